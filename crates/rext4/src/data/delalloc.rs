//! Delayed allocation (the kernel's `ext4_da_write_begin`/`ext4_da_write_end` and
//! `ext4_da_reserve_space`): a write into a hole copies its bytes into the file's *dirty
//! pages* and reserves one block per new page in a counter beside the free-block counts, so
//! that `ENOSPC` comes from the write and never from writeback. Blocks are chosen later, when
//! the pages are written back (data/writeback.rs), for whole runs of pages at once, so a file
//! written by many small appends, beside others, ends in few extents; a file deleted before
//! then never allocates at all.
//!
//! # Invariants
//! 1. A dirty page's block is a hole in the file's map: a write over mapped blocks writes
//!    them in place (as `overwrite` does), and everything that changes or reads the map other
//!    than `read(2)` (truncate, fallocate, SEEK_DATA/HOLE, the general write path) writes the
//!    file back first, under `op_lock`.
//! 2. Reads copy dirty pages over what the device holds (holes, so zeros), under `data_sem`
//!    shared; writeback turns pages into mapped blocks under `data_sem` exclusive, so a read
//!    sees a block either as a page or as written data.
//! 3. The bytes of a dirty page past the file's size are zeros (pages start zeroed, and the
//!    size only shrinks after a writeback).
//! 4. Size and times a delayed write sets are changed in memory only; the file is listed for
//!    writeback until they are journaled (its listing holds the inode in the cache).
//! 5. `Writeback::dirty_blocks` is the number of dirty pages of all files; allocations other
//!    than writeback's leave that many free blocks untouched.

use crate::error::Result;
use crate::fs::FsInner;
use crate::inode::write::{now, raw_flags, raw_size, raw_touch_cm};
use crate::inode::Inode;
use crate::num::usize_from;
use rext4_format::inode::INLINE_DATA_FL;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Writes at least this long are not delayed: a stream gains nothing from a copy of its
/// bytes, and allocating for 1 MiB at once already gives a large extent.
const DELAY_MAX: usize = 1 << 20;

/// A file's dirty pages. [under `Inode::dirty`]
#[derive(Default)]
pub(crate) struct DirtyPages {
    /// Logical block -> its bytes (one block each).
    pages: BTreeMap<u32, Box<[u8]>>,
    /// When the oldest change not yet written back was made.
    since: Option<Instant>,
    /// The record has changes (size, times) that are not journaled yet.
    record: bool,
    /// While delayed writes have moved the size past data not yet written back: the size
    /// to journal (the kernel's `i_disksize`; see `FsInner::mark_inode_dirty`).
    disk_size: Option<u64>,
}

/// The size `inode`'s record may be journaled with while delayed writes extend it.
pub(crate) fn disk_size(inode: &Inode) -> Option<u64> {
    if inode.dirty_pages.load(Ordering::Acquire) == 0 {
        return None;
    }
    inode.dirty.lock().disk_size
}

impl DirtyPages {
    pub(crate) fn pages_len(&self) -> u64 {
        self.pages.len() as u64
    }

    pub(crate) fn since(&self) -> Option<Instant> {
        self.since
    }

    pub(crate) fn is_clean(&self) -> bool {
        self.pages.is_empty() && !self.record
    }

    /// Restarts the age of what is left (written back in part).
    pub(crate) fn touch(&mut self) {
        self.since = Some(Instant::now());
    }

    /// After pages below `reached` were written back: the data on disk now reaches the first
    /// page left, or the whole size when none is left.
    pub(crate) fn advance_disk_size(&mut self, size: u64, bs: u64) {
        self.disk_size = match (self.disk_size, self.pages.keys().next()) {
            (Some(d), Some(&b)) => Some(d.max((u64::from(b) * bs).min(size))),
            _ => None,
        };
    }

    /// Whether the record had unjournaled changes; they are the caller's to journal now.
    pub(crate) fn take_record(&mut self) -> bool {
        let r = self.record;
        self.record = false;
        if self.pages.is_empty() {
            self.since = None;
        }
        r
    }

    /// The first run of consecutive dirty blocks, at most `max` long.
    pub(crate) fn first_run(&self, max: u64) -> Option<(u64, u64)> {
        let mut it = self.pages.keys();
        let lo = u64::from(*it.next()?);
        let mut hi = lo + 1;
        for &b in it {
            if u64::from(b) != hi || hi - lo >= max {
                break;
            }
            hi += 1;
        }
        Some((lo, hi))
    }

    /// Takes the pages of blocks `lo..hi` out (to be written back).
    pub(crate) fn take_run(&mut self, lo: u64, hi: u64) -> Vec<(u32, Box<[u8]>)> {
        let lo = u32::try_from(lo).unwrap_or(u32::MAX);
        let hi = u32::try_from(hi).unwrap_or(u32::MAX);
        let keys: Vec<u32> = self.pages.range(lo..hi).map(|(&k, _)| k).collect();
        let taken = keys.into_iter().filter_map(|k| self.pages.remove(&k).map(|p| (k, p))).collect();
        if self.pages.is_empty() && !self.record {
            self.since = None;
        }
        taken
    }

    /// Copies the dirty bytes of the file range `offset..offset + buf.len()` over `buf`.
    fn overlay(&self, bs: u64, offset: u64, buf: &mut [u8]) {
        let end = offset + buf.len() as u64;
        let lo = u32::try_from(offset / bs).unwrap_or(u32::MAX);
        let hi = u32::try_from(end.div_ceil(bs)).unwrap_or(u32::MAX);
        for (&b, p) in self.pages.range(lo..hi) {
            let start = u64::from(b) * bs;
            let a = start.max(offset);
            let z = (start + bs).min(end);
            buf[usize_from(a - offset)..usize_from(z - offset)]
                .copy_from_slice(&p[usize_from(a - start)..usize_from(z - start)]);
        }
    }
}

impl FsInner {
    /// Writes `data` at `offset` into dirty pages where the file has holes, and in place where
    /// its blocks are mapped and written, reserving a block per new page. Returns `None` when
    /// the write must take the general path: delayed allocation is off, the write is large,
    /// it covers unwritten extents, or the reservation failed (the general path allocates now
    /// and reports `ENOSPC` or a short write as usual). The caller holds `op_lock`.
    pub(super) fn write_delayed(
        &self,
        inode: &Arc<Inode>,
        offset: u64,
        data: &[u8],
    ) -> Result<Option<usize>> {
        if !self.wb.enabled || data.len() >= DELAY_MAX {
            return Ok(None);
        }
        let bs = u64::from(self.sbi.block_size);
        let end = offset + data.len() as u64;
        let (first, last) = (offset / bs, end.div_ceil(bs));
        if u32::try_from(last).is_err() {
            return Ok(None);
        }
        let _d = inode.data_sem.read();
        let (mapped, size) = {
            let raw = inode.raw();
            if raw_flags(&raw) & INLINE_DATA_FL != 0 {
                return Ok(None);
            }
            (self.map_runs(inode, &raw, first, last)?, raw_size(&raw))
        };
        if mapped.iter().any(|e| e.unwritten) {
            return Ok(None);
        }
        let is_mapped = |b: u64| mapped.iter().any(|e| b >= e.lblk && b < e.lblk + e.len);
        let holes: Vec<u64> = (first..last).filter(|&b| !is_mapped(b)).collect();
        // Check the reservation before writing anything in place.
        let new = {
            let d = inode.dirty.lock();
            // Cannot truncate: `last` fits in u32 (checked above).
            holes.iter().filter(|&&b| !d.pages.contains_key(&(b as u32))).count() as u64
        };
        if new > 0 && !self.delalloc_claim(new) {
            return Ok(None);
        }
        let placed = self.place_delayed(inode, offset, data, size, &mapped, &holes);
        if placed.is_err() {
            self.wb.dirty_blocks.fetch_sub(new, Ordering::AcqRel);
        } else {
            inode.dirty_pages.fetch_add(new, Ordering::AcqRel);
        }
        placed?;
        {
            let mut raw = inode.raw_mut();
            if end > raw_size(&raw) {
                crate::inode::write::raw_set_size(&mut raw, end);
            }
            raw_touch_cm(&mut raw, now());
        }
        self.wb.add(inode);
        drop(_d);
        self.balance_dirty(inode)?;
        Ok(Some(data.len()))
    }

    /// Writes the mapped part of a delayed write in place and copies the rest into dirty
    /// pages (whose blocks `delalloc_claim` reserved).
    fn place_delayed(
        &self,
        inode: &Inode,
        offset: u64,
        data: &[u8],
        size: u64,
        mapped: &[crate::map::extents_write::Ext],
        holes: &[u64],
    ) -> Result<()> {
        let bs = u64::from(self.sbi.block_size);
        let end = offset + data.len() as u64;
        // The old last block's tail past the size reads as zeros once the size moves past it
        // (a dirty page's tail already is zeros).
        if offset > size && !size.is_multiple_of(bs) {
            let raw = inode.raw();
            self.zero_stored(inode, &raw, size, offset.min(size.div_ceil(bs) * bs))?;
        }
        if !mapped.is_empty() {
            let runs: Vec<super::write::Run> = mapped.iter().map(super::write::Run::mapped).collect();
            self.write_runs(inode, &runs, offset, data)?;
            inode.data_dirty.store(true, Ordering::Release);
        }
        let mut d = inode.dirty.lock();
        if end > size && !holes.is_empty() && d.disk_size.is_none() {
            // The size moves past blocks whose data is only in memory.
            d.disk_size = Some(size);
        }
        for &b in holes {
            let start = b * bs;
            let a = start.max(offset);
            let z = (start + bs).min(end);
            // Cannot truncate: the caller checked that the last block fits in u32.
            let page = d.pages.entry(b as u32).or_insert_with(|| vec![0u8; usize_from(bs)].into());
            page[usize_from(a - start)..usize_from(z - start)]
                .copy_from_slice(&data[usize_from(a - offset)..usize_from(z - offset)]);
        }
        d.record = true;
        if d.since.is_none() {
            d.since = Some(Instant::now());
        }
        Ok(())
    }

    /// Reserves `n` blocks for dirty pages, leaving the root-reserved blocks and the
    /// metadata slack (what `statfs` keeps back) for others. Whether it could.
    fn delalloc_claim(&self, n: u64) -> bool {
        let free = self.counters.free_blocks.sum_positive();
        let keep = self.sbi.sb.r_blocks_count() + self.meta_slack();
        let mut cur = self.wb.dirty_blocks.load(Ordering::Acquire);
        loop {
            if cur.saturating_add(n).saturating_add(keep) > free {
                return false;
            }
            match self.wb.dirty_blocks.compare_exchange_weak(
                cur,
                cur + n,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(x) => cur = x,
            }
        }
    }

    /// Blocks kept for metadata and unwritten conversions: 2% or 4096 blocks, whichever is
    /// less, with extents (the kernel's `s_resv_clusters`); none without.
    pub(crate) fn meta_slack(&self) -> u64 {
        let extents = self.sbi.sb.incompat().contains(rext4_format::features::Incompat::EXTENTS);
        if extents {
            (self.sbi.blocks_count / 50).min(4096)
        } else {
            0
        }
    }

    /// Copies `inode`'s dirty pages over the bytes just read at `offset` (`buf` holds what
    /// the device or the page cache had). The caller holds `data_sem` shared.
    pub(super) fn overlay_dirty(&self, inode: &Inode, offset: u64, buf: &mut [u8]) {
        if inode.dirty_pages.load(Ordering::Acquire) == 0 {
            return;
        }
        inode.dirty.lock().overlay(u64::from(self.sbi.block_size), offset, buf);
    }

    /// Blocks reserved for `inode`'s dirty pages (counted in `st_blocks`, as the kernel's
    /// `ext4_getattr` counts delayed blocks).
    pub(crate) fn delalloc_blocks(&self, inode: &Inode) -> u64 {
        inode.dirty_pages.load(Ordering::Acquire)
    }
}
