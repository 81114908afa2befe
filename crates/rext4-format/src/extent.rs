//! Extent tree nodes (`ext4_extent_header`, `ext4_extent_idx`, `ext4_extent`) and the tail
//! checksum of extent blocks.

use crate::checksum::crc32c;
use crate::split::{hi16_of_48, lo32};
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `eh_magic`.
pub const EXTENT_MAGIC: u16 = 0xF30A;
/// Size of header, index and leaf entries alike.
pub const ENTRY_SIZE: usize = 12;
/// The longest initialised extent; longer lengths mark unwritten extents.
pub const INIT_MAX_LEN: u16 = 32768;
/// The longest unwritten extent.
pub const UNINIT_MAX_LEN: u16 = 32767;
/// Deepest tree the kernel accepts (`EXT4_MAX_EXTENT_DEPTH`).
pub const MAX_DEPTH: u16 = 5;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct ExtentHeader {
    /*00*/ pub eh_magic: U16,
    /*02*/ pub eh_entries: U16,
    /*04*/ pub eh_max: U16,
    /*06*/ pub eh_depth: U16,
    /*08*/ pub eh_generation: U32,
}
const _: () = assert!(core::mem::size_of::<ExtentHeader>() == ENTRY_SIZE);

/// An interior entry: the subtree covering logical blocks from `ei_block` on.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct ExtentIndex {
    /*00*/ pub ei_block: U32,
    /*04*/ pub ei_leaf_lo: U32,
    /*08*/ pub ei_leaf_hi: U16,
    /*0A*/ pub ei_unused: U16,
}
const _: () = assert!(core::mem::size_of::<ExtentIndex>() == ENTRY_SIZE);

/// A leaf entry: `len` logical blocks from `ee_block` mapped to physical blocks from `start`.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct Extent {
    /*00*/ pub ee_block: U32,
    /*04*/ pub ee_len: U16,
    /*06*/ pub ee_start_hi: U16,
    /*08*/ pub ee_start_lo: U32,
}
const _: () = assert!(core::mem::size_of::<Extent>() == ENTRY_SIZE);

impl ExtentIndex {
    pub fn leaf(&self) -> u64 {
        u64::from(self.ei_leaf_lo.get()) | u64::from(self.ei_leaf_hi.get()) << 32
    }
    pub fn set_leaf(&mut self, b: u64) {
        self.ei_leaf_lo.set(lo32(b));
        self.ei_leaf_hi.set(hi16_of_48(b));
    }
}

impl Extent {
    pub fn start(&self) -> u64 {
        u64::from(self.ee_start_lo.get()) | u64::from(self.ee_start_hi.get()) << 32
    }
    pub fn set_start(&mut self, b: u64) {
        self.ee_start_lo.set(lo32(b));
        self.ee_start_hi.set(hi16_of_48(b));
    }
    /// Whether the extent is allocated but unwritten (reads as zeros).
    pub fn is_unwritten(&self) -> bool {
        self.ee_len.get() > INIT_MAX_LEN
    }
    /// Number of blocks covered.
    pub fn len(&self) -> u16 {
        let l = self.ee_len.get();
        if l > INIT_MAX_LEN {
            l - INIT_MAX_LEN
        } else {
            l
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A decoded extent node, borrowed from a buffer (`i_block` or a tree block).
#[derive(Debug)]
pub struct Node<'a> {
    pub header: ExtentHeader,
    entries: &'a [u8],
}

/// Why a node failed to decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeError {
    BadMagic,
    /// `eh_entries > eh_max`, or `eh_max` does not fit the buffer.
    BadCount,
    BadDepth,
}

impl<'a> Node<'a> {
    /// Decodes and validates a node header against the buffer size.
    pub fn parse(buf: &'a [u8]) -> Result<Self, NodeError> {
        let (header, rest) = ExtentHeader::read_from_prefix(buf).map_err(|_| NodeError::BadCount)?;
        if header.eh_magic.get() != EXTENT_MAGIC {
            return Err(NodeError::BadMagic);
        }
        let max = usize::from(header.eh_max.get());
        let entries = usize::from(header.eh_entries.get());
        if entries > max || max * ENTRY_SIZE > rest.len() {
            return Err(NodeError::BadCount);
        }
        if header.eh_depth.get() > MAX_DEPTH {
            return Err(NodeError::BadDepth);
        }
        Ok(Node { header, entries: &rest[..entries * ENTRY_SIZE] })
    }
    pub fn depth(&self) -> u16 {
        self.header.eh_depth.get()
    }
    pub fn len(&self) -> usize {
        self.entries.len() / ENTRY_SIZE
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// Entry `i` as an index entry (depth > 0).
    pub fn index(&self, i: usize) -> ExtentIndex {
        let b = &self.entries[i * ENTRY_SIZE..(i + 1) * ENTRY_SIZE];
        // Cannot fail: the slice is exactly ENTRY_SIZE bytes and every bit pattern is valid.
        ExtentIndex::read_from_bytes(b).unwrap()
    }
    /// Entry `i` as a leaf extent (depth 0).
    pub fn extent(&self, i: usize) -> Extent {
        let b = &self.entries[i * ENTRY_SIZE..(i + 1) * ENTRY_SIZE];
        // Cannot fail: as above.
        Extent::read_from_bytes(b).unwrap()
    }
    /// First logical block of entry `i` (same field for index and leaf entries).
    pub fn first_block(&self, i: usize) -> u32 {
        let b = &self.entries[i * ENTRY_SIZE..i * ENTRY_SIZE + 4];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    /// Index of the last entry whose first block is <= `lblk`, if any (entries are sorted).
    pub fn search(&self, lblk: u32) -> Option<usize> {
        let n = self.len();
        let (mut lo, mut hi) = (0usize, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.first_block(mid) <= lblk {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.checked_sub(1)
    }
}

/// Byte offset of the checksum tail in an extent block: right after `eh_max` entries.
pub fn tail_offset(eh_max: u16) -> usize {
    ENTRY_SIZE * (1 + usize::from(eh_max))
}

/// The checksum of an extent tree block (not the root in `i_block`).
pub fn block_checksum(block: &[u8], inode_csum_seed: u32, eh_max: u16) -> u32 {
    crc32c(inode_csum_seed, &block[..tail_offset(eh_max).min(block.len())])
}

/// Verifies an extent block's tail; `false` if the tail lies outside the block.
pub fn verify_block_checksum(block: &[u8], inode_csum_seed: u32) -> bool {
    let Ok((h, _)) = ExtentHeader::read_from_prefix(block) else {
        return false;
    };
    let off = tail_offset(h.eh_max.get());
    let Some(t) = block.get(off..off + 4) else {
        return false;
    };
    let stored = u32::from_le_bytes([t[0], t[1], t[2], t[3]]);
    stored == block_checksum(block, inode_csum_seed, h.eh_max.get())
}

/// Writes an extent block's tail checksum.
pub fn set_block_checksum(block: &mut [u8], inode_csum_seed: u32) {
    let Ok((h, _)) = ExtentHeader::read_from_prefix(block) else {
        return;
    };
    let off = tail_offset(h.eh_max.get());
    let c = block_checksum(block, inode_csum_seed, h.eh_max.get());
    if let Some(t) = block.get_mut(off..off + 4) {
        t.copy_from_slice(&c.to_le_bytes());
    }
}

#[cfg(test)]
// Fixtures are built from small known values; a narrowing cast there is the clearest form.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
mod tests {
    use super::*;
    use zerocopy::FromZeros;

    fn node_bytes(depth: u16, firsts: &[u32]) -> Vec<u8> {
        let mut b = vec![0u8; 12 * 5];
        let h = ExtentHeader {
            eh_magic: EXTENT_MAGIC.into(),
            eh_entries: (firsts.len() as u16).into(),
            eh_max: 4.into(),
            eh_depth: depth.into(),
            eh_generation: 0.into(),
        };
        b[..12].copy_from_slice(h.as_bytes());
        for (i, f) in firsts.iter().enumerate() {
            b[12 + 12 * i..16 + 12 * i].copy_from_slice(&f.to_le_bytes());
        }
        b
    }

    #[test]
    fn search_finds_covering_entry() {
        let b = node_bytes(0, &[0, 10, 20]);
        let n = Node::parse(&b).unwrap();
        assert_eq!(n.search(0), Some(0));
        assert_eq!(n.search(9), Some(0));
        assert_eq!(n.search(10), Some(1));
        assert_eq!(n.search(1000), Some(2));
        let b = node_bytes(0, &[5]);
        assert_eq!(Node::parse(&b).unwrap().search(4), None);
    }

    #[test]
    fn bad_nodes_are_rejected() {
        let mut b = node_bytes(0, &[0, 1, 2, 3]);
        b[2] = 5; // entries > max
        assert_eq!(Node::parse(&b).unwrap_err(), NodeError::BadCount);
        let b = node_bytes(0, &[]);
        assert_eq!(Node::parse(&b[..30]).unwrap_err(), NodeError::BadCount);
        let mut b = node_bytes(0, &[]);
        b[0] = 0;
        assert_eq!(Node::parse(&b).unwrap_err(), NodeError::BadMagic);
        let mut b = node_bytes(0, &[]);
        b[6] = 9;
        assert_eq!(Node::parse(&b).unwrap_err(), NodeError::BadDepth);
    }

    #[test]
    fn unwritten_lengths() {
        let mut e = Extent::new_zeroed();
        e.ee_len.set(INIT_MAX_LEN);
        assert!(!e.is_unwritten());
        assert_eq!(e.len(), 32768);
        e.ee_len.set(INIT_MAX_LEN + 7);
        assert!(e.is_unwritten());
        assert_eq!(e.len(), 7);
    }
}
