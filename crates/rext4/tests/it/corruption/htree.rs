//! Damaged htree (dx_root / dx_node) blocks: a linear scan or a typed error.

use super::*;

/// Lookups of a few names in `/big` all still work.
#[track_caller]
fn big_lookups_work(fs: &Fs, big: u32) {
    for i in [0, 123, 250, 499] {
        let name = format!("entry_{i:04}_padding_name");
        let a = fs.lookup(InodeNo(big), name.as_bytes()).unwrap_or_else(|e| panic!("lookup {name}: {e}"));
        assert_eq!(a.size, format!("{i}\n").len() as u64);
    }
    assert!(matches!(fs.lookup(InodeNo(big), b"entry_9999_padding_name"), Err(Error::NotFound)));
    assert_eq!(names(fs, big).unwrap().len(), 502);
}

#[test]
fn dx_root_structural_corruption_falls_back_to_linear() {
    // (offset in the root block, bytes)
    let cases: &[(usize, &[u8])] = &[
        (0x22, &[0xFF, 0x7F]),       // count > limit
        (0x22, &[0, 0]),             // count 0
        (0x20, &[0xFF, 0x7F]),       // limit beyond the block
        (0x1C, &[9]),                // hash version unknown
        (0x1E, &[5]),                // indirect levels too deep
        (0x18, &[1, 0, 0, 0]),       // reserved_zero
        (0x1D, &[4]),                // info_length
        (0x24, &[0xFF, 0xFF, 0, 0]), // first leaf pointer past the directory
        (0x10, &[0x10, 0]),          // ".." rec_len: no longer a root
    ];
    for v in [Variant::Csum4k, Variant::NoCsum4k, Variant::Ext2, Variant::Csum1k] {
        for &(off, bytes) in cases {
            let mut img = img!(v);
            let big = img.ino("/big");
            let root = img.pblk(big, 0);
            let o = img.block_off(root) + off;
            img.b[o..o + bytes.len()].copy_from_slice(bytes);
            img.fix_dx(big, root);
            let fs = img.fs();
            let ctx = format!("{v:?} root+0x{off:x}={bytes:?}");
            if img.g.metadata_csum && !dx::verify_checksum(img.block(root), img.inode_seed(big)) {
                // No room for (or no way to compute) a checksum: like the kernel, a checksum
                // error, since the block cannot be verified.
                checksum(fs.lookup(InodeNo(big), BIG_NAME), big, Some(root));
                continue;
            }
            if off == 0x10 {
                // "." and ".." must still read; the rest of the root is not an entry area.
                let _ = names(&fs, big);
                for i in [0, 250] {
                    let n = format!("entry_{i:04}_padding_name");
                    fs.lookup(InodeNo(big), n.as_bytes()).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                }
                continue;
            }
            let r = catch_unwind(AssertUnwindSafe(|| big_lookups_work(&fs, big)));
            assert!(r.is_ok(), "{ctx}: {}", r.err().map(panic_message).unwrap_or_default());
        }
    }
}

/// A root claiming one level of interior nodes over what are leaves: the "nodes" are leaf
/// blocks with valid leaf checksums. The engine may fall back to a linear scan, or report the
/// structural problem (the kernel: "directory leaf block found instead of index block",
/// EFSCORRUPTED) naming the leaf; it must not call a good leaf a checksum failure.
#[test]
fn dx_root_levels_over_leaves() {
    for v in [Variant::Csum4k, Variant::NoCsum4k, Variant::Ext2, Variant::Csum1k] {
        let mut img = img!(v);
        let big = img.ino("/big");
        let root = img.pblk(big, 0);
        let o = img.block_off(root) + 0x1E;
        img.b[o] = 1;
        img.fix_dx(big, root);
        let fs = img.fs();
        for i in [0, 123, 250, 499] {
            let name = format!("entry_{i:04}_padding_name");
            match fs.lookup(InodeNo(big), name.as_bytes()) {
                Ok(a) => assert_eq!(a.size, format!("{i}\n").len() as u64, "{v:?}"),
                Err(e) => {
                    let c = structural(Err::<(), _>(e), big);
                    assert!(c.block().is_some_and(|b| b.0 != root), "{v:?}: {c}");
                }
            }
        }
        assert_eq!(names(&fs, big).unwrap().len(), 502, "{v:?}");
    }
}

#[test]
fn dx_root_wrong_leaf_pointer() {
    // Entries pointing at the wrong leaf: the kernel would not find the name (ENOENT); any
    // answer but a panic is acceptable, and other names keep working.
    let mut img = img!(Variant::Csum4k);
    let big = img.ino("/big");
    let root = img.pblk(big, 0);
    let count = img.u16_at(img.block_off(root) + 0x22) as usize;
    for i in 0..count {
        let o = img.block_off(root) + 0x20 + 8 * i + 4;
        img.put32(o, 1);
    }
    img.fix_dx(big, root);
    let fs = img.fs();
    for i in 0..500 {
        let n = format!("entry_{i:04}_padding_name");
        let _ = fs.lookup(InodeNo(big), n.as_bytes());
    }
    assert_eq!(names(&fs, big).unwrap().len(), 502);
    // Pointing at block 0 (the root itself).
    let mut img = img!(Variant::Csum4k);
    for i in 0..count {
        let o = img.block_off(root) + 0x20 + 8 * i + 4;
        img.put32(o, 0);
    }
    img.fix_dx(big, root);
    let fs = img.fs();
    let _ = fs.lookup(InodeNo(big), BIG_NAME);
}

#[test]
fn dx_root_checksum() {
    for v in [Variant::Csum4k, Variant::Csum1k] {
        let mut img = img!(v);
        let big = img.ino("/big");
        let root = img.pblk(big, 0);
        let o = img.block_off(root) + 0x28; // hash of entry 1, checksum not updated
        img.b[o] ^= 0x01;
        let fs = img.fs();
        checksum(fs.lookup(InodeNo(big), BIG_NAME), big, Some(root));
        checksum(names(&fs, big), big, Some(root));
    }
}

#[test]
fn dx_leaf_checksum_and_structure() {
    let mut img = img!(Variant::Csum4k);
    let big = img.ino("/big");
    let leaf = img.pblk(big, 1);
    let (e, name) = img.dir_entries(leaf)[0].clone();
    img.b[e + 8] ^= 0x01;
    let fs = img.fs();
    let c = checksum(names(&fs, big), big, Some(leaf));
    block_is(&c, leaf);
    let _ = fs.lookup(InodeNo(big), &name);
    // Structural corruption in a leaf (re-checksummed): reported by readdir and by lookups
    // that read it.
    let mut img = img!(Variant::Csum4k);
    img.put16(e + 4, 0);
    img.fix_dir_leaf(big, leaf);
    let fs = img.fs();
    let c = structural(names(&fs, big), big);
    block_is(&c, leaf);
    let mut n2 = name.clone();
    n2[0] ^= 0x20; // a different name; wherever it hashes, no panic
    let _ = fs.lookup(InodeNo(big), &n2);
}

/// The two-level tree of `/huge` (1 KiB blocks, with and without metadata_csum): interior node
/// corruption falls back to a linear scan; checksum errors are reported.
#[test]
fn dx_node_corruption() {
    for v in [Variant::Ext2, Variant::Csum1k] {
        let img0 = img!(v);
        let huge = img0.ino("/huge");
        let root = img0.pblk(huge, 0);
        let node_lblk = u64::from(img0.u32_at(img0.block_off(root) + 0x24));
        let node = img0.pblk(huge, node_lblk);
        assert!(dx::parse_node(img0.block(node)).is_ok());
        let probe = |fs: &Fs, ctx: &str| {
            for i in [0, 1500, 2999] {
                let n = huge_name(i);
                fs.lookup(InodeNo(huge), n.as_bytes())
                    .unwrap_or_else(|e| panic!("{v:?} {ctx}: lookup {n}: {e}"));
            }
        };
        // count > limit, count 0, limit beyond the block: linear scan (or a checksum error where
        // the checksum cannot be computed any more); fake dirent rec_len: see below.
        let cases: &[(usize, &[u8])] =
            &[(0x0A, &[0xFF, 0x7F]), (0x0A, &[0, 0]), (0x08, &[0xFF, 0x7F]), (0x04, &[0x10, 0])];
        for &(off, bytes) in cases {
            let mut img = Img::new(img0.f);
            let o = img.block_off(node) + off;
            img.b[o..o + bytes.len()].copy_from_slice(bytes);
            img.fix_dx(huge, node);
            let fs = img.fs();
            let ctx = format!("node+0x{off:x}={bytes:?}");
            if img.g.metadata_csum && !dx::verify_checksum(img.block(node), img.inode_seed(huge)) {
                // Names under this node: a checksum error; others may still be found.
                let r = fs.lookup(InodeNo(huge), huge_name(0).as_bytes());
                if r.is_err() {
                    checksum(r, huge, Some(node));
                }
                continue;
            }
            if off == 0x04 {
                // No longer shaped like a node: the kernel reports "directory leaf block found
                // instead of index block" (EFSCORRUPTED); falling back is fine too.
                for i in [0, 1500, 2999] {
                    if let Err(e) = fs.lookup(InodeNo(huge), huge_name(i).as_bytes()) {
                        block_is(&structural(Err::<(), _>(e), huge), node);
                    }
                }
                continue;
            }
            probe(&fs, &ctx);
        }
        // Checksum: reported for the names under that node, the others still found.
        if img0.g.metadata_csum {
            let mut img = Img::new(img0.f);
            let o = img.block_off(node) + 0x10;
            img.b[o] ^= 1;
            let fs = img.fs();
            let mut bad = 0;
            for i in 0..3000 {
                if let Err(e) = fs.lookup(InodeNo(huge), huge_name(i).as_bytes()) {
                    checksum(Err::<(), _>(e), huge, Some(node));
                    bad += 1;
                }
            }
            assert!(bad > 0 && bad < 3000, "{v:?}: {bad} of 3000 lookups failed");
        }
        // Node entries pointing at the root, at themselves and past the end: no loop, no panic.
        for target in [0u32, node_lblk as u32, 0xFFFF_FFF0] {
            let mut img = Img::new(img0.f);
            let count = img.u16_at(img.block_off(node) + 0x0A) as usize;
            for i in 0..count {
                let o = img.block_off(node) + 8 + 8 * i + 4;
                img.put32(o, target);
            }
            img.fix_dx(huge, node);
            let fs = img.fs();
            for i in [0, 1500, 2999] {
                let _ = fs.lookup(InodeNo(huge), huge_name(i).as_bytes());
            }
        }
    }
}
