//! `rext4 mount IMAGE MOUNTPOINT [-o OPTIONS] [-f]`: serve an image through FUSE.
//!
//! Without `-f` the command starts itself again as a detached daemon (`-f --daemon-child`)
//! and returns once that daemon has mounted the image, or with its error. A read-write
//! daemon holds the engine's exclusive `flock` on the image while it runs (as every rext4
//! writer does), so a second writer fails at once; it is released only after the journal is
//! committed and the image marked clean, so `flock IMAGE true` waits for a daemon that is
//! finishing after `umount`.
//!
//! Unmounting (`umount`, `fusermount3 -u`) or SIGTERM / SIGINT / SIGHUP ends the daemon
//! cleanly: the filesystem is unmounted (lazily if busy), the journal committed and the image
//! left clean.

use crate::CliResult;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use rext4_fuse::MountOptions;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The daemon's first line on its status pipe once it is mounted.
const READY: &str = "ready";

/// `rext4 mount`.
pub(crate) fn run(
    image: &Path,
    mountpoint: &Path,
    options: &[String],
    foreground: bool,
    child: bool,
) -> CliResult {
    let mut opts = MountOptions::default();
    for o in options {
        opts.add(o)?;
    }
    opts.validate()?;
    let image = absolute_address(image)?;
    rext4_fuse::check_mountpoint(mountpoint)?;
    let mountpoint = mountpoint.canonicalize().map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    if opts.fsname.is_none() {
        let s = image.to_string_lossy();
        if !s.contains([',', ' ', '\\', '\n']) {
            opts.fsname = Some(s.into_owned());
        }
    }
    // Mounted already (by its daemon, which holds the image): the kernel mounts a device twice
    // as one superblock on two mount points, and so does this, with a bind of that mount.
    if !child {
        if let Some((existing, ro)) = opts.fsname.as_deref().and_then(rext4_fuse::mounted_image) {
            if existing != mountpoint {
                rext4_fuse::bind(&existing, ro, &mountpoint, &opts).map_err(|e| e.to_string())?;
                return Ok(());
            }
        }
    }
    if foreground || child {
        let _ = std::env::set_current_dir("/");
        close_inherited_fds();
        serve(&image, &mountpoint, &opts, child)
    } else {
        daemonize(&image, &mountpoint, options)
    }
}

/// The image's address made absolute (the daemon runs in `/`): a file's path, and the disk
/// of a partition (`disk.img@2`), canonicalized; an NBD address as given.
fn absolute_address(image: &Path) -> CliResult<std::path::PathBuf> {
    let canon = |p: &Path| p.canonicalize().map_err(|e| format!("{}: {e}", p.display()));
    match rext4::dev::Address::parse(image).map_err(|e| format!("{}: {e}", image.display()))? {
        rext4::dev::Address { target: rext4::dev::address::Target::File(f), partition: Some(_) } => {
            let s = image.to_string_lossy();
            let suffix = &s[f.to_string_lossy().len()..];
            Ok(std::path::PathBuf::from(format!("{}{suffix}", canon(&f)?.display())))
        }
        rext4::dev::Address { target: rext4::dev::address::Target::Nbd(_), .. } => Ok(image.to_path_buf()),
        _ => canon(image),
    }
}

/// Closes every descriptor above stderr that the caller let this process inherit. The
/// daemon outlives its caller, and a descriptor it kept on a file in some other mount (a
/// test harness's log in another rext4 mount, say) would keep that mount busy for as long
/// as this one is mounted: `umount` of it would say "target is busy".
fn close_inherited_fds() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return };
    let fds: Vec<i32> =
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).filter(|&fd| fd > 2).collect();
    // The directory's own descriptor is among them; closed already, it gives EBADF.
    for fd in fds {
        let _ = nix::unistd::close(fd);
    }
}

/// Starts the daemon and waits for its word: mounted, or why not.
fn daemonize(image: &Path, mountpoint: &Path, options: &[String]) -> CliResult {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the rext4 executable: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount").arg(image).arg(mountpoint);
    for o in options {
        cmd.arg("-o").arg(o);
    }
    cmd.arg("--daemon-child").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("cannot start the daemon: {e}"))?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    if line.trim_end() == READY {
        // What the daemon said before it mounted (journal recovery, a filesystem with errors)
        // is the user's to see; what it says later has no terminal to go to.
        if let Some(err) = child.stderr.take() {
            let fd = std::os::fd::AsFd::as_fd(&err);
            if nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK)).is_ok() {
                let mut said = Vec::new();
                let _ = std::io::Read::read_to_end(&mut { err }, &mut said);
                eprint!("{}", String::from_utf8_lossy(&said));
            }
        }
        return Ok(());
    }
    // The daemon stopped before mounting: its stderr says why.
    let mut why = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut why);
    }
    let _ = child.wait();
    let why = why.trim().trim_start_matches("rext4: ").to_string();
    Err(if why.is_empty() { "the daemon stopped before mounting".into() } else { why })
}

/// Opens the image through the engine, whose writable open holds the image's lock (and refuses
/// an image another rext4 process or a kernel mount is writing) until it is closed clean. A
/// daemon whose mount is gone may still be writing the image home after `umount` (which does
/// not wait for it): a mount right after an unmount (a test suite's remount cycle) waits for
/// it, as it would wait for the kernel.
fn open_image(image: &Path, opts: &MountOptions) -> CliResult<rext4::Fs> {
    let start = std::time::Instant::now();
    loop {
        match rext4::Fs::open_with(image, opts.engine_options()) {
            Err(rext4::Error::InUse(why))
                if why.contains("another rext4 process")
                    && !mounted_from(image)
                    && start.elapsed() <= UNMOUNT_WAIT =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r.map_err(|e| format!("{}: {e}", image.display())),
        }
    }
}

/// How long a mount waits for a daemon that is finishing after its unmount.
const UNMOUNT_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// Whether some mount in the mount table has `image` as its source (a rext4 daemon's
/// mount shows the image's path, unless `fsname=` named it otherwise).
fn mounted_from(image: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    let want = image.to_string_lossy();
    info.lines().any(|l| {
        let mut after = l.split(" - ").nth(1).unwrap_or("").split(' ');
        after.next().is_some_and(|t| t.starts_with("fuse")) && after.next() == Some(&*want)
    })
}

fn serve(image: &Path, mountpoint: &Path, opts: &MountOptions, child: bool) -> CliResult {
    if child {
        // A session of its own, so the terminal's signals and hangups do not reach it.
        let _ = nix::unistd::setsid();
    }
    // Block the stop signals before any thread starts, so that every thread inherits the mask
    // and only the waiter below sees them.
    let mut signals = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        signals.add(s);
    }
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&signals), None)
        .map_err(|e| format!("cannot block signals: {e}"))?;

    let fs = open_image(image, opts)?;
    if let Some(r) = fs.recovery() {
        let fast = if r.fast_commit_tags > 0 {
            format!(", {} fast-commit records applied", r.fast_commit_tags)
        } else {
            String::new()
        };
        rext4_fuse::log(&format!(
            "{}: journal recovered at mount: {} transactions, {} blocks replayed{fast}",
            image.display(),
            r.transactions,
            r.blocks_replayed
        ));
    }
    for why in fs.read_only_reasons() {
        rext4_fuse::log(&format!("{}: {why}", image.display()));
    }
    if fs.has_errors() {
        // As the kernel warns at such a mount.
        rext4_fuse::log(&format!(
            "{}: warning: mounting a filesystem with errors, running e2fsck is recommended",
            image.display()
        ));
    }
    let engine = fs.clone();
    let mount =
        rext4_fuse::Mount::new(fs, mountpoint, opts).map_err(|e| rext4_fuse::mount_error(mountpoint, &e))?;
    // `rext4 stats MOUNTPOINT` asks here; a mount without it still serves files.
    let stats_socket = crate::stats_cmd::serve(engine, mountpoint)
        .map_err(|e| rext4_fuse::log(&format!("statistics socket: {e}")))
        .ok();

    let mp: PathBuf = mountpoint.to_path_buf();
    std::thread::Builder::new()
        .name("rext4-signals".into())
        .spawn(move || loop {
            match signals.wait() {
                Ok(sig) => {
                    rext4_fuse::log(&format!("{sig}: unmounting {}", mp.display()));
                    if let Err(e) = rext4_fuse::unmount(&mp, true) {
                        rext4_fuse::log(&format!("unmount {}: {e}", mp.display()));
                    }
                }
                Err(e) => {
                    rext4_fuse::log(&format!("waiting for signals: {e}"));
                    return;
                }
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;

    if child {
        let mut out = std::io::stdout();
        let _ = writeln!(out, "{READY}");
        let _ = out.flush();
        // Nobody reads the status pipe or stderr from now on.
        if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
            let _ = nix::unistd::dup2_stdout(&null);
            let _ = nix::unistd::dup2_stderr(&null);
        }
    }
    let r = mount.run().map_err(|e| format!("{}: {e}", image.display()));
    if let Some(path) = stats_socket {
        let _ = std::fs::remove_file(path);
    }
    r
}
