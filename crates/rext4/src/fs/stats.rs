//! Engine statistics for `rext4 stats`: time and count per operation (named after the kernel
//! functions they mirror, so the table reads like a function profile of ext4), and
//! wait times per lock class. Journal commit times live with the journal
//! (`CommitStats`); [`Fs::stats`] reports all three.
//!
//! Always on, so it must cost next to nothing. A metadata operation runs in a few microseconds
//! and nests twenty-odd timed functions; two clock reads and an atomic add for each would cost
//! a good share of it (docs/bench.md, `rext4 stats`). So each thread traces one top-level operation in `every` (16 by default;
//! [`Fs::set_stats_every`](crate::Fs::set_stats_every)), with everything nested in it, and adds
//! `every` times what it saw: the figures are unbiased estimates, exact when `every` is 1. An
//! untraced call costs a thread-local counter. Lock waits are exact: a lock is first tried
//! without blocking, and a failed try is always timed. Journal commits are always counted.
//!
//! Every thread adds to its own shard (a cache-line aligned block of relaxed atomics, like
//! `alloc/counter.rs`), so counting never bounces a line between cores; only a reader sums the
//! shards.
//!
//! # Locking
//! None: atomics and thread-locals only. A report taken while operations run is a sum of shards
//! read one by one (each figure consistent, the set not a snapshot), like
//! `percpu_counter_sum`.

use crate::sync::{Mutex, MutexGuard, RwLock, RwLockWriteGuard};
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $s:literal,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum $name { $($(#[$vm])* $v,)* }
        impl $name {
            pub(super) const ALL: &'static [$name] = &[$($name::$v,)*];
            pub(crate) fn name(self) -> &'static str {
                match self { $($name::$v => $s,)* }
            }
        }
    };
}

named_enum! {
    /// A timed operation. Public operations carry the name of the kernel entry point they
    /// correspond to; internal ones the kernel function doing the same job. Nested operations
    /// count in both (as in a function profile: `ext4_create` includes its `ext4_add_entry`).
    Op {
        Lookup = "ext4_lookup",
        Getattr = "ext4_getattr",
        Readdir = "ext4_readdir",
        Read = "ext4_file_read_iter",
        Llseek = "ext4_llseek",
        Open = "ext4_file_open",
        Release = "ext4_release_file",
        Readlink = "ext4_get_link",
        Statfs = "ext4_statfs",
        Trim = "ext4_trim_fs",
        Getxattr = "ext4_xattr_get",
        Listxattr = "ext4_listxattr",
        Create = "ext4_create",
        Tmpfile = "ext4_tmpfile",
        Mknod = "ext4_mknod",
        Mkdir = "ext4_mkdir",
        Unlink = "ext4_unlink",
        Rmdir = "ext4_rmdir",
        Rename = "ext4_rename2",
        Link = "ext4_link",
        Symlink = "ext4_symlink",
        Setattr = "ext4_setattr",
        SetFlags = "ext4_fileattr_set",
        Write = "ext4_file_write_iter",
        Fallocate = "ext4_fallocate",
        Fsync = "ext4_sync_file",
        Sync = "ext4_sync_fs",
        Setxattr = "ext4_xattr_set",
        SetQuota = "dquot_set_dqblk",
        JournalStart = "jbd2__journal_start",
        GetWriteAccess = "jbd2_journal_get_write_access",
        MarkInodeDirty = "ext4_mark_inode_dirty",
        AddEntry = "ext4_add_entry",
        DeleteEntry = "ext4_delete_entry",
        NewInode = "__ext4_new_inode",
        FreeInode = "ext4_free_inode",
        NewBlocks = "ext4_mb_new_blocks",
        FreeBlocks = "ext4_free_blocks",
        Truncate = "ext4_truncate",
        OrphanAdd = "ext4_orphan_add",
        OrphanDel = "ext4_orphan_del",
        Evict = "ext4_evict_inode",
        Commit = "jbd2_journal_commit_transaction",
        Getlk = "posix_test_lock",
        Setlk = "posix_lock_inode",
        Flock = "flock_lock_inode",
    }
}

named_enum! {
    /// A lock whose waits are timed. Names say what the lock is in rext4 and, after the
    /// slash, its kernel counterpart.
    LockClass {
        /// `Inode::op_lock`.
        OpLock = "inode op_lock / i_rwsem",
        /// `FsInner::rename_lock`.
        Rename = "rename_lock / s_vfs_rename_mutex",
        /// `Inode::data_sem`, taken for writing.
        DataSem = "data_sem / i_data_sem",
        /// A handle start that had to wait for the running transaction to commit.
        HandleStart = "handle start / t_updates",
        /// `Orphans::list`, the classic orphan list.
        OrphanList = "orphan list / s_orphan_lock",
        /// `Transaction::buffers` shard, when a buffer joins a transaction.
        TxnBuffers = "transaction buffers / j_list_lock",
        /// A metadata buffer's data lock taken for writing through a handle (bitmaps: the
        /// group allocation lock; directory and inode-table blocks).
        BufferData = "buffer data / bh lock, group lock",
    }
}

const SHARDS: usize = 16;
const OPS: usize = Op::ALL.len();
const LOCKS: usize = LockClass::ALL.len();

/// Per-lock-class counters in a shard.
#[derive(Default)]
struct LockCell {
    acquired: AtomicU64,
    contended: AtomicU64,
    wait_ns: AtomicU64,
    max_wait_ns: AtomicU64,
}

#[repr(align(128))]
struct Shard {
    count: [AtomicU64; OPS],
    ns: [AtomicU64; OPS],
    locks: [LockCell; LOCKS],
}

impl Default for Shard {
    fn default() -> Self {
        Shard {
            count: std::array::from_fn(|_| AtomicU64::new(0)),
            ns: std::array::from_fn(|_| AtomicU64::new(0)),
            locks: std::array::from_fn(|_| LockCell::default()),
        }
    }
}

static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static SLOT: Cell<usize> = Cell::new(NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % SHARDS);
    static TRACE: Trace = const {
        Trace { depth: Cell::new(0), traced: Cell::new(false), countdown: Cell::new(1), rng: Cell::new(0x9E37_79B9) }
    };
}

/// Whether this thread is tracing the operation it is in.
struct Trace {
    /// Timed operations this thread is inside.
    depth: Cell<u32>,
    /// Whether the outermost of them is traced.
    traced: Cell<bool>,
    /// Top-level operations until the next traced one.
    countdown: Cell<u32>,
    /// xorshift state for the gaps between traced operations. A fixed gap would alias with
    /// loops of several calls (create then unlink, with a gap of 16, traces only creates).
    rng: Cell<u32>,
}

impl Trace {
    /// Whether what starts now is traced: inside an operation, as that operation is; at top
    /// level, one in `every`.
    fn sampled(&self, every: u32) -> bool {
        if self.depth.get() > 0 {
            return self.traced.get();
        }
        let c = self.countdown.get().saturating_sub(1);
        let traced = c == 0;
        self.countdown.set(if traced { self.gap(every) } else { c });
        self.traced.set(traced);
        traced
    }
}

impl Trace {
    /// A gap uniform in `1..=2 * every - 1`: one operation in `every` on average.
    fn gap(&self, every: u32) -> u32 {
        if every <= 1 {
            return 1;
        }
        let mut x = self.rng.get();
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.rng.set(x);
        1 + x % (2 * every - 1)
    }
}

/// Default for [`Stats::every`].
pub(super) const DEFAULT_EVERY: u32 = 16;

/// The statistics of one filesystem. [atomics only; see the module's notes]
pub(crate) struct Stats {
    shards: Box<[Shard]>,
    /// One top-level operation in this many is traced per thread. [atomic]
    every: AtomicU32,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            every: AtomicU32::new(DEFAULT_EVERY),
        }
    }
}

/// Times an operation until dropped (if it is traced).
pub(crate) struct Timed<'a> {
    stats: &'a Stats,
    op: Op,
    start: Option<Instant>,
}

impl Timed<'_> {
    /// Counts nothing for this operation: it handed its work to another that is counted.
    pub(crate) fn forget(&mut self) {
        self.start = None;
    }
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        TRACE.with(|t| t.depth.set(t.depth.get().saturating_sub(1)));
        if let Some(start) = self.start {
            self.stats.add(self.op, start.elapsed(), self.stats.every());
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Stats {
    fn shard(&self) -> &Shard {
        &self.shards[SLOT.with(|s| s.get())]
    }

    fn every(&self) -> u32 {
        self.every.load(Ordering::Relaxed).max(1)
    }

    /// Traces one top-level operation in `every` per thread (1: all of them).
    pub(super) fn set_every(&self, every: u32) {
        self.every.store(every.max(1), Ordering::Relaxed);
    }

    fn sampled(&self) -> bool {
        TRACE.with(|t| t.sampled(self.every()))
    }

    /// Starts timing `op`; the time is recorded when the guard drops.
    pub(crate) fn time(&self, op: Op) -> Timed<'_> {
        let traced = self.sampled();
        TRACE.with(|t| t.depth.set(t.depth.get() + 1));
        Timed { stats: self, op, start: traced.then(Instant::now) }
    }

    /// Adds one `op` that took `d`, always (rare operations: commits).
    pub(crate) fn record_exact(&self, op: Op, d: Duration) {
        self.add(op, d, 1);
    }

    /// Adds `weight` operations of `d` each.
    fn add(&self, op: Op, d: Duration, weight: u32) {
        let s = self.shard();
        s.count[op as usize].fetch_add(u64::from(weight), Ordering::Relaxed);
        s.ns[op as usize].fetch_add(nanos(d).saturating_mul(u64::from(weight)), Ordering::Relaxed);
    }

    /// Counts an acquisition of a `class` lock that did not have to wait (if traced).
    pub(crate) fn acquired(&self, class: LockClass) {
        if self.sampled() {
            let w = u64::from(self.every());
            self.shard().locks[class as usize].acquired.fetch_add(w, Ordering::Relaxed);
        }
    }

    /// Counts an acquisition of a `class` lock that waited `d` (always).
    pub(crate) fn waited(&self, class: LockClass, d: Duration) {
        let c = &self.shard().locks[class as usize];
        let ns = nanos(d);
        c.acquired.fetch_add(1, Ordering::Relaxed);
        c.contended.fetch_add(1, Ordering::Relaxed);
        c.wait_ns.fetch_add(ns, Ordering::Relaxed);
        c.max_wait_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// `m.lock()`, timing the wait if there is one.
    pub(crate) fn lock<'a, T>(&self, class: LockClass, m: &'a Mutex<T>) -> MutexGuard<'a, T> {
        if let Some(g) = m.try_lock() {
            self.acquired(class);
            return g;
        }
        let t = Instant::now();
        let g = m.lock();
        self.waited(class, t.elapsed());
        g
    }

    /// `l.write()`, timing the wait if there is one.
    pub(crate) fn write<'a, T>(&self, class: LockClass, l: &'a RwLock<T>) -> RwLockWriteGuard<'a, T> {
        if let Some(g) = l.try_write() {
            self.acquired(class);
            return g;
        }
        let t = Instant::now();
        let g = l.write();
        self.waited(class, t.elapsed());
        g
    }

    /// Sums the shards.
    pub(crate) fn report(&self) -> StatsReport {
        let sum = |f: &dyn Fn(&Shard) -> u64| self.shards.iter().map(f).sum::<u64>();
        let ops = Op::ALL
            .iter()
            .map(|&op| OpStat {
                name: op.name(),
                count: sum(&|s| s.count[op as usize].load(Ordering::Relaxed)),
                total_ns: sum(&|s| s.ns[op as usize].load(Ordering::Relaxed)),
            })
            .collect();
        let locks = LockClass::ALL
            .iter()
            .map(|&c| {
                fn cell(s: &Shard, c: LockClass) -> &LockCell {
                    &s.locks[c as usize]
                }
                LockStat {
                    name: c.name(),
                    acquired: sum(&|s| cell(s, c).acquired.load(Ordering::Relaxed)),
                    contended: sum(&|s| cell(s, c).contended.load(Ordering::Relaxed)),
                    wait_ns: sum(&|s| cell(s, c).wait_ns.load(Ordering::Relaxed)),
                    max_wait_ns: self
                        .shards
                        .iter()
                        .map(|s| cell(s, c).max_wait_ns.load(Ordering::Relaxed))
                        .max()
                        .unwrap_or(0),
                }
            })
            .collect();
        StatsReport {
            ops,
            locks,
            commits: None,
            every: self.every(),
            page_cache: crate::PageCacheStats::default(),
            reserved_blocks: 0,
            writeback: crate::WritebackStats::default(),
        }
    }

    /// Sets every figure back to zero (figures added meanwhile may survive).
    pub(super) fn reset(&self) {
        for s in self.shards.iter() {
            for a in s.count.iter().chain(s.ns.iter()) {
                a.store(0, Ordering::Relaxed);
            }
            for c in &s.locks {
                for a in [&c.acquired, &c.contended, &c.wait_ns, &c.max_wait_ns] {
                    a.store(0, Ordering::Relaxed);
                }
            }
        }
    }
}

/// One row of the operation table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpStat {
    /// The kernel function this operation corresponds to (`ext4_create`, ...).
    pub name: &'static str,
    pub count: u64,
    /// Total time inside the operation, nanoseconds, summed over threads.
    pub total_ns: u64,
}

/// Waits on one class of lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockStat {
    pub name: &'static str,
    /// Acquisitions, and how many of them had to wait.
    pub acquired: u64,
    pub contended: u64,
    /// Total and longest wait, nanoseconds.
    pub wait_ns: u64,
    pub max_wait_ns: u64,
}

/// What [`Fs::stats`](crate::Fs::stats) reports.
#[derive(Clone, Debug, PartialEq)]
pub struct StatsReport {
    /// Every timed operation, in a fixed order (unused ones with a zero count).
    pub ops: Vec<OpStat>,
    /// Every lock class, in a fixed order.
    pub locks: Vec<LockStat>,
    /// Journal commit times; `None` when opened read-only.
    pub commits: Option<crate::CommitSummary>,
    /// Operation counts and times are estimated from one top-level operation in this many
    /// (1: exact); see [`Fs::set_stats_every`](crate::Fs::set_stats_every).
    pub every: u32,
    /// What the page cache holds and how reads used it.
    pub page_cache: crate::PageCacheStats,
    /// Free blocks set aside for files' next appends (alloc/prealloc.rs).
    pub reserved_blocks: u64,
    /// Delayed writes and their writeback (data/writeback.rs).
    pub writeback: crate::WritebackStats,
}

impl crate::Fs {
    /// Per-operation times and counts, lock waits and journal commit times since the
    /// filesystem was opened (or since [`Fs::reset_stats`](crate::Fs::reset_stats)).
    pub fn stats(&self) -> StatsReport {
        let mut r = self.inner.stats.report();
        r.commits = self.commit_stats().map(|c| c.summary());
        r.page_cache = self.page_cache_stats();
        r.reserved_blocks = self.inner.pa_blocks.load(Ordering::Relaxed);
        r.writeback = self.writeback_stats();
        r
    }

    /// Zeroes the operation and lock figures (not the journal's commit history).
    pub fn reset_stats(&self) {
        self.inner.stats.reset();
    }

    /// Traces one top-level operation in `every` per thread, with everything it calls, and
    /// scales what it saw by `every` (default 16; 1: exact figures, at some cost: two clock
    /// reads and an atomic add per nested function). Lock waits and commits are always exact.
    pub fn set_stats_every(&self, every: u32) {
        self.inner.stats.set_every(every);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_traces_whole_operations_and_scales() {
        let s = Stats::default();
        s.set_every(4);
        std::thread::spawn(move || {
            // Two top-level operations per loop: a fixed gap of four would only ever trace
            // the first.
            for _ in 0..20_000 {
                {
                    let _outer = s.time(Op::Create);
                    for _ in 0..3 {
                        let _inner = s.time(Op::AddEntry);
                    }
                    let _start = s.time(Op::JournalStart);
                }
                let _u = s.time(Op::Unlink);
            }
            s.record_exact(Op::Commit, Duration::from_nanos(5));
            let r = s.report();
            let count = |n: &str| r.ops.iter().find(|o| o.name == n).unwrap().count;
            let near = |n: &str, want: u64| {
                let c = count(n);
                assert!(c % 4 == 0 && c.abs_diff(want) < want / 10, "{n}: {c}, want about {want}");
            };
            near("ext4_create", 20_000);
            near("ext4_unlink", 20_000);
            // Nested calls are traced with their operation.
            assert_eq!(count("ext4_add_entry"), 3 * count("ext4_create"));
            assert_eq!(count("jbd2__journal_start"), count("ext4_create"));
            assert_eq!(count("jbd2_journal_commit_transaction"), 1);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn sums_threads_and_times_contended_waits() {
        let s = Stats::default();
        s.set_every(1);
        let m = Mutex::new(0u64);
        std::thread::scope(|sc| {
            for _ in 0..4 {
                sc.spawn(|| {
                    for _ in 0..1000 {
                        let _t = s.time(Op::Create);
                        *s.lock(LockClass::OpLock, &m) += 1;
                    }
                });
            }
        });
        let r = s.report();
        let create = r.ops.iter().find(|o| o.name == "ext4_create").unwrap();
        assert_eq!(create.count, 4000);
        assert!(create.total_ns > 0);
        let l = r.locks.iter().find(|l| l.name.starts_with("inode op_lock")).unwrap();
        assert_eq!(l.acquired, 4000);
        assert!(l.contended <= l.acquired);
        assert!(l.max_wait_ns <= l.wait_ns);
        assert_eq!(*m.lock(), 4000);
        s.reset();
        assert!(s.report().ops.iter().all(|o| o.count == 0 && o.total_ns == 0));
    }

    #[test]
    fn a_held_lock_is_counted_as_a_wait() {
        let s = Stats::default();
        s.set_every(1);
        let l = RwLock::new(());
        let g = l.write();
        std::thread::scope(|sc| {
            let h = sc.spawn(|| drop(s.write(LockClass::DataSem, &l)));
            std::thread::sleep(Duration::from_millis(20));
            drop(g);
            h.join().unwrap();
        });
        let r = s.report();
        let d = r.locks.iter().find(|l| l.name.starts_with("data_sem")).unwrap();
        assert_eq!((d.acquired, d.contended), (1, 1));
        assert!(d.wait_ns >= 10_000_000, "{d:?}");
    }
}
