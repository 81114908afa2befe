//! Names: create, mkdir, unlink, rmdir through the journal, with the kernel's errno; every
//! image e2fsck-clean afterwards and the kernel seeing the same tree.

use rext4::{FileType, Fs, Options};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

mod common;

use common::e2fsck_clean as fsck_clean;

fn mkfs(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    common::mkfs(None, &img, args, "64M");
    img
}

fn rw(img: &Path) -> Fs {
    Fs::open_with(img, Options { writable: true, ..Options::default() }).unwrap()
}

#[test]
fn create_mkdir_unlink_rmdir_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [
        ("default", &[][..]),
        ("upstream", &["-O", "metadata_csum_seed,orphan_file"][..]),
        ("nocsum", &["-O", "^metadata_csum"][..]),
        ("nojournal1k", &["-O", "^has_journal", "-b", "1024"][..]),
        ("ext3", &["-t", "ext3"][..]),
    ] {
        let img = mkfs(dir.path(), name, args);
        let fs = rw(&img);
        let root = fs.root();
        let before = fs.statfs().unwrap();
        let a = fs.mkdir(root, b"d", 0o755, 1000, 1000).unwrap();
        assert_eq!(a.kind, FileType::Directory);
        assert_eq!(a.nlink, 2);
        assert_eq!(fs.getattr(root).unwrap().nlink, 4, "{name}: root links after mkdir");
        for i in 0..300 {
            let f = fs
                .create(a.ino, format!("file-{i:04}-with-a-longer-name").as_bytes(), 0o644, 1000, 100)
                .unwrap();
            assert_eq!(f.kind, FileType::RegularFile);
            assert_eq!(f.perm(), 0o644);
        }
        assert_eq!(fs.create(a.ino, b"file-0000-with-a-longer-name", 0o644, 0, 0).unwrap_err().errno(), 17);
        assert_eq!(fs.create(a.ino, &[b'x'; 256], 0o644, 0, 0).unwrap_err().errno(), 36); // ENAMETOOLONG
        assert_eq!(fs.rmdir(root, b"d").unwrap_err().errno(), 39); // ENOTEMPTY
        assert_eq!(fs.unlink(root, b"d").unwrap_err().errno(), 21); // EISDIR
        let sub = fs.mkdir(a.ino, b"sub", 0o700, 0, 0).unwrap();
        assert_eq!(fs.rmdir(a.ino, b"file-0001-with-a-longer-name").unwrap_err().errno(), 20); // ENOTDIR
        assert_eq!(fs.getattr(a.ino).unwrap().nlink, 3);
        for i in (0..300).step_by(2) {
            fs.unlink(a.ino, format!("file-{i:04}-with-a-longer-name").as_bytes()).unwrap();
        }
        assert_eq!(fs.unlink(a.ino, b"file-0000-with-a-longer-name").unwrap_err().errno(), 2); // ENOENT
        fs.rmdir(a.ino, b"sub").unwrap();
        // A freed inode named by number: a stale handle, as the kernel answers one.
        assert_eq!(fs.getattr(sub.ino).unwrap_err().errno(), libc::ESTALE, "{name}: removed dir still live");
        let names: Vec<_> = fs.read_dir("/d").unwrap().map(|e| e.unwrap().name).collect();
        assert_eq!(names.len(), 150);
        fs.unmount().unwrap();
        drop(fs);
        fsck_clean(&img);

        if let Ok(km) = common::KernelMount::ro(&img) {
            let mnt = km.path().to_path_buf();
            let mut seen: Vec<String> = std::fs::read_dir(mnt.join("d"))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            seen.sort();
            let m = std::fs::metadata(mnt.join("d/file-0001-with-a-longer-name")).unwrap();
            let dm = std::fs::metadata(mnt.join("d")).unwrap();
            km.unmount().unwrap();
            let want: Vec<String> =
                (1..300).step_by(2).map(|i| format!("file-{i:04}-with-a-longer-name")).collect();
            assert_eq!(seen, want, "{name}: kernel view");
            assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (1000, 100, 0o644));
            assert_eq!(dm.nlink(), 2);
        }

        // Remove the rest: counts return to where they were.
        let fs = rw(&img);
        let d = fs.resolve("/d", false).unwrap();
        for i in (1..300).step_by(2) {
            fs.unlink(d, format!("file-{i:04}-with-a-longer-name").as_bytes()).unwrap();
        }
        fs.rmdir(fs.root(), b"d").unwrap();
        let after = fs.statfs().unwrap();
        assert_eq!((after.files_free, after.blocks_free), (before.files_free, before.blocks_free), "{name}");
        fs.unmount().unwrap();
        drop(fs);
        fsck_clean(&img);
    }
}

#[test]
fn parallel_creates_in_own_and_shared_directories() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "par", &[]);
    let fs = rw(&img);
    let root = fs.root();
    let shared = fs.mkdir(root, b"shared", 0o777, 0, 0).unwrap().ino;
    std::thread::scope(|s| {
        for t in 0..8 {
            let fs = fs.clone();
            s.spawn(move || {
                let own = fs.mkdir(root, format!("w{t}").as_bytes(), 0o755, 0, 0).unwrap().ino;
                for i in 0..200 {
                    fs.create(own, format!("f{i}").as_bytes(), 0o600, t, t).unwrap();
                    fs.create(shared, format!("t{t}-{i}").as_bytes(), 0o600, t, t).unwrap();
                }
                for i in (0..200).step_by(3) {
                    fs.unlink(own, format!("f{i}").as_bytes()).unwrap();
                    fs.unlink(shared, format!("t{t}-{i}").as_bytes()).unwrap();
                }
            });
        }
    });
    assert_eq!(fs.read_dir("/shared").unwrap().count(), 8 * 133);
    for t in 0..8 {
        assert_eq!(fs.read_dir(format!("/w{t}")).unwrap().count(), 133);
    }
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&img);
}

/// Directories growing in turn get fragmented: their extent trees outgrow the four extents of
/// the inode and gain a level; everything still checks out and frees cleanly.
#[test]
fn interleaved_growth_deepens_extent_trees() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [("x1k", &["-b", "1024"][..]), ("x4k", &[][..])] {
        let img = mkfs(dir.path(), name, args);
        let fs = rw(&img);
        let root = fs.root();
        let dirs: Vec<_> = (0..64)
            .map(|d| fs.mkdir(root, format!("dir-{d:02}").as_bytes(), 0o755, 0, 0).unwrap().ino)
            .collect();
        for i in 0..150 {
            for (d, &ino) in dirs.iter().enumerate() {
                fs.create(ino, format!("entry-{i:04}-of-directory-{d:02}-padding").as_bytes(), 0o644, 0, 0)
                    .unwrap();
            }
        }
        let big = fs.getattr(dirs[0]).unwrap();
        assert!(big.size >= 5 * u64::from(fs.block_size()), "{name}: directory did not grow: {}", big.size);
        fs.unmount().unwrap();
        drop(fs);
        fsck_clean(&img);
        let fs = Fs::open(&img).unwrap();
        for d in [0usize, 31, 63] {
            assert_eq!(fs.read_dir(format!("/dir-{d:02}")).unwrap().count(), 150, "{name}");
            fs.metadata(format!("/dir-{d:02}/entry-0149-of-directory-{d:02}-padding")).unwrap();
        }
        drop(fs);
        let fs = rw(&img);
        for (d, &ino) in dirs.iter().enumerate() {
            for i in 0..150 {
                fs.unlink(ino, format!("entry-{i:04}-of-directory-{d:02}-padding").as_bytes()).unwrap();
            }
            fs.rmdir(fs.root(), format!("dir-{d:02}").as_bytes()).unwrap();
        }
        fs.unmount().unwrap();
        drop(fs);
        fsck_clean(&img);
    }
}

/// A new image opened with caches of 16 inodes and 64 KiB of blocks, and a directory `d` in
/// it: every test of eviction works on many more.
fn tiny_caches(dir: &Path, name: &str) -> (PathBuf, Fs, rext4::InodeNo) {
    let img = mkfs(dir, name, &[]);
    let opts = Options { writable: true, inode_cache: 16, cache_bytes: 64 << 10, ..Options::default() };
    let fs = Fs::open_with(&img, opts).unwrap();
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    (img, fs, d)
}

/// New inodes beyond the group's never-used mark stay readable after the inode cache forgets
/// them (their group's live `itable_unused`, not the one read at open, decides).
#[test]
fn new_inodes_survive_cache_eviction() {
    let dir = tempfile::tempdir().unwrap();
    let (img, fs, d) = tiny_caches(dir.path(), "evict");
    for i in 0..2000 {
        fs.create(d, format!("f{i}").as_bytes(), 0o644, 7, 7).unwrap();
    }
    fs.drop_caches();
    for i in 0..2000 {
        assert_eq!(fs.lookup(d, format!("f{i}").as_bytes()).unwrap().uid, 7, "f{i}");
    }
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&img);
}

/// A cached name whose inode was evicted and loaded again gives the new copy, with changes
/// made through it, never the evicted one (whose memory may outlive the eviction a while).
#[test]
fn cached_names_follow_reloaded_inodes() {
    let dir = tempfile::tempdir().unwrap();
    let (img, fs, d) = tiny_caches(dir.path(), "relink");
    let files: Vec<_> =
        (0..200).map(|i| fs.create(d, format!("f{i}").as_bytes(), 0o644, 7, 7).unwrap().ino).collect();
    for round in 0..3u16 {
        fs.drop_caches();
        for (i, &ino) in files.iter().enumerate() {
            let mode = 0o600 | round << 3 | (i as u16 & 7);
            fs.setattr(ino, &rext4::SetAttr { mode: Some(mode), ..Default::default() }).unwrap();
            let a = fs.lookup(d, format!("f{i}").as_bytes()).unwrap();
            assert_eq!((a.ino, a.mode & 0o7777), (ino, mode), "f{i}, round {round}");
        }
    }
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&img);
}

/// Lookups racing with unlink and re-create of the same name never see a removed inode (the
/// name cache must not keep what a removal took away).
#[test]
fn lookups_racing_removals_see_only_live_inodes() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "race", &[]);
    let fs = rw(&img);
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..3 {
            let (fs, stop) = (fs.clone(), &stop);
            s.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for n in [&b"x"[..], b"y"] {
                        match fs.lookup(d, n) {
                            Ok(a) => assert_eq!(a.kind, FileType::RegularFile),
                            Err(e) => assert_eq!(e.errno(), 2, "lookup during removal: {e}"),
                        }
                    }
                }
            });
        }
        for i in 0..3000u32 {
            let n: &[u8] = if i % 2 == 0 { b"x" } else { b"y" };
            fs.create(d, n, 0o644, i, 0).unwrap();
            fs.unlink(d, n).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&img);
}

/// With an inode cache far smaller than the tree, lookups keep following names to inodes the
/// cache evicts and reloads (relinking the names) while other threads remove and re-create the
/// same names: a lookup sees only live inodes, and afterwards every name gives the inode it
/// names last, every removed name none.
#[test]
fn relinked_names_race_removals_and_evictions() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let dir = tempfile::tempdir().unwrap();
    let (img, fs, d) = tiny_caches(dir.path(), "relink-race");
    let names: Vec<Vec<u8>> = (0..64).map(|i| format!("n{i}").into_bytes()).collect();
    let stop = AtomicBool::new(false);
    let last: Vec<_> = std::thread::scope(|s| {
        for t in 0..2 {
            let (fs, stop, names) = (fs.clone(), &stop, &names);
            s.spawn(move || {
                while !stop.load(Relaxed) {
                    for n in names.iter().skip(t) {
                        // A file found may lose its name before its attributes are read
                        // (nlink 0), as with the kernel; an error other than ENOENT is a name
                        // left to an inode freed.
                        match fs.lookup(d, n) {
                            Ok(a) => assert_eq!(a.kind, FileType::RegularFile),
                            Err(e) => assert_eq!(e.errno(), 2, "lookup during removal: {e}"),
                        }
                    }
                }
            });
        }
        {
            let (fs, stop) = (fs.clone(), &stop);
            s.spawn(move || {
                while !stop.load(Relaxed) {
                    fs.drop_caches();
                    std::thread::yield_now();
                }
            });
        }
        // Stops the other threads however this one ends (a failed unwrap must not hang).
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Relaxed);
            }
        }
        let _stop = Stop(&stop);
        let mut last = vec![None; names.len()];
        for round in 0..999u32 {
            for (i, n) in names.iter().enumerate() {
                if last[i].is_some() {
                    fs.unlink(d, n).unwrap();
                }
                last[i] =
                    (round % 3 != 2 || i % 2 == 0).then(|| fs.create(d, n, 0o644, round, 0).unwrap().ino);
            }
        }
        last
    });
    for (n, want) in names.iter().zip(&last) {
        assert_eq!(fs.lookup(d, n).ok().map(|a| a.ino), *want, "{}", String::from_utf8_lossy(n));
    }
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&img);
}

#[test]
fn hard_and_symbolic_links() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in
        [("l-default", &[][..]), ("l-ext2", &["-t", "ext2"][..]), ("l-1k", &["-b", "1024"][..])]
    {
        let img = mkfs(dir.path(), name, args);
        let fs = rw(&img);
        let root = fs.root();
        let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
        let f = fs.create(d, b"f", 0o600, 5, 5).unwrap().ino;
        let a = fs.link(f, root, b"hard").unwrap();
        assert_eq!(a.nlink, 2);
        assert_eq!(fs.link(d, root, b"dirlink").unwrap_err().errno(), 1); // EPERM
        assert_eq!(fs.link(f, root, b"hard").unwrap_err().errno(), 17); // EEXIST
                                                                        // A taken name wins over a directory source, as in the kernel's linkat.
        assert_eq!(fs.link(d, root, b"hard").unwrap_err().errno(), 17);
        let fast = "f".repeat(59);
        let slow = "s/".repeat(300);
        fs.symlink(root, b"fast", fast.as_bytes(), 0, 0).unwrap();
        let s = fs.symlink(root, b"slow", slow.as_bytes(), 0, 0).unwrap();
        assert_eq!(s.kind, FileType::Symlink);
        assert_eq!(s.size, 600);
        fs.symlink(root, b"tof", b"d/f", 0, 0).unwrap();
        assert_eq!(fs.read_link("/fast").unwrap().as_os_str().len(), 59);
        assert_eq!(fs.read_link("/slow").unwrap().as_os_str().len(), 600);
        assert_eq!(fs.metadata("/tof").unwrap().ino, f);
        fs.unmount().unwrap();
        drop(fs);
        fsck_clean(&img);
        if let Ok(km) = common::KernelMount::ro(&img) {
            let mnt = km.path().to_path_buf();
            let fast_k = std::fs::read_link(mnt.join("fast")).unwrap();
            let slow_k = std::fs::read_link(mnt.join("slow")).unwrap();
            let hard = std::fs::metadata(mnt.join("hard")).unwrap();
            let orig = std::fs::metadata(mnt.join("d/f")).unwrap();
            km.unmount().unwrap();
            assert_eq!(fast_k.to_str().unwrap(), fast);
            assert_eq!(slow_k.to_str().unwrap(), slow);
            assert_eq!((hard.ino(), hard.nlink()), (orig.ino(), 2));
        }
        // Removing everything returns every block and inode.
        let fs = rw(&img);
        let root = fs.root();
        for n in [&b"hard"[..], b"fast", b"slow", b"tof"] {
            fs.unlink(root, n).unwrap();
        }
        let d = fs.resolve("/d", false).unwrap();
        assert_eq!(fs.getattr(fs.resolve("/d/f", false).unwrap()).unwrap().nlink, 1);
        fs.unlink(d, b"f").unwrap();
        fs.rmdir(root, b"d").unwrap();
        fs.unmount().unwrap();
        drop(fs);
        fsck_clean(&img);
    }
}

#[test]
fn rename_with_the_kernels_semantics() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [("r-default", &[][..]), ("r-ext2", &["-t", "ext2"][..])] {
        let img = mkfs(dir.path(), name, args);
        let fs = rw(&img);
        let root = fs.root();
        let a = fs.mkdir(root, b"a", 0o755, 0, 0).unwrap().ino;
        let b = fs.mkdir(root, b"b", 0o755, 0, 0).unwrap().ino;
        let sub = fs.mkdir(a, b"sub", 0o755, 0, 0).unwrap().ino;
        let f = fs.create(a, b"f", 0o644, 0, 0).unwrap().ino;
        let g = fs.create(b, b"g", 0o644, 0, 0).unwrap().ino;
        // Same directory, then across, replacing a file.
        fs.rename(a, b"f", a, b"f2", 0).unwrap();
        assert_eq!(fs.lookup(a, b"f").unwrap_err().errno(), 2);
        assert_eq!(fs.rename(a, b"f2", b, b"g", rext4::RENAME_NOREPLACE).unwrap_err().errno(), 17);
        fs.rename(a, b"f2", b, b"g", 0).unwrap();
        assert_eq!(fs.lookup(b, b"g").unwrap().ino, f);
        assert!(fs.getattr(g).is_err(), "{name}: replaced inode still live");
        // A directory across parents: `..` and link counts follow.
        fs.rename(a, b"sub", b, b"sub", 0).unwrap();
        assert_eq!(fs.lookup(sub, b"..").unwrap().ino, b);
        assert_eq!((fs.getattr(a).unwrap().nlink, fs.getattr(b).unwrap().nlink), (2, 3));
        // Into itself, onto a non-empty directory, file over directory, and back with exchange.
        assert_eq!(fs.rename(root, b"b", sub, b"x", 0).unwrap_err().errno(), 22);
        fs.create(sub, b"inner", 0o644, 0, 0).unwrap();
        assert_eq!(fs.rename(root, b"a", b, b"sub", 0).unwrap_err().errno(), 39);
        assert_eq!(fs.rename(b, b"g", b, b"sub", 0).unwrap_err().errno(), 21);
        assert_eq!(fs.rename(root, b"a", b, b"g", 0).unwrap_err().errno(), 20);
        fs.rename(root, b"a", b, b"sub", rext4::RENAME_EXCHANGE).unwrap();
        assert_eq!(fs.lookup(b, b"sub").unwrap().ino, a);
        assert_eq!(fs.lookup(root, b"a").unwrap().ino, sub);
        assert_eq!(fs.lookup(sub, b"..").unwrap().ino, root);
        assert_eq!(fs.lookup(a, b"..").unwrap().ino, b);
        assert_eq!(fs.rename(root, b"nope", root, b"x", rext4::RENAME_EXCHANGE).unwrap_err().errno(), 2);
        fs.unmount().unwrap();
        drop(fs);
        fsck_clean(&img);
        if let Ok(km) = common::KernelMount::ro(&img) {
            let mnt = km.path().to_path_buf();
            let inner = mnt.join("a/inner").exists();
            let up = std::fs::metadata(mnt.join("b/sub/..")).unwrap().ino();
            let broot = std::fs::metadata(mnt.join("b")).unwrap().ino();
            km.unmount().unwrap();
            assert!(inner, "{name}: kernel does not see a/inner");
            assert_eq!(up, broot);
        }
    }
}

/// `RENAME_WHITEOUT` (overlayfs's rename): the old name stays, naming a new whiteout (a
/// character device 0:0 without permission bits, one link, owned by the caller); a directory
/// moved this way still gets its `..` and link counts fixed; refused with `RENAME_EXCHANGE`;
/// nothing is made when the rename fails. The kernel, making the same renames on a copy of the
/// image, leaves the same tree.
#[test]
fn rename_whiteout_leaves_a_whiteout() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "wh", &[]);
    let fs = rw(&img);
    let root = fs.root();
    let d1 = fs.mkdir(root, b"d1", 0o755, 0, 0).unwrap().ino;
    let d2 = fs.mkdir(root, b"d2", 0o755, 0, 0).unwrap().ino;
    let s = fs.mkdir(d1, b"s", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    fs.create(root, b"x", 0o644, 0, 0).unwrap();
    fs.create(root, b"y", 0o644, 0, 0).unwrap();
    fs.create(root, b"mine", 0o644, 0, 0).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let kimg = dir.path().join("kernel.img");
    std::fs::copy(&img, &kimg).unwrap();
    let fs = rw(&img);
    let wh = rext4::RENAME_WHITEOUT;
    fs.rename(root, b"f", d2, b"f2", wh).unwrap();
    fs.rename(d1, b"s", d2, b"s", wh).unwrap();
    fs.rename(root, b"x", root, b"y", wh).unwrap();
    fs.rename_as(root, b"mine", root, b"mine2", wh, 1000, 1001).unwrap();
    let free = fs.statfs().unwrap().files_free;
    let err = |r: rext4::Result<()>| r.unwrap_err().errno();
    assert_eq!(err(fs.rename(root, b"y", root, b"d1", wh | rext4::RENAME_EXCHANGE)), libc::EINVAL);
    assert_eq!(err(fs.rename(root, b"y", root, b"mine2", wh | rext4::RENAME_NOREPLACE)), libc::EEXIST);
    assert_eq!(err(fs.rename(root, b"nope", root, b"z", wh)), libc::ENOENT);
    assert_eq!(fs.statfs().unwrap().files_free, free, "a failed rename made a whiteout");
    for (parent, name) in [(root, &b"f"[..]), (d1, b"s"), (root, b"x"), (root, b"mine")] {
        let a = fs.lookup(parent, name).unwrap();
        assert_eq!((a.kind, a.rdev, a.mode & 0o7777, a.nlink), (FileType::CharDevice, (0, 0), 0, 1));
    }
    let mine = fs.lookup(root, b"mine").unwrap();
    assert_eq!((mine.uid, mine.gid), (1000, 1001));
    assert_eq!(fs.lookup(d2, b"f2").unwrap().ino, f);
    assert_eq!(fs.lookup(s, b"..").unwrap().ino, d2);
    assert_eq!((fs.getattr(d1).unwrap().nlink, fs.getattr(d2).unwrap().nlink), (2, 3));
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&img);
    // The kernel's renames (as root) on the copy; then both trees as the kernel shows them.
    let Ok(km) = common::KernelMount::rw(&kimg) else { return };
    let m = km.path().to_path_buf();
    let renameat2 = |from: &str, to: &str, flags: u32| {
        let (a, b) = (std::ffi::CString::new(from).unwrap(), std::ffi::CString::new(to).unwrap());
        // SAFETY: both are NUL-terminated paths that outlive the call.
        let r = unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), flags) };
        assert_eq!(r, 0, "renameat2 {from} {to}: {}", std::io::Error::last_os_error());
    };
    let p = |rel: &str| m.join(rel).to_str().unwrap().to_string();
    renameat2(&p("f"), &p("d2/f2"), wh);
    renameat2(&p("d1/s"), &p("d2/s"), wh);
    renameat2(&p("x"), &p("y"), wh);
    renameat2(&p("mine"), &p("mine2"), wh);
    km.unmount().unwrap();
    let shape = |img: &Path| {
        let km = common::KernelMount::ro(img).unwrap();
        let v: Vec<_> = ["f", "d1/s", "x", "mine", "d2/f2", "d2/s", "y", "mine2", "d1", "d2"]
            .iter()
            .map(|rel| {
                let md = std::fs::symlink_metadata(km.path().join(rel)).unwrap();
                (rel.to_string(), md.file_type().is_char_device(), md.rdev(), md.mode() & 0o7777, md.nlink())
            })
            .collect();
        km.unmount().unwrap();
        v
    };
    assert_eq!(shape(&img), shape(&kimg));
    fsck_clean(&kimg);
}

/// Threads moving names between directories (and swapping directories) at once: no
/// deadlock, nothing lost, e2fsck clean.
#[test]
fn concurrent_renames() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "rc", &[]);
    let fs = rw(&img);
    let root = fs.root();
    let dirs: Vec<_> =
        (0..4).map(|i| fs.mkdir(root, format!("d{i}").as_bytes(), 0o755, 0, 0).unwrap().ino).collect();
    for t in 0..4u32 {
        for i in 0..50 {
            fs.create(dirs[t as usize], format!("t{t}-{i}").as_bytes(), 0o644, t, 0).unwrap();
        }
    }
    std::thread::scope(|s| {
        for t in 0..4usize {
            let (fs, dirs) = (fs.clone(), dirs.clone());
            s.spawn(move || {
                for round in 0..20 {
                    let (from, to) = (dirs[(t + round) % 4], dirs[(t + round + 1) % 4]);
                    for i in 0..50 {
                        let n = format!("t{t}-{i}");
                        fs.rename(from, n.as_bytes(), to, n.as_bytes(), 0).unwrap();
                    }
                }
            });
        }
        let fs = fs.clone();
        s.spawn(move || {
            for _ in 0..50 {
                let _ = fs.rename(root, b"d0", root, b"d1", rext4::RENAME_EXCHANGE);
            }
        });
    });
    let total: usize = (0..4).map(|i| fs.read_dir(format!("/d{i}")).unwrap().count()).sum();
    assert_eq!(total, 200);
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&img);
}

#[test]
fn mknod_makes_fifos_sockets_and_devices() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "mknod", &[]);
    let fs = rw(&img);
    let root = fs.root();
    let fifo = fs.mknod(root, b"fifo", 0o010644, (0, 0), 0, 0).unwrap();
    assert_eq!(fifo.kind, FileType::Fifo);
    fs.mknod(root, b"sock", 0o140600, (0, 0), 0, 0).unwrap();
    let c = fs.mknod(root, b"null", 0o020666, (1, 3), 0, 0).unwrap();
    assert_eq!((c.kind, c.rdev), (FileType::CharDevice, (1, 3)));
    let b = fs.mknod(root, b"big", 0o060600, (259, 70000), 0, 0).unwrap();
    assert_eq!((b.kind, b.rdev), (FileType::BlockDevice, (259, 70000)));
    assert_eq!(fs.mknod(root, b"d", 0o040755, (0, 0), 0, 0).unwrap_err().errno(), 22);
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&img);
    if let Ok(km) = common::KernelMount::ro(&img) {
        let mnt = km.path().to_path_buf();
        use std::os::unix::fs::FileTypeExt;
        let c = std::fs::symlink_metadata(mnt.join("null")).unwrap();
        let b = std::fs::symlink_metadata(mnt.join("big")).unwrap();
        let f = std::fs::symlink_metadata(mnt.join("fifo")).unwrap();
        let s = std::fs::symlink_metadata(mnt.join("sock")).unwrap();
        km.unmount().unwrap();
        assert!(c.file_type().is_char_device() && c.rdev() == (1 << 8 | 3));
        assert!(b.file_type().is_block_device());
        assert_eq!(b.rdev(), ((259u64 & 0xFFF) << 8) | (70000 & 0xFF) | ((70000u64 & !0xFF) << 12));
        assert!(f.file_type().is_fifo() && s.file_type().is_socket());
    }
}

/// Device nodes keep their device number in `i_block`: deleting one must free no block. The
/// number (1, 2) reads as block 258 when taken for a block map (the reserved GDT blocks on a
/// default image), others as blocks outside the filesystem. Nodes made by rext4 and by the
/// kernel, unlinked directly and after being held open, on extent and block-mapped images:
/// the free counts come back to where they were and e2fsck finds nothing.
#[test]
fn deleting_device_nodes_frees_no_block() {
    let dir = tempfile::tempdir().unwrap();
    let devs: [(u32, u32); 6] = [(1, 2), (8, 1), (1, 3), (259, 70000), (4095, 1 << 19), (0, 0)];
    for (name, args) in
        [("dev-ext4", &[][..]), ("dev-ext3", &["-t", "ext3"][..]), ("dev-1k", &["-b", "1024"][..])]
    {
        let img = mkfs(dir.path(), name, args);
        let kernel_made = match common::KernelMount::rw(&img) {
            Ok(km) => {
                for (i, &(ma, mi)) in devs.iter().enumerate() {
                    let p = std::ffi::CString::new(
                        km.path().join(format!("k{i}")).into_os_string().into_encoded_bytes(),
                    )
                    .unwrap();
                    let rc = unsafe { libc::mknod(p.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(ma, mi)) };
                    assert_eq!(rc, 0, "mknod through the kernel");
                }
                km.unmount().unwrap();
                true
            }
            Err(e) => {
                eprintln!("{name}: no kernel mount ({e}): rext4's own nodes only");
                false
            }
        };
        let fs = rw(&img);
        let root = fs.root();
        let before = fs.statfs().unwrap();
        let mut names = Vec::new();
        for (i, &d) in devs.iter().enumerate() {
            let mode = if i % 2 == 0 { 0o020644 } else { 0o060600 };
            let n = format!("r{i}").into_bytes();
            fs.mknod(root, &n, mode, d, 0, 0).unwrap_or_else(|e| panic!("mknod {d:?}: {e}"));
            names.push(n);
        }
        if kernel_made {
            names.extend((0..devs.len()).map(|i| format!("k{i}").into_bytes()));
        }
        for (i, n) in names.iter().enumerate() {
            if i % 3 == 0 {
                // Held open while its name goes: freed at release, through the orphan record.
                let ino = fs.lookup(root, n).unwrap().ino;
                fs.hold(ino).unwrap();
                fs.unlink(root, n).unwrap();
                fs.release(ino).unwrap();
            } else {
                fs.unlink(root, n)
                    .unwrap_or_else(|e| panic!("{name}: unlink {}: {e}", String::from_utf8_lossy(n)));
            }
        }
        let after = fs.statfs().unwrap();
        assert_eq!(after.blocks_free, before.blocks_free, "{name}: blocks freed by deleting device nodes");
        assert!(!fs.has_errors(), "{name}");
        fs.unmount().unwrap();
        drop(fs);
        fsck_clean(&img);
    }
}

/// Directories the kernel stored inline (`inline_data`) take every name operation: in place
/// (in `i_block`, then in the attribute space, as `system.data`) while the names fit, in a
/// block of their own after. Each stays inline, and as large, as when the kernel makes the
/// same changes; the image stays clean, with the kernel seeing the tree rext4 shows.
#[test]
fn inline_directories_take_every_change() {
    if !common::is_root() || !common::kernel_can_mount() {
        eprintln!("no kernel mount: skipping");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "inline", &["-O", "inline_data", "-I", "256"]);
    {
        let m = common::KernelMount::rw(&img).unwrap();
        let p = m.path();
        for d in ["empty", "few", "ren", "src", "dst", "rm", "nest", "links", "grown"] {
            std::fs::create_dir(p.join(d)).unwrap();
        }
        // Past i_block: the kernel grows system.data for these.
        for i in 1..=6 {
            std::fs::write(p.join("grown").join(format!("name_{i}")), "g").unwrap();
        }
        for f in ["a", "bb", "ccc"] {
            std::fs::write(p.join("few").join(f), f).unwrap();
            std::fs::write(p.join("ren").join(f), f).unwrap();
        }
        std::fs::create_dir(p.join("src/sub")).unwrap();
        std::fs::write(p.join("src/sub/x"), "x").unwrap();
        std::fs::create_dir(p.join("rm/gone")).unwrap();
        std::fs::write(p.join("links/t"), "t").unwrap();
        m.unmount().unwrap();
    }
    // The kernel makes the same changes on a copy: which directories stay inline, and how
    // large, must match.
    let kimg = dir.path().join("inline-kernel.img");
    std::fs::copy(&img, &kimg).unwrap();
    {
        let m = common::KernelMount::rw(&kimg).unwrap();
        let p = m.path();
        std::fs::write(p.join("empty/new-file"), "").unwrap();
        std::fs::remove_file(p.join("few/bb")).unwrap();
        std::fs::rename(p.join("ren/a"), p.join("ren/a-renamed-to-a-longer-name")).unwrap();
        std::fs::rename(p.join("src/sub"), p.join("dst/sub")).unwrap();
        std::fs::remove_dir(p.join("rm/gone")).unwrap();
        std::fs::create_dir(p.join("nest/inner")).unwrap();
        std::fs::write(p.join("nest/inner/deep"), "").unwrap();
        std::fs::hard_link(p.join("links/t"), p.join("links/t2")).unwrap();
        std::os::unix::fs::symlink("t", p.join("links/s")).unwrap();
        std::fs::remove_file(p.join("grown/name_6")).unwrap();
        std::fs::remove_file(p.join("grown/name_1")).unwrap();
        std::fs::write(p.join("grown/other6"), "").unwrap();
        std::fs::rename(p.join("grown/name_3"), p.join("grown/nm3")).unwrap();
        m.unmount().unwrap();
    }
    let fs = rw(&img);
    let inline = |path: &str| fs.metadata(path).unwrap().flags & 0x1000_0000 != 0;
    for d in ["/empty", "/few", "/ren", "/src", "/src/sub", "/rm/gone", "/nest", "/links"] {
        assert!(inline(d), "{d} is not inline: the fixture does not test anything");
    }
    let at = |path: &str| fs.resolve(path, false).unwrap();
    fs.create(at("/empty"), b"new-file", 0o644, 0, 0).unwrap();
    fs.unlink(at("/few"), b"bb").unwrap();
    fs.rename(at("/ren"), b"a", at("/ren"), b"a-renamed-to-a-longer-name", 0).unwrap();
    // A directory moved out of one inline directory into another: three conversions, and
    // the moved directory's `..` now names its new parent.
    fs.rename(at("/src"), b"sub", at("/dst"), b"sub", 0).unwrap();
    assert_eq!(fs.resolve("/dst/sub/..", false).unwrap(), at("/dst"));
    fs.rmdir(at("/rm"), b"gone").unwrap();
    let n = fs.mkdir(at("/nest"), b"inner", 0o755, 0, 0).unwrap();
    fs.create(n.ino, b"deep", 0o600, 0, 0).unwrap();
    fs.link(at("/links/t"), at("/links"), b"t2").unwrap();
    fs.symlink(at("/links"), b"s", b"t", 0, 0).unwrap();
    assert!(fs.metadata("/grown").unwrap().size > 60, "the kernel did not grow /grown");
    fs.unlink(at("/grown"), b"name_6").unwrap();
    fs.unlink(at("/grown"), b"name_1").unwrap();
    fs.create(at("/grown"), b"other6", 0o644, 0, 0).unwrap();
    fs.rename(at("/grown"), b"name_3", at("/grown"), b"nm3", 0).unwrap();
    // The long name did not fit in i_block: /ren's attribute space took it.
    assert!(inline("/ren") && fs.metadata("/ren").unwrap().size > 60, "/ren did not grow inline");
    let dirs = [
        "/empty",
        "/few",
        "/ren",
        "/src",
        "/dst",
        "/dst/sub",
        "/rm",
        "/nest",
        "/nest/inner",
        "/links",
        "/grown",
    ];
    let shape = |fs: &Fs, d: &str| {
        let a = fs.metadata(d).unwrap();
        (a.size, a.flags & 0x1000_0000 != 0)
    };
    let kfs = Fs::open(&kimg).unwrap();
    for d in dirs {
        assert_eq!(
            shape(&fs, d),
            shape(&kfs, d),
            "{d}: (size, inline) after the same changes, rext4 against the kernel"
        );
    }
    drop(kfs);
    let names = |path: &str| {
        let mut v: Vec<Vec<u8>> = fs.read_dir(path).unwrap().map(|e| e.unwrap().name).collect();
        v.sort();
        v
    };
    assert_eq!(names("/few"), [&b"a"[..], b"ccc"]);
    assert_eq!(names("/grown"), [&b"name_2"[..], b"name_4", b"name_5", b"nm3", b"other6"]);
    assert!(names("/src").is_empty());
    assert_eq!(names("/dst/sub"), [b"x"]);
    assert_eq!(names("/ren"), [&b"a-renamed-to-a-longer-name"[..], b"bb", b"ccc"]);
    assert_eq!(fs.getattr(at("/src")).unwrap().nlink, 2);
    assert_eq!(fs.getattr(at("/dst")).unwrap().nlink, 3);
    let ours = common::walk_rext4(&fs, None);
    fs.unmount().unwrap();
    fsck_clean(&img);
    let m = common::KernelMount::ro(&img).unwrap();
    let kernel = common::walk_kernel(m.path());
    let diffs = common::diff_full("kernel", &kernel, "rext4", &ours);
    m.unmount().unwrap();
    common::assert_no_diff("inline directories", &diffs);
}

/// Inline directories changed from several threads while others read them: a name that is
/// always there is always found, whichever area the changes land in; names move between two
/// inline directories; the directories stay inline and the image stays clean.
#[test]
fn concurrent_changes_to_inline_directories() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "ic", &["-O", "inline_data", "-I", "256"]);
    let fs = rw(&img);
    let root = fs.root();
    let dirs: Vec<_> =
        (0..3).map(|i| fs.mkdir(root, format!("d{i}").as_bytes(), 0o755, 0, 0).unwrap().ino).collect();
    for &d in &dirs {
        fs.create(d, b"keep", 0o644, 0, 0).unwrap();
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..3usize)
            .map(|t| {
                let (fs, dirs) = (fs.clone(), dirs.clone());
                s.spawn(move || {
                    for round in 0..300 {
                        let n = format!("w{t}");
                        fs.create(dirs[t], n.as_bytes(), 0o644, 0, 0).unwrap();
                        fs.rename(
                            dirs[t],
                            n.as_bytes(),
                            dirs[t],
                            format!("r{t}-{}", round % 7).as_bytes(),
                            0,
                        )
                        .unwrap();
                        let to = dirs[(t + 1) % 3];
                        let moved = format!("m{t}");
                        fs.rename(dirs[t], format!("r{t}-{}", round % 7).as_bytes(), to, moved.as_bytes(), 0)
                            .unwrap();
                        fs.unlink(to, moved.as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for _ in 0..2 {
            let (fs, dirs, done) = (fs.clone(), dirs.clone(), &done);
            s.spawn(move || {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    for &d in &dirs {
                        fs.lookup(d, b"keep").unwrap();
                        let mut seen = false;
                        fs.readdir(d, 0, |e| {
                            seen |= e.name == b"keep";
                            true
                        })
                        .unwrap();
                        assert!(seen, "readdir missed a name that never moved");
                    }
                }
            });
        }
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    for i in 0..3 {
        let p = format!("/d{i}");
        assert!(fs.metadata(&p).unwrap().flags & 0x1000_0000 != 0, "{p} left inline");
        let names: Vec<_> = fs.read_dir(&p).unwrap().map(|e| e.unwrap().name).collect();
        assert_eq!(names, [b"keep"], "{p}");
    }
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&img);
}
