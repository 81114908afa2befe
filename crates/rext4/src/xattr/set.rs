//! Setting and removing extended attributes (the write side of the kernel's `xattr.c`:
//! `ext4_xattr_set_handle`, `ext4_xattr_ibody_set`, `ext4_xattr_block_set`,
//! `ext4_xattr_release_block`), POSIX ACLs through them (`ext4_set_acl`), and the VFS checks
//! in front (`setxattr(2)`, `xattr_permission`).
//!
//! An attribute goes into the inode's extra space when it fits, else into the xattr block. A
//! block is shared by every inode with the same attributes (`h_refcount`, up to
//! [`REFCOUNT_MAX`]): one referenced more than once is copied before it changes, and a block
//! about to be written is first looked up by hash in the xattr block cache (`cache/mbcache.rs`), so
//! that an identical one is shared instead.
//!
//! With `ea_inode`, a value too large for either area, or larger than a block's worth, goes
//! to an EA inode of its own (`xattr/ea_inode.rs`), and the entry names it.
//!
//! # Locking
//! inode `op_lock` (the kernel's `i_rwsem`, which the VFS holds around setxattr) -> journal
//! handle -> `Inode::raw` (write, held through the whole change, so readers see the in-inode
//! area and the block as one) -> an EA inode's `Inode::raw` -> one xattr block's
//! `Buffer::data` at a time -> xattr block cache shard. The record is changed in a copy and
//! stored only when everything succeeded.

use crate::alloc::reserved::Pool;
use crate::cache::buffer::Buffer;
use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::{Fs, FsInner};
use crate::inode::write::{raw_links, raw_touch_c};
use crate::inode::Inode;
use crate::jbd2::journal::Journal;
use crate::jbd2::transaction::Handle;
use crate::xattr::acl::{self, AclEntry};
use crate::xattr::area::{self as area, AreaError, NewValue, Pos};
use crate::xattr::ea_inode::EaOwner;
use rext4_format::features::Compat;
use rext4_format::inode as fi;
use rext4_format::xattr::{self as fx, BLOCK_HEADER_SIZE, REFCOUNT_MAX, XATTR_MAGIC};
use rext4_format::{InodeNo, PhysBlock};
use std::sync::Arc;

/// `setxattr(2)` flag: fail with `EEXIST` if the attribute exists.
pub const XATTR_CREATE: u32 = 1;
/// `setxattr(2)` flag: fail with `ENODATA` if the attribute does not exist.
pub const XATTR_REPLACE: u32 = 2;

/// Largest value `setxattr(2)` takes (`XATTR_SIZE_MAX`).
const VALUE_MAX: usize = 65536;
/// Credits: the inode-table block, the superblock, the old and new xattr blocks, a bitmap and
/// descriptor each for allocating and freeing, and a few blocks tried for sharing.
const CREDITS: u32 = 16;
/// More credits with `ea_inode`: a new EA inode (its table block, bitmap and descriptor, and a
/// data handle's worth for its blocks) and an old one freed.
const EA_CREDITS: u32 = 128;
/// Identical blocks tried for sharing before a new one is allocated.
const SHARE_TRIES: usize = 4;
/// Offset of `s_feature_compat` in the superblock.
const SB_FEATURE_COMPAT: usize = 0x5C;

fn raw_set_file_acl(raw: &mut [u8], blk: u64) {
    crate::inode::write::rec(raw).set_file_acl(blk);
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// The (index, suffix) a name is stored under (the kernel's `xattr_resolve_name` over ext4's
/// handlers). The ACL names are handled before this.
fn resolve(name: &[u8]) -> Result<(u8, &[u8])> {
    for (prefix, index) in [
        (&b"user."[..], fx::INDEX_USER),
        (b"trusted.", fx::INDEX_TRUSTED),
        (b"security.", fx::INDEX_SECURITY),
    ] {
        if let Some(suffix) = name.strip_prefix(prefix) {
            if suffix.is_empty() {
                return Err(Error::InvalidInput("attribute name is only a namespace prefix"));
            }
            return Ok((index, suffix));
        }
    }
    Err(Error::NotSupported(format!("attribute namespace of {}", String::from_utf8_lossy(name))))
}

fn xattr_err(ino: InodeNo, blk: Option<u64>, what: &'static str) -> Error {
    Error::Corrupt(crate::error::Corrupt(CorruptKind::Xattr { ino, block: blk.map(PhysBlock), what }))
}

fn area_err(ino: InodeNo, blk: Option<u64>) -> impl Fn(AreaError) -> Error {
    move |e| match e {
        AreaError::NoSpace => Error::NoSpace,
        AreaError::Corrupt(what) => xattr_err(ino, blk, what),
    }
}

/// A name's place in the in-inode area (`ext4_xattr_ibody_find`).
#[derive(Clone, Copy)]
struct IbodySearch {
    /// Offset of the first entry in the record.
    first: usize,
    pos: Pos,
    /// The area has no magic yet: whatever it holds is not attributes.
    fresh: bool,
}

/// A name's place in the xattr block (`ext4_xattr_block_find`).
struct BlockSearch {
    /// The block the inode has, with a copy of its contents.
    old: Option<(u64, Arc<Buffer>, Vec<u8>)>,
    pos: Pos,
}

impl BlockSearch {
    fn found(&self) -> bool {
        self.pos.found
    }
}

impl FsInner {
    /// The inode's attribute changes: `f` works on a copy of the record under a handle and
    /// says whether it changed anything; then the change time is set and the record stored.
    fn change_record(
        &self,
        journal: &Arc<Journal>,
        inode: &Inode,
        f: impl FnOnce(&Handle, &mut [u8]) -> Result<bool>,
    ) -> Result<()> {
        let h = journal.start(if self.sbi.ea_inode { CREDITS + EA_CREDITS } else { CREDITS })?;
        let mut guard = inode.raw_mut();
        // An unlinked file still held (open, or unnamed from `O_TMPFILE`) takes attributes as
        // ext4 lets `fsetxattr` set them; one freed, or being freed, while this call waited
        // for the inode does not. Its eviction waits for the `op_lock` the caller holds.
        if raw_links(&guard) == 0 && !inode.is_held_orphan() {
            return Err(Error::NotFound);
        }
        let mut raw = guard.to_vec();
        let changed = f(&h, &mut raw);
        if let Ok(true) = changed {
            raw_touch_c(&mut raw, self.now());
            guard.copy_from_slice(&raw);
            self.mark_inode_dirty(&h, inode, &mut guard)?;
        } else {
            // Quota admitted for a change that was not made is given back (a record write
            // ends it otherwise).
            self.quota_settle(inode);
            changed?;
        }
        drop(guard);
        h.stop();
        Ok(())
    }

    /// `setxattr(2)` (`value` given) and `removexattr(2)` (`None`, with [`XATTR_REPLACE`]).
    /// `kill_sgid`: the caller is neither in the file's group nor holds `CAP_FSETID`, so an
    /// access ACL's new mode loses set-group-ID (`posix_acl_update_mode`).
    fn setxattr(
        &self,
        ino: InodeNo,
        name: &[u8],
        value: Option<&[u8]>,
        flags: u32,
        kill_sgid: bool,
    ) -> Result<()> {
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
            return Err(Error::InvalidInput("setxattr flags"));
        }
        if name.is_empty() || name.len() > 255 {
            return Err(Error::Range);
        }
        if name.contains(&0) {
            return Err(Error::InvalidInput("NUL in attribute name"));
        }
        if value.is_some_and(|v| v.len() > VALUE_MAX) {
            return Err(Error::TooBig);
        }
        let journal = self.journal()?.clone();
        let inode = self.iget_by_number(ino)?;
        let acl_index = match name {
            b"system.posix_acl_access" => Some(fx::INDEX_POSIX_ACL_ACCESS),
            b"system.posix_acl_default" => Some(fx::INDEX_POSIX_ACL_DEFAULT),
            _ => None,
        };
        // The VFS converts an ACL before anything else looks at it.
        let acl = match (acl_index, value) {
            (Some(_), Some(v)) => acl::from_xattr(v)?,
            _ => None,
        };
        let _op = self.stats.lock(crate::fs::stats::LockClass::OpLock, &inode.op_lock);
        let d = inode.disk();
        if d.flags() & (fi::IMMUTABLE_FL | fi::APPEND_FL) != 0 {
            return Err(Error::NotPermitted);
        }
        let kind = d.file_type();
        if name.starts_with(b"user.") && kind != fi::S_IFREG && kind != fi::S_IFDIR {
            // Only regular files and directories carry user attributes (`xattr_permission`).
            return Err(Error::NotPermitted);
        }
        if let Some(index) = acl_index {
            return self.set_acl(&journal, &inode, index, acl, kill_sgid);
        }
        let (index, suffix) = resolve(name)?;
        let set = || {
            self.change_record(&journal, &inode, |h, raw| {
                self.xattr_set_handle(h, ino, raw, index, suffix, value, flags)
            })
        };
        match set() {
            // Blocks freed by transactions not yet committed are not handed out again before
            // their commit: commit, then try once more (`ext4_should_retry_alloc`).
            Err(Error::NoSpace) if self.has_busy_blocks() => {
                journal.sync()?;
                set()
            }
            r => r,
        }
    }

    /// `ext4_set_acl`: an access ACL that says no more than a mode becomes that mode; one
    /// that does sets the mode's group bits to its mask; with `kill_sgid` the new mode loses
    /// set-group-ID. Flags do not apply to ACLs, and removing an absent ACL succeeds, as in
    /// the kernel.
    fn set_acl(
        &self,
        journal: &Arc<Journal>,
        inode: &Inode,
        index: u8,
        acl: Option<Vec<AclEntry>>,
        kill_sgid: bool,
    ) -> Result<()> {
        let d = inode.disk();
        if d.file_type() == fi::S_IFLNK {
            return Err(Error::NotSupported("ACLs on symbolic links".into()));
        }
        if let Some(a) = &acl {
            acl::validate(a)?;
        }
        if index == fx::INDEX_POSIX_ACL_DEFAULT && d.file_type() != fi::S_IFDIR {
            return if acl.is_some() { Err(Error::AccessDenied) } else { Ok(()) };
        }
        self.change_record(journal, inode, |h, raw| {
            let mode = u16::from_le_bytes([raw[0], raw[1]]);
            let mut acl = acl;
            let mut new_mode = mode;
            if let (fx::INDEX_POSIX_ACL_ACCESS, Some(a)) = (index, &acl) {
                let (m, more) = acl::equiv_mode(a, mode);
                new_mode = if kill_sgid { m & !0o2000 } else { m };
                if !more {
                    acl = None;
                }
            }
            let value = acl.map(|a| acl::to_disk(&a));
            let changed = self.xattr_set_handle(h, inode.ino, raw, index, b"", value.as_deref(), 0)?;
            raw[0..2].copy_from_slice(&new_mode.to_le_bytes());
            Ok(changed || new_mode != mode)
        })
    }

    /// `ext4_xattr_set_handle` on the record copy `raw`: sets (`Some`) or removes (`None`)
    /// attribute `index`/`name`. Returns whether anything changed.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn xattr_set_handle(
        &self,
        h: &Handle,
        ino: InodeNo,
        raw: &mut [u8],
        index: u8,
        name: &[u8],
        value: Option<&[u8]>,
        flags: u32,
    ) -> Result<bool> {
        let is = self.ibody_find(ino, raw, index, name)?;
        let in_ibody = is.is_some_and(|s| s.pos.found);
        let bs = if in_ibody { None } else { Some(self.block_find(ino, raw, index, name)?) };
        let in_block = bs.as_ref().is_some_and(BlockSearch::found);
        if !in_ibody && !in_block {
            if flags & XATTR_REPLACE != 0 {
                return Err(Error::NoData);
            }
            if value.is_none() {
                return Ok(false);
            }
        } else if flags & XATTR_CREATE != 0 {
            return Err(Error::Exists);
        }
        // An EA inode the in-inode entry names: its reference goes when the entry changes.
        let ibody_ea = is.filter(|s| s.pos.found).map_or(0, |s| u32_at(&raw[s.first..], s.pos.here + 4));
        let owner = EaOwner::new(ino, raw);
        let ibody_charged = self.ibody_ea_charge(owner, raw);
        match value {
            None => {
                if let Some(s) = is.filter(|s| s.pos.found) {
                    self.ibody_set(ino, raw, Some(s), index, name, None)?;
                } else if let Some(b) = bs {
                    self.block_set(h, ino, raw, b, index, name, None)?;
                }
            }
            Some(value) => {
                if let Some(s) = is.filter(|s| s.pos.found) {
                    if area::value_same(&raw[s.first..], s.pos, value) {
                        return Ok(false);
                    }
                }
                if let Some(BlockSearch { old: Some((_, _, data)), pos }) = &bs {
                    if area::value_same(data, *pos, value) {
                        return Ok(false);
                    }
                }
                self.xattr_put(h, ino, raw, is, bs, index, name, value)?;
                self.note_ext_attr(h)?;
            }
        }
        if ibody_ea != 0 {
            self.ea_inode_ref(h, owner, ibody_ea, -1)?;
        }
        let charge = self.ibody_ea_charge(owner, raw);
        self.raw_add_bytes(raw, charge - ibody_charged);
        Ok(true)
    }

    /// Stores `value` for `index`/`name` (found by `is` and `bs`) as `ext4_xattr_set_handle`
    /// does: a large value goes to an EA inode at once; a smaller one goes in the inode, else
    /// in the block, else to an EA inode when neither has room. The attribute's old entry
    /// goes; the reference of an EA inode it named in the inode is the caller's to drop.
    #[allow(clippy::too_many_arguments)]
    fn xattr_put(
        &self,
        h: &Handle,
        ino: InodeNo,
        raw: &mut [u8],
        is: Option<IbodySearch>,
        mut bs: Option<BlockSearch>,
        index: u8,
        name: &[u8],
        value: &[u8],
    ) -> Result<()> {
        let in_ibody = is.is_some_and(|s| s.pos.found);
        let in_block = bs.as_ref().is_some_and(BlockSearch::found);
        let mut ea = None;
        if self.sbi.ea_inode && fx::value_size(value.len()) > self.ea_large_value() {
            ea = Some(self.ea_inode_new(h, ino, raw, value)?);
        }
        // At most VALUE_MAX (checked by the callers).
        let size = u32::try_from(value.len()).map_err(|_| Error::TooBig)?;
        loop {
            let nv = match ea {
                Some((vino, hash)) => NewValue::Inode { ino: vino, size, hash },
                None => NewValue::Bytes(value),
            };
            let done = match self.ibody_set(ino, raw, is, index, name, Some(nv)) {
                // The old entry in the block goes (searched again after a failed try used
                // up the search).
                Ok(()) => match bs.take() {
                    Some(b) if b.found() => self.block_set(h, ino, raw, b, index, name, None),
                    None if in_block => {
                        let b = self.block_find(ino, raw, index, name)?;
                        self.block_set(h, ino, raw, b, index, name, None)
                    }
                    _ => Ok(()),
                },
                Err(Error::NoSpace) => {
                    let b = match bs.take() {
                        Some(b) => b,
                        None => self.block_find(ino, raw, index, name)?,
                    };
                    match self.block_set(h, ino, raw, b, index, name, Some(nv)) {
                        Ok(()) if in_ibody => self.ibody_set(ino, raw, is, index, name, None),
                        Ok(()) => Ok(()),
                        Err(Error::NoSpace) if self.sbi.ea_inode && !value.is_empty() && ea.is_none() => {
                            ea = Some(self.ea_inode_new(h, ino, raw, value)?);
                            continue;
                        }
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            };
            if let (Err(_), Some((vino, _))) = (&done, ea) {
                // The record copy is dropped on error; the new EA inode goes with it.
                self.ea_inode_ref(h, EaOwner::new(ino, raw), vino, -1)?;
            }
            return done;
        }
    }

    /// An EA inode holding `value`, for inode `ino` whose record copy is `raw` (the owner's
    /// ids go to the EA inode, as in the kernel).
    fn ea_inode_new(&self, h: &Handle, ino: InodeNo, raw: &[u8], value: &[u8]) -> Result<(u32, u32)> {
        // The owner is charged an inode and the value's blocks: its quotas must have room
        // (`ext4_xattr_inode_alloc_quota`).
        self.quota_ea_value_check(ino, raw, value.len() as u64)?;
        self.ea_inode_create(h, ino, raw, value)
    }

    fn ibody_find(&self, ino: InodeNo, raw: &[u8], index: u8, name: &[u8]) -> Result<Option<IbodySearch>> {
        let Some(first) = crate::xattr::area::ibody_first(raw) else { return Ok(None) };
        if !crate::xattr::area::has_ibody_magic(raw, first) {
            return Ok(Some(IbodySearch { first, pos: Pos { here: 0, found: false }, fresh: true }));
        }
        let base = &raw[first..];
        let (ents, end) = area::entries(base, 0).map_err(|w| xattr_err(ino, None, w))?;
        let pos = area::find(base, &ents, end, index, name, false);
        Ok(Some(IbodySearch { first, pos, fresh: false }))
    }

    /// `ext4_xattr_ibody_set`: `NoSpace` (area unchanged) when it does not fit or the record
    /// has no area; the magic is written with the first entry and cleared with the last.
    #[allow(clippy::too_many_arguments)]
    fn ibody_set(
        &self,
        ino: InodeNo,
        raw: &mut [u8],
        is: Option<IbodySearch>,
        index: u8,
        name: &[u8],
        value: Option<NewValue<'_>>,
    ) -> Result<()> {
        let Some(s) = is else { return Err(Error::NoSpace) };
        let first = s.first;
        if s.fresh {
            raw[first..].fill(0);
        }
        area::set_entry(&mut raw[first..], 0, s.pos, index, name, value, None)
            .map_err(area_err(ino, None))?;
        let magic = if raw[first..first + 4] == [0; 4] { 0 } else { XATTR_MAGIC };
        raw[first - 4..first].copy_from_slice(&magic.to_le_bytes());
        Ok(())
    }

    fn block_find(&self, ino: InodeNo, raw: &[u8], index: u8, name: &[u8]) -> Result<BlockSearch> {
        let blk = crate::inode::write::rec_ref(raw).file_acl();
        if blk == 0 {
            return Ok(BlockSearch { old: None, pos: Pos { here: BLOCK_HEADER_SIZE, found: false } });
        }
        let buf = self.xattr_block(ino, blk)?;
        let data = buf.data().to_vec();
        let (ents, end) =
            area::entries(&data, BLOCK_HEADER_SIZE).map_err(|w| xattr_err(ino, Some(blk), w))?;
        let pos = area::find(&data, &ents, end, index, name, true);
        Ok(BlockSearch { old: Some((blk, buf, data)), pos })
    }

    /// `ext4_xattr_block_set`: the new contents are built in memory; then an identical block
    /// is shared if there is one, else the old block is rewritten if this inode is its only
    /// user, else a new block is allocated. The old block is released if it is no longer
    /// the inode's. A block naming EA inodes is never shared: rewritten, it drops the
    /// reference of the entry it loses; copied, the copy takes a reference for each EA inode
    /// it names besides a new one's.
    #[allow(clippy::too_many_arguments)]
    fn block_set(
        &self,
        h: &Handle,
        ino: InodeNo,
        raw: &mut [u8],
        bs: BlockSearch,
        index: u8,
        name: &[u8],
        value: Option<NewValue<'_>>,
    ) -> Result<()> {
        let old_blk = bs.old.as_ref().map(|o| o.0);
        let (mut content, lost_ea) = match &bs.old {
            Some((_, _, data)) => {
                let lost = if bs.pos.found { u32_at(data, bs.pos.here + 4) } else { 0 };
                (data.clone(), lost)
            }
            None => {
                let mut b = vec![0u8; self.sbi.block_size as usize];
                b[0..4].copy_from_slice(&XATTR_MAGIC.to_le_bytes());
                b[8..12].copy_from_slice(&1u32.to_le_bytes());
                (b, 0)
            }
        };
        content[4..8].copy_from_slice(&1u32.to_le_bytes());
        area::set_entry(
            &mut content,
            BLOCK_HEADER_SIZE,
            bs.pos,
            index,
            name,
            value,
            Some(self.ea_block_reserve()),
        )
        .map_err(area_err(ino, old_blk))?;
        let empty = content[BLOCK_HEADER_SIZE..BLOCK_HEADER_SIZE + 4] == [0; 4];
        let eas = self.block_ea_inodes(ino, old_blk, &content)?;
        let shareable = eas.is_empty();
        let mut delta = 0i64;
        let shared =
            if !empty && shareable { self.xattr_block_share(h, ino, &content, old_blk)? } else { None };
        if !empty && old_blk.is_none() {
            // The inode takes a block it had not: its quotas must have room.
            self.quota_xattr_block_check(ino, raw)?;
        }
        let new_blk = if empty {
            None
        } else if let Some(b) = shared {
            delta += 1;
            Some(b)
        } else if let Some(b) = self.xattr_block_rewrite(h, &bs, &content, shareable)? {
            Some(b)
        } else {
            delta += 1;
            Some(self.xattr_block_new(h, ino, &content, shareable)?)
        };
        // Charged before a dropped reference may free the EA inode it looks at.
        let owner = EaOwner::new(ino, raw);
        let charged = bs.old.as_ref().map_or(0, |(_, _, d)| self.ea_charge(owner, d, BLOCK_HEADER_SIZE));
        if new_blk.is_some() && new_blk == old_blk {
            if lost_ea != 0 {
                self.ea_inode_ref(h, owner, lost_ea, -1)?;
            }
        } else if new_blk.is_some() {
            let fresh = match value {
                Some(NewValue::Inode { ino: v, .. }) => v,
                _ => 0,
            };
            // One reference per entry; the new entry's was taken with its value (another
            // entry may name the same EA inode: equal values share one).
            let mut skip = fresh != 0;
            for &e in &eas {
                if skip && e == fresh {
                    skip = false;
                    continue;
                }
                self.ea_inode_ref(h, owner, e, 1)?;
            }
        }
        let charge = if new_blk.is_some() { self.ea_charge(owner, &content, BLOCK_HEADER_SIZE) } else { 0 };
        self.raw_add_bytes(raw, charge - charged);
        // One inode of quota for each entry naming an EA inode (the in-inode area's follow the
        // record).
        let had = match &bs.old {
            Some((_, _, d)) if self.sbi.ea_inode => area::ea_entry_count(d, BLOCK_HEADER_SIZE),
            _ => 0,
        };
        let has = if new_blk.is_some() { eas.len() as u64 } else { 0 };
        self.quota_add_inodes(h, ino, raw, has as i64 - had as i64)?;
        raw_set_file_acl(raw, new_blk.unwrap_or(0));
        if let Some(ob) = old_blk.filter(|&b| Some(b) != new_blk) {
            self.xattr_release_block(h, owner, ob)?;
            delta -= 1;
        }
        self.raw_add_xattr_blocks(raw, delta);
        Ok(())
    }

    /// Takes a reference to a block already holding exactly `content`
    /// (`ext4_xattr_block_cache_find` and the reuse branch of `ext4_xattr_block_set`).
    fn xattr_block_share(
        &self,
        h: &Handle,
        ino: InodeNo,
        content: &[u8],
        not: Option<u64>,
    ) -> Result<Option<u64>> {
        let hash = u32_at(content, 0x0C);
        let mut tried = 0;
        for c in self.xattr_cache.candidates(hash) {
            if Some(c) == not || tried == SHARE_TRIES {
                continue;
            }
            let Ok(buf) = self.xattr_block(ino, c) else {
                self.xattr_cache.remove(hash, c);
                continue;
            };
            let looks_same = {
                let d = buf.data();
                u32_at(&d, 4) < REFCOUNT_MAX && area::same_attributes(&d, content, BLOCK_HEADER_SIZE)
            };
            if !looks_same {
                continue;
            }
            tried += 1;
            // Checked again under the lock: a block freed or rewritten meanwhile left the
            // cache under this same lock.
            let mut d = h.write(&buf)?;
            let refs = u32_at(&d, 4);
            if !self.xattr_cache.contains(hash, c)
                || u32_at(&d, 0) != XATTR_MAGIC
                || refs == 0
                || refs >= REFCOUNT_MAX
                || !area::same_attributes(&d, content, BLOCK_HEADER_SIZE)
            {
                continue;
            }
            d[4..8].copy_from_slice(&(refs + 1).to_le_bytes());
            if self.sbi.metadata_csum {
                fx::set_block_checksum(&mut d, self.sbi.csum_seed, c);
            }
            return Ok(Some(c));
        }
        Ok(None)
    }

    /// Writes `content` over the inode's old block if the inode is still its only user;
    /// `cache`: offer it for sharing.
    fn xattr_block_rewrite(
        &self,
        h: &Handle,
        bs: &BlockSearch,
        content: &[u8],
        cache: bool,
    ) -> Result<Option<u64>> {
        let Some((blk, buf, _)) = &bs.old else { return Ok(None) };
        let mut d = h.write(buf)?;
        if u32_at(&d, 4) != 1 {
            return Ok(None);
        }
        self.xattr_cache.remove(u32_at(&d, 0x0C), *blk);
        d.copy_from_slice(content);
        if self.sbi.metadata_csum {
            fx::set_block_checksum(&mut d, self.sbi.csum_seed, *blk);
        }
        if cache {
            self.xattr_cache.insert(u32_at(content, 0x0C), *blk);
        }
        Ok(Some(*blk))
    }

    /// Allocates a block in the inode's group and writes `content` into it; `cache`: offer it
    /// for sharing.
    fn xattr_block_new(&self, h: &Handle, ino: InodeNo, content: &[u8], cache: bool) -> Result<u64> {
        let group = (ino.0 - 1) / self.sbi.inodes_per_group;
        let (blk, _) = self.alloc_blocks(h, self.sbi.group_first_block(group), 1, Pool::Ordinary)?;
        let buf = self.bcache.get_fresh(blk);
        let mut d = h.write(&buf)?;
        d.copy_from_slice(content);
        if self.sbi.metadata_csum {
            fx::set_block_checksum(&mut d, self.sbi.csum_seed, blk);
        }
        drop(d);
        if cache {
            self.xattr_cache.insert(u32_at(content, 0x0C), blk);
        }
        Ok(blk)
    }

    /// `ext4_xattr_release_block`: drops one reference to xattr block `blk`, freeing it with
    /// the last, and with it the references it holds to EA inodes. The caller clears
    /// `i_file_acl` and adjusts `i_blocks`.
    pub(crate) fn xattr_release_block(&self, h: &Handle, owner: EaOwner, blk: u64) -> Result<()> {
        let ino = owner.ino;
        let buf = self.bread_owned(ino, blk)?;
        let mut d = h.write(&buf)?;
        if u32_at(&d, 0) != XATTR_MAGIC {
            return corrupt(CorruptKind::Xattr {
                ino,
                block: Some(PhysBlock(blk)),
                what: "bad block header",
            });
        }
        let refs = u32_at(&d, 4);
        if refs > 1 {
            d[4..8].copy_from_slice(&(refs - 1).to_le_bytes());
            if self.sbi.metadata_csum {
                fx::set_block_checksum(&mut d, self.sbi.csum_seed, blk);
            }
            return Ok(());
        }
        // Parsed first: a corrupt area fails here, with the block still counted as in use.
        let eas = self.block_ea_inodes(ino, Some(blk), &d)?;
        // Out of the cache, and counted as nobody's, before the lock is let go: a sharer that
        // found it in the cache, or a reader of the dying inode that would offer it there
        // again (`xattrs_snapshot`), sees a count of zero. The freed block's copy is revoked,
        // so the zero never reaches the log.
        self.xattr_cache.remove(u32_at(&d, 0x0C), blk);
        d[4..8].copy_from_slice(&0u32.to_le_bytes());
        if self.sbi.metadata_csum {
            // A reader of the dying inode may still check it.
            fx::set_block_checksum(&mut d, self.sbi.csum_seed, blk);
        }
        drop(d);
        self.ea_inodes_put(h, owner, &eas)?;
        self.free_blocks(h, blk, 1, true)
    }

    /// Checks that xattr block `blk` of `ino` can be released (`ext4_xattr_check_block`):
    /// header, checksum and entry table. A deletion calls it before it frees anything, so that
    /// a damaged block fails the deletion with the inode's blocks all still its own.
    /// Returns the EA inodes the block names.
    pub(crate) fn xattr_block_check(&self, ino: InodeNo, blk: u64) -> Result<Vec<u32>> {
        let buf = self.xattr_block(ino, blk)?;
        let data = buf.data();
        area::entries(&data, BLOCK_HEADER_SIZE).map_err(|w| xattr_err(ino, Some(blk), w))?;
        self.block_ea_inodes(ino, Some(blk), &data)
    }

    /// Adds `n` xattr blocks (may be negative) to the record's `i_blocks`: a cluster each
    /// with bigalloc.
    fn raw_add_xattr_blocks(&self, raw: &mut [u8], n: i64) {
        // A cluster is at most 1 GiB (checked at open).
        self.raw_add_bytes(raw, n * self.sbi.cluster_bytes() as i64);
    }

    /// The EA inodes xattr block `data` (block `blk` of inode `ino`, if it has one yet) names.
    fn block_ea_inodes(&self, ino: InodeNo, blk: Option<u64>, data: &[u8]) -> Result<Vec<u32>> {
        if !self.sbi.ea_inode {
            return Ok(Vec::new());
        }
        area::ea_inodes(data, BLOCK_HEADER_SIZE).map_err(|w| xattr_err(ino, blk, w))
    }

    /// What the values in EA inodes that an area's entries name cost its inode: each value's
    /// size rounded up to whole blocks, as the kernel charges them to the inode's `i_blocks`
    /// (`ext4_xattr_inode_alloc_quota`) and e2fsck counts them.
    /// Old Lustre EA inodes are not charged (e2fsck's `check_large_ea_inode`).
    fn ea_charge(&self, owner: EaOwner, base: &[u8], first: usize) -> i64 {
        if !self.sbi.ea_inode {
            return 0;
        }
        // Whole clusters with bigalloc (`round_up_cluster`).
        let bs = self.sbi.cluster_bytes();
        let Ok((ents, _)) = area::entries(base, first) else { return 0 };
        ents.iter()
            .filter(|e| e.value_inum != 0 && !self.ea_is_lustre(owner, e.value_inum))
            .map(|e| (e.value_size as u64).div_ceil(bs) * bs)
            .sum::<u64>() as i64
    }

    /// What all the values in EA inodes that inode `ino` (record `raw`) names cost it, in
    /// bytes of `i_blocks`: those of its in-inode area and of its xattr block.
    pub(crate) fn ea_charge_total(&self, ino: InodeNo, raw: &[u8]) -> Result<i64> {
        let owner = EaOwner::new(ino, raw);
        let blk = crate::inode::write::rec_ref(raw).file_acl();
        let block = if self.sbi.ea_inode && blk != 0 {
            let buf = self.xattr_block(ino, blk)?;
            let d = buf.data();
            self.ea_charge(owner, &d, BLOCK_HEADER_SIZE)
        } else {
            0
        };
        Ok(self.ibody_ea_charge(owner, raw) + block)
    }

    /// How many entries of the xattr block that inode `ino` (record `raw`) names keep their
    /// value in an EA inode: what the block adds to the inode's quota inode count.
    pub(crate) fn block_ea_count(&self, ino: InodeNo, raw: &[u8]) -> Result<u64> {
        let blk = crate::inode::write::rec_ref(raw).file_acl();
        if !self.sbi.ea_inode || blk == 0 {
            return Ok(0);
        }
        let buf = self.xattr_block(ino, blk)?;
        let d = buf.data();
        Ok(area::ea_entry_count(&d, BLOCK_HEADER_SIZE))
    }

    /// [`FsInner::ea_charge`] of the record's in-inode area.
    fn ibody_ea_charge(&self, owner: EaOwner, raw: &[u8]) -> i64 {
        crate::xattr::area::ibody_area(raw).map_or(0, |area| self.ea_charge(owner, area, 0))
    }

    /// Adds `bytes` (may be negative; whole blocks) to the record's `i_blocks`.
    fn raw_add_bytes(&self, raw: &mut [u8], bytes: i64) {
        if bytes == 0 {
            return;
        }
        let mut r = crate::inode::write::rec(raw);
        let unit = if self.sbi.huge_file && r.flags() & fi::HUGE_FILE_FL != 0 {
            i64::from(self.sbi.block_size)
        } else {
            512
        };
        let v = u64::try_from((r.blocks() as i64).saturating_add(bytes / unit)).unwrap_or(0);
        r.set_blocks(v);
    }

    /// `ext4_xattr_update_super_block`: the first attribute sets the `ext_attr` feature.
    fn note_ext_attr(&self, h: &Handle) -> Result<()> {
        let (_, off) = self.sbi.sb_location();
        let buf = &self.sb_buf;
        let bit = Compat::EXT_ATTR.bits();
        if u32_at(&buf.data(), off + SB_FEATURE_COMPAT) & bit != 0 {
            return Ok(());
        }
        let mut d = h.write(buf)?;
        let v = u32_at(&d, off + SB_FEATURE_COMPAT) | bit;
        d[off + SB_FEATURE_COMPAT..off + SB_FEATURE_COMPAT + 4].copy_from_slice(&v.to_le_bytes());
        Ok(())
    }

    /// Removes in-inode attribute `index`/`name` (inline data's `system.data`) from the record
    /// `raw`, which the caller holds for writing and stores afterwards. Returns whether it was
    /// there.
    pub(crate) fn ibody_remove(&self, ino: InodeNo, raw: &mut [u8], index: u8, name: &[u8]) -> Result<bool> {
        let is = self.ibody_find(ino, raw, index, name)?;
        if !is.is_some_and(|s| s.pos.found) {
            return Ok(false);
        }
        self.ibody_set(ino, raw, is, index, name, None)?;
        Ok(true)
    }

    /// Sets in-inode attribute `index`/`name` (inline data's `system.data`, which the format
    /// keeps in the inode, never in a block) in the record `raw`, as
    /// [`FsInner::ibody_remove`]; `NoSpace` (area unchanged) if it does not fit there.
    pub(crate) fn ibody_put(
        &self,
        ino: InodeNo,
        raw: &mut [u8],
        index: u8,
        name: &[u8],
        value: &[u8],
    ) -> Result<()> {
        let is = self.ibody_find(ino, raw, index, name)?;
        if is.is_some_and(|s| s.pos.found && area::value_same(&raw[s.first..], s.pos, value)) {
            return Ok(());
        }
        self.ibody_set(ino, raw, is, index, name, Some(NewValue::Bytes(value)))
    }
}

impl Fs {
    /// `setxattr(2)`: sets attribute `name` (with its namespace prefix: `user.`, `trusted.`,
    /// `security.`, or `system.posix_acl_access` / `_default` in the VFS ACL format) of `ino`
    /// to `value`. `flags` is 0, [`XATTR_CREATE`] or [`XATTR_REPLACE`] (ignored for ACLs, as
    /// in the kernel). The change time becomes now.
    pub fn setxattr(&self, ino: InodeNo, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        self.inner
            .op(crate::fs::stats::Op::Setxattr, || self.inner.setxattr(ino, name, Some(value), flags, false))
    }

    /// [`Fs::setxattr`] for a caller neither in the file's group nor holding `CAP_FSETID`: an
    /// access ACL set this way takes set-group-ID out of the mode it gives, in the same
    /// change (the kernel's `posix_acl_update_mode`; what a FUSE request's
    /// `FUSE_SETXATTR_ACL_KILL_SGID` says of its caller).
    pub fn setxattr_outside_group(&self, ino: InodeNo, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        self.inner
            .op(crate::fs::stats::Op::Setxattr, || self.inner.setxattr(ino, name, Some(value), flags, true))
    }

    /// `removexattr(2)`: `ENODATA` if the attribute does not exist (except for ACLs, whose
    /// removal always succeeds, as in the kernel).
    pub fn removexattr(&self, ino: InodeNo, name: &[u8]) -> Result<()> {
        self.inner
            .op(crate::fs::stats::Op::Setxattr, || self.inner.setxattr(ino, name, None, XATTR_REPLACE, false))
    }
}

#[cfg(test)]
mod tests {
    use crate::dev::MemDevice;
    use crate::fs::{Fs, Options};
    use rext4_format::xattr::INDEX_USER;
    use std::sync::Arc;

    /// The in-inode helpers the inline-data writer uses: put and remove on a held record.
    #[test]
    fn ibody_put_and_remove_on_a_held_record() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("a.img");
        let out = std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&img)
            .arg("16M")
            .output()
            .expect("mkfs.ext4 is required");
        assert!(out.status.success());
        let dev = Arc::new(MemDevice::new(std::fs::read(&img).unwrap()));
        let fs = Fs::from_device(dev, Options { writable: true, ..Options::default() }).unwrap();
        let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap();
        let inner = &fs.inner;
        let inode = inner.iget(f.ino).unwrap();
        let journal = inner.journal().unwrap().clone();
        let change = |op: &dyn Fn(&mut [u8]) -> crate::Result<bool>| {
            let h = journal.start(4).unwrap();
            let mut raw = inode.raw_mut();
            let r = op(&mut raw);
            inner.mark_inode_dirty(&h, &inode, &mut raw).unwrap();
            r
        };
        change(&|raw| inner.ibody_put(f.ino, raw, INDEX_USER, b"a", b"one").map(|_| true)).unwrap();
        change(&|raw| inner.ibody_put(f.ino, raw, INDEX_USER, b"b", b"two").map(|_| true)).unwrap();
        assert_eq!(fs.getxattr(f.ino, b"user.a").unwrap(), b"one");
        assert!(change(&|raw| inner.ibody_remove(f.ino, raw, INDEX_USER, b"a")).unwrap());
        assert!(!change(&|raw| inner.ibody_remove(f.ino, raw, INDEX_USER, b"a")).unwrap());
        assert_eq!(fs.listxattr(f.ino).unwrap(), vec![b"user.b".to_vec()]);
        let big = vec![7u8; 200];
        let e = change(&|raw| inner.ibody_put(f.ino, raw, INDEX_USER, b"c", &big).map(|_| true));
        assert_eq!(e.unwrap_err().errno(), libc::ENOSPC);
        assert!(change(&|raw| inner.ibody_remove(f.ino, raw, INDEX_USER, b"b")).unwrap());
        // The last entry gone, the area's magic goes too.
        let first = crate::xattr::area::ibody_first(&inode.raw()).unwrap();
        assert_eq!(inode.raw()[first - 4..first], [0; 4]);
    }
}
