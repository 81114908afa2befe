//! The system zone (the kernel's `block_validity.c`): every block the filesystem's own
//! metadata lives in — superblock and descriptor copies with their reserved blocks, bitmaps,
//! inode tables, and the journal's blocks. A block number read from an inode (an extent, an
//! index or indirect block, an xattr block) that falls in it is corruption: reading it would
//! show metadata as data, writing or freeing it would destroy the filesystem.
//!
//! Built once at open from the descriptors (checked by `Groups::load`) and the journal inode;
//! immutable afterwards, so lookups take no lock.
//!
//! # Invariants
//! - `zones` is sorted by start, and zones do not overlap: adjacent or overlapping ranges with
//!   the same owner are merged when built, so a lookup is one binary search.
//! - A zone with an owner (the journal inode) is valid for that inode alone.

use crate::error::{corrupt, CorruptKind, Result};
use crate::fs::super_block::SbInfo;
use crate::fs::FsInner;
use rext4_format::{InodeNo, PhysBlock};

/// One run of metadata blocks, `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Zone {
    start: u64,
    end: u64,
    /// The inode whose blocks these are (the journal's), or 0 for the filesystem's own.
    owner: u32,
}

/// Metadata runs of a filesystem. [immutable after open]
#[derive(Debug, Default)]
pub(crate) struct SystemZones {
    zones: Vec<Zone>,
}

impl SystemZones {
    /// The per-group metadata of the filesystem: `base_meta(g)` blocks at the start of each
    /// group (superblock and descriptor copies, reserved descriptor blocks), both bitmaps and
    /// the inode table.
    pub(crate) fn build(
        sbi: &SbInfo,
        groups: &crate::alloc::group::Groups,
        base_meta: impl Fn(u32) -> u64,
    ) -> Self {
        let ds = sbi.desc_size;
        let mut runs = Vec::with_capacity(sbi.group_count as usize * 4);
        for g in 0..sbi.group_count {
            let first = sbi.group_first_block(g);
            let base = base_meta(g).min(u64::from(sbi.blocks_in_group(g)));
            if base > 0 {
                runs.push((first, first + base, 0));
            }
            let d = groups.get(g);
            runs.push((d.block_bitmap(ds), d.block_bitmap(ds) + 1, 0));
            runs.push((d.inode_bitmap(ds), d.inode_bitmap(ds) + 1, 0));
            runs.push((d.inode_table(ds), d.inode_table(ds) + sbi.inode_table_blocks, 0));
        }
        let mut z = SystemZones::default();
        z.add(runs);
        z
    }

    /// Adds the runs `(start, end, owner)` and restores the invariants. Where an owned run
    /// overlaps the filesystem's own metadata, the metadata wins (nobody may use the block).
    /// Runs of different owners never overlap (only the journal has one).
    pub(crate) fn add(&mut self, runs: impl IntoIterator<Item = (u64, u64, u32)>) {
        let new = runs.into_iter().map(|(start, end, owner)| Zone { start, end, owner });
        let (meta, owned): (Vec<Zone>, Vec<Zone>) =
            self.zones.drain(..).chain(new).filter(|z| z.start < z.end).partition(|z| z.owner == 0);
        let meta = merged(meta);
        let mut pieces = Vec::with_capacity(owned.len());
        for o in owned {
            let mut s = o.start;
            let first = meta.partition_point(|m| m.end <= o.start);
            for m in meta[first..].iter().take_while(|m| m.start < o.end) {
                if m.start > s {
                    pieces.push(Zone { start: s, end: m.start, owner: o.owner });
                }
                s = s.max(m.end);
            }
            if s < o.end {
                pieces.push(Zone { start: s, ..o });
            }
        }
        let mut all = merged(pieces);
        all.extend(meta);
        all.sort_unstable_by_key(|z| z.start);
        self.zones = all;
    }

    /// Whether `len` blocks from `start` stay clear of every zone that `ino` does not own.
    pub(crate) fn clear_of(&self, ino: Option<InodeNo>, start: u64, len: u64) -> bool {
        let end = start.saturating_add(len);
        // The first zone ending after `start`; any overlap is with it or a later one.
        let mut i = self.zones.partition_point(|z| z.end <= start);
        while let Some(z) = self.zones.get(i) {
            if z.start >= end {
                return true;
            }
            if z.owner == 0 || Some(InodeNo(z.owner)) != ino {
                return false;
            }
            i += 1;
        }
        true
    }

    /// Clusters of `2^bits` blocks holding any of the filesystem's own metadata (the
    /// journal's blocks not counted).
    pub(crate) fn meta_clusters(&self, bits: u32) -> u64 {
        let mut count = 0;
        // The last cluster counted: zones are sorted, so a cluster shared by two is met
        // by the second as its first.
        let mut last: Option<u64> = None;
        for z in self.zones.iter().filter(|z| z.owner == 0) {
            let (first, end) = (z.start >> bits, (z.end - 1) >> bits);
            let first = match last {
                Some(l) if l >= first => l + 1,
                _ => first,
            };
            if first <= end {
                count += end - first + 1;
                last = Some(end);
            }
        }
        count
    }

    /// Number of runs (for tests and statistics).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.zones.len()
    }
}

/// `zones` sorted, with overlapping or adjacent runs of the same owner joined.
fn merged(mut zones: Vec<Zone>) -> Vec<Zone> {
    zones.sort_unstable_by_key(|z| (z.owner, z.start));
    let mut out: Vec<Zone> = Vec::with_capacity(zones.len());
    for z in zones {
        match out.last_mut() {
            Some(last) if last.owner == z.owner && z.start <= last.end => last.end = last.end.max(z.end),
            _ => out.push(z),
        }
    }
    out.sort_unstable_by_key(|z| z.start);
    out
}

impl FsInner {
    /// Checks that `len` blocks from `blk`, named by inode `ino`, lie inside the filesystem and
    /// outside its metadata (the kernel's `ext4_inode_block_valid`).
    pub(crate) fn check_range(&self, ino: InodeNo, blk: u64, len: u64) -> Result<()> {
        let end = blk.checked_add(len);
        if blk < self.sbi.first_data_block || end.is_none_or(|e| e > self.sbi.blocks_count) {
            return corrupt(CorruptKind::BlockRange { ino: Some(ino), block: PhysBlock(blk) });
        }
        if !self.zones.clear_of(Some(ino), blk, len) {
            return corrupt(CorruptKind::SystemZone { ino: Some(ino), block: PhysBlock(blk), len });
        }
        Ok(())
    }

    /// Reads block `blk`, which inode `ino` names as one of its own (an extent index, an
    /// indirect block, an xattr block), after [`FsInner::check_range`].
    pub(crate) fn bread_owned(
        &self,
        ino: InodeNo,
        blk: u64,
    ) -> Result<std::sync::Arc<crate::cache::buffer::Buffer>> {
        self.check_range(ino, blk, 1)?;
        self.bcache.get(blk)
    }

    /// Adds the journal inode's blocks to the system zone: valid for the journal, for nobody
    /// else. Called once, before the filesystem is shared.
    pub(crate) fn protect_journal(&mut self) {
        let sb = &self.sbi.sb;
        if !sb.compat().contains(rext4_format::features::Compat::HAS_JOURNAL) {
            return;
        }
        let jino = sb.s_journal_inum.get();
        if jino == 0 {
            return;
        }
        // A journal that cannot be mapped is reported by whoever loads it (recovery, or the
        // writable open); a read-only open goes on without its blocks in the zone.
        if let Ok((log, _, _)) = self.journal_log(InodeNo(jino)) {
            let runs: Vec<_> = log.runs().map(|(p, len)| (p, p + len, jino)).collect();
            self.zones.add(runs);
        }
    }

    /// Adds the MMP block (`mmp` feature) to the system zone, so that no inode may claim it.
    /// A writable open, which writes the block from here on, refuses an image whose block
    /// lies in other metadata (the journal, ...; `fs/mmp.rs` checked the rest before
    /// recovery); a read-only open leaves such a block out.
    pub(crate) fn protect_mmp(&mut self, writable: bool) -> Result<()> {
        let sb = &self.sbi.sb;
        if !sb.incompat().contains(rext4_format::features::Incompat::MMP) {
            return Ok(());
        }
        let blk = sb.s_mmp_block.get();
        let inside = blk >= self.sbi.first_data_block && blk < self.sbi.blocks_count;
        if inside && self.zones.clear_of(None, blk, 1) {
            self.zones.add([(blk, blk + 1, 0)]);
        } else if writable {
            return corrupt(CorruptKind::SystemZone { ino: None, block: PhysBlock(blk), len: 1 });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zones(runs: &[(u64, u64, u32)]) -> SystemZones {
        let mut z = SystemZones::default();
        z.add(runs.iter().copied());
        z
    }

    #[test]
    fn adjacent_runs_merge_and_lookups_find_overlaps() {
        let z = zones(&[(10, 12, 0), (12, 20, 0), (30, 31, 0), (5, 6, 0)]);
        assert_eq!(z.len(), 3);
        assert!(z.clear_of(None, 0, 5));
        assert!(!z.clear_of(None, 0, 6));
        assert!(z.clear_of(None, 6, 4));
        assert!(!z.clear_of(None, 19, 1));
        assert!(z.clear_of(None, 20, 10));
        assert!(!z.clear_of(None, 20, 11));
        assert!(z.clear_of(None, 31, u64::MAX));
        assert!(!z.clear_of(None, 0, u64::MAX));
    }

    #[test]
    fn owned_runs_are_valid_for_their_owner_only() {
        let z = zones(&[(100, 200, 8), (50, 60, 0)]);
        let j = Some(InodeNo(8));
        assert!(z.clear_of(j, 100, 100));
        assert!(!z.clear_of(Some(InodeNo(12)), 150, 1));
        assert!(!z.clear_of(None, 199, 1));
        // Spanning the owner's run and another zone.
        assert!(!z.clear_of(j, 55, 50));
        assert!(z.clear_of(j, 60, 140));
    }

    #[test]
    fn metadata_keeps_what_an_owned_run_overlaps() {
        // A journal mapped over an inode table: its blocks there are nobody's.
        let z = zones(&[(100, 200, 8), (150, 160, 0)]);
        let j = Some(InodeNo(8));
        assert!(z.clear_of(j, 100, 50));
        assert!(!z.clear_of(j, 150, 1));
        assert!(!z.clear_of(j, 159, 1));
        assert!(z.clear_of(j, 160, 40));
        let z = zones(&[(100, 200, 0), (150, 260, 8)]);
        assert!(!z.clear_of(j, 199, 1));
        assert!(z.clear_of(j, 200, 60));
    }
}
