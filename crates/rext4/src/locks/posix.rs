//! The byte-range (POSIX and OFD) locks of one inode, kept as `posix_lock_inode` keeps them:
//! one list, each owner's locks together and by start, where its first lock was; an owner's
//! locks never overlap each other; adjacent or overlapping locks of one owner and one type
//! merge; a request of another type (or an unlock) splits what it covers.
//!
//! Each lock has an identity, as the kernel's lock objects do: blocked requests wait under a
//! particular lock, and look again exactly when that lock is removed, replaced or shrunk.
//! [`PosixLocks::apply`] follows the kernel's steps so that which object survives a merge, and
//! whose waiters wake, is the same.

use super::{FileLock, LockOwner, LockType};

/// An inclusive byte range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Range {
    pub start: u64,
    pub end: u64,
}

impl Range {
    pub(super) fn overlaps(&self, o: &Range) -> bool {
        self.start <= o.end && o.start <= self.end
    }

    /// Overlapping or touching (`end + 1 == start`, without overflow).
    #[cfg(test)]
    pub(super) fn touches(&self, o: &Range) -> bool {
        self.overlaps(o)
            || self.end.checked_add(1) == Some(o.start)
            || o.end.checked_add(1) == Some(self.start)
    }
}

/// A held lock and its identity.
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    pub(super) lock: FileLock,
    pub(super) id: u64,
}

/// Every byte-range lock of one inode, in the kernel's list order (`F_GETLK` reports the first
/// conflict in that order; lists are short, as the kernel's are).
#[derive(Default)]
pub(super) struct PosixLocks {
    locks: Vec<Held>,
    next_id: u64,
}

/// What [`PosixLocks::apply`] changed, for the waiters.
#[derive(Default, Debug)]
pub(super) struct Applied {
    /// Locks removed, replaced or shrunk: the requests waiting under them look again.
    pub(super) woken: Vec<u64>,
    /// The new lock the request became, when it did not merge into one of the owner's locks:
    /// requests waiting under the request move under it (the kernel's `locks_move_blocks`).
    pub(super) became: Option<u64>,
}

/// Whether two requests, or a request and a held lock, conflict.
pub(super) fn conflicts(held: &FileLock, req: &FileLock) -> bool {
    req.kind != LockType::Unlock
        && held.owner != req.owner
        && held.range().overlaps(&req.range())
        && (held.kind == LockType::Write || req.kind == LockType::Write)
}

impl PosixLocks {
    pub(super) fn is_empty(&self) -> bool {
        self.locks.is_empty()
    }

    pub(super) fn all(&self) -> Vec<FileLock> {
        self.locks.iter().map(|h| h.lock).collect()
    }

    /// The first lock of another owner that `req` (a read or write request) conflicts with.
    pub(super) fn conflict(&self, req: &FileLock) -> Option<&Held> {
        self.locks.iter().find(|h| conflicts(&h.lock, req))
    }

    /// The first of `req.owner`'s own locks that overlaps `req` (`F_OFD_GETLK` with
    /// `F_UNLCK`).
    pub(super) fn own_overlap(&self, req: &FileLock) -> Option<&FileLock> {
        self.locks.iter().map(|h| &h.lock).find(|l| l.owner == req.owner && l.range().overlaps(&req.range()))
    }

    pub(super) fn owner_of(&self, id: u64) -> Option<LockOwner> {
        self.get(id).map(|h| h.lock.owner)
    }

    fn get(&self, id: u64) -> Option<&Held> {
        self.locks.iter().find(|h| h.id == id)
    }

    /// The lock with identity `id`, which `apply` took from the list and has not removed.
    fn lock_of(&self, id: u64) -> FileLock {
        // Cannot fail: `apply` asks only for identities it read from the list and kept there.
        self.get(id).expect("lock in list").lock
    }

    fn get_mut(&mut self, id: u64) -> &mut FileLock {
        // Cannot fail, as for `lock_of`.
        &mut self.locks.iter_mut().find(|h| h.id == id).expect("lock in list").lock
    }

    fn new_lock(&mut self, lock: FileLock) -> Held {
        self.next_id += 1;
        Held { lock, id: self.next_id }
    }

    /// Applies `req` for its owner (the caller checked for conflicts): merges, splits or
    /// removes that owner's locks, step for step as `posix_lock_inode` does.
    pub(super) fn apply(&mut self, req: &FileLock) -> Applied {
        let mut out = Applied::default();
        // The request: its own range and type until it merges into, or replaces, a lock of
        // the list (`at`); from then on that lock's.
        let mut cur = *req;
        let mut at: Option<u64> = None;
        let mut added = false;
        let (mut left, mut right) = (None, None);
        // The owner's locks are together; skip the others' before them.
        let mut i = self.locks.iter().position(|h| h.lock.owner == req.owner).unwrap_or(self.locks.len());
        while i < self.locks.len() && self.locks[i].lock.owner == req.owner {
            if let Some(id) = at {
                cur = self.lock_of(id);
            }
            let fl = self.locks[i];
            let f = fl.lock;
            if f.kind == cur.kind {
                // Compared as `start - 1`, never `end + 1`, which overflows at the end.
                if cur.start > 0 && f.end < cur.start - 1 {
                    i += 1;
                    continue;
                }
                if f.start > 0 && f.start - 1 > cur.end {
                    break;
                }
                let (s, e) = (f.start.min(cur.start), f.end.max(cur.end));
                if let Some(id) = at {
                    let r = self.get_mut(id);
                    (r.start, r.end) = (s, e);
                    out.woken.push(fl.id);
                    self.locks.remove(i);
                    continue;
                }
                let l = &mut self.locks[i].lock;
                (l.start, l.end) = (s, e);
                at = Some(fl.id);
                added = true;
                i += 1;
                continue;
            }
            if f.end < cur.start {
                i += 1;
                continue;
            }
            if f.start > cur.end {
                break;
            }
            if cur.kind == LockType::Unlock {
                added = true;
            }
            if f.start < cur.start {
                left = Some(fl.id);
            }
            if f.end > cur.end {
                right = Some(fl.id);
                break;
            }
            if f.start >= cur.start {
                // Covered entirely: the request replaces it (the first time) or it goes.
                if !added {
                    let new = self.new_lock(cur);
                    self.locks.insert(i, new);
                    i += 1;
                    at = Some(new.id);
                    out.became = Some(new.id);
                    added = true;
                }
                out.woken.push(fl.id);
                self.locks.remove(i);
                continue;
            }
            i += 1;
        }
        if let Some(id) = at {
            cur = self.lock_of(id);
        }
        if !added {
            if cur.kind == LockType::Unlock {
                return out;
            }
            let new = self.new_lock(cur);
            self.locks.insert(i, new);
            out.became = Some(new.id);
        }
        if let Some(r) = right {
            if left == Some(r) {
                // The request cuts one lock in two: the left part is a copy, in front.
                let copy = self.new_lock(self.lock_of(r));
                self.locks.insert(i, copy);
                left = Some(copy.id);
            }
            self.get_mut(r).start = cur.end + 1;
            out.woken.push(r);
        }
        if let Some(l) = left {
            self.get_mut(l).end = cur.start - 1;
            out.woken.push(l);
        }
        out
    }

    /// Removes every lock of `owner` (an unlock of everything, as a close makes it).
    pub(super) fn remove_owner(&mut self, owner: LockOwner) -> Applied {
        self.apply(&FileLock::new(LockType::Unlock, 0, u64::MAX, owner))
    }
}
