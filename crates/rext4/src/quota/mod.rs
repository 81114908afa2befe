//! Disk quotas (the kernel's `fs/quota/dquot.c` and ext4's quota inodes in `super.c`): with the
//! `quota` feature, space and inodes used per user, group and (with `project`) project are kept
//! in hidden quota files, changed in the same handle as the inode records they count, so a
//! commit never holds one without the other.
//!
//! | module | owns |
//! |---|---|
//! | this file | `Quotas`, what a record is charged, moving usage as records change |
//! | `tree` | one quota file: the v2 tree of entries, adding ids |
//! | `limits` | enforcing limits: `EDQUOT`, grace times, delayed writes' reservations |
//! | `report` | every id's entry for `repquota`, limits set as `setquota` does |
//!
//! What is counted is what e2fsck counts (pass 1): every inode in use from the root and the
//! first non-reserved inode on, but the project quota file, the orphan file and EA inodes,
//! each charged `i_blocks` in bytes and one inode to its owner, its group and its project,
//! plus one inode more for each of its attribute entries whose value lives in an EA inode
//! (those values' blocks being in its `i_blocks` already; the kernel's
//! `ext4_xattr_inode_alloc_quota` and `ext4_get_inode_usage`). EA inodes themselves are
//! charged to nobody. Limits are enforced only where the open asks for it (`limits`; the
//! kernel's `usrquota`/`grpquota`/`prjquota` mount options), and kept as they are otherwise.
//!
//! Charges follow the records: [`FsInner::mark_inode_dirty`] compares the record it writes with
//! the one in the inode table (the last one written) and moves the difference; a new inode's
//! first write charges it whole, and [`FsInner::quota_free_inode`] takes it back when it is
//! freed. The EA-inode entries of an inode's xattr block are not in its record: the block's
//! changes charge them as they make or drop them ([`FsInner::quota_add_inodes`]), and a change
//! of owner moves them with the rest. Entries for new ids are added before the record changes
//! ([`FsInner::quota_prepare`]), so that adding one (which may grow the quota file) does not
//! happen under another inode's record lock; a missing entry is still added when charged.
//!
//! # Locking
//! Charges run under the caller's handle and `Inode::raw` (write) of the inode charged, then
//! take `QuotaFile::entries` (read) and the entry's quota-file buffer. Adding an entry takes
//! `QuotaFile::tree`, then the quota inode's `data_sem` and `raw`, then buffers; the quota
//! inodes are never charged, so their locks are always the last inode locks taken.

pub(crate) mod limits;
pub(crate) mod report;
pub(crate) mod tree;

use crate::error::{Error, Result};
use crate::fs::FsInner;
use crate::inode::write::rec_ref;
use crate::inode::Inode;
use crate::jbd2::transaction::Handle;
use rext4_format::features::RoCompat;
use rext4_format::inode::{EA_INODE_FL, HUGE_FILE_FL};
use std::sync::atomic::Ordering;
use tree::QuotaFile;

/// Quota types, as the kernel numbers them.
pub(crate) const TYPES: usize = 3;

/// The quota files of a writable filesystem with the `quota` feature (none otherwise).
#[derive(Default)]
pub(crate) struct Quotas {
    /// User, group and project files, where the superblock names one. [immutable after open;
    /// locks inside]
    files: [Option<QuotaFile>; TYPES],
    /// Inodes never charged besides the reserved ones: the quota files (wherever the
    /// superblock puts them: a quota inode charged to itself would add entries to its own tree
    /// while the tree is locked) and the orphan file (0: none). [immutable]
    exempt: [u32; 4],
    /// Types whose limits are enforced (only where their file is loaded). [immutable]
    enforce: [bool; TYPES],
    /// Reservations of delayed writes and changes admitted against limits and not charged
    /// yet, per type and id (kept where limits are enforced).
    pending: [limits::Pending; TYPES],
}

/// What a record is charged: its user, group and project, its space in bytes, and its
/// inodes (itself and the EA-inode values its in-inode area names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Charge {
    ids: [u32; TYPES],
    space: u64,
    inodes: u64,
}

impl Quotas {
    /// Whether any usage is kept.
    pub(crate) fn is_on(&self) -> bool {
        self.files.iter().any(Option::is_some)
    }
}

impl FsInner {
    /// Opens the quota files at a writable open (`ext4_enable_quotas`), before anything is
    /// freed or replayed. A damaged quota file fails the open, as the kernel fails the mount.
    /// `enforce`: the types whose limits the open enforces; asking for any on a filesystem
    /// without the `quota` feature is refused (rext4 keeps no quota files outside it).
    pub(crate) fn load_quotas(&self, enforce: limits::QuotaEnforcement) -> Result<Quotas> {
        let sb = &self.sbi.sb;
        if !sb.ro_compat().contains(RoCompat::QUOTA) {
            if enforce.any() {
                return Err(Error::NotSupported(
                    "quota limits need the quota feature (tune2fs -O quota, or mkfs -O quota)".into(),
                ));
            }
            return Ok(Quotas::default());
        }
        let inums = self.quota_inums();
        let exempt = [inums[0], inums[1], sb.s_prj_quota_inum.get(), sb.s_orphan_file_inum.get()];
        let mut q = Quotas { exempt, ..Default::default() };
        for (ty, &ino) in inums.iter().enumerate() {
            if ino != 0 {
                q.files[ty] = Some(self.quota_file_load(ty, ino)?);
                q.enforce[ty] = enforce.types()[ty];
            }
        }
        Ok(q)
    }

    /// The user, group and project quota files' inodes where usage is kept (0: none): those
    /// the superblock names under the `quota` feature, project only where inodes carry a
    /// project.
    pub(crate) fn quota_inums(&self) -> [u32; TYPES] {
        let sb = &self.sbi.sb;
        if !sb.ro_compat().contains(RoCompat::QUOTA) {
            return [0; TYPES];
        }
        let prj = if sb.ro_compat().contains(RoCompat::PROJECT) { sb.s_prj_quota_inum.get() } else { 0 };
        [sb.s_usr_quota_inum.get(), sb.s_grp_quota_inum.get(), prj]
    }

    /// What the record `raw` of inode `inode` is charged; `None` for inodes no quota counts.
    pub(crate) fn quota_charge(&self, inode: &Inode, raw: &[u8]) -> Option<Charge> {
        self.quota_charge_ino(inode.ino.0, raw)
    }

    /// [`FsInner::quota_charge`] of the record `raw` of inode number `ino`.
    pub(crate) fn quota_charge_ino(&self, ino: u32, raw: &[u8]) -> Option<Charge> {
        let first = self.sbi.sb.first_ino();
        if (ino < first && ino != rext4_format::types::ROOT_INO.0) || self.quota.exempt.contains(&ino) {
            return None;
        }
        let r = rec_ref(raw);
        if r.flags() & EA_INODE_FL != 0 {
            return None;
        }
        let unit = if self.sbi.huge_file && r.flags() & HUGE_FILE_FL != 0 {
            u64::from(self.sbi.block_size)
        } else {
            512
        };
        let ea = if self.sbi.ea_inode {
            crate::xattr::area::ibody_area(raw).map_or(0, |a| crate::xattr::area::ea_entry_count(a, 0))
        } else {
            0
        };
        Some(Charge {
            ids: [r.uid(), r.gid(), r.projid()],
            space: r.blocks().saturating_mul(unit),
            inodes: 1 + ea,
        })
    }

    /// The user, group and project inode `inode` is charged to.
    pub(crate) fn quota_ids(inode: &Inode) -> [u32; TYPES] {
        let raw = inode.raw();
        let r = rec_ref(&raw);
        [r.uid(), r.gid(), r.projid()]
    }

    /// Makes sure each of `ids` (user, group, project) has an entry, adding missing ones under
    /// `h`: called before a record that may name new ids is locked (a new inode, a `chown`).
    pub(crate) fn quota_prepare(&self, h: &Handle, ids: [u32; TYPES]) -> Result<()> {
        for (qf, id) in self.quota.files.iter().zip(ids) {
            if let Some(qf) = qf {
                self.quota_slot(h, qf, id)?;
            }
        }
        Ok(())
    }

    /// Moves usage for inode `inode` whose record goes from the one last written (charged
    /// `old`) to `new`, under `h` (called by `mark_inode_dirty` where quotas are on). A new
    /// inode's first write charges the whole record and one inode.
    /// The claims the record's change was admitted under (limits.rs) end after this, in
    /// `mark_inode_dirty`.
    pub(crate) fn quota_update(
        &self,
        h: &Handle,
        inode: &Inode,
        old: Option<Charge>,
        new: &[u8],
    ) -> Result<()> {
        let Some(to) = self.quota_charge(inode, new) else { return Ok(()) };
        let from = if inode.quota_new.swap(false, Ordering::AcqRel) { None } else { old };
        if from == Some(to) {
            return Ok(());
        }
        // Cannot overflow in practice: i_blocks is 48 bits of 512 bytes (2^57 bytes), and a
        // record names fewer EA inodes than it has bytes.
        let space = |c: &Charge| i64::try_from(c.space).unwrap_or(i64::MAX);
        let inodes = |c: &Charge| i64::try_from(c.inodes).unwrap_or(i64::MAX);
        // The xattr block's EA-inode values move with the inode to a new owner. (A change of
        // owner and of attributes never share one record write, so the block `new` names is
        // the one the old record named.)
        let mut in_block = None;
        for (ty, qf) in self.quota.files.iter().enumerate() {
            let Some(qf) = qf else { continue };
            let id = to.ids[ty];
            match from {
                Some(f) if f.ids[ty] == id => {
                    let (ds, di) = (space(&to) - space(&f), inodes(&to) - inodes(&f));
                    if ds != 0 || di != 0 {
                        let s = self.quota_slot(h, qf, id)?;
                        self.quota_add(h, ty, s, ds, di)?;
                    }
                }
                _ => {
                    if let Some(f) = from {
                        let b = match in_block {
                            Some(b) => b,
                            None => *in_block
                                .insert(i64::try_from(self.block_ea_count(inode.ino, new)?).unwrap_or(0)),
                        };
                        let s = self.quota_slot(h, qf, f.ids[ty])?;
                        self.quota_add(h, ty, s, -space(&f), -inodes(&f) - b)?;
                        let s = self.quota_slot(h, qf, id)?;
                        self.quota_add(h, ty, s, space(&to), inodes(&to) + b)?;
                    } else {
                        let s = self.quota_slot(h, qf, id)?;
                        self.quota_add(h, ty, s, space(&to), inodes(&to))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Charges `delta` inodes (may be negative) to the ids of inode `ino`'s record `raw`
    /// under `h`: EA-inode values its xattr block gained or lost (`ext4_xattr_inode_alloc_quota`,
    /// `ext4_xattr_inode_free_quota`).
    pub(crate) fn quota_add_inodes(
        &self,
        h: &Handle,
        ino: rext4_format::InodeNo,
        raw: &[u8],
        delta: i64,
    ) -> Result<()> {
        if delta == 0 || !self.quota.is_on() {
            return Ok(());
        }
        let Some(c) = self.quota_charge_ino(ino.0, raw) else { return Ok(()) };
        for (ty, qf) in self.quota.files.iter().enumerate() {
            if let Some(qf) = qf {
                let s = self.quota_slot(h, qf, c.ids[ty])?;
                self.quota_add(h, ty, s, 0, delta)?;
            }
        }
        Ok(())
    }

    /// Takes back the inode a freed record (`raw`, already written with its blocks gone, so
    /// charged by that write if it was new) was charged (`dquot_free_inode`), under `h`.
    pub(crate) fn quota_free_inode(&self, h: &Handle, inode: &Inode, raw: &[u8]) -> Result<()> {
        if !self.quota.is_on() {
            return Ok(());
        }
        self.quota_settle(inode);
        let Some(c) = self.quota_charge(inode, raw) else { return Ok(()) };
        let space = i64::try_from(c.space).unwrap_or(i64::MAX);
        let inodes = i64::try_from(c.inodes).unwrap_or(i64::MAX);
        for (ty, qf) in self.quota.files.iter().enumerate() {
            if let Some(qf) = qf {
                let s = self.quota_slot(h, qf, c.ids[ty])?;
                self.quota_add(h, ty, s, -space, -inodes)?;
            }
        }
        Ok(())
    }
}
