//! Writing the formatted filesystem out (`ext2fs_close`): bitmaps of initialised groups,
//! group descriptors with their checksums and backups, the inode records, the special files'
//! blocks with their checksums, backup superblocks (marked not clean, as e2fsprogs leaves
//! them) and last the primary superblock.

use super::Builder;
use crate::dev::BlockDevice;
use crate::error::Result;
use crate::num::usize_from;
use rext4_format::checksum::{crc32c, inode_csum_seed};
use rext4_format::features::{Incompat, RoCompat};
use rext4_format::group_desc::{GroupDesc, BG_BLOCK_UNINIT, BG_INODE_UNINIT, BG_INODE_ZEROED};
use rext4_format::split::{hi16, hi32, lo16, lo32};
use rext4_format::superblock::{split_time, STATE_VALID, SUPERBLOCK_OFFSET};
use zerocopy::{FromZeros, IntoBytes};

/// Zeroes are written in pieces of this many bytes.
const ZERO_CHUNK: usize = 1 << 20;

impl Builder {
    fn bs(&self) -> u64 {
        u64::from(self.l.geo.block_size)
    }

    fn write_block(&self, dev: &dyn BlockDevice, blk: u64, data: &[u8], written: &mut u64) -> Result<()> {
        dev.write_at(data, blk * self.bs())?;
        *written += data.len() as u64;
        Ok(())
    }

    fn zero(&self, dev: &dyn BlockDevice, from: u64, len: u64, written: &mut u64) -> Result<()> {
        let zeros = vec![0u8; ZERO_CHUNK];
        let mut at = from;
        let end = from + len;
        while at < end {
            let n = usize_from((end - at).min(ZERO_CHUNK as u64));
            dev.write_at(&zeros[..n], at)?;
            at += n as u64;
        }
        *written += len;
        Ok(())
    }

    /// Writes everything; `zeroed` says the device reads as zeroes already.
    pub(crate) fn write(&mut self, dev: &dyn BlockDevice, zeroed: bool) -> Result<()> {
        let geo = self.l.geo.clone();
        let bs = self.bs();
        let csum = geo.features.has_r(RoCompat::METADATA_CSUM);
        let group_csum = geo.features.has_group_csum();
        let uuid = self.sb.s_uuid;
        let seed = if geo.features.has_i(Incompat::CSUM_SEED) {
            self.sb.s_checksum_seed.get()
        } else {
            rext4_format::checksum::csum_seed_from_uuid(&uuid)
        };
        let mut written = 0u64;

        if !zeroed {
            // What mke2fs wipes: the rest of the first 4 KiB after the boot sector, every
            // inode table, the journal, and the last 64 KiB of the device.
            self.zero(dev, SUPERBLOCK_OFFSET, 4096 - SUPERBLOCK_OFFSET, &mut written)?;
            for g in &self.l.groups {
                self.zero(dev, g.inode_table * bs, u64::from(geo.inode_blocks_per_group) * bs, &mut written)?;
            }
            for &(s, l) in &self.zero_ranges {
                self.zero(dev, s * bs, l * bs, &mut written)?;
            }
            let end = geo.blocks_count * bs;
            let tail = (64 * 1024).min(end);
            self.zero(dev, end - tail, tail, &mut written)?;
        }
        for g in self.l.groups.iter_mut() {
            g.flags |= BG_INODE_ZEROED;
        }

        // Special files' blocks, with their checksums.
        for (blk, data) in &self.blocks {
            self.write_block(dev, *blk, data, &mut written)?;
        }
        for (blk, (ino, data)) in &self.dir_blocks {
            let mut d = data.clone();
            if csum {
                rext4_format::dirent::set_leaf_tail(&mut d, inode_csum_seed(seed, *ino, 0));
            }
            self.write_block(dev, *blk, &d, &mut written)?;
        }
        for (ino, blk, data) in &self.extent_blocks {
            let mut d = data.clone();
            if csum {
                rext4_format::extent::set_block_checksum(&mut d, inode_csum_seed(seed, *ino, 0));
            }
            self.write_block(dev, *blk, &d, &mut written)?;
        }
        for &(ino, blk) in &self.orphan_blocks {
            let mut d = vec![0u8; usize_from(bs)];
            let off = d.len() - rext4_format::orphan::TAIL_SIZE;
            d[off..off + 4].copy_from_slice(&rext4_format::orphan::ORPHAN_BLOCK_MAGIC.to_le_bytes());
            if csum {
                rext4_format::orphan::set_tail(&mut d, inode_csum_seed(seed, ino, 0), blk);
            }
            self.write_block(dev, blk, &d, &mut written)?;
        }

        // Inode records into their tables.
        let isz = u64::from(geo.inode_size);
        for (ino, raw) in &self.inodes {
            let mut r = raw.clone();
            if csum {
                rext4_format::inode::set_inode_checksum(&mut r, inode_csum_seed(seed, *ino, 0));
            }
            let g = (ino - 1) / geo.inodes_per_group;
            let idx = u64::from((ino - 1) % geo.inodes_per_group);
            let at = self.l.groups[usize_from(u64::from(g))].inode_table * bs + idx * isz;
            dev.write_at(&r, at)?;
            written += isz;
        }

        // Bitmaps of the groups that have them, and the descriptors.
        let ds = usize_from(u64::from(geo.desc_size()));
        let mut table = vec![0u8; usize_from(u64::from(geo.desc_blocks) * bs)];
        for gi in 0..geo.group_count {
            let g = self.l.groups[usize_from(u64::from(gi))].clone();
            let mut d = GroupDesc::new_zeroed();
            d.bg_block_bitmap_lo.set(lo32(g.block_bitmap));
            d.bg_inode_bitmap_lo.set(lo32(g.inode_bitmap));
            d.bg_inode_table_lo.set(lo32(g.inode_table));
            d.bg_free_blocks_count_lo.set(lo16(g.free_blocks));
            d.bg_free_inodes_count_lo.set(lo16(g.free_inodes));
            d.bg_used_dirs_count_lo.set(lo16(g.used_dirs));
            d.bg_flags.set(g.flags);
            d.bg_itable_unused_lo.set(lo16(g.itable_unused));
            if ds >= 64 {
                d.bg_block_bitmap_hi.set(hi32(g.block_bitmap));
                d.bg_inode_bitmap_hi.set(hi32(g.inode_bitmap));
                d.bg_inode_table_hi.set(hi32(g.inode_table));
                d.bg_free_blocks_count_hi.set(hi16(g.free_blocks));
                d.bg_free_inodes_count_hi.set(hi16(g.free_inodes));
                d.bg_used_dirs_count_hi.set(hi16(g.used_dirs));
                d.bg_itable_unused_hi.set(hi16(g.itable_unused));
            }
            if !(group_csum && g.flags & BG_BLOCK_UNINIT != 0) {
                let bm = self.l.block_bitmap_bytes(gi);
                if csum {
                    let c = crc32c(seed, &bm[..usize_from(u64::from(geo.clusters_per_group() / 8))]);
                    d.bg_block_bitmap_csum_lo.set(lo16(c));
                    if ds >= 64 {
                        d.bg_block_bitmap_csum_hi.set(hi16(c));
                    }
                }
                self.write_block(dev, g.block_bitmap, &bm, &mut written)?;
            }
            if !(group_csum && g.flags & BG_INODE_UNINIT != 0) {
                let bm = self.l.inode_bitmap_bytes(gi);
                if csum {
                    let c = crc32c(seed, &bm[..usize_from(u64::from(geo.inodes_per_group / 8))]);
                    d.bg_inode_bitmap_csum_lo.set(lo16(c));
                    if ds >= 64 {
                        d.bg_inode_bitmap_csum_hi.set(hi16(c));
                    }
                }
                self.write_block(dev, g.inode_bitmap, &bm, &mut written)?;
            }
            if csum {
                let c = d.csum_crc32c(seed, gi, ds);
                d.bg_checksum.set(c);
            } else if group_csum {
                let c = d.csum_crc16(&uuid, gi, ds);
                d.bg_checksum.set(c);
            }
            let at = usize_from(u64::from(gi)) * ds;
            d.encode_into(&mut table[at..at + ds], ds);
        }

        // Superblock counts.
        self.sb.set_free_blocks_count(self.l.free_blocks);
        self.sb.s_free_inodes_count.set(self.l.free_inodes);
        let (lo, hi) = split_time(self.now);
        self.sb.s_wtime.set(lo);
        self.sb.s_wtime_hi = hi;

        // Descriptor blocks and backup superblocks, group by group.
        let f = geo.features;
        let counts_writes = f.has_i(Incompat::FLEX_BG)
            || f.has_r(RoCompat::HUGE_FILE)
            || f.has_r(RoCompat::GDT_CSUM)
            || f.has_r(RoCompat::DIR_NLINK)
            || f.has_r(RoCompat::METADATA_CSUM)
            || f.has_r(RoCompat::EXTRA_ISIZE);
        let old_desc_blocks = u64::from(geo.desc_blocks);
        let per = u64::from(geo.desc_per_block());
        if counts_writes {
            // What was written, in KiB, as the superblock counts lifetime writes (mke2fs
            // counts its own I/O, which differs a little: its zeroing of the device's end).
            self.sb.s_kbytes_written.set(1 + (written >> 10));
        }
        for gi in 0..geo.group_count {
            let (sb_blk, old, new, _) = geo.super_and_bgd_loc(gi);
            if gi != 0 && sb_blk != 0 {
                let mut backup = self.sb.clone();
                backup.s_block_group_nr.set(u16::try_from(gi).unwrap_or(u16::MAX));
                backup.s_state.set(backup.s_state.get() & !STATE_VALID);
                backup.update_checksum();
                dev.write_at(backup.as_bytes(), sb_blk * bs)?;
            }
            if old != 0 {
                dev.write_at(&table[..usize_from(old_desc_blocks * bs)], old * bs)?;
            }
            if new != 0 {
                let mb = u64::from(gi) / per;
                let from = usize_from(mb * bs);
                dev.write_at(&table[from..from + usize_from(bs)], new * bs)?;
            }
        }
        self.sb.s_block_group_nr.set(0);
        self.sb.update_checksum();
        dev.write_at(self.sb.as_bytes(), SUPERBLOCK_OFFSET)?;
        dev.flush()?;
        Ok(())
    }
}
