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
//! | `wait.rs` | a blocked request: how it sleeps, is woken and is cancelled |
//!
//! A release **wakes only whom it unblocks**: whoever frees a range walks that inode's
//! waiters in arrival order and wakes each whose request no longer conflicts with what is
//! held or with a request woken before it; a waiter whose range stays held sleeps on (no
//! herd). The woken retry rather than being handed the lock, as in the kernel: a thread
//! that unlocks and locks again in a loop keeps its time slice instead of trading places
//! with a sleeper on every lock (a convoy that costs a context switch per lock).
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
#[allow(clippy::cast_possible_truncation)] // model offsets are small constants
mod tests;

use crate::error::{Error, Result};
use crate::sync::Mutex;
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
    /// Sleep until the lock can be taken; `EINTR` if `cancel` is cancelled first.
    Until(&'a Cancel),
    /// Sleep until the lock can be taken.
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
    /// Runs `f` on inode `ino`'s lock state, creating it if `create`. The state stays while
    /// the inode is open, as the kernel's `i_flctx` stays with its inode: a lock taken and
    /// dropped in a loop allocates nothing ([`FileLocks::forget_idle`] frees it).
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
            return Some(f(&mut st));
        }
    }

    /// Drops inode `ino`'s lock state if it holds nothing (its last open file was closed).
    pub(crate) fn forget_idle(&self, ino: u32) {
        let map = self.contexts.pin();
        let Some(ctx) = map.get(&ino).cloned() else { return };
        drop(map);
        let mut st = ctx.state.lock();
        if !st.dead && st.is_empty() {
            st.dead = true;
            let _ = self.contexts.pin().remove_if(&ino, |_, v| Arc::ptr_eq(v, &ctx));
        }
    }

    /// The first lock of another owner that conflicts with `req` (`F_GETLK`); `None` if
    /// `req` could be taken now. An `Unlock` request never conflicts.
    pub(crate) fn getlk(&self, ino: u32, req: &FileLock) -> Option<FileLock> {
        if req.kind == LockType::Unlock {
            return None;
        }
        self.with_state(ino, false, |st| st.posix.conflict(req).copied()).flatten()
    }

    /// Takes, changes or releases a byte-range lock (`F_SETLK`/`F_SETLKW`).
    pub(crate) fn setlk(&self, ino: u32, req: &FileLock, wait: Wait<'_>) -> Result<()> {
        self.request(ino, wait::Request::Posix(*req), wait)
    }

    /// Takes, converts or releases `file`'s `flock` lock. As in the kernel, a conversion
    /// drops the old lock first, so a conversion that fails has lost it.
    pub(crate) fn flock(&self, ino: u32, file: u64, op: FlockOp, wait: Wait<'_>) -> Result<()> {
        self.request(ino, wait::Request::Flock { file, op }, wait)
    }

    fn request(&self, ino: u32, req: wait::Request, wait: Wait<'_>) -> Result<()> {
        let create = !req.is_release();
        let cancel = match wait {
            Wait::Until(c) => Some(c),
            _ => None,
        };
        loop {
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
            match w.sleep(cancel) {
                // Its range was freed: try again (someone may have taken it meanwhile).
                wait::Outcome::Woken => continue,
                wait::Outcome::Failed(e) => return Err(e),
                wait::Outcome::Cancelled => {
                    // Leave no trace; a wake that raced the cancel is passed on, so the
                    // range it freed is not left with sleepers that could take it.
                    self.with_state(ino, false, |st| {
                        let was_waiting = st.waiters.iter().any(|x| Arc::ptr_eq(x, &w));
                        st.waiters.retain(|x| !Arc::ptr_eq(x, &w));
                        self.unblock(&w);
                        if !was_waiting {
                            let freed = match &w.req {
                                wait::Request::Posix(r) => vec![r.range()],
                                wait::Request::Flock { .. } => Vec::new(),
                            };
                            self.wake_waiters(st, &freed, matches!(w.req, wait::Request::Flock { .. }));
                        }
                    });
                    return Err(Error::Interrupted);
                }
            }
        }
    }

    /// Applies `req` if nothing conflicts, then wakes whom it freed; otherwise the owner of
    /// a conflicting lock (POSIX requests) or `None` (flock).
    fn try_apply(&self, st: &mut State, req: &wait::Request) -> std::result::Result<(), Option<LockOwner>> {
        match req {
            wait::Request::Posix(r) => {
                if let Some(c) = st.posix.conflict(r) {
                    return Err(Some(c.owner));
                }
                let freed = st.posix.apply(r);
                self.wake_waiters(st, &freed, false);
            }
            wait::Request::Flock { file, op } => {
                // A conversion first drops the old lock and lets others in.
                if st.flock.remove_for_convert(*file, *op) {
                    self.wake_waiters(st, &[], true);
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

    /// Wakes, oldest first, the waiters that `freed` (byte ranges) or a flock release
    /// (`flock_freed`) unblocked: those whose request no longer conflicts with the locks held
    /// nor with a request woken before it. The woken retry; the rest sleep on, their waits
    /// recorded anew against whoever holds their range now.
    fn wake_waiters(&self, st: &mut State, freed: &[Range], flock_freed: bool) {
        if st.waiters.is_empty() || (freed.is_empty() && !flock_freed) {
            return;
        }
        let mut woken: Vec<wait::Request> = Vec::new();
        let mut i = 0;
        while i < st.waiters.len() {
            let w = st.waiters[i].clone();
            let candidate = match &w.req {
                wait::Request::Posix(r) => freed.iter().any(|f| f.overlaps(&r.range())),
                wait::Request::Flock { .. } => flock_freed,
            };
            if !candidate {
                i += 1;
                continue;
            }
            let free = match &w.req {
                wait::Request::Posix(r) => match st.posix.conflict(r) {
                    None => true,
                    // Still held, perhaps by someone else now: the wait is recorded anew,
                    // and fails if that closes a cycle (as the kernel's woken waiter finds
                    // on its retry).
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
            if free && !woken.iter().any(|x| x.conflicts(&w.req)) {
                st.waiters.remove(i);
                self.unblock(&w);
                woken.push(w.req);
                w.wake();
                continue;
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
    pub(crate) fn release_owner(&self, ino: u32, owner: LockOwner) {
        self.with_state(ino, false, |st| {
            let freed = st.posix.remove_owner(owner);
            self.wake_waiters(st, &freed, false);
        });
    }

    /// Drops `file`'s flock lock on `ino` (its last close).
    pub(crate) fn release_flock(&self, ino: u32, file: u64) {
        self.with_state(ino, false, |st| {
            if st.flock.remove(file) {
                self.wake_waiters(st, &[], true);
            }
        });
    }

    /// Forgets every lock and fails every waiter of `ino` (the inode was freed).
    pub(crate) fn drop_inode(&self, ino: u32) {
        self.with_state(ino, false, |st| {
            st.posix = posix::PosixLocks::default();
            st.flock = flock::FlockLocks::default();
            for w in std::mem::take(&mut st.waiters) {
                self.unblock(&w);
                w.fail(Error::Stale);
            }
        });
        self.forget_idle(ino);
    }

    /// The locks held on `ino`, POSIX and OFD first, then flock ones as whole-file locks
    /// owned by `LockOwner::Ofd(file)` (for `/proc/locks`-like listings and tests).
    pub(crate) fn list(&self, ino: u32) -> (Vec<FileLock>, Vec<(u64, FlockOp)>) {
        self.with_state(ino, false, |st| (st.posix.all().to_vec(), st.flock.all())).unwrap_or_default()
    }

    /// Inodes with lock state, once idle ones are forgotten (tests: nothing is left behind).
    #[cfg(test)]
    fn live_contexts(&self, ino: u32) -> usize {
        self.forget_idle(ino);
        self.contexts.pin().len()
    }
}
