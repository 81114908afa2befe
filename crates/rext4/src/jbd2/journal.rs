//! The journal object: where the log lives, the running transaction, starting handles, and
//! the commit thread (the kernel's `fs/jbd2/journal.c`).
//!
//! # Locking
//! `running` is an atomically swapped pointer: handle starts load it, the commit replaces it.
//! `state` is a small mutex held briefly to wait and to wake; it is never held across I/O.
//! Each kind of waiter has its own condition variable on it (the commit thread, the
//! committer waiting for handles to stop, handle starts waiting for the next transaction,
//! commit waiters), so that no event wakes threads it does not concern: on a busy machine
//! every needless wake-up is a thread that may take the CPU from the committer.
//! `log` is held by the committer while it writes a transaction into the log (log I/O
//! only) and briefly by checkpoints to read and move the tail. `cp_run` serialises
//! checkpoints (background, log-full, close) and is held across their home writes; it is
//! never taken with `log` held. `checkpoint` is brief: commits add to it and drop the copies
//! of blocks their transaction freed (then wait on `cp_written`, holding no other journal
//! lock, while a home write of one is in flight), checkpoints snapshot and prune it. `cp_req`
//! is a leaf. Handles take none of these.
//! Order: `cp_run` -> `log` -> `checkpoint`; `state` is taken after a handle has left its
//! transaction.

use super::transaction::{Handle, Transaction};
use crate::cache::buffer::Buffer;
use crate::dev::BlockDevice;
use crate::error::{Error, Result};
use crate::fs::stats::{LockClass, Op};
use crate::sync::{Condvar, Mutex};
use arc_swap::ArcSwap;
use rext4_format::jbd2::{DescriptorBuilder, JournalParams, JournalSuperblock, RevokeBuilder};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the journal's blocks are: `None` for a filesystem without a journal, whose commits
/// write home directly.
pub(crate) struct LogGeometry {
    /// Where the journal's blocks are on the device, as recovery mapped them: every one of
    /// the journal's blocks (the superblock's `maxlen`), checked to lie inside the filesystem.
    /// [immutable]
    pub map: crate::jbd2::log_map::JournalLog,
    pub params: JournalParams,
    pub uuid: [u8; 16],
    /// First log block (after the journal superblock), and the end of the log (the kernel's
    /// `j_last`): the journal's length less its fast-commit area. [immutable]
    pub first: u32,
    pub last: u32,
}

impl LogGeometry {
    /// Device block of journal block `n` (below `last`).
    pub(crate) fn dev_block(&self, n: u32) -> u64 {
        // Cannot fail: `journal_log` mapped every block of the journal, and the log never
        // addresses a block at or past `last`, which lies inside it.
        self.map.device_block(n).unwrap()
    }
}

/// Log positions (under `Journal::log`): commits append at the head, checkpoints move the
/// tail.
pub(crate) struct Log {
    pub geo: Option<LogGeometry>,
    pub jsb: Option<JournalSuperblock>,
    /// Next free log block.
    pub head: u32,
    /// First log block still needed for recovery, and the tid found there.
    pub tail: u32,
    pub tail_tid: u32,
    /// Log blocks in use (between tail and head).
    pub used: u32,
    /// The committed transactions between tail and head, oldest first.
    pub txns: VecDeque<LogTxn>,
}

/// Fixed figures of a log, taken from its geometry at open.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogShape {
    /// Log blocks available to transactions.
    pub capacity: u32,
    /// Block tags per descriptor block, and records per revoke block.
    pub per_desc: usize,
    pub per_revoke: usize,
    pub params: JournalParams,
    pub uuid: [u8; 16],
}

impl LogShape {
    fn new(g: &LogGeometry) -> Self {
        LogShape {
            capacity: g.last - g.first,
            per_desc: DescriptorBuilder::capacity(&g.params).max(1),
            per_revoke: RevokeBuilder::capacity(&g.params).max(1),
            params: g.params,
            uuid: g.uuid,
        }
    }

    /// Log blocks a transaction of `buffers` blocks and `revoked` revoke records takes:
    /// revoke blocks, descriptor blocks with the copies, and the commit block.
    pub(crate) fn blocks_for(&self, buffers: usize, revoked: usize) -> u32 {
        let n = buffers + buffers.div_ceil(self.per_desc) + revoked.div_ceil(self.per_revoke) + 1;
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

/// Where a committed transaction sits in the log.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogTxn {
    pub tid: u32,
    /// First log block (its first revoke or descriptor block, or the commit block).
    pub start: u32,
    /// Log blocks it takes, commit block included.
    pub blocks: u32,
}

/// A committed block not yet written home: the buffer (pinned so the cache keeps serving the
/// newest contents), the copy that was committed and the transaction that logged it.
pub(crate) struct Pending {
    pub _pin: Arc<Buffer>,
    pub data: Arc<[u8]>,
    pub tid: u32,
}

/// Committed blocks awaiting checkpoint, and the blocks whose home write is under way.
#[derive(Default)]
pub(crate) struct CheckpointList {
    pub pending: crate::cache::KeyMap<Pending>,
    /// Blocks of the batch a checkpoint is writing home now, sorted. The commit of a
    /// transaction that freed one of them waits (`Journal::cp_written`) until the write is
    /// done before it lets the block be reused.
    pub inflight: Vec<u64>,
}

/// Requests to the checkpoint thread.
#[derive(Default)]
pub(crate) struct CheckpointRequest {
    pub wanted: bool,
    pub stop: bool,
}

/// What a commit does to the blocks whose contents are only complete when frozen: the
/// filesystem keeps some counts and checksums in atomics and writes them into the frozen copy
/// (not under the locks of every writer; docs/design.md, the journal), in the cached block and
/// so in its copy. Such blocks are filled and copied while
/// no handle is open; every other buffer is copied
/// after the next transaction has started, by the commit or by its first writer there.
pub(crate) struct FreezeHook {
    /// Whether block `blk` is one of those. [immutable]
    pub fills: Box<dyn Fn(u64) -> bool + Send + Sync>,
    /// Completes such a block before it is copied. [immutable]
    pub fill: FillFn,
    /// Runs once a transaction's commit is durable, before its waiters wake (discarding
    /// the blocks it freed). [immutable]
    pub committed: Option<Box<dyn Fn(u32) + Send + Sync>>,
}

/// Completes the contents `data` of block `blk` for a commit.
pub(super) type FillFn = Box<dyn Fn(u64, &mut [u8]) + Send + Sync>;

/// Statistics of commits: their count and durations, handles, blocks and checkpoints.
#[derive(Default, Clone, Debug)]
pub struct CommitStats {
    pub commits: u64,
    /// Commit durations in microseconds (each commit's, most recent last; bounded).
    pub times_us: Vec<u64>,
    pub handles_waited_us: u64,
    /// Handles and blocks over all commits.
    pub handles: u64,
    pub blocks: u64,
    /// Checkpoints that moved the log tail, and the blocks they wrote home.
    pub checkpoints: u64,
    pub checkpoint_blocks: u64,
    /// Longest checkpoint and all checkpoints together, in microseconds (not part of any
    /// commit's time).
    pub checkpoint_max_us: u64,
    pub checkpoint_total_us: u64,
    /// Commits that found the log full and waited for a checkpoint.
    pub log_full_waits: u64,
    /// Commits that took longer than a millisecond; of those, the ones whose thread was
    /// preempted while committing (the scheduler gave its CPU to another thread), and the
    /// time they spent waiting for open handles to end, in microseconds: what held up the
    /// slow ones.
    pub slow: u64,
    pub slow_preempted: u64,
    pub slow_drain_us: u64,
}

/// Commit times summed up: count, mean, standard deviation, longest and top five.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CommitSummary {
    pub commits: u64,
    pub mean_us: f64,
    pub stddev_us: f64,
    pub max_us: u64,
    /// The five longest commits, longest first.
    pub top5_us: Vec<u64>,
    /// Handles and metadata blocks over all commits, and the blocks checkpoints wrote home.
    pub handles: u64,
    pub blocks: u64,
    pub checkpoint_blocks: u64,
    /// Commits over a millisecond, those of them preempted while committing, and their time
    /// waiting for open handles (as in [`CommitStats`]).
    pub slow: u64,
    pub slow_preempted: u64,
    pub slow_drain_us: u64,
}

impl CommitStats {
    /// Mean, standard deviation, maximum and top five of the recorded commit times.
    pub fn summary(&self) -> CommitSummary {
        let n = self.times_us.len();
        if n == 0 {
            return CommitSummary {
                commits: self.commits,
                handles: self.handles,
                blocks: self.blocks,
                checkpoint_blocks: self.checkpoint_blocks,
                slow: self.slow,
                slow_preempted: self.slow_preempted,
                slow_drain_us: self.slow_drain_us,
                ..CommitSummary::default()
            };
        }
        let mean = self.times_us.iter().sum::<u64>() as f64 / n as f64;
        let var = self.times_us.iter().map(|&t| (t as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        let mut sorted = self.times_us.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        CommitSummary {
            commits: self.commits,
            mean_us: mean,
            stddev_us: var.sqrt(),
            max_us: sorted[0],
            top5_us: sorted.into_iter().take(5).collect(),
            handles: self.handles,
            blocks: self.blocks,
            checkpoint_blocks: self.checkpoint_blocks,
            slow: self.slow,
            slow_preempted: self.slow_preempted,
            slow_drain_us: self.slow_drain_us,
        }
    }
}

struct State {
    /// Last committed tid.
    committed: u32,
    /// Highest tid someone asked to commit.
    requested: u32,
    /// A commit is under way (by the commit thread or by a thread waiting for it): commits run
    /// one at a time, in tid order.
    committing: bool,
    shutdown: bool,
    stats: CommitStats,
}

pub(crate) struct Journal {
    pub dev: Arc<dyn BlockDevice>,
    pub block_size: usize,
    /// The running transaction. [atomic pointer: loaded to join, replaced by the commit]
    running: ArcSwap<Transaction>,
    /// Commit bookkeeping, which the condition variables below wait on. [own mutex, brief]
    state: Mutex<State>,
    /// The commit thread waits here for requests, the interval, shutdown and the end of a
    /// commit someone else ran. [with `state`]
    commit_wake: Condvar,
    /// The committer waits here for the last open handle of the locked transaction.
    /// [with `state`]
    drained: Condvar,
    /// Handle starts wait here for the next transaction. [with `state`]
    switched: Condvar,
    /// Commit waiters wait here for the end of a commit. [with `state`]
    done: Condvar,
    /// The log's fixed figures; `None` without a journal. [immutable]
    pub shape: Option<LogShape>,
    /// Log positions, the transactions in the log and the journal superblock. [own mutex;
    /// held across log writes by the commit, briefly by checkpoints]
    pub log: Mutex<Log>,
    /// Committed blocks awaiting checkpoint. [own mutex, brief]
    pub checkpoint: Mutex<CheckpointList>,
    /// Signalled (with `checkpoint`) when an in-flight batch of home writes is done.
    pub cp_written: Condvar,
    /// Serialises checkpoints; held across their home writes. [own mutex]
    pub cp_run: Mutex<()>,
    /// Work for the checkpoint thread. [own mutex, leaf]
    pub cp_req: Mutex<CheckpointRequest>,
    pub cp_wake: Condvar,
    /// Serial for the next transaction. [atomic]
    next_serial: AtomicU64,
    /// Set after an I/O error: nothing more is committed. [atomic]
    aborted: AtomicBool,
    /// What aborted the journal first, and its errno. [own mutex, leaf]
    abort_reason: Mutex<Option<(String, i32)>>,
    /// Set once the abort's errno is in the journal superblock. [atomic]
    abort_recorded: AtomicBool,
    max_txn_buffers: u32,
    /// Copy of `State::committed` readable without the state lock. [atomic]
    committed_tid: AtomicU32,
    pub commit_interval: Duration,
    /// Completes the frozen copies of blocks whose counts and checksums live in atomics.
    pub freeze: FreezeHook,
    /// The filesystem's operation and lock statistics. [sharded atomics]
    pub stats: Arc<crate::fs::stats::Stats>,
}

impl Journal {
    pub(crate) fn new(
        dev: Arc<dyn BlockDevice>,
        block_size: usize,
        log: Log,
        first_tid: u32,
        commit_interval: Duration,
        freeze: FreezeHook,
        stats: Arc<crate::fs::stats::Stats>,
    ) -> Self {
        // Like jbd2 (`jbd2_journal_get_max_txn_bufs`): a transaction may use a third of the
        // journal outside its fast-commit area (a quarter until mid-2024, when jbd2 began to
        // count descriptor and revoke blocks against the credits). Without a journal,
        // bound the memory a transaction pins instead.
        let max_txn_buffers = match &log.geo {
            Some(g) => (g.last / 3).max(64),
            None => 16384,
        };
        Journal {
            dev,
            block_size,
            shape: log.geo.as_ref().map(LogShape::new),
            running: ArcSwap::from_pointee(Transaction::new(first_tid, 1)),
            state: Mutex::new(State {
                committed: first_tid.wrapping_sub(1),
                requested: first_tid.wrapping_sub(1),
                committing: false,
                shutdown: false,
                stats: CommitStats::default(),
            }),
            commit_wake: Condvar::new(),
            drained: Condvar::new(),
            switched: Condvar::new(),
            done: Condvar::new(),
            log: Mutex::new(log),
            checkpoint: Mutex::new(CheckpointList::default()),
            cp_written: Condvar::new(),
            cp_run: Mutex::new(()),
            cp_req: Mutex::new(CheckpointRequest::default()),
            cp_wake: Condvar::new(),
            next_serial: AtomicU64::new(2),
            aborted: AtomicBool::new(false),
            abort_reason: Mutex::new(None),
            abort_recorded: AtomicBool::new(false),
            max_txn_buffers,
            committed_tid: AtomicU32::new(first_tid.wrapping_sub(1)),
            commit_interval,
            freeze,
            stats,
        }
    }

    /// Log blocks available to transactions (0 without a journal).
    pub(crate) fn log_capacity(&self) -> u32 {
        self.shape.map_or(0, |s| s.capacity)
    }

    pub(crate) fn max_txn_buffers(&self) -> u32 {
        self.max_txn_buffers
    }

    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    pub(crate) fn check_aborted(&self) -> Result<()> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }

    /// Stops all further commits after a failure (`errno`, positive); the filesystem turns
    /// read-only. The first reason is kept, and its errno is written into the journal
    /// superblock ([`Journal::write_errno`]), except by a thread that is panicking, whose
    /// write could panic again: the failed operation's way out does it then.
    pub(crate) fn abort(&self, why: String, errno: i32) {
        // The reason first: whoever sees the flag finds the errno.
        self.abort_reason.lock().get_or_insert((why, errno));
        self.aborted.store(true, Ordering::Release);
        if !std::thread::panicking() {
            self.write_errno();
        }
        let _g = self.state.lock();
        self.notify_everyone();
    }

    /// Writes the abort's errno, negated, into the journal superblock, once
    /// (`jbd2_journal_update_sb_errno`), so that whoever mounts the image next (the kernel,
    /// e2fsck or rext4) marks the filesystem as having errors, whatever else of this mount
    /// reaches the disk. Best effort: the device may be what failed. Takes `cp_run`, so that
    /// a checkpoint's move of the log tail cannot write an older copy over it afterwards, then
    /// `log`: never called holding either.
    pub(crate) fn write_errno(&self) {
        let Some(errno) = self.abort_errno() else { return };
        if self.abort_recorded.swap(true, Ordering::AcqRel) {
            return;
        }
        let _run = self.cp_run.lock();
        let mut log = self.log.lock();
        let Some(jsb) = log.jsb.as_mut() else { return };
        let (start, sequence) = (jsb.start(), jsb.sequence());
        jsb.set_errno(-errno);
        let _ = super::checkpoint::write_jsb(self.block_size, &mut log, start, sequence);
    }

    fn notify_everyone(&self) {
        for c in [&self.commit_wake, &self.drained, &self.switched, &self.done] {
            c.notify_all();
        }
    }

    pub(crate) fn abort_reason(&self) -> Option<String> {
        self.abort_reason.lock().as_ref().map(|(why, _)| why.clone())
    }

    /// The errno the journal was aborted with, if it was.
    pub(crate) fn abort_errno(&self) -> Option<i32> {
        self.abort_reason.lock().as_ref().map(|&(_, errno)| errno)
    }

    /// Starts a handle that may write up to `credits` buffers (`jbd2_journal_start`).
    pub(crate) fn start(&self, credits: u32) -> Result<Handle<'_>> {
        if credits > self.max_txn_buffers {
            return Err(Error::InvalidInput("operation too large for the journal"));
        }
        // The clock is read only for a traced start or once a start has to wait: two clock
        // reads on every start are a cost every create would pay.
        let _t = self.stats.time(Op::JournalStart);
        let mut waiting_since: Option<Instant> = None;
        loop {
            self.check_aborted()?;
            let t = self.running.load();
            let fits = t.join(credits) + t.nbuffers.load(Ordering::Acquire) <= self.max_txn_buffers;
            if !t.locked.load(Ordering::SeqCst) && fits {
                t.mark_started();
                if let Some(since) = waiting_since {
                    let took = since.elapsed();
                    self.state.lock().stats.handles_waited_us += micros(took);
                    self.stats.waited(LockClass::HandleStart, took);
                } else {
                    self.stats.acquired(LockClass::HandleStart);
                }
                return Ok(Handle::new(self, t, credits));
            }
            // Back off: the transaction is committing or full. Ask for its commit and wait
            // for its successor.
            if t.leave(credits) && t.locked.load(Ordering::SeqCst) {
                self.wake_commit();
            }
            waiting_since.get_or_insert_with(Instant::now);
            let mut st = self.state.lock();
            if jbd2_after(t.tid, st.requested) {
                st.requested = t.tid;
                self.commit_wake.notify_all();
            }
            while self.running.load().tid == t.tid && !self.aborted.load(Ordering::Acquire) {
                self.switched.wait_for(&mut st, Duration::from_millis(100));
            }
        }
    }

    /// Wakes the committer: the last handle of the locked transaction stopped.
    pub(crate) fn wake_commit(&self) {
        let _g = self.state.lock();
        self.drained.notify_all();
    }

    /// The last committed tid.
    pub(crate) fn committed_tid(&self) -> u32 {
        self.committed_tid.load(Ordering::Acquire)
    }

    /// The running transaction's tid.
    pub(crate) fn running_tid(&self) -> u32 {
        self.running.load().tid
    }

    /// The newest transaction that may hold a change: the running one, or the one before it
    /// when nothing has joined the running one yet.
    pub(crate) fn newest_tid(&self) -> u32 {
        let t = self.running.load();
        if t.is_empty() {
            t.tid.wrapping_sub(1)
        } else {
            t.tid
        }
    }

    /// Asks for transaction `tid` to commit and waits until it has (group commit: waiters of
    /// the same tid share one commit). When no commit is under way the caller commits
    /// itself: an fsync then costs no thread wake-ups, which on a loaded machine take longer
    /// than the commit. The caller must hold no handle.
    pub(crate) fn commit_and_wait(&self, tid: u32) -> Result<()> {
        let mut st = self.state.lock();
        if jbd2_after(tid, st.requested) {
            st.requested = tid;
        }
        while jbd2_after(tid, st.committed) {
            if self.aborted.load(Ordering::Acquire) {
                // As the kernel's fsync on an aborted journal: the data may not be durable.
                return Err(Error::Io(std::io::Error::from_raw_os_error(libc::EIO)));
            }
            if st.shutdown {
                return Err(Error::ReadOnly);
            }
            if !st.committing {
                // Only commits replace the running transaction, and none is under way: it is
                // the oldest uncommitted one, so `tid` or older than it.
                let running = self.running.load_full();
                st.committing = true;
                drop(st);
                self.run_commit(&running, false);
                st = self.state.lock();
                continue;
            }
            self.done.wait_for(&mut st, Duration::from_millis(100));
        }
        Ok(())
    }

    /// Commits `t` (the caller set `committing`), aborts the journal if that fails, and lets
    /// the next commit start.
    ///
    /// A commit someone waits for (an fsync) wakes the handle starts it held back only when
    /// it ends, while the commit thread's wakes them as soon as the next transaction is
    /// installed. On a machine with more busy threads than cores, woken threads take the CPU
    /// from the committer for a time slice or more (docs/design.md, the journal), and the
    /// fsync waits for all of it, whereas writing a transaction is quick. Threads already
    /// running start their handles in the new transaction either way.
    fn run_commit(&self, t: &Arc<Transaction>, wake_early: bool) {
        // Ends the commit even when it panics (a bug, in an fsync caller's thread that may
        // catch it): the journal is then aborted, so that commit waiters and handle starts
        // get an error instead of waiting for a commit that never ends.
        struct Ending<'a>(&'a Journal, bool);
        impl Drop for Ending<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.abort("journal commit panicked".into(), libc::EIO);
                }
                self.0.end_commit(self.1);
            }
        }
        let _ending = Ending(self, wake_early);
        if !self.aborted.load(Ordering::Acquire) {
            if let Err(e) = self.commit(t, wake_early) {
                self.abort(format!("journal commit failed: {e}"), e.errno());
            }
        }
    }

    /// Lets the next commit start and wakes whoever waited for this one.
    fn end_commit(&self, wake_early: bool) {
        let mut st = self.state.lock();
        st.committing = false;
        let more = jbd2_after(st.requested, st.committed) || st.shutdown;
        // Notified with the lock released (the waiters' conditions changed under it), so a
        // woken thread does not wake only to wait for the lock the committer still holds.
        drop(st);
        // Waiters for this tid return; those for a later one, or the commit thread, may take
        // the next commit; handle starts go on in the next transaction.
        self.done.notify_all();
        if more {
            self.commit_wake.notify_all();
        }
        if !wake_early {
            self.switched.notify_all();
        }
    }

    /// Commits whatever is running and waits for it.
    pub(crate) fn sync(&self) -> Result<()> {
        let tid = self.running_tid();
        if self.running.load().is_empty() {
            // Nothing new; wait for an in-flight commit of the previous one.
            return self.commit_and_wait(tid.wrapping_sub(1));
        }
        self.commit_and_wait(tid)
    }

    /// The commit thread's body: commit on request, on the interval, or when asked to stop.
    /// A checkpoint thread runs beside it, writing committed blocks home while commits go on.
    pub(crate) fn run(self: &Arc<Self>) {
        std::thread::scope(|s| {
            let checkpointer = std::thread::Builder::new()
                .name("rext4-checkpoint".into())
                .spawn_scoped(s, || self.checkpoint_thread());
            if checkpointer.is_err() {
                // Without it, commits checkpoint when the log is full.
                self.cp_req.lock().stop = true;
            }
            self.commit_loop();
            {
                let mut req = self.cp_req.lock();
                req.stop = true;
                self.cp_wake.notify_all();
            }
            // Joined, not left to the scope: the scope's end waits for the thread's work, not
            // for the thread itself, whose exit (its thread-locals freed) could then still be
            // under way when the filesystem's close returns.
            if let Ok(t) = checkpointer {
                let _ = t.join();
            }
        });
    }

    fn commit_loop(&self) {
        loop {
            let (want, shutdown) = {
                let mut st = self.state.lock();
                let deadline = Instant::now() + self.commit_interval;
                loop {
                    let running = self.running.load_full();
                    let requested = !jbd2_after(running.tid, st.requested);
                    let due = running.age().is_some_and(|a| a >= self.commit_interval);
                    if (st.shutdown || requested || due) && !st.committing {
                        st.committing = true;
                        break (Some(running), st.shutdown);
                    }
                    if self.aborted.load(Ordering::Acquire) {
                        break (None, true);
                    }
                    let left = deadline.saturating_duration_since(Instant::now());
                    self.commit_wake.wait_for(&mut st, left.max(Duration::from_millis(5)));
                }
            };
            if let Some(t) = want {
                self.run_commit(&t, true);
            }
            if shutdown {
                return;
            }
        }
    }

    /// Locks `t` (no new handles) and waits for its open handles to stop.
    pub(super) fn lock_and_drain(&self, t: &Arc<Transaction>) {
        t.locked.store(true, Ordering::SeqCst);
        let mut st = self.state.lock();
        while t.updates() > 0 {
            self.drained.wait_for(&mut st, Duration::from_millis(50));
        }
        drop(st);
    }

    /// Installs the next running transaction after `t`. Threads that are running start
    /// handles in it at once; those asleep waiting for it are woken now if `wake`, else when
    /// `t`'s commit ends.
    pub(super) fn install_next(&self, t: &Transaction, wake: bool) {
        let serial = self.next_serial.fetch_add(1, Ordering::AcqRel);
        self.running.store(Arc::new(Transaction::new(t.tid.wrapping_add(1), serial)));
        if wake {
            // Taken and released: a starter that saw the old transaction under the lock is
            // waiting by now.
            drop(self.state.lock());
            self.switched.notify_all();
        }
    }

    /// Records a finished commit (its waiters are woken by `run_commit`).
    pub(super) fn committed(&self, tid: u32, took: Duration, blocks: u64, handles: u64, why: Held) {
        let mut st = self.state.lock();
        if took > Duration::from_millis(1) {
            st.stats.slow += 1;
            st.stats.slow_preempted += u64::from(why.preempted);
            st.stats.slow_drain_us += micros(why.drain);
        }
        st.committed = tid;
        self.committed_tid.store(tid, Ordering::Release);
        st.stats.commits += 1;
        st.stats.handles += handles;
        st.stats.blocks += blocks;
        if st.stats.times_us.len() >= 4096 {
            st.stats.times_us.remove(0);
        }
        st.stats.times_us.push(micros(took));
        self.stats.record_exact(Op::Commit, took);
    }

    pub(super) fn count_checkpoint(&self, blocks: u64, took: Duration) {
        let mut st = self.state.lock();
        st.stats.checkpoints += 1;
        st.stats.checkpoint_blocks += blocks;
        let us = micros(took);
        st.stats.checkpoint_max_us = st.stats.checkpoint_max_us.max(us);
        st.stats.checkpoint_total_us += us;
    }

    pub(super) fn count_log_full_wait(&self) {
        self.state.lock().stats.log_full_waits += 1;
    }

    pub(crate) fn stats(&self) -> CommitStats {
        self.state.lock().stats.clone()
    }

    /// Asks the commit thread to commit what is left and exit.
    pub(crate) fn request_shutdown(&self) {
        let mut st = self.state.lock();
        st.shutdown = true;
        self.notify_everyone();
    }
}

/// What may have held a commit up.
pub(super) struct Held {
    /// Its thread was preempted while committing.
    pub preempted: bool,
    /// Waiting for the transaction's open handles to end.
    pub drain: Duration,
}

/// The calling thread's involuntary context switches so far (0 where unknown): one more at
/// the end of a commit than at its start means the thread lost its CPU meanwhile.
pub(super) fn preemptions() -> i64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_THREAD).map_or(0, |u| u.involuntary_context_switches())
}

/// `tid_gt`: whether `a` comes after `b` in jbd2's wrapping sequence space.
pub(crate) fn jbd2_after(a: u32, b: u32) -> bool {
    rext4_format::jbd2::tid_gt(a, b)
}

/// A duration in microseconds, saturating (at half a million years).
fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
