//! The adapter's own state about inodes and opens: FUSE lookup counts (which keep inodes alive
//! in the engine) and open file handles.
//!
//! # Lookup counts
//! Every reply that hands the kernel an inode (lookup, create, mknod, mkdir, symlink, link, and
//! each readdirplus entry other than `.` and `..`) adds one to that inode's count; `forget`
//! subtracts what the kernel says. The count is raised *before* the reply is sent, so a
//! `forget` racing in on another worker never finds it short. An inode whose count goes 0 -> 1
//! is held in the engine ([`rext4::Fs::hold`]) and released when it drops back to 0, so an
//! unlinked file that is still open (or still known to the kernel) lives until forgotten.
//!
//! # Locking
//! One mutex per shard, chosen by inode number; never held across an engine call or another
//! lock. The engine's hold/release counts are atomic, so a hold and a release of the same inode
//! may reach it in either order.

use rext4::sync::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

const SHARDS: usize = 64;

/// What a change of a lookup count asks of the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transition {
    /// The count went 0 -> n: take an engine reference.
    Hold,
    /// The count went to 0: drop the engine reference.
    Release,
    /// Nothing to do.
    None,
}

/// Lookup counts per inode (engine inode numbers).
pub(crate) struct LookupCounts {
    /// Inode -> count; absent means 0. [each shard: its own mutex]
    shards: Box<[Mutex<HashMap<u64, u64>>]>,
}

/// Which of `shards` maps `key` falls in: the key modulo their number.
// Cannot truncate: the remainder is below `shards`, a usize.
#[allow(clippy::cast_possible_truncation)]
pub(crate) fn shard_index(key: u64, shards: usize) -> usize {
    (key % shards as u64) as usize
}

impl Default for LookupCounts {
    fn default() -> Self {
        LookupCounts { shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect() }
    }
}

impl LookupCounts {
    fn shard(&self, ino: u64) -> &Mutex<HashMap<u64, u64>> {
        &self.shards[shard_index(ino.wrapping_mul(0x9E37_79B9), SHARDS)]
    }

    /// Adds one lookup.
    pub(crate) fn add(&self, ino: u64) -> Transition {
        let mut s = self.shard(ino).lock();
        let c = s.entry(ino).or_insert(0);
        *c += 1;
        if *c == 1 {
            Transition::Hold
        } else {
            Transition::None
        }
    }

    /// Takes back `n` lookups (a `forget`, or undoing an `add` whose reply could not be
    /// built). Counts never go below 0: a forget for an unknown inode is ignored.
    pub(crate) fn sub(&self, ino: u64, n: u64) -> Transition {
        let mut s = self.shard(ino).lock();
        let Some(c) = s.get_mut(&ino) else { return Transition::None };
        *c = c.saturating_sub(n);
        if *c == 0 {
            s.remove(&ino);
            Transition::Release
        } else {
            Transition::None
        }
    }

    /// The current count of `ino`.
    #[cfg(test)]
    pub(crate) fn get(&self, ino: u64) -> u64 {
        self.shard(ino).lock().get(&ino).copied().unwrap_or(0)
    }

    /// Empties the table, returning every inode that had a count (at unmount, to release them).
    pub(crate) fn drain(&self) -> Vec<u64> {
        let mut all = Vec::new();
        for s in self.shards.iter() {
            all.extend(s.lock().drain().map(|(ino, _)| ino));
        }
        all
    }

    /// Every inode with a count, as the table holds them now.
    pub(crate) fn keys(&self) -> Vec<u64> {
        let mut all = Vec::new();
        for s in self.shards.iter() {
            all.extend(s.lock().keys().copied());
        }
        all
    }

    /// Number of inodes with a nonzero count.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether no inode has a count.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One open file or directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Open {
    /// Engine inode number.
    pub ino: u64,
    /// The `open(2)` flags.
    pub flags: i32,
}

/// The open handles of one inode.
#[derive(Clone, Copy, Debug, Default)]
struct InodeOpens {
    count: u32,
    /// Removed (its last name gone) while open: its data goes at the last close.
    removed: bool,
}

/// Open file handles: the `fh` the kernel passes back with every I/O request.
pub(crate) struct FileHandles {
    /// Next handle number; 0 is never handed out. [atomic]
    next: AtomicU64,
    /// Handle -> open. [each shard: its own mutex]
    shards: Box<[Mutex<HashMap<u64, Open>>]>,
    /// Inode -> its open handles, absent for none. [each shard: its own mutex, taken after
    /// the handle's shard is released, never with it]
    per_ino: Box<[Mutex<HashMap<u64, InodeOpens>>]>,
}

impl Default for FileHandles {
    fn default() -> Self {
        FileHandles {
            next: AtomicU64::new(1),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_ino: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }
}

impl FileHandles {
    fn shard(&self, fh: u64) -> &Mutex<HashMap<u64, Open>> {
        &self.shards[shard_index(fh, SHARDS)]
    }

    fn ino_shard(&self, ino: u64) -> &Mutex<HashMap<u64, InodeOpens>> {
        &self.per_ino[shard_index(ino.wrapping_mul(0x9E37_79B9), SHARDS)]
    }

    /// Records an open and returns its handle.
    pub(crate) fn open(&self, ino: u64, flags: i32) -> u64 {
        // Counted first: an inode is never seen unopened while a handle to it exists.
        self.ino_shard(ino).lock().entry(ino).or_default().count += 1;
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        self.shard(fh).lock().insert(fh, Open { ino, flags });
        fh
    }

    /// At the removal of `ino`'s last name: whether no handle to it is open (its data may go
    /// now); otherwise it is marked, and [`FileHandles::close`] says so at its last close.
    /// One lock for both, so a close racing in is never missed.
    pub(crate) fn removed(&self, ino: u64) -> bool {
        match self.ino_shard(ino).lock().get_mut(&ino) {
            Some(o) => {
                o.removed = true;
                false
            }
            None => true,
        }
    }

    /// The open behind `fh`, if it is one of ours and for inode `ino`.
    pub(crate) fn get(&self, fh: u64, ino: u64) -> Option<Open> {
        self.shard(fh).lock().get(&fh).copied().filter(|o| o.ino == ino)
    }

    /// Forgets a handle (`release` / `releasedir`); with it, whether that was the last
    /// handle of an inode [`FileHandles::removed`] marked.
    pub(crate) fn close(&self, fh: u64) -> Option<(Open, bool)> {
        let open = self.shard(fh).lock().remove(&fh)?;
        let mut s = self.ino_shard(open.ino).lock();
        let mut gone = false;
        if let Some(o) = s.get_mut(&open.ino) {
            o.count -= 1;
            if o.count == 0 {
                gone = o.removed;
                s.remove(&open.ino);
            }
        }
        Some((open, gone))
    }

    /// Number of open handles.
    #[cfg(test)]
    #[allow(clippy::len_without_is_empty)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_counts_hold_once_and_release_at_zero() {
        let c = LookupCounts::default();
        assert_eq!(c.add(12), Transition::Hold);
        assert_eq!(c.add(12), Transition::None);
        assert_eq!(c.sub(12, 1), Transition::None);
        assert_eq!(c.get(12), 1);
        assert_eq!(c.sub(12, 5), Transition::Release);
        assert_eq!(c.sub(12, 1), Transition::None, "a forget for an unknown inode is ignored");
        assert_eq!(c.add(12), Transition::Hold);
        assert_eq!(c.drain(), vec![12]);
        assert!(c.is_empty());
    }

    #[test]
    fn handles_are_unique_and_checked() {
        let h = FileHandles::default();
        let a = h.open(12, 0);
        let b = h.open(12, 1);
        assert_ne!(a, b);
        assert_eq!(h.get(a, 12).map(|o| o.flags), Some(0));
        assert_eq!(h.get(a, 13), None);
        assert_eq!(h.close(a).map(|(o, gone)| (o.ino, gone)), Some((12, false)));
        assert_eq!(h.get(a, 12), None);
        assert_eq!(h.len(), 1);
        // Removed while open: the last close says so, once.
        assert!(!h.removed(12));
        assert!(h.removed(13));
        assert_eq!(h.close(b).map(|(o, gone)| (o.ino, gone)), Some((12, true)));
        assert_eq!(h.close(b), None);
        assert!(h.removed(12));
        let c = h.open(12, 0);
        assert_eq!(h.close(c).map(|(_, gone)| gone), Some(false));
    }
}
