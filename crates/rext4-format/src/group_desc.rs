//! Block group descriptors (`struct ext4_group_desc`): 32 bytes, or 64 with the 64bit feature.

use crate::checksum::{crc16, crc32c};
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `bg_flags`: inode table and bitmap not initialised.
pub const BG_INODE_UNINIT: u16 = 0x0001;
/// `bg_flags`: block bitmap not initialised.
pub const BG_BLOCK_UNINIT: u16 = 0x0002;
/// `bg_flags`: inode table zeroed.
pub const BG_INODE_ZEROED: u16 = 0x0004;

/// Descriptor size without the 64bit feature.
pub const DESC_SIZE_32: usize = 32;
/// Descriptor size with the 64bit feature (the kernel's minimum for 64bit).
pub const DESC_SIZE_64: usize = 64;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Debug)]
#[repr(C)]
pub struct GroupDesc {
    /*00*/ pub bg_block_bitmap_lo: U32,
    /*04*/ pub bg_inode_bitmap_lo: U32,
    /*08*/ pub bg_inode_table_lo: U32,
    /*0C*/ pub bg_free_blocks_count_lo: U16,
    /*0E*/ pub bg_free_inodes_count_lo: U16,
    /*10*/ pub bg_used_dirs_count_lo: U16,
    /*12*/ pub bg_flags: U16,
    /*14*/ pub bg_exclude_bitmap_lo: U32,
    /*18*/ pub bg_block_bitmap_csum_lo: U16,
    /*1A*/ pub bg_inode_bitmap_csum_lo: U16,
    /*1C*/ pub bg_itable_unused_lo: U16,
    /*1E*/ pub bg_checksum: U16,
    // The rest exists only in 64-byte descriptors.
    /*20*/ pub bg_block_bitmap_hi: U32,
    /*24*/ pub bg_inode_bitmap_hi: U32,
    /*28*/ pub bg_inode_table_hi: U32,
    /*2C*/ pub bg_free_blocks_count_hi: U16,
    /*2E*/ pub bg_free_inodes_count_hi: U16,
    /*30*/ pub bg_used_dirs_count_hi: U16,
    /*32*/ pub bg_itable_unused_hi: U16,
    /*34*/ pub bg_exclude_bitmap_hi: U32,
    /*38*/ pub bg_block_bitmap_csum_hi: U16,
    /*3A*/ pub bg_inode_bitmap_csum_hi: U16,
    /*3C*/ pub bg_reserved: U32,
}
const _: () = assert!(core::mem::size_of::<GroupDesc>() == DESC_SIZE_64);

/// Offset of `bg_checksum`.
const CHECKSUM_OFFSET: usize = 0x1E;

fn join32(lo: u32, hi: u32, wide: bool) -> u64 {
    u64::from(lo) | if wide { u64::from(hi) << 32 } else { 0 }
}
fn join16(lo: u16, hi: u16, wide: bool) -> u32 {
    u32::from(lo) | if wide { u32::from(hi) << 16 } else { 0 }
}

impl GroupDesc {
    /// Decodes one descriptor of `desc_size` bytes (32, or >= 64 with 64bit); the hi halves of a
    /// 32-byte descriptor read as zero. `None` if `bytes` is shorter than `desc_size`.
    pub fn parse(bytes: &[u8], desc_size: usize) -> Option<Self> {
        let mut raw = [0u8; DESC_SIZE_64];
        let n = desc_size.min(DESC_SIZE_64);
        raw[..n].copy_from_slice(bytes.get(..n)?);
        Self::read_from_bytes(&raw).ok()
    }

    /// The bytes to store for a descriptor of `desc_size` bytes (trailing bytes beyond 64 are
    /// the caller's to keep).
    pub fn encode_into(&self, out: &mut [u8], desc_size: usize) {
        let n = desc_size.min(DESC_SIZE_64).min(out.len());
        out[..n].copy_from_slice(&self.as_bytes()[..n]);
    }

    fn wide(desc_size: usize) -> bool {
        desc_size >= DESC_SIZE_64
    }

    pub fn block_bitmap(&self, desc_size: usize) -> u64 {
        join32(self.bg_block_bitmap_lo.get(), self.bg_block_bitmap_hi.get(), Self::wide(desc_size))
    }
    pub fn inode_bitmap(&self, desc_size: usize) -> u64 {
        join32(self.bg_inode_bitmap_lo.get(), self.bg_inode_bitmap_hi.get(), Self::wide(desc_size))
    }
    pub fn inode_table(&self, desc_size: usize) -> u64 {
        join32(self.bg_inode_table_lo.get(), self.bg_inode_table_hi.get(), Self::wide(desc_size))
    }
    pub fn free_blocks_count(&self, desc_size: usize) -> u32 {
        join16(self.bg_free_blocks_count_lo.get(), self.bg_free_blocks_count_hi.get(), Self::wide(desc_size))
    }
    pub fn free_inodes_count(&self, desc_size: usize) -> u32 {
        join16(self.bg_free_inodes_count_lo.get(), self.bg_free_inodes_count_hi.get(), Self::wide(desc_size))
    }
    pub fn used_dirs_count(&self, desc_size: usize) -> u32 {
        join16(self.bg_used_dirs_count_lo.get(), self.bg_used_dirs_count_hi.get(), Self::wide(desc_size))
    }
    pub fn itable_unused(&self, desc_size: usize) -> u32 {
        join16(self.bg_itable_unused_lo.get(), self.bg_itable_unused_hi.get(), Self::wide(desc_size))
    }
    pub fn block_bitmap_csum(&self, desc_size: usize) -> u32 {
        join16(self.bg_block_bitmap_csum_lo.get(), self.bg_block_bitmap_csum_hi.get(), Self::wide(desc_size))
    }
    pub fn inode_bitmap_csum(&self, desc_size: usize) -> u32 {
        join16(self.bg_inode_bitmap_csum_lo.get(), self.bg_inode_bitmap_csum_hi.get(), Self::wide(desc_size))
    }
    pub fn flags(&self) -> u16 {
        self.bg_flags.get()
    }

    /// The metadata_csum checksum (`crc32c` low 16 bits) of this descriptor as group `group`.
    pub fn csum_crc32c(&self, fs_seed: u32, group: u32, desc_size: usize) -> u16 {
        let bytes = self.as_bytes();
        let n = desc_size.min(DESC_SIZE_64);
        let mut c = crc32c(fs_seed, &group.to_le_bytes());
        c = crc32c(c, &bytes[..CHECKSUM_OFFSET]);
        c = crc32c(c, &[0, 0]);
        if n > CHECKSUM_OFFSET + 2 {
            c = crc32c(c, &bytes[CHECKSUM_OFFSET + 2..n]);
        }
        (c & 0xFFFF) as u16
    }

    /// The gdt_csum / uninit_bg checksum (crc16) of this descriptor as group `group`.
    pub fn csum_crc16(&self, uuid: &[u8; 16], group: u32, desc_size: usize) -> u16 {
        let bytes = self.as_bytes();
        let n = desc_size.min(DESC_SIZE_64);
        let mut c = crc16(!0, uuid);
        c = crc16(c, &group.to_le_bytes());
        c = crc16(c, &bytes[..CHECKSUM_OFFSET]);
        if n > CHECKSUM_OFFSET + 2 {
            c = crc16(c, &bytes[CHECKSUM_OFFSET + 2..n]);
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_descriptors_have_zero_hi_halves() {
        let mut raw = [0xFFu8; 64];
        raw[0..4].copy_from_slice(&5u32.to_le_bytes());
        let gd = GroupDesc::parse(&raw, 32).unwrap();
        assert_eq!(gd.block_bitmap(32), 5);
        assert_eq!(gd.bg_block_bitmap_hi.get(), 0);
        let gd = GroupDesc::parse(&raw, 64).unwrap();
        assert_eq!(gd.block_bitmap(64), 0xFFFF_FFFF_0000_0005);
        assert!(GroupDesc::parse(&raw[..31], 32).is_none());
    }
}
