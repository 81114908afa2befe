//! Why a mount cannot be made, in words that name the cause: a mount point that is a FUSE
//! mount whose daemon died, and a user who may not use `/dev/fuse` or has no `fusermount3`
//! (the kernel's errno alone would blame the mount point).

use std::io;
use std::path::Path;

/// Checks that `dir` can be mounted on: a directory, and not a dead FUSE mount.
pub fn check_mountpoint(dir: &Path) -> Result<(), String> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("{}: not a directory", dir.display())),
        // What stat of a FUSE mount whose daemon is gone answers.
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Err(format!(
            "{0} is a stale FUSE mount (its daemon is gone): clear it with `umount -l {0}` or \
             `fusermount3 -uz {0}`",
            dir.display()
        )),
        Err(e) => Err(format!("{}: {e}", dir.display())),
    }
}

fn fusermount_installed() -> bool {
    let Some(path) = std::env::var_os("PATH") else { return false };
    std::env::split_paths(&path).any(|d| d.join("fusermount3").is_file() || d.join("fusermount").is_file())
}

/// The message for a mount on `dir` that failed with `e`.
pub fn mount_error(dir: &Path, e: &io::Error) -> String {
    let root = nix::unistd::geteuid().is_root();
    let dev = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse");
    match (e.raw_os_error(), dev) {
        (Some(libc::EACCES | libc::EPERM | libc::ENOENT), Err(d)) => format!(
            "cannot mount on {}: /dev/fuse: {d}: this user may not use FUSE (give it read and \
             write access to /dev/fuse, mode 0666 as fuse3 installs it, or its group; or mount as root)",
            dir.display()
        ),
        // Without root the mount goes through the setuid fusermount3.
        (Some(libc::ENOENT | libc::EPERM | libc::EACCES), Ok(_)) if !root && !fusermount_installed() => {
            format!(
                "cannot mount on {}: a user other than root mounts through the setuid `fusermount3`, \
             which is not installed (package fuse3)",
                dir.display()
            )
        }
        _ => format!("cannot mount on {}: {e}", dir.display()),
    }
}
