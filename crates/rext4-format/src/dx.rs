//! Hashed directory (htree / dir_index) blocks: `dx_root`, `dx_node`, their entries and the
//! `dx_tail` checksum.
//!
//! Both kinds of block disguise themselves as directory blocks so that code unaware of htree
//! sees empty entries: the root holds `.` and a `..` whose `rec_len` covers the rest of the
//! block; an interior node is one empty entry spanning the whole block.

use crate::checksum::crc32c;
use crate::dirent::{rec_len_from_disk, DirEntryHeader};
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Offset of `dx_root_info` in the root block (after the `.` and `..` entries' 12-byte heads).
pub const ROOT_INFO_OFFSET: usize = 0x18;
/// Offset of the count/limit header in the root block.
pub const ROOT_ENTRIES_OFFSET: usize = 0x20;
/// Offset of the count/limit header in an interior node.
pub const NODE_ENTRIES_OFFSET: usize = 8;
/// Size of one `dx_entry`.
pub const ENTRY_SIZE: usize = 8;
/// Size of the checksum tail after `limit` entries.
pub const TAIL_SIZE: usize = 8;
/// Deepest tree without `large_dir` (levels below the root).
pub const MAX_LEVELS: u8 = 2;
/// Deepest tree with `large_dir`.
pub const MAX_LEVELS_LARGEDIR: u8 = 3;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct DxRootInfo {
    /*00*/ pub reserved_zero: U32,
    /*04*/ pub hash_version: u8,
    /*05*/ pub info_length: u8,
    /*06*/ pub indirect_levels: u8,
    /*07*/ pub unused_flags: u8,
}
const _: () = assert!(core::mem::size_of::<DxRootInfo>() == 8);

/// The first `dx_entry` slot: its hash field holds limit and count.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct DxCountLimit {
    /*00*/ pub limit: U16,
    /*02*/ pub count: U16,
    /*04*/ pub block: U32,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct DxEntry {
    /*00*/ pub hash: U32,
    /*04*/ pub block: U32,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct DxTail {
    /*00*/ pub dt_reserved: U32,
    /*04*/ pub dt_checksum: U32,
}

/// Why a dx block does not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DxError {
    /// Not shaped like a root or node block.
    NotDx,
    /// `reserved_zero` or `info_length` wrong.
    BadRootInfo,
    /// `count` exceeds `limit`, is zero, or `limit` does not fit the block.
    BadCount,
}

/// The entries of a root or node block.
#[derive(Clone, Copy, Debug)]
pub struct DxEntries<'a> {
    /// Byte offset of the count/limit header in the block.
    pub offset: usize,
    pub limit: u16,
    pub count: u16,
    raw: &'a [u8],
}

impl<'a> DxEntries<'a> {
    fn parse(block: &'a [u8], offset: usize) -> Result<Self, DxError> {
        let (cl, _) = DxCountLimit::read_from_prefix(block.get(offset..).ok_or(DxError::BadCount)?)
            .map_err(|_| DxError::BadCount)?;
        let (limit, count) = (cl.limit.get(), cl.count.get());
        if count == 0 || count > limit || offset + usize::from(limit) * ENTRY_SIZE > block.len() {
            return Err(DxError::BadCount);
        }
        let raw = &block[offset..offset + usize::from(count) * ENTRY_SIZE];
        Ok(DxEntries { offset, limit, count, raw })
    }
    /// `(hash, block)` of entry `i`; entry 0's hash is implicitly 0.
    pub fn get(&self, i: usize) -> (u32, u32) {
        let b = &self.raw[i * ENTRY_SIZE..(i + 1) * ENTRY_SIZE];
        let hash = if i == 0 { 0 } else { u32::from_le_bytes([b[0], b[1], b[2], b[3]]) };
        (hash, u32::from_le_bytes([b[4], b[5], b[6], b[7]]))
    }
    pub fn len(&self) -> usize {
        usize::from(self.count)
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    /// The entry whose range holds `hash`: the last entry with hash <= `hash`.
    pub fn find(&self, hash: u32) -> usize {
        let (mut lo, mut hi) = (1usize, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.get(mid).0 <= hash {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo - 1
    }
}

/// A parsed root block.
#[derive(Clone, Copy, Debug)]
pub struct DxRoot<'a> {
    pub info: DxRootInfo,
    pub entries: DxEntries<'a>,
}

/// Parses block 0 of an indexed directory.
pub fn parse_root(block: &[u8]) -> Result<DxRoot<'_>, DxError> {
    let bs = u32::try_from(block.len()).map_err(|_| DxError::NotDx)?;
    let (dot, _) = DirEntryHeader::read_from_prefix(block).map_err(|_| DxError::NotDx)?;
    let dotdot = block.get(12..).and_then(|b| DirEntryHeader::read_from_prefix(b).ok());
    let Some((dotdot, _)) = dotdot else { return Err(DxError::NotDx) };
    if rec_len_from_disk(dot.rec_len.get(), bs) != 12
        || rec_len_from_disk(dotdot.rec_len.get(), bs) != bs - 12
    {
        return Err(DxError::NotDx);
    }
    let (info, _) = DxRootInfo::read_from_prefix(block.get(ROOT_INFO_OFFSET..).ok_or(DxError::NotDx)?)
        .map_err(|_| DxError::NotDx)?;
    if info.reserved_zero.get() != 0 || usize::from(info.info_length) != 8 {
        return Err(DxError::BadRootInfo);
    }
    let entries = DxEntries::parse(block, ROOT_INFO_OFFSET + usize::from(info.info_length))?;
    Ok(DxRoot { info, entries })
}

/// Parses an interior node block.
pub fn parse_node(block: &[u8]) -> Result<DxEntries<'_>, DxError> {
    let bs = u32::try_from(block.len()).map_err(|_| DxError::NotDx)?;
    let (h, _) = DirEntryHeader::read_from_prefix(block).map_err(|_| DxError::NotDx)?;
    if h.inode.get() != 0 || rec_len_from_disk(h.rec_len.get(), bs) != bs {
        return Err(DxError::NotDx);
    }
    DxEntries::parse(block, NODE_ENTRIES_OFFSET)
}

/// Where the count/limit header of a dx block is, judged from its disguise (root or node).
pub fn count_offset(block: &[u8]) -> Option<usize> {
    let bs = u32::try_from(block.len()).ok()?;
    let (first, _) = DirEntryHeader::read_from_prefix(block).ok()?;
    match rec_len_from_disk(first.rec_len.get(), bs) {
        n if n == bs => Some(NODE_ENTRIES_OFFSET),
        12 => {
            let (second, _) = DirEntryHeader::read_from_prefix(block.get(12..)?).ok()?;
            let (info, _) = DxRootInfo::read_from_prefix(block.get(ROOT_INFO_OFFSET..)?).ok()?;
            (rec_len_from_disk(second.rec_len.get(), bs) == bs - 12
                && info.reserved_zero.get() == 0
                && info.info_length == 8)
                .then_some(ROOT_ENTRIES_OFFSET)
        }
        _ => None,
    }
}

fn countlimit(block: &[u8], off: usize) -> Option<(usize, usize)> {
    let (cl, _) = DxCountLimit::read_from_prefix(block.get(off..)?).ok()?;
    Some((usize::from(cl.count.get()), usize::from(cl.limit.get())))
}

/// The checksum of a dx block (`ext4_dx_csum`): the block up to the last used entry, then the
/// tail's reserved word, then the checksum field taken as zero. `None` if the block has no
/// room for a tail after `limit` entries.
pub fn checksum(block: &[u8], inode_csum_seed: u32) -> Option<u32> {
    let off = count_offset(block)?;
    let (count, limit) = countlimit(block, off)?;
    let tail = off + limit * ENTRY_SIZE;
    if tail + TAIL_SIZE > block.len() || count > limit {
        return None;
    }
    let c = crc32c(inode_csum_seed, &block[..off + count * ENTRY_SIZE]);
    Some(crc32c(crc32c(c, &block[tail..tail + 4]), &[0u8; 4]))
}

/// Checks a dx block's tail checksum; `false` if there is no room for one.
pub fn verify_checksum(block: &[u8], inode_csum_seed: u32) -> bool {
    let Some(c) = checksum(block, inode_csum_seed) else { return false };
    let Some(off) = count_offset(block) else { return false };
    let Some((_, limit)) = countlimit(block, off) else { return false };
    let t = off + limit * ENTRY_SIZE + 4;
    block[t..t + 4] == c.to_le_bytes()
}

/// Writes a dx block's tail checksum (no-op if the block has no room for it).
pub fn set_checksum(block: &mut [u8], inode_csum_seed: u32) {
    let Some(c) = checksum(block, inode_csum_seed) else { return };
    let Some(off) = count_offset(block) else { return };
    let Some((_, limit)) = countlimit(block, off) else { return };
    let t = off + limit * ENTRY_SIZE + 4;
    block[t..t + 4].copy_from_slice(&c.to_le_bytes());
}

#[cfg(test)]
// Fixtures are built from small known values; a narrowing cast there is the clearest form.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
mod tests {
    use super::*;

    fn root_block(bs: usize, entries: &[(u32, u32)], limit: u16) -> Vec<u8> {
        let mut b = vec![0u8; bs];
        b[0..4].copy_from_slice(&2u32.to_le_bytes());
        b[4..6].copy_from_slice(&12u16.to_le_bytes());
        b[6] = 1;
        b[8] = b'.';
        b[12..16].copy_from_slice(&2u32.to_le_bytes());
        b[16..18].copy_from_slice(&((bs - 12) as u16).to_le_bytes());
        b[18] = 2;
        b[20..22].copy_from_slice(b"..");
        b[ROOT_INFO_OFFSET + 4] = 1;
        b[ROOT_INFO_OFFSET + 5] = 8;
        let o = ROOT_ENTRIES_OFFSET;
        b[o..o + 2].copy_from_slice(&limit.to_le_bytes());
        b[o + 2..o + 4].copy_from_slice(&(entries.len() as u16).to_le_bytes());
        for (i, (h, blk)) in entries.iter().enumerate() {
            let e = o + i * 8;
            if i > 0 {
                b[e..e + 4].copy_from_slice(&h.to_le_bytes());
            }
            b[e + 4..e + 8].copy_from_slice(&blk.to_le_bytes());
        }
        b
    }

    #[test]
    fn root_parses_and_finds() {
        let b = root_block(1024, &[(0, 1), (100, 2), (200, 3)], 10);
        let r = parse_root(&b).unwrap();
        assert_eq!(r.info.hash_version, 1);
        assert_eq!(r.entries.find(0), 0);
        assert_eq!(r.entries.find(99), 0);
        assert_eq!(r.entries.find(100), 1);
        assert_eq!(r.entries.find(u32::MAX), 2);
        assert_eq!(r.entries.get(2), (200, 3));
    }

    #[test]
    fn bad_counts_are_rejected() {
        let b = root_block(1024, &[(0, 1), (5, 2)], 1);
        assert_eq!(parse_root(&b).unwrap_err(), DxError::BadCount);
        let b = root_block(1024, &[(0, 1)], 200);
        assert_eq!(parse_root(&b).unwrap_err(), DxError::BadCount);
    }

    #[test]
    fn checksum_matches_a_kernel_written_root() {
        // The root of a 300-entry directory the kernel (6.18) built on a 1 KiB-block
        // metadata_csum filesystem; its tail's reserved word is left over from the block's
        // life as a leaf. Inode checksum seed computed from that filesystem's UUID, inode 12
        // and its generation.
        let head = "0c0000000c0001022e00000002000000f40302022e2e000000000000010800007b000500\
                    0100000054f8df4004000000f020cd6902000000687ff39505000000223555c303000000";
        let mut b = vec![0u8; 1024];
        for (i, byte) in b.iter_mut().take(head.len() / 2).enumerate() {
            *byte = u8::from_str_radix(&head[2 * i..2 * i + 2], 16).unwrap();
        }
        b[1016..].copy_from_slice(&[0x0c, 0x00, 0x00, 0xde, 0x41, 0xd9, 0xb0, 0x19]);
        assert_eq!(checksum(&b, 0xf5b2_c0f3), Some(0x19b0_d941));
        assert!(verify_checksum(&b, 0xf5b2_c0f3));
    }

    #[test]
    fn checksum_round_trips() {
        let limit = ((1024 - ROOT_ENTRIES_OFFSET - TAIL_SIZE) / ENTRY_SIZE) as u16;
        let mut b = root_block(1024, &[(0, 1), (100, 2)], limit);
        set_checksum(&mut b, 7);
        assert!(verify_checksum(&b, 7));
        b[ROOT_ENTRIES_OFFSET + 8] ^= 1;
        assert!(!verify_checksum(&b, 7));
    }
}
