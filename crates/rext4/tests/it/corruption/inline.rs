//! Damaged inline data: files and directories kept in the inode.

use super::*;

/// kernel (truncate can extend an inline file), bounded by the caller's buffer even for a huge
/// size.
#[test]
fn inline_file_size_beyond_data() {
    let mut img = img!(Variant::Inline);
    let ino = img.ino("/dir1/sub/file");
    img.set_size(ino, 61);
    let fs = img.fs();
    let mut b = [0xAAu8; 128];
    assert_eq!(fs.read(InodeNo(ino), 0, &mut b).unwrap(), 61);
    assert_eq!(&b[..6], b"hello\n");
    assert!(b[6..61].iter().all(|&x| x == 0));
    let mut img = img!(Variant::Inline);
    img.set_size(ino, u64::MAX);
    let fs = img.fs();
    assert_eq!(fs.read(InodeNo(ino), 0, &mut b).unwrap(), 128);
    assert_eq!(fs.read(InodeNo(ino), u64::MAX - 5, &mut b).unwrap(), 5);
    assert_eq!(fs.read(InodeNo(ino), 1 << 40, &mut b).unwrap(), 128);
    assert!(b.iter().all(|&x| x == 0));
    // /medium keeps 40 of its 100 bytes in system.data.
    let mut img = img!(Variant::Inline);
    let m = img.ino("/medium");
    img.set_size(m, 101);
    let fs = img.fs();
    assert_eq!(fs.read(InodeNo(m), 0, &mut b).unwrap(), 101);
    assert!(b[..100].iter().all(|&x| x == b'm') && b[100] == 0);
}

#[test]
fn inline_system_data_corrupt() {
    let img0 = img!(Variant::Inline);
    let m = img0.ino("/medium");
    let (e, _) = img0.ibody_xattr(m, fx::INDEX_SYSTEM, b"data");
    let field = e - img0.inode_off(m);
    for (off, bytes) in [(2usize, &[0xF0u8, 0x00][..]), (8, &[0xFF, 0, 0, 0][..]), (0, &[0xFF][..])] {
        let mut img = Img::new(img0.f);
        img.inode_put(m, field + off, bytes);
        let fs = img.fs();
        let mut b = [0u8; 128];
        structural(fs.read(InodeNo(m), 0, &mut b), m);
    }
    // system.data missing (renamed): the bytes past i_block read as zeros up to i_size, as in
    // the kernel.
    let mut img = Img::new(img0.f);
    img.inode_put(m, field + 16, b"date");
    let fs = img.fs();
    let mut b = [0u8; 128];
    assert_eq!(fs.read(InodeNo(m), 0, &mut b).unwrap(), 100);
    assert!(b[..60].iter().all(|&x| x == b'm') && b[60..100].iter().all(|&x| x == 0));
}

#[test]
fn inline_dir_corrupt() {
    let img0 = img!(Variant::Inline);
    let d = img0.ino("/dir1");
    let fs = img0.fs();
    assert!(names(&fs, d).unwrap().contains(&b"sub".to_vec()));
    // Bad parent.
    for parent in [0u32, img0.g.inodes_count + 1] {
        let mut img = Img::new(img0.f);
        img.inode32(d, 0x28, parent);
        let fs = img.fs();
        message_has(&structural(names(&fs, d), d), "parent");
        structural(fs.lookup(InodeNo(d), b"sub"), d);
    }
    // First entry's rec_len garbage / name_len too long.
    for (off, bytes) in [
        (4usize, &[0u8, 0][..]),
        (4, &[0xF0, 0x00][..]),
        (6, &[0xFF][..]),
        (0, &[0xFF, 0xFF, 0xFF, 0x7F][..]),
    ] {
        let mut img = Img::new(img0.f);
        img.inode_put(d, 0x28 + 4 + off, bytes);
        let fs = img.fs();
        let c = structural(names(&fs, d), d);
        assert_eq!(c.block(), None, "{c}");
        structural(fs.lookup(InodeNo(d), b"sub"), d);
    }
    // Size smaller than the parent pointer, larger than the inline area.
    for size in [0u64, 3, 61, 1 << 40] {
        let mut img = Img::new(img0.f);
        img.set_size(d, size);
        let fs = img.fs();
        structural(names(&fs, d), d);
    }
}

#[test]
fn inline_flag_without_feature() {
    let mut img = img!(Variant::Csum4k);
    let ino = img.ino("/small");
    let f = img.inode(ino).flags();
    img.inode32(ino, 0x20, f | fi::INLINE_DATA_FL);
    let d = img.ino("/dir1");
    let f = img.inode(d).flags();
    img.inode32(d, 0x20, f | fi::INLINE_DATA_FL);
    let fs = img.fs();
    let mut b = [0u8; 16];
    message_has(&structural(fs.read(InodeNo(ino), 0, &mut b), ino), "inline");
    structural(names(&fs, d), d);
    structural(fs.lookup(InodeNo(d), b"a"), d);
}
