//! Damaged inodes: checksums, modes, link counts, sizes, extent roots, numbers.

use super::*;

#[test]
fn inode_checksum_mismatch() {
    let mut img = img!(Variant::Csum4k);
    let ino = img.ino("/small");
    let o = img.inode_off(ino) + 0x10;
    img.b[o] ^= 0xFF; // mtime, checksum not updated
    let fs = img.fs();
    checksum(fs.getattr(InodeNo(ino)), ino, None);
    checksum(fs.lookup(InodeNo(2), b"small"), ino, None);
    checksum(fs.metadata("/small"), ino, None);
    checksum(fs.read_file("/small"), ino, None);
    // Other files are unaffected.
    assert_eq!(fs.read_file("/dir1/sub/file").unwrap(), b"hello\n");
}

#[test]
fn inode_root_checksum_mismatch() {
    let mut img = img!(Variant::Csum4k);
    let o = img.inode_off(2) + 0x20;
    img.b[o] ^= 0x01;
    let fs = img.fs();
    checksum(fs.getattr(InodeNo(2)), 2, None);
    checksum(fs.metadata("/dir1"), 2, None);
}

#[test]
fn inode_mode_garbage() {
    for mode in [0u16, 0xF1A4, 0x3000 | 0o644, 0xD000] {
        let mut img = img!(Variant::Csum4k);
        let ino = img.ino("/small");
        img.inode16(ino, 0x00, mode);
        let fs = img.fs();
        let c = structural(fs.getattr(InodeNo(ino)), ino);
        message_has(&c, "file type");
        structural(fs.lookup(InodeNo(2), b"small"), ino);
        walk(&fs);
    }
    // A directory turned into a regular file and vice versa: type errors, not corruption.
    let mut img = img!(Variant::Csum4k);
    let dir1 = img.ino("/dir1");
    let small = img.ino("/small");
    img.inode16(dir1, 0x00, fi::S_IFREG | 0o644);
    img.inode16(small, 0x00, fi::S_IFDIR | 0o755);
    let fs = img.fs();
    assert!(matches!(fs.read_dir("/dir1").map(|_| ()), Err(Error::NotDir)));
    assert!(matches!(fs.metadata("/dir1/sub"), Err(Error::NotDir)));
    // Reading a "file" that holds directory blocks is allowed (it is bytes).
    let _ = fs.read_file("/dir1");
    // Readdir of a "directory" whose data is file bytes: a typed error (a checksum error with
    // metadata_csum, since file data has no directory tail; structural without).
    let c = corrupt(names(&fs, small));
    assert_eq!(c.inode(), Some(InodeNo(small)), "{c}");
    let mut img = img!(Variant::NoCsum4k);
    let small = img.ino("/small");
    img.inode16(small, 0x00, fi::S_IFDIR | 0o755);
    structural(names(&img.fs(), small), small);
    walk(&fs);
}

#[test]
fn inode_links_zero_is_deleted() {
    let mut img = img!(Variant::Csum4k);
    let ino = img.ino("/small");
    img.inode16(ino, 0x1A, 0);
    let fs = img.fs();
    message_has(&structural(fs.lookup(InodeNo(2), b"small"), ino), "deleted");
    // Entries pointing to never-used inodes.
    let mut img = img!(Variant::Csum4k);
    let blk = img.pblk(img.ino("/dir1"), 0);
    let o = img.entry_off(blk, b"a");
    let free = img.g.ipg - 2; // far past the used inodes of group 0
    img.put32(o, free);
    img.fix_dir_leaf(img.ino("/dir1"), blk);
    let fs = img.fs();
    structural(fs.metadata("/dir1/a"), free);
}

#[test]
fn inode_bad_extra_isize() {
    for v in [2u16, 3, 200, 0xFFFF] {
        let mut img = img!(Variant::Csum4k);
        let ino = img.ino("/small");
        // Checksum computation itself depends on i_extra_isize; patch and re-checksum.
        img.inode16(ino, 0x80, v);
        let fs = img.fs();
        let r = fs.getattr(InodeNo(ino));
        let c = corrupt(r);
        assert_eq!(c.inode(), Some(InodeNo(ino)), "{c}");
    }
}

#[test]
fn inode_extent_root_corrupt() {
    // (field offset in i_block, value, expected words)
    let cases: &[(usize, u16, &str)] = &[
        (0, 0xBEEF, "magic"), // eh_magic
        (2, 5, "count"),      // eh_entries > eh_max (4)
        (4, 5, "count"),      // eh_max larger than i_block holds
        (6, 6, "depth"),      // eh_depth > 5
    ];
    for v in [Variant::Csum4k, Variant::NoCsum4k] {
        for &(field, val, words) in cases {
            let mut img = img!(v);
            let ino = img.ino("/frag");
            img.inode16(ino, 0x28 + field, val);
            let fs = img.fs();
            let mut b = [0u8; 16];
            let c = structural(fs.read(InodeNo(ino), 0, &mut b), ino);
            assert_eq!(c.block(), None, "{c}");
            message_has(&c, words);
            // getattr does not need the tree.
            assert!(fs.getattr(InodeNo(ino)).is_ok());
        }
    }
    // A directory's extent root: readdir and lookup report it.
    let mut img = img!(Variant::Csum4k);
    let ino = img.ino("/dir1");
    img.inode16(ino, 0x28, 0);
    let fs = img.fs();
    structural(names(&fs, ino), ino);
    structural(fs.metadata("/dir1/a"), ino);
}

#[test]
fn inode_extent_root_pointer_out_of_range() {
    for v in [Variant::Csum4k, Variant::Csum1k] {
        let mut img = img!(v);
        let ino = img.ino("/small");
        // Leaf extent 0 of the root: ee_start_lo at i_block + 12 + 8, ee_start_hi at +6.
        img.inode32(ino, 0x28 + 12 + 8, 0xFFFF_FFF0);
        let fs = img.fs();
        let mut b = [0u8; 16];
        let c = structural(fs.read(InodeNo(ino), 0, &mut b), ino);
        block_is(&c, 0xFFFF_FFF0);
        let mut img = img!(v);
        img.inode16(ino, 0x28 + 12 + 6, 0xFFFF);
        let fs = img.fs();
        let c = structural(fs.read(InodeNo(ino), 0, &mut b), ino);
        assert!(c.block().unwrap().0 > img.g.blocks_count, "{c}");
        // An extent running off the end of the filesystem.
        let mut img = img!(v);
        let last = (img.g.blocks_count - 1) as u32;
        img.inode32(ino, 0x28 + 12 + 8, last);
        img.inode16(ino, 0x28 + 12 + 4, 8);
        let fs = img.fs();
        structural(fs.read(InodeNo(ino), 0, &mut b), ino);
        // Pointing at block 0 (the boot block / superblock).
        let mut img = img!(v);
        img.inode32(ino, 0x28 + 12 + 8, 0);
        let fs = img.fs();
        let r = fs.read(InodeNo(ino), 0, &mut b);
        if matches!(v, Variant::Csum1k | Variant::Bigalloc) {
            // Block 0 is below s_first_data_block on 1 KiB filesystems, and the boot block
            // before the superblock (in the system zone) under bigalloc.
            structural(r, ino);
        } else {
            let _ = r;
        }
    }
}

#[test]
fn inode_huge_size_file() {
    let mut img = img!(Variant::Csum4k);
    let ino = img.ino("/frag");
    img.set_size(ino, u64::MAX);
    let fs = img.fs();
    let mut b = vec![0u8; 8192];
    assert_eq!(fs.read(InodeNo(ino), 0, &mut b).unwrap(), 8192);
    assert_eq!(b[0], b'A');
    // Far beyond the last mapped block: zeros, quickly.
    for off in [1u64 << 40, (1 << 44) - 4096, u64::MAX - 8192, u64::MAX - 1] {
        let n = fs.read(InodeNo(ino), off, &mut b).unwrap();
        assert!(b[..n].iter().all(|&x| x == 0), "offset {off}");
    }
    assert_eq!(fs.getattr(InodeNo(ino)).unwrap().size, u64::MAX);
}

#[test]
fn inode_blocks_garbage() {
    for v in [Variant::Csum4k, Variant::Ext2] {
        let mut img = img!(v);
        let ino = img.ino("/small");
        img.inode32(ino, 0x1C, u32::MAX);
        img.inode16(ino, 0x74, u16::MAX);
        let f = img.inode(ino).flags();
        img.inode32(ino, 0x20, f | fi::HUGE_FILE_FL);
        let fs = img.fs();
        let a = fs.getattr(InodeNo(ino)).unwrap();
        assert!(a.blocks > 0);
        assert_eq!(fs.read_file("/small").unwrap(), b"small file\n");
        // A symlink whose block count says "slow" but whose target is in i_block.
        let mut img = img!(v);
        let ino = img.ino("/fastlink");
        img.inode32(ino, 0x1C, 8);
        let fs = img.fs();
        let _ = fs.readlink(InodeNo(ino));
        walk(&fs);
    }
}

/// A number no inode can have, passed by the caller: a stale handle (`ESTALE`, as the
/// kernel answers a file handle naming one), not damage to the image.
#[test]
fn inode_number_out_of_range() {
    let img = img!(Variant::Csum4k);
    let fs = img.fs();
    for ino in [0u32, img.g.inodes_count + 1, u32::MAX] {
        assert_eq!(fs.getattr(InodeNo(ino)).unwrap_err().errno(), libc::ESTALE);
        assert_eq!(fs.readdir(InodeNo(ino), 0, |_| true).unwrap_err().errno(), libc::ESTALE);
        let mut b = [0u8; 4];
        assert_eq!(fs.read(InodeNo(ino), 0, &mut b).unwrap_err().errno(), libc::ESTALE);
        assert_eq!(fs.listxattr(InodeNo(ino)).unwrap_err().errno(), libc::ESTALE);
    }
}

/// The encrypted flag on an inode without an encryption context: damage (`EUCLEAN`), not a
/// file without its key.
#[test]
fn inode_encrypted_flag_without_context_is_corrupt() {
    let mut img = img!(Variant::Csum4k);
    let ino = img.ino("/dir1");
    let f = img.inode(ino).flags();
    img.inode32(ino, 0x20, f | fi::ENCRYPT_FL);
    let fs = img.fs();
    assert_eq!(fs.readdir(InodeNo(ino), 0, |_| true).unwrap_err().errno(), libc::EUCLEAN);
    assert_eq!(fs.read_dir("/dir1").unwrap().next().unwrap().unwrap_err().errno(), libc::EUCLEAN);
    assert_eq!(fs.lookup(InodeNo(ino), b"a").unwrap_err().errno(), libc::EUCLEAN);
}

/// Every byte of a few inodes (root, directories, indexed directory, files with extent trees,
/// block maps and inline data, symlinks) set to hostile values (re-checksummed).
#[test]
fn inode_field_sweep() {
    run_cases(test_path!("inode_field_sweep"), Duration::from_secs(5), || {
        let mut cases = Vec::new();
        for v in [Variant::Csum4k, Variant::Ext2, Variant::Inline] {
            let Some(f) = fixture(v) else { return cases };
            let img = Img::new(f);
            for path in [
                "/",
                "/frag",
                "/big",
                "/small",
                "/fastlink",
                "/slowlink",
                "/dir1",
                "/medium",
                "/dir1/sub/file",
            ] {
                let ino = if path == "/" { 2 } else { img.ino(path) };
                let off = img.inode_off(ino);
                let orig = img.inode_raw(ino);
                for field in 0..orig.len().min(176) {
                    for val in [0x00u8, 0xFF, 0x80, 0x01] {
                        if orig[field] == val {
                            continue;
                        }
                        let mut rec = orig.to_vec();
                        rec[field] = val;
                        if img.g.metadata_csum {
                            fix_inode_record(&mut rec, ino, img.g.csum_seed);
                        }
                        let desc = format!("{path} (inode {ino}) byte 0x{field:x} = {val:#x}");
                        cases.push(Case { desc, variant: v, patches: vec![(off, rec)], full: false });
                    }
                }
            }
        }
        cases
    });
}
