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
    decode_dev, engine_ino, file_attr, negative_attr, stat_attr, statx_attributes, time_set, timestamp,
    visible, writeback_times,
};
use crate::errno::ErrorPolicy;
use crate::handles::{FileHandles, LookupCounts, Transition};
use crate::options::{Atime, LockMode, MountOptions};
use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyStatx, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use rext4::{Attr, Fs, InodeNo, SetAttr};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How long the kernel may trust entries and attributes without asking again.
pub(crate) const TTL: Duration = Duration::from_secs(24 * 3600);
/// Largest request payload: 1 MiB reads and writes.
pub(crate) const MAX_IO: u32 = 1 << 20;
/// `copy_file_range` moves data through a buffer of this size.
pub(crate) const COPY_CHUNK: usize = 1 << 20;
/// Most bytes one `copy_file_range` request copies (the reply carries a 32-bit count).
pub(crate) const COPY_MAX: u64 = 1 << 30;

const S_IFMT: u32 = libc::S_IFMT;

/// The supplementary groups of process `pid` (`Groups:` in /proc/PID/status), which a FUSE
/// request does not carry; none if the process is gone or unreadable.
pub(crate) fn supplementary_groups(pid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return Vec::new() };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| g.split_whitespace().filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_default()
}

thread_local! {
    /// The request a worker is serving (set by `Adapter::guard`).
    static CURRENT_OP: std::cell::Cell<&'static str> = const { std::cell::Cell::new("request") };
    /// A worker's buffer for `READ` replies, kept between requests: a fresh one was a
    /// megabyte to zero per request, a fifth of the daemon's time in a stream. Only the bytes
    /// a read fills are ever sent.
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

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
    /// Whether the kernel took `FUSE_HANDLE_KILLPRIV_V2` (killpriv.rs).
    pub killpriv: std::sync::atomic::AtomicBool,
    /// Whether directories open without a request (`FUSE_NO_OPENDIR_SUPPORT`, init.rs).
    pub no_opendir: std::sync::atomic::AtomicBool,
    /// Whether the kernel takes `FUSE_NOTIFY_INC_EPOCH` (ABI 7.44, Linux 6.16), by which a
    /// key's coming or going drops every cached name (fscrypt.rs).
    pub epoch_notify: std::sync::atomic::AtomicBool,
    /// Messages to the kernel about its caches (set once, when the session exists).
    pub notifier: std::sync::OnceLock<fuser::Notifier>,
}

impl Shared {
    /// The state of a connection that has served nothing yet.
    pub(crate) fn new(fs: Fs, policy: ErrorPolicy, opts: MountOptions) -> Shared {
        Shared {
            fs,
            lookups: Default::default(),
            handles: Default::default(),
            policy,
            opts,
            acls: Default::default(),
            lock_owners: Default::default(),
            killpriv: Default::default(),
            no_opendir: Default::default(),
            epoch_notify: Default::default(),
            notifier: Default::default(),
        }
    }

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

pub(crate) fn ino_of(ino: INodeNo) -> R<InodeNo> {
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
    ///
    /// `op` is the request's name, said once: errors the request meets are recorded under it
    /// ([`Adapter::err`]).
    fn guard(&self, op: &'static str, f: impl FnOnce()) {
        let outer = CURRENT_OP.replace(op);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        CURRENT_OP.set(outer);
        if let Err(p) = r {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            crate::log(&format!("bug: {op} panicked ({msg}); the request got EIO"));
        }
    }

    /// [`Adapter::guard`] for a request that may allocate blocks or inodes, or move a file's
    /// quota usage: the root-reserved blocks are the sender's to fill where ext4 would let it
    /// (`ext4_has_free_clusters`): root (taken for `CAP_SYS_RESOURCE`, which FUSE does not
    /// pass on), the superblock's reserving user, or its reserving group when that is not
    /// root's; and root passes quota limits (`ignore_hardlimit`, `CAP_SYS_RESOURCE` again).
    fn guard_as(&self, req: &Request, op: &'static str, f: impl FnOnce()) {
        // The request names no supplementary groups.
        let (uid, gid) = (req.uid(), req.gid());
        let reserve = rext4::may_use_reserved_blocks(self.fs().superblock(), uid, |g| g == gid, uid == 0);
        let run = || {
            if reserve {
                rext4::with_reserved_blocks(|| self.guard(op, f));
            } else {
                self.guard(op, f);
            }
        };
        if uid == 0 {
            rext4::with_quota_limits_ignored(run);
        } else {
            run();
        }
    }

    pub(crate) fn fs(&self) -> &Fs {
        &self.shared.fs
    }

    /// The errno for engine error `e`, recorded (corruption) under the request being served.
    pub(crate) fn err(&self, e: rext4::Error) -> Errno {
        self.shared.policy.errno(CURRENT_OP.get(), &e)
    }

    /// As [`Adapter::err`], for a step of the request that has a name of its own.
    pub(crate) fn err_in(&self, step: &str, e: rext4::Error) -> Errno {
        self.shared.policy.errno(step, &e)
    }

    /// Fails with `EROFS` unless changes are allowed.
    pub(crate) fn writable(&self) -> R<()> {
        if !self.fs().is_writable() {
            return Err(Errno::EROFS);
        }
        Ok(())
    }

    /// Counts one lookup of `ino`, holding it in the engine on the first.
    pub(crate) fn take_lookup(&self, ino: InodeNo) -> R<()> {
        if self.shared.lookups.add(u64::from(ino.0)) == Transition::Hold {
            if let Err(e) = self.fs().hold(ino) {
                self.shared.lookups.sub(u64::from(ino.0), 1);
                return Err(self.err(e));
            }
        }
        Ok(())
    }

    pub(crate) fn forget_one(&self, ino: INodeNo, n: u64) {
        let Some(e) = engine_ino(ino) else { return };
        if self.shared.lookups.sub(u64::from(e.0), n) == Transition::Release {
            if let Err(err) = self.fs().release(e) {
                self.shared.policy.errno("forget", &err);
                crate::log(&format!("release of inode {e}: {err}"));
            }
        }
    }

    /// Replies with the entry `r` made or found in `parent`.
    fn entry(&self, parent: INodeNo, r: R<Attr>, reply: ReplyEntry) {
        match r.and_then(|a| self.take_lookup(a.ino).map(|()| a)) {
            Ok(a) => {
                let g = Generation(u64::from(a.generation));
                reply.entry_with_ttls(&TTL, &self.entry_ttl(parent), &file_attr(&a), g);
            }
            Err(e) => reply.error(e),
        }
    }

    /// How long the kernel may keep a name of directory `parent`: not at all where the
    /// directory is casefolded. Its cache keys names by their bytes, so `Foo` and `foo` would
    /// be two entries there for one on the disk: a removal through one would leave the other,
    /// and a negative `foo` would hide a `Foo` created after it. Nor in an encrypted
    /// directory where the kernel cannot be told to drop every name when a key comes or goes
    /// (no `FUSE_NOTIFY_INC_EPOCH`, fscrypt.rs): a no-key name would outlive the key's coming.
    pub(crate) fn entry_ttl(&self, parent: INodeNo) -> Duration {
        match ino_of(parent) {
            Ok(p) if self.fs().folds_names(p) => Duration::ZERO,
            Ok(p)
                if !self.shared.epoch_notify.load(std::sync::atomic::Ordering::Relaxed)
                    && self
                        .fs()
                        .getattr(p)
                        .is_ok_and(|a| a.flags & rext4::format::inode::ENCRYPT_FL != 0) =>
            {
                Duration::ZERO
            }
            _ => TTL,
        }
    }
}

/// The size from which a removed file's blocks are freed in the removal itself rather than
/// at the kernel's `FORGET` (see `Adapter::free_if_gone`).
const FREE_AT_REMOVAL: u64 = 1 << 20;

impl Adapter {
    /// After an unlink or a rename that replaced `victim` (as looked up just before): a
    /// regular file whose last link that was, and that no open file holds, can never be read
    /// again, so its blocks are freed now, as ext4's `unlink(2)` frees them before it returns,
    /// instead of when the kernel forgets the inode, a request it sends later, while the next
    /// writes may already want the space (and `statfs` would show it taken until then). The
    /// inode itself stays until that `FORGET`. A failure here is logged: the name is gone, and
    /// the blocks still go at the `FORGET`.
    ///
    /// Only for files of [`FREE_AT_REMOVAL`] bytes or more: a small file's blocks matter
    /// little to the space, and freeing them in the request would lengthen every removal of
    /// a tree (a quarter longer for 8 KiB files, measured) for what the `FORGET` does a
    /// moment later anyway.
    fn free_if_gone(&self, victim: Option<Attr>) {
        let Some(a) = victim else { return };
        if a.kind != rext4::FileType::RegularFile || a.nlink != 1 || a.size < FREE_AT_REMOVAL {
            return;
        }
        // Still open: the last `RELEASE` frees it (the kernel sends a closed file's `RELEASE`
        // in the background, so even an `UNLINK` right after the `close(2)` can find it open).
        if self.shared.handles.removed(u64::from(a.ino.0)) {
            self.free_removed(a.ino);
        }
    }

    /// Frees the data of the removed file `ino` (the engine checks that it is one).
    fn free_removed(&self, ino: InodeNo) {
        if let Err(e) = self.fs().free_unlinked_data(ino) {
            crate::log(&format!("inode {}: freeing the data of a removed file: {e}", ino.0));
        }
    }
}

impl Filesystem for Adapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        crate::init::negotiate(config, self.shared.opts.writeback_cache, self.shared.opts.uring_choice());
        // Under the writeback cache the kernel stamps a file's writes from its coarse clock
        // and the daemon stamps the rest: one clock for both keeps them in order (a file's
        // birth never after its first write's modification time). The kernel sends its
        // writes' times with a SETATTR when they changed; a WRITE arriving later must not
        // stamp its own over what the kernel showed.
        if self.shared.opts.writeback_cache && config.capabilities().contains(InitFlags::FUSE_WRITEBACK_CACHE)
        {
            self.fs().set_coarse_time(true);
            self.fs().set_caller_write_times(true);
        }
        self.negotiate_acl(config);
        if self.fs().is_writable() {
            self.negotiate_killpriv(config);
        }
        // File handles (`name_to_handle_at`/`open_by_handle_at`, NFS export) of nodes the
        // kernel has forgotten: it looks them up as "." (and a directory's parent as "..").
        let _ = config.add_capabilities(InitFlags::FUSE_EXPORT_SUPPORT);
        let abi = config.kernel_abi();
        let epoch = (abi.0, abi.1) >= (7, 44);
        self.shared.epoch_notify.store(epoch, std::sync::atomic::Ordering::Relaxed);
        let no_opendir = crate::init::zero_message_opendir(config, self.shared.opts.locks);
        self.shared.no_opendir.store(no_opendir, std::sync::atomic::Ordering::Relaxed);
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
                // With `FUSE_EXPORT_SUPPORT` the kernel asks for "." of a node it no longer
                // caches to open a file handle, and ".." of a directory for its parent; no
                // other lookup has these names (the VFS answers them).
                let found = match n {
                    b"." => self.fs().getattr_by_handle(p),
                    _ => self.fs().lookup(p, n),
                };
                match found {
                    Ok(a) if !visible(a.ino) => Err(Errno::from_i32(libc::EUCLEAN)),
                    Ok(a) => Ok(Some(a)),
                    Err(rext4::Error::NotFound) => Ok(None),
                    Err(e) => Err(self.err(e)),
                }
            })();
            match r {
                Ok(Some(a)) => self.entry(parent, Ok(a), reply),
                // A negative entry the kernel may cache: node id 0 with a timeout.
                Ok(None) => reply.entry(&self.entry_ttl(parent), &negative_attr(), Generation(0)),
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

    /// `statx(2)` asking for the birth time: the attributes `getattr` gives, the inode's
    /// creation time where its record holds one (`i_crtime`, inodes over 128 bytes), and the
    /// flags ext4 reports as `STATX_ATTR_*` (which Linux 6.18 does not yet pass on from FUSE).
    fn statx(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: Option<FileHandle>,
        _flags: u32,
        _mask: u32,
        reply: ReplyStatx,
    ) {
        self.guard("statx", || match self.attr(ino) {
            Ok(a) => {
                let (attributes, mask) = statx_attributes(a.flags);
                reply.statx(&TTL, &stat_attr(&a), a.crtime.is_some(), attributes, mask);
            }
            Err(e) => reply.error(e),
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        kill_suidgid: bool,
        reply: ReplyAttr,
    ) {
        self.guard_as(req, "setattr", || {
            let r = ino_of(ino).and_then(|e| {
                let mut ch = SetAttr {
                    mode: mode.map(|m| (m & 0o7777) as u16),
                    uid,
                    gid,
                    atime: atime.map(time_set),
                    mtime: mtime.map(time_set),
                    size,
                    ctime: None,
                };
                if self.shared.opts.writeback_cache {
                    writeback_times(&mut ch, ctime.map(timestamp));
                }
                if self.fs().is_writable() {
                    self.kill_priv_on_setattr(req, e, &mut ch, kill_suidgid)?;
                }
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
            match ino_of(ino).and_then(|e| self.fs().readlink(e).map_err(|err| self.err(err))) {
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
        self.guard_as(req, "mknod", || {
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
                let a = r.map_err(|e| self.err(e))?;
                self.dir_synced(p, self.store_inherited_acl(p, n, a, &acl, false))
            })();
            self.entry(parent, r, reply);
        });
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        self.guard_as(req, "mkdir", || {
            let r = (|| {
                self.writable()?;
                let (p, n) = (ino_of(parent)?, name_of(name)?);
                let acl = self.new_inode_acl(p, (mode & 0o7777) as u16, umask, true)?;
                let (m, uid, gid) = self.new_owner(req, p, acl.initial_mode(), true)?;
                let a = self.fs().mkdir(p, n, m, uid, gid).map_err(|e| self.err(e))?;
                self.dir_synced(p, self.store_inherited_acl(p, n, a, &acl, true))
            })();
            self.entry(parent, r, reply);
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.guard("unlink", || {
            let r = (|| {
                self.writable()?;
                let (p, n) = (ino_of(parent)?, name_of(name)?);
                let victim = self.fs().lookup(p, n).ok();
                self.dir_synced(p, self.fs().unlink(p, n).map_err(|e| self.err(e)))?;
                self.free_if_gone(victim);
                Ok(())
            })();
            reply_empty(r, reply);
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.guard("rmdir", || {
            let r = (|| {
                self.writable()?;
                let p = ino_of(parent)?;
                self.dir_synced(p, self.fs().rmdir(p, name_of(name)?).map_err(|e| self.err(e)))
            })();
            reply_empty(r, reply);
        });
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        self.guard_as(req, "symlink", || {
            let r = (|| {
                self.writable()?;
                let (p, n) = (ino_of(parent)?, name_of(link_name)?);
                let (_, uid, gid) = self.new_owner(req, p, 0o777, false)?;
                let t = target.as_os_str().as_bytes();
                self.dir_synced(p, self.fs().symlink(p, n, t, uid, gid).map_err(|e| self.err(e)))
            })();
            self.entry(parent, r, reply);
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
        self.guard_as(req, "rename", || {
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
                let replaces = f & (rext4::RENAME_EXCHANGE | rext4::RENAME_NOREPLACE) == 0;
                let victim = if replaces { self.fs().lookup(np, nn).ok() } else { None };
                let r = self.fs().rename_as(op, on, np, nn, f, uid, gid).map_err(|e| self.err(e));
                self.dir_synced(np, self.dir_synced(op, r))?;
                self.free_if_gone(victim);
                Ok(())
            })();
            reply_empty(r, reply);
        });
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        self.guard_as(req, "link", || {
            let r = (|| {
                self.writable()?;
                let (i, p, n) = (ino_of(ino)?, ino_of(newparent)?, name_of(newname)?);
                self.dir_synced(p, self.fs().link(i, p, n).map_err(|e| self.err(e)))
            })();
            self.entry(newparent, r, reply);
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
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.guard("read", || {
            let want = size.min(MAX_IO) as usize;
            let mut touch = flags.0 & libc::O_NOATIME == 0;
            let reply = match self.read_spliced(ino, offset, want, &mut touch, reply) {
                Ok(None) => return,
                Ok(Some(reply)) => reply,
                Err((reply, e)) => return reply.error(e),
            };
            READ_BUF.with_borrow_mut(|buf| {
                if buf.len() < want {
                    buf.resize(want, 0);
                }
                let buf = &mut buf[..want];
                // The kernel leaves a FUSE inode's access time to the daemon; the request
                // carries the file's flags as they are now (`O_NOATIME` may have been set by
                // `fcntl` since the open).
                let r = ino_of(ino).and_then(|e| {
                    if !touch {
                        self.fs().read_noatime(e, offset, buf)
                    } else {
                        self.fs().read(e, offset, buf)
                    }
                    .map_err(|err| self.err(err))
                });
                match r {
                    Ok(n) => reply.data(&buf[..n]),
                    Err(e) => reply.error(e),
                }
            })
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.guard_as(req, "write", || {
            let r = (|| {
                self.writable()?;
                let e = ino_of(ino)?;
                self.kill_priv_on_write(req, e, write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID))?;
                let (at, rest) = self.append_only_tail(ino, offset, data)?;
                let mut n = data.len() - rest.len();
                if !rest.is_empty() {
                    n += self.fs().write(e, at, rest).map_err(|err| self.err(err))?;
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
            // the closer's POSIX locks go (locks=engine). With the kernel's locks a FLUSH
            // comes only with writeback_cache (which overrides FOPEN_NOFLUSH), after the
            // kernel has written the file's pages back itself: ENOSYS tells it to send no
            // more on this connection, a round trip saved on every close.
            if self.shared.opts.locks == LockMode::Kernel {
                reply.error(Errno::ENOSYS);
                return;
            }
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
            let removed = self.shared.handles.close(fh.0).is_some_and(|(_, gone)| gone);
            if let Some(e) = engine_ino(ino) {
                self.release_locks(e, fh.0, lock_owner.map(|o| o.0));
                if removed {
                    self.free_removed(e);
                }
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
            let r = ino_of(ino).and_then(|e| self.fs().fsync(e).map_err(|err| self.err(err)));
            reply_empty(ro_ok(r), reply);
        });
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if self.shared.no_opendir.load(std::sync::atomic::Ordering::Relaxed) {
            // The kernel then opens directories without asking, as if this reply had been
            // `FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR` (init.rs).
            reply.error(Errno::ENOSYS);
            return;
        }
        self.guard("opendir", || match ino_of(ino) {
            Ok(e) => {
                let fh = self.shared.handles.open(u64::from(e.0), flags.0);
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR);
            }
            Err(e) => reply.error(e),
        });
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        self.guard("readdir", || {
            let r = self.do_readdir(ino, fh, offset, &mut reply);
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
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.guard("readdirplus", || {
            let r = self.do_readdirplus(ino, fh, offset, &mut reply);
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
            let r = ino_of(ino).and_then(|e| self.fs().fsync(e).map_err(|err| self.err(err)));
            reply_empty(ro_ok(r), reply);
        });
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        // A project directory's own counts where project limits are enforced.
        let st = |i| self.fs().statfs_at(i).map_err(|e| self.err(e));
        self.guard("statfs", || match ino_of(ino).and_then(st) {
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
            Err(e) => reply.error(e),
        });
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        setxattr_flags: u32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        self.guard_as(req, "setxattr", || {
            let r = (|| {
                self.writable()?;
                if position != 0 {
                    return Err(Errno::EINVAL);
                }
                let e = ino_of(ino)?;
                let flags = u32::try_from(flags).map_err(|_| Errno::EINVAL)?;
                // The kernel found the caller outside the file's group and without
                // `CAP_FSETID` (only ever said of an access ACL).
                let r = if setxattr_flags & fuser::consts::FUSE_SETXATTR_ACL_KILL_SGID != 0 {
                    self.fs().setxattr_outside_group(e, name.as_bytes(), value, flags)
                } else {
                    self.fs().setxattr(e, name.as_bytes(), value, flags)
                };
                r.map_err(|err| self.err(err))
            })();
            reply_empty(r, reply);
        });
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.guard("getxattr", || {
            match ino_of(ino)
                .and_then(|e| self.fs().getxattr(e, name.as_bytes()).map_err(|err| self.err(err)))
            {
                Ok(v) => Self::do_xattr_reply(v, size, reply),
                Err(e) => reply.error(e),
            }
        });
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.guard("listxattr", || {
            match ino_of(ino).and_then(|e| self.fs().listxattr(e).map_err(|err| self.err(err))) {
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
                self.fs().removexattr(e, name.as_bytes()).map_err(|err| self.err(err))
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
        self.guard_as(req, "create", || {
            let r = (|| {
                self.writable()?;
                let (p, n) = (ino_of(parent)?, name_of(name)?);
                let (acl, m, uid, gid) = self.new_file(req, p, mode, umask)?;
                let a = self.fs().create(p, n, m, uid, gid).map_err(|e| self.err(e))?;
                let a = self.dir_synced(p, self.store_inherited_acl(p, n, a, &acl, false))?;
                self.take_lookup(a.ino)?;
                Ok(a)
            })();
            self.created(parent, r, flags, reply);
        });
    }

    /// `open(O_TMPFILE)`: an unnamed file in `parent`'s part of the disk, owned and given
    /// ACLs as a create would be. The engine holds it once (`Fs::tmpfile`), which stands for
    /// the lookup the reply counts; the kernel's last `FORGET` lets it go, freeing it unless a
    /// `LINK` named it.
    fn tmpfile(&self, req: &Request, parent: INodeNo, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        self.guard_as(req, "tmpfile", || {
            let r = (|| {
                self.writable()?;
                let p = ino_of(parent)?;
                let (acl, m, uid, gid) = self.new_file(req, p, mode, umask)?;
                let a = self.fs().tmpfile(p, m, uid, gid).map_err(|e| self.err(e))?;
                let ino = a.ino;
                let held = self.shared.lookups.add(u64::from(ino.0)) == Transition::Hold;
                let stored = if acl.stores_any() {
                    self.fs().set_inherited_acl(ino, &acl).and_then(|()| self.fs().getattr(ino))
                } else {
                    Ok(a)
                };
                // The engine's hold counts once: a second one (a lookup count the kernel still
                // had for this number) or a failed ACL gives it back.
                if !held || stored.is_err() {
                    if stored.is_err() {
                        self.shared.lookups.sub(u64::from(ino.0), 1);
                    }
                    if let Err(e) = self.fs().release(ino) {
                        crate::log(&format!("release of unnamed inode {ino}: {e}"));
                    }
                }
                stored.map_err(|e| self.err_in("tmpfile (ACL)", e))
            })();
            self.created(parent, r, flags, reply);
        });
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.guard_as(req, "ioctl", || {
            let creds = rext4::Creds::user(req.uid(), req.gid(), &[]);
            let r = self
                .fscrypt_ioctl(&creds, ino, cmd, in_data)
                .unwrap_or_else(|| self.do_ioctl(req.uid(), ino, cmd, in_data));
            match r {
                Ok(out) => reply.ioctl(0, &out[..out.len().min(out_size as usize)]),
                Err(e) => reply.error(e),
            }
        });
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.guard_as(req, "fallocate", || {
            let r = (|| {
                self.writable()?;
                let e = ino_of(ino)?;
                let mode = u32::try_from(mode).map_err(|_| Errno::EINVAL)?;
                self.fs().fallocate(e, mode, offset, length).map_err(|err| self.err(err))
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
                let pos = pos.map_err(|err| self.err(err))?;
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
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.guard_as(req, "copy_file_range", || {
            let r = (|| {
                if !flags.is_empty() {
                    return Err(Errno::EINVAL);
                }
                let (src, dst) = (ino_of(ino_in)?, ino_of(ino_out)?);
                let opened = self.shared.handles.get(fh_in.0, u64::from(src.0));
                let noatime = opened.is_some_and(|o| o.flags & libc::O_NOATIME != 0);
                let n = self.do_copy(src, offset_in, dst, offset_out, len, noatime)?;
                if n > 0 && !noatime && self.shared.opts.atime != Atime::NoAtime {
                    self.attributes_changed(ino_in);
                }
                u32::try_from(n).map_err(|_| Errno::EIO)
            })();
            match r {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(e),
            }
        });
    }
}

impl Adapter {
    /// Drops the kernel's cached attributes of `ino` after a request that changed them but
    /// after which the kernel keeps them: a `COPY_FILE_RANGE` that set its source's access
    /// time (the kernel marks it stale after the reads it sends, not after this request), an
    /// ioctl that set inode flags and so the change time. The next `stat` asks again. Only
    /// the attributes (a negative offset): no page is touched, so the kernel takes no lock a
    /// request in flight could hold.
    pub(crate) fn attributes_changed(&self, ino: INodeNo) {
        self.invalidate(ino, -1);
    }

    /// Drops the kernel's cached attributes of `ino` and, from byte `offset` on (none where
    /// negative), its pages: a file's data, a directory's cached listing.
    pub(crate) fn invalidate(&self, ino: INodeNo, offset: i64) {
        if let Some(n) = self.shared.notifier.get() {
            if let Err(e) = n.inval_inode(ino, offset, 0) {
                // The kernel may have forgotten the inode meanwhile (ENOENT): nothing cached.
                if e.raw_os_error() != Some(libc::ENOENT) {
                    crate::log(&format!("invalidating inode {}: {e}", ino.0));
                }
            }
        }
    }
}

pub(crate) fn gen(a: &Attr) -> Generation {
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
