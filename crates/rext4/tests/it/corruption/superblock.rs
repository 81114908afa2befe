//! Damaged superblocks: refused with the field named, or opened read-only.

use super::*;

#[test]
fn sb_bad_magic_is_refused() {
    let mut img = img!(Variant::Csum4k);
    img.sb16(0x38, 0x1234);
    incompatible(img.open(), "magic");
}

#[test]
fn sb_checksum_mismatch() {
    let mut img = img!(Variant::Csum4k);
    img.b[SB + 0x78] ^= 0x55; // volume name, checksum not updated
    let c = corrupt(img.open());
    assert!(c.is_checksum(), "{c}");
    assert_eq!(c.inode(), None);
    assert_eq!(Error::Corrupt(c).errno(), EBADMSG);
}

#[test]
fn sb_log_block_size_out_of_range() {
    for v in [7u32, 31, u32::MAX] {
        let mut img = img!(Variant::Csum4k);
        img.sb32(0x18, v);
        img.sb32(0x1C, v); // cluster size alike, so the block size check is the one that fires
        message_has(&sb_corrupt(img.open()), "block size");
    }
    // A different but valid block size: geometry no longer matches the device or the groups.
    let mut img = img!(Variant::Csum4k);
    img.sb32(0x18, 4);
    img.sb32(0x1C, 4);
    assert!(img.open().is_err());
}

#[test]
fn sb_counts_out_of_range() {
    // blocks_count beyond the device.
    let mut img = img!(Variant::Csum4k);
    img.sb32(0x04, u32::MAX);
    incompatible(img.open(), "exceeds the device");
    // blocks_count 0.
    let mut img = img!(Variant::Csum4k);
    img.sb32(0x04, 0);
    sb_corrupt(img.open());
    // inodes_count not groups x inodes_per_group.
    let mut img = img!(Variant::Csum4k);
    let n = img.u32_at(SB);
    img.sb32(0x00, n + 1);
    message_has(&sb_corrupt(img.open()), "inode count");
    // first_data_block wrong for the block size.
    let mut img = img!(Variant::Csum4k);
    img.sb32(0x14, 1);
    message_has(&sb_corrupt(img.open()), "first data block");
    // blocks_per_group 0 and too many.
    for v in [0u32, 4096 * 8 + 1] {
        let mut img = img!(Variant::Csum4k);
        img.sb32(0x20, v);
        img.sb32(0x24, v);
        message_has(&sb_corrupt(img.open()), "blocks per group");
    }
}

#[test]
fn sb_inodes_per_group_out_of_range() {
    for v in [0u32, 1, 4096 * 8 + 1, u32::MAX] {
        let mut img = img!(Variant::Csum4k);
        img.sb32(0x28, v);
        sb_corrupt(img.open());
    }
    // Valid-looking but inconsistent with the inode count.
    let mut img = img!(Variant::Csum4k);
    let ipg = img.u32_at(SB + 0x28);
    img.sb32(0x28, ipg / 2);
    message_has(&sb_corrupt(img.open()), "inode count");
}

#[test]
fn sb_inode_size_and_first_ino() {
    for v in [0u16, 100, 129, 384, 8192, u16::MAX] {
        let mut img = img!(Variant::Csum4k);
        img.sb16(0x58, v);
        message_has(&sb_corrupt(img.open()), "inode size");
    }
    for v in [0u32, 5, u32::MAX] {
        let mut img = img!(Variant::Csum4k);
        img.sb32(0x54, v);
        message_has(&sb_corrupt(img.open()), "first inode");
    }
}

#[test]
fn sb_desc_size_out_of_range() {
    for v in [0u16, 32, 48, 65, 96, 2048, u16::MAX] {
        let mut img = img!(Variant::Csum4k);
        img.sb16(0xFE, v);
        message_has(&sb_corrupt(img.open()), "descriptor size");
    }
}

#[test]
fn sb_unknown_incompat_feature_is_refused_by_name() {
    let mut img = img!(Variant::Csum4k);
    let f = img.u32_at(SB + 0x60);
    img.sb32(0x60, f | 1 << 31);
    incompatible(img.open(), "FEATURE_I31");
    // Known to e2fsprogs but not implemented: named by its real name.
    let mut img = img!(Variant::Csum4k);
    img.sb32(0x60, f | 0x1000);
    incompatible(img.open(), "dirdata");
    let mut img = img!(Variant::Csum4k);
    img.sb32(0x60, f | 0x0001);
    incompatible(img.open(), "compression");
}

#[test]
fn sb_unknown_ro_compat_feature_opens_read_only() {
    let mut img = img!(Variant::Csum4k);
    let f = img.u32_at(SB + 0x64);
    img.sb32(0x64, f | 1 << 30);
    let fs = img.fs();
    let why = fs.read_only_reasons();
    assert!(!why.is_empty());
    assert!(why.iter().any(|r| r.contains("FEATURE_R30")), "{why:?}");
    // Still readable.
    assert_eq!(fs.read_file("/dir1/sub/file").unwrap(), b"hello\n");
}

/// bigalloc's geometry is checked as the kernel's `ext4_handle_clustersize` checks it.
#[test]
fn sb_bigalloc_geometry() {
    let img = img!(Variant::Bigalloc);
    assert!(img.fs().read_only_reasons().is_empty());
    let dev = Arc::new(MemDevice::new(img.b.clone()));
    Fs::from_device(dev, Options { writable: true, ..Options::default() }).unwrap();
    // A block count that is not whole clusters: read-only, saying why.
    let mut img = img!(Variant::Bigalloc);
    let n = img.u32_at(SB + 0x04);
    img.sb32(0x04, n - 1);
    let why = img.fs().read_only_reasons().to_vec();
    assert!(why.iter().any(|r| r.contains("whole number of clusters")), "{why:?}");
    // Clusters smaller than blocks.
    let mut img = img!(Variant::Bigalloc);
    img.sb32(0x1C, 0);
    img.sb32(0x18, 1);
    message_has(&sb_corrupt(img.open()), "smaller than block size");
    // Clusters of one block: then blocks and clusters per group must be equal.
    let mut img = img!(Variant::Bigalloc);
    img.sb32(0x1C, 0);
    message_has(&sb_corrupt(img.open()), "inconsistent");
    // Clusters per group: zero, more than a bitmap holds, not blocks per group / ratio.
    for v in [0u32, 1024 * 8 + 1, 8191] {
        let mut img = img!(Variant::Bigalloc);
        img.sb32(0x24, v);
        message_has(&sb_corrupt(img.open()), "clusters per group");
    }
    // Clusters over 1 GiB.
    let mut img = img!(Variant::Bigalloc);
    img.sb32(0x1C, 21);
    message_has(&sb_corrupt(img.open()), "cluster size out of range");
    // Without extents the kernel refuses the filesystem.
    let mut img = img!(Variant::Bigalloc);
    let f = img.u32_at(SB + 0x60);
    img.sb32(0x60, f & !0x40);
    incompatible(img.open(), "extent");
    // A first data block neither 0 nor 1.
    let mut img = img!(Variant::Bigalloc);
    img.sb32(0x14, 2);
    message_has(&sb_corrupt(img.open()), "first data block");
    // 1, which the kernel takes: read-only here, clusters being counted from block 0.
    let mut img = img!(Variant::Bigalloc);
    img.sb32(0x14, 1);
    let why = img.fs().read_only_reasons().to_vec();
    assert!(why.iter().any(|r| r.contains("first data block")), "{why:?}");
}

#[test]
fn sb_needs_recovery_with_an_empty_log_opens_and_journal_device_is_refused() {
    let mut img = img!(Variant::Csum4k);
    let f = img.u32_at(SB + 0x60);
    img.sb32(0x60, f | 0x4);
    // Journal recovery runs at open (the `recovery` tests); an empty log replays nothing.
    let fs = img.open().unwrap();
    assert_eq!(fs.recovery().map(|r| r.transactions), Some(0));
    let mut img = img!(Variant::Csum4k);
    img.sb32(0x60, f | 0x8);
    incompatible(img.open(), "journal device");
}

#[test]
fn sb_metadata_csum_with_uninit_bg_or_bad_type() {
    let mut img = img!(Variant::Csum4k);
    let f = img.u32_at(SB + 0x64);
    img.sb32(0x64, f | 0x10);
    sb_corrupt(img.open());
    let mut img = img!(Variant::Csum4k);
    img.b[SB + 0x175] = 7;
    img.fix_sb();
    message_has(&sb_corrupt(img.open()), "checksum type");
}

#[test]
fn device_too_small() {
    let img = img!(Variant::Csum4k);
    for len in [0usize, 1024, 2047, 4096, 1 << 20] {
        let r = open_bytes(img.b[..len].to_vec());
        assert!(matches!(r, Err(Error::Incompatible(_))), "len {len}: {:?}", r.err());
    }
}

/// Every 32-bit word of the superblock set to a few hostile values (re-checksummed), on a
/// 4 KiB metadata_csum image and a 1 KiB ext2 image: open fails cleanly or the image reads
/// without panicking or hanging.
#[test]
fn sb_field_sweep() {
    run_cases(test_path!("sb_field_sweep"), Duration::from_secs(5), || {
        let mut cases = Vec::new();
        for v in [Variant::Csum4k, Variant::Ext2, Variant::Bigalloc] {
            let Some(f) = fixture(v) else { return cases };
            let img = Img::new(f);
            let orig = &img.b[SB..SB + 1024];
            for word in 0..(0x3FC / 4) {
                for val in [0u32, 1, 0xFFFF_FFFF, 0x8000_0000, 0x0000_FFFF] {
                    let mut sb = orig.to_vec();
                    sb[4 * word..4 * word + 4].copy_from_slice(&val.to_le_bytes());
                    if img.g.metadata_csum {
                        let c = crc32c(!0, &sb[..0x3FC]);
                        sb[0x3FC..].copy_from_slice(&c.to_le_bytes());
                    }
                    let desc = format!("sb word 0x{:x} = {val:#x}", 4 * word);
                    cases.push(Case { desc, variant: v, patches: vec![(SB, sb)], full: false });
                }
            }
        }
        cases
    });
}
