//! The first inodes (`create_root_dir`, `create_lost_and_found`, `reserve_inodes` and
//! `create_bad_block_inode` of `mke2fs`): the root directory, `lost+found` grown to 16 KiB
//! (at least two blocks), inodes 3-10 reserved, and the empty bad-block inode.

use super::Builder;
use crate::error::Result;
use crate::num::usize_from;
use rext4_format::dirent::{rec_len_to_disk, FT_DIR, TAIL_SIZE};
use rext4_format::features::{Incompat, RoCompat};
use rext4_format::inode::{Timestamp, INLINE_DATA_FL, S_IFDIR};
use rext4_format::inode_record::TimeField;

pub(crate) const ROOT_INO: u32 = 2;
pub(crate) const LPF_INO: u32 = 11;

impl Builder {
    fn csum(&self) -> bool {
        self.l.geo.features.has_r(RoCompat::METADATA_CSUM)
    }

    fn filetype(&self) -> bool {
        self.l.geo.features.has_i(Incompat::FILETYPE)
    }

    /// A directory block holding `entries` (inode, name), the last entry taking the rest of
    /// the block, with a checksum tail (filled in at write time) under metadata_csum.
    pub(crate) fn dir_block(&self, entries: &[(u32, &[u8])]) -> Vec<u8> {
        let bs = usize_from(u64::from(self.l.geo.block_size));
        let mut b = vec![0u8; bs];
        let end = if self.csum() { bs - TAIL_SIZE } else { bs };
        let mut pos = 0;
        for (i, (ino, name)) in entries.iter().enumerate() {
            let rec = if i + 1 == entries.len() { end - pos } else { (8 + name.len() + 3) & !3 };
            b[pos..pos + 4].copy_from_slice(&ino.to_le_bytes());
            let rl = rec_len_to_disk(u32::try_from(rec).unwrap_or(0), self.l.geo.block_size);
            b[pos + 4..pos + 6].copy_from_slice(&rl.to_le_bytes());
            b[pos + 6] = u8::try_from(name.len()).unwrap_or(0);
            b[pos + 7] = if self.filetype() && *ino != 0 { FT_DIR } else { 0 };
            b[pos + 8..pos + 8 + name.len()].copy_from_slice(name);
            pos += rec;
        }
        if entries.is_empty() {
            let rl = rec_len_to_disk(u32::try_from(end).unwrap_or(0), self.l.geo.block_size);
            b[4..6].copy_from_slice(&rl.to_le_bytes());
        }
        if self.csum() {
            // The tail's checksum is put in at write time (see `write.rs`).
            rext4_format::dirent::put_leaf_tail(&mut b, 0);
        }
        b
    }

    /// The root directory and lost+found.
    pub(crate) fn make_root_and_lpf(&mut self, root_owner: (u32, u32)) -> Result<()> {
        let flex_start = 0;
        // Root: one block, from the start of its (flex) group.
        let root_blk = self.l.new_block(flex_start)?;
        let block = self.dir_block(&[(ROOT_INO, b"."), (ROOT_INO, b"..")]);
        self.new_record(ROOT_INO, S_IFDIR | 0o755, 2);
        {
            let mut r = self.record(ROOT_INO);
            r.set_uid(root_owner.0);
            r.set_gid(root_owner.1);
        }
        self.dir_blocks.insert(root_blk, (ROOT_INO, block));
        self.map_small_file(ROOT_INO, &[root_blk])?;
        self.l.alloc_stats(root_blk);
        self.l.inode_alloc_stats(ROOT_INO, true);

        // lost+found (`ext2fs_new_inode` finds the first inode after the reserved ones),
        // 0700: inline at first where inline_data is on (its first expansion then
        // turns it into one block), else one block; grown to 16 KiB and two blocks.
        let inline = self.l.geo.features.has_i(Incompat::INLINE_DATA);
        let lpf = self.l.new_inode()?;
        debug_assert_eq!(lpf, LPF_INO, "nothing past the reserved inodes is in use yet");
        let bs = self.l.geo.block_size;
        let mut target = 0u32;
        let mut grow = 0;
        for _ in 1..12 {
            target += bs;
            if target >= 16 * 1024 && target >= 2 * bs {
                break;
            }
            grow += 1;
        }
        let nblocks = if inline { grow } else { grow + 1 };
        let mut blks = Vec::with_capacity(nblocks);
        // `ext2fs_find_inode_goal`: the start of the (flex) group holding the inode, but
        // from block 0 for a block converted from inline data.
        let mut goal = if inline {
            flex_start
        } else {
            let mut g = (lpf - 1) / self.l.geo.inodes_per_group;
            if self.l.geo.log_groups_per_flex != 0 {
                g &= !((1u32 << self.l.geo.log_groups_per_flex) - 1);
            }
            self.l.geo.group_first_block(g)
        };
        for i in 0..nblocks {
            // A block in the cluster the last one began is the directory's already.
            let fresh = i == 0 || !self.l.same_cluster_next(goal);
            let b = if fresh { self.l.new_block(goal)? } else { goal + 1 };
            let block = if i == 0 && inline {
                // Converted from inline data: the emptied inline space stays an entry.
                self.dir_block(&[(LPF_INO, b"."), (ROOT_INO, b".."), (0, b"")])
            } else if i == 0 {
                self.dir_block(&[(LPF_INO, b"."), (ROOT_INO, b"..")])
            } else {
                self.dir_block(&[])
            };
            self.dir_blocks.insert(b, (LPF_INO, block));
            if fresh {
                self.l.alloc_stats(b);
            }
            if i == 0 && !inline {
                // ext2fs_mkdir counts the inode before the directory grows.
                self.l.inode_alloc_stats(LPF_INO, true);
            }
            blks.push(b);
            goal = b;
        }
        if inline {
            self.l.inode_alloc_stats(LPF_INO, true);
        }
        self.new_record(LPF_INO, S_IFDIR | 0o700, 2);
        self.map_small_file(LPF_INO, &blks)?;
        if inline {
            // The in-inode xattr area that held `system.data` keeps its header.
            let raw = self.inodes.get_mut(&LPF_INO).map(|r| &mut r[160..164]);
            if let Some(h) = raw {
                h.copy_from_slice(&0xEA02_0000u32.to_le_bytes());
            }
            let mut r = self.record(LPF_INO);
            r.set_flags(r.flags() & !INLINE_DATA_FL);
        }
        // Link lost+found into the root (ext2fs_link splits `..`'s slack).
        let block = self.dir_block(&[(ROOT_INO, b"."), (ROOT_INO, b".."), (LPF_INO, b"lost+found")]);
        self.dir_blocks.insert(root_blk, (ROOT_INO, block));
        self.record(ROOT_INO).set_links_count(3);

        // Inodes 3-10 reserved; the bad-block inode with its times and no blocks.
        // Their records are written, zero but for the checksum, as mke2fs leaves them.
        for ino in 3..11 {
            self.l.inode_alloc_stats(ino, false);
            self.record(ino);
        }
        self.l.inode_alloc_stats(1, false);
        let t = Timestamp { sec: self.now, nsec: 0 };
        let mut r = self.record(1);
        r.set_time(TimeField::Atime, t);
        r.set_time(TimeField::Mtime, t);
        r.set_time(TimeField::Ctime, t);
        Ok(())
    }
}
