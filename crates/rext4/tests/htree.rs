//! Hashed (htree) directories written by rext4: indexing a growing directory, inserting with
//! leaf and index splits up to three levels (large_dir), every hash version, with and without
//! metadata_csum, removal, rename, concurrency, and readdir positions that survive splits.
//! Every image is judged by `e2fsck -fn` and, where it can mount, by the kernel.

use rext4::{Fs, InodeNo, Options};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

mod common;

const INDEX_FL: u32 = 0x1000;

fn mkfs(dir: &Path, name: &str, args: &[&str], size: &str) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    common::mkfs(None, &img, args, size);
    img
}

fn rw(img: &Path) -> Fs {
    Fs::open_with(img, Options { writable: true, ..Options::default() }).unwrap()
}

/// Every name in `dir` but `.` and `..`, read with the inode-level readdir.
fn names(fs: &Fs, dir: InodeNo) -> BTreeSet<Vec<u8>> {
    let mut v = Vec::new();
    fs.readdir(dir, 0, |e| {
        v.push(e.name);
        true
    })
    .unwrap();
    let n = v.len();
    let set: BTreeSet<_> = v.into_iter().filter(|n| n != b"." && n != b"..").collect();
    assert_eq!(set.len() + 2, n, "readdir repeated a name or lacks . / ..");
    set
}

/// What the kernel lists in `path` of `img` (None where it cannot mount).
fn kernel_names(img: &Path, path: &str) -> Option<BTreeSet<Vec<u8>>> {
    use std::os::unix::ffi::OsStrExt;
    if !common::kernel_can_mount() {
        return None;
    }
    let km = common::KernelMount::ro(img).unwrap();
    let set = std::fs::read_dir(km.path().join(path.trim_start_matches('/')))
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    km.unmount().unwrap();
    Some(set)
}

fn big_name(i: usize) -> Vec<u8> {
    format!("file-{i:06}-{:x}", i.wrapping_mul(2_654_435_761) % 65521).into_bytes()
}

/// 200,000 creates into one directory: an htree, clean, the kernel lists the same names;
/// then every name removed: clean and empty.
#[test]
fn two_hundred_thousand_entries() {
    const N: usize = 200_000;
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "big", &["-N", "210000"], "512M");
    let fs = rw(&img);
    let d = fs.mkdir(fs.root(), b"big", 0o755, 0, 0).unwrap().ino;
    let t = Instant::now();
    for i in 0..N {
        fs.create(d, &big_name(i), 0o644, 0, 0).unwrap();
    }
    let secs = t.elapsed().as_secs_f64();
    eprintln!("{N} creates in {secs:.1} s ({:.0}/s)", N as f64 / secs);
    assert_ne!(fs.getattr(d).unwrap().flags & INDEX_FL, 0, "not indexed");
    let t = Instant::now();
    let seen = names(&fs, d);
    eprintln!("readdir of {N} in {:.2} s", t.elapsed().as_secs_f64());
    let want: BTreeSet<Vec<u8>> = (0..N).map(big_name).collect();
    assert!(seen == want, "rext4 readdir: {} names, want {N}", seen.len());
    fs.unmount().unwrap();
    drop(fs);
    let t = Instant::now();
    common::e2fsck_clean(&img);
    eprintln!("e2fsck in {:.1} s", t.elapsed().as_secs_f64());
    assert!(common::htree_levels(&img, "/big").is_some());
    if let Some(k) = kernel_names(&img, "/big") {
        assert!(k == want, "kernel lists {} names, want {N}", k.len());
    }

    let fs = rw(&img);
    let t = Instant::now();
    for i in 0..N {
        fs.unlink(d, &big_name(i)).unwrap();
    }
    let secs = t.elapsed().as_secs_f64();
    eprintln!("{N} unlinks in {secs:.1} s ({:.0}/s)", N as f64 / secs);
    assert!(names(&fs, d).is_empty());
    fs.unmount().unwrap();
    drop(fs);
    common::e2fsck_clean(&img);
    if let Some(k) = kernel_names(&img, "/big") {
        assert!(k.is_empty(), "kernel still lists {} names", k.len());
    }
}
