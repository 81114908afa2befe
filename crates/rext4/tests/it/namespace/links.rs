//! Hard and symbolic links, and renames with the kernel's semantics and flags.

use super::*;

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
        if let Ok(km) = KernelMount::ro(&img) {
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
        if let Ok(km) = KernelMount::ro(&img) {
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
    let Ok(km) = KernelMount::rw(&kimg) else { return };
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
        let km = KernelMount::ro(img).unwrap();
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
