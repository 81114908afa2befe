//! Committing a transaction (the kernel's `fs/jbd2/commit.c`): freeze its buffers, write revoke
//! records, descriptor blocks with the journaled copies, then the commit block behind a flush.
//! Without a journal, the frozen copies go straight home.

use super::journal::{Journal, Log, LogGeometry, LogShape, LogTxn, Pending};
use super::transaction::Transaction;
use crate::error::{Error, Result};
use rext4_format::jbd2::{CommitHeader, DescriptorBuilder, RevokeBuilder};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

impl Journal {
    /// Commits `t`: called by whoever set `committing` (the commit thread or a waiter).
    /// `wake_early`: wake the handle starts waiting for the next transaction as soon as it
    /// is installed, rather than when this commit ends (see `Journal::run_commit`).
    pub(super) fn commit(&self, t: &Arc<Transaction>, wake_early: bool) -> Result<()> {
        let began = Instant::now();
        self.lock_and_drain(t);
        // No handle is open on `t` and none can join: its buffers are stable. Freeze a copy of
        // each (running the checksum hooks on the copy) before letting the next transaction
        // write to them.
        let buffers = t.take_buffers();
        let mut frozen: Vec<(u64, Arc<[u8]>)> = Vec::with_capacity(buffers.len());
        for b in &buffers {
            let mut copy: Arc<[u8]> = Arc::from(&b.data()[..]);
            // Cannot fail: the copy was just made and is not shared yet.
            (self.freeze)(b.blk, Arc::get_mut(&mut copy).unwrap());
            frozen.push((b.blk, copy));
        }
        let mut revoked = std::mem::take(&mut *t.revoked.lock());
        revoked.sort_unstable();
        revoked.dedup();
        self.install_next(t, wake_early);

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
    /// descriptor blocks each followed by the (escaped) copies it describes.
    fn build_transaction(
        &self,
        shape: &LogShape,
        tid: u32,
        frozen: &[(u64, Arc<[u8]>)],
        revoked: &[u64],
    ) -> Result<Vec<u8>> {
        let (params, uuid) = (shape.params, shape.uuid);
        let bs = self.block_size;
        let needed = shape.blocks_for(frozen.len(), revoked.len());
        let mut out: Vec<u8> = Vec::with_capacity((needed as usize).saturating_sub(1) * bs);
        for chunk in revoked.chunks(shape.per_revoke) {
            let mut rb = RevokeBuilder::new(&params, tid);
            for &b in chunk {
                rb.push(b).map_err(|_| Error::InvalidInput("revoke record does not fit"))?;
            }
            if let Some(block) = rb.finish() {
                out.extend_from_slice(&block);
            }
        }
        for chunk in frozen.chunks(shape.per_desc) {
            let mut desc = DescriptorBuilder::new(&params, tid, uuid);
            let at = out.len();
            out.resize(at + bs, 0);
            for (blk, data) in chunk {
                let from = out.len();
                out.extend_from_slice(data);
                desc.push_block(*blk, &mut out[from..])
                    .map_err(|_| Error::InvalidInput("descriptor tag does not fit"))?;
            }
            if let Some(block) = desc.finish() {
                out[at..at + bs].copy_from_slice(&block);
            }
        }
        Ok(out)
    }

    /// Writes a transaction laid out by `build_transaction` into the log at the head (which
    /// `make_room` made room for), then its commit block, and records where it lies.
    fn write_transaction(&self, log: &mut Log, tid: u32, shape: &LogShape, blocks: &[u8]) -> Result<()> {
        let needed = (blocks.len() / self.block_size) as u32 + 1;
        if log.used + needed > shape.capacity {
            return Err(Error::InvalidInput("no room in the journal"));
        }
        let (start, used_before) = (log.head, log.used);
        self.log_write(log, blocks)?;
        // Everything of the transaction must be durable before its commit block.
        self.dev.flush()?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let commit = CommitHeader::new(tid, now.as_secs(), now.subsec_nanos()).to_block(&shape.params);
        self.log_write(log, &commit)?;
        self.dev.flush()?;
        log.txns.push_back(LogTxn { tid, start, blocks: log.used - used_before });
        Ok(())
    }

    /// Writes whole blocks at the log head and advances it, wrapping at the end; runs of log
    /// blocks that are contiguous on the device go out in one call.
    fn log_write(&self, log: &mut Log, blocks: &[u8]) -> Result<()> {
        let bs = self.block_size;
        // Cannot fail: only called while a journal is present.
        let g: &LogGeometry = log.geo.as_ref().unwrap();
        let mut rest = blocks;
        while !rest.is_empty() {
            let start = log.head;
            let dev_start = g.dev_block(start);
            let mut n = 1usize;
            while n * bs < rest.len()
                && start as usize + n < g.maxlen as usize
                && g.dev_block(start + n as u32) == dev_start + n as u64
            {
                n += 1;
            }
            let len = (n * bs).min(rest.len());
            self.dev.write_at(&rest[..len], dev_start * bs as u64)?;
            rest = &rest[len..];
            log.head += n as u32;
            if log.head >= g.maxlen {
                log.head = g.first;
            }
            log.used += n as u32;
        }
        Ok(())
    }
}
