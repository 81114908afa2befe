//! A bounded map from `u64` keys to shared entries, sharded so that threads working on
//! different keys never meet on a lock. Both the buffer cache and the inode cache are one.
//!
//! # Locking
//! A shard's mutex protects its map and clock queue only; it is never held while an entry is
//! loaded (I/O). Two threads missing the same key both load it; the first insert wins and the
//! other thread's copy is dropped.
//!
//! # Bounds
//! Each shard holds about `capacity / SHARDS` entries. Eviction is CLOCK (second chance): an
//! entry used since the hand last passed is spared once; an entry someone still holds (`Arc`
//! count above one) or whose state exists only in memory (`Evict::Keep`) is never dropped, so
//! the bound can be exceeded only by what is in use. An entry may instead leave a small state
//! behind (`Evict::Park`, e.g. an inode's reference count): the shard keeps that number and hands
//! it to the next copy loaded under the same key ([`Cached::unpark`]). Each eviction pass looks
//! at a bounded number of entries, so a shard full of kept entries costs little per insert.

use crate::error::Result;
use crate::sync::Mutex;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Hashes a `u64` key with one multiply-xorshift round (splitmix64's finalizer). Keys are
/// block and inode numbers, or names already hashed (dcache.rs): none needs SipHash, which
/// took as long as the rest of a lookup.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, k: u64) {
        self.0 = mix64(k);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// splitmix64's finalizer: every input bit moves every output bit.
pub(crate) fn mix64(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
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

/// What a cached value must offer: a "used recently" bit for the clock.
pub(crate) trait Cached {
    fn referenced(&self) -> &AtomicBool;
    /// Whether and how the entry may be evicted when nobody holds it.
    fn evict(&self) -> Evict {
        Evict::Drop
    }
    /// Takes back the state an evicted copy parked (called under the shard lock, before the
    /// new copy is visible).
    fn unpark(&self, _state: u32) {}
}

struct Shard<V> {
    map: KeyMap<Arc<V>>,
    clock: VecDeque<u64>,
    /// States left by evicted entries, until their key is loaded again.
    parked: KeyMap<u32>,
}

pub(crate) struct ShardedCache<V> {
    per_shard: usize,
    shards: Box<[Mutex<Shard<V>>]>,
}

impl<V: Cached> ShardedCache<V> {
    /// A cache of about `capacity` entries (at least a few per shard).
    pub fn new(capacity: usize) -> Self {
        let per_shard = (capacity / SHARDS).max(4);
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    map: KeyMap::default(),
                    clock: VecDeque::new(),
                    parked: KeyMap::default(),
                })
            })
            .collect();
        ShardedCache { per_shard, shards }
    }

    fn shard(&self, key: u64) -> &Mutex<Shard<V>> {
        // Fibonacci hashing spreads consecutive keys over shards.
        let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
        &self.shards[h as usize % SHARDS]
    }

    /// The cached entry for `key`, if present.
    pub fn get(&self, key: u64) -> Option<Arc<V>> {
        let b = self.shard(key).lock().map.get(&key).cloned()?;
        b.referenced().store(true, Ordering::Relaxed);
        Some(b)
    }

    /// `f` of the cached entry for `key`, if present, run under the shard lock: no reference
    /// taken, so no write to the entry's reference count (a lookup that needs one number).
    pub fn read<R>(&self, key: u64, f: impl FnOnce(&V) -> R) -> Option<R> {
        let s = self.shard(key).lock();
        let v = s.map.get(&key)?;
        if !v.referenced().load(Ordering::Relaxed) {
            v.referenced().store(true, Ordering::Relaxed);
        }
        Some(f(v))
    }

    /// The entry for `key`, loading it with `load` (no lock held) on a miss.
    pub fn get_or_load(&self, key: u64, load: impl FnOnce() -> Result<V>) -> Result<Arc<V>> {
        if let Some(v) = self.get(key) {
            return Ok(v);
        }
        let fresh = Arc::new(load()?);
        fresh.referenced().store(true, Ordering::Relaxed);
        let mut s = self.shard(key).lock();
        if let Some(v) = s.map.get(&key) {
            return Ok(v.clone());
        }
        if let Some(state) = s.parked.remove(&key) {
            fresh.unpark(state);
        }
        s.map.insert(key, fresh.clone());
        s.clock.push_back(key);
        if s.map.len() > self.per_shard {
            Self::evict(&mut s, self.per_shard);
        }
        Ok(fresh)
    }

    /// Puts `v` under `key`, replacing any cached entry and parked state (for objects created
    /// in memory).
    pub fn insert(&self, key: u64, v: Arc<V>) {
        v.referenced().store(true, Ordering::Relaxed);
        let mut s = self.shard(key).lock();
        s.parked.remove(&key);
        if s.map.insert(key, v).is_none() {
            s.clock.push_back(key);
        }
        if s.map.len() > self.per_shard {
            Self::evict(&mut s, self.per_shard);
        }
    }

    /// Puts `v` under `key` if `still_valid()` holds, checked under the shard lock (so that a
    /// remover that invalidates before removing cannot be overtaken).
    pub fn insert_if(&self, key: u64, v: Arc<V>, still_valid: impl FnOnce() -> bool) {
        let mut s = self.shard(key).lock();
        if !still_valid() {
            return;
        }
        v.referenced().store(true, Ordering::Relaxed);
        if s.map.insert(key, v).is_none() {
            s.clock.push_back(key);
        }
        if s.map.len() > self.per_shard {
            Self::evict(&mut s, self.per_shard);
        }
    }

    /// Drops the entry under `key`, if any.
    pub fn remove(&self, key: u64) {
        self.shard(key).lock().map.remove(&key);
    }

    /// Drops or parks what `v` may lose; `false` if it must stay.
    fn try_evict(s: &mut Shard<V>, key: u64) -> bool {
        let Some(v) = s.map.get(&key) else { return true };
        if Arc::strong_count(v) > 1 {
            return false;
        }
        match v.evict() {
            Evict::Keep => return false,
            Evict::Drop => {}
            Evict::Park(state) => {
                s.parked.insert(key, state);
            }
        }
        s.map.remove(&key);
        true
    }

    fn evict(s: &mut Shard<V>, target: usize) {
        // Bounded sweep (second chance for recently used entries).
        let mut budget = s.clock.len().min(EVICT_SCAN);
        while s.map.len() > target && budget > 0 {
            budget -= 1;
            let Some(key) = s.clock.pop_front() else {
                break;
            };
            let recent = s.map.get(&key).is_some_and(|v| v.referenced().swap(false, Ordering::Relaxed));
            if recent || !Self::try_evict(s, key) {
                s.clock.push_back(key);
            }
        }
    }

    /// Every entry for which `keep` says yes (one shard locked at a time).
    pub fn collect(&self, keep: impl Fn(&V) -> bool) -> Vec<Arc<V>> {
        self.shards
            .iter()
            .flat_map(|s| s.lock().map.values().filter(|v| keep(v)).cloned().collect::<Vec<_>>())
            .collect()
    }

    /// Number of cached entries.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }

    /// Drops (or parks) every entry nobody holds.
    pub fn shrink(&self) {
        for s in self.shards.iter() {
            let mut s = s.lock();
            let keys: Vec<u64> = s.map.keys().copied().collect();
            for k in keys {
                Self::try_evict(&mut s, k);
            }
            let Shard { map, clock, .. } = &mut *s;
            clock.retain(|k| map.contains_key(k));
        }
    }

    /// Number of parked states.
    #[cfg(test)]
    pub fn parked(&self) -> usize {
        self.shards.iter().map(|s| s.lock().parked.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct V(u64, AtomicBool);
    impl Cached for V {
        fn referenced(&self) -> &AtomicBool {
            &self.1
        }
    }

    #[test]
    fn bounded_and_correct() {
        let c = ShardedCache::new(256);
        for round in 0..2 {
            for k in 0..4096u64 {
                let v = c.get_or_load(k, || Ok(V(k * 3, AtomicBool::new(false)))).unwrap();
                assert_eq!(v.0, k * 3, "round {round}");
            }
        }
        assert!(c.len() <= 256 + SHARDS * 4, "cache grew to {}", c.len());
    }

    #[test]
    fn held_entries_survive() {
        let c = ShardedCache::new(64);
        let held = c.get_or_load(7, || Ok(V(7, AtomicBool::new(false)))).unwrap();
        for k in 0..2048 {
            c.get_or_load(k, || Ok(V(k, AtomicBool::new(false)))).unwrap();
        }
        assert!(Arc::ptr_eq(&held, &c.get(7).unwrap()));
        c.shrink();
        assert_eq!(c.len(), 1);
    }

    /// An entry that parks its number when evicted.
    struct P(AtomicBool, std::sync::atomic::AtomicU32);
    impl Cached for P {
        fn referenced(&self) -> &AtomicBool {
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
        let c = ShardedCache::new(64);
        let load = |_: u64| Ok(P(AtomicBool::new(false), std::sync::atomic::AtomicU32::new(0)));
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

    #[test]
    fn load_errors_are_not_cached() {
        let c: ShardedCache<V> = ShardedCache::new(64);
        assert!(c.get_or_load(1, || Err(crate::error::Error::NotFound)).is_err());
        assert!(c.get(1).is_none());
    }
}
