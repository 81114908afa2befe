//! The page cache: clean copies of regular files' blocks, keyed by (inode, logical block), so
//! that a hot read is a lookup and a copy, with no system call and no map walk (the kernel's
//! `filemap.c` read side; docs/pagecache.md has the invariants).
//!
//! A page is one filesystem block and never changes once made: a write makes a new page (or
//! drops the old one), so readers copy out of it without a lock. Every page carries the
//! *generation* of its inode's page set; an inode moves to a new generation when its map
//! changes in ways a write does not describe (truncate, punch, zero, collapse, insert), which
//! drops all its pages at once, and a new in-memory inode (loaded again, or a reused inode
//! number) starts with a generation never used before. Generations come from one counter,
//! handed to threads in blocks ([`next_gen`]).
//!
//! # Locking
//! The map is a [`ShardedCache`]: lookups take no lock; changes under a key take its shard's
//! mutex. A reader that misses registers its load under the shard mutex before it reads the
//! device ([`PageCache::begin_load`]); a writer that changed the device under a key records
//! that under the same mutex ([`PageCache::written`]), and a load registered before that is
//! not put in the cache ([`PageCache::end_load`]): it may hold what the write replaced.

use super::{CacheMark, Cached, Shard, ShardedCache};
use crate::sync::MutexGuard;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One block of a file, as the device holds it. [immutable]
pub(crate) struct Page {
    mark: CacheMark,
    /// The generation of the inode's page set this page belongs to.
    gen: u64,
    data: Box<[u8]>,
}

impl Cached for Page {
    fn mark(&self) -> &CacheMark {
        &self.mark
    }
}

/// Generations handed to a thread at a time: the shared counter is written once per this many
/// inodes loaded or invalidated.
const GEN_BATCH: u64 = 1 << 16;

static GEN_NEXT: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's next generation and the end of its block.
    static GEN_LOCAL: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// A generation no page set has had before (0 is never given).
pub(crate) fn next_gen() -> u64 {
    GEN_LOCAL.with(|c| {
        let (mut next, mut end) = c.get();
        if next == end {
            next = GEN_NEXT.fetch_add(GEN_BATCH, Ordering::Relaxed);
            end = next + GEN_BATCH;
        }
        c.set((next + 1, end));
        next
    })
}

/// The key of block `lblk` of inode `ino`: consecutive blocks get consecutive keys, which the
/// map's hash keeps in neighbouring slots.
fn key(ino: u32, lblk: u32) -> u64 {
    u64::from(ino) << 32 | u64::from(lblk)
}

/// Miss, readahead and direct-read counts (hits are not counted: a shared counter would be
/// written by every hot read). [relaxed atomics]
#[derive(Default)]
pub(crate) struct PageStats {
    pub misses: AtomicU64,
    pub readahead: AtomicU64,
    pub direct: AtomicU64,
}

pub(crate) struct PageCache {
    map: ShardedCache<Page>,
    block_size: usize,
    /// Whether pages are kept at all (`Options::page_cache_bytes` > 0). [immutable]
    enabled: bool,
    pub stats: PageStats,
}

/// A load registered under a key: what it saw of the key's writes when it began.
pub(crate) struct Load {
    key: u64,
    seen: u64,
}

impl PageCache {
    /// A cache of about `bytes` of pages of `block_size` bytes (none when `bytes` is 0).
    pub(crate) fn new(bytes: usize, block_size: usize) -> Self {
        let pages = bytes / block_size.max(1);
        PageCache {
            map: ShardedCache::new(pages.max(1), 64),
            block_size,
            enabled: bytes > 0,
            stats: PageStats::default(),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// Copies bytes `from..from + dst.len()` of block `lblk` of `ino` into `dst` if it is
    /// cached in generation `gen`; whether it was. Takes no lock and no reference: a page
    /// never changes, so a copy out of one being evicted is still right.
    pub(crate) fn copy(&self, ino: u32, lblk: u32, gen: u64, from: usize, dst: &mut [u8]) -> bool {
        self.map
            .read(key(ino, lblk), |p| {
                let hit = p.gen == gen;
                if hit {
                    dst.copy_from_slice(&p.data[from..from + dst.len()]);
                }
                hit
            })
            .unwrap_or(false)
    }

    /// Registers a load of block `lblk` of `ino`, before its contents are read.
    pub(crate) fn begin_load(&self, ino: u32, lblk: u32) -> Load {
        let key = key(ino, lblk);
        let mut s = self.map.shard(key).lock();
        let l = s.loads.entry(key).or_default();
        l.loaders += 1;
        Load { key, seen: l.overtaken }
    }

    /// Ends `load`, putting `data` (what it read) in the cache as generation `gen` unless a
    /// write under its key came after it began, or a current page is there already.
    pub(crate) fn end_load(&self, load: Load, gen: u64, data: &[u8]) {
        let Load { key, seen } = load;
        let mut s = self.map.shard(key).lock();
        let overtaken = match s.loads.get_mut(&key) {
            Some(l) => {
                l.loaders -= 1;
                let o = l.overtaken != seen;
                if l.loaders == 0 {
                    s.loads.remove(&key);
                }
                o
            }
            None => true,
        };
        if overtaken || data.len() != self.block_size {
            return;
        }
        if self.map.map.get(&key, &self.map.map.guard()).is_some_and(|p| p.gen == gen) {
            return;
        }
        let page = Arc::new(Page { mark: CacheMark::new(), gen, data: data.into() });
        self.map.put(&mut s, key, page);
    }

    /// Records that bytes `from..` of block `lblk` of `ino` are now `bytes` on the device (the
    /// write is done): a current page takes them, a stale one goes, a whole block written
    /// becomes a page if `fill` (as the kernel's writes leave their pages cached), and loads
    /// in flight under the key will not be cached.
    pub(crate) fn written(&self, ino: u32, lblk: u32, gen: u64, from: usize, bytes: &[u8], fill: bool) {
        let key = key(ino, lblk);
        let mut s = self.map.shard(key).lock();
        Self::overtake(&mut s, key);
        let guard = self.map.map.guard();
        let Some(old) = self.map.map.get(&key, &guard) else {
            if fill && from == 0 && bytes.len() == self.block_size {
                drop(guard);
                let page = Arc::new(Page { mark: CacheMark::new(), gen, data: bytes.into() });
                self.map.put(&mut s, key, page);
            }
            return;
        };
        let fits = from.checked_add(bytes.len()).is_some_and(|e| e <= self.block_size);
        if old.gen != gen || !fits {
            drop(guard);
            self.remove_locked(&mut s, key);
            return;
        }
        let mut data: Box<[u8]> = old.data.clone();
        data[from..from + bytes.len()].copy_from_slice(bytes);
        drop(guard);
        self.map.put(&mut s, key, Arc::new(Page { mark: CacheMark::new(), gen, data }));
    }

    /// Records that block `lblk` of `ino` now holds `data` (a whole block, just written from
    /// a dirty page that is handed over rather than copied): it becomes the current page, and
    /// loads in flight under the key will not be cached.
    pub(crate) fn written_block(&self, ino: u32, lblk: u32, gen: u64, data: Box<[u8]>) {
        if !self.enabled || data.len() != self.block_size {
            return;
        }
        let key = key(ino, lblk);
        let mut s = self.map.shard(key).lock();
        self.map.put(&mut s, key, Arc::new(Page { mark: CacheMark::new(), gen, data }));
    }

    /// Marks loads of `key` in flight as overtaken.
    fn overtake(s: &mut MutexGuard<'_, Shard>, key: u64) {
        if let Some(l) = s.loads.get_mut(&key) {
            l.overtaken += 1;
        }
    }

    fn remove_locked(&self, s: &mut MutexGuard<'_, Shard>, key: u64) {
        if let Some(old) = self.map.map.remove(&key, &self.map.map.guard()) {
            old.mark().dead.store(true, Ordering::Release);
            s.len -= 1;
        }
    }

    /// Number of cached pages (current or not).
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Drops every page nobody is copying from.
    pub(crate) fn shrink(&self) {
        self.map.shrink();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_are_unique_across_threads() {
        let mut all: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> =
                (0..4).map(|_| s.spawn(|| (0..1000).map(|_| next_gen()).collect::<Vec<_>>())).collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n);
        assert!(!all.contains(&0));
    }

    /// The whole block `lblk` of `ino` in generation `gen`, if cached.
    fn page(c: &PageCache, ino: u32, lblk: u32, gen: u64) -> Option<Vec<u8>> {
        let mut v = vec![0; c.block_size];
        c.copy(ino, lblk, gen, 0, &mut v).then_some(v)
    }

    #[test]
    fn pages_are_per_generation_and_take_writes() {
        let c = PageCache::new(1 << 20, 16);
        let l = c.begin_load(5, 3);
        c.end_load(l, 7, &[1u8; 16]);
        assert_eq!(page(&c, 5, 3, 7).unwrap(), &[1u8; 16]);
        assert!(page(&c, 5, 3, 8).is_none(), "another generation sees nothing");
        assert!(page(&c, 5, 4, 7).is_none() && page(&c, 6, 3, 7).is_none());
        c.written(5, 3, 7, 4, &[9, 9], true);
        let mut want = [1u8; 16];
        want[4..6].copy_from_slice(&[9, 9]);
        assert_eq!(page(&c, 5, 3, 7).unwrap(), &want);
        let mut part = [0u8; 3];
        assert!(c.copy(5, 3, 7, 3, &mut part));
        assert_eq!(part, [1, 9, 9], "a part of a page");
        // A write in a newer generation drops the old page.
        c.written(5, 3, 8, 0, &[2], true);
        assert!(page(&c, 5, 3, 7).is_none() && page(&c, 5, 3, 8).is_none());
        assert_eq!(c.len(), 0);
        // A whole block written is cached; a part of one is not.
        c.written(5, 9, 8, 0, &[3; 16], true);
        assert_eq!(page(&c, 5, 9, 8).unwrap(), &[3; 16]);
        c.written(5, 10, 8, 0, &[3; 15], true);
        assert!(page(&c, 5, 10, 8).is_none());
        c.written(5, 11, 8, 0, &[3; 16], false);
        assert!(page(&c, 5, 11, 8).is_none(), "not filled when not asked");
    }

    /// A load that began before a write under its key ended is not cached: it may have read
    /// what the write replaced.
    #[test]
    fn loads_overtaken_by_writes_are_not_cached() {
        let c = PageCache::new(1 << 20, 16);
        let early = c.begin_load(1, 0);
        let other = c.begin_load(1, 1);
        c.written(1, 0, 3, 0, &[5; 16], false);
        c.end_load(early, 3, &[0; 16]);
        assert!(page(&c, 1, 0, 3).is_none(), "stale load dropped");
        c.end_load(other, 3, &[4; 16]);
        assert_eq!(page(&c, 1, 1, 3).unwrap(), &[4; 16], "other keys unaffected");
        let late = c.begin_load(1, 0);
        c.end_load(late, 3, &[5; 16]);
        assert_eq!(page(&c, 1, 0, 3).unwrap(), &[5; 16]);
        assert_eq!(c.map.shard(key(1, 0)).lock().loads.len(), 0, "no load left recorded");
    }

    #[test]
    fn bounded() {
        let c = PageCache::new(64 * 1024, 16);
        for i in 0..100_000u32 {
            let l = c.begin_load(2, i);
            c.end_load(l, 1, &[0; 16]);
        }
        assert!(c.len() <= 4096 + 64 * 4, "{} pages", c.len());
        c.shrink();
        assert_eq!(c.len(), 0);
    }
}
