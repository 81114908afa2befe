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
//! count above one) or that is pinned (`Cached::pinned`) is never dropped, so the bound can be
//! exceeded only by what is in use.

use crate::error::Result;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const SHARDS: usize = 64;

/// What a cached value must offer: a "used recently" bit for the clock.
pub(crate) trait Cached {
    fn referenced(&self) -> &AtomicBool;
    /// Whether the entry must stay cached even when nobody holds it (an inode with
    /// references or an orphan record: its in-memory state is the only copy).
    fn pinned(&self) -> bool {
        false
    }
}

struct Shard<V> {
    map: HashMap<u64, Arc<V>>,
    clock: VecDeque<u64>,
}

pub(crate) struct ShardedCache<V> {
    per_shard: usize,
    shards: Box<[Mutex<Shard<V>>]>,
}

impl<V: Cached> ShardedCache<V> {
    /// A cache of about `capacity` entries (at least a few per shard).
    pub fn new(capacity: usize) -> Self {
        let per_shard = (capacity / SHARDS).max(4);
        let shards =
            (0..SHARDS).map(|_| Mutex::new(Shard { map: HashMap::new(), clock: VecDeque::new() })).collect();
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
        s.map.insert(key, fresh.clone());
        s.clock.push_back(key);
        if s.map.len() > self.per_shard {
            Self::evict(&mut s, self.per_shard);
        }
        Ok(fresh)
    }

    /// Puts `v` under `key`, replacing any cached entry (for objects created in memory).
    pub fn insert(&self, key: u64, v: Arc<V>) {
        v.referenced().store(true, Ordering::Relaxed);
        let mut s = self.shard(key).lock();
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

    fn evict(s: &mut Shard<V>, target: usize) {
        // Bounded sweep: at most two passes over the queue.
        let mut budget = s.clock.len() * 2;
        while s.map.len() > target && budget > 0 {
            budget -= 1;
            let Some(key) = s.clock.pop_front() else {
                break;
            };
            let Some(v) = s.map.get(&key) else { continue };
            if v.referenced().swap(false, Ordering::Relaxed) || Arc::strong_count(v) > 1 || v.pinned() {
                s.clock.push_back(key);
            } else {
                s.map.remove(&key);
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

    /// Drops every entry nobody holds.
    pub fn shrink(&self) {
        for s in self.shards.iter() {
            let mut s = s.lock();
            s.map.retain(|_, v| Arc::strong_count(v) > 1 || v.pinned());
            let Shard { map, clock } = &mut *s;
            clock.retain(|k| map.contains_key(k));
        }
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

    #[test]
    fn load_errors_are_not_cached() {
        let c: ShardedCache<V> = ShardedCache::new(64);
        assert!(c.get_or_load(1, || Err(crate::error::Error::NotFound)).is_err());
        assert!(c.get(1).is_none());
    }
}
