//! Checkpointing (the kernel's `fs/jbd2/checkpoint.c`): write committed blocks home, then move
//! the log tail past them in the journal superblock, freeing log space.

use super::journal::{Journal, Log};
use crate::dev::BlockDevice;
use crate::error::Result;

impl Journal {
    /// Writes every committed block home and empties the log. `next_tid` is the first
    /// transaction the log will hold afterwards. Commit thread (or close) only.
    pub(super) fn checkpoint_all(&self, log: &mut Log, next_tid: u32) -> Result<()> {
        let pending = std::mem::take(&mut *self.checkpoint.lock());
        let mut blocks: Vec<_> = pending.into_iter().collect();
        blocks.sort_unstable_by_key(|(blk, _)| *blk);
        self.write_home(blocks.iter().map(|(blk, p)| (*blk, &p.data[..])))?;
        // Home copies must be durable before the log forgets them.
        self.dev.flush()?;
        drop(blocks);
        log.tail = log.head;
        log.tail_tid = next_tid;
        log.used = 0;
        self.write_log_tail(log, log.head, next_tid)?;
        self.count_checkpoint();
        Ok(())
    }

    /// Writes blocks to their home locations, sorted by block number; runs of adjacent blocks
    /// go out in one call.
    pub(super) fn write_home<'a>(&self, blocks: impl Iterator<Item = (u64, &'a [u8])>) -> Result<()> {
        let bs = self.block_size as u64;
        let mut run: Vec<u8> = Vec::new();
        let mut run_start = 0u64;
        for (blk, data) in blocks {
            let contiguous = !run.is_empty() && blk == run_start + run.len() as u64 / bs;
            if !contiguous || run.len() >= 8 << 20 {
                if !run.is_empty() {
                    self.dev.write_at(&run, run_start * bs)?;
                }
                run.clear();
                run_start = blk;
            }
            run.extend_from_slice(data);
        }
        if !run.is_empty() {
            self.dev.write_at(&run, run_start * bs)?;
        }
        Ok(())
    }

    /// Records the log tail in the journal superblock (`start` 0 marks the log empty and
    /// clean) and makes it durable.
    pub(crate) fn write_log_tail(&self, log: &mut Log, start: u32, sequence: u32) -> Result<()> {
        write_jsb(&*self.dev, self.block_size, log, start, sequence)
    }

    /// Closes the journal: commits what is running, writes everything home and marks the log
    /// empty. After this the image needs no recovery.
    pub(crate) fn close(&self) -> Result<()> {
        self.check_aborted()?;
        let mut log = self.log.lock();
        let next = self.running_tid();
        self.checkpoint_all(&mut log, next)?;
        let head = log.head;
        if log.geo.is_some() {
            let _ = head;
            self.write_log_tail(&mut log, 0, next)?;
        }
        Ok(())
    }
}

/// Writes the journal superblock with the log starting at `start` and transaction `sequence`
/// next, and flushes: used at open (before the journal object exists) and at every tail move.
pub(crate) fn write_jsb(
    dev: &dyn BlockDevice,
    block_size: usize,
    log: &mut Log,
    start: u32,
    sequence: u32,
) -> Result<()> {
    let (Some(geo), Some(jsb)) = (log.geo.as_ref(), log.jsb.as_mut()) else { return Ok(()) };
    jsb.set_start(start);
    jsb.set_sequence(sequence);
    jsb.update_checksum();
    let bytes = zerocopy::IntoBytes::as_bytes(&*jsb);
    dev.write_at(bytes, geo.dev_block(0) * block_size as u64)?;
    dev.flush()?;
    Ok(())
}
