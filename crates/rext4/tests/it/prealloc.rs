//! Per-inode preallocation (alloc/prealloc.rs): files appended to side by side keep their
//! blocks together, as the kernel's do, and the blocks set aside for them are free again
//! when the files are closed, or when nothing else is left.

use rext4::{Fs, InodeNo, Options};
use rext4_testkit::{e2fsck_clean, extent_count, Image, KernelMount};
use std::path::Path;

const FILES: usize = 8;
const APPENDS: usize = 512;
const PIECE: usize = 4096;

/// Without delayed allocation, so that every write allocates and the reserves are what keeps
/// the files' blocks together (tests/it/delalloc.rs has the default).
fn open(img: &Path) -> Fs {
    Fs::open_with(img, Options { writable: true, delalloc: false, ..Options::default() }).unwrap()
}

/// `files` threads each append `appends` pieces of 4 KiB to a file of their own (`/f0`,
/// ...), the files held open meanwhile, through the engine.
pub(crate) fn append_side_by_side(fs: &Fs, files: usize, appends: usize) {
    let inos: Vec<InodeNo> = (0..files)
        .map(|i| {
            let a = fs.create(fs.root(), format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
            fs.hold(a.ino).unwrap();
            a.ino
        })
        .collect();
    std::thread::scope(|s| {
        for (i, &ino) in inos.iter().enumerate() {
            s.spawn(move || {
                let data = vec![i as u8 + 1; PIECE];
                for k in 0..appends {
                    fs.write(ino, (k * PIECE) as u64, &data).unwrap();
                }
            });
        }
    });
    for ino in inos {
        fs.release(ino).unwrap();
    }
}

#[test]
fn files_appended_side_by_side_keep_their_blocks_together() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("pa.img");
    Image::ext4("256M").block_size(4096).build(&img);
    let fs = open(&img);
    let free_before = fs.statfs().unwrap().blocks_free;
    append_side_by_side(&fs, FILES, APPENDS);
    // Closed: nothing stays set aside, every block not in a file is free.
    assert_eq!(fs.stats().reserved_blocks, 0);
    let used = (FILES * APPENDS) as u64;
    let free_after = fs.statfs().unwrap().blocks_free;
    assert!(
        free_before - free_after >= used && free_before - free_after < used + 64,
        "{free_before} -> {free_after}"
    );
    for i in 0..FILES {
        let data = fs.read_file(format!("/f{i}")).unwrap();
        assert_eq!(data.len(), APPENDS * PIECE);
        assert!(data.iter().all(|&b| b == i as u8 + 1), "f{i} holds another file's bytes");
    }
    fs.unmount().unwrap();
    e2fsck_clean(&img);
    let ours: Vec<usize> = (0..FILES).map(|i| extent_count(&img, &format!("/f{i}"))).collect();
    // Without reserves the files took turns, one extent per block; the kernel's reserves grow
    // with the file up to 8 MiB, which 2 MiB files never outgrow.
    assert!(ours.iter().all(|&n| n <= 12), "extents per file: {ours:?}");

    // The kernel on the same workload, where it can mount: no more extents than it makes.
    rext4_testkit::require_kernel!();
    let kimg = dir.path().join("kernel.img");
    Image::ext4("256M").block_size(4096).build(&kimg);
    {
        let m = KernelMount::rw(&kimg).unwrap();
        let files: Vec<std::fs::File> =
            (0..FILES).map(|i| std::fs::File::create(m.path().join(format!("f{i}"))).unwrap()).collect();
        std::thread::scope(|s| {
            for (i, f) in files.iter().enumerate() {
                s.spawn(move || {
                    use std::os::unix::fs::FileExt;
                    let data = vec![i as u8 + 1; PIECE];
                    for k in 0..APPENDS {
                        f.write_all_at(&data, (k * PIECE) as u64).unwrap();
                        // Each append its own allocation, as the engine's are (no delayed
                        // allocation to merge them).
                        f.sync_data().unwrap();
                    }
                });
            }
        });
        drop(files);
        m.unmount().unwrap();
    }
    let kernel: Vec<usize> = (0..FILES).map(|i| extent_count(&kimg, &format!("/f{i}"))).collect();
    let (o, k): (usize, usize) = (ours.iter().sum(), kernel.iter().sum());
    eprintln!("extents per file: rext4 {ours:?}, kernel {kernel:?}");
    assert!(o <= k.max(FILES), "extents: rext4 {ours:?}, kernel {kernel:?}");
}

#[test]
fn reserved_blocks_are_given_back_when_nothing_else_is_free() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("full.img");
    Image::ext4("16M").block_size(4096).build(&img);
    let fs = open(&img);
    // Files held open, each with a reserve after its first blocks.
    let held: Vec<InodeNo> = (0..16)
        .map(|i| {
            let a = fs.create(fs.root(), format!("h{i}").as_bytes(), 0o644, 0, 0).unwrap();
            fs.hold(a.ino).unwrap();
            fs.write(a.ino, 0, &vec![7u8; 64 << 10]).unwrap();
            fs.write(a.ino, 64 << 10, &[7u8; 4096]).unwrap();
            a.ino
        })
        .collect();
    assert!(fs.stats().reserved_blocks > 0, "held files that grew keep reserves");
    // A file that needs nearly every free block: the reserves must make way.
    let free = fs.statfs().unwrap().blocks_avail;
    let big = fs.create(fs.root(), b"big", 0o644, 0, 0).unwrap();
    let want = (free - 64) * 4096;
    let chunk = vec![9u8; 1 << 20];
    let mut at = 0;
    while at < want {
        let n = (want - at).min(chunk.len() as u64) as usize;
        fs.write(big.ino, at, &chunk[..n]).unwrap_or_else(|e| panic!("at {at} of {want}: {e}"));
        at += n as u64;
    }
    for ino in held {
        fs.release(ino).unwrap();
    }
    fs.unmount().unwrap();
    e2fsck_clean(&img);
}
