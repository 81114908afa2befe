//! The mount's backing-device settings (`/sys/class/bdi/MAJOR:MINOR`): its readahead
//! window. A FUSE mount's starts at the kernel's 128 KiB and `max_readahead` in `FUSE_INIT`
//! can only lower it, so a large sequential read reaches the daemon in 128 KiB requests; the
//! window is raised to the largest request the daemon takes, as an administrator would with
//! `blockdev --setra` on a disk. Sequential reads through the mount: 1.6-1.7 GB/s at 128 KiB,
//! 2.0-2.1 GB/s at 1 MiB (docs/bench.md). Small random reads keep their small windows: the
//! kernel grows a window only for a sequential stream.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The readahead window the mount is given, in KiB: one request of the largest size but a
/// page, so that the reply to a whole window and its header fit in the 1 MiB pipe any
/// process may have (splice.rs; `/proc/sys/fs/pipe-max-size`): 256 page buffers.
pub(crate) const READ_AHEAD_KB: u32 = (crate::adapter::MAX_IO - 4096) / 1024;

/// The sysfs file holding the readahead window of the filesystem mounted at `mountpoint`,
/// found in `/proc/self/mountinfo` (a `stat` of the mount would be a request to the daemon,
/// which may not be serving yet); the newest mount there wins.
fn read_ahead_file(mountpoint: &Path) -> std::io::Result<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let want = mountpoint.as_os_str().as_bytes();
    info.lines()
        .rev()
        .find_map(|l| {
            let mut f = l.split(' ');
            let dev = f.nth(2)?;
            let point = f.nth(1)?;
            (unescape(point) == want).then_some(dev)
        })
        .map(|dev| PathBuf::from(format!("/sys/class/bdi/{dev}/read_ahead_kb")))
        .ok_or_else(|| {
            std::io::Error::other(format!("{} is not in /proc/self/mountinfo", mountpoint.display()))
        })
}

/// A mountinfo path field: space, tab, newline and backslash are written as `\ooo`.
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        let byte =
            octal.and_then(|d| u8::try_from(d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'))).ok());
        if let (b'\\', Some(v)) = (b[i], byte) {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Sets the readahead window of the mount at `mountpoint`, after the handshake (its
/// `max_readahead` would lower the window again). Only root may: without the privilege the
/// mount keeps the kernel's window.
pub(crate) fn apply(mountpoint: &Path) -> std::io::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let file = read_ahead_file(mountpoint)?;
    std::fs::write(&file, READ_AHEAD_KB.to_string())
        .map_err(|e| std::io::Error::other(format!("{}: {e}", file.display())))
}

#[cfg(test)]
mod tests {
    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(super::unescape(r"/mnt/a\040b\011c"), b"/mnt/a b\tc");
        assert_eq!(super::unescape(r"/x\134y"), b"/x\\y");
        // Not an escape (or past a byte): kept as it is.
        assert_eq!(super::unescape(r"/x\9ab\777\04"), br"/x\9ab\777\04");
    }
}
