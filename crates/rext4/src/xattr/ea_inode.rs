//! Values in EA inodes (`ea_inode`; the kernel's `ext4_xattr_inode_create`,
//! `ext4_xattr_inode_write`, `ext4_xattr_inode_update_ref`): a value too large for an xattr
//! area lives in the data blocks of an inode of its own, flagged `EA_INODE_FL` and named by
//! no directory. The entry keeps the inode's number and the value's size; the EA inode keeps
//! the value's crc32c hash in `i_atime` and a 64-bit reference count in `i_ctime` (high word)
//! and `l_i_version` (low word), one per entry naming it (an xattr block counts once however
//! many inodes share it). It is freed with its last reference.
//!
//! As the kernel does, equal values share one EA inode: EA inodes made or read are recorded by
//! value hash (`ea_inode_cache`, cache/mbcache.rs), and a new value equal to a recorded one takes a
//! reference to it instead of a new inode (`ext4_xattr_inode_lookup_create`). rext4 never
//! shares an xattr block that names EA inodes, and copying one (to change it for one of the
//! inodes sharing it) takes a reference for each of the copy's entries.
//!
//! Old Lustre EA inodes have no reference count and no value hash: their `i_mtime` points back
//! to the one inode naming them and their generation is that inode's. As the kernel
//! (`ext4_xattr_inode_iget`) does, such an inode counts as holding one reference, and as
//! e2fsck does, its value is not charged to its owner's `i_blocks`.
//!
//! Value blocks are written like file data, before the handle's transaction commits; the
//! entry naming them commits with the inode and its map.
//!
//! # Locking
//! An EA inode's record is taken after its owner's: EA inodes own no attributes themselves,
//! so the order has no cycle.

use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::FsInner;
use crate::inode::write::{raw_set_size, rec};
use crate::inode::Inode;
use crate::jbd2::transaction::Handle;
use rext4_format::checksum::crc32c;
use rext4_format::inode::{self as fi, Timestamp, EA_INODE_FL};
use rext4_format::inode_record::TimeField;
use rext4_format::xattr::{entry_size, BLOCK_HEADER_SIZE};
use rext4_format::InodeNo;

/// Offset of `l_i_version` (the reference count's low word) in a record.
const OFF_VERSION: usize = 0x24;
/// Offset of `i_ctime` (the reference count's high word).
const OFF_CTIME: usize = 0x0C;
/// Offset of `i_atime` (the value's hash).
const OFF_ATIME: usize = 0x08;
/// Offset of `i_mtime` (a Lustre EA inode's owner).
const OFF_MTIME: usize = 0x10;
/// Offset of `i_generation`.
const OFF_GENERATION: usize = 0x64;

/// The inode whose attribute entries name EA inodes: its number and generation, which tell
/// an old Lustre EA inode of its own.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EaOwner {
    pub ino: InodeNo,
    pub gen: u32,
}

impl EaOwner {
    /// The owner `ino` with record (or record copy) `raw`.
    pub(crate) fn new(ino: InodeNo, raw: &[u8]) -> Self {
        EaOwner { ino, gen: u32_at(raw, OFF_GENERATION) }
    }
}

/// Whether EA inode record `raw` is an old Lustre one belonging to `owner`.
fn raw_is_lustre(raw: &[u8], owner: EaOwner) -> bool {
    u32_at(raw, OFF_MTIME) == owner.ino.0 && u32_at(raw, OFF_GENERATION) == owner.gen
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// The reference count of an EA inode's record.
pub(super) fn raw_ea_refs(raw: &[u8]) -> u64 {
    u64::from(u32_at(raw, OFF_CTIME)) << 32 | u64::from(u32_at(raw, OFF_VERSION))
}

fn raw_set_ea_refs(raw: &mut [u8], refs: u64) {
    // As the kernel's `ext4_xattr_inode_set_ref`: the high half as ctime seconds (its extra
    // word written as for any time), the low half in `i_version_lo`.
    let mut r = rec(raw);
    r.set_time(TimeField::Ctime, Timestamp { sec: (refs >> 32) as i64, nsec: 0 });
    r.set_version_lo(rext4_format::split::lo32(refs));
}

impl FsInner {
    /// The padded value size above which a value goes to an EA inode at once
    /// (`EXT4_XATTR_MIN_LARGE_EA_SIZE`: a block less its header, one short entry and the
    /// terminator).
    pub(super) fn ea_large_value(&self) -> usize {
        self.sbi.block_size as usize - entry_size(3) - BLOCK_HEADER_SIZE - 4
    }

    /// Bytes a value stored in an xattr block must leave for entries on an `ea_inode`
    /// filesystem (`EXT4_XATTR_BLOCK_RESERVE`), 0 without the feature.
    pub(super) fn ea_block_reserve(&self) -> usize {
        if self.sbi.ea_inode {
            (self.sbi.block_size as usize / 8).min(1024)
        } else {
            0
        }
    }

    /// `ext4_xattr_inode_hash`: crc32c of the value with the filesystem's checksum seed.
    pub(super) fn ea_value_hash(&self, value: &[u8]) -> u32 {
        crc32c(self.sbi.csum_seed, value)
    }

    /// A reference to an EA inode holding `value`: one already holding it, or a new one
    /// owned by the owner of `owner` (its record copy `raw`, whose lock the caller holds for
    /// writing), near it. Returns its number and the value's hash.
    pub(super) fn ea_inode_create(
        &self,
        h: &Handle,
        owner: InodeNo,
        raw: &[u8],
        value: &[u8],
    ) -> Result<(u32, u32)> {
        let hash = self.ea_value_hash(value);
        if let Some(ea) = self.ea_inode_share(h, owner, value, hash)? {
            return Ok((ea, hash));
        }
        // As the kernel's `ext4_xattr_inode_create`: made in the root directory, whose project
        // it takes where the root passes one on, with the inode after its owner as goal. (The
        // root's record is the copy when the root is the owner: its lock is held.)
        let root = rext4_format::types::ROOT_INO;
        let projid = if owner == root {
            self.inherited_project(raw)
        } else {
            self.inherited_project(&self.iget(root)?.raw())
        };
        let goal = std::sync::atomic::AtomicU32::new(owner.0 + 1);
        let r = crate::inode::write::rec_ref(raw);
        let (uid, gid) = (r.uid(), r.gid());
        let inode =
            self.new_inode_in(h, root, Some(&goal), fi::S_IFREG | 0o600, uid, gid, 1, projid, false)?;
        match self.ea_inode_init(h, &inode, value, hash) {
            Ok(()) => {
                self.ea_inode_cache.insert(hash, u64::from(inode.ino.0));
                Ok((inode.ino.0, hash))
            }
            Err(e) => {
                self.abandon_new_inode(h, &inode, false)?;
                Err(e)
            }
        }
    }

    /// Takes a reference to a recorded EA inode holding exactly `value` (hash `hash`), if
    /// there is one (`ext4_xattr_inode_cache_find` and `ext4_xattr_inode_inc_ref`).
    fn ea_inode_share(&self, h: &Handle, owner: InodeNo, value: &[u8], hash: u32) -> Result<Option<u32>> {
        for c in self.ea_inode_cache.candidates(hash) {
            let Ok(inode) =
                u32::try_from(c).map_err(|_| Error::NotFound).and_then(|ea| self.ea_iget(owner, ea))
            else {
                self.ea_inode_cache.remove(hash, c);
                continue;
            };
            if inode.size() != value.len() as u64 {
                continue;
            }
            let mut have = vec![0u8; value.len()];
            if self.read_data(&inode, 0, &mut have).ok() != Some(have.len()) || have != value {
                continue;
            }
            // Freeing drops the entry and zeroes the count under this lock first, so a live
            // entry here means the inode (and the value just compared) is still there.
            let mut raw = inode.raw_mut();
            let refs = raw_ea_refs(&raw);
            if !self.ea_inode_cache.contains(hash, c) || refs == 0 || u32_at(&raw, OFF_ATIME) != hash {
                continue;
            }
            raw_set_ea_refs(&mut raw, refs + 1);
            self.mark_inode_dirty(h, &inode, &mut raw)?;
            return Ok(Some(inode.ino.0));
        }
        Ok(None)
    }

    /// Records EA inode `ea` (its record `raw`) by the value hash it stores, for sharing; not
    /// old Lustre ones, which belong to one inode.
    pub(super) fn ea_inode_seen(&self, ea: &Inode, owner: EaOwner) {
        let raw = ea.raw();
        if raw_ea_refs(&raw) != 0 && !raw_is_lustre(&raw, owner) {
            self.ea_inode_cache.insert(u32_at(&raw, OFF_ATIME), u64::from(ea.ino.0));
        }
    }

    /// Makes the new inode an EA inode (flag, hash, one reference), maps its blocks and
    /// writes `value` into them (`ext4_xattr_inode_write`).
    fn ea_inode_init(&self, h: &Handle, inode: &Inode, value: &[u8], hash: u32) -> Result<()> {
        let mut raw = inode.raw_mut();
        let flags = crate::inode::write::raw_flags(&raw) | EA_INODE_FL;
        crate::inode::write::raw_set_flags(&mut raw, flags);
        rec(&mut raw).set_time(TimeField::Atime, Timestamp { sec: i64::from(hash), nsec: 0 });
        raw_set_ea_refs(&mut raw, 1);
        let bs = u64::from(self.sbi.block_size);
        let blocks = (value.len() as u64).div_ceil(bs);
        let mut lblk = 0;
        while lblk < blocks {
            let filled = self.fill_map(h, inode, &mut raw, lblk, blocks, false, false)?;
            self.write_runs(inode, &filled.runs, 0, value)?;
            if filled.reached <= lblk {
                return Err(Error::NoSpace);
            }
            lblk = filled.reached;
        }
        raw_set_size(&mut raw, value.len() as u64);
        self.mark_inode_dirty(h, inode, &mut raw)
    }

    /// EA inode `ea`, named by an entry of `owner`, checked to be one.
    fn ea_iget(&self, owner: InodeNo, ea: u32) -> Result<std::sync::Arc<Inode>> {
        let bad = |what| corrupt(CorruptKind::Xattr { ino: owner, block: None, what });
        if ea == owner.0 || ea < self.sbi.sb.first_ino() || ea > self.sbi.inodes_count {
            return bad("value inode number out of range");
        }
        let inode = self.iget(InodeNo(ea))?;
        if inode.flags() & EA_INODE_FL == 0 {
            return bad("value inode is not an EA inode");
        }
        Ok(inode)
    }

    /// Whether EA inode `ea` is an old Lustre one of `owner`'s (false where it cannot be
    /// read: the caller's use of it reports that).
    pub(super) fn ea_is_lustre(&self, owner: EaOwner, ea: u32) -> bool {
        self.ea_iget(owner.ino, ea).is_ok_and(|i| raw_is_lustre(&i.raw(), owner))
    }

    /// Adds `delta` to EA inode `ea`'s reference count (`ext4_xattr_inode_update_ref`), named
    /// by an entry of `owner`; frees the inode when none is left.
    pub(super) fn ea_inode_ref(&self, h: &Handle, owner: EaOwner, ea: u32, delta: i64) -> Result<()> {
        let inode = self.ea_iget(owner.ino, ea)?;
        let mut raw = inode.raw_mut();
        let held = if raw_is_lustre(&raw, owner) { 1 } else { raw_ea_refs(&raw) };
        let refs = held.checked_add_signed(delta).unwrap_or(0);
        if refs == 0 {
            // Nobody may share it from now on (see `ea_inode_share`).
            self.ea_inode_cache.remove(u32_at(&raw, OFF_ATIME), u64::from(ea));
        }
        raw_set_ea_refs(&mut raw, refs);
        self.mark_inode_dirty(h, &inode, &mut raw)?;
        if refs > 0 {
            return Ok(());
        }
        drop(raw);
        self.delete_inode(h, &inode)
    }

    /// Drops one reference to each EA inode in `eas`, named by `owner`.
    pub(super) fn ea_inodes_put(&self, h: &Handle, owner: EaOwner, eas: &[u32]) -> Result<()> {
        eas.iter().try_for_each(|&ea| self.ea_inode_ref(h, owner, ea, -1))
    }

    /// Drops the references the in-inode area of `inode`, whose last link is gone, holds
    /// (the in-inode half of `ext4_xattr_delete_inode`; the xattr block's go with the block).
    pub(crate) fn ea_inodes_release_ibody(&self, h: &Handle, inode: &Inode) -> Result<()> {
        let (owner, eas) = self.ibody_ea_inodes(inode)?;
        self.ea_inodes_put(h, owner, &eas)
    }

    /// The EA inodes the in-inode area of `inode` names.
    fn ibody_ea_inodes(&self, inode: &Inode) -> Result<(EaOwner, Vec<u32>)> {
        let raw = inode.raw();
        let owner = EaOwner::new(inode.ino, &raw);
        if !self.sbi.ea_inode {
            return Ok((owner, Vec::new()));
        }
        match crate::xattr::area::ibody_area(&raw).map(|a| crate::xattr::area::ea_inodes(a, 0)) {
            None => Ok((owner, Vec::new())),
            Some(Ok(eas)) => Ok((owner, eas)),
            Some(Err(what)) => corrupt(CorruptKind::Xattr { ino: inode.ino, block: None, what }),
        }
    }

    /// Checks, before a deletion changes anything, that every EA inode `inode` names (in its
    /// in-inode area, and `in_block`, those of its xattr block) can be read as one, and that
    /// those whose last reference goes can be freed whole (their blocks in range, outside the
    /// metadata and in use): otherwise some references would be dropped, and EA inodes freed,
    /// before the damage stopped the deletion. An EA inode that names EA inodes itself is
    /// corrupt (the kernel never makes one), which also keeps a cycle of them from recursing.
    pub(crate) fn ea_inodes_check(&self, h: &Handle, inode: &Inode, in_block: &[u32]) -> Result<()> {
        let (owner, eas) = self.ibody_ea_inodes(inode)?;
        let all: Vec<u32> = eas.iter().chain(in_block).copied().collect();
        if !all.is_empty() && inode.flags() & EA_INODE_FL != 0 {
            return corrupt(CorruptKind::Xattr {
                ino: inode.ino,
                block: None,
                what: "EA inode names EA inodes",
            });
        }
        for (i, &ea) in all.iter().enumerate() {
            let e = self.ea_iget(inode.ino, ea)?;
            if all[..i].contains(&ea) {
                continue;
            }
            let dropped = all.iter().filter(|&&x| x == ea).count() as u64;
            let last = {
                let raw = e.raw();
                raw_is_lustre(&raw, owner) || raw_ea_refs(&raw) <= dropped
            };
            if last {
                self.deletion_checks(h, &e)?;
            }
        }
        Ok(())
    }
}
