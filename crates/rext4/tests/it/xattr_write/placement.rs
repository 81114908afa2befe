//! Where attributes go: in the inode, in a block, next to inline data; as the kernel lays them out.

use super::*;

#[test]
fn set_replace_remove_in_inode_and_in_block() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [
        ("default", &[][..]),
        ("inode128", &["-I", "128"][..]),
        ("nocsum", &["-O", "^metadata_csum"][..]),
        ("ext2_1k", &["-t", "ext2", "-b", "1024"][..]),
    ] {
        let img = mkfs(dir.path(), name, args);
        let fs = rw(&img);
        let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
        let small_inode = args.contains(&"128");
        let sectors = fs.block_size() as u64 / 512;
        let before = fs.getattr(f).unwrap();
        // 128-byte records keep whole seconds.
        std::thread::sleep(std::time::Duration::from_millis(if small_inode { 1100 } else { 20 }));
        set(&fs, "/f", "user.a", b"alpha");
        let after = fs.getattr(f).unwrap();
        assert!(after.ctime > before.ctime, "{name}: ctime moves");
        assert_eq!(after.mtime, before.mtime, "{name}: mtime stays");
        // A small value lives in the inode where there is room; in a block otherwise.
        assert_eq!(after.blocks, if small_inode { sectors } else { 0 }, "{name}: blocks after a small value");
        // Setting the same value again changes nothing, not even ctime.
        set(&fs, "/f", "user.a", b"alpha");
        assert_eq!(fs.getattr(f).unwrap().ctime, after.ctime, "{name}: same value");
        set(&fs, "/f", "trusted.t", b"");
        set(&fs, "/f", "security.s", &[0, 1, 2, 255]);
        let big = vec![b'B'; 500];
        set(&fs, "/f", "user.big", &big);
        assert_eq!(fs.getattr(f).unwrap().blocks, sectors, "{name}: one xattr block");
        set(&fs, "/f", "user.a", &[b'A'; 300]);
        set(&fs, "/f", "user.a", b"short again");
        set(&fs, "/f", "user.big", &big[..499]);
        assert_eq!(errno(fs.setxattr(f, b"user.a", b"x", XATTR_CREATE)), libc::EEXIST);
        assert_eq!(errno(fs.setxattr(f, b"user.nope", b"x", XATTR_REPLACE)), libc::ENODATA);
        fs.setxattr(f, b"user.c", b"created", XATTR_CREATE).unwrap();
        fs.setxattr(f, b"user.c", b"replaced", XATTR_REPLACE).unwrap();
        assert_eq!(errno(fs.removexattr(f, b"user.nope")), libc::ENODATA);
        fs.removexattr(f, b"user.big").unwrap();
        assert_eq!(errno(fs.getxattr(f, b"user.big")), libc::ENODATA);
        let want = map(&[
            ("user.a", b"short again"),
            ("trusted.t", b""),
            ("security.s", &[0, 1, 2, 255]),
            ("user.c", b"replaced"),
        ]);
        assert_eq!(rext4_xattrs(&fs, "/f"), want, "{name}");
        // Everything removed: no block left, nothing listed.
        let g = fs.create(fs.root(), b"g", 0o644, 0, 0).unwrap().ino;
        set(&fs, "/g", "user.x", &[1; 900]);
        set(&fs, "/g", "user.y", b"y");
        fs.removexattr(g, b"user.x").unwrap();
        fs.removexattr(g, b"user.y").unwrap();
        assert_eq!(fs.getattr(g).unwrap().blocks, 0, "{name}: block released");
        assert!(fs.listxattr(g).unwrap().is_empty());
        // Directories take attributes too.
        fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap();
        set(&fs, "/d", "user.dir", b"on a directory");
        finish(
            fs,
            &img,
            &[("/f", want), ("/g", Xattrs::new()), ("/d", map(&[("user.dir", b"on a directory")]))],
        );
    }
}

#[test]
fn many_attributes_spill_into_a_block_until_full() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [("default", &[][..]), ("1k", &["-b", "1024"][..]), ("inode128", &["-I", "128"][..])]
    {
        let img = mkfs(dir.path(), name, args);
        let fs = rw(&img);
        let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
        let mut want = Xattrs::new();
        let mut full_at = None;
        for i in 0..400 {
            let n = format!("user.attr-{i:03}-{}", "n".repeat(i % 17)).into_bytes();
            let v: Vec<u8> = (0..(i * 7) % 90).map(|k| (i + k) as u8).collect();
            match fs.setxattr(f, &n, &v, 0) {
                Ok(()) => {
                    want.insert(n, v);
                }
                Err(e) => {
                    assert_eq!(e.errno(), libc::ENOSPC, "{name}: attribute {i}");
                    full_at = Some(i);
                    break;
                }
            }
        }
        let full_at = full_at.unwrap_or_else(|| panic!("{name}: never full"));
        assert!(full_at > 10, "{name}: full after {full_at}");
        assert_eq!(rext4_xattrs(&fs, "/f"), want, "{name}: all readable when full");
        // Removing every other one makes room again.
        let names: Vec<_> = want.keys().cloned().collect();
        for n in names.iter().step_by(2) {
            fs.removexattr(f, n).unwrap();
            want.remove(n);
        }
        set(&fs, "/f", "user.after", b"room again");
        want.insert(b"user.after".to_vec(), b"room again".to_vec());
        assert_eq!(rext4_xattrs(&fs, "/f"), want, "{name}");
        finish(fs, &img, &[("/f", want)]);
    }
}

/// The same operations done by the kernel on one image and by rext4 on another leave the
/// same bytes: the in-inode area and the xattr block (all but its checksum) match exactly.
#[test]
fn layout_matches_the_kernel() {
    require_kernel!();
    let acl = vfs_acl(&[
        (ACL_USER_OBJ, 6, U),
        (ACL_USER, 4, 1000),
        (ACL_GROUP_OBJ, 4, U),
        (ACL_GROUP, 6, 50),
        (ACL_MASK, 6, U),
        (ACL_OTHER, 4, U),
    ]);
    let ops: Vec<(&str, Option<Vec<u8>>)> = vec![
        ("user.a", Some(vec![1; 10])),
        ("user.bb", Some(vec![2; 30])),
        ("trusted.t", Some(vec![3; 5])),
        ("user.a", Some(vec![4; 40])),
        ("user.big", Some(vec![5; 300])),
        ("security.s", Some(vec![6; 7])),
        ("user.bb", None),
        ("user.a", Some(vec![7; 3])),
        ("user.big", Some(vec![8; 299])),
        ("system.posix_acl_access", Some(acl)),
        ("user.c1", Some(vec![9; 100])),
        ("user.c22", Some(vec![])),
        ("trusted.c333", Some(vec![10; 61])),
        ("user.a", Some(vec![11; 90])),
        ("user.big", None),
        ("user.c1", Some(vec![12; 1])),
        ("security.s", None),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [("default", &[][..]), ("inode128", &["-I", "128"][..]), ("1k", &["-b", "1024"][..])]
    {
        let kimg = mkfs(dir.path(), &format!("{name}-kernel"), args);
        let rimg = mkfs(dir.path(), &format!("{name}-rext4"), args);
        {
            let km = KernelMount::rw(&kimg).unwrap();
            let p = km.path().join("f");
            std::fs::write(&p, b"").unwrap();
            for (n, v) in &ops {
                match v {
                    Some(v) => xattr::set(&p, n, v).unwrap_or_else(|e| panic!("kernel set {n}: {e}")),
                    None => xattr::remove(&p, n).unwrap(),
                }
            }
            km.unmount().unwrap();
        }
        let fs = rw(&rimg);
        let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
        for (n, v) in &ops {
            match v {
                Some(v) => {
                    fs.setxattr(f, n.as_bytes(), v, 0).unwrap_or_else(|e| panic!("rext4 set {n}: {e}"))
                }
                None => fs.removexattr(f, n.as_bytes()).unwrap(),
            }
        }
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&rimg);
        e2fsck_clean(&kimg);
        let (kr, rr) = (inode_record(&kimg, "/f"), inode_record(&rimg, "/f"));
        if kr.len() > 128 {
            let extra = 128 + usize::from(u16::from_le_bytes([kr[0x80], kr[0x81]]));
            assert_eq!(&kr[0x80..0x82], &rr[0x80..0x82], "{name}: i_extra_isize");
            assert_eq!(kr[extra..], rr[extra..], "{name}: in-inode area");
        }
        let (kb, rb) = (file_acl(&kimg, "/f"), file_acl(&rimg, "/f"));
        assert!(kb != 0 && rb != 0, "{name}: both have a block");
        let (mut kd, mut rd) = (read_block(&kimg, kb), read_block(&rimg, rb));
        kd[0x10..0x14].fill(0);
        rd[0x10..0x14].fill(0);
        assert!(
            kd == rd,
            "{name}: xattr block differs:\nkernel {:02x?}\nrext4  {:02x?}",
            &kd[..128],
            &rd[..128]
        );
        // i_blocks agree too.
        assert_eq!(kr[0x1C..0x20], rr[0x1C..0x20], "{name}: i_blocks");
    }
}

/// Attributes the kernel wrote (in the inode, in blocks, shared) changed by rext4.
#[test]
fn kernel_written_attributes_modified() {
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [("default", &[][..]), ("nocsum", &["-O", "^metadata_csum"][..])] {
        let img = mkfs(dir.path(), name, args);
        {
            let km = KernelMount::rw(&img).unwrap();
            let m = km.path();
            for i in 0..4 {
                let p = m.join(format!("k{i}"));
                std::fs::write(&p, b"data").unwrap();
                xattr::set(&p, "user.small", b"in the inode").unwrap();
                xattr::set(&p, "user.big", &[b'K'; 500]).unwrap();
                xattr::set(&p, "trusted.t", b"tt").unwrap();
            }
            km.unmount().unwrap();
        }
        let before_free = {
            let fs = Fs::open(&img).unwrap();
            fs.statfs().unwrap().blocks_free
        };
        let kernel_block = file_acl(&img, "/k0");
        assert_eq!(refcount(&img, kernel_block), 4, "{name}: the kernel shared its block");
        let fs = rw(&img);
        // rext4 learns the kernel's block when reading it, and shares it.
        let _ = rext4_xattrs(&fs, "/k0");
        fs.create(fs.root(), b"r", 0o644, 0, 0).unwrap();
        set(&fs, "/r", "user.big", &[b'K'; 500]);
        set(&fs, "/r", "trusted.t", b"tt");
        assert_eq!(fs.statfs().unwrap().blocks_free, before_free, "{name}: no new block");
        // Change a shared one, replace and remove in-inode ones.
        set(&fs, "/k1", "user.big", &[b'Z'; 600]);
        set(&fs, "/k2", "user.small", b"replaced");
        fs.removexattr(ino(&fs, "/k3"), b"user.small").unwrap();
        fs.removexattr(ino(&fs, "/k3"), b"user.big").unwrap();
        let base = map(&[("user.small", b"in the inode"), ("user.big", &[b'K'; 500]), ("trusted.t", b"tt")]);
        let mut k1 = base.clone();
        k1.insert(b"user.big".to_vec(), vec![b'Z'; 600]);
        let mut k2 = base.clone();
        k2.insert(b"user.small".to_vec(), b"replaced".to_vec());
        let k3 = map(&[("trusted.t", b"tt")]);
        let r = map(&[("user.big", &[b'K'; 500]), ("trusted.t", b"tt")]);
        finish(fs, &img, &[("/k0", base), ("/k1", k1), ("/k2", k2), ("/k3", k3), ("/r", r)]);
        assert_eq!(file_acl(&img, "/r"), kernel_block);
        assert_eq!(refcount(&img, kernel_block), 3, "{name}: k0, k2, r (k1 copied, k3 dropped it)");
        // And the kernel can go on changing and removing them.
        let km = KernelMount::rw(&img).unwrap();
        for i in 0..4 {
            let p = km.path().join(format!("k{i}"));
            for n in xattr::list(&p).unwrap() {
                xattr::remove(&p, n).unwrap();
            }
        }
        std::fs::remove_file(km.path().join("r")).unwrap();
        km.unmount().unwrap();
        e2fsck_clean(&img);
    }
}

/// Inline-data files keep `system.data` (in the inode area next to the new attributes) and
/// their bytes.
#[test]
fn inline_data_files_keep_their_data() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("tiny"), b"tiny file").unwrap();
    std::fs::write(src.join("inline"), vec![b'i'; 100]).unwrap();
    let img = dir.path().join("inline.img");
    Image::ext4("32M").features("inline_data").block_size(4096).from_dir(&src).build(&img);
    let fs = rw(&img);
    let f = ino(&fs, "/inline");
    assert_ne!(fs.getattr(f).unwrap().flags & 0x1000_0000, 0, "fixture: /inline has inline data");
    set(&fs, "/inline", "user.a", b"next to system.data");
    set(&fs, "/inline", "user.big", &[b'b'; 300]);
    set(&fs, "/tiny", "user.t", b"t");
    fs.removexattr(f, b"user.a").unwrap();
    set(&fs, "/inline", "user.c", b"c");
    assert_eq!(errno(fs.setxattr(f, b"system.data", b"", 0)), libc::EOPNOTSUPP);
    assert_eq!(fs.read_file("/inline").unwrap(), vec![b'i'; 100]);
    assert_eq!(fs.read_file("/tiny").unwrap(), b"tiny file");
    let want_inline = map(&[("user.big", &[b'b'; 300]), ("user.c", b"c")]);
    finish(fs, &img, &[("/inline", want_inline), ("/tiny", map(&[("user.t", b"t")]))]);
    let km = KernelMount::ro(&img);
    if let Ok(km) = km {
        assert_eq!(std::fs::read(km.path().join("inline")).unwrap(), vec![b'i'; 100]);
        km.unmount().unwrap();
    }
}
