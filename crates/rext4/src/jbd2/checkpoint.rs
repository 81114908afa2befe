//! Checkpointing (the kernel's `fs/jbd2/checkpoint.c`): write committed blocks home, then move
//! the log tail past the oldest transactions, freeing log space.
//!
//! Checkpoints run beside commits: on the checkpoint thread once the log is half used, on the
//! committer only when the log is full, and at close. A checkpoint of the transactions up
//! to `T` writes home every pending copy last logged by a transaction up to `T` (a block
//! logged again later keeps its newer copy in the log, so it need not go home yet), flushes,
//! prunes those copies and moves the tail to the first transaction after `T`. Home writes hold
//! no journal lock but `cp_run`; the tail is read and moved under `log`.
//!
//! Freed blocks: the commit of the transaction that freed a block drops its pending copy and,
//! before the commit is published (which lets the block be allocated again, see `busy` in
//! alloc/balloc.rs), waits for a home write of it that a checkpoint has in flight. Until then a
//! checkpoint may still write the copy home: the block is allocated in every state a crash
//! can leave, and that copy is its newest committed contents.

use super::journal::{jbd2_after, Journal, Log};
use crate::dev::BlockDevice;
use crate::error::{Error, Result};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Blocks written home per batch: a freeing commit waits for at most one batch.
const BATCH_BLOCKS: usize = 256;

/// Clears the in-flight batch and wakes commits waiting on it, also when the write failed.
struct Inflight<'a>(&'a Journal);

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        let mut cp = self.0.checkpoint.lock();
        cp.inflight.clear();
        self.0.cp_written.notify_all();
    }
}

impl Journal {
    /// The checkpoint thread: checkpoints on request until stopped.
    pub(super) fn checkpoint_thread(&self) {
        loop {
            {
                let mut req = self.cp_req.lock();
                while !req.wanted && !req.stop {
                    self.cp_wake.wait(&mut req);
                }
                if req.stop {
                    return;
                }
                req.wanted = false;
            }
            if self.check_aborted().is_err() {
                continue;
            }
            let done = {
                let _run = self.cp_run.lock();
                self.checkpoint_to(self.log_capacity() / 4)
            };
            if let Err(e) = done {
                self.abort(format!("journal checkpoint failed: {e}"), e.errno());
            }
        }
    }

    /// Asks the checkpoint thread to free log space.
    pub(super) fn request_checkpoint(&self) {
        let mut req = self.cp_req.lock();
        req.wanted = true;
        self.cp_wake.notify_all();
    }

    /// Makes room for `needed` more log blocks, waiting for a running checkpoint or
    /// checkpointing here (the committer only, holding no journal lock). Returns the time it
    /// took.
    pub(super) fn make_room(&self, needed: u32) -> Result<Duration> {
        let capacity = self.log_capacity();
        let fits = |log: &Log| log.used + needed <= capacity;
        if fits(&self.log.lock()) {
            return Ok(Duration::ZERO);
        }
        let began = Instant::now();
        self.count_log_full_wait();
        let _run = self.cp_run.lock();
        if needed > capacity {
            return Err(Error::InvalidInput("transaction larger than the journal"));
        }
        let goal = (capacity - needed).min(capacity / 4);
        if !fits(&self.log.lock()) {
            self.checkpoint_to(goal)?;
        }
        Ok(began.elapsed())
    }

    /// Checkpoints the oldest transactions until at most `goal` log blocks stay in use (as
    /// the log was when it began). The caller holds `cp_run`.
    pub(super) fn checkpoint_to(&self, goal: u32) -> Result<()> {
        let began = Instant::now();
        // The newest transaction to checkpoint: commits add to the log meanwhile, but every
        // transaction listed here has its copies in the pending list (added under `log`).
        let target = {
            let log = self.log.lock();
            let mut left = log.used;
            let mut target = None;
            for t in &log.txns {
                if left <= goal {
                    break;
                }
                left -= t.blocks;
                target = Some(t.tid);
            }
            target
        };
        let Some(target) = target else { return Ok(()) };
        let mut copies: Vec<(u64, Arc<[u8]>)> = {
            let cp = self.checkpoint.lock();
            cp.pending
                .iter()
                .filter(|(_, p)| !jbd2_after(p.tid, target))
                .map(|(&blk, p)| (blk, p.data.clone()))
                .collect()
        };
        copies.sort_unstable_by_key(|c| c.0);
        let mut written = 0u64;
        for chunk in copies.chunks(BATCH_BLOCKS) {
            // Only copies still pending as they were: a freeing commit may have dropped one
            // and a newer commit replaced another since. The rest are in flight until written.
            let batch: Vec<&(u64, Arc<[u8]>)> = {
                let mut cp = self.checkpoint.lock();
                let batch: Vec<_> = chunk
                    .iter()
                    .filter(|(blk, data)| cp.pending.get(blk).is_some_and(|p| Arc::ptr_eq(&p.data, data)))
                    .collect();
                cp.inflight = batch.iter().map(|c| c.0).collect();
                batch
            };
            let _inflight = Inflight(self);
            self.write_home(batch.iter().map(|(blk, data)| (*blk, &data[..])))?;
            written += batch.len() as u64;
        }
        // Home copies must be durable before the log lets go of them.
        if written > 0 {
            self.dev.flush()?;
        }
        // Copies added since belong to later transactions; a copy of a block freed since was
        // dropped by the freeing commit. Everything still here up to `target` went home.
        self.checkpoint.lock().pending.retain(|_, p| jbd2_after(p.tid, target));
        self.move_tail(target)?;
        self.count_checkpoint(written, began.elapsed());
        Ok(())
    }

    /// Moves the log tail past transaction `target` and everything before it. The journal
    /// superblock is written before the freed log space is handed to commits (until then a
    /// crash recovers from the old tail, whose transactions are still intact), and without
    /// `log` held, so that commits go on meanwhile. The caller holds `cp_run`.
    fn move_tail(&self, target: u32) -> Result<()> {
        let (pop, start, sequence, mut jsb, jsb_at) = {
            let log = self.log.lock();
            let pop = log.txns.iter().take_while(|t| !jbd2_after(t.tid, target)).count();
            let (Some(geo), Some(jsb)) = (log.geo.as_ref(), log.jsb.clone()) else { return Ok(()) };
            if pop == 0 {
                return Ok(());
            }
            // The first transaction left, or, with none left, the next one to be written: it
            // starts at the head (a commit appends and records itself under `log`).
            let (start, sequence) = match log.txns.get(pop) {
                Some(t) => (t.start, t.tid),
                None => (log.head, log.txns[pop - 1].tid.wrapping_add(1)),
            };
            (pop, start, sequence, jsb, (geo.map.dev().clone(), geo.dev_block(geo.map.sb_block())))
        };
        write_jsb_at(&*jsb_at.0, self.block_size, jsb_at.1, &mut jsb, start, sequence)?;
        let mut log = self.log.lock();
        for _ in 0..pop {
            if let Some(t) = log.txns.pop_front() {
                log.used -= t.blocks;
            }
        }
        log.tail = start;
        log.tail_tid = sequence;
        log.jsb = Some(jsb);
        Ok(())
    }

    /// Writes blocks to their home locations, sorted by block number; runs of adjacent blocks
    /// go out in one vectored call, straight from the copies (no gathering copy of our own).
    pub(super) fn write_home<'a>(&self, blocks: impl Iterator<Item = (u64, &'a [u8])>) -> Result<()> {
        let bs = self.block_size as u64;
        let mut run: Vec<&[u8]> = Vec::new();
        let mut run_start = 0u64;
        for (blk, data) in blocks {
            let contiguous = !run.is_empty() && blk == run_start + run.len() as u64;
            if !contiguous {
                if !run.is_empty() {
                    self.dev.write_vectored_at(&run, run_start * bs)?;
                }
                run.clear();
                run_start = blk;
            }
            run.push(data);
        }
        if !run.is_empty() {
            self.dev.write_vectored_at(&run, run_start * bs)?;
        }
        Ok(())
    }

    /// Records the log tail in the journal superblock (`start` 0 marks the log empty and
    /// clean) and makes it durable.
    pub(super) fn write_log_tail(&self, log: &mut Log, start: u32, sequence: u32) -> Result<()> {
        write_jsb(self.block_size, log, start, sequence)
    }

    /// Closes the journal (after the commit and checkpoint threads have stopped): writes
    /// everything home and marks the log empty. After this the image needs no recovery.
    pub(crate) fn close(&self) -> Result<()> {
        self.check_aborted()?;
        let _run = self.cp_run.lock();
        self.checkpoint_to(0)?;
        let next = self.running_tid();
        let mut log = self.log.lock();
        if log.geo.is_some() {
            self.write_log_tail(&mut log, 0, next)?;
        }
        Ok(())
    }
}

/// Writes the journal superblock with the log starting at `start` and transaction `sequence`
/// next, and flushes: used at open (before the journal object exists) and at close.
pub(crate) fn write_jsb(block_size: usize, log: &mut Log, start: u32, sequence: u32) -> Result<()> {
    let (Some(geo), Some(jsb)) = (log.geo.as_ref(), log.jsb.as_mut()) else { return Ok(()) };
    write_jsb_at(&**geo.map.dev(), block_size, geo.dev_block(geo.map.sb_block()), jsb, start, sequence)
}

/// Writes `jsb` at device block `at` with the given start and sequence, and flushes.
fn write_jsb_at(
    dev: &dyn BlockDevice,
    block_size: usize,
    at: u64,
    jsb: &mut rext4_format::jbd2::JournalSuperblock,
    start: u32,
    sequence: u32,
) -> Result<()> {
    jsb.set_start(start);
    jsb.set_sequence(sequence);
    jsb.update_checksum();
    let bytes = zerocopy::IntoBytes::as_bytes(&*jsb);
    dev.write_at(bytes, at * block_size as u64)?;
    dev.flush()?;
    Ok(())
}
