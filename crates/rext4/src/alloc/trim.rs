//! `FITRIM` (`ext4_trim_fs` and `ext4_trim_all_free` in mballoc.c): tells the device that the
//! free blocks of a range hold nothing (for an image file: punches them out, so the host gets
//! the space back). What `fstrim(8)` asks for.
//!
//! A group is trimmed with its bitmap buffer read-locked: allocations and frees in it, which
//! write the bitmap, wait until its free runs are discarded, so no block is handed out while
//! its discard is under way (the kernel marks the runs in use in the buddy instead). Blocks
//! freed by a transaction not yet committed (busy), set aside for a file's appends, or in a
//! metadata zone (a damaged bitmap may call the inode table free) are not discarded.
//!
//! # Locking
//! A group's bitmap `Buffer::data` (read) -> its `busy` and `prealloc` lists; no handle.

use crate::alloc::balloc::Avoid;
use crate::alloc::bitmap;
use crate::error::{Error, Result};
use crate::fs::FsInner;
use crate::num::usize_from;
use rext4_format::group_desc::BG_BLOCK_UNINIT;
use std::sync::atomic::Ordering;

impl FsInner {
    /// Discards the free blocks of `len` bytes from byte `start` in runs of at least `minlen`
    /// bytes; returns the bytes discarded (what `FITRIM` hands back in `fstrim_range.len`).
    /// `EINVAL` as ext4: a start past the last block, a length under one block, a minimum
    /// longer than a group. The range is clipped to the filesystem.
    pub(crate) fn trim_fs(&self, start: u64, len: u64, minlen: u64) -> Result<u64> {
        if self.journal.is_none() {
            // A read-only open may not write the device, and with `norecovery` the bitmaps
            // may not be the truth yet.
            return Err(Error::ReadOnly);
        }
        let sbi = &self.sbi;
        let bs = u64::from(sbi.block_size);
        let first = start / bs;
        let blocks = len / bs;
        // At least one block: runs are whole blocks (the device's discard granularity here).
        // In clusters from here on, as the bitmaps count (a cluster is a block without bigalloc).
        let bits = sbi.cluster_bits;
        let min = (minlen / bs).max(1).div_ceil(sbi.c2b(1));
        if min > u64::from(sbi.clusters_per_group) || first >= sbi.blocks_count || blocks == 0 {
            return Err(Error::InvalidInput("trim range"));
        }
        let last = first.saturating_add(blocks - 1).min(sbi.blocks_count - 1);
        let first = first.max(sbi.first_data_block);
        if last <= sbi.first_data_block {
            return Ok(0);
        }
        let mut trimmed = 0u64;
        let (g0, _) = sbi.block_group_offset(first);
        let (g1, _) = sbi.block_group_offset(last);
        for g in g0..=g1 {
            let st = &self.groups.state[g as usize];
            if u64::from(st.free_blocks.load(Ordering::Acquire)) < min {
                continue;
            }
            let gfirst = sbi.group_first_block(g);
            let n = u64::from(sbi.clusters_in_group(g));
            let lo = first.saturating_sub(gfirst) >> bits;
            let hi = ((last - gfirst) >> bits).min(n - 1);
            let whole = lo == 0 && hi == n - 1;
            let was = st.trimmed.load(Ordering::Acquire);
            if whole && was != 0 && min >= u64::from(was) {
                continue;
            }
            trimmed += self.trim_group(g, usize_from(lo), usize_from(hi) + 1, usize_from(min), whole)?;
        }
        Ok(trimmed * bs)
    }

    /// Discards the free runs of at least `min` clusters between bits `lo` and `hi` of group
    /// `g`; returns the blocks discarded. `whole`: the range is the whole group, which is
    /// then marked trimmed unless some of its free blocks were busy (blocks set aside for a
    /// file's appends clear the mark when they are given back).
    fn trim_group(&self, g: u32, lo: usize, hi: usize, min: usize, whole: bool) -> Result<u64> {
        let st = &self.groups.state[g as usize];
        let blk = self.groups.get(g).block_bitmap(self.sbi.desc_size);
        let uninit = || st.flags.load(Ordering::Acquire) & u32::from(BG_BLOCK_UNINIT) != 0;
        // A BLOCK_UNINIT group's bitmap is not on the device: its buffer is only locked here
        // (the allocation that initialises it writes it under this lock, then clears the flag).
        let buf = if uninit() { self.bcache.get_fresh(blk) } else { self.bread(blk, None)? };
        let guard = buf.data();
        let computed;
        let map: &[u8] = if uninit() {
            computed = self.init_block_bitmap(g).0;
            &computed
        } else {
            &guard
        };
        let (runs, none_busy) = {
            let pa = self.prealloc_ranges(g);
            let busy = self.busy_list(g);
            (free_runs(map, lo, hi, min, &Avoid { busy: &busy, pa: &pa }), busy.is_empty())
        };
        let gfirst = self.sbi.group_first_block(g);
        let bs = u64::from(self.sbi.block_size);
        let mut done = 0u64;
        let min_blocks = self.sbi.c2b(min as u64);
        for (off, len) in runs {
            let (start, len) = (gfirst + self.sbi.c2b(off as u64), self.sbi.c2b(len as u64));
            let mut discard = |s: u64, l: u64| {
                // Advice to the device: one that cannot discard does nothing, and a failed
                // discard loses nothing (the blocks are free either way).
                let _ = self.dev.discard(s * bs, l * bs);
                done += l;
            };
            if self.zones.clear_of(None, start, len) {
                discard(start, len);
                continue;
            }
            // The bitmap calls metadata free: discard only the blocks outside every zone.
            let mut run: Option<u64> = None;
            for b in start..=start + len {
                let clear = b < start + len && self.zones.clear_of(None, b, 1);
                match (run, clear) {
                    (None, true) => run = Some(b),
                    (Some(s), false) => {
                        if b - s >= min_blocks {
                            discard(s, b - s);
                        }
                        run = None;
                    }
                    _ => {}
                }
            }
        }
        if whole && none_busy {
            // Under the bitmap lock, which a free takes to clear it: no free is missed. (Cannot
            // truncate: `min` is at most a group's blocks.)
            #[allow(clippy::cast_possible_truncation)]
            st.trimmed.store(min as u32, Ordering::Release);
        }
        drop(guard);
        Ok(done)
    }
}

/// The runs of clear bits of `map` between `lo` and `hi`, of at least `min` bits, that do
/// not touch what `avoid` names: (offset, length) each.
fn free_runs(map: &[u8], lo: usize, hi: usize, min: usize, avoid: &Avoid<'_>) -> Vec<(usize, usize)> {
    bitmap::free_runs(map, lo, hi, usize::MAX, |i| avoid.next_after(i)).filter(|&(_, l)| l >= min).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::group::BusyList;

    #[test]
    fn runs_skip_used_busy_and_short() {
        // Bits 0-3 used, 4-11 free, 12 used, 13-15 free, 16-31 free but 20-23 busy.
        let mut map = vec![0u8; 4];
        for i in [0, 1, 2, 3, 12] {
            bitmap::set(&mut map, i);
        }
        let mut busy = BusyList::default();
        busy.push(20, 4, 7);
        let avoid = Avoid { busy: &busy, pa: &[] };
        assert_eq!(free_runs(&map, 0, 32, 1, &avoid), vec![(4, 8), (13, 7), (24, 8)]);
        assert_eq!(free_runs(&map, 0, 32, 8, &avoid), vec![(4, 8), (24, 8)]);
        // Clipped to the range asked for.
        assert_eq!(free_runs(&map, 6, 26, 1, &avoid), vec![(6, 6), (13, 7), (24, 2)]);
        let pa = [(26u32, 2u32)];
        let avoid = Avoid { busy: &busy, pa: &pa };
        assert_eq!(free_runs(&map, 24, 32, 1, &avoid), vec![(24, 2), (28, 4)]);
    }
}
