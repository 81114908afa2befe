//! Walks of a damaged image: everything reachable, or a cheap visit of the fixture paths.
//! Errors are fine; panics and unbounded work are not.

use super::isolate::LAST_PANIC;
use super::{huge_name, names, BIG_NAME, PATHS};
use rext4::dev::{BlockDevice, MemDevice};
use rext4::{FileType, Fs, Options};
use std::collections::HashSet;
use std::io::Read;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// Visits everything reachable: readdir (twice, once resumed from the middle) and lookup of
/// every entry, getattr, bounded reads, readlink, listxattr/getxattr, statfs, and the path API
/// over the root's entries. Errors are fine; panics and unbounded work are not. Returns the
/// number of operations done.
pub(super) fn walk(fs: &Fs) -> usize {
    const MAX_INODES: usize = 4000;
    const MAX_ENTRIES: usize = 4000;
    const MAX_READ: u64 = 256 << 10;
    let mut ops = 0usize;
    let _ = fs.statfs();
    let _ = fs.read_only_reasons();
    let mut seen = HashSet::new();
    let mut stack = vec![(fs.root(), 0u32)];
    let mut buf = vec![0u8; 64 << 10];
    while let Some((ino, depth)) = stack.pop() {
        if !seen.insert(ino) || seen.len() > MAX_INODES {
            continue;
        }
        ops += 1;
        if let Ok(names) = fs.listxattr(ino) {
            for n in names.iter().take(32) {
                let _ = fs.getxattr(ino, n);
            }
        }
        let _ = fs.getxattr(ino, b"user.absent");
        let Ok(attr) = fs.getattr(ino) else { continue };
        match attr.kind {
            FileType::Directory => {
                let mut entries = Vec::new();
                let _ = fs.readdir(ino, 0, |e| {
                    entries.push(e);
                    entries.len() < MAX_ENTRIES
                });
                if let Some(mid) = entries.get(entries.len() / 2) {
                    let _ = fs.readdir(ino, mid.next, |_| false);
                }
                for e in &entries {
                    ops += 1;
                    if e.name == b"." || e.name == b".." {
                        continue;
                    }
                    let _ = fs.lookup(ino, &e.name);
                    if depth < 12 {
                        stack.push((e.ino, depth + 1));
                    }
                }
                let _ = fs.lookup(ino, b"no-such-name-here");
            }
            FileType::RegularFile => {
                let mut off = 0u64;
                while off < attr.size.min(MAX_READ) {
                    ops += 1;
                    match fs.read(ino, off, &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => off += n as u64,
                    }
                }
                if attr.size > 0 {
                    let _ = fs.read(ino, attr.size - 1, &mut buf[..1]);
                    let _ = fs.read(ino, attr.size / 2, &mut buf[..4096]);
                }
                let _ = fs.read(ino, u64::MAX - 10, &mut buf[..16]);
            }
            FileType::Symlink => {
                let _ = fs.readlink(ino);
            }
            _ => {}
        }
    }
    // The path API over the root's entries (follows symlinks, ReadDir batching, File reads).
    if let Ok(rd) = fs.read_dir("/") {
        for e in rd.take(64).flatten() {
            let mut p = b"/".to_vec();
            p.extend_from_slice(&e.name);
            let p = std::path::PathBuf::from(
                <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(p),
            );
            let _ = fs.metadata(&p);
            let _ = fs.symlink_metadata(&p);
            let _ = fs.read_link(&p);
            if let Ok(rd) = fs.read_dir(&p) {
                ops += rd.take(MAX_ENTRIES).count();
            }
            if let Ok(mut f) = fs.open_file(&p) {
                let mut b = vec![0u8; 4096];
                let _ = f.read(&mut b);
            }
        }
    }
    for p in PATHS {
        let _ = fs.metadata(p);
    }
    ops
}

/// A cheap visit for sweeps: each fixture path through the path and inode APIs (bounded
/// reads, readdir, lookups, readlink, xattrs).
pub(super) fn light_walk(fs: &Fs) {
    let _ = fs.statfs();
    let mut buf = vec![0u8; 16 << 10];
    let _ = names(fs, 2);
    for p in PATHS.iter().chain(&["/huge"]) {
        let _ = fs.metadata(p);
        let Ok(ino) = fs.resolve(p, false) else { continue };
        let _ = fs.listxattr(ino);
        let _ = fs.getxattr(ino, b"user.big");
        let _ = fs.getxattr(ino, b"user.huge");
        let Ok(a) = fs.getattr(ino) else { continue };
        match a.kind {
            FileType::Directory => {
                let mut n = 0;
                let _ = fs.readdir(ino, 0, |_| {
                    n += 1;
                    n < 1000
                });
                let _ = fs.lookup(ino, b"a");
                let _ = fs.lookup(ino, BIG_NAME);
                let _ = fs.lookup(ino, huge_name(1500).as_bytes());
                let _ = fs.lookup(ino, b"no-such-name");
            }
            FileType::RegularFile => {
                let _ = fs.read(ino, 0, &mut buf);
                let _ = fs.read(ino, a.size.saturating_sub(100), &mut buf);
                let _ = fs.read(ino, 8192 * 7, &mut buf);
            }
            FileType::Symlink => {
                let _ = fs.readlink(ino);
                let _ = fs.read_link(p);
            }
            _ => {}
        }
    }
}

pub(super) fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    let msg = p
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "non-string panic".into());
    let hook = std::mem::take(&mut *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()));
    if hook.is_empty() {
        msg
    } else {
        hook
    }
}

pub(super) fn open_and_light_walk(dev: &Arc<MemDevice>) -> Result<(), String> {
    let dev: Arc<dyn BlockDevice> = dev.clone();
    catch_unwind(AssertUnwindSafe(|| {
        if let Ok(fs) = Fs::from_device(dev, Options::default()) {
            light_walk(&fs);
        }
    }))
    .map_err(panic_message)
}

pub(super) fn open_and_walk(dev: Arc<MemDevice>) -> Result<usize, String> {
    catch_unwind(AssertUnwindSafe(|| match Fs::from_device(dev, Options::default()) {
        Ok(fs) => walk(&fs),
        Err(_) => 0,
    }))
    .map_err(panic_message)
}
