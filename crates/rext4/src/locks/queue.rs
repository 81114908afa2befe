//! The tree of blocked byte-range requests, as the kernel keeps it: each waits under a held
//! lock or under an earlier request it conflicts with, and looks again when that changes.
//! It decides whom a change wakes and what deadlock detection follows (`blocked.rs`).
//!
//! Unlike the kernel, a change wakes only the requests it frees, which then retry themselves
//! (no convoy: a thread that unlocks and locks again in a loop keeps its time slice); the
//! others are moved, with what waits under them, where their retry would queue them, without
//! a thread switch each.

use super::{is_posix, posix, posix_req, wait, FileLock, FileLocks, LockOwner, State};
use crate::error::Error;
use std::sync::Arc;

/// Where a blocked byte-range request waits, as in the kernel's tree of waiters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Parent {
    /// Under a held lock (by its identity).
    Lock(u64),
    /// Under an earlier request (by its waiter id), waiting or woken.
    Waiter(u64),
}

/// A blocked request.
pub(super) struct Queued {
    pub(super) w: Arc<wait::Waiter>,
    /// Where a byte-range request waits; `None` for a flock request.
    pub(super) parent: Option<Parent>,
    /// Whether the wait is on the blocked hash: what it waits under is a POSIX lock or request.
    pub(super) hashed: bool,
    /// The owner at the root of its wait, as the hash has it.
    pub(super) root: LockOwner,
}

/// A byte-range request woken to look again that has not yet.
#[derive(Clone, Copy)]
pub(super) struct Woken {
    pub(super) id: u64,
    pub(super) req: FileLock,
}

impl State {
    /// Ids of the requests waiting directly under `p`, in order.
    pub(super) fn children(&self, p: Parent) -> Vec<u64> {
        self.waiters.iter().filter(|q| q.parent == Some(p)).map(|q| q.w.id).collect()
    }

    /// The requests at `pos` and under it, taken out of the queue in order.
    pub(super) fn take_subtree(&mut self, pos: usize) -> Vec<Queued> {
        let mut ids = std::collections::HashSet::from([self.waiters[pos].w.id]);
        // Whatever waits under a request comes after it in the queue: one pass finds it all.
        let rest = self.waiters.split_off(pos);
        let mut out = Vec::new();
        for q in rest {
            let under = match q.parent {
                Some(Parent::Waiter(p)) => ids.contains(&p),
                _ => false,
            };
            if out.is_empty() || under {
                ids.insert(q.w.id);
                out.push(q);
            } else {
                self.waiters.push(q);
            }
        }
        out
    }
}

impl FileLocks {
    /// Queues byte-range request `q` under held lock `blocker`, or under the first request
    /// waiting there that it conflicts with, and so on down (`__locks_insert_block`).
    pub(super) fn queue_under(&self, st: &mut State, mut q: Queued, blocker: posix::Held) {
        let Some(r) = posix_req(&q) else { return };
        let mut parent = Parent::Lock(blocker.id);
        let mut parent_owner = blocker.lock.owner;
        // One pass suffices: a request's own waiters come after it.
        for o in &st.waiters {
            if o.parent != Some(parent) {
                continue;
            }
            if let Some(or) = posix_req(o) {
                if posix::conflicts(&or, &r) {
                    parent = Parent::Waiter(o.w.id);
                    parent_owner = or.owner;
                }
            }
        }
        self.set_parent(&mut q, parent, parent_owner);
        st.waiters.push(q);
        st.moved = true;
    }

    /// Hangs `q` under `parent` (owned by `parent_owner`): on the hash only if that is a
    /// POSIX lock or request, as the kernel hashes a wait by what it waits under.
    pub(super) fn set_parent(&self, q: &mut Queued, parent: Parent, parent_owner: LockOwner) {
        let Some(r) = posix_req(q) else { return };
        q.parent = Some(parent);
        let hashed = is_posix(parent_owner);
        if hashed != q.hashed {
            if hashed {
                self.blocked.block(r.owner, q.w.id, q.root);
            } else {
                self.blocked.unblock(r.owner, q.w.id);
            }
            q.hashed = hashed;
        }
    }

    /// The requests waiting directly under locks `ids` (removed, replaced or shrunk): they
    /// look again.
    pub(super) fn detach_under_locks(&self, st: &State, ids: &[u64]) -> Vec<u64> {
        if st.waiters.is_empty() {
            return Vec::new();
        }
        ids.iter().flat_map(|&l| st.children(Parent::Lock(l))).collect()
    }

    /// Requests whose wait changed look again, first first, without leaving their queue
    /// unless they must: one whose range is free now is woken to take it itself (what waits
    /// under it stays there until it has); one that would wait again moves, with what waits
    /// under it, under whatever holds its range now, and fails if that is a deadlock; one
    /// free but for a request woken before it waits under that one.
    ///
    /// Only the requests a change frees are woken: the rest are moved where the kernel's
    /// woken requests would queue themselves again, without a thread switch each.
    pub(super) fn look_again(&self, st: &mut State, ids: Vec<u64>) {
        if ids.is_empty() {
            return;
        }
        st.moved = true;
        let mut queue: std::collections::VecDeque<u64> = ids.into();
        while let Some(id) = queue.pop_front() {
            let Some(pos) = st.position(id) else { continue };
            let Some(r) = posix_req(&st.waiters[pos]) else { continue };
            if let Some(blocker) = st.posix.conflict(&r).copied() {
                if is_posix(r.owner) && self.blocked.deadlock(r.owner, blocker.lock.owner) {
                    let q = st.waiters.remove(pos);
                    if q.hashed {
                        self.blocked.unblock(r.owner, id);
                    }
                    queue.extend(st.children(Parent::Waiter(id)));
                    q.w.fail(Error::Deadlock);
                    continue;
                }
                let mut sub = st.take_subtree(pos);
                let head = sub.remove(0);
                // The requests right under it would look again in the kernel: check them.
                let direct: Vec<u64> =
                    sub.iter().filter(|q| q.parent == Some(Parent::Waiter(id))).map(|q| q.w.id).collect();
                self.queue_under(st, head, blocker);
                st.waiters.extend(sub);
                for c in direct {
                    let Some(cp) = st.position(c) else { continue };
                    let Some(cr) = posix_req(&st.waiters[cp]) else { continue };
                    let Some(cb) = st.posix.conflict(&cr).copied() else { continue };
                    if is_posix(cr.owner) && self.blocked.deadlock(cr.owner, cb.lock.owner) {
                        let q = st.waiters.remove(cp);
                        if q.hashed {
                            self.blocked.unblock(cr.owner, c);
                        }
                        queue.extend(st.children(Parent::Waiter(c)));
                        q.w.fail(Error::Deadlock);
                    }
                }
            } else if let Some(wk) = st.woken.iter().find(|x| posix::conflicts(&x.req, &r)).copied() {
                let mut q = st.waiters.remove(pos);
                self.set_parent(&mut q, Parent::Waiter(wk.id), wk.req.owner);
                // A woken request is not in the queue, so this one may stay where it was.
                st.waiters.insert(pos, q);
            } else {
                let q = st.waiters.remove(pos);
                if q.hashed {
                    self.blocked.unblock(r.owner, id);
                }
                st.woken.push(Woken { id, req: r });
                q.w.wake();
            }
        }
    }

    /// Brings the hash's roots of this inode's waits up to date: the owner of the held lock
    /// each waits under, through the requests it waits under, or of the woken request at the
    /// top of its queue.
    pub(super) fn sync_roots(&self, st: &mut State) {
        if !std::mem::take(&mut st.moved) || st.waiters.is_empty() {
            return;
        }
        let mut changed = Vec::new();
        // Roots of the requests seen so far: a waiting parent comes earlier in the queue,
        // most often just before.
        let mut roots: Vec<(u64, LockOwner)> = Vec::with_capacity(st.waiters.len());
        for q in &mut st.waiters {
            let Some(r) = posix_req(q) else { continue };
            let root = match q.parent {
                None => continue,
                Some(Parent::Lock(l)) => st.posix.owner_of(l),
                // A woken parent is the root.
                Some(Parent::Waiter(p)) => {
                    let seen = roots.iter().rev().find(|x| x.0 == p).map(|x| x.1);
                    seen.or_else(|| st.woken.iter().find(|x| x.id == p).map(|x| x.req.owner))
                }
            };
            if let Some(root) = root {
                if root != q.root {
                    q.root = root;
                    if q.hashed {
                        changed.push((r.owner, q.w.id, root));
                    }
                }
            }
            roots.push((q.w.id, q.root));
        }
        if !changed.is_empty() {
            self.blocked.set_roots(&changed);
        }
    }
}
