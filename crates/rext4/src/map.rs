//! Block mapping for reads: one entry point over extents, block maps and inline data (the
//! read side of `ext4_map_blocks`).

use crate::error::Result;
use crate::fs::FsInner;
use crate::inode::Inode;
use rext4_format::inode::EXTENTS_FL;

/// What a run of logical blocks maps to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mapping {
    /// `len` blocks with no storage: they read as zeros.
    Hole { len: u64 },
    /// `len` blocks stored contiguously from `pblk`; unwritten ones read as zeros.
    Mapped { pblk: u64, len: u64, unwritten: bool },
}

impl FsInner {
    /// Maps logical block `lblk` of `inode` (which must not hold inline data).
    pub(crate) fn map_block(&self, inode: &Inode, lblk: u32) -> Result<Mapping> {
        if inode.flags() & EXTENTS_FL != 0 {
            self.ext_map(inode, lblk)
        } else {
            self.ind_map(inode, lblk)
        }
    }
}
