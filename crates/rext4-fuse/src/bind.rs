//! A second mount of an image already mounted: the kernel mounts a block device twice by
//! giving both mount points the one superblock it has (`get_tree_bdev` finds it), so both
//! show the same files at once. An image has one daemon (it holds the image's lock), so a
//! second `rext4 mount` of it is that daemon's mount bound onto the new mount point, with
//! the per-mount flags the new options ask for; unmounting either leaves the other, and the
//! daemon ends with the last.

use crate::options::MountOptions;
use nix::mount::MsFlags;
use std::io;
use std::path::{Path, PathBuf};

/// A rext4 mount of the image whose mount table source is `fsname`: its mount point, and
/// whether its superblock is read-only. From `/proc/self/mountinfo` (`id parent dev root
/// mountpoint options [optional...] - fstype source superoptions`). A mount of type
/// `fuse.rext4` is one; a plain `fuse` one (`subtype=`) only while a process holds the
/// image's writer lock (a rext4 daemon; another FUSE filesystem over the same file is not
/// bound to).
pub fn mounted_image(fsname: &str) -> Option<(PathBuf, bool)> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    table.lines().find_map(|line| {
        let (head, tail) = line.split_once(" - ")?;
        let mut t = tail.split(' ');
        let (fstype, source, superopts) = (t.next()?, t.next()?, t.next()?);
        if unescape(source) != fsname {
            return None;
        }
        let ours = fstype == "fuse.rext4" || (fstype == "fuse" && locked(Path::new(fsname)));
        if !ours {
            return None;
        }
        let mountpoint = unescape(head.split(' ').nth(4)?);
        let ro = superopts.split(',').any(|o| o == "ro");
        Some((PathBuf::from(mountpoint), ro))
    })
}

/// Whether some process holds the writer lock (an exclusive `flock`) on the file `image`.
fn locked(image: &Path) -> bool {
    let Ok(f) = std::fs::File::open(image) else { return false };
    matches!(
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockSharedNonblock),
        Err((_, nix::errno::Errno::EWOULDBLOCK))
    )
}

/// The mount table's octal escapes (`\040` for a space) undone.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let code = b.get(i + 1..i + 4).and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match (b[i], code) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Binds the mount at `existing` (whose superblock is read-only if `ro`) onto `mountpoint`,
/// with the per-mount flags of `opts`. A read-write mount of a read-only one is `EBUSY`, as
/// for a block device the kernel has mounted read-only.
pub fn bind(existing: &Path, ro: bool, mountpoint: &Path, opts: &MountOptions) -> io::Result<()> {
    if ro && !opts.read_only {
        return Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!("the image is mounted read-only on {}; mount it with -o ro", existing.display()),
        ));
    }
    nix::mount::mount(Some(existing), mountpoint, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(
        |e| io::Error::other(format!("binding {} on {}: {e}", existing.display(), mountpoint.display())),
    )?;
    // A bind copies the source's flags; set the ones these options ask for.
    let flags = crate::vfs_flags::per_mount(opts);
    if let Err(e) = nix::mount::mount(None::<&str>, mountpoint, None::<&str>, flags, None::<&str>) {
        let _ = nix::mount::umount(mountpoint);
        return Err(io::Error::other(format!("setting the flags of {}: {e}", mountpoint.display())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn mount_table_escapes() {
        assert_eq!(unescape(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape(r"/x\134y"), r"/x\y");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/end\04"), r"/end\04");
    }
}
