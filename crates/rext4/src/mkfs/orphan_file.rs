//! The orphan file (`ext2fs_create_orphan_file`): the first free inode after lost+found, its
//! blocks from the first free block on, each an empty slot array with the magic tail.

use super::Builder;
use crate::error::{Error, Result};
use crate::num::usize_from;
use rext4_format::features::Incompat;
use rext4_format::inode::S_IFREG;

impl Builder {
    pub(crate) fn make_orphan_file(&mut self, blocks: u32) -> Result<()> {
        // mke2fs takes them one at a time until none is left; refused before any is taken.
        if blocks == 0 {
            return Err(Error::InvalidInput("an orphan file of no blocks"));
        }
        if u64::from(blocks) > self.l.free_blocks {
            return Err(Error::NoSpace);
        }
        let ino = self.l.new_inode()?;
        self.l.inode_alloc_stats(ino, false);
        let bs = u64::from(self.l.geo.block_size);
        let n = u64::from(blocks);
        self.new_record(ino, S_IFREG | 0o600, 1);
        let (data, taken) = if self.l.geo.features.has_i(Incompat::EXTENTS) {
            let mut blks: Vec<u64> = Vec::with_capacity(usize_from(n));
            for _ in 0..n {
                let b = self.next_file_block(blks.last().copied())?;
                blks.push(b);
            }
            let runs = super::files::runs(&blks);
            let before = self.extent_blocks.len();
            self.set_extents(ino, &runs)?;
            let extra = (self.extent_blocks.len() - before) as u64;
            let taken = (self.clusters_of(&blks) + extra) * self.l.geo.ratio();
            (blks, taken)
        } else {
            self.map_blocks_indirect(ino, 0, n)?
        };
        for b in data {
            self.orphan_blocks.push((ino, b));
        }
        let mut r = self.record(ino);
        r.set_size(n * bs);
        r.set_blocks(taken * bs / 512);
        self.sb.s_orphan_file_inum.set(ino);
        Ok(())
    }
}
