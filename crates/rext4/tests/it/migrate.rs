//! Converting files between block maps and extent trees (`chattr +e` / `chattr -e`, the
//! kernel's `migrate.c`): every case runs on two copies of one image, once through rext4
//! and once through the kernel. The errnos must match, both images must be clean, and the
//! kernel must read the same bytes, flags and block counts from both.

use crate::flags::{flags_of, ino, kernel_chflags, rext4_chflags};
use rext4::format::inode::EXTENTS_FL;
use rext4::{Fs, Options};
use rext4_testkit::{e2fsck_clean, extent_depth, require_kernel, tool, Image, KernelMount};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

fn rw(img: &Path) -> Fs {
    Fs::open_with(img, Options { writable: true, ..Options::default() }).unwrap()
}

/// What the kernel shows of `p` under mount `m`: bytes (files) or names (directories),
/// flags, and the blocks it holds.
fn state(m: &Path, p: &str) -> (Vec<u8>, u32, u64) {
    let path = m.join(p);
    let meta = std::fs::metadata(&path).unwrap();
    let content = if meta.is_dir() {
        let mut names: Vec<String> = std::fs::read_dir(&path)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names.join("/").into_bytes()
    } else {
        std::fs::read(&path).unwrap()
    };
    (content, flags_of(&path), meta.blocks())
}

/// Runs `change` on every path through rext4 (image `a`) and through the kernel (image
/// `b`, a copy): the errnos, then the state the kernel reads from each, must match.
fn compare(a: &Path, b: &Path, paths: &[&str], change: fn(u32) -> u32) -> Vec<String> {
    let mut failures = Vec::new();
    let fs = rw(a);
    let ours: Vec<i32> = paths.iter().map(|p| rext4_chflags(&fs, &format!("/{p}"), change)).collect();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(a);
    let km = KernelMount::rw(b).unwrap();
    let theirs: Vec<i32> = paths.iter().map(|p| kernel_chflags(&km.path().join(p), change)).collect();
    km.unmount().unwrap();
    e2fsck_clean(b);
    let (ka, kb) = (KernelMount::ro(a).unwrap(), KernelMount::ro(b).unwrap());
    for (i, p) in paths.iter().enumerate() {
        if ours[i] != theirs[i] {
            failures.push(format!("{p}: rext4 errno {}, kernel {}", ours[i], theirs[i]));
        }
        let (x, y) = (state(ka.path(), p), state(kb.path(), p));
        if x.0 != y.0 {
            failures.push(format!("{p}: the bytes differ"));
        }
        if (x.1, x.2) != (y.1, y.2) {
            failures.push(format!(
                "{p}: rext4 left flags {:#x}, {} blocks; the kernel {:#x}, {}",
                x.1, x.2, y.1, y.2
            ));
        }
    }
    ka.unmount().unwrap();
    kb.unmount().unwrap();
    failures
}

fn write_at(path: &Path, off: u64, data: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().create(true).write(true).truncate(false).open(path).unwrap();
    f.write_all_at(data, off).unwrap();
    f.sync_all().unwrap();
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// ext3 files (block maps, with single, double and triple indirect blocks, holes, a
/// fragmented pair, a directory) after `tune2fs -O extents`: `chattr +e` converts each as
/// the kernel does, the fragmented file into a tree two levels deep; the converted files
/// then take writes through their extents. Without the feature, `chattr +e` is `EINVAL`.
#[test]
fn block_maps_convert_to_extents_as_the_kernel_does() {
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.img");
    Image::ext4("96M").fs_type("ext3").block_size(1024).build(&base);
    let km = KernelMount::rw(&base).unwrap();
    let m = km.path().to_path_buf();
    std::fs::File::create(m.join("empty")).unwrap();
    write_at(&m.join("small"), 0, &pattern(1, 5000));
    write_at(&m.join("big"), 0, &pattern(2, 400 << 10));
    // Direct, single, double and triple indirect (1 KiB blocks: the triple from ~64.3 MiB).
    for (i, off) in [0u64, 100 << 10, 1 << 20, 70 << 20].into_iter().enumerate() {
        write_at(&m.join("sparse"), off, &pattern(3 + i as u8, 3000));
    }
    // Two files written a block at a time in turn: a run per block each.
    {
        let (fa, fb) = (m.join("frag_a"), m.join("frag_b"));
        for i in 0..500u64 {
            write_at(&fa, i * 1024, &pattern(7, 1024));
            write_at(&fb, i * 1024, &pattern(8, 1024));
        }
    }
    std::fs::create_dir(m.join("dir")).unwrap();
    for i in 0..300 {
        std::fs::write(m.join(format!("dir/a-file-with-a-long-name-{i:04}")), b"").unwrap();
    }
    km.unmount().unwrap();
    let paths = ["empty", "small", "big", "sparse", "frag_a", "frag_b", "dir"];

    // Without the extents feature: EINVAL on both sides.
    let (a, b) = (dir.path().join("a0.img"), dir.path().join("b0.img"));
    std::fs::copy(&base, &a).unwrap();
    std::fs::copy(&base, &b).unwrap();
    let failures = compare(&a, &b, &["small"], |f| f | EXTENTS_FL);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let fs = Fs::open(&a).unwrap();
    assert_eq!(rext4_chflags(&fs, "/small", |f| f | EXTENTS_FL), libc::EROFS, "read-only open");
    drop(fs);

    let st = Command::new(tool("tune2fs")).args(["-O", "extents"]).arg(&base).output().unwrap();
    assert!(st.status.success(), "tune2fs: {}", String::from_utf8_lossy(&st.stderr));
    let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
    std::fs::copy(&base, &a).unwrap();
    std::fs::copy(&base, &b).unwrap();
    let failures = compare(&a, &b, &paths, |f| f | EXTENTS_FL);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(extent_depth(&a, "/frag_a"), 2, "500 runs need leaves and an index block");
    assert_eq!(extent_depth(&a, "/frag_a"), extent_depth(&b, "/frag_a"));

    // The converted trees take writes: an append and a rewrite in the middle.
    let fs = rw(&a);
    for p in ["/frag_a", "/sparse", "/big"] {
        let i = ino(&fs, p);
        let size = fs.getattr(i).unwrap().size;
        fs.write(i, size, &pattern(9, 70_000)).unwrap();
        fs.write(i, 2048, &pattern(10, 5000)).unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&a);
    let km = KernelMount::rw(&b).unwrap();
    for p in ["frag_a", "sparse", "big"] {
        let path = km.path().join(p);
        let size = std::fs::metadata(&path).unwrap().len();
        write_at(&path, size, &pattern(9, 70_000));
        write_at(&path, 2048, &pattern(10, 5000));
    }
    km.unmount().unwrap();
    e2fsck_clean(&b);
    let (ka, kb) = (KernelMount::ro(&a).unwrap(), KernelMount::ro(&b).unwrap());
    for p in paths {
        assert_eq!(state(ka.path(), p).0, state(kb.path(), p).0, "{p} after writes");
    }
    ka.unmount().unwrap();
    kb.unmount().unwrap();
}

/// `chattr -e` converts what fits the direct pointers (no extent, or one written extent
/// ending before block 12) and refuses the rest with `EOPNOTSUPP`, as the kernel does.
#[test]
fn extent_files_convert_to_block_maps_where_the_kernel_does() {
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.img");
    Image::ext4("32M").block_size(4096).build(&base);
    let km = KernelMount::rw(&base).unwrap();
    let m = km.path().to_path_buf();
    std::fs::File::create(m.join("empty")).unwrap();
    write_at(&m.join("s3"), 0, &pattern(1, 3 * 4096));
    write_at(&m.join("s12"), 0, &pattern(2, 12 * 4096));
    write_at(&m.join("s13"), 0, &pattern(3, 13 * 4096));
    write_at(&m.join("two"), 0, &pattern(4, 4096));
    write_at(&m.join("two"), 5 * 4096, &pattern(5, 4096));
    write_at(&m.join("tail"), 8 * 4096, &pattern(6, 4 * 4096));
    write_at(&m.join("partial"), 0, &pattern(7, 100));
    {
        let f = std::fs::File::create(m.join("prealloc")).unwrap();
        nix::fcntl::fallocate(&f, nix::fcntl::FallocateFlags::empty(), 0, 3 * 4096).unwrap();
    }
    std::fs::create_dir(m.join("dir")).unwrap();
    std::fs::write(m.join("dir/f"), b"x").unwrap();
    km.unmount().unwrap();
    let paths = ["empty", "s3", "s12", "s13", "two", "tail", "partial", "prealloc", "dir"];
    let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
    std::fs::copy(&base, &a).unwrap();
    std::fs::copy(&base, &b).unwrap();
    let failures = compare(&a, &b, &paths, |f| f & !EXTENTS_FL);
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // The converted files are block maps that take writes, and convert back.
    let fs = rw(&a);
    let s3 = ino(&fs, "/s3");
    assert_eq!(fs.getattr(s3).unwrap().flags & EXTENTS_FL, 0);
    fs.write(s3, 3 * 4096, &pattern(11, 20 * 4096)).unwrap();
    assert_eq!(rext4_chflags(&fs, "/s3", |f| f | EXTENTS_FL), 0);
    assert_ne!(fs.getattr(s3).unwrap().flags & EXTENTS_FL, 0);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&a);
    let ka = KernelMount::ro(&a).unwrap();
    let mut want = pattern(1, 3 * 4096);
    want.extend(pattern(11, 20 * 4096));
    assert_eq!(std::fs::read(ka.path().join("s3")).unwrap(), want);
    assert_ne!(flags_of(&ka.path().join("s3")) & EXTENTS_FL, 0);
    ka.unmount().unwrap();
}

/// A conversion whose tree needs blocks a full filesystem does not have fails with `ENOSPC`
/// and changes nothing: the same map, bytes and flags, the image clean. With space freed it
/// goes through.
#[test]
fn a_conversion_without_space_for_its_tree_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("full.img");
    // No blocks reserved for root: tree blocks may take those.
    Image::ext4("8M").fs_type("ext3").block_size(1024).args(["-m", "0"]).build(&img);
    let fs = rw(&img);
    let (a, b) = (
        fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap().ino,
        fs.create(fs.root(), b"b", 0o644, 0, 0).unwrap().ino,
    );
    // Written a block at a time in turn, each written back at once: a run per block.
    for i in 0..300u64 {
        for (f, seed) in [(a, 1u8), (b, 2)] {
            fs.write(f, i * 1024, &pattern(seed, 1024)).unwrap();
            fs.fsync(f).unwrap();
        }
    }
    let filler = fs.create(fs.root(), b"filler", 0o644, 0, 0).unwrap().ino;
    let mut off = 0u64;
    while fs.write(filler, off, &[7u8; 65536]).is_ok() {
        off += 65536;
    }
    while fs.write(filler, off, &[7u8; 1024]).is_ok() {
        off += 1024;
    }
    fs.fsync(filler).unwrap();
    assert_eq!(fs.statfs().unwrap().blocks_free, 0, "the filler took every block");
    fs.unmount().unwrap();
    drop(fs);
    let st = Command::new(tool("tune2fs")).args(["-O", "extents"]).arg(&img).output().unwrap();
    assert!(st.status.success(), "tune2fs: {}", String::from_utf8_lossy(&st.stderr));
    let fs = rw(&img);
    let before = fs.read_file("/a").unwrap();
    let blocks = fs.getattr(ino(&fs, "/a")).unwrap().blocks;
    assert_eq!(rext4_chflags(&fs, "/a", |f| f | EXTENTS_FL), libc::ENOSPC);
    let attr = fs.getattr(ino(&fs, "/a")).unwrap();
    assert_eq!((attr.flags & EXTENTS_FL, attr.blocks), (0, blocks), "the map is as it was");
    assert_eq!(fs.read_file("/a").unwrap(), before);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    let fs = rw(&img);
    fs.unlink(fs.root(), b"filler").unwrap();
    assert_eq!(rext4_chflags(&fs, "/a", |f| f | EXTENTS_FL), 0);
    assert_eq!(fs.read_file("/a").unwrap(), before);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    assert_eq!(extent_depth(&img, "/a"), 1, "300 runs: leaves under the root");
}

/// A block map that names one block twice is damage: `chattr +e` refuses it (the
/// filesystem is marked as needing a check) and frees nothing.
#[test]
fn a_map_naming_a_block_twice_is_not_converted() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("dup.img");
    Image::ext4("8M").fs_type("ext3").block_size(1024).build(&img);
    let fs = rw(&img);
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &pattern(1, 3 * 1024)).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let stat = Command::new(tool("debugfs")).args(["-R", "stat /f"]).arg(&img).output().unwrap();
    let text = String::from_utf8_lossy(&stat.stdout).into_owned();
    // "BLOCKS:\n(0-2):1234-1236": the first data block.
    let first: u64 = text
        .split("BLOCKS:")
        .nth(1)
        .and_then(|b| b.split(':').nth(1))
        .and_then(|b| b.trim().split(['-', ' ', '\n']).next())
        .and_then(|b| b.parse().ok())
        .unwrap_or_else(|| panic!("no block list in:\n{text}"));
    let st = Command::new(tool("debugfs"))
        .args(["-w", "-R", &format!("sif /f block[1] {first}")])
        .arg(&img)
        .output()
        .unwrap();
    assert!(st.status.success());
    let st = Command::new(tool("tune2fs")).args(["-O", "extents"]).arg(&img).output().unwrap();
    assert!(st.status.success(), "tune2fs: {}", String::from_utf8_lossy(&st.stderr));
    let fsck = || {
        let out = Command::new(tool("e2fsck")).arg("-fn").arg(&img).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let damage = fsck();
    assert!(damage.contains("multiply-claimed"), "e2fsck -fn:\n{damage}");
    let fs = rw(&img);
    let free = fs.statfs().unwrap().blocks_free;
    let e = rext4_chflags(&fs, "/f", |f| f | EXTENTS_FL);
    assert!(e == libc::EUCLEAN || e == libc::EIO, "errno {e}");
    let attr = fs.getattr(ino(&fs, "/f")).unwrap();
    assert_eq!(attr.flags & EXTENTS_FL, 0);
    assert_eq!(fs.statfs().unwrap().blocks_free, free, "nothing freed");
    fs.unmount().unwrap();
    drop(fs);
    // The image holds the damage it was given and nothing more: e2fsck -fn says what it
    // said before (but for the file's change time, which chattr moves).
    let same = |t: &str| t.lines().filter(|l| !l.contains("mod time")).collect::<Vec<_>>().join("\n");
    assert_eq!(same(&fsck()), same(&damage), "e2fsck -fn after the refused conversion");
}
