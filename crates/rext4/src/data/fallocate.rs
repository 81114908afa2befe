//! `fallocate(2)`: preallocation as unwritten extents, hole punching, zeroing, and the
//! collapse and insert of block-aligned ranges (the kernel's `extents.c`: `ext4_fallocate`,
//! `ext4_punch_hole`, `ext4_zero_range`, `ext4_collapse_range`, `ext4_insert_range`).
//!
//! # Locking
//! As writes (data/write.rs): `op_lock` -> journal handle -> `data_sem` -> `raw`.

use super::write::{CHUNK_BLOCKS, DATA_CREDITS, OPS_PER_HANDLE};
use crate::error::{Error, Result};
use crate::fs::{Fs, FsInner};
use crate::inode::write::{raw_size, raw_touch_c, raw_touch_cm};
use crate::inode::Inode;
use crate::map::extents_write::{Ext, LBLK_END};
use rext4_format::inode::{APPEND_FL, EXTENTS_FL, IMMUTABLE_FL, INLINE_DATA_FL};
use rext4_format::InodeNo;

/// `fallocate(2)` mode: keep the file size even when allocating past it.
pub const FALLOC_FL_KEEP_SIZE: u32 = 0x01;
/// `fallocate(2)` mode: deallocate the range (with `KEEP_SIZE`).
pub const FALLOC_FL_PUNCH_HOLE: u32 = 0x02;
/// `fallocate(2)` mode: remove the range and shift the rest of the file down.
pub const FALLOC_FL_COLLAPSE_RANGE: u32 = 0x08;
/// `fallocate(2)` mode: make the range read as zeros, keeping it allocated.
pub const FALLOC_FL_ZERO_RANGE: u32 = 0x10;
/// `fallocate(2)` mode: insert a hole, shifting the rest of the file up.
pub const FALLOC_FL_INSERT_RANGE: u32 = 0x20;

impl FsInner {
    pub(crate) fn fallocate(&self, ino: InodeNo, mode: u32, offset: u64, len: u64) -> Result<()> {
        let journal = self.journal()?.clone();
        let known = FALLOC_FL_KEEP_SIZE
            | FALLOC_FL_PUNCH_HOLE
            | FALLOC_FL_COLLAPSE_RANGE
            | FALLOC_FL_ZERO_RANGE
            | FALLOC_FL_INSERT_RANGE;
        if mode & !known != 0 {
            return Err(Error::NotSupported("fallocate mode".into()));
        }
        if len == 0 {
            return Err(Error::InvalidInput("fallocate length 0"));
        }
        // `vfs_fallocate`: EISDIR for directories, not supported on other non-regular files.
        let inode = match self.regular_file(ino) {
            Err(Error::InvalidInput(_)) => {
                return Err(Error::NotSupported("fallocate on a special file".into()))
            }
            r => r?,
        };
        // `vfs_fallocate`: an append-only file loses no bytes; an immutable one nothing.
        let flags = inode.flags();
        if flags & IMMUTABLE_FL != 0
            || (flags & APPEND_FL != 0 && mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_COLLAPSE_RANGE) != 0)
        {
            return Err(Error::NotPermitted);
        }
        // Encrypted blocks are bound to their logical numbers (the XTS tweak): moving them
        // would need them encrypted again (`ext4_fallocate`).
        if flags & rext4_format::inode::ENCRYPT_FL != 0
            && mode & (FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_INSERT_RANGE) != 0
        {
            return Err(Error::NotSupported("collapse or insert range on an encrypted file".into()));
        }
        if flags & INLINE_DATA_FL != 0 {
            let _op = self.stats.lock(crate::fs::stats::LockClass::OpLock, &inode.op_lock);
            self.inline_to_blocks(&journal, &inode)?;
        }
        let extents = inode.flags() & EXTENTS_FL != 0;
        if !extents && mode != FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE {
            // As the kernel: only extent-mapped files have unwritten extents (and shifts);
            // a hole is punched in either kind (`ext4_ind_remove_space`).
            return Err(Error::NotSupported("fallocate on a block-mapped file".into()));
        }
        let end = offset.checked_add(len).ok_or(Error::FileTooBig)?;
        if end > self.max_file_size(extents) {
            return Err(Error::FileTooBig);
        }
        let keep = mode & FALLOC_FL_KEEP_SIZE != 0;
        let _op = self.stats.lock(crate::fs::stats::LockClass::OpLock, &inode.op_lock);
        self.contents_key_held(&inode)?;
        // Every mode edits the map: dirty pages over it are written back first.
        self.writeback_locked(&inode)?;
        let bs = u64::from(self.sbi.block_size);
        match mode & !FALLOC_FL_KEEP_SIZE {
            0 => self.alloc_range(&journal, &inode, offset, end, keep, false),
            FALLOC_FL_ZERO_RANGE => self.alloc_range(&journal, &inode, offset, end, keep, true),
            FALLOC_FL_PUNCH_HOLE if keep => {
                let size = inode.size();
                let end = end.min(size.div_ceil(bs) * bs);
                if offset >= end {
                    return Ok(());
                }
                let h = journal.start(DATA_CREDITS)?;
                {
                    let _d = self.stats.write(crate::fs::stats::LockClass::DataSem, &inode.data_sem);
                    let mut raw = inode.raw_mut();
                    self.zero_partial(&inode, &raw, offset, end)?;
                    raw_touch_cm(&mut raw, self.now());
                    self.mark_inode_dirty(&h, &inode, &mut raw)?;
                }
                let (lo, hi) = (offset.div_ceil(bs), end / bs);
                if lo < hi {
                    self.free_range(h, &inode, lo, hi)?;
                }
                Ok(())
            }
            FALLOC_FL_COLLAPSE_RANGE if !keep => self.shift_range(&journal, &inode, offset, len, false),
            FALLOC_FL_INSERT_RANGE if !keep => self.shift_range(&journal, &inode, offset, len, true),
            _ => Err(Error::NotSupported("fallocate mode combination".into())),
        }
    }

    /// Zeros the parts of `from..to` that lie in partial blocks at its ends.
    fn zero_partial(&self, inode: &Inode, raw: &[u8], from: u64, to: u64) -> Result<()> {
        let bs = u64::from(self.sbi.block_size);
        let head_end = from.div_ceil(bs) * bs;
        if !from.is_multiple_of(bs) {
            self.zero_stored(inode, raw, from, head_end.min(to))?;
        }
        let tail_start = (to / bs) * bs;
        if !to.is_multiple_of(bs) && tail_start >= head_end {
            self.zero_stored(inode, raw, tail_start.max(from), to)?;
        }
        Ok(())
    }

    /// `fallocate` modes 0 and `ZERO_RANGE`: every block of the range gets storage (unwritten
    /// where there was none; with `zero`, written blocks become unwritten too, and partial end
    /// blocks are zeroed); the size grows to `end` unless `keep`.
    fn alloc_range(
        &self,
        journal: &std::sync::Arc<crate::jbd2::journal::Journal>,
        inode: &Inode,
        offset: u64,
        end: u64,
        keep: bool,
        zero: bool,
    ) -> Result<()> {
        let bs = u64::from(self.sbi.block_size);
        let (lo, hi) = if zero { (offset.div_ceil(bs), end / bs) } else { (offset / bs, end.div_ceil(bs)) };
        let mut cur = lo;
        let mut first = true;
        let mut retried = false;
        // A caller that keeps the times (`Fs::set_caller_write_times`: FUSE's writeback cache)
        // stamps mtime and ctime itself when fallocate grows the file, and sends them only if
        // they changed: stamping here too would persist a time it never showed.
        let caller_stamps = !keep && end > inode.size() && !self.write_stamps_times();
        loop {
            let h = journal.start(DATA_CREDITS)?;
            let _d = self.stats.write(crate::fs::stats::LockClass::DataSem, &inode.data_sem);
            let mut raw = inode.raw_mut();
            // The map is edited in place: a step refused part way still journals the inode
            // with what this handle did (blocks it allocated, extents it converted), so memory
            // and the log agree; the error is returned after.
            let step = (|| -> Result<u64> {
                if first && zero {
                    self.zero_partial(inode, &raw, offset, end)?;
                }
                let mut reached = cur;
                if cur >= hi {
                    return Ok(reached);
                }
                if !zero {
                    match self.fill_map(&h, inode, &mut raw, cur, hi.min(cur + CHUNK_BLOCKS), true, false) {
                        Ok(f) => reached = f.reached,
                        Err(Error::NoSpace) if !retried && self.has_busy_blocks() => {}
                        Err(e) => return Err(e),
                    }
                    return Ok(reached);
                }
                // Stored blocks become unwritten in place (`ext4_zero_range`).
                let upto = hi.min(cur + CHUNK_BLOCKS);
                let written: Vec<Ext> = self
                    .map_runs(inode, &raw, cur, upto)?
                    .into_iter()
                    .filter(|e| !e.unwritten)
                    .take(OPS_PER_HANDLE)
                    .collect();
                if !written.is_empty() {
                    // Written blocks are about to read as zeros: their pages go (no reader
                    // fills a page while `data_sem` is held for writing).
                    inode.invalidate_pages();
                }
                for e in &written {
                    self.ext_remap(&h, inode, &mut raw, e.lblk..e.lblk + e.len, Some((e.pblk, true)))?;
                }
                let conv_end = if written.len() == OPS_PER_HANDLE {
                    written.last().map_or(upto, |e| e.lblk + e.len)
                } else {
                    upto
                };
                while reached < conv_end {
                    match self.fill_map(&h, inode, &mut raw, reached, conv_end, true, false) {
                        Ok(f) if f.reached > reached => reached = f.reached,
                        Ok(_) => break,
                        Err(Error::NoSpace) if !retried && self.has_busy_blocks() => break,
                        Err(e) => return Err(e),
                    }
                }
                Ok(reached)
            })();
            first = false;
            let reached = match step {
                Ok(reached) => reached,
                Err(e) => {
                    self.mark_inode_dirty(&h, inode, &mut raw)?;
                    drop(raw);
                    h.stop();
                    return Err(e);
                }
            };
            let done = reached >= hi;
            let grows = done && !keep && end > raw_size(&raw);
            if grows {
                crate::inode::write::raw_set_size(&mut raw, end);
            }
            if !caller_stamps {
                if grows || zero {
                    raw_touch_cm(&mut raw, self.now());
                } else {
                    raw_touch_c(&mut raw, self.now());
                }
            }
            self.mark_inode_dirty(&h, inode, &mut raw)?;
            drop(raw);
            h.stop();
            if done {
                return Ok(());
            }
            if reached == cur {
                if retried {
                    return Err(Error::NoSpace);
                }
                journal.sync()?;
                retried = true;
            }
            cur = reached;
        }
    }

    /// `COLLAPSE_RANGE` (remove `offset..offset+len`, shifting the rest down) and
    /// `INSERT_RANGE` (shift up from `offset`, leaving a hole).
    fn shift_range(
        &self,
        journal: &std::sync::Arc<crate::jbd2::journal::Journal>,
        inode: &Inode,
        offset: u64,
        len: u64,
        insert: bool,
    ) -> Result<()> {
        let bs = u64::from(self.sbi.block_size);
        if !offset.is_multiple_of(bs) || !len.is_multiple_of(bs) {
            return Err(Error::InvalidInput("range not block-aligned"));
        }
        self.check_cluster_aligned(offset, len)?;
        let size = inode.size();
        let (lo, n) = (offset / bs, len / bs);
        if insert {
            if offset >= size {
                return Err(Error::InvalidInput("insert at or past the end"));
            }
            if size + len > self.max_file_size(true) {
                return Err(Error::FileTooBig);
            }
        } else {
            if offset + len >= size {
                return Err(Error::InvalidInput("collapse reaching the end"));
            }
            // Free the range first (several handles if need be), then shift in one.
            let h = journal.start(DATA_CREDITS)?;
            self.free_range(h, inode, lo, lo + n)?;
        }
        // The extents from `lo` on: what moves (the caller's op_lock keeps them as read).
        let after = {
            let raw = inode.raw();
            self.ext_collect(inode, &raw, lo, LBLK_END)?
        };
        let more = u32::try_from(after.len() / 8).unwrap_or(u32::MAX);
        let credits = DATA_CREDITS.saturating_add(more).min(journal.max_txn_buffers());
        let h = journal.start(credits)?;
        let _d = self.stats.write(crate::fs::stats::LockClass::DataSem, &inode.data_sem);
        let mut raw = inode.raw_mut();
        if insert {
            if after.last().is_some_and(|e| e.lblk + e.len + n > LBLK_END) {
                return Err(Error::FileTooBig);
            }
            match after.first().filter(|w| w.lblk < lo) {
                // Split the extent straddling `lo`, so every key from `lo` on can move up.
                Some(w) => {
                    let right_len = w.lblk + w.len - lo;
                    let right_pblk = w.pblk + (lo - w.lblk);
                    // Cutting an extent's tail and shifting keys take no block; the right
                    // part's new entry may (a split), and without one the cut is undone: the
                    // part goes back to its left neighbour, which it merges with.
                    let right = Some((right_pblk, w.unwritten));
                    self.ext_remap(&h, inode, &mut raw, lo..lo + right_len, None)?;
                    self.ext_shift(&h, inode, &mut raw, lo, n as i64)?;
                    let moved = lo + n..lo + n + right_len;
                    if let Err(e) = self.ext_remap(&h, inode, &mut raw, moved, right) {
                        self.ext_shift(&h, inode, &mut raw, lo + n, -(n as i64))?;
                        self.ext_remap(&h, inode, &mut raw, lo..lo + right_len, right)?;
                        self.mark_inode_dirty(&h, inode, &mut raw)?;
                        return Err(e);
                    }
                }
                None => self.ext_shift(&h, inode, &mut raw, lo, n as i64)?,
            }
            crate::inode::write::raw_set_size(&mut raw, size + len);
        } else {
            self.ext_shift(&h, inode, &mut raw, lo + n, -(n as i64))?;
            crate::inode::write::raw_set_size(&mut raw, size - len);
        }
        // Every block from `lo` on moved.
        inode.invalidate_pages();
        raw_touch_cm(&mut raw, self.now());
        self.mark_inode_dirty(&h, inode, &mut raw)?;
        drop(raw);
        h.stop();
        Ok(())
    }
}

impl Fs {
    /// `fallocate(2)` with the kernel's mode flags (`FALLOC_FL_*`): 0 and `KEEP_SIZE`
    /// allocate unwritten blocks, `PUNCH_HOLE | KEEP_SIZE` frees, `ZERO_RANGE` makes the
    /// range read as zeros keeping it allocated, `COLLAPSE_RANGE` and `INSERT_RANGE` shift
    /// the rest of the file by a block-aligned amount. Extent-mapped files only, as in the
    /// kernel (`EOPNOTSUPP` otherwise).
    pub fn fallocate(&self, ino: InodeNo, mode: u32, offset: u64, len: u64) -> Result<()> {
        self.inner.op(crate::fs::stats::Op::Fallocate, || self.inner.fallocate(ino, mode, offset, len))
    }
}
