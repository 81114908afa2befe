//! The formatter's files: inode records as `ext2fs_write_new_inode` fills them, and block
//! mapping for the few files `mke2fs` makes (extents in the inode, or block maps with their
//! indirect blocks allocated in file order).

use super::Builder;
use crate::error::{Error, Result};
use crate::num::usize_from;
use rext4_format::extent::{Extent, ExtentHeader, EXTENT_MAGIC, INIT_MAX_LEN};
use rext4_format::features::Incompat;
use rext4_format::inode::{Timestamp, EXTENTS_FL};
use rext4_format::inode_record::{InodeRecord, TimeField};
use rext4_format::split::{hi16_of_48, lo32};
use zerocopy::IntoBytes;

/// `blks` in file order as runs of (first physical block, length).
pub(crate) fn runs(blks: &[u64]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &b in blks {
        match runs.last_mut() {
            Some((s, l)) if *s + *l == b => *l += 1,
            _ => runs.push((b, 1)),
        }
    }
    runs
}

/// The extents of a file whose blocks were mapped one at a time, as (logical, physical) in
/// that order, as `ext2fs_extent_set_bmap` builds them: a block extends the extent before it,
/// else the one it precedes, else starts its own; extents that come to touch are not merged.
/// Returns (first physical, length) in logical order, for a file mapped from block 0 on
/// without holes.
pub(crate) fn extents_as_mapped(events: &[(u64, u64)]) -> Vec<(u64, u64)> {
    // (logical, physical, length), sorted by logical.
    let mut ext: Vec<(u64, u64, u64)> = Vec::new();
    let max = u64::from(INIT_MAX_LEN) - 1;
    for &(l, p) in events {
        // The extent at or before `l` (`ext2fs_extent_goto`), else the first.
        let at = ext.iter().rposition(|e| e.0 <= l).unwrap_or(0);
        let next = if ext.get(at).is_some_and(|e| e.0 <= l) { at + 1 } else { at };
        match ext.get(at).copied() {
            Some((el, ep, n)) if l == el + n && p == ep + n && n < max => ext[at].2 += 1,
            Some((el, ep, n)) if l + 1 == el && p + 1 == ep && n < max => ext[at] = (l, p, n + 1),
            _ => match ext.get(next).copied() {
                Some((el, ep, n)) if next != at && l + 1 == el && p + 1 == ep && n < max => {
                    ext[next] = (l, p, n + 1);
                }
                _ => {
                    let pos = ext.partition_point(|e| e.0 < l);
                    ext.insert(pos, (l, p, 1));
                }
            },
        }
    }
    ext.into_iter().map(|(_, p, n)| (p, n)).collect()
}

impl Builder {
    /// A new record for `ino`: `mode`, one link, every time `now` (and `i_crtime` with an
    /// extra area), `i_extra_isize` as `ext2fs_write_new_inode` sets it.
    pub(crate) fn new_record(&mut self, ino: u32, mode: u16, links: u16) -> &mut Vec<u8> {
        let isz = usize::from(self.l.geo.inode_size);
        let mut raw = vec![0u8; isz];
        let t = Timestamp { sec: self.now, nsec: 0 };
        {
            // Cannot fail: inode sizes are at least 128 bytes (checked in params).
            let mut r = InodeRecord::new(&mut raw[..]).expect("inode record of 128 bytes or more");
            if isz > 128 {
                r.set_extra_isize(32);
            }
            r.set_mode(mode);
            r.set_links_count(links);
            for f in [TimeField::Atime, TimeField::Ctime, TimeField::Mtime, TimeField::Crtime] {
                r.set_time(f, t);
            }
        }
        self.inodes.insert(ino, raw);
        // Cannot fail: inserted just above.
        self.inodes.get_mut(&ino).expect("record just inserted")
    }

    pub(crate) fn record(&mut self, ino: u32) -> InodeRecord<&mut [u8]> {
        let isz = usize::from(self.l.geo.inode_size);
        let raw = self.inodes.entry(ino).or_insert_with(|| vec![0u8; isz]);
        // Cannot fail: as in `new_record`.
        InodeRecord::new(&mut raw[..]).expect("inode record of 128 bytes or more")
    }

    /// Maps the blocks `blks` (contiguous or not, at most 12) of a small file or directory
    /// `ino` as its blocks from 0 on, and sets its size and block count to them.
    pub(crate) fn map_small_file(&mut self, ino: u32, blks: &[u64]) -> Result<()> {
        self.map_small_file_as(ino, blks, &runs(blks))
    }

    /// [`Builder::map_small_file`] with the extents given (`extents` runs of `blks`).
    pub(crate) fn map_small_file_as(&mut self, ino: u32, blks: &[u64], extents: &[(u64, u64)]) -> Result<()> {
        let bs = u64::from(self.l.geo.block_size);
        if self.l.geo.features.has_i(Incompat::EXTENTS) {
            self.set_extents(ino, extents)?;
        } else {
            let mut r = self.record(ino);
            let ib = r.i_block_mut();
            for (i, b) in blks.iter().enumerate() {
                // At most 12 blocks: all direct.
                ib[4 * i..4 * i + 4].copy_from_slice(&rext4_format::split::lo32(*b).to_le_bytes());
            }
        }
        let sectors = self.clusters_of(blks) * self.l.geo.ratio() * bs / 512;
        let mut r = self.record(ino);
        r.set_size(blks.len() as u64 * bs);
        r.set_blocks(sectors);
        Ok(())
    }

    /// The clusters `blks` take (as many as blocks without bigalloc), as `i_blocks` counts
    /// them.
    pub(crate) fn clusters_of(&self, blks: &[u64]) -> u64 {
        let bits = self.l.geo.cluster_bits;
        let mut c: Vec<u64> = blks.iter().map(|b| b >> bits).collect();
        c.sort_unstable();
        c.dedup();
        c.len() as u64
    }

    /// The next block of a file growing by one from `last` (`None` for its first): the next
    /// block of `last`'s cluster while it has one, else a new cluster from `last` on, as
    /// e2fsprogs extends directories and the orphan file.
    pub(crate) fn next_file_block(&mut self, last: Option<u64>) -> Result<u64> {
        match last {
            Some(b) if self.l.same_cluster_next(b) => Ok(b + 1),
            _ => self.l.alloc_block(last.unwrap_or(0)),
        }
    }

    /// Maps `runs` of (first physical block, length), logically contiguous from block 0, into
    /// `ino`'s extent tree: in the inode for up to four extents, else through one leaf block
    /// allocated from just before the data (as `ext2fs_fallocate` does for a journal that long).
    pub(crate) fn set_extents(&mut self, ino: u32, runs: &[(u64, u64)]) -> Result<()> {
        self.set_extents_with_leaf(ino, runs, None)
    }

    /// [`Builder::set_extents`] with the leaf block, if one is needed, allocated already.
    pub(crate) fn set_extents_with_leaf(
        &mut self,
        ino: u32,
        runs: &[(u64, u64)],
        leaf: Option<u64>,
    ) -> Result<()> {
        let mut extents = Vec::new();
        let mut lblk = 0u64;
        for &(start, len) in runs {
            let mut done = 0;
            while done < len {
                let n = (len - done).min(u64::from(INIT_MAX_LEN));
                let mut e = Extent {
                    ee_block: u32::try_from(lblk).map_err(|_| Error::FileTooBig)?.into(),
                    ee_len: u16::try_from(n).unwrap_or(INIT_MAX_LEN).into(),
                    ee_start_hi: hi16_of_48(start + done).into(),
                    ee_start_lo: lo32(start + done).into(),
                };
                e.set_start(start + done);
                extents.push(e);
                done += n;
                lblk += n;
            }
        }
        let header = |entries: usize, max: usize, depth: u16| ExtentHeader {
            eh_magic: EXTENT_MAGIC.into(),
            eh_entries: u16::try_from(entries).unwrap_or(0).into(),
            eh_max: u16::try_from(max).unwrap_or(0).into(),
            eh_depth: depth.into(),
            eh_generation: 0.into(),
        };
        let mut iblock = [0u8; 60];
        if extents.len() <= 4 {
            iblock[..12].copy_from_slice(header(extents.len(), 4, 0).as_bytes());
            for (i, e) in extents.iter().enumerate() {
                iblock[12 + 12 * i..24 + 12 * i].copy_from_slice(e.as_bytes());
            }
        } else {
            let bs = usize_from(u64::from(self.l.geo.block_size));
            let max = (bs - 12) / 12;
            if extents.len() > max {
                return Err(Error::InvalidInput("journal too fragmented"));
            }
            // As the split of the inode's root places it: from the block before the data.
            let goal = runs.first().map_or(0, |&(s, _)| s.saturating_sub(1));
            let leaf = match leaf {
                Some(b) => b,
                None => self.l.alloc_block(goal)?,
            };
            let mut block = vec![0u8; bs];
            block[..12].copy_from_slice(header(extents.len(), max, 0).as_bytes());
            for (i, e) in extents.iter().enumerate() {
                block[12 + 12 * i..24 + 12 * i].copy_from_slice(e.as_bytes());
            }
            self.extent_blocks.push((ino, leaf, block));
            iblock[..12].copy_from_slice(header(1, 4, 1).as_bytes());
            iblock[12..16].copy_from_slice(&0u32.to_le_bytes());
            iblock[16..20].copy_from_slice(&lo32(leaf).to_le_bytes());
            iblock[20..22].copy_from_slice(&hi16_of_48(leaf).to_le_bytes());
            // The split leaves the rest of the inode's root as it was: the second to fourth
            // extents stay behind the index entry, unused.
            for (i, e) in extents.iter().enumerate().take(4).skip(1) {
                iblock[12 + 12 * i..24 + 12 * i].copy_from_slice(e.as_bytes());
            }
        }
        let mut r = self.record(ino);
        r.set_flags(r.flags() | EXTENTS_FL);
        r.i_block_mut().copy_from_slice(&iblock);
        Ok(())
    }

    /// Allocates `n` data blocks for a block-mapped file, each indirect block just before the
    /// first block it maps, from `goal` on; fills `i_block` and returns every block it took
    /// (data and indirect), for `i_blocks`.
    pub(crate) fn map_blocks_indirect(&mut self, ino: u32, goal: u64, n: u64) -> Result<(Vec<u64>, u64)> {
        let apb = u64::from(self.l.geo.addr_per_block());
        let mut iblock = [0u32; 15];
        let mut data = Vec::with_capacity(usize_from(n));
        let mut taken = 0u64;
        // Indirect blocks being filled: (block, pointers).
        let mut ind: Option<(u64, Vec<u32>)> = None;
        let mut dind: Option<(u64, Vec<u32>)> = None;
        let mut pending: Vec<(u64, Vec<u32>)> = Vec::new();
        let mut next = goal;
        let alloc = |l: &mut super::layout::Layout, next: &mut u64| -> Result<u64> {
            let b = l.alloc_block(*next)?;
            *next = b + 1;
            Ok(b)
        };
        for i in 0..n {
            if i == 12 {
                let b = alloc(&mut self.l, &mut next)?;
                taken += 1;
                iblock[12] = lo32(b);
                ind = Some((b, Vec::new()));
            } else if i >= 12 + apb && (i - 12 - apb) % apb == 0 {
                if (i - 12 - apb) / apb >= apb {
                    return Err(Error::FileTooBig);
                }
                if let Some(full) = ind.take() {
                    pending.push(full);
                }
                if dind.is_none() {
                    let b = alloc(&mut self.l, &mut next)?;
                    taken += 1;
                    iblock[13] = lo32(b);
                    dind = Some((b, Vec::new()));
                }
                let b = alloc(&mut self.l, &mut next)?;
                taken += 1;
                if let Some((_, ptrs)) = dind.as_mut() {
                    ptrs.push(lo32(b));
                }
                ind = Some((b, Vec::new()));
            }
            let b = alloc(&mut self.l, &mut next)?;
            taken += 1;
            data.push(b);
            if i < 12 {
                iblock[usize_from(i)] = lo32(b);
            } else if let Some((_, ptrs)) = ind.as_mut() {
                ptrs.push(lo32(b));
            }
        }
        pending.extend(ind);
        pending.extend(dind);
        let bs = usize_from(u64::from(self.l.geo.block_size));
        for (blk, ptrs) in pending {
            let mut block = vec![0u8; bs];
            for (j, p) in ptrs.iter().enumerate() {
                block[4 * j..4 * j + 4].copy_from_slice(&p.to_le_bytes());
            }
            self.blocks.push((blk, block));
        }
        let mut r = self.record(ino);
        let ib = r.i_block_mut();
        for (j, p) in iblock.iter().enumerate() {
            ib[4 * j..4 * j + 4].copy_from_slice(&p.to_le_bytes());
        }
        Ok((data, taken))
    }
}
