//! Damaged symbolic links: fast and slow targets, loops.

use super::*;

#[test]
fn symlink_fast_corrupt() {
    for v in [Variant::Csum4k, Variant::Ext2, Variant::Inline] {
        let mut img = img!(v);
        let ino = img.ino("/fastlink");
        img.set_size(ino, 60);
        let fs = img.fs();
        message_has(&structural(fs.readlink(InodeNo(ino)), ino), "symlink");
        structural(fs.metadata("/fastlink"), ino);
        let mut img = img!(v);
        img.set_size(ino, 0);
        let fs = img.fs();
        structural(fs.readlink(InodeNo(ino)), ino);
        let mut img = img!(v);
        img.set_size(ino, u64::MAX);
        let fs = img.fs();
        structural(fs.readlink(InodeNo(ino)), ino);
    }
}

#[test]
fn symlink_slow_corrupt() {
    for v in [Variant::Csum4k, Variant::Ext2] {
        let img0 = img!(v);
        let ino = img0.ino("/slowlink");
        let bs = img0.g.bs as u64;
        for size in [bs, bs + 1, u64::MAX, 0] {
            let mut img = Img::new(img0.f);
            img.set_size(ino, size);
            let fs = img.fs();
            structural(fs.readlink(InodeNo(ino)), ino);
        }
        // Target block out of range.
        let mut img = Img::new(img0.f);
        if v == Variant::Ext2 {
            img.inode32(ino, 0x28, 0xFFFF_FF00);
        } else {
            img.inode32(ino, 0x28 + 12 + 8, 0xFFFF_FF00);
        }
        let fs = img.fs();
        let c = structural(fs.readlink(InodeNo(ino)), ino);
        block_is(&c, 0xFFFF_FF00);
        // A NUL inside the target.
        let mut img = Img::new(img0.f);
        let blk = img.pblk(ino, 0);
        let o = img.block_off(blk) + 3;
        img.b[o] = 0;
        let fs = img.fs();
        structural(fs.readlink(InodeNo(ino)), ino);
        // A hole instead of the target block.
        let mut img = Img::new(img0.f);
        if v == Variant::Ext2 {
            img.inode32(ino, 0x28, 0);
        } else {
            img.inode16(ino, 0x28 + 2, 0);
        }
        let fs = img.fs();
        structural(fs.readlink(InodeNo(ino)), ino);
    }
}

#[test]
fn symlink_loops_give_eloop() {
    let mut img = img!(Variant::Csum4k);
    let ino = img.ino("/fastlink");
    let target = b"/fastlink";
    img.inode_put(ino, 0x28, target);
    img.set_size(ino, target.len() as u64);
    let fs = img.fs();
    assert!(matches!(fs.metadata("/fastlink"), Err(Error::Loop)));
    assert!(matches!(fs.read_file("/fastlink"), Err(Error::Loop)));
    assert!(fs.symlink_metadata("/fastlink").is_ok());
    // A link to "." repeated: 40 links then ELOOP, no unbounded queue growth.
    let mut img = img!(Variant::Csum4k);
    let t = b"fastlink/fastlink/fastlink/fastlink/fastlink/fastl";
    img.inode_put(ino, 0x28, t);
    img.set_size(ino, t.len() as u64);
    let fs = img.fs();
    assert!(fs.metadata("/fastlink").is_err());
}
