//! Damaged ext2 block maps: direct and indirect pointers.

use super::*;

#[test]
fn blockmap_pointers_out_of_range() {
    let img0 = img!(Variant::Ext2);
    let ino = img0.ino("/frag");
    let ind = u64::from(img0.inode(ino).i_block[fi::IND_BLOCK].get());
    let mut b = vec![0u8; 1024];
    // Direct pointer.
    let mut img = Img::new(img0.f);
    img.inode32(ino, 0x28, 0xFFFF_FFFF);
    let c = structural(img.fs().read(InodeNo(ino), 0, &mut b), ino);
    block_is(&c, 0xFFFF_FFFF);
    // Indirect block pointer.
    let mut img = Img::new(img0.f);
    img.inode32(ino, 0x28 + 4 * fi::IND_BLOCK, 0x00FF_FFFF);
    let c = structural(img.fs().read(InodeNo(ino), 16 * 1024, &mut b), ino);
    block_is(&c, 0x00FF_FFFF);
    // A pointer inside the indirect block.
    let mut img = Img::new(img0.f);
    let o = img.block_off(ind) + 4 * 4; // lblk 16
    img.put32(o, 0x7FFF_FFFF);
    let c = structural(img.fs().read(InodeNo(ino), 16 * 1024, &mut b), ino);
    block_is(&c, 0x7FFF_FFFF);
    // Double and triple indirect roots out of range.
    for slot in [fi::DIND_BLOCK, fi::TIND_BLOCK] {
        let mut img = Img::new(img0.f);
        img.inode32(ino, 0x28 + 4 * slot, 0x7FFF_FFFF);
        img.set_size(ino, 1 << 40);
        let fs = img.fs();
        let off = if slot == fi::DIND_BLOCK { (12 + 256) * 1024 } else { (12 + 256 + 65536) * 1024 };
        let c = structural(fs.read(InodeNo(ino), off, &mut b), ino);
        block_is(&c, 0x7FFF_FFFF);
    }
    // An indirect block pointing at itself, at the superblock, at the inode table: bytes, not
    // a loop.
    for target in [ind, 1, 5] {
        let mut img = Img::new(img0.f);
        img.inode32(ino, 0x28 + 4 * fi::DIND_BLOCK, target as u32);
        img.set_size(ino, 1 << 30);
        let fs = img.fs();
        let _ = fs.read(InodeNo(ino), (12 + 256) * 1024, &mut b);
        walk(&fs);
    }
}

/// Consecutive direct pointers are read as one run; the run must stop at the end of the
/// filesystem: a pointer just past the end is corruption, not an I/O error or a read of bytes
/// beyond the filesystem.
#[test]
fn blockmap_run_past_end_of_fs() {
    let mut img = img!(Variant::Ext2);
    let ino = img.ino("/frag");
    let last = img.g.blocks_count - 1;
    img.inode32(ino, 0x28, last as u32);
    img.inode32(ino, 0x28 + 4, (last + 1) as u32);
    let fs = img.fs();
    let mut b = vec![0u8; 2048];
    let r = fs.read(InodeNo(ino), 0, &mut b);
    let c = structural(r, ino);
    block_is(&c, last + 1);
}
