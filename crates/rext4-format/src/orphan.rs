//! Blocks of the orphan file (`orphan_file` feature): an array of inode numbers (0 = free slot)
//! followed by a tail with a magic number and a checksum.

use crate::checksum::crc32c;
use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `ob_magic`.
pub const ORPHAN_BLOCK_MAGIC: u32 = 0x0B10_CA04;
/// Size of the tail.
pub const TAIL_SIZE: usize = 8;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct OrphanBlockTail {
    /*00*/ pub ob_magic: U32,
    /*04*/ pub ob_checksum: U32,
}
const _: () = assert!(core::mem::size_of::<OrphanBlockTail>() == TAIL_SIZE);

/// Slots per orphan block.
pub fn inodes_per_block(block_size: usize) -> usize {
    (block_size - TAIL_SIZE) / 4
}

/// The tail of an orphan block.
pub fn tail(block: &[u8]) -> Option<OrphanBlockTail> {
    let off = block.len().checked_sub(TAIL_SIZE)?;
    OrphanBlockTail::read_from_bytes(&block[off..]).ok()
}

/// Checksum of an orphan block at physical block `blk`: seeded with the orphan file's inode
/// checksum seed, then the block number as `le64`, then the slot array.
pub fn block_checksum(block: &[u8], inode_csum_seed: u32, blk: u64) -> u32 {
    let c = crc32c(inode_csum_seed, &blk.to_le_bytes());
    crc32c(c, &block[..inodes_per_block(block.len()) * 4])
}

/// Whether the tail has the magic number and a matching checksum (`metadata_csum` decides if
/// the checksum is checked).
pub fn verify_block(block: &[u8], inode_csum_seed: u32, blk: u64, metadata_csum: bool) -> bool {
    let Some(t) = tail(block) else { return false };
    t.ob_magic.get() == ORPHAN_BLOCK_MAGIC
        && (!metadata_csum || t.ob_checksum.get() == block_checksum(block, inode_csum_seed, blk))
}

/// The inode numbers recorded in a block (non-zero slots).
pub fn slots(block: &[u8]) -> impl Iterator<Item = u32> + '_ {
    block[..inodes_per_block(block.len()) * 4]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .filter(|&i| i != 0)
}

/// Writes the tail (magic and checksum) of an orphan block.
pub fn set_tail(block: &mut [u8], inode_csum_seed: u32, blk: u64) {
    let c = block_checksum(block, inode_csum_seed, blk);
    let off = block.len() - TAIL_SIZE;
    let t = OrphanBlockTail { ob_magic: ORPHAN_BLOCK_MAGIC.into(), ob_checksum: c.into() };
    block[off..].copy_from_slice(t.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_round_trips() {
        let mut b = vec![0u8; 1024];
        b[8..12].copy_from_slice(&77u32.to_le_bytes());
        set_tail(&mut b, 5, 3);
        assert!(verify_block(&b, 5, 3, true));
        assert!(!verify_block(&b, 5, 4, true));
        assert!(verify_block(&b, 5, 4, false));
        assert_eq!(slots(&b).collect::<Vec<_>>(), vec![77]);
    }
}
