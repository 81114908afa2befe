//! Blocked POSIX owners by owner, for deadlock detection (the kernel's `blocked_hash`): owner
//! A waiting for a lock of owner B records A -> B. A new wait of A on B is a deadlock when
//! following B's own wait, and the wait of whoever that leads to, comes back to A. The walk is
//! bounded as the kernel bounds it, so a long chain is let through rather than searched.

use super::LockOwner;
use crate::error::{Error, Result};
use crate::sync::Mutex;
use std::collections::HashMap;

/// Longest chain of waits followed (the kernel's `MAX_DEADLK_ITERATIONS`).
const MAX_WALK: usize = 10;

#[derive(Default)]
pub(super) struct Blocked {
    /// Waiting POSIX owner -> (waiter id, owner of the lock it waits for), one per blocked
    /// request (threads sharing an owner may each wait). [own mutex]
    map: Mutex<HashMap<u64, Vec<(u64, LockOwner)>>>,
}

impl Blocked {
    /// Records that waiter `id` of owner `me` waits for `blocker`, unless that closes a cycle.
    pub(super) fn block(&self, me: u64, id: u64, blocker: LockOwner) -> Result<()> {
        let mut map = self.map.lock();
        let mut cur = blocker;
        for _ in 0..=MAX_WALK {
            let LockOwner::Posix(o) = cur else { break };
            if o == me {
                return Err(Error::Deadlock);
            }
            // What `o` waits for, if it waits (the first of its waits, as the kernel finds).
            match map.get(&o).and_then(|v| v.first()) {
                Some(&(_, next)) => cur = next,
                None => break,
            }
        }
        let v = map.entry(me).or_default();
        match v.iter_mut().find(|(w, _)| *w == id) {
            Some(e) => e.1 = blocker,
            None => v.push((id, blocker)),
        }
        Ok(())
    }

    /// Forgets waiter `id` of owner `me` (woken, cancelled or failed).
    pub(super) fn unblock(&self, me: u64, id: u64) {
        let mut map = self.map.lock();
        if let Some(v) = map.get_mut(&me) {
            v.retain(|(w, _)| *w != id);
            if v.is_empty() {
                map.remove(&me);
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
