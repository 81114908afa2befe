//! One quota file (the kernel's `quota_tree.c` and `quota_v2.c`): where each id's entry is,
//! reading the tree once at open, and adding entries for new ids. Format: rext4-format's
//! `quota` module.
//!
//! # Locking
//! `QuotaFile::tree` (adding an entry: the tree's blocks and the info record) -> the quota
//! inode's `data_sem` and `raw` (growing the file) -> quota-file `Buffer::data`. Usage changes
//! take only `QuotaFile::entries` (read) and then the entry's buffer (write).

use crate::alloc::reserved::Pool;
use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use crate::jbd2::transaction::Handle;
use crate::map::Mapping;
use crate::sync::{Mutex, RwLock};
use rext4_format::quota::{
    self as fq, DataHeader, DiskDquot, DiskHeader, DiskInfo, DATA_HEADER, ENTRIES_PER_BLOCK, ENTRY, QT_BLOCK,
    QT_DEPTH, QT_TREEOFF,
};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use zerocopy::{FromBytes, IntoBytes};

/// Where an id's entry is: its quota block, and the filesystem block and byte offset that
/// hold it (quota files never move their blocks, so a charge needs no mapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    pub qblk: u32,
    pub pblk: u64,
    pub off: u32,
}

/// One quota type's file.
pub(crate) struct QuotaFile {
    /// The hidden quota inode, held while the filesystem is open. [immutable]
    pub inode: Arc<Inode>,
    /// Each id's entry. [own lock: read to charge, write to add]
    entries: RwLock<HashMap<u32, Slot>>,
    /// The info record as on disk (`dqi_blocks` and the free lists); held while an entry is
    /// added. [own lock; before the quota inode's locks]
    tree: Mutex<DiskInfo>,
    /// Space and inode grace periods in seconds, as the info record holds them: read by
    /// charges, which may not take `tree` under an entry's buffer. [atomics; written under
    /// `tree`]
    grace: [AtomicU32; 2],
}

/// Corruption of a quota file (the kernel refuses to turn quotas on, so the mount fails).
fn bad<T>(what: &'static str) -> Result<T> {
    corrupt(CorruptKind::Quota(what))
}

impl FsInner {
    /// The filesystem block holding quota block `qblk` of `q` and the quota block's offset in
    /// it. The file must already reach it.
    fn quota_pblk(&self, q: &Inode, qblk: u32) -> Result<(u64, usize)> {
        let bs = self.sbi.block_size as usize;
        let byte = u64::from(qblk) * QT_BLOCK as u64;
        let lblk = u32::try_from(byte / bs as u64).map_err(|_| Error::FileTooBig)?;
        match self.map_block(q, lblk)? {
            Mapping::Mapped { pblk, unwritten: false, .. } => {
                self.check_range(q.ino, pblk, 1)?;
                // Below the block size.
                Ok((pblk, crate::num::usize_from(byte % bs as u64)))
            }
            _ => bad("a block of the tree is not mapped"),
        }
    }

    /// The buffer holding quota block `qblk` of `q` and the block's offset in it.
    fn quota_block(&self, q: &Inode, qblk: u32) -> Result<(Arc<crate::cache::buffer::Buffer>, usize)> {
        let (pblk, off) = self.quota_pblk(q, qblk)?;
        Ok((self.bcache.get(pblk)?, off))
    }

    /// The slot of the entry at byte `off` of quota block `qblk`.
    fn quota_slot_at(&self, q: &Inode, qblk: u32, off: usize) -> Result<Slot> {
        let (pblk, base) = self.quota_pblk(q, qblk)?;
        // Cannot fail: both offsets lie within one filesystem block (at most 64 KiB).
        Ok(Slot { qblk, pblk, off: u32::try_from(base + off).unwrap_or(u32::MAX) })
    }

    /// A copy of quota block `qblk`.
    fn quota_read(&self, q: &Inode, qblk: u32) -> Result<Vec<u8>> {
        let (buf, off) = self.quota_block(q, qblk)?;
        let data = buf.data();
        Ok(data[off..off + QT_BLOCK].to_vec())
    }

    /// Changes quota block `qblk` under `h`.
    fn quota_edit<R>(&self, h: &Handle, q: &Inode, qblk: u32, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        let (buf, off) = self.quota_block(q, qblk)?;
        let mut data = h.write(&buf)?;
        Ok(f(&mut data[off..off + QT_BLOCK]))
    }

    /// Opens the quota file in inode `ino` for quota type `ty`: checks its header and reads
    /// where every id's entry is (`qtree_read_dquot` for all ids at once).
    pub(crate) fn quota_file_load(&self, ty: usize, ino: u32) -> Result<QuotaFile> {
        if ino == 0 || !self.ino_in_range(rext4_format::InodeNo(ino)) {
            return bad("quota inode number out of range");
        }
        let inode = self.iget(rext4_format::InodeNo(ino))?;
        let (size, regular) = inode.with_disk(|d| (d.size(), d.file_type() == rext4_format::inode::S_IFREG));
        if !regular || inode.flags() & rext4_format::inode::INLINE_DATA_FL != 0 {
            return bad("quota inode is not a regular file");
        }
        let head = self.quota_read(&inode, 0)?;
        let (Ok((h, _)), Ok((info, _))) =
            (DiskHeader::read_from_prefix(&head), DiskInfo::read_from_prefix(&head[fq::INFO_OFF..]))
        else {
            return bad("unreadable header");
        };
        if h.dqh_magic.get() != fq::MAGICS[ty] || h.dqh_version.get() != fq::V2_VERSION_R1 {
            return bad("not a v2r1 quota file of its type");
        }
        let blocks = info.dqi_blocks.get();
        if blocks <= QT_TREEOFF
            || u64::from(blocks) * QT_BLOCK as u64 > size.next_multiple_of(QT_BLOCK as u64)
        {
            return bad("file size does not cover its blocks");
        }
        let mut entries = HashMap::new();
        let mut seen = HashSet::new();
        self.quota_scan(&inode, blocks, QT_TREEOFF, 0, 0, &mut seen, &mut entries)?;
        let grace = [AtomicU32::new(info.dqi_bgrace.get()), AtomicU32::new(info.dqi_igrace.get())];
        Ok(QuotaFile { inode, entries: RwLock::new(entries), tree: Mutex::new(info), grace })
    }

    /// Reads tree block `blk` at `depth` whose ids start with `prefix`, recording entries.
    /// Every tree block is read once: a block named twice is damage (and would make the walk
    /// exponential).
    #[allow(clippy::too_many_arguments)]
    fn quota_scan(
        &self,
        q: &Inode,
        blocks: u32,
        blk: u32,
        depth: usize,
        prefix: u32,
        seen: &mut HashSet<u32>,
        entries: &mut HashMap<u32, Slot>,
    ) -> Result<()> {
        if blk >= blocks || !seen.insert(blk) {
            return bad("tree block out of range or named twice");
        }
        let block = self.quota_read(q, blk)?;
        for i in 0..fq::QT_REFS {
            let r = fq::tree_ref(&block, i);
            if r == 0 {
                continue;
            }
            // Cannot fail: i < 256.
            let id = prefix | u32::try_from(i).unwrap_or(0) << ((QT_DEPTH - 1 - depth) * 8);
            if depth + 1 < QT_DEPTH {
                self.quota_scan(q, blocks, r, depth + 1, id, seen, entries)?;
                continue;
            }
            if r >= blocks || r == QT_TREEOFF {
                return bad("data block out of range");
            }
            let data = self.quota_read(q, r)?;
            let slot = (0..ENTRIES_PER_BLOCK).map(|k| DATA_HEADER + k * ENTRY).find(|&o| {
                let e = &data[o..o + ENTRY];
                !fq::entry_unused(e) && u32::from_le_bytes([e[0], e[1], e[2], e[3]]) == id
            });
            let Some(off) = slot else { return bad("tree names an entry its data block lacks") };
            entries.insert(id, self.quota_slot_at(q, r, off)?);
        }
        Ok(())
    }
}

impl QuotaFile {
    /// Where `id`'s entry is, if it has one.
    pub(crate) fn slot(&self, id: u32) -> Option<Slot> {
        self.entries.read().get(&id).copied()
    }

    /// Every id's entry place, in id order.
    pub(crate) fn slots(&self) -> Vec<(u32, Slot)> {
        let mut v: Vec<(u32, Slot)> = self.entries.read().iter().map(|(&id, &s)| (id, s)).collect();
        v.sort_unstable_by_key(|e| e.0);
        v
    }

    /// The info record as last written (grace periods, free lists).
    pub(crate) fn info(&self) -> DiskInfo {
        *self.tree.lock()
    }

    /// The space and inode grace periods, in seconds, without the info record's lock.
    pub(crate) fn grace(&self) -> [u64; 2] {
        self.grace.each_ref().map(|g| u64::from(g.load(Ordering::Relaxed)))
    }
}

impl FsInner {
    /// `id`'s entry in `qf`, added (usage and limits zero) under `h` if it has none
    /// (`qtree_write_dquot` of a new dquot: `dq_insert_tree`).
    pub(crate) fn quota_slot(&self, h: &Handle, qf: &QuotaFile, id: u32) -> Result<Slot> {
        if let Some(s) = qf.slot(id) {
            return Ok(s);
        }
        let mut info = qf.tree.lock();
        if let Some(s) = qf.slot(id) {
            return Ok(s);
        }
        let before = *info;
        let added = insert(&mut Journaled { fs: self, h, q: &qf.inode }, &mut info, id);
        // The info record follows the blocks taken, also when adding failed half way (the
        // handle still carries what was done), so the file stays readable.
        if before.as_bytes() != info.as_bytes() {
            self.quota_write_info(h, qf, &info)?;
        }
        let (qblk, off) = added?;
        let slot = self.quota_slot_at(&qf.inode, qblk, off)?;
        qf.entries.write().insert(id, slot);
        Ok(slot)
    }

    /// Writes `info` as `qf`'s info record under `h` (`v2_write_file_info`). The caller
    /// holds `qf.tree`.
    fn quota_write_info(&self, h: &Handle, qf: &QuotaFile, info: &DiskInfo) -> Result<()> {
        self.quota_edit(h, &qf.inode, 0, |b| {
            b[fq::INFO_OFF..fq::INFO_OFF + size_of::<DiskInfo>()].copy_from_slice(info.as_bytes())
        })
    }

    /// Sets the grace periods in `qf`'s info record under `h`, for charges from now on too.
    pub(crate) fn quota_set_grace(&self, h: &Handle, qf: &QuotaFile, space: u32, inodes: u32) -> Result<()> {
        let mut info = qf.tree.lock();
        let mut new = *info;
        new.dqi_bgrace.set(space);
        new.dqi_igrace.set(inodes);
        self.quota_write_info(h, qf, &new)?;
        *info = new;
        for (g, v) in qf.grace.iter().zip([space, inodes]) {
            g.store(v, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Adds `space` bytes and `inodes` inodes (either may be negative) to the entry at `slot`
    /// of type `ty` under `h`, as `dquot_incr_space` / `dquot_decr_space` and the inode
    /// counterparts do: usage never goes below zero, falling to or under a soft limit ends its
    /// grace time, and growing past one starts it where limits are enforced.
    pub(crate) fn quota_add(&self, h: &Handle, ty: usize, slot: Slot, space: i64, inodes: i64) -> Result<()> {
        let off = slot.off as usize;
        let buf = self.bcache.get(slot.pblk)?;
        let mut b = h.write(&buf)?;
        {
            let Ok(mut d) = DiskDquot::read_from_bytes(&b[off..off + ENTRY]) else { return Ok(()) };
            let cur = d.dqb_curspace.get().saturating_add_signed(space);
            d.dqb_curspace.set(cur);
            if space < 0 && cur <= d.dqb_bsoftlimit.get().saturating_mul(QT_BLOCK as u64) {
                d.dqb_btime.set(0);
            }
            let cur = d.dqb_curinodes.get().saturating_add_signed(inodes);
            d.dqb_curinodes.set(cur);
            if inodes < 0 && cur <= d.dqb_isoftlimit.get() {
                d.dqb_itime.set(0);
            }
            let [btime, itime] = self.quota_grace_starts(ty, &d, space, inodes);
            if let Some(t) = btime {
                d.dqb_btime.set(t);
            }
            if let Some(t) = itime {
                d.dqb_itime.set(t);
            }
            b[off..off + ENTRY].copy_from_slice(&d.to_disk());
        }
        Ok(())
    }
}

/// The blocks of a quota file while an entry is added: the journaled file of an open
/// filesystem ([`Journaled`]), or the bytes the formatter builds (mkfs). One insertion
/// algorithm serves both, so a new file and a grown one have the same shape.
pub(crate) trait QuotaBlocks {
    /// A copy of quota block `qblk`.
    fn read(&mut self, qblk: u32) -> Result<Vec<u8>>;
    /// Changes quota block `qblk`.
    fn edit(&mut self, qblk: u32, f: &mut dyn FnMut(&mut [u8])) -> Result<()>;
    /// Makes block `qblk`, the first past the file's blocks, part of the file, zeroed.
    fn grow(&mut self, qblk: u32) -> Result<()>;
}

/// Walks the tree to `id`'s leaf, adding the blocks it lacks, and writes its new entry (usage
/// and limits zero). Returns the entry's quota block and its byte offset in that block.
pub(crate) fn insert(s: &mut dyn QuotaBlocks, info: &mut DiskInfo, id: u32) -> Result<(u32, usize)> {
    let mut blk = QT_TREEOFF;
    for depth in 0..QT_DEPTH - 1 {
        let idx = fq::tree_index(id, depth);
        let r = fq::tree_ref(&s.read(blk)?, idx);
        blk = if r != 0 {
            r
        } else {
            let n = new_block(s, info)?;
            s.edit(n, &mut |b| b.fill(0))?;
            s.edit(blk, &mut |b| fq::set_tree_ref(b, idx, n))?;
            n
        };
    }
    // The last level names the data block holding the entry.
    let idx = fq::tree_index(id, QT_DEPTH - 1);
    if fq::tree_ref(&s.read(blk)?, idx) != 0 {
        return bad("tree names an id the scan did not find");
    }
    let (qblk, off) = add_entry(s, info, id)?;
    s.edit(blk, &mut |b| fq::set_tree_ref(b, idx, qblk))?;
    Ok((qblk, off))
}

/// A block for the tree: the first wholly free one, or a new one at the file's end
/// (`get_free_dqblk`).
fn new_block(s: &mut dyn QuotaBlocks, info: &mut DiskInfo) -> Result<u32> {
    let free = info.dqi_free_blk.get();
    if free != 0 {
        if free >= info.dqi_blocks.get() || free == QT_TREEOFF {
            return bad("free block out of range");
        }
        let b = s.read(free)?;
        let next = DataHeader::read_from_prefix(&b).map_or(0, |(d, _)| d.dqdh_next_free.get());
        info.dqi_free_blk.set(next);
        return Ok(free);
    }
    let n = info.dqi_blocks.get();
    let Some(next) = n.checked_add(1) else { return bad("file has as many blocks as it can") };
    s.grow(n)?;
    info.dqi_blocks.set(next);
    Ok(n)
}

/// Writes a new entry for `id` into a data block with room (`find_free_dqentry`).
fn add_entry(s: &mut dyn QuotaBlocks, info: &mut DiskInfo, id: u32) -> Result<(u32, usize)> {
    let mut blk = info.dqi_free_entry.get();
    if blk == 0 {
        blk = new_block(s, info)?;
        s.edit(blk, &mut |b| b.fill(0))?;
        link_free(s, info, blk)?;
    } else if blk >= info.dqi_blocks.get() || blk == QT_TREEOFF {
        return bad("free-entry block out of range");
    }
    let mut entry = DiskDquot::default();
    entry.dqb_id.set(id);
    let disk = entry.to_disk();
    let mut placed = None;
    s.edit(blk, &mut |b| {
        let Some(off) = (0..ENTRIES_PER_BLOCK)
            .map(|k| DATA_HEADER + k * ENTRY)
            .find(|&o| fq::entry_unused(&b[o..o + ENTRY]))
        else {
            return;
        };
        let Ok((mut hd, _)) = DataHeader::read_from_prefix(b) else { return };
        b[off..off + ENTRY].copy_from_slice(&disk);
        let n = hd.dqdh_entries.get().saturating_add(1);
        hd.dqdh_entries.set(n);
        b[..DATA_HEADER].copy_from_slice(hd.as_bytes());
        placed = Some((off, usize::from(n) >= ENTRIES_PER_BLOCK));
    })?;
    let Some((off, full)) = placed else { return bad("block on the free-entry list is full") };
    if full {
        unlink_free(s, info, blk)?;
    }
    Ok((blk, off))
}

/// Puts data block `blk` at the head of the free-entry list (`insert_free_dqentry`).
fn link_free(s: &mut dyn QuotaBlocks, info: &mut DiskInfo, blk: u32) -> Result<()> {
    let head = info.dqi_free_entry.get();
    header(s, blk, &mut |d| {
        d.dqdh_next_free.set(head);
        d.dqdh_prev_free.set(0);
    })?;
    if head != 0 {
        header(s, head, &mut |d| d.dqdh_prev_free.set(blk))?;
    }
    info.dqi_free_entry.set(blk);
    Ok(())
}

/// Takes data block `blk` off the free-entry list (`remove_free_dqentry`).
fn unlink_free(s: &mut dyn QuotaBlocks, info: &mut DiskInfo, blk: u32) -> Result<()> {
    let (mut next, mut prev) = (0, 0);
    header(s, blk, &mut |d| {
        (next, prev) = (d.dqdh_next_free.get(), d.dqdh_prev_free.get());
        d.dqdh_next_free.set(0);
        d.dqdh_prev_free.set(0);
    })?;
    let blocks = info.dqi_blocks.get();
    if next >= blocks || prev >= blocks {
        return bad("free-entry list out of range");
    }
    if next != 0 {
        header(s, next, &mut |d| d.dqdh_prev_free.set(prev))?;
    }
    if prev != 0 {
        header(s, prev, &mut |d| d.dqdh_next_free.set(next))?;
    } else {
        info.dqi_free_entry.set(next);
    }
    Ok(())
}

/// Changes the header of data block `blk`.
fn header(s: &mut dyn QuotaBlocks, blk: u32, f: &mut dyn FnMut(&mut DataHeader)) -> Result<()> {
    s.edit(blk, &mut |b| {
        if let Ok((mut d, _)) = DataHeader::read_from_prefix(b) {
            f(&mut d);
            b[..DATA_HEADER].copy_from_slice(d.as_bytes());
        }
    })
}

/// A quota file in memory (the formatter's, and the tests'): its quota blocks, and those
/// added past its end in the order they were added.
#[derive(Default)]
pub(crate) struct InMemory {
    pub blocks: Vec<Vec<u8>>,
    pub grown: Vec<u32>,
}

impl InMemory {
    /// Quota block `qblk`, the file growing to it if it is past the end.
    pub(crate) fn block(&mut self, qblk: u32) -> &mut Vec<u8> {
        let i = crate::num::usize_from(u64::from(qblk));
        if self.blocks.len() <= i {
            self.blocks.resize(i + 1, vec![0; QT_BLOCK]);
        }
        &mut self.blocks[i]
    }
}

impl QuotaBlocks for InMemory {
    fn read(&mut self, qblk: u32) -> Result<Vec<u8>> {
        Ok(self.block(qblk).clone())
    }

    fn edit(&mut self, qblk: u32, f: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        f(self.block(qblk));
        Ok(())
    }

    fn grow(&mut self, qblk: u32) -> Result<()> {
        self.block(qblk);
        self.grown.push(qblk);
        Ok(())
    }
}

/// A quota file of an open filesystem: every change under the handle `h`.
struct Journaled<'a, 'j> {
    fs: &'a FsInner,
    h: &'a Handle<'j>,
    q: &'a Inode,
}

impl QuotaBlocks for Journaled<'_, '_> {
    fn read(&mut self, qblk: u32) -> Result<Vec<u8>> {
        self.fs.quota_read(self.q, qblk)
    }

    fn edit(&mut self, qblk: u32, f: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        self.fs.quota_edit(self.h, self.q, qblk, f)
    }

    fn grow(&mut self, qblk: u32) -> Result<()> {
        let (fs, h, q) = (self.fs, self.h, self.q);
        let bs = fs.sbi.block_size as u64;
        let byte = u64::from(qblk) * QT_BLOCK as u64;
        let lblk = u32::try_from(byte / bs).map_err(|_| Error::FileTooBig)?;
        let _d = q.data_sem.write();
        // Mapped before the record is locked: the lookup reads it.
        let hole = matches!(fs.map_block(q, lblk)?, Mapping::Hole { .. });
        let mut raw = q.raw_mut();
        let size = crate::inode::write::raw_size(&raw);
        if hole {
            // Quota files grow while writeback charges its blocks: they may take what
            // index blocks may (the kernel gives them the root reserve).
            let pblk = fs.append_block(h, q, &mut raw, lblk, Pool::NoFail)?;
            let buf = fs.bcache.get_fresh(pblk);
            h.write(&buf)?.fill(0);
        }
        // The kernel's `ext4_quota_write` grows the size to the end of what it wrote.
        crate::inode::write::raw_set_size(&mut raw, size.max(byte + QT_BLOCK as u64));
        fs.mark_inode_dirty(h, q, &mut raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use zerocopy::FromZeros;

    /// An empty file as `v2_new_io` leaves it: the header's info, and the root.
    fn empty() -> (InMemory, DiskInfo) {
        let mut info = DiskInfo::new_zeroed();
        info.dqi_blocks.set(QT_TREEOFF + 1);
        let mut f = InMemory::default();
        f.block(QT_TREEOFF);
        (f, info)
    }

    /// Every (id, quota block, offset) the tree names, walking it as the engine's open does,
    /// and checking that no block is named twice or past the file's end.
    fn walk(
        f: &InMemory,
        blocks: u32,
        blk: u32,
        depth: usize,
        prefix: u32,
        seen: &mut Vec<u32>,
        out: &mut Vec<(u32, u32, usize)>,
    ) {
        assert!(blk < blocks && !seen.contains(&blk), "tree block {blk} out of range or named twice");
        seen.push(blk);
        let b = &f.blocks[blk as usize];
        for i in 0..fq::QT_REFS {
            let r = fq::tree_ref(b, i);
            if r == 0 {
                continue;
            }
            let id = prefix | u32::try_from(i).expect("i < 256") << ((QT_DEPTH - 1 - depth) * 8);
            if depth + 1 < QT_DEPTH {
                walk(f, blocks, r, depth + 1, id, seen, out);
                continue;
            }
            let d = &f.blocks[r as usize];
            let off = (0..ENTRIES_PER_BLOCK)
                .map(|k| DATA_HEADER + k * ENTRY)
                .find(|&o| !fq::entry_unused(&d[o..o + ENTRY]) && d[o..o + 4] == id.to_le_bytes())
                .unwrap_or_else(|| panic!("id {id} not in its data block {r}"));
            out.push((id, r, off));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Ids added one by one, in any order and spread (one leaf or many), are each found
        /// where their insertion put them by a walk of the tree; every data block counts its
        /// entries, and the free-entry list holds exactly the data blocks with room, linked
        /// both ways; the file has exactly the blocks its info counts.
        #[test]
        fn inserted_ids_are_found_and_the_lists_hold(
            ids in prop::collection::hash_set(prop_oneof![0u32..64, any::<u32>(), (0u32..4).prop_map(|k| k << 24)], 1..200),
        ) {
            let (mut f, mut info) = empty();
            let mut placed = Vec::new();
            for &id in &ids {
                let (qblk, off) = insert(&mut f, &mut info, id).expect("insert");
                placed.push((id, qblk, off));
            }
            // A second insertion of a present id is refused.
            let some = *ids.iter().next().expect("one id");
            prop_assert!(insert(&mut f, &mut info, some).is_err());
            let blocks = info.dqi_blocks.get();
            prop_assert_eq!(f.blocks.len(), blocks as usize);
            let (mut seen, mut found) = (Vec::new(), Vec::new());
            walk(&f, blocks, QT_TREEOFF, 0, 0, &mut seen, &mut found);
            found.sort_unstable();
            placed.sort_unstable();
            prop_assert_eq!(&found, &placed);
            // Data blocks: their entry counts, and which have room.
            let mut data: Vec<u32> = placed.iter().map(|p| p.1).collect();
            data.sort_unstable();
            data.dedup();
            let mut with_room = Vec::new();
            for &d in &data {
                let b = &f.blocks[d as usize];
                let used = (0..ENTRIES_PER_BLOCK).filter(|k| !fq::entry_unused(&b[DATA_HEADER + k * ENTRY..][..ENTRY])).count();
                let (h, _) = DataHeader::read_from_prefix(b).expect("header");
                prop_assert_eq!(usize::from(h.dqdh_entries.get()), used);
                if used < ENTRIES_PER_BLOCK {
                    with_room.push(d);
                }
            }
            let (mut listed, mut prev, mut at) = (Vec::new(), 0, info.dqi_free_entry.get());
            while at != 0 {
                prop_assert!(listed.len() <= data.len(), "free-entry list loops");
                let (h, _) = DataHeader::read_from_prefix(&f.blocks[at as usize]).expect("header");
                prop_assert_eq!(h.dqdh_prev_free.get(), prev);
                listed.push(at);
                (prev, at) = (at, h.dqdh_next_free.get());
            }
            listed.sort_unstable();
            prop_assert_eq!(listed, with_room);
            // Nothing unaccounted: every block is the header, a tree block or a data block.
            prop_assert_eq!(blocks as usize, 1 + seen.len() + data.len());
        }
    }
}
