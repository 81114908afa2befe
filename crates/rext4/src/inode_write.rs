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
use rext4_format::inode::{self as fi, encode_time, set_inode_checksum};
use rext4_format::InodeNo;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

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
}

pub(crate) fn now() -> Timestamp {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    Timestamp { sec: d.as_secs() as i64, nsec: d.subsec_nanos() }
}

/// Stores a timestamp into a record: seconds always, the extra word where the record has it.
pub(crate) fn put_time(raw: &mut [u8], inode_size: usize, sec_off: usize, extra_off: usize, t: Timestamp) {
    let (sec, extra) = encode_time(t);
    let extra_isize = if inode_size > fi::GOOD_OLD_INODE_SIZE {
        usize::from(u16::from_le_bytes([raw[fi::OFF_EXTRA_ISIZE], raw[fi::OFF_EXTRA_ISIZE + 1]]))
    } else {
        0
    };
    let fits =
        |off: usize| off + 4 <= fi::GOOD_OLD_INODE_SIZE || off + 4 <= fi::GOOD_OLD_INODE_SIZE + extra_isize;
    if !fits(sec_off) {
        return;
    }
    raw[sec_off..sec_off + 4].copy_from_slice(&sec.to_le_bytes());
    if extra_off >= fi::GOOD_OLD_INODE_SIZE && fits(extra_off) {
        raw[extra_off..extra_off + 4].copy_from_slice(&extra.to_le_bytes());
    }
}

pub(crate) fn raw_set_size(raw: &mut [u8], v: u64) {
    raw[4..8].copy_from_slice(&(v as u32).to_le_bytes());
    raw[0x6C..0x70].copy_from_slice(&((v >> 32) as u32).to_le_bytes());
}

/// Adds `n` 512-byte sectors to `i_blocks` (records without HUGE_FILE_FL).
pub(crate) fn raw_add_blocks(raw: &mut [u8], n: u64) {
    let cur = raw_blocks(raw);
    let v = cur.saturating_add(n);
    raw[0x1C..0x20].copy_from_slice(&(v as u32).to_le_bytes());
    raw[0x74..0x76].copy_from_slice(&((v >> 32) as u16).to_le_bytes());
}

/// Takes `n` 512-byte sectors from `i_blocks`.
pub(crate) fn raw_sub_blocks(raw: &mut [u8], n: u64) {
    let cur = raw_blocks(raw);
    let v = cur.saturating_sub(n);
    raw[0x1C..0x20].copy_from_slice(&(v as u32).to_le_bytes());
    raw[0x74..0x76].copy_from_slice(&((v >> 32) as u16).to_le_bytes());
}

/// `i_blocks` in 512-byte sectors (records without HUGE_FILE_FL).
pub(crate) fn raw_blocks(raw: &[u8]) -> u64 {
    u64::from(u32::from_le_bytes([raw[0x1C], raw[0x1D], raw[0x1E], raw[0x1F]]))
        | u64::from(u16::from_le_bytes([raw[0x74], raw[0x75]])) << 32
}

pub(crate) fn raw_size(raw: &[u8]) -> u64 {
    u64::from(u32::from_le_bytes([raw[4], raw[5], raw[6], raw[7]]))
        | u64::from(u32::from_le_bytes([raw[0x6C], raw[0x6D], raw[0x6E], raw[0x6F]])) << 32
}

pub(crate) fn raw_flags(raw: &[u8]) -> u32 {
    u32::from_le_bytes([raw[0x20], raw[0x21], raw[0x22], raw[0x23]])
}

pub(crate) fn raw_set_flags(raw: &mut [u8], flags: u32) {
    raw[0x20..0x24].copy_from_slice(&flags.to_le_bytes());
}

pub(crate) fn raw_links(raw: &[u8]) -> u16 {
    u16::from_le_bytes([raw[0x1A], raw[0x1B]])
}

pub(crate) fn raw_set_links(raw: &mut [u8], n: u16) {
    raw[0x1A..0x1C].copy_from_slice(&n.to_le_bytes());
}

/// Sets ctime and mtime to `t` (a directory whose entries changed).
pub(crate) fn raw_touch_cm(raw: &mut [u8], inode_size: usize, t: Timestamp) {
    put_time(raw, inode_size, 0x0C, fi::OFF_CTIME_EXTRA, t);
    put_time(raw, inode_size, 0x10, fi::OFF_MTIME_EXTRA, t);
}

/// Sets ctime to `t`.
pub(crate) fn raw_touch_c(raw: &mut [u8], inode_size: usize, t: Timestamp) {
    put_time(raw, inode_size, 0x0C, fi::OFF_CTIME_EXTRA, t);
}

/// Sets every timestamp of a new inode, creation time included.
pub(crate) fn raw_init_times(raw: &mut [u8], inode_size: usize, t: Timestamp) {
    put_time(raw, inode_size, 0x08, fi::OFF_ATIME_EXTRA, t);
    put_time(raw, inode_size, 0x0C, fi::OFF_CTIME_EXTRA, t);
    put_time(raw, inode_size, 0x10, fi::OFF_MTIME_EXTRA, t);
    put_time(raw, inode_size, fi::OFF_CRTIME, fi::OFF_CRTIME_EXTRA, t);
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
        let _t = self.stats.time(crate::stats::Op::MarkInodeDirty);
        if self.sbi.metadata_csum {
            set_inode_checksum(raw, inode.csum_seed);
        }
        let (blk, off) = self.inode_location(inode.ino);
        let buf = self.bread(blk, Some(inode.ino))?;
        let mut data = h.write(&buf)?;
        data[off..off + raw.len()].copy_from_slice(raw);
        inode.last_tid.store(h.tid(), Ordering::Release);
        inode.dirtied.store(true, Ordering::Release);
        Ok(())
    }

    fn setattr(&self, ino: InodeNo, ch: &SetAttr) -> Result<()> {
        let journal = self.journal()?;
        let h = journal.start(1)?;
        let inode = self.iget_by_number(ino)?;
        let size = self.sbi.inode_size;
        let mut raw = inode.raw_mut();
        let disk = fi::Inode::parse(&raw).ok_or(Error::InvalidInput("inode record too short"))?;
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
        raw[0..2].copy_from_slice(&mode.to_le_bytes());
        if let Some(uid) = ch.uid {
            raw[0x02..0x04].copy_from_slice(&(uid as u16).to_le_bytes());
            raw[0x78..0x7A].copy_from_slice(&((uid >> 16) as u16).to_le_bytes());
        }
        if let Some(gid) = ch.gid {
            raw[0x18..0x1A].copy_from_slice(&(gid as u16).to_le_bytes());
            raw[0x7A..0x7C].copy_from_slice(&((gid >> 16) as u16).to_le_bytes());
        }
        let t = now();
        let pick = |s: TimeSet| match s {
            TimeSet::Now => t,
            TimeSet::At(x) => x,
        };
        if let Some(a) = ch.atime {
            put_time(&mut raw, size, 0x08, fi::OFF_ATIME_EXTRA, pick(a));
        }
        if let Some(m) = ch.mtime {
            put_time(&mut raw, size, 0x10, fi::OFF_MTIME_EXTRA, pick(m));
        }
        put_time(&mut raw, size, 0x0C, fi::OFF_CTIME_EXTRA, t);
        self.mark_inode_dirty(&h, &inode, &mut raw)?;
        drop(raw);
        h.stop();
        Ok(())
    }

    fn fsync(&self, ino: InodeNo) -> Result<()> {
        let journal = self.journal()?;
        let inode = self.iget_by_number(ino)?;
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
    /// `truncate`); the change time becomes now. Returns the new attributes.
    pub fn setattr(&self, ino: InodeNo, changes: &SetAttr) -> Result<Attr> {
        let _t = self.inner.stats.time(crate::stats::Op::Setattr);
        self.inner.noting(crate::stats::Op::Setattr, || {
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

    /// Stores the modification time a writer kept in its own cache, as writing would have set
    /// it (`file_update_time`; the change time becomes now). Unlike [`Fs::setattr`], the
    /// append-only flag does not forbid it: the FUSE writeback cache flushes the times of its
    /// writes this way.
    pub fn update_write_time(&self, ino: InodeNo, mtime: Timestamp) -> Result<Attr> {
        let _t = self.inner.stats.time(crate::stats::Op::Setattr);
        self.inner.noting(crate::stats::Op::Setattr, || {
            if self.inner.iget_by_number(ino)?.flags() & fi::IMMUTABLE_FL != 0 {
                return Err(Error::NotPermitted);
            }
            self.inner.setattr(ino, &SetAttr { mtime: Some(TimeSet::At(mtime)), ..SetAttr::default() })?;
            Ok(())
        })?;
        self.getattr(ino)
    }

    /// Makes the inode's changes durable (`fsync`): waits for the commit of the last
    /// transaction that touched it, sharing that commit with every other waiter.
    pub fn fsync(&self, ino: InodeNo) -> Result<()> {
        let _t = self.inner.stats.time(crate::stats::Op::Fsync);
        self.inner.noted(crate::stats::Op::Fsync, self.inner.fsync(ino))
    }
}
