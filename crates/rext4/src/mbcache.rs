//! The xattr block cache (the kernel's `fs/mbcache.c` as ext4 uses it for xattr blocks): block
//! hash (`h_hash`) -> blocks with that hash, so that an inode given the same attributes as
//! another shares its block instead of allocating one.
//!
//! It is only a hint. Whoever takes a block from it checks, under the block's data lock, that
//! the entry is still here, that the block still holds the wanted attributes and that its
//! reference count can grow; whoever frees a block or rewrites one in place drops its entry
//! under that same lock first. So an entry that outlives its block is never acted on.
//!
//! # Locking
//! One mutex per shard, held only around the map; a leaf (taken under an xattr block's data
//! lock, never the other way round).

use crate::sync::Mutex;
use std::collections::HashMap;

const SHARDS: usize = 16;

/// Blocks per hash kept at most: identical blocks beyond the first few are rare (one reaching
/// the reference limit is the usual reason for a second).
const PER_HASH: usize = 8;

/// Block hash -> blocks with it, newest last.
type Shard = HashMap<u32, Vec<u64>>;

pub(crate) struct XattrBlockCache {
    /// [own lock per shard]
    shards: Box<[Mutex<Shard>]>,
    /// Hashes per shard before one is dropped. [immutable]
    per_shard: usize,
}

impl XattrBlockCache {
    /// A cache of about `capacity` hashes.
    pub fn new(capacity: usize) -> Self {
        XattrBlockCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: (capacity / SHARDS).max(16),
        }
    }

    fn shard(&self, hash: u32) -> &Mutex<Shard> {
        &self.shards[(hash.wrapping_mul(0x9E37_79B9) >> 28) as usize % SHARDS]
    }

    /// Records that `blk` has block hash `hash`. Hash 0 marks a block that must not be shared
    /// and is not recorded.
    pub fn insert(&self, hash: u32, blk: u64) {
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
        if !v.contains(&blk) {
            if v.len() >= PER_HASH {
                v.remove(0);
            }
            v.push(blk);
        }
    }

    /// Forgets that `blk` has hash `hash`.
    pub fn remove(&self, hash: u32, blk: u64) {
        let mut m = self.shard(hash).lock();
        if let Some(v) = m.get_mut(&hash) {
            v.retain(|&b| b != blk);
            if v.is_empty() {
                m.remove(&hash);
            }
        }
    }

    /// Whether `blk` is recorded under `hash`.
    pub fn contains(&self, hash: u32, blk: u64) -> bool {
        self.shard(hash).lock().get(&hash).is_some_and(|v| v.contains(&blk))
    }

    /// The blocks recorded under `hash`, most recent first.
    pub fn candidates(&self, hash: u32) -> Vec<u64> {
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
        let c = XattrBlockCache::new(16 * SHARDS);
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
