//! `-o locks=engine`: `fcntl` locks answered from the engine's lock table.
//!
//! The kernel sends `GETLK`/`SETLK`/`SETLKW` with a lock owner: for POSIX locks the caller's
//! file table, for OFD locks the open file. Both become engine POSIX owners (FUSE does not say
//! which kind a lock is), so OFD locks through the mount are also part of deadlock detection.
//! Locks kept by the daemon are invisible to the kernel's close path, so the adapter releases
//! them itself:
//! - `FLUSH` (each `close(2)`) carries the closer's file table: its POSIX locks on the inode go,
//!   as closing any descriptor does (the mount is opened without `FOPEN_NOFLUSH` for this);
//! - `RELEASE` (the last close of an open file) drops the locks of every owner that locked
//!   through that handle alone: an OFD owner is its one open file.
//!
//! `flock(2)` requests (`FUSE_LK_FLOCK`) become the engine's flock locks, owned by the open
//! file the kernel names, and go at that file's last close (`FUSE_RELEASE_FLOCK_UNLOCK`).
//!
//! A blocking request first tries without waiting; if it must wait, a thread of its own waits
//! and replies, so no FUSE worker is ever tied up by a lock. A `FUSE_INTERRUPT` for it (the
//! caller got a signal) cancels the wait, which replies `EINTR` and leaves nothing behind; an
//! interrupt that overtakes its request is kept until the request arrives.
//!
//! # Locking
//! One mutex per shard of the handle -> owners table; never held across an engine call.

use crate::adapter::{Adapter, R};
use fuser::{Errno, ReplyEmpty, ReplyLock};
use rext4::sync::Mutex;
use rext4::{Cancel, FileLock, FlockOp, InodeNo, LockOwner, LockType, Wait};
use std::collections::{HashMap, VecDeque};

/// Interrupts remembered for requests not seen yet.
const EARLY_INTERRUPTS: usize = 64;

const SHARDS: usize = 64;

/// The kernel's largest offset, which its whole-file locks end at.
const OFFSET_MAX: u64 = i64::MAX as u64;

/// Handle -> the owners that locked through it.
type OwnersByHandle = Mutex<HashMap<u64, Vec<u64>>>;

/// Lock owners seen on each open handle, and on how many handles each owner was seen.
pub(crate) struct LockOwners {
    /// Handle -> owners that locked through it. [each shard: its own mutex]
    by_handle: Box<[OwnersByHandle]>,
    /// Owner -> handles it locked through. [own mutex]
    handles_of: Mutex<HashMap<u64, u32>>,
    /// Waiting requests by FUSE request id, and interrupts that came before their request.
    /// [own mutex]
    waits: Mutex<Waits>,
}

#[derive(Default)]
struct Waits {
    pending: HashMap<u64, Cancel>,
    early: VecDeque<u64>,
}

impl Default for LockOwners {
    fn default() -> Self {
        LockOwners {
            by_handle: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            handles_of: Mutex::new(HashMap::new()),
            waits: Mutex::new(Waits::default()),
        }
    }
}

impl LockOwners {
    fn shard(&self, fh: u64) -> &OwnersByHandle {
        // The remainder is below SHARDS.
        &self.by_handle[usize::try_from(fh % SHARDS as u64).unwrap_or(0)]
    }

    /// Records that `owner` locked through handle `fh`.
    fn note(&self, fh: u64, owner: u64) {
        let mut s = self.shard(fh).lock();
        let v = s.entry(fh).or_default();
        if !v.contains(&owner) {
            v.push(owner);
            drop(s);
            *self.handles_of.lock().entry(owner).or_default() += 1;
        }
    }

    /// A cancel token for request `unique`'s wait, already fired if its interrupt came first.
    fn register(&self, unique: u64) -> Cancel {
        let c = Cancel::new();
        let mut w = self.waits.lock();
        if let Some(i) = w.early.iter().position(|&u| u == unique) {
            w.early.remove(i);
            c.cancel();
        }
        w.pending.insert(unique, c.clone());
        c
    }

    fn unregister(&self, unique: u64) {
        self.waits.lock().pending.remove(&unique);
    }

    /// `FUSE_INTERRUPT` for request `unique`.
    pub(crate) fn interrupt(&self, unique: u64) {
        let mut w = self.waits.lock();
        match w.pending.get(&unique) {
            Some(c) => c.cancel(),
            None => {
                // Its request may still be on its way (or long answered: then this is
                // never matched and ages out).
                if w.early.len() == EARLY_INTERRUPTS {
                    w.early.pop_front();
                }
                w.early.push_back(unique);
            }
        }
    }

    /// Forgets handle `fh`; returns the owners that locked through no other handle.
    fn close(&self, fh: u64) -> Vec<u64> {
        let Some(owners) = self.shard(fh).lock().remove(&fh) else { return Vec::new() };
        let mut all = self.handles_of.lock();
        owners
            .into_iter()
            .filter(|o| match all.get_mut(o) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                _ => {
                    all.remove(o);
                    true
                }
            })
            .collect()
    }
}

fn kind_of(typ: i32) -> R<LockType> {
    match typ {
        libc::F_RDLCK => Ok(LockType::Read),
        libc::F_WRLCK => Ok(LockType::Write),
        libc::F_UNLCK => Ok(LockType::Unlock),
        _ => Err(Errno::EINVAL),
    }
}

fn request(ino: InodeNo, owner: u64, start: u64, end: u64, typ: i32, pid: u32) -> R<(InodeNo, FileLock)> {
    let end = if end >= OFFSET_MAX { u64::MAX } else { end };
    if start > end {
        return Err(Errno::EINVAL);
    }
    let mut l = FileLock::new(kind_of(typ)?, start, end, LockOwner::Posix(owner));
    l.pid = pid;
    Ok((ino, l))
}

impl Adapter {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn do_getlk(
        &self,
        ino: InodeNo,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let r = request(ino, owner, start, end, typ, pid)
            .and_then(|(ino, l)| self.fs().getlk(ino, &l).map_err(|e| self.err(e)));
        match r {
            Ok(Some(c)) => {
                let typ = if c.kind == LockType::Read { libc::F_RDLCK } else { libc::F_WRLCK };
                reply.locked(c.start, c.end.min(OFFSET_MAX), typ, c.pid)
            }
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
            Err(e) => reply.error(e),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn do_setlk(
        &self,
        unique: u64,
        ino: InodeNo,
        fh: u64,
        owner: u64,
        (start, end): (u64, u64),
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let (ino, l) = match request(ino, owner, start, end, typ, pid) {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        if l.kind != LockType::Unlock {
            self.shared.lock_owners.note(fh, owner);
        }
        match self.fs().setlk(ino, &l, Wait::No) {
            Ok(()) => reply.ok(),
            Err(rext4::Error::WouldBlock) if sleep => {
                self.wait_in_thread(unique, "setlkw", reply, move |fs, w| fs.setlk(ino, &l, w))
            }
            Err(e) => reply.error(self.err(e)),
        }
    }

    /// `flock(2)` through the mount: the owner is the open file.
    pub(crate) fn do_flock(
        &self,
        unique: u64,
        ino: InodeNo,
        owner: u64,
        typ: i32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let op = match typ {
            libc::F_RDLCK => FlockOp::Shared,
            libc::F_WRLCK => FlockOp::Exclusive,
            libc::F_UNLCK => FlockOp::Unlock,
            _ => return reply.error(Errno::EINVAL),
        };
        match self.fs().flock(ino, owner, op, Wait::No) {
            Ok(()) => reply.ok(),
            Err(rext4::Error::WouldBlock) if sleep => {
                self.wait_in_thread(unique, "flock", reply, move |fs, w| fs.flock(ino, owner, op, w))
            }
            Err(e) => reply.error(self.err(e)),
        }
    }

    /// Waits for a lock on a thread of its own (the wait may be long) and replies from there;
    /// an interrupt of request `unique` ends the wait with `EINTR`.
    fn wait_in_thread(
        &self,
        unique: u64,
        op: &'static str,
        reply: ReplyEmpty,
        take: impl FnOnce(&rext4::Fs, Wait<'_>) -> rext4::Result<()> + Send + 'static,
    ) {
        let shared = self.shared.clone();
        let cancel = shared.lock_owners.register(unique);
        let spawned = std::thread::Builder::new().name("rext4-lockwait".into()).spawn(move || {
            let r = take(&shared.fs, Wait::Until(&cancel));
            shared.lock_owners.unregister(unique);
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(shared.policy.errno(op, &e)),
            }
        });
        if let Err(e) = spawned {
            self.shared.lock_owners.unregister(unique);
            crate::log(&format!("{op}: no thread to wait in: {e}"));
        }
    }

    /// `FLUSH`: the closer's POSIX locks on the inode go.
    pub(crate) fn flush_locks(&self, ino: InodeNo, owner: u64) {
        self.fs().release_posix_locks(ino, owner);
    }

    /// `RELEASE` of handle `fh`: owners that locked through it alone lose their locks, and
    /// the open file `flock_owner` (when the kernel says it took a flock lock) its flock.
    pub(crate) fn release_locks(&self, ino: InodeNo, fh: u64, flock_owner: Option<u64>) {
        for owner in self.shared.lock_owners.close(fh) {
            self.fs().release_posix_locks(ino, owner);
        }
        if let Some(owner) = flock_owner {
            if let Err(e) = self.fs().flock(ino, owner, FlockOp::Unlock, Wait::No) {
                crate::log(&format!("release of a flock lock on inode {ino}: {e}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_released_with_their_last_handle() {
        let o = LockOwners::default();
        o.note(1, 100); // a process's file table, through two handles
        o.note(2, 100);
        o.note(3, 7); // an OFD owner: one handle
        o.note(3, 7);
        assert_eq!(o.close(1), Vec::<u64>::new());
        assert_eq!(o.close(3), vec![7]);
        assert_eq!(o.close(2), vec![100]);
        assert_eq!(o.close(2), Vec::<u64>::new());
    }

    #[test]
    fn an_interrupt_cancels_its_wait_even_when_it_comes_first() {
        let o = LockOwners::default();
        let c = o.register(10);
        assert!(!c.is_cancelled());
        o.interrupt(10);
        assert!(c.is_cancelled());
        o.unregister(10);
        o.interrupt(11);
        assert!(o.register(11).is_cancelled(), "an interrupt overtaking its request");
        assert!(!o.register(12).is_cancelled());
        for u in 100..100 + EARLY_INTERRUPTS as u64 + 5 {
            o.interrupt(u);
        }
        assert_eq!(o.waits.lock().early.len(), EARLY_INTERRUPTS);
    }

    #[test]
    fn whole_file_ranges_map_to_the_engines_end() {
        let (_, l) = request(InodeNo(12), 5, 0, OFFSET_MAX, libc::F_WRLCK, 9).unwrap();
        assert_eq!((l.end, l.pid, l.kind), (u64::MAX, 9, LockType::Write));
        assert!(request(InodeNo(12), 5, 9, 3, libc::F_RDLCK, 0).is_err());
        assert!(request(InodeNo(12), 5, 0, 3, 77, 0).is_err());
    }
}
