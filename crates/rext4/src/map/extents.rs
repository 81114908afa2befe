//! Mapping logical to physical blocks through an extent tree (the read side of the kernel's
//! `extents.c`: `ext4_find_extent`, `ext4_ext_map_blocks`).

use crate::cache::buffer::{Buffer, Verified};
use crate::error::{corrupt, Corrupt, CorruptKind, Error, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use crate::map::Mapping;
use rext4_format::extent::{self as fe, Node, NodeError};
use rext4_format::{InodeNo, PhysBlock};
use std::sync::Arc;

/// One past the largest logical block an extent can map.
const LBLK_END: u64 = 1 << 32;

fn node_error(ino: InodeNo, block: Option<u64>, e: NodeError) -> Error {
    let what = match e {
        NodeError::BadMagic => "bad header magic",
        NodeError::BadCount => "entry count exceeds capacity",
        NodeError::BadDepth => "depth too large",
    };
    Error::Corrupt(Corrupt(CorruptKind::ExtentTree { ino, block: block.map(PhysBlock), what }))
}

enum Step {
    Done(Mapping),
    /// Read this child block, whose depth must be the given one.
    Descend(u64, u16),
}

impl FsInner {
    /// Maps logical block `lblk` of an extent-mapped inode.
    pub(super) fn ext_map(&self, inode: &Inode, lblk: u32) -> Result<Mapping> {
        let ino = inode.ino;
        // Only i_block is read: a copy of its 60 bytes, not a decode of the whole record.
        let mut root = [0u8; 60];
        inode.with_disk(|d| root.copy_from_slice(d.i_block_bytes()));
        // First logical block known to lie beyond the subtree we are in: it bounds holes.
        let mut next_start = LBLK_END;
        let mut depth = None;
        let mut block: Option<(u64, Arc<Buffer>)> = None;
        loop {
            let step = {
                let guard;
                let node = match &block {
                    None => Node::parse(&root).map_err(|e| node_error(ino, None, e))?,
                    Some((blk, buf)) => {
                        guard = buf.data();
                        Node::parse(&guard).map_err(|e| node_error(ino, Some(*blk), e))?
                    }
                };
                if let Some(expected) = depth {
                    if node.depth() != expected {
                        let block = block.as_ref().map(|(b, _)| PhysBlock(*b));
                        let what = "depth does not match parent";
                        return corrupt(CorruptKind::ExtentTree { ino, block, what });
                    }
                }
                self.ext_step(ino, &node, lblk, &mut next_start)?
            };
            match step {
                Step::Done(m) => return Ok(m),
                Step::Descend(child, child_depth) => {
                    depth = Some(child_depth);
                    block = Some((child, self.read_extent_block(inode, child)?));
                }
            }
        }
    }

    fn ext_step(&self, ino: InodeNo, node: &Node<'_>, lblk: u32, next_start: &mut u64) -> Result<Step> {
        let lblk64 = u64::from(lblk);
        let Some(i) = node.search(lblk) else {
            // Before the first entry: a hole up to it.
            let first = if node.is_empty() { *next_start } else { u64::from(node.first_block(0)) };
            let len = first.min(*next_start).saturating_sub(lblk64).max(1);
            return Ok(Step::Done(Mapping::Hole { len }));
        };
        if i + 1 < node.len() {
            *next_start = (*next_start).min(u64::from(node.first_block(i + 1)));
        }
        if node.depth() > 0 {
            return Ok(Step::Descend(node.index(i).leaf(), node.depth() - 1));
        }
        let e = node.extent(i);
        let start = u64::from(e.ee_block.get());
        let end = start + u64::from(e.len());
        if lblk64 >= end {
            let len = next_start.saturating_sub(lblk64).max(1);
            return Ok(Step::Done(Mapping::Hole { len }));
        }
        self.check_range(ino, e.start(), u64::from(e.len()))?;
        let pblk = e.start() + (lblk64 - start);
        let len = (end - lblk64).min(next_start.saturating_sub(lblk64)).max(1);
        Ok(Step::Done(Mapping::Mapped { pblk, len, unwritten: e.is_unwritten() }))
    }

    /// Reads an extent tree block and checks its header and checksum (once per load).
    pub(super) fn read_extent_block(&self, inode: &Inode, blk: u64) -> Result<Arc<Buffer>> {
        let ino = inode.ino;
        let buf = self.bread_owned(ino, blk)?;
        let csum = self.sbi.metadata_csum;
        let seed = inode.csum_seed;
        buf.verify(Verified::ExtentBlock, |data| {
            Node::parse(data).map_err(|e| node_error(ino, Some(blk), e))?;
            if csum && !fe::verify_block_checksum(data, seed) {
                return corrupt(CorruptKind::ExtentChecksum { ino, block: PhysBlock(blk) });
            }
            Ok(())
        })?;
        Ok(buf)
    }
}
