//! Delayed allocation (the kernel's `ext4_da_write_begin`/`ext4_da_write_end` and
//! `ext4_da_reserve_space`): a write into a hole copies its bytes into the file's *dirty
//! pages* and reserves one block per new page in a counter beside the free-block counts, so
//! that `ENOSPC` comes from the write and never from writeback. A write into preallocated
//! (unwritten) blocks is delayed the same way, without a reservation: writeback converts
//! them. Blocks are chosen later, when the pages are written back (data/writeback.rs), for
//! whole runs of pages at once, so a file written by many small appends, beside others, ends
//! in few extents; a file deleted before then never allocates at all.
//!
//! # Invariants
//! 1. A dirty page's block is a hole or an unwritten extent in the file's map: a write over
//!    written blocks writes them in place (as `overwrite` does), and everything that changes
//!    or reads the map other than `read(2)` (truncate, fallocate, SEEK_DATA/HOLE, the general
//!    write path) writes the file back first, under `op_lock`. So what lies under a page
//!    stays what it was when the page was made.
//! 2. Reads copy dirty pages over what the device holds (holes and unwritten blocks, so
//!    zeros), under `data_sem` shared; writeback turns pages into written blocks under
//!    `data_sem` exclusive, so a read sees a block either as a page or as written data.
//! 3. The bytes of a dirty page past the file's size are zeros (pages start zeroed, and the
//!    size only shrinks after a writeback).
//! 4. Size and times a delayed write sets are changed in memory only; the file is listed for
//!    writeback until they are journaled (its listing holds the inode in the cache).
//! 5. A page over a hole reserves a block; a page over an unwritten extent does not (its
//!    block is allocated already: writeback converts it, as the kernel's end-of-I/O
//!    conversion does, with the metadata slack for any extent split). `Writeback::dirty_blocks`
//!    is the number of reserved pages of all files; allocations other than writeback's leave
//!    that many free blocks untouched. `Writeback::pages` counts all dirty pages, for the
//!    dirty limits.
//! 6. Writeback needs no block beyond the reservations but tree blocks, and finds those: an
//!    extent tree's come from the metadata slack, which only index blocks may take
//!    (`alloc::reserved::Pool`); a block-mapped file's page is delayed only where its
//!    indirect blocks exist already (a block map has no slack).
//! 7. With bigalloc a reservation is a cluster, and belongs to a logical cluster
//!    (`DirtyPages::res_clusters`, the kernel's pending reservations): a page over a hole
//!    reserves its logical cluster unless the file maps a block of it (written or unwritten:
//!    writeback puts the page in that block's cluster) or a page of it holds the
//!    reservation already. Writing back any page of a reserved cluster maps that cluster
//!    whole, so its reservation is given back then, and the cluster's other pages need none.
//!    `Writeback::dirty_blocks` counts clusters, as the free counters do.

use crate::error::Result;
use crate::fs::FsInner;
use crate::inode::write::{raw_flags, raw_size, raw_touch_cm};
use crate::inode::Inode;
use crate::num::usize_from;
use rext4_format::inode::{EXTENTS_FL, INLINE_DATA_FL};
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
    /// First logical block of a run -> its pages. Runs never overlap; they may touch (an
    /// append past a full run starts a new one, as does one that goes on from unwritten
    /// blocks into a hole).
    runs: BTreeMap<u64, PageRun>,
    /// Blocks in all runs.
    blocks: u64,
    /// Blocks in runs over holes (without bigalloc each reserved in
    /// `Writeback::dirty_blocks`).
    reserved: u64,
    /// The block size. [set by the first write]
    bs: u64,
    /// With bigalloc: the logical clusters holding a reservation, each a cluster in
    /// `Writeback::dirty_blocks` (invariant 7).
    res_clusters: std::collections::BTreeSet<u64>,
    /// When the oldest change not yet written back was made.
    since: Option<Instant>,
    /// The record has changes (size, times) that are not journaled yet.
    record: bool,
    /// While delayed writes have moved the size past data not yet written back: the size
    /// to journal (the kernel's `i_disksize`; see `FsInner::mark_inode_dirty`).
    disk_size: Option<u64>,
}

/// The pages of one run of consecutive dirty blocks.
pub(crate) struct PageRun {
    /// The run's bytes (a whole number of blocks).
    pub(crate) bytes: Vec<u8>,
    /// Its blocks are holes, each reserved (invariant 5); else unwritten extents.
    pub(crate) reserved: bool,
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

    /// Pages that hold a reserved block (over holes).
    #[cfg(test)]
    pub(crate) fn reserved_len(&self) -> u64 {
        self.reserved
    }

    /// Reservations held, in clusters (pages over holes without bigalloc).
    pub(crate) fn reserved_clusters(&self, bigalloc: bool) -> u64 {
        if bigalloc {
            self.res_clusters.len() as u64
        } else {
            self.reserved
        }
    }

    /// With bigalloc: gives up the reservations of the logical clusters that blocks
    /// `lo..hi` touch (their pages were written back, so those clusters are mapped now);
    /// returns how many there were.
    pub(crate) fn release_clusters(&mut self, lo: u64, hi: u64, bits: u32) -> u64 {
        if hi <= lo {
            return 0;
        }
        let gone: Vec<u64> = self.res_clusters.range(lo >> bits..=(hi - 1) >> bits).copied().collect();
        for c in &gone {
            self.res_clusters.remove(c);
        }
        gone.len() as u64
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
        let (&start, r) = self.runs.range(..=b).next_back()?;
        let end = start + r.bytes.len() as u64 / self.bs;
        (b < end).then_some((start, end))
    }

    /// How many of blocks `lo..hi` are not dirty yet.
    fn missing(&self, lo: u64, hi: u64) -> u64 {
        let mut covered = 0;
        let first = self.run_at(lo).map_or(lo, |(s, _)| s);
        for (&start, r) in self.runs.range(first..hi) {
            let end = start + r.bytes.len() as u64 / self.bs;
            covered += end.min(hi).saturating_sub(start.max(lo));
        }
        (hi - lo) - covered
    }

    /// Makes blocks `lo..hi` dirty (new ones zeros) and returns how many were new. An append
    /// grows the run it follows, up to `RUN_CAP` blocks, if that run is of the same kind
    /// (`reserved`: the new blocks are holes; else unwritten); other writes keep the runs
    /// they overlap and fill the gaps between them with new runs (runs may touch).
    fn cover(&mut self, lo: u64, hi: u64, reserved: bool, spares: &crate::sync::Mutex<Vec<Vec<u8>>>) -> u64 {
        let bs = self.bs;
        let new = self.missing(lo, hi);
        if new == 0 {
            return 0;
        }
        self.blocks += new;
        if reserved {
            self.reserved += new;
        }
        let overlaps = self.run_at(lo).is_some() || self.runs.range(lo..hi).next().is_some();
        if !overlaps && lo > 0 {
            if let Some((start, end)) = self.run_at(lo - 1) {
                let same = self.runs.get(&start).is_some_and(|r| r.reserved == reserved);
                if end == lo && same && end - start + (hi - lo) <= RUN_CAP {
                    if let Some(r) = self.runs.get_mut(&start) {
                        r.bytes.resize(usize_from((hi - start) * bs), 0);
                        return new;
                    }
                }
                if end == lo && hi - lo <= RUN_CAP {
                    // A stream past a full run: the next run in a buffer written back before
                    // (its memory already mapped; a new one faults in page by page).
                    let mut v = spares.lock().pop().unwrap_or_default();
                    v.clear();
                    v.resize(usize_from((hi - lo) * bs), 0);
                    self.runs.insert(lo, PageRun { bytes: v, reserved });
                    return new;
                }
            }
        }
        // The gaps of lo..hi between the runs there.
        let mut gaps = Vec::new();
        let mut at = lo;
        let first = self.run_at(lo).map_or(lo, |(s, _)| s);
        for (&start, r) in self.runs.range(first..hi) {
            let end = start + r.bytes.len() as u64 / bs;
            if start > at {
                gaps.push((at, start));
            }
            at = at.max(end);
        }
        if at < hi {
            gaps.push((at, hi));
        }
        for (a, z) in gaps {
            self.runs.insert(a, PageRun { bytes: vec![0u8; usize_from((z - a) * bs)], reserved });
        }
        new
    }

    /// The parts of the runs that the file range `offset..offset + len` meets: each run's
    /// first block, the part's place in the run's bytes, and its place in the range.
    fn spans(&self, offset: u64, len: usize) -> Vec<(u64, Range<usize>, Range<usize>)> {
        let bs = self.bs;
        let end = offset + len as u64;
        let first = self.run_at(offset / bs).map_or(offset / bs, |(s, _)| s);
        let mut out = Vec::new();
        for (&k, r) in self.runs.range(first..end.div_ceil(bs)) {
            let (s, e) = (k * bs, k * bs + r.bytes.len() as u64);
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
            if let Some(r) = self.runs.get_mut(&k) {
                r.bytes[in_run].copy_from_slice(&data[in_data]);
            }
        }
    }

    /// The first stretch of consecutive dirty blocks (touching runs together), at most `max`
    /// long.
    pub(crate) fn first_run(&self, max: u64) -> Option<(u64, u64)> {
        let mut it = self.runs.iter();
        let (&lo, r) = it.next()?;
        let mut hi = lo + r.bytes.len() as u64 / self.bs;
        for (&start, r) in it {
            if start != hi || hi - lo >= max {
                break;
            }
            hi = start + r.bytes.len() as u64 / self.bs;
        }
        Some((lo, hi.min(lo + max)))
    }

    /// Takes the pages of blocks `lo..hi` out, from the front of the first stretch, which
    /// starts at `lo` (to be written back): the runs, each with its first block.
    pub(crate) fn take_front(&mut self, lo: u64, hi: u64) -> Vec<(u64, PageRun)> {
        let bs = self.bs;
        let mut out = Vec::new();
        let mut at = lo;
        while at < hi {
            let Some(mut r) = self.runs.remove(&at) else { break };
            let n = r.bytes.len() as u64 / bs;
            if at + n > hi {
                // Split: the rest (at most a run's cap) stays dirty.
                let rest = r.bytes.split_off(usize_from((hi - at) * bs));
                self.runs.insert(hi, PageRun { bytes: rest, reserved: r.reserved });
            }
            let taken = r.bytes.len() as u64 / bs;
            self.blocks -= taken;
            if r.reserved {
                self.reserved -= taken;
            }
            out.push((at, r));
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
            if let Some(r) = self.runs.get(&k) {
                buf[in_buf].copy_from_slice(&r.bytes[in_run]);
            }
        }
    }
}

impl FsInner {
    /// Writes `data` at `offset` into dirty pages where the file has holes or unwritten
    /// extents, and in place where its blocks are written, reserving a block per new page
    /// over a hole. Returns `None` when the write must take the general path: delayed
    /// allocation is off, the write is large, or the reservation failed (the general path
    /// allocates now and reports `ENOSPC` or a short write as usual). The caller holds
    /// `op_lock`.
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
        let (mapped, size, block_map) = {
            let raw = inode.raw();
            // Encrypted files allocate at once: their pages would have to be encrypted at
            // writeback, and reads of them go to the device (crypto/contents.rs).
            if raw_flags(&raw) & (INLINE_DATA_FL | rext4_format::inode::ENCRYPT_FL) != 0 {
                return Ok(None);
            }
            (self.map_runs(inode, &raw, first, last)?, raw_size(&raw), raw_flags(&raw) & EXTENTS_FL == 0)
        };
        // Pages go over the holes (reserved) and the unwritten extents (not: invariant 5).
        let mut under: Vec<(u64, u64, bool)> = Vec::new();
        let mut at = first;
        for e in mapped.iter().chain(std::iter::once(&crate::map::extents_write::Ext {
            lblk: last,
            len: 0,
            pblk: 0,
            unwritten: false,
        })) {
            if e.lblk > at {
                under.push((at, e.lblk.min(last), true));
            }
            if e.unwritten && e.len > 0 {
                under.push((e.lblk, e.lblk + e.len, false));
            }
            at = at.max(e.lblk + e.len);
        }
        if block_map && !self.delay_fits_block_map(inode, &under)? {
            return Ok(None);
        }
        let written: Vec<_> = mapped.iter().filter(|e| !e.unwritten).copied().collect();
        // With bigalloc a page over a hole reserves its logical cluster, unless the file maps
        // a block of that cluster already or a page there holds its reservation (invariant 7).
        let bits = self.sbi.cluster_bits;
        let cluster_mapped = if bits > 0 {
            let mask = (1u64 << bits) - 1;
            let raw = inode.raw();
            self.map_runs(inode, &raw, first & !mask, (last + mask) & !mask)?
        } else {
            Vec::new()
        };
        // Check the reservation before writing anything in place.
        let (new, unreserved, clusters) = {
            let mut d = inode.dirty.lock();
            d.bs = bs;
            let (new, unreserved) = under.iter().fold((0, 0), |(r, u), &(lo, hi, hole)| {
                let n = d.missing(lo, hi);
                if hole {
                    (r + n, u)
                } else {
                    (r, u + n)
                }
            });
            let mut clusters = Vec::new();
            if bits > 0 {
                for &(lo, hi, _) in under.iter().filter(|u| u.2) {
                    for c in lo >> bits..=(hi - 1) >> bits {
                        let (cs, ce) = (c << bits, (c + 1) << bits);
                        let has_block = cluster_mapped.iter().any(|e| e.lblk < ce && e.lblk + e.len > cs);
                        if !has_block && !d.res_clusters.contains(&c) && clusters.last() != Some(&c) {
                            clusters.push(c);
                        }
                    }
                }
            }
            (new, unreserved, clusters)
        };
        // Reservations, in clusters (a block each without bigalloc).
        let res = if bits > 0 { clusters.len() as u64 } else { new };
        if res > 0 && !self.delalloc_claim(res) {
            return Ok(None);
        }
        // Over a quota limit the general path takes what fits and says `EDQUOT` after.
        match self.quota_reserve(inode, self.sbi.c2b(res)) {
            Ok(true) => {}
            r => {
                self.wb.dirty_blocks.fetch_sub(res, Ordering::AcqRel);
                return r.map(|_| None);
            }
        }
        let placed = self.place_delayed(inode, offset, data, size, &written, &under);
        if placed.is_err() {
            self.wb.dirty_blocks.fetch_sub(res, Ordering::AcqRel);
            self.quota_unreserve(inode, &inode.raw(), self.sbi.c2b(res));
        } else {
            if bits > 0 {
                inode.dirty.lock().res_clusters.extend(clusters);
            }
            inode.dirty_pages.fetch_add(new + unreserved, Ordering::AcqRel);
            self.wb.pages.fetch_add(new + unreserved, Ordering::AcqRel);
        }
        placed?;
        {
            let mut raw = inode.raw_mut();
            if end > raw_size(&raw) {
                crate::inode::write::raw_set_size(&mut raw, end);
            }
            if self.write_stamps_times() {
                raw_touch_cm(&mut raw, self.now());
            }
        }
        self.wb.add(inode);
        drop(_d);
        // The write is done whatever the throttle's writeback makes of it: a failure leaves
        // the pages dirty, for `fsync` and `sync` to report.
        let _ = self.balance_dirty(inode);
        Ok(Some(data.len()))
    }

    /// Whether a block-mapped file's pages over the holes `under` find their indirect blocks
    /// in place. A reservation counts data blocks only;
    /// an extent tree's writeback takes its tree blocks from the metadata slack, which a
    /// block map has not (`s_resv_clusters` is 0 without extents). A page that would need a
    /// new indirect block therefore takes the general path, which allocates it now, so that
    /// writeback never needs a block nobody reserved (invariant 6). Every change to the map
    /// writes the file's dirty pages back first, so the indirect blocks found here stay.
    fn delay_fits_block_map(&self, inode: &Inode, under: &[(u64, u64, bool)]) -> Result<bool> {
        let raw = inode.raw();
        for &(lo, hi, hole) in under {
            if hole {
                for lblk in lo..hi {
                    if !self.ind_index_present(inode, &raw, lblk)? {
                        return Ok(false);
                    }
                }
            }
        }
        Ok(true)
    }

    /// Writes the written part of a delayed write in place and copies the rest into dirty
    /// pages: `under` holds the runs of blocks they go over, each a hole (whose blocks
    /// `delalloc_claim` reserved) or unwritten.
    fn place_delayed(
        &self,
        inode: &Inode,
        offset: u64,
        data: &[u8],
        size: u64,
        written: &[crate::map::extents_write::Ext],
        under: &[(u64, u64, bool)],
    ) -> Result<()> {
        let bs = u64::from(self.sbi.block_size);
        let end = offset + data.len() as u64;
        // The old last block's tail past the size reads as zeros once the size moves past it
        // (a dirty page's tail already is zeros).
        if offset > size && !size.is_multiple_of(bs) {
            let raw = inode.raw();
            self.zero_stored(inode, &raw, size, offset.min(size.div_ceil(bs) * bs))?;
        }
        if !written.is_empty() {
            let runs: Vec<super::write::Run> = written.iter().map(super::write::Run::mapped).collect();
            self.write_runs(inode, &runs, offset, data)?;
            inode.data_dirty.store(true, Ordering::Release);
        }
        let mut d = inode.dirty.lock();
        if end > size && !under.is_empty() && d.disk_size.is_none() {
            // The size moves past blocks whose data is only in memory.
            d.disk_size = Some(size);
        }
        for &(lo, hi, hole) in under {
            d.cover(lo, hi, hole, &self.wb.spares);
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

    /// Reserves `n` clusters (blocks without bigalloc) for dirty pages, leaving the
    /// root-reserved blocks (unless the caller may use them, alloc/reserved.rs) and the
    /// metadata slack (what `statfs` keeps back) for others. Whether it could.
    fn delalloc_claim(&self, n: u64) -> bool {
        let free = self.counters.free_blocks.sum_positive();
        let bits = self.sbi.cluster_bits;
        let keep = (self.root_reserve() >> bits) + (self.meta_slack() >> bits);
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
            // `s_resv_clusters`: a fiftieth of the clusters, at most 4096 of them.
            self.sbi.c2b(((self.sbi.blocks_count >> self.sbi.cluster_bits) / 50).min(4096))
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
    /// `ext4_getattr` counts delayed blocks; pages over unwritten extents are counted in the
    /// record already).
    pub(crate) fn delalloc_blocks(&self, inode: &Inode) -> u64 {
        if inode.dirty_pages.load(Ordering::Acquire) == 0 {
            return 0;
        }
        self.sbi.c2b(inode.dirty.lock().reserved_clusters(self.sbi.cluster_bits > 0))
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // small test values
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap as Model;

    const BS: u64 = 16;

    /// Whether block `b` is a hole in the tests' file (else it is unwritten): stretches of
    /// each kind, of several lengths, so writes and appends cross between them.
    fn hole(b: u64) -> bool {
        !(b / 7 + b / 113).is_multiple_of(3)
    }

    /// Checks every run against the model and the counts and invariants.
    fn check(d: &DirtyPages, model: &Model<u64, Vec<u8>>) {
        assert_eq!(d.pages_len(), model.len() as u64);
        assert_eq!(d.reserved_len(), model.keys().filter(|&&b| hole(b)).count() as u64);
        let mut prev_end = 0;
        for (&start, r) in &d.runs {
            assert!(start >= prev_end, "runs overlap");
            assert_eq!(r.bytes.len() as u64 % BS, 0);
            prev_end = start + r.bytes.len() as u64 / BS;
            // A run is of one kind: holes (reserved) or unwritten blocks.
            for b in start..prev_end {
                assert_eq!(r.reserved, hole(b), "block {b} in the run at {start}");
            }
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
                        for (start, r) in taken {
                            prop_assert_eq!(start, at);
                            for (i, blk) in r.bytes.chunks(BS as usize).enumerate() {
                                let b = start + i as u64;
                                prop_assert_eq!(r.reserved, hole(b), "block {}", b);
                                let want = model.remove(&b);
                                prop_assert_eq!(want.as_deref(), Some(blk), "block {}", b);
                            }
                            at += r.bytes.len() as u64 / BS;
                        }
                        prop_assert_eq!(at, reached);
                    }
                } else {
                    let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8)).collect();
                    let end = off + len as u64;
                    let (lo, hi) = (off / BS, end.div_ceil(BS));
                    // Covered a stretch of one kind at a time, as `write_delayed` does.
                    let mut a = lo;
                    while a < hi {
                        let z = (a..hi).find(|&b| hole(b) != hole(a)).unwrap_or(hi);
                        let missing = (a..z).filter(|b| !model.contains_key(b)).count() as u64;
                        prop_assert_eq!(d.cover(a, z, hole(a), &spares), missing);
                        a = z;
                    }
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
