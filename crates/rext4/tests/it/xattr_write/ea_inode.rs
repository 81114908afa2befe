//! Values in EA inodes (`ea_inode`): placement, sharing, replacement, Lustre-style entries.

use super::*;

/// With `ea_inode`: values too large for an xattr area go to EA inodes of their own, at once
/// or when neither area has room left; replacing, removing and unlinking free them again. The
/// kernel reads every value, and can go on removing them; e2fsck counts the references right.
/// Also with `project` (a new EA inode's project is its root directory's, which was once read
/// through the record the change holds, and waited for forever).
#[test]
fn values_in_ea_inodes() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [
        ("4k", &["-O", "ea_inode"][..]),
        ("1k", &["-b", "1024", "-O", "ea_inode"][..]),
        ("project", &["-O", "ea_inode,project"][..]),
    ] {
        let img = mkfs(dir.path(), name, args);
        let in_use = inodes_in_use(&img);
        let fs = rw(&img);
        let root = fs.root();
        for f in ["big", "two", "max", "gone", "shrink", "grow"] {
            fs.create(root, f.as_bytes(), 0o644, 1000, 1000).unwrap();
        }
        // A value over a block's worth goes to an EA inode at once.
        set(&fs, "/big", "user.big", &pattern(1, 10_000));
        set(&fs, "/big", "user.small", b"s");
        // Two values that each fit a block, but not together: the second goes to an EA inode.
        let bs = fs.block_size() as usize;
        set(&fs, "/two", "user.a", &pattern(2, bs * 3 / 4));
        set(&fs, "/two", "user.b", &pattern(3, bs * 3 / 4));
        // The largest value setxattr takes.
        set(&fs, "/max", "trusted.max", &pattern(4, 65_536));
        set(&fs, "/gone", "user.g", &pattern(5, 8_000));
        set(&fs, "/shrink", "user.s", &pattern(6, 9_000));
        // A value in the block that grows past the block's room moves to an EA inode, its
        // entry to the inode: the block's entry goes.
        set(&fs, "/grow", "user.a", &pattern(14, bs * 3 / 4));
        set(&fs, "/grow", "user.b", &pattern(15, bs / 8));
        set(&fs, "/grow", "user.b", &pattern(16, bs * 3 / 4));
        let names = fs.listxattr(ino(&fs, "/grow")).unwrap();
        assert_eq!(names.len(), 2, "{name}: {names:?}");
        let files = fs.statfs().unwrap().files_free;
        // Replaced by another large value: the old EA inode goes, a new one comes.
        set(&fs, "/big", "user.big", &pattern(7, 20_000));
        // Replaced by a small value: its EA inode goes.
        set(&fs, "/shrink", "user.s", b"small now");
        // Removed, and unlinked with its value: both EA inodes go.
        fs.removexattr(ino(&fs, "/max"), b"trusted.max").unwrap();
        fs.unlink(root, b"gone").unwrap();
        assert_eq!(fs.statfs().unwrap().files_free, files + 4, "{name}: three EA inodes and /gone freed");
        assert_eq!(errno(fs.getxattr(ino(&fs, "/max"), b"trusted.max")), libc::ENODATA);
        let big = map(&[("user.big", &pattern(7, 20_000)), ("user.small", b"s")]);
        let two = map(&[("user.a", &pattern(2, bs * 3 / 4)), ("user.b", &pattern(3, bs * 3 / 4))]);
        let shrink = map(&[("user.s", b"small now")]);
        let grow = map(&[("user.a", &pattern(14, bs * 3 / 4)), ("user.b", &pattern(16, bs * 3 / 4))]);
        assert_eq!(rext4_xattrs(&fs, "/big"), big, "{name}");
        finish(
            fs,
            &img,
            &[("/big", big), ("/two", two), ("/max", Xattrs::new()), ("/shrink", shrink), ("/grow", grow)],
        );
        // Five files and the three EA inodes still named.
        assert_eq!(inodes_in_use(&img), in_use + 8, "{name}");
        // The kernel takes them from here.
        match KernelMount::rw(&img) {
            Ok(km) => {
                for f in ["big", "two"] {
                    let p = km.path().join(f);
                    for n in xattr::list(&p).unwrap() {
                        xattr::remove(&p, n).unwrap();
                    }
                }
                km.unmount().unwrap();
                e2fsck_clean(&img);
                assert_eq!(inodes_in_use(&img), in_use + 6, "{name}: the kernel freed both EA inodes");
            }
            Err(e) => eprintln!("skipping the kernel's removal: {e}"),
        }
    }
}

/// Values the kernel put in EA inodes (one of them shared by several files' equal values) are
/// replaced, removed and unlinked by rext4 with the references counted right; a block the
/// kernel shares that names an EA inode is copied for the file that changes it.
#[test]
fn kernel_ea_inode_values_changed() {
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "kea", &["-O", "ea_inode"]);
    let in_use = inodes_in_use(&img);
    {
        let km = KernelMount::rw(&img).unwrap();
        for f in ["a", "b", "c"] {
            let p = km.path().join(f);
            std::fs::write(&p, b"x").unwrap();
            xattr::set(&p, "user.v", &pattern(9, 12_000)).unwrap();
        }
        // The in-inode area full, the entry naming the EA inode goes to a block, shared.
        for f in ["e", "f"] {
            let p = km.path().join(f);
            std::fs::write(&p, b"y").unwrap();
            xattr::set(&p, "user.pad", &pattern(11, 100)).unwrap();
            xattr::set(&p, "user.w", &pattern(12, 12_000)).unwrap();
        }
        km.unmount().unwrap();
    }
    let shared = file_acl(&img, "/e");
    assert!(shared != 0 && file_acl(&img, "/f") == shared, "the kernel shares one block");
    let fs = rw(&img);
    set(&fs, "/e", "user.more", &pattern(13, 200));
    assert_eq!(rext4_xattrs(&fs, "/a"), map(&[("user.v", &pattern(9, 12_000))]));
    set(&fs, "/a", "user.v", &pattern(10, 5_000));
    fs.removexattr(ino(&fs, "/b"), b"user.v").unwrap();
    let c = map(&[("user.v", &pattern(9, 12_000))]);
    fs.unlink(fs.root(), b"c").unwrap();
    fs.create(fs.root(), b"d", 0o644, 0, 0).unwrap();
    set(&fs, "/d", "user.v", &pattern(9, 12_000));
    let a = map(&[("user.v", &pattern(10, 5_000))]);
    let f = map(&[("user.pad", &pattern(11, 100)), ("user.w", &pattern(12, 12_000))]);
    let mut e = f.clone();
    e.insert(b"user.more".to_vec(), pattern(13, 200));
    finish(fs, &img, &[("/a", a), ("/b", Xattrs::new()), ("/d", c), ("/e", e), ("/f", f)]);
    assert_ne!(file_acl(&img, "/e"), shared);
    assert_eq!(file_acl(&img, "/f"), shared);
    // a, b, d, e, f and the EA inodes of a's, d's and e's and f's values.
    assert_eq!(inodes_in_use(&img), in_use + 8);
}

/// A reader racing a writer that keeps replacing a value in an EA inode (freeing the old
/// one each time) always gets one whole value, never an error; the writer never runs out of
/// room while freed blocks wait for their commit.
#[test]
fn ea_inode_values_read_while_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "race", &["-O", "ea_inode"]);
    let fs = rw(&img);
    fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap();
    let f = ino(&fs, "/f");
    let (a, b) = (pattern(20, 10_000), pattern(21, 12_000));
    fs.setxattr(f, b"user.v", &a, 0).unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut reads = 0u32;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let v = fs.getxattr(f, b"user.v").unwrap_or_else(|e| panic!("read {reads}: {e}"));
                assert!(v == a || v == b, "read {reads}: a torn value of {} bytes", v.len());
                reads += 1;
            }
            reads
        });
        // Far more values than the image holds at once: the freed ones must come back.
        let wrote =
            (0..4000).try_for_each(|i| fs.setxattr(f, b"user.v", if i % 2 == 0 { &b } else { &a }, 0));
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        wrote.unwrap();
        assert!(reader.join().unwrap() > 0);
    });
    finish(fs, &img, &[("/f", map(&[("user.v", &a)]))]);
}

/// Old Lustre EA inodes (no reference count or value hash; `i_mtime` names the owner, the
/// generation is the owner's, and e2fsck charges their values to nobody): rext4 drops them
/// with the entry naming them, in the inode and in a block, and with their owner, as the
/// kernel does, without touching the owner's `i_blocks` for them.
#[test]
fn lustre_ea_inodes_are_dropped_with_their_entries() {
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "lustre", &["-O", "ea_inode"]);
    let in_use = inodes_in_use(&img);
    // Values differ: the kernel would share one EA inode between equal ones.
    let big = |seed| pattern(seed, 8000);
    {
        let km = KernelMount::rw(&img).unwrap();
        for (seed, f) in [(40, "a"), (41, "b"), (42, "c")] {
            let p = km.path().join(f);
            std::fs::write(&p, b"x").unwrap();
            xattr::set(&p, "user.big", &big(seed)).unwrap();
        }
        // An xattr block beside the in-inode entry naming the EA inode.
        let p = km.path().join("e");
        std::fs::write(&p, b"y").unwrap();
        xattr::set(&p, "user.pad", &pattern(31, 100)).unwrap();
        xattr::set(&p, "user.big", &big(43)).unwrap();
        km.unmount().unwrap();
    }
    let le32 = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let mut cmds = String::new();
    for f in ["/a", "/b", "/c", "/e"] {
        let rec = inode_record(&img, f);
        let owner: u32 = debugfs(&img, &format!("stat {f}"))
            .split("Inode: ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap()
            .parse()
            .unwrap();
        // The entry naming the EA inode, in the inode's area or in the block.
        let named = |area: &[u8], mut o: usize| {
            while o + 16 <= area.len() && le32(area, o) != 0 {
                if le32(area, o + 4) != 0 {
                    return le32(area, o + 4);
                }
                o += (16 + usize::from(area[o]) + 3) & !3;
            }
            0
        };
        let acl = file_acl(&img, f);
        let mut ea = named(&rec, 128 + usize::from(u16::from_le_bytes([rec[0x80], rec[0x81]])) + 4);
        if ea == 0 && acl != 0 {
            ea = named(&read_block(&img, acl), 32);
        }
        assert_ne!(ea, 0, "{f}: no EA inode");
        let gen = le32(&rec, 0x64);
        let blocks = le32(&rec, 0x1C);
        cmds += &format!(
            "sif <{ea}> mtime @{owner}\nsif <{ea}> generation {gen}\nsif <{ea}> atime @12345\n\
             sif <{ea}> ctime @12345\nsif <{ea}> version 0\nsif {f} blocks {}\n",
            blocks - 16
        );
    }
    rext4_testkit::debugfs_write(&img, &cmds);
    e2fsck_clean(&img);
    assert_eq!(inodes_in_use(&img), in_use + 8);

    let fs = rw(&img);
    assert_eq!(rext4_xattrs(&fs, "/a"), map(&[("user.big", &big(40))]));
    fs.removexattr(ino(&fs, "/a"), b"user.big").unwrap();
    set(&fs, "/b", "user.big", &pattern(32, 100));
    fs.unlink(fs.root(), b"c").unwrap();
    fs.removexattr(ino(&fs, "/e"), b"user.big").unwrap();
    let b = map(&[("user.big", &pattern(32, 100))]);
    let e = map(&[("user.pad", &pattern(31, 100))]);
    finish(fs, &img, &[("/a", Xattrs::new()), ("/b", b), ("/e", e)]);
    // a, b and e; c and the four EA inodes are gone.
    assert_eq!(inodes_in_use(&img), in_use + 3);
}

/// Equal values share one EA inode, as the kernel shares them: across inodes, within one
/// inode, and with an EA inode the kernel made (learned when rext4 reads it). Its reference
/// count follows every entry naming it, which e2fsck checks.
#[test]
fn equal_values_share_one_ea_inode() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "share", &["-O", "ea_inode"]);
    let base = inodes_in_use(&img);
    let (v, w) = (pattern(50, 12_000), pattern(51, 9_000));
    let kernel = kernel_can_mount();
    if kernel {
        let km = KernelMount::rw(&img).unwrap();
        let p = km.path().join("k1");
        std::fs::write(&p, b"k").unwrap();
        xattr::set(&p, "user.w", &w).unwrap();
        km.unmount().unwrap();
    }
    let fs = rw(&img);
    for f in [&b"a"[..], b"b", b"c", b"k2"] {
        fs.create(fs.root(), f, 0o644, 0, 0).unwrap();
    }
    set(&fs, "/a", "user.v", &v);
    set(&fs, "/b", "user.v", &v);
    set(&fs, "/c", "user.x", &v);
    set(&fs, "/c", "user.y", &v);
    let kfiles = if kernel {
        assert_eq!(rext4_xattrs(&fs, "/k1"), map(&[("user.w", &w)]));
        set(&fs, "/k2", "user.w", &w);
        1
    } else {
        0
    };
    // a, b, c, k2 (and k1), one EA inode for v and, with the kernel's, one for w.
    let st = fs.statfs().unwrap();
    assert_eq!(st.files - st.files_free, base + 4 + 2 * kfiles + 1);
    fs.removexattr(ino(&fs, "/a"), b"user.v").unwrap();
    fs.unlink(fs.root(), b"b").unwrap();
    set(&fs, "/c", "user.x", &pattern(52, 50));
    let c = map(&[("user.x", &pattern(52, 50)), ("user.y", &v)]);
    let mut expected = vec![("/a", Xattrs::new()), ("/c", c)];
    if kernel {
        expected.push(("/k1", map(&[("user.w", &w)])));
        expected.push(("/k2", map(&[("user.w", &w)])));
    }
    finish(fs, &img, &expected);
    assert_eq!(inodes_in_use(&img), base + 3 + 2 * kfiles + 1);
}
