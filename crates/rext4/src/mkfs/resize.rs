//! The resize inode (inode 7, `ext2fs_create_resize_inode`): a double-indirect block whose
//! entries are the primary reserved GDT blocks, each used as an indirect block listing the
//! same block in every backup group, so online growth finds them all reserved.

use super::Builder;
use crate::error::Result;
use crate::num::usize_from;
use rext4_format::inode::{Timestamp, S_IFREG};
use rext4_format::inode_record::TimeField;
use rext4_format::split::lo32;

pub(crate) const RESIZE_INO: u32 = 7;

impl Builder {
    /// Groups holding backups, in `list_backups` order: 1, then powers of 3, 5 and 7
    /// (every group from 1 without sparse_super).
    fn backup_groups(&self) -> Vec<u32> {
        let n = self.l.geo.group_count;
        if self.l.geo.features.has_c(rext4_format::features::Compat::SPARSE_SUPER2) {
            return self.l.geo.backup_bgs.into_iter().filter(|&g| g != 0).collect();
        }
        if !self.l.geo.sparse_super() {
            return (1..n).collect();
        }
        let mut v: Vec<u32> = Vec::new();
        for base in [3u64, 5, 7] {
            let mut p = 1u64;
            while p < u64::from(n) {
                v.push(u32::try_from(p).unwrap_or(u32::MAX));
                p *= base;
            }
        }
        v.sort_unstable();
        v.dedup();
        v
    }

    pub(crate) fn make_resize_inode(&mut self) -> Result<()> {
        let geo = &self.l.geo;
        let sb_blk = geo.first_data_block.max(u64::from(geo.block_size == 1024));
        let apb = geo.addr_per_block();
        let goal = sb_blk
            + u64::from(geo.desc_blocks)
            + u64::from(geo.reserved_gdt_blocks)
            + 2
            + u64::from(geo.inode_blocks_per_group);
        let (desc_blocks, rsv, bpg) =
            (geo.desc_blocks, geo.reserved_gdt_blocks, u64::from(geo.blocks_per_group));
        let bs = usize_from(u64::from(geo.block_size));
        let dind = self.l.alloc_block(goal)?;
        let mut dind_buf = vec![0u32; usize_from(u64::from(apb))];
        let mut count = 1u64;
        let backups = self.backup_groups();
        for rsv_off in 0..rsv {
            let gdt_off = (desc_blocks + rsv_off) % apb;
            let gdt_blk = sb_blk + 1 + u64::from(desc_blocks) + u64::from(rsv_off);
            dind_buf[usize_from(u64::from(gdt_off))] = lo32(gdt_blk);
            count += 1;
            let mut ind = vec![0u8; bs];
            for (last, g) in backups.iter().enumerate() {
                let expect = gdt_blk + u64::from(*g) * bpg;
                ind[4 * last..4 * last + 4].copy_from_slice(&lo32(expect).to_le_bytes());
                count += 1;
            }
            self.blocks.push((gdt_blk, ind));
        }
        let mut block = vec![0u8; bs];
        for (i, p) in dind_buf.iter().enumerate() {
            block[4 * i..4 * i + 4].copy_from_slice(&p.to_le_bytes());
        }
        self.blocks.push((dind, block));
        let size = (u64::from(apb) * u64::from(apb) + u64::from(apb) + 12) * bs as u64;
        let bs64 = bs as u64;
        let ratio = self.l.geo.ratio();
        self.new_record(RESIZE_INO, S_IFREG | 0o600, 1);
        let t = Timestamp { sec: self.now, nsec: 0 };
        let mut r = self.record(RESIZE_INO);
        r.set_size(size);
        // Every block counted as a cluster, as `ext2fs_iblk_add_blocks` counts them.
        r.set_blocks(count * ratio * bs64 / 512);
        r.set_time(TimeField::Ctime, t);
        let ib = r.i_block_mut();
        ib[13 * 4..14 * 4].copy_from_slice(&lo32(dind).to_le_bytes());
        Ok(())
    }
}
