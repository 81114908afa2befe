//! Enforcing quota limits (the kernel's `check_bdq` / `check_idq` in `fs/quota/dquot.c`) on
//! writable opens that ask for it ([`crate::Options::quota_limits`], the `usrquota`,
//! `grpquota` and `prjquota` mount options), with the kernel's rules:
//!
//! - a hard limit is never passed, and a soft limit not once its grace time has run out
//!   (`EDQUOT`); passing a soft limit starts the grace time;
//! - space counts what is in use and what delayed writes have reserved (`dqb_rsvspace`);
//! - a caller with `CAP_SYS_RESOURCE` ([`with_quota_limits_ignored`]) passes hard and expired
//!   soft limits, and still starts grace times (`ignore_hardlimit`);
//! - an allocation for a file's data takes what fits (a write near the limit is short, then
//!   the next fails), as `ext4_mb_new_blocks` shrinks its request; directory blocks, inodes
//!   and changes of owner or project fit whole or fail;
//! - blocks of delayed writes were checked when reserved and are not checked again when
//!   written back, and extent-tree blocks are not checked (the kernel allocates both with
//!   `dquot_alloc_block_nofail` or under a reservation), so metadata may pass a limit by a
//!   block or two, as on ext4.
//!
//! Checks read the entry's usage and add what the caller's record holds but has not been
//! charged yet (blocks mapped earlier in the same handle). A check and the charge that
//! follows are not one atomic step: writers of one id racing each other may pass a limit by
//! what they allocate at once, where the kernel's check-and-add under `dq_dqb_lock` would not.
//!
//! # Invariant
//! While a file has delayed writes over holes, the ids in its record are those its
//! reservation was charged to: reservations are made under the file's `op_lock`, and a change
//! of owner or project takes `op_lock` and writes the file back first (which turns the
//! reservation into usage) where limits are enforced.

use super::{Quotas, TYPES};
use crate::error::{Error, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use crate::sync::Mutex;
use rext4_format::quota::{DiskDquot, QT_BLOCK};
use std::cell::Cell;
use std::collections::HashMap;

/// Which quota types' limits an open enforces (the kernel's `usrquota`, `grpquota` and
/// `prjquota` mount options). Usage is kept either way on filesystems with the `quota`
/// feature; a writable open asking for a type refuses a filesystem without the feature.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaEnforcement {
    pub user: bool,
    pub group: bool,
    pub project: bool,
}

impl QuotaEnforcement {
    pub(crate) fn types(self) -> [bool; TYPES] {
        [self.user, self.group, self.project]
    }

    pub fn any(self) -> bool {
        self.user || self.group || self.project
    }
}

thread_local! {
    /// Whether the current call passes quota limits (`CAP_SYS_RESOURCE`).
    static IGNORE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` as a caller that may pass quota limits (the kernel's `CAP_SYS_RESOURCE`): hard
/// limits and expired soft limits do not stop the changes it makes on this thread. Nests;
/// restored even if `f` unwinds. The engine has no caller identity on its write paths; the
/// caller marks the calls of such a caller, as the kernel reads the current task's
/// capabilities.
pub fn with_quota_limits_ignored<T>(f: impl FnOnce() -> T) -> T {
    crate::alloc::reserved::with_flag(&IGNORE, f)
}

fn ignoring() -> bool {
    IGNORE.with(Cell::get)
}

/// Shards of the reservation table: writers of different ids rarely share a lock.
const SHARDS: usize = 16;

/// Bytes reserved by delayed writes and not yet allocated, by id (`dqb_rsvspace`), for one
/// quota type. [each shard its own lock; a leaf: taken under `Inode::dirty` or nothing]
#[derive(Default)]
pub(crate) struct Reserved([Mutex<HashMap<u32, u64>>; SHARDS]);

impl Reserved {
    fn shard(&self, id: u32) -> &Mutex<HashMap<u32, u64>> {
        &self.0[id as usize % SHARDS]
    }

    fn get(&self, id: u32) -> u64 {
        self.shard(id).lock().get(&id).copied().unwrap_or(0)
    }

    fn sub(&self, id: u32, bytes: u64) {
        let mut m = self.shard(id).lock();
        if let Some(v) = m.get_mut(&id) {
            *v = v.saturating_sub(bytes);
            if *v == 0 {
                m.remove(&id);
            }
        }
    }
}

/// The limit an entry puts on its usage now, for a caller bound by limits: its hard limit,
/// and its soft limit once the grace time has run out (`None`: no limit).
fn limit(hard: u64, soft: u64, grace_end: u64, now: u64) -> Option<u64> {
    let expired = (soft != 0 && grace_end != 0 && now >= grace_end).then_some(soft);
    match (hard, expired) {
        (0, e) => e,
        (h, Some(s)) => Some(h.min(s)),
        (h, None) => Some(h),
    }
}

fn now() -> u64 {
    u64::try_from(crate::clock::now().0).unwrap_or(0)
}

impl Quotas {
    /// Whether any type's limits are enforced.
    pub(crate) fn enforced(&self) -> bool {
        self.enforce.iter().any(|&e| e)
    }
}

impl FsInner {
    /// The entry of `id` in type `ty`'s file, where limits of that type are enforced and the
    /// id has one (an id without an entry has no limits).
    fn quota_limited(&self, ty: usize, id: u32) -> Result<Option<DiskDquot>> {
        if !self.quota.enforce[ty] {
            return Ok(None);
        }
        let Some(slot) = self.quota.files[ty].as_ref().and_then(|qf| qf.slot(id)) else { return Ok(None) };
        self.quota_entry(slot).map(Some)
    }

    /// Bytes `ty`'s entry for `id` may still grow by (`None`: without limit).
    fn space_room(&self, ty: usize, id: u32, now: u64) -> Result<Option<u64>> {
        if ignoring() {
            return Ok(None);
        }
        let Some(d) = self.quota_limited(ty, id)? else { return Ok(None) };
        let k = QT_BLOCK as u64;
        let lim = limit(
            d.dqb_bhardlimit.get().saturating_mul(k),
            d.dqb_bsoftlimit.get().saturating_mul(k),
            d.dqb_btime.get(),
            now,
        );
        let used = d.dqb_curspace.get().saturating_add(self.quota.rsv[ty].get(id));
        Ok(lim.map(|l| l.saturating_sub(used)))
    }

    /// Bytes the record `raw` of `inode` holds beyond what its quotas were charged (blocks
    /// mapped in the caller's handle, charged when the record is next written).
    fn quota_uncharged(&self, inode: &Inode, raw: &[u8]) -> Result<u64> {
        let Some(now) = self.quota_charge(inode, raw) else { return Ok(0) };
        if inode.quota_new.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(now.space);
        }
        let (blk, off) = self.inode_location(inode.ino);
        let buf = self.bread(blk, Some(inode.ino))?;
        let before = self.quota_charge(inode, &buf.data()[off..off + raw.len()]);
        Ok(now.space.saturating_sub(before.map_or(0, |c| c.space)))
    }

    /// How many of `want` blocks the file `inode` (record `raw`) may be given now; `EDQUOT`
    /// when none (`dquot_alloc_block`, with `ext4_mb_new_blocks`'s shrinking request).
    pub(crate) fn quota_blocks_allowed(&self, inode: &Inode, raw: &[u8], want: u64) -> Result<u64> {
        if !self.quota.enforced() || ignoring() {
            return Ok(want);
        }
        let Some(c) = self.quota_charge(inode, raw) else { return Ok(want) };
        self.quota_fit(c, || self.quota_uncharged(inode, raw), want)
    }

    /// Checks that the inode `ino` (record `raw`) may take one more block for its extended
    /// attributes, a new or a shared one (`ext4_xattr_block_set`'s `dquot_alloc_block`).
    pub(crate) fn quota_xattr_block_check(&self, ino: rext4_format::InodeNo, raw: &[u8]) -> Result<()> {
        if !self.quota.enforced() || ignoring() {
            return Ok(());
        }
        let Some(c) = self.quota_charge_ino(ino.0, raw) else { return Ok(()) };
        // Attribute blocks change outside data allocation: nothing of the record is pending.
        self.quota_fit(c, || Ok(0), 1).map(|_| ())
    }

    /// Checks that inode `ino` (record `raw`) may be charged one more inode and the blocks of
    /// a value of `len` bytes, for a value it is to keep in an EA inode
    /// (`ext4_xattr_inode_alloc_quota`).
    pub(crate) fn quota_ea_value_check(
        &self,
        ino: rext4_format::InodeNo,
        raw: &[u8],
        len: u64,
    ) -> Result<()> {
        if !self.quota.enforced() || ignoring() {
            return Ok(());
        }
        let Some(c) = self.quota_charge_ino(ino.0, raw) else { return Ok(()) };
        self.quota_inode_check(c.ids)?;
        let blocks = len.div_ceil(u64::from(self.sbi.block_size));
        if blocks > 0 && self.quota_fit(c, || Ok(0), blocks)? < blocks {
            return Err(Error::QuotaExceeded);
        }
        Ok(())
    }

    /// How many of `want` blocks fit in the limits of `c`'s ids, `pending` bytes of the
    /// record not charged yet; `EDQUOT` when none.
    fn quota_fit(&self, c: super::Charge, pending: impl FnOnce() -> Result<u64>, want: u64) -> Result<u64> {
        let bs = u64::from(self.sbi.block_size);
        let t = now();
        let mut pending = Some(pending);
        let mut known = 0;
        let mut fit = want;
        for ty in 0..TYPES {
            let Some(room) = self.space_room(ty, c.ids[ty], t)? else { continue };
            if let Some(p) = pending.take() {
                known = p()?;
            }
            fit = fit.min(room.saturating_sub(known) / bs);
        }
        if fit == 0 {
            return Err(Error::QuotaExceeded);
        }
        Ok(fit)
    }

    /// Checks that one more inode of `ids` (user, group, project) fits (`dquot_alloc_inode`).
    pub(crate) fn quota_inode_check(&self, ids: [u32; TYPES]) -> Result<()> {
        if !self.quota.enforced() || ignoring() {
            return Ok(());
        }
        let t = now();
        for (ty, id) in ids.into_iter().enumerate() {
            if !self.inodes_fit(ty, id, t, 1)? {
                return Err(Error::QuotaExceeded);
            }
        }
        Ok(())
    }

    /// Whether `ty`'s entry for `id` may count `n` more inodes at time `now` (`check_idq`),
    /// for a caller bound by limits.
    fn inodes_fit(&self, ty: usize, id: u32, now: u64, n: u64) -> Result<bool> {
        let Some(d) = self.quota_limited(ty, id)? else { return Ok(true) };
        let lim = limit(d.dqb_ihardlimit.get(), d.dqb_isoftlimit.get(), d.dqb_itime.get(), now);
        Ok(lim.is_none_or(|l| d.dqb_curinodes.get().saturating_add(n) <= l))
    }

    /// Checks that `inode` (record `raw`: one inode and its space) fits in the ids it is
    /// about to move to (`__dquot_transfer`). The caller holds `op_lock` and has written
    /// back the file's delayed writes ([`FsInner::quota_transfer_prepare`]).
    pub(crate) fn quota_transfer_check(&self, inode: &Inode, raw: &[u8], to: [u32; TYPES]) -> Result<()> {
        if !self.quota.enforced() || ignoring() {
            return Ok(());
        }
        let Some(c) = self.quota_charge(inode, raw) else { return Ok(()) };
        // The inode, and the values it keeps in EA inodes.
        let inodes = c.inodes + self.block_ea_count(inode.ino, raw)?;
        let t = now();
        for (ty, (&from, &id)) in c.ids.iter().zip(&to).enumerate() {
            if from != id
                && (!self.inodes_fit(ty, id, t, inodes)?
                    || self.space_room(ty, id, t)?.is_some_and(|room| c.space > room))
            {
                return Err(Error::QuotaExceeded);
            }
        }
        Ok(())
    }

    /// Before a change of `inode`'s owner or project where limits are enforced: writes its
    /// delayed writes back, so that no reservation is left under the old ids (the invariant
    /// above). The caller holds `op_lock`.
    pub(crate) fn quota_transfer_prepare(&self, inode: &std::sync::Arc<Inode>) -> Result<()> {
        if self.quota.enforced() && self.delalloc_blocks(inode) > 0 {
            self.writeback_locked(inode)?;
        }
        Ok(())
    }

    /// Reserves `blocks` blocks of delayed writes to `inode`'s ids (`dquot_reserve_block`);
    /// whether they fit. The caller holds `op_lock` (and no record lock).
    pub(crate) fn quota_reserve(&self, inode: &Inode, blocks: u64) -> Result<bool> {
        if !self.quota.enforced() || blocks == 0 {
            return Ok(true);
        }
        // Only here, off the path of opens that enforce nothing, is the record read.
        let Some(c) = self.quota_charge(inode, &inode.raw()) else { return Ok(true) };
        let bytes = blocks.saturating_mul(u64::from(self.sbi.block_size));
        let t = now();
        for ty in 0..TYPES {
            if self.quota.enforce[ty] && self.space_room(ty, c.ids[ty], t)?.is_some_and(|room| bytes > room) {
                return Ok(false);
            }
        }
        for ty in (0..TYPES).filter(|&ty| self.quota.enforce[ty]) {
            *self.quota.rsv[ty].shard(c.ids[ty]).lock().entry(c.ids[ty]).or_insert(0) += bytes;
        }
        Ok(true)
    }

    /// Gives back `blocks` blocks reserved for the delayed writes of `inode` (record `raw`):
    /// written back (now counted as usage) or dropped.
    pub(crate) fn quota_unreserve(&self, inode: &Inode, raw: &[u8], blocks: u64) {
        if !self.quota.enforced() || blocks == 0 {
            return;
        }
        let Some(c) = self.quota_charge(inode, raw) else { return };
        let bytes = blocks.saturating_mul(u64::from(self.sbi.block_size));
        for ty in (0..TYPES).filter(|&ty| self.quota.enforce[ty]) {
            self.quota.rsv[ty].sub(c.ids[ty], bytes);
        }
    }

    /// Where usage of type `ty` grows past a soft limit with no grace time running, the
    /// grace time to start now (`check_bdq`/`check_idq` with `DQUOT_SPACE_WARN`): space and
    /// inodes, each `None` to leave alone.
    pub(crate) fn quota_grace_starts(
        &self,
        ty: usize,
        d: &DiskDquot,
        space: i64,
        inodes: i64,
    ) -> [Option<u64>; 2] {
        let Some(qf) = self.quota.files[ty].as_ref().filter(|_| self.quota.enforce[ty]) else {
            return [None, None];
        };
        let [bgrace, igrace] = qf.grace();
        let t = now();
        let soft = d.dqb_bsoftlimit.get().saturating_mul(QT_BLOCK as u64);
        let b = (space > 0 && soft != 0 && d.dqb_curspace.get() > soft && d.dqb_btime.get() == 0)
            .then(|| t + bgrace);
        let soft = d.dqb_isoftlimit.get();
        let running = super::report::inode_grace_end(d) != 0;
        let i = (inodes > 0 && soft != 0 && d.dqb_curinodes.get() > soft && !running).then(|| t + igrace);
        [b, i]
    }
}

impl FsInner {
    /// `statfs` from inside directory `inode`: where project limits are enforced and the
    /// directory passes its project on (`PROJINHERIT`), the counts are the project's, each
    /// bounded by the filesystem's (`ext4_statfs_project`): its space limit (soft, else hard)
    /// as the size and what is left of it as free, the same for inodes.
    pub(crate) fn quota_statfs_project(&self, inode: &Inode, st: &mut crate::attr::StatFs) -> Result<()> {
        const PRJ: usize = 2;
        if !self.quota.enforce[PRJ] || inode.flags() & rext4_format::inode::PROJINHERIT_FL == 0 {
            return Ok(());
        }
        let prj = Self::quota_ids(inode)[PRJ];
        let Some(d) = self.quota_limited(PRJ, prj)? else { return Ok(()) };
        let min_not_zero = |a: u64, b: u64| if a == 0 || b == 0 { a.max(b) } else { a.min(b) };
        let bs = u64::from(self.sbi.block_size);
        let k = QT_BLOCK as u64;
        let limit = min_not_zero(d.dqb_bsoftlimit.get(), d.dqb_bhardlimit.get()).saturating_mul(k) / bs;
        if limit != 0 {
            let used = d.dqb_curspace.get().saturating_add(self.quota.rsv[PRJ].get(prj)) / bs;
            let left = limit.saturating_sub(used);
            st.blocks = st.blocks.min(limit);
            st.blocks_free = st.blocks_free.min(left);
            st.blocks_avail = st.blocks_avail.min(left);
        }
        let limit = min_not_zero(d.dqb_isoftlimit.get(), d.dqb_ihardlimit.get());
        if limit != 0 {
            st.files = st.files.min(limit);
            st.files_free = st.files_free.min(limit.saturating_sub(d.dqb_curinodes.get()));
        }
        Ok(())
    }
}
