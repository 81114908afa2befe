//! The group descriptor table (`ext4_get_group_desc`, `ext4_check_descriptors`): loaded and
//! checked once at open. Locations of bitmaps and tables never change; the counts and flags
//! that do are per-group atomics here, written into the descriptor blocks only when those are
//! frozen for a commit, with the bitmap and descriptor checksums (no checksum work under the
//! locks of every allocation; docs/design.md, Allocation).

use crate::cache::buffer::{Buffer, BufferCache};
use crate::error::{corrupt, CorruptKind, Result};
use crate::fs::super_block::SbInfo;
use crate::num::usize_from;
use rext4_format::features::Incompat;
use rext4_format::group_desc::GroupDesc;
use rext4_format::split::{hi16, lo16};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// A group's busy ranges (`GroupState::busy`): sorted by offset, so that an allocation can
/// step over them while it scans the bitmap instead of copying the bitmap and marking them
/// (thousands after a large delete). They never overlap: a busy block is not handed out, so
/// not freed again, before its commit. Neighbours freed by one transaction are merged.
#[derive(Default)]
pub(crate) struct BusyList {
    /// (offset in group, length, tid), sorted by offset.
    ranges: Vec<(u32, u32, u32)>,
    /// The oldest tid among `ranges` (meaningless when empty): nothing is released before it
    /// commits, so most releases need not scan.
    oldest: u32,
}

impl BusyList {
    /// Records `len` blocks from `off` freed by transaction `tid`.
    pub(crate) fn push(&mut self, off: u32, len: u32, tid: u32) {
        use crate::jbd2::journal::jbd2_after;
        let i = self.ranges.partition_point(|r| r.0 < off);
        if i > 0 && self.ranges[i - 1].2 == tid && self.ranges[i - 1].0 + self.ranges[i - 1].1 == off {
            self.ranges[i - 1].1 += len;
            if let Some(&(n_off, n_len, n_tid)) = self.ranges.get(i) {
                if n_tid == tid && off + len == n_off {
                    self.ranges[i - 1].1 += n_len;
                    self.ranges.remove(i);
                }
            }
            return;
        }
        if let Some(next) = self.ranges.get_mut(i) {
            if next.2 == tid && off + len == next.0 {
                *next = (off, len + next.1, tid);
                return;
            }
        }
        if self.ranges.is_empty() || jbd2_after(self.oldest, tid) {
            self.oldest = tid;
        }
        self.ranges.insert(i, (off, len, tid));
    }

    /// Drops the ranges of transactions up to `limit` (committed, and discarded if asked).
    pub(crate) fn release(&mut self, limit: u32) {
        use crate::jbd2::journal::jbd2_after;
        if self.ranges.is_empty() || jbd2_after(self.oldest, limit) {
            return;
        }
        self.ranges.retain(|r| jbd2_after(r.2, limit));
        if let Some(first) = self.ranges.first() {
            self.oldest = self.ranges.iter().fold(first.2, |o, r| if jbd2_after(o, r.2) { r.2 } else { o });
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// (offset, length, tid) of every range, by offset.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &(u32, u32, u32)> {
        self.ranges.iter()
    }

    /// The first range that ends after bit `i`, as `start..end` bits.
    pub(crate) fn next_after(&self, i: usize) -> Option<(usize, usize)> {
        let k = self.ranges.partition_point(|r| (r.0 as usize + r.1 as usize) <= i);
        self.ranges.get(k).map(|r| (r.0 as usize, r.0 as usize + r.1 as usize))
    }
}

/// What changes about a group while the filesystem is open. Updated by the allocators under
/// the group's bitmap buffer lock; read without locks for placement decisions. On a cache
/// line of its own: threads allocating in neighbouring groups do not write one line.
#[repr(align(64))]
pub(crate) struct GroupState {
    pub free_blocks: AtomicU32,
    pub free_inodes: AtomicU32,
    pub used_dirs: AtomicU32,
    /// `bg_flags` (BLOCK_UNINIT, INODE_UNINIT, INODE_ZEROED).
    pub flags: AtomicU32,
    pub itable_unused: AtomicU32,
    /// Blocks freed by transactions that have not committed yet, as (offset in group, length,
    /// tid): not handed out again before that commit, so a crash can never leave the old owner
    /// pointing at a new owner's data (mballoc's busy extents). Pushed under the group's
    /// bitmap lock (bitmap -> `busy`). [own lock]
    pub busy: crate::sync::Mutex<BusyList>,
    /// Free blocks set aside for a file's next appends, as (offset in group, length): skipped
    /// by every other allocation (alloc/prealloc.rs). Pushed under the group's bitmap lock.
    /// [own lock]
    pub prealloc: crate::sync::Mutex<Vec<(u32, u32)>>,
    /// The minimum run length of the last `FITRIM` that covered the whole group with nothing
    /// busy in it, 0 if none since the mount or since a later free (the kernel's
    /// `EXT4_GROUP_INFO_WAS_TRIMMED`): a trim asking no shorter runs skips the group.
    /// Cleared by frees under the bitmap lock, set by trims under its read lock. [atomic]
    pub trimmed: AtomicU32,
}

/// Every group's descriptor, as read at open, and its live counts.
pub(crate) struct Groups {
    descs: Vec<GroupDesc>,
    /// Live counts and flags. [atomics; see GroupState]
    pub state: Vec<GroupState>,
    /// Descriptor block -> first group it describes. [immutable]
    desc_blocks: crate::cache::KeyMap<u32>,
    /// The descriptor blocks' buffers, in table order, held for the filesystem's life: every
    /// allocation and free puts one in its transaction, and a lookup in the buffer cache would
    /// write the buffer's reference count, one line all allocating threads share. [immutable]
    desc_bufs: Vec<Arc<Buffer>>,
    /// The `discard` option's progress. [atomics; see Discard]
    pub discard: Discard,
}

/// Discarding freed blocks after their commit (`Options::discard`). While it is on, a busy
/// range stays busy until it has been discarded, not merely committed: a block handed out
/// again before its discard would lose its new owner's data to it.
#[derive(Default)]
pub(crate) struct Discard {
    /// Set once at open, before any block is freed. [atomic]
    on: std::sync::atomic::AtomicBool,
    /// Every busy range of this transaction and older ones has been discarded. Only the
    /// commit path stores it, in commit order. [atomic]
    done_tid: AtomicU32,
    /// The transaction of the latest free, so that a commit that freed nothing skips the
    /// walk over the groups. [atomic]
    freed_tid: AtomicU32,
}

impl Discard {
    /// Turns discarding on; `committed` is the last transaction committed before the open.
    pub(crate) fn enable(&self, committed: u32) {
        self.done_tid.store(committed, Ordering::Release);
        self.freed_tid.store(committed, Ordering::Release);
        self.on.store(true, Ordering::Release);
    }

    /// The transaction up to which busy ranges may be released: the last discarded one with
    /// discarding on, else the last committed.
    pub(crate) fn release_limit(&self, committed: u32) -> u32 {
        if self.on.load(Ordering::Acquire) {
            self.done_tid.load(Ordering::Acquire)
        } else {
            committed
        }
    }

    /// Notes a free in transaction `tid`.
    pub(crate) fn freed(&self, tid: u32) {
        if self.on.load(Ordering::Relaxed) {
            self.freed_tid.store(tid, Ordering::Release);
        }
    }
}

impl Groups {
    /// After transaction `tid` committed: discards the ranges freed by it (and by any older
    /// transaction not yet discarded), merged per group, through `discard(first block,
    /// blocks)`; then lets them be allocated again. Runs in the commit path, so commits
    /// call it in order. Device errors are the caller's to ignore: a discard is advice.
    pub(crate) fn discard_committed(&self, sbi: &SbInfo, tid: u32, mut discard: impl FnMut(u64, u64)) {
        use crate::jbd2::journal::jbd2_after;
        let d = &self.discard;
        if !d.on.load(Ordering::Acquire) {
            return;
        }
        let done = d.done_tid.load(Ordering::Acquire);
        if jbd2_after(d.freed_tid.load(Ordering::Acquire), done) {
            for (g, st) in (0u32..).zip(&self.state) {
                let mut ranges: Vec<(u32, u32)> = st
                    .busy
                    .lock()
                    .iter()
                    .filter(|&&(_, _, t)| jbd2_after(t, done) && !jbd2_after(t, tid))
                    .map(|&(off, len, _)| (off, len))
                    .collect();
                if ranges.is_empty() {
                    continue;
                }
                ranges.sort_unstable();
                let first = sbi.group_first_block(g);
                // Busy ranges are in bitmap bits (clusters); the device takes blocks.
                let mut discard =
                    |s: u32, l: u32| discard(first + sbi.c2b(u64::from(s)), sbi.c2b(u64::from(l)));
                let mut run: Option<(u32, u32)> = None;
                for (off, len) in ranges {
                    run = match run {
                        Some((s, l)) if s + l >= off => Some((s, l.max(off + len - s))),
                        Some((s, l)) => {
                            discard(s, l);
                            Some((off, len))
                        }
                        None => Some((off, len)),
                    };
                }
                if let Some((s, l)) = run {
                    discard(s, l);
                }
            }
        }
        d.done_tid.store(tid, Ordering::Release);
    }
}

impl Groups {
    pub(crate) fn load(sbi: &SbInfo, cache: &BufferCache) -> Result<Self> {
        let mut descs = Vec::with_capacity(sbi.group_count as usize);
        let mut desc_bufs = Vec::with_capacity(usize_from(sbi.gdt_blocks));
        let per_block = sbi.descs_per_block as usize;
        // The first group descriptor block `i` describes: below group_count for every block of
        // the table, so the fallback is never taken.
        let first_group = |i: u64| u32::try_from(i * u64::from(sbi.descs_per_block)).unwrap_or(u32::MAX);
        for i in 0..sbi.gdt_blocks {
            let blk = sbi.descriptor_block(i);
            if blk >= sbi.blocks_count {
                return corrupt(CorruptKind::GroupDesc {
                    group: first_group(i),
                    what: "descriptor block outside the filesystem",
                });
            }
            let buf = cache.get(blk)?;
            let data = buf.data();
            for d in data.chunks_exact(sbi.desc_size).take(per_block) {
                if descs.len() == sbi.group_count as usize {
                    break;
                }
                // Cannot fail: chunks are exactly desc_size (>= 32) bytes.
                descs.push(GroupDesc::parse(d, sbi.desc_size).unwrap());
            }
            drop(data);
            desc_bufs.push(buf);
        }
        let ds = sbi.desc_size;
        let state = descs
            .iter()
            .map(|d| GroupState {
                free_blocks: AtomicU32::new(d.free_blocks_count(ds)),
                free_inodes: AtomicU32::new(d.free_inodes_count(ds)),
                used_dirs: AtomicU32::new(d.used_dirs_count(ds)),
                flags: AtomicU32::new(u32::from(d.flags())),
                itable_unused: AtomicU32::new(d.itable_unused(ds)),
                busy: crate::sync::Mutex::new(BusyList::default()),
                prealloc: crate::sync::Mutex::new(Vec::new()),
                trimmed: AtomicU32::new(0),
            })
            .collect();
        let desc_blocks = (0..sbi.gdt_blocks).map(|i| (sbi.descriptor_block(i), first_group(i))).collect();
        let groups = Groups { descs, state, desc_blocks, desc_bufs, discard: Discard::default() };
        for g in 0..sbi.group_count {
            groups.check(sbi, g)?;
        }
        Ok(groups)
    }

    /// The buffer of the descriptor block describing group `g`, if `g` is a group.
    pub(crate) fn desc_buf(&self, sbi: &SbInfo, g: u32) -> Option<&Arc<Buffer>> {
        self.desc_bufs.get((g / sbi.descs_per_block) as usize)
    }

    /// Descriptor of group `g`; callers pass a group below `group_count`.
    pub(crate) fn get(&self, g: u32) -> &GroupDesc {
        &self.descs[g as usize]
    }

    fn check(&self, sbi: &SbInfo, g: u32) -> Result<()> {
        let d = self.get(g);
        let ds = sbi.desc_size;
        if sbi.metadata_csum {
            if d.bg_checksum.get() != d.csum_crc32c(sbi.csum_seed, g, ds) {
                return corrupt(CorruptKind::GroupDescChecksum { group: g });
            }
        } else if sbi.gdt_csum && d.bg_checksum.get() != d.csum_crc16(&sbi.sb.s_uuid, g, ds) {
            return corrupt(CorruptKind::GroupDescChecksum { group: g });
        }
        // Metadata of a group lives in the group, or anywhere with flex_bg.
        let (lo, hi) = if sbi.sb.incompat().contains(Incompat::FLEX_BG) {
            (sbi.first_data_block, sbi.blocks_count)
        } else {
            let first = sbi.group_first_block(g);
            (first, first + u64::from(sbi.blocks_in_group(g)))
        };
        let inside = |b: u64, n: u64| b >= lo && b.checked_add(n).is_some_and(|e| e <= hi);
        let sb_block = sbi.first_data_block;
        let what = if !inside(d.block_bitmap(ds), 1) || d.block_bitmap(ds) == sb_block {
            "block bitmap not in group"
        } else if !inside(d.inode_bitmap(ds), 1) || d.inode_bitmap(ds) == sb_block {
            "inode bitmap not in group"
        } else if !inside(d.inode_table(ds), sbi.inode_table_blocks) || d.inode_table(ds) == sb_block {
            "inode table not in group"
        } else if d.free_inodes_count(ds) > sbi.inodes_per_group {
            "free inode count too large"
        } else {
            return Ok(());
        };
        corrupt(CorruptKind::GroupDesc { group: g, what })
    }

    /// What a read-write mount refuses besides (`ext4_check_descriptors`, which lets a
    /// read-only one go on): a bitmap or inode table on the superblock's block or on a
    /// descriptor block. Writing one would overwrite the other, and the commit, filling a
    /// descriptor block, would wait for itself to read the bitmap's checksum.
    pub(crate) fn check_writable(&self, sbi: &SbInfo) -> Result<()> {
        let ds = sbi.desc_size;
        let mut meta: Vec<u64> = self.desc_blocks.keys().copied().collect();
        meta.push(sbi.first_data_block);
        meta.sort_unstable();
        // Whether a superblock or descriptor block lies in [b, b + n).
        let hits = |b: u64, n: u64| {
            let i = meta.partition_point(|&m| m < b);
            meta.get(i).is_some_and(|&m| m - b < n)
        };
        for g in 0..sbi.group_count {
            let d = self.get(g);
            let what = if hits(d.block_bitmap(ds), 1) {
                "block bitmap overlaps the superblock or descriptors"
            } else if hits(d.inode_bitmap(ds), 1) {
                "inode bitmap overlaps the superblock or descriptors"
            } else if hits(d.inode_table(ds), sbi.inode_table_blocks) {
                "inode table overlaps the superblock or descriptors"
            } else {
                continue;
            };
            return corrupt(CorruptKind::GroupDesc { group: g, what });
        }
        Ok(())
    }

    /// Sums of free blocks, free inodes and directories over all groups.
    pub(crate) fn totals(&self) -> (u64, u64, u64) {
        self.state.iter().fold((0, 0, 0), |(b, i, d), s| {
            (
                b + u64::from(s.free_blocks.load(Ordering::Relaxed)),
                i + u64::from(s.free_inodes.load(Ordering::Relaxed)),
                d + u64::from(s.used_dirs.load(Ordering::Relaxed)),
            )
        })
    }

    /// Whether `blk` holds group descriptors.
    pub(crate) fn is_desc_block(&self, blk: u64) -> bool {
        self.desc_blocks.contains_key(&blk)
    }

    /// Fills the frozen copy of descriptor block `blk` with the live counts and flags of its
    /// groups, the bitmap checksums `bitmap_csum(block, bytes)` can provide (crc32c of the
    /// first `bytes` of a cached bitmap block), and each descriptor's checksum.
    pub(crate) fn freeze_desc_block(
        &self,
        sbi: &SbInfo,
        blk: u64,
        data: &mut [u8],
        bitmap_csum: impl Fn(u64, usize) -> Option<u32>,
    ) {
        let Some(&first) = self.desc_blocks.get(&blk) else { return };
        let ds = sbi.desc_size;
        for (i, raw) in data.chunks_exact_mut(ds).enumerate() {
            let Some(g) = u32::try_from(i).ok().and_then(|i| first.checked_add(i)) else { break };
            let Some(st) = self.state.get(g as usize) else { break };
            let Some(mut d) = GroupDesc::parse(raw, ds) else { break };
            let (fb, fi, ud, iu) = (
                st.free_blocks.load(Ordering::Relaxed),
                st.free_inodes.load(Ordering::Relaxed),
                st.used_dirs.load(Ordering::Relaxed),
                st.itable_unused.load(Ordering::Relaxed),
            );
            d.bg_free_blocks_count_lo.set(lo16(fb));
            d.bg_free_blocks_count_hi.set(hi16(fb));
            d.bg_free_inodes_count_lo.set(lo16(fi));
            d.bg_free_inodes_count_hi.set(hi16(fi));
            d.bg_used_dirs_count_lo.set(lo16(ud));
            d.bg_used_dirs_count_hi.set(hi16(ud));
            d.bg_itable_unused_lo.set(lo16(iu));
            d.bg_itable_unused_hi.set(hi16(iu));
            // bg_flags is 16 bits wide; the atomic holds it widened and gains no other bits.
            d.bg_flags.set(lo16(st.flags.load(Ordering::Relaxed)));
            if sbi.metadata_csum {
                if let Some(c) = bitmap_csum(d.block_bitmap(ds), (sbi.clusters_per_group / 8) as usize) {
                    d.bg_block_bitmap_csum_lo.set(lo16(c));
                    d.bg_block_bitmap_csum_hi.set(hi16(c));
                }
                if let Some(c) = bitmap_csum(d.inode_bitmap(ds), (sbi.inodes_per_group / 8) as usize) {
                    d.bg_inode_bitmap_csum_lo.set(lo16(c));
                    d.bg_inode_bitmap_csum_hi.set(hi16(c));
                }
                d.bg_checksum.set(d.csum_crc32c(sbi.csum_seed, g, ds));
            } else if sbi.gdt_csum {
                d.bg_checksum.set(d.csum_crc16(&sbi.sb.s_uuid, g, ds));
            }
            d.encode_into(raw, ds);
        }
    }
}
