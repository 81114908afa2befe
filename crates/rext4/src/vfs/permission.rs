//! Permission checks as the kernel's VFS makes them before calling ext4: `generic_permission`
//! (mode bits, POSIX ACLs, capabilities), `may_open`, `may_create`, `may_delete` with the
//! sticky bit, `inode_init_owner` (set-group-ID directories), and `setattr_prepare` (who may
//! chown, chmod and set times, and which set-ID bits are lost on the way).

use super::creds::{Caps, Creds};
use super::open::OpenFlags;
use crate::attr::{Attr, FileType};
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::inode::write::{SetAttr, TimeSet};
use crate::xattr::acl::{from_xattr, AclEntry};
use rext4_format::inode::{APPEND_FL, IMMUTABLE_FL};
use rext4_format::xattr::{ACL_GROUP, ACL_GROUP_OBJ, ACL_MASK, ACL_OTHER, ACL_USER, ACL_USER_OBJ};

const S_ISUID: u16 = 0o4000;
const S_ISGID: u16 = 0o2000;
const S_ISVTX: u16 = 0o1000;
const S_IXGRP: u16 = 0o0010;

bitflags::bitflags! {
    /// What a caller wants to do with an inode (`access(2)`'s `R_OK`, `W_OK`, `X_OK`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct Access: u32 {
        const EXEC = 1;
        const WRITE = 2;
        const READ = 4;
    }
}

/// Whether access control list `acl` grants `want` to `c` on a file owned by `owner`
/// (`posix_acl_permission`): the owner entry, else a named user, else any matching group
/// entry that grants everything, each limited by the mask; else the other entry.
fn acl_grants(acl: &[AclEntry], c: &Creds, owner: u32, file_gid: u32, want: u32) -> bool {
    let mask = acl.iter().find(|e| e.tag == ACL_MASK).map_or(7, |e| u32::from(e.perm));
    let mut group_found = false;
    for e in acl {
        let perm = u32::from(e.perm);
        match e.tag {
            ACL_USER_OBJ if c.uid == owner => return perm & want == want,
            ACL_USER if e.id == c.uid => return perm & mask & want == want,
            ACL_GROUP_OBJ | ACL_GROUP => {
                let gid = if e.tag == ACL_GROUP_OBJ { file_gid } else { e.id };
                if c.in_group(gid) {
                    group_found = true;
                    if perm & mask & want == want {
                        return true;
                    }
                }
            }
            ACL_OTHER if !group_found => return perm & want == want,
            _ => {}
        }
    }
    false
}

impl Fs {
    /// The inode's access ACL, if it has one.
    fn access_acl(&self, ino: rext4_format::InodeNo) -> Result<Option<Vec<AclEntry>>> {
        match self.getxattr(ino, b"system.posix_acl_access") {
            Ok(v) => from_xattr(&v),
            Err(Error::NoData | Error::NotSupported(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `inode_permission`: may `c` do `want` to the inode `a` describes? `EROFS` for writes
    /// to a read-only filesystem, `EPERM` for writes to an immutable inode, `EACCES` when
    /// neither the mode, the ACL nor a capability allows it.
    pub fn permission(&self, c: &Creds, a: &Attr, want: Access) -> Result<()> {
        if want.contains(Access::WRITE) {
            let data = matches!(a.kind, FileType::RegularFile | FileType::Directory | FileType::Symlink);
            if data && !self.is_writable() {
                return Err(Error::ReadOnly);
            }
            if a.flags & IMMUTABLE_FL != 0 {
                return Err(Error::NotPermitted);
            }
        }
        let w = want.bits();
        let mode = u32::from(a.mode);
        let granted = if c.uid == a.uid {
            (mode >> 6) & 7 & w == w
        } else if mode & 0o070 != 0 && c.caps != Caps::all() {
            // An ACL only matters when it could grant through the group class; a caller
            // with every capability passes anyway, so its ACL need not be read.
            match self.access_acl(a.ino)? {
                Some(acl) => acl_grants(&acl, c, a.uid, a.gid, w),
                None if c.in_group(a.gid) => (mode >> 3) & 7 & w == w,
                None => mode & 7 & w == w,
            }
        } else if c.in_group(a.gid) {
            (mode >> 3) & 7 & w == w
        } else {
            mode & 7 & w == w
        };
        if granted {
            return Ok(());
        }
        // `capable_wrt_inode_uidgid` as `generic_permission` asks it.
        let ok = if a.kind == FileType::Directory {
            (!want.contains(Access::WRITE) && c.has(Caps::DAC_READ_SEARCH)) || c.has(Caps::DAC_OVERRIDE)
        } else {
            (want == Access::READ && c.has(Caps::DAC_READ_SEARCH))
                || (c.has(Caps::DAC_OVERRIDE) && (!want.contains(Access::EXEC) || mode & 0o111 != 0))
        };
        if ok {
            Ok(())
        } else {
            Err(Error::AccessDenied)
        }
    }

    /// `access(2)` for `c` on inode `a`: as [`Fs::permission`], where `F_OK` (empty `want`)
    /// only asks that the inode exist.
    pub fn access(&self, c: &Creds, a: &Attr, want: Access) -> Result<()> {
        if want.is_empty() {
            return Ok(());
        }
        self.permission(c, a, want)
    }

    /// `may_open`: may `c` open inode `a` with `flags`? `ELOOP` for a symbolic link,
    /// `EISDIR` for a directory opened to write, `EPERM` to write an append-only file other
    /// than by appending, or to truncate it, or for `O_NOATIME` on another's file.
    pub fn may_open(&self, c: &Creds, a: &Attr, flags: OpenFlags) -> Result<()> {
        let mut want = Access::empty();
        if flags.reads() {
            want |= Access::READ;
        }
        if flags.writes() || flags.contains(OpenFlags::TRUNCATE) {
            want |= Access::WRITE;
        }
        match a.kind {
            FileType::Symlink => return Err(Error::Loop),
            FileType::Directory if want.contains(Access::WRITE) => return Err(Error::IsDir),
            _ => {}
        }
        self.permission(c, a, want)?;
        if a.flags & APPEND_FL != 0
            && ((flags.writes() && !flags.contains(OpenFlags::APPEND)) || flags.contains(OpenFlags::TRUNCATE))
        {
            return Err(Error::NotPermitted);
        }
        if flags.contains(OpenFlags::NOATIME) && c.uid != a.uid && !c.has(Caps::FOWNER) {
            return Err(Error::NotPermitted);
        }
        Ok(())
    }

    /// `may_create`: may `c` add a name to directory `dir`?
    pub fn may_create(&self, c: &Creds, dir: &Attr) -> Result<()> {
        if dir.kind != FileType::Directory {
            return Err(Error::NotDir);
        }
        if dir.nlink == 0 {
            // A removed directory takes no new names (`IS_DEADDIR`).
            return Err(Error::NotFound);
        }
        self.permission(c, dir, Access::WRITE | Access::EXEC)
    }

    /// `may_delete`: may `c` remove `victim`'s name from `dir`? The sticky bit limits it to
    /// the owners of the file and of the directory; immutable or append-only files and
    /// append-only directories keep their names.
    pub fn may_delete(&self, c: &Creds, dir: &Attr, victim: &Attr) -> Result<()> {
        self.permission(c, dir, Access::WRITE | Access::EXEC)?;
        if dir.flags & APPEND_FL != 0 {
            return Err(Error::NotPermitted);
        }
        if dir.mode & S_ISVTX != 0 && c.uid != victim.uid && c.uid != dir.uid && !c.has(Caps::FOWNER) {
            return Err(Error::NotPermitted);
        }
        if victim.flags & (APPEND_FL | IMMUTABLE_FL) != 0 {
            return Err(Error::NotPermitted);
        }
        Ok(())
    }
}

/// `inode_init_owner`: the mode, uid and gid of a new inode that `c` makes in `dir` with
/// `mode` (type and permission bits, the umask already applied). A set-group-ID directory,
/// or the `grpid` mount option, gives the directory's group; such a directory passes its
/// set-group-ID bit on to new directories. A new set-group-ID executable in a group the
/// caller is not in loses the bit (`mode_strip_sgid`).
pub fn init_owner(c: &Creds, dir: &Attr, mode: u16, grpid: bool) -> (u16, u32, u32) {
    let is_dir = mode & rext4_format::inode::S_IFMT == rext4_format::inode::S_IFDIR;
    if grpid {
        return (mode, c.uid, dir.gid);
    }
    if dir.mode & S_ISGID == 0 {
        return (mode, c.uid, c.gid);
    }
    let mut mode = mode;
    if is_dir {
        mode |= S_ISGID;
    } else if mode & (S_ISGID | S_IXGRP) == (S_ISGID | S_IXGRP)
        && !c.in_group(dir.gid)
        && !c.has(Caps::FSETID)
    {
        mode &= !S_ISGID;
    }
    (mode, c.uid, dir.gid)
}

impl Fs {
    /// `setattr_prepare` and `notify_change`: checks that `c` may make `ch` to inode `a` and
    /// returns the change to make, with the set-ID bits that a chown or a chmod by a
    /// non-member loses.
    pub fn setattr_prepare(&self, c: &Creds, a: &Attr, ch: &SetAttr) -> Result<SetAttr> {
        let owner = c.uid == a.uid;
        let mut out = ch.clone();
        if let Some(uid) = ch.uid {
            let may = c.has(Caps::CHOWN) || (owner && uid == a.uid);
            if !may {
                return Err(Error::NotPermitted);
            }
        }
        if let Some(gid) = ch.gid {
            let may = c.has(Caps::CHOWN) || (owner && (gid == a.gid || c.in_group(gid)));
            if !may {
                return Err(Error::NotPermitted);
            }
        }
        if let Some(mode) = ch.mode {
            if !owner && !c.has(Caps::FOWNER) {
                return Err(Error::NotPermitted);
            }
            let gid = ch.gid.unwrap_or(a.gid);
            if mode & S_ISGID != 0 && !c.in_group(gid) && !c.has(Caps::FSETID) {
                out.mode = Some(mode & !S_ISGID);
            }
        }
        for t in [ch.atime, ch.mtime].into_iter().flatten() {
            let may = owner || c.has(Caps::FOWNER);
            match t {
                TimeSet::At(_) if !may => return Err(Error::NotPermitted),
                TimeSet::Now if !may => self.permission(c, a, Access::WRITE)?,
                _ => {}
            }
        }
        if ch.size.is_some() {
            if a.kind == FileType::Directory {
                return Err(Error::IsDir);
            }
            self.permission(c, a, Access::WRITE)?;
        }
        // A chown of a non-directory drops set-user-ID, and set-group-ID where group
        // execution makes it one (`chown_common`: ATTR_KILL_SUID / ATTR_KILL_SGID).
        let chown = ch.uid.is_some_and(|u| u != a.uid) || ch.gid.is_some_and(|g| g != a.gid);
        if chown && a.kind != FileType::Directory {
            let mut mode = out.mode.unwrap_or(a.perm());
            mode &= !S_ISUID;
            if mode & S_IXGRP != 0 {
                mode &= !S_ISGID;
            }
            if mode != a.perm() || out.mode.is_some() {
                out.mode = Some(mode);
            }
        }
        Ok(out)
    }
}

/// The mode a write by `c` leaves on a file with attributes `a` (`file_remove_privs`): a
/// writer without `CAP_FSETID` clears set-user-ID, and set-group-ID where group execution
/// makes it one. `None` when nothing changes.
pub(crate) fn mode_after_write(c: &Creds, a: &Attr) -> Option<u16> {
    if c.has(Caps::FSETID) || a.kind != FileType::RegularFile {
        return None;
    }
    let mut mode = a.perm() & !S_ISUID;
    if mode & S_IXGRP != 0 {
        mode &= !S_ISGID;
    }
    (mode != a.perm()).then_some(mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(tag: u16, perm: u16, id: u32) -> AclEntry {
        AclEntry { tag, perm, id }
    }

    #[test]
    fn acl_entries_apply_in_the_kernels_order() {
        let acl = [
            e(ACL_USER_OBJ, 6, u32::MAX),
            e(ACL_USER, 7, 1001),
            e(ACL_GROUP_OBJ, 4, u32::MAX),
            e(ACL_GROUP, 2, 50),
            e(ACL_MASK, 6, u32::MAX),
            e(ACL_OTHER, 1, u32::MAX),
        ];
        let u = |uid, gid, groups: &[u32]| Creds::user(uid, gid, groups);
        // The owner entry, unmasked.
        assert!(acl_grants(&acl, &u(1000, 1, &[]), 1000, 100, 6));
        // A named user, masked (rwx & rw-).
        assert!(acl_grants(&acl, &u(1001, 1, &[]), 1000, 100, 6));
        assert!(!acl_grants(&acl, &u(1001, 1, &[]), 1000, 100, 1));
        // Group entries: one matching entry must grant everything asked.
        assert!(acl_grants(&acl, &u(2000, 100, &[50]), 1000, 100, 4));
        assert!(acl_grants(&acl, &u(2000, 100, &[50]), 1000, 100, 2));
        assert!(!acl_grants(&acl, &u(2000, 100, &[50]), 1000, 100, 6));
        // A matching group that grants nothing does not fall through to other.
        assert!(!acl_grants(&acl, &u(2000, 100, &[]), 1000, 100, 1));
        assert!(acl_grants(&acl, &u(2000, 7, &[]), 1000, 100, 1));
    }

    fn dir(mode: u16, gid: u32) -> Attr {
        let t = crate::Timestamp { sec: 0, nsec: 0 };
        Attr {
            ino: rext4_format::InodeNo(2),
            kind: FileType::Directory,
            mode: rext4_format::inode::S_IFDIR | mode,
            nlink: 2,
            uid: 0,
            gid,
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: None,
            rdev: (0, 0),
            blksize: 4096,
            flags: 0,
            generation: 0,
        }
    }

    #[test]
    fn set_group_id_directories_pass_on_group_and_bit() {
        let mut dir = dir(0o2775, 500);
        let c = Creds::user(1000, 1000, &[]);
        let reg = rext4_format::inode::S_IFREG;
        assert_eq!(init_owner(&c, &dir, reg | 0o644, false), (reg | 0o644, 1000, 500));
        let d = rext4_format::inode::S_IFDIR;
        assert_eq!(init_owner(&c, &dir, d | 0o755, false), (d | 0o2755, 1000, 500));
        // A set-group-ID executable for a group the caller is not in loses the bit.
        assert_eq!(init_owner(&c, &dir, reg | 0o2755, false), (reg | 0o755, 1000, 500));
        let member = Creds::user(1000, 1000, &[500]);
        assert_eq!(init_owner(&member, &dir, reg | 0o2755, false), (reg | 0o2755, 1000, 500));
        // grpid: the group, not the bit.
        assert_eq!(init_owner(&c, &dir, d | 0o755, true), (d | 0o755, 1000, 500));
        dir.mode = rext4_format::inode::S_IFDIR | 0o775;
        assert_eq!(init_owner(&c, &dir, reg | 0o644, false), (reg | 0o644, 1000, 1000));
    }
}
