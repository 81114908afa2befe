//! Inode allocation (the kernel's `ialloc.c`; docs/design.md, Allocation): find a free bit
//! in the group's inode bitmap without the group lock, test-and-set it under the lock, and if
//! another thread took it, search again *with the lock held* and take the next free bit (one
//! retry, never a loop of races). Placement: Orlov for directories (spread top-level ones,
//! keep the rest near their parent), files in their directory's group.
//!
//! # Locking
//! journal handle -> inode bitmap `Buffer::data` (write; the group's inode allocation lock)
//! -> group state atomics. The new inode's record is written after the bitmap lock is dropped.

use crate::alloc::bitmap;
use crate::cache::buffer::Buffer;
use crate::error::{Error, Result};
use crate::fs::FsInner;
use crate::inode::write::{raw_init_times, raw_set_flags, rec, rec_ref};
use crate::inode::{Inode, RawRecord};
use crate::jbd2::transaction::Handle;
use crate::sync::RwLockWriteGuard;
use rext4_format::checksum::inode_csum_seed;
use rext4_format::features::{Incompat, RoCompat};
use rext4_format::group_desc::BG_INODE_UNINIT;
use rext4_format::inode::{self as fi, EXTENTS_FL};
use rext4_format::InodeNo;
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

thread_local! {
    /// This thread's last inode generation number (0 until its first). Each thread steps a
    /// sequence of its own, so threads creating files do not all write one shared counter;
    /// the kernel draws generations at random, per CPU.
    static GENERATION: Cell<u32> = const { Cell::new(0) };
}

/// The next generation number of this thread's sequence: a Weyl sequence (every value once in
/// 2^32 steps) from a start that differs by thread and by process.
fn next_generation() -> u32 {
    GENERATION.with(|g| {
        let last = g.get();
        let last = if last == 0 { sequence_start() } else { last };
        let next = last.wrapping_add(0x9E37_79B9);
        // 0 marks an unseeded thread: skip it (one value in 2^32).
        let next = if next == 0 { 0x9E37_79B9 } else { next };
        g.set(next);
        next
    })
}

/// Where a thread's sequence starts: the clock's nanoseconds, spread by the thread's order.
fn sequence_start() -> u32 {
    static THREADS: AtomicU32 = AtomicU32::new(0);
    if crate::clock::fixed_time().is_some() {
        // Reproducible: the same sequence on every run (one per thread, in start order).
        return THREADS.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x85EB_CA6B) | 1;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(1);
    let order = THREADS.fetch_add(1, Ordering::Relaxed);
    (nanos ^ order.wrapping_mul(0x85EB_CA6B)) | 1
}

impl FsInner {
    /// Chooses a group for a new inode (`find_group_orlov` / `find_group_other`).
    fn find_group(&self, parent: InodeNo, is_dir: bool) -> Option<u32> {
        let sbi = &self.sbi;
        let n = sbi.group_count;
        let pg = (parent.0 - 1) / sbi.inodes_per_group;
        let free_inodes = |g: u32| self.groups.state[g as usize].free_inodes.load(Ordering::Relaxed);
        let free_blocks = |g: u32| self.groups.state[g as usize].free_blocks.load(Ordering::Relaxed);
        let dirs = |g: u32| self.groups.state[g as usize].used_dirs.load(Ordering::Relaxed);
        if is_dir {
            // The sharded counters already hold these sums; no walk over every group.
            let c = &self.counters;
            let (fb, fi, nd) =
                (c.free_blocks.sum_positive(), c.free_inodes.sum_positive(), c.dirs.sum_positive());
            // Averages of per-group u32 counts fit a u32 unless the counters drifted; they
            // only steer placement, so saturate.
            let avg = |sum: u64| u32::try_from(sum / u64::from(n)).unwrap_or(u32::MAX);
            let (avg_inodes, avg_blocks, avg_dirs) = (avg(fi), avg(fb), avg(nd));
            if parent == rext4_format::types::ROOT_INO {
                // Top-level directories spread out: the group with the fewest directories among
                // those with at least average free inodes and blocks, starting somewhere
                // different for each parent generation of calls.
                let start = next_generation() % n;
                let mut best: Option<(u32, u32)> = None;
                for k in 0..n {
                    let g = (start + k) % n;
                    if free_inodes(g) >= avg_inodes.max(1)
                        && free_blocks(g) >= avg_blocks
                        && best.is_none_or(|(_, d)| dirs(g) < d)
                    {
                        best = Some((g, dirs(g)));
                    }
                }
                if let Some((g, _)) = best {
                    return Some(g);
                }
            } else {
                // Near the parent: the first group with enough room that is not crowded.
                let min_inodes = avg_inodes.saturating_sub(sbi.inodes_per_group / 4).max(1);
                let max_dirs = avg_dirs + sbi.inodes_per_group / 16 + 1;
                for k in 0..n {
                    let g = (pg + k) % n;
                    if free_inodes(g) >= min_inodes && free_blocks(g) >= avg_blocks / 4 && dirs(g) < max_dirs
                    {
                        return Some(g);
                    }
                }
            }
        } else if free_inodes(pg) > 0 && free_blocks(pg) > 0 {
            return Some(pg);
        } else {
            // Quadratic probe from the parent, then anything with room.
            let mut g = pg;
            let mut step = 1;
            while step < n {
                g = (g + step) % n;
                if free_inodes(g) > 0 && free_blocks(g) > 0 {
                    return Some(g);
                }
                step <<= 1;
            }
        }
        (0..n).map(|k| (pg + k) % n).find(|&g| free_inodes(g) > 0)
    }

    /// Takes a free inode number in group `g`, or `None` if the group is full.
    ///
    /// With `goal` (a bit of this group: the one after the directory's last child), that bit
    /// if it is free; if another directory's child took it, the first free run of a whole
    /// inode-table block's inodes, so that directories filling one group at once do not
    /// interleave their inodes in shared table blocks (whose buffer locks and lines their
    /// threads would then contend for); else the first free bit.
    fn take_inode_bit(&self, h: &Handle, g: u32, goal: Option<usize>) -> Result<Option<u32>> {
        let sbi = &self.sbi;
        let ipg = sbi.inodes_per_group as usize;
        let blk = self.groups.get(g).inode_bitmap(sbi.desc_size);
        let st = &self.groups.state[g as usize];
        let uninit = self.inode_uninit(g);
        let buf = if uninit { self.bcache.get_fresh(blk) } else { self.bread(blk, None)? };
        // Reserved inodes (below s_first_ino) are never handed out.
        let first = if g == 0 { sbi.sb.first_ino() as usize } else { 0 };
        if first >= ipg {
            // All of group 0 is reserved (an s_first_ino past it): nothing to take here, and
            // `first` is no bit of its bitmap.
            return Ok(None);
        }
        // Bits index the group's inodes: below inodes_per_group, a u32.
        #[allow(clippy::cast_possible_truncation)]
        let bit32 = |bit: usize| bit as u32;
        let per_block = (sbi.block_size as usize / sbi.inode_size).max(1);
        // Records past the group's used mark (`ipg - itable_unused`) may never have been
        // written (mkfs leaves inode tables to lazy init), and e2fsck reads every record below
        // the mark: a run chosen beyond it needs the records it skips zeroed first.
        let mark = || ipg - (st.itable_unused.load(Ordering::Acquire) as usize).min(ipg);
        let choose = |map: &[u8]| match goal {
            Some(b) if b >= first && b < ipg && !bitmap::test(map, b) => Some(b),
            Some(b) if b >= first && b < ipg => bitmap::find_zero_aligned(map, b, ipg, per_block)
                .or_else(|| bitmap::find_zero_aligned(map, first, b, per_block))
                .or_else(|| bitmap::find_zero(map, first, ipg)),
            _ => bitmap::find_zero(map, first, ipg),
        };
        let found = if uninit { Some(first) } else { choose(&buf.data()) };
        let Some(mut bit) = found else { return Ok(None) };
        // The block of those records, read before the bitmap is locked (no I/O under it).
        let skip_from = mark().max(first);
        let skipped = if bit > skip_from {
            let (blk, _) = self.inode_location(InodeNo(g * sbi.inodes_per_group + bit32(skip_from) + 1));
            Some((blk, self.bread(blk, None)?))
        } else {
            None
        };
        let mut map = self.inode_bitmap_write(h, g, &buf)?;
        if bitmap::test(&map, bit) {
            // Another thread won this bit: choose again, now under the lock.
            match choose(&map) {
                Some(b) => bit = b,
                None => return Ok(None),
            }
        }
        let from = mark().max(first);
        if bit > from {
            // Zero the records between the mark and `bit` (free, so nobody writes them while
            // the bitmap is held). They lie in the block read above unless the mark moved
            // meanwhile; then the mark's own bit is taken instead (it is free: past the mark).
            let (blk, off) = self.inode_location(InodeNo(g * sbi.inodes_per_group + bit32(from) + 1));
            let end = off + (bit - from) * sbi.inode_size;
            let free = (from..bit).all(|i| !bitmap::test(&map, i));
            match &skipped {
                Some((b, ibuf)) if free && *b == blk && end <= sbi.block_size as usize => {
                    h.write(ibuf)?[off..end].fill(0);
                }
                // Set although past the mark, the descriptor's count of unused inodes is
                // wrong: the first free bit, unless that too lies past the mark.
                _ if bitmap::test(&map, from) => match bitmap::find_zero(&map, first, ipg) {
                    Some(b) if b <= from => bit = b,
                    _ => return Ok(None),
                },
                _ => bit = from,
            }
        }
        self.take_bit(&mut map, g, bit);
        drop(map);
        self.counters.free_inodes.add(-1);
        Ok(Some(bit32(bit)))
    }

    /// Write access to group `g`'s inode bitmap `buf`. The first use of a group gives it an
    /// empty bitmap with the padding bits set, and its block bitmap, which must exist on disk
    /// too once the group holds an inode.
    fn inode_bitmap_write<'a>(
        &self,
        h: &Handle,
        g: u32,
        buf: &'a Arc<Buffer>,
    ) -> Result<RwLockWriteGuard<'a, Box<[u8]>>> {
        let mut map = h.write(buf)?;
        if self.inode_uninit(g) {
            map.fill(0);
            bitmap::set_range(&mut map, self.sbi.inodes_per_group as usize, self.sbi.block_size as usize * 8);
            self.groups.state[g as usize].flags.fetch_and(!u32::from(BG_INODE_UNINIT), Ordering::AcqRel);
            drop(map);
            self.block_bitmap(h, g)?;
            map = h.write(buf)?;
        }
        Ok(map)
    }

    /// Sets free bit `bit` of group `g`'s inode bitmap `map` (held for writing) and counts it
    /// in the group; the caller counts it in the filesystem's total once the bitmap is free.
    fn take_bit(&self, map: &mut [u8], g: u32, bit: usize) {
        let ipg = self.sbi.inodes_per_group as usize;
        let st = &self.groups.state[g as usize];
        bitmap::set(map, bit);
        st.free_inodes.fetch_sub(1, Ordering::AcqRel);
        // Inodes past `itable_unused` are about to be used: move the mark (lazy itable init).
        let unused = st.itable_unused.load(Ordering::Acquire) as usize;
        if bit >= ipg - unused.min(ipg) {
            // Below inodes_per_group, a u32.
            #[allow(clippy::cast_possible_truncation)]
            st.itable_unused.store((ipg - bit - 1) as u32, Ordering::Release);
        }
    }

    /// Allocates an inode for a child of inode `parent` (a directory, or for an EA inode the
    /// inode naming it) and returns its number (`__ext4_new_inode`'s bitmap part). The caller
    /// initialises and writes the record.
    ///
    /// `goal` is the parent directory's [`Inode::child_goal`]: a file goes next to its
    /// directory's last new child while that group has room (as the kernel keeps a
    /// directory's allocations in `i_last_alloc_group`), and the goal moves past the new one.
    /// Directories are spread by [`FsInner::find_group`] and take no goal.
    ///
    /// [`Inode::child_goal`]: crate::inode::Inode::child_goal
    pub(crate) fn alloc_inode(
        &self,
        h: &Handle,
        parent: InodeNo,
        is_dir: bool,
        goal: Option<&AtomicU32>,
    ) -> Result<InodeNo> {
        let _t = self.stats.time(crate::fs::stats::Op::NewInode);
        if self.counters.free_inodes.sum() <= 0 {
            return Err(Error::NoSpace);
        }
        let (n, ipg) = (self.sbi.group_count, self.sbi.inodes_per_group);
        let goal = goal.filter(|_| !is_dir);
        // The goal's group, while it has free inodes; else the usual choice.
        let near = goal
            .map(|a| a.load(Ordering::Relaxed))
            .filter(|&x| x != 0 && x <= self.sbi.inodes_count)
            .map(|x| ((x - 1) / ipg, (x - 1) % ipg))
            .filter(|&(g, _)| self.groups.state[g as usize].free_inodes.load(Ordering::Acquire) != 0);
        let start = match near {
            Some((g, _)) => g,
            None => self.find_group(parent, is_dir).ok_or(Error::NoSpace)?,
        };
        for k in 0..n {
            let g = (start + k) % n;
            if self.groups.state[g as usize].free_inodes.load(Ordering::Acquire) == 0 {
                continue;
            }
            let want = near.filter(|&(ng, _)| ng == g).map(|(_, b)| b as usize);
            if let Some(bit) = self.take_inode_bit(h, g, want)? {
                if is_dir {
                    self.groups.state[g as usize].used_dirs.fetch_add(1, Ordering::AcqRel);
                    self.counters.dirs.add(1);
                }
                self.touch_group_desc(h, g)?;
                let ino = g * ipg + bit + 1;
                if let Some(a) = goal {
                    a.store(ino + 1, Ordering::Relaxed);
                }
                return Ok(InodeNo(ino));
            }
        }
        Err(Error::NoSpace)
    }

    /// Frees inode `ino` in its group's bitmap (`ext4_free_inode`).
    pub(crate) fn free_inode(&self, h: &Handle, ino: InodeNo, was_dir: bool) -> Result<()> {
        let _t = self.stats.time(crate::fs::stats::Op::FreeInode);
        // The kernel's lock context dies with the inode (`locks_free_lock_context`).
        self.locks.drop_inode(ino.0);
        let sbi = &self.sbi;
        let g = (ino.0 - 1) / sbi.inodes_per_group;
        let bit = ((ino.0 - 1) % sbi.inodes_per_group) as usize;
        let buf = self.bread(self.groups.get(g).inode_bitmap(sbi.desc_size), Some(ino))?;
        let mut map = h.write(&buf)?;
        if !bitmap::test(&map, bit) {
            return crate::error::corrupt(crate::error::CorruptKind::Inode {
                ino,
                what: "freeing a free inode",
            });
        }
        bitmap::clear(&mut map, bit);
        drop(map);
        let st = &self.groups.state[g as usize];
        st.free_inodes.fetch_add(1, Ordering::AcqRel);
        self.counters.free_inodes.add(1);
        if was_dir {
            st.used_dirs.fetch_sub(1, Ordering::AcqRel);
            self.counters.dirs.add(-1);
        }
        self.touch_group_desc(h, g)
    }

    /// Whether inode `ino` is allocated in its group's bitmap.
    pub(crate) fn inode_in_bitmap(&self, ino: InodeNo) -> Result<bool> {
        let ipg = self.sbi.inodes_per_group;
        let (g, bit) = ((ino.0 - 1) / ipg, ((ino.0 - 1) % ipg) as usize);
        if self.inode_uninit(g) {
            return Ok(false);
        }
        let buf = self.bread(self.groups.get(g).inode_bitmap(self.sbi.desc_size), Some(ino))?;
        let map = buf.data();
        Ok(bitmap::test(&map, bit))
    }

    /// Marks inode `ino` allocated in its group's bitmap, if it is not yet (the kernel's
    /// `ext4_mark_inode_used`, for a replay that names the inode): the group's first inode
    /// makes its bitmaps, and the unused-inodes mark moves past it. `is_dir` counts it in the
    /// group's directories. Returns whether the bit was taken here.
    pub(crate) fn mark_inode_used(&self, h: &Handle, ino: InodeNo, is_dir: bool) -> Result<bool> {
        let ipg = self.sbi.inodes_per_group;
        let (g, bit) = ((ino.0 - 1) / ipg, ((ino.0 - 1) % ipg) as usize);
        let blk = self.groups.get(g).inode_bitmap(self.sbi.desc_size);
        let buf = if self.inode_uninit(g) { self.bcache.get_fresh(blk) } else { self.bread(blk, Some(ino))? };
        let mut map = self.inode_bitmap_write(h, g, &buf)?;
        if bitmap::test(&map, bit) {
            return Ok(false);
        }
        self.take_bit(&mut map, g, bit);
        drop(map);
        self.counters.free_inodes.add(-1);
        if is_dir {
            self.groups.state[g as usize].used_dirs.fetch_add(1, Ordering::AcqRel);
            self.counters.dirs.add(1);
        }
        self.touch_group_desc(h, g)?;
        Ok(true)
    }

    /// A fresh generation number for a new inode.
    pub(crate) fn new_generation(&self) -> u32 {
        next_generation()
    }
}

/// Making a new inode (`__ext4_new_inode`): its number, then its record in memory.
impl FsInner {
    /// A new inode's record: type and permissions, owner, times, extent root.
    fn new_record(&self, mode: u16, uid: u32, gid: u32, links: u16, generation: u32) -> RawRecord {
        let size = self.sbi.inode_size;
        let mut raw = RawRecord::zeroed(size);
        let mut r = rec(&mut raw);
        r.set_mode(mode);
        r.set_uid(uid);
        r.set_gid(gid);
        r.set_links_count(links);
        r.set_generation(generation);
        if size > fi::GOOD_OLD_INODE_SIZE {
            let want = self.sbi.sb.s_want_extra_isize.get().max(32);
            let room = u16::try_from(size - fi::GOOD_OLD_INODE_SIZE).unwrap_or(u16::MAX);
            r.set_extra_isize(want.min(room) & !3);
        }
        raw_init_times(&mut raw, self.now());
        if self.sbi.sb.incompat().contains(Incompat::EXTENTS) {
            raw_set_flags(&mut raw, EXTENTS_FL);
            crate::map::extents_write::init_root(&mut raw);
        }
        raw
    }

    /// Allocates a new inode in directory `dir` (next to its last new child) and makes its
    /// record in memory; the caller writes it (`mark_inode_dirty`).
    pub(crate) fn new_inode(
        &self,
        h: &Handle,
        dir: &Inode,
        mode: u16,
        uid: u32,
        gid: u32,
        links: u16,
    ) -> Result<Arc<Inode>> {
        let projid = if self.sbi.sb.ro_compat().contains(RoCompat::PROJECT) {
            self.inherited_project(&dir.raw())
        } else {
            0
        };
        self.new_inode_in(h, dir.ino, Some(&dir.child_goal), mode, uid, gid, links, projid, true)
    }

    /// The project a new inode made in the directory with record `dir_raw` starts in: the
    /// directory's where it is marked to pass it on (`__ext4_new_inode`), else 0.
    pub(crate) fn inherited_project(&self, dir_raw: &[u8]) -> u32 {
        let r = rec_ref(dir_raw);
        if self.sbi.sb.ro_compat().contains(RoCompat::PROJECT) && r.flags() & fi::PROJINHERIT_FL != 0 {
            r.projid()
        } else {
            0
        }
    }

    /// Allocates a new inode near `parent` (next to the inode `goal` names, where it is a
    /// directory's `child_goal`), in project `projid`, and makes its record in memory; the
    /// caller writes it. `charged`: quotas count it (all but EA inodes, whose values are
    /// charged to their owner: `ext4_new_inode` skips `dquot_alloc_inode` for them).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new_inode_in(
        &self,
        h: &Handle,
        parent: InodeNo,
        goal: Option<&AtomicU32>,
        mode: u16,
        uid: u32,
        gid: u32,
        links: u16,
        projid: u32,
        charged: bool,
    ) -> Result<Arc<Inode>> {
        let is_dir = mode & fi::S_IFMT == fi::S_IFDIR;
        let quota = self.quota.is_on() && charged;
        let claim = if quota { self.quota_inode_check([uid, gid, projid])? } else { None };
        let prepared = if quota { self.quota_prepare(h, [uid, gid, projid]) } else { Ok(()) };
        let ino = match prepared.and_then(|()| self.alloc_inode(h, parent, is_dir, goal)) {
            Ok(ino) => ino,
            Err(e) => {
                self.quota_inode_unclaimed(claim);
                return Err(e);
            }
        };
        let generation = self.new_generation();
        let mut raw = self.new_record(mode, uid, gid, links, generation);
        rec(&mut raw).set_projid(projid);
        let inode =
            Arc::new(Inode::new_in_memory(ino, raw, inode_csum_seed(self.sbi.csum_seed, ino.0, generation)));
        // Its first record write charges its quotas, and ends the claim.
        inode.quota_new.store(true, Ordering::Release);
        Self::quota_inode_claimed(&inode, claim);
        self.icache.insert(u64::from(ino.0), inode.clone());
        Ok(inode)
    }
}

#[cfg(test)]
mod tests {
    /// Threads step sequences of their own, from different starts: no generation repeats
    /// within one thread's draws, and two threads' draws overlap only by chance (about one
    /// run in 200,000 here).
    #[test]
    fn generations_do_not_repeat_within_or_across_threads() {
        let draw = || (0..10_000).map(|_| super::next_generation()).collect::<Vec<u32>>();
        let a = std::thread::spawn(draw).join().unwrap();
        let b = std::thread::spawn(draw).join().unwrap();
        assert!(a.iter().chain(&b).all(|&g| g != 0), "0 marks an unseeded thread");
        let mut all: Vec<u32> = a.iter().chain(&b).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 20_000);
    }
}
