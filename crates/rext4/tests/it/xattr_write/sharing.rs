//! Identical attribute sets share one block: reference counts, their limit, races.

use super::*;

#[test]
fn identical_attributes_share_one_block() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [("default", &[][..]), ("nocsum", &["-O", "^metadata_csum"][..])] {
        let img = mkfs(dir.path(), name, args);
        let fs = rw(&img);
        let root = fs.root();
        let free0 = fs.statfs().unwrap().blocks_free;
        let used = |fs: &Fs| free0 - fs.statfs().unwrap().blocks_free;
        let shared = map(&[("user.shared", &[b'S'; 200]), ("user.other", &[b'o'; 100])]);
        for i in 0..10 {
            let f = fs.create(root, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
            for (n, v) in &shared {
                fs.setxattr(f, n, v, 0).unwrap();
            }
            assert_eq!(
                fs.getattr(f).unwrap().blocks,
                fs.block_size() as u64 / 512,
                "{name}: i_blocks of f{i}"
            );
        }
        assert_eq!(used(&fs), 1, "{name}: one block for ten files");
        // Changing one copies the block first; changing it back shares again and frees the copy.
        set(&fs, "/f3", "user.other", &[b'y'; 100]);
        assert_eq!(used(&fs), 2, "{name}: the changed inode has its own block");
        set(&fs, "/f3", "user.other", &[b'o'; 100]);
        assert_eq!(used(&fs), 1, "{name}: shared again, copy freed");
        close(fs);
        let b = file_acl(&img, "/f0");
        for i in 1..10 {
            assert_eq!(file_acl(&img, &format!("/f{i}")), b, "{name}: f{i} shares the block");
        }
        assert_eq!(refcount(&img, b), 10);
        e2fsck_clean(&img);

        // Deleting drops references.
        let fs = rw(&img);
        for i in 0..9 {
            fs.unlink(root, format!("f{i}").as_bytes()).unwrap();
        }
        assert_eq!(used(&fs), 1);
        close(fs);
        assert_eq!(refcount(&img, b), 1);
        e2fsck_clean(&img);

        // The sole user rewrites it in place; a later file with the same attributes shares it.
        let fs = rw(&img);
        fs.removexattr(ino(&fs, "/f9"), b"user.other").unwrap();
        fs.create(root, b"late", 0o644, 0, 0).unwrap();
        set(&fs, "/late", "user.shared", &[b'S'; 200]);
        assert_eq!(used(&fs), 1);
        let one = map(&[("user.shared", &[b'S'; 200])]);
        finish(fs, &img, &[("/f9", one.clone()), ("/late", one)]);
        assert_eq!(
            (file_acl(&img, "/f9"), file_acl(&img, "/late")),
            (b, b),
            "{name}: rewritten in place, shared"
        );
        assert_eq!(refcount(&img, b), 2);

        let fs = rw(&img);
        fs.unlink(root, b"f9").unwrap();
        fs.unlink(root, b"late").unwrap();
        assert_eq!(used(&fs), 0, "{name}: everything freed");
        finish(fs, &img, &[]);
    }
}

/// Past the kernel's `EXT4_XATTR_REFCOUNT_MAX` (1024) references a second block is started.
#[test]
fn shared_block_reference_limit() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "refmax", &["-N", "2048"]);
    let fs = rw(&img);
    let root = fs.root();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let v = vec![b'v'; 300];
    for i in 0..1030 {
        let f = fs.create(d, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.setxattr(f, b"user.same", &v, 0).unwrap();
    }
    close(fs);
    let (b0, b1) = (file_acl(&img, "/d/f0"), file_acl(&img, "/d/f1029"));
    assert_ne!(b0, b1);
    assert_eq!((refcount(&img, b0), refcount(&img, b1)), (1024, 6));
    // Dropping one reference from the full block makes it shareable again.
    let fs = rw(&img);
    let _ = rext4_xattrs(&fs, "/d/f1");
    fs.unlink(d, b"f0").unwrap();
    let g = fs.create(d, b"g", 0o644, 0, 0).unwrap().ino;
    fs.setxattr(g, b"user.same", &v, 0).unwrap();
    let want = map(&[("user.same", &v)]);
    finish(fs, &img, &[("/d/f1", want.clone()), ("/d/f1029", want.clone()), ("/d/g", want)]);
    assert_eq!(file_acl(&img, "/d/g"), b0);
    assert_eq!((refcount(&img, b0), refcount(&img, b1)), (1024, 6));
}

/// Threads giving many files the same attributes at once: references are counted right.
#[test]
fn concurrent_sharing_keeps_counts_right() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "conc", &[]);
    let fs = rw(&img);
    let root = fs.root();
    let dirs: Vec<InodeNo> =
        (0..4).map(|t| fs.mkdir(root, format!("t{t}").as_bytes(), 0o755, 0, 0).unwrap().ino).collect();
    let free0 = fs.statfs().unwrap().blocks_free;
    let mine = |t: usize| vec![b'0' + t as u8; 100];
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let writers: Vec<_> = dirs
            .iter()
            .enumerate()
            .map(|(t, &d)| {
                let fs = fs.clone();
                s.spawn(move || {
                    for i in 0..60 {
                        let f = fs.create(d, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
                        fs.setxattr(f, b"user.common", &[b'c'; 400], 0).unwrap();
                        if i % 3 == 0 {
                            fs.setxattr(f, b"user.mine", &mine(t), 0).unwrap();
                        }
                        if i % 5 == 0 {
                            fs.setxattr(f, b"user.common", &[b'd'; 400], 0).unwrap();
                        }
                        if i % 7 == 0 {
                            fs.unlink(d, format!("f{i}").as_bytes()).unwrap();
                        }
                    }
                })
            })
            .collect();
        // A reader meanwhile sees each attribute whole: one of the values ever set, or none.
        let reader = s.spawn(|| {
            let mut seen = 0;
            loop {
                let last = done.load(std::sync::atomic::Ordering::Acquire);
                for &d in &dirs {
                    fs.readdir(d, 0, |e| {
                        if e.name.starts_with(b"f") {
                            if let Ok(names) = fs.listxattr(e.ino) {
                                for n in names {
                                    match fs.getxattr(e.ino, &n) {
                                        Ok(v) => {
                                            seen += 1;
                                            let ok = v == [b'c'; 400]
                                                || v == [b'd'; 400]
                                                || (0..4).any(|t| v == mine(t));
                                            assert!(ok, "torn value of {}", String::from_utf8_lossy(&n));
                                        }
                                        // Removed meanwhile (a file unlinked meanwhile is
                                        // a stale number), never damage.
                                        Err(e) => {
                                            assert!([libc::ENODATA, libc::ESTALE].contains(&e.errno()), "{e}")
                                        }
                                    }
                                }
                            }
                        }
                        true
                    })
                    .unwrap();
                }
                if last {
                    break seen;
                }
            }
        });
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        assert!(reader.join().unwrap() > 0);
    });
    assert!(!fs.has_errors(), "a racing reader recorded an error");
    // Distinct blocks: common=c or d, with or without each thread's own attribute (two
    // threads missing the cache at once may each start a copy, as in the kernel).
    let used = free0 - fs.statfs().unwrap().blocks_free;
    assert!(used <= 16, "{used} blocks for ten distinct attribute sets");
    let mut expected = Vec::new();
    for t in 0..4 {
        for i in (0..60).filter(|i| i % 7 != 0) {
            let p: &'static str = Box::leak(format!("/t{t}/f{i}").into_boxed_str());
            let mut want = map(&[("user.common", &[if i % 5 == 0 { b'd' } else { b'c' }; 400])]);
            if i % 3 == 0 {
                want.insert(b"user.mine".to_vec(), mine(t));
            }
            expected.push((p, want));
        }
    }
    finish(fs, &img, &expected);
}

/// A reader of a file being unlinked must not offer the file's xattr block for sharing
/// once the unlink has freed it: the next file with the same attributes would take a
/// reference to a free block (e2fsck: "reference count 2, should be 1" and the block free in
/// the bitmap). The reader hammers each file while the test unlinks it.
#[test]
fn reading_a_dying_file_never_offers_its_freed_block() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "dying", &[]);
    let fs = rw(&img);
    let root = fs.root();
    // Each unlinked file's value is the next file's: a chance per pair to share a freed block.
    let value = |i: usize| format!("{:0>600}", i / 2).into_bytes();
    let target = std::sync::atomic::AtomicU32::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut expected = Vec::new();
    std::thread::scope(|s| {
        let (fs2, target, stop) = (fs.clone(), &target, &stop);
        s.spawn(move || {
            use std::sync::atomic::Ordering::Acquire;
            while !stop.load(Acquire) {
                let ino = InodeNo(target.load(Acquire));
                if ino.0 == 0 {
                    continue;
                }
                // A file unlinked meanwhile is a stale number (ESTALE, as the kernel answers a
                // file handle naming a freed inode); never a bad checksum or corruption (which
                // would mark the image as having errors).
                let ok = |e: rext4::Error| assert!([libc::ESTALE, libc::ENODATA].contains(&e.errno()), "{e}");
                match fs2.listxattr(ino) {
                    Ok(names) => names.iter().for_each(|n| fs2.getxattr(ino, n).map(drop).unwrap_or_else(ok)),
                    Err(e) => ok(e),
                }
            }
        });
        for i in 0..400 {
            let name = format!("f{i}");
            let f = fs.create(root, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
            fs.setxattr(f, b"user.big", &value(i), 0).unwrap();
            target.store(f.0, std::sync::atomic::Ordering::Release);
            if i % 2 == 0 {
                fs.unlink(root, name.as_bytes()).unwrap();
            } else {
                expected.push((
                    Box::leak(format!("/{name}").into_boxed_str()) as &str,
                    map(&[("user.big", &value(i))]),
                ));
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Release);
    });
    assert!(!fs.has_errors(), "a racing reader recorded an error");
    finish(fs, &img, &expected);
}
