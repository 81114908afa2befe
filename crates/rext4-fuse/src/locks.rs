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
//! A blocking `SETLKW` first tries without waiting; if it must wait, a thread of its own waits
//! and replies, so no FUSE worker is ever tied up by a lock.
//!
//! # Locking
//! One mutex per shard of the handle -> owners table; never held across an engine call.

use crate::adapter::{Adapter, R};
use fuser::{Errno, ReplyEmpty, ReplyLock};
use rext4::sync::Mutex;
use rext4::{FileLock, InodeNo, LockOwner, LockType, Wait};
use std::collections::HashMap;

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
}

impl Default for LockOwners {
    fn default() -> Self {
        LockOwners {
            by_handle: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            handles_of: Mutex::new(HashMap::new()),
        }
    }
}

impl LockOwners {
    fn shard(&self, fh: u64) -> &OwnersByHandle {
        &self.by_handle[fh as usize % SHARDS]
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
            .and_then(|(ino, l)| self.fs().getlk(ino, &l).map_err(|e| self.err("getlk", e)));
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
                let shared = self.shared.clone();
                // The wait may be long: it gets a thread of its own.
                let spawned = std::thread::Builder::new().name("rext4-setlkw".into()).spawn(move || {
                    match shared.fs.setlk(ino, &l, Wait::Forever) {
                        Ok(()) => reply.ok(),
                        Err(e) => reply.error(shared.policy.errno("setlkw", &e)),
                    }
                });
                if let Err(e) = spawned {
                    crate::log(&format!("setlkw: no thread to wait in: {e}"));
                }
            }
            Err(e) => reply.error(self.err("setlk", e)),
        }
    }

    /// `FLUSH`: the closer's POSIX locks on the inode go.
    pub(crate) fn flush_locks(&self, ino: InodeNo, owner: u64) {
        self.fs().release_posix_locks(ino, owner);
    }

    /// `RELEASE` of handle `fh`: owners that locked through it alone lose their locks.
    pub(crate) fn release_locks(&self, ino: InodeNo, fh: u64) {
        for owner in self.shared.lock_owners.close(fh) {
            self.fs().release_posix_locks(ino, owner);
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
    fn whole_file_ranges_map_to_the_engines_end() {
        let (_, l) = request(InodeNo(12), 5, 0, OFFSET_MAX, libc::F_WRLCK, 9).unwrap();
        assert_eq!((l.end, l.pid, l.kind), (u64::MAX, 9, LockType::Write));
        assert!(request(InodeNo(12), 5, 9, 3, libc::F_RDLCK, 0).is_err());
        assert!(request(InodeNo(12), 5, 0, 3, 77, 0).is_err());
    }
}
