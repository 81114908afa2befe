//! The `flock` locks of one inode: at most one per open file, shared or exclusive, over the
//! whole file. They never conflict with byte-range locks (Linux keeps them apart).

use super::FlockOp;

#[derive(Default)]
pub(super) struct FlockLocks {
    /// (open file, exclusive?), oldest first.
    locks: Vec<(u64, bool)>,
}

impl FlockLocks {
    pub(super) fn is_empty(&self) -> bool {
        self.locks.is_empty()
    }

    pub(super) fn all(&self) -> Vec<(u64, FlockOp)> {
        self.locks.iter().map(|&(f, ex)| (f, if ex { FlockOp::Exclusive } else { FlockOp::Shared })).collect()
    }

    /// Whether `op` by `file` conflicts with another file's lock.
    pub(super) fn conflicts(&self, file: u64, op: FlockOp) -> bool {
        let ex = op == FlockOp::Exclusive;
        self.locks.iter().any(|&(f, held_ex)| f != file && (ex || held_ex))
    }

    /// Before `op` by `file`: drops `file`'s lock unless it already is what `op` asks for
    /// (then the request has nothing left to do but succeed: the caller's insert is a no-op).
    /// Returns whether a lock was dropped.
    pub(super) fn remove_for_convert(&mut self, file: u64, op: FlockOp) -> bool {
        let Some(i) = self.locks.iter().position(|&(f, _)| f == file) else { return false };
        let same = match op {
            FlockOp::Shared => !self.locks[i].1,
            FlockOp::Exclusive => self.locks[i].1,
            FlockOp::Unlock => false,
        };
        if same {
            return false;
        }
        self.locks.remove(i);
        true
    }

    /// Records `file`'s lock (`op` is shared or exclusive; the caller checked conflicts).
    pub(super) fn insert(&mut self, file: u64, op: FlockOp) {
        let ex = op == FlockOp::Exclusive;
        match self.locks.iter_mut().find(|(f, _)| *f == file) {
            Some(l) => l.1 = ex,
            None => self.locks.push((file, ex)),
        }
    }

    /// Drops `file`'s lock; whether it had one.
    pub(super) fn remove(&mut self, file: u64) -> bool {
        let before = self.locks.len();
        self.locks.retain(|&(f, _)| f != file);
        self.locks.len() != before
    }
}
