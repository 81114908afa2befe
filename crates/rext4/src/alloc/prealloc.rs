//! Per-inode preallocation (mballoc's inode PA, in spirit): a file that grows by appends gets
//! the blocks after the ones it asked for set aside, so its next appends continue the same
//! run even while other files grow beside it. Without it, files appended to concurrently
//! take turns block by block and end in one extent per block.
//!
//! The reserve lives **only in memory**: its blocks stay free in the bitmaps and the free
//! counts (so a crash leaves nothing to repair, and `statfs` shows them free); allocations
//! for anyone else skip them, as they skip blocks whose freeing has not committed. It goes when
//! the file's last opener releases it, and every reserve goes at once when an allocation
//! would otherwise fail for lack of space.
//!
//! A reserve is only a hint of where the next blocks go: it says nothing of the file's map,
//! so truncates, punches and shifts need not touch it.
//!
//! # Locking
//! `Inode::prealloc` -> a group's bitmap data lock -> `GroupState::prealloc`. Discarding a
//! reserve takes only the group's `prealloc` list.

use crate::alloc::reserved::Pool;
use crate::error::Result;
use crate::fs::FsInner;
use crate::inode::Inode;
use crate::jbd2::transaction::Handle;
use std::sync::atomic::Ordering;

/// The largest reserve, in bytes (the kernel's largest normalized request for a growing
/// file is 8 MiB).
const MAX_WINDOW_BYTES: u64 = 8 << 20;
/// The smallest, in bytes.
const MIN_WINDOW_BYTES: u64 = 16 << 10;

/// Blocks set aside for one file: logical blocks `lblk..lblk + len` would go to physical
/// blocks `pblk..pblk + len`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Prealloc {
    lblk: u64,
    pblk: u64,
    len: u32,
    /// [`FsInner::pa_epoch`] when it was made: a reserve from before a discard of all is gone.
    epoch: u64,
}

impl FsInner {
    /// Allocates up to `want` blocks for logical block `lblk` of `inode`, which the file's
    /// data will fill (`appending`: nothing is mapped after it), near `goal`. Returns the
    /// first block and the count, as [`FsInner::alloc_blocks`] from `pool` (`Reserved`:
    /// delayed writes reserved the blocks, see `FsInner::fill_map`).
    #[allow(clippy::too_many_arguments)] // an allocation request's parts
    pub(crate) fn alloc_data_blocks(
        &self,
        h: &Handle,
        inode: &Inode,
        lblk: u64,
        goal: u64,
        want: u32,
        appending: bool,
        pool: Pool,
    ) -> Result<(u64, u32)> {
        if !appending || !inode.is_held() {
            return self.alloc_blocks(h, goal, want, pool);
        }
        // No reserves under bigalloc (a cluster is already a run; fill_map allocates those).
        debug_assert_eq!(self.sbi.cluster_bits, 0);
        let mut pa = inode.prealloc.lock();
        if let Some(p) = pa.take() {
            if p.epoch == self.pa_epoch.load(Ordering::Acquire) && p.lblk == lblk && p.len > 0 {
                let n = want.min(p.len);
                if self.take_reserved(h, p.pblk, n)? {
                    if n < p.len {
                        let rest = Prealloc {
                            lblk: p.lblk + u64::from(n),
                            pblk: p.pblk + u64::from(n),
                            len: p.len - n,
                            ..p
                        };
                        *pa = Some(rest);
                    }
                    return Ok((p.pblk, n));
                }
            }
            self.drop_reserve(&p);
        }
        // A new reserve, sized as the kernel normalizes a growing file's request: the file's
        // size after this allocation rounded up to a power of two, 16 KiB to 8 MiB.
        let bs = u64::from(self.sbi.block_size);
        let end = lblk + u64::from(want);
        let window = (end * bs).next_power_of_two().clamp(MIN_WINDOW_BYTES, MAX_WINDOW_BYTES) / bs;
        let extra = u32::try_from(window.saturating_sub(u64::from(want))).unwrap_or(0);
        let ask = want.saturating_add(extra);
        let (p, got) = self.alloc_blocks(h, goal, ask, pool)?;
        if got > want {
            let rest = got - want;
            let start = p + u64::from(want);
            let epoch = self.reserve(h, start, rest)?;
            *pa = Some(Prealloc { lblk: end, pblk: start, len: rest, epoch });
            return Ok((p, want));
        }
        Ok((p, got))
    }

    /// Gives back `inode`'s reserve (its last opener released it).
    pub(crate) fn discard_prealloc(&self, inode: &Inode) {
        if let Some(p) = inode.prealloc.lock().take() {
            self.drop_reserve(&p);
        }
    }

    /// Gives back every reserve (an allocation found no room outside them). Whether there were
    /// any.
    pub(crate) fn discard_all_preallocs(&self) -> bool {
        if self.pa_blocks.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.pa_epoch.fetch_add(1, Ordering::AcqRel);
        for st in &self.groups.state {
            let mut v = st.prealloc.lock();
            for &(_, len) in v.iter() {
                self.pa_blocks.fetch_sub(u64::from(len), Ordering::AcqRel);
            }
            if !v.is_empty() {
                // Free again, and never trimmed while set aside (alloc/trim.rs).
                st.trimmed.store(0, Ordering::Release);
            }
            v.clear();
        }
        true
    }

    fn drop_reserve(&self, p: &Prealloc) {
        if p.len == 0 || p.epoch != self.pa_epoch.load(Ordering::Acquire) {
            return;
        }
        let (g, off) = self.sbi.block_group_offset(p.pblk);
        let mut v = self.groups.state[g as usize].prealloc.lock();
        if let Some(i) = v.iter().position(|&(o, _)| o == off) {
            let (_, len) = v.swap_remove(i);
            self.pa_blocks.fetch_sub(u64::from(len), Ordering::AcqRel);
            // Free again, and never trimmed while set aside (alloc/trim.rs).
            self.groups.state[g as usize].trimmed.store(0, Ordering::Release);
        }
    }
}
