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
use crate::inode::write::{raw_flags, raw_size, raw_touch_cm};
use crate::inode::Inode;
use crate::num::usize_from;
use rext4_format::inode::INLINE_DATA_FL;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Writes at least this long are not delayed: a stream of large writes gains nothing from a
/// copy of its bytes in memory (measured: 128 KiB writes ran at a third of their speed through
/// dirty pages, the copy and the memory it takes costing more than the write), and each of
/// its writes allocates a large run anyway (next to the previous one, or from the file's
/// preallocation).
const DELAY_MAX: usize = 64 << 10;

/// The most blocks an append grows one run to (8 MiB of 4 KiB blocks): writeback takes runs
/// from the front, and splitting one copies its rest.
const RUN_CAP: u64 = 2048;

/// A file's dirty pages, as runs of consecutive blocks, each run's bytes in one buffer: a
/// stream of appends grows one buffer (one copy per write) and is written back with one
/// device write, with no per-block allocation. [under `Inode::dirty`]
#[derive(Default)]
pub(crate) struct DirtyPages {
    /// First logical block of a run -> its bytes (a whole number of blocks). Runs never
    /// overlap; they may touch (an append past a full run starts a new one).
    runs: BTreeMap<u64, Vec<u8>>,
    /// Blocks in all runs.
    blocks: u64,
    /// The block size. [set by the first write]
    bs: u64,
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
        self.blocks
    }

    pub(crate) fn since(&self) -> Option<Instant> {
        self.since
    }

    pub(crate) fn is_clean(&self) -> bool {
        self.runs.is_empty() && !self.record
    }

    /// Restarts the age of what is left (written back in part).
    pub(crate) fn touch(&mut self) {
        self.since = Some(Instant::now());
    }

    /// After pages were written back from the front: the data on disk now reaches the first
    /// page left, or the whole size when none is left.
    pub(crate) fn advance_disk_size(&mut self, size: u64) {
        self.disk_size = match (self.disk_size, self.runs.keys().next()) {
            (Some(d), Some(&b)) => Some(d.max((b * self.bs).min(size))),
            _ => None,
        };
    }

    /// Whether the record had unjournaled changes; they are the caller's to journal now.
    pub(crate) fn take_record(&mut self) -> bool {
        let r = self.record;
        self.record = false;
        if self.runs.is_empty() {
            self.since = None;
        }
        r
    }

    /// The run of blocks `start..end` of the run that starts at or before `b`, if it holds `b`.
    fn run_at(&self, b: u64) -> Option<(u64, u64)> {
        let (&start, v) = self.runs.range(..=b).next_back()?;
        let end = start + v.len() as u64 / self.bs;
        (b < end).then_some((start, end))
    }

    /// How many of blocks `lo..hi` are not dirty yet.
    fn missing(&self, lo: u64, hi: u64) -> u64 {
        let mut covered = 0;
        let first = self.run_at(lo).map_or(lo, |(s, _)| s);
        for (&start, v) in self.runs.range(first..hi) {
            let end = start + v.len() as u64 / self.bs;
            covered += end.min(hi).saturating_sub(start.max(lo));
        }
        (hi - lo) - covered
    }

    /// Makes blocks `lo..hi` dirty (new ones zeros) and returns how many were new. An append
    /// grows the run it follows, up to `RUN_CAP` blocks; other writes keep the runs they
    /// overlap and fill the gaps between them with new runs (runs may touch).
    fn cover(&mut self, lo: u64, hi: u64, spares: &crate::sync::Mutex<Vec<Vec<u8>>>) -> u64 {
        let bs = self.bs;
        let new = self.missing(lo, hi);
        if new == 0 {
            return 0;
        }
        let overlaps = self.run_at(lo).is_some() || self.runs.range(lo..hi).next().is_some();
        if !overlaps && lo > 0 {
            if let Some((start, end)) = self.run_at(lo - 1) {
                if end == lo && end - start + (hi - lo) <= RUN_CAP {
                    if let Some(v) = self.runs.get_mut(&start) {
                        v.resize(usize_from((hi - start) * bs), 0);
                        self.blocks += new;
                        return new;
                    }
                }
                if end == lo && hi - lo <= RUN_CAP {
                    // A stream past a full run: the next run in a buffer written back before
                    // (its memory already mapped; a new one faults in page by page).
                    let mut v = spares.lock().pop().unwrap_or_default();
                    v.clear();
                    v.resize(usize_from((hi - lo) * bs), 0);
                    self.runs.insert(lo, v);
                    self.blocks += new;
                    return new;
                }
            }
        }
        // The gaps of lo..hi between the runs there.
        let mut gaps = Vec::new();
        let mut at = lo;
        let first = self.run_at(lo).map_or(lo, |(s, _)| s);
        for (&start, v) in self.runs.range(first..hi) {
            let end = start + v.len() as u64 / bs;
            if start > at {
                gaps.push((at, start));
            }
            at = at.max(end);
        }
        if at < hi {
            gaps.push((at, hi));
        }
        for (a, z) in gaps {
            self.runs.insert(a, vec![0u8; usize_from((z - a) * bs)]);
        }
        self.blocks += new;
        new
    }

    /// The parts of the runs that the file range `offset..offset + len` meets: each run's
    /// first block, the part's place in the run's bytes, and its place in the range.
    fn spans(&self, offset: u64, len: usize) -> Vec<(u64, Range<usize>, Range<usize>)> {
        let bs = self.bs;
        let end = offset + len as u64;
        let first = self.run_at(offset / bs).map_or(offset / bs, |(s, _)| s);
        let mut out = Vec::new();
        for (&k, v) in self.runs.range(first..end.div_ceil(bs)) {
            let (s, e) = (k * bs, k * bs + v.len() as u64);
            let a = s.max(offset);
            let z = e.min(end);
            if a < z {
                out.push((
                    k,
                    usize_from(a - s)..usize_from(z - s),
                    usize_from(a - offset)..usize_from(z - offset),
                ));
            }
        }
        out
    }

    /// Copies `data` (the file's bytes from `offset`) into the dirty blocks it covers.
    fn store(&mut self, offset: u64, data: &[u8]) {
        for (k, in_run, in_data) in self.spans(offset, data.len()) {
            if let Some(v) = self.runs.get_mut(&k) {
                v[in_run].copy_from_slice(&data[in_data]);
            }
        }
    }

    /// The first stretch of consecutive dirty blocks (touching runs together), at most `max`
    /// long.
    pub(crate) fn first_run(&self, max: u64) -> Option<(u64, u64)> {
        let mut it = self.runs.iter();
        let (&lo, v) = it.next()?;
        let mut hi = lo + v.len() as u64 / self.bs;
        for (&start, v) in it {
            if start != hi || hi - lo >= max {
                break;
            }
            hi = start + v.len() as u64 / self.bs;
        }
        Some((lo, hi.min(lo + max)))
    }

    /// Takes the bytes of blocks `lo..hi` out, from the front of the first stretch, which
    /// starts at `lo` (to be written back): the runs, each with its first block.
    pub(crate) fn take_front(&mut self, lo: u64, hi: u64) -> Vec<(u64, Vec<u8>)> {
        let bs = self.bs;
        let mut out = Vec::new();
        let mut at = lo;
        while at < hi {
            let Some(mut v) = self.runs.remove(&at) else { break };
            let n = v.len() as u64 / bs;
            if at + n > hi {
                // Split: the rest (at most a run's cap) stays dirty.
                let rest = v.split_off(usize_from((hi - at) * bs));
                self.runs.insert(hi, rest);
            }
            let taken = v.len() as u64 / bs;
            self.blocks -= taken;
            out.push((at, v));
            at += taken;
        }
        if self.runs.is_empty() && !self.record {
            self.since = None;
        }
        out
    }

    /// Copies the dirty bytes of the file range `offset..offset + buf.len()` over `buf`.
    fn overlay(&self, offset: u64, buf: &mut [u8]) {
        for (k, in_run, in_buf) in self.spans(offset, buf.len()) {
            if let Some(v) = self.runs.get(&k) {
                buf[in_buf].copy_from_slice(&v[in_run]);
            }
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
        // The runs of holes the write covers (between and around its mapped blocks).
        let mut holes: Vec<(u64, u64)> = Vec::new();
        let mut at = first;
        for e in mapped.iter().chain(std::iter::once(&crate::map::extents_write::Ext {
            lblk: last,
            len: 0,
            pblk: 0,
            unwritten: false,
        })) {
            if e.lblk > at {
                holes.push((at, e.lblk.min(last)));
            }
            at = at.max(e.lblk + e.len);
        }
        // Check the reservation before writing anything in place.
        let new = {
            let mut d = inode.dirty.lock();
            d.bs = bs;
            holes.iter().map(|&(lo, hi)| d.missing(lo, hi)).sum::<u64>()
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
            raw_touch_cm(&mut raw, self.now());
        }
        self.wb.add(inode);
        drop(_d);
        // The write is done whatever the throttle's writeback makes of it: a failure leaves
        // the pages dirty, for `fsync` and `sync` to report.
        let _ = self.balance_dirty(inode);
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
        holes: &[(u64, u64)],
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
        for &(lo, hi) in holes {
            d.cover(lo, hi, &self.wb.spares);
            let a = (lo * bs).max(offset);
            let z = (hi * bs).min(end);
            d.store(a, &data[usize_from(a - offset)..usize_from(z - offset)]);
        }
        d.record = true;
        if d.since.is_none() {
            d.since = Some(Instant::now());
        }
        Ok(())
    }

    /// Reserves `n` blocks for dirty pages, leaving the root-reserved blocks (unless the
    /// caller may use them, alloc/reserved.rs) and the metadata slack (what `statfs` keeps
    /// back) for others. Whether it could.
    fn delalloc_claim(&self, n: u64) -> bool {
        let free = self.counters.free_blocks.sum_positive();
        let keep = self.root_reserve() + self.meta_slack();
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
        inode.dirty.lock().overlay(offset, buf);
    }

    /// Blocks reserved for `inode`'s dirty pages (counted in `st_blocks`, as the kernel's
    /// `ext4_getattr` counts delayed blocks).
    pub(crate) fn delalloc_blocks(&self, inode: &Inode) -> u64 {
        inode.dirty_pages.load(Ordering::Acquire)
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // small test values
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap as Model;

    const BS: u64 = 16;

    /// Checks every run against the model and the counts and invariants.
    fn check(d: &DirtyPages, model: &Model<u64, Vec<u8>>) {
        assert_eq!(d.pages_len(), model.len() as u64);
        let mut prev_end = 0;
        for (&start, v) in &d.runs {
            assert!(start >= prev_end, "runs overlap");
            assert_eq!(v.len() as u64 % BS, 0);
            prev_end = start + v.len() as u64 / BS;
        }
        let top = model.keys().next_back().map_or(0, |&b| b + 1) + 2;
        let mut buf = vec![0xEE; usize_from(top * BS)];
        // What a read sees: holes as zeros, then the dirty blocks over them.
        buf.fill(0);
        d.overlay(0, &mut buf);
        for b in 0..top {
            let got = &buf[usize_from(b * BS)..usize_from((b + 1) * BS)];
            match model.get(&b) {
                Some(want) => assert_eq!(got, &want[..], "block {b}"),
                None => assert!(got.iter().all(|&x| x == 0), "block {b} is not dirty"),
            }
        }
    }

    proptest! {
        /// Writes of any length at any offset, and writebacks from the front, against a map of
        /// blocks to bytes.
        #[test]
        fn runs_hold_what_was_written(ops in proptest::collection::vec(
            (0u64..3000, 1usize..200, any::<u8>(), 0u8..6), 1..60)) {
            let mut d = DirtyPages { bs: BS, ..DirtyPages::default() };
            let spares = crate::sync::Mutex::new(Vec::new());
            let mut model: Model<u64, Vec<u8>> = Model::new();
            for (off, len, byte, kind) in ops {
                if kind == 0 {
                    // Write back the front, as writeback does (sometimes only part of it).
                    if let Some((lo, hi)) = d.first_run(1 + u64::from(byte) % 40) {
                        let reached = lo + (hi - lo).div_ceil(if byte % 2 == 0 { 1 } else { 2 });
                        let taken = d.take_front(lo, reached);
                        let mut at = lo;
                        for (start, v) in taken {
                            prop_assert_eq!(start, at);
                            for (i, blk) in v.chunks(BS as usize).enumerate() {
                                let b = start + i as u64;
                                let want = model.remove(&b);
                                prop_assert_eq!(want.as_deref(), Some(blk), "block {}", b);
                            }
                            at += v.len() as u64 / BS;
                        }
                        prop_assert_eq!(at, reached);
                    }
                } else {
                    let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8)).collect();
                    let end = off + len as u64;
                    let (lo, hi) = (off / BS, end.div_ceil(BS));
                    let missing = (lo..hi).filter(|b| !model.contains_key(b)).count() as u64;
                    prop_assert_eq!(d.cover(lo, hi, &spares), missing);
                    d.store(off, &data);
                    for b in lo..hi {
                        let blk = model.entry(b).or_insert_with(|| vec![0; BS as usize]);
                        let (s, e) = (b * BS, (b + 1) * BS);
                        let (a, z) = (s.max(off), e.min(end));
                        blk[(a - s) as usize..(z - s) as usize]
                            .copy_from_slice(&data[(a - off) as usize..(z - off) as usize]);
                    }
                }
                check(&d, &model);
            }
        }
    }
}
