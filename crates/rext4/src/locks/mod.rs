//! File locks with the kernel's semantics (`fs/locks.c`): POSIX record locks (owned by a
//! process-like lock owner), open-file-description (OFD) locks (owned by an open file) and
//! `flock` locks, built the way seed 002 rebuilt the kernel's: lock state per inode, no global
//! lock on the uncontended path, blocked POSIX waiters in a hash by owner so deadlock
//! detection is a short walk, and a release that wakes only the waiters it unblocks.
//!
//! | file | owns |
//! |---|---|
//! | `posix.rs` | byte-range locks of one inode: conflicts, splitting and merging |
//! | `flock.rs` | whole-file `flock` locks of one inode |
//! | `blocked.rs` | which POSIX owner waits for which (deadlock detection) |
//! | `wait.rs` | a blocked request: how it sleeps, is granted and is cancelled |
//!
//! A blocked request is **granted by the releaser**: whoever frees a range walks that inode's
//! waiters in arrival order and applies each request that no longer conflicts, then wakes
//! that thread alone. A waiter never wakes to find its lock taken again (no herd), and a
//! waiter whose range stays held sleeps on.
//!
//! # Locking
//! `FileLocks::contexts` is a concurrent map read without locks. Each inode's
//! `LockContext::state` mutex guards its locks and waiters. A request that must block takes
//! `Blocked::map` (one mutex for the filesystem, taken only to block or unblock a POSIX
//! request) while holding its inode's state mutex, never the other way round. A waiter's own
//! mutex is innermost. None of these is held across I/O or an engine lock.

mod api;
mod blocked;
mod flock;
mod posix;
mod wait;

#[cfg(test)]
mod tests;

use crate::error::{Error, Result};
use crate::sync::{Mutex, MutexGuard};
use posix::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
pub use wait::Cancel;

/// What a byte-range request asks for (`F_RDLCK`, `F_WRLCK`, `F_UNLCK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockType {
    /// Shared: conflicts only with another owner's write lock.
    Read,
    /// Exclusive: conflicts with any other owner's lock.
    Write,
    /// Releases the owner's locks in the range.
    Unlock,
}

/// Who holds a byte-range lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockOwner {
    /// A POSIX record lock (`F_SETLK`), held by a process-like owner: released when that
    /// owner closes any file of the inode ([`crate::Fs::release_posix_locks`]).
    Posix(u64),
    /// An OFD lock (`F_OFD_SETLK`), held by an open file description: released when it is
    /// last closed. Not part of deadlock detection, as in the kernel.
    Ofd(u64),
}

/// A byte-range lock: what `F_GETLK` reports and `F_SETLK` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileLock {
    pub kind: LockType,
    /// First byte.
    pub start: u64,
    /// Last byte, inclusive; `u64::MAX` for "to the end of the file, however it grows" (a
    /// `l_len` of 0).
    pub end: u64,
    pub owner: LockOwner,
    /// The locking process, for `F_GETLK`'s `l_pid`; not used for ownership.
    pub pid: u32,
}

impl FileLock {
    /// A request for `[start, end]` (inclusive) by `owner`.
    pub fn new(kind: LockType, start: u64, end: u64, owner: LockOwner) -> FileLock {
        FileLock { kind, start, end, owner, pid: 0 }
    }

    /// The range as `fcntl` describes it: `len` bytes from `start`, 0 meaning to the end.
    /// `EINVAL` for a range past the largest offset.
    pub fn from_len(kind: LockType, start: u64, len: u64, owner: LockOwner) -> Result<FileLock> {
        let end = match len {
            0 => u64::MAX,
            n => start.checked_add(n - 1).ok_or(Error::InvalidInput("lock range overflows"))?,
        };
        Ok(FileLock::new(kind, start, end, owner))
    }

    fn range(&self) -> Range {
        Range { start: self.start, end: self.end }
    }
}

/// What a `flock` call asks for (`LOCK_SH`, `LOCK_EX`, `LOCK_UN`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlockOp {
    Shared,
    Exclusive,
    Unlock,
}

/// Whether a request that conflicts waits (`F_SETLKW`, `flock` without `LOCK_NB`).
#[derive(Clone, Copy, Debug)]
pub enum Wait<'a> {
    /// Fail at once: `EAGAIN` (`F_SETLK`) or `EWOULDBLOCK` (`LOCK_NB`).
    No,
    /// Sleep until granted; `EINTR` if `cancel` is cancelled first.
    Until(&'a Cancel),
    /// Sleep until granted.
    Forever,
}

/// The lock state of one inode. [state: own mutex]
#[derive(Default)]
struct LockContext {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    posix: posix::PosixLocks,
    flock: flock::FlockLocks,
    /// Blocked requests, oldest first.
    waiters: Vec<Arc<wait::Waiter>>,
    /// Set when the context left the map (it was empty): a thread that fetched it before then
    /// must fetch again.
    dead: bool,
}

impl State {
    fn is_empty(&self) -> bool {
        self.posix.is_empty() && self.flock.is_empty() && self.waiters.is_empty()
    }
}

/// Every inode's locks and the blocked-owner hash of one filesystem.
pub(crate) struct FileLocks {
    /// Inode number -> its lock state, present while it has a lock or a waiter. [read without
    /// locks; an entry leaves only with its `dead` flag set under its own mutex]
    contexts: papaya::HashMap<u32, Arc<LockContext>>,
    /// POSIX owners that are waiting. [own mutex; taken inside a context's]
    blocked: blocked::Blocked,
    /// Identity of the next waiter. [atomic]
    next_waiter: AtomicU64,
}

impl Default for FileLocks {
    fn default() -> Self {
        FileLocks {
            contexts: papaya::HashMap::new(),
            blocked: blocked::Blocked::default(),
            next_waiter: AtomicU64::new(1),
        }
    }
}

impl FileLocks {
    /// Runs `f` on inode `ino`'s lock state, creating it if `create`; the state leaves the map
    /// once `f` leaves it empty.
    fn with_state<R>(&self, ino: u32, create: bool, f: impl FnOnce(&mut State) -> R) -> Option<R> {
        loop {
            let map = self.contexts.pin();
            let ctx = match map.get(&ino) {
                Some(c) => c.clone(),
                None if create => map.get_or_insert_with(ino, Arc::default).clone(),
                None => return None,
            };
            drop(map);
            let mut st = ctx.state.lock();
            if st.dead {
                continue;
            }
            let r = f(&mut st);
            self.drop_if_empty(ino, &ctx, &mut st);
            return Some(r);
        }
    }

    fn drop_if_empty(&self, ino: u32, ctx: &Arc<LockContext>, st: &mut MutexGuard<'_, State>) {
        if st.is_empty() {
            st.dead = true;
            let _ = self.contexts.pin().remove_if(&ino, |_, v| Arc::ptr_eq(v, ctx));
        }
    }

    /// The first lock of another owner that conflicts with `req` (`F_GETLK`); `None` if
    /// `req` could be taken now. An `Unlock` request never conflicts.
    pub fn getlk(&self, ino: u32, req: &FileLock) -> Option<FileLock> {
        if req.kind == LockType::Unlock {
            return None;
        }
        self.with_state(ino, false, |st| st.posix.conflict(req).copied()).flatten()
    }

    /// Takes, changes or releases a byte-range lock (`F_SETLK`/`F_SETLKW`).
    pub fn setlk(&self, ino: u32, req: &FileLock, wait: Wait<'_>) -> Result<()> {
        self.request(ino, wait::Request::Posix(*req), wait)
    }

    /// Takes, converts or releases `file`'s `flock` lock. As in the kernel, a conversion
    /// drops the old lock first, so a conversion that fails has lost it.
    pub fn flock(&self, ino: u32, file: u64, op: FlockOp, wait: Wait<'_>) -> Result<()> {
        self.request(ino, wait::Request::Flock { file, op }, wait)
    }

    fn request(&self, ino: u32, req: wait::Request, wait: Wait<'_>) -> Result<()> {
        let create = !req.is_release();
        let waiter = self.with_state(ino, create, |st| -> Result<Option<Arc<wait::Waiter>>> {
            let blocker = match self.try_apply(st, &req) {
                Ok(()) => return Ok(None),
                Err(b) => b,
            };
            if let Wait::No = wait {
                return Err(Error::WouldBlock);
            }
            let id = self.next_waiter.fetch_add(1, Ordering::Relaxed);
            let w = Arc::new(wait::Waiter::new(id, req));
            if let (wait::Request::Posix(r), Some(b)) = (&req, blocker) {
                if let LockOwner::Posix(me) = r.owner {
                    self.blocked.block(me, id, b)?;
                }
            }
            st.waiters.push(w.clone());
            Ok(Some(w))
        });
        let Some(w) = waiter.transpose()?.flatten() else { return Ok(()) };
        let cancel = match wait {
            Wait::Until(c) => Some(c),
            _ => None,
        };
        if w.sleep(cancel)? {
            return Ok(());
        }
        // Cancelled: leave no trace, unless the grant won the race (then the lock is held,
        // as in the kernel when a signal comes after the lock was given).
        let granted = self.with_state(ino, false, |st| {
            if w.is_granted() {
                return true;
            }
            st.waiters.retain(|x| !Arc::ptr_eq(x, &w));
            self.unblock(&w);
            false
        });
        if granted.unwrap_or_else(|| w.is_granted()) {
            Ok(())
        } else {
            Err(Error::Interrupted)
        }
    }

    /// Applies `req` if nothing conflicts, then grants what it freed; otherwise the owner of
    /// a conflicting lock (POSIX requests) or `None` (flock).
    fn try_apply(&self, st: &mut State, req: &wait::Request) -> std::result::Result<(), Option<LockOwner>> {
        match req {
            wait::Request::Posix(r) => {
                if let Some(c) = st.posix.conflict(r) {
                    return Err(Some(c.owner));
                }
                let freed = st.posix.apply(r);
                self.grant_waiters(st, &freed, false);
            }
            wait::Request::Flock { file, op } => {
                // A conversion first drops the old lock and lets others in.
                if st.flock.remove_for_convert(*file, *op) {
                    self.grant_waiters(st, &[], true);
                }
                if *op != FlockOp::Unlock {
                    if st.flock.conflicts(*file, *op) {
                        return Err(None);
                    }
                    st.flock.insert(*file, *op);
                }
            }
        }
        Ok(())
    }

    /// Grants, oldest first, every waiter that `freed` (byte ranges) or a flock release
    /// (`flock_freed`) may have unblocked and that no longer conflicts.
    fn grant_waiters(&self, st: &mut State, freed: &[Range], flock_freed: bool) {
        if st.waiters.is_empty() || (freed.is_empty() && !flock_freed) {
            return;
        }
        let mut i = 0;
        while i < st.waiters.len() {
            let w = st.waiters[i].clone();
            let candidate = match &w.req {
                wait::Request::Posix(r) => freed.iter().any(|f| f.overlaps(&r.range())),
                wait::Request::Flock { .. } => flock_freed,
            };
            if candidate {
                let ok = match &w.req {
                    wait::Request::Posix(r) => match st.posix.conflict(r) {
                        None => true,
                        // Still held, now by someone else perhaps: the wait is recorded
                        // anew, and fails if that closes a cycle (the kernel's waiter,
                        // woken, finds the deadlock on its retry).
                        Some(c) => {
                            if let LockOwner::Posix(me) = r.owner {
                                if let Err(e) = self.blocked.block(me, w.id, c.owner) {
                                    st.waiters.remove(i);
                                    self.unblock(&w);
                                    w.fail(e);
                                    continue;
                                }
                            }
                            false
                        }
                    },
                    wait::Request::Flock { file, op } => !st.flock.conflicts(*file, *op),
                };
                if ok {
                    st.waiters.remove(i);
                    match &w.req {
                        // A grant frees nothing the others wait for: it only adds or
                        // converts the waiter's own locks (an unlock never waits).
                        wait::Request::Posix(r) => {
                            st.posix.apply(r);
                        }
                        wait::Request::Flock { file, op } => st.flock.insert(*file, *op),
                    }
                    self.unblock(&w);
                    w.grant();
                    continue;
                }
            }
            i += 1;
        }
    }

    fn unblock(&self, w: &wait::Waiter) {
        if let wait::Request::Posix(FileLock { owner: LockOwner::Posix(me), .. }) = w.req {
            self.blocked.unblock(me, w.id);
        }
    }

    /// Drops every byte-range lock `owner` holds on `ino` (a POSIX owner closing any file of
    /// the inode, or an open file's last close for its OFD locks).
    pub fn release_owner(&self, ino: u32, owner: LockOwner) {
        self.with_state(ino, false, |st| {
            let freed = st.posix.remove_owner(owner);
            self.grant_waiters(st, &freed, false);
        });
    }

    /// Drops `file`'s flock lock on `ino` (its last close).
    pub fn release_flock(&self, ino: u32, file: u64) {
        self.with_state(ino, false, |st| {
            if st.flock.remove(file) {
                self.grant_waiters(st, &[], true);
            }
        });
    }

    /// Forgets every lock and fails every waiter of `ino` (the inode was freed).
    pub fn drop_inode(&self, ino: u32) {
        self.with_state(ino, false, |st| {
            st.posix = posix::PosixLocks::default();
            st.flock = flock::FlockLocks::default();
            for w in std::mem::take(&mut st.waiters) {
                self.unblock(&w);
                w.fail(Error::Stale);
            }
        });
    }

    /// The locks held on `ino`, POSIX and OFD first, then flock ones as whole-file locks
    /// owned by `LockOwner::Ofd(file)` (for `/proc/locks`-like listings and tests).
    pub fn list(&self, ino: u32) -> (Vec<FileLock>, Vec<(u64, FlockOp)>) {
        self.with_state(ino, false, |st| (st.posix.all().to_vec(), st.flock.all())).unwrap_or_default()
    }

    /// Inodes with lock state (tests: nothing is left behind).
    #[cfg(test)]
    fn live_contexts(&self) -> usize {
        self.contexts.pin().len()
    }
}
