//! Recording errors in the superblock (the kernel's `ext4_handle_error` and
//! `save_error_info`). An operation on a writable filesystem that finds the image corrupt
//! marks it as having errors (`s_state`), counts the error (`s_error_count`) and keeps the
//! first and the last one's time, inode, block, operation and code, as `dumpe2fs -h` shows
//! them. The mark is what makes the next `e2fsck -p` check the whole filesystem instead of
//! trusting its clean state; without it a damaged image that rext4 had unmounted cleanly would
//! be passed over. The record goes through the journal, as the kernel's does when the
//! filesystem keeps running (`errors=continue`, what mkfs sets).
//!
//! With `errors=remount-ro` (in the superblock, or [`crate::Options::errors`], which overrides
//! it as the kernel's mount option does) the filesystem then takes no more changes: the record
//! is committed and every later change fails with `EROFS`, while reads go on. A library cannot
//! stop its process as the kernel's `errors=panic` does; it stops changes in the same way.
//!
//! Errors are recorded where they leave the library (the public operations of [`crate::Fs`]),
//! once each, under the operation's kernel name (`ext4_unlink`, ...), with no source line.

use crate::error::{Corrupt, Error, Result};
use crate::fs::stats::Op;
use crate::fs::{ErrorBehavior, FsInner};
use rext4_format::superblock::{split_time, Superblock, STATE_ERROR, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE};
use std::sync::atomic::Ordering;
use zerocopy::IntoBytes;

/// The code `s_*_error_errcode` keeps for `errno` (`ext4_errno_to_code`): a checksum mismatch
/// (`EFSBADCRC`, which is `EBADMSG`) is 4, other corruption (`EFSCORRUPTED`, `EUCLEAN`) 5, an
/// I/O error 2; an errno without a code of its own is 1.
fn errcode(errno: i32) -> u8 {
    match errno {
        libc::EIO => 2,
        libc::ENOMEM => 3,
        libc::EBADMSG => 4,
        libc::EUCLEAN => 5,
        libc::ENOSPC => 6,
        libc::ENOKEY => 7,
        libc::EROFS => 8,
        libc::EFBIG => 9,
        libc::EEXIST => 10,
        libc::ERANGE => 11,
        libc::EOVERFLOW => 12,
        libc::EBUSY => 13,
        libc::ENOTDIR => 14,
        libc::ENOTEMPTY => 15,
        libc::ESHUTDOWN => 16,
        libc::EFAULT => 17,
        _ => 1,
    }
}

impl FsInner {
    /// `r`, after recording it in the superblock if it says the image is corrupt (see the
    /// module comment). `op` is the public operation that returns it.
    pub(super) fn noted<T>(&self, op: Op, r: Result<T>) -> Result<T> {
        match &r {
            Err(Error::Corrupt(c)) => self.record_error(op, c),
            Err(_) => self.record_abort(),
            Ok(_) => {}
        }
        r
    }

    /// Runs public operation `op` (the one place public calls are timed and their errors
    /// noted): `f()` timed as `op`, and what it returns passed through [`FsInner::noted`].
    pub(crate) fn op<T>(&self, op: Op, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let _t = self.stats.time(op);
        self.noted(op, f())
    }

    /// [`FsInner::noted`] of `f()`.
    pub(crate) fn noting<T>(&self, op: Op, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.noted(op, f())
    }

    /// Whether changes are refused after an error (`errors=remount-ro`).
    pub(crate) fn stopped_by_error(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Records corruption `c`, found by `op`, in the superblock through the journal, and stops
    /// changes afterwards under `errors=remount-ro`. Called by [`FsInner::noted`] for what an
    /// operation returns, and directly for damage an operation met but did not return (an
    /// inode it could not free); the caller holds no journal handle. Best effort: nothing
    /// reports whether the record could be made. Nothing is recorded on a read-only
    /// filesystem.
    pub(crate) fn record_error(&self, op: Op, c: &Corrupt) {
        let Some(journal) = &self.journal else { return };
        let recorded = (|| -> Result<()> {
            let h = journal.start(1)?;
            let (_, off) = self.sbi.sb_location();
            let mut d = h.write(&self.sb_buf)?;
            let Some(mut sb) = Superblock::parse(&d[off..]) else { return Ok(()) };
            let (ino, block, code) = fields_of(c);
            record(&mut sb, op.name(), ino, block, code, crate::fs::mount::now_secs());
            d[off..off + SUPERBLOCK_SIZE].copy_from_slice(sb.as_bytes());
            Ok(())
        })();
        if self.errors == ErrorBehavior::RemountRo && !self.stopped_by_error() {
            // The record must reach the disk before changes stop: nothing commits it later
            // but the unmount.
            if recorded.is_ok() {
                let _ = journal.sync();
            }
            self.stopped.store(true, Ordering::Release);
        }
    }

    /// Records, once, that the journal aborted (an I/O error writing the log or a block's
    /// home copy, or an operation that panicked): the kernel's `ext4_abort` when a journal
    /// start finds the journal aborted ("Detected aborted journal"), which counts the error
    /// under `ext4_journal_check_start` with the abort's errno and stops all changes. The
    /// record goes straight into the superblock on disk, as nothing commits any more (replay
    /// at the next open keeps it: `jbd2/replay.rs`, `ERR_RANGE`), and into the cached copy for
    /// [`crate::Fs::has_errors`]. Best effort, as the device may be what failed: the journal
    /// superblock's errno (`Journal::write_errno`, written first) makes the next mount mark
    /// the image anyway. Called on every failed operation's way out ([`FsInner::noted`]) and
    /// at close; the caller holds no lock.
    pub(super) fn record_abort(&self) {
        // After the first, a failed operation costs two atomic loads here.
        let Some(journal) = self.journal.as_ref().filter(|j| j.is_aborted()) else { return };
        if self.abort_recorded.load(Ordering::Acquire) || self.abort_recorded.swap(true, Ordering::AcqRel) {
            return;
        }
        self.stopped.store(true, Ordering::Release);
        journal.write_errno();
        // Set before the journal's abort flag: cannot be missing.
        let Some(errno) = journal.abort_errno() else { return };
        let (code, now) = (errcode(errno), crate::fs::mount::now_secs());
        let mark = |raw: &mut [u8]| {
            let Some(mut sb) = Superblock::parse(raw) else { return };
            record(&mut sb, "ext4_journal_check_start", 0, 0, code, now);
            sb.update_checksum();
            raw.copy_from_slice(sb.as_bytes());
        };
        let (_, off) = self.sbi.sb_location();
        mark(&mut self.sb_buf.data_mut(0)[off..off + SUPERBLOCK_SIZE]);
        // Under `cp_run`, so that a checkpoint writing the superblock's block home cannot
        // put an older copy over the record.
        let _run = journal.cp_run.lock();
        let mut raw = [0u8; SUPERBLOCK_SIZE];
        if self.dev.read_at(&mut raw, SUPERBLOCK_OFFSET).is_ok() {
            mark(&mut raw);
            let _ = self.dev.write_at(&raw, SUPERBLOCK_OFFSET).and_then(|()| self.dev.flush());
        }
    }
}

/// What the record keeps of corruption `c`: its inode, its block and its code.
fn fields_of(c: &Corrupt) -> (u32, u64, u8) {
    (c.inode().map_or(0, |i| i.0), c.block().map_or(0, |b| b.0), errcode(c.errno()))
}

/// Adds one error to `sb`'s record (`__save_error_info`): the first one's fields are kept
/// once set, the last one's always replaced.
fn record(sb: &mut Superblock, func: &str, ino: u32, block: u64, code: u8, now: i64) {
    let mut name = [0u8; 32];
    let n = func.len().min(name.len());
    name[..n].copy_from_slice(&func.as_bytes()[..n]);
    sb.s_state.set(sb.s_state.get() | STATE_ERROR);
    sb.s_error_count.set(sb.s_error_count.get().saturating_add(1));
    if sb.s_first_error_time.get() == 0 && sb.s_first_error_time_hi == 0 {
        let (lo, hi) = split_time(now);
        sb.s_first_error_time.set(lo);
        sb.s_first_error_time_hi = hi;
        sb.s_first_error_ino.set(ino);
        sb.s_first_error_block.set(block);
        sb.s_first_error_func = name;
        sb.s_first_error_line.set(0);
        sb.s_first_error_errcode = code;
    }
    let (lo, hi) = split_time(now);
    sb.s_last_error_time.set(lo);
    sb.s_last_error_time_hi = hi;
    sb.s_last_error_ino.set(ino);
    sb.s_last_error_block.set(block);
    sb.s_last_error_func = name;
    sb.s_last_error_line.set(0);
    sb.s_last_error_errcode = code;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::CorruptKind;
    use rext4_format::{InodeNo, PhysBlock};
    use zerocopy::FromZeros;

    #[test]
    fn first_error_is_kept_and_last_replaced() {
        let mut sb = Superblock::new_zeroed();
        let bad_dir =
            Corrupt(CorruptKind::DirEntry { ino: InodeNo(12), block: Some(PhysBlock(700)), what: "x" });
        let bad_sum = Corrupt(CorruptKind::InodeChecksum { ino: InodeNo(13) });
        let ((i1, b1, c1), (i2, b2, c2)) = (fields_of(&bad_dir), fields_of(&bad_sum));
        record(&mut sb, "ext4_unlink", i1, b1, c1, 1 << 33);
        record(&mut sb, "ext4_lookup", i2, b2, c2, 5);
        assert_eq!(sb.s_state.get() & STATE_ERROR, STATE_ERROR);
        assert_eq!(sb.s_error_count.get(), 2);
        assert_eq!((sb.s_first_error_time.get(), sb.s_first_error_time_hi), (0, 2));
        assert_eq!(sb.s_first_error_ino.get(), 12);
        assert_eq!(sb.s_first_error_block.get(), 700);
        assert_eq!(&sb.s_first_error_func[..12], b"ext4_unlink\0");
        assert_eq!(sb.s_first_error_errcode, 5, "EXT4_ERR_EFSCORRUPTED");
        assert_eq!((sb.s_last_error_time.get(), sb.s_last_error_time_hi), (5, 0));
        assert_eq!(sb.s_last_error_ino.get(), 13);
        assert_eq!(sb.s_last_error_block.get(), 0);
        assert_eq!(&sb.s_last_error_func[..12], b"ext4_lookup\0");
        assert_eq!(sb.s_last_error_errcode, 4, "EXT4_ERR_EFSBADCRC");
    }

    #[test]
    fn errnos_map_to_the_kernels_codes() {
        let codes =
            [(libc::EIO, 2), (libc::ENOSPC, 6), (libc::EROFS, 8), (libc::EFAULT, 17), (libc::EPERM, 1)];
        for (errno, code) in codes {
            assert_eq!(errcode(errno), code, "errno {errno}");
        }
    }
}
