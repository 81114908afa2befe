//! Transactions and handles (the kernel's `fs/jbd2/transaction.c`).
//!
//! Every metadata change happens inside a [`Handle`], which belongs to the running
//! [`Transaction`]. Starting and stopping a handle touches only atomics of the running
//! transaction (credits and the count of open handles) plus a shared read lock on the pointer to
//! it; the first write to a buffer in a transaction claims it with a compare-and-swap of its
//! `jserial` and appends it to the writing thread's own list. Nothing here is a
//! filesystem-wide lock.
//!
//! # Locking
//! `Journal::running` (read) -> `Transaction::revoked[shard]`, then `Transaction::joined[list]`
//! (never both at once) -> `Buffer::data` (write). A handle must be started before any inode
//! or buffer lock is taken (a start may wait for a commit, and a commit waits for open handles
//! to stop).

use super::journal::Journal;
use crate::cache::buffer::Buffer;
use crate::cache::KeyMap;
use crate::error::{Error, Result};
use crate::fs::stats::{LockClass, Op};
use crate::sync::{Mutex, RwLockWriteGuard};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

const ONE_HANDLE: u64 = 1 << 32;
use std::sync::Arc;
use std::time::Instant;

/// Shards of a transaction's revoked blocks (rare: freed metadata blocks).
const SHARDS: usize = 64;
const STRIPES: usize = 8;

/// Lists of the buffers that joined a transaction, one per thread (round robin past that).
/// The buffer sets were hash maps in 64 shards under their own locks: a worker preempted
/// holding one (48 workers on two cores) stalled every worker needing that shard for a time
/// slice (docs/bench.md, "Joining a transaction without a shared lock"). A thread's own list
/// is locked by the commit alone besides it.
const LISTS: usize = 64;

/// A list of joined buffers on cache lines of its own.
#[repr(align(64))]
#[derive(Default)]
struct JoinList(Mutex<Vec<Arc<Buffer>>>);

/// This thread's list of joined buffers, assigned round robin at its first join.
fn list() -> usize {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed) as usize % LISTS;
    }
    MINE.with(|m| *m)
}

/// A counter on a cache line of its own.
#[repr(align(64))]
struct Stripe(AtomicU32);

/// This thread's counter stripe, assigned round robin at its first handle.
fn stripe() -> usize {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed) as usize % STRIPES;
    }
    MINE.with(|m| *m)
}

/// A transaction's buffers as the threads' lists held them: each buffer once, but for one
/// revoked and written again (listed again by the write that cancelled the revoke).
pub(crate) struct BufferSets(Vec<Vec<Arc<Buffer>>>);

impl BufferSets {
    /// The buffers to log, in block order: each once, none of a block in `revoked` (sorted;
    /// freed in the transaction, their copies must not be written).
    pub(crate) fn into_sorted(self, revoked: &[u64]) -> Vec<Arc<Buffer>> {
        let mut v: Vec<Arc<Buffer>> = self.0.into_iter().flatten().collect();
        v.sort_unstable_by_key(|b| b.blk);
        v.dedup_by_key(|b| b.blk);
        if !revoked.is_empty() {
            v.retain(|b| revoked.binary_search(&b.blk).is_err());
        }
        v
    }
}

/// A group of metadata changes that reach the journal together.
pub(crate) struct Transaction {
    /// jbd2 transaction id (its sequence number in the log). [immutable]
    pub tid: u32,
    /// Engine-wide serial, never reused (buffers remember the serial they joined). [immutable]
    pub serial: u64,
    /// Open handles (high 32 bits) and the credits they reserved (low 32 bits), in one word so
    /// that joining and leaving are one atomic operation each. [atomic; SeqCst against
    /// `locked`]
    usage: AtomicU64,
    /// Buffers in the transaction. [atomic]
    pub nbuffers: AtomicU32,
    /// Handles that joined, in all, in stripes a thread picks once, so that threads starting
    /// handles at once do not bounce one more cache line (summed at commit). [atomics]
    handles: [Stripe; STRIPES],
    /// Set by the commit when it takes the transaction: no handle may join any more.
    /// [atomic; SeqCst against `updates`]
    pub locked: AtomicBool,
    /// Buffers modified in this transaction, each appended once by the thread whose
    /// compare-and-swap of its `jserial` put it in. [each list its own mutex]
    joined: [JoinList; LISTS],
    /// Blocks freed in this transaction (whose old journal copies must not be replayed), by
    /// block number, so that a revoke and its cancellation by a later write meet under one
    /// lock, in O(1) (the kernel's revoke hash table). [each shard its own mutex]
    revoked: [Mutex<KeyMap<()>>; SHARDS],
    /// Revoked blocks in all shards. [atomic; changed under the block's shard lock]
    nrevoked: AtomicU32,
    /// The joined buffers whose contents the commit completes from atomics (see
    /// `FreezeHook`): a few a transaction, found without a walk of every buffer.
    /// [own mutex, leaf]
    fills: Mutex<Vec<Arc<Buffer>>>,
    /// When the first handle joined, in nanoseconds after `epoch` (0: none yet). [atomic]
    pub started: AtomicU64,
    /// Reference point for `started`. [immutable]
    pub epoch: Instant,
}

impl Transaction {
    pub(crate) fn new(tid: u32, serial: u64) -> Self {
        Transaction {
            tid,
            serial,
            usage: AtomicU64::new(0),
            nbuffers: AtomicU32::new(0),
            handles: std::array::from_fn(|_| Stripe(AtomicU32::new(0))),
            locked: AtomicBool::new(false),
            joined: std::array::from_fn(|_| JoinList::default()),
            revoked: std::array::from_fn(|_| Mutex::new(KeyMap::default())),
            nrevoked: AtomicU32::new(0),
            fills: Mutex::new(Vec::new()),
            started: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Adds a handle with `credits`; returns the credits now reserved.
    pub(crate) fn join(&self, credits: u32) -> u32 {
        let add = ONE_HANDLE + u64::from(credits);
        // The credits are the low half; the handle count is the high one.
        rext4_format::split::lo32(self.usage.fetch_add(add, Ordering::SeqCst) + add)
    }

    /// Removes a handle with `credits`; returns whether it was the last one open.
    pub(crate) fn leave(&self, credits: u32) -> bool {
        let prev = self.usage.fetch_sub(ONE_HANDLE + u64::from(credits), Ordering::SeqCst);
        prev >> 32 == 1
    }

    /// Handles open.
    pub(crate) fn updates(&self) -> u32 {
        (self.usage.load(Ordering::SeqCst) >> 32) as u32
    }

    /// Notes that a handle joined: the first one starts the commit-interval clock.
    pub(crate) fn mark_started(&self) {
        self.handles[stripe()].0.fetch_add(1, Ordering::Relaxed);
        if self.started.load(Ordering::Relaxed) == 0 {
            let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1);
            let _ = self.started.compare_exchange(0, now, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// Handles that joined, in all.
    pub(crate) fn handles(&self) -> u32 {
        self.handles.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }

    /// How long ago the first handle joined, if one has.
    pub(crate) fn age(&self) -> Option<std::time::Duration> {
        match self.started.load(Ordering::Acquire) {
            0 => None,
            t => Some(self.epoch.elapsed().saturating_sub(std::time::Duration::from_nanos(t))),
        }
    }

    fn shard(blk: u64) -> usize {
        crate::cache::shard_of(blk, SHARDS)
    }

    /// Whether the transaction holds no change.
    pub(crate) fn is_empty(&self) -> bool {
        self.nbuffers.load(Ordering::Acquire) == 0 && self.nrevoked.load(Ordering::Acquire) == 0
    }

    /// Takes every buffer out of the transaction as the lists hold them: one swap a list
    /// (the commit does this once no handle is open, and sorts them after the next
    /// transaction has started; see [`BufferSets::into_sorted`]).
    pub(crate) fn take_buffer_sets(&self) -> BufferSets {
        BufferSets(self.joined.iter().map(|l| std::mem::take(&mut *l.0.lock())).collect())
    }

    /// Takes the buffers the commit completes from atomics out of their list (they stay
    /// among the buffers).
    pub(crate) fn take_fills(&self) -> Vec<Arc<Buffer>> {
        std::mem::take(&mut *self.fills.lock())
    }

    /// Tries to put `buf` in the transaction: whoever moves its `jserial` to this transaction
    /// appends it to their list, cancelling a revoke of its block first (a block freed and
    /// reused as metadata in one transaction: replay would otherwise skip its new contents,
    /// `jbd2_journal_cancel_revoke`). Whether this call put it in.
    fn insert(&self, buf: &Arc<Buffer>, stats: &crate::fs::stats::Stats) -> bool {
        let mut seen = buf.jserial.load(Ordering::Acquire);
        loop {
            if seen == self.serial {
                return false;
            }
            match buf.jserial.compare_exchange_weak(seen, self.serial, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => seen = now,
            }
        }
        // A revoke in this transaction happened before the block was handed out again, and
        // that hand-over before this write: the count is seen.
        if self.nrevoked.load(Ordering::Acquire) != 0 {
            let mut revoked = self.revoked[Transaction::shard(buf.blk)].lock();
            if revoked.remove(&buf.blk).is_some() {
                self.nrevoked.fetch_sub(1, Ordering::AcqRel);
            }
        }
        stats.lock(LockClass::TxnBuffers, &self.joined[list()].0).push(buf.clone());
        true
    }

    /// Records block `blk` as revoked: a copy of it the transaction holds is not written
    /// (`BufferSets::into_sorted`), unless a later write cancels the revoke. `buf` is the
    /// block's cached buffer, if any: if it is in this transaction, its next write here must
    /// put it in again (which cancels the revoke).
    fn revoke(&self, blk: u64, buf: Option<&Arc<Buffer>>) {
        {
            let mut revoked = self.revoked[Transaction::shard(blk)].lock();
            if revoked.insert(blk, ()).is_none() {
                self.nrevoked.fetch_add(1, Ordering::AcqRel);
            }
        }
        if let Some(b) = buf {
            let _ = b.jserial.compare_exchange(self.serial, 0, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// Takes the revoked blocks out of the transaction, in block order (the commit does this
    /// once no handle is open).
    pub(crate) fn take_revoked(&self) -> Vec<u64> {
        let mut v: Vec<u64> =
            self.revoked.iter().flat_map(|s| std::mem::take(&mut *s.lock()).into_keys()).collect();
        self.nrevoked.store(0, Ordering::Release);
        v.sort_unstable();
        v
    }
}

/// An open unit of change within the running transaction. Stopping (dropping) it lets the
/// transaction commit.
///
/// It borrows the journal and holds the transaction through `arc_swap`'s per-thread guard, so
/// that starting and stopping it writes no reference count shared by every thread: with two
/// workers, each count was one more line passed between the cores twice an operation.
pub(crate) struct Handle<'j> {
    pub(crate) journal: &'j Journal,
    pub(crate) txn: arc_swap::Guard<Arc<Transaction>>,
    credits: u32,
    stopped: bool,
}

impl<'j> Handle<'j> {
    pub(crate) fn new(journal: &'j Journal, txn: arc_swap::Guard<Arc<Transaction>>, credits: u32) -> Self {
        Handle { journal, txn, credits, stopped: false }
    }

    /// The transaction id this handle's changes will commit in.
    pub(crate) fn tid(&self) -> u32 {
        self.txn.tid
    }

    /// Puts a buffer into this handle's transaction without writing it: its contents are
    /// produced when the commit freezes it (the superblock and descriptor blocks, whose
    /// counts live in atomics).
    pub(crate) fn join(&self, buf: &Arc<Buffer>) -> Result<()> {
        self.journal.check_aborted()?;
        self.add(buf)
    }

    fn add(&self, buf: &Arc<Buffer>) -> Result<()> {
        let t = &self.txn;
        if buf.jserial.load(Ordering::Acquire) != t.serial && t.insert(buf, &self.journal.stats) {
            if (self.journal.freeze.fills)(buf.blk) {
                t.fills.lock().push(buf.clone());
            }
            let n = t.nbuffers.fetch_add(1, Ordering::AcqRel) + 1;
            if n > self.journal.max_txn_buffers() {
                // Credits were under-reserved somewhere: a bug, not a user error.
                return Err(Error::InvalidInput("transaction exceeds the journal's capacity"));
            }
        }
        Ok(())
    }

    /// Write access to a metadata buffer: the buffer joins this handle's transaction (the
    /// kernel's `get_write_access` + `dirty_metadata`), then its contents are locked for
    /// writing.
    pub(crate) fn write<'a>(&self, buf: &'a Arc<Buffer>) -> Result<RwLockWriteGuard<'a, Box<[u8]>>> {
        let _t = self.journal.stats.time(Op::GetWriteAccess);
        self.journal.check_aborted()?;
        self.add(buf)?;
        Ok(buf.data_mut_timed(self.txn.serial, &self.journal.stats))
    }

    /// Records that metadata block `blk` was freed: older journal copies of it must never be
    /// replayed over whatever it holds next, and its pending copy is dropped when this
    /// transaction commits (not before: until then the block is allocated in every state a
    /// crash can leave, and that copy is its contents).
    ///
    /// `buf` is the block's cached buffer, if there is one (a buffer in the transaction is
    /// always cached: the transaction holds it): a later write in this transaction must put
    /// it in again, which cancels the revoke.
    pub(crate) fn revoke(&self, blk: u64, buf: Option<&Arc<Buffer>>) {
        self.txn.revoke(blk, buf);
    }

    /// Ends the handle (also done on drop).
    pub(crate) fn stop(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let t = &self.txn;
        if t.leave(self.credits) && t.locked.load(Ordering::SeqCst) {
            self.journal.wake_commit();
        }
    }
}

impl Drop for Handle<'_> {
    fn drop(&mut self) {
        if !self.stopped && std::thread::panicking() {
            // The operation stopped half way (a bug): its transaction must never commit, so
            // the journal aborts and the filesystem turns read-only with the image as the
            // last commit left it, as jbd2 does after an error.
            self.journal.abort("an operation panicked with its journal handle open".into(), libc::EIO);
        }
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::buffer::BufferCache;
    use crate::dev::MemDevice;

    #[test]
    fn a_write_after_a_revoke_cancels_it() {
        let cache = BufferCache::new(Arc::new(MemDevice::new(vec![0; 64 * 1024])), 1024, 1 << 20);
        let t = Transaction::new(1, 1);
        let stats = crate::fs::stats::Stats::default();
        let add = |blk: u64| t.insert(&cache.get(blk).unwrap(), &stats);
        let revoke = |blk: u64| t.revoke(blk, cache.peek(blk).as_ref());
        assert!(add(5) && !add(5), "a buffer joins once");
        assert!(add(12) && add(40));
        for blk in [5, 40, 9, 33, 9] {
            revoke(blk);
        }
        assert!(!t.is_empty());
        // Written again: no longer revoked, and back among the buffers (once).
        assert!(add(9) && add(5) && !add(5));
        let revoked = t.take_revoked();
        assert_eq!(revoked, vec![33, 40]);
        let logged = t.take_buffer_sets().into_sorted(&revoked);
        assert_eq!(logged.iter().map(|b| b.blk).collect::<Vec<_>>(), vec![5, 9, 12], "40 stays revoked");
        assert!(t.take_revoked().is_empty());
    }
}
