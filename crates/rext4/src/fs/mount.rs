//! Opening for writing and closing (the write side of the kernel's `super.c` and
//! `ext4_load_journal`): load the journal, mark the image in use, start the commit thread;
//! at close, commit and checkpoint everything and mark the image clean.

use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::{Fs, FsInner, Options};
use crate::jbd2::journal::{Journal, Log, LogGeometry};
use rext4_format::checksum::crc32c;
use rext4_format::features::{Compat, Incompat, RoCompat};
use rext4_format::jbd2::{JournalIncompat, CHKSUM_CRC32C};
use rext4_format::superblock::{
    split_time, Superblock, STATE_ERROR, STATE_VALID, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE,
};
use rext4_format::InodeNo;
use std::sync::Arc;
use zerocopy::IntoBytes;

pub(crate) fn now_secs() -> i64 {
    crate::clock::now().0
}

/// `s_free_inodes_count` from the counters: at most `s_inodes_count` (each group's count is
/// checked against the inodes per group at open), so the saturation is never reached.
fn free_inodes_u32(counters: &crate::alloc::counter::Counters) -> u32 {
    u32::try_from(counters.free_inodes.sum_positive()).unwrap_or(u32::MAX)
}

impl FsInner {
    /// Turns a freshly loaded, read-only filesystem into a writable one, applying the fast
    /// commits recovery found (`fs/fast_commit.rs`).
    pub(super) fn start_writing(
        &mut self,
        opts: &Options,
        fast_commits: &[rext4_format::fast_commit::Tag],
    ) -> Result<()> {
        self.sbi.check_writable()?;
        self.groups.check_writable(&self.sbi)?;
        // Before anything is written: a damaged quota file refuses the open, as it fails the
        // kernel's mount. Usage counts from here on, so the fast-commit replay and the orphan
        // cleanup below are charged.
        self.quota = self.load_quotas(opts.quota_limits)?;
        let log = self.load_log()?;
        let first_tid = log.jsb.as_ref().map_or(1, |j| j.sequence());
        // An abort the journal recorded without leaving anything to replay (recovery clears
        // it itself): the filesystem is marked as having errors below, and only once that
        // mark is durable is the journal's record cleared (`ext4_clear_journal_err`), so that
        // a crash between the two loses neither.
        let journal_errno = log.jsb.as_ref().map_or(0, |j| j.errno());
        let has_log = log.geo.is_some();
        self.orphans = Arc::new(crate::inode::orphan::Orphans::load(self, has_log)?);
        let (sb_blk, sb_off) = self.sbi.sb_location();
        let (groups, counters, bcache, sbi, orphans) = (
            self.groups.clone(),
            self.counters.clone(),
            self.bcache.clone(),
            self.sbi.clone(),
            self.orphans.clone(),
        );
        let fills = {
            let (groups, orphans) = (groups.clone(), orphans.clone());
            Box::new(move |blk: u64| groups.is_desc_block(blk) || blk == sb_blk || orphans.is_file_block(blk))
        };
        let fill = Box::new(move |blk: u64, data: &mut [u8]| {
            // Counts and checksums go into these blocks here, as the commit freezes them, not
            // under the locks of every writer. Nothing changes meanwhile. A bitmap
            // no longer cached has not changed since its checksum was last put here.
            if groups.is_desc_block(blk) {
                let seed = sbi.csum_seed;
                let bitmap_csum = |b: u64, n: usize| {
                    // Never this block itself, whose lock the commit holds (refused at open:
                    // `Groups::check_writable`).
                    if b == blk {
                        return None;
                    }
                    let buf = bcache.peek(b)?;
                    let map = buf.data();
                    Some(crc32c(seed, &map[..n.min(map.len())]))
                };
                groups.freeze_desc_block(&sbi, blk, data, bitmap_csum);
            }
            if blk == sb_blk {
                if let Some(mut sb) = Superblock::parse(&data[sb_off..]) {
                    sb.set_free_blocks_count(sbi.c2b(counters.free_blocks.sum_positive()));
                    sb.s_free_inodes_count.set(free_inodes_u32(&counters));
                    sb.s_last_orphan.set(orphans.head());
                    sb.update_checksum();
                    data[sb_off..sb_off + SUPERBLOCK_SIZE].copy_from_slice(sb.as_bytes());
                }
            }
            orphans.freeze_block(blk, data);
        });
        // The `discard` option, with a journal (without one, freed blocks are not kept busy
        // until a commit).
        let committed: Option<Box<dyn Fn(u32) + Send + Sync>> = if opts.discard && has_log {
            self.groups.discard.enable(first_tid.wrapping_sub(1));
            let (groups, sbi, dev) = (self.groups.clone(), self.sbi.clone(), self.dev.clone());
            Some(Box::new(move |tid| {
                let bs = u64::from(sbi.block_size);
                groups.discard_committed(&sbi, tid, |blk, n| {
                    let _ = dev.discard(blk * bs, n * bs);
                });
            }))
        } else {
            None
        };
        let freeze = crate::jbd2::journal::FreezeHook { fills, fill, committed };
        let journal = Arc::new(Journal::new(
            self.dev.clone(),
            self.sbi.block_size as usize,
            log,
            first_tid,
            opts.commit_interval,
            freeze,
            self.stats.clone(),
        ));
        // Mark the image in use: needs_recovery with a journal, not-clean without one; with an
        // orphan file, orphan_present (orphans may be recorded there from now on).
        self.update_super(|sb| {
            if has_log {
                sb.s_feature_incompat.set(sb.s_feature_incompat.get() | Incompat::RECOVER.bits());
                if sb.compat().contains(Compat::ORPHAN_FILE) {
                    let ro = sb.s_feature_ro_compat.get() | RoCompat::ORPHAN_PRESENT.bits();
                    sb.s_feature_ro_compat.set(ro);
                }
            } else {
                sb.s_state.set(sb.s_state.get() & !STATE_VALID);
            }
            if journal_errno != 0 {
                sb.s_state.set(sb.s_state.get() | STATE_ERROR);
            }
            sb.s_mnt_count.set(sb.s_mnt_count.get().wrapping_add(1));
            let (lo, hi) = split_time(now_secs());
            sb.s_mtime.set(lo);
            sb.s_mtime_hi = hi;
        })?;
        if journal_errno != 0 {
            let mut log = journal.log.lock();
            if let Some(jsb) = log.jsb.as_mut() {
                jsb.set_errno(0);
                let (start, sequence) = (jsb.start(), jsb.sequence());
                let bs = self.sbi.block_size as usize;
                crate::jbd2::checkpoint::write_jsb(bs, &mut log, start, sequence)?;
            }
        }
        let j = journal.clone();
        let thread = std::thread::Builder::new()
            .name("rext4-commit".into())
            .spawn(move || j.run())
            .map_err(Error::Io)?;
        *self.committer.lock() = Some(thread);
        self.journal = Some(journal);
        // Fast commits go before the orphans, as the kernel replays them in recovery.
        self.replay_fast_commits(fast_commits)?;
        // What a crash left recorded is freed or truncated now (`ext4_orphan_cleanup`).
        self.orphan_cleanup()
    }

    /// Reads the journal superblock and maps the log; an empty geometry without a journal.
    fn load_log(&self) -> Result<Log> {
        let none =
            Log { geo: None, jsb: None, head: 0, tail: 0, tail_tid: 1, used: 0, txns: Default::default() };
        let sb = &self.sbi.sb;
        if !sb.compat().contains(Compat::HAS_JOURNAL) {
            return Ok(none);
        }
        let jino = sb.s_journal_inum.get();
        // The same checks and mapping recovery uses (`ext4_get_journal_inode`,
        // `ext4_open_dev_journal`).
        let (map, mut jsb, _) = match (&self.ext_journal, jino) {
            (Some(ext), 0) => ext.log(self.sbi.block_size)?,
            (None, 0) => {
                return Err(Error::Incompatible(
                    "the journal is on an external device: give its path (Options::journal_path, \
                     --journal, -o journal_path=)"
                        .into(),
                ))
            }
            (_, ino) => self.journal_log(InodeNo(ino))?,
        };
        // Features as the kernel sets them at mount: checksums v3 with metadata_csum, 64-bit
        // block numbers on 64bit filesystems, revoke records.
        let mut inc = jsb.incompat() | JournalIncompat::REVOKE;
        if self.sbi.metadata_csum {
            inc = (inc - JournalIncompat::CSUM_V2) | JournalIncompat::CSUM_V3;
            jsb.s_checksum_type = CHKSUM_CRC32C;
            jsb.set_compat(jsb.compat() - rext4_format::jbd2::JournalCompat::CHECKSUM);
        }
        if sb.is_64bit() {
            inc |= JournalIncompat::BIT64;
        }
        jsb.set_incompat(inc);
        jsb.update_checksum();
        let params = jsb.params().map_err(|_| {
            Error::Corrupt(crate::error::Corrupt(CorruptKind::Journal("unusable journal features")))
        })?;
        let first = jsb.first();
        // With the fast-commit feature, the journal's last blocks are the fast-commit area:
        // the log wraps before them, where recovery stops reading.
        let last = jsb.log_end();
        if first >= last {
            return corrupt(CorruptKind::Journal("invalid first block of the log"));
        }
        let geo = LogGeometry { map, params, uuid: jsb.uuid(), first, last };
        let mut log = Log {
            geo: Some(geo),
            jsb: Some(jsb),
            head: first,
            tail: first,
            tail_tid: 0,
            used: 0,
            txns: Default::default(),
        };
        // An empty log starting at `first`, with the sequence the superblock carries: older
        // blocks in the log have smaller sequences and are never taken as part of it.
        let seq = log.jsb.as_ref().map_or(1, |j| j.sequence());
        log.tail_tid = seq;
        crate::jbd2::checkpoint::write_jsb(self.sbi.block_size as usize, &mut log, first, seq)?;
        Ok(log)
    }

    /// Changes the primary superblock directly (not through the journal: only at open and
    /// close, when no transaction is running), with its checksum, and makes it durable. The
    /// counts and the orphan list head are taken from memory: commits write them only into
    /// the frozen copies, so the cached bytes hold those of the open.
    pub(super) fn update_super(&self, f: impl FnOnce(&mut Superblock)) -> Result<()> {
        let (_, off) = self.sbi.sb_location();
        let mut data = self.sb_buf.data_mut(0);
        let Some(mut sb) = Superblock::parse(&data[off..]) else {
            return corrupt(CorruptKind::Superblock("unreadable"));
        };
        sb.set_free_blocks_count(self.sbi.c2b(self.counters.free_blocks.sum_positive()));
        sb.s_free_inodes_count.set(free_inodes_u32(&self.counters));
        sb.s_last_orphan.set(self.orphans.head());
        f(&mut sb);
        let (lo, hi) = split_time(now_secs());
        sb.s_wtime.set(lo);
        sb.s_wtime_hi = hi;
        sb.update_checksum();
        data[off..off + SUPERBLOCK_SIZE].copy_from_slice(sb.as_bytes());
        self.dev.write_at(sb.as_bytes(), SUPERBLOCK_OFFSET)?;
        self.dev.flush()?;
        Ok(())
    }

    /// Commits and checkpoints everything and marks the image clean, then ends multi-mount
    /// protection (its block clean last) and gives up the claim. Idempotent.
    pub(crate) fn close(&self) -> Result<()> {
        let closed = self.close_journal();
        if let Some(mmp) = &self.mmp {
            mmp.stop();
            // What stopped the writes, rather than the failed write it caused.
            if let (Err(_), Some(why)) = (&closed, mmp.conflict()) {
                return Err(Error::InUse(why));
            }
        }
        if closed? {
            // Clean on disk: another writer may have the image now.
            self.dev.release_claim();
        }
        Ok(())
    }

    /// The close up to the clean mark; `true` if it closed the filesystem just now.
    fn close_journal(&self) -> Result<bool> {
        let Some(journal) = &self.journal else { return Ok(false) };
        if self.committer.lock().is_none() {
            return Ok(false);
        }
        // Delayed writes go out before the last commit; the flusher stops first, so that
        // nothing is dirtied behind the final writeback by it.
        crate::data::writeback::stop_flusher(self);
        let written = if self.stopped_by_error() { Ok(()) } else { self.writeback_all() };
        let Some(thread) = self.committer.lock().take() else { return Ok(false) };
        let evicted = self.evict_held_orphans();
        journal.request_shutdown();
        let _ = thread.join();
        if let Some(why) = journal.abort_reason() {
            self.record_abort();
            return Err(Error::Io(std::io::Error::other(why)));
        }
        journal.close()?;
        evicted?;
        written?;
        let has_log = journal.log.lock().geo.is_some();
        let no_orphans = self.orphans.is_empty();
        self.update_super(|sb| {
            if has_log {
                sb.s_feature_incompat.set(sb.s_feature_incompat.get() & !Incompat::RECOVER.bits());
            }
            if no_orphans {
                let ro = sb.s_feature_ro_compat.get() & !RoCompat::ORPHAN_PRESENT.bits();
                sb.s_feature_ro_compat.set(ro);
            }
            sb.s_state.set(sb.s_state.get() | STATE_VALID);
        })?;
        Ok(true)
    }
}

impl Fs {
    /// Commits everything, writes it home and marks the image clean; the filesystem is
    /// read-only afterwards. Dropping the last handle does the same, ignoring errors.
    pub fn unmount(&self) -> Result<()> {
        self.inner.close()
    }

    /// Makes every change so far durable (`syncfs`).
    pub fn sync(&self) -> Result<()> {
        self.inner.op(crate::fs::stats::Op::Sync, || match &self.inner.journal {
            Some(j) => {
                self.inner.writeback_all()?;
                j.sync()
            }
            None => Ok(()),
        })
    }

    /// Whether the filesystem takes changes: opened for writing, and not stopped by an error
    /// under `errors=remount-ro` (see [`Fs::has_errors`]).
    pub fn is_writable(&self) -> bool {
        self.inner.journal.is_some() && !self.inner.stopped_by_error()
    }

    /// What corruption found by an operation does: [`crate::Options::errors`], or else the
    /// superblock's `errors=`.
    pub fn error_behavior(&self) -> crate::ErrorBehavior {
        self.inner.errors
    }

    /// Whether the image is marked as having errors (`s_state`): found by this filesystem since
    /// it was opened, or recorded before by it, the kernel or e2fsck's last run.
    pub fn has_errors(&self) -> bool {
        let (_, off) = self.inner.sbi.sb_location();
        let d = self.inner.sb_buf.data();
        Superblock::parse(&d[off..]).is_some_and(|sb| sb.s_state.get() & STATE_ERROR != 0)
    }

    /// Journal statistics: commits, per-commit times, blocks.
    pub fn commit_stats(&self) -> Option<crate::jbd2::CommitStats> {
        self.inner.journal.as_ref().map(|j| j.stats())
    }
}

impl Drop for FsInner {
    fn drop(&mut self) {
        let _ = self.close();
    }
}
