//! Orphans (seed 001): held inodes outlive their last name, are recorded in the orphan file or
//! on the superblock's list, and are freed at the last release; what a crash (or the kernel)
//! leaves recorded is freed at the next writable open. Oracles: `e2fsck -fn`, the kernel's
//! view and counts, `debugfs`.

use rext4::{Fs, InodeNo, Options, SetAttr};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

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
        assert!(fs_blocks(&fs, ino) >= 40, "{name}: data has too few blocks");
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
        // Writable too: overwrite, grow, shrink.
        let mut want = want;
        assert_eq!(fs.write(ino, 100, b"written after the unlink").unwrap(), 24);
        want[100..124].copy_from_slice(b"written after the unlink");
        let tail = vec![0x5a; 20 << 10];
        assert_eq!(fs.write(ino, want.len() as u64, &tail).unwrap(), tail.len());
        want.extend_from_slice(&tail);
        assert_eq!(read_all(&fs, ino), want, "{name}: written while orphaned");
        fs.setattr(ino, &SetAttr { size: Some(50 << 10), ..SetAttr::default() }).unwrap();
        want.truncate(50 << 10);
        assert_eq!(read_all(&fs, ino), want, "{name}: truncated while orphaned");
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
        let blocks = fs_blocks(&fs, ino);
        let pre = fs.statfs().unwrap();
        fs.release(ino).unwrap();
        assert_eq!(fs.release(ino).unwrap_err().errno(), libc::EINVAL, "{name}: release of a freed inode");
        assert!(fs.getattr(ino).is_err(), "{name}: freed inode still live");
        assert_eq!(fs.hold(ino).unwrap_err().errno(), libc::ENOENT, "{name}");
        let after = fs.statfs().unwrap();
        assert_eq!(after.blocks_free, pre.blocks_free + blocks, "{name}: blocks back");
        assert_eq!(after.files_free, before.files_free + 1, "{name}: inode back");
        assert!(fs.orphans().is_empty(), "{name}");
        fs.unmount().unwrap();
        drop(fs);
        common::e2fsck_clean(&img);
        assert!(!common::features(&img).contains("orphan_present"), "{name}: orphan_present after unmount");
        assert!(!in_use(&img, ino), "{name}");
        assert_eq!(recorded(&img), (0, BTreeSet::new()), "{name}");
        // The superblock's own counts (written at unmount) agree with the groups'.
        assert_eq!(superblock_free_counts(&img), free_counts(&img), "{name}: superblock counts");
        if let Ok(km) = common::KernelMount::ro(&img) {
            let f = Fs::open(&img).unwrap();
            common::assert_no_diff(name, &common::statfs_diff(&f, km.path()));
            assert!(!km.path().join("data").exists());
        }
    }
}

/// `O_TMPFILE` files (`Fs::tmpfile`): nameless, held once, recorded as orphans; the last
/// release frees one, unless `link` gave it a name first (then it is an ordinary file, whose
/// record is gone); a file unlinked while held cannot be linked again (`ENOENT`, as the
/// kernel's `vfs_link` without `I_LINKABLE`); one still held at unmount is freed then. In every
/// feature variant; e2fsck clean, and the kernel reads the named one.
#[test]
fn tmpfiles_are_freed_unless_linked() {
    let dir = tempfile::tempdir().unwrap();
    for &(name, args) in VARIANTS {
        let img = image(dir.path(), name, args, 1, 2);
        let fs = rw(&img);
        let root = fs.root();
        let before = fs.statfs().unwrap();
        let data: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        let t1 = fs.tmpfile(root, 0o640, 1000, 1001).unwrap();
        assert_eq!((t1.nlink, t1.mode & 0o7777, t1.uid, t1.gid), (0, 0o640, 1000, 1001), "{name}");
        assert_eq!(t1.kind, rext4::FileType::RegularFile);
        fs.write(t1.ino, 0, &data).unwrap();
        let t2 = fs.tmpfile(root, 0o600, 0, 0).unwrap().ino;
        fs.write(t2, 0, &data).unwrap();
        let t3 = fs.tmpfile(root, 0o600, 0, 0).unwrap().ino;
        fs.sync().unwrap();
        let recorded_now = fs.orphans();
        for t in [t1.ino, t2, t3] {
            assert_eq!(recorded_now.contains(&t), journaled(args), "{name}: {t:?} recorded");
        }
        // A name for t2: an ordinary file from now on, its record gone.
        fs.link(t2, root, b"kept").unwrap();
        assert_eq!(fs.getattr(t2).unwrap().nlink, 1);
        assert!(!fs.orphans().contains(&t2), "{name}: linked file still recorded");
        fs.link(t2, root, b"kept2").unwrap();
        assert_eq!(fs.getattr(t2).unwrap().nlink, 2);
        fs.release(t2).unwrap();
        assert_eq!(read_all(&fs, t2), data);
        // A file unlinked while held is not linkable.
        let u = fs.create(root, b"u", 0o644, 0, 0).unwrap().ino;
        fs.hold(u).unwrap();
        fs.unlink(root, b"u").unwrap();
        assert_eq!(fs.link(u, root, b"again").unwrap_err().errno(), libc::ENOENT, "{name}");
        fs.release(u).unwrap();
        // t1's last release frees it.
        fs.release(t1.ino).unwrap();
        assert!(fs.getattr(t1.ino).is_err(), "{name}: released tmpfile still there");
        assert_eq!(fs.link(t1.ino, root, b"late").unwrap_err().errno(), libc::ENOENT, "{name}");
        // Errors: not a directory; no tmpfile on a read-only filesystem.
        let kept = fs.lookup(root, b"kept").unwrap().ino;
        assert_eq!(fs.tmpfile(kept, 0o600, 0, 0).unwrap_err().errno(), libc::ENOTDIR);
        // t3 is still held at unmount.
        fs.unmount().unwrap();
        drop(fs);
        common::e2fsck_clean(&img);
        assert!(!in_use(&img, t1.ino) && !in_use(&img, t3), "{name}: a tmpfile left in use");
        assert!(in_use(&img, t2));
        let ro = Fs::open(&img).unwrap();
        assert_eq!(ro.tmpfile(root, 0o600, 0, 0).unwrap_err().errno(), libc::EROFS);
        let after = ro.statfs().unwrap();
        assert_eq!(after.files_free, before.files_free - 1, "{name}: only the named tmpfile stays");
        drop(ro);
        if let Ok(km) = common::KernelMount::ro(&img) {
            let got = std::fs::read(km.path().join("kept2")).unwrap();
            let nlink =
                std::os::unix::fs::MetadataExt::nlink(&std::fs::metadata(km.path().join("kept")).unwrap());
            km.unmount().unwrap();
            assert_eq!((got == data, nlink), (true, 2), "{name}: the kernel's view");
        }
    }
}

/// A `tmpfile` file linked by one thread while another drops its only hold: either the link
/// wins (the file keeps its name and its data) or the release does (the file is freed and the
/// link fails with `ENOENT`); never a name for a freed inode, never a leak. e2fsck clean.
#[test]
fn linking_a_tmpfile_races_its_release() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "race", &["-O", "orphan_file"], 1, 1);
    let fs = rw(&img);
    let root = fs.root();
    let before = fs.statfs().unwrap().files_free;
    let (mut linked, mut freed) = (0, 0);
    for i in 0..300 {
        let t = fs.tmpfile(root, 0o600, 0, 0).unwrap().ino;
        fs.write(t, 0, &[i as u8; 5000]).unwrap();
        let name = format!("t{i}");
        // Both start together; a short spin on one side or the other moves the race about.
        let go = std::sync::Barrier::new(2);
        let spin = |n: u32| (0..n * 64).for_each(|_| std::hint::spin_loop());
        let r = std::thread::scope(|s| {
            let (f2, go) = (fs.clone(), &go);
            s.spawn(move || {
                go.wait();
                spin(if i % 2 == 0 { i % 13 } else { 0 });
                f2.release(t).unwrap()
            });
            go.wait();
            spin(if i % 2 == 1 { i % 13 } else { 0 });
            fs.link(t, root, name.as_bytes())
        });
        match r {
            Ok(a) => {
                linked += 1;
                assert_eq!(a.nlink, 1);
                assert_eq!(fs.lookup(root, name.as_bytes()).unwrap().ino, t);
                assert_eq!(read_all(&fs, t), vec![i as u8; 5000]);
            }
            Err(e) => {
                freed += 1;
                assert_eq!(e.errno(), libc::ENOENT, "{e}");
                assert_eq!(fs.lookup(root, name.as_bytes()).unwrap_err().errno(), libc::ENOENT);
                assert_eq!(fs.getattr(t).unwrap_err().errno(), libc::ESTALE);
            }
        }
    }
    assert_eq!(linked + freed, 300);
    assert_eq!(fs.statfs().unwrap().files_free, before - linked, "linked {linked}, freed {freed}");
    assert!(fs.orphans().is_empty(), "records left: {:?}", fs.orphans());
    fs.unmount().unwrap();
    drop(fs);
    common::e2fsck_clean(&img);
}

/// A crash while a `tmpfile` file is held: its record is on disk, and rext4's, e2fsck's and
/// the kernel's recovery each free it.
#[test]
fn crashed_tmpfiles_are_recovered() {
    let dir = tempfile::tempdir().unwrap();
    for &(name, args) in VARIANTS.iter().filter(|(_, a)| journaled(a)) {
        let img = image(dir.path(), name, args, 1, 2);
        let dev = Arc::new(rext4::dev::CrashDevice::new(std::fs::read(&img).unwrap()));
        let fs = Fs::from_device(dev.clone(), Options { writable: true, ..Options::default() }).unwrap();
        let t = fs.tmpfile(fs.root(), 0o600, 0, 0).unwrap().ino;
        fs.write(t, 0, &[9u8; 30_000]).unwrap();
        fs.sync().unwrap();
        // The crash: the device as it is now.
        let snap = dev.snapshot();
        drop(fs);
        let c = dir.path().join(format!("{name}-crash.img"));
        std::fs::write(&c, &snap).unwrap();
        let fs = rw(&c);
        assert_eq!(fs.orphans_recovered().0, 1, "{name}: rext4 freed the tmpfile");
        fs.unmount().unwrap();
        drop(fs);
        common::e2fsck_clean(&c);
        assert!(!in_use(&c, t), "{name}");
        std::fs::write(&c, &snap).unwrap();
        let (code, out) = fsck(&c, true);
        assert!(code < 4, "{name}: e2fsck -fy ({code}):\n{out}");
        common::e2fsck_clean(&c);
        assert!(!in_use(&c, t), "{name}: after e2fsck's recovery");
        if common::kernel_can_mount() {
            std::fs::write(&c, &snap).unwrap();
            common::KernelMount::rw(&c).unwrap().unmount().unwrap();
            common::e2fsck_clean(&c);
            assert!(!in_use(&c, t), "{name}: after the kernel's recovery");
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
fn held_inodes_can_leave_the_cache() {
    // A FUSE mount holds every inode the kernel knows; holding must not pin them all in the
    // inode cache. Held inodes that keep their links are evicted with their count parked; the
    // count comes back with the next load, so unlinks and releases still see it.
    const FILES: usize = 60;
    const DIRS: usize = 10;
    let dir = tempfile::tempdir().unwrap();
    for &(name, args) in &VARIANTS[..2] {
        let img = image(dir.path(), name, args, DIRS, FILES);
        let fs =
            Fs::open_with(&img, Options { writable: true, inode_cache: 64, ..Options::default() }).unwrap();
        let before = fs.statfs().unwrap();
        let mut all = Vec::new();
        for d in 0..DIRS {
            let dino = fs.resolve(format!("/d{d}"), false).unwrap();
            for f in 0..FILES {
                let ino = fs.lookup(dino, format!("f{f}").as_bytes()).unwrap().ino;
                fs.hold(ino).unwrap();
                fs.hold(ino).unwrap();
                all.push((dino, f, ino, read_all(&fs, ino)));
            }
        }
        let cached = fs.cache_counts().1;
        assert!(cached < all.len() / 2, "{name}: {cached} of {} held inodes still cached", all.len());
        // Every other file loses its name while evicted and held: it must become an orphan.
        let mut freed_blocks = 0;
        for (k, (dino, f, ino, want)) in all.iter().enumerate() {
            if k % 2 == 0 {
                fs.drop_caches();
                freed_blocks += fs_blocks(&fs, *ino);
                fs.unlink(*dino, format!("f{f}").as_bytes()).unwrap();
                let a = fs.getattr(*ino).unwrap();
                assert_eq!(a.nlink, 0, "{name}: f{f}");
                assert_eq!(&read_all(&fs, *ino), want, "{name}: orphan content");
            }
        }
        fs.drop_caches();
        // One release each: nothing is freed yet.
        for (_, _, ino, _) in &all {
            fs.release(*ino).unwrap();
        }
        fs.drop_caches();
        let mid = fs.statfs().unwrap();
        assert_eq!(mid.files_free, before.files_free, "{name}: freed before the last release");
        for (k, (_, _, ino, want)) in all.iter().enumerate() {
            if k % 2 == 1 {
                assert_eq!(&read_all(&fs, *ino), want, "{name}: linked file content");
            }
            fs.release(*ino).unwrap();
            assert_eq!(fs.release(*ino).unwrap_err().errno(), libc::EINVAL, "{name}: released twice");
        }
        let after = fs.statfs().unwrap();
        assert_eq!(
            after.files_free,
            before.files_free + (all.len() as u64).div_ceil(2),
            "{name}: inodes back"
        );
        assert_eq!(after.blocks_free, before.blocks_free + freed_blocks, "{name}: blocks back");
        assert!(fs.orphans().is_empty(), "{name}");
        fs.unmount().unwrap();
        drop(fs);
        common::e2fsck_clean(&img);
    }
}

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

fn copy(from: &Path, to: &Path) -> PathBuf {
    std::fs::copy(from, to).unwrap();
    to.to_path_buf()
}

/// "Free blocks" and "Free inodes" as the superblock records them (`dumpe2fs -h`).
fn superblock_free_counts(img: &Path) -> (u64, u64) {
    let o = Command::new(common::tool("dumpe2fs")).arg("-h").arg(img).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let field = |name: &str| -> u64 {
        text.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().parse().unwrap()).unwrap()
    };
    (field("Free blocks:"), field("Free inodes:"))
}

fn free_counts(img: &Path) -> (u64, u64) {
    let s = Fs::open(img).unwrap().statfs().unwrap();
    (s.blocks_free, s.files_free)
}

/// The kernel leaves orphans behind: files (and a directory) opened, unlinked and still open
/// when the image is copied from under the mount, i.e. a crash with open files. A read-only
/// open leaves them; a writable open frees them, as the kernel's own recovery does.
#[test]
fn kernel_made_orphans() {
    if !common::kernel_can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for &(name, args) in &VARIANTS[..4] {
        let img = image(dir.path(), name, args, 1, 6);
        let snap = dir.path().join(format!("{name}-crash.img"));
        let mut inos = Vec::new();
        {
            let km = common::KernelMount::rw(&img).unwrap();
            let m = km.path();
            let mut open = Vec::new();
            for f in 0..5 {
                let p = m.join(format!("d0/f{f}"));
                let file = std::fs::File::open(&p).unwrap();
                inos.push(InodeNo(std::os::unix::fs::MetadataExt::ino(&file.metadata().unwrap()) as u32));
                std::fs::remove_file(&p).unwrap();
                open.push(file);
            }
            let d = std::fs::File::open(m.join("emptydir")).unwrap();
            inos.push(InodeNo(std::os::unix::fs::MetadataExt::ino(&d.metadata().unwrap()) as u32));
            std::fs::remove_dir(m.join("emptydir")).unwrap();
            open.push(d);
            // Commit the journal, then take the image as a crash would leave it.
            assert_eq!(unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&open[0])) }, 0);
            copy(&img, &snap);
            drop(open);
            km.unmount().unwrap();
        }
        inos.sort_by_key(|i| i.0);
        common::e2fsck_clean(&img);
        let kernel_final = free_counts(&img);

        // Read-only: the records are there (after the in-memory replay) and the image is left
        // alone.
        let bytes = std::fs::read(&snap).unwrap();
        let (head, file) = recorded(&snap);
        let mut seen: Vec<u32> = file.into_iter().collect();
        if head != 0 {
            let ro = Fs::open(&snap).unwrap();
            let mut i = head;
            while i != 0 && seen.len() < 100 {
                seen.push(i);
                let raw = ro.getattr(InodeNo(i));
                assert!(raw.is_err(), "{name}: orphan {i} looks live");
                i = dtime_of(&snap, i);
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, inos.iter().map(|i| i.0).collect::<Vec<_>>(), "{name}: orphans the kernel recorded");
        assert_eq!(std::fs::read(&snap).unwrap(), bytes, "{name}: read-only open wrote");

        // rext4's recovery.
        let ours = copy(&snap, &dir.path().join(format!("{name}-ours.img")));
        let fs = rw(&ours);
        assert_eq!(fs.orphans_recovered(), (inos.len() as u32, 0), "{name}");
        assert!(fs.orphans().is_empty());
        fs.unmount().unwrap();
        drop(fs);
        common::e2fsck_clean(&ours);
        assert!(!common::features(&ours).contains("orphan_present"), "{name}");
        assert_eq!(free_counts(&ours), kernel_final, "{name}: rext4's recovery vs the kernel's unmount");
        for &ino in &inos {
            assert!(!in_use(&ours, ino), "{name}: {ino:?}");
        }
        // The kernel's recovery of the same crash agrees.
        let theirs = copy(&snap, &dir.path().join(format!("{name}-theirs.img")));
        common::KernelMount::rw(&theirs).unwrap().unmount().unwrap();
        common::e2fsck_clean(&theirs);
        assert_eq!(free_counts(&theirs), kernel_final, "{name}: kernel recovery");
    }
}

/// `i_dtime` of an inode (the next orphan on the list), read with debugfs.
fn dtime_of(img: &Path, ino: u32) -> u32 {
    let o = Command::new(common::tool("debugfs"))
        .arg("-R")
        .arg(format!("stat <{ino}>"))
        .arg(img)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("dtime: 0x"))
        .map(|v| u32::from_str_radix(&v[..8], 16).unwrap())
        .unwrap_or(0)
}

fn debugfs_w(img: &Path, cmds: &[String]) {
    let script = cmds.join("\n");
    let mut c = Command::new(common::tool("debugfs"));
    c.arg("-w").arg("-f").arg("-").arg(img).stdin(std::process::Stdio::piped());
    c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), script.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "debugfs: {}", String::from_utf8_lossy(&o.stderr));
}

/// Orphans written by hand the way the kernel records them: truncates that did not finish
/// (to zero, and to 1500 bytes: the blocks past the size go, the name stays) and a deleted
/// inode, on the list and in the orphan file, plus entries recovery must drop (a free inode, a
/// duplicate).
#[test]
fn recorded_truncates_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    for &(name, args) in &VARIANTS[..2] {
        let img = image(dir.path(), name, args, 1, 4);
        let (ino0, ino1, ino2, data2, blocks, before, csum_seed, oino) = {
            let fs = Fs::open(&img).unwrap();
            let i0 = fs.resolve("/d0/f0", false).unwrap();
            let i1 = fs.resolve("/d0/f1", false).unwrap();
            let i2 = fs.resolve("/d0/f2", false).unwrap();
            let oino = fs.superblock().s_orphan_file_inum.get();
            let seed = if oino != 0 {
                let g = fs.getattr(InodeNo(oino)).unwrap().generation;
                rext4::format::checksum::inode_csum_seed(fs.superblock().csum_seed(), oino, g)
            } else {
                0
            };
            let freed = fs_blocks(&fs, i0) + fs_blocks(&fs, i1) + fs_blocks(&fs, i2) - 2;
            (i0, i1, i2, read_all(&fs, i2), freed, free_counts(&img), seed, oino)
        };
        assert!(data2.len() > 2048, "{name}");
        let mut cmds = vec![
            "sif /d0/f0 size 0".to_string(),
            "sif /d0/f2 size 1500".to_string(),
            "unlink /d0/f1".to_string(),
            format!("sif <{}> links_count 0", ino1.0),
        ];
        if oino == 0 {
            cmds.push(format!("ssv last_orphan {}", ino0.0));
            cmds.push(format!("sif <{}> dtime {}", ino0.0, ino1.0));
            cmds.push(format!("sif <{}> dtime {}", ino1.0, ino2.0));
        }
        debugfs_w(&img, &cmds);
        if oino != 0 {
            let o = Command::new(common::tool("debugfs"))
                .arg("-R")
                .arg(format!("bmap <{oino}> 0"))
                .arg(&img)
                .output()
                .unwrap();
            let pblk: u64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
            let mut block = vec![0u8; 1024];
            for (k, v) in [ino0.0, ino1.0, 3999, ino1.0, ino2.0].into_iter().enumerate() {
                block[k * 4..k * 4 + 4].copy_from_slice(&v.to_le_bytes());
            }
            rext4::format::orphan::set_tail(&mut block, csum_seed, pblk);
            let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
            std::os::unix::fs::FileExt::write_at(&f, &block, pblk * 1024).unwrap();
        }
        let fs = rw(&img);
        assert_eq!(fs.orphans_recovered(), (1, 2), "{name}");
        let a = fs.getattr(ino0).unwrap();
        assert_eq!((a.size, a.blocks, a.nlink), (0, 0, 1), "{name}: truncated orphan");
        let a = fs.getattr(ino2).unwrap();
        assert_eq!((a.size, fs_blocks(&fs, ino2), a.nlink), (1500, 2, 1), "{name}: partly truncated orphan");
        assert_eq!(read_all(&fs, ino2), data2[..1500], "{name}");
        assert_eq!(fs.lookup(fs.resolve("/d0", false).unwrap(), b"f1").unwrap_err().errno(), libc::ENOENT);
        fs.unmount().unwrap();
        drop(fs);
        common::e2fsck_clean(&img);
        assert_eq!(free_counts(&img), (before.0 + blocks, before.1 + 1), "{name}");
        assert!(!in_use(&img, ino1));
        assert_eq!(recorded(&img), (0, BTreeSet::new()), "{name}");
        // Past the new end of the last block, the kernel reads zeros too.
        if let Ok(km) = common::KernelMount::ro(&img) {
            assert_eq!(std::fs::read(km.path().join("d0/f2")).unwrap(), data2[..1500], "{name}");
        }
    }
}

// ------------------------------------------------------------------------------------------
// Crashes
// ------------------------------------------------------------------------------------------

use rext4::dev::CrashDevice;

/// After any recovery: each of `files` (name, inode) either still has its name and inode, or
/// has neither; a replaced name points at the inode that replaced it.
fn check_crash_model(img: &Path, files: &[(&str, InodeNo)], replaced: (&str, InodeNo, InodeNo), how: &str) {
    let fs = Fs::open(img).unwrap_or_else(|e| panic!("{how}: open: {e}"));
    for &(path, ino) in files {
        match fs.resolve(path, false) {
            Ok(i) => {
                assert_eq!(i, ino, "{how}: {path}");
                assert_eq!(fs.getattr(ino).unwrap().nlink, 1, "{how}: {path}");
            }
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOENT, "{how}: {path}: {e}");
                assert!(fs.getattr(ino).is_err(), "{how}: {path} gone but inode {ino:?} still live");
            }
        }
    }
    let (path, old, new) = replaced;
    let now = fs.resolve(path, false).unwrap_or_else(|e| panic!("{how}: {path}: {e}"));
    assert!(now == old || now == new, "{how}: {path} is {now:?}");
    if now == new {
        assert!(fs.getattr(old).is_err(), "{how}: replaced inode {old:?} still live");
    }
}

fn crash_run(name: &str, args: &[&str], seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), name, args, 1, 6);
    let dev = Arc::new(CrashDevice::new(std::fs::read(&img).unwrap()));
    let opts = Options {
        writable: true,
        commit_interval: std::time::Duration::from_secs(3600),
        ..Options::default()
    };
    let fs = Fs::from_device(dev.clone(), opts).unwrap();
    let d = fs.resolve("/d0", false).unwrap();
    let ino = |n: &str| fs.lookup(d, n.as_bytes()).unwrap().ino;
    let (f0, f1, f2, f3, f4) = (ino("f0"), ino("f1"), ino("f2"), ino("f3"), ino("f4"));
    let data0 = read_all(&fs, f0);
    for i in [f0, f1, f2, f3] {
        fs.hold(i).unwrap();
    }
    fs.unlink(d, b"f0").unwrap();
    fs.sync().unwrap();
    fs.unlink(d, b"f1").unwrap();
    fs.rename(d, b"f4", d, b"f2", 0).unwrap();
    fs.sync().unwrap();
    assert_eq!(read_all(&fs, f0), data0);
    fs.release(f0).unwrap();
    fs.sync().unwrap();
    fs.release(f1).unwrap();
    fs.release(f3).unwrap();
    // f2 is still held at unmount.
    fs.unmount().unwrap();
    drop(fs);
    let done = dir.path().join("final.img");
    std::fs::write(&done, dev.snapshot()).unwrap();
    common::e2fsck_clean(&done);

    let files = [("/d0/f0", f0), ("/d0/f1", f1), ("/d0/f3", f3)];
    let replaced = ("/d0/f2", f2, f4);
    let ops = dev.ops();
    let kernel = common::kernel_can_mount();
    let c = dir.path().join("c.img");
    let (mut with_orphans, mut checked) = (0, 0);
    common::for_each_crash_image(&ops, dev.initial(), seed, 1, |pos, bytes| {
        let how = format!("{name} crash #{checked} at op {pos}");
        checked += 1;
        // rext4: journal replay and orphan recovery at a writable open.
        std::fs::write(&c, bytes).unwrap();
        let fs = rw(&c);
        let (freed, _) = fs.orphans_recovered();
        if freed > 0 {
            with_orphans += 1;
        }
        fs.unmount().unwrap();
        drop(fs);
        let (code, out) = fsck(&c, false);
        assert_eq!(code, 0, "{how} (rext4 recovery): e2fsck -fn:\n{out}");
        check_crash_model(&c, &files, replaced, &format!("{how} (rext4)"));
        // e2fsck's.
        std::fs::write(&c, bytes).unwrap();
        let (code, out) = fsck(&c, true);
        assert!(code < 4, "{how}: e2fsck -fy failed ({code}):\n{out}");
        let (code, out) = fsck(&c, false);
        assert_eq!(code, 0, "{how} (e2fsck recovery): e2fsck -fn:\n{out}");
        check_crash_model(&c, &files, replaced, &format!("{how} (e2fsck)"));
        // The kernel's.
        if kernel {
            std::fs::write(&c, bytes).unwrap();
            common::KernelMount::rw(&c).unwrap().unmount().unwrap();
            let (code, out) = fsck(&c, false);
            assert_eq!(code, 0, "{how} (kernel recovery): e2fsck -fn:\n{out}");
            check_crash_model(&c, &files, replaced, &format!("{how} (kernel)"));
        }
    });
    assert!(with_orphans >= 2, "{name}: only {with_orphans} of {checked} crash images held orphans");
    eprintln!("{name}: {checked} crash images, {with_orphans} with orphans to recover");
}

fn fsck(img: &Path, fix: bool) -> (i32, String) {
    let o =
        Command::new(common::tool("e2fsck")).arg(if fix { "-fy" } else { "-fn" }).arg(img).output().unwrap();
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).into_owned())
}

#[test]
fn crash_with_held_orphans_list() {
    crash_run("list", VARIANTS[0].1, 11);
}

#[test]
fn crash_with_held_orphans_orphan_file() {
    crash_run("orphan-file", VARIANTS[1].1, 12);
}

/// A truncate of a file with many extents takes many transactions, and commits land between
/// them (another thread syncs all along). A crash at any of them leaves the file at its old
/// size, or at its new size with an orphan record that recovery uses to free the rest.
fn crash_truncate_run(name: &str, args: &[&str], seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), name, args, 1, 1);
    let opts = |ms| Options {
        writable: true,
        commit_interval: std::time::Duration::from_millis(ms),
        ..Options::default()
    };
    let setup = Arc::new(CrashDevice::new(std::fs::read(&img).unwrap()));
    let (ino, old_size, old_blocks) = {
        let fs = Fs::from_device(setup.clone(), opts(3_600_000)).unwrap();
        let a = fs.create(fs.root(), b"frag", 0o644, 0, 0).unwrap();
        // Every other 1 KiB block: one extent each.
        for i in 0..12000u64 {
            fs.write(a.ino, i * 2048, &[i as u8 | 1; 1024]).unwrap();
        }
        let got = fs.getattr(a.ino).unwrap();
        assert!(got.blocks > 2 * 12000, "{name}: an extent tree with index blocks");
        fs.unmount().unwrap();
        (a.ino, got.size, got.blocks)
    };
    let base = setup.snapshot();
    drop(setup);
    let kernel = common::kernel_can_mount();
    let c = dir.path().join("c.img");
    let (mut mid_truncate, mut checked) = (0, 0);
    // Whether a commit lands inside the truncate depends on timing: try a few times.
    for attempt in 0..8 {
        let dev = Arc::new(CrashDevice::new(base.clone()));
        {
            let fs = Fs::from_device(dev.clone(), opts(1)).unwrap();
            let done = std::sync::atomic::AtomicBool::new(false);
            std::thread::scope(|s| {
                s.spawn(|| {
                    while !done.load(std::sync::atomic::Ordering::Acquire) {
                        fs.sync().unwrap();
                    }
                });
                fs.setattr(ino, &SetAttr { size: Some(0), ..SetAttr::default() }).unwrap();
                done.store(true, std::sync::atomic::Ordering::Release);
            });
            assert_eq!(fs.getattr(ino).unwrap().blocks, 0);
            fs.unmount().unwrap();
        }
        // At most 16 per attempt (two per chosen flush), spread over the run, built one at a
        // time: the run may have thousands of flushes.
        let ops = dev.ops();
        let stride = common::flush_count(&ops).div_ceil(8).max(1);
        common::for_each_crash_image(&ops, dev.initial(), seed + attempt, stride, |pos, bytes| {
            let how = format!("{name} truncate attempt {attempt} crash #{checked} at op {pos}");
            checked += 1;
            std::fs::write(&c, bytes).unwrap();
            let fs = rw(&c);
            mid_truncate += usize::from(fs.orphans_recovered().1 > 0);
            fs.unmount().unwrap();
            drop(fs);
            let (code, out) = fsck(&c, false);
            assert_eq!(code, 0, "{how} (rext4 recovery): e2fsck -fn:\n{out}");
            let truncated_or_not = |img: &Path, how: &str| {
                let a = Fs::open(img).unwrap().getattr(ino).unwrap();
                let ok = (a.size == old_size && a.blocks == old_blocks) || (a.size == 0 && a.blocks == 0);
                assert!(ok, "{how}: size {} blocks {}", a.size, a.blocks);
            };
            truncated_or_not(&c, &format!("{how} (rext4)"));
            if kernel {
                std::fs::write(&c, bytes).unwrap();
                common::KernelMount::rw(&c).unwrap().unmount().unwrap();
                let (code, out) = fsck(&c, false);
                assert_eq!(code, 0, "{how} (kernel recovery): e2fsck -fn:\n{out}");
                truncated_or_not(&c, &format!("{how} (kernel)"));
            }
            // e2fsck: a consistent image. Its orphan truncation of a half-truncated two-level
            // tree gives up ("Already cleared indirect block"), though the replayed journal
            // alone leaves tree and bitmaps consistent; it then sets i_size from the blocks
            // left, so the file keeps the prefix not yet freed (rext4 and the kernel finish the
            // truncate).
            std::fs::write(&c, bytes).unwrap();
            let (code, out0) = fsck(&c, true);
            assert!(code < 4, "{how}: e2fsck -fy failed ({code}):\n{out0}");
            let (code, out) = fsck(&c, false);
            assert_eq!(code, 0, "{how} (e2fsck recovery): e2fsck -fn:\n{out}");
            let a = Fs::open(&c).unwrap().getattr(ino).unwrap();
            assert!(
                a.size <= old_size && a.blocks <= old_blocks,
                "{how} (e2fsck): size {} blocks {}\n{out0}",
                a.size,
                a.blocks
            );
        });
        if mid_truncate > 0 {
            break;
        }
    }
    eprintln!("{name}: {checked} truncate crash images checked, {mid_truncate} mid-truncate");
    assert!(mid_truncate >= 1, "{name}: no crash image caught the truncate half done");
}

#[test]
fn crash_mid_truncate_list() {
    crash_truncate_run("list", VARIANTS[0].1, 21);
}

#[test]
fn crash_mid_truncate_orphan_file() {
    crash_truncate_run("orphan-file", VARIANTS[1].1, 22);
}
