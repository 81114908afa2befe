//! Changing inline directories and inline files (the write side of the kernel's `inline.c`).
//!
//! An inline file keeps its first 60 bytes in `i_block` and the rest in the value of
//! `system.data`. Writes and truncates that fit in the record are made there; a file that
//! never had a block goes inline on its first such write (`write_inline`,
//! `truncate_inline`); anything larger moves the bytes into a block first (data/write.rs).
//!
//! An inline directory keeps its parent's inode number in the first 4 bytes of `i_block`,
//! and its entries in two areas: the other 56 bytes of `i_block`, and the value of the
//! `system.data` attribute (empty for a new one). Each area is laid out like a leaf block,
//! its last entry reaching the area's end; the size is 60 plus the attribute's length.
//! Names are added, removed and repointed in place, in either area, under the directory's
//! record lock (readers take it to read both areas at once). When a new name fits in
//! neither area, the entries move into a block of their own and the directory becomes an
//! ordinary one-block directory, as the kernel does once an inline directory is full
//! (`ext4_convert_inline_dir`). Before that, a directory whose `system.data` is still empty
//! gets all the free attribute space of its record as its second area, once, as the kernel's
//! `ext4_update_inline_dir` gives it. On `inline_data` filesystems new directories start
//! inline, as the kernel's `ext4_try_create_inline_dir` makes them.

use crate::alloc::reserved::Pool;
use crate::data::inline::I_BLOCK_SIZE;
use crate::dir::dx_write::NamesMoving;
use crate::dir::write::put_entry;
use crate::error::{corrupt, CorruptKind, Result};
use crate::fs::FsInner;
use crate::inode::write::{raw_blocks, raw_flags, raw_set_flags, raw_set_size, raw_size, raw_touch_cm};
use crate::inode::Inode;
use crate::jbd2::transaction::Handle;
use crate::map::extents_write::I_BLOCK;
use crate::num::usize_from;
use rext4_format::dirent::{self as fd, DirBlockIter};
use rext4_format::inode::{EXTENTS_FL, INLINE_DATA_FL};
use rext4_format::xattr::INDEX_SYSTEM;
use rext4_format::InodeNo;

/// Entry-area offset of the first entry after the parent's inode number.
const FIRST_ENTRY: usize = 4;

impl FsInner {
    /// Turns record `raw` of inode `ino` from inline into an empty block-mapped one: no
    /// `system.data` attribute, no inline flag, and an empty extent root (or block map) in
    /// `i_block`, ready for blocks to be mapped (files and directories alike).
    pub(super) fn clear_inline_record(&self, ino: InodeNo, raw: &mut [u8]) -> Result<()> {
        self.ibody_remove(ino, raw, rext4_format::xattr::INDEX_SYSTEM, b"data")?;
        let extents = self.sbi.sb.incompat().contains(rext4_format::features::Incompat::EXTENTS);
        let flags = (raw_flags(raw) & !INLINE_DATA_FL) | if extents { EXTENTS_FL } else { 0 };
        raw_set_flags(raw, flags);
        raw[I_BLOCK].fill(0);
        if extents {
            crate::map::extents_write::init_root(raw);
        }
        Ok(())
    }

    /// Moves the entries of inline directory `dir` into a newly allocated block, in handle
    /// `h`; does nothing if `dir` is not inline. The caller holds `dir`'s `op_lock`.
    pub(crate) fn inline_dir_to_block(&self, h: &Handle, dir: &Inode) -> Result<()> {
        if !self.has_inline_data(dir) {
            return Ok(());
        }
        let (parent, data) = self.inline_dir(dir)?;
        let bs = self.sbi.block_size;
        let ft_dir = if self.sbi.filetype { fd::FT_DIR } else { 0 };
        let mut entries: Vec<(u32, &[u8], u8)> = vec![(dir.ino.0, b".", ft_dir), (parent.0, b"..", ft_dir)];
        let areas =
            [&data[FIRST_ENTRY..I_BLOCK_SIZE.min(data.len())], data.get(I_BLOCK_SIZE..).unwrap_or(&[])];
        for area in areas {
            // `inline_dir` checked every entry: the iterator yields no errors here.
            for e in DirBlockIter::new(area, bs).map_while(|e| e.ok()) {
                if e.inode != 0 {
                    entries.push((e.inode, e.name, e.file_type));
                }
            }
        }
        let area = self.entry_area();
        let used: usize = entries.iter().map(|e| fd::rec_len_for(e.1.len())).sum();
        if used > area {
            return corrupt(CorruptKind::InlineData { ino: dir.ino, what: "entries do not fit in a block" });
        }
        let mut block = vec![0u8; bs as usize];
        let mut off = 0;
        for (i, (ino, name, ft)) in entries.iter().enumerate() {
            let len = if i + 1 == entries.len() { area - off } else { fd::rec_len_for(name.len()) };
            put_entry(&mut block, off, bs, *ino, len, name, *ft);
            off += len;
        }
        self.seal_leaf(dir, &mut block);

        // Lookups and readdirs without the op_lock retry while the entries move.
        let _moving = NamesMoving::new(dir);
        let _d = self.stats.write(crate::fs::stats::LockClass::DataSem, &dir.data_sem);
        let mut raw = dir.raw_mut();
        // Without a block (a full disk, a quota) the directory stays inline, in memory too.
        let saved = raw.to_vec();
        let pblk = match self
            .clear_inline_record(dir.ino, &mut raw)
            .and_then(|()| self.append_block(h, dir, &mut raw, 0, Pool::Ordinary))
        {
            Ok(p) => p,
            Err(e) => {
                raw.copy_from_slice(&saved);
                return Err(e);
            }
        };
        let buf = self.bcache.get_fresh(pblk);
        h.write(&buf)?.copy_from_slice(&block);
        self.mark_inode_dirty(h, dir, &mut raw)
    }

    /// `edit_leaf` for inline directory `dir`: `probe` and `apply` see the `i_block` area,
    /// then the `system.data` area. The caller holds `dir`'s `op_lock`.
    pub(crate) fn edit_inline<T, R>(
        &self,
        h: &Handle,
        dir: &Inode,
        probe: impl Fn(&[u8]) -> Option<T>,
        apply: impl FnOnce(&mut [u8], T) -> R,
    ) -> Result<Option<R>> {
        let mut raw = dir.raw_mut();
        let first = I_BLOCK.start + FIRST_ENTRY..I_BLOCK.end;
        if let Some(found) = probe(&raw[first.clone()]) {
            let r = apply(&mut raw[first], found);
            self.mark_inode_dirty(h, dir, &mut raw)?;
            return Ok(Some(r));
        }
        let Some(mut more) = self.system_data_in(dir.ino, &raw)? else {
            return corrupt(CorruptKind::InlineData { ino: dir.ino, what: "no system.data attribute" });
        };
        let Some(found) = probe(&more) else { return Ok(None) };
        let r = apply(&mut more, found);
        // Same length: the value is rewritten where it is.
        self.ibody_put(dir.ino, &mut raw, INDEX_SYSTEM, b"data", &more)?;
        self.mark_inode_dirty(h, dir, &mut raw)?;
        Ok(Some(r))
    }

    /// Gives inline directory `dir` a second area when it has none: `system.data` grows to
    /// all the room the record's attribute space has, as one unused entry
    /// (`ext4_update_inline_dir`). Returns whether it grew; not when the room would not hold
    /// even a one-character name, as in the kernel.
    pub(crate) fn inline_grow(&self, h: &Handle, dir: &Inode) -> Result<bool> {
        let mut raw = dir.raw_mut();
        let Some(more) = self.system_data_in(dir.ino, &raw)? else { return Ok(false) };
        if !more.is_empty() {
            return Ok(false);
        }
        let Some(room) = inline_xattr_room(&raw) else { return Ok(false) };
        if room <= fd::rec_len_for(1) {
            return Ok(false);
        }
        let mut area = vec![0u8; room];
        put_entry(&mut area, 0, self.sbi.block_size, 0, room, b"", 0);
        match self.ibody_put(dir.ino, &mut raw, INDEX_SYSTEM, b"data", &area) {
            Err(crate::error::Error::NoSpace) => return Ok(false),
            r => r?,
        };
        crate::inode::write::raw_set_size(&mut raw, (I_BLOCK_SIZE + room) as u64);
        self.mark_inode_dirty(h, dir, &mut raw)?;
        Ok(true)
    }

    /// Points inline directory `dir`'s `..` at `parent`; returns the old parent.
    pub(crate) fn inline_set_parent(&self, h: &Handle, dir: &Inode, parent: InodeNo) -> Result<InodeNo> {
        let mut raw = dir.raw_mut();
        let at = I_BLOCK.start..I_BLOCK.start + FIRST_ENTRY;
        let old =
            u32::from_le_bytes([raw[at.start], raw[at.start + 1], raw[at.start + 2], raw[at.start + 3]]);
        raw[at].copy_from_slice(&parent.0.to_le_bytes());
        self.mark_inode_dirty(h, dir, &mut raw)?;
        Ok(InodeNo(old))
    }

    /// Writes `data` at `offset` of regular file `inode` inside its record, when the file is
    /// an inline one or one without blocks on an `inline_data` filesystem, and the
    /// bytes up to the end of the write fit (`ext4_try_to_write_inline_data`): the first 60 in
    /// `i_block`, the rest in `system.data`, which grows to the end of the write and never
    /// shrinks here. `None` (nothing changed) when they do not fit: the caller moves the data
    /// to blocks. The caller holds the file's `op_lock`.
    pub(super) fn write_inline(
        &self,
        journal: &std::sync::Arc<crate::jbd2::journal::Journal>,
        inode: &Inode,
        offset: u64,
        data: &[u8],
    ) -> Result<Option<usize>> {
        // Without a handle first: most writes cannot fit (the record bounds the inline bytes).
        let Some(end) = offset.checked_add(data.len() as u64) else { return Ok(None) };
        if !self.sbi.inline_data || end > self.sbi.inode_size as u64 || !may_inline(inode, &inode.raw()) {
            return Ok(None);
        }
        let h = journal.start(crate::data::write::DATA_CREDITS)?;
        let _d = self.stats.write(crate::fs::stats::LockClass::DataSem, &inode.data_sem);
        let mut raw = inode.raw_mut();
        // `may_inline` still holds: only writers holding the op_lock change it.
        if end > max_inline_size(&raw) as u64 {
            return Ok(None);
        }
        let inline = raw_flags(&raw) & INLINE_DATA_FL != 0;
        let size = raw_size(&raw);
        // Both within the record (checked above).
        let (offset, end) = (usize_from(offset), usize_from(end));
        let mut bytes = raw[I_BLOCK].to_vec();
        if inline {
            bytes.extend(self.system_data_in(inode.ino, &raw)?.unwrap_or_default());
        } else {
            bytes.fill(0);
        }
        if bytes.len() < end {
            bytes.resize(end, 0);
        }
        bytes[offset..end].copy_from_slice(data);
        match self.ibody_put(inode.ino, &mut raw, INDEX_SYSTEM, b"data", &bytes[I_BLOCK_SIZE..]) {
            // The attribute code found less room than `max_inline_size`: blocks, then.
            Err(crate::error::Error::NoSpace) => return Ok(None),
            r => r?,
        }
        raw[I_BLOCK].copy_from_slice(&bytes[..I_BLOCK_SIZE]);
        let flags = (raw_flags(&raw) | INLINE_DATA_FL) & !EXTENTS_FL;
        raw_set_flags(&mut raw, flags);
        if end as u64 > size {
            raw_set_size(&mut raw, end as u64);
        }
        if self.write_stamps_times() {
            raw_touch_cm(&mut raw, self.now());
        }
        self.mark_inode_dirty(&h, inode, &mut raw)?;
        Ok(Some(data.len()))
    }

    /// Truncates inline file `inode` to `new_size` in its record, when that keeps it inline
    /// (`ext4_inline_data_truncate`): shrinking drops the bytes past the end (`system.data`
    /// keeps only what lies past `i_block`'s 60 bytes), growing within the inline bytes only
    /// moves the size. `false` (nothing changed) when the file is not inline or would grow
    /// past its inline bytes: the caller moves it to blocks first, as the kernel does. The
    /// caller holds the file's `op_lock`.
    pub(super) fn truncate_inline(
        &self,
        journal: &std::sync::Arc<crate::jbd2::journal::Journal>,
        inode: &Inode,
        new_size: u64,
    ) -> Result<bool> {
        let h = journal.start(crate::data::write::DATA_CREDITS)?;
        let _d = self.stats.write(crate::fs::stats::LockClass::DataSem, &inode.data_sem);
        let mut raw = inode.raw_mut();
        if raw_flags(&raw) & INLINE_DATA_FL == 0 {
            return Ok(false);
        }
        let value = self.system_data_in(inode.ino, &raw)?.unwrap_or_default();
        let size = raw_size(&raw);
        if new_size > (I_BLOCK_SIZE + value.len()) as u64 {
            return Ok(false);
        }
        if new_size < size {
            let keep = usize_from(new_size);
            let value = &value[..keep.saturating_sub(I_BLOCK_SIZE).min(value.len())];
            self.ibody_put(inode.ino, &mut raw, INDEX_SYSTEM, b"data", value)?;
            if keep < I_BLOCK_SIZE {
                raw[I_BLOCK.start + keep..I_BLOCK.end].fill(0);
            }
        }
        if new_size != size {
            raw_set_size(&mut raw, new_size);
        }
        raw_touch_cm(&mut raw, self.now());
        self.mark_inode_dirty(&h, inode, &mut raw)?;
        Ok(true)
    }

    /// Makes new directory `dir` (record `raw`, not yet named anywhere) an empty inline
    /// directory under `parent`: the parent's number, one unused entry over the rest of
    /// `i_block`, and an empty `system.data`. `NoSpace` (record unchanged) if the record has
    /// no room for the attribute.
    pub(crate) fn init_inline_dir(&self, dir: &Inode, raw: &mut [u8], parent: InodeNo) -> Result<()> {
        self.ibody_put(dir.ino, raw, INDEX_SYSTEM, b"data", &[])?;
        let flags = (raw_flags(raw) | INLINE_DATA_FL) & !EXTENTS_FL;
        raw_set_flags(raw, flags);
        let ib = &mut raw[I_BLOCK];
        ib.fill(0);
        ib[..FIRST_ENTRY].copy_from_slice(&parent.0.to_le_bytes());
        put_entry(&mut ib[FIRST_ENTRY..], 0, self.sbi.block_size, 0, I_BLOCK_SIZE - FIRST_ENTRY, b"", 0);
        crate::inode::write::raw_set_size(raw, I_BLOCK_SIZE as u64);
        Ok(())
    }
}

/// Whether `inode` (record `raw`) keeps its data inline, or may start to: one that never had
/// a block may, whatever its size (the kernel's `EXT4_STATE_MAY_INLINE_DATA`), unless delayed
/// writes hold its data until they get blocks (data/delalloc.rs).
fn may_inline(inode: &Inode, raw: &[u8]) -> bool {
    // Encrypted contents are never inline (`ext4_set_context` moves them out).
    if raw_flags(raw) & rext4_format::inode::ENCRYPT_FL != 0 {
        return false;
    }
    raw_flags(raw) & INLINE_DATA_FL != 0
        || (raw_blocks(raw) == 0 && inode.dirty_pages.load(std::sync::atomic::Ordering::Acquire) == 0)
}

/// The most bytes `system.data` could hold in record `raw`, which has the attribute
/// (`get_max_inline_xattr_value_size`): the free space between the entry table (and its
/// terminator) and the lowest value, plus the attribute's own value.
fn inline_xattr_room(raw: &[u8]) -> Option<usize> {
    match ibody_room(raw)? {
        (free, Some(value)) => Some(free + value),
        (_, None) => None,
    }
}

/// The free bytes of record `raw`'s attribute space (between the entry table and its
/// terminator, and the lowest value), and the rounded size of `system.data`'s value if the
/// record has that attribute. `None` if the record has no attribute space or it is damaged.
fn ibody_room(raw: &[u8]) -> Option<(usize, Option<usize>)> {
    let first = crate::xattr::area::ibody_first(raw)?;
    let Some(area) = crate::xattr::area::ibody_area(raw) else {
        // No attribute yet: the whole space, less the terminator.
        return (raw.len() - first).checked_sub(4).map(|f| (f, None));
    };
    let (ents, end) = crate::xattr::area::entries(area, 0).ok()?;
    let min_offs = ents
        .iter()
        .filter(|e| e.value_inum == 0 && e.value_size != 0)
        .map(|e| e.value_offs)
        .fold(area.len(), usize::min);
    let free = min_offs.checked_sub(end + 4)?;
    let data = ents.iter().find(|e| e.index == INDEX_SYSTEM && e.name(area) == b"data");
    Some((free, data.map(|d| rext4_format::xattr::value_size(d.value_size))))
}

/// The most bytes of file data record `raw` can hold inline (`ext4_get_max_inline_size`):
/// `i_block` and all the room `system.data` could take, adding the attribute's entry if it
/// is not there yet; 0 when the attribute could hold nothing.
fn max_inline_size(raw: &[u8]) -> usize {
    let value = match ibody_room(raw) {
        Some((free, Some(value))) => free + value,
        // The new entry's header and name ("data", rounded), then whole words of value.
        Some((free, None)) => match free.saturating_sub(rext4_format::xattr::ENTRY_HEADER_SIZE + 4) {
            f if f > 3 => f & !3,
            _ => 0,
        },
        None => 0,
    };
    if value == 0 {
        0
    } else {
        I_BLOCK_SIZE + value
    }
}
