//! Delayed allocation and writeback (data/delalloc.rs, data/writeback.rs): writes into holes
//! stay in memory with a block reserved each, and get their blocks when written back, for
//! whole runs at once.

use rext4::{Fs, InodeNo, Options};
use rext4_testkit::{e2fsck_clean, extent_count, Image, KernelMount};
use std::path::Path;
use std::time::Duration;

fn open_with(img: &Path, f: impl FnOnce(&mut Options)) -> Fs {
    let mut o = Options { writable: true, ..Options::default() };
    f(&mut o);
    Fs::open_with(img, o).unwrap()
}

fn image(dir: &Path, size: &str) -> std::path::PathBuf {
    let img = dir.join("d.img");
    Image::ext4(size).block_size(4096).build(&img);
    img
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add((i / 997) as u8)).collect()
}

/// Writes `data` in pieces of `piece` bytes.
fn write_pieces(fs: &Fs, ino: InodeNo, data: &[u8], piece: usize) {
    write_pieces_at(fs, ino, 0, data, piece);
}

/// Delayed writes read back (small and large reads) before writeback, take reservations that
/// `statfs` shows, count in `st_blocks`, allocate nothing until written back, and after
/// `fsync` are in blocks e2fsck and the kernel agree on.
#[test]
fn delayed_writes_read_back_and_reach_the_disk_at_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "64M");
    let fs = open_with(&img, |_| {});
    let a = fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap().ino;
    let free_before = fs.statfs().unwrap().blocks_free;
    let data = pattern(3, 300_000);
    // Odd pieces: writes start and end inside blocks.
    write_pieces(&fs, a, &data, 3001);
    let st = fs.writeback_stats();
    assert_eq!(st.dirty_pages, 74, "300,000 bytes are 74 dirty 4 KiB pages");
    assert_eq!(st.written_blocks, 0, "nothing written back yet");
    assert_eq!(fs.getattr(a).unwrap().blocks, 74 * 8, "st_blocks counts delayed blocks");
    assert_eq!(fs.statfs().unwrap().blocks_free, free_before - 74, "reserved blocks are not free");
    assert_eq!(fs.read_file("/a").unwrap(), data, "large read over dirty pages");
    let mut piece = vec![0u8; 5000];
    assert_eq!(fs.read(a, 123_456, &mut piece).unwrap(), 5000);
    assert_eq!(piece, data[123_456..128_456], "small read over dirty pages");
    assert_eq!(fs.seek_data(a, 0).unwrap(), 0, "SEEK_DATA sees delayed data");
    assert_eq!(fs.seek_hole(a, 0).unwrap(), 300_000);
    // seek wrote the file back: its blocks are chosen, in one extent.
    assert_eq!(fs.writeback_stats().dirty_pages, 0);
    fs.write(a, 300_000, &data[..50_000]).unwrap();
    fs.fsync(a).unwrap();
    let st = fs.writeback_stats();
    assert_eq!((st.dirty_pages, st.dirty_files), (0, 0));
    assert_eq!(st.written_blocks, 74 + 12, "{st:?}");
    assert_eq!(fs.statfs().unwrap().blocks_free, free_before - 86);
    let mut want = data.clone();
    want.extend_from_slice(&data[..50_000]);
    assert_eq!(fs.read_file("/a").unwrap(), want);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    assert!(extent_count(&img, "/a") <= 2, "{} extents", extent_count(&img, "/a"));
    rext4_testkit::require_kernel!();
    let m = KernelMount::ro(&img).unwrap();
    assert_eq!(std::fs::read(m.path().join("a")).unwrap(), want, "the kernel reads the same");
    m.unmount().unwrap();
}

/// Writes into preallocated space (unwritten extents) are delayed too, without a
/// reservation: their blocks are the file's already (counted once in `st_blocks`, not taken
/// from `statfs` again), writeback converts them, and they succeed on a full filesystem, as
/// fallocate promised. An append that goes on past the preallocation reserves its new block.
#[test]
fn writes_into_preallocated_space_are_delayed_without_a_reservation() {
    const MIB: usize = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "16M");
    let fs = open_with(&img, |_| {});
    let a = fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap().ino;
    fs.fallocate(a, rext4::FALLOC_FL_KEEP_SIZE, 0, MIB as u64).unwrap();
    let free = fs.statfs().unwrap().blocks_free;
    assert_eq!(fs.getattr(a).unwrap().blocks, 256 * 8);
    let mut model = pattern(3, 300_000);
    write_pieces(&fs, a, &model, 3001);
    // Across the end of the preallocation: block 255 is unwritten, block 256 a hole.
    let tail = pattern(9, 6000);
    fs.write(a, (MIB - 2000) as u64, &tail).unwrap();
    model.resize(MIB - 2000, 0);
    model.extend_from_slice(&tail);
    let st = fs.writeback_stats();
    assert_eq!((st.dirty_pages, st.delalloc_blocks, st.written_blocks), (76, 1, 0), "{st:?}");
    assert_eq!(fs.getattr(a).unwrap().blocks, 257 * 8, "st_blocks counts the new block once");
    assert_eq!(fs.statfs().unwrap().blocks_free, free - 1, "only the hole's page reserves");
    assert_eq!(fs.read_file("/a").unwrap(), model, "read over pages and unwritten blocks");
    let mut piece = vec![0u8; 5000];
    assert_eq!(fs.read(a, 123_456, &mut piece).unwrap(), 5000);
    assert_eq!(piece, model[123_456..128_456]);
    // A dirty page written again is still one page.
    fs.write(a, 4000, &[0xEE; 200]).unwrap();
    model[4000..4200].fill(0xEE);
    assert_eq!(fs.writeback_stats().dirty_pages, 76);
    fs.fsync(a).unwrap();
    let st = fs.writeback_stats();
    assert_eq!((st.dirty_pages, st.delalloc_blocks, st.written_blocks), (0, 0, 76), "{st:?}");
    assert_eq!(fs.statfs().unwrap().blocks_free, free - 1);
    assert_eq!(fs.getattr(a).unwrap().blocks, 257 * 8);
    assert_eq!(fs.read_file("/a").unwrap(), model, "after writeback");

    // Fill the filesystem; the preallocated blocks still take writes, delayed or not.
    let b = fs.create(fs.root(), b"b", 0o644, 0, 0).unwrap().ino;
    let chunk = vec![0x77u8; 256 << 10];
    let mut at = 0u64;
    loop {
        match fs.write(b, at, &chunk) {
            Ok(n) if n > 0 => at += n as u64,
            Ok(_) => break,
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                break;
            }
        }
    }
    fs.sync().unwrap();
    assert_eq!(fs.write(b, at, &[1; 4096]).map_err(|e| e.errno()), Err(libc::ENOSPC), "full");
    let body = pattern(5, 400_000);
    write_pieces_at(&fs, a, 400_000, &body, 4096);
    model[400_000..800_000].copy_from_slice(&body);
    assert_eq!(fs.writeback_stats().dirty_pages, 99, "400,000 bytes over 99 unwritten blocks");
    fs.fsync(a).unwrap();
    assert_eq!(fs.read_file("/a").unwrap(), model);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    // Written 0..74, unwritten 74..97, written 97..196, unwritten 196..255, written 255..257.
    assert_eq!(extent_count(&img, "/a"), 5);
    let fs = Fs::open(&img).unwrap();
    assert_eq!(fs.read_file("/a").unwrap(), model, "after reopen");
    drop(fs);
    rext4_testkit::require_kernel!();
    let m = KernelMount::ro(&img).unwrap();
    assert_eq!(std::fs::read(m.path().join("a")).unwrap(), model, "the kernel reads the same");
    m.unmount().unwrap();
}

/// Writes `data` at `at` in pieces of `piece` bytes.
fn write_pieces_at(fs: &Fs, ino: InodeNo, at: usize, data: &[u8], piece: usize) {
    for (k, p) in data.chunks(piece).enumerate() {
        assert_eq!(fs.write(ino, (at + k * piece) as u64, p).unwrap(), p.len());
    }
}

/// A file written and deleted before writeback never allocates: its reservation goes back,
/// nothing is written, and nothing of it is left on disk.
#[test]
fn files_deleted_before_writeback_allocate_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "64M");
    let fs = open_with(&img, |_| {});
    let free_before = fs.statfs().unwrap().blocks_free;
    for i in 0..50 {
        let name = format!("t{i}");
        let ino = fs.create(fs.root(), name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        write_pieces(&fs, ino, &pattern(i as u8, 64 << 10), 4096);
        if i % 2 == 0 {
            fs.hold(ino).unwrap();
            fs.unlink(fs.root(), name.as_bytes()).unwrap();
            // Unlinked but open: still readable from its pages.
            let mut b = vec![0u8; 64 << 10];
            assert_eq!(fs.read(ino, 0, &mut b).unwrap(), 64 << 10);
            assert_eq!(b, pattern(i as u8, 64 << 10));
            fs.release(ino).unwrap();
        } else {
            fs.unlink(fs.root(), name.as_bytes()).unwrap();
        }
    }
    let st = fs.writeback_stats();
    assert_eq!((st.dirty_pages, st.dirty_files, st.written_blocks), (0, 0, 0), "{st:?}");
    assert_eq!(fs.statfs().unwrap().blocks_free, free_before);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}

/// ENOSPC comes from the write that finds no block to reserve; every byte a write accepted
/// reaches the disk at writeback, which never runs out of space.
#[test]
fn no_space_comes_from_the_write_never_from_writeback() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "16M");
    let fs = open_with(&img, |_| {});
    let mut files = Vec::new();
    let mut full = false;
    for i in 0..10_000 {
        let name = format!("f{i}");
        let ino = match fs.create(fs.root(), name.as_bytes(), 0o644, 0, 0) {
            Ok(a) => a.ino,
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                full = true;
                break;
            }
        };
        let data = pattern(i as u8, 40_000);
        let mut done = 0;
        for p in data.chunks(4096) {
            match fs.write(ino, done as u64, p) {
                Ok(n) => done += n,
                Err(e) => {
                    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                    full = true;
                    break;
                }
            }
        }
        files.push((name, data[..done].to_vec()));
        if full {
            break;
        }
    }
    assert!(full, "the filesystem filled up");
    // Writeback of everything accepted succeeds.
    fs.sync().unwrap();
    assert_eq!(fs.writeback_stats().dirty_pages, 0);
    for (name, want) in &files {
        assert_eq!(&fs.read_file(format!("/{name}")).unwrap(), want, "{name}");
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    let fs = Fs::open(&img).unwrap();
    for (name, want) in &files {
        assert_eq!(&fs.read_file(format!("/{name}")).unwrap(), want, "{name} after reopen");
    }
}

/// Opens `img` so that nothing is written back before the test asks.
fn open_holding_dirty_pages(img: &Path) -> Fs {
    open_with(img, |o| {
        o.page_cache_bytes = 256 << 20;
        o.dirty_ratio = 90;
        o.dirty_background_ratio = 90;
        o.dirty_expire = Duration::from_secs(3600);
    })
}

/// Makes directories with a 3,000-byte attribute each (an attribute block) until the disk
/// refuses one; returns the refusal.
fn directories_until_refused(fs: &Fs) -> rext4::Error {
    for made in 0..100_000 {
        let r = fs.mkdir(fs.root(), format!("d{made}").as_bytes(), 0o755, 0, 0).and_then(|a| {
            fs.setxattr(a.ino, b"user.v", &[7u8; 3000], 0)?;
            Ok(a)
        });
        if let Err(e) = r {
            return e;
        }
    }
    panic!("100,000 directories on a full disk");
}

/// Blocks reserved for delayed writes are not anyone else's: once the disk is full of
/// delayed writes, directories and attribute blocks fail with `ENOSPC` rather than take
/// them, and every accepted byte still reaches the disk (`ext4_has_free_clusters` counts
/// dirty clusters for every allocation).
#[test]
fn metadata_never_takes_the_blocks_of_delayed_writes() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("d.img");
    Image::ext4("32M").block_size(4096).args(["-m", "0"]).build(&img);
    let fs = open_holding_dirty_pages(&img);
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let data = pattern(3, 64 << 20);
    let mut done = 0usize;
    // Every block `statfs` offers, reserved by delayed writes (what is left is the slack
    // kept for metadata).
    while fs.statfs().unwrap().blocks_avail > 0 {
        done += fs.write(f, done as u64, &data[done..done + 4096]).unwrap();
    }
    assert!(done > 16 << 20, "{done}");
    assert_eq!(fs.writeback_stats().dirty_pages, done as u64 / 4096, "delayed writes wait in memory");
    let err = directories_until_refused(&fs);
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    fs.fsync(f).expect("writeback of accepted writes");
    assert_eq!(fs.read_file("/f").unwrap(), &data[..done]);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    let fs = Fs::open(&img).unwrap();
    assert_eq!(fs.read_file("/f").unwrap(), &data[..done], "after reopen");
}

/// A sparse file's delayed writes need extent-tree blocks at writeback beyond the blocks they
/// reserved; those come from the metadata slack, which directories and attribute blocks must
/// therefore leave alone (as in `ext4_has_free_clusters`: only `METADATA_NOFAIL` mappings
/// may take it). A user filling the disk with directories must not make writeback fail.
#[test]
fn directories_leave_the_slack_writeback_needs_for_tree_blocks() {
    for ext3 in [false, true] {
        for reserve in ["0", "5"] {
            sparse_delayed_writes_then_directories(ext3, reserve);
        }
    }
}

fn sparse_delayed_writes_then_directories(ext3: bool, reserve: &str) {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("d.img");
    let image = Image::ext4("32M").block_size(4096).args(["-m", reserve]);
    if ext3 { image.fs_type("ext3") } else { image }.build(&img);
    let fs = open_holding_dirty_pages(&img);
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let page = [5u8; 4096];
    // Every other block: each written page is an extent of its own at writeback.
    let mut pages = 0u64;
    while fs.statfs().unwrap().blocks_avail > 0 {
        fs.write(f, pages * 2 * 4096, &page).unwrap();
        pages += 1;
    }
    assert!(pages > 3000, "{pages}");
    let err = directories_until_refused(&fs);
    assert_eq!(err.errno(), libc::ENOSPC, "ext3 {ext3}, -m {reserve}: {err}");
    let synced = fs.fsync(f);
    assert!(synced.is_ok(), "ext3 {ext3}, -m {reserve}: writeback of accepted writes: {synced:?}");
    let mut buf = [0u8; 4096];
    for p in [0, pages / 2, pages - 1] {
        assert_eq!(fs.read(f, p * 2 * 4096, &mut buf).unwrap(), 4096);
        assert_eq!(buf, page, "page {p}");
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    if !ext3 {
        assert!(extent_count(&img, "/f") as u64 >= pages, "one extent a page");
    }
}

/// With a small page cache, dirty pages stay within the hard limit, whether the flusher
/// (woken past the background limit) or the writer itself writes them back.
#[test]
fn dirty_pages_stay_within_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "256M");
    // 8 MiB of cache: at most 4 MiB (1024 pages) dirty.
    let fs = open_with(&img, |o| o.page_cache_bytes = 8 << 20);
    let ino = fs.create(fs.root(), b"big", 0o644, 0, 0).unwrap().ino;
    let data = pattern(9, 64 << 20);
    let most = write_watching_dirty(&fs, ino, &data);
    let st = fs.writeback_stats();
    assert!(most <= 1024 + 1, "{most} pages dirty at most");
    assert!(st.flusher_rounds + st.throttled > 0, "{st:?}");
    assert!(st.written_blocks >= 16384 - 1024, "{st:?}");
    assert_eq!(fs.read_file("/big").unwrap(), data);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    assert!(extent_count(&img, "/big") <= 8, "{} extents", extent_count(&img, "/big"));
}

/// With the background limit at the hard one, nothing is written back before the hard
/// limit, so the writer meets it and writes its own file back (`balance_dirty_pages`),
/// whatever the flusher's speed; with the background limit lower, the flusher starts first.
#[test]
fn writers_write_their_own_files_back_at_the_hard_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (img, fs, ino) = with_dirty_limits(dir.path(), 8, 25, 25);
    // 8 MiB: four times the 2 MiB (512 pages) the limit allows.
    let data = pattern(3, 8 << 20);
    let most = write_watching_dirty(&fs, ino, &data);
    let st = fs.writeback_stats();
    assert!(most <= 512 + 1, "{most} pages dirty at most");
    assert!(st.throttled > 0, "{st:?}");
    assert_eq!(fs.read_file("/big").unwrap(), data);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);

    // Background limit low, hard limit out of reach: only the flusher writes back.
    let (img, fs, ino) = with_dirty_limits(dir.path(), 64, 100, 1);
    write_watching_dirty(&fs, ino, &data);
    let t = std::time::Instant::now();
    while fs.writeback_stats().flusher_rounds == 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", fs.writeback_stats());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(fs.writeback_stats().throttled, 0);
    assert_eq!(fs.read_file("/big").unwrap(), data);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}

/// A fresh 128 MiB image in `dir` opened with a page cache of `cache_mib` and the dirty
/// limits given, and an empty file `/big` on it.
fn with_dirty_limits(
    dir: &Path,
    cache_mib: usize,
    ratio: u8,
    background: u8,
) -> (std::path::PathBuf, Fs, InodeNo) {
    let img = image(dir, "128M");
    let fs = open_with(&img, |o| {
        o.page_cache_bytes = cache_mib << 20;
        o.dirty_ratio = ratio;
        o.dirty_background_ratio = background;
    });
    let ino = fs.create(fs.root(), b"big", 0o644, 0, 0).unwrap().ino;
    (img, fs, ino)
}

/// Writes `data` to `ino` a block at a time; returns the most pages seen dirty after a write.
fn write_watching_dirty(fs: &Fs, ino: InodeNo, data: &[u8]) -> u64 {
    let mut most = 0;
    for (k, p) in data.chunks(4096).enumerate() {
        fs.write(ino, (k * 4096) as u64, p).unwrap();
        most = most.max(fs.writeback_stats().dirty_pages);
    }
    most
}

/// Pages older than the expiry are written back by the flusher, without fsync or sync.
#[test]
fn the_flusher_writes_back_expired_pages() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "64M");
    let fs = open_with(&img, |o| o.dirty_expire = Duration::from_millis(60));
    let ino = fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap().ino;
    write_pieces(&fs, ino, &pattern(1, 100_000), 10_000);
    assert!(fs.writeback_stats().dirty_pages > 0);
    let t = std::time::Instant::now();
    while fs.writeback_stats().dirty_files > 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", fs.writeback_stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = fs.writeback_stats();
    assert_eq!(st.written_blocks, 25, "{st:?}");
    assert!(st.flusher_rounds > 0);
    // Written back and journaled: a crash now (no unmount) keeps the file.
    fs.sync().unwrap();
    let snap = dir.path().join("snap.img");
    std::fs::copy(&img, &snap).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    let fs = Fs::open(&snap).unwrap();
    assert_eq!(fs.read_file("/a").unwrap(), pattern(1, 100_000));
    drop(fs);
    // The snapshot as e2fsck recovers it is clean too.
    let status = std::process::Command::new("e2fsck").arg("-fy").arg(&snap).output().unwrap().status;
    assert!(status.code().is_some_and(|c| c <= 1), "e2fsck {status}");
    e2fsck_clean(&snap);
}

/// Writes into holes of a file that has blocks, overwrites of blocks next to dirty pages, and
/// the operations that edit the map (truncate, punch, collapse, zero) keep every byte.
#[test]
fn delayed_pages_beside_mapped_blocks_and_map_edits() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "64M");
    let fs = open_with(&img, |_| {});
    let ino = fs.create(fs.root(), b"m", 0o644, 0, 0).unwrap().ino;
    let mut model = vec![0u8; 0];
    let put = |fs: &Fs, off: usize, data: &[u8], model: &mut Vec<u8>| {
        fs.write(ino, off as u64, data).unwrap();
        if model.len() < off + data.len() {
            model.resize(off + data.len(), 0);
        }
        model[off..off + data.len()].copy_from_slice(data);
    };
    // Mapped blocks (a large write goes to the device at once), then holes around them.
    put(&fs, 40_960, &pattern(1, 2 << 20), &mut model);
    put(&fs, 0, &pattern(2, 10_000), &mut model);
    put(&fs, (2 << 20) + 40_000, &pattern(3, 30_000), &mut model);
    put(&fs, 8 << 20, &pattern(4, 5000), &mut model);
    assert!(fs.writeback_stats().dirty_pages > 0);
    assert_eq!(fs.read_file("/m").unwrap(), model);
    fs.fallocate(ino, rext4::FALLOC_FL_PUNCH_HOLE | rext4::FALLOC_FL_KEEP_SIZE, 4096, 8192).unwrap();
    model[4096..12_288].fill(0);
    assert_eq!(fs.read_file("/m").unwrap(), model);
    put(&fs, 5000, &pattern(5, 100), &mut model);
    fs.fallocate(ino, rext4::FALLOC_FL_COLLAPSE_RANGE, 1 << 20, 1 << 20).unwrap();
    model.drain(1 << 20..2 << 20);
    put(&fs, (7 << 20) + 3, &pattern(6, 9000), &mut model);
    fs.setattr(ino, &rext4::SetAttr { size: Some((7 << 20) + 5000), ..Default::default() }).unwrap();
    model.truncate((7 << 20) + 5000);
    put(&fs, (7 << 20) + 9000, &pattern(7, 10), &mut model);
    assert_eq!(fs.read_file("/m").unwrap(), model);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    let fs = Fs::open(&img).unwrap();
    assert_eq!(fs.read_file("/m").unwrap(), model, "after reopen");
}

/// Issue target: 8 threads append 4 KiB at a time to their own files up to 64 MiB each
/// (files held open, no fsync): no more extents per file than the kernel makes.
#[test]
fn appends_side_by_side_end_in_no_more_extents_than_the_kernels() {
    const FILES: usize = 8;
    const SIZE: usize = 64 << 20;
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "1G");
    let fs = open_with(&img, |_| {});
    crate::prealloc::append_side_by_side(&fs, FILES, SIZE / 4096);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    let ours: Vec<usize> = (0..FILES).map(|i| extent_count(&img, &format!("/f{i}"))).collect();
    eprintln!("extents per file: rext4 {ours:?}");
    rext4_testkit::require_kernel!();
    let kimg = dir.path().join("kernel.img");
    Image::ext4("1G").block_size(4096).build(&kimg);
    {
        let m = KernelMount::rw(&kimg).unwrap();
        std::thread::scope(|s| {
            for i in 0..FILES {
                let path = m.path().join(format!("f{i}"));
                s.spawn(move || {
                    use std::io::Write;
                    let mut f = std::fs::File::create(path).unwrap();
                    let data = vec![i as u8 + 1; 4096];
                    for _ in 0..SIZE / 4096 {
                        f.write_all(&data).unwrap();
                    }
                });
            }
        });
        m.unmount().unwrap();
    }
    let kernel: Vec<usize> = (0..FILES).map(|i| extent_count(&kimg, &format!("/f{i}"))).collect();
    eprintln!("extents per file: kernel {kernel:?}");
    for (i, (o, k)) in ours.iter().zip(&kernel).enumerate() {
        assert!(o <= k, "f{i}: rext4 {o} extents, kernel {k} (rext4 {ours:?}, kernel {kernel:?})");
    }
}

/// Write a new version, rename it over the old (no fsync): the rename writes the new file
/// back first, so a crash right after the rename's commit shows the new data, never an empty
/// or zero-filled file (the kernel's `auto_da_alloc`). A crash before it shows the old data.
#[test]
fn rename_over_a_file_writes_the_new_one_back_first() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "64M");
    let fs = open_with(&img, |_| {});
    fs.write_file("/config", pattern(1, 30_000)).unwrap();
    fs.sync().unwrap();
    let tmp = fs.create(fs.root(), b"config.tmp", 0o644, 0, 0).unwrap().ino;
    write_pieces(&fs, tmp, &pattern(2, 50_000), 4096);
    assert!(fs.writeback_stats().dirty_files > 0);
    let before = dir.path().join("before.img");
    std::fs::copy(&img, &before).unwrap();
    fs.rename(fs.root(), b"config.tmp", fs.root(), b"config", 0).unwrap();
    assert_eq!(fs.writeback_stats().dirty_pages, 0, "the renamed file was written back");
    // The rename's transaction commits (fsync of the directory), then the machine stops.
    fs.fsync(fs.root()).unwrap();
    let after = dir.path().join("after.img");
    std::fs::copy(&img, &after).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    for (snap, want) in [(&before, pattern(1, 30_000)), (&after, pattern(2, 50_000))] {
        let fs = Fs::open(snap).unwrap();
        assert_eq!(fs.read_file("/config").unwrap(), want, "{}", snap.display());
        drop(fs);
        // What the kernel's or e2fsck's recovery makes of it is clean too.
        let status = std::process::Command::new("e2fsck").arg("-fy").arg(snap).output().unwrap().status;
        assert!(status.code().is_some_and(|c| c <= 1), "{}: e2fsck {status}", snap.display());
        e2fsck_clean(snap);
    }
}

/// A bigalloc image of `size` with 4 KiB blocks and clusters of `cluster` bytes.
fn bigalloc_image(dir: &Path, size: &str, cluster: &str) -> std::path::PathBuf {
    let img = dir.join("b.img");
    Image::ext4(size).block_size(4096).args(["-O", "bigalloc", "-C", cluster]).build(&img);
    img
}

/// With bigalloc a delayed page over a hole reserves its logical cluster, once: a second page
/// of the cluster reserves nothing, nor does a page in a cluster the file maps a block of
/// (written, or preallocated); `statfs`, `st_blocks` and the statistics count whole clusters;
/// writing back any page of a cluster gives its reservation up; and what is written back,
/// e2fsck and the kernel agree on.
#[test]
fn bigalloc_pages_reserve_their_clusters() {
    let dir = tempfile::tempdir().unwrap();
    // Clusters of 4 blocks.
    let img = bigalloc_image(dir.path(), "64M", "16384");
    let fs = open_with(&img, |_| {});
    let (c, bs) = (16_384u64, 4096u64);
    let cluster_blocks = |n: u64| n * 4;
    let free0 = fs.statfs().unwrap().blocks_free;
    let delayed = |fs: &Fs| fs.writeback_stats().delalloc_blocks;
    let a = fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap().ino;
    fs.write(a, 10, b"first").unwrap();
    assert_eq!(delayed(&fs), cluster_blocks(1), "a page reserves its cluster");
    fs.write(a, 2 * bs + 7, b"same cluster").unwrap();
    assert_eq!(delayed(&fs), cluster_blocks(1), "another page of the cluster reserves nothing");
    fs.write(a, 5 * c + bs, b"far").unwrap();
    fs.write(a, 5 * c + 3 * bs, b"farther").unwrap();
    assert_eq!(delayed(&fs), cluster_blocks(2));
    assert_eq!(fs.getattr(a).unwrap().blocks, cluster_blocks(2) * 8, "st_blocks in whole clusters");
    assert_eq!(fs.statfs().unwrap().blocks_free, free0 - cluster_blocks(2));

    // A block of the cluster is mapped: pages beside it reserve nothing.
    let b = fs.create(fs.root(), b"b", 0o644, 0, 0).unwrap().ino;
    fs.write(b, 0, &pattern(1, 70_000)).unwrap();
    fs.fsync(b).unwrap();
    let free1 = fs.statfs().unwrap().blocks_free;
    let before = delayed(&fs);
    // 70,000 bytes end in block 17, the second of the fifth cluster: block 18 is a hole.
    fs.write(b, 18 * bs + 5, b"hole in a mapped cluster").unwrap();
    assert!(fs.writeback_stats().dirty_pages > 0);
    assert_eq!(delayed(&fs), before, "the last cluster of b is mapped");
    // Preallocated clusters are mapped too.
    let p = fs.create(fs.root(), b"p", 0o644, 0, 0).unwrap().ino;
    fs.fallocate(p, rext4::FALLOC_FL_KEEP_SIZE, 0, 8 * c).unwrap();
    let free2 = fs.statfs().unwrap().blocks_free;
    fs.write(p, 3 * c + 100, b"into preallocated space").unwrap();
    fs.write(p, 9 * c, b"past it").unwrap();
    assert_eq!(delayed(&fs), before + cluster_blocks(1), "only the page past the preallocation");
    assert_eq!(fs.statfs().unwrap().blocks_free, free2 - cluster_blocks(1));
    assert!(free2 < free1);

    // Written back: every reservation given up, the clusters taken instead.
    fs.fsync(a).unwrap();
    assert_eq!(delayed(&fs), cluster_blocks(1), "p's reservation stays");
    fs.sync().unwrap();
    let st = fs.writeback_stats();
    assert_eq!((st.dirty_pages, st.delalloc_blocks), (0, 0), "{st:?}");
    assert_eq!(fs.getattr(a).unwrap().blocks, cluster_blocks(2) * 8);
    let mut want_a = vec![0u8; (5 * c + 3 * bs) as usize + 7];
    want_a[10..15].copy_from_slice(b"first");
    want_a[(2 * bs + 7) as usize..(2 * bs + 19) as usize].copy_from_slice(b"same cluster");
    want_a[(5 * c + bs) as usize..(5 * c + bs + 3) as usize].copy_from_slice(b"far");
    want_a[(5 * c + 3 * bs) as usize..].copy_from_slice(b"farther");
    assert_eq!(fs.read_file("/a").unwrap(), want_a);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    rext4_testkit::require_kernel!();
    let m = KernelMount::ro(&img).unwrap();
    assert_eq!(std::fs::read(m.path().join("a")).unwrap(), want_a, "the kernel reads the same");
    let pk = std::fs::read(m.path().join("p")).unwrap();
    assert_eq!(pk.len() as u64, 9 * c + 7);
    assert_eq!(&pk[(3 * c + 100) as usize..(3 * c + 123) as usize], b"into preallocated space");
    m.unmount().unwrap();
}

/// With bigalloc too, `ENOSPC` comes from the write, never from writeback: files written a
/// page at a time into every other cluster (each page reserving a cluster of its own) until
/// the filesystem is full, then written back whole.
#[test]
fn bigalloc_no_space_comes_from_the_write_never_from_writeback() {
    let dir = tempfile::tempdir().unwrap();
    let img = bigalloc_image(dir.path(), "24M", "16384");
    let fs = open_with(&img, |_| {});
    // Each file's name and its pieces (offset, bytes).
    type Pieces = Vec<(u64, Vec<u8>)>;
    let mut files: Vec<(String, Pieces)> = Vec::new();
    let mut full = false;
    for i in 0..10_000u32 {
        let name = format!("f{i}");
        let ino = match fs.create(fs.root(), name.as_bytes(), 0o644, 0, 0) {
            Ok(a) => a.ino,
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                break;
            }
        };
        let mut pieces = Vec::new();
        for k in 0..12u64 {
            let piece = pattern((i + k as u32) as u8, 3000);
            match fs.write(ino, k * 2 * 16_384 + 100, &piece) {
                Ok(n) => pieces.push((k * 2 * 16_384 + 100, piece[..n].to_vec())),
                Err(e) => {
                    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                    full = true;
                    break;
                }
            }
        }
        files.push((name, pieces));
        if full {
            break;
        }
    }
    assert!(full, "the filesystem filled up");
    fs.sync().unwrap();
    assert_eq!(fs.writeback_stats().dirty_pages, 0);
    let check = |fs: &Fs, when: &str| {
        for (name, pieces) in &files {
            let got = fs.read_file(format!("/{name}")).unwrap();
            for (off, want) in pieces {
                assert_eq!(&got[*off as usize..*off as usize + want.len()], &want[..], "{name} {when}");
            }
        }
    };
    check(&fs, "written back");
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    check(&Fs::open(&img).unwrap(), "after reopen");
}
