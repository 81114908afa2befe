//! Committing a transaction (the kernel's `fs/jbd2/commit.c`): freeze its buffers, write revoke
//! records, descriptor blocks with the journaled copies, then the commit block behind a flush.
//! Without a journal, the frozen copies go straight home.

use super::journal::{Journal, Log, LogGeometry, LogShape, LogTxn, Pending};
use super::transaction::Transaction;
use crate::error::{Error, Result};
use rext4_format::jbd2::{CommitHeader, DescriptorBuilder, RevokeBuilder};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

impl Journal {
    /// Commits `t`: called by whoever set `committing` (the commit thread or a waiter).
    /// `wake_early`: wake the handle starts waiting for the next transaction as soon as it
    /// is installed, rather than when this commit ends (see `Journal::run_commit`).
    pub(super) fn commit(&self, t: &Arc<Transaction>, wake_early: bool) -> Result<()> {
        let began = Instant::now();
        self.lock_and_drain(t);
        // A handle that ended in a panic aborted the journal: its changes are half done.
        self.check_aborted()?;
        // No handle is open on `t` and none can join: its buffers are stable. Each must be
        // frozen as it is now before the next transaction writes to it.
        let buffers = t.take_buffers();
        // Blocks completed from atomics are copied now, while nothing changes; the others are
        // only marked, and copied once the next transaction runs (by this commit, or by the
        // first writer there, see `Buffer::take_frozen`), so handle starts wait for the
        // drain alone.
        let mut filled: Vec<Option<Arc<[u8]>>> = Vec::with_capacity(buffers.len());
        for b in &buffers {
            if (self.freeze.fills)(b.blk) {
                filled.push(Some(b.fill_and_copy(|data| (self.freeze.fill)(b.blk, data))));
            } else {
                b.set_freeze_due();
                filled.push(None);
            }
        }
        let revoked = t.take_revoked();
        self.install_next(t, wake_early);
        let frozen: Vec<(u64, Arc<[u8]>)> =
            buffers.iter().zip(filled).map(|(b, f)| (b.blk, f.unwrap_or_else(|| b.take_frozen()))).collect();

        let nblocks = frozen.len() as u64;
        let mut room_wait = Duration::ZERO;
        let mut used = None;
        if let Some(shape) = self.shape {
            let blocks = self.build_transaction(&shape, t.tid, &frozen, &revoked)?;
            let needed = shape.blocks_for(frozen.len(), revoked.len());
            // A full log waits for (or runs) a checkpoint; that time is not the commit's.
            room_wait = self.make_room(needed)?;
            let mut log = self.log.lock();
            self.write_transaction(&mut log, t.tid, &shape, &blocks)?;
            // Under `log`, so that a checkpoint that finds this transaction in the log also
            // finds its copies.
            let mut cp = self.checkpoint.lock();
            let mut replaced = Vec::with_capacity(buffers.len());
            for (b, (blk, data)) in buffers.into_iter().zip(frozen) {
                replaced.extend(cp.pending.insert(blk, Pending { _pin: b, data, tid: t.tid }));
            }
            // Blocks this transaction freed: their copies must never reach home once the
            // commit is published (the blocks may then be reused, as data written straight
            // home), so drop them and wait out a home write of one already in flight.
            for blk in &revoked {
                cp.pending.remove(blk);
            }
            used = Some((log.used, shape.capacity));
            drop(log);
            while revoked.iter().any(|b| cp.inflight.binary_search(b).is_ok()) {
                self.cp_written.wait(&mut cp);
            }
            drop(cp);
            // Older copies are freed with no lock held.
            drop(replaced);
        } else {
            // No journal: write home, then flush, as ext4's nojournal mode does at sync.
            self.write_home(frozen.iter().map(|(blk, d)| (*blk, &d[..])))?;
            self.dev.flush()?;
        }
        self.committed(t.tid, began.elapsed().saturating_sub(room_wait), nblocks, u64::from(t.handles()));
        // Reclaim log space early, beside later commits: fsync never waits for home writes
        // unless the log fills up.
        if let Some((used, capacity)) = used {
            if used > capacity / 2 {
                self.request_checkpoint();
            }
        }
        Ok(())
    }

    /// Lays out a transaction's log blocks before its commit block: revoke blocks, then
    /// descriptor blocks each followed by the copies it describes. The frozen copies are
    /// written from where they lie; only escaped ones are copied again.
    fn build_transaction<'a>(
        &self,
        shape: &LogShape,
        tid: u32,
        frozen: &'a [(u64, Arc<[u8]>)],
        revoked: &[u64],
    ) -> Result<Vec<Cow<'a, [u8]>>> {
        let params = shape.params;
        let mut out: Vec<Cow<'a, [u8]>> =
            Vec::with_capacity(shape.blocks_for(frozen.len(), revoked.len()) as usize);
        for chunk in revoked.chunks(shape.per_revoke) {
            let mut rb = RevokeBuilder::new(&params, tid);
            for &b in chunk {
                rb.push(b).map_err(|_| Error::InvalidInput("revoke record does not fit"))?;
            }
            if let Some(block) = rb.finish() {
                out.push(Cow::Owned(block));
            }
        }
        for chunk in frozen.chunks(shape.per_desc) {
            let mut desc = DescriptorBuilder::new(&params, tid, shape.uuid);
            let at = out.len();
            out.push(Cow::Borrowed(&[]));
            for (blk, data) in chunk {
                let escaped = desc
                    .push_shared(*blk, data)
                    .map_err(|_| Error::InvalidInput("descriptor tag does not fit"))?;
                out.push(escaped.map_or(Cow::Borrowed(&data[..]), Cow::Owned));
            }
            out[at] = Cow::Owned(desc.finish().ok_or(Error::InvalidInput("empty descriptor block"))?);
        }
        Ok(out)
    }

    /// Writes a transaction laid out by `build_transaction` into the log at the head (which
    /// `make_room` made room for), then its commit block, and records where it lies.
    fn write_transaction(
        &self,
        log: &mut Log,
        tid: u32,
        shape: &LogShape,
        blocks: &[Cow<'_, [u8]>],
    ) -> Result<()> {
        let needed = blocks.len() as u32 + 1;
        if log.used + needed > shape.capacity {
            return Err(Error::InvalidInput("no room in the journal"));
        }
        let (start, used_before) = (log.head, log.used);
        let blocks: Vec<&[u8]> = blocks.iter().map(|b| &b[..]).collect();
        self.log_write(log, &blocks)?;
        // Everything of the transaction must be durable before its commit block.
        self.dev.flush()?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let commit = CommitHeader::new(tid, now.as_secs(), now.subsec_nanos()).to_block(&shape.params);
        self.log_write(log, &[&commit])?;
        self.dev.flush()?;
        log.txns.push_back(LogTxn { tid, start, blocks: log.used - used_before });
        Ok(())
    }

    /// Writes whole blocks at the log head and advances it, wrapping at the end; runs of log
    /// blocks that are contiguous on the device go out in one call.
    fn log_write(&self, log: &mut Log, blocks: &[&[u8]]) -> Result<()> {
        // Cannot fail: only called while a journal is present.
        let g: &LogGeometry = log.geo.as_ref().unwrap();
        let mut rest = blocks;
        while !rest.is_empty() {
            let start = log.head;
            let dev_start = g.dev_block(start);
            let mut n = 1usize;
            while n < rest.len()
                && start as usize + n < g.maxlen as usize
                && g.dev_block(start + n as u32) == dev_start + n as u64
            {
                n += 1;
            }
            self.dev.write_vectored_at(&rest[..n], dev_start * self.block_size as u64)?;
            rest = &rest[n..];
            log.head += n as u32;
            if log.head >= g.maxlen {
                log.head = g.first;
            }
            log.used += n as u32;
        }
        Ok(())
    }
}
