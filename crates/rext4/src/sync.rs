//! The engine's locks: the standard library's futex locks behind the small API the engine
//! uses, without lock poisoning (a panic while a lock is held is a bug that aborts the
//! operation, not one that should wedge every later one).
//!
//! Why not `parking_lot`: its locks, when contended, call `sched_yield` up to seven times
//! before they sleep. On a machine with more runnable threads than cores (48 workers on 2
//! cores, or a commit racing 4 busy threads), each yield sends the thread behind every other
//! runnable one, for a time slice or more; on the fsync path the yields made up most of the p99
//! latency (docs/bench.md, "After futex locks and fsync-run commits"). The standard locks spin
//! briefly on the lock word and then sleep in the kernel until the holder's unlock wakes them.

use std::ops::{Deref, DerefMut};
use std::sync::{PoisonError, TryLockError};
use std::time::Duration;

pub use std::sync::{RwLockReadGuard, RwLockWriteGuard};

/// A mutual exclusion lock (`std::sync::Mutex` without poisoning).
#[derive(Default, Debug)]
pub struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

/// Holds a [`Mutex`]. Wraps the standard guard in an `Option` so that [`Condvar`] can wait on
/// it in place (the standard `Condvar` takes the guard by value).
pub struct MutexGuard<'a, T: ?Sized>(Option<std::sync::MutexGuard<'a, T>>);

impl<T> Mutex<T> {
    pub const fn new(value: T) -> Self {
        Mutex(std::sync::Mutex::new(value))
    }
}

impl<T: ?Sized> Mutex<T> {
    pub fn lock(&self) -> MutexGuard<'_, T> {
        MutexGuard(Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)))
    }

    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(g) => Some(MutexGuard(Some(g))),
            Err(TryLockError::Poisoned(p)) => Some(MutexGuard(Some(p.into_inner()))),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // Cannot fail: the guard is only `None` inside `Condvar::wait*`, which holds `&mut`.
        self.0.as_deref().unwrap()
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // Cannot fail: as in `deref`.
        self.0.as_deref_mut().unwrap()
    }
}

/// A condition variable for [`Mutex`].
#[derive(Default, Debug)]
pub struct Condvar(std::sync::Condvar);

impl Condvar {
    pub const fn new() -> Self {
        Condvar(std::sync::Condvar::new())
    }

    pub fn notify_all(&self) {
        self.0.notify_all();
    }

    /// Releases the lock, waits for a notification (or a spurious wake-up), and takes it again.
    pub fn wait<T>(&self, g: &mut MutexGuard<'_, T>) {
        // Cannot fail: a guard is `Some` outside this function and `wait_for`.
        let inner = g.0.take().unwrap();
        g.0 = Some(self.0.wait(inner).unwrap_or_else(PoisonError::into_inner));
    }

    /// As [`Condvar::wait`], for at most `d`.
    pub fn wait_for<T>(&self, g: &mut MutexGuard<'_, T>, d: Duration) {
        // Cannot fail: as in `wait`.
        let inner = g.0.take().unwrap();
        let (inner, _) = self.0.wait_timeout(inner, d).unwrap_or_else(PoisonError::into_inner);
        g.0 = Some(inner);
    }
}

/// A reader-writer lock (`std::sync::RwLock` without poisoning; a waiting writer holds back
/// new readers).
#[derive(Default, Debug)]
pub struct RwLock<T: ?Sized>(std::sync::RwLock<T>);

impl<T> RwLock<T> {
    pub const fn new(value: T) -> Self {
        RwLock(std::sync::RwLock::new(value))
    }
}

impl<T: ?Sized> RwLock<T> {
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
        match self.0.try_write() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_panic_under_the_lock_does_not_poison_it() {
        let m = Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let r = std::thread::spawn(move || {
            let _g = m2.lock();
            panic!("while holding");
        })
        .join();
        assert!(r.is_err());
        *m.lock() += 1;
        assert_eq!(*m.lock(), 2);
        let l = Arc::new(RwLock::new(1));
        let l2 = l.clone();
        assert!(std::thread::spawn(move || {
            let _g = l2.write();
            panic!("while writing");
        })
        .join()
        .is_err());
        assert_eq!(*l.read(), 1);
    }

    #[test]
    fn condvar_waits_in_place_and_times_out() {
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let p2 = pair.clone();
        let h = std::thread::spawn(move || {
            *p2.0.lock() = true;
            p2.1.notify_all();
        });
        let mut g = pair.0.lock();
        while !*g {
            pair.1.wait_for(&mut g, Duration::from_millis(50));
        }
        drop(g);
        h.join().unwrap();
        let mut g = pair.0.lock();
        let t = std::time::Instant::now();
        pair.1.wait_for(&mut g, Duration::from_millis(20));
        assert!(t.elapsed() >= Duration::from_millis(15));
        assert!(*g, "the guard is usable after a timed-out wait");
        assert!(pair.0.try_lock().is_none());
    }
}
