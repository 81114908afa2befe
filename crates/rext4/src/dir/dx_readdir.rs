//! `readdir` in hash order (the kernel's `ext4_dx_readdir` and `ext4_htree_fill_tree`): the
//! position of an entry is made of its name's hash (`hash2pos`: major hash without its low
//! bit in the high word, minor hash in the low one), so it stays valid while entries are
//! added, removed and moved between blocks by splits: a resumed readdir neither repeats nor
//! skips an entry that was there all along. `.` and `..` come first (hashes 0 and 2, as the
//! kernel gives them).
//!
//! Indexed directories are read one leaf at a time (with the leaves a hash collision
//! continues into), under [`FsInner::names_stable`] so that a batch never mixes states from
//! before and after a split. One-block directories on dir_index filesystems are read in hash
//! order too, as the kernel does, so that their positions survive the directory becoming
//! indexed.
//!
//! Names with equal 64-bit hashes share a position: an entry followed by one with the same
//! position reports that position as its `next`, so a caller stopping between them sees the
//! first again rather than losing the second (the kernel likewise repeats, never skips).
//!
//! When the index is unusable (the kernel's `ERR_BAD_DX_DIR`) at the start of a readdir, the
//! blocks are read in order instead, with byte positions tagged by [`LINEAR_POS`].

use crate::attr::DirEntry;
use crate::cache::buffer::Buffer;
use crate::dir::dx_write::DxKey;
use crate::dir::DirBlockKind;
use crate::error::{Corrupt, CorruptKind, Error, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use rext4_format::dirent::DirBlockIter;
use rext4_format::hash::HashAlgo;
use rext4_format::inode::INDEX_FL;
use rext4_format::PhysBlock;
use std::collections::HashSet;

/// Marks a byte position of a linear read of an indexed directory whose index is unusable.
/// Hash positions never have this bit: the largest major hash is `0xffff_fffc`.
pub(super) const LINEAR_POS: u64 = 1 << 63;

/// The position of `..` (hash 2).
const DOTDOT_POS: u64 = 1 << 32;

/// The readdir position of a hash (`hash2pos`, 64-bit).
fn hash2pos(major: u32, minor: u32) -> u64 {
    (u64::from(major >> 1) << 32) | u64::from(minor)
}

/// The position of an entry of hash `(major, minor)` in a hash-order listing.
pub(crate) fn hash_pos(major: u32, minor: u32) -> u64 {
    hash2pos(major, minor)
}

/// The major hash a position starts at (`pos2maj_hash`, which keeps the low 32 bits too).
fn pos2major(pos: u64) -> u32 {
    rext4_format::split::lo32((pos >> 32) << 1)
}

/// One leaf's worth (plus the leaves its last hash continues into) of entries, each with its
/// position, in no particular order; or why the index cannot be used.
enum Batch {
    Entries { entries: Vec<(u64, Where, DirEntry)>, next_hash: Option<u32> },
    Unusable,
}

/// Where an entry sits (logical block, end of its record), to recognise it in a linear
/// fallback.
type Where = (u32, usize);

impl FsInner {
    /// Whether `dir` is read in hash order: indexed, or a single block, on a dir_index
    /// filesystem (the kernel's `is_dx_dir`).
    pub(crate) fn hash_order_readdir(&self, dir: &Inode) -> bool {
        if !self.sbi.dir_index {
            return false;
        }
        dir.flags() & INDEX_FL != 0
            || (dir.size() == u64::from(self.sbi.block_size) && self.default_dx_hash().is_some())
    }

    /// Hash-order readdir of `dir` from position `pos`; `f` gets each entry with its own
    /// position (`None` when the index is unusable and blocks are read in order).
    pub(super) fn dx_readdir(
        &self,
        dir: &Inode,
        pos: u64,
        mut f: impl FnMut(DirEntry, Option<u64>) -> bool,
    ) -> Result<()> {
        if pos & LINEAR_POS != 0 {
            return self.readdir_linear(dir, pos & !LINEAR_POS, |mut e, at| {
                e.next |= LINEAR_POS;
                f(e, at)
            });
        }
        // What this call has handed out, in case the index turns out to be unusable midway.
        let mut given: Option<HashSet<Where>> = (pos == 0).then(HashSet::new);
        let mut start = pos;
        loop {
            let batch = self.names_stable(dir, || self.dx_batch(dir, start))?;
            let (mut entries, next_hash) = match batch {
                Batch::Entries { entries, next_hash } => (entries, next_hash),
                Batch::Unusable => return self.dx_fallback(dir, given, f),
            };
            // Stable: `.` and `..` were put first.
            entries.sort_by_key(|e| e.0);
            for i in 0..entries.len() {
                let p = entries[i].0;
                let same_next = entries.get(i + 1).is_some_and(|n| n.0 == p);
                let w = entries[i].1;
                let mut e = std::mem::replace(&mut entries[i].2, empty_entry());
                e.next = if same_next { p } else { p + 1 };
                if let Some(g) = given.as_mut() {
                    g.insert(w);
                }
                if !f(e, Some(p)) {
                    return Ok(());
                }
            }
            match next_hash {
                Some(h) => start = start.max(hash2pos(h & !1, 0)),
                None => return Ok(()),
            }
        }
    }

    /// The index is unusable: read the blocks in order, skipping what this call already gave
    /// (if it started at 0; a resumed one cannot know, and reports the corruption).
    fn dx_fallback(
        &self,
        dir: &Inode,
        given: Option<HashSet<Where>>,
        mut f: impl FnMut(DirEntry, Option<u64>) -> bool,
    ) -> Result<()> {
        let Some(given) = given else {
            let what = "htree index unusable while reading the directory";
            return Err(Error::Corrupt(Corrupt(CorruptKind::DirEntry { ino: dir.ino, block: None, what })));
        };
        let bs = u64::from(self.sbi.block_size);
        self.readdir_linear(dir, 0, |mut e, at| {
            // A linear read reports the end of each record as its `next`.
            let lblk = e.next.saturating_sub(1) / bs;
            let off = crate::num::usize_from(e.next - lblk * bs);
            let given_here = u32::try_from(lblk).is_ok_and(|l| given.contains(&(l, off)));
            e.next |= LINEAR_POS;
            given_here || f(e, at)
        })
    }

    /// Reads the batch of entries at or after position `start`.
    fn dx_batch(&self, dir: &Inode, start: u64) -> Result<Batch> {
        if !self.is_dx(dir) {
            return self.one_block_batch(dir, start);
        }
        let mut path = match self.dx_probe(dir, DxKey::Hash(pos2major(start)))? {
            Ok(p) => p,
            Err(_) => return Ok(Batch::Unusable),
        };
        let mut entries = Vec::new();
        if start <= DOTDOT_POS {
            let d = path.levels[0].buf.data();
            let mut it = DirBlockIter::new(&d, self.sbi.block_size);
            for p in [0, DOTDOT_POS] {
                let Some(Ok(e)) = it.next() else { return Ok(Batch::Unusable) };
                if p >= start && e.inode != 0 {
                    entries.push((p, (0, e.offset + e.rec_len as usize), self.dir_entry(&e, 0)));
                }
            }
        }
        loop {
            let Some((_, buf)) = self.dir_block(dir, path.leaf, DirBlockKind::Leaf)? else {
                return Ok(Batch::Unusable);
            };
            let found = self.hashed_entries(dir, path.leaf, &buf, path.algo, false)?;
            // Every hash of a leaf lies in its range, or the index does not describe it.
            if found.iter().any(|e| e.0 < path.lo) {
                return Ok(Batch::Unusable);
            }
            let next = match self.dx_next_leaf(dir, &mut path)? {
                Ok(n) => n,
                Err(_) => return Ok(Batch::Unusable),
            };
            if let Some(n) = next {
                let over = |m: u32| if n & 1 != 0 { m > n & !1 } else { m >= n };
                if found.iter().any(|e| over(e.0)) {
                    return Ok(Batch::Unusable);
                }
            }
            entries.extend(found.into_iter().filter(|e| e.1 >= start).map(|(_, p, w, e)| (p, w, e)));
            match next {
                Some(n) if n & 1 != 0 => continue,
                _ => return Ok(Batch::Entries { entries, next_hash: next }),
            }
        }
    }

    /// The whole of a one-block, unindexed directory, hashed with the default hash.
    fn one_block_batch(&self, dir: &Inode, start: u64) -> Result<Batch> {
        let Some(algo) = self.default_dx_hash() else { return Ok(Batch::Unusable) };
        let mut entries = Vec::new();
        if let Some((DirBlockKind::Leaf, buf)) = self.dir_block_any(dir, 0)? {
            let found = self.hashed_entries(dir, 0, &buf, algo, true)?;
            entries.extend(found.into_iter().filter(|e| e.1 >= start).map(|(_, p, w, e)| (p, w, e)));
        }
        Ok(Batch::Entries { entries, next_hash: None })
    }

    /// The live entries of leaf `lblk` with their major hash and position (with `dots`, `.`
    /// and `..` get positions 0 and 2, as in an index root).
    fn hashed_entries(
        &self,
        dir: &Inode,
        lblk: u32,
        buf: &Buffer,
        algo: HashAlgo,
        dots: bool,
    ) -> Result<Vec<(u32, u64, Where, DirEntry)>> {
        let d = buf.data();
        let mut v = Vec::new();
        let stored = self.hash_in_dirent(dir);
        let area = self.leaf_entries(&d);
        for e in DirBlockIter::new(area, self.sbi.block_size) {
            let Ok(e) = e else {
                let what = "bad directory entry";
                let block = Some(PhysBlock(buf.blk));
                return Err(Error::Corrupt(Corrupt(CorruptKind::DirEntry { ino: dir.ino, block, what })));
            };
            if e.inode == 0 {
                continue;
            }
            let (major, p) = match e.name {
                b"." if dots => (0, 0),
                b".." if dots => (2, DOTDOT_POS),
                // Entries that carry their hashes are listed by them.
                _ if stored => {
                    let (major, minor) =
                        rext4_format::dirent::stored_hash(area, e.offset, e.name.len()).unwrap_or((0, 0));
                    (major, hash2pos(major, minor))
                }
                n => {
                    let h = self.name_hash(dir, n, algo)?;
                    (h.major, hash2pos(h.major, h.minor))
                }
            };
            v.push((major, p, (lblk, e.offset + e.rec_len as usize), self.dir_entry(&e, 0)));
        }
        Ok(v)
    }
}

fn empty_entry() -> DirEntry {
    DirEntry { ino: rext4_format::InodeNo(0), name: Vec::new(), kind: None, next: 0 }
}
