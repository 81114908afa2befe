//! The `fuser::Filesystem` implementation: every FUSE request becomes one engine call.
//!
//! Requests arrive on several worker threads at once (one cloned `/dev/fuse` fd each) and go
//! straight to the engine, which has no filesystem-wide lock; the adapter adds only the sharded
//! lookup-count and handle tables (see handles.rs).
//!
//! # Caching
//! The daemon is the image's only writer, so entries and attributes are given long timeouts
//! and files and directories are opened with `FOPEN_KEEP_CACHE` / `FOPEN_CACHE_DIR`: every
//! change goes through this mount, and the kernel invalidates what each change touches.
//! Missing names are answered with a negative entry (node id 0) that the kernel caches too.
//!
//! # Lookup counts
//! Each reply carrying an entry adds one lookup before it is sent; see handles.rs.

use crate::attr::{
    decode_dev, engine_ino, file_attr, fuse_type, negative_attr, stat_attr, time_set, visible,
};
use crate::errno::ErrorPolicy;
use crate::handles::{FileHandles, LookupCounts, Transition};
use crate::options::{LockMode, MountOptions};
use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use rext4::format::inode::APPEND_FL;
use rext4::{Attr, Caps, Creds, FileType, Fs, InodeNo, SetAttr, TimeSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How long the kernel may trust entries and attributes without asking again.
pub(crate) const TTL: Duration = Duration::from_secs(24 * 3600);
/// Largest request payload: 1 MiB reads and writes.
const MAX_IO: u32 = 1 << 20;
/// `copy_file_range` moves data through a buffer of this size.
const COPY_CHUNK: usize = 1 << 20;
/// Most bytes one `copy_file_range` request copies (the reply carries a 32-bit count).
const COPY_MAX: u64 = 1 << 30;

const S_IFMT: u32 = libc::S_IFMT;

// `FS_IOC_GETFLAGS` / `FS_IOC_SETFLAGS` / `FS_IOC_GETVERSION`, with the argument sizes of 64-
// and 32-bit callers (the kernel's fileattr calls use the latter).
const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
const FS_IOC32_GETFLAGS: u32 = 0x8004_6601;
const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
const FS_IOC32_SETFLAGS: u32 = 0x4004_6602;
const FS_IOC_FSGETXATTR: u32 = 0x801C_581F;
const FS_IOC_FSSETXATTR: u32 = 0x401C_5820;
const FS_IOC_GETVERSION: u32 = 0x8008_7601;

/// The supplementary groups of process `pid` (`Groups:` in /proc/PID/status), which a FUSE
/// request does not carry; none if the process is gone or unreadable.
fn supplementary_groups(pid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return Vec::new() };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| g.split_whitespace().filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_default()
}

/// Inode flags and the `FS_XFLAG_*` bits `fsxattr` shows them as (`fileattr_fill_flags`).
const XFLAG_MAP: [(u32, u32); 7] = [
    (0x0000_0008, 0x0000_0020), // sync
    (0x0000_0010, 0x0000_0008), // immutable
    (0x0000_0020, 0x0000_0010), // append
    (0x0000_0040, 0x0000_0080), // nodump
    (0x0000_0080, 0x0000_0040), // noatime
    (0x0200_0000, 0x0000_8000), // dax
    (0x2000_0000, 0x0000_0200), // project inherit
];

fn flags_to_xflags(flags: u32) -> u32 {
    XFLAG_MAP.iter().filter(|&&(f, _)| flags & f != 0).fold(0, |x, &(_, b)| x | b)
}

fn xflags_to_flags(xflags: u32) -> u32 {
    XFLAG_MAP.iter().filter(|&&(_, b)| xflags & b != 0).fold(0, |f, &(b, _)| f | b)
}
const FS_IOC32_GETVERSION: u32 = 0x8004_7601;

/// State shared by the workers and by the mount after they stop.
pub(crate) struct Shared {
    pub fs: Fs,
    pub lookups: LookupCounts,
    pub handles: FileHandles,
    pub policy: ErrorPolicy,
    pub opts: MountOptions,
    /// Whether the kernel took `FUSE_POSIX_ACL` and `FUSE_DONT_MASK` at init (acl.rs).
    pub acls: std::sync::atomic::AtomicBool,
    /// Who locked through which handle, for `-o locks=engine` (locks.rs).
    pub lock_owners: crate::locks::LockOwners,
}

impl Shared {
    /// Releases every inode the kernel still knew (at unmount, when no forget will come).
    pub(crate) fn release_all(&self) {
        for ino in self.lookups.drain() {
            // Keys are engine inode numbers (see `lookups.add`): they fit.
            let Ok(n) = u32::try_from(ino) else { continue };
            if let Err(e) = self.fs.release(InodeNo(n)) {
                crate::log(&format!("release of inode {ino} at unmount: {e}"));
            }
        }
    }
}

/// The FUSE filesystem over one engine [`Fs`].
pub(crate) struct Adapter {
    pub shared: Arc<Shared>,
}

pub(crate) type R<T> = Result<T, Errno>;

fn ino_of(ino: INodeNo) -> R<InodeNo> {
    engine_ino(ino).ok_or(Errno::ENOENT)
}

fn name_of(name: &OsStr) -> R<&[u8]> {
    let n = name.as_bytes();
    if n.len() > 255 {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(n)
}

impl Adapter {
    /// Runs one request's work, keeping the worker thread alive if it panics (a bug): the
    /// reply, dropped unsent, answers EIO (fuser does that), and the panic is logged. A panic
    /// with a journal handle open has aborted the journal by then, so the image keeps its
    /// last commit and the mount turns read-only; the daemon goes on serving.
    fn guard(&self, op: &str, f: impl FnOnce()) {
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            crate::log(&format!("bug: {op} panicked ({msg}); the request got EIO"));
        }
    }

    pub(crate) fn fs(&self) -> &Fs {
        &self.shared.fs
    }

    pub(crate) fn err(&self, op: &str, e: rext4::Error) -> Errno {
        self.shared.policy.errno(op, &e)
    }

    /// Fails with `EROFS` unless changes are allowed.
    fn writable(&self) -> R<()> {
        if !self.fs().is_writable() {
            return Err(Errno::EROFS);
        }
        Ok(())
    }

    /// Counts one lookup of `ino`, holding it in the engine on the first.
    fn take_lookup(&self, ino: InodeNo) -> R<()> {
        if self.shared.lookups.add(u64::from(ino.0)) == Transition::Hold {
            if let Err(e) = self.fs().hold(ino) {
                self.shared.lookups.sub(u64::from(ino.0), 1);
                return Err(self.err("hold", e));
            }
        }
        Ok(())
    }

    fn forget_one(&self, ino: INodeNo, n: u64) {
        let Some(e) = engine_ino(ino) else { return };
        if self.shared.lookups.sub(u64::from(e.0), n) == Transition::Release {
            if let Err(err) = self.fs().release(e) {
                self.shared.policy.errno("forget", &err);
                crate::log(&format!("release of inode {e}: {err}"));
            }
        }
    }

    fn entry(&self, r: R<Attr>, reply: ReplyEntry) {
        match r.and_then(|a| self.take_lookup(a.ino).map(|()| a)) {
            Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(u64::from(a.generation))),
            Err(e) => reply.error(e),
        }
    }

    /// The caller as the engine's VFS layer sees it, for what the kernel has not checked
    /// itself: with `default_permissions` every permission check is the kernel's (and so is
    /// the set-group-ID stripping of new files), so the caller passes them all.
    fn creds(&self, req: &Request) -> Creds {
        Creds::user(req.uid(), req.gid(), &[]).with_caps(Caps::all())
    }

    /// Owner and mode of a new inode in `parent` (`inode_init_owner`, in the engine).
    fn new_owner(&self, req: &Request, parent: InodeNo, mode: u16, is_dir: bool) -> R<(u16, u32, u32)> {
        let p = self.fs().getattr(parent).map_err(|e| self.err("getattr", e))?;
        if p.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        let kind = if is_dir { rext4::format::inode::S_IFDIR } else { rext4::format::inode::S_IFREG };
        let (m, uid, gid) = rext4::init_owner(&self.creds(req), &p, kind | mode, self.shared.opts.grpid);
        Ok((m & 0o7777, uid, gid))
    }

    fn attr(&self, ino: INodeNo) -> R<Attr> {
        self.fs().getattr(ino_of(ino)?).map_err(|e| self.err("getattr", e))
    }

    fn do_setattr(&self, ino: InodeNo, ch: &SetAttr) -> R<Attr> {
        if *ch == SetAttr::default() {
            return self.fs().getattr(ino).map_err(|e| self.err("getattr", e));
        }
        self.writable()?;
        // With the writeback cache the kernel keeps a file's modification time while it
        // writes and flushes it later as a setattr of that time alone (`fuse_flush_times`):
        // that is the write's own time update, which an append-only file allows.
        if let (
            true,
            SetAttr {
                mtime: Some(TimeSet::At(t)),
                atime: None,
                mode: None,
                uid: None,
                gid: None,
                size: None,
            },
        ) = (self.shared.opts.writeback_cache, ch)
        {
            let a = self.fs().getattr(ino).map_err(|e| self.err("getattr", e))?;
            if a.flags & APPEND_FL != 0 {
                return self.fs().update_write_time(ino, *t).map_err(|e| self.err("setattr", e));
            }
        }
        self.fs().setattr(ino, ch).map_err(|e| self.err("setattr", e))
    }

    fn do_open(&self, req: &Request, ino: INodeNo, flags: OpenFlags) -> R<(u64, FopenFlags)> {
        let e = ino_of(ino)?;
        let acc = flags.0 & libc::O_ACCMODE;
        if acc != libc::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            self.writable()?;
            // `may_open` in the engine: the kernel knows nothing of ext4's flags on a FUSE
            // inode. With the writeback cache the kernel keeps `O_APPEND` to itself (it
            // places the writes), so only writes that would change bytes are refused
            // (`append_only_tail`).
            let mut f = rext4::OpenFlags::from_libc(flags.0);
            if self.shared.opts.writeback_cache {
                f |= rext4::OpenFlags::APPEND;
            }
            let a = self.attr(ino)?;
            self.fs().may_open(&self.creds(req), &a, f).map_err(|err| self.err("open", err))?;
        }
        // No FUSE_ATOMIC_O_TRUNC: the kernel truncates with a SETATTR once the VFS has made
        // its checks (`handle_truncate`: a running executable is ETXTBSY and keeps its bytes).
        let fh = self.shared.handles.open(u64::from(e.0), flags.0);
        Ok((fh, self.open_flags()))
    }

    /// How files are opened: kept in the kernel's cache, and closed without a `FLUSH`
    /// unless the engine keeps the locks (a close must then drop the closer's, locks.rs).
    fn open_flags(&self) -> FopenFlags {
        match self.shared.opts.locks {
            LockMode::Kernel => FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
            LockMode::Engine => FopenFlags::FOPEN_KEEP_CACHE,
        }
    }

    /// The ioctls `lsattr` and `chattr` use (through the kernel's fileattr calls, which have
    /// checked ownership and, for the immutable and append-only flags, CAP_LINUX_IMMUTABLE)
    /// and `FS_IOC_GETVERSION`; the reply's bytes.
    fn do_ioctl(&self, ino: INodeNo, cmd: u32, input: &[u8]) -> R<Vec<u8>> {
        let e = ino_of(ino)?;
        let word = |at: usize| -> R<u32> {
            let b = input.get(at..at + 4).ok_or(Errno::EINVAL)?;
            Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let visible = |a: &Attr| a.flags & rext4::FL_USER_VISIBLE;
        match cmd {
            FS_IOC_GETFLAGS | FS_IOC32_GETFLAGS => {
                Ok(u64::from(visible(&self.attr(ino)?)).to_le_bytes().to_vec())
            }
            FS_IOC_GETVERSION | FS_IOC32_GETVERSION => {
                // An int, as ext4 `put_user`s it: the kernel copies the whole reply into the
                // caller's buffer, whatever the size in the ioctl number says.
                Ok(self.attr(ino)?.generation.to_le_bytes().to_vec())
            }
            FS_IOC_SETFLAGS | FS_IOC32_SETFLAGS => {
                let flags = word(0)?;
                self.writable()?;
                self.fs().set_flags(e, flags).map_err(|err| self.err("setflags", err))?;
                Ok(Vec::new())
            }
            FS_IOC_FSGETXATTR => {
                // struct fsxattr: xflags, extsize, nextents, projid, cowextsize, 8 pad bytes.
                let mut out = vec![0u8; 28];
                out[0..4].copy_from_slice(&flags_to_xflags(visible(&self.attr(ino)?)).to_le_bytes());
                Ok(out)
            }
            FS_IOC_FSSETXATTR => {
                let (xflags, projid) = (word(0)?, word(12)?);
                if projid != 0 {
                    // No project quotas here: every inode's project is 0.
                    return Err(Errno::EOPNOTSUPP);
                }
                self.writable()?;
                let old = visible(&self.attr(ino)?);
                let flags = (old & !XFLAG_MAP.iter().fold(0, |m, &(f, _)| m | f)) | xflags_to_flags(xflags);
                self.fs().set_flags(e, flags).map_err(|err| self.err("fssetxattr", err))?;
                Ok(Vec::new())
            }
            _ => Err(Errno::ENOTTY),
        }
    }

    /// What of a write to an append-only file is new: the engine takes such writes only past
    /// the end, but with the writeback cache the kernel writes whole pages back, so the
    /// bytes before the end come again (without it, nothing to do: no attribute read on the
    /// write path). They are dropped where they are what the file holds
    /// (nothing is overwritten); a write that would change them is `EPERM`.
    fn append_only_tail<'a>(&self, ino: INodeNo, offset: u64, data: &'a [u8]) -> R<(u64, &'a [u8])> {
        if !self.shared.opts.writeback_cache {
            // The kernel places every write itself: nothing comes twice.
            return Ok((offset, data));
        }
        let a = self.attr(ino)?;
        if a.flags & APPEND_FL == 0 || offset >= a.size {
            return Ok((offset, data));
        }
        let overlap = usize::try_from(a.size - offset).map_or(data.len(), |n| n.min(data.len()));
        let mut have = vec![0u8; overlap];
        let got = self.fs().read(ino_of(ino)?, offset, &mut have).map_err(|e| self.err("write", e))?;
        if got != overlap || have != data[..overlap] {
            return Err(Errno::EPERM);
        }
        Ok((a.size, &data[overlap..]))
    }

    fn do_xattr_reply(data: Vec<u8>, size: u32, reply: ReplyXattr) {
        if size == 0 {
            match u32::try_from(data.len()) {
                Ok(n) => reply.size(n),
                Err(_) => reply.error(Errno::E2BIG),
            }
        } else if data.len() > size as usize {
            reply.error(Errno::ERANGE);
        } else {
            reply.data(&data);
        }
    }

    fn do_copy(&self, src: InodeNo, mut off_in: u64, dst: InodeNo, mut off_out: u64, len: u64) -> R<u64> {
        self.writable()?;
        let mut left = len.min(COPY_MAX);
        let mut buf = vec![0u8; usize::try_from(left).map_or(COPY_CHUNK, |l| l.min(COPY_CHUNK))];
        let mut done = 0u64;
        while left > 0 {
            let want = usize::try_from(left).map_or(buf.len(), |l| l.min(buf.len()));
            let n =
                self.fs().read(src, off_in, &mut buf[..want]).map_err(|e| self.err("copy_file_range", e))?;
            if n == 0 {
                break;
            }
            let mut put = 0;
            while put < n {
                let w = self
                    .fs()
                    .write(dst, off_out + put as u64, &buf[put..n])
                    .map_err(|e| self.err("copy_file_range", e))?;
                if w == 0 {
                    return Err(Errno::EIO);
                }
                put += w;
            }
            done += n as u64;
            left -= n as u64;
            off_in += n as u64;
            off_out += n as u64;
        }
        Ok(done)
    }

    /// `access(2)` when the kernel does not check (no `default_permissions`): the engine's
    /// `generic_permission` for the caller with its supplementary groups (which a FUSE
    /// request does not carry: read from /proc) and root's capabilities if it is root.
    fn check_access(&self, req: &Request, a: &Attr, mask: AccessFlags) -> R<()> {
        let want = rext4::Access::from_bits_truncate((mask.bits() & 7).unsigned_abs());
        if want.contains(rext4::Access::WRITE) {
            self.writable()?;
        }
        if want.is_empty() {
            return Ok(());
        }
        let c = Creds::user(req.uid(), req.gid(), &supplementary_groups(req.pid()));
        self.fs().access(&c, a, want).map_err(|e| self.err("access", e))
    }
}

impl Filesystem for Adapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        negotiate(config, self.shared.opts.writeback_cache);
        self.negotiate_acl(config);
        let locks = InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS;
        if self.shared.opts.locks == LockMode::Engine && config.add_capabilities(locks).is_err() {
            crate::log("locks=engine: this kernel does not pass locks on; it keeps them itself");
        }
        Ok(())
    }

    fn destroy(&mut self) {
        self.shared.release_all();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.guard("lookup", || {
            let r = (|| {
                let p = ino_of(parent)?;
                let n = name_of(name)?;
                match self.fs().lookup(p, n) {
                    Ok(a) if !visible(a.ino) => Err(Errno::from_i32(libc::EUCLEAN)),
                    Ok(a) => Ok(Some(a)),
                    Err(rext4::Error::NotFound) => Ok(None),
                    Err(e) => Err(self.err("lookup", e)),
                }
            })();
            match r {
                Ok(Some(a)) => self.entry(Ok(a), reply),
                // A negative entry the kernel may cache: node id 0 with a timeout.
                Ok(None) => reply.entry(&TTL, &negative_attr(), Generation(0)),
                Err(e) => reply.error(e),
            }
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.guard("forget", || {
            self.forget_one(ino, nlookup);
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.guard("getattr", || match self.attr(ino) {
            Ok(a) => reply.attr(&TTL, &stat_attr(&a)),
            Err(e) => reply.error(e),
        });
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.guard("setattr", || {
            let r = ino_of(ino).and_then(|e| {
                let ch = SetAttr {
                    mode: mode.map(|m| (m & 0o7777) as u16),
                    uid,
                    gid,
                    atime: atime.map(time_set),
                    mtime: mtime.map(time_set),
                    size,
                };
                self.synced(e, self.do_setattr(e, &ch))
            });
            match r {
                Ok(a) => reply.attr(&TTL, &stat_attr(&a)),
                Err(e) => reply.error(e),
            }
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.guard("readlink", || {
            match ino_of(ino).and_then(|e| self.fs().readlink(e).map_err(|err| self.err("readlink", err))) {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(e),
            }
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.guard("mknod", || {
            let r = (|| {
                self.writable()?;
                let (p, n) = (ino_of(parent)?, name_of(name)?);
                let acl = self.new_inode_acl(p, (mode & 0o7777) as u16, umask, false)?;
                let (m, uid, gid) = self.new_owner(req, p, acl.initial_mode(), false)?;
                let kind = mode & S_IFMT;
                let r = if kind == libc::S_IFREG || kind == 0 {
                    self.fs().create(p, n, m, uid, gid)
                } else {
                    self.fs().mknod(p, n, kind as u16 | m, decode_dev(rdev), uid, gid)
                };
                let a = r.map_err(|e| self.err("mknod", e))?;
                self.dir_synced(p, self.store_inherited_acl(p, n, a, &acl, false))
            })();
            self.entry(r, reply);
        });
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        self.guard("mkdir", || {
            let r = (|| {
                self.writable()?;
                let (p, n) = (ino_of(parent)?, name_of(name)?);
                let acl = self.new_inode_acl(p, (mode & 0o7777) as u16, umask, true)?;
                let (m, uid, gid) = self.new_owner(req, p, acl.initial_mode(), true)?;
                let a = self.fs().mkdir(p, n, m, uid, gid).map_err(|e| self.err("mkdir", e))?;
                self.dir_synced(p, self.store_inherited_acl(p, n, a, &acl, true))
            })();
            self.entry(r, reply);
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.guard("unlink", || {
            let r = (|| {
                self.writable()?;
                let p = ino_of(parent)?;
                self.dir_synced(p, self.fs().unlink(p, name_of(name)?).map_err(|e| self.err("unlink", e)))
            })();
            reply_empty(r, reply);
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.guard("rmdir", || {
            let r = (|| {
                self.writable()?;
                let p = ino_of(parent)?;
                self.dir_synced(p, self.fs().rmdir(p, name_of(name)?).map_err(|e| self.err("rmdir", e)))
            })();
            reply_empty(r, reply);
        });
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        self.guard("symlink", || {
            let r = (|| {
                self.writable()?;
                let (p, n) = (ino_of(parent)?, name_of(link_name)?);
                let (_, uid, gid) = self.new_owner(req, p, 0o777, false)?;
                let t = target.as_os_str().as_bytes();
                self.dir_synced(p, self.fs().symlink(p, n, t, uid, gid).map_err(|e| self.err("symlink", e)))
            })();
            self.entry(r, reply);
        });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.guard("rename", || {
            let r = (|| {
                self.writable()?;
                let mut f = 0;
                if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                    f |= rext4::RENAME_NOREPLACE;
                }
                if flags.contains(RenameFlags::RENAME_EXCHANGE) {
                    f |= rext4::RENAME_EXCHANGE;
                }
                if flags.contains(RenameFlags::RENAME_WHITEOUT) {
                    f |= rext4::RENAME_WHITEOUT;
                }
                let (op, on) = (ino_of(parent)?, name_of(name)?);
                let (np, nn) = (ino_of(newparent)?, name_of(newname)?);
                // A whiteout's owner, as a new file's in the old directory.
                let (uid, gid) = match f & rext4::RENAME_WHITEOUT {
                    0 => (0, 0),
                    _ => self.new_owner(req, op, 0, false).map(|(_, u, g)| (u, g))?,
                };
                let r = self.fs().rename_as(op, on, np, nn, f, uid, gid).map_err(|e| self.err("rename", e));
                self.dir_synced(np, self.dir_synced(op, r))
            })();
            reply_empty(r, reply);
        });
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        self.guard("link", || {
            let r = (|| {
                self.writable()?;
                let (i, p, n) = (ino_of(ino)?, ino_of(newparent)?, name_of(newname)?);
                self.dir_synced(p, self.fs().link(i, p, n).map_err(|e| self.err("link", e)))
            })();
            self.entry(r, reply);
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.guard("open", || match self.do_open(req, ino, flags) {
            Ok((fh, f)) => reply.opened(FileHandle(fh), f),
            Err(e) => reply.error(e),
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.guard("read", || {
            let r = ino_of(ino).and_then(|e| {
                let mut buf = vec![0u8; size.min(MAX_IO) as usize];
                let n = self.fs().read(e, offset, &mut buf).map_err(|err| self.err("read", err))?;
                buf.truncate(n);
                Ok(buf)
            });
            match r {
                Ok(b) => reply.data(&b),
                Err(e) => reply.error(e),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.guard("write", || {
            let r = (|| {
                self.writable()?;
                let e = ino_of(ino)?;
                let (at, rest) = self.append_only_tail(ino, offset, data)?;
                let mut n = data.len() - rest.len();
                if !rest.is_empty() {
                    n += self.fs().write(e, at, rest).map_err(|err| self.err("write", err))?;
                }
                u32::try_from(n).map_err(|_| Errno::EIO)
            })();
            match r {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(e),
            }
        });
    }

    fn flush(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, lock_owner: LockOwner, reply: ReplyEmpty) {
        self.guard("flush", || {
            // Writes reach the engine synchronously; there is nothing to push at close, but
            // the closer's POSIX locks go (sent only with locks=engine, see open_flags).
            if let Some(e) = engine_ino(ino) {
                self.flush_locks(e, lock_owner.0);
            }
            reply.ok();
        });
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.guard("release", || {
            self.shared.handles.close(fh.0);
            if let Some(e) = engine_ino(ino) {
                self.release_locks(e, fh.0, lock_owner.map(|o| o.0));
            }
            reply.ok();
        });
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: fuser::ReplyLock,
    ) {
        self.guard("getlk", || match ino_of(ino) {
            Ok(e) => self.do_getlk(e, lock_owner.0, start, end, typ, pid, reply),
            Err(err) => reply.error(err),
        });
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        self.guard("setlk", || match ino_of(ino) {
            Ok(e) => {
                self.do_setlk(req.unique().0, e, fh.0, lock_owner.0, (start, end), typ, pid, sleep, reply)
            }
            Err(err) => reply.error(err),
        });
    }

    fn flock(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        typ: i32,
        _pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        self.guard("flock", || match ino_of(ino) {
            Ok(e) => self.do_flock(req.unique().0, e, lock_owner.0, typ, sleep, reply),
            Err(err) => reply.error(err),
        });
    }

    fn interrupt(&self, _req: &Request, unique: fuser::RequestId) {
        self.shared.lock_owners.interrupt(unique.0);
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.guard("fsync", || {
            let r = ino_of(ino).and_then(|e| self.fs().fsync(e).map_err(|err| self.err("fsync", err)));
            reply_empty(ro_ok(r), reply);
        });
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.guard("opendir", || match ino_of(ino) {
            Ok(e) => {
                let fh = self.shared.handles.open(u64::from(e.0), flags.0);
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR);
            }
            Err(e) => reply.error(e),
        });
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        self.guard("readdir", || {
            let r = ino_of(ino).and_then(|dir| {
                let mut failed = None;
                let res = self.fs().readdir(dir, offset, |e| {
                    if !visible(e.ino) {
                        return true;
                    }
                    let kind = match e.kind {
                        Some(k) => k,
                        None => match self.fs().getattr(e.ino) {
                            Ok(a) => a.kind,
                            // Removed since the entry was read: leave it out.
                            Err(rext4::Error::NotFound) => return true,
                            Err(err) => {
                                failed = Some(self.err("readdir", err));
                                return false;
                            }
                        },
                    };
                    // `d_ino` is the ext4 number (the root's `.` and `..` show 2, as `st_ino` does).
                    !reply.add(
                        INodeNo(u64::from(e.ino.0)),
                        e.next,
                        fuse_type(kind),
                        OsStr::from_bytes(&e.name),
                    )
                });
                match (res, failed) {
                    (_, Some(e)) => Err(e),
                    (Err(e), None) => Err(self.err("readdir", e)),
                    (Ok(()), None) => Ok(()),
                }
            });
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.guard("readdirplus", || {
            let r = ino_of(ino).and_then(|dir| {
                let mut failed = None;
                let mut added = 0usize;
                let res = self.fs().readdir(dir, offset, |e| {
                    if !visible(e.ino) {
                        return true;
                    }
                    let a = match self.fs().getattr(e.ino) {
                        Ok(a) => a,
                        Err(rext4::Error::NotFound) => return true,
                        Err(err) => {
                            failed = Some(self.err("readdirplus", err));
                            return false;
                        }
                    };
                    let dots = e.name == b"." || e.name == b"..";
                    // `.` and `..` carry no lookup: the kernel skips them. Every other entry
                    // that fits is counted before the reply goes out.
                    if !dots {
                        if let Err(err) = self.take_lookup(a.ino) {
                            failed = Some(err);
                            return false;
                        }
                    }
                    // The kernel links no dentry for `.` and `..`: they carry `st_ino` values.
                    let fa = if dots { stat_attr(&a) } else { file_attr(&a) };
                    let d_ino = INodeNo(u64::from(a.ino.0));
                    let full = reply.add(d_ino, e.next, OsStr::from_bytes(&e.name), &TTL, &fa, gen(&a));
                    if full && !dots {
                        self.forget_one(fa.ino, 1);
                    }
                    if !full {
                        added += 1;
                    }
                    !full
                });
                match (res, failed) {
                    // What was added is still good; the error comes back on the next call.
                    _ if added > 0 => Ok(()),
                    (_, Some(e)) => Err(e),
                    (Err(e), None) => Err(self.err("readdirplus", e)),
                    (Ok(()), None) => Ok(()),
                }
            });
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.guard("releasedir", || {
            self.shared.handles.close(fh.0);
            reply.ok();
        });
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.guard("fsyncdir", || {
            let r = ino_of(ino).and_then(|e| self.fs().fsync(e).map_err(|err| self.err("fsyncdir", err)));
            reply_empty(ro_ok(r), reply);
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.guard("statfs", || match self.fs().statfs() {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_avail,
                s.files,
                s.files_free,
                s.block_size,
                s.name_max,
                s.block_size,
            ),
            Err(e) => reply.error(self.err("statfs", e)),
        });
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        self.guard("setxattr", || {
            let r = (|| {
                self.writable()?;
                if position != 0 {
                    return Err(Errno::EINVAL);
                }
                let e = ino_of(ino)?;
                let flags = u32::try_from(flags).map_err(|_| Errno::EINVAL)?;
                self.fs().setxattr(e, name.as_bytes(), value, flags).map_err(|err| self.err("setxattr", err))
            })();
            reply_empty(r, reply);
        });
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.guard("getxattr", || {
            match ino_of(ino)
                .and_then(|e| self.fs().getxattr(e, name.as_bytes()).map_err(|err| self.err("getxattr", err)))
            {
                Ok(v) => Self::do_xattr_reply(v, size, reply),
                Err(e) => reply.error(e),
            }
        });
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.guard("listxattr", || {
            match ino_of(ino).and_then(|e| self.fs().listxattr(e).map_err(|err| self.err("listxattr", err))) {
                Ok(names) => {
                    let mut out = Vec::new();
                    for n in names {
                        out.extend_from_slice(&n);
                        out.push(0);
                    }
                    Self::do_xattr_reply(out, size, reply)
                }
                Err(e) => reply.error(e),
            }
        });
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.guard("removexattr", || {
            let r = (|| {
                self.writable()?;
                let e = ino_of(ino)?;
                self.fs().removexattr(e, name.as_bytes()).map_err(|err| self.err("removexattr", err))
            })();
            reply_empty(r, reply);
        });
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.guard("access", || {
            let r = self.attr(ino).and_then(|a| self.check_access(req, &a, mask));
            reply_empty(r, reply);
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.guard("create", || {
            let r = (|| {
                self.writable()?;
                let (p, n) = (ino_of(parent)?, name_of(name)?);
                let acl = self.new_inode_acl(p, (mode & 0o7777) as u16, umask, false)?;
                let (m, uid, gid) = self.new_owner(req, p, acl.initial_mode(), false)?;
                let a = self.fs().create(p, n, m, uid, gid).map_err(|e| self.err("create", e))?;
                let a = self.dir_synced(p, self.store_inherited_acl(p, n, a, &acl, false))?;
                self.take_lookup(a.ino)?;
                let fh = self.shared.handles.open(u64::from(a.ino.0), flags);
                Ok((a, fh))
            })();
            match r {
                Ok((a, fh)) => {
                    reply.created(&TTL, &file_attr(&a), gen(&a), FileHandle(fh), self.open_flags())
                }
                Err(e) => reply.error(e),
            }
        });
    }

    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.guard("ioctl", || match self.do_ioctl(ino, cmd, in_data) {
            Ok(out) => reply.ioctl(0, &out[..out.len().min(out_size as usize)]),
            Err(e) => reply.error(e),
        });
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.guard("fallocate", || {
            let r = (|| {
                self.writable()?;
                let e = ino_of(ino)?;
                let mode = u32::try_from(mode).map_err(|_| Errno::EINVAL)?;
                self.fs().fallocate(e, mode, offset, length).map_err(|err| self.err("fallocate", err))
            })();
            reply_empty(r, reply);
        });
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.guard("lseek", || {
            let r = (|| {
                let e = ino_of(ino)?;
                let off = u64::try_from(offset).map_err(|_| Errno::ENXIO)?;
                let pos = match whence {
                    libc::SEEK_DATA => self.fs().seek_data(e, off),
                    libc::SEEK_HOLE => self.fs().seek_hole(e, off),
                    _ => return Err(Errno::EINVAL),
                };
                let pos = pos.map_err(|err| self.err("lseek", err))?;
                i64::try_from(pos).map_err(|_| Errno::EOVERFLOW)
            })();
            match r {
                Ok(p) => reply.offset(p),
                Err(e) => reply.error(e),
            }
        });
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.guard("copy_file_range", || {
            let r = (|| {
                if !flags.is_empty() {
                    return Err(Errno::EINVAL);
                }
                let (src, dst) = (ino_of(ino_in)?, ino_of(ino_out)?);
                let n = self.do_copy(src, offset_in, dst, offset_out, len)?;
                u32::try_from(n).map_err(|_| Errno::EIO)
            })();
            match r {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(e),
            }
        });
    }
}

/// The connection's settings, asked of the kernel at `init` (memfs.rs asks the same).
pub(crate) fn negotiate(config: &mut KernelConfig, writeback_cache: bool) {
    let mut want = InitFlags::FUSE_ASYNC_READ
        | InitFlags::FUSE_BIG_WRITES
        | InitFlags::FUSE_PARALLEL_DIROPS
        | InitFlags::FUSE_DO_READDIRPLUS
        | InitFlags::FUSE_READDIRPLUS_AUTO
        | InitFlags::FUSE_CACHE_SYMLINKS
        | InitFlags::FUSE_MAX_PAGES;
    if writeback_cache {
        want |= InitFlags::FUSE_WRITEBACK_CACHE;
    }
    // Each flag the kernel lacks is simply not used.
    let _ = config.add_capabilities(want & config.capabilities());
    if writeback_cache && !config.capabilities().contains(InitFlags::FUSE_WRITEBACK_CACHE) {
        crate::log("writeback_cache: not supported by this kernel, writing through");
    }
    let _ = config.set_max_write(MAX_IO);
    let _ = config.set_max_readahead(MAX_IO).or_else(|max| config.set_max_readahead(max));
    let _ = config.set_max_background(64);
    let _ = config.set_time_granularity(Duration::from_nanos(1));
}

fn gen(a: &Attr) -> Generation {
    Generation(u64::from(a.generation))
}

pub(crate) fn reply_empty(r: R<()>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

/// `fsync` on a read-only mount has nothing to make durable.
fn ro_ok(r: R<()>) -> R<()> {
    match r {
        Err(e) if e == Errno::EROFS => Ok(()),
        r => r,
    }
}
