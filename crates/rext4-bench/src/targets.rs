//! What a workload runs against: rext4 in process (the library API), or a mounted directory
//! used through the system calls any program makes (kernel ext4 on a loop device over tmpfs,
//! rext4's FUSE daemon, fuse2fs, or a plain tmpfs directory).
//!
//! Workloads see one small trait, [`Target`], with `*at`-style calls on [`Node`]s (an inode
//! number in process, an open file descriptor on a mount), so both sides do the same work:
//! no path walks on the hot path, a name looked up in an open directory.
//!
//! Every mount and daemon is registered in [`ACTIVE`] while it exists, so the signal handler
//! in `main.rs` can take them all down on Ctrl-C; normal teardown is `Drop`.

use crate::CliResult;
use nix::fcntl::AtFlags;
use nix::fcntl::{FcntlArg, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;
use rext4::{Fs, InodeNo, Options, SetAttr};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The kinds of target, in the order tables show them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Kind {
    InProc,
    NbdUnix,
    NbdUnix1,
    NbdTcp,
    NbdTcp1,
    Fuse,
    /// `fuse` with `-o io_uring`.
    FuseUring,
    Kernel,
    Fuse2fs,
    Tmpfs,
    FuseMem,
    /// `fusemem` with `-o io_uring`.
    FuseMemUring,
}

impl Kind {
    pub(crate) const ALL: [Kind; 12] = [
        Kind::InProc,
        Kind::NbdUnix,
        Kind::NbdUnix1,
        Kind::NbdTcp,
        Kind::NbdTcp1,
        Kind::Fuse,
        Kind::FuseUring,
        Kind::Kernel,
        Kind::Fuse2fs,
        Kind::Tmpfs,
        Kind::FuseMem,
        Kind::FuseMemUring,
    ];

    /// Served by `rext4 mount` or `rext4 memfs`.
    pub(crate) fn is_rext4_fuse(self) -> bool {
        matches!(self, Kind::Fuse | Kind::FuseUring | Kind::FuseMem | Kind::FuseMemUring)
    }

    /// Served through FUSE-over-io_uring queues (`-o io_uring`).
    pub(crate) fn is_uring(self) -> bool {
        matches!(self, Kind::FuseUring | Kind::FuseMemUring)
    }

    /// The in-process engine over an NBD export of the image (nbdkit's file plugin).
    pub(crate) fn is_nbd(self) -> bool {
        matches!(self, Kind::NbdUnix | Kind::NbdUnix1 | Kind::NbdTcp | Kind::NbdTcp1)
    }

    pub(crate) fn parse(s: &str) -> CliResult<Kind> {
        Ok(match s {
            "inproc" | "in-process" | "rext4" => Kind::InProc,
            "fuse" | "rext4-fuse" => Kind::Fuse,
            "kernel" | "ext4" => Kind::Kernel,
            "fuse2fs" => Kind::Fuse2fs,
            "tmpfs" => Kind::Tmpfs,
            "fusemem" => Kind::FuseMem,
            "fuse-uring" => Kind::FuseUring,
            "fusemem-uring" => Kind::FuseMemUring,
            "nbd-unix" => Kind::NbdUnix,
            "nbd-unix-1" => Kind::NbdUnix1,
            "nbd-tcp" => Kind::NbdTcp,
            "nbd-tcp-1" => Kind::NbdTcp1,
            _ => {
                return Err(format!(
                    "unknown target {s} (inproc, nbd-unix, nbd-unix-1, nbd-tcp, nbd-tcp-1, fuse, fuse-uring, kernel, fuse2fs, tmpfs, fusemem, fusemem-uring)"
                ))
            }
        })
    }

    /// Short name, as on the command line and in JSON.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::InProc => "inproc",
            Kind::NbdUnix => "nbd-unix",
            Kind::NbdUnix1 => "nbd-unix-1",
            Kind::NbdTcp => "nbd-tcp",
            Kind::NbdTcp1 => "nbd-tcp-1",
            Kind::Fuse => "fuse",
            Kind::Kernel => "kernel",
            Kind::Fuse2fs => "fuse2fs",
            Kind::Tmpfs => "tmpfs",
            Kind::FuseMem => "fusemem",
            Kind::FuseUring => "fuse-uring",
            Kind::FuseMemUring => "fusemem-uring",
        }
    }

    /// What it is, for notes.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Kind::InProc => "rext4 in process (library API)",
            Kind::NbdUnix => {
                "rext4 in process over NBD: nbdkit file plugin on a Unix socket, default connections (multi-conn)"
            }
            Kind::NbdUnix1 => "rext4 in process over NBD: nbdkit file plugin on a Unix socket, one connection",
            Kind::NbdTcp => {
                "rext4 in process over NBD: nbdkit file plugin on loopback TCP, default connections (multi-conn)"
            }
            Kind::NbdTcp1 => "rext4 in process over NBD: nbdkit file plugin on loopback TCP, one connection",
            Kind::Fuse => "rext4 mount (FUSE daemon)",
            Kind::Kernel => "kernel ext4 on a loop device over tmpfs",
            Kind::Fuse2fs => "fuse2fs (e2fsprogs FUSE driver)",
            Kind::Tmpfs => "a tmpfs directory (no ext4 at all)",
            Kind::FuseMem => {
                "rext4 memfs: an in-memory FUSE filesystem with the daemon's settings (the FUSE ceiling)"
            }
            Kind::FuseUring => "rext4 mount -o io_uring (FUSE over io_uring)",
            Kind::FuseMemUring => "rext4 memfs -o io_uring (the FUSE-over-io_uring ceiling)",
        }
    }
}

/// The image a workload needs.
#[derive(Clone, Debug, Default)]
pub(crate) struct ImageSpec {
    pub inodes: u64,
    pub mib: u64,
    /// More mkfs.ext4 arguments (`--mkfs`).
    pub extra: Vec<String>,
    /// rext4's metadata cache in MiB (`--cache`); `None`: the engine's default.
    pub cache_mib: Option<u64>,
    /// More `-o` options for the fuse target's daemon (`--fuse-opts`).
    pub fuse_opts: Option<String>,
    /// rext4 without delayed allocation (`--nodelalloc`), in process and for the daemon.
    pub nodelalloc: bool,
    /// In process: quota limits enforced for every type, with limits no workload reaches set
    /// for root's ids, so that every check reads an entry (`--quota-limits`; needs an image
    /// made with `--mkfs "-O quota,..."`).
    pub quota_limits: bool,
    /// In process: directories made by workloads are casefolded (`--casefold-dirs`).
    pub casefold_dirs: bool,
}

/// An open directory or file on a target (in process: a held inode; `close` releases it).
pub(crate) enum Node {
    Ino(InodeNo),
    /// In process: a held inode and the identity of its open file description (the owner
    /// of its OFD and flock locks).
    Open(InodeNo, u64),
    Fd(File),
}

/// Lock calls of lockperf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockKind {
    /// A whole-file POSIX write lock. Taken as an open-file-description lock (`F_OFD_SETLKW`):
    /// the workers are threads of one process, for which classic POSIX locks would not
    /// conflict; OFD locks go through the same record-lock code in the kernel.
    Posix,
    /// `flock(LOCK_EX)`.
    Flock,
}

/// One filesystem under test, as a workload sees it. All calls may run from many threads.
pub(crate) trait Target: Sync {
    fn kind(&self) -> Kind;
    fn root(&self) -> &Node;
    /// Makes directory `name` in `dir` and opens it.
    fn mkdir(&self, dir: &Node, name: &str) -> CliResult<Node>;
    fn rmdir(&self, dir: &Node, name: &str) -> CliResult;
    /// `open(O_CREAT | O_EXCL | O_RDWR)`.
    fn create(&self, dir: &Node, name: &str) -> CliResult<Node>;
    /// `open(O_RDWR)` of an existing file.
    fn open(&self, dir: &Node, name: &str) -> CliResult<Node>;
    /// `open(O_DIRECTORY)` of an existing directory.
    fn open_dir(&self, dir: &Node, name: &str) -> CliResult<Node>;
    /// The names in a directory (`getdents`), without `.` and `..`.
    fn readdir(&self, dir: &Node) -> CliResult<Vec<String>>;
    fn close(&self, f: Node) -> CliResult;
    /// `fstatat` (no symlink following); returns the size.
    fn stat(&self, dir: &Node, name: &str) -> CliResult<u64>;
    fn unlink(&self, dir: &Node, name: &str) -> CliResult;
    fn write_at(&self, f: &Node, off: u64, buf: &[u8]) -> CliResult;
    fn read_at(&self, f: &Node, off: u64, buf: &mut [u8]) -> CliResult<usize>;
    /// `ftruncate`.
    fn set_len(&self, f: &Node, len: u64) -> CliResult;
    /// `fallocate(FALLOC_FL_KEEP_SIZE)`: space set aside past the end. Whether the target
    /// could (a filesystem without it says `EOPNOTSUPP`).
    fn preallocate(&self, f: &Node, off: u64, len: u64) -> CliResult<bool>;
    fn fsync(&self, f: &Node) -> CliResult;
    /// `syncfs`.
    fn sync(&self) -> CliResult;
    /// Whether [`Target::lock`] works here.
    fn has_locks(&self) -> bool;
    /// Takes (`on`) or drops a whole-file exclusive lock, waiting for it.
    fn lock(&self, f: &Node, kind: LockKind, on: bool) -> CliResult;
    /// Drops what caches it can so that reads come from the device.
    fn drop_caches(&self);
    /// The engine, for the in-process target (its statistics).
    fn engine(&self) -> Option<&Fs> {
        None
    }
    /// The daemon serving the mount, for FUSE targets.
    fn daemon(&self) -> Option<u32> {
        None
    }
}

/// Peak resident memory of process `pid`, MiB.
pub(crate) fn peak_rss_mib(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = s.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn fd(n: &Node) -> CliResult<&File> {
    match n {
        Node::Fd(f) => Ok(f),
        Node::Ino(_) | Node::Open(..) => Err("an in-process node given to a mounted target".into()),
    }
}

fn ino(n: &Node) -> CliResult<InodeNo> {
    match n {
        Node::Ino(i) | Node::Open(i, _) => Ok(*i),
        Node::Fd(_) => Err("a file descriptor given to the in-process target".into()),
    }
}

// ---------------------------------------------------------------------------------------
// In process.

/// rext4 through its library API, on an image file.
pub(crate) struct InProc {
    kind: Kind,
    fs: Fs,
    root: Node,
    /// The NBD server the engine reads and writes through (NBD kinds); dropped after `fs`,
    /// which is unmounted first.
    server: Option<NbdServer>,
    /// Identity of the next open file description. [atomic]
    next_open: std::sync::atomic::AtomicU64,
    /// New directories are casefolded.
    casefold_dirs: bool,
}

fn e(e: rext4::Error) -> String {
    e.to_string()
}

impl InProc {
    /// Opens `image` for writing, with `cache_mib` MiB of metadata cache (and inode and name
    /// caches to match) if given.
    pub(crate) fn open(image: &Path, spec: &ImageSpec) -> CliResult<InProc> {
        Self::open_address(Kind::InProc, &image.to_string_lossy(), None, spec)
    }

    /// Opens `address` (an image path or an NBD address served by `server`).
    fn open_address(
        kind: Kind,
        address: &str,
        server: Option<NbdServer>,
        spec: &ImageSpec,
    ) -> CliResult<InProc> {
        let mut o = Options { writable: true, delalloc: !spec.nodelalloc, ..Options::default() };
        if let Some(mib) = spec.cache_mib.and_then(|m| usize::try_from(m).ok()) {
            o.cache_bytes = mib.saturating_mul(1 << 20);
            o.inode_cache = o.inode_cache.max(mib.saturating_mul(4096));
            o.name_cache = o.name_cache.max(mib.saturating_mul(4096));
        }
        if spec.quota_limits {
            o.quota_limits = rext4::QuotaEnforcement { user: true, group: true, project: true };
        }
        let fs = Fs::open_with(Path::new(address), o).map_err(e)?;
        if spec.quota_limits {
            let far = rext4::QuotaLimits {
                space_soft_kib: 1 << 40,
                space_hard_kib: 1 << 41,
                inodes_soft: 1 << 40,
                inodes_hard: 1 << 41,
            };
            for ty in [rext4::QuotaType::User, rext4::QuotaType::Group, rext4::QuotaType::Project] {
                match fs.set_quota_limits(ty, 0, far) {
                    Ok(_) | Err(rext4::Error::NotSupported(_)) => {}
                    Err(x) => return Err(e(x)),
                }
            }
        }
        let root = Node::Ino(fs.root());
        let next_open = std::sync::atomic::AtomicU64::new(1);
        Ok(InProc { kind, fs, root, server, next_open, casefold_dirs: spec.casefold_dirs })
    }

    /// An open file or directory: held, as the kernel holds an open file, until closed.
    fn held(&self, i: InodeNo) -> CliResult<Node> {
        self.fs.hold(i).map_err(e)?;
        Ok(Node::Open(i, self.next_open.fetch_add(1, std::sync::atomic::Ordering::Relaxed)))
    }

    /// Commits everything and marks the image clean.
    pub(crate) fn unmount(self) -> CliResult {
        let InProc { fs, server, .. } = self;
        let r = fs.unmount().map_err(e);
        // The device's connections close with the engine, before the server stops.
        drop(fs);
        if let Some(srv) = server {
            srv.stop();
        }
        r
    }
}

impl Target for InProc {
    fn kind(&self) -> Kind {
        self.kind
    }
    fn root(&self) -> &Node {
        &self.root
    }
    fn mkdir(&self, dir: &Node, name: &str) -> CliResult<Node> {
        let a = self.fs.mkdir(ino(dir)?, name.as_bytes(), 0o755, 0, 0).map_err(e)?;
        if self.casefold_dirs {
            self.fs.set_flags(a.ino, a.flags | rext4::format::inode::CASEFOLD_FL).map_err(e)?;
        }
        self.held(a.ino)
    }
    fn rmdir(&self, dir: &Node, name: &str) -> CliResult {
        self.fs.rmdir(ino(dir)?, name.as_bytes()).map_err(e)
    }
    fn create(&self, dir: &Node, name: &str) -> CliResult<Node> {
        self.held(self.fs.create(ino(dir)?, name.as_bytes(), 0o644, 0, 0).map_err(e)?.ino)
    }
    fn open(&self, dir: &Node, name: &str) -> CliResult<Node> {
        self.held(self.fs.lookup(ino(dir)?, name.as_bytes()).map_err(e)?.ino)
    }
    fn open_dir(&self, dir: &Node, name: &str) -> CliResult<Node> {
        let a = self.fs.lookup(ino(dir)?, name.as_bytes()).map_err(e)?;
        if a.kind != rext4::FileType::Directory {
            return Err(format!("open {name}: not a directory"));
        }
        self.held(a.ino)
    }
    fn readdir(&self, dir: &Node) -> CliResult<Vec<String>> {
        let names = self.fs.children(ino(dir)?).map_err(e)?;
        Ok(names.into_iter().map(|d| String::from_utf8_lossy(&d.name).into_owned()).collect())
    }
    fn close(&self, f: Node) -> CliResult {
        if let Node::Open(i, id) = f {
            self.fs.release_file_locks(i, id);
        }
        self.fs.release(ino(&f)?).map_err(e)
    }
    fn stat(&self, dir: &Node, name: &str) -> CliResult<u64> {
        Ok(self.fs.lookup(ino(dir)?, name.as_bytes()).map_err(e)?.size)
    }
    fn unlink(&self, dir: &Node, name: &str) -> CliResult {
        self.fs.unlink(ino(dir)?, name.as_bytes()).map_err(e)
    }
    fn write_at(&self, f: &Node, mut off: u64, mut buf: &[u8]) -> CliResult {
        let i = ino(f)?;
        while !buf.is_empty() {
            let n = self.fs.write(i, off, buf).map_err(e)?;
            if n == 0 {
                return Err("short write".into());
            }
            buf = &buf[n..];
            off += n as u64;
        }
        Ok(())
    }
    fn read_at(&self, f: &Node, off: u64, buf: &mut [u8]) -> CliResult<usize> {
        self.fs.read(ino(f)?, off, buf).map_err(e)
    }
    fn set_len(&self, f: &Node, len: u64) -> CliResult {
        self.fs.setattr(ino(f)?, &SetAttr { size: Some(len), ..SetAttr::default() }).map(|_| ()).map_err(e)
    }
    fn preallocate(&self, f: &Node, off: u64, len: u64) -> CliResult<bool> {
        self.fs.fallocate(ino(f)?, rext4::FALLOC_FL_KEEP_SIZE, off, len).map(|_| true).map_err(e)
    }
    fn fsync(&self, f: &Node) -> CliResult {
        self.fs.fsync(ino(f)?).map_err(e)
    }
    fn sync(&self) -> CliResult {
        self.fs.sync().map_err(e)
    }
    fn has_locks(&self) -> bool {
        true
    }
    fn lock(&self, f: &Node, kind: LockKind, on: bool) -> CliResult {
        let Node::Open(i, id) = *f else { return Err("lock on a file that is not open".into()) };
        // As the mounted targets: OFD write locks (the workers are threads of one process)
        // and flock, whole file, waiting.
        match kind {
            LockKind::Posix => {
                let t = if on { rext4::LockType::Write } else { rext4::LockType::Unlock };
                let l = rext4::FileLock::new(t, 0, u64::MAX, rext4::LockOwner::Ofd(id));
                self.fs.setlk(i, &l, rext4::Wait::Forever).map_err(e)
            }
            LockKind::Flock => {
                let op = if on { rext4::FlockOp::Exclusive } else { rext4::FlockOp::Unlock };
                self.fs.flock(i, id, op, rext4::Wait::Forever).map_err(e)
            }
        }
    }
    fn drop_caches(&self) {
        self.fs.drop_caches();
    }
    fn engine(&self) -> Option<&Fs> {
        Some(&self.fs)
    }
}

// ---------------------------------------------------------------------------------------
// A mounted directory.

/// A directory used through system calls; what is mounted there goes away with `guard`.
pub(crate) struct Mounted {
    kind: Kind,
    root: Node,
    // Dropped after `root` (fields drop in order): the directory is closed before unmounting.
    guard: MountGuard,
}

impl Mounted {
    /// Where it is mounted.
    pub(crate) fn dir(&self) -> &Path {
        &self.guard.dir
    }
}

fn errno(op: &str, name: &str, e: nix::Error) -> String {
    format!("{op} {name}: {e}")
}

impl Target for Mounted {
    fn kind(&self) -> Kind {
        self.kind
    }
    fn root(&self) -> &Node {
        &self.root
    }
    fn mkdir(&self, dir: &Node, name: &str) -> CliResult<Node> {
        let d = fd(dir)?;
        nix::sys::stat::mkdirat(d, name, Mode::from_bits_truncate(0o755))
            .map_err(|x| errno("mkdir", name, x))?;
        let f = nix::fcntl::openat(
            d,
            name,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|x| errno("open", name, x))?;
        Ok(Node::Fd(File::from(f)))
    }
    fn rmdir(&self, dir: &Node, name: &str) -> CliResult {
        // FUSE sends a file's release after close returns: a daemon may still count a file
        // closed a moment ago as open, and keep it until the release arrives.
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            match nix::unistd::unlinkat(fd(dir)?, name, UnlinkatFlags::RemoveDir) {
                Err(nix::Error::ENOTEMPTY) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                r => return r.map_err(|x| errno("rmdir", name, x)),
            }
        }
    }
    fn create(&self, dir: &Node, name: &str) -> CliResult<Node> {
        let flags = OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR | OFlag::O_CLOEXEC;
        let f = nix::fcntl::openat(fd(dir)?, name, flags, Mode::from_bits_truncate(0o644))
            .map_err(|x| errno("create", name, x))?;
        Ok(Node::Fd(File::from(f)))
    }
    fn open(&self, dir: &Node, name: &str) -> CliResult<Node> {
        let f = nix::fcntl::openat(fd(dir)?, name, OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|x| errno("open", name, x))?;
        Ok(Node::Fd(File::from(f)))
    }
    fn open_dir(&self, dir: &Node, name: &str) -> CliResult<Node> {
        let flags = OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC;
        let f =
            nix::fcntl::openat(fd(dir)?, name, flags, Mode::empty()).map_err(|x| errno("open", name, x))?;
        Ok(Node::Fd(File::from(f)))
    }
    fn readdir(&self, dir: &Node) -> CliResult<Vec<String>> {
        let flags = OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC;
        let mut d = nix::dir::Dir::openat(fd(dir)?, ".", flags, Mode::empty())
            .map_err(|x| errno("opendir", ".", x))?;
        let mut names = Vec::new();
        for ent in d.iter() {
            let ent = ent.map_err(|x| errno("readdir", ".", x))?;
            let n = ent.file_name().to_bytes();
            if n != b"." && n != b".." {
                names.push(String::from_utf8_lossy(n).into_owned());
            }
        }
        Ok(names)
    }
    fn close(&self, f: Node) -> CliResult {
        drop(f);
        Ok(())
    }
    fn stat(&self, dir: &Node, name: &str) -> CliResult<u64> {
        let st = nix::sys::stat::fstatat(fd(dir)?, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|x| errno("stat", name, x))?;
        Ok(st.st_size as u64)
    }
    fn unlink(&self, dir: &Node, name: &str) -> CliResult {
        nix::unistd::unlinkat(fd(dir)?, name, UnlinkatFlags::NoRemoveDir)
            .map_err(|x| errno("unlink", name, x))
    }
    fn write_at(&self, f: &Node, off: u64, buf: &[u8]) -> CliResult {
        fd(f)?.write_all_at(buf, off).map_err(|x| format!("write: {x}"))
    }
    fn read_at(&self, f: &Node, off: u64, buf: &mut [u8]) -> CliResult<usize> {
        fd(f)?.read_at(buf, off).map_err(|x| format!("read: {x}"))
    }
    fn set_len(&self, f: &Node, len: u64) -> CliResult {
        fd(f)?.set_len(len).map_err(|x| format!("ftruncate: {x}"))
    }
    fn preallocate(&self, f: &Node, off: u64, len: u64) -> CliResult<bool> {
        let mode = nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
        let (off, len) = (off as libc::off_t, len as libc::off_t);
        match nix::fcntl::fallocate(fd(f)?, mode, off, len) {
            Ok(()) => Ok(true),
            Err(nix::Error::EOPNOTSUPP) => Ok(false),
            Err(x) => Err(format!("fallocate: {x}")),
        }
    }
    fn fsync(&self, f: &Node) -> CliResult {
        fd(f)?.sync_all().map_err(|x| format!("fsync: {x}"))
    }
    fn sync(&self) -> CliResult {
        nix::unistd::syncfs(fd(&self.root)?).map_err(|x| format!("syncfs: {x}"))
    }
    fn has_locks(&self) -> bool {
        true
    }
    fn lock(&self, f: &Node, kind: LockKind, on: bool) -> CliResult {
        let file = fd(f)?;
        match kind {
            LockKind::Posix => {
                let ty = if on { libc::F_WRLCK } else { libc::F_UNLCK };
                let fl = libc::flock {
                    l_type: ty as libc::c_short,
                    l_whence: libc::SEEK_SET as libc::c_short,
                    l_start: 0,
                    l_len: 0,
                    l_pid: 0,
                };
                nix::fcntl::fcntl(file, FcntlArg::F_OFD_SETLKW(&fl))
                    .map(|_| ())
                    .map_err(|x| format!("F_OFD_SETLKW: {x}"))
            }
            LockKind::Flock => {
                use std::os::fd::AsRawFd;
                let arg = if on { nix::fcntl::FlockArg::LockExclusive } else { nix::fcntl::FlockArg::Unlock };
                // `nix::fcntl::Flock` takes the file by value; the workload keeps using its file
                // between lock and unlock, so the plain call it replaces is used instead.
                #[allow(deprecated)]
                nix::fcntl::flock(file.as_raw_fd(), arg).map_err(|x| format!("flock: {x}"))
            }
        }
    }
    fn daemon(&self) -> Option<u32> {
        self.guard.daemon.as_ref().map(|c| c.id())
    }
    fn drop_caches(&self) {
        let _ = self.sync();
        // Needs root; without it reads may come from the page cache, which the note says.
        let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    }
}

// ---------------------------------------------------------------------------------------
// Setting targets up and taking them down.

/// Mounts and daemons alive now, for the Ctrl-C handler. [own mutex]
pub(crate) static ACTIVE: Mutex<Vec<Active>> = Mutex::new(Vec::new());

/// A mount the Ctrl-C handler must take down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Active {
    pub dir: PathBuf,
    pub daemon: Option<u32>,
}

fn register(a: Active) {
    ACTIVE.lock().unwrap_or_else(|p| p.into_inner()).push(a);
}

fn unregister(dir: &Path) {
    ACTIVE.lock().unwrap_or_else(|p| p.into_inner()).retain(|a| a.dir != dir);
}

/// Takes down everything still registered, without waiting for anything (Ctrl-C).
pub(crate) fn teardown_all() {
    let all = std::mem::take(&mut *ACTIVE.lock().unwrap_or_else(|p| p.into_inner()));
    for a in all {
        let _ = quiet(Command::new("umount").arg("-l").arg(&a.dir)).status();
        if let Some(pid) = a.daemon {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::SIGTERM);
        }
    }
}

fn quiet(c: &mut Command) -> &mut Command {
    c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null())
}

/// Whether `dir` is a mount point now.
pub(crate) fn is_mounted(dir: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    let d = dir.to_string_lossy();
    // Field 5 is the mount point, with spaces escaped as \040 (our paths have none).
    info.lines().any(|l| l.split(' ').nth(4) == Some(&*d))
}

/// What is mounted at a directory, taken down on drop.
struct MountGuard {
    dir: PathBuf,
    daemon: Option<Child>,
}

impl MountGuard {
    fn none(dir: &Path) -> Self {
        MountGuard { dir: dir.to_path_buf(), daemon: None }
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        let mounted = self.daemon.is_some() || is_mounted(&self.dir);
        if mounted {
            unmount(&self.dir);
        }
        if let Some(child) = &mut self.daemon {
            // The daemon commits and exits once unmounted; do not wait for ever.
            let until = Instant::now() + Duration::from_secs(30);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        unregister(&self.dir);
    }
}

/// Unmounts `dir`, retrying while busy, detaching it lazily as a last resort.
pub(crate) fn unmount(dir: &Path) {
    for _ in 0..50 {
        if !is_mounted(dir) {
            return;
        }
        if quiet(Command::new("umount").arg(dir)).status().is_ok_and(|s| s.success()) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = quiet(Command::new("umount").arg("-l").arg(dir)).status();
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn find_on_path(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(prog)).find(|p| p.is_file())
}

fn on_path(prog: &str) -> bool {
    find_on_path(prog).is_some()
}

/// The `rext4` program `--rext4` names. [set before any workload runs]
static REXT4: OnceLock<PathBuf> = OnceLock::new();

/// Serves the FUSE targets with `rext4` instead of looking for it.
pub(crate) fn set_rext4(p: Option<PathBuf>) {
    if let Some(p) = p {
        let _ = REXT4.set(p);
    }
}

/// The `rext4` program serving the FUSE targets: `--rext4`, else the one beside this program
/// (where cargo builds and installs both), else the one on PATH.
pub(crate) fn rext4_exe() -> Option<PathBuf> {
    if let Some(p) = REXT4.get() {
        return p.is_file().then(|| p.clone());
    }
    let beside = std::env::current_exe().ok().map(|e| e.with_file_name("rext4")).filter(|p| p.is_file());
    beside.or_else(|| find_on_path("rext4"))
}

/// The fuse module's switch for FUSE over io_uring, read by the kernel at each `FUSE_INIT`.
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// `enable_uring` as it was before the first io_uring target turned it on.
static URING_WAS: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Turns `enable_uring` on for the io_uring targets (`restore_uring` puts it back). Daemons
/// that do not ask for io_uring are not affected by it.
fn enable_uring() -> CliResult {
    let now = std::fs::read_to_string(ENABLE_URING).map_err(|e| format!("{ENABLE_URING}: {e}"))?;
    URING_WAS.get_or_init(|| now.trim().to_string());
    std::fs::write(ENABLE_URING, "Y").map_err(|e| format!("{ENABLE_URING}: {e}"))
}

/// Puts `enable_uring` back as it was before the run.
pub(crate) fn restore_uring() {
    if let Some(was) = URING_WAS.get() {
        let _ = std::fs::write(ENABLE_URING, was);
    }
}

/// Why `kind` cannot run here, if it cannot (checked before making any image).
pub(crate) fn unavailable(kind: Kind) -> Option<String> {
    match kind {
        Kind::InProc => None,
        k if k.is_nbd() && !on_path("nbdkit") => Some("nbdkit is not installed".into()),
        Kind::Tmpfs => tmpfs_base().is_none().then(|| "no tmpfs directory (/dev/shm) to use".into()),
        Kind::Kernel if !is_root() => Some("kernel loop mounts need root".into()),
        Kind::Fuse2fs if !on_path("fuse2fs") => Some("fuse2fs is not installed".into()),
        Kind::Fuse2fs if !is_root() => Some("fuse2fs mounts are run as root here; not root".into()),
        k if k.is_rext4_fuse() && !Path::new("/dev/fuse").exists() => Some("no /dev/fuse".into()),
        k if k.is_uring() && !Path::new(ENABLE_URING).exists() => {
            Some("this kernel has no FUSE over io_uring".into())
        }
        k if k.is_uring() && !is_root() => Some("enabling FUSE over io_uring needs root".into()),
        k if k.is_rext4_fuse() && rext4_exe().is_none() => Some(match REXT4.get() {
            Some(p) => format!("{}: no such program (--rext4)", p.display()),
            None => "no rext4 program beside rext4-bench or on PATH (--rext4 names one)".into(),
        }),
        k if k.is_rext4_fuse() && !is_root() && !on_path("fusermount3") => {
            Some("not root and no fusermount3 to mount with".into())
        }
        _ => None,
    }
}

/// A tmpfs directory to put images (and the tmpfs target) in: /dev/shm when it is tmpfs.
pub(crate) fn tmpfs_base() -> Option<PathBuf> {
    let shm = Path::new("/dev/shm");
    let st = nix::sys::statfs::statfs(shm).ok()?;
    (st.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC).then(|| shm.to_path_buf())
}

/// Makes an empty ext4 image as the workload asks (the same command for every target).
/// Blocks are 4 KiB unless `--mkfs` picks a size or a usage type: mke2fs makes images under
/// 512 MiB with 1 KiB blocks, so a run with fewer workers (a smaller image) would otherwise
/// measure another format, with four times the directory and inode-table blocks.
pub(crate) fn mkfs(img: &Path, spec: &ImageSpec) -> CliResult {
    let chosen = spec.extra.iter().any(|a| a.starts_with("-b") || a.starts_with("-T"));
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-N"])
        .arg(spec.inodes.to_string())
        .args(if chosen { &[][..] } else { &["-b", "4096"][..] })
        .args(&spec.extra)
        .arg(img)
        .arg(format!("{}M", spec.mib))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("mkfs.ext4: {e}"))?;
    if !out.status.success() {
        return Err(format!("mkfs.ext4: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(())
}

fn open_dir(dir: &Path) -> CliResult<Node> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags_dir()
        .open(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(Node::Fd(f))
}

trait DirFlags {
    fn custom_flags_dir(&mut self) -> &mut Self;
}

impl DirFlags for std::fs::OpenOptions {
    fn custom_flags_dir(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_DIRECTORY)
    }
}

/// A mounted target: mounts a fresh image made by [`mkfs`] (or uses a tmpfs directory).
pub(crate) fn mount(kind: Kind, work: &Path, spec: &ImageSpec) -> CliResult<Mounted> {
    let name = kind.name();
    let dir = work.join(format!("mnt-{name}"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let dir = dir.canonicalize().map_err(|e| e.to_string())?;
    let img = work.join(format!("{name}.img"));
    let guard = match kind {
        Kind::InProc | Kind::NbdUnix | Kind::NbdUnix1 | Kind::NbdTcp | Kind::NbdTcp1 => {
            return Err("the in-process targets are not mounted".into())
        }
        Kind::Tmpfs => MountGuard::none(&dir),
        Kind::Kernel => {
            mkfs(&img, spec)?;
            register(Active { dir: dir.clone(), daemon: None });
            let guard = MountGuard::none(&dir);
            let out = Command::new("mount")
                .args(["-o", "loop"])
                .arg(&img)
                .arg(&dir)
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("mount: {e}"))?;
            if !out.status.success() {
                return Err(format!("mount: {}", String::from_utf8_lossy(&out.stderr).trim()));
            }
            guard
        }
        Kind::Fuse | Kind::FuseUring | Kind::Fuse2fs | Kind::FuseMem | Kind::FuseMemUring => {
            let rext4 = || rext4_exe().map(Command::new).ok_or("no rext4 program (--rext4 names one)");
            if kind.is_uring() {
                enable_uring()?;
            }
            let mut cmd = if matches!(kind, Kind::FuseMem | Kind::FuseMemUring) {
                let mut c = rext4()?;
                c.arg("memfs").arg(&dir);
                // Each transport by name: `enable_uring` is on while the io_uring targets run.
                c.args(["-o", if kind.is_uring() { "io_uring" } else { "noio_uring" }]);
                c
            } else if matches!(kind, Kind::Fuse | Kind::FuseUring) {
                mkfs(&img, spec)?;
                let mut c = rext4()?;
                let mut opts = spec.cache_mib.map_or("rw".to_string(), |m| format!("rw,cache={m}"));
                if spec.nodelalloc {
                    opts.push_str(",nodelalloc");
                }
                if let Some(more) = &spec.fuse_opts {
                    opts = format!("{opts},{more}");
                }
                opts.push_str(if kind.is_uring() { ",io_uring" } else { ",noio_uring" });
                c.arg("mount").arg(&img).arg(&dir).args(["-o", &opts, "-f"]);
                c
            } else {
                mkfs(&img, spec)?;
                // hard_remove: libfuse's high-level layer otherwise renames a file unlinked
                // before its (asynchronous) release to `.fuse_hidden*`, and fuse2fs leaves
                // those behind, so the workloads' directories never empty.
                let mut c = Command::new("fuse2fs");
                c.arg(&img).arg(&dir).args(["-f", "-o", "hard_remove"]);
                c
            };
            // A process group of its own: the terminal's Ctrl-C reaches this process, which
            // then unmounts in order, not the daemon behind its back.
            cmd.process_group(0).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
            let mut child = cmd.spawn().map_err(|e| format!("{name}: {e}"))?;
            register(Active { dir: dir.clone(), daemon: Some(child.id()) });
            let start = Instant::now();
            while !is_mounted(&dir) {
                if let Ok(Some(st)) = child.try_wait() {
                    unregister(&dir);
                    let mut why = String::new();
                    if let Some(mut err) = child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut err, &mut why);
                    }
                    let why = why.lines().next().unwrap_or("").trim().to_string();
                    return Err(format!("{name} exited before mounting ({st}): {why}"));
                }
                if start.elapsed() > Duration::from_secs(30) {
                    let _ = child.kill();
                    let _ = child.wait();
                    unregister(&dir);
                    return Err(format!("{name} did not mount within 30 s"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // Nobody reads the daemon's stderr from now on.
            drop(child.stderr.take());
            MountGuard { dir: dir.clone(), daemon: Some(child) }
        }
    };
    let root = open_dir(&dir)?;
    Ok(Mounted { kind, root, guard })
}

/// A read-only or read-write kernel loop mount of an existing image, unmounted on drop (the
/// `walk` and `journal` workloads, and looking at what rext4 wrote).
pub(crate) struct KernelMount {
    pub dir: PathBuf,
}

impl KernelMount {
    /// A read-only mount.
    pub(crate) fn new(image: &Path, dir: &Path) -> CliResult<Self> {
        Self::mount(image, dir, "loop,ro")
    }

    /// A read-write mount.
    pub(crate) fn new_rw(image: &Path, dir: &Path) -> CliResult<Self> {
        Self::mount(image, dir, "loop")
    }

    fn mount(image: &Path, dir: &Path, opts: &str) -> CliResult<Self> {
        if !is_root() {
            return Err("kernel loop mounts need root".into());
        }
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let dir = dir.canonicalize().map_err(|e| e.to_string())?;
        register(Active { dir: dir.clone(), daemon: None });
        let out = Command::new("mount")
            .args(["-o", opts])
            .arg(image)
            .arg(&dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            unregister(&dir);
            return Err(format!("mount failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(KernelMount { dir })
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        unmount(&self.dir);
        unregister(&self.dir);
    }
}

/// The in-process target on a fresh image.
pub(crate) fn inproc(work: &Path, spec: &ImageSpec) -> CliResult<InProc> {
    let img = work.join("inproc.img");
    mkfs(&img, spec)?;
    InProc::open(&img, spec)
}

/// The path of a target's image in `work` (in-process and image-backed mounts).
pub(crate) fn image_path(work: &Path, kind: Kind) -> PathBuf {
    work.join(format!("{}.img", kind.name()))
}

// ---------------------------------------------------------------------------------------
// NBD.

/// An `nbdkit file` server on the image of an NBD target; stopped (SIGTERM, then waited
/// for) by [`NbdServer::stop`] or on drop.
struct NbdServer {
    child: Option<Child>,
    /// The directory of its Unix socket (registered in [`ACTIVE`] under this name).
    dir: PathBuf,
}

impl NbdServer {
    /// Serves `img` as export `bench` over a Unix socket in `work` or on a free loopback
    /// TCP port; returns the server and the engine's address of the export.
    fn start(kind: Kind, work: &Path, img: &Path) -> CliResult<(NbdServer, String)> {
        let dir = work.join(format!("nbd-{}", kind.name()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let one = matches!(kind, Kind::NbdUnix1 | Kind::NbdTcp1);
        let mut cmd = Command::new("nbdkit");
        // --exit-with-parent: the server goes with this process, however it ends.
        cmd.args(["--foreground", "--exit-with-parent", "-e", "bench"]);
        let (address, ready): (String, Box<dyn Fn() -> bool>) = match kind {
            Kind::NbdUnix | Kind::NbdUnix1 => {
                let sock = dir.join("nbd.sock");
                cmd.arg("-U").arg(&sock);
                let q = if one { "&connections=1" } else { "" };
                let a = format!("nbd+unix:///bench?socket={}{q}", sock.display());
                (a, Box::new(move || std::os::unix::net::UnixStream::connect(&sock).is_ok()))
            }
            _ => {
                // A port free now; another program taking it before nbdkit does makes
                // nbdkit exit, which is reported below.
                let port = std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .map_err(|e| format!("a free TCP port: {e}"))?
                    .port();
                cmd.args(["-i", "127.0.0.1", "-p", &port.to_string()]);
                let q = if one { "?connections=1" } else { "" };
                let a = format!("nbd://127.0.0.1:{port}/bench{q}");
                (a, Box::new(move || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()))
            }
        };
        cmd.arg("file").arg(img);
        // Its messages go to a file: a pipe nobody reads would stop it at its next message.
        let log_path = dir.join("nbdkit.log");
        let log = File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        cmd.process_group(0).stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        let child = cmd.spawn().map_err(|e| format!("nbdkit: {e}"))?;
        register(Active { dir: dir.clone(), daemon: Some(child.id()) });
        let mut srv = NbdServer { child: Some(child), dir };
        let start = Instant::now();
        while !ready() {
            let child = srv.child.as_mut().ok_or("nbdkit is gone")?;
            if let Ok(Some(st)) = child.try_wait() {
                let why = std::fs::read_to_string(&log_path).unwrap_or_default();
                return Err(format!("nbdkit exited at start ({st}): {}", why.trim()));
            }
            if start.elapsed() > Duration::from_secs(20) {
                return Err("nbdkit did not listen within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok((srv, address))
    }

    /// Stops the server, once the engine has closed its connections. SIGKILL: this process
    /// blocks SIGTERM for its signal thread and children inherit that mask, and the file
    /// plugin holds nothing unwritten (every write was answered, and flushed at unmount).
    fn stop(mut self) {
        self.terminate();
    }

    fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        unregister(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// An NBD target: a fresh image (as [`inproc`] makes) served by nbdkit and opened in process
/// through its address.
pub(crate) fn nbd(kind: Kind, work: &Path, spec: &ImageSpec) -> CliResult<InProc> {
    let img = image_path(work, kind);
    mkfs(&img, spec)?;
    let (srv, address) = NbdServer::start(kind, work, &img)?;
    InProc::open_address(kind, &address, Some(srv), spec)
}
