//! Damaged directory leaf blocks: entries, checksums, sizes, cycles.

use super::*;

/// `/dir1`'s inode, its first block, and the offset of the entry `a` in it.
fn dir1(img: &Img) -> (u32, u64, usize) {
    let ino = img.ino("/dir1");
    let blk = img.pblk(ino, 0);
    (ino, blk, img.entry_off(blk, b"a"))
}

#[test]
fn dir_entry_structure() {
    // (field, bytes, expected words)
    let cases: &[(usize, &[u8], &str)] = &[
        (4, &[0, 0], "rec_len"),                 // rec_len 0
        (4, &[13, 0], "rec_len"),                // unaligned
        (4, &[8, 0], "rec_len"),                 // smaller than any entry
        (4, &[0xFC, 0x7F], "overrun"),           // past the block
        (6, &[255], "name_len"),                 // name longer than rec_len
        (0, &[0xFF, 0xFF, 0xFF, 0x7F], "inode"), // inode number out of range
    ];
    for v in [Variant::Csum4k, Variant::NoCsum4k, Variant::Ext2, Variant::Csum1k] {
        for &(field, bytes, words) in cases {
            let mut img = img!(v);
            let (ino, blk, e) = dir1(&img);
            img.b[e + field..e + field + bytes.len()].copy_from_slice(bytes);
            img.fix_dir_leaf(ino, blk);
            let fs = img.fs();
            let c = structural(names(&fs, ino), ino);
            block_is(&c, blk);
            message_has(&c, words);
            let c = structural(fs.lookup(InodeNo(ino), b"sub"), ino);
            block_is(&c, blk);
            assert_eq!(Error::Corrupt(c).errno(), EUCLEAN);
        }
    }
}

#[test]
fn dir_leaf_checksum() {
    for v in [Variant::Csum4k, Variant::Csum1k] {
        let mut img = img!(v);
        let (ino, blk, e) = dir1(&img);
        img.b[e + 8] ^= 0x20; // the name "a" -> "A", checksum not updated
        let fs = img.fs();
        checksum(names(&fs, ino), ino, Some(blk));
        checksum(fs.lookup(InodeNo(ino), b"a"), ino, Some(blk));
        // A leaf without a tail on a metadata_csum filesystem.
        let mut img = img!(v);
        let (ino, blk, _) = dir1(&img);
        let end = img.block_off(blk) + img.g.bs;
        img.b[end - 12..end].fill(0);
        let fs = img.fs();
        checksum(names(&fs, ino), ino, Some(blk));
    }
}

#[test]
fn dir_size_beyond_blocks_reads_holes() {
    // A directory whose size claims more blocks than are mapped: the missing ones are holes.
    let mut img = img!(Variant::Csum4k);
    let (ino, _, _) = dir1(&img);
    let bs = img.g.bs as u64;
    img.set_size(ino, bs * 4);
    let fs = img.fs();
    let n = names(&fs, ino).unwrap();
    assert!(n.contains(&b"a".to_vec()));
    assert!(matches!(fs.lookup(InodeNo(ino), b"zzz"), Err(Error::NotFound)));
}

/// A directory whose i_size is huge but whose blocks are mostly holes must not make readdir or
/// lookup step through 2^32 logical blocks one by one (the kernel skips holes by the mapped
/// length).
#[test]
fn dir_huge_size_terminates() {
    isolated(test_path!("dir_huge_size_terminates"), Duration::from_secs(15), || {
        for size in [1u64 << 44, u64::MAX] {
            let mut img = img!(Variant::Csum4k);
            let (ino, _, _) = dir1(&img);
            img.set_size(ino, size);
            let fs = img.fs();
            let t = Instant::now();
            let r = names(&fs, ino);
            eprintln!("size {size:#x}: readdir {:?} in {:?}", r.as_ref().map(|v| v.len()), t.elapsed());
            assert!(r.unwrap().contains(&b"a".to_vec()));
            let t = Instant::now();
            let r = fs.lookup(InodeNo(ino), b"no-such-name");
            eprintln!("size {size:#x}: lookup {:?} in {:?}", r.as_ref().map(|a| a.ino), t.elapsed());
            assert!(matches!(r, Err(Error::NotFound)));
            assert_eq!(fs.lookup(InodeNo(ino), b"a").unwrap().size, 2);
        }
    });
}

#[test]
fn dir_entry_to_bad_inodes() {
    let mut img = img!(Variant::Csum4k);
    let (ino, blk, e) = dir1(&img);
    img.put32(e, img.g.inodes_count + 1);
    img.fix_dir_leaf(ino, blk);
    let fs = img.fs();
    message_has(&structural(names(&fs, ino), ino), "inode");
    // The journal inode (8) is not a directory entry a user should reach, but it is valid to
    // stat; a name pointing at inode 1 (bad blocks inode, links 0) is a deleted inode.
    let mut img = img!(Variant::Csum4k);
    let (ino, blk, e) = dir1(&img);
    img.put32(e, 1);
    img.fix_dir_leaf(ino, blk);
    let fs = img.fs();
    let c = corrupt(fs.metadata("/dir1/a"));
    assert_eq!(c.inode(), Some(InodeNo(1)), "{c}");
}

/// A directory entry pointing at the directory itself or its parent: no infinite recursion in
/// path resolution (which is iterative) and the walk terminates.
#[test]
fn dir_entry_cycles() {
    let mut img = img!(Variant::Csum4k);
    let (ino, blk, e) = dir1(&img);
    img.put32(e, 2);
    img.b[e + 7] = 2; // file type: directory
    img.fix_dir_leaf(ino, blk);
    let fs = img.fs();
    assert_eq!(fs.resolve("/dir1/a/dir1/a/dir1/a/dir1", true).unwrap(), InodeNo(ino));
    walk(&fs);
}
