//! The mount's own VFS flags that fuser cannot ask for at mount time (`strictatime`,
//! `nodiratime`; `noatime` for symmetry): set by a bind remount of the fresh mount, as
//! `mount -o remount,bind,...` would, so the kernel keeps access times as ext4's mount would.

use crate::options::{Atime, MountOptions};
use nix::mount::MsFlags;
use std::io;
use std::path::Path;

/// The per-mount flags the options ask for, or `None` when the kernel's defaults (relatime,
/// diratime) are what they ask for.
fn wanted(opts: &MountOptions) -> Option<MsFlags> {
    if opts.atime == Atime::Relatime && !opts.nodiratime {
        return None;
    }
    Some(per_mount(opts))
}

/// The flags of a bind remount that gives a mount every per-mount flag `opts` ask for.
pub(crate) fn per_mount(opts: &MountOptions) -> MsFlags {
    let has = |f: &str| opts.kernel_flags.iter().any(|k| k == f);
    // A bind remount sets every per-mount flag at once: repeat the ones the mount has.
    let mut f = MsFlags::MS_REMOUNT | MsFlags::MS_BIND;
    f |= match opts.atime {
        Atime::Relatime => MsFlags::MS_RELATIME,
        Atime::NoAtime => MsFlags::MS_NOATIME,
        Atime::Strict => MsFlags::MS_STRICTATIME,
    };
    if opts.nodiratime {
        f |= MsFlags::MS_NODIRATIME;
    }
    if opts.read_only {
        f |= MsFlags::MS_RDONLY;
    }
    if !has("suid") {
        f |= MsFlags::MS_NOSUID;
    }
    if !has("dev") {
        f |= MsFlags::MS_NODEV;
    }
    if has("noexec") {
        f |= MsFlags::MS_NOEXEC;
    }
    f
}

/// Applies the access-time flags to the mount on `mountpoint`. Without the privilege
/// (a mount through fusermount3) the mount keeps relatime, and the caller is told.
pub(crate) fn apply(mountpoint: &Path, opts: &MountOptions) -> io::Result<()> {
    let Some(flags) = wanted(opts) else { return Ok(()) };
    nix::mount::mount(None::<&str>, mountpoint, None::<&str>, flags, None::<&str>)
        .map_err(|e| io::Error::other(format!("setting the access-time flags of the mount: {e}")))
}
