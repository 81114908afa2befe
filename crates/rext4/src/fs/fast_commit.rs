//! Fast-commit replay (the kernel's `ext4_fc_replay` in `fs/ext4/fast_commit.c`): the tags
//! that journal recovery found valid for the transaction after the last full commit
//! (`jbd2/recovery.rs`) are applied at a writable open, after the logged blocks are home and
//! before orphans are cleaned up.
//!
//! # What each tag does
//! - `INODE`: the logged record replaces the inode's, except its block map: an extent-mapped
//!   inode keeps its tree, which the range tags then change (the kernel's rule), while a new
//!   inode, or a number freed and given to another file (another generation, or no links
//!   left), starts from an empty one. Records whose `i_block` is no block map (inline data,
//!   fast symlinks, device numbers) take the logged `i_block` too. The inode is marked in use.
//! - `ADD_RANGE` / `DEL_RANGE`: a logical range of an extent-mapped inode maps the logged
//!   blocks, or nothing.
//! - `CREAT` / `LINK` / `UNLINK`: a name is added (a new directory gets `.` and `..`) or
//!   removed; a name already there (or already gone) is left as it is.
//!
//! # Where rext4 differs from the kernel
//! The kernel frees and marks blocks in the bitmaps as each tag goes, and can leave directory
//! link counts, `i_blocks` of new directories and group directory counts wrong (e2fsck finds
//! them). rext4 leaves an image e2fsck finds clean:
//! - bitmaps are settled once, at the end: blocks the changed inodes map afterwards are in
//!   use; blocks they mapped before, and blocks claimed for `ADD_RANGE`, that no changed
//!   inode maps any more are free. Until then nothing is freed, so a tree block allocated
//!   during the replay never lands on a block still named;
//! - `i_blocks` of every changed inode is counted from its map, link counts of directories
//!   from their entries, directory sizes from their blocks;
//! - an inode left without names, and not recorded as an orphan, is freed.
//!
//! # Crash safety
//! Recovery leaves the journal empty at the transaction the fast commits belong to, with the
//! fast-commit area in place and the superblock still marked for recovery
//! (`jbd2/replay.rs`), and the whole replay is one handle, so it commits as that transaction
//! or not at all. A crash before the commit finds the same fast commits again; after it, the
//! journal has moved past their transaction and ignores them.
//!
//! Everything a tag names is checked before anything changes (inode numbers, block ranges
//! against the system zones, names); damage found later aborts the journal, so no part of a
//! replay ever commits.
//!
//! # Locking
//! Runs inside the open, before the filesystem is shared: no other operation can reach an
//! inode, so records are taken without their `op_lock` (which would otherwise come before the
//! handle).

use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::FsInner;
use crate::inode::write::{
    raw_blocks, raw_flags, raw_links, raw_set_links, raw_set_size, raw_size, rec, rec_ref,
};
use crate::inode::{Inode, RawRecord};
use crate::jbd2::transaction::Handle;
use crate::map::extents_write::{init_root, I_BLOCK, LBLK_END};
use crate::map::Mapping;
use rext4_format::checksum::inode_csum_seed;
use rext4_format::extent::EXTENT_MAGIC;
use rext4_format::fast_commit::Tag;
use rext4_format::inode::{self as fi, EXTENTS_FL, HUGE_FILE_FL, INLINE_DATA_FL};
use rext4_format::InodeNo;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Where `i_generation` starts: the logged record's second part (the first ends at `i_block`).
const I_GENERATION: usize = 0x64;

/// A run of blocks as `(first, end)`, end exclusive.
type Run = (u64, u64);

/// What the replay learns as it goes.
#[derive(Default)]
struct State {
    /// Each inode whose record or map the tags change: the blocks its map named before (data
    /// and tree, as runs), and the 512-byte sectors of its `i_blocks` those did not account
    /// for (its xattr block, EA values), which stay with it. `None`: not in use before.
    before: BTreeMap<u32, Option<(Vec<Run>, u64)>>,
    /// Runs this replay marked in use for `ADD_RANGE` tags.
    claimed: Vec<Run>,
    /// Directories whose entries changed.
    dirs: BTreeSet<u32>,
    /// Inodes that gained or lost a name.
    named: BTreeSet<u32>,
}

/// Sorts and merges runs.
fn merged(mut v: Vec<Run>) -> Vec<Run> {
    v.sort_unstable();
    let mut out: Vec<Run> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// The parts of merged runs `a` outside merged runs `b`.
fn minus(a: &[Run], b: &[Run]) -> Vec<Run> {
    let mut out = Vec::new();
    let mut j = 0;
    for &(mut s, e) in a {
        while j < b.len() && b[j].1 <= s {
            j += 1;
        }
        let mut k = j;
        while s < e {
            match b.get(k) {
                Some(&(bs, be)) if bs < e => {
                    if bs > s {
                        out.push((s, bs));
                    }
                    s = s.max(be);
                    k += 1;
                }
                _ => {
                    out.push((s, e));
                    s = e;
                }
            }
        }
    }
    out
}

fn bad(what: &'static str) -> Error {
    Error::Corrupt(crate::error::Corrupt(CorruptKind::Journal(what)))
}

impl FsInner {
    /// Applies fast-commit `tags` (see the module's documentation) and waits for their
    /// commit. Called once the journal runs, before orphan cleanup.
    pub(crate) fn replay_fast_commits(&self, tags: &[Tag]) -> Result<()> {
        if tags.is_empty() {
            return Ok(());
        }
        self.check_fast_commit_tags(tags)?;
        let journal = self.journal()?.clone();
        let h = journal.start(64)?;
        let tid = h.tid();
        let done = self.apply_fast_commits(&h, tags);
        if let Err(e) = &done {
            // Nothing of a replay that failed half way may commit: the image keeps its
            // fast commits for e2fsck.
            journal.abort(format!("fast-commit replay failed: {e}"), e.errno());
        }
        drop(h);
        done?;
        journal.commit_and_wait(tid)
    }

    /// Refuses tags naming what no fast commit of a sound filesystem names: inodes out of
    /// range or reserved (the root aside), blocks outside the data area, bad names.
    pub(crate) fn check_fast_commit_tags(&self, tags: &[Tag]) -> Result<()> {
        let sb = &self.sbi.sb;
        let special = [
            sb.s_journal_inum.get(),
            sb.s_orphan_file_inum.get(),
            sb.s_usr_quota_inum.get(),
            sb.s_grp_quota_inum.get(),
            sb.s_prj_quota_inum.get(),
        ];
        let ino_ok = |ino: u32| {
            self.ino_in_range(InodeNo(ino))
                && (ino == rext4_format::types::ROOT_INO.0 || ino >= sb.first_ino())
                && !special.contains(&ino)
        };
        let name_ok = |n: &[u8]| !n.contains(&b'/') && !n.contains(&0) && n != b"." && n != b"..";
        for t in tags {
            let ok = match t {
                Tag::AddRange { ino, lblk, len, pblk, .. } => {
                    ino_ok(*ino)
                        && *len != 0
                        && u64::from(*lblk) + u64::from(*len) <= LBLK_END
                        && self.check_range(InodeNo(*ino), *pblk, u64::from(*len)).is_ok()
                }
                Tag::DelRange { ino, lblk, len } => {
                    ino_ok(*ino) && u64::from(*lblk) + u64::from(*len) <= LBLK_END
                }
                Tag::Create { parent, ino, name }
                | Tag::Link { parent, ino, name }
                | Tag::Unlink { parent, ino, name } => ino_ok(*parent) && ino_ok(*ino) && name_ok(name),
                Tag::Inode { ino, raw } => {
                    // A logged `i_extra_isize` must fit the filesystem's records.
                    let extra =
                        raw.get(0x80..0x82).map_or(0, |b| usize::from(u16::from_le_bytes([b[0], b[1]])));
                    let room = self.sbi.inode_size - fi::GOOD_OLD_INODE_SIZE;
                    // The root stays a directory.
                    let mode = u16::from_le_bytes([raw[0], raw[1]]);
                    let root_ok = *ino != rext4_format::types::ROOT_INO.0 || mode & fi::S_IFMT == fi::S_IFDIR;
                    ino_ok(*ino)
                        && raw.len() <= self.sbi.inode_size
                        && extra <= room
                        && extra % 4 == 0
                        && root_ok
                }
                Tag::Pad | Tag::Tail { .. } | Tag::Head { .. } => true,
            };
            if !ok {
                return Err(bad("fast commit names a reserved inode, a bad block range or a bad name"));
            }
        }
        Ok(())
    }

    fn apply_fast_commits(&self, h: &Handle, tags: &[Tag]) -> Result<()> {
        let mut st = State::default();
        // What the changed inodes map before anything changes, then the blocks ADD_RANGE
        // names, so that no allocation during the replay takes them.
        for t in tags {
            if let Tag::Inode { ino, .. } | Tag::AddRange { ino, .. } | Tag::DelRange { ino, .. } = t {
                self.note_before(&mut st, *ino)?;
            }
        }
        for t in tags {
            if let Tag::AddRange { pblk, len, .. } = t {
                let runs = self.claim_blocks(h, *pblk, u64::from(*len))?;
                st.claimed.extend(runs.into_iter().map(|(s, l)| (s, s + l)));
            }
        }
        for t in tags {
            match t {
                Tag::Inode { ino, raw } => self.fc_inode(h, &mut st, *ino, raw)?,
                Tag::AddRange { ino, lblk, len, pblk, unwritten } => {
                    let range = u64::from(*lblk)..u64::from(*lblk) + u64::from(*len);
                    self.fc_remap(h, *ino, range, Some((*pblk, *unwritten)))?;
                }
                Tag::DelRange { ino, lblk, len } if *len != 0 => {
                    self.fc_remap(h, *ino, u64::from(*lblk)..u64::from(*lblk) + u64::from(*len), None)?;
                }
                Tag::Create { parent, ino, name } => {
                    self.fc_name(h, &mut st, *parent, *ino, name, NameOp::Create)?
                }
                Tag::Link { parent, ino, name } => {
                    self.fc_name(h, &mut st, *parent, *ino, name, NameOp::Link)?
                }
                Tag::Unlink { parent, ino, name } => {
                    self.fc_name(h, &mut st, *parent, *ino, name, NameOp::Unlink)?
                }
                Tag::DelRange { .. } | Tag::Pad | Tag::Tail { .. } | Tag::Head { .. } => {}
            }
        }
        self.fc_settle(h, &st)
    }

    /// Whether `inode` is in use: allocated in its bitmap, with a file type.
    fn fc_in_use(&self, inode: &Inode) -> Result<bool> {
        Ok(inode.file_type().is_some() && self.inode_in_bitmap(inode.ino)?)
    }

    /// Records what inode `ino` maps now, once.
    fn note_before(&self, st: &mut State, ino: u32) -> Result<()> {
        if st.before.contains_key(&ino) {
            return Ok(());
        }
        let inode = self.iget(InodeNo(ino))?;
        let entry = if self.fc_in_use(&inode)? {
            let (runs, mapped) = self.mapped_runs(&inode)?;
            let other = raw_blocks(&inode.raw()).saturating_sub(mapped * self.sectors_per_block());
            Some((merged(runs), other))
        } else {
            None
        };
        st.before.insert(ino, entry);
        Ok(())
    }

    /// The blocks `inode`'s map names (data and tree), as runs, and how many: with bigalloc
    /// the whole clusters they touch, each once (a cluster is the file's, or free, whole).
    fn mapped_runs(&self, inode: &Inode) -> Result<(Vec<Run>, u64)> {
        let owned = self.owned_blocks(inode)?;
        let mut runs: Vec<Run> = owned.data.iter().map(|&(s, l)| (s, s + l)).collect();
        runs.extend(owned.meta.iter().map(|&b| (b, b + 1)));
        if self.sbi.cluster_bits > 0 {
            let mask = self.sbi.cluster_mask();
            runs = merged(runs.into_iter().map(|(s, e)| (s & !mask, (e + mask) & !mask)).collect());
        }
        let n = runs.iter().map(|(s, e)| e - s).sum();
        Ok((runs, n))
    }

    fn sectors_per_block(&self) -> u64 {
        u64::from(self.sbi.block_size / 512)
    }

    /// `INODE`: the logged record over inode `ino`'s (see the module's documentation).
    fn fc_inode(&self, h: &Handle, st: &mut State, ino: u32, fc: &[u8]) -> Result<()> {
        let n = InodeNo(ino);
        let old = self.iget(n)?;
        // The map is this inode's own only if the record in place is the same inode: in use
        // (before this replay, or made so by an earlier tag), linked, and of the same
        // generation. A number freed and given to a new file within the fast commits starts
        // from an empty map; the old file's blocks are freed when the replay settles.
        let same = {
            let r = old.raw();
            let cur = rec_ref(&r);
            let logged_gen = u32::from_le_bytes([
                fc[I_GENERATION],
                fc[I_GENERATION + 1],
                fc[I_GENERATION + 2],
                fc[I_GENERATION + 3],
            ]);
            cur.links_count() != 0 && cur.generation() == logged_gen
        };
        let was_used = same && self.fc_in_use(&old)?;
        let mut raw = RawRecord::new(&old.raw());
        let len = fc.len().min(raw.len());
        raw[..I_BLOCK.start].copy_from_slice(&fc[..I_BLOCK.start]);
        raw[I_GENERATION..len].copy_from_slice(&fc[I_GENERATION..len]);
        let (mode, flags, size) = {
            let r = rec_ref(&raw);
            (r.mode(), r.flags(), r.size())
        };
        let kind = mode & fi::S_IFMT;
        let has_map = flags & INLINE_DATA_FL == 0
            && (kind == fi::S_IFREG
                || kind == fi::S_IFDIR
                || (kind == fi::S_IFLNK && (flags & EXTENTS_FL != 0 || size >= 60)));
        if has_map && flags & EXTENTS_FL != 0 {
            let magic = u16::from_le_bytes([raw[I_BLOCK.start], raw[I_BLOCK.start + 1]]);
            if !was_used || magic != EXTENT_MAGIC {
                init_root(&mut raw);
            }
        } else if has_map {
            // A block map: the kernel's fast commits never change one; a new inode has none.
            if !was_used {
                raw[I_BLOCK].fill(0);
            }
        } else {
            raw[I_BLOCK].copy_from_slice(&fc[I_BLOCK]);
        }
        if self.sbi.inode_size > fi::GOOD_OLD_INODE_SIZE {
            let extra = usize::from(rec_ref(&raw).extra_isize());
            if extra > self.sbi.inode_size - fi::GOOD_OLD_INODE_SIZE || extra % 4 != 0 {
                return corrupt(CorruptKind::Inode { ino: n, what: "fast commit logs a bad i_extra_isize" });
            }
        }
        // An inode the replay brings into use is charged to its quotas whole at its first write
        // (the record the table holds is a free one's).
        let fresh = kind != 0 && self.mark_inode_used(h, n, kind == fi::S_IFDIR)?;
        let generation = rec_ref(&raw).generation();
        let inode =
            Arc::new(Inode::new_in_memory(n, raw, inode_csum_seed(self.sbi.csum_seed, ino, generation)));
        inode.quota_new.store(fresh, std::sync::atomic::Ordering::Release);
        self.icache.insert(u64::from(ino), inode.clone());
        let mut r = inode.raw_mut();
        self.mark_inode_dirty(h, &inode, &mut r)?;
        if kind == fi::S_IFDIR {
            st.dirs.insert(ino);
        }
        Ok(())
    }

    /// `ADD_RANGE` (`new` is the run and whether it is unwritten) and `DEL_RANGE`. Inodes not
    /// in use or not extent-mapped are left alone, as the kernel's `ext4_iget` and map calls
    /// would fail on them.
    fn fc_remap(
        &self,
        h: &Handle,
        ino: u32,
        range: std::ops::Range<u64>,
        new: Option<(u64, bool)>,
    ) -> Result<()> {
        let inode = self.iget(InodeNo(ino))?;
        if !self.fc_in_use(&inode)? || inode.flags() & EXTENTS_FL == 0 || self.has_inline_data(&inode) {
            return Ok(());
        }
        let _ds = inode.data_sem.write();
        let mut raw = inode.raw_mut();
        self.ext_remap(h, &inode, &mut raw, range, new)?;
        self.mark_inode_dirty(h, &inode, &mut raw)?;
        inode.invalidate_pages();
        Ok(())
    }

    /// `CREAT`, `LINK` and `UNLINK`.
    fn fc_name(
        &self,
        h: &Handle,
        st: &mut State,
        parent: u32,
        ino: u32,
        name: &[u8],
        op: NameOp,
    ) -> Result<()> {
        let dir = self.iget(InodeNo(parent))?;
        let inode = self.iget(InodeNo(ino))?;
        if !dir.is_dir() || !self.fc_in_use(&dir)? || inode.file_type().is_none() {
            return Ok(());
        }
        let is_dir = inode.is_dir();
        st.dirs.insert(parent);
        st.named.insert(ino);
        self.uncache_name(&dir, name);
        let found = match self.lookup_uncached(&dir, name) {
            Ok(i) => Some(i),
            Err(Error::NotFound) => None,
            Err(e) => return Err(e),
        };
        match op {
            NameOp::Create | NameOp::Link => {
                if op == NameOp::Create {
                    self.mark_inode_used(h, inode.ino, is_dir)?;
                    if is_dir {
                        st.dirs.insert(ino);
                        let empty = !self.has_inline_data(&inode)
                            && matches!(self.map_block(&inode, 0)?, Mapping::Hole { .. });
                        if empty {
                            let mut raw = inode.raw_mut();
                            self.init_dir(h, &inode, &mut raw, dir.ino)?;
                            self.mark_inode_dirty(h, &inode, &mut raw)?;
                        }
                    }
                } else if is_dir {
                    // No second name for a directory.
                    return Ok(());
                }
                if found.is_some() {
                    return Ok(());
                }
                let mode = inode.disk().mode();
                self.add_entry(h, &dir, name, inode.ino, crate::dir::dirent_type(mode))?;
                let mut raw = inode.raw_mut();
                let links = raw_links(&raw);
                let next = match op {
                    NameOp::Create if !is_dir => 1,
                    NameOp::Create => links.max(2),
                    _ => links.saturating_add(1),
                };
                raw_set_links(&mut raw, next);
                self.mark_inode_dirty(h, &inode, &mut raw)?;
            }
            NameOp::Unlink => {
                if found != Some(inode.ino) {
                    return Ok(());
                }
                self.remove_entry(h, &dir, name)?;
                let mut raw = inode.raw_mut();
                let links = raw_links(&raw);
                raw_set_links(&mut raw, if is_dir { 0 } else { links.saturating_sub(1) });
                self.mark_inode_dirty(h, &inode, &mut raw)?;
            }
        }
        Ok(())
    }

    /// The end of a replay: bitmaps, `i_blocks`, directory sizes and link counts, and
    /// inodes left without names.
    fn fc_settle(&self, h: &Handle, st: &State) -> Result<()> {
        let spb = self.sectors_per_block();
        let mut after: Vec<Run> = Vec::new();
        let mut before: Vec<Run> = st.claimed.clone();
        for (&ino, was) in &st.before {
            if let Some((runs, _)) = was {
                before.extend_from_slice(runs);
            }
            let inode = self.iget(InodeNo(ino))?;
            if !self.fc_in_use(&inode)? {
                continue;
            }
            let (runs, mapped) = self.mapped_runs(&inode)?;
            after.extend(runs);
            let mut raw = inode.raw_mut();
            if raw_flags(&raw) & (HUGE_FILE_FL | INLINE_DATA_FL) == 0 {
                let other = match was {
                    Some((_, other)) => *other,
                    // An attribute block: a cluster's worth with bigalloc.
                    None if rec_ref(&raw).file_acl() != 0 => self.meta_sectors(),
                    None => 0,
                };
                rec(&mut raw).set_blocks(mapped * spb + other);
                self.mark_inode_dirty(h, &inode, &mut raw)?;
            }
        }
        let (before, after) = (merged(before), merged(after));
        for &(s, e) in &after {
            self.claim_blocks(h, s, e - s)?;
        }
        for (s, e) in minus(&before, &after) {
            self.release_blocks(h, s, e - s)?;
        }
        for &ino in &st.dirs {
            self.fc_settle_dir(h, ino)?;
        }
        // Inodes left without a name: free them, unless an orphan record will.
        let orphans = self.orphans.recorded(self, self.sbi.inodes_count as usize);
        let candidates: BTreeSet<u32> = st.named.iter().chain(st.before.keys()).copied().collect();
        for ino in candidates {
            let inode = self.iget(InodeNo(ino))?;
            if !self.fc_in_use(&inode)? || raw_links(&inode.raw()) != 0 || orphans.contains(&ino) {
                continue;
            }
            self.delete_inode(h, &inode)?;
        }
        // A block the kernel's log gave another inode stays in use, though a freed inode
        // named it too (the kernel never reuses a block within a transaction; a hostile log
        // may).
        for &(s, e) in &after {
            self.claim_blocks(h, s, e - s)?;
        }
        Ok(())
    }

    /// A directory whose entries the replay changed: its size covers its blocks, and its link
    /// count is 2 and one per subdirectory (1 past the kernel's limit, as `dir_nlink` has it).
    fn fc_settle_dir(&self, h: &Handle, ino: u32) -> Result<()> {
        let dir = self.iget(InodeNo(ino))?;
        if !dir.is_dir() || !self.fc_in_use(&dir)? || raw_links(&dir.raw()) == 0 {
            return Ok(());
        }
        let mut subdirs = 0u32;
        let mut err = None;
        self.readdir(&dir, 0, |e| {
            if e.name == b"." || e.name == b".." {
                return true;
            }
            let is_dir = match e.kind {
                Some(k) => k == crate::attr::FileType::Directory,
                None => match self.iget(e.ino) {
                    Ok(i) => i.is_dir(),
                    Err(x) => {
                        err = Some(x);
                        return false;
                    }
                },
            };
            subdirs += u32::from(is_dir);
            true
        })?;
        if let Some(e) = err {
            return Err(e);
        }
        let inline = self.has_inline_data(&dir);
        let mut raw = dir.raw_mut();
        if !inline && raw_flags(&raw) & EXTENTS_FL != 0 {
            let exts = self.ext_collect(&dir, &raw, 0, LBLK_END)?;
            if let Some(end) = exts.iter().map(|e| e.lblk + e.len).max() {
                let size = end * u64::from(self.sbi.block_size);
                if raw_size(&raw) != size {
                    raw_set_size(&mut raw, size);
                }
            }
        }
        let links = 2 + subdirs;
        let links = if links >= u32::from(crate::namei::create::LINK_MAX) { 1 } else { links };
        // Below the limit, a u16.
        #[allow(clippy::cast_possible_truncation)]
        raw_set_links(&mut raw, links as u16);
        self.mark_inode_dirty(h, &dir, &mut raw)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum NameOp {
    Create,
    Link,
    Unlink,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_and_subtract() {
        assert_eq!(merged(vec![(5, 8), (1, 3), (2, 4), (8, 9)]), vec![(1, 4), (5, 9)]);
        let a = merged(vec![(0, 10), (20, 30)]);
        let b = merged(vec![(2, 4), (8, 22), (25, 26)]);
        assert_eq!(minus(&a, &b), vec![(0, 2), (4, 8), (22, 25), (26, 30)]);
        assert_eq!(minus(&a, &[]), a);
        assert_eq!(minus(&[], &b), vec![]);
        assert_eq!(minus(&a, &[(0, 100)]), vec![]);
    }
}
