//! The multi-mount protection block (`mmp` feature, `struct mmp_struct`): a block whose
//! sequence number the node that has the filesystem open keeps changing, so that another
//! node, seeing it change, stays away. The structure fills the first 1 KiB of its block.

use crate::checksum::crc32c;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `mmp_magic`.
pub const MMP_MAGIC: u32 = 0x004D_4D50;
/// `mmp_seq` of a filesystem nobody has open.
pub const SEQ_CLEAN: u32 = 0xFF4D_4D50;
/// `mmp_seq` while e2fsck has the filesystem.
pub const SEQ_FSCK: u32 = 0xE24D_4D50;
/// The largest sequence number an open node writes (it wraps to 1 after it).
pub const SEQ_MAX: u32 = 0xE24D_4D4F;
/// The update interval mke2fs sets, in seconds.
pub const UPDATE_INTERVAL: u16 = 5;
/// The largest update interval e2fsprogs accepts, in seconds.
pub const MAX_UPDATE_INTERVAL: u16 = 300;
/// Bounds of the check interval, in seconds.
pub const MIN_CHECK_INTERVAL: u16 = 5;
pub const MAX_CHECK_INTERVAL: u16 = 300;
/// How many update intervals make a check interval.
pub const CHECK_MULT: u16 = 2;
/// Size of the structure at the start of the block.
pub const MMP_SIZE: usize = 1024;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct MmpBlock {
    /*000*/ pub mmp_magic: U32,
    /*004*/ pub mmp_seq: U32,
    /*008*/ pub mmp_time: U64,
    /*010*/ pub mmp_nodename: [u8; 64],
    /*050*/ pub mmp_bdevname: [u8; 32],
    /*070*/ pub mmp_check_interval: U16,
    /*072*/ pub mmp_pad1: U16,
    /*074*/ pub mmp_pad2: [U32; 226],
    /*3FC*/ pub mmp_checksum: U32,
}
const _: () = assert!(core::mem::size_of::<MmpBlock>() == MMP_SIZE);

/// Bytes the checksum covers: everything before it.
const CSUM_OFFSET: usize = MMP_SIZE - 4;

impl MmpBlock {
    /// The structure at the start of `block`, if the block is long enough.
    pub fn parse(block: &[u8]) -> Option<MmpBlock> {
        MmpBlock::read_from_prefix(block).ok().map(|(m, _)| m)
    }

    /// crc32c of the structure before its checksum, seeded with the filesystem's seed.
    pub fn compute_checksum(&self, fs_seed: u32) -> u32 {
        crc32c(fs_seed, &self.as_bytes()[..CSUM_OFFSET])
    }

    /// Whether the checksum matches (`metadata_csum` says whether there is one).
    pub fn verify_checksum(&self, fs_seed: u32, metadata_csum: bool) -> bool {
        !metadata_csum || self.mmp_checksum.get() == self.compute_checksum(fs_seed)
    }

    /// Sets the checksum where the filesystem keeps one.
    pub fn update_checksum(&mut self, fs_seed: u32, metadata_csum: bool) {
        if metadata_csum {
            let c = self.compute_checksum(fs_seed);
            self.mmp_checksum.set(c);
        }
    }

    /// `field` with `name` in it, cut to fit and zero-padded (the node and device names).
    pub fn set_name(field: &mut [u8], name: &[u8]) {
        field.fill(0);
        let n = name.len().min(field.len());
        field[..n].copy_from_slice(&name[..n]);
    }

    /// A name field up to its first zero byte.
    pub fn name(field: &[u8]) -> &[u8] {
        let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
        &field[..end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromZeros;

    #[test]
    fn checksum_covers_everything_but_itself() {
        let mut m = MmpBlock::new_zeroed();
        m.mmp_magic.set(MMP_MAGIC);
        m.mmp_seq.set(SEQ_CLEAN);
        m.update_checksum(7, true);
        assert!(m.verify_checksum(7, true));
        assert!(!m.verify_checksum(8, true));
        m.mmp_pad2[225].set(1);
        assert!(!m.verify_checksum(7, true));
        assert!(m.verify_checksum(7, false), "no checksum without metadata_csum");
    }

    #[test]
    fn names_are_cut_and_padded() {
        let mut f = [b'x'; 8];
        MmpBlock::set_name(&mut f, b"node");
        assert_eq!(&f, b"node\0\0\0\0");
        assert_eq!(MmpBlock::name(&f), b"node");
        MmpBlock::set_name(&mut f, b"a-much-longer-name");
        assert_eq!(MmpBlock::name(&f), b"a-much-l");
    }
}
