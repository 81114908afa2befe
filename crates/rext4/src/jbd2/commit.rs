//! Committing a transaction (the kernel's `fs/jbd2/commit.c`): freeze its buffers, write revoke
//! records, descriptor blocks with the journaled copies, then the commit block behind a flush.
//! Without a journal, the frozen copies go straight home.

use super::journal::{Journal, Log, LogGeometry, LogShape, LogTxn, Pending};
use super::transaction::Transaction;
use crate::cache::buffer::Buffer;
use crate::error::{Error, Result};
use rext4_format::jbd2::{CommitHeader, DescriptorBuilder, RevokeBuilder};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Journal {
    /// Commits `t`: called by whoever set `committing` (the commit thread or a waiter).
    /// `wake_early`: wake the handle starts waiting for the next transaction as soon as it
    /// is installed, rather than when this commit ends (see `Journal::run_commit`).
    pub(super) fn commit(&self, t: &Arc<Transaction>, wake_early: bool) -> Result<()> {
        let began = Instant::now();
        let switches = super::journal::preemptions();
        self.lock_and_drain(t);
        let drain = began.elapsed();
        // A handle that ended in a panic aborted the journal: its changes are half done.
        self.check_aborted()?;
        // No handle is open on `t` and none can join: its buffers are stable. Only what must
        // be taken before the next transaction runs is taken now, in work per shard, not per
        // buffer: the buffer sets, the blocks completed from atomics (a few, copied now), and
        // the revokes. Every other buffer is copied after the next transaction has started,
        // by this commit or by its first writer there (see `Buffer::take_frozen`), so handle
        // starts wait for the drain alone.
        let sets = t.take_buffer_sets();
        let mut filled: Vec<(u64, Arc<[u8]>)> = t
            .take_fills()
            .iter()
            .map(|b| (b.blk, b.fill_and_copy(|data| (self.freeze.fill)(b.blk, data))))
            .collect();
        let revoked = t.take_revoked();
        self.install_next(t, wake_early);
        filled.sort_unstable_by_key(|f| f.0);
        let buffers = sets.into_sorted(&revoked);
        let copy = |b: &Buffer| match filled.binary_search_by_key(&b.blk, |f| f.0) {
            Ok(i) => filled[i].1.clone(),
            Err(_) => b.take_frozen(t.serial),
        };

        let nblocks = buffers.len() as u64;
        let mut room_wait = Duration::ZERO;
        let mut used = None;
        let mut frozen: Vec<(u64, Arc<[u8]>)> = Vec::with_capacity(buffers.len());
        if let Some(shape) = self.shape {
            let needed = shape.blocks_for(buffers.len(), revoked.len());
            // A full log waits for (or runs) a checkpoint; that time is not the commit's.
            room_wait = self.make_room(needed)?;
            let mut log = self.log.lock();
            if log.used + needed > shape.capacity {
                return Err(Error::InvalidInput("no room in the journal"));
            }
            let (start, used_before) = (log.head, log.used);
            let revokes = self.revoke_blocks(&shape, t.tid, &revoked)?;
            self.log_write(&mut log, &revokes.iter().map(|b| &b[..]).collect::<Vec<_>>())?;
            // A descriptor's worth at a time: its copies are made, checksummed and written
            // while they are still in the core's cache (copying the whole transaction first
            // left them in memory for the checksums and the writes to read again).
            for chunk in buffers.chunks(shape.per_desc) {
                let at = frozen.len();
                frozen.extend(chunk.iter().map(|b| (b.blk, copy(b))));
                let blocks = self.descriptor_run(&shape, t.tid, &frozen[at..])?;
                self.log_write(&mut log, &blocks.iter().map(|b| &b[..]).collect::<Vec<_>>())?;
            }
            self.write_commit_block(&mut log, t.tid, &shape)?;
            let blocks = log.used - used_before;
            log.txns.push_back(LogTxn { tid: t.tid, start, blocks });
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
            frozen.extend(buffers.iter().map(|b| (b.blk, copy(b))));
            self.write_home(frozen.iter().map(|(blk, d)| (*blk, &d[..])))?;
            self.dev.flush()?;
        }
        let why = super::journal::Held { preempted: super::journal::preemptions() > switches, drain };
        self.committed(
            t.tid,
            began.elapsed().saturating_sub(room_wait),
            nblocks,
            u64::from(t.handles()),
            why,
        );
        if let Some(after) = &self.freeze.committed {
            after(t.tid);
        }
        // Reclaim log space early, beside later commits: fsync never waits for home writes
        // unless the log fills up.
        if let Some((used, capacity)) = used {
            if used > capacity / 2 {
                self.request_checkpoint();
            }
        }
        Ok(())
    }

    /// A transaction's revoke blocks, written first.
    fn revoke_blocks(&self, shape: &LogShape, tid: u32, revoked: &[u64]) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::with_capacity(revoked.len().div_ceil(shape.per_revoke));
        for chunk in revoked.chunks(shape.per_revoke) {
            let mut rb = RevokeBuilder::new(&shape.params, tid);
            for &b in chunk {
                rb.push(b).map_err(|_| Error::InvalidInput("revoke record does not fit"))?;
            }
            if let Some(block) = rb.finish() {
                out.push(block);
            }
        }
        Ok(out)
    }

    /// One descriptor block and the copies it describes (at most `per_desc` of them), as
    /// they go into the log: copies are written from where they lie; only escaped ones are
    /// copied again.
    fn descriptor_run<'a>(
        &self,
        shape: &LogShape,
        tid: u32,
        frozen: &'a [(u64, Arc<[u8]>)],
    ) -> Result<Vec<Cow<'a, [u8]>>> {
        let mut out: Vec<Cow<'a, [u8]>> = Vec::with_capacity(frozen.len() + 1);
        let mut desc = DescriptorBuilder::new(&shape.params, tid, shape.uuid);
        out.push(Cow::Borrowed(&[]));
        for (blk, data) in frozen {
            let escaped = desc
                .push_shared(*blk, data)
                .map_err(|_| Error::InvalidInput("descriptor tag does not fit"))?;
            out.push(escaped.map_or(Cow::Borrowed(&data[..]), Cow::Owned));
        }
        out[0] = Cow::Owned(desc.finish().ok_or(Error::InvalidInput("empty descriptor block"))?);
        Ok(out)
    }

    /// Ends a transaction written into the log: everything before must be durable before its
    /// commit block, and the commit block before the commit counts as done.
    fn write_commit_block(&self, log: &mut Log, tid: u32, shape: &LogShape) -> Result<()> {
        // The filesystem's device: ordered data, and the log itself when it lives there.
        self.dev.flush()?;
        if let Some(g) = log.geo.as_ref().filter(|g| g.map.is_external()) {
            // The log's own device, as jbd2 flushes `j_fs_dev` and `j_dev` apart.
            g.map.dev().flush()?;
        }
        let (sec, nsec) = crate::clock::now();
        let commit = CommitHeader::new(tid, sec.cast_unsigned(), nsec).to_block(&shape.params);
        // Durable when written: one forced-unit-access write where the device has them,
        // else a write and a flush (the kernel's REQ_PREFLUSH | REQ_FUA commit block).
        self.log_write_as(log, &[&commit], true)
    }

    /// Writes whole blocks at the log head and advances it, wrapping at the end; runs of log
    /// blocks that are contiguous on the device go out in one call.
    fn log_write(&self, log: &mut Log, blocks: &[&[u8]]) -> Result<()> {
        self.log_write_as(log, blocks, false)
    }

    /// [`Self::log_write`], each run written durable (`BlockDevice::write_durable`) if
    /// `durable`.
    fn log_write_as(&self, log: &mut Log, blocks: &[&[u8]], durable: bool) -> Result<()> {
        // Cannot fail: only called while a journal is present.
        let g: &LogGeometry = log.geo.as_ref().unwrap();
        let mut rest = blocks;
        while !rest.is_empty() {
            let start = log.head;
            let dev_start = g.dev_block(start);
            // At most last - start: a u32.
            let mut n = 1u32;
            while (n as usize) < rest.len()
                && start + n < g.last
                && g.dev_block(start + n) == dev_start + u64::from(n)
            {
                n += 1;
            }
            let at = dev_start * self.block_size as u64;
            let dev = g.map.dev();
            if durable {
                dev.write_durable(&rest[..n as usize].concat(), at)?;
            } else {
                dev.write_vectored_at(&rest[..n as usize], at)?;
            }
            rest = &rest[n as usize..];
            log.head += n;
            if log.head >= g.last {
                log.head = g.first;
            }
            log.used += n;
        }
        Ok(())
    }
}
