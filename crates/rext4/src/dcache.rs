//! A cache of name lookups (the kernel's dcache, positive entries only): `(directory, name)`
//! to inode number, so that repeated lookups do not rescan directory blocks. Every change to a
//! directory's names goes through `namei_write.rs`, which keeps this cache in step: entries are
//! added on create and on successful lookups, and dropped on removal. A lookup caches what it
//! found only if the directory's `names_gen` was even (no removal under way) and did not move
//! meanwhile; a removal bumps it before and after changing the directory block, then drops the
//! cache entry, and a lookup's check and insert happen under that entry's shard lock.
//!
//! # Locking
//! A [`ShardedCache`]: one shard mutex, held only around the map.

use crate::cache::{Cached, ShardedCache};
use rext4_format::InodeNo;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub(crate) struct Dentry {
    dir: InodeNo,
    name: Box<[u8]>,
    ino: InodeNo,
    referenced: AtomicBool,
}

impl Cached for Dentry {
    fn referenced(&self) -> &AtomicBool {
        &self.referenced
    }
}

pub(crate) struct Dcache {
    map: ShardedCache<Dentry>,
}

fn key(dir: InodeNo, name: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    dir.0.hash(&mut h);
    name.hash(&mut h);
    h.finish()
}

impl Dcache {
    pub fn new(capacity: usize) -> Self {
        Dcache { map: ShardedCache::new(capacity) }
    }

    /// The cached inode of `name` in `dir`, if known.
    pub fn get(&self, dir: InodeNo, name: &[u8]) -> Option<InodeNo> {
        let d = self.map.get(key(dir, name))?;
        (d.dir == dir && *d.name == *name).then_some(d.ino)
    }

    pub fn insert(&self, dir: InodeNo, name: &[u8], ino: InodeNo) {
        let d = Dentry { dir, name: name.into(), ino, referenced: AtomicBool::new(true) };
        self.map.insert(key(dir, name), Arc::new(d));
    }

    /// Caches what a lookup found, unless a removal was under way when `gen` was read (odd)
    /// or has happened since (see `Inode::names_gen`).
    pub fn insert_found(&self, dir: &crate::inode::Inode, gen: u64, name: &[u8], ino: InodeNo) {
        if gen % 2 == 1 {
            return;
        }
        let d = Dentry { dir: dir.ino, name: name.into(), ino, referenced: AtomicBool::new(true) };
        self.map.insert_if(key(dir.ino, name), Arc::new(d), || dir.names_gen.load(Ordering::Acquire) == gen);
    }

    /// Forgets `name` in `dir` (a hash neighbour with another name is dropped too: harmless).
    pub fn remove(&self, dir: InodeNo, name: &[u8]) {
        self.map.remove(key(dir, name));
    }
}
