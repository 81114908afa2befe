//! Adding and removing directory entries (the write side of the kernel's `namei.c`:
//! `add_dirent_to_buf`, `ext4_delete_entry`, `ext4_append`). Linear directories are scanned
//! block by block; in indexed (htree) ones the index names the leaf (see dir/dx_write.rs, which
//! also turns a full one-block directory into an indexed one). Inline directories are refused.
//!
//! # Locking
//! The directory's `op_lock` is held by the caller; then the handle; then the directory's
//! record and its blocks.

use crate::alloc::reserved::Pool;
use crate::cache::buffer::{Buffer, Verified};
use crate::dir::lookup::Room;
use crate::dir::DirBlockKind;
use crate::error::{Error, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use crate::jbd2::transaction::Handle;
use rext4_format::dirent::{self as fd, DirBlockIter};
use rext4_format::hash::DxHash;
use rext4_format::inode::EXTENTS_FL;
use rext4_format::InodeNo;
use zerocopy::IntoBytes;

/// Where a new entry goes in a leaf: `(offset, rec_len, bytes in use, inode)` of the entry
/// whose slack (or, if unused, whole length) takes it.
pub(crate) type Slot = fd::Room;

/// The slot entry `e` offers an entry of `need` bytes, if it has room (`extra`: what each
/// live entry carries past its name, `FsInner::dirent_extra`).
pub(super) fn entry_slot(e: &fd::RawEntry<'_>, need: usize, extra: usize) -> Option<Slot> {
    let room = fd::room_of((e.inode, e.rec_len as usize, e.name.len()), e.offset, extra);
    (room.1 >= room.2 + need).then_some(room)
}

/// The on-disk `rec_len` of an entry `len` bytes long, in blocks of `bs` bytes.
// Cannot truncate: an entry's length is at most its block's size, a u32.
#[allow(clippy::cast_possible_truncation)]
pub(crate) fn rec_len_disk(len: usize, bs: u32) -> u16 {
    fd::rec_len_to_disk(len as u32, bs)
}

/// Writes one entry at `off` of `block`. `name` is at most 255 bytes: callers check new names
/// (`check_name`) and copy the others from entries.
pub(crate) fn put_entry(
    block: &mut [u8],
    off: usize,
    bs: u32,
    ino: u32,
    rec_len: usize,
    name: &[u8],
    ft: u8,
) {
    debug_assert!(name.len() <= 255);
    let h = fd::DirEntryHeader {
        inode: ino.into(),
        rec_len: rec_len_disk(rec_len, bs).into(),
        name_len: u8::try_from(name.len()).unwrap_or(u8::MAX),
        file_type: ft,
    };
    block[off..off + fd::HEADER_SIZE].copy_from_slice(h.as_bytes());
    block[off + fd::HEADER_SIZE..off + fd::HEADER_SIZE + name.len()].copy_from_slice(name);
}

/// Writes `hash` after the name (of `name_len` bytes) of the entry at `off` of `block`.
pub(crate) fn put_hash(block: &mut [u8], off: usize, name_len: usize, hash: DxHash) {
    let at = off + fd::rec_len_for(name_len);
    block[at..at + 4].copy_from_slice(&hash.major.to_le_bytes());
    block[at + 4..at + fd::HASH_LEN].copy_from_slice(&hash.minor.to_le_bytes());
}

impl FsInner {
    pub(crate) fn entry_area(&self) -> usize {
        self.sbi.block_size as usize - if self.sbi.metadata_csum { fd::TAIL_SIZE } else { 0 }
    }

    pub(crate) fn seal_leaf(&self, dir: &Inode, block: &mut [u8]) {
        if self.sbi.metadata_csum {
            fd::set_leaf_tail(block, dir.csum_seed);
        }
    }

    /// Seals leaf `buf` of `dir` after an edit in place (`block`: its contents, under the
    /// write lock): the checksum is left to each commit's copy (`Buffer::leaf_seal`), so a
    /// leaf taking a hundred entries in one transaction is checksummed once, not a hundred
    /// times; and the block stays verified, so the next lookup does not check it again.
    pub(crate) fn seal_leaf_in(&self, dir: &Inode, buf: &Buffer, block: &mut [u8]) {
        if self.sbi.metadata_csum {
            buf.seal_leaf_later(block, dir.csum_seed);
        }
        buf.mark_verified(Verified::DirLeaf);
    }

    /// Finds the first leaf block of `dir` in which `probe` finds something, lets `apply`
    /// change that block, and seals it with its checksum. The caller holds `dir`'s `op_lock`,
    /// which every change to a directory's entries takes (rename takes the moved directory's
    /// too), so what `probe` found still holds when `apply` runs. `None` if no block matched.
    /// In an indexed directory only the leaves the index gives for `name` are searched (all
    /// leaves if the index is unusable, as the kernel falls back). `probe` and `apply` see a
    /// block's entry area, or one of an inline directory's two areas (data/inline_write.rs).
    fn edit_leaf<T, R>(
        &self,
        h: &Handle,
        dir: &Inode,
        name: &[u8],
        probe: impl Fn(&[u8]) -> Option<T>,
        apply: impl FnOnce(&mut [u8], T) -> R,
    ) -> Result<Option<R>> {
        if self.has_inline_data(dir) {
            return self.edit_inline(h, dir, probe, apply);
        }
        let nblocks = dir.size().div_ceil(u64::from(self.sbi.block_size));
        let mut hashed =
            if self.is_dx(dir) { self.dx_leaves_for(dir, name)? } else { None }.map(Vec::into_iter);
        let mut next = 0u64;
        loop {
            let lblk = match hashed.as_mut() {
                Some(leaves) => match leaves.next() {
                    Some(l) => l,
                    None => break,
                },
                None => {
                    let Some(l) = self.next_dir_block(dir, next, nblocks)? else { break };
                    next = u64::from(l) + 1;
                    l
                }
            };
            let Some((DirBlockKind::Leaf, buf)) = self.dir_block_any(dir, lblk)? else { continue };
            let area = self.entry_area();
            let Some(found) = probe(&buf.data()[..area]) else { continue };
            // Probed once: the caller's op_lock keeps this directory's entries as they were
            // read (write access copies a committing block for the commit, not for us).
            let mut block = h.write(&buf)?;
            let r = apply(&mut block[..area], found);
            self.seal_leaf_in(dir, &buf, &mut block);
            return Ok(Some(r));
        }
        Ok(None)
    }

    /// The live entries of a leaf block's entry area.
    pub(super) fn leaf_iter<'a>(&self, block: &'a [u8]) -> impl Iterator<Item = fd::RawEntry<'a>> + 'a {
        self.area_iter(&block[..self.entry_area()])
    }

    /// The live entries of an entry area (a block's, or an inline directory's).
    pub(super) fn area_iter<'a>(&self, area: &'a [u8]) -> impl Iterator<Item = fd::RawEntry<'a>> + 'a {
        DirBlockIter::new(area, self.sbi.block_size).map_while(|e| e.ok())
    }

    /// Where in a leaf block an entry of `need` bytes fits: see [`FsInner::area_slot`].
    pub(super) fn leaf_slot(&self, block: &[u8], need: usize, extra: usize) -> Option<Slot> {
        self.area_slot(&block[..self.entry_area()], need, extra)
    }

    /// Where in an entry area an entry of `need` bytes fits: an entry whose slack (or, if
    /// unused, whole length) holds it, as `(offset, rec_len, bytes in use, inode)` (`extra`:
    /// see [`entry_slot`]).
    pub(super) fn area_slot(&self, area: &[u8], need: usize, extra: usize) -> Option<Slot> {
        self.area_iter(area).find_map(|e| entry_slot(&e, need, extra))
    }

    /// Whether `slot` still describes the entry at its offset of `area` (found by an earlier
    /// scan of the same block).
    pub(super) fn slot_holds(&self, area: &[u8], slot: Slot, extra: usize) -> bool {
        let off = slot.0;
        fd::header_at(area, off, self.sbi.block_size)
            .is_some_and(|h| fd::room_of(h, off, extra) == slot && off + h.1 <= area.len())
    }

    /// Writes `name` -> `ino` into the slot `leaf_slot` found, with the name's `hash` after it
    /// in a directory whose entries carry theirs.
    pub(super) fn leaf_put(
        &self,
        block: &mut [u8],
        (off, rec_len, used, cur): Slot,
        name: &[u8],
        ino: InodeNo,
        ft: u8,
        hash: Option<DxHash>,
    ) {
        let bs = self.sbi.block_size;
        let ft = if self.sbi.filetype { ft } else { 0 };
        let at = if cur == 0 {
            put_entry(block, off, bs, ino.0, rec_len, name, ft);
            off
        } else {
            block[off + 4..off + 6].copy_from_slice(&rec_len_disk(used, bs).to_le_bytes());
            put_entry(block, off + used, bs, ino.0, rec_len - used, name, ft);
            off + used
        };
        if let Some(h) = hash {
            put_hash(block, at, name.len(), h);
        }
    }

    /// Adds `name` -> `ino` to directory `dir` (whose `op_lock` the caller holds). A linear
    /// directory gets a new block when no block has room, or is indexed when it is one full
    /// block and the filesystem has dir_index (the kernel's `make_indexed_dir`).
    pub(crate) fn add_entry(&self, h: &Handle, dir: &Inode, name: &[u8], ino: InodeNo, ft: u8) -> Result<()> {
        self.add_entry_in(h, dir, name, ino, ft, None)
    }

    /// [`FsInner::add_entry`], with the room `ensure_absent` found when it checked the name.
    pub(crate) fn add_entry_in(
        &self,
        h: &Handle,
        dir: &Inode,
        name: &[u8],
        ino: InodeNo,
        ft: u8,
        room: Option<Room>,
    ) -> Result<()> {
        let _t = self.stats.time(crate::fs::stats::Op::AddEntry);
        let steps = || -> Result<()> {
            let bs = self.sbi.block_size;
            let hash = self.new_entry_hash(dir, name)?;
            if self.is_dx(dir) {
                return self.dx_add_entry(h, dir, (name, ino, ft, hash), room);
            }
            let extra = self.dirent_extra(dir);
            let need = fd::rec_len_for(name.len()) + extra;
            let fits = |area: &[u8]| self.area_slot(area, need, extra);
            let put = |area: &mut [u8], slot| self.leaf_put(area, slot, name, ino, ft, hash);
            if self.edit_leaf(h, dir, name, fits, put)?.is_some() {
                return Ok(());
            }
            if self.has_inline_data(dir) {
                // `i_block` is full: the attribute space takes the name if it can, once given to
                // the directory; else the entries move into a block (`ext4_try_add_inline_entry`).
                if self.inline_grow(h, dir)? && self.edit_inline(h, dir, fits, put)?.is_some() {
                    return Ok(());
                }
                self.inline_dir_to_block(h, dir)?;
                return self.add_entry(h, dir, name, ino, ft);
            }
            let nblocks = dir.size().div_ceil(u64::from(bs));
            if nblocks == 1 && self.can_index() {
                return self.make_indexed_dir(h, dir, (name, ino, ft, hash));
            }
            // No room: a new block at the end.
            let ft = if self.sbi.filetype { ft } else { 0 };
            let lblk = u32::try_from(nblocks).map_err(|_| Error::NoSpace)?;
            // Readers map directory blocks under data_sem: keep them off the tree being edited,
            // and off the new block until it holds its entry.
            let _d = self.stats.write(crate::fs::stats::LockClass::DataSem, &dir.data_sem);
            let pblk = self.append_block(h, dir, &mut dir.raw_mut(), lblk, Pool::Ordinary)?;
            let buf = self.bcache.get_fresh(pblk);
            let mut block = h.write(&buf)?;
            block.fill(0);
            put_entry(&mut block, 0, bs, ino.0, self.entry_area(), name, ft);
            if let Some(h) = hash {
                put_hash(&mut block, 0, name.len(), h);
            }
            self.seal_leaf_in(dir, &buf, &mut block);
            Ok(())
        };
        let added = steps();
        if added.is_err() {
            // Refused after a step that grew the directory (an index node split, an inline
            // directory moved to a block, then no block for the leaf): the record in memory
            // has the new block, and the log must too, as the caller journals the directory
            // only on success.
            self.mark_inode_dirty(h, dir, &mut dir.raw_mut())?;
        }
        added
    }

    /// Allocates a block from `pool` and maps it at `lblk` of `inode` (record `raw`), growing
    /// size and block count, in an extent tree or a block map.
    pub(crate) fn append_block(
        &self,
        h: &Handle,
        inode: &Inode,
        raw: &mut [u8],
        lblk: u32,
        pool: Pool,
    ) -> Result<u64> {
        self.quota_blocks_allowed(inode, raw, 1)?;
        let map = |raw: &mut [u8]| -> Result<u64> {
            if crate::inode::write::raw_flags(raw) & EXTENTS_FL != 0 {
                return self.ext_append(h, inode, raw, lblk, pool);
            }
            // A block map (an indexed ext3 directory soon outgrows its twelve direct blocks).
            let prev = match lblk.checked_sub(1) {
                Some(p) => self.ind_lookup(inode, raw, u64::from(p))?,
                None => None,
            };
            let goal = prev.map_or_else(|| self.inode_goal(inode), |p| p + 1);
            self.ind_alloc(h, inode, raw, u64::from(lblk), goal, pool)
        };
        let added = map(raw);
        match added {
            Ok(_) => {
                crate::inode::write::raw_set_size(raw, (u64::from(lblk) + 1) * u64::from(self.sbi.block_size))
            }
            // The quota claimed for the block goes back with it.
            Err(_) => self.quota_unclaim_blocks(inode, 1),
        }
        added
    }

    /// Where new blocks of `inode` should go by default: the start of its group's data.
    pub(crate) fn inode_goal(&self, inode: &Inode) -> u64 {
        let g = (inode.ino.0 - 1) / self.sbi.inodes_per_group;
        self.sbi.group_first_block(g)
    }

    /// Removes `name` from directory `dir`; returns the inode it named.
    pub(crate) fn remove_entry(&self, h: &Handle, dir: &Inode, name: &[u8]) -> Result<InodeNo> {
        let _t = self.stats.time(crate::fs::stats::Op::DeleteEntry);
        let bs = self.sbi.block_size;
        let key = self.dir_name(dir, name);
        let find = |area: &[u8]| {
            let hit = fd::probe_key(area, bs, key.key(), None, 0).0?;
            Some((hit.prev, hit.offset, hit.rec_len, hit.inode))
        };
        let remove = |block: &mut [u8], (prev, off, rec_len, ino): (Option<usize>, usize, usize, u32)| {
            match prev {
                Some(p) => {
                    // Merge into the previous entry.
                    let prev_len =
                        fd::rec_len_from_disk(u16::from_le_bytes([block[p + 4], block[p + 5]]), bs) as usize;
                    block[p + 4..p + 6].copy_from_slice(&rec_len_disk(prev_len + rec_len, bs).to_le_bytes());
                }
                None => block[off..off + 4].fill(0),
            }
            InodeNo(ino)
        };
        self.edit_leaf(h, dir, name, find, remove)?.ok_or(Error::NotFound)
    }

    /// Points the existing entry `name` in `dir` at `ino` (type `ft`); returns the inode it
    /// named before.
    pub(crate) fn set_entry(
        &self,
        h: &Handle,
        dir: &Inode,
        name: &[u8],
        ino: InodeNo,
        ft: u8,
    ) -> Result<InodeNo> {
        if name == b".." && self.is_dx(dir) {
            return self.dx_set_dotdot(h, dir, ino, ft);
        }
        if name == b".." && self.has_inline_data(dir) {
            return self.inline_set_parent(h, dir, ino);
        }
        let ft = if self.sbi.filetype { ft } else { 0 };
        let bs = self.sbi.block_size;
        let key = self.dir_name(dir, name);
        let find =
            |area: &[u8]| fd::probe_key(area, bs, key.key(), None, 0).0.map(|hit| (hit.offset, hit.inode));
        let set = |block: &mut [u8], (off, old): (usize, u32)| {
            block[off..off + 4].copy_from_slice(&ino.0.to_le_bytes());
            block[off + 7] = ft;
            InodeNo(old)
        };
        self.edit_leaf(h, dir, name, find, set)?.ok_or(Error::NotFound)
    }

    /// Whether directory `dir` holds nothing but `.` and `..`.
    pub(crate) fn dir_is_empty(&self, dir: &Inode) -> Result<bool> {
        let mut empty = true;
        self.readdir(dir, 0, |e| {
            if e.name != b"." && e.name != b".." {
                empty = false;
            }
            empty
        })?;
        Ok(empty)
    }
}
