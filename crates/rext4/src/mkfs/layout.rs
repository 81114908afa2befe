//! Where the metadata goes (`alloc_sb.c`, `alloc_tables.c`, and the allocation calls of
//! libext2fs that `mke2fs` makes): an in-memory block bitmap of the whole filesystem, each
//! group's counts and flags, the superblock copies and descriptor blocks reserved, then the
//! bitmaps and inode tables placed, packed per flex group as `ext2fs_allocate_group_table`
//! packs them.
//!
//! With bigalloc, tables are placed block by block as without it; then
//! [`Layout::convert_to_clusters`] marks every cluster holding a used block wholly used (as
//! `ext2fs_convert_subcluster_bitmap`), and from there on blocks are taken a whole cluster
//! at a time. The bitmap stays one bit per block, every block of a cluster alike.

use super::geometry::Geometry;
use crate::error::{Error, Result};
use crate::num::usize_from;
use rext4_format::group_desc::{BG_BLOCK_UNINIT, BG_INODE_UNINIT};

/// One group's descriptor as it is being built.
#[derive(Clone, Debug, Default)]
pub(crate) struct Group {
    pub(crate) block_bitmap: u64,
    pub(crate) inode_bitmap: u64,
    pub(crate) inode_table: u64,
    pub(crate) free_blocks: u32,
    pub(crate) free_inodes: u32,
    pub(crate) used_dirs: u32,
    pub(crate) flags: u16,
    pub(crate) itable_unused: u32,
}

/// The filesystem being laid out.
pub(crate) struct Layout {
    pub(crate) geo: Geometry,
    /// One bit per block, set when used.
    used: Vec<u64>,
    /// One bit per inode (inode `n` is bit `n - 1`), set when used.
    pub(crate) inode_used: Vec<u64>,
    pub(crate) groups: Vec<Group>,
    pub(crate) free_blocks: u64,
    pub(crate) free_inodes: u32,
}

fn test(map: &[u64], i: u64) -> bool {
    map[usize_from(i / 64)] & (1 << (i % 64)) != 0
}
fn set(map: &mut [u64], i: u64) {
    map[usize_from(i / 64)] |= 1 << (i % 64);
}

impl Layout {
    /// The empty filesystem of `ext2fs_initialize`: superblocks and descriptor blocks reserved
    /// and counted; every group's inode table and bitmaps counted as used unless flex_bg
    /// places them later.
    pub(crate) fn new(geo: Geometry) -> Result<Layout> {
        let words = usize::try_from(geo.blocks_count.div_ceil(64))
            .map_err(|_| Error::InvalidInput("too many blocks"))?;
        let mut l = Layout {
            used: vec![0; words],
            inode_used: vec![0; usize_from(u64::from(geo.inodes_count()).div_ceil(64))],
            groups: vec![Group::default(); usize_from(u64::from(geo.group_count))],
            free_blocks: 0,
            free_inodes: geo.inodes_count(),
            geo,
        };
        let csum = l.geo.features.has_group_csum();
        let ipg = l.geo.inodes_per_group;
        let mut reserved_inos = 11u32;
        let mut free = 0u64;
        for g in 0..l.geo.group_count {
            let mut gd = Group::default();
            if csum {
                if g + 1 != l.geo.group_count {
                    gd.flags |= BG_BLOCK_UNINIT;
                }
                gd.flags |= BG_INODE_UNINIT;
                let mut n = ipg;
                if reserved_inos > 0 {
                    if n > reserved_inos {
                        n -= reserved_inos;
                        reserved_inos = 0;
                    } else {
                        reserved_inos -= n;
                        n = 0;
                    }
                }
                gd.itable_unused = n;
            }
            let mut n = l.reserve_super_and_bgd(g);
            if l.geo.log_groups_per_flex != 0 {
                n += 2 + l.geo.inode_blocks_per_group;
            }
            free += u64::from(n);
            gd.free_blocks = n;
            gd.free_inodes = ipg;
            l.groups[usize_from(u64::from(g))] = gd;
        }
        l.free_blocks = free;
        Ok(l)
    }

    pub(crate) fn group(&mut self, g: u32) -> &mut Group {
        &mut self.groups[usize_from(u64::from(g))]
    }

    pub(crate) fn is_used(&self, b: u64) -> bool {
        test(&self.used, b)
    }

    /// Marks `b` used without touching any count.
    pub(crate) fn mark(&mut self, b: u64) {
        set(&mut self.used, b);
    }

    /// The first block of `b`'s cluster.
    pub(crate) fn cluster_start(&self, b: u64) -> u64 {
        b & !(self.geo.ratio() - 1)
    }

    /// `b` and `b + 1` lie in the same cluster: a file's next block needs no allocation.
    pub(crate) fn same_cluster_next(&self, b: u64) -> bool {
        self.geo.cluster_bits != 0 && self.cluster_start(b) == self.cluster_start(b + 1)
    }

    /// Every cluster with a used block becomes used whole (`ext2fs_convert_subcluster_bitmap`).
    pub(crate) fn convert_to_clusters(&mut self) {
        let ratio = self.geo.ratio();
        if ratio == 1 {
            return;
        }
        let mut c = 0;
        while c < self.geo.blocks_count {
            if self.first_used(c, ratio).is_some() {
                for b in c..c + ratio {
                    self.mark(b);
                }
            }
            c += ratio;
        }
    }

    /// `fix_cluster_bg_counts` of mke2fs: each group's free clusters and the filesystem's
    /// free blocks counted again from the bitmap.
    pub(crate) fn recount_free_clusters(&mut self) {
        let ratio = self.geo.ratio();
        let mut total = 0;
        for g in 0..self.geo.group_count {
            let first = self.geo.group_first_block(g);
            let n = self.geo.group_blocks(g);
            let free = (0..n).step_by(usize_from(ratio)).filter(|&i| !self.is_used(first + i)).count() as u64;
            self.group(g).free_blocks = u32::try_from(free).unwrap_or(u32::MAX);
            total += free * ratio;
        }
        self.free_blocks = total;
    }

    /// `ext2fs_reserve_super_and_bgd`: marks group `g`'s superblock and descriptor blocks and
    /// returns the blocks left once those and the group's own tables are taken.
    fn reserve_super_and_bgd(&mut self, g: u32) -> u32 {
        let (sb, old, new, used) = self.geo.super_and_bgd_loc(g);
        if sb != 0 || g == 0 {
            self.mark(sb);
        }
        if g == 0 && self.geo.block_size == 1024 && self.geo.cluster_bits != 0 {
            // Block 0 (the boot block) shares the superblock's cluster.
            self.mark(0);
        }
        if old != 0 {
            let mut n = u64::from(self.geo.desc_blocks + self.geo.reserved_gdt_blocks);
            if old + n >= self.geo.blocks_count {
                n = self.geo.blocks_count - old;
            }
            for b in old..old + n {
                self.mark(b);
            }
        }
        if new != 0 {
            self.mark(new);
        }
        let blocks = u32::try_from(self.geo.group_blocks(g)).unwrap_or(u32::MAX);
        blocks.wrapping_sub(2 + self.geo.inode_blocks_per_group + used)
    }

    /// The first used block in `[b, b + n)`, if any.
    fn first_used(&self, b: u64, n: u64) -> Option<u64> {
        let mut i = b;
        let end = b + n;
        while i < end {
            let w = self.used[usize_from(i / 64)] >> (i % 64);
            if w == 0 {
                i = (i / 64 + 1) * 64;
                continue;
            }
            let at = i + u64::from(w.trailing_zeros());
            return (at < end).then_some(at);
        }
        None
    }

    /// `ext2fs_get_free_blocks2`: the first run of `num` free blocks starting in
    /// `[start, finish)`, wrapping to the first data block at the end of the filesystem
    /// when `finish <= start`.
    pub(crate) fn get_free_blocks(&self, start: u64, finish: u64, num: u64) -> Option<u64> {
        let count = self.geo.blocks_count;
        let first = self.geo.first_data_block;
        let mut b = if start == 0 { first } else { start };
        let finish = if finish == 0 { start } else { finish };
        let num = num.max(1);
        loop {
            if b + num > count {
                if finish > start {
                    return None;
                }
                b = first;
            }
            match self.first_used(b, num) {
                None => return Some(b),
                Some(u) => {
                    let next = (u + 1).min(count.saturating_sub(num) + 1).max(b + 1);
                    if b < finish && finish <= next {
                        return None;
                    }
                    b = next;
                }
            }
        }
    }

    /// `ext2fs_new_block2`: the first free block at or after `goal`, else from the start.
    pub(crate) fn new_block(&self, goal: u64) -> Result<u64> {
        let count = self.geo.blocks_count;
        let first = self.geo.first_data_block;
        let goal = if goal == 0 || goal >= count { first } else { goal };
        let goal = self.cluster_start(goal);
        // Clusters are used whole (after `convert_to_clusters`): their first block says.
        let step = usize_from(self.geo.ratio());
        let find = |from: u64, to: u64| (from..to).step_by(step).find(|&b| !self.is_used(b));
        find(goal, count).or_else(|| find(first, goal)).ok_or(Error::NoSpace)
    }

    /// `ext2fs_block_alloc_stats2(+1)`: marks `b`'s cluster used and counts it.
    pub(crate) fn alloc_stats(&mut self, b: u64) {
        let start = self.cluster_start(b);
        let ratio = self.geo.ratio();
        for blk in start..start + ratio {
            self.mark(blk);
        }
        let g = self.geo.group_of_block(b);
        let gd = self.group(g);
        gd.free_blocks = gd.free_blocks.wrapping_sub(1);
        gd.flags &= !BG_BLOCK_UNINIT;
        self.free_blocks -= ratio;
    }

    /// Allocates a block at or after `goal` and counts it (`ext2fs_alloc_block2`).
    pub(crate) fn alloc_block(&mut self, goal: u64) -> Result<u64> {
        let b = self.new_block(goal)?;
        self.alloc_stats(b);
        Ok(b)
    }

    /// `ext2fs_inode_alloc_stats2(+1)`.
    pub(crate) fn inode_alloc_stats(&mut self, ino: u32, is_dir: bool) {
        set(&mut self.inode_used, u64::from(ino - 1));
        let ipg = self.geo.inodes_per_group;
        let g = (ino - 1) / ipg;
        let csum = self.geo.features.has_group_csum();
        let gd = self.group(g);
        gd.free_inodes -= 1;
        if is_dir {
            gd.used_dirs += 1;
        }
        gd.flags &= !BG_INODE_UNINIT;
        if csum {
            let first_unused = ipg - gd.itable_unused + g * ipg + 1;
            if ino >= first_unused {
                gd.itable_unused = g * ipg + ipg - ino;
            }
        }
        self.free_inodes -= 1;
    }

    /// `ext2fs_new_inode` for a child of the root: the first free inode from the first
    /// non-reserved one. Each group searched that has not initialised its inodes gets both
    /// its bitmaps initialised, as the kernel does (`check_inode_uninit`).
    pub(crate) fn new_inode(&mut self) -> Result<u32> {
        let ipg = self.geo.inodes_per_group;
        let found = (11..=self.geo.inodes_count())
            .find(|&i| !test(&self.inode_used, u64::from(i - 1)))
            .ok_or(Error::InvalidInput("too few inodes for the files mkfs makes"))?;
        if self.geo.features.has_group_csum() {
            for g in (11 - 1) / ipg..=(found - 1) / ipg {
                let gd = self.group(g);
                if gd.flags & BG_INODE_UNINIT != 0 {
                    gd.flags &= !(BG_INODE_UNINIT | BG_BLOCK_UNINIT);
                }
            }
        }
        Ok(found)
    }

    /// Takes `n` blocks from `b` out of the counts of the groups they lie in (flex_bg tables):
    /// a group's count loses clusters for an inode table (`whole`), one for a bitmap block,
    /// as `ext2fs_allocate_group_table` counts them (made right by `recount_free_clusters`).
    fn take_range(&mut self, b: u64, n: u64, whole: bool) {
        let bits = if whole { self.geo.cluster_bits } else { 0 };
        let mut blk = b;
        let mut left = n;
        while left > 0 {
            let g = self.geo.group_of_block(blk);
            let last = self.geo.group_last_block(g);
            let k = left.min(last - blk + 1);
            let gd = self.group(g);
            gd.free_blocks = gd.free_blocks.wrapping_sub(u32::try_from(k >> bits).unwrap_or(u32::MAX));
            gd.flags &= !BG_BLOCK_UNINIT;
            self.free_blocks -= k;
            blk += k;
            left -= k;
        }
    }

    /// `flexbg_offset`: where the next table of a flex group should start looking.
    fn flexbg_offset(&self, g: u32, start_blk: u64, rem_grp: u32, elem: u64) -> u64 {
        let flex = 1u32 << self.geo.log_groups_per_flex;
        let flexbg = g / flex;
        let mut size = u64::from(rem_grp) * elem;
        size = size.min(u64::from(self.geo.blocks_per_group / 4));
        if start_blk != 0 && start_blk < self.geo.blocks_count {
            if let Some(b) = self.get_free_blocks(start_blk, start_blk + size, elem) {
                return b;
            }
        }
        let start = self.geo.group_first_block(flex * flexbg);
        let last_grp = (g | (flex - 1)).min(self.geo.group_count - 1);
        let last_blk = self.geo.group_last_block(last_grp);
        self.get_free_blocks(start, last_blk, size)
            .or_else(|| self.get_free_blocks(start, last_blk, elem))
            .or_else(|| self.get_free_blocks(0, last_blk, elem))
            .unwrap_or(0)
    }

    /// `ext2fs_allocate_group_table` for group `g`.
    pub(crate) fn allocate_group_table(&mut self, g: u32) -> Result<()> {
        let mut group_blk = self.geo.group_first_block(g);
        let mut last_blk = self.geo.group_last_block(g);
        let flex = self.geo.features.has_i(rext4_format::features::Incompat::FLEX_BG)
            && self.geo.log_groups_per_flex != 0;
        let flexbg_size = if flex { 1u32 << self.geo.log_groups_per_flex } else { 0 };
        let (mut last_grp, mut rem) = (0, 0);
        if flex {
            last_grp = (g | (flexbg_size - 1)).min(self.geo.group_count - 1);
            rem = last_grp - g + 1;
        }
        // Without flex_bg a RAID stride staggers each group's bitmaps past its inode table's
        // room, by the stride times the group (`fs->stride`).
        let stride = u64::from(self.geo.stride);
        let mut start_blk = group_blk;
        if stride != 0 && !flex {
            let b = self.get_free_blocks(group_blk, last_blk, 1).ok_or(Error::NoSpace)?;
            start_blk = b + u64::from(self.geo.inode_blocks_per_group);
            start_blk += (stride * u64::from(g)) % (last_blk.saturating_sub(start_blk) + 1);
            if start_blk >= last_blk {
                start_blk = group_blk;
            }
        }
        let mut table_offset = 0u64;
        let itb = u64::from(self.geo.inode_blocks_per_group);
        if flex {
            let mut prev = 0;
            table_offset = u64::from(flexbg_size);
            if !g.is_multiple_of(flexbg_size) {
                prev = self.groups[usize_from(u64::from(g - 1))].block_bitmap + 1;
            } else if last_grp == self.geo.group_count - 1 {
                // The last flex group keeps its tables together.
                table_offset = u64::from(last_grp & (flexbg_size - 1));
                if table_offset == 0 {
                    table_offset = u64::from(flexbg_size);
                } else {
                    table_offset += 1;
                }
            }
            start_blk = self.flexbg_offset(g, prev, rem, 1);
            last_blk = self.geo.group_last_block(last_grp);
        }
        let bb = self
            .get_free_blocks(start_blk, last_blk, 1)
            .or_else(|| self.get_free_blocks(group_blk, last_blk, 1))
            .ok_or(Error::NoSpace)?;
        self.mark(bb);
        self.group(g).block_bitmap = bb;
        if flex {
            self.take_range(bb, 1, false);
            let prev = if !g.is_multiple_of(flexbg_size) {
                self.groups[usize_from(u64::from(g - 1))].inode_bitmap + 1
            } else {
                bb + table_offset
            };
            start_blk = self.flexbg_offset(g, prev, rem, 1);
            last_blk = self.geo.group_last_block(last_grp);
        }
        let ib = self
            .get_free_blocks(start_blk, last_blk, 1)
            .or_else(|| self.get_free_blocks(group_blk, last_blk, 1))
            .ok_or(Error::NoSpace)?;
        self.mark(ib);
        self.group(g).inode_bitmap = ib;
        if flex {
            self.take_range(ib, 1, false);
            let prev = if !g.is_multiple_of(flexbg_size) {
                self.groups[usize_from(u64::from(g - 1))].inode_table + itb
            } else {
                ib + table_offset
            };
            group_blk = self.flexbg_offset(g, prev, rem, itb);
            last_blk = self.geo.group_last_block(last_grp);
        }
        let it = self.get_free_blocks(group_blk, last_blk, itb).ok_or(Error::NoSpace)?;
        for b in it..it + itb {
            self.mark(b);
        }
        if flex {
            self.take_range(it, itb, true);
        }
        self.group(g).inode_table = it;
        Ok(())
    }

    /// Clusters in use from the first data block to the end (`ext2fs_count_used_clusters`).
    pub(crate) fn count_used(&self) -> u64 {
        let mut n = 0u64;
        for (i, w) in self.used.iter().enumerate() {
            let mut w = *w;
            let base = i as u64 * 64;
            if base < self.geo.first_data_block {
                w &= !1;
            }
            if base + 64 > self.geo.blocks_count {
                let keep = self.geo.blocks_count - base;
                if keep < 64 {
                    w &= (1u64 << keep) - 1;
                }
            }
            n += u64::from(w.count_ones());
        }
        // Clusters are used whole by now (`convert_to_clusters`).
        n >> self.geo.cluster_bits
    }

    /// Group `g`'s block bitmap as the block stores it, a bit per cluster: clusters past the
    /// group's end (the last group's, or a short `clusters_per_group`) marked used.
    pub(crate) fn block_bitmap_bytes(&self, g: u32) -> Vec<u8> {
        let bs = usize_from(u64::from(self.geo.block_size));
        let mut out = vec![0u8; bs];
        let first = self.geo.group_first_block(g);
        let bits = self.geo.cluster_bits;
        let n = self.geo.group_blocks(g) >> bits;
        for i in 0..n {
            if self.is_used(first + (i << bits)) {
                out[usize_from(i / 8)] |= 1 << (i % 8);
            }
        }
        for i in n..(bs as u64 * 8) {
            out[usize_from(i / 8)] |= 1 << (i % 8);
        }
        out
    }

    /// Group `g`'s inode bitmap block, padded past the group's inodes.
    pub(crate) fn inode_bitmap_bytes(&self, g: u32) -> Vec<u8> {
        let bs = usize_from(u64::from(self.geo.block_size));
        let mut out = vec![0u8; bs];
        let ipg = u64::from(self.geo.inodes_per_group);
        let base = u64::from(g) * ipg;
        for i in 0..ipg {
            if test(&self.inode_used, base + i) {
                out[usize_from(i / 8)] |= 1 << (i % 8);
            }
        }
        for i in ipg..(bs as u64 * 8) {
            out[usize_from(i / 8)] |= 1 << (i % 8);
        }
        out
    }
}
