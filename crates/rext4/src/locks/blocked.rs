//! Waiting lock owners, for deadlock detection: the kernel's `blocked_hash`. A POSIX owner
//! about to wait for a lock held by B follows what B waits for, and what that owner waits
//! for, and so on: back at itself, the wait is a deadlock (`EDEADLK`).
//!
//! Which waits are followed is the kernel's choice, kept here so that the answers are the
//! same: a wait is recorded when what it queues under (a held lock, or an earlier request it
//! conflicts with) is a POSIX one, whatever the waiter is, so an OFD owner waiting on a POSIX
//! lock is followed and a POSIX owner waiting beneath an OFD request is not. A wait leads to
//! the owner of the lock at the root of its queue (or of the request there, while that one is
//! woken and has not looked again). An owner with several waits is followed along its newest.
//! The walk gives up after 11 steps.

use super::LockOwner;
use crate::sync::Mutex;
use std::collections::HashMap;

/// Steps after which the walk gives up (the kernel's `MAX_DEADLK_ITERATIONS`, with its count:
/// it follows one more step than this).
const MAX_WALK: usize = 10;

#[derive(Default)]
pub(super) struct Blocked {
    /// Waiting owner -> (waiter id, owner at the root of its wait), oldest first. [own mutex;
    /// taken inside an inode's lock state]
    map: Mutex<HashMap<LockOwner, Vec<(u64, LockOwner)>>>,
}

impl Blocked {
    /// Whether POSIX owner `me` waiting for a lock of `blocker` closes a cycle of waits.
    pub(super) fn deadlock(&self, me: LockOwner, blocker: LockOwner) -> bool {
        let map = self.map.lock();
        let mut cur = blocker;
        let mut steps = 0;
        while let Some(&(_, next)) = map.get(&cur).and_then(|v| v.last()) {
            if steps > MAX_WALK {
                return false;
            }
            steps += 1;
            if next == me {
                return true;
            }
            cur = next;
        }
        false
    }

    /// Records that waiter `id` of `owner` waits, under a lock of `root`.
    pub(super) fn block(&self, owner: LockOwner, id: u64, root: LockOwner) {
        self.map.lock().entry(owner).or_default().push((id, root));
    }

    /// Records new roots for waits whose queue changed (owner, waiter id, root). Each becomes
    /// its owner's newest wait, as a kernel waiter that looked again is put back in front.
    pub(super) fn set_roots(&self, roots: &[(LockOwner, u64, LockOwner)]) {
        let mut map = self.map.lock();
        for &(owner, id, root) in roots {
            let v = map.entry(owner).or_default();
            v.retain(|e| e.0 != id);
            v.push((id, root));
        }
    }

    /// Forgets waiter `id` of `owner` (woken, cancelled or failed), if recorded.
    pub(super) fn unblock(&self, owner: LockOwner, id: u64) {
        let mut map = self.map.lock();
        if let Some(v) = map.get_mut(&owner) {
            v.retain(|(w, _)| *w != id);
            if v.is_empty() {
                map.remove(&owner);
            }
        }
    }
}

#[cfg(test)]
impl Blocked {
    pub(crate) fn is_empty(&self) -> bool {
        self.map.lock().is_empty()
    }
}
