//! The group descriptor table (the read side of `ext4_get_group_desc` and
//! `ext4_check_descriptors`): loaded and checked once at open.

use crate::buffer::BufferCache;
use crate::error::{corrupt, CorruptKind, Result};
use crate::super_block::SbInfo;
use rext4_format::features::Incompat;
use rext4_format::group_desc::GroupDesc;

/// Every group's descriptor, as read at open.
pub(crate) struct Groups {
    descs: Vec<GroupDesc>,
}

impl Groups {
    pub fn load(sbi: &SbInfo, cache: &BufferCache) -> Result<Self> {
        let mut descs = Vec::with_capacity(sbi.group_count as usize);
        let per_block = sbi.descs_per_block as usize;
        for i in 0..sbi.gdt_blocks {
            let blk = sbi.descriptor_block(i);
            if blk >= sbi.blocks_count {
                return corrupt(CorruptKind::GroupDesc {
                    group: (i * per_block as u64) as u32,
                    what: "descriptor block outside the filesystem",
                });
            }
            let buf = cache.get(blk)?;
            let data = buf.data();
            for d in data.chunks_exact(sbi.desc_size).take(per_block) {
                if descs.len() == sbi.group_count as usize {
                    break;
                }
                // Cannot fail: chunks are exactly desc_size (>= 32) bytes.
                descs.push(GroupDesc::parse(d, sbi.desc_size).unwrap());
            }
        }
        let groups = Groups { descs };
        for g in 0..sbi.group_count {
            groups.check(sbi, g)?;
        }
        Ok(groups)
    }

    /// Descriptor of group `g`; callers pass a group below `group_count`.
    pub fn get(&self, g: u32) -> &GroupDesc {
        &self.descs[g as usize]
    }

    fn check(&self, sbi: &SbInfo, g: u32) -> Result<()> {
        let d = self.get(g);
        let ds = sbi.desc_size;
        if sbi.metadata_csum {
            if d.bg_checksum.get() != d.csum_crc32c(sbi.csum_seed, g, ds) {
                return corrupt(CorruptKind::GroupDescChecksum { group: g });
            }
        } else if sbi.gdt_csum && d.bg_checksum.get() != d.csum_crc16(&sbi.sb.s_uuid, g, ds) {
            return corrupt(CorruptKind::GroupDescChecksum { group: g });
        }
        // Metadata of a group lives in the group, or anywhere with flex_bg.
        let (lo, hi) = if sbi.sb.incompat().contains(Incompat::FLEX_BG) {
            (sbi.first_data_block, sbi.blocks_count)
        } else {
            let first = sbi.group_first_block(g);
            (first, first + sbi.blocks_in_group(g))
        };
        let inside = |b: u64, n: u64| b >= lo && b.checked_add(n).is_some_and(|e| e <= hi);
        let sb_block = sbi.first_data_block;
        let what = if !inside(d.block_bitmap(ds), 1) || d.block_bitmap(ds) == sb_block {
            "block bitmap not in group"
        } else if !inside(d.inode_bitmap(ds), 1) || d.inode_bitmap(ds) == sb_block {
            "inode bitmap not in group"
        } else if !inside(d.inode_table(ds), sbi.inode_table_blocks) || d.inode_table(ds) == sb_block {
            "inode table not in group"
        } else if d.free_inodes_count(ds) > sbi.inodes_per_group {
            "free inode count too large"
        } else {
            return Ok(());
        };
        corrupt(CorruptKind::GroupDesc { group: g, what })
    }

    /// Sums of free blocks and free inodes over all groups (what statfs reports).
    pub fn free_totals(&self, sbi: &SbInfo) -> (u64, u64) {
        let ds = sbi.desc_size;
        self.descs.iter().fold((0, 0), |(b, i), d| {
            (b + u64::from(d.free_blocks_count(ds)), i + u64::from(d.free_inodes_count(ds)))
        })
    }
}
