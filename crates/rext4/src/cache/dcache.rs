//! A cache of name lookups (the kernel's dcache, positive entries only): `(directory, name)`
//! to the inode, so that repeated lookups neither rescan directory blocks nor look the inode up
//! again. Every change to a directory's names goes through `namei/create.rs`, which keeps this
//! cache in step: entries are added on create and on successful lookups, and dropped on
//! removal. A lookup caches what it found only if the directory's `names_gen` was even (no
//! removal under way) and did not move meanwhile; a removal bumps it before and after changing
//! the directory block, then drops the cache entry, and a lookup's check and insert happen
//! under that entry's shard lock.
//!
//! # The link to the inode
//! An entry keeps its inode's number and a weak link to the cached inode, followed with the
//! inode cache's eviction protocol ([`crate::cache::follow`]): a hit whose inode is still cached
//! skips the inode cache's map, about two fifths of a `stat`'s cache misses on large trees.
//! The link does not keep the inode cached (the inode cache's bound and its eviction stay as
//! they are); once the inode is evicted, the next hit looks it up by number and links the
//! entry to the new copy. An entry whose inode was evicted keeps the inode's allocation (not
//! its contents) until the entry is relinked or evicted.
//!
//! # Locking
//! A [`ShardedCache`]: lookups take no lock; a shard mutex is held only around changes.

use crate::cache::{mix64, CacheMark, Cached, InPlace, ShardedCache};
use crate::inode::Inode;
use rext4_format::InodeNo;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

pub(super) struct Dentry {
    dir: InodeNo,
    ino: InodeNo,
    /// The inode as cached when this entry was made (see the module comment). [immutable]
    inode: Weak<Inode>,
    mark: CacheMark,
    name: Name,
}

/// Bytes of a name kept inside the entry: 48 bytes in all, which the map keeps in its own
/// allocation with the key (no `Arc` of their own: nobody holds a cached name), so a lookup of
/// a short name reads one allocation where an `Arc`'d entry took two and a boxed name three.
const INLINE_NAME: usize = 20;

type Name = crate::data::inline_bytes::InlineBytes<INLINE_NAME>;

impl Cached for Dentry {
    fn mark(&self) -> &CacheMark {
        &self.mark
    }
}

/// What the cache knows of a name.
pub(crate) enum Hit {
    /// Its inode, still cached.
    Linked(Arc<Inode>),
    /// Its inode's number; the inode has left the inode cache since.
    Unlinked(InodeNo),
}

pub(crate) struct Dcache {
    map: ShardedCache<Dentry, InPlace<Dentry>>,
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

fn dentry(dir: InodeNo, name: &[u8], inode: &Arc<Inode>) -> InPlace<Dentry> {
    let (ino, inode) = (inode.ino, Arc::downgrade(inode));
    InPlace(Dentry { dir, ino, inode, mark: CacheMark::new(), name: Name::new(name) })
}

impl Dcache {
    pub(crate) fn new(capacity: usize) -> Self {
        Dcache { map: ShardedCache::new(capacity, 512) }
    }

    /// What is cached of `name` in `dir`, if anything. Writes nothing to the entry's line
    /// (unless the eviction hand cleared its mark); takes a reference on the inode.
    pub(crate) fn get(&self, dir: InodeNo, name: &[u8]) -> Option<Hit> {
        self.map
            .read(key(dir, name), |d| {
                (d.dir == dir && *d.name == *name)
                    .then(|| crate::cache::follow(&d.inode).map_or(Hit::Unlinked(d.ino), Hit::Linked))
            })
            .flatten()
    }

    /// Whether `name` in `dir` is cached.
    pub(crate) fn contains(&self, dir: InodeNo, name: &[u8]) -> bool {
        self.map.read(key(dir, name), |d| d.dir == dir && *d.name == *name).unwrap_or(false)
    }

    /// Caches `name` in `dir` as `inode` (a name just made, under the directory's `op_lock`).
    pub(crate) fn insert(&self, dir: InodeNo, name: &[u8], inode: &Arc<Inode>) {
        self.map.insert(key(dir, name), dentry(dir, name, inode));
    }

    /// Caches what a lookup found, unless a removal was under way when `gen` was read (odd)
    /// or has happened since (see `Inode::names_gen`).
    pub(crate) fn insert_found(&self, dir: &Inode, gen: u64, name: &[u8], inode: &Arc<Inode>) {
        if gen % 2 == 1 {
            return;
        }
        let d = dentry(dir.ino, name, inode);
        self.map.insert_if(key(dir.ino, name), d, || dir.names_gen.load(Ordering::Acquire) == gen);
    }

    /// Links the entry of `name` in `dir` to `inode`, a new copy of the inode it named
    /// ([`Hit::Unlinked`]), if the cache still holds an entry for `name` naming that inode
    /// whose link is broken, and `inode` is still the inode cache's copy: checked under the
    /// shard lock, which a removal's drop and a create's insert take too. So an entry a removal
    /// dropped meanwhile is not brought back, and an entry made since by a create that reused
    /// the number is not linked to the freed inode (which the create's inode replaced in the
    /// inode cache before the entry was made).
    pub(crate) fn relink(&self, dir: InodeNo, name: &[u8], inode: &Arc<Inode>) {
        let still = |d: &Dentry| {
            d.dir == dir
                && d.ino == inode.ino
                && *d.name == *name
                && crate::cache::follow(&d.inode).is_none()
                && crate::cache::is_current(&**inode)
        };
        self.map.replace_if(key(dir, name), still, dentry(dir, name, inode));
    }

    /// Forgets `name` in `dir` (a hash neighbour with another name is dropped too: harmless).
    pub(crate) fn remove(&self, dir: InodeNo, name: &[u8]) {
        self.map.remove(key(dir, name));
    }
}

#[cfg(test)]
// Fixtures are built from small known values; a narrowing cast there is the clearest form.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
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

    fn inode(ino: u32) -> Arc<Inode> {
        Arc::new(Inode::new_in_memory(InodeNo(ino), crate::inode::RawRecord::zeroed(256), 0))
    }

    /// The number a lookup gives, whether or not the entry's link still holds.
    fn ino_of(d: &Dcache, dir: u32, name: &[u8]) -> Option<InodeNo> {
        d.get(InodeNo(dir), name).map(|h| match h {
            Hit::Linked(i) => i.ino,
            Hit::Unlinked(ino) => ino,
        })
    }

    #[test]
    fn lookups_check_the_name() {
        let d = Dcache::new(1024);
        let a = inode(12);
        d.insert(InodeNo(2), b"a", &a);
        assert_eq!(ino_of(&d, 2, b"a"), Some(InodeNo(12)));
        assert_eq!(std::mem::size_of::<Dentry>(), 48, "with the key, within one 64-byte line");
        // Names on either side of the inline limit, and the longest.
        let mut held = Vec::new();
        for len in [INLINE_NAME - 1, INLINE_NAME, INLINE_NAME + 1, 255] {
            let name = vec![b'n'; len];
            held.push(inode(len as u32));
            d.insert(InodeNo(2), &name, held.last().unwrap());
            assert_eq!(ino_of(&d, 2, &name), Some(InodeNo(len as u32)));
            let mut other = name.clone();
            other[len - 1] = b'm';
            assert!(d.get(InodeNo(2), &other).is_none());
            assert!(d.contains(InodeNo(2), &name) && !d.contains(InodeNo(2), &other));
        }
        assert!(d.get(InodeNo(3), b"a").is_none());
        assert!(d.get(InodeNo(2), b"b").is_none());
        d.remove(InodeNo(2), b"a");
        assert!(d.get(InodeNo(2), b"a").is_none());
    }

    /// A hit gives the inode cache's own copy while it holds one, and the number once it has
    /// evicted it; relinking to the next copy works only while the entry is still cached.
    #[test]
    fn links_follow_the_inode_cache() {
        let icache: ShardedCache<Inode> = ShardedCache::new(1024, 32);
        let load = |ino: u32| {
            icache
                .get_or_load(u64::from(ino), || {
                    Ok(Inode::new_in_memory(InodeNo(ino), crate::inode::RawRecord::zeroed(256), 0))
                })
                .unwrap()
        };
        let d = Dcache::new(1024);
        let first = load(12);
        d.insert(InodeNo(2), b"f", &first);
        match d.get(InodeNo(2), b"f") {
            Some(Hit::Linked(i)) => assert!(Arc::ptr_eq(&i, &first)),
            _ => panic!("a cached inode is linked"),
        }
        // Evicted (its memory may live on until the cache's next reclamation): not linked.
        drop(first);
        icache.shrink();
        assert_eq!(icache.len(), 0);
        assert!(matches!(d.get(InodeNo(2), b"f"), Some(Hit::Unlinked(InodeNo(12)))));
        let second = load(12);
        d.relink(InodeNo(2), b"f", &second);
        match d.get(InodeNo(2), b"f") {
            Some(Hit::Linked(i)) => assert!(Arc::ptr_eq(&i, &second)),
            _ => panic!("relinked to the new copy"),
        }
        // A name removed meanwhile is not brought back, nor is a name for another inode.
        d.remove(InodeNo(2), b"f");
        d.relink(InodeNo(2), b"f", &second);
        assert!(d.get(InodeNo(2), b"f").is_none());
        let other = load(13);
        d.insert(InodeNo(2), b"g", &other);
        d.relink(InodeNo(2), b"g", &second);
        assert_eq!(ino_of(&d, 2, b"g"), Some(InodeNo(13)));
    }
}
