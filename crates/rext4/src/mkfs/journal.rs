//! The internal journal (inode 8, `ext2fs_add_journal_inode3`): its size from the
//! filesystem's (`ext2fs_default_journal_size`), placed at the start of the emptiest group
//! near the middle of the filesystem with extents (`get_midpoint_journal_block`), or from
//! the first free block when block-mapped; a fresh jbd2 superblock in its first block and a
//! copy of its block map in the superblock (`s_jnl_blocks`).

use super::Builder;
use crate::error::{Error, Result};
use rext4_format::features::Incompat;
use rext4_format::inode::S_IFREG;
use rext4_format::jbd2::superblock::JournalSuperblock;
use zerocopy::IntoBytes;

pub(crate) const JOURNAL_INO: u32 = 8;

/// Runs of (first block, blocks).
type Runs = Vec<(u64, u64)>;

impl Builder {
    /// `get_midpoint_journal_block`.
    fn midpoint_journal_block(&self) -> u64 {
        let geo = &self.l.geo;
        let mid = (geo.blocks_count - geo.first_data_block) / 2;
        let mut group = geo.group_of_block(mid.max(geo.first_data_block));
        let log_flex = 1u32 << geo.log_groups_per_flex;
        // As the descriptor holds it: 16 bits without 64bit (a bigalloc group's count of
        // blocks, before clusters are counted again, can pass that).
        let mask = if geo.desc_size_field == 0 { 0xFFFF } else { u32::MAX };
        let free = |g: u32| self.l.groups[g as usize].free_blocks & mask;
        let start;
        if geo.log_groups_per_flex != 0 && group > log_flex {
            group &= !(log_flex - 1);
            while group < geo.group_count && free(group) == 0 {
                group += 1;
            }
            if group == geo.group_count {
                group = 0;
            }
            start = group;
        } else {
            start = group.saturating_sub(1);
        }
        let end = if group + 1 < geo.group_count { group + 1 } else { group };
        let mut best = start;
        for g in start + 1..=end {
            if free(g) > free(best) {
                best = g;
            }
        }
        geo.group_first_block(best)
    }

    /// Free blocks from `goal` on (wrapping once), as extents of at most `INIT_MAX_LEN`
    /// blocks, `n` blocks in all, taken a cluster at a time. A fifth extent no longer fits
    /// the inode: once it is complete, its leaf block is taken (as `ext2fs_fallocate` splits
    /// the tree on inserting it) and returned too.
    fn take_runs(&mut self, goal: u64, n: u64) -> Result<(Runs, Option<u64>)> {
        let mut leaf = None;
        let max = u64::from(rext4_format::extent::INIT_MAX_LEN);
        let (first, count) = (self.l.geo.first_data_block, self.l.geo.blocks_count);
        let ratio = self.l.geo.ratio();
        let goal = self.l.cluster_start(goal);
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut left = n;
        let step = crate::num::usize_from(ratio);
        let order = (goal..count).step_by(step).chain((first..goal).step_by(step));
        for b in order {
            if left == 0 {
                break;
            }
            if self.l.is_used(b) {
                continue;
            }
            let k = left.min(ratio);
            let extends = runs.last().is_some_and(|&(s, l)| s + l == b && l + k <= max);
            if !extends && runs.len() == 5 && leaf.is_none() {
                // From the block before the data, as `set_extents` places a leaf.
                leaf = Some(self.l.alloc_block(runs[0].0.saturating_sub(1))?);
                if self.l.is_used(b) {
                    continue;
                }
            }
            self.l.alloc_stats(b);
            match runs.last_mut() {
                Some((_, l)) if extends => *l += k,
                _ => runs.push((b, k)),
            }
            left -= k;
        }
        if left > 0 {
            return Err(Error::NoSpace);
        }
        Ok((runs, leaf))
    }

    /// Creates the journal of `blocks` blocks and `fc_blocks` of fast-commit area after
    /// them; returns its first block.
    pub(crate) fn make_journal(&mut self, blocks: u32, fc_blocks: u32) -> Result<u64> {
        let bs = u64::from(self.l.geo.block_size);
        let n = u64::from(blocks) + u64::from(fc_blocks);
        self.new_record(JOURNAL_INO, S_IFREG | 0o600, 1);
        let (first, taken) = if self.l.geo.features.has_i(Incompat::EXTENTS) {
            let goal = self.midpoint_journal_block();
            let (runs, leaf) = self.take_runs(goal, n)?;
            let before = self.extent_blocks.len();
            self.set_extents_with_leaf(JOURNAL_INO, &runs, leaf)?;
            let extra = (self.extent_blocks.len() - before) as u64;
            for &(s, l) in &runs {
                self.zero_ranges.push((s, l));
            }
            let ratio = self.l.geo.ratio();
            (runs[0].0, (n.div_ceil(ratio) + extra) * ratio)
        } else {
            let (data, taken) = self.map_blocks_indirect(JOURNAL_INO, 0, n)?;
            for &b in &data {
                self.zero_ranges.push((b, 1));
            }
            (data[0], taken)
        };
        let uuid = self.sb.s_uuid;
        let mut jsb = JournalSuperblock::new(self.l.geo.block_size, blocks + fc_blocks, uuid);
        jsb.s_num_fc_blks.set(fc_blocks);
        let mut block = vec![0u8; usize::try_from(bs).unwrap_or(4096)];
        block[..jsb.as_bytes().len()].copy_from_slice(jsb.as_bytes());
        self.blocks.push((first, block));
        let mut r = self.record(JOURNAL_INO);
        r.set_size(n * bs);
        r.set_blocks(taken * bs / 512);
        let ib: Vec<u8> = r.i_block_mut().to_vec();
        for i in 0..15 {
            let v = u32::from_le_bytes([ib[4 * i], ib[4 * i + 1], ib[4 * i + 2], ib[4 * i + 3]]);
            self.sb.s_jnl_blocks[i].set(v);
        }
        let size = n * bs;
        self.sb.s_jnl_blocks[15].set(rext4_format::split::hi32(size));
        self.sb.s_jnl_blocks[16].set(rext4_format::split::lo32(size));
        self.sb.s_jnl_backup_type = 1;
        self.sb.s_journal_inum.set(JOURNAL_INO);
        Ok(first)
    }
}
