//! Access times on reads (the kernel's `touch_atime`, `atime_needs_update` and
//! `relatime_need_update` in fs/inode.c; ext4 journals the change through `ext4_dirty_inode`):
//! reading a file's data or a directory's entries sets its access time to now when
//! [`AtimeMode`] says so.
//!
//! # Locking
//! The check uses times the read copied from the record when it looked at it anyway, and
//! takes no lock. An update happens after the read has let go of `data_sem` (as the kernel's
//! `file_accessed` comes after the copy) and takes what `setattr` takes: handle ->
//! `Inode::raw` (write) -> inode-table `Buffer::data`.

use crate::attr::Timestamp;
use crate::error::Result;
use crate::fs::FsInner;
use crate::inode::write::rec;
use crate::inode::Inode;
use rext4_format::inode::{self as fi, NOATIME_FL, OFF_ATIME_EXTRA};
use rext4_format::inode_record::TimeField;
use std::sync::atomic::Ordering;

/// When reads set access times (the kernel's `relatime`, `noatime` and `strictatime` mount
/// options). Writes set them regardless (`utimensat`, new inodes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtimeMode {
    /// Only when the access time is not later than the modification or change time, or is a
    /// day old or more: a reader can still tell whether a file was read since it changed
    /// (the kernel's default).
    #[default]
    Relatime,
    /// Never.
    NoAtime,
    /// On every read (the kernel's `strictatime`, the old `atime`).
    StrictAtime,
}

/// A relatime access time older than this is renewed by any read.
const DAY_SECS: i64 = 24 * 60 * 60;

/// What deciding on an update needs of a record, copied while a reader looked at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AtimeFacts {
    atime: Timestamp,
    mtime: Timestamp,
    ctime: Timestamp,
    /// `chattr +A` (`NOATIME_FL`).
    noatime_fl: bool,
    dir: bool,
}

impl AtimeFacts {
    pub(crate) fn of(d: &fi::Inode, inode_size: usize) -> AtimeFacts {
        AtimeFacts {
            atime: d.atime(inode_size),
            mtime: d.mtime(inode_size),
            ctime: d.ctime(inode_size),
            noatime_fl: d.flags() & NOATIME_FL != 0,
            dir: d.file_type() == fi::S_IFDIR,
        }
    }
}

/// `relatime_need_update`: the access time is not after the modification or change time, or
/// is a day old.
fn relatime_need_update(f: &AtimeFacts, now: Timestamp) -> bool {
    f.mtime >= f.atime || f.ctime >= f.atime || now.sec.saturating_sub(f.atime.sec) >= DAY_SECS
}

impl FsInner {
    /// Now as the filesystem stores it (the kernel's `current_time`): whole seconds when the
    /// records have no room for `i_atime_extra` (128-byte inodes).
    fn atime_now(&self) -> Timestamp {
        let mut t = self.now();
        if self.sbi.inode_size < OFF_ATIME_EXTRA + 4 {
            t.nsec = 0;
        }
        t
    }

    /// `atime_needs_update`: whether a read of an inode described by `f` at `now` sets its
    /// access time. Never on a read-only filesystem (or one an error stopped), never for
    /// `NOATIME_FL`, `noatime`, or a directory under `nodiratime`; then as the mode says, and
    /// never to the time it already holds.
    pub(crate) fn atime_needs_update(&self, f: &AtimeFacts, now: Timestamp) -> bool {
        if self.atime == AtimeMode::NoAtime
            || self.journal.is_none()
            || self.stopped_by_error()
            || f.noatime_fl
            || (f.dir && self.nodiratime)
        {
            return false;
        }
        if self.atime == AtimeMode::Relatime && !relatime_need_update(f, now) {
            return false;
        }
        f.atime != now
    }

    /// Whether a read may set an access time at all: not under `noatime`, not read-only. A
    /// reader that gets `false` need not copy the times out of the record, nor read the clock.
    pub(crate) fn atime_may_change(&self) -> bool {
        self.atime != AtimeMode::NoAtime && self.journal.is_some()
    }

    /// Whether a read of `inode` now would set its access time (a cache in front of the
    /// engine asks before it answers reads itself); the caller checked `atime_may_change`.
    pub(crate) fn read_would_set_atime(&self, inode: &Inode) -> bool {
        let f = inode.with_disk(|r| AtimeFacts::of(r, self.sbi.inode_size));
        self.atime_needs_update(&f, self.atime_now())
    }

    /// `touch_atime`, after a read of `inode` whose record said `f`; the caller holds no lock.
    /// An update that fails is dropped, as the kernel drops it: the read itself succeeded.
    pub(crate) fn touch_atime(&self, inode: &Inode, f: &AtimeFacts) {
        let now = self.atime_now();
        if self.atime_needs_update(f, now) {
            let _ = self.update_atime(inode, now);
        }
    }

    /// Stores access time `now` in `inode`'s record under a handle of its own (the kernel's
    /// `generic_update_time` -> `ext4_dirty_inode`).
    fn update_atime(&self, inode: &Inode, now: Timestamp) -> Result<()> {
        let journal = self.journal()?;
        let h = journal.start(1)?;
        let mut raw = inode.raw_mut();
        let d = fi::Inode::parse(&raw).ok_or(crate::error::Error::InvalidInput("inode record too short"))?;
        // Looked at again under the lock: another reader may have set it meanwhile, or the
        // file may have lost its last link and been freed since the read (its record then
        // belongs to nobody, and writing it would undo the free).
        let live = d.links_count() != 0 || inode.is_held_orphan() || inode.linkable.load(Ordering::Acquire);
        if !live || !self.atime_needs_update(&AtimeFacts::of(&d, self.sbi.inode_size), now) {
            return Ok(());
        }
        rec(&mut raw).set_time(TimeField::Atime, now);
        self.mark_inode_dirty(&h, inode, &mut raw)?;
        drop(raw);
        h.stop();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(sec: i64, nsec: u32) -> Timestamp {
        Timestamp { sec, nsec }
    }

    fn facts(atime: Timestamp, mtime: Timestamp, ctime: Timestamp) -> AtimeFacts {
        AtimeFacts { atime, mtime, ctime, noatime_fl: false, dir: false }
    }

    #[test]
    fn relatime_rules() {
        let now = t(1_000_000, 0);
        // Not after the modification or the change time: renewed (equal counts).
        assert!(relatime_need_update(&facts(t(500, 0), t(500, 0), t(400, 0)), now));
        assert!(relatime_need_update(&facts(t(999_000, 5), t(999_000, 6), t(400, 0)), now));
        assert!(relatime_need_update(&facts(t(999_000, 5), t(400, 0), t(999_000, 5)), now));
        // After both and younger than a day: kept.
        assert!(!relatime_need_update(&facts(t(999_000, 7), t(999_000, 6), t(999_000, 6)), now));
        // A day old: renewed; a second short of it: kept.
        let old = now.sec - DAY_SECS;
        assert!(relatime_need_update(&facts(t(old, 0), t(1, 0), t(1, 0)), now));
        assert!(!relatime_need_update(&facts(t(old + 1, 0), t(1, 0), t(1, 0)), now));
        // An access time in the future is never a day old.
        assert!(!relatime_need_update(&facts(t(i64::MAX, 0), t(1, 0), t(1, 0)), t(i64::MIN, 0)));
    }
}
