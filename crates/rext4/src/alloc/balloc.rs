//! Block allocation (the kernel's `balloc.c` and, in spirit, `mballoc.c`): per-group bitmaps
//! behind per-group locks, a goal block, contiguous runs preferred, groups never initialised
//! (BLOCK_UNINIT) set up on first use, free counts in per-group atomics and sharded counters.
//!
//! # Locking
//! journal handle -> block bitmap `Buffer::data` (write; this is the group's allocation lock)
//! -> group state atomics. The search for a free run is done first under the bitmap's read
//! lock; the bits are then taken under its write lock, searching again there if another thread
//! won them (the inode allocator's shape, applied to blocks; docs/design.md, Allocation).

use crate::alloc::bitmap;
use crate::alloc::reserved::Pool;
use crate::cache::buffer::Buffer;
use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::FsInner;
use crate::jbd2::transaction::Handle;
use crate::num::usize_from;
use rext4_format::group_desc::{BG_BLOCK_UNINIT, BG_INODE_UNINIT};
use rext4_format::PhysBlock;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One past the blocks extents, extent index nodes and `i_file_acl` can name (48 bits).
const ADDRESSABLE_END: u64 = 1 << 48;

/// One past the blocks a block map (ext2/ext3 32-bit pointers) can name.
pub(crate) const BLOCK_MAP_END: u64 = 1 << 32;

impl FsInner {
    /// Group of block `blk`, which must lie in the filesystem.
    pub(super) fn block_group(&self, blk: u64) -> u32 {
        self.sbi.block_group_offset(blk).0
    }

    /// Builds the block bitmap of a BLOCK_UNINIT group (`ext4_init_block_bitmap`); returns it
    /// and the number of free clusters it leaves (a bit is a cluster: a block without bigalloc).
    pub(super) fn init_block_bitmap(&self, g: u32) -> (Vec<u8>, u32) {
        let sbi = &self.sbi;
        let bs = sbi.block_size as usize;
        let bits = sbi.cluster_bits;
        let mut map = vec![0u8; bs];
        let first = sbi.group_first_block(g);
        let blocks = sbi.blocks_in_group(g);
        let n32 = sbi.clusters_in_group(g);
        let n = n32 as usize;
        let meta = u32::try_from(self.sbi.base_meta_blocks(g)).map_or(blocks, |m| m.min(blocks));
        bitmap::set_range(&mut map, 0, meta.div_ceil(1 << bits) as usize);
        let d = self.groups.get(g);
        let ds = sbi.desc_size;
        let mut own = |b: u64, len: u64| {
            for x in b..b + len {
                if let Some(i) = x.checked_sub(first).filter(|&i| i < u64::from(blocks)) {
                    bitmap::set(&mut map, usize_from(i >> bits));
                }
            }
        };
        own(d.block_bitmap(ds), 1);
        own(d.inode_bitmap(ds), 1);
        own(d.inode_table(ds), sbi.inode_table_blocks);
        bitmap::set_range(&mut map, n, bs * 8);
        let free = (0..n32).map(|i| u32::from(!bitmap::test(&map, i as usize))).sum();
        (map, free)
    }

    /// The block bitmap buffer of group `g`, initialised under `h` if the group was never used.
    pub(crate) fn block_bitmap(&self, h: &Handle, g: u32) -> Result<Arc<Buffer>> {
        let st = &self.groups.state[g as usize];
        let blk = self.groups.get(g).block_bitmap(self.sbi.desc_size);
        if st.flags.load(Ordering::Acquire) & u32::from(BG_BLOCK_UNINIT) == 0 {
            return self.bread(blk, None);
        }
        let buf = self.bcache.get_fresh(blk);
        let mut data = h.write(&buf)?;
        // Re-check under the bitmap lock: another thread may have initialised it meanwhile.
        if st.flags.load(Ordering::Acquire) & u32::from(BG_BLOCK_UNINIT) != 0 {
            let (map, free) = self.init_block_bitmap(g);
            data.copy_from_slice(&map);
            let old = st.free_blocks.swap(free, Ordering::AcqRel);
            self.counters.free_blocks.add(i64::from(free) - i64::from(old));
            st.flags.fetch_and(!u32::from(BG_BLOCK_UNINIT), Ordering::AcqRel);
            self.touch_group_desc(h, g)?;
        }
        drop(data);
        Ok(buf)
    }

    /// Puts group `g`'s descriptor block (and the superblock, for the counts) into `h`'s
    /// transaction; their contents are filled in when the commit freezes them.
    /// Both buffers are held for the filesystem's life, so this clones no `Arc`: with a cache
    /// lookup each, every create and unlink wrote the two reference counts all threads share.
    pub(crate) fn touch_group_desc(&self, h: &Handle, g: u32) -> Result<()> {
        let gd = self.groups.desc_buf(&self.sbi, g).ok_or(Error::InvalidInput("no such group"))?;
        h.join(gd)?;
        h.join(&self.sb_buf)
    }

    /// Allocates up to `want` contiguous blocks near `goal` (at least one); returns the first
    /// block and the count. `pool` says which held-back blocks the allocation may take
    /// ([`Pool`]). The blocks lie below 2^48, where extents and `i_file_acl` can name them.
    /// Each block may serve as a metadata block of its own: with bigalloc, where such a
    /// block takes a cluster, this is one block (the first of a cluster) at a time. File
    /// data takes clusters through [`FsInner::alloc_clusters`].
    pub(crate) fn alloc_blocks(&self, h: &Handle, goal: u64, want: u32, pool: Pool) -> Result<(u64, u32)> {
        let want = if self.sbi.cluster_bits > 0 { 1 } else { want };
        self.alloc_blocks_below(h, goal, want, pool, ADDRESSABLE_END)
    }

    /// Allocates up to `want` contiguous clusters near block `goal` (at least one); returns
    /// the first block (the start of a cluster) and the number of clusters. Without bigalloc
    /// a cluster is a block.
    pub(crate) fn alloc_clusters(&self, h: &Handle, goal: u64, want: u32, pool: Pool) -> Result<(u64, u32)> {
        self.alloc_blocks_below(h, goal, want, pool, ADDRESSABLE_END)
    }

    /// The clusters an allocation from `pool` must leave free.
    fn held_back(&self, pool: Pool) -> u64 {
        // Clusters reserved for dirty pages (data/delalloc.rs) are not anyone else's: the
        // kernel's `ext4_has_free_clusters` always keeps the dirty clusters, or writeback
        // would run out of space. Writeback's own allocations come out of them.
        let dirty = self.wb.dirty_blocks.load(Ordering::Acquire);
        let bits = self.sbi.cluster_bits;
        match pool {
            Pool::Reserved => 0,
            Pool::NoFail if crate::alloc::reserved::in_writeback() => 0,
            Pool::NoFail => dirty,
            Pool::Ordinary => (self.root_reserve() >> bits) + (self.meta_slack() >> bits) + dirty,
        }
    }

    /// Allocates up to `want` bitmap bits (clusters; blocks without bigalloc) in a row near
    /// block `goal`, in the groups that lie wholly below block `end`; returns the first block
    /// and the count of bits.
    pub(crate) fn alloc_blocks_below(
        &self,
        h: &Handle,
        goal: u64,
        want: u32,
        pool: Pool,
        end: u64,
    ) -> Result<(u64, u32)> {
        let _t = self.stats.time(crate::fs::stats::Op::NewBlocks);
        let sbi = &self.sbi;
        let want = want.max(1);
        let free = self.counters.free_blocks.sum_positive();
        let reserve = self.held_back(pool);
        if free <= reserve {
            return Err(Error::NoSpace);
        }
        let want = want.min(u32::try_from(free - reserve).unwrap_or(u32::MAX)).min(sbi.clusters_per_group);
        let n = sbi.groups_below(end);
        if n == 0 {
            return Err(Error::NoSpace);
        }
        let goal = if goal >= sbi.first_data_block && goal < sbi.blocks_count && self.block_group(goal) < n {
            goal
        } else {
            sbi.first_data_block
        };
        let goal_group = self.block_group(goal);
        match self.search_groups(h, goal, goal_group, want, n) {
            // The only free blocks left may be set aside for files' appends: give those back.
            Err(Error::NoSpace) if self.discard_all_preallocs() => {
                self.search_groups(h, goal, goal_group, want, n)
            }
            r => r,
        }
    }

    fn search_groups(&self, h: &Handle, goal: u64, goal_group: u32, want: u32, n: u32) -> Result<(u64, u32)> {
        let sbi = &self.sbi;
        // First pass: a group with room for the whole run; second: any free block.
        for full in [true, false] {
            for k in 0..n {
                let g = (goal_group + k) % n;
                let st = &self.groups.state[g as usize];
                let avail = st.free_blocks.load(Ordering::Acquire);
                if avail == 0 || (full && avail < want) {
                    continue;
                }
                let start = if g == goal_group {
                    (sbi.block_group_offset(goal).1 >> sbi.cluster_bits) as usize
                } else {
                    0
                };
                if let Some((off, len)) = self.take_run(h, g, start, want, full)? {
                    return Ok((sbi.group_first_block(g) + sbi.c2b(off as u64), len));
                }
            }
        }
        Err(Error::NoSpace)
    }

    /// Takes a run of free bits (clusters) in group `g` from bit `start` on (wrapping to the
    /// group start); `full` asks for exactly `want`. Clusters freed by uncommitted
    /// transactions are skipped as if in use. Returns the run's bit offset and its length.
    fn take_run(
        &self,
        h: &Handle,
        g: u32,
        start: usize,
        want32: u32,
        full: bool,
    ) -> Result<Option<(usize, u32)>> {
        let n = self.sbi.clusters_in_group(g) as usize;
        let want = want32 as usize;
        let buf = self.block_bitmap(h, g)?;
        let search = |map: &[u8], avoid: &Avoid<'_>| {
            let run = |from| bitmap::find_free_run(map, from, n, want, |i| avoid.next_after(i));
            run(start.min(n))
                .filter(|&(_, l)| l == want || !full)
                .or_else(|| run(0).filter(|&(_, l)| l == want || !full))
        };
        // Look without the group lock first.
        let found = {
            let map = buf.data();
            let pa = self.prealloc_ranges(g);
            let busy = self.busy_list(g);
            search(&map, &Avoid { busy: &busy, pa: &pa })
        };
        let Some(mut found) = found else { return Ok(None) };
        let mut map = h.write(&buf)?;
        // Under the lock: take what we found if it is still free; if another thread won it,
        // search once more with the lock held. Frees push their busy ranges under this lock,
        // so the list read here is complete.
        {
            let pa = self.prealloc_ranges(g);
            let busy = self.busy_list(g);
            let avoid = Avoid { busy: &busy, pa: &pa };
            let (off, len) = found;
            let taken = (off..off + len).any(|i| bitmap::test(&map, i))
                || avoid.next_after(off).is_some_and(|(b, _)| b < off + len);
            if taken {
                match search(&map, &avoid) {
                    Some(f) => found = f,
                    None => return Ok(None),
                }
            }
        }
        let (off, len) = found;
        // Cannot truncate: a run found is at most `want` long.
        #[allow(clippy::cast_possible_truncation)]
        let len32 = len as u32;
        let first = self.sbi.group_first_block(g);
        let c2b = |i: usize| self.sbi.c2b(i as u64);
        if !self.zones.clear_of(None, first + c2b(off), c2b(len)) {
            // The bitmap calls metadata free (the kernel's "Allocating blocks which overlap fs
            // metadata"): mark those blocks in use, as they are, and fail this allocation with
            // the damage, to be recorded; the next one searches the corrected bitmap. The free
            // counts stay as they are, as the kernel leaves them: only the bitmap was wrong.
            let meta: Vec<usize> =
                (off..off + len).filter(|&i| !self.zones.clear_of(None, first + c2b(i), c2b(1))).collect();
            for &i in &meta {
                bitmap::set(&mut map, i);
            }
            drop(map);
            // Cannot be empty: the run overlaps a zone, so one of its clusters is in it.
            let block = PhysBlock(first + c2b(meta[0]));
            return corrupt(CorruptKind::SystemZone { ino: None, block, len: c2b(meta.len()) });
        }
        bitmap::set_range(&mut map, off, off + len);
        let st = &self.groups.state[g as usize];
        st.free_blocks.fetch_sub(len32, Ordering::AcqRel);
        drop(map);
        self.counters.free_blocks.add(-i64::from(len32));
        self.touch_group_desc(h, g)?;
        Ok(Some((off, len32)))
    }

    /// Group `g`'s busy ranges whose freeing transaction has not committed (committed ones
    /// are dropped on the way), locked: a leaf, taken after the group's bitmap lock.
    pub(super) fn busy_list(&self, g: u32) -> crate::sync::MutexGuard<'_, super::group::BusyList> {
        let mut busy = self.groups.state[g as usize].busy.lock();
        if !busy.is_empty() {
            if let Some(j) = &self.journal {
                busy.release(self.groups.discard.release_limit(j.committed_tid()));
            }
        }
        busy
    }

    /// The blocks of group `g` set aside for files' appends, as (offset, length) by offset.
    pub(super) fn prealloc_ranges(&self, g: u32) -> Vec<(u32, u32)> {
        // No reserve anywhere (the common case): no list to lock.
        if self.pa_blocks.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut v = self.groups.state[g as usize].prealloc.lock().clone();
        v.sort_unstable();
        v
    }

    /// Sets aside `len` blocks from `start`, taken in this handle by an allocation, for a
    /// file's next appends: they go back to free in the bitmap and the counts, and on the
    /// group's list of reserved ranges. Returns the reserve's epoch.
    pub(crate) fn reserve(&self, h: &Handle, start: u64, len: u32) -> Result<u64> {
        // Reserves are made without bigalloc only (alloc/prealloc.rs): offsets are bits.
        debug_assert_eq!(self.sbi.cluster_bits, 0);
        let (g, off) = self.sbi.block_group_offset(start);
        let buf = self.block_bitmap(h, g)?;
        let mut map = h.write(&buf)?;
        let st = &self.groups.state[g as usize];
        let epoch = {
            // On the list before the bits clear, under the bitmap lock: no allocation sees
            // them free in between.
            let mut pa = st.prealloc.lock();
            pa.push((off, len));
            self.pa_blocks.fetch_add(u64::from(len), Ordering::AcqRel);
            self.pa_epoch.load(Ordering::Acquire)
        };
        bitmap::clear_range(&mut map, off as usize, (off + len) as usize);
        st.free_blocks.fetch_add(len, Ordering::AcqRel);
        drop(map);
        self.counters.free_blocks.add(i64::from(len));
        self.touch_group_desc(h, g)?;
        Ok(epoch)
    }

    /// Takes the first `n` blocks of the reserve starting at `start` for its file. False when
    /// the reserve is gone (all were given back) or its blocks are not free: the caller
    /// allocates anew.
    pub(crate) fn take_reserved(&self, h: &Handle, start: u64, n: u32) -> Result<bool> {
        debug_assert_eq!(self.sbi.cluster_bits, 0);
        let (g, off) = self.sbi.block_group_offset(start);
        let buf = self.block_bitmap(h, g)?;
        let mut map = h.write(&buf)?;
        let st = &self.groups.state[g as usize];
        {
            let mut pa = st.prealloc.lock();
            let Some(i) = pa.iter().position(|&(o, l)| o == off && l >= n) else { return Ok(false) };
            let range = off as usize..(off + n) as usize;
            if range.clone().any(|b| bitmap::test(&map, b)) || !self.zones.clear_of(None, start, u64::from(n))
            {
                return Ok(false);
            }
            if pa[i].1 == n {
                pa.swap_remove(i);
            } else {
                pa[i] = (off + n, pa[i].1 - n);
            }
            self.pa_blocks.fetch_sub(u64::from(n), Ordering::AcqRel);
        }
        bitmap::set_range(&mut map, off as usize, (off + n) as usize);
        st.free_blocks.fetch_sub(n, Ordering::AcqRel);
        drop(map);
        self.counters.free_blocks.add(-i64::from(n));
        self.touch_group_desc(h, g)?;
        Ok(true)
    }

    /// Whether any freed block waits for its transaction to commit before it can be reused
    /// (an allocation that failed may succeed after a commit).
    pub(crate) fn has_busy_blocks(&self) -> bool {
        (0..self.sbi.group_count).any(|g| !self.busy_list(g).is_empty())
    }

    /// The clusters (bitmap bits) that blocks `start..end` touch, in each group they cross:
    /// (group, the group's first block, first bit, one past the last bit). A cluster is a
    /// block without bigalloc.
    fn group_spans(&self, start: u64, end: u64) -> impl Iterator<Item = (u32, u64, usize, usize)> + '_ {
        let sbi = &self.sbi;
        let bits = sbi.cluster_bits;
        let mut b = start;
        std::iter::from_fn(move || {
            if b >= end {
                return None;
            }
            let g = self.block_group(b);
            let gfirst = sbi.group_first_block(g);
            let gend = (gfirst + u64::from(sbi.blocks_in_group(g))).min(end);
            let piece =
                (g, gfirst, usize_from((b - gfirst) >> bits), usize_from((gend - 1 - gfirst) >> bits) + 1);
            b = gend;
            Some(piece)
        })
    }

    /// `start..start + len` widened to the clusters it touches (itself without bigalloc).
    pub(crate) fn cluster_span(&self, start: u64, len: u64) -> (u64, u64) {
        let mask = self.sbi.cluster_mask();
        let first = start & !mask;
        let end = start.saturating_add(len).saturating_add(mask) & !mask;
        (first, end - first)
    }

    /// Frees `len` blocks from `start`: with bigalloc, the whole clusters they touch (the
    /// caller knows no other block of them is in use; data goes through
    /// `FsInner::free_file_data`). Freed metadata blocks are revoked, so that no older
    /// journal copy is replayed over whatever they hold next.
    pub(crate) fn free_blocks(&self, h: &Handle, start: u64, len: u64, metadata: bool) -> Result<()> {
        let _t = self.stats.time(crate::fs::stats::Op::FreeBlocks);
        let (cstart, clen) = self.cluster_span(start, len);
        self.check_block_range(cstart, clen)?;
        for (g, _, lo, hi) in self.group_spans(cstart, cstart + clen) {
            let buf = self.block_bitmap(h, g)?;
            let mut map = h.write(&buf)?;
            let mut freed = 0u32;
            for i in lo..hi {
                if !bitmap::test(&map, i) {
                    return corrupt(CorruptKind::GroupDesc { group: g, what: "freeing a free block" });
                }
                bitmap::clear(&mut map, i);
                freed += 1;
            }
            // Below the group's bit count, a u32.
            #[allow(clippy::cast_possible_truncation)]
            self.groups.state[g as usize].busy.lock().push(lo as u32, freed, h.tid());
            self.groups.state[g as usize].trimmed.store(0, Ordering::Release);
            self.groups.discard.freed(h.tid());
            drop(map);
            self.groups.state[g as usize].free_blocks.fetch_add(freed, Ordering::AcqRel);
            self.counters.free_blocks.add(i64::from(freed));
            self.touch_group_desc(h, g)?;
        }
        if metadata {
            for x in start..start + len {
                h.revoke(x, self.bcache.peek(x).as_ref());
            }
        }
        Ok(())
    }

    /// Marks the free clusters among those `len` blocks from `start` touch in use (a replay
    /// that names blocks already chosen: the kernel's `ext4_mb_mark_bb`). Returns the runs it
    /// changed, as `(start, len)` in blocks.
    pub(crate) fn claim_blocks(&self, h: &Handle, start: u64, len: u64) -> Result<Vec<(u64, u64)>> {
        let (cstart, clen) = self.cluster_span(start, len);
        self.check_block_range(cstart, clen)?;
        let unit = self.sbi.c2b(1);
        let mut taken = Vec::new();
        for (g, gfirst, lo, hi) in self.group_spans(cstart, cstart + clen) {
            let buf = self.block_bitmap(h, g)?;
            let mut map = h.write(&buf)?;
            let mut n = 0u32;
            for i in lo..hi {
                if !bitmap::test(&map, i) {
                    bitmap::set(&mut map, i);
                    n += 1;
                    let x = gfirst + self.sbi.c2b(i as u64);
                    match taken.last_mut() {
                        Some((s, l)) if *s + *l == x => *l += unit,
                        _ => taken.push((x, unit)),
                    }
                }
            }
            drop(map);
            if n != 0 {
                self.groups.state[g as usize].free_blocks.fetch_sub(n, Ordering::AcqRel);
                self.counters.free_blocks.add(-i64::from(n));
                self.touch_group_desc(h, g)?;
            }
        }
        Ok(taken)
    }

    /// Frees the clusters in use among those `len` blocks from `start` touch (the other half
    /// of [`FsInner::claim_blocks`]), as [`FsInner::free_blocks`] frees them.
    pub(crate) fn release_blocks(&self, h: &Handle, start: u64, len: u64) -> Result<()> {
        let (cstart, clen) = self.cluster_span(start, len);
        self.check_block_range(cstart, clen)?;
        for (g, gfirst, lo, hi) in self.group_spans(cstart, cstart + clen) {
            let used: Vec<usize> = {
                let buf = self.block_bitmap(h, g)?;
                let map = buf.data();
                (lo..hi).filter(|&i| bitmap::test(&map, i)).collect()
            };
            let mut i = 0;
            while i < used.len() {
                let mut j = i + 1;
                while j < used.len() && used[j] == used[j - 1] + 1 {
                    j += 1;
                }
                let first = gfirst + self.sbi.c2b(used[i] as u64);
                self.free_blocks(h, first, self.sbi.c2b((j - i) as u64), true)?;
                i = j;
            }
        }
        Ok(())
    }

    /// `len` blocks from `start` lie in the filesystem's data area, inside the filesystem
    /// and outside its metadata: whoever named them, no metadata block is ever freed.
    fn check_block_range(&self, start: u64, len: u64) -> Result<()> {
        let sbi = &self.sbi;
        if start < sbi.first_data_block || start.checked_add(len).is_none_or(|e| e > sbi.blocks_count) {
            return corrupt(CorruptKind::BlockRange { ino: None, block: PhysBlock(start) });
        }
        if !self.zones.clear_of(None, start, len) {
            return corrupt(CorruptKind::SystemZone { ino: None, block: PhysBlock(start), len });
        }
        Ok(())
    }

    /// What [`FsInner::free_blocks`] would find wrong in freeing `len` blocks from `start`
    /// (outside the filesystem, an unreadable bitmap, a block already free), found without
    /// changing anything: a deletion checks all its blocks first, so that damage does not stop
    /// it half way with some of them freed and still named by the inode.
    pub(crate) fn check_blocks_in_use(&self, h: &Handle, start: u64, len: u64) -> Result<()> {
        let (cstart, clen) = self.cluster_span(start, len);
        self.check_block_range(cstart, clen)?;
        for (g, _, lo, hi) in self.group_spans(cstart, cstart + clen) {
            let buf = self.block_bitmap(h, g)?;
            let map = buf.data();
            if (lo..hi).any(|i| !bitmap::test(&map, i)) {
                return corrupt(CorruptKind::GroupDesc { group: g, what: "freeing a free block" });
            }
        }
        Ok(())
    }

    /// Whether group `g`'s inode table and bitmap were never initialised.
    pub(crate) fn inode_uninit(&self, g: u32) -> bool {
        self.groups.state[g as usize].flags.load(Ordering::Acquire) & u32::from(BG_INODE_UNINIT) != 0
    }
}

/// What an allocation in a group must skip besides the blocks in use: its busy ranges and
/// the blocks set aside for files' appends (both sorted by offset, disjoint from each other).
pub(super) struct Avoid<'a> {
    pub(super) busy: &'a super::group::BusyList,
    pub(super) pa: &'a [(u32, u32)],
}

impl Avoid<'_> {
    /// The first skipped range that ends after bit `i`, as `start..end`.
    pub(super) fn next_after(&self, i: usize) -> Option<(usize, usize)> {
        let k = self.pa.partition_point(|&(o, l)| (o as usize + l as usize) <= i);
        let pa = self.pa.get(k).map(|&(o, l)| (o as usize, o as usize + l as usize));
        match (self.busy.next_after(i), pa) {
            (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
            (a, b) => a.or(b),
        }
    }
}
