//! Extended attributes (the kernel's `xattr.c`, `acl.c`): in the inode, in shared blocks,
//! in EA inodes; POSIX ACLs.
//!
//! | module | owns |
//! |---|---|
//! | this file | reading attributes (`ext4_xattr_get`, `listxattr`) |
//! | `area` | editing an area of entries and values in place |
//! | `set` | setting and removing, block sharing and release |
//! | `ea_inode` | values in EA inodes: sharing, references |
//! | `acl` | ACL permission checks and inheritance |
//!
//! # Locking
//! inode `op_lock` -> journal handle -> `Inode::raw` -> xattr block `Buffer::data`; an EA
//! inode's record after its owner's.
//!
//! ## This module
//! Extended attributes, read side (the kernel's `xattr.c`): entries in the inode's extra space
//! and in an xattr block, values inline or in an EA inode (`ea_inode`).

pub(crate) mod acl;
pub(crate) mod area;
pub(crate) mod ea_inode;
pub(crate) mod set;

use crate::cache::buffer::{Buffer, Verified};
use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use rext4_format::inode::{EA_INODE_FL, GOOD_OLD_INODE_SIZE};
use rext4_format::xattr::{self as fx, RawXattr, XattrIter};
use rext4_format::{InodeNo, PhysBlock};
use std::sync::Arc;

/// Largest value the VFS passes (`XATTR_SIZE_MAX`).
const VALUE_MAX: u32 = 65536;

/// One attribute, with its value read.
pub(crate) struct Xattr {
    pub index: u8,
    pub name: Vec<u8>,
    pub value: Vec<u8>,
    /// For values in an EA inode: (inode, size), read after the block's lock is released but
    /// under the record's, so that a change cannot free the EA inode meanwhile.
    ea_inode: Option<(u32, u32)>,
}

impl FsInner {
    /// Every attribute of `inode`: in-inode ones first, then the block's.
    pub(crate) fn xattrs(&self, inode: &Inode) -> Result<Vec<Xattr>> {
        let mut out = Vec::new();
        self.xattrs_snapshot(inode, &mut out)?;
        Ok(out)
    }

    /// Reads both areas under one hold of the record's read lock: a change (which holds the
    /// write lock throughout) moving an attribute between them is seen whole, and the block
    /// named is the inode's while it is read. The block is brought into the cache before the
    /// lock is taken; if the record names another one by then, that one is fetched.
    fn xattrs_snapshot(&self, inode: &Inode, out: &mut Vec<Xattr>) -> Result<()> {
        let ino = inode.ino;
        let mut blk = crate::inode::write::rec_ref(&inode.raw()).file_acl();
        let mut tries = 0;
        loop {
            tries += 1;
            let fetched = (blk != 0).then(|| self.xattr_block(ino, blk));
            let raw = inode.raw();
            let now = crate::inode::write::rec_ref(&raw).file_acl();
            if now != blk && tries < 4 {
                blk = now;
                continue;
            }
            let buf = match fetched {
                _ if now != blk => (now != 0).then(|| self.xattr_block(ino, now)).transpose()?,
                f => f.transpose()?,
            };
            self.ibody_xattrs(ino, &raw, out)?;
            if let Some(buf) = buf {
                let data = buf.data();
                let entries = &data[fx::BLOCK_HEADER_SIZE..];
                self.collect(ino, Some(now), entries, &data, fx::BLOCK_HEADER_SIZE, out)?;
                // Known good: a candidate for sharing (the kernel's mbcache learns blocks as
                // they are read, too), unless its last reference is gone: the inode may be
                // dying, its block released (and dropped from the cache) since the record
                // was read; the release zeroes the count under the lock held here.
                let hash = u32::from_le_bytes([data[12], data[13], data[14], data[15]]);
                if data[4..8] != [0; 4] {
                    self.xattr_cache.insert(hash, now);
                }
            }
            // Values in EA inodes, still under the record's read lock: a change that replaces
            // or removes one (and may free its EA inode) holds the write lock. Owner record
            // before EA inode record, as writers take them.
            let owner = crate::xattr::ea_inode::EaOwner::new(ino, &raw);
            for x in out.iter_mut() {
                if let Some((vino, size)) = x.ea_inode {
                    x.value = self.ea_inode_value(owner, vino, size)?;
                }
            }
            return Ok(());
        }
    }

    fn ibody_xattrs(&self, ino: InodeNo, raw: &[u8], out: &mut Vec<Xattr>) -> Result<()> {
        let size = self.sbi.inode_size;
        if size <= GOOD_OLD_INODE_SIZE {
            return Ok(());
        }
        let start = GOOD_OLD_INODE_SIZE + usize::from(crate::inode::write::rec_ref(raw).extra_isize());
        let Some(magic) = raw.get(start..start + 4) else {
            return Ok(());
        };
        if u32::from_le_bytes([magic[0], magic[1], magic[2], magic[3]]) != fx::XATTR_MAGIC {
            return Ok(());
        }
        let area = &raw[start + 4..];
        self.collect(ino, None, area, area, 0, out)
    }

    /// Xattr block `blk` of inode `ino`, its header and checksum checked (once per load).
    pub(in crate::xattr) fn xattr_block(&self, ino: InodeNo, blk: u64) -> Result<Arc<Buffer>> {
        let buf = self.bread_owned(ino, blk)?;
        let (csum, seed) = (self.sbi.metadata_csum, self.sbi.csum_seed);
        buf.verify(Verified::XattrBlock, |data| {
            let magic = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
            let blocks = u32::from_le_bytes([data[8], data[9], data[10], data[11]]);
            if magic != fx::XATTR_MAGIC || blocks != 1 {
                let what = "bad block header";
                return corrupt(CorruptKind::Xattr { ino, block: Some(PhysBlock(blk)), what });
            }
            if csum && !fx::verify_block_checksum(data, seed, blk) {
                return corrupt(CorruptKind::XattrChecksum { ino, block: PhysBlock(blk) });
            }
            Ok(())
        })?;
        Ok(buf)
    }

    /// Reads the entries in `entries` with values in `values`; `entries_at` is where the entry
    /// table starts within `values`.
    fn collect(
        &self,
        ino: InodeNo,
        blk: Option<u64>,
        entries: &[u8],
        values: &[u8],
        entries_at: usize,
        out: &mut Vec<Xattr>,
    ) -> Result<()> {
        let block = blk.map(PhysBlock);
        let bad = |what| corrupt(CorruptKind::Xattr { ino, block, what });
        let mut it = XattrIter::new(entries);
        let mut found: Vec<RawXattr<'_>> = Vec::new();
        for e in it.by_ref() {
            match e {
                Ok(e) => found.push(e),
                Err(_) => return bad("entry runs past the end of its area"),
            }
        }
        let entries_end = entries_at + it.end();
        for e in found {
            let (value, ea_inode) = if e.value_inum != 0 {
                (Vec::new(), Some((e.value_inum, e.value_size)))
            } else {
                match fx::value_slice(values, entries_end, &e) {
                    Ok(v) => (v.to_vec(), None),
                    Err(_) => return bad("value outside its area"),
                }
            };
            out.push(Xattr { index: e.index, name: e.name.to_vec(), value, ea_inode });
        }
        Ok(())
    }

    fn ea_inode_value(
        &self,
        owner: crate::xattr::ea_inode::EaOwner,
        value_inum: u32,
        value_size: u32,
    ) -> Result<Vec<u8>> {
        let ino = owner.ino;
        let bad = |what| corrupt(CorruptKind::Xattr { ino, block: None, what });
        if !self.sbi.ea_inode {
            return bad("value in an inode without the ea_inode feature");
        }
        if value_size > VALUE_MAX {
            return bad("value too large");
        }
        if value_inum == ino.0 {
            return bad("value inode is the inode itself");
        }
        let vino = self.iget(InodeNo(value_inum))?;
        if vino.flags() & EA_INODE_FL == 0 || vino.size() != u64::from(value_size) {
            return bad("value inode does not match its entry");
        }
        let mut v = vec![0u8; value_size as usize];
        let n = self.read_data(&vino, 0, &mut v)?;
        if n != v.len() {
            return bad("value inode shorter than its entry");
        }
        // A candidate for sharing, as the kernel's `ext4_xattr_inode_get` records it.
        self.ea_inode_seen(&vino, owner);
        Ok(v)
    }

    /// `getxattr(2)`: the value of a full name (`user.x`, `system.posix_acl_access`, ...).
    pub(crate) fn getxattr(&self, inode: &Inode, name: &[u8]) -> Result<Vec<u8>> {
        let (index, suffix) = visible_split(name)?;
        for x in self.xattrs(inode)? {
            if x.index == index && x.name == suffix {
                return match index {
                    fx::INDEX_POSIX_ACL_ACCESS | fx::INDEX_POSIX_ACL_DEFAULT => {
                        let what = "malformed ACL";
                        let e = CorruptKind::Xattr { ino: inode.ino, block: None, what };
                        fx::acl_disk_to_xattr(&x.value).ok_or(Error::Corrupt(crate::error::Corrupt(e)))
                    }
                    _ => Ok(x.value),
                };
            }
        }
        Err(Error::NoData)
    }

    /// `listxattr(2)`: the full names the VFS would show.
    pub(crate) fn listxattr(&self, inode: &Inode) -> Result<Vec<Vec<u8>>> {
        Ok(self
            .xattrs(inode)?
            .into_iter()
            .filter(|x| is_visible(x.index))
            .filter_map(|x| fx::full_name(x.index, &x.name))
            .collect())
    }

    /// The value of the inline-data attribute `system.data` in inode `ino`'s record `raw`,
    /// if present.
    pub(crate) fn system_data_in(&self, ino: InodeNo, raw: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut out = Vec::new();
        self.ibody_xattrs(ino, raw, &mut out)?;
        Ok(out.into_iter().find(|x| x.index == fx::INDEX_SYSTEM && x.name == b"data").map(|x| x.value))
    }
}

/// Namespaces the kernel's ext4 handlers show through the VFS.
fn is_visible(index: u8) -> bool {
    matches!(
        index,
        fx::INDEX_USER
            | fx::INDEX_TRUSTED
            | fx::INDEX_SECURITY
            | fx::INDEX_POSIX_ACL_ACCESS
            | fx::INDEX_POSIX_ACL_DEFAULT
    )
}

fn visible_split(name: &[u8]) -> Result<(u8, &[u8])> {
    if name.is_empty() || name.len() > 255 {
        return Err(Error::Range);
    }
    match fx::split_name(name) {
        Some((index, suffix)) if is_visible(index) => Ok((index, suffix)),
        _ => Err(Error::NotSupported("xattr namespace".into())),
    }
}
