//! The binary as mount(8)'s and umount(8)'s helpers for the type `fuse.rext4`
//! (`/sbin/mount.fuse.rext4`, `/sbin/umount.fuse.rext4`: links to it by those names).
//!
//! The umount helper exists because the kernel does not wait for a FUSE daemon at unmount:
//! `umount` would return while the daemon still writes the image home, and a check or mount
//! of the image right after it would find it in use or not yet clean. The helper unmounts,
//! then waits until the daemon has let go of the image, as `umount` of a kernel ext4 mount
//! returns once everything is written.

use crate::CliResult;
use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
/// The name mount(8) runs for `-t fuse.rext4` (and fstab lines of that type): a link to
/// this binary by that name makes it the helper.
const HELPER_NAME: &str = "mount.fuse.rext4";

/// If this process runs as `mount.fuse.rext4` (or `umount.fuse.rext4`), serves as mount(8)'s
/// (or umount(8)'s) helper and returns its exit code; otherwise `None`.
///
/// mount(8) runs `mount.fuse.rext4 SOURCE DIR [-sfnv] [-o OPTIONS] [-t TYPE]`. A remount
/// (`-o remount,...`) is the kernel's business: it is handed back to mount(8) with `-i`, which
/// does it without a helper.
pub(crate) fn helper_main() -> Option<std::process::ExitCode> {
    let mut args = std::env::args_os();
    let argv0 = args.next()?;
    let name = Path::new(&argv0).file_name()?.to_string_lossy().into_owned();
    let rest: Vec<std::ffi::OsString> = args.collect();
    let r = if name.ends_with(UMOUNT_NAME) {
        umount_helper(rest)
    } else if name.ends_with(HELPER_NAME) || fuse_helper_call(&rest) {
        helper(rest)
    } else {
        return None;
    };
    let code = match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{name}: {e}");
            // mount(8)'s "mount failure".
            32
        }
    };
    Some(std::process::ExitCode::from(code))
}

/// Whether `rext4` was run the way fuse3's generic `mount.fuse` runs a `fuse.TYPE` mount's
/// program: `rext4 SOURCE DIR -o OPTIONS` (where no `mount.fuse.rext4` helper is installed,
/// mount(8) hands `-t fuse.rext4` mounts and remounts to `mount.fuse`, which runs `rext4` from
/// PATH). An existing file or device and an existing directory before any flag; a subcommand
/// is never an existing path there.
fn fuse_helper_call(args: &[std::ffi::OsString]) -> bool {
    match args {
        [source, dir, flag, ..] => {
            Path::new(source).exists()
                && Path::new(dir).is_dir()
                && flag.to_str().is_some_and(|f| f.starts_with("-o"))
        }
        _ => false,
    }
}

fn helper(args: Vec<std::ffi::OsString>) -> CliResult {
    let usage = || format!("usage: {HELPER_NAME} SOURCE DIR [-sfnv] [-o OPTIONS] [-t fuse.rext4]");
    let (mut positional, mut options, mut fake) = (Vec::new(), Vec::new(), false);
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-o") => options.push(it.next().and_then(|o| o.into_string().ok()).ok_or_else(usage)?),
            Some("-t") => {
                let t = it.next().ok_or_else(usage)?;
                if !matches!(t.to_str(), Some("fuse.rext4" | "rext4")) {
                    return Err(format!("{}: not the fuse.rext4 type", t.to_string_lossy()));
                }
            }
            // Also from mount(8): no mtab (-n), sloppy (-s), verbose (-v) need nothing here.
            Some("-f") => fake = true,
            Some("-n" | "-s" | "-v") => {}
            Some("-N") => return Err("-N (another mount namespace) is not supported".into()),
            Some(o) if o.starts_with("-o") => options.push(o[2..].to_string()),
            Some(o) if o.starts_with('-') && o.len() > 1 => {
                return Err(format!("unknown flag {o}\n{}", usage()))
            }
            _ => positional.push(PathBuf::from(a)),
        }
    }
    let [source, dir] = <[PathBuf; 2]>::try_from(positional).map_err(|_| usage())?;
    let all = options.join(",");
    if all.split(',').any(|o| o == "remount") {
        let st = Command::new("mount").arg("-i").arg("-o").arg(&all).arg(&dir).status();
        return match st {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("mount -i -o {all} {}: {s}", dir.display())),
            Err(e) => Err(format!("cannot run mount: {e}")),
        };
    }
    if fake {
        return Ok(());
    }
    crate::mount_cmd::run(&source, &dir, &options, false, false)
}

/// The name umount(8) runs for a `fuse.rext4` mount.
const UMOUNT_NAME: &str = "umount.fuse.rext4";

/// How long the umount helper waits for the daemon to write the image home.
const DAEMON_WAIT: Duration = Duration::from_secs(120);

/// The (source, mount point) of the mount table's entry for `arg` (its mount point, or the
/// image it serves).
fn find_mount(arg: &Path) -> Option<(PathBuf, PathBuf)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = arg.canonicalize().unwrap_or_else(|_| arg.to_path_buf());
    let unescape = |s: &str| s.replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\");
    // The last entry is the one on top, as umount(8) takes it.
    info.lines().rev().find_map(|l| {
        let target = PathBuf::from(unescape(l.split(' ').nth(4)?));
        let source = PathBuf::from(unescape(l.split(" - ").nth(1)?.split(' ').nth(1)?));
        (target == want || source == want).then_some((source, target))
    })
}

/// umount(8) runs `umount.fuse.rext4 DIR [-nlfvr] [-N NS] [-t TYPE]`.
fn umount_helper(args: Vec<std::ffi::OsString>) -> CliResult {
    let (mut lazy, mut force, mut dir) = (false, false, None);
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-l") => lazy = true,
            Some("-f") => force = true,
            Some("-n" | "-v" | "-r" | "-i") => {}
            Some("-t") => {
                it.next();
            }
            Some("-N") => return Err("-N (another mount namespace) is not supported".into()),
            _ => dir = Some(PathBuf::from(a)),
        }
    }
    let dir = dir.ok_or_else(|| format!("usage: {UMOUNT_NAME} DIR [-nlfv]"))?;
    let (source, target) = find_mount(&dir).ok_or_else(|| format!("{}: not mounted", dir.display()))?;
    let mut flags = nix::mount::MntFlags::empty();
    if lazy {
        flags |= nix::mount::MntFlags::MNT_DETACH;
    }
    if force {
        flags |= nix::mount::MntFlags::MNT_FORCE;
    }
    match nix::mount::umount2(&target, flags) {
        Ok(()) => {}
        Err(nix::errno::Errno::EBUSY) => return Err(format!("{}: target is busy", target.display())),
        Err(nix::errno::Errno::EPERM) => {
            // Not root: the setuid fusermount3 unmounts the user's own FUSE mounts.
            let mut c = Command::new("fusermount3");
            c.arg("-u");
            if lazy {
                c.arg("-z");
            }
            let st = c.arg(&target).status().map_err(|e| format!("cannot run fusermount3: {e}"))?;
            if !st.success() {
                return Err(format!("fusermount3 -u {}: {st}", target.display()));
            }
        }
        Err(e) => return Err(format!("{}: {e}", target.display())),
    }
    // A lazy unmount goes when its last user does: nothing to wait for now.
    if !lazy {
        wait_for_daemon(&source);
    }
    Ok(())
}

/// Waits until no daemon holds `image`'s lock (it has committed, marked the image clean and
/// exited). A source that is not a file (`fsname=` named it otherwise) cannot be waited for.
fn wait_for_daemon(image: &Path) {
    let Ok(f) = File::open(image) else { return };
    let start = Instant::now();
    let mut f = f;
    loop {
        match Flock::lock(f, FlockArg::LockSharedNonblock) {
            Ok(_) => return,
            Err((back, nix::errno::Errno::EWOULDBLOCK)) if start.elapsed() < DAEMON_WAIT => {
                f = back;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => return,
        }
    }
}
