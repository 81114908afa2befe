//! Orphans (seed 001): held inodes outlive their last name, are recorded in the orphan file or
//! on the superblock's list, and are freed at the last release; what a crash (or the kernel)
//! leaves recorded is freed at the next writable open. Oracles: `e2fsck -fn`, the kernel's
//! view and counts, `debugfs`.

use rext4::{Fs, InodeNo, Options, SetAttr};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

/// Feature variants: the list only, the orphan file, a two-block orphan file that fills up,
/// no checksums, no journal (no records at all).
const VARIANTS: &[(&str, &[&str])] = &[
    ("list", &[]),
    ("orphan-file", &["-O", "metadata_csum_seed,orphan_file"]),
    ("tiny-orphan-file", &["-O", "orphan_file", "-E", "orphan_file_size=2"]),
    ("nocsum", &["-O", "^metadata_csum,^64bit"]),
    ("nojournal", &["-O", "^has_journal"]),
];

fn journaled(args: &[&str]) -> bool {
    !args.contains(&"^has_journal")
}

/// A source tree: `dN/fM` files with data (1..6 KiB, so blocks are freed), `data` (40 KiB with
/// an xattr), and an empty directory `emptydir`.
fn source(dir: &Path, dirs: usize, files: usize) -> PathBuf {
    let src = dir.join("src");
    let mut rng = common::Rng::new(7);
    for d in 0..dirs {
        let p = src.join(format!("d{d}"));
        std::fs::create_dir_all(&p).unwrap();
        for f in 0..files {
            let n = rng.range(1024, 6000) as usize;
            std::fs::write(p.join(format!("f{f}")), rng.bytes(n)).unwrap();
        }
    }
    std::fs::write(src.join("data"), rng.bytes(40 << 10)).unwrap();
    xattr::set(src.join("data"), "user.note", b"kept until the last release").unwrap();
    std::fs::create_dir_all(src.join("emptydir")).unwrap();
    src
}

fn image(dir: &Path, name: &str, args: &[&str], dirs: usize, files: usize) -> PathBuf {
    let src = source(&dir.join(name), dirs, files);
    let img = dir.join(format!("{name}.img"));
    // Extended options go in one -E.
    let mut ext = vec!["root_owner=0:0".to_string()];
    let mut all: Vec<String> = ["-b", "1024", "-N", "4096"].map(String::from).to_vec();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match *a {
            "-E" => ext.push(it.next().unwrap().to_string()),
            a => all.push(a.to_string()),
        }
    }
    all.extend(["-E".to_string(), ext.join(",")]);
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    common::mkfs(Some(&src), &img, &all, "32M");
    img
}

fn rw(img: &Path) -> Fs {
    Fs::open_with(img, Options { writable: true, ..Options::default() }).unwrap()
}

fn read_all(fs: &Fs, ino: InodeNo) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size as usize;
    let mut buf = vec![0u8; size + 10];
    let n = fs.read(ino, 0, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// Blocks the inode takes, in filesystem blocks.
fn fs_blocks(fs: &Fs, ino: InodeNo) -> u64 {
    fs.getattr(ino).unwrap().blocks / u64::from(fs.block_size() / 512)
}

/// Whether debugfs says the inode is allocated.
fn in_use(img: &Path, ino: InodeNo) -> bool {
    let o = Command::new(common::tool("debugfs"))
        .arg("-R")
        .arg(format!("testi <{}>", ino.0))
        .arg(img)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    if text.contains("is marked in use") {
        return true;
    }
    assert!(text.contains("is not in use"), "debugfs testi: {text}");
    false
}

/// A read-only look at the image as the journal would leave it: the list head and the inodes in
/// the orphan file.
fn recorded(img: &Path) -> (u32, BTreeSet<u32>) {
    let fs = Fs::open(img).unwrap();
    let head = fs.superblock().s_last_orphan.get();
    let mut file = BTreeSet::new();
    let oino = fs.superblock().s_orphan_file_inum.get();
    if oino != 0 {
        let size = fs.getattr(InodeNo(oino)).unwrap().size as usize;
        let mut buf = vec![0u8; size];
        fs.read(InodeNo(oino), 0, &mut buf).unwrap();
        for b in buf.chunks(fs.block_size() as usize) {
            file.extend(rext4::format::orphan::slots(b));
        }
    }
    (head, file)
}

#[test]
fn held_file_outlives_its_name() {
    let dir = tempfile::tempdir().unwrap();
    for &(name, args) in VARIANTS {
        let img = image(dir.path(), name, args, 1, 4);
        let fs = rw(&img);
        let root = fs.root();
        let ino = fs.resolve("/data", false).unwrap();
        let want = read_all(&fs, ino);
        let blocks = fs_blocks(&fs, ino);
        assert!(blocks >= 40, "{name}: data has {blocks} blocks");
        let before = fs.statfs().unwrap();
        if journaled(args) && args.contains(&"orphan_file") {
            assert!(common::features(&img).contains("orphan_present"), "{name}: orphan_present while open");
        }

        fs.hold(ino).unwrap();
        fs.hold(ino).unwrap();
        fs.unlink(root, b"data").unwrap();
        assert_eq!(fs.lookup(root, b"data").unwrap_err().errno(), libc::ENOENT);
        let a = fs.getattr(ino).unwrap();
        assert_eq!(a.nlink, 0, "{name}");
        assert_eq!(read_all(&fs, ino), want, "{name}: content after unlink");
        assert_eq!(fs.getxattr(ino, b"user.note").unwrap(), b"kept until the last release");
        let a = fs.setattr(ino, &SetAttr { mode: Some(0o600), uid: Some(42), ..SetAttr::default() }).unwrap();
        assert_eq!((a.perm(), a.uid, a.nlink), (0o600, 42, 0), "{name}");
        // Nothing freed yet: the blocks and the inode are still in use.
        let mid = fs.statfs().unwrap();
        assert_eq!((mid.blocks_free, mid.files_free), (before.blocks_free, before.files_free), "{name}");
        assert_eq!(fs.orphans(), if journaled(args) { vec![ino] } else { vec![] }, "{name}: records");
        // A name cannot be given back to an orphan (the kernel's ENOENT).
        assert_eq!(fs.link(ino, root, b"again").unwrap_err().errno(), libc::ENOENT);

        // Committed: a read-only look at the image sees the record.
        fs.sync().unwrap();
        let (head, file) = recorded(&img);
        if journaled(args) {
            assert!(
                head == ino.0 || file.contains(&ino.0),
                "{name}: record on disk: head {head} file {file:?}"
            );
        } else {
            assert!(head == 0 && file.is_empty(), "{name}");
        }

        fs.release(ino).unwrap();
        assert_eq!(read_all(&fs, ino), want, "{name}: one reference left");
        fs.release(ino).unwrap();
        assert_eq!(fs.release(ino).unwrap_err().errno(), libc::EINVAL, "{name}: release of a freed inode");
        assert!(fs.getattr(ino).is_err(), "{name}: freed inode still live");
        assert_eq!(fs.hold(ino).unwrap_err().errno(), libc::ENOENT, "{name}");
        let after = fs.statfs().unwrap();
        assert_eq!(after.blocks_free, before.blocks_free + blocks, "{name}: blocks back");
        assert_eq!(after.files_free, before.files_free + 1, "{name}: inode back");
        assert!(fs.orphans().is_empty(), "{name}");
        fs.unmount().unwrap();
        drop(fs);
        common::e2fsck_clean(&img);
        assert!(!common::features(&img).contains("orphan_present"), "{name}: orphan_present after unmount");
        assert!(!in_use(&img, ino), "{name}");
        assert_eq!(recorded(&img), (0, BTreeSet::new()), "{name}");
        if let Ok(km) = common::KernelMount::ro(&img) {
            let f = Fs::open(&img).unwrap();
            common::assert_no_diff(name, &common::statfs_diff(&f, km.path()));
            assert!(!km.path().join("data").exists());
        }
    }
}

#[test]
fn unmount_frees_held_orphans() {
    let dir = tempfile::tempdir().unwrap();
    for &(name, args) in &VARIANTS[..3] {
        let img = image(dir.path(), name, args, 1, 8);
        let fs = rw(&img);
        let d = fs.resolve("/d0", false).unwrap();
        let before = fs.statfs().unwrap();
        let mut freed = 0;
        let mut inos = Vec::new();
        for f in 0..8 {
            let ino = fs.lookup(d, format!("f{f}").as_bytes()).unwrap().ino;
            freed += fs_blocks(&fs, ino);
            fs.hold(ino).unwrap();
            fs.unlink(d, format!("f{f}").as_bytes()).unwrap();
            inos.push(ino);
        }
        assert_eq!(fs.orphans(), inos, "{name}");
        fs.unmount().unwrap();
        drop(fs);
        common::e2fsck_clean(&img);
        let fs = Fs::open(&img).unwrap();
        let after = fs.statfs().unwrap();
        assert_eq!(
            (after.blocks_free, after.files_free),
            (before.blocks_free + freed, before.files_free + 8)
        );
        for ino in inos {
            assert!(!in_use(&img, ino), "{name}: {ino:?}");
        }
    }
}

#[test]
fn held_directory_and_replaced_file() {
    let dir = tempfile::tempdir().unwrap();
    for &(name, args) in &VARIANTS[..2] {
        let img = image(dir.path(), name, args, 1, 2);
        let fs = rw(&img);
        let root = fs.root();
        let before = fs.statfs().unwrap();
        // rmdir of a held directory: no names in it any more, and none can be added.
        let e = fs.resolve("/emptydir", false).unwrap();
        fs.hold(e).unwrap();
        fs.rmdir(root, b"emptydir").unwrap();
        assert_eq!(fs.getattr(e).unwrap().nlink, 0, "{name}");
        assert_eq!(fs.readdir(e, 0, |_| true).unwrap_err().errno(), libc::ENOENT);
        assert_eq!(fs.lookup(e, b".").unwrap_err().errno(), libc::ENOENT);
        assert_eq!(fs.create(e, b"x", 0o644, 0, 0).unwrap_err().errno(), libc::ENOENT);
        assert_eq!(fs.mkdir(e, b"x", 0o755, 0, 0).unwrap_err().errno(), libc::ENOENT);
        assert_eq!(fs.getattr(root).unwrap().nlink, 4, "{name}: root lost the dir's ..");
        // rename over a held file: the replaced inode becomes the orphan.
        let d = fs.resolve("/d0", false).unwrap();
        let victim = fs.lookup(d, b"f1").unwrap().ino;
        let kept = read_all(&fs, victim);
        fs.hold(victim).unwrap();
        fs.rename(d, b"f0", d, b"f1", 0).unwrap();
        assert_eq!(fs.getattr(victim).unwrap().nlink, 0);
        assert_eq!(read_all(&fs, victim), kept, "{name}");
        let mut want = vec![e, victim];
        want.sort_by_key(|i| i.0);
        assert_eq!(fs.orphans(), want, "{name}");
        fs.release(e).unwrap();
        fs.release(victim).unwrap();
        assert!(fs.orphans().is_empty());
        let after = fs.statfs().unwrap();
        assert_eq!(after.files_free, before.files_free + 2, "{name}");
        fs.unmount().unwrap();
        drop(fs);
        common::e2fsck_clean(&img);
    }
}

#[test]
fn holds_on_missing_inodes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "refuse", &[], 1, 1);
    let fs = rw(&img);
    // A free inode, and one past the end.
    assert_eq!(fs.hold(InodeNo(4000)).unwrap_err().errno(), libc::ENOENT);
    assert!(fs.hold(InodeNo(1 << 30)).is_err());
    assert_eq!(fs.release(fs.root()).unwrap_err().errno(), libc::EINVAL);
    // Holds without an unlink change nothing; the inode survives cache pressure.
    let ino = fs.resolve("/d0/f0", false).unwrap();
    fs.hold(ino).unwrap();
    fs.drop_caches();
    fs.release(ino).unwrap();
    assert_eq!(fs.getattr(ino).unwrap().nlink, 1);
    fs.unmount().unwrap();
    common::e2fsck_clean(&img);
}

/// Many threads hold, unlink and release at once: each its own files in its own directory,
/// then all of them releasing each other's orphans (middle-of-list removals), with the orphan
/// file, without it, and with one that fills up (the rest goes on the list).
#[test]
fn concurrent_orphans() {
    const THREADS: usize = 8;
    const FILES: usize = 80;
    let dir = tempfile::tempdir().unwrap();
    for &(name, args) in &VARIANTS[..3] {
        let img = image(dir.path(), name, args, THREADS, FILES);
        let fs = rw(&img);
        let before = fs.statfs().unwrap();
        let dirs: Vec<InodeNo> = (0..THREADS).map(|t| fs.resolve(format!("/d{t}"), false).unwrap()).collect();
        let freed = std::sync::atomic::AtomicU64::new(0);
        let barrier = std::sync::Barrier::new(THREADS);
        let held: Vec<Vec<InodeNo>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (fs, dirs, freed, barrier) = (&fs, &dirs, &freed, &barrier);
                    s.spawn(move || {
                        let d = dirs[t];
                        // Round trips on new (empty) files: create, hold, unlink, release.
                        for i in 0..200 {
                            let n = format!("tmp{i}");
                            let ino = fs.create(d, n.as_bytes(), 0o644, 0, 0).unwrap().ino;
                            fs.hold(ino).unwrap();
                            fs.unlink(d, n.as_bytes()).unwrap();
                            assert_eq!(fs.getattr(ino).unwrap().nlink, 0);
                            fs.release(ino).unwrap();
                        }
                        // Then hold every file with data and unlink it, keeping the references.
                        let mut mine = Vec::new();
                        for f in 0..FILES {
                            let n = format!("f{f}");
                            let ino = fs.lookup(d, n.as_bytes()).unwrap().ino;
                            freed.fetch_add(fs_blocks(fs, ino), std::sync::atomic::Ordering::Relaxed);
                            fs.hold(ino).unwrap();
                            fs.unlink(d, n.as_bytes()).unwrap();
                            mine.push(ino);
                        }
                        barrier.wait();
                        mine
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let all: Vec<InodeNo> = held.iter().flatten().copied().collect();
        assert_eq!(fs.orphans().len(), THREADS * FILES, "{name}");
        fs.sync().unwrap();
        let (head, file) = recorded(&img);
        match name {
            "list" => assert!(head != 0 && file.is_empty(), "{name}"),
            "orphan-file" => assert!(head == 0 && file.len() == THREADS * FILES, "{name}"),
            // Two 1 KiB blocks hold 508 inodes: the rest went on the list.
            _ => assert!(head != 0 && file.len() == 508, "{name}: head {head}, {} in the file", file.len()),
        }
        // Release in an order unrelated to the order of unlinks, from all threads.
        let mut order = all.clone();
        common::Rng::new(3).shuffle(&mut order);
        std::thread::scope(|s| {
            for chunk in order.chunks(order.len() / THREADS) {
                let fs = &fs;
                s.spawn(move || {
                    for &ino in chunk {
                        assert_eq!(fs.getattr(ino).unwrap().nlink, 0);
                        fs.release(ino).unwrap();
                    }
                });
            }
        });
        assert!(fs.orphans().is_empty(), "{name}");
        let after = fs.statfs().unwrap();
        let freed = freed.into_inner();
        assert_eq!(after.blocks_free, before.blocks_free + freed, "{name}: blocks back");
        assert_eq!(after.files_free, before.files_free + (THREADS * FILES) as u64, "{name}: inodes back");
        fs.unmount().unwrap();
        drop(fs);
        common::e2fsck_clean(&img);
        assert_eq!(recorded(&img), (0, BTreeSet::new()), "{name}");
        if let Ok(km) = common::KernelMount::ro(&img) {
            let f = Fs::open(&img).unwrap();
            common::assert_no_diff(name, &common::statfs_diff(&f, km.path()));
            for t in 0..THREADS {
                assert_eq!(std::fs::read_dir(km.path().join(format!("d{t}"))).unwrap().count(), 0);
            }
        }
    }
}
