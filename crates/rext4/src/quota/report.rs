//! Reading and setting quota entries as `repquota` and `setquota` do through `quotactl`, for
//! images (a FUSE mount has no `quotactl`): every id's usage, limits and grace times from any
//! open, read-only too, and limits set on a writable one, with the kernel's rules for grace
//! times (`do_set_dqblk`). Limits bind opens that enforce them (quota/limits.rs; the kernel
//! mounted with `usrquota`/`grpquota`/`prjquota`, or rext4's mount with the same options).

use super::tree::QuotaFile;
use crate::error::{Error, Result};
use crate::fs::{Fs, FsInner};
use rext4_format::quota::{DiskDquot, ENTRY, QT_BLOCK};
use zerocopy::FromBytes;

/// A quota type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuotaType {
    User,
    Group,
    Project,
}

impl QuotaType {
    fn index(self) -> usize {
        match self {
            QuotaType::User => 0,
            QuotaType::Group => 1,
            QuotaType::Project => 2,
        }
    }
}

/// Limits of one id: space in KiB (the quota format's unit), inodes in inodes; 0 is none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaLimits {
    pub space_soft_kib: u64,
    pub space_hard_kib: u64,
    pub inodes_soft: u64,
    pub inodes_hard: u64,
}

/// One id's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaEntry {
    pub id: u32,
    /// Bytes in use.
    pub space: u64,
    /// Inodes in use.
    pub inodes: u64,
    pub limits: QuotaLimits,
    /// When the space grace period ends, in seconds since the epoch (0: not over the soft
    /// limit).
    pub space_grace_end: u64,
    /// When the inode grace period ends (0: not over the soft limit).
    pub inodes_grace_end: u64,
}

/// A quota file's contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaReport {
    /// Grace periods, in seconds.
    pub space_grace: u32,
    pub inodes_grace: u32,
    /// Every id with an entry, in id order.
    pub entries: Vec<QuotaEntry>,
}

impl From<&DiskDquot> for QuotaEntry {
    fn from(d: &DiskDquot) -> Self {
        QuotaEntry {
            id: d.dqb_id.get(),
            space: d.dqb_curspace.get(),
            inodes: d.dqb_curinodes.get(),
            limits: QuotaLimits {
                space_soft_kib: d.dqb_bsoftlimit.get(),
                space_hard_kib: d.dqb_bhardlimit.get(),
                inodes_soft: d.dqb_isoftlimit.get(),
                inodes_hard: d.dqb_ihardlimit.get(),
            },
            space_grace_end: d.dqb_btime.get(),
            inodes_grace_end: inode_grace_end(d),
        }
    }
}

/// When `d`'s inode grace time ends (0: none runs). An entry otherwise all zero has an inode
/// time of 1 to mark it in use, which is no grace time.
pub(super) fn inode_grace_end(d: &DiskDquot) -> u64 {
    match d.dqb_itime.get() {
        1 if d.dqb_isoftlimit.get() == 0 => 0,
        t => t,
    }
}

impl FsInner {
    /// The entry at `slot`'s place.
    pub(super) fn quota_entry(&self, slot: super::tree::Slot) -> Result<DiskDquot> {
        let buf = self.bcache.get(slot.pblk)?;
        let data = buf.data();
        let off = slot.off as usize;
        DiskDquot::read_from_bytes(&data[off..off + ENTRY]).map_err(|_| Error::InvalidInput("quota entry"))
    }

    fn quota_report(&self, qf: &QuotaFile) -> Result<QuotaReport> {
        let mut entries = Vec::new();
        for (_, slot) in qf.slots() {
            entries.push(QuotaEntry::from(&self.quota_entry(slot)?));
        }
        let info = qf.info();
        Ok(QuotaReport { space_grace: info.dqi_bgrace.get(), inodes_grace: info.dqi_igrace.get(), entries })
    }
}

impl Fs {
    /// Every entry of quota file `ty` (`repquota`), or `None` where the filesystem keeps no
    /// such file. A damaged file is `EUCLEAN`. Read from the file as it is now, changes not
    /// yet committed included; delayed writes are written back first, so that their blocks
    /// count (the kernel counts their reservations).
    pub fn quota_report(&self, ty: QuotaType) -> Result<Option<QuotaReport>> {
        let inner = &self.inner;
        let ino = inner.quota_inums()[ty.index()];
        if ino == 0 {
            return Ok(None);
        }
        if inner.quota.is_on() {
            inner.writeback_all()?;
        }
        match &inner.quota.files[ty.index()] {
            Some(qf) => inner.quota_report(qf).map(Some),
            // Not loaded (a read-only open): read the file now.
            None => inner.quota_report(&inner.quota_file_load(ty.index(), ino)?).map(Some),
        }
    }

    /// Sets the grace periods of quota file `ty`, in seconds (`setquota -t`, `Q_SETINFO`):
    /// how long usage may stay over a soft limit, for space and for inodes, for grace times
    /// that start from now on (those running keep their ends, as in the kernel). `EROFS` on
    /// a read-only open, `EOPNOTSUPP` where the filesystem keeps no such file.
    pub fn set_quota_grace(&self, ty: QuotaType, space_secs: u32, inodes_secs: u32) -> Result<()> {
        let inner = &self.inner;
        inner.op(crate::fs::stats::Op::SetQuota, || {
            let journal = inner.journal()?.clone();
            let Some(qf) = &inner.quota.files[ty.index()] else {
                return Err(Error::NotSupported("no quota file of that type".into()));
            };
            let h = journal.start(2)?;
            inner.quota_set_grace(&h, qf, space_secs, inodes_secs)
        })
    }

    /// Sets the limits of `id` in quota file `ty` (`setquota`), adding its entry if it has
    /// none. As the kernel's `do_set_dqblk`: a grace time starts now where usage is over a new
    /// soft limit, and ends where it is not (delayed writes are written back first, as for
    /// [`Fs::quota_report`]). `EROFS` on a read-only open, `EOPNOTSUPP` where the filesystem
    /// keeps no such file.
    pub fn set_quota_limits(&self, ty: QuotaType, id: u32, limits: QuotaLimits) -> Result<QuotaEntry> {
        let inner = &self.inner;
        inner.op(crate::fs::stats::Op::SetQuota, || {
            let journal = inner.journal()?.clone();
            // A writable open loads every quota file the filesystem keeps.
            let Some(qf) = &inner.quota.files[ty.index()] else {
                return Err(Error::NotSupported("no quota file of that type".into()));
            };
            let kib =
                |v: u64| v.checked_mul(QT_BLOCK as u64).ok_or(Error::InvalidInput("quota limit too large"));
            kib(limits.space_soft_kib)?;
            kib(limits.space_hard_kib)?;
            // Usage decides the grace times: delayed writes count once written back.
            inner.writeback_all()?;
            let h = journal.start(8)?;
            let slot = inner.quota_slot(&h, qf, id)?;
            let [bgrace, igrace] = qf.grace();
            let now = u64::try_from(inner.now().sec).unwrap_or(0);
            let buf = inner.bcache.get(slot.pblk)?;
            let mut b = h.write(&buf)?;
            let off = slot.off as usize;
            let mut d = DiskDquot::read_from_bytes(&b[off..off + ENTRY])
                .map_err(|_| Error::InvalidInput("quota entry"))?;
            d.dqb_bsoftlimit.set(limits.space_soft_kib);
            d.dqb_bhardlimit.set(limits.space_hard_kib);
            d.dqb_isoftlimit.set(limits.inodes_soft);
            d.dqb_ihardlimit.set(limits.inodes_hard);
            // Cannot overflow: checked above.
            let soft = limits.space_soft_kib * QT_BLOCK as u64;
            let over = soft != 0 && d.dqb_curspace.get() > soft;
            d.dqb_btime.set(if over { now + bgrace } else { 0 });
            let over = limits.inodes_soft != 0 && d.dqb_curinodes.get() > limits.inodes_soft;
            d.dqb_itime.set(if over { now + igrace } else { 0 });
            b[off..off + ENTRY].copy_from_slice(&d.to_disk());
            Ok(QuotaEntry::from(&d))
        })
    }
}
