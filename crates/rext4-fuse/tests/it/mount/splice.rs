//! Large reads spliced from the image (splice.rs in the adapter): the bytes a reader gets are
//! the file's, whether the read was spliced or, for what cannot be (holes, unwritten extents,
//! delayed writes, short reads), read through memory; access times as for any read.

use super::*;
use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};

/// The file's bytes read through the mount in `chunk`-byte reads, after the kernel's cached
/// pages are dropped, so every read reaches the daemon.
fn read_cold(path: &std::path::Path, chunk: usize) -> Vec<u8> {
    let f = File::open(path).unwrap();
    posix_fadvise(&f, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED).unwrap();
    let mut out = Vec::new();
    let mut buf = vec![0u8; chunk];
    loop {
        let n = f.read_at(&mut buf, out.len() as u64).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

fn spliced(fs: &rext4::Fs) -> u64 {
    fs.page_cache_stats().spliced_reads
}

/// A fresh image of `size` in `dir`, mounted with `opts`, and the filesystem the daemon serves.
/// The tests name `noio_uring`: replies through io_uring are not spliced, and uring.rs may
/// turn the kernel's `enable_uring` on while they mount.
fn mounted(dir: &std::path::Path, size: &str, opts: &str) -> (std::path::PathBuf, rext4::Fs, FuseMount) {
    let img = Image::ext4(size).build_in(dir, "splice.img");
    let o = rext4_fuse::MountOptions::parse(opts).unwrap();
    let fs = rext4::Fs::open_with(&img, o.engine_options()).unwrap();
    let m = FuseMount::serve(fs.clone(), &o).unwrap();
    (img, fs, m)
}

#[test]
fn large_reads_splice_the_files_bytes() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let (img, fs, m) = mounted(dir.path(), "256M", "rw,strictatime,noio_uring");
    let p = |s: &str| m.join(s);
    let mut rng = Rng::new(7);

    // Written and synced: every block mapped and on the image.
    let big = rng.bytes((5 << 20) + 4097);
    fs::write(p("big"), &big).unwrap();
    File::open(p("big")).unwrap().sync_all().unwrap();
    let before = spliced(&fs);
    for chunk in [1 << 20, 128 << 10, 300_001] {
        assert_eq!(read_cold(&p("big"), chunk), big, "big in {chunk}-byte reads");
    }
    let after_big = spliced(&fs);
    assert!(after_big > before, "no read of a synced file was spliced");

    // A hole between two written stretches: zeros, read through memory.
    let sparse = File::create(p("sparse")).unwrap();
    let head = rng.bytes(1 << 20);
    let tail = rng.bytes(1 << 20);
    sparse.write_all_at(&head, 0).unwrap();
    sparse.write_all_at(&tail, 3 << 20).unwrap();
    sparse.sync_all().unwrap();
    let mut want = head.clone();
    want.resize(3 << 20, 0);
    want.extend_from_slice(&tail);
    drop(sparse);
    assert_eq!(read_cold(&p("sparse"), 1 << 20), want, "sparse");

    // Preallocated (unwritten) blocks read as zeros; the written part as written.
    let pre = File::create(p("prealloc")).unwrap();
    nix::fcntl::fallocate(&pre, nix::fcntl::FallocateFlags::empty(), 0, 4 << 20).unwrap();
    let mid = rng.bytes(1 << 20);
    pre.write_all_at(&mid, 1 << 20).unwrap();
    pre.sync_all().unwrap();
    drop(pre);
    let mut want = vec![0u8; 4 << 20];
    want[1 << 20..2 << 20].copy_from_slice(&mid);
    assert_eq!(read_cold(&p("prealloc"), 1 << 20), want, "prealloc");

    // A range zeroed over written blocks (ext4 makes it unwritten; the old bytes stay on
    // the image, and must not be read).
    let z = File::create(p("zeroed")).unwrap();
    let mut want = rng.bytes(4 << 20);
    z.write_all_at(&want, 0).unwrap();
    z.sync_all().unwrap();
    nix::fcntl::fallocate(&z, nix::fcntl::FallocateFlags::FALLOC_FL_ZERO_RANGE, 1 << 20, 2 << 20).unwrap();
    z.sync_all().unwrap();
    drop(z);
    want[1 << 20..3 << 20].fill(0);
    assert_eq!(read_cold(&p("zeroed"), 1 << 20), want, "zeroed");

    // Delayed writes still in the daemon's memory: over a hole and over written blocks.
    let d = OpenOptions::new().write(true).open(p("big")).unwrap();
    let patch = rng.bytes(200_000);
    d.write_all_at(&patch, 1_000_000).unwrap();
    let grown = rng.bytes(1 << 20);
    d.write_all_at(&grown, 6 << 20).unwrap();
    let mut want = big.clone();
    want[1_000_000..1_200_000].copy_from_slice(&patch);
    want.resize(6 << 20, 0);
    want.extend_from_slice(&grown);
    assert_eq!(read_cold(&p("big"), 1 << 20), want, "big after unsynced writes");
    d.sync_all().unwrap();
    drop(d);
    assert_eq!(read_cold(&p("big"), 1 << 20), want, "big after they were synced");

    // A spliced read sets the access time (strictatime: every read).
    let old = ft(1_000_000_000, 0);
    filetime::set_file_atime(p("big"), old).unwrap();
    let n = spliced(&fs);
    let _ = read_cold(&p("big"), 1 << 20);
    assert!(spliced(&fs) > n, "the read after the sync was not spliced");
    let atime = fs::metadata(p("big")).unwrap().atime();
    assert!(atime > 1_000_000_000, "a spliced read left the access time at {atime}");

    unmount_and_compare(m, &img);
}

#[test]
fn nosplice_reads_through_memory() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let (img, fs, m) = mounted(dir.path(), "64M", "rw,nosplice,noio_uring");
    let data = Rng::new(9).bytes(3 << 20);
    fs::write(m.join("f"), &data).unwrap();
    File::open(m.join("f")).unwrap().sync_all().unwrap();
    assert_eq!(read_cold(&m.join("f"), 1 << 20), data);
    assert_eq!(spliced(&fs), 0, "nosplice spliced a read");
    unmount_and_compare(m, &img);
}
