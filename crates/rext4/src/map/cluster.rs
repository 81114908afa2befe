//! File data in clusters (`bigalloc`; the cluster parts of the kernel's `extents.c`:
//! `get_implied_cluster_alloc`, the partial clusters of `ext4_ext_remove_space`): where new
//! data blocks of an extent-mapped file go, and which clusters freeing its blocks gives back.
//! Without bigalloc a cluster is a block and all of this reduces to allocating and freeing
//! runs of blocks.
//!
//! # Invariants (bigalloc)
//! 1. A bitmap bit is a cluster of `2^cluster_bits` blocks; a cluster is in use, whole, or
//!    free.
//! 2. A data block sits at the same offset in its physical cluster as its logical block in its
//!    logical cluster (`pblk & mask == lblk & mask`), and the blocks of one logical cluster of
//!    a file lie in one physical cluster, which no other logical cluster and no other file
//!    uses. So a new block of a logical cluster that has a block mapped goes in that block's
//!    cluster (the "implied" cluster), and takes nothing from the bitmap.
//! 3. A physical cluster is freed when the last block of its logical cluster is unmapped.
//! 4. Every metadata block (extent tree node, xattr block) has a cluster of its own
//!    (`FsInner::alloc_blocks` hands out one at a time).
//! 5. `i_blocks` counts whole clusters: each cluster a file has, data or metadata, counts its
//!    blocks once.
//!
//! Shifting a file's blocks (collapse and insert range) keeps invariant 2 only by whole
//! clusters: those take cluster-aligned ranges (`EINVAL` otherwise, as in the kernel).

use crate::alloc::reserved::Pool;
use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use crate::jbd2::transaction::Handle;
use crate::map::extents_write::Ext;
use rext4_format::PhysBlock;

/// Blocks given to a hole of a file: physical `p..p + n` for the logical blocks asked for
/// from the first. `fresh` is what was taken from the bitmap, `(first block, blocks)`, whole
/// clusters (nothing when the blocks went in a cluster the file already had), and `claimed`
/// the blocks quota admitted for them and still holds for the inode's next record write.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DataAlloc {
    pub p: u64,
    pub n: u64,
    pub fresh: (u64, u64),
    pub claimed: u64,
}

impl FsInner {
    /// Allocates blocks for the hole of `want` blocks at logical `lblk` of the extent-mapped
    /// `inode` (record `raw`, held for writing), near `goal`. `quota`: ask quota for the
    /// blocks taken (the caller did not). `appending` and `pool` as for
    /// [`FsInner::alloc_data_blocks`].
    #[allow(clippy::too_many_arguments)] // an allocation request's parts
    pub(crate) fn ext_alloc_data(
        &self,
        h: &Handle,
        inode: &Inode,
        raw: &[u8],
        lblk: u64,
        goal: u64,
        want: u32,
        appending: bool,
        pool: Pool,
        quota: bool,
    ) -> Result<DataAlloc> {
        let bits = self.sbi.cluster_bits;
        let mask = self.sbi.cluster_mask();
        let lc = lblk & !mask;
        let mut end = lblk + u64::from(want);
        if bits > 0 {
            if let Some(pc) = self.file_cluster(inode, raw, lc)? {
                // Invariant 2: the rest of this logical cluster is already the file's.
                let n = u64::from(want).min(lc + mask + 1 - lblk);
                return Ok(DataAlloc { p: pc + (lblk & mask), n, fresh: (0, 0), claimed: 0 });
            }
            // Fresh clusters, stopping before a logical cluster the file has a block of (its
            // blocks in the hole go in that one's cluster, on a later call).
            if end & mask != 0 && end & !mask > lc && self.file_cluster(inode, raw, end & !mask)?.is_some() {
                end &= !mask;
            }
        }
        let off = lblk & mask;
        let mut clusters = (off + end - lblk).div_ceil(mask + 1);
        let mut claimed = 0;
        if quota {
            claimed = self.quota_blocks_allowed(inode, raw, self.sbi.c2b(clusters))?;
            clusters = clusters.min(claimed >> bits);
        }
        let ask = u32::try_from(clusters).unwrap_or(u32::MAX);
        // Per-inode reserves only without bigalloc (a cluster is already a run).
        let got = if bits == 0 {
            self.alloc_data_blocks(h, inode, lblk, goal, ask, appending, pool)
        } else {
            self.alloc_clusters(h, goal, ask, pool)
        };
        let (c0, got) = match got {
            Ok(x) => x,
            Err(e) => {
                self.quota_unclaim_blocks(inode, claimed);
                return Err(e);
            }
        };
        let blocks = self.sbi.c2b(u64::from(got));
        self.quota_unclaim_blocks(inode, claimed.saturating_sub(blocks));
        let n = (blocks - off).min(end - lblk);
        Ok(DataAlloc { p: c0 + off, n, fresh: (c0, blocks), claimed: claimed.min(blocks) })
    }

    /// The first block of the physical cluster that holds the blocks of logical cluster `lc`
    /// (its first logical block) of `inode`, if any of them is mapped. A mapped block at
    /// another offset in its cluster than in the logical one is damage (invariant 2).
    fn file_cluster(&self, inode: &Inode, raw: &[u8], lc: u64) -> Result<Option<u64>> {
        let mask = self.sbi.cluster_mask();
        let Some(e) = self.ext_collect(inode, raw, lc, lc + mask + 1)?.into_iter().next() else {
            return Ok(None);
        };
        if e.pblk & mask != e.lblk & mask {
            return corrupt(CorruptKind::ExtentTree {
                ino: inode.ino,
                block: None,
                what: "extent not aligned to its cluster",
            });
        }
        let l = e.lblk.max(lc);
        Ok(Some((e.pblk + (l - e.lblk)) & !mask))
    }

    /// Frees the blocks of `old`, just unmapped from the extent-mapped `inode` (record `raw`
    /// shows the map without them): with bigalloc, each cluster none of whose logical
    /// cluster's blocks is still mapped (invariant 3). Returns the blocks freed, for
    /// `i_blocks`.
    pub(crate) fn free_file_data(&self, h: &Handle, inode: &Inode, raw: &[u8], old: &[Ext]) -> Result<u64> {
        let bits = self.sbi.cluster_bits;
        if bits == 0 {
            for e in old {
                self.free_blocks(h, e.pblk, e.len, false)?;
            }
            return Ok(old.iter().map(|e| e.len).sum());
        }
        let mask = self.sbi.cluster_mask();
        let mut ranges = Vec::with_capacity(old.len());
        for e in old.iter().filter(|e| e.len > 0) {
            if e.pblk & mask != e.lblk & mask {
                return corrupt(CorruptKind::ExtentTree {
                    ino: inode.ino,
                    block: Some(PhysBlock(e.pblk)),
                    what: "extent not aligned to its cluster",
                });
            }
            let (mut first, mut last) = (e.pblk >> bits, (e.pblk + e.len - 1) >> bits);
            // Only the end clusters can hold blocks the extent did not map.
            if e.pblk & mask != 0 && self.file_cluster(inode, raw, e.lblk & !mask)?.is_some() {
                first += 1;
            }
            let end = e.lblk + e.len;
            if last >= first && end & mask != 0 && self.file_cluster(inode, raw, end & !mask)?.is_some() {
                last -= 1;
            }
            if last >= first {
                ranges.push((first, last + 1));
            }
        }
        self.free_cluster_ranges(h, ranges)
    }

    /// Frees every cluster the data runs `data` (`(first block, blocks)`) touch, once each:
    /// a file going whole. Returns the blocks freed.
    pub(crate) fn free_all_data(&self, h: &Handle, data: &[(u64, u64)]) -> Result<u64> {
        let bits = self.sbi.cluster_bits;
        let ranges = data
            .iter()
            .filter(|&&(_, n)| n > 0)
            .map(|&(b, n)| (b >> bits, ((b + n - 1) >> bits) + 1))
            .collect();
        self.free_cluster_ranges(h, ranges)
    }

    /// Frees clusters `[first, end)` of each range, ranges that overlap or touch merged (two
    /// extents may share a cluster). Returns the blocks freed.
    fn free_cluster_ranges(&self, h: &Handle, mut ranges: Vec<(u64, u64)>) -> Result<u64> {
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (a, b) in ranges {
            match merged.last_mut() {
                Some((_, e)) if a <= *e => *e = (*e).max(b),
                _ => merged.push((a, b)),
            }
        }
        let mut freed = 0;
        for (a, b) in merged {
            let (start, len) = (self.sbi.c2b(a), self.sbi.c2b(b - a));
            self.free_blocks(h, start, len, false)?;
            freed += len;
        }
        Ok(freed)
    }

    /// Collapse and insert range move blocks by whole clusters only (invariant 2): `EINVAL`
    /// for an offset or length in bytes that is not a multiple of the cluster size.
    pub(crate) fn check_cluster_aligned(&self, offset: u64, len: u64) -> Result<()> {
        let unit = self.sbi.cluster_bytes();
        if !offset.is_multiple_of(unit) || !len.is_multiple_of(unit) {
            return Err(Error::InvalidInput("range not aligned to the cluster size"));
        }
        Ok(())
    }
}
