//! The filesystem's shape (what `ext2fs_initialize` settles): blocks per group, the group
//! count, inodes per group filling whole inode-table blocks, reserved GDT blocks for online
//! growth (or `meta_bg` when they would not fit), and a last group too small for its metadata
//! cut off.

use super::params::{Features, Params};
use crate::error::{Error, Result};
use rext4_format::features::{Compat, Incompat, RoCompat};

#[derive(Clone, Debug)]
pub(crate) struct Geometry {
    pub(crate) block_size: u32,
    pub(crate) blocks_count: u64,
    pub(crate) r_blocks_count: u64,
    pub(crate) first_data_block: u64,
    pub(crate) blocks_per_group: u32,
    pub(crate) group_count: u32,
    /// `s_desc_size`: 64 with 64bit, else 0 (32-byte descriptors).
    pub(crate) desc_size_field: u16,
    pub(crate) desc_blocks: u32,
    pub(crate) inode_size: u16,
    pub(crate) inodes_per_group: u32,
    pub(crate) inode_blocks_per_group: u32,
    pub(crate) reserved_gdt_blocks: u32,
    pub(crate) log_groups_per_flex: u8,
    pub(crate) features: Features,
    /// log2 of blocks per cluster (0 without bigalloc).
    pub(crate) cluster_bits: u32,
    /// `s_raid_stride`.
    pub(crate) stride: u16,
    /// `s_backup_bgs` with `sparse_super2`: the groups other than 0 holding backups (0: none).
    pub(crate) backup_bgs: [u32; 2],
}

impl Geometry {
    /// Blocks per cluster.
    pub(crate) fn ratio(&self) -> u64 {
        1 << self.cluster_bits
    }
    /// `s_clusters_per_group`.
    pub(crate) fn clusters_per_group(&self) -> u32 {
        self.blocks_per_group >> self.cluster_bits
    }
    pub(crate) fn desc_size(&self) -> u32 {
        if self.desc_size_field == 0 {
            32
        } else {
            u32::from(self.desc_size_field)
        }
    }
    pub(crate) fn desc_per_block(&self) -> u32 {
        self.block_size / self.desc_size()
    }
    pub(crate) fn inodes_count(&self) -> u32 {
        // Cannot overflow: `compute` keeps the product within u32.
        self.inodes_per_group * self.group_count
    }
    pub(crate) fn group_first_block(&self, g: u32) -> u64 {
        self.first_data_block + u64::from(g) * u64::from(self.blocks_per_group)
    }
    pub(crate) fn group_last_block(&self, g: u32) -> u64 {
        if g + 1 == self.group_count {
            self.blocks_count - 1
        } else {
            self.group_first_block(g) + u64::from(self.blocks_per_group) - 1
        }
    }
    pub(crate) fn group_of_block(&self, b: u64) -> u32 {
        // Cannot truncate: every block of the filesystem is in a group numbered below 2^32.
        u32::try_from((b - self.first_data_block) / u64::from(self.blocks_per_group)).unwrap_or(u32::MAX)
    }
    pub(crate) fn addr_per_block(&self) -> u32 {
        self.block_size / 4
    }
    pub(crate) fn meta_bg(&self) -> bool {
        self.features.has_i(Incompat::META_BG)
    }
    pub(crate) fn sparse_super(&self) -> bool {
        self.features.has_r(RoCompat::SPARSE_SUPER)
    }

    /// `ext2fs_bg_has_super`.
    pub(crate) fn has_super(&self, g: u32) -> bool {
        if g == 0 {
            return true;
        }
        if self.features.has_c(Compat::SPARSE_SUPER2) {
            return self.backup_bgs.contains(&g);
        }
        if g <= 1 || !self.sparse_super() {
            return true;
        }
        if g & 1 == 0 {
            return false;
        }
        let root = |mut a: u32, b: u32| loop {
            if a < b {
                return false;
            }
            if a == b {
                return true;
            }
            if !a.is_multiple_of(b) {
                return false;
            }
            a /= b;
        };
        root(g, 3) || root(g, 5) || root(g, 7)
    }

    /// `ext2fs_super_and_bgd_loc2`: (superblock, old-style descriptor blocks, meta_bg
    /// descriptor block, blocks used), 0 where there is none.
    pub(crate) fn super_and_bgd_loc(&self, g: u32) -> (u64, u64, u64, u32) {
        let mut first = self.group_first_block(g);
        if first == 0 && self.block_size == 1024 {
            first = 1;
        }
        let old_desc_blocks = self.desc_blocks + self.reserved_gdt_blocks;
        let has_super = self.has_super(g);
        let (mut sb, mut old, mut new, mut used) = (0, 0, 0, 0);
        if has_super {
            sb = first;
            used += 1;
        }
        let per = self.desc_per_block();
        if !self.meta_bg() {
            if has_super {
                old = first + 1;
                used += old_desc_blocks;
            }
        } else {
            let r = g % per;
            if r == 0 || r == 1 || r == per - 1 {
                new = first + u64::from(has_super);
                used += 1;
            }
        }
        (sb, old, new, used)
    }

    /// Blocks in group `g`.
    pub(crate) fn group_blocks(&self, g: u32) -> u64 {
        self.group_last_block(g) - self.group_first_block(g) + 1
    }
}

/// `calc_reserved_gdt_blocks`: enough descriptor blocks to grow to 1024 times the size or to
/// 2^32 blocks, at most one block of pointers.
fn reserved_gdt_blocks(
    blocks: u64,
    first_data_block: u64,
    bpg: u32,
    per_block: u32,
    desc_blocks: u32,
    apb: u32,
) -> u32 {
    let max_blocks: u64 =
        if blocks < u64::from(u32::MAX) / 1024 { blocks * 1024 } else { u64::from(u32::MAX) };
    let rsv_groups = (max_blocks - first_data_block).div_ceil(u64::from(bpg));
    let rsv = u32::try_from(rsv_groups.div_ceil(u64::from(per_block)))
        .unwrap_or(u32::MAX)
        .wrapping_sub(desc_blocks);
    rsv.min(apb)
}

/// Lays out `p` as `ext2fs_initialize` does.
pub(crate) fn compute(p: &Params) -> Result<Geometry> {
    let bs = p.block_size;
    let mut features = p.features;
    let bigalloc = features.has_r(RoCompat::BIGALLOC);
    let cbits = p.cluster_bits;
    // Block 0 starts the first group when clusters are larger than 1 KiB.
    let first_data_block = u64::from(bs == 1024 && !bigalloc);
    let mut bpg = if bigalloc {
        // Clusters per group: a bitmap block's bits, less a byte's where the group's bytes
        // would reach 2^32; at most 65528.
        let log_cluster = bs.trailing_zeros() - 10 + cbits;
        let cpg = match p.per_group {
            Some(n) => n,
            None if log_cluster + 15 < 32 => bs * 8,
            None => (bs - 1) * 8,
        };
        u32::try_from(u64::from(cpg.min(65528)) << cbits)
            .map_err(|_| Error::InvalidInput("cluster size too large for a block group"))?
    } else {
        p.per_group.unwrap_or(bs * 8).min(65528)
    };
    let cluster_mask = (1u64 << cbits) - 1;
    let mut blocks_count = p.blocks_count & !cluster_mask;
    let mut r_blocks_count = p.r_blocks_count;
    if r_blocks_count >= p.blocks_count {
        return Err(Error::InvalidInput("too many reserved blocks"));
    }
    let desc_size_field: u16 = if features.has_i(Incompat::BIT64) { 64 } else { 0 };
    let desc_size = if desc_size_field == 0 { 32 } else { 64 };
    let per_block = bs / desc_size;
    let inode_size = p.inode_size;
    let ipb = bs / u32::from(inode_size);
    'retry: loop {
        let groups = (blocks_count.saturating_sub(first_data_block)).div_ceil(u64::from(bpg));
        let group_count = u32::try_from(groups).map_err(|_| Error::InvalidInput("too many block groups"))?;
        if group_count == 0 {
            return Err(Error::InvalidInput("device too small for a filesystem"));
        }
        let desc_blocks = group_count.div_ceil(per_block);
        let mut inodes = p.inodes_count;
        if inodes == 0 {
            let i = if bs >= 4096 { 1 } else { u64::from(4096 / bs) };
            inodes = (blocks_count / i).min(u64::from(u32::MAX));
        }
        inodes = inodes.max(12);
        let mut ipg = u32::try_from(inodes.div_ceil(u64::from(group_count))).unwrap_or(u32::MAX);
        if ipg > bs * 8 {
            if !bigalloc && bpg >= 256 {
                bpg -= 8;
                blocks_count = p.blocks_count;
                continue 'retry;
            }
            return Err(Error::InvalidInput("too many inodes"));
        }
        ipg = ipg.min(65536 - ipb);
        let (ipg, itb) = loop {
            let itb = (ipg * u32::from(inode_size)).div_ceil(bs);
            let mut ipg2 = itb * bs / u32::from(inode_size);
            ipg2 = ipg2.max(8) & !7;
            let itb = (ipg2 * u32::from(inode_size)).div_ceil(bs);
            if u64::from(ipg2) * u64::from(group_count) > u64::from(u32::MAX) {
                ipg -= 1;
                continue;
            }
            break (ipg2, itb);
        };
        // `-E resize=`'s count stands whatever follows (mke2fs's `set_field`).
        let mut rsv = match p.reserved_gdt {
            Some(r) => r,
            None if features.has_c(Compat::RESIZE_INODE) => {
                reserved_gdt_blocks(blocks_count, first_data_block, bpg, per_block, desc_blocks, bs / 4)
            }
            None => 0,
        };
        // 32-bit arithmetic, as mke2fs's: with clusters of a GiB a group's blocks times three
        // wraps there, and the same filesystem is made.
        if rsv + desc_blocks > bpg.wrapping_mul(3) / 4 {
            features.set_i(Incompat::META_BG);
            features.clear_c(Compat::RESIZE_INODE);
            rsv = p.reserved_gdt.unwrap_or(0);
        }
        let mut overhead = 3 + itb + rsv;
        if features.has_i(Incompat::META_BG) {
            overhead += 1;
        } else {
            overhead += desc_blocks;
        }
        if overhead > bpg {
            return Err(Error::InvalidInput("too many inodes for the block groups"));
        }
        let geo = Geometry {
            block_size: bs,
            blocks_count,
            r_blocks_count,
            first_data_block,
            blocks_per_group: bpg,
            group_count,
            desc_size_field,
            desc_blocks,
            inode_size,
            inodes_per_group: ipg,
            inode_blocks_per_group: itb,
            reserved_gdt_blocks: rsv,
            log_groups_per_flex: p.log_groups_per_flex,
            features,
            cluster_bits: cbits,
            stride: p.stride,
            backup_bgs: p.backup_bgs,
        };
        // A last group too small for its own metadata (and 50 blocks more) is dropped.
        let mut last_overhead = 2 + itb;
        let last_has_super = if features.has_c(Compat::SPARSE_SUPER2) {
            // The groups asked for, before the count settles them.
            p.backup_bgs[usize::from(group_count != 2)] != 0
        } else {
            geo.has_super(group_count - 1)
        };
        if last_has_super {
            last_overhead += 1 + desc_blocks + rsv;
        }
        let rem = (blocks_count - first_data_block) % u64::from(bpg);
        if group_count == 1 && rem != 0 && rem < u64::from(last_overhead) {
            return Err(Error::InvalidInput("device too small for a filesystem"));
        }
        if rem != 0 && rem < u64::from(last_overhead) + 50 {
            blocks_count -= rem;
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
            {
                let ratio = 100.0 * p.r_blocks_count as f64 / p.blocks_count as f64;
                r_blocks_count = (ratio * blocks_count as f64 / 100.0) as u64;
            }
            continue 'retry;
        }
        let mut geo = geo;
        if features.has_c(Compat::SPARSE_SUPER2) {
            // Within the groups there are, distinct, in order.
            let mut b = geo.backup_bgs.map(|g| g.min(group_count - 1));
            if b[0] == b[1] {
                b[1] = 0;
            }
            if b[0] > b[1] {
                b.swap(0, 1);
            }
            geo.backup_bgs = b;
        }
        return Ok(geo);
    }
}
