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
//! Usage is charged when the record holding it is written, after the check: a check counts
//! the entry's usage and what is held for the id in memory ([`Pending`]: delayed writes'
//! reservations, and changes admitted and not charged yet), and adds what it grants, under
//! the id's lock, as the kernel checks and charges under `dq_dqb_lock`. What a change was
//! granted is its inode's [`Claim`] until the inode's record write charges it (released after
//! the charge) or the change fails, so writers of one id racing each other never pass its
//! limits together.
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
use std::sync::atomic::Ordering;

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

/// Shards of the pending tables: writers of different ids, and changes of different inodes,
/// rarely share a lock.
const SHARDS: usize = 16;

/// What one id of one quota type holds beyond its entry's usage: admitted against its limits
/// and not charged yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Held {
    /// Bytes reserved by delayed writes (`dqb_rsvspace`), until written back or dropped.
    rsv: u64,
    /// Bytes and inodes of changes admitted and not charged yet (their [`Claim`]s).
    space: u64,
    inodes: u64,
}

/// One quota type's [`Held`] amounts by id. [each shard its own lock; taken in type order
/// (user, group, project), one shard per type at most, before a quota file's buffers]
#[derive(Default)]
pub(crate) struct Pending([Mutex<HashMap<u32, Held>>; SHARDS]);

impl Pending {
    fn shard(&self, id: u32) -> &Mutex<HashMap<u32, Held>> {
        &self.0[id as usize % SHARDS]
    }

    fn get(&self, id: u32) -> Held {
        self.shard(id).lock().get(&id).copied().unwrap_or_default()
    }

    /// Takes back `space` bytes and `inodes` inodes held for `id` (as a reservation where
    /// `rsv`).
    fn release(&self, id: u32, space: u64, inodes: u64, rsv: bool) {
        let mut m = self.shard(id).lock();
        if let Some(h) = m.get_mut(&id) {
            if rsv {
                h.rsv = h.rsv.saturating_sub(space);
            } else {
                h.space = h.space.saturating_sub(space);
                h.inodes = h.inodes.saturating_sub(inodes);
            }
            // Kept at zero: the id's next admission finds its place without inserting.
        }
    }
}

/// A change admitted for one inode and not charged yet (kept in `Inode::quota_claims` until
/// the inode's next record write charges it, or the change fails): the ids it is held under
/// (per type, `None` where it holds nothing), its bytes and its inodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Claim {
    ids: [Option<u32>; TYPES],
    space: u64,
    inodes: u64,
}

/// What a change asks of its ids' limits.
#[derive(Clone, Copy)]
struct Ask {
    /// Bytes: all of them, or with `shrink` (a unit) as many whole units as fit, at least one.
    space: u64,
    shrink: Option<u64>,
    inodes: u64,
    /// Held as a delayed write's reservation, not as a claim.
    rsv: bool,
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

    /// Checks `ask` against the limits of `ids` (per type; `None`: not concerned) and holds
    /// what it grants in the pending tables, in one critical section per id (the kernel's
    /// check and charge under `dq_dqb_lock`): the bytes granted, fewer than asked only with
    /// `shrink`; `EDQUOT` when nothing fits. A caller passing limits is granted all, and its
    /// change is held too, so that others count it.
    ///
    /// Why this cannot be passed by racing writers: every admission of an id reads the entry's
    /// usage and what is held under the id's shard lock and adds to what is held before
    /// unlocking; a charge adds to the entry's usage before its claim is released (under the
    /// same lock), so an admission sees a change in usage, in the held amounts, or in both.
    fn quota_admit(&self, ids: [Option<u32>; TYPES], ask: Ask) -> Result<u64> {
        let ids: [Option<u32>; TYPES] = std::array::from_fn(|ty| ids[ty].filter(|_| self.quota.enforce[ty]));
        // Each entry's place is found before any lock is taken (it never changes once made);
        // its buffer is taken from the cache under the lock, where a charge finds it too.
        let slots: [Option<super::tree::Slot>; TYPES] =
            std::array::from_fn(|ty| ids[ty].and_then(|id| self.quota.files[ty].as_ref()?.slot(id)));
        // In type order, one shard of each type's own table: no two admissions wait on
        // each other in a cycle.
        let mut locked: [Option<_>; TYPES] =
            std::array::from_fn(|ty| ids[ty].map(|id| self.quota.pending[ty].shard(id).lock()));
        let mut grant = ask.space;
        if !ignoring() {
            let t = now();
            for ty in 0..TYPES {
                let (Some(id), Some(m), Some(slot)) = (ids[ty], &locked[ty], slots[ty]) else { continue };
                let d = self.quota_entry(slot)?;
                let held = m.get(&id).copied().unwrap_or_default();
                if ask.inodes > 0 {
                    let lim = limit(d.dqb_ihardlimit.get(), d.dqb_isoftlimit.get(), d.dqb_itime.get(), t);
                    let used = d.dqb_curinodes.get().saturating_add(held.inodes);
                    if lim.is_some_and(|l| used.saturating_add(ask.inodes) > l) {
                        return Err(Error::QuotaExceeded);
                    }
                }
                let k = QT_BLOCK as u64;
                let lim = limit(
                    d.dqb_bhardlimit.get().saturating_mul(k),
                    d.dqb_bsoftlimit.get().saturating_mul(k),
                    d.dqb_btime.get(),
                    t,
                );
                if let (true, Some(l)) = (ask.space > 0, lim) {
                    let used = d.dqb_curspace.get().saturating_add(held.rsv).saturating_add(held.space);
                    let room = l.saturating_sub(used);
                    grant = match ask.shrink {
                        Some(unit) => grant.min(room / unit * unit),
                        None if room < ask.space => 0,
                        None => grant,
                    };
                }
            }
            if ask.space > 0 && grant == 0 {
                return Err(Error::QuotaExceeded);
            }
        }
        for ty in 0..TYPES {
            let (Some(id), Some(m)) = (ids[ty], &mut locked[ty]) else { continue };
            let h = m.entry(id).or_default();
            if ask.rsv {
                h.rsv = h.rsv.saturating_add(grant);
            } else {
                h.space = h.space.saturating_add(grant);
                h.inodes = h.inodes.saturating_add(ask.inodes);
            }
        }
        Ok(grant)
    }

    /// Admits `ask` for `inode` and keeps it as the inode's claim.
    fn quota_admit_for(&self, inode: &Inode, ids: [Option<u32>; TYPES], ask: Ask) -> Result<u64> {
        let granted = self.quota_admit(ids, ask)?;
        Self::quota_claim_attach(inode, Claim { ids, space: granted, inodes: ask.inodes });
        Ok(granted)
    }

    /// Keeps `c` as a claim of `inode`, charged by its next record write.
    fn quota_claim_attach(inode: &Inode, c: Claim) {
        let mut claims = inode.quota_claims.lock();
        claims.push(c);
        inode.quota_claimed.store(true, Ordering::Release);
    }

    /// Takes back what claim `c` holds.
    fn quota_claim_release(&self, c: Claim) {
        for (ty, id) in c.ids.iter().enumerate() {
            if let Some(id) = *id {
                self.quota.pending[ty].release(id, c.space, c.inodes, false);
            }
        }
    }

    /// Ends the claims of `inode`: its record was just written (`mark_inode_dirty`, after the
    /// charge, so that no admission sees neither), it is freed, or the change failed.
    pub(crate) fn quota_settle(&self, inode: &Inode) {
        // The enforcement flags first: every record write comes here, and the inode's flag
        // lies on a line of its own.
        if !self.quota.enforced() || !inode.quota_claimed.load(Ordering::Acquire) {
            return;
        }
        let mut claims = inode.quota_claims.lock();
        inode.quota_claimed.store(false, Ordering::Release);
        for c in claims.iter() {
            self.quota_claim_release(*c);
        }
        // Emptied with its capacity kept: the next claim of this inode allocates nothing.
        claims.clear();
    }

    /// Takes back `blocks` blocks of the data claims of `inode` that were not allocated after
    /// all (the allocator found fewer, or mapping them failed).
    pub(crate) fn quota_unclaim_blocks(&self, inode: &Inode, blocks: u64) {
        if blocks == 0 || !inode.quota_claimed.load(Ordering::Acquire) {
            return;
        }
        let mut left = blocks.saturating_mul(u64::from(self.sbi.block_size));
        let mut claims = inode.quota_claims.lock();
        for c in claims.iter_mut().rev().filter(|c| c.inodes == 0) {
            let n = left.min(c.space);
            c.space -= n;
            left -= n;
            self.quota_claim_release(Claim { space: n, ..*c });
            if left == 0 {
                break;
            }
        }
        claims.retain(|c| c.space > 0 || c.inodes > 0);
        if claims.is_empty() {
            inode.quota_claimed.store(false, Ordering::Release);
        }
    }

    /// How many of `want` blocks the file `inode` (record `raw`) may be given now; `EDQUOT`
    /// when none (`dquot_alloc_block`, with `ext4_mb_new_blocks`'s shrinking request). What
    /// it grants is the inode's claim until its record is written: a caller that ends up
    /// with fewer blocks gives the rest back ([`FsInner::quota_unclaim_blocks`]).
    pub(crate) fn quota_blocks_allowed(&self, inode: &Inode, raw: &[u8], want: u64) -> Result<u64> {
        if !self.quota.enforced() {
            return Ok(want);
        }
        let Some(c) = self.quota_charge(inode, raw) else { return Ok(want) };
        let bs = u64::from(self.sbi.block_size);
        // With bigalloc a new block may take a cluster: asked and shrunk by whole clusters.
        let unit = self.sbi.c2b(1);
        let want = want.div_ceil(unit) * unit;
        let ask = Ask { space: want.saturating_mul(bs), shrink: Some(unit * bs), inodes: 0, rsv: false };
        Ok(self.quota_admit_for(inode, c.ids.map(Some), ask)? / bs)
    }

    /// Checks that the inode `ino` (record `raw`) may take one more block for its extended
    /// attributes, a new or a shared one (`ext4_xattr_block_set`'s `dquot_alloc_block`).
    pub(crate) fn quota_xattr_block_check(&self, ino: rext4_format::InodeNo, raw: &[u8]) -> Result<()> {
        if !self.quota.enforced() {
            return Ok(());
        }
        let Some(c) = self.quota_charge_ino(ino.0, raw) else { return Ok(()) };
        // A cluster with bigalloc.
        let ask = Ask { space: self.sbi.cluster_bytes(), shrink: None, inodes: 0, rsv: false };
        self.quota_admit_for(&*self.iget(ino)?, c.ids.map(Some), ask).map(|_| ())
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
        if !self.quota.enforced() {
            return Ok(());
        }
        let Some(c) = self.quota_charge_ino(ino.0, raw) else { return Ok(()) };
        // Whole clusters with bigalloc (`round_up_cluster`).
        let unit = self.sbi.cluster_bytes();
        let space = len.div_ceil(unit).saturating_mul(unit);
        let ask = Ask { space, shrink: None, inodes: 1, rsv: false };
        self.quota_admit_for(&*self.iget(ino)?, c.ids.map(Some), ask).map(|_| ())
    }

    /// Checks that one more inode of `ids` (user, group, project) fits (`dquot_alloc_inode`)
    /// and holds it: the claim goes to the new inode once it has a number
    /// ([`FsInner::quota_inode_claimed`]), or is given back
    /// ([`FsInner::quota_inode_unclaimed`]).
    pub(crate) fn quota_inode_check(&self, ids: [u32; TYPES]) -> Result<Option<Claim>> {
        if !self.quota.enforced() {
            return Ok(None);
        }
        let ids = ids.map(Some);
        let ask = Ask { space: 0, shrink: None, inodes: 1, rsv: false };
        self.quota_admit(ids, ask)?;
        Ok(Some(Claim { ids, space: 0, inodes: 1 }))
    }

    /// The claim of [`FsInner::quota_inode_check`] now belongs to the new inode `inode`.
    pub(crate) fn quota_inode_claimed(inode: &Inode, c: Option<Claim>) {
        if let Some(c) = c {
            Self::quota_claim_attach(inode, c);
        }
    }

    /// The claim of [`FsInner::quota_inode_check`] is given back: no inode was made.
    pub(crate) fn quota_inode_unclaimed(&self, c: Option<Claim>) {
        if let Some(c) = c {
            self.quota_claim_release(c);
        }
    }

    /// Checks that `inode` (record `raw`: one inode and its space) fits in the ids it is
    /// about to move to (`__dquot_transfer`), and holds it there until the record is written.
    /// The caller holds `op_lock` and has written back the file's delayed writes
    /// ([`FsInner::quota_transfer_prepare`]); the record write that follows ends the claim,
    /// whatever its outcome.
    pub(crate) fn quota_transfer_check(&self, inode: &Inode, raw: &[u8], to: [u32; TYPES]) -> Result<()> {
        if !self.quota.enforced() {
            return Ok(());
        }
        let Some(c) = self.quota_charge(inode, raw) else { return Ok(()) };
        let ids: [Option<u32>; TYPES] = std::array::from_fn(|ty| (c.ids[ty] != to[ty]).then_some(to[ty]));
        if ids.iter().all(Option::is_none) {
            return Ok(());
        }
        // The inode, and the values it keeps in EA inodes.
        let inodes = c.inodes + self.block_ea_count(inode.ino, raw)?;
        let ask = Ask { space: c.space, shrink: None, inodes, rsv: false };
        self.quota_admit_for(inode, ids, ask).map(|_| ())
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
        let bs = u64::from(self.sbi.block_size);
        let ask = Ask { space: blocks.saturating_mul(bs), shrink: None, inodes: 0, rsv: true };
        match self.quota_admit(c.ids.map(Some), ask) {
            Ok(_) => Ok(true),
            Err(Error::QuotaExceeded) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives back `blocks` blocks reserved for the delayed writes of `inode` (record `raw`):
    /// dropped, or written back, in which case the record write that charged them came
    /// first.
    pub(crate) fn quota_unreserve(&self, inode: &Inode, raw: &[u8], blocks: u64) {
        if !self.quota.enforced() || blocks == 0 {
            return;
        }
        let Some(c) = self.quota_charge(inode, raw) else { return };
        let bytes = blocks.saturating_mul(u64::from(self.sbi.block_size));
        for ty in (0..TYPES).filter(|&ty| self.quota.enforce[ty]) {
            self.quota.pending[ty].release(c.ids[ty], bytes, 0, true);
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
            let held = self.quota.pending[PRJ].get(prj);
            let used = d.dqb_curspace.get().saturating_add(held.rsv).saturating_add(held.space) / bs;
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
