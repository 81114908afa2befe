//! Quota files in the kernel's `QFMT_VFS_V1` format (`quota_v2.c`, `quota_tree.c`), as ext4's
//! `quota` feature keeps them in hidden inodes: a header, an info record, then a radix tree of
//! 1 KiB blocks, four levels deep by the id's bytes, whose leaves are data blocks of 72-byte
//! entries (one per user, group or project id).
//!
//! Block 0 holds the header and info; block 1 is the tree's root. A tree block is 256
//! little-endian block numbers (0: none). A data block starts with a header (free-list links
//! and its entry count) and holds 14 entries; an entry whose bytes are all zero is free, so an
//! entry in use that would be all zero (id 0, nothing used, no limits) carries `dqb_itime` 1.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Size of a quota-file block (`QT_BLKSIZE`), whatever the filesystem's block size.
pub const QT_BLOCK: usize = 1024;
/// Block of the tree's root (`QT_TREEOFF`).
pub const QT_TREEOFF: u32 = 1;
/// Levels of the tree (`QT_TREEDEPTH`): one per byte of the 32-bit id.
pub const QT_DEPTH: usize = 4;
/// References in a tree block.
pub const QT_REFS: usize = QT_BLOCK / 4;
/// `dqi_bgrace` / `dqi_igrace` the kernel writes for a new file: seven days.
pub const MAX_DQ_TIME: u32 = 604_800;
/// Version of the format (`V2_VERSION_R1`, 64-bit limits and usage).
pub const V2_VERSION_R1: u32 = 1;

/// Magic numbers by quota type (`V2_INITQMAGICS`): user, group, project.
pub const MAGICS: [u32; 3] = [0xd9c0_1f11, 0xd9c0_1927, 0xd9c0_3f14];

/// The file's first bytes (`struct v2_disk_dqheader`).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct DiskHeader {
    /*00*/ pub dqh_magic: U32,
    /*04*/ pub dqh_version: U32,
}
const _: () = assert!(core::mem::size_of::<DiskHeader>() == 8);

/// Offset of [`DiskInfo`] in the file (`V2_DQINFOOFF`).
pub const INFO_OFF: usize = 8;

/// Grace times and the tree's allocation state (`struct v2_disk_dqinfo`).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct DiskInfo {
    /*00*/ pub dqi_bgrace: U32,
    /*04*/ pub dqi_igrace: U32,
    /*08*/ pub dqi_flags: U32,
    /// Blocks in the file.
    /*0C*/
    pub dqi_blocks: U32,
    /// First wholly free block (a list through the data-block headers' `next_free`).
    /*10*/
    pub dqi_free_blk: U32,
    /// First data block with a free entry (a doubly linked list).
    /*14*/
    pub dqi_free_entry: U32,
}
const _: () = assert!(core::mem::size_of::<DiskInfo>() == 24);

/// Header of a data block (`struct qt_disk_dqdbheader`).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct DataHeader {
    /*00*/ pub dqdh_next_free: U32,
    /*04*/ pub dqdh_prev_free: U32,
    /// Entries in use.
    /*08*/
    pub dqdh_entries: U16,
    /*0A*/ pub dqdh_pad1: U16,
    /*0C*/ pub dqdh_pad2: U32,
}
pub const DATA_HEADER: usize = 16;
const _: () = assert!(core::mem::size_of::<DataHeader>() == DATA_HEADER);

/// One id's limits and usage (`struct v2r1_disk_dqblk`).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct DiskDquot {
    /*00*/ pub dqb_id: U32,
    /*04*/ pub dqb_pad: U32,
    /*08*/ pub dqb_ihardlimit: U64,
    /*10*/ pub dqb_isoftlimit: U64,
    /*18*/ pub dqb_curinodes: U64,
    /// Space limits are in 1 KiB blocks (`QUOTABLOCK_SIZE`); usage is in bytes.
    /*20*/
    pub dqb_bhardlimit: U64,
    /*28*/ pub dqb_bsoftlimit: U64,
    /// Space in bytes.
    /*30*/
    pub dqb_curspace: U64,
    /// When the block grace period ends (0: not over the soft limit).
    /*38*/
    pub dqb_btime: U64,
    /// When the inode grace period ends; 1 in an entry that would otherwise be all zero.
    /*40*/
    pub dqb_itime: U64,
}
pub const ENTRY: usize = 72;
const _: () = assert!(core::mem::size_of::<DiskDquot>() == ENTRY);

/// Entries in a data block.
pub const ENTRIES_PER_BLOCK: usize = (QT_BLOCK - DATA_HEADER) / ENTRY;

/// Index into a tree block at `depth` (0 = root) for `id`.
pub fn tree_index(id: u32, depth: usize) -> usize {
    ((id >> ((QT_DEPTH - 1 - depth) * 8)) & 0xff) as usize
}

/// Reference `i` of a tree block.
pub fn tree_ref(block: &[u8], i: usize) -> u32 {
    U32::read_from_bytes(&block[i * 4..i * 4 + 4]).map_or(0, |v| v.get())
}

/// Sets reference `i` of a tree block.
pub fn set_tree_ref(block: &mut [u8], i: usize, blk: u32) {
    block[i * 4..i * 4 + 4].copy_from_slice(&blk.to_le_bytes());
}

/// Whether an entry's bytes are all zero (a free slot: `qtree_entry_unused`).
pub fn entry_unused(e: &[u8]) -> bool {
    e.iter().all(|&b| b == 0)
}

impl DiskDquot {
    /// The entry's bytes, marked in use where they would otherwise be all zero.
    pub fn to_disk(mut self) -> [u8; ENTRY] {
        if entry_unused(self.as_bytes()) {
            self.dqb_itime.set(1);
        }
        let mut out = [0u8; ENTRY];
        out.copy_from_slice(self.as_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_take_the_id_bytes_from_the_top() {
        let id = 0x0102_03ff;
        let idx: Vec<usize> = (0..QT_DEPTH).map(|d| tree_index(id, d)).collect();
        assert_eq!(idx, vec![1, 2, 3, 0xff]);
        assert_eq!(ENTRIES_PER_BLOCK, 14);
    }

    #[test]
    fn an_all_zero_entry_in_use_is_marked() {
        let e = DiskDquot::default().to_disk();
        assert!(!entry_unused(&e));
        let mut d = DiskDquot::default();
        d.dqb_id.set(5);
        assert_eq!(&d.to_disk()[..], d.as_bytes());
    }
}
