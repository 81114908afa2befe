//! Changing inodes (the write side of the kernel's `inode.c`: `ext4_mark_iloc_dirty`,
//! `ext4_setattr`, `ext4_sync_file`).
//!
//! # Locking
//! journal handle -> `Inode::raw` (write) -> inode-table `Buffer::data` (write).

use crate::attr::{Attr, Timestamp};
use crate::error::{Error, Result};
use crate::fs::{Fs, FsInner};
use crate::inode::Inode;
use crate::jbd2::journal::Journal;
use crate::jbd2::transaction::Handle;
use rext4_format::inode::{self as fi, set_inode_checksum};
use rext4_format::inode_record::{InodeRecord, TimeField};
use rext4_format::InodeNo;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A time to set: the current time, or a given one (`utimensat`'s `UTIME_NOW` or a value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(Timestamp),
}

/// Attribute changes for [`Fs::setattr`]; `None` leaves a field alone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Permission bits (`chmod`); the file type is kept.
    pub mode: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    /// New size of a regular file (`truncate`): shrinking frees the blocks past it, growing
    /// leaves a hole.
    pub size: Option<u64>,
    /// The change time to stamp instead of the clock's now, which [`TimeSet::Now`] times
    /// take too: a caller that keeps its own clock for the file, as the kernel's FUSE
    /// writeback cache does (`FATTR_CTIME`), so the times it already shows stay true.
    pub ctime: Option<Timestamp>,
}

impl FsInner {
    /// The time an inode change stamps: the clock's now, or the coarse clock's where the
    /// filesystem was told its user stamps files from that one (`Fs::set_coarse_time`).
    pub(crate) fn now(&self) -> Timestamp {
        let (sec, nsec) = if self.coarse_time.load(Ordering::Relaxed) {
            crate::clock::coarse_now()
        } else {
            crate::clock::now()
        };
        Timestamp { sec, nsec }
    }

    /// Whether a data write stamps the file's mtime and ctime (not when the caller keeps
    /// them: `Fs::set_caller_write_times`).
    pub(crate) fn write_stamps_times(&self) -> bool {
        !self.caller_write_times.load(Ordering::Relaxed)
    }
}

/// Record `raw` for typed field writes.
pub(crate) fn rec(raw: &mut [u8]) -> InodeRecord<&mut [u8]> {
    // Cannot fail: every record is `inode_size` bytes, at least 128 (checked at open).
    InodeRecord::new(raw).expect("inode record shorter than 128 bytes")
}

/// Record `raw` for typed field reads.
pub(crate) fn rec_ref(raw: &[u8]) -> InodeRecord<&[u8]> {
    // Cannot fail: as for `rec`.
    InodeRecord::new(raw).expect("inode record shorter than 128 bytes")
}

pub(crate) fn raw_set_size(raw: &mut [u8], v: u64) {
    rec(raw).set_size(v);
}

/// Adds `n` 512-byte sectors to `i_blocks` (records without HUGE_FILE_FL).
pub(crate) fn raw_add_blocks(raw: &mut [u8], n: u64) {
    let v = raw_blocks(raw).saturating_add(n);
    rec(raw).set_blocks(v);
}

/// Takes `n` 512-byte sectors from `i_blocks`.
pub(crate) fn raw_sub_blocks(raw: &mut [u8], n: u64) {
    let v = raw_blocks(raw).saturating_sub(n);
    rec(raw).set_blocks(v);
}

/// `i_blocks` in 512-byte sectors (records without HUGE_FILE_FL).
pub(crate) fn raw_blocks(raw: &[u8]) -> u64 {
    rec_ref(raw).blocks()
}

pub(crate) fn raw_size(raw: &[u8]) -> u64 {
    rec_ref(raw).size()
}

pub(crate) fn raw_flags(raw: &[u8]) -> u32 {
    rec_ref(raw).flags()
}

pub(crate) fn raw_set_flags(raw: &mut [u8], flags: u32) {
    rec(raw).set_flags(flags);
}

pub(crate) fn raw_links(raw: &[u8]) -> u16 {
    rec_ref(raw).links_count()
}

pub(crate) fn raw_set_links(raw: &mut [u8], n: u16) {
    rec(raw).set_links_count(n);
}

/// Sets ctime and mtime to `t` (a directory whose entries changed).
pub(crate) fn raw_touch_cm(raw: &mut [u8], t: Timestamp) {
    let mut r = rec(raw);
    r.set_time(TimeField::Ctime, t);
    r.set_time(TimeField::Mtime, t);
}

/// Sets ctime to `t`.
pub(crate) fn raw_touch_c(raw: &mut [u8], t: Timestamp) {
    rec(raw).set_time(TimeField::Ctime, t);
}

/// Sets every timestamp of a new inode, creation time included.
pub(crate) fn raw_init_times(raw: &mut [u8], t: Timestamp) {
    let mut r = rec(raw);
    for f in [TimeField::Atime, TimeField::Ctime, TimeField::Mtime, TimeField::Crtime] {
        r.set_time(f, t);
    }
}

impl FsInner {
    pub(crate) fn journal(&self) -> Result<&Arc<Journal>> {
        match &self.journal {
            Some(j) if !self.stopped_by_error() => Ok(j),
            _ => Err(Error::ReadOnly),
        }
    }

    /// Copies an inode's record into its inode-table block under `h`, with its checksum.
    pub(crate) fn mark_inode_dirty(&self, h: &Handle, inode: &Inode, raw: &mut [u8]) -> Result<()> {
        let _t = self.stats.time(crate::fs::stats::Op::MarkInodeDirty);
        // A size that delayed writes moved past data not yet written back is not journaled:
        // the record goes with the size whose data is on disk (the kernel's `i_disksize`),
        // so a crash never shows a file longer than what reached the disk.
        let size = raw_size(raw);
        let disk_size = crate::data::delalloc::disk_size(inode).filter(|&d| d < size);
        if let Some(d) = disk_size {
            raw_set_size(raw, d);
        }
        let written = self.write_record(h, inode, raw);
        // The copy in memory keeps its size, whether or not the record went out.
        if disk_size.is_some() {
            raw_set_size(raw, size);
            if self.sbi.metadata_csum {
                set_inode_checksum(raw, inode.csum_seed);
            }
        }
        // The quota claims of the change this record carries end with its write: after its
        // charge, or with its failure (quota/limits.rs).
        self.quota_settle(inode);
        written
    }

    /// [`FsInner::mark_inode_dirty`]'s write of `raw` as it is: checksum, quota charge, block.
    fn write_record(&self, h: &Handle, inode: &Inode, raw: &mut [u8]) -> Result<()> {
        if self.sbi.metadata_csum {
            set_inode_checksum(raw, inode.csum_seed);
        }
        let (blk, off) = self.inode_location(inode.ino);
        let buf = self.bread(blk, Some(inode.ino))?;
        if self.quota.is_on() {
            // The bytes in the table are the record as last charged (stable: the caller holds
            // the record's lock). Charged before the table is locked: adding a quota entry may
            // write the quota inode's record, perhaps into this very block.
            let old = self.quota_charge(inode, &buf.data()[off..off + raw.len()]);
            self.quota_update(h, inode, old, raw)?;
        }
        let mut data = h.write(&buf)?;
        data[off..off + raw.len()].copy_from_slice(raw);
        inode.last_tid.store(h.tid(), Ordering::Release);
        inode.dirtied.store(true, Ordering::Release);
        Ok(())
    }

    fn setattr(&self, ino: InodeNo, ch: &SetAttr) -> Result<()> {
        let journal = self.journal()?;
        let inode = self.iget_by_number(ino)?;
        // Where quota limits are enforced, a new owner must have room for the file, delayed
        // writes included: writers are kept out and the file is written back first
        // (quota/limits.rs).
        let transfer = self.quota.enforced() && (ch.uid.is_some() || ch.gid.is_some());
        let _op = transfer.then(|| self.stats.lock(crate::fs::stats::LockClass::OpLock, &inode.op_lock));
        if transfer {
            self.quota_transfer_prepare(&inode)?;
        }
        let h = journal.start(1)?;
        if self.quota.is_on() && (ch.uid.is_some() || ch.gid.is_some()) {
            // Entries for the new owner before the record is locked (quota/mod.rs).
            let [uid, gid, prj] = Self::quota_ids(&inode);
            self.quota_prepare(&h, [ch.uid.unwrap_or(uid), ch.gid.unwrap_or(gid), prj])?;
        }
        let mut raw = inode.raw_mut();
        let disk = fi::Inode::parse(&raw).ok_or(Error::InvalidInput("inode record too short"))?;
        if transfer {
            let to = [ch.uid.unwrap_or(disk.uid()), ch.gid.unwrap_or(disk.gid()), rec_ref(&raw).projid()];
            self.quota_transfer_check(&inode, &raw, to)?;
        }
        let mut mode = disk.mode();
        if let Some(m) = ch.mode {
            mode = (mode & fi::S_IFMT) | (m & 0o7777);
        }
        let owner_changes =
            ch.uid.is_some_and(|u| u != disk.uid()) || ch.gid.is_some_and(|g| g != disk.gid());
        if owner_changes && ch.mode.is_none() && disk.file_type() != fi::S_IFDIR {
            // As the VFS does on chown: drop set-user-ID, and set-group-ID where it means
            // "executable by group" rather than mandatory locking.
            mode &= !0o4000;
            if mode & 0o010 != 0 {
                mode &= !0o2000;
            }
        }
        let mut r = rec(&mut raw);
        r.set_mode(mode);
        if let Some(uid) = ch.uid {
            r.set_uid(uid);
        }
        if let Some(gid) = ch.gid {
            r.set_gid(gid);
        }
        let t = ch.ctime.unwrap_or_else(|| self.now());
        let pick = |s: TimeSet| match s {
            TimeSet::Now => t,
            TimeSet::At(x) => x,
        };
        if let Some(a) = ch.atime {
            r.set_time(TimeField::Atime, pick(a));
        }
        if let Some(m) = ch.mtime {
            r.set_time(TimeField::Mtime, pick(m));
        }
        r.set_time(TimeField::Ctime, t);
        self.mark_inode_dirty(&h, &inode, &mut raw)?;
        drop(raw);
        h.stop();
        Ok(())
    }

    fn fsync(&self, ino: InodeNo) -> Result<()> {
        let journal = self.journal()?;
        let inode = self.iget_by_number(ino)?;
        // The file's delayed writes get their blocks and go to the device first
        // (`file_write_and_wait_range` in ext4_sync_file).
        self.writeback_inode(&inode)?;
        // Taken first: an overwrite after this point is the next fsync's business.
        let data = inode.data_dirty.swap(false, Ordering::AcqRel);
        if inode.dirtied.load(Ordering::Acquire) {
            journal.commit_and_wait(inode.last_tid.load(Ordering::Acquire))?;
        }
        if data {
            // Overwrites in place carry no metadata; if the transaction above had already
            // committed, nothing flushed them yet (`blkdev_issue_flush` in ext4_sync_file).
            self.dev.flush()?;
        }
        Ok(())
    }
}

impl Fs {
    /// Changes an inode's mode, owner, times or size (`chmod`, `chown`, `utimensat`,
    /// `truncate`); the change time becomes now (or `changes.ctime`). Returns the new
    /// attributes.
    pub fn setattr(&self, ino: InodeNo, changes: &SetAttr) -> Result<Attr> {
        self.inner.op(crate::fs::stats::Op::Setattr, || {
            // `notify_change` and `do_truncate`: an immutable or append-only inode keeps its
            // mode, owner, size and explicit times; an immutable one any time at all.
            let flags = self.inner.iget_by_number(ino)?.flags();
            let set_times = [changes.atime, changes.mtime].iter().any(|t| matches!(t, Some(TimeSet::At(_))));
            let fixed = changes.mode.is_some()
                || changes.uid.is_some()
                || changes.gid.is_some()
                || changes.size.is_some()
                || set_times;
            let touched = changes.atime.is_some() || changes.mtime.is_some();
            if (flags & (fi::IMMUTABLE_FL | fi::APPEND_FL) != 0 && fixed)
                || (flags & fi::IMMUTABLE_FL != 0 && touched)
            {
                return Err(Error::NotPermitted);
            }
            if let Some(size) = changes.size {
                self.inner.truncate(ino, size)?;
            }
            let rest = SetAttr { size: None, ..changes.clone() };
            if changes.size.is_none() || rest != SetAttr::default() {
                self.inner.setattr(ino, &rest)?;
            }
            if let Some(mode) = changes.mode {
                // `ext4_setattr`: the access ACL follows the new mode.
                self.acl_chmod(ino, mode)?;
            }
            Ok(())
        })?;
        self.getattr(ino)
    }

    /// Stamps inode times from the kernel's coarse clock (`CLOCK_REALTIME_COARSE`) from now
    /// on, or from the precise one again. For a user that mixes the filesystem's times
    /// with times the kernel stamped itself, as the FUSE writeback cache does: a file made
    /// by the engine then never shows a birth time after the modification time the kernel
    /// gave its first write.
    pub fn set_coarse_time(&self, on: bool) {
        self.inner.coarse_time.store(on, Ordering::Relaxed);
    }

    /// Leaves the modification and change times of data writes to the caller from now on
    /// (or stamps them again): for a user that stamps them at the write itself and sends
    /// them with a later `setattr`, as the FUSE writeback cache does (the kernel sets them at
    /// `write(2)` and sends its writes later, with its times only when they changed). A
    /// write stamping its arrival would move them past what the kernel showed. Size changes
    /// are still the write's.
    pub fn set_caller_write_times(&self, on: bool) {
        self.inner.caller_write_times.store(on, Ordering::Relaxed);
    }

    /// Makes the inode's changes durable (`fsync`): waits for the commit of the last
    /// transaction that touched it, sharing that commit with every other waiter.
    pub fn fsync(&self, ino: InodeNo) -> Result<()> {
        self.inner.op(crate::fs::stats::Op::Fsync, || self.inner.fsync(ino))
    }
}
