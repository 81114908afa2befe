//! Writing file data (the write side of the kernel's `file.c`, `inode.c` and `extents.c`):
//! `write(2)`, `truncate(2)` (fallocate.rs has `fallocate(2)`), `lseek(2)`'s `SEEK_DATA` / `SEEK_HOLE`.
//!
//! Data goes straight to the device; there is no page cache of our own (the host's caches the
//! image). Ordering is the kernel's `data=ordered`: newly mapped blocks are written before the
//! handle that maps them stops, so the commit that makes them reachable (and its flush) comes
//! after their contents. Blocks freed by a transaction are not reused before it commits (see
//! alloc/balloc.rs), so a crash never shows one file another's data.
//!
//! # Locking
//! `op_lock` (writers to one file serialise, as under the kernel's `i_rwsem`) -> journal
//! handle -> `data_sem` (exclusive while the map changes and new blocks are filled) ->
//! `raw` (write). Readers take `data_sem` shared.

use crate::alloc::reserved::Pool;
use crate::attr::Timestamp;
use crate::error::{Error, Result};
use crate::fs::{Fs, FsInner};
use crate::inode::write::{raw_add_blocks, raw_flags, raw_size, raw_sub_blocks, raw_touch_cm};
use crate::inode::Inode;
use crate::jbd2::transaction::Handle;
use crate::map::extents_write::{Ext, LBLK_END};
use crate::num::usize_from;
use rext4_format::inode::{self as fi, APPEND_FL, ENCRYPT_FL, EXTENTS_FL, IMMUTABLE_FL, INLINE_DATA_FL};
use rext4_format::InodeNo;

/// Granularity of the clock that stamps overwrites (the kernel's coarse time: a jiffy at
/// HZ=250).
const COARSE_TICK_NS: i128 = 4_000_000;

/// Zeros for the parts of blocks a write or truncate must clear (the largest block size).
static ZEROS: [u8; 65536] = [0; 65536];

/// Writes shorter than this leave their whole blocks in the page cache (and so do runs of
/// written-back pages shorter than this: data/writeback.rs).
pub(super) const FILL_WRITE: usize = 64 << 10;

/// Blocks one write handle covers at most.
pub(super) const CHUNK_BLOCKS: u64 = 2048;
/// Allocations (or conversions) one handle makes at most, which bounds its buffers.
pub(super) const OPS_PER_HANDLE: usize = 4;
/// Credits of a data handle: per operation a bitmap, a descriptor and a tree path with splits.
pub(super) const DATA_CREDITS: u32 = 96;
/// Extents freed per handle when truncating or punching.
const FREES_PER_HANDLE: usize = 16;
/// Blocks of a block map freed per handle when truncating.
const IND_FREE_STEP: u64 = 8192;

/// What `fill_map` mapped: the runs, how far it got, and whether it stopped short for lack
/// of space.
pub(crate) struct Filled {
    pub runs: Vec<Run>,
    pub reached: u64,
    pub short: bool,
}

/// A run of the file to fill: logical start, length, physical start, and whether it was
/// just mapped (so the parts of its blocks the write does not cover must be zeroed).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Run {
    pub lblk: u64,
    pub len: u64,
    pub pblk: u64,
    pub(crate) fresh: bool,
}

impl Run {
    /// A run of blocks already mapped and written.
    pub(crate) fn mapped(e: &Ext) -> Run {
        Run { lblk: e.lblk, len: e.len, pblk: e.pblk, fresh: false }
    }
}

/// Where the bytes of a write come from.
#[derive(Clone, Copy)]
enum Source<'a> {
    Bytes(&'a [u8]),
    /// `len` bytes of a host file from `offset`.
    File {
        file: &'a std::fs::File,
        offset: u64,
        len: u64,
    },
}

impl Source<'_> {
    fn len(&self) -> u64 {
        match self {
            Source::Bytes(d) => d.len() as u64,
            Source::File { len, .. } => *len,
        }
    }
}

impl FsInner {
    /// The largest size a file can have (`ext4_max_size`, `ext4_max_bitmap_size`).
    pub(crate) fn max_file_size(&self, extents: bool) -> u64 {
        let bits = self.sbi.block_size.trailing_zeros();
        // Without huge_file, i_blocks (32 bits of 512-byte units) bounds the blocks a file
        // may own, metadata included.
        let upper_blocks =
            if self.sbi.huge_file { u64::MAX >> bits } else { ((1u64 << 32) - 1) >> (bits - 9) };
        let max_lfs = i64::MAX as u64;
        if extents {
            return ((((1u64 << 32) - 1).min(upper_blocks)) << bits).min(max_lfs);
        }
        let ppb = 1u64 << (bits - 2);
        let tree = 12 + ppb + ppb * ppb + ppb * ppb * ppb;
        let tree_meta = 1 + (1 + ppb) + (1 + ppb + ppb * ppb);
        let blocks = if tree + tree_meta <= upper_blocks {
            tree
        } else {
            // Data blocks plus the indirect blocks addressing them must fit in i_blocks.
            let mut rest = upper_blocks - 12 - ppb;
            let mut meta = 1;
            if rest < ppb * ppb {
                meta += 1 + rest.div_ceil(ppb);
            } else {
                meta += 1 + ppb;
                rest -= ppb * ppb;
                meta += 1 + rest.div_ceil(ppb) + rest.div_ceil(ppb * ppb);
            }
            upper_blocks - meta
        };
        (blocks << bits).min(max_lfs)
    }

    pub(super) fn regular_file(&self, ino: InodeNo) -> Result<std::sync::Arc<Inode>> {
        let inode = self.iget_by_number(ino)?;
        let d = inode.disk();
        match d.file_type() {
            fi::S_IFREG => {}
            fi::S_IFDIR => return Err(Error::IsDir),
            _ => return Err(Error::InvalidInput("not a regular file")),
        }
        // Contents are written with the file's key (crypto/contents.rs), `ENOKEY` without it
        // (the kernel's `fscrypt_file_open`, `fscrypt_prepare_setattr`).
        if d.flags() & ENCRYPT_FL != 0 && self.inode_crypt(&inode)?.contents.is_none() {
            return Err(Error::NoKey);
        }
        Ok(inode)
    }

    /// Moves an inline-data file's bytes into a block (`ext4_convert_inline_data`), so that
    /// writes, truncates and fallocate work on an ordinary block map. The caller holds the
    /// file's `op_lock`.
    pub(super) fn inline_to_blocks(
        &self,
        journal: &std::sync::Arc<crate::jbd2::journal::Journal>,
        inode: &Inode,
    ) -> Result<()> {
        let h = journal.start(DATA_CREDITS)?;
        let _d = self.stats.write(crate::fs::stats::LockClass::DataSem, &inode.data_sem);
        if inode.flags() & INLINE_DATA_FL == 0 {
            return Ok(());
        }
        let size = inode.size();
        let mut data = self.inline_bytes(inode)?;
        data.truncate(usize::try_from(size).unwrap_or(usize::MAX));
        let mut raw = inode.raw_mut();
        // Without a block (a full disk, a quota) or its write, the file stays inline, in
        // memory too.
        let saved = raw.to_vec();
        let moved = self.clear_inline_record(inode.ino, &mut raw).and_then(|()| {
            if data.is_empty() {
                return Ok(());
            }
            let f = self.fill_map(&h, inode, &mut raw, 0, 1, false, false)?;
            self.write_runs(inode, &f.runs, 0, &data).or_else(|e| {
                self.unmap_fresh(&h, inode, &mut raw, &f.runs)?;
                Err(e)
            })
        });
        if let Err(e) = moved {
            raw.copy_from_slice(&saved);
            return Err(e);
        }
        inode.invalidate_pages();
        self.mark_inode_dirty(&h, inode, &mut raw)?;
        drop(raw);
        h.stop();
        Ok(())
    }

    /// Mapped runs of `lo..hi` in record `raw` (clipped to the range, in order).
    pub(super) fn map_runs(&self, inode: &Inode, raw: &[u8], lo: u64, hi: u64) -> Result<Vec<Ext>> {
        if raw_flags(raw) & EXTENTS_FL != 0 {
            let mut v = self.ext_collect(inode, raw, lo, hi)?;
            for e in &mut v {
                let a = e.lblk.max(lo);
                let b = (e.lblk + e.len).min(hi);
                *e = Ext { lblk: a, len: b - a, pblk: e.pblk + (a - e.lblk), unwritten: e.unwritten };
            }
            return Ok(v);
        }
        let mut out: Vec<Ext> = Vec::new();
        let top = self.max_file_size(false) / u64::from(self.sbi.block_size);
        for l in lo..hi.min(top) {
            if let Some(p) = self.ind_lookup(inode, raw, l)? {
                match out.last_mut() {
                    Some(e) if e.lblk + e.len == l && e.pblk + e.len == p => e.len += 1,
                    _ => out.push(Ext { lblk: l, len: 1, pblk: p, unwritten: false }),
                }
            }
        }
        Ok(out)
    }

    /// Writes zeros over the bytes `from..to` wherever they are stored (written blocks);
    /// holes and unwritten blocks already read as zeros.
    pub(super) fn zero_stored(&self, inode: &Inode, raw: &[u8], from: u64, to: u64) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        let bs = u64::from(self.sbi.block_size);
        let runs = self.map_runs(inode, raw, from / bs, to.div_ceil(bs))?;
        if raw_flags(raw) & ENCRYPT_FL != 0 {
            // Known since `regular_file` (crypto/mod.rs, invariant 4).
            let Some(crypt) = inode.crypt.load_full() else { return Err(Error::NoKey) };
            return self.zero_stored_encrypted(&crypt, &runs, from, to);
        }
        for e in runs {
            if e.unwritten {
                continue;
            }
            let a = from.max(e.lblk * bs);
            let b = to.min((e.lblk + e.len) * bs);
            let mut pos = a;
            while pos < b {
                let n = (b - pos).min(bs);
                let phys = e.pblk * bs + (pos - e.lblk * bs);
                self.dev.write_at(&ZEROS[..usize_from(n)], phys)?;
                self.pages_written(inode, pos, &ZEROS[..usize_from(n)]);
                pos += n;
            }
        }
        Ok(())
    }

    /// Gives the holes and unwritten blocks of `lo..hi` storage (written, or unwritten when
    /// `unwritten`), at most `OPS_PER_HANDLE` operations' worth. Returns the runs of the
    /// range it covered (existing written ones included) and how far it got; running out of
    /// space after some progress ends the range early instead (see `Filled::short`).
    /// `reserved`: the blocks were reserved by delayed writes (data/delalloc.rs), so the
    /// allocation need not leave room for reservations.
    #[allow(clippy::too_many_arguments)] // the map edit's inputs, each needed
    pub(crate) fn fill_map(
        &self,
        h: &Handle,
        inode: &Inode,
        raw: &mut [u8],
        lo: u64,
        hi: u64,
        unwritten: bool,
        reserved: bool,
    ) -> Result<Filled> {
        let extents = raw_flags(raw) & EXTENTS_FL != 0;
        let pool = if reserved { Pool::Reserved } else { Pool::Ordinary };
        let mut short = false;
        let sectors = u64::from(self.sbi.block_size / 512);
        let mapped = self.map_runs(inode, raw, lo, hi)?;
        let mut runs = Vec::new();
        let mut ops = 0usize;
        let mut cur = lo;
        let mut prev_end: Option<u64> = None;
        let mut it = mapped.into_iter().peekable();
        while cur < hi {
            if ops >= OPS_PER_HANDLE {
                break;
            }
            let next = it.peek().copied();
            match next {
                Some(e) if e.lblk <= cur => {
                    it.next();
                    if e.unwritten && !unwritten {
                        // Written now: convert (`ext4_ext_convert_to_initialized`). A split
                        // the tree has no block for ends the runs here (the map is as it was).
                        match self.ext_remap(h, inode, raw, e.lblk..e.lblk + e.len, Some((e.pblk, false))) {
                            Ok(_) => {}
                            Err(Error::NoSpace) if !runs.is_empty() => {
                                short = true;
                                break;
                            }
                            Err(err) => return Err(err),
                        }
                        ops += 1;
                        runs.push(Run { lblk: e.lblk, len: e.len, pblk: e.pblk, fresh: true });
                    } else {
                        runs.push(Run::mapped(&e));
                    }
                    prev_end = Some(e.pblk + e.len);
                    cur = e.lblk + e.len;
                }
                _ => {
                    let hole_end = next.map_or(hi, |e| e.lblk).min(hi);
                    let goal = match prev_end {
                        Some(p) => p,
                        None if extents => self.ext_goal(inode, raw, cur)?,
                        None => self.ind_goal(inode, raw, cur)?,
                    };
                    let step = if extents {
                        let want = u32::try_from(hole_end - cur).unwrap_or(u32::MAX);
                        // Nothing mapped past the hole: the file grows here, and a reserve
                        // keeps its next appends in the same run.
                        let appending = next.is_none();
                        // Delayed writes' blocks were checked against quotas when reserved.
                        let a = match self
                            .ext_alloc_data(h, inode, raw, cur, goal, want, appending, pool, !reserved)
                        {
                            Ok(a) => a,
                            Err(e) => {
                                if runs.is_empty() {
                                    return Err(e);
                                }
                                short = true;
                                break;
                            }
                        };
                        let (p, n) = (a.p, a.n);
                        if let Err(e) = self.ext_remap(h, inode, raw, cur..cur + n, Some((p, unwritten))) {
                            // The map is as it was (a split takes all its blocks or none):
                            // runs already mapped stay, for the caller to write or unmap.
                            self.quota_unclaim_blocks(inode, a.claimed);
                            if a.fresh.1 > 0 {
                                self.free_blocks(h, a.fresh.0, a.fresh.1, false)?;
                            }
                            if matches!(e, Error::NoSpace) && !runs.is_empty() {
                                short = true;
                                break;
                            }
                            return Err(e);
                        }
                        raw_add_blocks(raw, a.fresh.1 * sectors);
                        Run { lblk: cur, len: n, pblk: p, fresh: true }
                    } else {
                        let fit = if reserved { Ok(1) } else { self.quota_blocks_allowed(inode, raw, 1) };
                        let claimed = u64::from(!reserved && fit.is_ok());
                        let p = match fit.and_then(|_| self.ind_alloc(h, inode, raw, cur, goal, pool)) {
                            Ok(p) => p,
                            Err(e) => {
                                self.quota_unclaim_blocks(inode, claimed);
                                if runs.is_empty() {
                                    return Err(e);
                                }
                                short = true;
                                break;
                            }
                        };
                        Run { lblk: cur, len: 1, pblk: p, fresh: true }
                    };
                    // Block maps allocate block by block: count a handle's worth of them as
                    // one operation per 64.
                    ops += if extents || step.lblk % 64 == 63 { 1 } else { 0 };
                    prev_end = Some(step.pblk + step.len);
                    cur = step.lblk + step.len;
                    runs.push(step);
                }
            }
        }
        Ok(Filled { runs, reached: cur, short })
    }

    /// Unmaps and frees the blocks of `runs` that `fill_map` has just mapped in `h` (their
    /// data was not written). Unwritten extents it converted become holes: they read as zeros
    /// either way, only their preallocation is lost.
    fn unmap_fresh(&self, h: &Handle, inode: &Inode, raw: &mut [u8], runs: &[Run]) -> Result<()> {
        let sectors = u64::from(self.sbi.block_size / 512);
        for r in runs.iter().filter(|r| r.fresh) {
            if raw_flags(raw) & EXTENTS_FL != 0 {
                let old = self.ext_remap(h, inode, raw, r.lblk..r.lblk + r.len, None)?;
                let freed = self.free_file_data(h, inode, raw, &old)?;
                raw_sub_blocks(raw, freed * sectors);
            } else {
                self.ind_remove(h, inode, raw, r.lblk, r.lblk + r.len)?;
            }
        }
        inode.invalidate_pages();
        Ok(())
    }

    /// Goal for a new block of a block-mapped file: after the block before it.
    fn ind_goal(&self, inode: &Inode, raw: &[u8], lblk: u64) -> Result<u64> {
        if lblk > 0 {
            if let Some(p) = self.ind_lookup(inode, raw, lblk - 1)? {
                return Ok(p + 1);
            }
        }
        Ok(self.inode_goal(inode))
    }

    /// Writes `data` (the bytes of the file from `offset`) into the blocks of `runs`,
    /// zeroing the uncovered parts of freshly mapped blocks.
    pub(crate) fn write_runs(&self, inode: &Inode, runs: &[Run], offset: u64, data: &[u8]) -> Result<()> {
        self.write_runs_from(inode, runs, offset, Source::Bytes(data))
    }

    /// [`Self::write_runs`] with the bytes from `src`.
    fn write_runs_from(&self, inode: &Inode, runs: &[Run], offset: u64, src: Source<'_>) -> Result<()> {
        // An encrypted file's state is known since `regular_file` let the write in
        // (crypto/mod.rs, invariant 4); the caller may hold the record's lock.
        if let Some(crypt) = inode.crypt.load_full() {
            // Whole blocks of ciphertext; the page cache keeps no plaintext of these files.
            let Source::Bytes(data) = src else {
                return Err(Error::NotSupported("copying a host file into an encrypted one".into()));
            };
            return self.write_runs_encrypted(&crypt, runs, offset, data);
        }
        let bs = u64::from(self.sbi.block_size);
        let end = offset + src.len();
        for r in runs {
            let (rs, re) = (r.lblk * bs, (r.lblk + r.len) * bs);
            let a = rs.max(offset);
            let b = re.min(end);
            let phys = |pos: u64| r.pblk * bs + (pos - rs);
            if r.fresh {
                // The part of the first and last blocks outside the write reads as zeros.
                let head = a - (a / bs) * bs;
                if head > 0 {
                    self.dev.write_at(&ZEROS[..usize_from(head)], phys(a - head))?;
                }
                let tail = b.div_ceil(bs) * bs - b;
                if tail > 0 {
                    self.dev.write_at(&ZEROS[..usize_from(tail)], phys(b))?;
                }
            }
            if a < b {
                match src {
                    Source::Bytes(data) => {
                        let bytes = &data[usize_from(a - offset)..usize_from(b - offset)];
                        self.dev.write_at(bytes, phys(a))?;
                        self.pages_written(inode, a, bytes);
                    }
                    Source::File { file, offset: from, .. } => {
                        self.dev.write_from_file(file, from + (a - offset), phys(a), b - a)?;
                        // The caller holds data_sem exclusively: no read caches a page of
                        // the range while the device takes the new bytes.
                        inode.invalidate_pages();
                    }
                }
            }
        }
        Ok(())
    }

    /// Tells the page cache that the file's bytes from `pos` are now `bytes` on the device
    /// (write-through: cached pages take them, loads in flight are not cached). Whole blocks
    /// of writes shorter than `FILL_WRITE` become pages too; a stream of large writes would
    /// pay an allocation and a copy per block for pages it rarely reads again (seqio wrote at
    /// half its speed), and its readers read large pieces straight from the device anyway.
    pub(crate) fn pages_written(&self, inode: &Inode, pos: u64, bytes: &[u8]) {
        if !self.pcache.enabled() {
            return;
        }
        let bs = u64::from(self.sbi.block_size);
        let gen = inode.pages_gen.load(std::sync::atomic::Ordering::Acquire);
        // Past the last addressable block: nothing is cached there.
        let Ok(lblk) = u32::try_from(pos / bs) else { return };
        let fill = bytes.len() < FILL_WRITE;
        self.pcache.written(inode.ino.0, lblk, gen, usize_from(pos % bs), bytes, fill);
    }

    /// Overwrites `data` in place when every block it covers is mapped and written and the
    /// size does not change: no allocation, no map change, so it shares `data_sem` with
    /// readers and needs no journal handle unless the times move on a coarse tick (a writer
    /// must not queue behind commits or block readers). Returns `false` when the
    /// write needs the general path. The caller holds `op_lock`.
    fn overwrite(
        &self,
        journal: &std::sync::Arc<crate::jbd2::journal::Journal>,
        inode: &Inode,
        offset: u64,
        data: &[u8],
    ) -> Result<bool> {
        let bs = u64::from(self.sbi.block_size);
        let end = offset + data.len() as u64;
        {
            let _d = inode.data_sem.read();
            let runs = {
                let raw = inode.raw();
                if end > raw_size(&raw) || raw_flags(&raw) & INLINE_DATA_FL != 0 {
                    return Ok(false);
                }
                self.map_runs(inode, &raw, offset / bs, end.div_ceil(bs))?
            };
            let mut next = offset / bs;
            for e in &runs {
                if e.unwritten || e.lblk != next {
                    return Ok(false);
                }
                next = e.lblk + e.len;
            }
            if next < end.div_ceil(bs) {
                return Ok(false);
            }
            let runs: Vec<Run> = runs.iter().map(Run::mapped).collect();
            self.write_runs(inode, &runs, offset, data)?;
        }
        // mtime and ctime move when a coarse tick has passed since they were set, as the
        // kernel's coarse clock makes them; otherwise only fsync needs to know.
        // (Not when the caller keeps the times: `Fs::set_caller_write_times`.)
        if self.write_stamps_times() {
            let t = self.now();
            let d = inode.disk();
            let size = self.sbi.inode_size;
            let stale = |x: Timestamp| {
                let ns = |t: Timestamp| i128::from(t.sec) * 1_000_000_000 + i128::from(t.nsec);
                ns(t) - ns(x) >= COARSE_TICK_NS || ns(t) < ns(x)
            };
            if stale(d.mtime(size)) || stale(d.ctime(size)) {
                let h = journal.start(4)?;
                let mut raw = inode.raw_mut();
                raw_touch_cm(&mut raw, t);
                self.mark_inode_dirty(&h, inode, &mut raw)?;
                drop(raw);
                h.stop();
            }
        }
        inode.data_dirty.store(true, std::sync::atomic::Ordering::Release);
        Ok(true)
    }

    pub(crate) fn write(&self, ino: InodeNo, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_at(ino, Some(offset), data).map(|(_, n)| n)
    }

    /// Writes `data` at `offset`, or at the end of the file when `None` (`O_APPEND`: the end
    /// is read under the inode's lock, so appenders never overlap); returns where the write
    /// went and how many bytes it wrote.
    pub(crate) fn write_at(&self, ino: InodeNo, offset: Option<u64>, data: &[u8]) -> Result<(u64, usize)> {
        let journal = self.journal()?.clone();
        let inode = self.regular_file(ino)?;
        if data.is_empty() {
            return Ok((offset.unwrap_or_else(|| inode.size()), 0));
        }
        let _op = self.stats.lock(crate::fs::stats::LockClass::OpLock, &inode.op_lock);
        self.contents_key_held(&inode)?;
        let offset = offset.unwrap_or_else(|| inode.size());
        let len = self.may_write(&inode, offset, data.len() as u64)?;
        let data = &data[..usize_from(len)];
        // Small files stay in the record (data/inline_write.rs), as the kernel keeps them.
        if let Some(n) = self.write_inline(&journal, &inode, offset, data)? {
            return Ok((offset, n));
        }
        if inode.flags() & INLINE_DATA_FL != 0 {
            self.inline_to_blocks(&journal, &inode)?;
        }
        if self.overwrite(&journal, &inode, offset, data)? {
            return Ok((offset, data.len()));
        }
        if let Some(n) = self.write_delayed(&inode, offset, data)? {
            return Ok((offset, n));
        }
        // The general path maps holes: none of them may hold a dirty page.
        self.writeback_locked(&inode)?;
        let done = self.write_mapping(&journal, &inode, offset, Source::Bytes(data))?;
        // At most data.len().
        Ok((offset, usize_from(done)))
    }

    /// How many of `len` bytes at `offset` may be written to `inode` (the format's largest
    /// size cuts them short; `EFBIG` at or past it), or why none may.
    fn may_write(&self, inode: &Inode, offset: u64, len: u64) -> Result<u64> {
        let max = self.max_file_size(inode.flags() & EXTENTS_FL != 0);
        if offset >= max {
            return Err(Error::FileTooBig);
        }
        // What opening for writing checks (`may_open`): nothing is written to an immutable
        // file, and an append-only one only past its end (`O_APPEND`; a writer placing its
        // own appends, as the FUSE writeback cache does, may flush them out of order).
        let flags = inode.flags();
        if flags & IMMUTABLE_FL != 0 || (flags & APPEND_FL != 0 && offset < inode.size()) {
            return Err(Error::NotPermitted);
        }
        Ok(len.min(max - offset))
    }

    /// `copy_file_range(2)` from a host file into a regular file: writes the `len` bytes
    /// of `src` from `src_offset` at `offset`, the device copying them where it can
    /// ([`crate::dev::BlockDevice::write_from_file`]) instead of through memory; returns
    /// the bytes written, as [`Self::write_at`].
    pub(crate) fn write_from_file(
        &self,
        ino: InodeNo,
        offset: u64,
        src: &std::fs::File,
        src_offset: u64,
        len: u64,
    ) -> Result<u64> {
        let journal = self.journal()?.clone();
        let inode = self.regular_file(ino)?;
        if len == 0 {
            return Ok(0);
        }
        if inode.flags() & ENCRYPT_FL != 0 {
            // Encrypted on the way: through memory, a piece at a time.
            use std::os::unix::fs::FileExt;
            let mut buf = vec![0u8; usize_from(len.min(1 << 20))];
            let mut done = 0u64;
            while done < len {
                let n = usize_from((len - done).min(buf.len() as u64));
                src.read_exact_at(&mut buf[..n], src_offset + done)?;
                let (_, w) = self.write_at(ino, Some(offset + done), &buf[..n])?;
                done += w as u64;
                if w < n {
                    break;
                }
            }
            return Ok(done);
        }
        if len < FILL_WRITE as u64 || offset.saturating_add(len) <= self.sbi.inode_size as u64 {
            // Small: through memory and the ordinary write (which may keep it inline or
            // in the page cache).
            use std::os::unix::fs::FileExt;
            let mut buf = vec![0u8; usize_from(len)];
            src.read_exact_at(&mut buf, src_offset)?;
            return self.write_at(ino, Some(offset), &buf).map(|(_, n)| n as u64);
        }
        let _op = self.stats.lock(crate::fs::stats::LockClass::OpLock, &inode.op_lock);
        self.contents_key_held(&inode)?;
        let len = self.may_write(&inode, offset, len)?;
        if inode.flags() & INLINE_DATA_FL != 0 {
            self.inline_to_blocks(&journal, &inode)?;
        }
        // The general path maps holes: none of them may hold a dirty page.
        self.writeback_locked(&inode)?;
        self.write_mapping(&journal, &inode, offset, Source::File { file: src, offset: src_offset, len })
    }

    /// The write that maps blocks (`ext4_map_blocks` with `EXT4_GET_BLOCKS_CREATE`, then the
    /// data), a handle per `CHUNK_BLOCKS`; returns the bytes written, short only when space
    /// ran out part way. The caller holds the file's `op_lock`.
    fn write_mapping(
        &self,
        journal: &std::sync::Arc<crate::jbd2::journal::Journal>,
        inode: &std::sync::Arc<Inode>,
        offset: u64,
        src: Source<'_>,
    ) -> Result<u64> {
        let inode = &**inode;
        let bs = u64::from(self.sbi.block_size);
        let end = offset + src.len();
        let mut lblk = offset / bs;
        let last = end.div_ceil(bs);
        let mut retried = false;
        while lblk < last {
            let h = journal.start(DATA_CREDITS)?;
            let _d = self.stats.write(crate::fs::stats::LockClass::DataSem, &inode.data_sem);
            let mut raw = inode.raw_mut();
            let size = raw_size(&raw);
            if lblk == offset / bs && offset > size && !size.is_multiple_of(bs) {
                // The old last block's tail past the size must read as zeros now that the
                // size moves past it.
                self.zero_stored(inode, &raw, size, offset.min(size.div_ceil(bs) * bs))?;
            }
            let hi = last.min(lblk + CHUNK_BLOCKS);
            let Filled { runs, reached, short } =
                match self.fill_map(&h, inode, &mut raw, lblk, hi, false, false) {
                    Ok(x) => x,
                    Err(Error::NoSpace) if !retried && self.has_busy_blocks() => {
                        // Freed blocks wait for their commit: commit, then try once more.
                        drop(raw);
                        drop(h);
                        journal.sync()?;
                        retried = true;
                        continue;
                    }
                    // Out of space or quota after some progress: a short write.
                    Err(Error::NoSpace | Error::QuotaExceeded) if lblk * bs > offset => break,
                    Err(e) => return Err(e),
                };
            if let Err(e) = self.write_runs_from(inode, &runs, offset, src) {
                // The open handle maps blocks whose contents did not reach the device (a
                // source that failed, or the device): they go again before it stops, so its
                // commit never exposes them (data=ordered); if that fails too, the handle
                // must never commit at all.
                if let Err(undo) = self.unmap_fresh(&h, inode, &mut raw, &runs) {
                    journal
                        .abort(format!("data write to inode {} failed: {e}; {undo}", inode.ino.0), libc::EIO);
                }
                // The blocks quota admitted for them went back with them.
                self.quota_settle(inode);
                return Err(e);
            }
            let written_end = (reached * bs).min(end);
            if written_end > size {
                crate::inode::write::raw_set_size(&mut raw, written_end);
            }
            if self.write_stamps_times() {
                raw_touch_cm(&mut raw, self.now());
            }
            self.mark_inode_dirty(&h, inode, &mut raw)?;
            drop(raw);
            drop(_d);
            h.stop();
            if short && !retried && self.has_busy_blocks() {
                // Out of space part way, with freed blocks waiting for their commit.
                journal.sync()?;
                retried = true;
            }
            if reached == lblk {
                break;
            }
            lblk = reached;
        }
        let done = (lblk * bs).min(end).saturating_sub(offset);
        if done == 0 {
            return Err(Error::NoSpace);
        }
        Ok(done)
    }

    /// Unmaps and frees every block of `lo..hi`, over as many handles as it takes, from the
    /// end backwards (as `ext4_ext_remove_space`), so that an interrupted run leaves the file
    /// a prefix of itself. The first handle is `h` (already holding the caller's other
    /// changes); the record is marked dirty at the end of each.
    pub(super) fn free_range(&self, h: Handle, inode: &Inode, lo: u64, hi: u64) -> Result<()> {
        let journal = self.journal()?.clone();
        let sectors = u64::from(self.sbi.block_size / 512);
        let mut h = Some(h);
        let mut hi = hi;
        loop {
            let hd = match h.take() {
                Some(x) => x,
                None => journal.start(DATA_CREDITS)?,
            };
            let _d = self.stats.write(crate::fs::stats::LockClass::DataSem, &inode.data_sem);
            let mut raw = inode.raw_mut();
            let start = if raw_flags(&raw) & EXTENTS_FL != 0 {
                let start = match self.ext_tail_start(inode, &raw, lo, hi, FREES_PER_HANDLE)? {
                    Some(start) => {
                        let old = self.ext_remap(&hd, inode, &mut raw, start..hi, None)?;
                        let freed = self.free_file_data(&hd, inode, &raw, &old)?;
                        raw_sub_blocks(&mut raw, freed * sectors);
                        start
                    }
                    None => lo,
                };
                start.max(lo)
            } else {
                // From the end backwards in bounded steps, which keep each handle's bitmaps
                // and indirect blocks few. A range that reaches the end of the file frees
                // whatever is mapped past it too, as a truncate must.
                let end = raw_size(&raw).div_ceil(u64::from(self.sbi.block_size));
                let top = hi.min(end.max(lo));
                let start = top.saturating_sub(IND_FREE_STEP).max(lo);
                let to = if hi >= end { u64::MAX } else { top };
                self.ind_remove(&hd, inode, &mut raw, start, to)?;
                start
            };
            // Freed blocks read as zeros (or nothing) now; their pages go.
            inode.invalidate_pages();
            self.mark_inode_dirty(&hd, inode, &mut raw)?;
            drop(raw);
            hd.stop();
            if start <= lo {
                return Ok(());
            }
            hi = start;
        }
    }

    /// `truncate(2)`: sets the size of a regular file, freeing the blocks past it.
    pub(crate) fn truncate(&self, ino: InodeNo, new_size: u64) -> Result<()> {
        let _t = self.stats.time(crate::fs::stats::Op::Truncate);
        let journal = self.journal()?.clone();
        let inode = self.regular_file(ino)?;
        if new_size > self.max_file_size(inode.flags() & EXTENTS_FL != 0) {
            return Err(Error::FileTooBig);
        }
        let _op = self.stats.lock(crate::fs::stats::LockClass::OpLock, &inode.op_lock);
        self.contents_key_held(&inode)?;
        // The map changes: no dirty page may stay over it (the kernel's `auto_da_alloc` writes
        // back a file truncated to nothing, too).
        self.writeback_locked(&inode)?;
        if inode.flags() & INLINE_DATA_FL != 0 {
            if self.truncate_inline(&journal, &inode, new_size)? {
                return Ok(());
            }
            self.inline_to_blocks(&journal, &inode)?;
        }
        let bs = u64::from(self.sbi.block_size);
        let h = journal.start(DATA_CREDITS)?;
        let (shrinks, old_size) = {
            let _d = self.stats.write(crate::fs::stats::LockClass::DataSem, &inode.data_sem);
            let mut raw = inode.raw_mut();
            let old = raw_size(&raw);
            // Bytes past the new end of its last block read as zeros if the file grows again.
            if !new_size.is_multiple_of(bs) {
                self.zero_stored(&inode, &raw, new_size, new_size.div_ceil(bs) * bs)?;
            } else if new_size > old && !old.is_multiple_of(bs) {
                self.zero_stored(&inode, &raw, old, old.div_ceil(bs) * bs)?;
            }
            crate::inode::write::raw_set_size(&mut raw, new_size);
            raw_touch_cm(&mut raw, self.now());
            inode.invalidate_pages();
            self.mark_inode_dirty(&h, &inode, &mut raw)?;
            (new_size < old, old)
        };
        // Freeing may take several transactions: an orphan record with the new size makes
        // recovery finish a truncate a crash interrupts (inode/orphan.rs).
        if shrinks {
            self.orphan_add(&h, &inode)?;
        }
        // Shrinking (or keeping) the size frees everything from the first block past it,
        // blocks fallocated past the old size included; growing frees nothing (`ext4_setattr`).
        if shrinks || new_size == old_size {
            self.free_range(h, &inode, new_size.div_ceil(bs), LBLK_END)?;
        } else {
            h.stop();
        }
        if shrinks {
            let h = journal.start(4)?;
            self.orphan_del(&h, &inode)?;
        }
        Ok(())
    }

    /// `SEEK_DATA` (`data`) or `SEEK_HOLE`: unwritten extents count as holes, as in the
    /// kernel when no page holds their data.
    pub(crate) fn seek(&self, ino: InodeNo, offset: u64, data: bool) -> Result<u64> {
        let inode = self.iget_by_number(ino)?;
        if inode.disk().file_type() != fi::S_IFREG {
            return Err(Error::InvalidInput("not a regular file"));
        }
        // Dirty pages are data the map does not show yet.
        self.writeback_inode(&inode)?;
        let _d = inode.data_sem.read();
        let raw = inode.raw();
        let size = raw_size(&raw);
        if offset >= size {
            return Err(Error::NoSuchOffset);
        }
        if raw_flags(&raw) & INLINE_DATA_FL != 0 {
            return Ok(if data { offset } else { size });
        }
        let bs = u64::from(self.sbi.block_size);
        let runs: Vec<Ext> = self
            .map_runs(&inode, &raw, offset / bs, size.div_ceil(bs))?
            .into_iter()
            .filter(|e| !e.unwritten)
            .collect();
        if data {
            let first = runs.first().map(|e| (e.lblk * bs).max(offset));
            return first.filter(|&p| p < size).ok_or(Error::NoSuchOffset);
        }
        let mut pos = offset;
        for e in &runs {
            if e.lblk * bs > pos {
                break;
            }
            pos = pos.max((e.lblk + e.len) * bs);
        }
        Ok(pos.min(size))
    }
}

impl Fs {
    /// `pwrite(2)` on a regular file: writes `data` at `offset`, allocating blocks as needed,
    /// and returns the number of bytes written (short only when the disk fills up part way).
    /// Errors: `EFBIG` at or past the format's largest size, `ENOSPC`, `EISDIR`.
    pub fn write(&self, ino: InodeNo, offset: u64, data: &[u8]) -> Result<usize> {
        self.inner.op(crate::fs::stats::Op::Write, || self.inner.write(ino, offset, data))
    }

    /// `copy_file_range(2)` from a host file: writes the `len` bytes of `src` from
    /// `src_offset` at `offset` of regular file `ino`, as [`Fs::write`] would write them,
    /// and returns how many it wrote (short only when the disk fills up part way). An image
    /// file takes them straight from the kernel's copy of `src` (no pass through this
    /// process's memory). Errors: those of `write`, and `EIO` with `UnexpectedEof` when
    /// `src` holds fewer bytes.
    pub fn write_from_file(
        &self,
        ino: InodeNo,
        offset: u64,
        src: &std::fs::File,
        src_offset: u64,
        len: u64,
    ) -> Result<u64> {
        self.inner
            .op(crate::fs::stats::Op::Write, || self.inner.write_from_file(ino, offset, src, src_offset, len))
    }

    /// `lseek(2)` with `SEEK_DATA`: the first offset at or after `offset` holding data
    /// (`ENXIO` if none before the end).
    pub fn seek_data(&self, ino: InodeNo, offset: u64) -> Result<u64> {
        self.inner.op(crate::fs::stats::Op::Llseek, || self.inner.seek(ino, offset, true))
    }

    /// `lseek(2)` with `SEEK_HOLE`: the first offset at or after `offset` in a hole (the end
    /// of the file counts as one); `ENXIO` at or past the end.
    pub fn seek_hole(&self, ino: InodeNo, offset: u64) -> Result<u64> {
        self.inner.op(crate::fs::stats::Op::Llseek, || self.inner.seek(ino, offset, false))
    }
}
