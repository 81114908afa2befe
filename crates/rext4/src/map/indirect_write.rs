//! Writing ext2/ext3 block maps (the write side of the kernel's `indirect.c`:
//! `ext4_ind_map_blocks` allocating, `ext4_ind_truncate`). Work on a record the caller holds
//! for writing; indirect blocks go through the journal like any metadata.

use crate::alloc::balloc::BLOCK_MAP_END;
use crate::alloc::reserved::Pool;
use crate::cache::buffer::Buffer;
use crate::error::{Error, Result};
use crate::fs::FsInner;
use crate::inode::write::{raw_add_blocks, raw_sub_blocks};
use crate::inode::Inode;
use crate::jbd2::transaction::Handle;
use crate::num::usize_from;
use rext4_format::inode::{DIND_BLOCK, IND_BLOCK, NDIR_BLOCKS, TIND_BLOCK};
use std::sync::Arc;

const I_BLOCK: usize = 0x28;

/// What [`FsInner::ind_walk`] found of a chain of blocks in a block map.
struct Walk {
    links: usize,
    last: u64,
    parent: Option<Arc<Buffer>>,
}

/// Pointer `i` of a block-map array (`i_block` or an indirect block).
pub(super) fn word(b: &[u8], i: usize) -> u64 {
    u64::from(u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]))
}

fn set_word(b: &mut [u8], i: usize, v: u32) {
    b[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
}

impl FsInner {
    /// The slot in `i_block` and the offsets in each indirect level that lead to `lblk`;
    /// `None` past what a block map addresses.
    pub(super) fn ind_path(&self, lblk: u64) -> Option<(usize, Vec<usize>)> {
        let ptrs = u64::from(self.sbi.block_size / 4);
        if lblk < NDIR_BLOCKS as u64 {
            return Some((usize_from(lblk), Vec::new()));
        }
        let mut l = lblk - NDIR_BLOCKS as u64;
        let mut span = ptrs;
        for (slot, levels) in [(IND_BLOCK, 1u32), (DIND_BLOCK, 2), (TIND_BLOCK, 3)] {
            if l < span {
                let mut offs = Vec::with_capacity(levels as usize);
                let mut covered = span;
                for _ in 0..levels {
                    covered /= ptrs;
                    offs.push(usize_from(l / covered));
                    l %= covered;
                }
                return Some((slot, offs));
            }
            l -= span;
            span = span.saturating_mul(ptrs);
        }
        None
    }

    /// How much of the chain to a block exists in the block map of record `raw`: the chain
    /// is b0 (named by the record's `slot`), b1 = b0[offs[0]], and so on. `links` of its
    /// blocks are there in a row, `last` is the deepest of them (0 when none is), and
    /// `parent` the index block holding the first missing pointer.
    fn ind_walk(&self, inode: &Inode, raw: &[u8], slot: usize, offs: &[usize]) -> Result<Walk> {
        let mut w = Walk { links: 0, last: word(&raw[I_BLOCK..], slot), parent: None };
        if w.last == 0 {
            return Ok(w);
        }
        w.links = 1;
        for &o in offs {
            let buf = self.bread_owned(inode.ino, w.last)?;
            let next = word(&buf.data(), o);
            if next == 0 {
                w.parent = Some(buf);
                break;
            }
            w.last = next;
            w.links += 1;
        }
        Ok(w)
    }

    /// The physical block of `lblk` in the block map of record `raw`, if mapped.
    pub(crate) fn ind_lookup(&self, inode: &Inode, raw: &[u8], lblk: u64) -> Result<Option<u64>> {
        let Some((slot, offs)) = self.ind_path(lblk) else { return Ok(None) };
        let w = self.ind_walk(inode, raw, slot, &offs)?;
        if w.links <= offs.len() {
            return Ok(None);
        }
        self.check_range(inode.ino, w.last, 1)?;
        Ok(Some(w.last))
    }

    /// Whether every indirect block on the way to `lblk` exists in the block map of record
    /// `raw` (a direct block needs none), so that mapping it takes its data block alone.
    pub(crate) fn ind_index_present(&self, inode: &Inode, raw: &[u8], lblk: u64) -> Result<bool> {
        let Some((slot, offs)) = self.ind_path(lblk) else { return Ok(false) };
        let Some((_, above)) = offs.split_last() else { return Ok(true) };
        Ok(self.ind_walk(inode, raw, slot, above)?.links > above.len())
    }

    /// Maps `lblk` to a new block near `goal` from `pool`, allocating the indirect blocks on
    /// the way (from the same pool, but for writeback's: `NoFail`, as the slack an extent
    /// tree's writeback takes its blocks from). Returns the data block; `i_blocks` counts
    /// every block allocated. Every block is allocated before anything is linked (the
    /// kernel's `ext4_alloc_branch`, then `ext4_splice_branch`): a failure part way gives
    /// back what it took and leaves the map as it was, so no block is left allocated that
    /// nothing names.
    pub(crate) fn ind_alloc(
        &self,
        h: &Handle,
        inode: &Inode,
        raw: &mut [u8],
        lblk: u64,
        goal: u64,
        pool: Pool,
    ) -> Result<u64> {
        if self.sbi.cluster_bits > 0 {
            // Block maps take blocks one at a time, never clusters (mke2fs and the kernel make
            // no such file on bigalloc).
            return Err(Error::NotSupported("block-mapped files on a bigalloc filesystem".into()));
        }
        let Some((slot, offs)) = self.ind_path(lblk) else { return Err(Error::FileTooBig) };
        let index_pool = if pool == Pool::Reserved { Pool::NoFail } else { pool };
        // The chain's last block, b[n], is the data block; b[first_missing..=n] are new.
        let n = offs.len();
        let Walk { links: first_missing, last, parent } = self.ind_walk(inode, raw, slot, &offs)?;
        if first_missing > n {
            return Ok(last);
        }
        // Block maps hold 32-bit block numbers: allocate below 2^32 (a 64bit filesystem may
        // be larger), so that the number stored is the block allocated.
        let mut new: Vec<u64> = Vec::with_capacity(n + 1 - first_missing);
        let mut goal = goal;
        for level in first_missing..=n {
            let from = if level == n { pool } else { index_pool };
            match self.alloc_blocks_below(h, goal, 1, from, BLOCK_MAP_END) {
                Ok((b, _)) => {
                    new.push(b);
                    goal = b + 1;
                }
                Err(e) => {
                    for (k, &b) in new.iter().enumerate() {
                        // Index blocks are metadata (revoked); the data block is never one
                        // here, as the last allocation is the one that failed.
                        self.free_blocks(h, b, 1, first_missing + k < n)?;
                    }
                    return Err(e);
                }
            }
        }
        let word32 = |b: u64| u32::try_from(b).map_err(|_| Error::FileTooBig);
        // The new index blocks, each naming the next new block; then the splice.
        for (k, pair) in new.windows(2).enumerate() {
            let buf = self.bcache.get_fresh(pair[0]);
            let mut d = h.write(&buf)?;
            d.fill(0);
            set_word(&mut d, offs[first_missing + k], word32(pair[1])?);
        }
        let top = word32(new[0])?;
        match parent {
            Some(buf) => set_word(&mut h.write(&buf)?, offs[first_missing - 1], top),
            None => set_word(&mut raw[I_BLOCK..], slot, top),
        }
        raw_add_blocks(raw, new.len() as u64 * u64::from(self.sbi.block_size / 512));
        Ok(new[new.len() - 1])
    }

    /// Frees every block of logical blocks `from..to` of the block map in `raw` (data, and the
    /// indirect blocks left empty: the kernel's `ext4_ind_remove_space`), clearing pointers to
    /// them. Checks everything first (see [`FsInner::ind_remove_check`]), so that damage found
    /// half way never leaves blocks freed that the record still names.
    pub(crate) fn ind_remove(
        &self,
        h: &Handle,
        inode: &Inode,
        raw: &mut [u8],
        from: u64,
        to: u64,
    ) -> Result<()> {
        self.ind_remove_check(h, inode, raw, from, to)?;
        let sectors = u64::from(self.sbi.block_size / 512);
        let ptrs = (self.sbi.block_size / 4) as u64;
        for i in usize_from(from.min(NDIR_BLOCKS as u64))..usize_from(to.min(NDIR_BLOCKS as u64)) {
            let p = word(&raw[I_BLOCK..], i);
            if p != 0 {
                self.check_range(inode.ino, p, 1)?;
                self.free_blocks(h, p, 1, false)?;
                raw_sub_blocks(raw, sectors);
                set_word(&mut raw[I_BLOCK..], i, 0);
            }
        }
        // Each top-level tree covers [first, first + span).
        let mut first = NDIR_BLOCKS as u64;
        let mut span = ptrs;
        for (slot, levels) in [(IND_BLOCK, 1u32), (DIND_BLOCK, 2), (TIND_BLOCK, 3)] {
            let p = word(&raw[I_BLOCK..], slot);
            if p != 0 && from < first + span && to > first {
                let range = (from.saturating_sub(first), to.saturating_sub(first));
                let (emptied, freed) = self.ind_prune(h, inode, p, levels, span, range)?;
                raw_sub_blocks(raw, freed * sectors);
                if emptied {
                    self.free_blocks(h, p, 1, true)?;
                    raw_sub_blocks(raw, sectors);
                    set_word(&mut raw[I_BLOCK..], slot, 0);
                }
            }
            first += span;
            span = span.saturating_mul(ptrs);
        }
        Ok(())
    }

    /// What [`FsInner::ind_remove`] would find wrong, found without changing anything: every
    /// block it may free (data and indirect blocks mapping `from..to`) inside the filesystem,
    /// outside its metadata and in use, every indirect block on the way readable.
    fn ind_remove_check(&self, h: &Handle, inode: &Inode, raw: &[u8], from: u64, to: u64) -> Result<()> {
        let ptrs = (self.sbi.block_size / 4) as u64;
        for i in usize_from(from.min(NDIR_BLOCKS as u64))..usize_from(to.min(NDIR_BLOCKS as u64)) {
            let p = word(&raw[I_BLOCK..], i);
            if p != 0 {
                self.check_range(inode.ino, p, 1)?;
                self.check_blocks_in_use(h, p, 1)?;
            }
        }
        let mut first = NDIR_BLOCKS as u64;
        let mut span = ptrs;
        // (block, levels below it, blocks it covers, covered blocks to free, relative)
        let mut stack = Vec::new();
        for (slot, levels) in [(IND_BLOCK, 1u32), (DIND_BLOCK, 2), (TIND_BLOCK, 3)] {
            let p = word(&raw[I_BLOCK..], slot);
            if p != 0 && from < first + span && to > first {
                stack.push((p, levels, span, from.saturating_sub(first), to.saturating_sub(first)));
            }
            first += span;
            span = span.saturating_mul(ptrs);
        }
        // Depth strictly decreases down the stack, so the walk ends.
        while let Some((blk, levels, span, from, to)) = stack.pop() {
            self.check_blocks_in_use(h, blk, 1)?;
            let buf = self.bread_owned(inode.ino, blk)?;
            let per = span / ptrs;
            let d = buf.data();
            for i in 0..ptrs as usize {
                let (p, start) = (word(&d, i), i as u64 * per);
                if p == 0 || start + per <= from || start >= to {
                    continue;
                }
                self.check_range(inode.ino, p, 1)?;
                if levels == 1 {
                    self.check_blocks_in_use(h, p, 1)?;
                } else {
                    stack.push((p, levels - 1, per, from.saturating_sub(start), to.saturating_sub(start)));
                }
            }
        }
        Ok(())
    }

    /// Frees what indirect block `blk` (covering `span` blocks, `levels` deep) maps in
    /// `from..to` (relative to its start). Returns whether it is now empty (freeing it is the
    /// caller's job) and how many blocks below it were freed.
    fn ind_prune(
        &self,
        h: &Handle,
        inode: &Inode,
        blk: u64,
        levels: u32,
        span: u64,
        (from, to): (u64, u64),
    ) -> Result<(bool, u64)> {
        let ptrs = (self.sbi.block_size / 4) as usize;
        let per = span / ptrs as u64;
        let buf = self.bread_owned(inode.ino, blk)?;
        let entries: Vec<u64> = {
            let d = buf.data();
            (0..ptrs).map(|i| word(&d, i)).collect()
        };
        let mut freed = 0u64;
        let mut cleared = Vec::new();
        let mut gone = vec![false; ptrs];
        for (i, &p) in entries.iter().enumerate() {
            let start = i as u64 * per;
            if p == 0 || start + per <= from || start >= to {
                continue;
            }
            self.check_range(inode.ino, p, 1)?;
            if levels == 1 {
                self.free_blocks(h, p, 1, false)?;
                freed += 1;
                cleared.push(i);
                gone[i] = true;
            } else {
                let range = (from.saturating_sub(start), to.saturating_sub(start));
                let (emptied, below) = self.ind_prune(h, inode, p, levels - 1, per, range)?;
                freed += below;
                if emptied {
                    self.free_blocks(h, p, 1, true)?;
                    freed += 1;
                    cleared.push(i);
                    gone[i] = true;
                }
            }
        }
        if !cleared.is_empty() {
            let mut d = h.write(&buf)?;
            for &i in &cleared {
                set_word(&mut d, i, 0);
            }
        }
        let empty = entries.iter().zip(&gone).all(|(&p, &g)| p == 0 || g);
        Ok((empty, freed))
    }
}
