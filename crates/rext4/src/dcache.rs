//! A cache of name lookups (the kernel's dcache, positive entries only): `(directory, name)`
//! to inode number, so that repeated lookups do not rescan directory blocks. Every change to a
//! directory's names goes through `namei_write.rs`, which keeps this cache in step: entries are
//! added on create and on successful lookups, and dropped on removal. A lookup caches what it
//! found only if the directory's `names_gen` was even (no removal under way) and did not move
//! meanwhile; a removal bumps it before and after changing the directory block, then drops the
//! cache entry, and a lookup's check and insert happen under that entry's shard lock.
//!
//! # Locking
//! A [`ShardedCache`]: lookups take no lock; a shard mutex is held only around changes.

use crate::cache::{mix64, CacheMark, Cached, ShardedCache};
use rext4_format::InodeNo;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub(crate) struct Dentry {
    dir: InodeNo,
    ino: InodeNo,
    mark: CacheMark,
    name: Name,
}

/// Bytes of a name kept inside the entry: with the rest, a 64-byte line including the `Arc`
/// counts, so a lookup of a short name reads one line where a boxed name took two.
const INLINE_NAME: usize = 28;

type Name = crate::inline_bytes::InlineBytes<INLINE_NAME>;

impl Cached for Dentry {
    fn mark(&self) -> &CacheMark {
        &self.mark
    }
}

pub(crate) struct Dcache {
    map: ShardedCache<Dentry>,
}

/// The cache key of `name` in `dir`: eight bytes of the name at a time, one multiply each.
/// Two names with the same key only evict each other (entries are checked against the name).
fn key(dir: InodeNo, name: &[u8]) -> u64 {
    let mut h = mix64(u64::from(dir.0) << 32 | name.len() as u64);
    let mut words = name.chunks_exact(8);
    for w in &mut words {
        // Cannot fail: chunks_exact gives 8-byte slices.
        h = (h ^ u64::from_le_bytes(w.try_into().unwrap()))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(29);
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    mix64((h ^ u64::from_le_bytes(tail)).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

impl Dcache {
    pub fn new(capacity: usize) -> Self {
        Dcache { map: ShardedCache::new(capacity, 512) }
    }

    /// The cached inode of `name` in `dir`, if known.
    pub fn get(&self, dir: InodeNo, name: &[u8]) -> Option<InodeNo> {
        self.map.read(key(dir, name), |d| (d.dir == dir && *d.name == *name).then_some(d.ino)).flatten()
    }

    pub fn insert(&self, dir: InodeNo, name: &[u8], ino: InodeNo) {
        let d = Dentry { dir, ino, mark: CacheMark::new(), name: Name::new(name) };
        self.map.insert(key(dir, name), Arc::new(d));
    }

    /// Caches what a lookup found, unless a removal was under way when `gen` was read (odd)
    /// or has happened since (see `Inode::names_gen`).
    pub fn insert_found(&self, dir: &crate::inode::Inode, gen: u64, name: &[u8], ino: InodeNo) {
        if gen % 2 == 1 {
            return;
        }
        let d = Dentry { dir: dir.ino, ino, mark: CacheMark::new(), name: Name::new(name) };
        self.map.insert_if(key(dir.ino, name), Arc::new(d), || dir.names_gen.load(Ordering::Acquire) == gen);
    }

    /// Forgets `name` in `dir` (a hash neighbour with another name is dropped too: harmless).
    pub fn remove(&self, dir: InodeNo, name: &[u8]) {
        self.map.remove(key(dir, name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_names_and_directories() {
        // mdtest-like names, their neighbours in another directory, and names that differ
        // only in a trailing NUL or in one byte of a long name: all keys distinct.
        let mut keys = std::collections::HashSet::new();
        let mut n = 0;
        for dir in [2u32, 3, 1 << 20] {
            for i in 0..20_000 {
                for name in [format!("file.mdtest.{i}"), format!("{i}"), format!("{i}\0")] {
                    keys.insert(key(InodeNo(dir), name.as_bytes()));
                    n += 1;
                }
            }
            let long = [b'x'; 255];
            for i in 0..255 {
                let mut v = long;
                v[i] = b'y';
                keys.insert(key(InodeNo(dir), &v));
                n += 1;
            }
        }
        assert_eq!(keys.len(), n);
        // Buckets of the shard maps: the low bits spread too.
        let low: std::collections::HashSet<u64> = keys.iter().map(|k| k & 0xFFFF).collect();
        assert!(low.len() > 60_000, "{} of 65,536 low-bit patterns", low.len());
    }

    #[test]
    fn lookups_check_the_name() {
        let d = Dcache::new(1024);
        d.insert(InodeNo(2), b"a", InodeNo(12));
        assert_eq!(d.get(InodeNo(2), b"a"), Some(InodeNo(12)));
        assert_eq!(std::mem::size_of::<Dentry>(), 48, "an Arc'd entry fills one 64-byte line");
        // Names on either side of the inline limit, and the longest.
        for len in [INLINE_NAME - 1, INLINE_NAME, INLINE_NAME + 1, 255] {
            let name = vec![b'n'; len];
            d.insert(InodeNo(2), &name, InodeNo(len as u32));
            assert_eq!(d.get(InodeNo(2), &name), Some(InodeNo(len as u32)));
            let mut other = name.clone();
            other[len - 1] = b'm';
            assert_eq!(d.get(InodeNo(2), &other), None);
        }
        assert_eq!(d.get(InodeNo(3), b"a"), None);
        assert_eq!(d.get(InodeNo(2), b"b"), None);
        d.remove(InodeNo(2), b"a");
        assert_eq!(d.get(InodeNo(2), b"a"), None);
    }
}
