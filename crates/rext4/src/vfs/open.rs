//! Open files: an [`OpenFile`] is an open file description. It holds its inode while open
//! (an unlinked open file stays readable and writable, and is freed on the last close),
//! carries its open flags and the credentials it was opened with, has an identity for OFD and
//! `flock` locks, and on its last close drops those locks and its hold.

use super::creds::Creds;
use super::permission::{mode_after_write, Access};
use crate::attr::Attr;
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::inode::write::SetAttr;
use crate::locks::{FileLock, FlockOp, LockOwner, Wait};
use crate::sync::Mutex;
use rext4_format::inode::{APPEND_FL, IMMUTABLE_FL};
use rext4_format::InodeNo;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

bitflags::bitflags! {
    /// How a file is opened (`open(2)` flags, by meaning rather than by number).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct OpenFlags: u32 {
        const READ = 1 << 0;
        const WRITE = 1 << 1;
        /// Every write goes to the end of the file (`O_APPEND`).
        const APPEND = 1 << 2;
        /// Cut the file to length 0 at open (`O_TRUNC`).
        const TRUNCATE = 1 << 3;
        /// Create the file if it does not exist (`O_CREAT`).
        const CREATE = 1 << 4;
        /// With `CREATE`: fail with `EEXIST` if it exists (`O_EXCL`).
        const EXCLUSIVE = 1 << 5;
        /// Do not update the access time (`O_NOATIME`).
        const NOATIME = 1 << 6;
        /// Fail unless the file is a directory (`O_DIRECTORY`).
        const DIRECTORY = 1 << 7;
        /// Fail with `ELOOP` if the final component is a symbolic link (`O_NOFOLLOW`).
        const NOFOLLOW = 1 << 8;
        /// Every write is durable before it returns (`O_SYNC`).
        const SYNC = 1 << 9;
    }
}

impl OpenFlags {
    /// The flags of an `open(2)` call's `flags` argument.
    pub fn from_libc(f: i32) -> OpenFlags {
        let mut o = match f & libc::O_ACCMODE {
            libc::O_WRONLY => OpenFlags::WRITE,
            libc::O_RDWR => OpenFlags::READ | OpenFlags::WRITE,
            _ => OpenFlags::READ,
        };
        for (bit, flag) in [
            (libc::O_APPEND, OpenFlags::APPEND),
            (libc::O_TRUNC, OpenFlags::TRUNCATE),
            (libc::O_CREAT, OpenFlags::CREATE),
            (libc::O_EXCL, OpenFlags::EXCLUSIVE),
            (libc::O_NOATIME, OpenFlags::NOATIME),
            (libc::O_DIRECTORY, OpenFlags::DIRECTORY),
            (libc::O_NOFOLLOW, OpenFlags::NOFOLLOW),
            (libc::O_SYNC, OpenFlags::SYNC),
        ] {
            if f & bit != 0 {
                o |= flag;
            }
        }
        o
    }

    pub fn reads(self) -> bool {
        self.contains(OpenFlags::READ)
    }

    pub fn writes(self) -> bool {
        self.contains(OpenFlags::WRITE)
    }
}

/// Identities of open file descriptions, unique in the process (OFD and flock lock owners).
static NEXT_FILE: AtomicU64 = AtomicU64::new(1);

struct Description {
    fs: Fs,
    ino: InodeNo,
    flags: OpenFlags,
    id: u64,
    creds: Creds,
    /// The file position `read`, `write` and `seek` share. [own mutex]
    pos: Mutex<u64>,
}

impl Drop for Description {
    fn drop(&mut self) {
        // The last close: OFD and flock locks go, then the hold (which frees an unlinked
        // inode). Errors here have no caller to go to; the hold is released regardless.
        self.fs.release_file_locks(self.ino, self.id);
        let _ = self.fs.release(self.ino);
    }
}

/// An open file description. Clones share it, as `dup(2)` does: the position, the flags and
/// the lock identity; the last clone dropped closes it.
#[derive(Clone)]
pub struct OpenFile {
    d: Arc<Description>,
}

impl std::fmt::Debug for OpenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenFile").field("ino", &self.d.ino).field("flags", &self.d.flags).finish()
    }
}

impl Fs {
    /// Opens inode `ino` for `c` (`open(2)` once the path is resolved): checks `may_open`,
    /// holds the inode, and truncates for `TRUNCATE`. `CREATE`, `EXCLUSIVE`, `DIRECTORY` and
    /// `NOFOLLOW` are for path-level opens ([`crate::UserFs::open`]).
    pub fn open_inode(&self, c: &Creds, ino: InodeNo, flags: OpenFlags) -> Result<OpenFile> {
        let a = self.getattr(ino)?;
        if flags.contains(OpenFlags::DIRECTORY) && a.kind != crate::FileType::Directory {
            return Err(Error::NotDir);
        }
        self.may_open(c, &a, flags)?;
        self.hold(ino)?;
        let f = OpenFile {
            d: Arc::new(Description {
                fs: self.clone(),
                ino,
                flags,
                id: NEXT_FILE.fetch_add(1, Ordering::Relaxed),
                creds: c.clone(),
                pos: Mutex::new(0),
            }),
        };
        if flags.contains(OpenFlags::TRUNCATE) && a.kind == crate::FileType::RegularFile && a.size != 0 {
            self.setattr(ino, &SetAttr { size: Some(0), ..SetAttr::default() })?;
        }
        Ok(f)
    }
}

impl OpenFile {
    pub fn ino(&self) -> InodeNo {
        self.d.ino
    }

    pub fn flags(&self) -> OpenFlags {
        self.d.flags
    }

    /// This description's identity: the owner of its OFD locks and of its flock lock.
    pub fn id(&self) -> u64 {
        self.d.id
    }

    pub fn creds(&self) -> &Creds {
        &self.d.creds
    }

    pub fn fs(&self) -> &Fs {
        &self.d.fs
    }

    /// Current attributes (`fstat`).
    pub fn metadata(&self) -> Result<Attr> {
        self.d.fs.getattr(self.d.ino)
    }

    fn need(&self, f: OpenFlags) -> Result<()> {
        if self.d.flags.contains(f) {
            Ok(())
        } else {
            // What the kernel answers for a read of a write-only descriptor and the reverse.
            Err(Error::Io(io::Error::from_raw_os_error(libc::EBADF)))
        }
    }

    /// `pread(2)`: sets the access time as the filesystem's [`crate::Options::atime`] says,
    /// unless the file was opened with `NOATIME`.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.need(OpenFlags::READ)?;
        if self.d.flags.contains(OpenFlags::NOATIME) {
            self.d.fs.read_noatime(self.d.ino, offset, buf)
        } else {
            self.d.fs.read(self.d.ino, offset, buf)
        }
    }

    /// `pwrite(2)`; with `APPEND` the data goes to the end whatever `offset` says (as Linux
    /// does). Returns where it went and the count. A writer without `CAP_FSETID` clears the
    /// file's set-ID bits first (`file_remove_privs`).
    pub fn write_at(&self, data: &[u8], offset: u64) -> Result<(u64, usize)> {
        self.need(OpenFlags::WRITE)?;
        let fs = &self.d.fs;
        // Only a writer without CAP_FSETID can lose the set-ID bits: the others skip reading
        // the attributes on every write.
        if !self.d.creds.has(super::creds::Caps::FSETID) {
            if let Some(mode) = mode_after_write(&self.d.creds, &self.metadata()?) {
                fs.setattr(self.d.ino, &SetAttr { mode: Some(mode), ..SetAttr::default() })?;
            }
        }
        let at = (!self.d.flags.contains(OpenFlags::APPEND)).then_some(offset);
        let r = self.d.creds.allocating(fs, || {
            fs.inner.op(crate::fs::stats::Op::Write, || fs.inner.write_at(self.d.ino, at, data))
        })?;
        if self.d.flags.contains(OpenFlags::SYNC) {
            fs.fsync(self.d.ino)?;
        }
        Ok(r)
    }

    /// Reads at the shared position and advances it.
    pub fn read(&self, buf: &mut [u8]) -> Result<usize> {
        let mut pos = self.d.pos.lock();
        let n = self.read_at(buf, *pos)?;
        *pos += n as u64;
        Ok(n)
    }

    /// Writes at the shared position (or the end, with `APPEND`) and advances it.
    pub fn write(&self, data: &[u8]) -> Result<usize> {
        let mut pos = self.d.pos.lock();
        let (at, n) = self.write_at(data, *pos)?;
        *pos = at + n as u64;
        Ok(n)
    }

    /// `lseek(2)` with `SEEK_SET`, `SEEK_CUR` or `SEEK_END`.
    pub fn seek(&self, to: io::SeekFrom) -> Result<u64> {
        let mut pos = self.d.pos.lock();
        let (base, d) = match to {
            io::SeekFrom::Start(p) => (p, 0),
            io::SeekFrom::Current(d) => (*pos, d),
            io::SeekFrom::End(d) => (self.metadata()?.size, d),
        };
        let p =
            base.checked_add_signed(d).ok_or(Error::InvalidInput("seek before the start or past the end"))?;
        *pos = p;
        Ok(p)
    }

    /// `ftruncate(2)`: `EINVAL` unless open for writing.
    pub fn set_len(&self, size: u64) -> Result<()> {
        // `ftruncate(2)`: EINVAL without write access, EPERM on an append-only or immutable
        // file; a caller without CAP_FSETID clears the set-ID bits, as a write does.
        if !self.d.flags.writes() {
            return Err(Error::InvalidInput("not open for writing"));
        }
        let a = self.metadata()?;
        if a.flags & (APPEND_FL | IMMUTABLE_FL) != 0 {
            return Err(Error::NotPermitted);
        }
        let mode = mode_after_write(&self.d.creds, &a);
        let ch = SetAttr { size: Some(size), mode, ..SetAttr::default() };
        self.d.creds.allocating(&self.d.fs, || self.d.fs.setattr(self.d.ino, &ch))?;
        Ok(())
    }

    /// `fsync(2)`.
    pub fn sync_all(&self) -> Result<()> {
        self.d.fs.fsync(self.d.ino)
    }

    /// `F_GETLK` for POSIX owner `owner`, or `F_OFD_GETLK` with `owner` `None`.
    pub fn getlk(&self, mut lock: FileLock, owner: Option<u64>) -> Result<Option<FileLock>> {
        lock.owner = self.owner(owner);
        self.d.fs.getlk(self.d.ino, &lock)
    }

    /// `F_SETLK`/`F_SETLKW` for POSIX owner `owner`, or the OFD forms with `owner` `None`.
    /// A read lock needs the file open for reading and a write lock for writing (`EBADF`).
    pub fn setlk(&self, mut lock: FileLock, owner: Option<u64>, wait: Wait<'_>) -> Result<()> {
        match lock.kind {
            crate::LockType::Read => self.need(OpenFlags::READ)?,
            crate::LockType::Write => self.need(OpenFlags::WRITE)?,
            crate::LockType::Unlock => {}
        }
        lock.owner = self.owner(owner);
        self.d.fs.setlk(self.d.ino, &lock, wait)
    }

    fn owner(&self, posix: Option<u64>) -> LockOwner {
        posix.map_or(LockOwner::Ofd(self.d.id), LockOwner::Posix)
    }

    /// `flock(2)` on this description.
    pub fn flock(&self, op: FlockOp, wait: Wait<'_>) -> Result<()> {
        self.d.fs.flock(self.d.ino, self.d.id, op, wait)
    }

    /// What `close(2)` of one descriptor does for POSIX owner `owner`: its POSIX locks on the
    /// inode go, whichever descriptor took them. The description itself closes when the
    /// last clone is dropped.
    pub fn close_posix(&self, owner: u64) {
        self.d.fs.release_posix_locks(self.d.ino, owner);
    }

    /// Whether `c` may do `want` to this file now (`faccessat` on an open file).
    pub fn access(&self, c: &Creds, want: Access) -> Result<()> {
        self.d.fs.access(c, &self.metadata()?, want)
    }
}
