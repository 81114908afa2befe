//! rext4-fuse: serves a [`rext4::Fs`] to the kernel through FUSE.
//!
//! ```no_run
//! let opts = rext4_fuse::MountOptions::parse("rw,allow_other").unwrap();
//! let fs = rext4::Fs::open_with("disk.img", opts.engine_options())?;
//! rext4_fuse::mount(fs, "/mnt".as_ref(), &opts)?; // returns once unmounted, image clean
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Only the adapter lives here: option parsing (options.rs), lookup counts and file handles
//! (handles.rs), errno and `errors=` policy (errno.rs), attribute translation (attr.rs), the
//! `fuser::Filesystem` implementation (adapter.rs) and the work its requests share (ops.rs,
//! readdir.rs, splice.rs, ioctl.rs, acl.rs, locks.rs, sync_opts.rs), the connection's settings (init.rs);
//! memfs.rs serves an in-memory filesystem with the same settings, the benchmark's measure of
//! what FUSE itself costs. Daemonizing, the image lock and signals belong to the `rext4 mount`
//! command.
#![forbid(unsafe_code)]

mod acl;
mod adapter;
mod attr;
mod bdi;
mod bind;
mod diagnose;
mod errno;
pub mod fscrypt;
mod handles;
mod init;
mod ioctl;
mod killpriv;
mod locks;
mod memfs;
mod ops;
mod options;
mod readdir;
mod splice;
mod sync_opts;
mod vfs_flags;

pub use bind::{bind, mounted_image};
pub use diagnose::{check_mountpoint, mount_error};
pub use fuser::TransportStats;
pub use memfs::serve_memfs;
pub use options::{load_key, Atime, ErrorBehavior, LockMode, MountOptions};

use adapter::{Adapter, Shared};
use errno::ErrorPolicy;
use fuser::{Config, MountOption, Session, SessionACL};
use rext4::Fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Writes one line to standard error, ignoring failure (a daemon's stderr may be gone).
pub fn log(msg: &str) {
    use std::io::Write;
    let _ = writeln!(io::stderr(), "rext4: {msg}");
}

/// A mounted filesystem, not yet serving requests.
pub struct Mount {
    session: Session<Adapter>,
    shared: Arc<Shared>,
    mountpoint: PathBuf,
}

impl Mount {
    /// Mounts `fs` on `mountpoint` (the kernel's handshake included). Requests are served by
    /// [`Mount::run`].
    pub fn new(fs: Fs, mountpoint: &Path, opts: &MountOptions) -> io::Result<Mount> {
        opts.validate().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        if fs.is_writable() == opts.read_only {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the filesystem's open mode does not match the ro/rw option",
            ));
        }
        // The engine's setting (the superblock's, or `errors=` through `engine_options`).
        let behavior = fs.error_behavior();
        let shared = Arc::new(Shared::new(fs, ErrorPolicy::new(behavior), opts.clone()));
        let session = Session::new(Adapter { shared: shared.clone() }, mountpoint, &fuser_config(opts))?;
        // Cannot fail: set once, here, before any request is served.
        let _ = shared.notifier.set(session.notifier());
        let mountpoint = mountpoint.canonicalize().unwrap_or_else(|_| mountpoint.to_path_buf());
        if let Err(e) = vfs_flags::apply(&mountpoint, opts) {
            log(&format!("{e}; the mount keeps relatime"));
        }
        if let Err(e) = bdi::apply(&mountpoint) {
            log(&format!("{e}; the mount keeps the kernel's readahead window"));
        }
        Ok(Mount { session, shared, mountpoint })
    }

    /// Where the filesystem is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// How many requests each transport served (io_uring queues or /dev/fuse reads).
    pub fn transport_stats(&self) -> Arc<TransportStats> {
        self.session.transport_stats()
    }

    /// Serves requests on the configured number of threads until the filesystem is unmounted
    /// (`umount`, `fusermount3 -u`, or [`unmount`]); then releases every inode the kernel
    /// still held, commits the journal and marks the image clean.
    pub fn run(self) -> io::Result<()> {
        let Mount { session, shared, .. } = self;
        let stats = session.transport_stats();
        let served = match session.run() {
            // The connection going away is how every session ends; which errno a worker sees
            // depends on how the kernel tore it down.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENODEV | libc::ECONNABORTED)) => {
                log(&format!("session ended: {e}"));
                Ok(())
            }
            r => r,
        };
        if shared.opts.io_uring == Some(true) || stats.uring_requests() > 0 {
            log(&format!(
                "io_uring: {} requests served by {} rings",
                stats.uring_requests(),
                stats.uring_queues()
            ));
        }
        shared.release_all();
        let closed = shared.fs.unmount().map_err(io::Error::from);
        served.and(closed)
    }
}

/// Mounts `fs` on `mountpoint` and serves it until it is unmounted; returns once the image is
/// committed and clean.
pub fn mount(fs: Fs, mountpoint: &Path, opts: &MountOptions) -> io::Result<()> {
    Mount::new(fs, mountpoint, opts)?.run()
}

/// A mount served by a background thread.
pub struct Background {
    thread: std::thread::JoinHandle<io::Result<()>>,
    mountpoint: PathBuf,
    stats: Arc<TransportStats>,
}

impl Background {
    /// Where the filesystem is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// How many requests each transport served.
    pub fn transport_stats(&self) -> &TransportStats {
        &self.stats
    }

    /// Unmounts and waits until the image is committed and clean. If files on the mount stay
    /// open for seconds, detaches it instead (it goes once they are closed) and returns
    /// `EBUSY` without waiting.
    pub fn unmount(self) -> io::Result<()> {
        for _ in 0..50 {
            match unmount(&self.mountpoint, false) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(100))
                }
                Err(e) => return Err(e),
                Ok(()) => return self.join(),
            }
        }
        unmount(&self.mountpoint, true)?;
        Err(io::Error::from_raw_os_error(libc::EBUSY))
    }

    /// Waits for the mount to end (unmounted by someone else).
    pub fn join(self) -> io::Result<()> {
        self.thread.join().map_err(|_| io::Error::other("the FUSE session panicked"))?
    }
}

/// Mounts `fs` on `mountpoint` and serves it from a background thread.
pub fn spawn(fs: Fs, mountpoint: &Path, opts: &MountOptions) -> io::Result<Background> {
    let m = Mount::new(fs, mountpoint, opts)?;
    let mountpoint = m.mountpoint().to_path_buf();
    let stats = m.transport_stats();
    let thread = std::thread::Builder::new().name("rext4-fuse".into()).spawn(move || m.run())?;
    Ok(Background { thread, mountpoint, stats })
}

/// Unmounts a FUSE mount. A busy mount is an error (`EBUSY`) unless `lazy`, when it is
/// detached and goes once its last user closes it. Without the privilege to unmount, goes
/// through `fusermount3 -u` (`-z` when lazy).
pub fn unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    use nix::errno::Errno;
    match nix::mount::umount(mountpoint) {
        Ok(()) => Ok(()),
        Err(Errno::EBUSY) if lazy => {
            nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH).map_err(io::Error::from)
        }
        Err(Errno::EPERM) => {
            let mut cmd = std::process::Command::new("fusermount3");
            cmd.arg("-u");
            if lazy {
                cmd.arg("-z");
            }
            if cmd.arg(mountpoint).status()?.success() {
                Ok(())
            } else {
                Err(io::Error::other(format!("fusermount3 -u {} failed", mountpoint.display())))
            }
        }
        Err(e) => Err(e.into()),
    }
}

fn fuser_config(opts: &MountOptions) -> Config {
    let mut mo = vec![
        MountOption::FSName(opts.fsname.clone().unwrap_or_else(|| "rext4".into())),
        if opts.read_only { MountOption::RO } else { MountOption::RW },
    ];
    if !opts.subtype.is_empty() {
        // The kernel's own `subtype=` (fuser passes `Subtype` only to fusermount3), so the
        // mount table says `fuse.rext4` and mount(8) finds `mount.fuse.rext4` for a remount.
        mo.push(MountOption::CUSTOM(format!("subtype={}", opts.subtype)));
    }
    if opts.default_permissions {
        mo.push(MountOption::DefaultPermissions);
    }
    for f in &opts.kernel_flags {
        mo.push(match f.as_str() {
            "dev" => MountOption::Dev,
            "nodev" => MountOption::NoDev,
            "suid" => MountOption::Suid,
            "nosuid" => MountOption::NoSuid,
            "exec" => MountOption::Exec,
            "noexec" => MountOption::NoExec,
            "sync" => MountOption::Sync,
            "async" => MountOption::Async,
            "dirsync" => MountOption::DirSync,
            other => MountOption::CUSTOM(other.to_string()),
        });
    }
    let mut c = Config::default();
    c.mount_options = mo;
    c.acl = if opts.allow_other { SessionACL::All } else { SessionACL::Owner };
    c.n_threads = Some(opts.thread_count());
    c.clone_fd = true;
    c
}
