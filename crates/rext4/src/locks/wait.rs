//! A blocked lock request: it sleeps on its own condition variable until a release wakes it
//! to retry, the wait fails, or its [`Cancel`] fires.

use super::{FileLock, FlockOp, LockType};
use crate::error::Error;
use crate::sync::{Condvar, Mutex};
use std::sync::Arc;

/// What a waiter asked for.
#[derive(Clone, Copy, Debug)]
pub(super) enum Request {
    Posix(FileLock),
    Flock { file: u64, op: FlockOp },
}

impl Request {
    /// An unlock: it never waits and needs no lock state to exist.
    pub(super) fn is_release(&self) -> bool {
        matches!(
            self,
            Request::Posix(FileLock { kind: LockType::Unlock, .. })
                | Request::Flock { op: FlockOp::Unlock, .. }
        )
    }

    /// Whether both could not be held at once (two requests woken by one release).
    pub(super) fn conflicts(&self, o: &Request) -> bool {
        match (self, o) {
            (Request::Posix(a), Request::Posix(b)) => {
                a.owner != b.owner
                    && a.range().overlaps(&b.range())
                    && (a.kind == LockType::Write || b.kind == LockType::Write)
            }
            (Request::Flock { file: a, op: x }, Request::Flock { file: b, op: y }) => {
                a != b && (*x == FlockOp::Exclusive || *y == FlockOp::Exclusive)
            }
            _ => false,
        }
    }
}

/// How a wait ended.
#[derive(Debug)]
pub(super) enum Outcome {
    /// A release freed what the request needs: retry it.
    Woken,
    /// The wait failed (a deadlock found on a later conflict, or the inode freed).
    Failed(Error),
    /// Its [`Cancel`] fired.
    Cancelled,
}

pub(super) struct Waiter {
    pub id: u64,
    pub req: Request,
    /// How the wait ended; `None` while it goes on. [own mutex; innermost]
    outcome: Mutex<Option<Outcome>>,
    cv: Condvar,
}

impl Waiter {
    pub(super) fn new(id: u64, req: Request) -> Waiter {
        Waiter { id, req, outcome: Mutex::new(None), cv: Condvar::new() }
    }

    fn finish(&self, o: Outcome) {
        let mut g = self.outcome.lock();
        if g.is_none() {
            *g = Some(o);
            self.cv.notify_all();
        }
    }

    /// Its range was freed (by the releaser, which removed it from the waiters).
    pub(super) fn wake(&self) {
        self.finish(Outcome::Woken);
    }

    pub(super) fn fail(&self, e: Error) {
        self.finish(Outcome::Failed(e));
    }

    /// Sleeps until woken, failed or cancelled.
    pub(super) fn sleep(self: &Arc<Self>, cancel: Option<&Cancel>) -> Outcome {
        if let Some(c) = cancel {
            c.attach(self);
        }
        let mut g = self.outcome.lock();
        while g.is_none() {
            self.cv.wait(&mut g);
        }
        // Cannot fail: the loop above ends only once it is set.
        let o = g.take().unwrap();
        drop(g);
        if let Some(c) = cancel {
            c.detach();
        }
        o
    }
}

/// Cancels a blocked lock request from another thread (a signal, a FUSE interrupt, a
/// timeout): the request returns `EINTR` and leaves nothing behind. Cancelling before the
/// request blocks makes it fail as soon as it would block.
#[derive(Clone, Default)]
pub struct Cancel {
    inner: Arc<Mutex<CancelState>>,
}

#[derive(Default)]
struct CancelState {
    cancelled: bool,
    waiter: Option<Arc<Waiter>>,
}

impl std::fmt::Debug for Cancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cancel").field("cancelled", &self.is_cancelled()).finish()
    }
}

impl Cancel {
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Ends the wait this token guards (now or, if it has not started, as soon as it does).
    pub fn cancel(&self) {
        let mut s = self.inner.lock();
        s.cancelled = true;
        if let Some(w) = s.waiter.take() {
            w.finish(Outcome::Cancelled);
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.inner.lock().cancelled
    }

    fn attach(&self, w: &Arc<Waiter>) {
        let mut s = self.inner.lock();
        if s.cancelled {
            w.finish(Outcome::Cancelled);
        } else {
            s.waiter = Some(w.clone());
        }
    }

    fn detach(&self) {
        self.inner.lock().waiter = None;
    }
}
