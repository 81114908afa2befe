//! The page cache: clean copies of regular files' blocks, so that a hot read is a lookup and a
//! copy, with no system call and no map walk (the kernel's `filemap.c` read side;
//! docs/pagecache.md has the invariants).
//!
//! A page is one filesystem block and never changes once made: a write makes a new page (or
//! drops the old one), so readers copy out of it without a lock. Pages are kept in *chunks* of
//! [`CHUNK_BLOCKS`] consecutive blocks of one file, one map entry each, keyed by (inode, block
//! / [`CHUNK_BLOCKS`]): a read of a few blocks is one lookup, and the map has a sixteenth of
//! the entries, so its table stays in the processor's caches (a lookup per block followed
//! five dependent pointers, most of them misses). A chunk never changes either: a change under
//! it puts a new chunk holding the same pages but the changed ones.
//!
//! Every chunk carries the *generation* of its inode's page set; an inode moves to a new
//! generation when its map changes in ways a write does not describe (truncate, punch, zero,
//! collapse, insert), which drops all its pages at once, and a new in-memory inode (loaded
//! again, or a reused inode number) starts with a generation never used before. Generations
//! come from one counter, handed to threads in blocks ([`next_gen`]).
//!
//! # Locking
//! The map is a [`ShardedCache`]: lookups take no lock; changes under a chunk's key take its
//! shard's mutex. A reader that misses registers its load of a block under that mutex before
//! it reads the device ([`PageCache::begin_load`]); a writer that changed the device under a
//! block records that under the same mutex ([`PageCache::written`]), and a load registered
//! before that is not put in the cache ([`PageCache::end_loads`]): it may hold what the write
//! replaced.

use super::{CacheMark, Cached, Shard, ShardedCache, SHARDS};
use crate::sync::MutexGuard;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Consecutive blocks of a file kept under one key (64 KiB of 4 KiB blocks).
const CHUNK_SHIFT: u32 = 4;
const CHUNK_BLOCKS: usize = 1 << CHUNK_SHIFT;

/// One block of a file, as the device holds it, shared by the chunks that hold it. [immutable]
type Page = Arc<Box<[u8]>>;

/// The cached pages of [`CHUNK_BLOCKS`] consecutive blocks of a file. [immutable]
///
/// In this order: a read's first cache line holds the mark it checks, the generation and the
/// first pages.
#[repr(C)]
pub(crate) struct Chunk {
    mark: CacheMark,
    /// The generation of the inode's page set these pages belong to.
    gen: u64,
    pages: [Option<Page>; CHUNK_BLOCKS],
}

impl Chunk {
    fn count(&self) -> usize {
        self.pages.iter().filter(|p| p.is_some()).count()
    }
}

impl Cached for Chunk {
    fn mark(&self) -> &CacheMark {
        &self.mark
    }
    fn weight(&self) -> usize {
        self.count()
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

/// The key of the chunk holding block `lblk` of inode `ino`: a file's consecutive chunks get
/// consecutive keys, which the map's hash keeps in neighbouring slots.
fn chunk_key(ino: u32, lblk: u32) -> u64 {
    u64::from(ino) << 32 | u64::from(lblk >> CHUNK_SHIFT)
}

/// The key a load of block `lblk` of `ino` is registered under (in its chunk's shard).
fn block_key(ino: u32, lblk: u32) -> u64 {
    u64::from(ino) << 32 | u64::from(lblk)
}

/// Where block `lblk` sits in its chunk.
fn slot(lblk: u32) -> usize {
    crate::num::usize_from(u64::from(lblk)) & (CHUNK_BLOCKS - 1)
}

/// Miss, readahead and direct-read counts (hits are not counted: a shared counter would be
/// written by every hot read). [relaxed atomics]
#[derive(Default)]
pub(crate) struct PageStats {
    pub misses: AtomicU64,
    pub readahead: AtomicU64,
    pub direct: AtomicU64,
    /// Large reads handed over where their bytes lie in the host file (`read_in_place`).
    pub spliced: AtomicU64,
}

pub(crate) struct PageCache {
    map: ShardedCache<Chunk>,
    block_size: usize,
    /// Whether pages are kept at all (`Options::page_cache_bytes` > 0). [immutable]
    enabled: bool,
    pub stats: PageStats,
}

/// A load registered under a block: what it saw of the block's writes when it began.
pub(crate) struct Load {
    ino: u32,
    lblk: u32,
    seen: u64,
}

impl PageCache {
    /// A cache of about `bytes` of pages of `block_size` bytes (none when `bytes` is 0), and
    /// at least a chunk per shard (a shard smaller than a chunk would evict each chunk it
    /// takes in).
    pub(crate) fn new(bytes: usize, block_size: usize) -> Self {
        let pages = bytes / block_size.max(1);
        PageCache {
            map: ShardedCache::new(pages.max(SHARDS * CHUNK_BLOCKS), 64),
            block_size,
            enabled: bytes > 0,
            stats: PageStats::default(),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// Copies into `dst` the bytes from `from` in block `lblk` of `ino` on, through the
    /// following blocks of its chunk while they are cached in generation `gen`; how many
    /// bytes it copied (0: a miss at `lblk`). Takes no lock and no reference: pages and chunks
    /// never change, so a copy out of one being evicted is still right.
    pub(crate) fn copy(&self, ino: u32, lblk: u32, gen: u64, from: usize, dst: &mut [u8]) -> usize {
        let bs = self.block_size;
        self.map
            .read(chunk_key(ino, lblk), |c| {
                if c.gen != gen {
                    return 0;
                }
                let (mut done, mut at) = (0, from);
                for p in c.pages[slot(lblk)..].iter() {
                    let Some(p) = p else { break };
                    let n = (dst.len() - done).min(bs - at);
                    dst[done..done + n].copy_from_slice(&p[at..at + n]);
                    done += n;
                    at = 0;
                    if done == dst.len() {
                        break;
                    }
                }
                done
            })
            .unwrap_or(0)
    }

    /// Registers a load of block `lblk` of `ino`, before its contents are read.
    pub(crate) fn begin_load(&self, ino: u32, lblk: u32) -> Load {
        let mut s = self.map.shard(chunk_key(ino, lblk)).lock();
        let l = s.loads.entry(block_key(ino, lblk)).or_default();
        l.loaders += 1;
        Load { ino, lblk, seen: l.overtaken }
    }

    /// Ends `loads`, of consecutive blocks of one file, whose contents are `data` (one block
    /// each, in order; empty after a failed read): each goes in the cache as generation `gen`
    /// unless a write under its block came after it began, or a current page is there
    /// already. One change per chunk.
    pub(crate) fn end_loads(&self, loads: Vec<Load>, gen: u64, data: &[u8]) {
        let bs = self.block_size;
        let whole = data.len() == loads.len() * bs;
        let mut loads = loads.into_iter().enumerate().peekable();
        while let Some((i, first)) = loads.next() {
            let key = chunk_key(first.ino, first.lblk);
            let mut s = self.map.shard(key).lock();
            let mut fresh = Vec::new();
            let mut take = |s: &mut MutexGuard<'_, Shard>, i: usize, l: Load| {
                if !Self::unregister(s, &l) && whole {
                    fresh.push((slot(l.lblk), &data[i * bs..(i + 1) * bs]));
                }
            };
            take(&mut s, i, first);
            while let Some((i, l)) = loads.next_if(|(_, l)| chunk_key(l.ino, l.lblk) == key) {
                take(&mut s, i, l);
            }
            self.edit(&mut s, key, gen, |pages| {
                let mut changed = false;
                for &(k, d) in &fresh {
                    if pages[k].is_none() {
                        pages[k] = Some(Arc::new(d.into()));
                        changed = true;
                    }
                }
                changed
            });
        }
    }

    /// Takes load `l` off its block's record; whether a write overtook it.
    fn unregister(s: &mut MutexGuard<'_, Shard>, l: &Load) -> bool {
        let key = block_key(l.ino, l.lblk);
        match s.loads.get_mut(&key) {
            Some(r) => {
                r.loaders -= 1;
                let o = r.overtaken != l.seen;
                if r.loaders == 0 {
                    s.loads.remove(&key);
                }
                o
            }
            None => true,
        }
    }

    /// Puts in place of chunk `key` one with its pages as `f` leaves them, starting from the
    /// chunk's pages if it is of generation `gen` and from none otherwise; nothing when `f`
    /// says it changed nothing and the chunk is current. A chunk left with no page goes.
    fn edit(
        &self,
        s: &mut MutexGuard<'_, Shard>,
        key: u64,
        gen: u64,
        f: impl FnOnce(&mut [Option<Page>; CHUNK_BLOCKS]) -> bool,
    ) {
        let guard = self.map.map.guard();
        let old = self.map.map.get(&key, &guard);
        let current = old.is_some_and(|c| c.gen == gen);
        let mut pages = match old {
            Some(c) if current => c.pages.clone(),
            _ => Default::default(),
        };
        if !f(&mut pages) && (current || old.is_none()) {
            return;
        }
        drop(guard);
        if pages.iter().all(Option::is_none) {
            self.remove_locked(s, key);
        } else {
            self.map.put(s, key, Arc::new(Chunk { mark: CacheMark::new(), gen, pages }));
        }
    }

    /// Records that the bytes of `ino` from byte `from` of block `lblk` on are now `bytes` on
    /// the device (the write is done): current pages take them, pages of another generation
    /// go, a whole block written becomes a page if `fill` (as the kernel's writes leave their
    /// pages cached), and loads in flight under the blocks will not be cached. One change per
    /// chunk.
    pub(crate) fn written(&self, ino: u32, lblk: u32, gen: u64, from: usize, bytes: &[u8], fill: bool) {
        let bs = self.block_size;
        if bs == 0 || from >= bs {
            return;
        }
        // (block, offset in it, bytes) for each block the write touches, a chunk's worth at a
        // time (a long write is not listed whole).
        let (mut b, mut at, mut rest) = (lblk, from, bytes);
        while !rest.is_empty() {
            let key = chunk_key(ino, b);
            let mut run = Vec::with_capacity(CHUNK_BLOCKS);
            while !rest.is_empty() && chunk_key(ino, b) == key {
                let n = rest.len().min(bs - at);
                run.push((b, at, &rest[..n]));
                rest = &rest[n..];
                at = 0;
                match b.checked_add(1) {
                    Some(next) => b = next,
                    None => rest = &[],
                }
            }
            let mut s = self.map.shard(key).lock();
            for &(b, _, _) in &run {
                Self::overtake(&mut s, block_key(ino, b));
            }
            self.edit(&mut s, key, gen, |pages| {
                let mut changed = false;
                for (b, at, piece) in run {
                    let k = slot(b);
                    let whole = piece.len() == bs;
                    match &pages[k] {
                        Some(_) if whole => pages[k] = Some(Arc::new(piece.into())),
                        Some(old) => {
                            let mut data: Box<[u8]> = old.as_ref().clone();
                            data[at..at + piece.len()].copy_from_slice(piece);
                            pages[k] = Some(Arc::new(data));
                        }
                        None if fill && whole => pages[k] = Some(Arc::new(piece.into())),
                        None => continue,
                    }
                    changed = true;
                }
                changed
            });
        }
    }

    /// Marks loads of block key `key` in flight as overtaken.
    fn overtake(s: &mut MutexGuard<'_, Shard>, key: u64) {
        if let Some(l) = s.loads.get_mut(&key) {
            l.overtaken += 1;
        }
    }

    fn remove_locked(&self, s: &mut MutexGuard<'_, Shard>, key: u64) {
        if let Some(old) = self.map.map.remove(&key, &self.map.map.guard()) {
            old.mark().dead.store(true, Ordering::Release);
            s.len -= old.weight();
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
        (c.copy(ino, lblk, gen, 0, &mut v) == v.len()).then_some(v)
    }

    /// Loads block `lblk` of `ino` as `data`.
    fn load(c: &PageCache, ino: u32, lblk: u32, gen: u64, data: &[u8]) {
        let l = c.begin_load(ino, lblk);
        c.end_loads(vec![l], gen, data);
    }

    #[test]
    fn pages_are_per_generation_and_take_writes() {
        let c = PageCache::new(1 << 20, 16);
        load(&c, 5, 3, 7, &[1u8; 16]);
        assert_eq!(page(&c, 5, 3, 7).unwrap(), &[1u8; 16]);
        assert!(page(&c, 5, 3, 8).is_none(), "another generation sees nothing");
        assert!(page(&c, 5, 4, 7).is_none() && page(&c, 6, 3, 7).is_none());
        c.written(5, 3, 7, 4, &[9, 9], true);
        let mut want = [1u8; 16];
        want[4..6].copy_from_slice(&[9, 9]);
        assert_eq!(page(&c, 5, 3, 7).unwrap(), &want);
        let mut part = [0u8; 3];
        assert_eq!(c.copy(5, 3, 7, 3, &mut part), 3);
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
        // A write over the end of a page goes on in the next block: the cached page takes
        // its part, the uncached block a part of which was written stays uncached.
        c.written(5, 9, 8, 10, &[4; 8], true);
        let mut want = [3u8; 16];
        want[10..].fill(4);
        assert_eq!(page(&c, 5, 9, 8).unwrap(), &want);
        assert!(page(&c, 5, 10, 8).is_none());
        // Over a chunk's end, whole blocks filled on both sides.
        c.written(5, 15, 8, 0, &[6; 32], true);
        assert_eq!(page(&c, 5, 15, 8).unwrap(), &[6; 16]);
        assert_eq!(page(&c, 5, 16, 8).unwrap(), &[6; 16]);
        assert_eq!(c.len(), 3);
    }

    /// A read copies across the cached blocks of a chunk and stops at the first missing one
    /// or at the chunk's end.
    #[test]
    fn copies_run_through_a_chunk() {
        let c = PageCache::new(1 << 20, 16);
        let data: Vec<u8> = (0..=255).collect();
        let loads: Vec<_> = (14..30).map(|b| c.begin_load(1, b)).collect();
        c.end_loads(loads, 2, &data);
        assert_eq!(c.len(), 16, "one page per block, in two chunks");
        let mut dst = vec![0u8; 40];
        // Blocks 14 and 15 end the first chunk: a copy from 14 stops there.
        assert_eq!(c.copy(1, 14, 2, 5, &mut dst), 27);
        assert_eq!(&dst[..27], &data[5..32]);
        assert_eq!(c.copy(1, 16, 2, 0, &mut dst), 40);
        assert_eq!(&dst[..], &data[32..72]);
        // A hole in the chunk ends the copy.
        c.written(1, 18, 3, 0, &[7; 16], false);
        assert_eq!(c.copy(1, 16, 2, 0, &mut dst), 0, "the chunk moved to generation 3");
        let loads: Vec<_> = (16..18).map(|b| c.begin_load(1, b)).collect();
        c.end_loads(loads, 3, &data[32..64]);
        assert_eq!(c.copy(1, 16, 3, 0, &mut dst), 32);
        assert_eq!(c.copy(1, 18, 3, 0, &mut dst), 0);
        // Whole blocks written become pages, over chunk boundaries.
        c.written(1, 30, 3, 0, &[9u8; 48], true);
        assert_eq!(c.copy(1, 30, 3, 8, &mut dst), 24, "to the chunk's end");
        assert_eq!(&dst[..24], &[9u8; 24]);
        assert_eq!(page(&c, 1, 32, 3).unwrap(), &[9u8; 16]);
    }

    /// A load that began before a write under its block ended is not cached: it may have read
    /// what the write replaced. Loads of other blocks of the chunk are.
    #[test]
    fn loads_overtaken_by_writes_are_not_cached() {
        let c = PageCache::new(1 << 20, 16);
        let early = c.begin_load(1, 0);
        let other = c.begin_load(1, 1);
        c.written(1, 0, 3, 0, &[5; 16], false);
        c.end_loads(vec![early], 3, &[0; 16]);
        assert!(page(&c, 1, 0, 3).is_none(), "stale load dropped");
        c.end_loads(vec![other], 3, &[4; 16]);
        assert_eq!(page(&c, 1, 1, 3).unwrap(), &[4; 16], "other blocks unaffected");
        let late = c.begin_load(1, 0);
        c.end_loads(vec![late], 3, &[5; 16]);
        assert_eq!(page(&c, 1, 0, 3).unwrap(), &[5; 16]);
        // Overtaken in the middle of a run: the rest of the run is cached.
        let run: Vec<_> = (4..7).map(|b| c.begin_load(1, b)).collect();
        c.written(1, 5, 3, 0, &[6; 16], true);
        c.end_loads(run, 3, &[1; 48]);
        assert_eq!(page(&c, 1, 4, 3).unwrap(), &[1; 16]);
        assert_eq!(page(&c, 1, 5, 3).unwrap(), &[6; 16], "the write's page stays");
        assert_eq!(page(&c, 1, 6, 3).unwrap(), &[1; 16]);
        // A failed read registers nothing and caches nothing.
        let failed = c.begin_load(1, 8);
        c.end_loads(vec![failed], 3, &[]);
        assert!(page(&c, 1, 8, 3).is_none());
        assert_eq!(c.map.shard(chunk_key(1, 0)).lock().loads.len(), 0, "no load left recorded");
    }

    #[test]
    fn bounded() {
        let c = PageCache::new(64 * 1024, 16);
        for i in 0..100_000u32 {
            load(&c, 2, i, 1, &[0; 16]);
        }
        assert!(c.len() <= 4096 + 64, "{} pages", c.len());
        c.shrink();
        assert_eq!(c.len(), 0);
    }
}
