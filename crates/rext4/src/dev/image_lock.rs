//! One writer per image: what a writable open claims before it changes anything.
//!
//! Two things may already be writing an image. Another rext4 process (a library user, a CLI
//! command, the FUSE daemon) holds an exclusive `flock` on it for as long as its filesystem
//! is open; a second writer refuses, naming the holder's pid from `/proc/locks`. The kernel
//! may have it mounted, through a loop device over the file or as the block device itself,
//! and caches its metadata: a writer refuses that too, as e2fsprogs refuses to change a
//! mounted filesystem. Read-only opens claim nothing, so readers keep working beside a
//! writer (they see its state at the last commit).

use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

/// The claim: the lock lives on a descriptor of its own (a `dup`, so the same open file the
/// device reads and writes through), released when the device is dropped.
pub(crate) struct ImageLock {
    _lock: Flock<File>,
}

fn in_use(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::ResourceBusy, msg)
}

/// Claims `file` for writing, or says who has it (the caller names the image).
pub(crate) fn claim(file: &File) -> io::Result<ImageLock> {
    let meta = file.metadata()?;
    if let Some((dev, mnt)) = kernel_mount(&meta) {
        return Err(in_use(format!("image is mounted by the kernel ({dev} on {mnt}); unmount it first")));
    }
    let dup = file.try_clone()?;
    match Flock::lock(dup, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(ImageLock { _lock: lock }),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
            let who = lock_holder(&meta).map(|pid| format!(" (pid {pid})")).unwrap_or_default();
            Err(in_use(format!("image is in use by another rext4 process{who}")))
        }
        Err((_, e)) => Err(io::Error::from(e)),
    }
}

/// The pid holding a `flock` on the file, from `/proc/locks` (`... FLOCK ADVISORY WRITE
/// PID MAJ:MIN:INO ...`, device numbers in hex).
fn lock_holder(meta: &std::fs::Metadata) -> Option<u32> {
    let want = (nix::sys::stat::major(meta.dev()), nix::sys::stat::minor(meta.dev()), meta.ino());
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.get(1) != Some(&"FLOCK") {
            return None;
        }
        let mut id = f.get(5)?.split(':');
        let maj = u64::from_str_radix(id.next()?, 16).ok()?;
        let min = u64::from_str_radix(id.next()?, 16).ok()?;
        let ino = id.next()?.parse::<u64>().ok()?;
        ((maj, min, ino) == want).then(|| f.get(4)?.parse().ok()).flatten()
    })
}

/// `(device, mount point)` of a kernel mount of this image: the block device itself, or a
/// loop device (or one of its partitions) whose backing file is this file.
fn kernel_mount(meta: &std::fs::Metadata) -> Option<(String, String)> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // Field 3 of each mountinfo line is the mounted filesystem's device, MAJ:MIN.
    let mounted_at = |devno: &str| {
        mountinfo.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&devno)).then(|| f.get(4).map(|m| m.to_string())).flatten()
        })
    };
    if meta.file_type().is_block_device() {
        let rdev = meta.rdev();
        let devno = format!("{}:{}", nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev));
        return mounted_at(&devno).map(|m| (devno, m));
    }
    for e in std::fs::read_dir("/sys/block").ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(backing) = std::fs::read_to_string(e.path().join("loop/backing_file")) else { continue };
        let same = std::fs::metadata(backing.trim_end())
            .is_ok_and(|b| b.dev() == meta.dev() && b.ino() == meta.ino());
        if !same {
            continue;
        }
        // The whole device and its partitions (loop0p1, ...).
        let mut devs = vec![(name.clone(), e.path().join("dev"))];
        for p in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
            let pn = p.file_name().to_string_lossy().into_owned();
            if pn.starts_with(&name) {
                devs.push((pn, p.path().join("dev")));
            }
        }
        for (dev, file) in devs {
            let Ok(devno) = std::fs::read_to_string(file) else { continue };
            if let Some(m) = mounted_at(devno.trim()) {
                return Some((dev, m));
            }
        }
    }
    None
}
