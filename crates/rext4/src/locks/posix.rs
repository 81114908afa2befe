//! The byte-range (POSIX and OFD) locks of one inode, as `posix_lock_inode` keeps them: an
//! owner's locks never overlap each other; adjacent or overlapping locks of one owner and one
//! type merge; a request of another type (or an unlock) splits what it covers.

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
    pub(super) fn touches(&self, o: &Range) -> bool {
        self.overlaps(o)
            || self.end.checked_add(1) == Some(o.start)
            || o.end.checked_add(1) == Some(self.start)
    }
}

/// Every byte-range lock of one inode, in no particular order (lists are short: the kernel
/// keeps a plain list too).
#[derive(Default)]
pub(super) struct PosixLocks {
    locks: Vec<FileLock>,
}

fn conflicts(held: &FileLock, req: &FileLock) -> bool {
    req.kind != LockType::Unlock
        && held.owner != req.owner
        && held.range().overlaps(&req.range())
        && (held.kind == LockType::Write || req.kind == LockType::Write)
}

impl PosixLocks {
    pub(super) fn is_empty(&self) -> bool {
        self.locks.is_empty()
    }

    pub(super) fn all(&self) -> &[FileLock] {
        &self.locks
    }

    /// The first lock of another owner that `req` (a read or write request) conflicts with.
    pub(super) fn conflict(&self, req: &FileLock) -> Option<&FileLock> {
        self.locks.iter().find(|h| conflicts(h, req))
    }

    /// Applies `req` for its owner (the caller checked for conflicts): merges, splits or
    /// removes that owner's locks. Returns the ranges others may now take: what was unlocked,
    /// or downgraded from write to read.
    pub(super) fn apply(&mut self, req: &FileLock) -> Vec<Range> {
        let mut freed = Vec::new();
        let mut new = req.range();
        // The kernel's list keeps an owner's locks together, by start, where its first lock
        // was; `F_GETLK` reports the first conflict in that order.
        let at = self.locks.iter().position(|l| l.owner == req.owner).unwrap_or(self.locks.len());
        if at == self.locks.len() {
            // The common case: the owner holds nothing here.
            if req.kind != LockType::Unlock {
                self.locks.push(*req);
            }
            return freed;
        }
        let mut others = Vec::with_capacity(self.locks.len());
        let mut kept = Vec::new();
        for l in self.locks.drain(..) {
            if l.owner != req.owner {
                others.push(l);
                continue;
            }
            let r = l.range();
            if l.kind == req.kind && r.touches(&new) {
                // Same type: the request absorbs it.
                new = Range { start: new.start.min(r.start), end: new.end.max(r.end) };
                continue;
            }
            if !r.overlaps(&req.range()) {
                kept.push(l);
                continue;
            }
            // Another type, or an unlock: keep what lies outside the request.
            let covered = Range { start: r.start.max(req.start), end: r.end.min(req.end) };
            if l.kind == LockType::Write {
                freed.push(covered);
            }
            if r.start < req.start {
                kept.push(FileLock { start: r.start, end: req.start - 1, ..l });
            }
            if r.end > req.end {
                kept.push(FileLock { start: req.end + 1, end: r.end, ..l });
            }
            if req.kind == LockType::Unlock && l.kind == LockType::Read {
                freed.push(covered);
            }
        }
        if req.kind != LockType::Unlock {
            kept.push(FileLock { start: new.start, end: new.end, ..*req });
        }
        kept.sort_unstable_by_key(|l| l.start);
        let at = at.min(others.len());
        others.splice(at..at, kept);
        self.locks = others;
        freed
    }

    /// Removes every lock of `owner`; returns their ranges.
    pub(super) fn remove_owner(&mut self, owner: LockOwner) -> Vec<Range> {
        let mut freed = Vec::new();
        self.locks.retain(|l| {
            if l.owner == owner {
                freed.push(l.range());
                false
            } else {
                true
            }
        });
        freed
    }
}
