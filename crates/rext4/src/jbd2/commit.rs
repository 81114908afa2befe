//! Committing a transaction (the kernel's `fs/jbd2/commit.c`): freeze its buffers, write revoke
//! records, descriptor blocks with the journaled copies, then the commit block behind a flush.
//! Without a journal, the frozen copies go straight home.

use super::journal::{Journal, Log, LogGeometry, Pending};
use super::transaction::Transaction;
use crate::error::{Error, Result};
use rext4_format::jbd2::{CommitHeader, DescriptorBuilder, RevokeBuilder};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

impl Journal {
    /// Commits `t`: called only by the commit thread.
    pub(super) fn commit(&self, t: &Arc<Transaction>) -> Result<()> {
        let began = Instant::now();
        self.lock_and_drain(t);
        // No handle is open on `t` and none can join: its buffers are stable. Freeze a copy of
        // each (running the checksum hooks on the copy) before letting the next transaction
        // write to them.
        let buffers = t.take_buffers();
        let mut frozen: Vec<(u64, Vec<u8>)> = Vec::with_capacity(buffers.len());
        for b in &buffers {
            let mut copy = b.data().to_vec();
            (self.freeze)(b.blk, &mut copy);
            frozen.push((b.blk, copy));
        }
        let mut revoked = std::mem::take(&mut *t.revoked.lock());
        revoked.sort_unstable();
        revoked.dedup();
        self.install_next(t);

        let mut log = self.log.lock();
        let nblocks = frozen.len() as u64;
        if log.geo.is_some() {
            self.write_transaction(&mut log, t.tid, &frozen, &revoked)?;
            let mut cp = self.checkpoint.lock();
            for (b, (blk, data)) in buffers.into_iter().zip(frozen) {
                cp.insert(blk, Pending { _pin: b, data: data.into() });
            }
            drop(cp);
        } else {
            // No journal: write home, then flush, as ext4's nojournal mode does at sync.
            self.write_home(frozen.iter().map(|(blk, d)| (*blk, &d[..])))?;
            self.dev.flush()?;
        }
        drop(log);
        self.committed(
            t.tid,
            began.elapsed(),
            nblocks,
            u64::from(t.handles.load(std::sync::atomic::Ordering::Relaxed)),
        );
        // Reclaim log space early (a checkpoint once a quarter of the log is left), after the
        // waiters of this commit have been released: fsync does not wait for home writes.
        let mut log = self.log.lock();
        let geo_len = log.geo.as_ref().map_or(0, |g| g.maxlen - g.first);
        if log.geo.is_some() && log.used > geo_len - geo_len / 4 {
            self.checkpoint_all(&mut log, t.tid.wrapping_add(1))?;
        }
        Ok(())
    }

    /// Writes one transaction into the log at the head.
    fn write_transaction(
        &self,
        log: &mut Log,
        tid: u32,
        frozen: &[(u64, Vec<u8>)],
        revoked: &[u64],
    ) -> Result<()> {
        let (params, uuid) = {
            // Cannot fail: the caller checked `geo` is present.
            let g = log.geo.as_ref().unwrap();
            (g.params, g.uuid)
        };
        let per_desc = DescriptorBuilder::capacity(&params).max(1);
        let per_revoke = RevokeBuilder::capacity(&params).max(1);
        let needed =
            (frozen.len() + frozen.len().div_ceil(per_desc) + revoked.len().div_ceil(per_revoke) + 1) as u32;
        let capacity = log.geo.as_ref().map_or(0, |g| g.maxlen - g.first);
        if log.used + needed > capacity {
            self.checkpoint_all(log, tid)?;
        }
        if needed > capacity {
            return Err(Error::InvalidInput("transaction larger than the journal"));
        }

        // Everything before the commit block is assembled in log order and written in as few
        // calls as the log's layout allows.
        let bs = self.block_size;
        let mut out: Vec<u8> = Vec::with_capacity((needed as usize).saturating_sub(1) * bs);
        for chunk in revoked.chunks(per_revoke) {
            let mut rb = RevokeBuilder::new(&params, tid);
            for &b in chunk {
                rb.push(b).map_err(|_| Error::InvalidInput("revoke record does not fit"))?;
            }
            if let Some(block) = rb.finish() {
                out.extend_from_slice(&block);
            }
        }
        for chunk in frozen.chunks(per_desc) {
            let mut desc = DescriptorBuilder::new(&params, tid, uuid);
            let at = out.len();
            out.resize(at + bs, 0);
            for (blk, data) in chunk {
                let mut copy = data.clone();
                desc.push_block(*blk, &mut copy)
                    .map_err(|_| Error::InvalidInput("descriptor tag does not fit"))?;
                out.extend_from_slice(&copy);
            }
            if let Some(block) = desc.finish() {
                out[at..at + bs].copy_from_slice(&block);
            }
        }
        self.log_write(log, &out)?;
        // Everything of the transaction must be durable before its commit block.
        self.dev.flush()?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let commit = CommitHeader::new(tid, now.as_secs(), now.subsec_nanos()).to_block(&params);
        self.log_write(log, &commit)?;
        self.dev.flush()?;
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
