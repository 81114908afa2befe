//! The kernel's `fs/mbcache.c` as ext4 uses it: a hash -> the numbers of objects with that
//! hash. Two instances: xattr blocks by block hash (`h_hash`), so that an inode given the
//! same attributes as another shares its block instead of allocating one; EA inodes by value
//! hash, so that equal large values share one EA inode.
//!
//! It is only a hint. Whoever takes an object from it checks, under the object's lock (a
//! block's data lock, an EA inode's record lock), that the entry is still here, that the
//! object still holds the wanted content and that its reference count can grow; whoever frees
//! an object or rewrites one in place drops its entry under that same lock first. So an entry
//! that outlives its object is never acted on.
//!
//! # Locking
//! One mutex per shard, held only around the map; a leaf (taken under an xattr block's data
//! lock or an EA inode's record lock, never the other way round).

use crate::sync::Mutex;
use std::collections::HashMap;

const SHARDS: usize = 16;

/// Objects per hash kept at most: identical blocks beyond the first few are rare (one
/// reaching the reference limit is the usual reason for a second).
const PER_HASH: usize = 8;

/// Hash -> objects with it, newest last.
type Shard = HashMap<u32, Vec<u64>>;

pub(crate) struct MbCache {
    /// [own lock per shard]
    shards: Box<[Mutex<Shard>]>,
    /// Hashes per shard before one is dropped. [immutable]
    per_shard: usize,
}

impl MbCache {
    /// A cache of about `capacity` hashes.
    pub(crate) fn new(capacity: usize) -> Self {
        MbCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: (capacity / SHARDS).max(16),
        }
    }

    fn shard(&self, hash: u32) -> &Mutex<Shard> {
        &self.shards[(hash.wrapping_mul(0x9E37_79B9) >> 28) as usize % SHARDS]
    }

    /// Records that object `n` has hash `hash`. Hash 0 marks one that must not be shared and
    /// is not recorded.
    pub(crate) fn insert(&self, hash: u32, n: u64) {
        if hash == 0 {
            return;
        }
        let mut m = self.shard(hash).lock();
        if !m.contains_key(&hash) && m.len() >= self.per_shard {
            // Full: forget some hash. Losing an entry only loses a chance to share.
            if let Some(k) = m.keys().next().copied() {
                m.remove(&k);
            }
        }
        let v = m.entry(hash).or_default();
        if !v.contains(&n) {
            if v.len() >= PER_HASH {
                v.remove(0);
            }
            v.push(n);
        }
    }

    /// Forgets that `n` has hash `hash`.
    pub(crate) fn remove(&self, hash: u32, n: u64) {
        let mut m = self.shard(hash).lock();
        if let Some(v) = m.get_mut(&hash) {
            v.retain(|&b| b != n);
            if v.is_empty() {
                m.remove(&hash);
            }
        }
    }

    /// Whether `n` is recorded under `hash`.
    pub(crate) fn contains(&self, hash: u32, n: u64) -> bool {
        self.shard(hash).lock().get(&hash).is_some_and(|v| v.contains(&n))
    }

    /// The objects recorded under `hash`, most recent first.
    pub(crate) fn candidates(&self, hash: u32) -> Vec<u64> {
        if hash == 0 {
            return Vec::new();
        }
        self.shard(hash).lock().get(&hash).map(|v| v.iter().rev().copied().collect()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_find_remove_and_bound() {
        let c = MbCache::new(16 * SHARDS);
        c.insert(0, 5);
        assert!(c.candidates(0).is_empty());
        c.insert(7, 100);
        c.insert(7, 101);
        c.insert(7, 100);
        assert_eq!(c.candidates(7), vec![101, 100]);
        assert!(c.contains(7, 100));
        c.remove(7, 100);
        assert!(!c.contains(7, 100));
        assert_eq!(c.candidates(7), vec![101]);
        for b in 0..20 {
            c.insert(9, b);
        }
        assert_eq!(c.candidates(9).len(), PER_HASH);
        for h in 1..10_000u32 {
            c.insert(h, u64::from(h));
        }
        let total: usize = c.shards.iter().map(|s| s.lock().len()).sum();
        assert!(total <= 16 * SHARDS, "{total} hashes kept");
    }
}
