//! A blocked lock request: it sleeps on its own condition variable until a releaser grants it
//! (applying the lock on its behalf), fails it, or its [`Cancel`] fires.

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
    pub fn is_release(&self) -> bool {
        matches!(
            self,
            Request::Posix(FileLock { kind: LockType::Unlock, .. })
                | Request::Flock { op: FlockOp::Unlock, .. }
        )
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Waiting,
    Granted,
    Failed,
    Cancelled,
}

pub(super) struct Waiter {
    pub id: u64,
    pub req: Request,
    /// How the wait ended. [own mutex; innermost]
    outcome: Mutex<(Outcome, Option<Error>)>,
    cv: Condvar,
}

impl Waiter {
    pub fn new(id: u64, req: Request) -> Waiter {
        Waiter { id, req, outcome: Mutex::new((Outcome::Waiting, None)), cv: Condvar::new() }
    }

    fn finish(&self, o: Outcome, e: Option<Error>) {
        let mut g = self.outcome.lock();
        if g.0 == Outcome::Waiting {
            *g = (o, e);
            self.cv.notify_all();
        }
    }

    /// The lock was applied for this waiter (by the releaser, under the inode's lock state).
    pub fn grant(&self) {
        self.finish(Outcome::Granted, None);
    }

    /// The wait ends with `e` (a deadlock found on a later conflict, or the inode freed).
    pub fn fail(&self, e: Error) {
        self.finish(Outcome::Failed, Some(e));
    }

    pub fn is_granted(&self) -> bool {
        self.outcome.lock().0 == Outcome::Granted
    }

    /// Sleeps until granted (`Ok(true)`), failed (`Err`), or cancelled (`Ok(false)`).
    pub fn sleep(self: &Arc<Self>, cancel: Option<&Cancel>) -> Result<bool, Error> {
        if let Some(c) = cancel {
            c.attach(self);
        }
        let mut g = self.outcome.lock();
        while g.0 == Outcome::Waiting {
            self.cv.wait(&mut g);
        }
        let r = match g.0 {
            Outcome::Granted => Ok(true),
            Outcome::Failed => Err(g.1.take().unwrap_or(Error::Interrupted)),
            _ => Ok(false),
        };
        drop(g);
        if let Some(c) = cancel {
            c.detach();
        }
        r
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
            w.finish(Outcome::Cancelled, None);
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.inner.lock().cancelled
    }

    fn attach(&self, w: &Arc<Waiter>) {
        let mut s = self.inner.lock();
        if s.cancelled {
            w.finish(Outcome::Cancelled, None);
        } else {
            s.waiter = Some(w.clone());
        }
    }

    fn detach(&self) {
        self.inner.lock().waiter = None;
    }
}
