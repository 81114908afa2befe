//! Damaged extended attributes: blocks, in-inode entries, ACLs, EA inodes.

use super::*;

fn xattr_block(img: &Img) -> (u32, u64) {
    let ino = img.ino("/small");
    (ino, img.inode(ino).file_acl())
}

#[test]
fn xattr_block_header() {
    for v in [Variant::Csum4k, Variant::NoCsum4k, Variant::Ext2] {
        for (field, val) in [(0usize, 0xEA01_0000u32), (8, 2), (8, 0)] {
            let mut img = img!(v);
            let (ino, blk) = xattr_block(&img);
            let o = img.block_off(blk) + field;
            img.put32(o, val);
            img.fix_xattr_block(blk);
            let fs = img.fs();
            let c = structural(fs.listxattr(InodeNo(ino)), ino);
            block_is(&c, blk);
            structural(fs.getxattr(InodeNo(ino), b"user.big"), ino);
            // The in-inode attribute is read first, but the whole set is checked.
            let _ = fs.getxattr(InodeNo(ino), b"user.tiny");
            // Data is unaffected.
            assert_eq!(fs.read_file("/small").unwrap(), b"small file\n");
        }
    }
}

#[test]
fn xattr_block_entries() {
    // (offset in the first entry, bytes, expected words)
    let cases: &[(usize, &[u8], &str)] = &[
        (2, &[0xF0, 0x0F], "value"),             // e_value_offs past the block
        (2, &[0x00, 0x00], "value"),             // value overlapping the entries
        (8, &[0xFF, 0xFF, 0xFF, 0x0F], "value"), // e_value_size huge
    ];
    for v in [Variant::Csum4k, Variant::NoCsum4k, Variant::Ext2] {
        for &(off, bytes, words) in cases {
            let mut img = img!(v);
            let (ino, blk) = xattr_block(&img);
            let e = img.block_off(blk) + fx::BLOCK_HEADER_SIZE + off;
            img.b[e..e + bytes.len()].copy_from_slice(bytes);
            img.fix_xattr_block(blk);
            let fs = img.fs();
            let c = structural(fs.listxattr(InodeNo(ino)), ino);
            block_is(&c, blk);
            message_has(&c, words);
            structural(fs.getxattr(InodeNo(ino), b"user.big"), ino);
        }
        // A name running over the next entry (still inside the area and before the values, as
        // the kernel checks): the set reads, with a garbage name.
        let mut img = img!(v);
        let (ino, blk) = xattr_block(&img);
        let e = img.block_off(blk) + fx::BLOCK_HEADER_SIZE;
        img.b[e] = 0xFF;
        img.fix_xattr_block(blk);
        let _ = img.fs().listxattr(InodeNo(ino));
        // No terminator: entries filling the block.
        let mut img = img!(v);
        let (ino, blk) = xattr_block(&img);
        let o = img.block_off(blk) + fx::BLOCK_HEADER_SIZE;
        let n = img.g.bs - fx::BLOCK_HEADER_SIZE;
        for i in (0..n).step_by(4) {
            img.b[o + i..o + i + 4].copy_from_slice(&[4, 1, 0, 0]);
        }
        img.fix_xattr_block(blk);
        let fs = img.fs();
        structural(fs.listxattr(InodeNo(ino)), ino);
    }
}

#[test]
fn xattr_block_checksum() {
    let mut img = img!(Variant::Csum4k);
    let (ino, blk) = xattr_block(&img);
    let o = img.block_off(blk) + img.g.bs - 1;
    img.b[o] ^= 1;
    let fs = img.fs();
    checksum(fs.listxattr(InodeNo(ino)), ino, Some(blk));
    checksum(fs.getxattr(InodeNo(ino), b"user.big"), ino, Some(blk));
}

#[test]
fn xattr_block_pointer_out_of_range() {
    for v in [Variant::Csum4k, Variant::Ext2] {
        let mut img = img!(v);
        let ino = img.ino("/small");
        img.inode32(ino, 0x68, 0xFFFF_FFF0);
        let fs = img.fs();
        let c = structural(fs.listxattr(InodeNo(ino)), ino);
        block_is(&c, 0xFFFF_FFF0);
        // Pointing at a block of another kind (the root directory's first block).
        let mut img = img!(v);
        let root_blk = img.pblk(2, 0);
        img.inode32(ino, 0x68, root_blk as u32);
        let fs = img.fs();
        let c = structural(fs.listxattr(InodeNo(ino)), ino);
        block_is(&c, root_blk);
        // ...and the directory still reads afterwards (the block is re-checked as a leaf).
        assert!(names(&fs, 2).is_ok());
    }
}

#[test]
fn xattr_in_inode_corrupt() {
    for v in [Variant::Csum4k, Variant::NoCsum4k] {
        let cases: &[(usize, &[u8], &str)] = &[
            (0, &[0xFF], "past the end"),      // e_name_len
            (2, &[0xF0, 0x00], "value"),       // value offset past the inode
            (8, &[0xFF, 0x00, 0, 0], "value"), // value size past the inode
        ];
        for &(off, bytes, words) in cases {
            let mut img = img!(v);
            let ino = img.ino("/small");
            let (e, _) = img.ibody_xattr(ino, fx::INDEX_USER, b"tiny");
            let field = e - img.inode_off(ino) + off;
            img.inode_put(ino, field, bytes);
            let fs = img.fs();
            let c = structural(fs.listxattr(InodeNo(ino)), ino);
            assert_eq!(c.block(), None, "{c}");
            message_has(&c, words);
        }
    }
}

#[test]
fn xattr_malformed_acl() {
    // Turn user.tiny into system.posix_acl_access (empty name, so the entry shrinks and a
    // terminator follows it) whose value "abc" is no ACL.
    let mut img = img!(Variant::Csum4k);
    let ino = img.ino("/small");
    let (e, _) = img.ibody_xattr(ino, fx::INDEX_USER, b"tiny");
    let field = e - img.inode_off(ino);
    img.inode_put(ino, field, &[0, fx::INDEX_POSIX_ACL_ACCESS]);
    img.inode_put(ino, field + 16, &[0, 0, 0, 0]);
    let fs = img.fs();
    let c = structural(fs.getxattr(InodeNo(ino), b"system.posix_acl_access"), ino);
    message_has(&c, "ACL");
}

#[test]
fn xattr_ea_inode_value_corrupt() {
    let img0 = img!(Variant::Inline);
    let ino = img0.ino("/medium");
    let (e, _) = img0.ibody_xattr(ino, fx::INDEX_USER, b"huge");
    let field = e - img0.inode_off(ino);
    let vino = u32::from_le_bytes(img0.inode_raw(ino)[field + 4..field + 8].try_into().unwrap());
    assert_ne!(vino, 0);
    // Value inode number out of range, pointing at a non-EA inode, size mismatch.
    for bad in [img0.g.inodes_count + 5, 2, img0.ino("/small")] {
        let mut img = Img::new(img0.f);
        img.inode_put(ino, field + 4, &bad.to_le_bytes());
        let fs = img.fs();
        let c = corrupt(fs.getxattr(InodeNo(ino), b"user.huge"));
        assert!(c.inode() == Some(InodeNo(ino)) || c.inode() == Some(InodeNo(bad)), "{c}");
    }
    let mut img = Img::new(img0.f);
    img.inode_put(ino, field + 8, &100_000u32.to_le_bytes());
    let fs = img.fs();
    structural(fs.getxattr(InodeNo(ino), b"user.huge"), ino);
    let mut img = Img::new(img0.f);
    img.inode_put(ino, field + 8, &4095u32.to_le_bytes());
    let fs = img.fs();
    structural(fs.getxattr(InodeNo(ino), b"user.huge"), ino);
    // The EA inode's own extent tree broken.
    let mut img = Img::new(img0.f);
    img.inode16(vino, 0x28, 0);
    let fs = img.fs();
    structural(fs.getxattr(InodeNo(ino), b"user.huge"), vino);
}

/// Attribute values that "live in" an EA inode which is the inode itself, or an inline EA inode
/// whose own `system.data` points back: typed errors or values, never unbounded recursion.
/// Runs in a child process because a stack overflow aborts.
#[test]
fn xattr_ea_inode_cycles() {
    isolated(test_path!("xattr_ea_inode_cycles"), Duration::from_secs(60), || {
        let img0 = img!(Variant::Inline);
        let small = img0.ino("/small");
        let (e, _) = img0.ibody_xattr(small, fx::INDEX_USER, b"tiny");
        let field = e - img0.inode_off(small);
        // The value inode is the inode itself.
        let mut img = Img::new(img0.f);
        img.inode_put(small, field + 4, &small.to_le_bytes());
        img.inode_put(small, field + 8, &11u32.to_le_bytes());
        structural(img.fs().getxattr(InodeNo(small), b"user.tiny"), small);
        // /small's value is in /dir1/sub/file, made an inline EA inode whose system.data value
        // is in turn "in" /small.
        let mut img = Img::new(img0.f);
        let file = img.ino("/dir1/sub/file");
        let fl = img.inode(file).flags();
        img.inode32(file, 0x20, fl | fi::EA_INODE_FL);
        let (e2, _) = img.ibody_xattr(file, fx::INDEX_SYSTEM, b"data");
        let f2 = e2 - img.inode_off(file);
        img.inode_put(file, f2 + 4, &small.to_le_bytes());
        img.inode_put(file, f2 + 8, &11u32.to_le_bytes());
        img.inode_put(small, field + 4, &file.to_le_bytes());
        img.inode_put(small, field + 8, &6u32.to_le_bytes());
        let fs = img.fs();
        eprintln!("getxattr: {:?}", fs.getxattr(InodeNo(small), b"user.tiny").map(|v| v.len()));
        let _ = fs.listxattr(InodeNo(small));
        let mut b = [0u8; 16];
        eprintln!("read: {:?}", fs.read(InodeNo(file), 0, &mut b));
        eprintln!("read: {:?}", fs.read(InodeNo(small), 0, &mut b));
        walk(&fs);
    });
}
