//! Mapping logical to physical blocks through ext2/ext3 block maps (the read side of the
//! kernel's `indirect.c`): 12 direct pointers, then single, double and triple indirect blocks.

use crate::error::{corrupt, CorruptKind, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use crate::map::Mapping;
use crate::num::usize_from;
use rext4_format::inode::{DIND_BLOCK, IND_BLOCK, NDIR_BLOCKS, TIND_BLOCK};
use rext4_format::PhysBlock;

impl FsInner {
    /// Maps logical block `lblk` of a block-mapped inode.
    pub(super) fn ind_map(&self, inode: &Inode, lblk: u32) -> Result<Mapping> {
        let disk = inode.disk();
        let ptrs = u64::from(self.sbi.block_size / 4);
        let mut l = u64::from(lblk);
        if l < NDIR_BLOCKS as u64 {
            let p = u64::from(disk.i_block[usize_from(l)].get());
            if p == 0 {
                return Ok(Mapping::Hole { len: 1 });
            }
            self.check_range(inode.ino, p, 1)?;
            // Count following direct pointers that continue the run.
            let mut len = 1;
            while l + len < NDIR_BLOCKS as u64
                && u64::from(disk.i_block[usize_from(l + len)].get()) == p + len
                && p + len < self.sbi.blocks_count
            {
                len += 1;
            }
            return Ok(Mapping::Mapped { pblk: p, len, unwritten: false });
        }
        l -= NDIR_BLOCKS as u64;
        // (root slot, levels below it, blocks covered by one entry at the top level)
        let mut span = ptrs;
        let mut chosen = None;
        for (slot, levels) in [(IND_BLOCK, 1u32), (DIND_BLOCK, 2), (TIND_BLOCK, 3)] {
            if l < span {
                chosen = Some((slot, levels));
                break;
            }
            l -= span;
            span = span.saturating_mul(ptrs);
        }
        let Some((slot, levels)) = chosen else {
            // Beyond what a block map can address: a hole to the end of the file's range.
            return Ok(Mapping::Hole { len: (1u64 << 32) - u64::from(lblk) });
        };
        let mut blk = u64::from(disk.i_block[slot].get());
        let mut covered = span; // blocks under `blk`
        for _ in 0..levels {
            if blk == 0 {
                // A missing indirect block: the whole range below it is a hole.
                return Ok(Mapping::Hole { len: (covered - l).min(u64::from(u32::MAX)) });
            }
            let buf = self.bread_owned(inode.ino, blk)?;
            let data = buf.data();
            covered /= ptrs;
            let idx = usize_from(l / covered);
            let read = |i: usize| {
                u64::from(u32::from_le_bytes([
                    data[4 * i],
                    data[4 * i + 1],
                    data[4 * i + 2],
                    data[4 * i + 3],
                ]))
            };
            let next = read(idx);
            l %= covered;
            if covered == 1 {
                if next == 0 {
                    return Ok(Mapping::Hole { len: 1 });
                }
                self.check_range(inode.ino, next, 1)?;
                let mut len = 1u64;
                while idx + usize_from(len) < usize_from(ptrs)
                    && read(idx + usize_from(len)) == next + len
                    && next + len < self.sbi.blocks_count
                {
                    len += 1;
                }
                return Ok(Mapping::Mapped { pblk: next, len, unwritten: false });
            }
            blk = next;
        }
        corrupt(CorruptKind::BlockMap {
            ino: inode.ino,
            block: PhysBlock(blk),
            what: "indirection deeper than the format allows",
        })
    }
}
