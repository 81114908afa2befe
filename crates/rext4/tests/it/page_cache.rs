//! The page cache (cache/page.rs): reads served from cached pages stay coherent with every
//! write, racing readers never leave a stale page behind, readahead and the memory bound hold,
//! and a reused inode number never shows the old file's pages.

use crate::file_write::read_pieces;
use rext4::{Fs, Options, SetAttr};
use rext4_testkit::{e2fsck_clean, Image, Rng};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

fn mkfs(dir: &Path, args: &[&str]) -> PathBuf {
    let img = dir.join("pc.img");
    let mut all = vec!["-b", "4096"];
    all.extend_from_slice(args);
    Image::ext4("128M").args(&all).build(&img);
    img
}

fn open(img: &Path, page_cache_bytes: usize) -> Fs {
    Fs::open_with(img, Options { writable: true, page_cache_bytes, ..Options::default() }).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// One writer overwrites pieces of a file (whole blocks, and odd pieces inside blocks) while
/// readers keep loading random pieces into the cache: when all stop, every cached read agrees
/// with what was written, so no load that raced a write left its old copy cached. The cache
/// holds a fraction of the file, so that reads keep missing and loading.
fn racing_overwrites(piece: std::ops::Range<usize>) {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), &[]);
    let fs = open(&img, 64 << 10);
    let ino = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    const SIZE: usize = 8 << 20;
    let mut model = pattern(SIZE, 1);
    fs.write(ino, 0, &model).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for r in 0..3u64 {
            let (fs, stop) = (&fs, &stop);
            s.spawn(move || {
                let mut rng = Rng::new(r + 100);
                let mut buf = vec![0u8; 8192];
                while !stop.load(Ordering::Relaxed) {
                    let off = rng.below(SIZE as u64 - 8192);
                    let n = 1 + rng.below(8191) as usize;
                    fs.read(ino, off, &mut buf[..n]).unwrap();
                }
            });
        }
        let mut rng = Rng::new(7);
        for i in 0..20_000u32 {
            let len = piece.start + rng.below((piece.end - piece.start) as u64) as usize;
            let off = rng.below((SIZE - len) as u64) as usize;
            let data = pattern(len, i as u8);
            assert_eq!(fs.write(ino, off as u64, &data).unwrap(), len);
            model[off..off + len].copy_from_slice(&data);
            if i % 97 == 0 {
                // A read right after a write sees it.
                let mut back = vec![0u8; len.min(4096)];
                fs.read(ino, off as u64, &mut back).unwrap();
                assert_eq!(back, model[off..off + back.len()], "read after write at {off}");
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(read_pieces(&fs, ino, 4096) == model, "cached pieces differ from what was written");
    assert!(read_pieces(&fs, ino, 1000) == model, "odd pieces differ");
    let mut whole = vec![0u8; SIZE];
    fs.read(ino, 0, &mut whole).unwrap();
    assert!(whole == model, "the device differs from what was written");
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}

#[test]
fn racing_block_overwrites_leave_no_stale_page() {
    racing_overwrites(4096..8193);
}

#[test]
fn racing_partial_overwrites_leave_no_stale_page() {
    racing_overwrites(1..300);
}

/// Sequential small reads miss once per readahead window; reading again hits; random reads
/// over a cached file read nothing from the device; a page cache of 0 bytes keeps nothing.
#[test]
fn readahead_hits_and_disabled_cache() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), &[]);
    let data = pattern(4 << 20, 3);
    {
        let fs = open(&img, 64 << 20);
        let ino = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
        fs.write(ino, 0, &data).unwrap();
        fs.drop_caches();
        let before = fs.page_cache_stats();
        assert_eq!(read_pieces(&fs, ino, 4096), data);
        let after = fs.page_cache_stats();
        let misses = after.misses - before.misses;
        // 1,024 blocks read 4 KiB at a time: the first miss reads the request, then each
        // window 32 blocks ahead.
        assert!(misses <= 40, "{misses} misses for a sequential read of 1,024 blocks");
        assert!(after.readahead > before.readahead);
        assert_eq!(after.pages, 1024);
        let mut rng = Rng::new(5);
        let mut buf = vec![0u8; 8192];
        for _ in 0..2000 {
            let off = rng.below(data.len() as u64 - 8192);
            fs.read(ino, off, &mut buf).unwrap();
            assert_eq!(buf, data[off as usize..off as usize + 8192]);
        }
        assert_eq!(fs.page_cache_stats().misses, after.misses, "a cached file is read from pages");
        fs.unmount().unwrap();
    }
    let fs = open(&img, 0);
    let ino = fs.resolve("/f", false).unwrap();
    assert_eq!(read_pieces(&fs, ino, 4096), data);
    assert_eq!(fs.page_cache_stats().pages, 0);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}

/// Reading a file much larger than the cache keeps the cache within its bound.
#[test]
fn page_cache_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), &[]);
    let fs = open(&img, 8 << 20);
    let ino = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let data = pattern(24 << 20, 9);
    fs.write(ino, 0, &data).unwrap();
    assert_eq!(read_pieces(&fs, ino, 4096), data);
    let st = fs.page_cache_stats();
    // 2,048 pages, in 64 shards of 32 pages (two chunks of 16) each.
    assert!(st.pages <= 2048 + 64, "{} pages cached under an 8 MiB bound", st.pages);
    assert!(st.pages >= 1024, "{} pages: the cache was not used", st.pages);
    fs.unmount().unwrap();
}

/// A file's pages die with it: a new file given the same inode number reads its own bytes
/// (zeros in its holes), not the old file's cached pages.
#[test]
fn reused_inode_numbers_see_no_old_pages() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), &[]);
    let fs = open(&img, 64 << 20);
    let root = fs.root();
    let mut reused = 0;
    for round in 0..4u8 {
        let old = fs.create(root, b"old", 0o644, 0, 0).unwrap().ino;
        let bytes = vec![0xA0 | round; 20_000];
        fs.write(old, 0, &bytes).unwrap();
        // Held and unlinked, the old file outlives the cache drop that makes the directory
        // forget where its last new file went, so the next one takes the lowest free number.
        fs.hold(old).unwrap();
        fs.unlink(root, b"old").unwrap();
        fs.drop_caches();
        assert_eq!(read_pieces(&fs, old, 4096), bytes);
        assert!(fs.page_cache_stats().pages >= 5, "the old file's pages are cached");
        fs.release(old).unwrap();
        // Freed inodes are given again once the freeing transaction has committed.
        fs.sync().unwrap();
        let new = fs.create(root, b"new", 0o644, 0, 0).unwrap().ino;
        reused += usize::from(new == old);
        fs.setattr(new, &SetAttr { size: Some(20_000), ..SetAttr::default() }).unwrap();
        fs.write(new, 5000, b"new bytes").unwrap();
        let mut want = vec![0u8; 20_000];
        want[5000..5009].copy_from_slice(b"new bytes");
        assert_eq!(read_pieces(&fs, new, 4096), want, "round {round}");
        fs.unlink(root, b"new").unwrap();
        fs.sync().unwrap();
        fs.drop_caches();
    }
    assert!(reused > 0, "the test needs an inode number given again");
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}
