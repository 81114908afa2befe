//! Caches: the sharded lock-free map every cache is built on (this file), metadata buffers
//! (`buffer`), names (`dcache`), xattr-block and EA-inode sharing (`mbcache`) and file data
//! (`page`).
//!
//! ## This module
//! A bounded map from `u64` keys to shared entries, read without locks, so that threads
//! working on different keys never write a shared cache line. The buffer cache, the inode
//! cache and the name cache are each one; the first two hand out `Arc`s of their entries, the
//! name cache keeps its entries in the map itself and is only read in place ([`Slot`]).
//!
//! # Locking
//! The entries sit in one concurrent map (`papaya`) whose readers take no lock: a lookup reads
//! the table under an epoch guard and clones the entry's `Arc`, as the kernel's RCU walks of
//! the dcache and the inode hash do. On two cores, the shard mutexes lookups took before wrote
//! their cache line on every lookup: 3 to 10 line transfers between cores per metadata
//! operation. Every change to the map under a key is made holding that key's shard mutex,
//! which also protects the shard's clock queue, parked states, count and loads in flight; it
//! is never held while an entry is loaded (I/O), and no other lock is taken under it. Two
//! threads missing the same key both load it; the first insert wins and the other thread's
//! copy is dropped, or, if the first was evicted meanwhile, loaded again.
//!
//! # Eviction against lock-free readers
//! An entry nobody holds (its `Arc` count is one: the map's) may be evicted. A reader may clone
//! it in the moment the evictor checked the count, and would then hold a copy the cache no
//! longer knows: the next load would make a second one (two copies of a bitmap hand out the
//! same bit twice). So the evictor marks the entry dead, then checks the count; a reader clones,
//! then checks the mark; each with a full fence between its store and its load, so that at
//! least one of them sees the other (store buffering). An evictor that sees a reader's clone
//! revives the entry; a reader that sees the mark drops its clone and looks again under the
//! shard mutex, where no dead entry is ever found. [`ShardedCache::read`] clones nothing and
//! may run on an entry being evicted: it is for entries whose eviction loses nothing. A weak
//! link to an entry (a cached name's to its inode) is followed the same way ([`follow`]): it
//! upgrades, then checks the mark; an evicted entry stays marked dead until it is freed. An
//! entry replaced under its key (an inode number given to a new file) is marked dead too, so
//! that a link or a holder does not take the freed inode for the key's current one
//! ([`is_current`]).
//!
//! # Bounds
//! Each shard holds about `capacity / SHARDS` entries (weighted: a page cache chunk weighs its
//! pages, [`Cached::weight`]). Eviction is CLOCK (second chance): an
//! entry used since the hand last passed is spared once; an entry someone still holds (`Arc`
//! count above one) or whose state exists only in memory (`Evict::Keep`) is never dropped, so
//! the bound can be exceeded only by what is in use. An entry may instead leave a small state
//! behind (`Evict::Park`, e.g. an inode's reference count): the shard keeps that number and hands
//! it to the next copy loaded under the same key ([`Cached::unpark`]). Each eviction pass looks
//! at a bounded number of entries, so a shard full of kept entries costs little per insert.

pub(crate) mod buffer;
pub(crate) mod dcache;
pub(crate) mod mbcache;
pub(crate) mod page;

use crate::error::Result;
use crate::sync::{Mutex, MutexGuard};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Weak};

/// Hashes a `u64` key with one multiply-xorshift round (splitmix64's finalizer). Keys are
/// block and inode numbers, or names already hashed (cache/dcache.rs): none needs SipHash, which
/// took as long as the rest of a lookup.
///
/// The low three bits pass through unmixed, so eight consecutive numbers land in neighbouring
/// slots of the table: inodes made one after another (and stat'ed, removed or written back in
/// the same order) share the table's cache lines and pages instead of each missing on its own.
/// Runs of eight are short enough not to lengthen probes; everything above them is mixed, so
/// strided keys (one bitmap block per group) still spread.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, k: u64) {
        self.0 = mix64(k >> 3) << 3 | k & 7;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// splitmix64's finalizer: every input bit moves every output bit.
pub(in crate::cache) fn mix64(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Which of `shards` (a power of two) `key` falls in: Fibonacci hashing, the multiply's top
/// bits, so that consecutive keys spread over all shards.
pub(crate) fn shard_of(key: u64, shards: usize) -> usize {
    debug_assert!(shards.is_power_of_two() && shards > 1);
    crate::num::usize_from(key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - shards.ilog2()))
}

/// A map keyed by block or inode numbers (or hashes), with [`KeyHasher`].
pub(crate) type KeyMap<T> = HashMap<u64, T, BuildHasherDefault<KeyHasher>>;

const SHARDS: usize = 64;

/// Most entries one eviction pass looks at: inserts stay cheap when a shard is full of entries
/// that cannot go; the cache then runs over its bound until they can.
const EVICT_SCAN: usize = 64;

/// What evicting an entry nobody holds would lose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Evict {
    /// Nothing: a fresh load gives the same entry.
    Drop,
    /// This number, which the next load gets back through [`Cached::unpark`].
    Park(u32),
    /// State that exists only in memory: never evict.
    Keep,
}

/// The cache's own marks on an entry. [atomic]
#[derive(Debug)]
pub(crate) struct CacheMark {
    /// Used since the clock hand last passed.
    referenced: AtomicBool,
    /// Being evicted (see the module comment); set and cleared only under the shard mutex.
    dead: AtomicBool,
}

impl CacheMark {
    pub(crate) fn new() -> Self {
        CacheMark { referenced: AtomicBool::new(true), dead: AtomicBool::new(false) }
    }

    /// Records a use, writing the entry's line only when the hand has cleared the bit.
    fn touch(&self) {
        if !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
    }
}

/// What a cached value must offer: the cache's marks.
pub(crate) trait Cached {
    fn mark(&self) -> &CacheMark;
    /// Whether and how the entry may be evicted when nobody holds it.
    fn evict(&self) -> Evict {
        Evict::Drop
    }
    /// Takes back the state an evicted copy parked (called under the shard lock, before the
    /// new copy is visible).
    fn unpark(&self, _state: u32) {}
    /// How much of the cache's capacity the entry takes (the pages of a page cache chunk);
    /// fixed for the entry's life.
    fn weight(&self) -> usize {
        1
    }
}

/// What a shard's mutex protects besides the right to change the map under its keys.
struct Shard {
    clock: VecDeque<u64>,
    /// States left by evicted entries, until their key is loaded again.
    parked: KeyMap<u32>,
    /// The weight of this shard's entries in the map (their number, but for pages).
    len: usize,
    /// Keys being loaded ([`ShardedCache::get_or_load`]), each with its loaders and a count of
    /// the entries put under it since: a load that began before one of them may have read
    /// what that entry replaces.
    loads: KeyMap<Loading>,
}

/// Loads in flight for one key.
#[derive(Default)]
struct Loading {
    loaders: u32,
    /// Entries put under the key while a load was in flight.
    overtaken: u64,
}

/// How a cache keeps its entries: shared (`Arc`), so that callers may hold them, or in the
/// map's own allocation ([`InPlace`]), read only through [`ShardedCache::read`]: one pointer
/// fewer to follow on a lookup, for entries nobody needs to hold (cached names).
pub(crate) trait Slot: std::ops::Deref + Send + Sync {
    /// Whether someone besides the map holds the entry (it must not be evicted).
    fn held(&self) -> bool;
}

impl<V: Send + Sync> Slot for Arc<V> {
    fn held(&self) -> bool {
        Arc::strong_count(self) > 1
    }
}

/// An entry kept in the map itself.
pub(in crate::cache) struct InPlace<V>(pub V);

impl<V> std::ops::Deref for InPlace<V> {
    type Target = V;
    fn deref(&self) -> &V {
        &self.0
    }
}

impl<V: Send + Sync> Slot for InPlace<V> {
    fn held(&self) -> bool {
        false
    }
}

pub(crate) struct ShardedCache<V, S = Arc<V>> {
    per_shard: usize,
    /// Every entry. [read without locks; changed under the key's shard mutex]
    map: papaya::HashMap<u64, S, BuildHasherDefault<KeyHasher>>,
    shards: Box<[Mutex<Shard>]>,
    _entries: std::marker::PhantomData<fn() -> V>,
}

impl<V: Cached, S: Slot<Target = V>> ShardedCache<V, S> {
    /// A cache of about `capacity` entries (at least a few per shard). Entries it drops are
    /// freed `retire_batch` at a time per thread, each batch after one process-wide memory
    /// barrier (`membarrier`, which interrupts every core running one of our threads): large
    /// batches for small entries, smaller ones where each entry holds a block.
    pub(crate) fn new(capacity: usize, retire_batch: usize) -> Self {
        let per_shard = (capacity / SHARDS).max(4);
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    clock: VecDeque::new(),
                    parked: KeyMap::default(),
                    len: 0,
                    loads: KeyMap::default(),
                })
            })
            .collect();
        let map = papaya::HashMap::builder()
            .hasher(Default::default())
            .collector(seize::Collector::new().batch_size(retire_batch))
            .build();
        ShardedCache { per_shard, map, shards, _entries: std::marker::PhantomData }
    }

    fn shard(&self, key: u64) -> &Mutex<Shard> {
        &self.shards[Self::shard_index(key)]
    }

    fn shard_index(key: u64) -> usize {
        shard_of(key, SHARDS)
    }

    /// `f` of the cached entry for `key`, if present, without a lock and without a reference
    /// taken, so no write to the entry's reference count (a lookup that needs one number).
    /// `f` may see an entry being evicted: only for entries whose eviction loses nothing.
    pub(crate) fn read<R>(&self, key: u64, f: impl FnOnce(&V) -> R) -> Option<R> {
        let guard = self.map.guard();
        let v = self.map.get(&key, &guard)?;
        v.mark().touch();
        Some(f(v))
    }

    /// Puts `v` under `key` in the map, holding the key's shard, and keeps the shard bounded.
    fn put(&self, s: &mut MutexGuard<'_, Shard>, key: u64, v: S) {
        v.mark().referenced.store(true, Ordering::Relaxed);
        let weight = v.weight();
        if !s.loads.is_empty() {
            if let Some(l) = s.loads.get_mut(&key) {
                l.overtaken += 1;
            }
        }
        let guard = self.map.guard();
        match self.map.insert(key, v, &guard) {
            // Replaced (an inode number given to a new file): as good as evicted, for whoever
            // still holds or links to the old entry.
            Some(old) => {
                old.mark().dead.store(true, Ordering::Release);
                s.len = s.len + weight - old.weight();
            }
            None => {
                s.len += weight;
                s.clock.push_back(key);
            }
        }
        if s.len > self.per_shard {
            self.evict(s, self.per_shard);
        }
    }

    /// Puts `v` under `key`, replacing any cached entry and parked state (for objects created
    /// in memory).
    pub(crate) fn insert(&self, key: u64, v: S) {
        let mut s = self.shard(key).lock();
        s.parked.remove(&key);
        self.put(&mut s, key, v);
    }

    /// Puts `v` under `key` if `still_valid()` holds, checked under the shard lock (so that a
    /// remover that invalidates before removing cannot be overtaken).
    pub(crate) fn insert_if(&self, key: u64, v: S, still_valid: impl FnOnce() -> bool) {
        let mut s = self.shard(key).lock();
        if still_valid() {
            self.put(&mut s, key, v);
        }
    }

    /// Puts `new` under `key` in place of the entry there if `still(entry)` holds, checked
    /// under the key's shard lock (so a remover that takes the entry out first wins).
    pub(crate) fn replace_if(&self, key: u64, still: impl FnOnce(&V) -> bool, new: S) {
        let mut s = self.shard(key).lock();
        if self.map.get(&key, &self.map.guard()).is_some_and(|v| still(v)) {
            self.put(&mut s, key, new);
        }
    }

    /// Drops the entry under `key`, if any.
    pub(crate) fn remove(&self, key: u64) {
        let mut s = self.shard(key).lock();
        if let Some(old) = self.map.remove(&key, &self.map.guard()) {
            s.len -= old.weight();
        }
    }

    /// Drops or parks what the entry under `key` may lose; `false` if it must stay. Holds the
    /// key's shard.
    fn try_evict(&self, s: &mut Shard, key: u64) -> bool {
        let guard = self.map.guard();
        let Some(v) = self.map.get(&key, &guard) else { return true };
        if v.held() || v.evict() == Evict::Keep {
            return false;
        }
        // Against readers cloning it right now (module comment).
        v.mark().dead.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let verdict = if v.held() { Evict::Keep } else { v.evict() };
        match verdict {
            Evict::Keep => {
                v.mark().dead.store(false, Ordering::Relaxed);
                return false;
            }
            Evict::Drop => {}
            Evict::Park(state) => {
                s.parked.insert(key, state);
            }
        }
        s.len -= v.weight();
        self.map.remove(&key, &guard);
        true
    }

    fn evict(&self, s: &mut Shard, target: usize) {
        // Bounded sweep (second chance for recently used entries): up to twice round the
        // clock, so that a shard whose entries were all used since the hand last passed still
        // gets back under its bound (one pass only clears their marks; an entry weighing many
        // units, a page cache chunk, would overshoot by as much).
        let mut budget = (2 * s.clock.len()).min(EVICT_SCAN);
        let guard = self.map.guard();
        while s.len > target && budget > 0 {
            budget -= 1;
            let Some(key) = s.clock.pop_front() else {
                break;
            };
            let recent = self
                .map
                .get(&key, &guard)
                .is_some_and(|v| v.mark().referenced.swap(false, Ordering::Relaxed));
            if recent || !self.try_evict(s, key) {
                s.clock.push_back(key);
            }
        }
    }

    /// Every shard's mutex, in order: nothing changes the map while they are held.
    fn lock_all(&self) -> Vec<MutexGuard<'_, Shard>> {
        self.shards.iter().map(|s| s.lock()).collect()
    }

    /// Number of cached entries (their weight, for pages).
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len).sum()
    }

    /// Drops (or parks) every entry nobody holds.
    pub(crate) fn shrink(&self) {
        let mut all = self.lock_all();
        let keys: Vec<u64> = {
            let guard = self.map.guard();
            self.map.iter(&guard).map(|(k, _)| *k).collect()
        };
        for k in keys {
            self.try_evict(&mut all[Self::shard_index(k)], k);
        }
        let guard = self.map.guard();
        for s in all.iter_mut() {
            s.clock.retain(|k| self.map.get(k, &guard).is_some());
        }
    }

    /// Number of parked states.
    #[cfg(test)]
    pub(crate) fn parked(&self) -> usize {
        self.shards.iter().map(|s| s.lock().parked.len()).sum()
    }
}

impl<V: Cached + Send + Sync> ShardedCache<V> {
    /// The cached entry for `key`, if present.
    pub(crate) fn get(&self, key: u64) -> Option<Arc<V>> {
        match self.get_unlocked(key) {
            Lookup::Found(v) => Some(v),
            Lookup::Absent => None,
            Lookup::Evicting => {
                let _s = self.shard(key).lock();
                self.get_locked(key)
            }
        }
    }

    /// A reader's lookup: no lock, and a clone that an eviction cannot strand (module comment).
    fn get_unlocked(&self, key: u64) -> Lookup<V> {
        let guard = self.map.guard();
        let Some(v) = self.map.get(&key, &guard) else { return Lookup::Absent };
        let v = v.clone();
        fence(Ordering::SeqCst);
        if v.mark().dead.load(Ordering::Relaxed) {
            return Lookup::Evicting;
        }
        v.mark().touch();
        Lookup::Found(v)
    }

    /// A lookup under the key's shard mutex, where no entry is dead.
    fn get_locked(&self, key: u64) -> Option<Arc<V>> {
        let guard = self.map.guard();
        let v = self.map.get(&key, &guard)?.clone();
        v.mark().touch();
        Some(v)
    }

    /// The entry for `key`, loading it with `load` (no lock held) on a miss.
    ///
    /// A load may read what a newer entry under the same key replaces, and that entry may be
    /// evicted before the load ends: putting the loaded copy in then would bring the old
    /// contents back. The newer entry may be made in memory (an inode number freed and given
    /// to a new file while a lookup that found the old name reads the inode table) or loaded,
    /// changed and evicted by another thread (an inode or a block read before the change
    /// reached the table or the device). So a load during which an entry was put under its
    /// key is thrown away and done again.
    pub(crate) fn get_or_load(&self, key: u64, mut load: impl FnMut() -> Result<V>) -> Result<Arc<V>> {
        loop {
            if let Some(v) = self.get(key) {
                return Ok(v);
            }
            let seen = {
                let mut s = self.shard(key).lock();
                let l = s.loads.entry(key).or_default();
                l.loaders += 1;
                l.overtaken
            };
            let fresh = load();
            let mut s = self.shard(key).lock();
            // The record stays until its last loader takes it out here.
            let (left, overtaken) = match s.loads.get_mut(&key) {
                Some(l) => {
                    l.loaders -= 1;
                    (l.loaders, l.overtaken != seen)
                }
                None => (0, false),
            };
            if left == 0 {
                s.loads.remove(&key);
            }
            let fresh = fresh?;
            if let Some(v) = self.get_locked(key) {
                return Ok(v);
            }
            if overtaken {
                continue;
            }
            // Allocated only for a copy that goes in.
            let fresh = Arc::new(fresh);
            if let Some(state) = s.parked.remove(&key) {
                fresh.unpark(state);
            }
            self.put(&mut s, key, fresh.clone());
            return Ok(fresh);
        }
    }

    /// Every entry for which `keep` says yes (a snapshot: the map does not change meanwhile).
    pub(crate) fn collect(&self, keep: impl Fn(&V) -> bool) -> Vec<Arc<V>> {
        let _all = self.lock_all();
        let guard = self.map.guard();
        self.map.iter(&guard).filter(|(_, v)| keep(v)).map(|(_, v)| v.clone()).collect()
    }
}

/// The entry behind weak link `w`, if the cache still holds it: the lock-free reader's side of
/// the eviction protocol (module comment), with an upgrade in place of the map's clone. `None`
/// once the entry is evicted or evicting: look it up by key instead.
pub(crate) fn follow<V: Cached>(w: &Weak<V>) -> Option<Arc<V>> {
    let v = w.upgrade()?;
    fence(Ordering::SeqCst);
    if v.mark().dead.load(Ordering::Relaxed) {
        return None;
    }
    v.mark().touch();
    Some(v)
}

/// Whether `v` is still its key's entry: neither evicted nor replaced (for an entry held since
/// it was looked up).
pub(in crate::cache) fn is_current<V: Cached>(v: &V) -> bool {
    !v.mark().dead.load(Ordering::Acquire)
}

/// What a lock-free lookup found.
enum Lookup<V> {
    Found(Arc<V>),
    Absent,
    /// An entry being evicted: look again under the shard mutex.
    Evicting,
}

#[cfg(test)]
// Fixtures are built from small known values; a narrowing cast there is the clearest form.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
mod tests {
    use super::*;

    struct V(u64, CacheMark);
    impl Cached for V {
        fn mark(&self) -> &CacheMark {
            &self.1
        }
    }

    fn hash(k: u64) -> u64 {
        let mut h = KeyHasher::default();
        h.write_u64(k);
        h.finish()
    }

    #[test]
    fn hashes_keep_runs_of_eight_and_spread_strides() {
        // Consecutive numbers share slots' lines: runs of eight stay next to each other.
        for base in [0u64, 8, 4096, 1 << 40] {
            for i in 0..8 {
                assert_eq!(hash(base + i), hash(base) + i);
            }
        }
        // Block numbers one group apart (a bitmap per group) spread over the bits that pick
        // a run of slots, as do runs of inode numbers: 4,096 keys over 8,192 runs, where
        // random picks give about 3,220 distinct.
        let spread = |keys: &mut dyn Iterator<Item = u64>| {
            keys.map(|k| hash(k) >> 3 & 0x1FFF).collect::<std::collections::HashSet<u64>>().len()
        };
        let strided = spread(&mut (0..4096u64).map(|g| g * 32768 + 1));
        assert!(strided > 3000, "{strided} of 4096");
        let runs = spread(&mut (0..4096u64).map(|r| r * 8));
        assert!(runs > 3000, "{runs} of 4096");
        // The metadata byte (top seven bits) varies too.
        let top: std::collections::HashSet<u64> = (0..4096u64).map(|r| hash(r * 8) >> 57).collect();
        assert_eq!(top.len(), 128);
    }

    #[test]
    fn bounded_and_correct() {
        let c = ShardedCache::new(256, 32);
        for round in 0..2 {
            for k in 0..4096u64 {
                let v = c.get_or_load(k, || Ok(V(k * 3, CacheMark::new()))).unwrap();
                assert_eq!(v.0, k * 3, "round {round}");
            }
        }
        assert!(c.len() <= 256 + SHARDS * 4, "cache grew to {}", c.len());
    }

    #[test]
    fn in_place_entries_are_bounded_and_replaced_only_as_asked() {
        let c: ShardedCache<V, InPlace<V>> = ShardedCache::new(256, 32);
        for k in 0..4096u64 {
            c.insert(k, InPlace(V(k * 3, CacheMark::new())));
            assert_eq!(c.read(k, |v| v.0), Some(k * 3));
        }
        assert!(c.len() <= 256 + SHARDS * 4, "cache grew to {}", c.len());
        let k = 4095;
        c.replace_if(k, |v| v.0 == 1, InPlace(V(1, CacheMark::new())));
        assert_eq!(c.read(k, |v| v.0), Some(k * 3), "condition false: kept");
        c.replace_if(k, |v| v.0 == k * 3, InPlace(V(7, CacheMark::new())));
        assert_eq!(c.read(k, |v| v.0), Some(7));
        c.remove(k);
        c.replace_if(k, |_| true, InPlace(V(8, CacheMark::new())));
        assert_eq!(c.read(k, |v| v.0), None, "a removed entry is not brought back");
        c.shrink();
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn held_entries_survive() {
        let c = ShardedCache::new(64, 32);
        let held = c.get_or_load(7, || Ok(V(7, CacheMark::new()))).unwrap();
        for k in 0..2048 {
            c.get_or_load(k, || Ok(V(k, CacheMark::new()))).unwrap();
        }
        assert!(Arc::ptr_eq(&held, &c.get(7).unwrap()));
        c.shrink();
        assert_eq!(c.len(), 1);
    }

    /// An entry that parks its number when evicted.
    struct P(CacheMark, std::sync::atomic::AtomicU32);
    impl Cached for P {
        fn mark(&self) -> &CacheMark {
            &self.0
        }
        fn evict(&self) -> Evict {
            match self.1.load(Ordering::Relaxed) {
                0 => Evict::Drop,
                u32::MAX => Evict::Keep,
                n => Evict::Park(n),
            }
        }
        fn unpark(&self, state: u32) {
            self.1.store(state, Ordering::Relaxed);
        }
    }

    #[test]
    fn parked_states_come_back_and_kept_entries_stay() {
        let c = ShardedCache::new(64, 32);
        let load = |_: u64| Ok(P(CacheMark::new(), std::sync::atomic::AtomicU32::new(0)));
        for k in 0..1024u64 {
            let v = c.get_or_load(k, || load(k)).unwrap();
            let state = match k % 3 {
                0 => 0,
                1 => k as u32,
                _ if k < 30 => u32::MAX,
                _ => 0,
            };
            v.1.store(state, Ordering::Relaxed);
        }
        c.shrink();
        assert_eq!(c.len(), 10, "only the kept entries stay");
        assert_eq!(c.parked(), (0..1024).filter(|k| k % 3 == 1).count());
        for k in 0..1024u64 {
            let v = c.get_or_load(k, || load(k)).unwrap();
            let want = match k % 3 {
                1 => k as u32,
                _ if k < 30 && k % 3 == 2 => u32::MAX,
                _ => 0,
            };
            assert_eq!(v.1.load(Ordering::Relaxed), want, "key {k}");
        }
        // A fresh object under a parked key starts clean.
        c.shrink();
        c.insert(4, Arc::new(load(4).unwrap()));
        assert_eq!(c.get(4).unwrap().1.load(Ordering::Relaxed), 0);
    }

    /// Lock-free lookups racing evictions never leave two live copies of one key: while a
    /// thread holds an entry, every lookup of its key returns that same entry.
    #[test]
    fn evictions_strand_no_copy() {
        let c: ShardedCache<V> = ShardedCache::new(64, 32);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let c = &c;
                s.spawn(move || {
                    let mut x = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                    for _ in 0..100_000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let k = x % 512;
                        let held = c.get_or_load(k, || Ok(V(k, CacheMark::new()))).unwrap();
                        for _ in 0..2 {
                            let again = c.get_or_load(k, || Ok(V(k, CacheMark::new()))).unwrap();
                            assert!(Arc::ptr_eq(&held, &again), "two copies of key {k}");
                        }
                    }
                });
            }
        });
        // Four per shard, plus what other threads held when a shard last evicted.
        assert!(c.len() <= 2 * SHARDS * 4, "cache grew to {}", c.len());
    }

    /// Loads key 5 from a "disk" holding 1; during the first load, `newer` puts a newer entry
    /// under the key (from what the disk holds) before the disk changes to 2 and the cache is
    /// emptied. The load must be done again and give 2, leaving no load recorded.
    fn overtaken_load(newer: impl Fn(&ShardedCache<V>, &std::sync::atomic::AtomicU64)) {
        let c: ShardedCache<V> = ShardedCache::new(64, 32);
        let disk = std::sync::atomic::AtomicU64::new(1);
        let mut loads = 0;
        let v = c
            .get_or_load(5, || {
                loads += 1;
                let read = disk.load(Ordering::Relaxed);
                if loads == 1 {
                    newer(&c, &disk);
                    disk.store(2, Ordering::Relaxed);
                    c.shrink();
                    assert_eq!(c.len(), 0);
                }
                Ok(V(read, CacheMark::new()))
            })
            .unwrap();
        assert_eq!((v.0, loads), (2, 2));
        assert_eq!(c.shard(5).lock().loads.len(), 0, "no load left recorded");
    }

    /// A load that read the old contents while a new entry was made under its key, and
    /// evicted, is done again instead of bringing the old contents back.
    #[test]
    fn a_load_overtaken_by_a_new_entry_is_done_again() {
        overtaken_load(|c, _| c.insert(5, Arc::new(V(2, CacheMark::new()))));
    }

    /// The same when the newer entry was itself loaded (another thread read the key, changed
    /// what backs it, and its copy was evicted).
    #[test]
    fn a_load_overtaken_by_another_load_is_done_again() {
        overtaken_load(|c, disk| {
            let newer = c.get_or_load(5, || Ok(V(disk.load(Ordering::Relaxed), CacheMark::new())));
            assert_eq!(newer.unwrap().0, 1, "the other load reads the same");
        });
    }

    /// An entry replaced under its key counts as evicted for whoever holds it.
    #[test]
    fn replaced_entries_are_no_longer_current() {
        let c: ShardedCache<V> = ShardedCache::new(64, 32);
        let old = c.get_or_load(3, || Ok(V(1, CacheMark::new()))).unwrap();
        assert!(is_current(&*old));
        let weak = Arc::downgrade(&old);
        c.insert(3, Arc::new(V(2, CacheMark::new())));
        assert!(!is_current(&*old) && follow(&weak).is_none());
        assert_eq!(c.get(3).unwrap().0, 2);
    }

    #[test]
    fn load_errors_are_not_cached() {
        let c: ShardedCache<V> = ShardedCache::new(64, 32);
        assert!(c.get_or_load(1, || Err(crate::error::Error::NotFound)).is_err());
        assert!(c.get(1).is_none());
    }
}
