//! Converting a file between a block map and an extent tree (the kernel's `migrate.c`), as
//! `chattr +e` and `chattr -e` ask through `Fs::set_flags`.
//!
//! - To extents (`ext4_ext_migrate`): any block-mapped regular file or directory, on a
//!   filesystem with the `extents` feature. The data stays where it is; its runs become
//!   extents, the indirect blocks are freed and the tree's blocks (if more than four runs)
//!   allocated, all in one handle, so a crash leaves the old map or the new tree, never a
//!   mix. The kernel builds the tree in a temporary inode and swaps it in; a single handle
//!   gives the same atomicity without the temporary inode.
//! - To a block map (`ext4_ind_migrate`): only what needs no indirect block, as the kernel
//!   allows: a tree of at most one written extent, in the root, ending before logical block
//!   12, on a filesystem whose blocks all have 32-bit numbers. Anything else is
//!   `EOPNOTSUPP`.
//!
//! Both run with the file's `op_lock` held (no writer), its delayed pages written back first
//! (as `ext4_alloc_da_blocks` does), and its `data_sem` exclusive while the map changes.

use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::FsInner;
use crate::inode::write::{raw_flags, raw_set_flags, raw_size, raw_sub_blocks};
use crate::inode::Inode;
use crate::map::extents_write::{Ext, I_BLOCK, LBLK_END};
use crate::map::indirect_write::word;
use crate::num::usize_from;
use rext4_format::extent::INIT_MAX_LEN;
use rext4_format::features::Incompat;
use rext4_format::inode::{
    DIND_BLOCK, EXTENTS_FL, IND_BLOCK, INLINE_DATA_FL, NDIR_BLOCKS, S_IFLNK, TIND_BLOCK,
};
use std::sync::Arc;

/// A block map as the conversion sees it: the data's runs and the indirect blocks.
struct BlockMap {
    runs: Vec<Ext>,
    meta: Vec<u64>,
}

impl BlockMap {
    /// Adds data block `pblk` at logical block `lblk` (called in increasing `lblk` order).
    fn push(&mut self, lblk: u64, pblk: u64) -> Result<()> {
        if lblk >= LBLK_END {
            return Err(Error::NotSupported("a block past what an extent can map".into()));
        }
        match self.runs.last_mut() {
            Some(e)
                if e.lblk + e.len == lblk && e.pblk + e.len == pblk && e.len < u64::from(INIT_MAX_LEN) =>
            {
                e.len += 1;
            }
            _ => self.runs.push(Ext { lblk, len: 1, pblk, unwritten: false }),
        }
        Ok(())
    }
}

impl FsInner {
    /// Reads the block map of record `raw`: every data run in logical order and every
    /// indirect block, each checked against the system zone. A map naming more blocks than
    /// the filesystem has is damaged (it bounds the walk of a map whose indirect blocks name
    /// each other).
    fn ind_layout(&self, inode: &Inode, raw: &[u8]) -> Result<BlockMap> {
        let ptrs = u64::from(self.sbi.block_size / 4);
        let mut map = BlockMap { runs: Vec::new(), meta: Vec::new() };
        // Every pointer followed counts; past the filesystem's size the map is damaged.
        let mut seen = 0u64;
        let mut count = || -> Result<()> {
            seen += 1;
            if seen > self.sbi.blocks_count {
                let what = "block map names more blocks than the filesystem has";
                return corrupt(CorruptKind::Inode { ino: inode.ino, what });
            }
            Ok(())
        };
        let iblock = &raw[I_BLOCK];
        for i in 0..NDIR_BLOCKS {
            let p = word(iblock, i);
            if p != 0 {
                count()?;
                self.check_range(inode.ino, p, 1)?;
                map.push(i as u64, p)?;
            }
        }
        // (block, levels below it, its first logical block, blocks one entry covers)
        let mut stack = Vec::new();
        let mut first = NDIR_BLOCKS as u64;
        let mut span = ptrs;
        for (slot, levels) in [(IND_BLOCK, 1u32), (DIND_BLOCK, 2), (TIND_BLOCK, 3)] {
            let p = word(iblock, slot);
            if p != 0 {
                stack.push((p, levels, first, span / ptrs));
            }
            first += span;
            span = span.saturating_mul(ptrs);
        }
        // Depth-first, lowest logical blocks first: pushed in reverse so they pop in order.
        stack.reverse();
        while let Some((blk, levels, first, per)) = stack.pop() {
            count()?;
            let buf = self.bread_owned(inode.ino, blk)?;
            map.meta.push(blk);
            let data = buf.data();
            let mut children = Vec::new();
            for i in 0..usize_from(ptrs) {
                let p = word(&data, i);
                if p == 0 {
                    continue;
                }
                let lblk = first + i as u64 * per;
                if levels == 1 {
                    count()?;
                    self.check_range(inode.ino, p, 1)?;
                    map.push(lblk, p)?;
                } else {
                    children.push((p, levels - 1, lblk, per / ptrs));
                }
            }
            stack.extend(children.into_iter().rev());
        }
        // No block named twice (data and indirect blocks alike): freeing an indirect block
        // that is also named as data would hand out a block the file still maps.
        let mut claimed: Vec<(u64, u64)> =
            map.runs.iter().map(|e| (e.pblk, e.len)).chain(map.meta.iter().map(|&b| (b, 1))).collect();
        claimed.sort_unstable();
        if claimed.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
            let what = "block map names a block twice";
            return corrupt(CorruptKind::Inode { ino: inode.ino, what });
        }
        Ok(map)
    }

    /// `chattr +e`: converts block-mapped `inode` to an extent tree (module text). The
    /// caller holds its `op_lock`.
    pub(crate) fn ext_migrate(&self, inode: &Arc<Inode>) -> Result<()> {
        let flags = inode.flags();
        if !self.sbi.sb.incompat().contains(Incompat::EXTENTS) || flags & (EXTENTS_FL | INLINE_DATA_FL) != 0 {
            return Err(Error::InvalidInput("not a block-mapped file on an extents filesystem"));
        }
        if self.sbi.cluster_bits > 0 {
            // Its blocks were never placed by clusters (map/cluster.rs invariant 2).
            return Err(Error::NotSupported(
                "converting a block-mapped file on a bigalloc filesystem".into(),
            ));
        }
        let (kind, blocks) = inode.with_disk(|d| (d.file_type(), d.i_blocks_lo.get()));
        if kind == S_IFLNK && blocks == 0 {
            // A fast symlink has no map: nothing to convert (and the flag stays off).
            return Ok(());
        }
        self.writeback_locked(inode)?;
        let map = {
            let _d = inode.data_sem.read();
            let raw = inode.raw();
            self.ind_layout(inode, &raw)?
        };
        // The record, the tree's blocks with a bitmap and descriptor for each group they may
        // span, and a bitmap and descriptor for each group an indirect block is freed from.
        let tree = self.ext_build_blocks(map.runs.len());
        let mut freed_groups: Vec<u64> =
            map.meta.iter().map(|b| b / u64::from(self.sbi.blocks_per_group)).collect();
        freed_groups.sort_unstable();
        freed_groups.dedup();
        let credits = 4 + tree * 3 + 2 * freed_groups.len() as u64;
        let journal = self.journal()?.clone();
        let credits = u32::try_from(credits).unwrap_or(u32::MAX);
        match self.ext_migrate_in(&journal, inode, &map, credits) {
            // Blocks freed by a transaction not yet committed come back at its commit
            // (`ext4_should_retry_alloc`).
            Err(Error::NoSpace) if self.has_busy_blocks() => {
                journal.sync()?;
                self.ext_migrate_in(&journal, inode, &map, credits)
            }
            r => r,
        }
    }

    /// The handle of [`FsInner::ext_migrate`]: the record's map replaced by a tree of
    /// `map`'s runs and its indirect blocks freed, or nothing changed.
    fn ext_migrate_in(
        &self,
        journal: &crate::jbd2::journal::Journal,
        inode: &Arc<Inode>,
        map: &BlockMap,
        credits: u32,
    ) -> Result<()> {
        let h = journal.start(credits).map_err(|e| match e {
            Error::InvalidInput(_) => {
                Error::NotSupported("a map too large to convert in one transaction".into())
            }
            e => e,
        })?;
        let sectors = u64::from(self.sbi.block_size / 512);
        let _d = self.stats.write(crate::fs::stats::LockClass::DataSem, &inode.data_sem);
        let mut raw = inode.raw_mut();
        // Checked before anything changes: every indirect block is in use.
        for &b in &map.meta {
            self.check_blocks_in_use(&h, b, 1)?;
        }
        let saved: Vec<u8> = raw[I_BLOCK].to_vec();
        raw[I_BLOCK].fill(0);
        if let Err(e) = self.ext_build(&h, inode, &mut raw, &map.runs) {
            raw[I_BLOCK].copy_from_slice(&saved);
            return Err(e);
        }
        let flags = raw_flags(&raw) | EXTENTS_FL;
        raw_set_flags(&mut raw, flags);
        for &b in &map.meta {
            self.free_blocks(&h, b, 1, true)?;
            raw_sub_blocks(&mut raw, sectors);
        }
        self.mark_inode_dirty(&h, inode, &mut raw)?;
        drop(raw);
        h.stop();
        Ok(())
    }

    /// `chattr -e`: converts extent-mapped `inode` to a block map where no indirect block is
    /// needed (module text). The caller holds its `op_lock`.
    pub(crate) fn ind_migrate(&self, inode: &Arc<Inode>) -> Result<()> {
        if !self.sbi.sb.incompat().contains(Incompat::EXTENTS) || inode.flags() & EXTENTS_FL == 0 {
            return Err(Error::InvalidInput("not an extent-mapped file"));
        }
        self.writeback_locked(inode)?;
        let journal = self.journal()?.clone();
        let h = journal.start(1)?;
        let _d = self.stats.write(crate::fs::stats::LockClass::DataSem, &inode.data_sem);
        let mut raw = inode.raw_mut();
        let no = |why: &str| Err(Error::NotSupported(format!("converting to a block map: {why}")));
        if self.sbi.blocks_count > u64::from(u32::MAX) {
            return no("block numbers past 32 bits");
        }
        if self.sbi.cluster_bits > 0 {
            // As `ext4_ind_migrate`: block maps cannot hold clusters.
            return no("a bigalloc filesystem");
        }
        let exts = self.ext_collect(inode, &raw, 0, LBLK_END)?;
        // `eh_depth`, the fourth field of the root's header.
        let depth = u16::from_le_bytes([raw[I_BLOCK.start + 6], raw[I_BLOCK.start + 7]]);
        if depth != 0 || exts.len() > 1 {
            return no("more than one extent");
        }
        // Logical blocks 0..12 are the direct pointers.
        let run = exts.first().copied();
        if let Some(e) = run {
            if e.unwritten {
                return no("an unwritten extent");
            }
            if e.lblk + e.len > NDIR_BLOCKS as u64 {
                return no("blocks past the direct pointers");
            }
        }
        // A block-mapped file addresses less than an extent-mapped one may hold.
        if raw_size(&raw) > self.max_file_size(false) {
            return no("a size past what a block map addresses");
        }
        raw[I_BLOCK].fill(0);
        if let Some(e) = run {
            for i in 0..e.len {
                // Below 2^32: the filesystem's blocks are (checked above).
                #[allow(clippy::cast_possible_truncation)]
                let p = (e.pblk + i) as u32;
                let at = I_BLOCK.start + 4 * usize_from(e.lblk + i);
                raw[at..at + 4].copy_from_slice(&p.to_le_bytes());
            }
        }
        let flags = raw_flags(&raw) & !EXTENTS_FL;
        raw_set_flags(&mut raw, flags);
        self.mark_inode_dirty(&h, inode, &mut raw)?;
        drop(raw);
        h.stop();
        Ok(())
    }
}
