//! Inode flags as `chattr` changes them (the kernel's `ext4_fileattr_set` in `ioctl.c`), and
//! what the immutable and append-only flags forbid (the VFS's checks, which rext4 makes
//! itself: a library call or a FUSE request reaches no VFS that knows the flags).
//!
//! - immutable: no change to the inode or its names. Its data, size, mode, owner, times,
//!   xattrs and links stay; no name may be added to or removed from it as a directory, and
//!   its own names may not be removed or moved.
//! - append-only: no byte before the end is written again; mode, owner, explicit times and
//!   size stay; its names may not be removed or moved, and as a directory, its names may not
//!   be removed (new ones may be added).
//!
//! Each check comes where the kernel's comes, so that errno precedence matches: a missing
//! name is `ENOENT` and an existing target `EEXIST` before `EPERM`, and `EPERM` before
//! `EISDIR`, `ENOTDIR` and `ENOTEMPTY`.

use crate::error::{Error, Result};
use crate::fs::{Fs, FsInner};
use crate::inode::write::{raw_flags, raw_set_flags, raw_touch_c};
use crate::inode::Inode;
use crate::Attr;
use rext4_format::inode::{self as fi, APPEND_FL, IMMUTABLE_FL};
use rext4_format::InodeNo;

/// Formerly `EXT4_EOFBLOCKS_FL`; still settable.
const EOFBLOCKS_FL: u32 = 0x0040_0000;
const DAX_FL: u32 = 0x0200_0000;

/// Flags `chattr` may change (`EXT4_FL_USER_MODIFIABLE`).
pub const FL_USER_MODIFIABLE: u32 = fi::SECRM_FL
    | fi::UNRM_FL
    | fi::COMPR_FL
    | fi::SYNC_FL
    | IMMUTABLE_FL
    | APPEND_FL
    | fi::NODUMP_FL
    | fi::NOATIME_FL
    | fi::JOURNAL_DATA_FL
    | fi::NOTAIL_FL
    | fi::DIRSYNC_FL
    | fi::TOPDIR_FL
    | fi::EXTENTS_FL
    | EOFBLOCKS_FL
    | DAX_FL
    | fi::PROJINHERIT_FL
    | fi::CASEFOLD_FL;

/// Flags `lsattr` sees (`EXT4_FL_USER_VISIBLE`): the modifiable ones and a few the
/// filesystem sets itself.
pub const FL_USER_VISIBLE: u32 = FL_USER_MODIFIABLE
    | 0x0000_0100 // dirty
    | 0x0000_0200 // compressed blocks
    | 0x0000_0400 // no compression
    | fi::ENCRYPT_FL
    | fi::INDEX_FL
    | fi::VERITY_FL
    | fi::INLINE_DATA_FL;

/// Flags that change how the data is stored, other than `EXTENTS_FL` (which converts the
/// file: map/migrate.rs); rext4 does not switch files between those forms, so changing one is
/// `EOPNOTSUPP`.
const CONVERTING: u32 = fi::JOURNAL_DATA_FL | DAX_FL;

/// Credits: the inode.
const CREDITS: u32 = 1;

/// `EXT4_NOCOMPR_FL`.
const NOCOMPR_FL: u32 = 0x0000_0400;

/// Flags a new inode takes from its directory (`EXT4_FL_INHERITED`).
const FL_INHERITED: u32 = fi::SECRM_FL
    | fi::UNRM_FL
    | fi::COMPR_FL
    | fi::SYNC_FL
    | fi::NODUMP_FL
    | fi::NOATIME_FL
    | NOCOMPR_FL
    | fi::JOURNAL_DATA_FL
    | fi::NOTAIL_FL
    | fi::DIRSYNC_FL
    | fi::PROJINHERIT_FL
    | fi::CASEFOLD_FL
    | DAX_FL;

/// The flags of `flags` an inode of type `mode` may carry (`ext4_mask_flags`): a directory
/// all of them, a regular file those that are not about names, anything else only `nodump`
/// and `noatime`.
fn mask_flags(mode: u16, flags: u32) -> u32 {
    match mode & fi::S_IFMT {
        fi::S_IFDIR => flags,
        fi::S_IFREG => flags & !(fi::DIRSYNC_FL | fi::TOPDIR_FL | fi::CASEFOLD_FL | fi::PROJINHERIT_FL),
        _ => flags & (fi::NODUMP_FL | fi::NOATIME_FL),
    }
}

/// What a new inode of type `mode` inherits from a directory with flags `dir_flags`. (A file
/// inheriting data journaling keeps the flag; rext4 writes its data in ordered mode.)
pub(crate) fn inherited_flags(dir_flags: u32, mode: u16) -> u32 {
    mask_flags(mode, dir_flags & FL_INHERITED)
}

/// `EPERM` if `inode` is immutable or append-only: its names may not be removed or moved,
/// nor its attributes set (`may_delete`, `notify_change`, `vfs_link`).
pub(crate) fn check_pinned(inode: &Inode) -> Result<()> {
    if inode.flags() & (IMMUTABLE_FL | APPEND_FL) != 0 {
        return Err(Error::NotPermitted);
    }
    Ok(())
}

/// `EPERM` if directory `dir` is immutable: no name may be added to it (`may_create`'s
/// write permission).
pub(crate) fn check_dir_open(dir: &Inode) -> Result<()> {
    if dir.flags() & IMMUTABLE_FL != 0 {
        return Err(Error::NotPermitted);
    }
    Ok(())
}

/// `EPERM` if a name may not leave directory `dir` (immutable or append-only) or inode
/// `child` may not lose it (`may_delete`).
pub(crate) fn check_removable(dir: &Inode, child: &Inode) -> Result<()> {
    check_pinned(dir)?;
    check_pinned(child)
}

impl FsInner {
    fn set_flags(&self, ino: InodeNo, flags: u32) -> Result<()> {
        if flags & !FL_USER_VISIBLE != 0 {
            return Err(Error::NotSupported("inode flag".into()));
        }
        // chattr passes back what it read: visible flags it cannot set are dropped silently.
        let flags = flags & FL_USER_MODIFIABLE;
        let journal = self.journal()?.clone();
        let inode = self.iget_by_number(ino)?;
        let _op = self.stats.lock(crate::fs::stats::LockClass::OpLock, &inode.op_lock);
        if mask_flags(inode.disk().file_type(), flags) != flags {
            return Err(Error::NotSupported("flag for this file type".into()));
        }
        let casefold_changes = (inode.flags() ^ flags) & fi::CASEFOLD_FL != 0;
        // `fscrypt_prepare_setflags`: an encrypted directory is casefolded only with its key,
        // under a v2 policy (which gives the key its entries' hashes take).
        if casefold_changes && flags & fi::CASEFOLD_FL != 0 && inode.flags() & fi::ENCRYPT_FL != 0 {
            let crypt = self.inode_crypt(&inode)?;
            if !crypt.has_key() {
                return Err(Error::NoKey);
            }
            if !crypt.ctx.as_ref().is_some_and(rext4_format::fscrypt::Context::is_v2) {
                return Err(Error::InvalidInput("v1 encryption policies cannot casefold"));
            }
        }
        // `ext4_ioctl_setflags`: how a directory compares names changes only while it has none.
        if casefold_changes {
            if !self.sbi.casefold {
                return Err(Error::NotSupported("casefolding without the casefold feature".into()));
            }
            if !inode.is_dir() {
                return Err(Error::NotDir);
            }
            if !self.dir_is_empty(&inode)? {
                return Err(Error::NotEmpty);
            }
        }
        let h = journal.start(CREDITS)?;
        let mut raw = inode.raw_mut();
        let old = raw_flags(&raw);
        // `ext4_ioctl_check_immutable`: while it stays immutable, nothing else changes.
        if old & flags & IMMUTABLE_FL != 0 && old & !IMMUTABLE_FL != flags & !IMMUTABLE_FL {
            return Err(Error::NotPermitted);
        }
        if (old ^ flags) & CONVERTING != 0 {
            return Err(Error::NotSupported("changing how a file is stored".into()));
        }
        // As `ext4_ioctl_setflags`: the other flags first, in their own handle; then the
        // conversion, whose failure leaves them set.
        let migrate = (old ^ flags) & fi::EXTENTS_FL != 0;
        let new = (old & !FL_USER_MODIFIABLE) | (flags & !fi::EXTENTS_FL) | (old & fi::EXTENTS_FL);
        raw_set_flags(&mut raw, new);
        raw_touch_c(&mut raw, self.now());
        self.mark_inode_dirty(&h, &inode, &mut raw)?;
        drop(raw);
        h.stop();
        if casefold_changes {
            // Derived again with (or without) the key of its entries' hashes.
            inode.crypt.store(None);
        }
        if !migrate {
            Ok(())
        } else if flags & fi::EXTENTS_FL != 0 {
            self.ext_migrate(&inode)
        } else {
            self.ind_migrate(&inode)
        }
    }
}

impl Fs {
    /// `FS_IOC_SETFLAGS` (`chattr`): sets the inode's user-modifiable flags to those in
    /// `flags`, as `ext4_fileattr_set` does. Visible flags that cannot be set are ignored,
    /// others are `EOPNOTSUPP`, as are flags that do not apply to the file type and changes
    /// of how it is stored (data journaling, DAX). Casefolding (`chattr +F`) changes only on
    /// an empty directory (`ENOTEMPTY`) of an image with `casefold`. Setting or clearing
    /// `EXTENTS_FL` converts the file's map as the kernel does (`EOPNOTSUPP` for an extent
    /// tree no block map can hold, `EINVAL` without the `extents` feature); an immutable
    /// inode changes nothing but that flag (`EPERM`). The caller makes the VFS's checks
    /// first: the caller owns the inode, and changing `APPEND_FL` or `IMMUTABLE_FL` needs
    /// `CAP_LINUX_IMMUTABLE`. The change time becomes now.
    pub fn set_flags(&self, ino: InodeNo, flags: u32) -> Result<Attr> {
        self.inner.op(crate::fs::stats::Op::SetFlags, || self.inner.set_flags(ino, flags))?;
        self.getattr(ino)
    }
}

/// Projects (the `project` feature, `ext4_ioctl_setproject`): the id every inode carries for
/// project quotas, which new inodes take from a directory marked `PROJINHERIT`.
impl FsInner {
    /// The project of inode `ino` (0 where the record has no room for one).
    pub(crate) fn project_of(inode: &Inode) -> u32 {
        crate::inode::write::rec_ref(&inode.raw()).projid()
    }

    /// `EXDEV` where directory `dir` passes its project on and `inode` is in another: a link
    /// or a rename there would leave it outside the directory's project (`ext4_link`,
    /// `ext4_rename`).
    pub(crate) fn check_same_project(&self, dir: &Inode, inode: &Inode) -> Result<()> {
        let passes_on = dir.flags() & fi::PROJINHERIT_FL != 0;
        if passes_on && Self::project_of(dir) != Self::project_of(inode) {
            return Err(Error::CrossProject);
        }
        Ok(())
    }

    fn set_project(&self, ino: InodeNo, projid: u32) -> Result<()> {
        use rext4_format::features::RoCompat;
        let inode = self.iget_by_number(ino)?;
        if !self.sbi.sb.ro_compat().contains(RoCompat::PROJECT) {
            return if projid == 0 {
                Ok(())
            } else {
                Err(Error::NotSupported("projects without the project feature".into()))
            };
        }
        if self.sbi.inode_size <= fi::GOOD_OLD_INODE_SIZE {
            return Err(Error::NotSupported("projects in 128-byte inodes".into()));
        }
        let journal = self.journal()?.clone();
        let _op = self.stats.lock(crate::fs::stats::LockClass::OpLock, &inode.op_lock);
        if Self::project_of(&inode) == projid {
            return Ok(());
        }
        let sb = &self.sbi.sb;
        let quota_files = [sb.s_usr_quota_inum.get(), sb.s_grp_quota_inum.get(), sb.s_prj_quota_inum.get()];
        if quota_files.contains(&ino.0) {
            return Err(Error::NotPermitted);
        }
        self.quota_transfer_prepare(&inode)?;
        let h = journal.start(CREDITS)?;
        if self.quota.is_on() {
            let [uid, gid, _] = Self::quota_ids(&inode);
            self.quota_prepare(&h, [uid, gid, projid])?;
        }
        let mut raw = inode.raw_mut();
        if !crate::inode::write::rec(&mut raw).has_field(rext4_format::inode::OFF_PROJID, 4) {
            // The kernel would first grow the record's extra area; rext4 does not.
            return Err(Error::NotSupported("a record whose extra area has no project field".into()));
        }
        {
            let r = crate::inode::write::rec_ref(&raw);
            self.quota_transfer_check(&inode, &raw, [r.uid(), r.gid(), projid])?;
        }
        crate::inode::write::rec(&mut raw).set_projid(projid);
        raw_touch_c(&mut raw, self.now());
        self.mark_inode_dirty(&h, &inode, &mut raw)
    }
}

impl Fs {
    /// The project of inode `ino` (`FS_IOC_FSGETXATTR`'s `fsx_projid`).
    pub fn project(&self, ino: InodeNo) -> Result<u32> {
        Ok(FsInner::project_of(&*self.inner.iget_by_number(ino)?))
    }

    /// Moves inode `ino` to project `projid` (`FS_IOC_FSSETXATTR`, `chattr -p`), its quota
    /// usage with it, as `ext4_ioctl_setproject` does: without the `project` feature only 0 is
    /// accepted (and changes nothing); quota files refuse (`EPERM`). The caller makes the
    /// VFS's checks first: it owns the inode, and an inode immutable before and after the
    /// call keeps its project (`EPERM`). The change time becomes now.
    pub fn set_project(&self, ino: InodeNo, projid: u32) -> Result<Attr> {
        self.inner.op(crate::fs::stats::Op::SetFlags, || self.inner.set_project(ino, projid))?;
        self.getattr(ino)
    }
}
