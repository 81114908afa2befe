//! Writeback of delayed-allocation pages (the kernel's `fs-writeback.c`, `page-writeback.c`
//! and ext4's `ext4_writepages`): the set of files with dirty pages, the flusher thread that
//! writes them back when they are old or when too much is dirty, the throttle that makes a
//! writer write back its own file at the hard limit, and `sync`'s writeback of everything.
//!
//! Writing a file back gives its dirty pages storage in as few, as large allocations as the
//! free space allows (one `fill_map` per run of dirty blocks, with the file's goal and its
//! preallocation), writes them, maps them, and journals the record in short handles. The pages
//! are written before the handle that maps them stops, so the commit that makes them
//! reachable comes after their contents (`data=ordered`).
//!
//! # Locking
//! A file is written back under its `op_lock` (so no writer changes its pages meanwhile):
//! `op_lock` -> handle -> `data_sem` (exclusive while pages become mapped blocks) -> `raw` ->
//! `Inode::dirty`. `Writeback::files` shards are leaves: nothing is taken while one is held.

use super::delalloc::PageRun;
use super::write::{Filled, DATA_CREDITS};
use crate::error::{Error, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use crate::num::usize_from;
use crate::sync::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The longest run of dirty pages given blocks by one allocation: the longest initialized
/// extent.
const RUN_BLOCKS: u64 = 32768;

/// Buffers of written-back runs kept for reuse, and the least capacity worth keeping.
const SPARES: usize = 8;
const SPARE_MIN: usize = 4 << 20;

/// Shards of the set of dirty files (by inode number).
const SHARDS: usize = 16;

/// Dirty-page state of the whole filesystem.
pub(crate) struct Writeback {
    /// Whether writes may be delayed at all (`Options::delalloc`, a writable open with a page
    /// cache). [immutable]
    pub enabled: bool,
    /// Files with dirty pages or record changes not yet journaled, held so that the inode
    /// cache keeps them. [sharded mutexes; leaves]
    files: [Mutex<HashMap<u32, Arc<Inode>>>; SHARDS],
    /// Buffers of full runs written back, kept for the next runs of streams (their memory
    /// stays mapped). [own mutex; a leaf, taken under `Inode::dirty`]
    pub spares: Mutex<Vec<Vec<u8>>>,
    /// Clusters reserved for the writeback of dirty pages over holes (a block per page
    /// without bigalloc; a cluster per logical cluster with bigalloc): the kernel's
    /// `s_dirtyclusters_counter`. [atomic]
    pub dirty_blocks: AtomicU64,
    /// Dirty pages of all files, over holes and unwritten extents: what the dirty limits
    /// bound. [atomic]
    pub pages: AtomicU64,
    /// The flusher starts writing back above this many dirty pages. [immutable]
    pub background: u64,
    /// Writers write back their own file above this many. [immutable]
    pub hard: u64,
    /// Pages dirty for longer than this are written back by the flusher. [immutable]
    pub expire: Duration,
    /// The flusher's wake-up, shared with its thread (which holds no strong reference to
    /// the filesystem while it sleeps). [own lock]
    wake: Arc<(Mutex<FlusherState>, Condvar)>,
    /// Set while a wake-up for the background limit is pending (writers signal once). [atomic]
    kicked: AtomicBool,
    /// The flusher thread. [own lock; taken at close]
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub stats: WritebackStats,
}

#[derive(Default)]
struct FlusherState {
    stop: bool,
    /// Write everything back now (a `sync`-like request, or the background limit).
    urgent: bool,
}

/// Writeback figures ([`crate::Fs::writeback_stats`]). [relaxed atomics]
#[derive(Default)]
pub(crate) struct WritebackStats {
    /// Blocks written back.
    pub blocks: AtomicU64,
    /// Writebacks of one file (each a run of handles).
    pub files: AtomicU64,
    /// Nanoseconds spent writing back.
    pub nanos: AtomicU64,
    /// Writes that had to write their own file back (the hard limit).
    pub throttled: AtomicU64,
    /// Rounds of the flusher that found work.
    pub flusher_rounds: AtomicU64,
}

/// What bounds dirty pages: a share of the page cache.
pub(crate) struct DirtyLimits {
    pub(crate) page_cache_bytes: usize,
    pub(crate) block_size: u32,
    /// Percent of the cache dirty at which writers write back their own files.
    pub(crate) ratio: u8,
    /// Percent of the cache dirty at which the flusher starts.
    pub(crate) background_ratio: u8,
}

impl DirtyLimits {
    /// (background, hard) in blocks. The hard limit is never below 256 blocks, so a tiny
    /// cache still lets a write of 1 MiB be dirty at once; a percent over 100 counts as 100.
    fn blocks(&self) -> (u64, u64) {
        let cache = (self.page_cache_bytes / self.block_size.max(1) as usize) as u64;
        let share =
            |pct: u8| cache / 100 * u64::from(pct.min(100)) + cache % 100 * u64::from(pct.min(100)) / 100;
        let hard = share(self.ratio).max(256);
        (share(self.background_ratio).min(hard), hard)
    }
}

impl Writeback {
    pub(crate) fn new(enabled: bool, limits: DirtyLimits, expire: Duration) -> Self {
        let (background, hard) = limits.blocks();
        Writeback {
            enabled,
            files: std::array::from_fn(|_| Mutex::new(HashMap::new())),
            spares: Mutex::new(Vec::new()),
            dirty_blocks: AtomicU64::new(0),
            pages: AtomicU64::new(0),
            background,
            hard,
            expire,
            wake: Arc::new((Mutex::new(FlusherState::default()), Condvar::new())),
            kicked: AtomicBool::new(false),
            thread: Mutex::new(None),
            stats: WritebackStats::default(),
        }
    }

    fn shard(&self, ino: u32) -> &Mutex<HashMap<u32, Arc<Inode>>> {
        &self.files[ino as usize % SHARDS]
    }

    /// Records that `inode` has something to write back (no-op if it is recorded).
    pub(crate) fn add(&self, inode: &Arc<Inode>) {
        if !inode.wb_listed.swap(true, Ordering::AcqRel) {
            self.shard(inode.ino.0).lock().insert(inode.ino.0, inode.clone());
        }
    }

    /// Forgets `inode` (written back or deleted). The caller holds its `op_lock`.
    pub(crate) fn remove(&self, inode: &Inode) {
        if inode.wb_listed.swap(false, Ordering::AcqRel) {
            self.shard(inode.ino.0).lock().remove(&inode.ino.0);
        }
    }

    /// Keeps the buffers of full runs for the next streams' runs (a few).
    fn keep_spares(&self, taken: Vec<(u64, PageRun)>) {
        let mut s = self.spares.lock();
        for (_, r) in taken {
            if s.len() < SPARES && r.bytes.capacity() >= SPARE_MIN {
                s.push(r.bytes);
            }
        }
    }

    /// How many files are recorded now.
    pub(crate) fn files_listed(&self) -> u64 {
        self.files.iter().map(|s| s.lock().len() as u64).sum()
    }

    /// The files recorded now.
    fn listed(&self) -> Vec<Arc<Inode>> {
        let mut v = Vec::new();
        for s in &self.files {
            v.extend(s.lock().values().cloned());
        }
        v
    }

    /// Asks the flusher to write back now (the background limit was crossed).
    fn kick(&self) {
        if !self.kicked.swap(true, Ordering::AcqRel) {
            self.wake.0.lock().urgent = true;
            self.wake.1.notify_all();
        }
    }
}

impl FsInner {
    /// Writes back `inode`'s dirty pages and journals its record's pending changes. The
    /// caller holds its `op_lock`.
    pub(crate) fn writeback_locked(&self, inode: &Arc<Inode>) -> Result<()> {
        if !inode.wb_listed.load(Ordering::Acquire) {
            return Ok(());
        }
        let started = Instant::now();
        let journal = self.journal()?.clone();
        let bs = u64::from(self.sbi.block_size);
        let mut blocks = 0u64;
        let mut retried = false;
        loop {
            // Whole runs at once (up to an extent's length), so that the allocator can find
            // them one free run that holds them all; unwritten blocks among them are
            // converted in the same handle.
            let range = inode.dirty.lock().first_run(RUN_BLOCKS);
            let Some((lo, hi)) = range else {
                // No pages: the record's size and times still go to the journal.
                if inode.dirty.lock().take_record() {
                    let h = journal.start(4)?;
                    let mut raw = inode.raw_mut();
                    self.mark_inode_dirty(&h, inode, &mut raw)?;
                    drop(raw);
                    h.stop();
                }
                break;
            };
            let h = journal.start(DATA_CREDITS)?;
            let _d = self.stats.write(crate::fs::stats::LockClass::DataSem, &inode.data_sem);
            let mut raw = inode.raw_mut();
            let filled = crate::alloc::reserved::writing_back(|| {
                self.fill_map(&h, inode, &mut raw, lo, hi, false, true)
            });
            let Filled { runs, reached, .. } = match filled {
                Ok(f) if f.reached > lo => f,
                // Every dirty page has a block while the reservations hold, but blocks freed
                // by a transaction not yet committed count as free and are not for reuse
                // (busy): commit them, and try again, as the general write path does.
                Ok(_) | Err(Error::NoSpace) if !retried && self.has_busy_blocks() => {
                    drop(raw);
                    drop(_d);
                    h.stop();
                    journal.sync()?;
                    retried = true;
                    continue;
                }
                Ok(_) => return Err(Error::NoSpace),
                Err(e) => return Err(e),
            };
            retried = false;
            // The stretch's runs: each part of one that a piece the allocator found holds is
            // one write.
            let (taken, released) = {
                let mut d = inode.dirty.lock();
                let taken = d.take_front(lo, reached);
                // With bigalloc the clusters these pages are in are mapped now: their
                // reservations are used up (invariant 7 of data/delalloc.rs).
                let bits = self.sbi.cluster_bits;
                (taken, if bits > 0 { Some(d.release_clusters(lo, reached, bits)) } else { None })
            };
            let (mut n, mut reserved) = (0, 0);
            for (start, run) in &taken {
                let data = &run.bytes;
                let end = start + data.len() as u64 / bs;
                n += end - start;
                if run.reserved {
                    reserved += end - start;
                }
                for r in runs.iter().filter(|r| r.lblk < end && r.lblk + r.len > *start) {
                    let a = r.lblk.max(*start);
                    let z = (r.lblk + r.len).min(end);
                    let bytes = &data[usize_from((a - start) * bs)..usize_from((z - start) * bs)];
                    if let Err(e) = self.dev.write_at(bytes, (r.pblk + (a - r.lblk)) * bs) {
                        // The open handle maps blocks whose contents did not reach the
                        // device: it must never commit (data=ordered; the kernel's
                        // `data_err=abort`).
                        journal.abort(format!("writeback of inode {} failed: {e}", inode.ino.0), libc::EIO);
                        // EIO, as the kernel reports a failed writeback.
                        return Err(Error::Io(std::io::Error::other(format!("writeback failed: {e}"))));
                    }
                }
                // As a write of the run's bytes: a short run's pages stay in the clean cache,
                // a long run's become pages only where one was cached (a stream rarely reads
                // its data again, and filling the cache with it costs more than the write).
                self.pages_written(inode, start * bs, data);
            }
            self.wb.keep_spares(taken);
            // Reservations given back, in clusters (pages over holes without bigalloc).
            let reserved = released.unwrap_or(reserved);
            let size = crate::inode::write::raw_size(&raw);
            {
                let mut d = inode.dirty.lock();
                d.advance_disk_size(size);
                d.take_record();
            }
            // Journaled while the count still covers what is left (see `disk_size`). The
            // reservation becomes usage as the record is charged, and is given back after
            // it, so that a check racing this one counts the blocks one way or the other.
            let written = self.mark_inode_dirty(&h, inode, &mut raw);
            self.quota_unreserve(inode, &raw, self.sbi.c2b(reserved));
            written?;
            inode.dirty_pages.fetch_sub(n, Ordering::AcqRel);
            self.wb.pages.fetch_sub(n, Ordering::AcqRel);
            self.wb.dirty_blocks.fetch_sub(reserved, Ordering::AcqRel);
            blocks += n;
            drop(raw);
            drop(_d);
            h.stop();
        }
        let mut d = inode.dirty.lock();
        if d.is_clean() {
            drop(d);
            self.wb.remove(inode);
        } else {
            // Dirtied again meanwhile cannot happen under `op_lock`; keep it listed anyway.
            d.touch();
        }
        let st = &self.wb.stats;
        st.blocks.fetch_add(blocks, Ordering::Relaxed);
        st.files.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        st.nanos.fetch_add(ns, Ordering::Relaxed);
        Ok(())
    }

    /// [`FsInner::writeback_locked`], taking `op_lock`.
    pub(crate) fn writeback_inode(&self, inode: &Arc<Inode>) -> Result<()> {
        if !inode.wb_listed.load(Ordering::Acquire) {
            return Ok(());
        }
        let _op = self.stats.lock(crate::fs::stats::LockClass::OpLock, &inode.op_lock);
        self.writeback_locked(inode)
    }

    /// Writes back every file (`sync`, unmount). Returns the first error, after trying all.
    pub(crate) fn writeback_all(&self) -> Result<()> {
        // In inode order, one file after another on each of the threads.
        let mut files = self.wb.listed();
        files.sort_unstable_by_key(|i| i.ino.0);
        // Another thread only for a long list: on a busy machine a new thread may wait a
        // time slice for a CPU, longer than a few hundred small files take.
        let threads =
            std::thread::available_parallelism().map_or(1, |n| n.get()).min(files.len() / 512).max(1);
        let next = std::sync::atomic::AtomicUsize::new(0);
        let run = || -> Result<()> {
            let mut first = Ok(());
            while let Some(inode) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
                if let Err(e) = self.writeback_inode(inode) {
                    if first.is_ok() {
                        first = Err(e);
                    }
                }
            }
            first
        };
        if threads == 1 {
            return run();
        }
        std::thread::scope(|s| {
            let helpers: Vec<_> = (1..threads).map(|_| s.spawn(run)).collect();
            let mut first = run();
            for h in helpers {
                // A panic in a helper is a bug: pass it on.
                let r = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
                if first.is_ok() {
                    first = r;
                }
            }
            first
        })
    }

    /// After a delayed write by the holder of `inode`'s `op_lock`: at the hard limit the
    /// writer writes its own file back (`balance_dirty_pages`), past the background limit the
    /// flusher is woken.
    pub(crate) fn balance_dirty(&self, inode: &Arc<Inode>) -> Result<()> {
        let dirty = self.wb.pages.load(Ordering::Acquire);
        if dirty > self.wb.hard {
            self.wb.stats.throttled.fetch_add(1, Ordering::Relaxed);
            self.wb.kick();
            return self.writeback_locked(inode);
        }
        if dirty > self.wb.background {
            self.wb.kick();
        }
        Ok(())
    }

    /// Drops `inode`'s dirty pages unwritten and gives back their reservation (it is being
    /// deleted). The caller holds its `op_lock`.
    pub(crate) fn drop_dirty(&self, inode: &Inode) {
        if !inode.wb_listed.load(Ordering::Acquire) {
            return;
        }
        let d = std::mem::take(&mut *inode.dirty.lock());
        let res = d.reserved_clusters(self.sbi.cluster_bits > 0);
        inode.dirty_pages.fetch_sub(d.pages_len(), Ordering::AcqRel);
        self.wb.pages.fetch_sub(d.pages_len(), Ordering::AcqRel);
        self.wb.dirty_blocks.fetch_sub(res, Ordering::AcqRel);
        self.quota_unreserve(inode, &inode.raw(), self.sbi.c2b(res));
        self.wb.remove(inode);
    }

    /// One round of the flusher: files dirty for longer than `expire`, or every file when
    /// above the background limit (oldest first, until below half of it).
    fn flush_round(&self, urgent: bool) {
        let now = Instant::now();
        let mut files: Vec<(Instant, Arc<Inode>)> = self
            .wb
            .listed()
            .into_iter()
            .map(|i| {
                let since = i.dirty.lock().since().unwrap_or(now);
                (since, i)
            })
            .collect();
        if files.is_empty() {
            return;
        }
        files.sort_by_key(|(t, _)| *t);
        self.wb.stats.flusher_rounds.fetch_add(1, Ordering::Relaxed);
        for (since, inode) in files {
            let over = self.wb.pages.load(Ordering::Acquire) > self.wb.background / 2;
            if !(urgent && over) && now.duration_since(since) < self.wb.expire {
                continue;
            }
            // A failure leaves the pages dirty and listed: the next round, `fsync` or
            // `sync` tries again, and those report it.
            let _ = self.writeback_inode(&inode);
        }
    }
}

/// Starts the flusher of `fs` (writable opens with delayed allocation).
pub(crate) fn start_flusher(fs: &Arc<FsInner>) -> Result<()> {
    if !fs.wb.enabled {
        return Ok(());
    }
    let weak: Weak<FsInner> = Arc::downgrade(fs);
    let wake = fs.wb.wake.clone();
    let tick = (fs.wb.expire / 6).clamp(Duration::from_millis(10), Duration::from_secs(5));
    let thread = std::thread::Builder::new()
        .name("rext4-flush".into())
        .spawn(move || loop {
            let urgent = {
                let mut st = wake.0.lock();
                if !st.stop && !st.urgent {
                    wake.1.wait_for(&mut st, tick);
                }
                if st.stop {
                    return;
                }
                std::mem::take(&mut st.urgent)
            };
            let Some(fs) = weak.upgrade() else { return };
            fs.wb.kicked.store(false, Ordering::Release);
            fs.flush_round(urgent);
        })
        .map_err(Error::Io)?;
    *fs.wb.thread.lock() = Some(thread);
    Ok(())
}

/// Stops the flusher (at close). When the last reference to the filesystem was the
/// flusher's own (it is closing it), the thread is not waited for: it ends by itself.
pub(crate) fn stop_flusher(fs: &FsInner) {
    fs.wb.wake.0.lock().stop = true;
    fs.wb.wake.1.notify_all();
    let thread = fs.wb.thread.lock().take();
    if let Some(t) = thread {
        if t.thread().id() != std::thread::current().id() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DirtyLimits;

    fn limits(mib: usize, ratio: u8, background_ratio: u8) -> (u64, u64) {
        DirtyLimits { page_cache_bytes: mib << 20, block_size: 4096, ratio, background_ratio }.blocks()
    }

    #[test]
    fn limits_are_shares_of_the_cache() {
        assert_eq!(limits(64, 50, 25), (4096, 8192));
        assert_eq!(limits(64, 100, 1), (163, 16384));
        // The background limit never passes the hard one; percents stop at 100.
        assert_eq!(limits(64, 20, 40), (3276, 3276));
        assert_eq!(limits(64, 200, 200), (16384, 16384));
        // A tiny cache still allows 256 dirty blocks.
        assert_eq!(limits(1, 50, 25), (64, 256));
        assert_eq!(limits(0, 50, 50), (0, 256));
    }
}
