//! The lock calls of [`Fs`], shaped like `fcntl(2)` and `flock(2)`. Callers with open files
//! usually go through [`crate::OpenFile`], which supplies the owners and releases on close.

use super::{FileLock, FlockOp, LockOwner, Wait};
use crate::error::{Error, Result};
use crate::fs::stats::Op;
use crate::fs::Fs;
use rext4_format::InodeNo;

impl Fs {
    fn lockable(&self, ino: InodeNo) -> Result<()> {
        if self.inner.ino_in_range(ino) {
            Ok(())
        } else {
            Err(Error::Stale)
        }
    }

    /// The first lock that would block `req` (`F_GETLK` / `F_OFD_GETLK`), or `None` if it
    /// could be taken now. An unlock request asks an OFD owner about its own locks: the first
    /// of them in the range (`F_OFD_GETLK` with `F_UNLCK`); a POSIX owner may not ask it
    /// (`EINVAL`, as `F_GETLK` answers).
    pub fn getlk(&self, ino: InodeNo, req: &FileLock) -> Result<Option<FileLock>> {
        self.inner.op(Op::Getlk, || {
            self.lockable(ino)?;
            let req = check_range(req)?;
            if req.kind == crate::LockType::Unlock && matches!(req.owner, LockOwner::Posix(_)) {
                // `F_GETLK` of `F_UNLCK` is EINVAL in the kernel.
                return Err(Error::InvalidInput("F_GETLK of an unlock"));
            }
            Ok(self.inner.locks.getlk(ino.0, &req))
        })
    }

    /// Takes, converts or releases a byte-range lock (`F_SETLK`, or `F_SETLKW` with a
    /// waiting `wait`; the OFD forms with a [`LockOwner::Ofd`] owner). `EAGAIN` when it
    /// conflicts and may not wait, `EDEADLK` when waiting would deadlock, `EINTR` when
    /// cancelled.
    pub fn setlk(&self, ino: InodeNo, req: &FileLock, wait: Wait<'_>) -> Result<()> {
        self.inner.op(Op::Setlk, || {
            self.lockable(ino)?;
            let req = check_range(req)?;
            self.inner.locks.setlk(ino.0, &req, wait)
        })
    }

    /// Takes, converts or releases open file `file`'s whole-file lock (`flock(2)`);
    /// `EWOULDBLOCK` when it conflicts and may not wait.
    pub fn flock(&self, ino: InodeNo, file: u64, op: FlockOp, wait: Wait<'_>) -> Result<()> {
        self.inner.op(Op::Flock, || {
            self.lockable(ino)?;
            self.inner.locks.flock(ino.0, file, op, wait)
        })
    }

    /// Drops every POSIX lock `owner` holds on `ino`: what closing any file of the inode does
    /// to its process's locks.
    pub fn release_posix_locks(&self, ino: InodeNo, owner: u64) {
        self.inner.locks.release_owner(ino.0, LockOwner::Posix(owner));
    }

    /// Drops open file `file`'s OFD and flock locks on `ino`: what its last close does.
    pub fn release_file_locks(&self, ino: InodeNo, file: u64) {
        self.inner.locks.release_owner(ino.0, LockOwner::Ofd(file));
        self.inner.locks.release_flock(ino.0, file);
    }

    /// The byte-range and flock locks held on `ino` (as `/proc/locks` lists them).
    pub fn file_locks(&self, ino: InodeNo) -> (Vec<FileLock>, Vec<(u64, FlockOp)>) {
        self.inner.locks.list(ino.0)
    }

    /// How many lock requests wait on `ino` (the blocked entries `/proc/locks` lists).
    pub fn lock_waiters(&self, ino: InodeNo) -> usize {
        self.inner.locks.waiting(ino.0)
    }
}

/// The request as the kernel takes it: offsets stop at `i64::MAX` (a start past it is
/// `EINVAL`; a range reaching it runs to the end of the file, however it grows).
fn check_range(req: &FileLock) -> Result<FileLock> {
    const OFFSET_MAX: u64 = i64::MAX.cast_unsigned();
    if req.start > req.end {
        return Err(Error::InvalidInput("lock range ends before it starts"));
    }
    if req.start > OFFSET_MAX {
        return Err(Error::InvalidInput("lock start past the largest offset"));
    }
    let end = if req.end >= OFFSET_MAX { u64::MAX } else { req.end };
    Ok(FileLock { end, ..*req })
}
