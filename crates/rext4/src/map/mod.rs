//! Block mapping (the kernel's `ext4_map_blocks`, `extents.c`, `indirect.c`,
//! `block_validity.c`): logical to physical blocks through extent trees and block maps, read
//! and write, and the system zone every mapped block is checked against.
//!
//! | module | owns |
//! |---|---|
//! | this file | `Mapping`, `map_block` |
//! | `extents`, `extents_write` | extent trees: lookup; insert, split, merge, shift, remove |
//! | `indirect`, `indirect_write` | block maps: lookup; allocate, truncate |
//! | `migrate` | converting files between block maps and extents (`chattr +e` / `-e`) |
//! | `block_validity` | the system zone |
//! | `cluster` | new data blocks and freed ones in clusters (`bigalloc`) |
//!
//! # Locking
//! Callers hold the inode's `data_sem` (shared to read, exclusive to change) and, to change,
//! a journal handle; tree blocks are buffers changed under their data lock.
//!
//! ## This module
//! Block mapping for reads: one entry point over extents, block maps and inline data (the
//! read side of `ext4_map_blocks`).

pub(crate) mod block_validity;
pub(crate) mod cluster;
pub(crate) mod extents;
pub(crate) mod extents_write;
pub(crate) mod indirect;
pub(crate) mod indirect_write;
pub(crate) mod migrate;

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
