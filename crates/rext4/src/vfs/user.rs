//! [`UserFs`]: the filesystem as one caller sees it. Every call makes the checks the kernel's
//! VFS makes before it calls ext4 (search permission on the way, write permission on the
//! directory, the sticky bit, ownership for chmod and chown, immutable and append-only
//! inodes, xattr namespaces) and gives new inodes their owner as `inode_init_owner` does.
//! [`Fs`]'s own calls make none of these checks: they are the filesystem below the VFS.

use super::creds::{Caps, Creds};
use super::open::{OpenFile, OpenFlags};
use super::permission::{init_owner, Access};
use crate::attr::{Attr, FileType};
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::inode::write::SetAttr;
use rext4_format::inode::{APPEND_FL, IMMUTABLE_FL, S_IFBLK, S_IFCHR, S_IFDIR, S_IFMT, S_IFREG};
use rext4_format::InodeNo;
use std::path::Path;

/// A filesystem and a caller's credentials. Cheap to clone.
#[derive(Clone)]
pub struct UserFs {
    fs: Fs,
    creds: Creds,
}

impl Fs {
    /// This filesystem as the caller `creds` sees it.
    pub fn as_user(&self, creds: Creds) -> UserFs {
        UserFs { fs: self.clone(), creds }
    }
}

impl UserFs {
    pub fn creds(&self) -> &Creds {
        &self.creds
    }

    pub fn fs(&self) -> &Fs {
        &self.fs
    }

    fn dir_attr(&self, dir: InodeNo) -> Result<Attr> {
        let a = self.fs.getattr(dir)?;
        if a.kind != FileType::Directory {
            return Err(Error::NotDir);
        }
        Ok(a)
    }

    /// `access(2)`.
    pub fn access(&self, ino: InodeNo, want: Access) -> Result<()> {
        self.fs.access(&self.creds, &self.fs.getattr(ino)?, want)
    }

    /// Looks `name` up in `dir`, which the caller must be allowed to search.
    pub fn lookup(&self, dir: InodeNo, name: &[u8]) -> Result<Attr> {
        self.fs.permission(&self.creds, &self.dir_attr(dir)?, Access::EXEC)?;
        self.fs.lookup(dir, name)
    }

    /// Resolves `path` with search permission checked on every directory passed through.
    pub fn resolve(&self, path: impl AsRef<Path>, follow: bool) -> Result<InodeNo> {
        self.fs.resolve_as(Some(&self.creds), path.as_ref(), follow)
    }

    /// The mode, uid and gid a new inode of `mode` in `dir` gets, after the checks to create
    /// there.
    fn new_owner(&self, dir: InodeNo, mode: u16) -> Result<(u16, u32, u32)> {
        let d = self.dir_attr(dir)?;
        self.fs.may_create(&self.creds, &d)?;
        Ok(init_owner(&self.creds, &d, mode, self.fs.inner.grpid))
    }

    /// `open(O_CREAT|O_EXCL)` of regular file `name` in `dir`; `mode` holds the permission
    /// bits (the umask already applied).
    pub fn create(&self, dir: InodeNo, name: &[u8], mode: u16) -> Result<Attr> {
        let (mode, uid, gid) = self.new_owner(dir, S_IFREG | (mode & 0o7777))?;
        self.creds.allocating(&self.fs, || self.fs.create(dir, name, mode & 0o7777, uid, gid))
    }

    /// `mkdir(2)`.
    pub fn mkdir(&self, dir: InodeNo, name: &[u8], mode: u16) -> Result<Attr> {
        let (mode, uid, gid) = self.new_owner(dir, S_IFDIR | (mode & 0o7777))?;
        self.creds.allocating(&self.fs, || self.fs.mkdir(dir, name, mode & 0o7777, uid, gid))
    }

    /// `mknod(2)`: device nodes need `CAP_MKNOD`.
    pub fn mknod(&self, dir: InodeNo, name: &[u8], mode: u16, rdev: (u32, u32)) -> Result<Attr> {
        let kind = mode & S_IFMT;
        if (kind == S_IFCHR || kind == S_IFBLK) && !self.creds.has(Caps::MKNOD) {
            return Err(Error::NotPermitted);
        }
        let (mode, uid, gid) = self.new_owner(dir, mode)?;
        self.creds.allocating(&self.fs, || self.fs.mknod(dir, name, mode, rdev, uid, gid))
    }

    /// `symlink(2)`.
    pub fn symlink(&self, dir: InodeNo, name: &[u8], target: &[u8]) -> Result<Attr> {
        let (_, uid, gid) = self.new_owner(dir, rext4_format::inode::S_IFLNK | 0o777)?;
        self.creds.allocating(&self.fs, || self.fs.symlink(dir, name, target, uid, gid))
    }

    /// `link(2)`: immutable and append-only files take no new names.
    pub fn link(&self, ino: InodeNo, dir: InodeNo, name: &[u8]) -> Result<Attr> {
        let d = self.dir_attr(dir)?;
        self.fs.may_create(&self.creds, &d)?;
        if self.fs.getattr(ino)?.flags & (APPEND_FL | IMMUTABLE_FL) != 0 {
            return Err(Error::NotPermitted);
        }
        self.creds.allocating(&self.fs, || self.fs.link(ino, dir, name))
    }

    fn victim(&self, dir: InodeNo, name: &[u8]) -> Result<(Attr, Attr)> {
        let d = self.dir_attr(dir)?;
        self.fs.permission(&self.creds, &d, Access::EXEC)?;
        let v = self.fs.lookup(dir, name)?;
        self.fs.may_delete(&self.creds, &d, &v)?;
        Ok((d, v))
    }

    /// `unlink(2)`.
    pub fn unlink(&self, dir: InodeNo, name: &[u8]) -> Result<()> {
        self.victim(dir, name)?;
        self.fs.unlink(dir, name)
    }

    /// `rmdir(2)`.
    pub fn rmdir(&self, dir: InodeNo, name: &[u8]) -> Result<()> {
        self.victim(dir, name)?;
        self.fs.rmdir(dir, name)
    }

    /// `renameat2(2)`: the source must be removable from its directory, the target either
    /// removable or creatable in its own, and a directory that changes parent writable (its
    /// `..` changes). A whiteout left behind belongs to the caller.
    pub fn rename(
        &self,
        old_dir: InodeNo,
        old: &[u8],
        new_dir: InodeNo,
        new: &[u8],
        flags: u32,
    ) -> Result<()> {
        let (_, src) = self.victim(old_dir, old)?;
        let nd = self.dir_attr(new_dir)?;
        self.fs.permission(&self.creds, &nd, Access::EXEC)?;
        let target = match self.fs.lookup(new_dir, new) {
            Ok(t) => Some(t),
            Err(Error::NotFound) => None,
            Err(e) => return Err(e),
        };
        match &target {
            Some(t) => self.fs.may_delete(&self.creds, &nd, t)?,
            None => self.fs.may_create(&self.creds, &nd)?,
        }
        if old_dir != new_dir {
            if src.kind == FileType::Directory {
                self.fs.permission(&self.creds, &src, Access::WRITE)?;
            }
            if let Some(t) = target.as_ref().filter(|t| t.kind == FileType::Directory) {
                if flags & crate::RENAME_EXCHANGE != 0 {
                    self.fs.permission(&self.creds, t, Access::WRITE)?;
                }
            }
        }
        let (uid, gid) = (self.creds.uid, self.creds.gid);
        self.creds.allocating(&self.fs, || self.fs.rename_as(old_dir, old, new_dir, new, flags, uid, gid))
    }

    /// `chmod`, `chown`, `utimensat`, `truncate` with the VFS's checks and set-ID bit rules.
    pub fn setattr(&self, ino: InodeNo, ch: &SetAttr) -> Result<Attr> {
        let a = self.fs.getattr(ino)?;
        let ch = self.fs.setattr_prepare(&self.creds, &a, ch)?;
        self.creds.allocating(&self.fs, || self.fs.setattr(ino, &ch))
    }

    /// `FS_IOC_SETFLAGS`: the owner (or `CAP_FOWNER`) only, and the immutable and
    /// append-only flags change only with `CAP_LINUX_IMMUTABLE`.
    pub fn set_flags(&self, ino: InodeNo, flags: u32) -> Result<Attr> {
        let a = self.fs.getattr(ino)?;
        if self.creds.uid != a.uid && !self.creds.has(Caps::FOWNER) {
            return Err(Error::NotPermitted);
        }
        if (a.flags ^ flags) & (APPEND_FL | IMMUTABLE_FL) != 0 && !self.creds.has(Caps::LINUX_IMMUTABLE) {
            return Err(Error::NotPermitted);
        }
        self.fs.set_flags(ino, flags)
    }

    /// `xattr_permission`: `trusted.*` needs `CAP_SYS_ADMIN` (reads see nothing without it);
    /// `user.*` lives on regular files and directories only, and in a sticky directory only
    /// its owner may write it; writes to immutable or append-only inodes are `EPERM`; ACLs
    /// are set by the owner; everything else needs read or write permission on the inode.
    fn xattr_permission(&self, a: &Attr, name: &[u8], write: bool) -> Result<()> {
        let denied = if write { Error::NotPermitted } else { Error::NoData };
        if write && a.flags & (APPEND_FL | IMMUTABLE_FL) != 0 {
            return Err(Error::NotPermitted);
        }
        if name.starts_with(b"trusted.") {
            return if self.creds.has(Caps::SYS_ADMIN) { Ok(()) } else { Err(denied) };
        }
        if name.starts_with(b"system.posix_acl_") {
            if write && self.creds.uid != a.uid && !self.creds.has(Caps::FOWNER) {
                return Err(Error::NotPermitted);
            }
            return Ok(());
        }
        if name.starts_with(b"security.") {
            return Ok(());
        }
        if name.starts_with(b"user.") {
            if !matches!(a.kind, FileType::RegularFile | FileType::Directory) {
                return Err(denied);
            }
            if write
                && a.kind == FileType::Directory
                && a.mode & 0o1000 != 0
                && self.creds.uid != a.uid
                && !self.creds.has(Caps::FOWNER)
            {
                return Err(Error::NotPermitted);
            }
        }
        self.fs.permission(&self.creds, a, if write { Access::WRITE } else { Access::READ })
    }

    /// `getxattr(2)`.
    pub fn getxattr(&self, ino: InodeNo, name: &[u8]) -> Result<Vec<u8>> {
        self.xattr_permission(&self.fs.getattr(ino)?, name, false)?;
        self.fs.getxattr(ino, name)
    }

    /// `listxattr(2)`: `trusted.*` names only for `CAP_SYS_ADMIN`.
    pub fn listxattr(&self, ino: InodeNo) -> Result<Vec<Vec<u8>>> {
        let mut names = self.fs.listxattr(ino)?;
        if !self.creds.has(Caps::SYS_ADMIN) {
            names.retain(|n| !n.starts_with(b"trusted."));
        }
        Ok(names)
    }

    /// `setxattr(2)`. An access ACL set by a caller outside the file's group and without
    /// `CAP_FSETID` takes set-group-ID away (`posix_acl_update_mode`).
    pub fn setxattr(&self, ino: InodeNo, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        let a = self.fs.getattr(ino)?;
        self.xattr_permission(&a, name, true)?;
        if name == b"system.posix_acl_access" && !self.creds.in_group(a.gid) && !self.creds.has(Caps::FSETID)
        {
            return self
                .creds
                .allocating(&self.fs, || self.fs.setxattr_outside_group(ino, name, value, flags));
        }
        self.creds.allocating(&self.fs, || self.fs.setxattr(ino, name, value, flags))
    }

    /// `removexattr(2)`.
    pub fn removexattr(&self, ino: InodeNo, name: &[u8]) -> Result<()> {
        self.xattr_permission(&self.fs.getattr(ino)?, name, true)?;
        self.fs.removexattr(ino, name)
    }

    /// Opens inode `ino` (`may_open`, then an [`OpenFile`] holding it).
    pub fn open_inode(&self, ino: InodeNo, flags: OpenFlags) -> Result<OpenFile> {
        self.fs.open_inode(&self.creds, ino, flags)
    }

    /// `openat(2)` on `name` in `dir` with `CREATE`: makes a regular file of `mode` (the
    /// umask already applied) if the name is free, then opens it. Returns whether it was
    /// made. `EEXIST` with `EXCLUSIVE` if it exists; a new file is opened without the
    /// permission check (the creator may write what it made read-only, as in the kernel).
    pub fn create_open(
        &self,
        dir: InodeNo,
        name: &[u8],
        mode: u16,
        flags: OpenFlags,
    ) -> Result<(OpenFile, bool)> {
        match self.lookup(dir, name) {
            Ok(_) if flags.contains(OpenFlags::EXCLUSIVE) => Err(Error::Exists),
            Ok(a) => Ok((self.open_inode(a.ino, flags)?, false)),
            Err(Error::NotFound) => match self.create(dir, name, mode) {
                Ok(a) => {
                    // Every check passed, for the creator; the reserve stays as the caller's.
                    let caps = (Caps::all() - Caps::SYS_RESOURCE) | self.creds.caps;
                    let owner = self.creds.clone().with_caps(caps);
                    let f = self.fs.open_inode(&owner, a.ino, flags - OpenFlags::TRUNCATE)?;
                    Ok((f, true))
                }
                // Made by someone else meanwhile: open what is there.
                Err(Error::Exists) if !flags.contains(OpenFlags::EXCLUSIVE) => {
                    Ok((self.open_inode(self.lookup(dir, name)?.ino, flags)?, false))
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Opens `path`: resolves it (following a final symbolic link unless `NOFOLLOW`, which
    /// then fails with `ELOOP`), creating a regular file of `mode` with `CREATE` (`EISDIR`
    /// for a path ending in `/`, as the kernel answers).
    pub fn open(&self, path: impl AsRef<Path>, flags: OpenFlags, mode: u16) -> Result<OpenFile> {
        let path = path.as_ref();
        if !flags.contains(OpenFlags::CREATE) {
            let ino = self.resolve(path, !flags.contains(OpenFlags::NOFOLLOW))?;
            return self.open_inode(ino, flags);
        }
        // O_CREAT names a file; a trailing `/` can only name a directory.
        if path.as_os_str().as_encoded_bytes().ends_with(b"/") {
            return Err(Error::IsDir);
        }
        let (dir, name) = self.parent_of(path)?;
        // A final symbolic link is followed to what it names (O_CREAT without O_EXCL).
        if !flags.contains(OpenFlags::EXCLUSIVE) {
            match self.resolve(path, !flags.contains(OpenFlags::NOFOLLOW)) {
                Ok(ino) => return self.open_inode(ino, flags),
                Err(Error::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(self.create_open(dir, &name, mode, flags)?.0)
    }

    /// The directory holding `path`'s last component, and that component. `EEXIST` for
    /// the root (it has no parent entry to make), `EISDIR` for `.`/`..` last (what
    /// `open(O_CREAT)` answers there).
    pub fn parent_of(&self, path: &Path) -> Result<(InodeNo, Vec<u8>)> {
        use std::os::unix::ffi::OsStrExt;
        let bytes = path.as_os_str().as_bytes();
        let trimmed = bytes.strip_suffix(b"/").unwrap_or(bytes);
        let (dir, name) = match trimmed.iter().rposition(|&b| b == b'/') {
            Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
            None => (&b""[..], trimmed),
        };
        if name.is_empty() {
            return Err(Error::Exists);
        }
        if name == b"." || name == b".." {
            // What mkdir, unlink and rename answer for a last component that is a directory
            // of its own.
            return Err(Error::IsDir);
        }
        let d = self.resolve(std::ffi::OsStr::from_bytes(if dir.is_empty() { b"/" } else { dir }), true)?;
        Ok((d, name.to_vec()))
    }
}
