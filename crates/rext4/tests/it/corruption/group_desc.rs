//! Damaged group descriptors: the group is named.

use super::*;

#[test]
fn gd_checksum_mismatch_names_group() {
    for v in [Variant::Csum4k, Variant::NoCsum4k] {
        let mut img = img!(v);
        let o = img.gd_off(0) + 0x0C;
        img.b[o] ^= 1; // free blocks count, checksum not updated
        let c = corrupt(img.open());
        assert!(c.is_checksum(), "{v:?}: {c}");
        assert_eq!(c.group(), Some(0), "{v:?}: {c}");
    }
}

#[test]
fn gd_inode_table_out_of_range() {
    for v in [Variant::Csum4k, Variant::NoCsum4k, Variant::Ext2] {
        // (Block 1, the descriptor block itself, is accepted read-only, as by the kernel.)
        for bad in [0u32, 0x00FF_FFFF, u32::MAX] {
            let mut img = img!(v);
            let o = img.gd_off(0) + 0x08;
            img.put32(o, bad);
            img.fix_gd(0);
            let c = corrupt(img.open());
            assert!(!c.is_checksum(), "{v:?}: {c}");
            assert_eq!(c.group(), Some(0), "{v:?}: {c}");
            message_has(&c, "inode table");
        }
        // Straddling the end of the filesystem.
        let mut img = img!(v);
        let o = img.gd_off(0) + 0x08;
        let last = (img.g.blocks_count - 2) as u32;
        img.put32(o, last);
        img.fix_gd(0);
        let c = corrupt(img.open());
        assert_eq!(c.group(), Some(0), "{v:?}: {c}");
    }
}

#[test]
fn gd_bitmaps_and_counts() {
    for (field, words) in [(0x00usize, "block bitmap"), (0x04, "inode bitmap")] {
        for bad in [0u32, u32::MAX] {
            let mut img = img!(Variant::Csum4k);
            let o = img.gd_off(0) + field;
            img.put32(o, bad);
            img.fix_gd(0);
            let c = corrupt(img.open());
            assert_eq!(c.group(), Some(0), "{c}");
            message_has(&c, words);
        }
    }
    let mut img = img!(Variant::Csum4k);
    let o = img.gd_off(0) + 0x0E;
    img.put16(o, u16::MAX);
    img.fix_gd(0);
    assert_eq!(corrupt(img.open()).group(), Some(0));
}

/// A descriptor claiming its inode table is unused reads inodes as free: entries pointing at
/// them are "deleted inode referenced", not garbage.
#[test]
fn gd_itable_unused_hides_inodes() {
    let mut img = img!(Variant::Csum4k);
    let ipg = img.g.ipg;
    let o = img.gd_off(0) + 0x1C;
    img.put16(o, (ipg - 1) as u16);
    let o = img.gd_off(0) + 0x32;
    img.put16(o, 0);
    img.fix_gd(0);
    let fs = img.fs();
    // Root (inode 2) now lies in the "unused" part: reads as a zeroed inode.
    let r = fs.getattr(InodeNo(2));
    structural(r, 2);
    assert!(walk(&fs) < 10);
}

/// Every 16-bit word of the first descriptor set to hostile values (re-checksummed).
#[test]
fn gd_field_sweep() {
    run_cases(test_path!("gd_field_sweep"), Duration::from_secs(5), || {
        let mut cases = Vec::new();
        for v in [Variant::Csum4k, Variant::NoCsum4k, Variant::Ext2] {
            let Some(f) = fixture(v) else { return cases };
            let img = Img::new(f);
            let ds = img.g.desc_size;
            for word in 0..ds / 2 {
                for val in [0u16, 1, 0xFFFF, 0x8000, 0x00FF] {
                    let mut p = Img::new(f);
                    let o = p.gd_off(0);
                    p.put16(o + 2 * word, val);
                    p.fix_gd(0);
                    let desc = format!("gd0 word 0x{:x} = {val:#x}", 2 * word);
                    let patches = vec![(o, p.b[o..o + ds].to_vec())];
                    cases.push(Case { desc, variant: v, patches, full: false });
                }
            }
        }
        cases
    });
}
