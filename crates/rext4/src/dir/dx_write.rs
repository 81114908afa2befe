//! Hashed (htree, dir_index) directories: the index walk shared by writers and hash-order
//! readdir, and the write side of the kernel's `namei.c` (`dx_probe`, `make_indexed_dir`,
//! `ext4_dx_add_entry`, `do_split`, `dx_insert_block`): indexing a full one-block directory,
//! inserting with leaf splits, index-node splits and new levels, and finding the leaves that
//! may hold a name (for removal and repointing, which then edit the leaf like the linear code).
//!
//! # Locking
//! Writers hold the directory's `op_lock`, so the index does not change under their walk.
//! Readers (lookups, readdir) take no directory lock: every change that moves existing entries
//! between blocks (indexing, a leaf or node split, a new level) runs with the directory's
//! `names_gen` odd ([`NamesMoving`]), and readers retry when it was odd or has changed
//! ([`FsInner::names_stable`]). Adding or removing one entry in place moves nothing else, and
//! each block is read and written whole under its own lock.

use crate::alloc::reserved::Pool;
use crate::cache::buffer::Buffer;
use crate::dir::lookup::Room;
use crate::dir::write::{put_entry, rec_len_disk};
use crate::dir::DirBlockKind;
use crate::error::{Corrupt, CorruptKind, Error, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use crate::jbd2::transaction::Handle;
use rext4_format::dirent as fd;
use rext4_format::dx;
use rext4_format::hash::{DxHash, HashAlgo};
use rext4_format::inode::INDEX_FL;
use rext4_format::{InodeNo, PhysBlock};
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn le16(b: &[u8], off: usize) -> usize {
    usize::from(u16::from_le_bytes([b[off], b[off + 1]]))
}

fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

// Cannot truncate: the values are dx counts and limits, at most a block's worth of 8-byte
// entries (8192).
#[allow(clippy::cast_possible_truncation)]
fn put16(b: &mut [u8], off: usize, v: usize) {
    b[off..off + 2].copy_from_slice(&(v as u16).to_le_bytes());
}

fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// Hash of index entry `i` of the entries at `off` (entry 0's is implicitly 0).
fn ent_hash(b: &[u8], off: usize, i: usize) -> u32 {
    if i == 0 {
        0
    } else {
        le32(b, off + i * dx::ENTRY_SIZE)
    }
}

fn ent_block(b: &[u8], off: usize, i: usize) -> u32 {
    le32(b, off + i * dx::ENTRY_SIZE + 4)
}

/// Where a full leaf is cut (`do_split`), given its live entries sorted by hash as (major
/// hash, bytes): the first entry that moves, entries moving from the top until about half the
/// block's bytes did (or half the entries, if they all fit in half a block); and whether that
/// entry's hash also stays behind, so the new leaf continues a collision. `map` is not empty.
fn split_point(map: &[(u32, usize)], bs: usize) -> (usize, bool) {
    let (mut size, mut moved) = (0, 0);
    for &(_, len) in map.iter().rev() {
        if size + len / 2 > bs / 2 {
            break;
        }
        size += len;
        moved += 1;
    }
    let count = map.len();
    let split = if moved + 1 < count { count - moved } else { count / 2 };
    (split, split > 0 && map[split - 1].0 == map[split].0)
}

/// An entry to add: its on-disk name, inode, file type, and the hash it stores where the
/// directory's entries carry theirs (`FsInner::new_entry_hash`).
pub(super) type NewEntry<'a> = (&'a [u8], InodeNo, u8, Option<DxHash>);

/// What a probe descends by.
#[derive(Clone, Copy)]
pub(super) enum DxKey<'a> {
    /// A name, hashed with the directory's algorithm.
    Name(&'a [u8]),
    /// A major hash (readdir positions).
    Hash(u32),
    /// A name with its hash under an algorithm, hashed again only if the directory's
    /// algorithm is another.
    Hashed(&'a [u8], HashAlgo, DxHash),
}

/// One index block on the path from the root to a leaf.
pub(crate) struct Level {
    pub buf: Arc<Buffer>,
    /// Offset of the count/limit header in the block.
    pub off: usize,
    pub count: usize,
    pub limit: usize,
    /// The entry followed.
    pub at: usize,
}

/// The path from the root to the leaf whose hash range holds a hash (`dx_probe`).
pub(super) struct DxPath {
    /// Root first. [valid while the directory's `op_lock` is held or `names_gen` unchanged]
    pub levels: Vec<Level>,
    pub algo: HashAlgo,
    /// The hash probed for (minor 0 for [`DxKey::Hash`]).
    pub hash: DxHash,
    /// Logical block of the leaf.
    pub leaf: u32,
    /// The lowest major hash the leaf may hold (its index entry's, continuation bit cleared).
    pub lo: u32,
}

/// Keeps a directory's `names_gen` odd while entries move between its blocks, so lookups and
/// readdir batches that ran meanwhile are retried. Only the holder of the directory's
/// `op_lock` changes `names_gen`, so when it is odd already (a removal or rename in progress)
/// that window covers this one and nothing is added.
pub(crate) struct NamesMoving<'a>(&'a Inode, bool);

impl<'a> NamesMoving<'a> {
    pub(crate) fn new(dir: &'a Inode) -> Self {
        let even = dir.names_gen.load(Ordering::Acquire).is_multiple_of(2);
        if even {
            dir.names_gen.fetch_add(1, Ordering::AcqRel);
        }
        NamesMoving(dir, even)
    }
}

impl Drop for NamesMoving<'_> {
    fn drop(&mut self) {
        if self.1 {
            self.0.names_gen.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl FsInner {
    /// Entries that fit in the root block (`dx_root_limit`).
    fn dx_root_limit(&self) -> usize {
        let tail = if self.sbi.metadata_csum { dx::TAIL_SIZE } else { 0 };
        (self.sbi.block_size as usize - dx::ROOT_ENTRIES_OFFSET - tail) / dx::ENTRY_SIZE
    }

    /// Entries that fit in an interior node of `dir` (`dx_node_limit`). The kernel takes the
    /// node's empty entry to be as long as one of `dir`'s with no name, so where entries carry
    /// their hashes a node holds one entry fewer; e2fsck writes such nodes without that, so
    /// both are read ([`FsInner::dx_node_limit_ok`]).
    fn dx_node_limit(&self, dir: &Inode) -> usize {
        let tail = if self.sbi.metadata_csum { dx::TAIL_SIZE } else { 0 };
        (self.sbi.block_size as usize - dx::NODE_ENTRIES_OFFSET - self.dirent_extra(dir) - tail)
            / dx::ENTRY_SIZE
    }

    /// Whether `limit` is a node's of `dir`: the kernel's, or e2fsck's where they differ.
    fn dx_node_limit_ok(&self, dir: &Inode, limit: usize) -> bool {
        let tail = if self.sbi.metadata_csum { dx::TAIL_SIZE } else { 0 };
        limit == self.dx_node_limit(dir)
            || self.hash_in_dirent(dir)
                && limit == (self.sbi.block_size as usize - dx::NODE_ENTRIES_OFFSET - tail) / dx::ENTRY_SIZE
    }

    /// The hash an index of `dir` whose root names hash version `v` uses; `None` where the
    /// index cannot be used. A directory whose entries carry their hashes takes version 6
    /// (SipHash) and only it, another directory any but it (`dx_probe`); SipHash comes from
    /// the key ([`FsInner::name_hash`]), so the algorithm returned for it only marks hashes
    /// as this index's and is never run.
    pub(super) fn dx_algo(&self, dir: &Inode, v: u8) -> Option<HashAlgo> {
        if self.hash_in_dirent(dir) {
            return (v == rext4_format::hash::DX_HASH_SIPHASH).then_some(HashAlgo::Legacy);
        }
        HashAlgo::for_dir(v, self.sbi.hash_unsigned)
    }

    /// Index blocks a path may have (root included): two, three with large_dir.
    fn dx_max_levels(&self) -> usize {
        usize::from(if self.sbi.large_dir { dx::MAX_LEVELS_LARGEDIR } else { dx::MAX_LEVELS })
    }

    /// The hash new indexes use: the superblock's default version, with its signedness.
    pub(super) fn default_dx_hash(&self) -> Option<HashAlgo> {
        HashAlgo::for_dir(self.sbi.sb.s_def_hash_version, self.sbi.hash_unsigned)
    }

    /// Whether a full one-block directory may be turned into an indexed one. An encrypted one
    /// is hashed by its ciphertext names, or, casefolded, by the hashes its entries carry.
    pub(super) fn can_index(&self) -> bool {
        self.sbi.dir_index && self.default_dx_hash().is_some()
    }

    fn dx_corrupt(&self, dir: &Inode, block: Option<u64>, what: &'static str) -> Error {
        Error::Corrupt(Corrupt(CorruptKind::DirEntry { ino: dir.ino, block: block.map(PhysBlock), what }))
    }

    fn dx_seal(&self, dir: &Inode, block: &mut [u8]) {
        if self.sbi.metadata_csum {
            dx::set_checksum(block, dir.csum_seed);
        }
    }

    /// Runs `f` (a read of `dir`'s entries without its `op_lock`) until no entries moved
    /// between blocks while it ran (see [`NamesMoving`]).
    pub(super) fn names_stable<T>(&self, dir: &Inode, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        // Past this many tries the answer is taken as it is: a writer stuck in its window
        // must not hang readers for ever.
        const GIVE_UP: u32 = 200_000;
        let mut tries = 0u32;
        loop {
            let gen = dir.names_gen.load(Ordering::Acquire);
            if gen.is_multiple_of(2) || tries >= GIVE_UP {
                let r = f();
                if tries >= GIVE_UP || dir.names_gen.load(Ordering::Acquire) == gen {
                    return r;
                }
            }
            tries += 1;
            if tries < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
    }

    /// Walks the index of `dir` from the root to the leaf for `key`. The inner `Err` says why
    /// the index cannot be used (the kernel's `ERR_BAD_DX_DIR`); the outer one is an I/O or
    /// checksum error.
    pub(super) fn dx_probe(&self, dir: &Inode, key: DxKey<'_>) -> Result<Result<DxPath, &'static str>> {
        let nblocks = dir.size() / u64::from(self.sbi.block_size);
        let Some((_, root)) = self.dir_block(dir, 0, DirBlockKind::Index)? else {
            return Ok(Err("htree root is a hole"));
        };
        let (algo, depth, level) = {
            let d = root.data();
            let Ok(r) = dx::parse_root(&d) else { return Ok(Err("bad htree root")) };
            if usize::from(r.info.indirect_levels) >= self.dx_max_levels() {
                return Ok(Err("htree too deep"));
            }
            if r.info.unused_flags & 1 != 0 {
                return Ok(Err("htree root has unknown flags"));
            }
            let Some(algo) = self.dx_algo(dir, r.info.hash_version) else {
                return Ok(Err("unknown htree hash version"));
            };
            if usize::from(r.entries.limit) != self.dx_root_limit() {
                return Ok(Err("bad htree root limit"));
            }
            let e = r.entries;
            let level = Level {
                buf: root.clone(),
                off: e.offset,
                count: e.len(),
                limit: usize::from(e.limit),
                at: 0,
            };
            (algo, usize::from(r.info.indirect_levels), level)
        };
        let hash = match key {
            DxKey::Hash(h) => Ok(DxHash { major: h, minor: 0 }),
            DxKey::Hashed(_, a, h) if a == algo => Ok(h),
            DxKey::Name(n) | DxKey::Hashed(n, _, _) => self.name_hash(dir, n, algo),
        };
        let hash = match hash {
            Ok(h) => h,
            Err(Error::NoKey) => return Ok(Err("names hashed with a key that is not here")),
            Err(e) => return Err(e),
        };
        let mut path = DxPath { levels: vec![level], algo, hash, leaf: 0, lo: 0 };
        loop {
            let child = {
                let is_root = path.levels.len() == 1;
                // Cannot fail: `levels` starts with the root and only grows.
                let l = path.levels.last_mut().unwrap();
                let d = l.buf.data();
                let e = if is_root { dx::parse_root(&d).map(|r| r.entries) } else { dx::parse_node(&d) };
                let Ok(e) = e else { return Ok(Err("htree block changed shape")) };
                l.at = e.find(hash.major);
                let (h, child) = e.get(l.at);
                if l.at > 0 {
                    path.lo = h & !1;
                }
                child
            };
            if child == 0 || u64::from(child) >= nblocks {
                return Ok(Err("htree entry points outside the directory"));
            }
            if path.levels.len() > depth {
                path.leaf = child;
                return Ok(Ok(path));
            }
            match self.dx_level(dir, child)? {
                Ok(l) => path.levels.push(l),
                Err(why) => return Ok(Err(why)),
            }
        }
    }

    /// Reads interior node `lblk` (a leaf where a node should be is a structural problem, not
    /// a checksum one).
    fn dx_level(&self, dir: &Inode, lblk: u32) -> Result<Result<Level, &'static str>> {
        let Some((DirBlockKind::Index, buf)) = self.dir_block_any(dir, lblk)? else {
            return Ok(Err("htree node is not an index block"));
        };
        let (off, count, limit) = {
            let d = buf.data();
            let Ok(e) = dx::parse_node(&d) else { return Ok(Err("bad htree node")) };
            (e.offset, e.len(), usize::from(e.limit))
        };
        if !self.dx_node_limit_ok(dir, limit) {
            return Ok(Err("bad htree node limit"));
        }
        Ok(Ok(Level { buf, off, count, limit, at: 0 }))
    }

    /// Moves `path` to the next leaf in hash order; returns the hash its index entry holds
    /// (low bit: the previous leaf's last hash continues there), or `None` after the last leaf.
    pub(super) fn dx_next_leaf(
        &self,
        dir: &Inode,
        path: &mut DxPath,
    ) -> Result<Result<Option<u32>, &'static str>> {
        let depth = path.levels.len();
        let mut k = depth;
        while k > 0 && path.levels[k - 1].at + 1 >= path.levels[k - 1].count {
            k -= 1;
        }
        if k == 0 {
            return Ok(Ok(None));
        }
        let l = &mut path.levels[k - 1];
        l.at += 1;
        let (bhash, mut child) = {
            let d = l.buf.data();
            if l.off + (l.at + 1) * dx::ENTRY_SIZE > d.len() {
                return Ok(Err("htree count past the block"));
            }
            (ent_hash(&d, l.off, l.at), ent_block(&d, l.off, l.at))
        };
        path.levels.truncate(k);
        let nblocks = dir.size() / u64::from(self.sbi.block_size);
        while path.levels.len() < depth {
            if child == 0 || u64::from(child) >= nblocks {
                return Ok(Err("htree entry points outside the directory"));
            }
            let l = match self.dx_level(dir, child)? {
                Ok(l) => l,
                Err(why) => return Ok(Err(why)),
            };
            child = ent_block(&l.buf.data(), l.off, 0);
            path.levels.push(l);
        }
        if child == 0 || u64::from(child) >= nblocks {
            return Ok(Err("htree entry points outside the directory"));
        }
        path.leaf = child;
        path.lo = bhash & !1;
        Ok(Ok(Some(bhash)))
    }

    /// The leaves of indexed `dir` that may hold `name`: its hash's leaf and those the hash
    /// continues into. `None` if the index is unusable (search every leaf, as the kernel does).
    pub(super) fn dx_leaves_for(&self, dir: &Inode, name: &[u8]) -> Result<Option<Vec<u32>>> {
        let mut path = match self.dx_probe(dir, DxKey::Name(name))? {
            Ok(p) => p,
            Err(_) => return Ok(None),
        };
        let mut leaves = vec![path.leaf];
        loop {
            match self.dx_next_leaf(dir, &mut path)? {
                Ok(Some(h)) if h & !1 == path.hash.major => leaves.push(path.leaf),
                Ok(_) => return Ok(Some(leaves)),
                Err(_) => return Ok(None),
            }
        }
    }

    fn dx_leaf_buf(&self, dir: &Inode, lblk: u32) -> Result<Arc<Buffer>> {
        match self.dir_block(dir, lblk, DirBlockKind::Leaf)? {
            Some((_, buf)) => Ok(buf),
            None => Err(self.dx_corrupt(dir, None, "htree leaf is a hole")),
        }
    }

    /// The next logical block of `dir` (new blocks go at the end).
    fn dir_end_lblk(&self, dir: &Inode) -> Result<u32> {
        u32::try_from(dir.size() / u64::from(self.sbi.block_size)).map_err(|_| Error::NoSpace)
    }

    /// Adds `name` -> `ino` to indexed directory `dir` (`ext4_dx_add_entry`): into its leaf if
    /// there is room; otherwise the leaf is split, after splitting full index nodes above it or
    /// adding a level (one such change per pass, then the walk starts again).
    pub(super) fn dx_add_entry(
        &self,
        h: &Handle,
        dir: &Inode,
        new: NewEntry<'_>,
        mut room: Option<Room>,
    ) -> Result<()> {
        let (name, ino, ft, hash) = new;
        let extra = self.dirent_extra(dir);
        let need = fd::rec_len_for(name.len()) + extra;
        let area = self.entry_area();
        // At most a new level and a split of each node level come before the leaf split.
        for _ in 0..=2 * self.dx_max_levels() {
            let key = match room {
                Some(r) => DxKey::Hashed(name, r.hash.0, r.hash.1),
                None => DxKey::Name(name),
            };
            let path = self.dx_probe(dir, key)?.map_err(|w| self.dx_corrupt(dir, None, w))?;
            let leaf = self.dx_leaf_buf(dir, path.leaf)?;
            // The caller's scan of this leaf, if it scanned it (only for the first probe: a
            // split moves names), else a scan here.
            let slot = match room.take() {
                Some(r) if r.lblk == path.leaf => r.slot,
                _ => self.leaf_slot(&leaf.data(), need, extra),
            };
            if let Some(slot) = slot {
                let mut b = h.write(&leaf)?;
                // The directory's op_lock keeps its leaves as scanned; an O(1) check of the
                // slot guards that, and a scan replaces it should it fail.
                let slot = if self.slot_holds(&b[..area], slot, extra) {
                    Some(slot)
                } else {
                    self.leaf_slot(&b, need, extra)
                };
                if let Some(slot) = slot {
                    self.leaf_put(&mut b, slot, name, ino, ft, hash);
                    self.seal_leaf_in(dir, &leaf, &mut b);
                    return Ok(());
                }
            }
            let _moving = NamesMoving::new(dir);
            let last = path.levels.len() - 1;
            if path.levels[last].count < path.levels[last].limit {
                return self.dx_split_leaf(h, dir, &path, &leaf, new);
            }
            // The deepest full node whose parent has room is split; if every node on the path
            // is full, the tree grows a level.
            let mut k = last;
            while k > 0 && path.levels[k - 1].count >= path.levels[k - 1].limit {
                k -= 1;
            }
            if k > 0 {
                self.dx_split_node(h, dir, &path, k)?;
            } else if path.levels.len() >= self.dx_max_levels() {
                // The kernel's "Directory index full!"
                return Err(Error::NoSpace);
            } else {
                self.dx_add_level(h, dir, &path)?;
            }
        }
        Err(self.dx_corrupt(dir, None, "htree insertion does not converge"))
    }

    /// Inserts `(hash, lblk)` after the followed entry of `level` (`dx_insert_block`); the
    /// caller made sure there is room.
    fn dx_insert(&self, h: &Handle, dir: &Inode, level: &Level, hash: u32, lblk: u32) -> Result<()> {
        let mut b = h.write(&level.buf)?;
        let (off, count) = (level.off, le16(&b, level.off + 2));
        if count >= level.limit || level.at >= count {
            return Err(self.dx_corrupt(dir, Some(level.buf.blk), "htree node changed under its lock"));
        }
        let at = level.at + 1;
        let (from, to) = (off + at * dx::ENTRY_SIZE, off + count * dx::ENTRY_SIZE);
        b.copy_within(from..to, from + dx::ENTRY_SIZE);
        put32(&mut b, from, hash);
        put32(&mut b, from + 4, lblk);
        put16(&mut b, off + 2, count + 1);
        self.dx_seal(dir, &mut b);
        Ok(())
    }

    /// Appends a block to `dir` for new index or leaf contents.
    fn dx_new_block(&self, h: &Handle, dir: &Inode) -> Result<(u32, Arc<Buffer>)> {
        let lblk = self.dir_end_lblk(dir)?;
        let pblk = {
            // Readers map directory blocks under data_sem: keep them off the tree being edited.
            let _d = self.stats.write(crate::fs::stats::LockClass::DataSem, &dir.data_sem);
            self.append_block(h, dir, &mut dir.raw_mut(), lblk, Pool::Ordinary)?
        };
        Ok((lblk, self.bcache.get_fresh(pblk)))
    }

    /// A node block: an empty entry spanning the block, then the count/limit header and
    /// `entries` (whose first hash slot becomes the header).
    fn dx_node_block(&self, dir: &Inode, entries: &[u8]) -> Vec<u8> {
        let bs = self.sbi.block_size;
        let mut b = vec![0u8; bs as usize];
        put_entry(&mut b, 0, bs, 0, bs as usize, b"", 0);
        let off = dx::NODE_ENTRIES_OFFSET;
        b[off..off + entries.len()].copy_from_slice(entries);
        put16(&mut b, off, self.dx_node_limit(dir));
        put16(&mut b, off + 2, entries.len() / dx::ENTRY_SIZE);
        self.dx_seal(dir, &mut b);
        b
    }

    /// Splits full node `k` of the path in two halves; the upper half goes to a new node
    /// entered in node `k - 1`.
    fn dx_split_node(&self, h: &Handle, dir: &Inode, path: &DxPath, k: usize) -> Result<()> {
        let node = &path.levels[k];
        let (new_lblk, nbuf) = self.dx_new_block(h, dir)?;
        let (count, off) = (node.count, node.off);
        let keep = count / 2;
        let (hash2, upper) = {
            let d = node.buf.data();
            (ent_hash(&d, off, keep), d[off + keep * dx::ENTRY_SIZE..off + count * dx::ENTRY_SIZE].to_vec())
        };
        let fresh = self.dx_node_block(dir, &upper);
        h.write(&nbuf)?.copy_from_slice(&fresh);
        {
            let mut b = h.write(&node.buf)?;
            b[off + keep * dx::ENTRY_SIZE..off + count * dx::ENTRY_SIZE].fill(0);
            put16(&mut b, off + 2, keep);
            self.dx_seal(dir, &mut b);
        }
        self.dx_insert(h, dir, &path.levels[k - 1], hash2, new_lblk)
    }

    /// Moves the root's entries into a new node under it: one more level.
    fn dx_add_level(&self, h: &Handle, dir: &Inode, path: &DxPath) -> Result<()> {
        let root = &path.levels[0];
        let (new_lblk, nbuf) = self.dx_new_block(h, dir)?;
        let entries = root.buf.data()[root.off..root.off + root.count * dx::ENTRY_SIZE].to_vec();
        let fresh = self.dx_node_block(dir, &entries);
        h.write(&nbuf)?.copy_from_slice(&fresh);
        let mut b = h.write(&root.buf)?;
        b[root.off + dx::ENTRY_SIZE..root.off + root.count * dx::ENTRY_SIZE].fill(0);
        put16(&mut b, root.off + 2, 1);
        put32(&mut b, root.off + 4, new_lblk);
        b[dx::ROOT_INFO_OFFSET + 6] += 1;
        self.dx_seal(dir, &mut b);
        Ok(())
    }

    /// Lays `entries` (offsets and lengths in `src`) out from the start of a leaf, the last one
    /// taking the rest of the entry area; an empty list leaves one unused entry.
    fn dx_fill_leaf(&self, dst: &mut [u8], src: &[u8], entries: &[(usize, usize)]) {
        let bs = self.sbi.block_size;
        let area = self.entry_area();
        dst.fill(0);
        if entries.is_empty() {
            put_entry(dst, 0, bs, 0, area, b"", 0);
            return;
        }
        let mut pos = 0;
        for (i, &(off, len)) in entries.iter().enumerate() {
            dst[pos..pos + len].copy_from_slice(&src[off..off + len]);
            let rec = if i + 1 == entries.len() { area - pos } else { len };
            dst[pos + 4..pos + 6].copy_from_slice(&rec_len_disk(rec, bs).to_le_bytes());
            pos += len;
        }
    }

    /// Splits the full leaf of `path` (`do_split`): its entries sorted by hash, the upper half
    /// by size moves to a new block entered in the leaf's parent under the first moved hash
    /// (plus the continuation bit when that hash also stays behind); then `name` goes to the
    /// half its hash belongs to.
    fn dx_split_leaf(
        &self,
        h: &Handle,
        dir: &Inode,
        path: &DxPath,
        leaf: &Arc<Buffer>,
        (name, ino, ft, hash): NewEntry<'_>,
    ) -> Result<()> {
        let bs = self.sbi.block_size as usize;
        let src = leaf.data().to_vec();
        let extra = self.dirent_extra(dir);
        let mut map = Vec::new();
        for e in self.leaf_iter(&src).filter(|e| e.inode != 0) {
            // Entries that carry their hashes move by them, and take them along.
            let major = if extra > 0 {
                let area = &src[..self.entry_area()];
                fd::stored_hash(area, e.offset, e.name.len())
                    .ok_or_else(|| self.dx_corrupt(dir, Some(leaf.blk), "entry without room for its hash"))?
                    .0
            } else {
                self.name_hash(dir, e.name, path.algo)?.major
            };
            map.push((major, e.offset, fd::rec_len_for(e.name.len()) + extra));
        }
        if map.is_empty() {
            return Err(self.dx_corrupt(dir, Some(leaf.blk), "full htree leaf without entries"));
        }
        map.sort_by_key(|m| m.0);
        let sizes: Vec<(u32, usize)> = map.iter().map(|&(h, _, l)| (h, l)).collect();
        let (split, continued) = split_point(&sizes, bs);
        let hash2 = map[split].0;
        let (new_lblk, nbuf) = self.dx_new_block(h, dir)?;
        let pick = |m: &[(u32, usize, usize)]| m.iter().map(|&(_, o, l)| (o, l)).collect::<Vec<_>>();
        let mut low = vec![0u8; bs];
        let mut high = vec![0u8; bs];
        self.dx_fill_leaf(&mut low, &src, &pick(&map[..split]));
        self.dx_fill_leaf(&mut high, &src, &pick(&map[split..]));
        let target = if path.hash.major >= hash2 { &mut high } else { &mut low };
        let slot =
            self.leaf_slot(target, fd::rec_len_for(name.len()) + extra, extra).ok_or(Error::NoSpace)?;
        self.leaf_put(target, slot, name, ino, ft, hash);
        self.seal_leaf(dir, &mut low);
        self.seal_leaf(dir, &mut high);
        h.write(&nbuf)?.copy_from_slice(&high);
        h.write(leaf)?.copy_from_slice(&low);
        // Cannot fail: a path always has its root.
        let parent = path.levels.last().unwrap();
        self.dx_insert(h, dir, parent, hash2 | u32::from(continued), new_lblk)
    }

    /// Turns full one-block directory `dir` into an indexed one and adds `name`
    /// (`make_indexed_dir`): its entries after `..` move to a new leaf, block 0 becomes the
    /// root (keeping `.` and `..`), and that leaf is split at once, as the kernel does.
    pub(super) fn make_indexed_dir(&self, h: &Handle, dir: &Inode, new: NewEntry<'_>) -> Result<()> {
        let name = new.0;
        let bs = self.sbi.block_size;
        let Some(default) = self.default_dx_hash() else {
            return Err(Error::NotSupported("unknown default directory hash".into()));
        };
        let extra = self.dirent_extra(dir);
        let version =
            if extra > 0 { rext4_format::hash::DX_HASH_SIPHASH } else { self.sbi.sb.s_def_hash_version };
        let algo = self.dx_algo(dir, version).unwrap_or(default);
        let Some((_, b0)) = self.dir_block(dir, 0, DirBlockKind::Leaf)? else {
            return Err(self.dx_corrupt(dir, None, "first directory block is a hole"));
        };
        let src = b0.data().to_vec();
        let mut it = self.leaf_iter(&src);
        let (dot, dotdot) = (it.next(), it.next());
        let (Some(dot), Some(dotdot)) = (dot, dotdot) else {
            return Err(self.dx_corrupt(dir, Some(b0.blk), "missing '.' or '..'"));
        };
        // e2fsck's rebuild of an encrypted casefolded directory gives `.` the length of an
        // entry with a hash (20); the root puts `..` at 12 all the same.
        let dot_ok = dot.rec_len == 12 || extra > 0 && dot.rec_len as usize == fd::rec_len_for(1) + extra;
        if dot.name != b"." || !dot_ok || dotdot.name != b".." {
            return Err(self.dx_corrupt(dir, Some(b0.blk), "invalid rec_len for '..'"));
        }
        let rest: Vec<(usize, usize)> =
            it.filter(|e| e.inode != 0).map(|e| (e.offset, fd::rec_len_for(e.name.len()) + extra)).collect();
        let _moving = NamesMoving::new(dir);
        let (leaf_lblk, lbuf) = self.dx_new_block(h, dir)?;
        let mut leaf = vec![0u8; bs as usize];
        self.dx_fill_leaf(&mut leaf, &src, &rest);
        self.seal_leaf(dir, &mut leaf);
        h.write(&lbuf)?.copy_from_slice(&leaf);

        let mut root = vec![0u8; bs as usize];
        root[..12].copy_from_slice(&src[..12]);
        root[4..6].copy_from_slice(&12u16.to_le_bytes());
        put_entry(&mut root, 12, bs, dotdot.inode, bs as usize - 12, b"..", dotdot.file_type);
        let info = dx::ROOT_INFO_OFFSET;
        root[info + 4] = version;
        root[info + 5] = 8;
        let off = dx::ROOT_ENTRIES_OFFSET;
        put16(&mut root, off, self.dx_root_limit());
        put16(&mut root, off + 2, 1);
        put32(&mut root, off + 4, leaf_lblk);
        self.dx_seal(dir, &mut root);
        {
            let mut b = h.write(&b0)?;
            b.copy_from_slice(&root);
            b0.not_a_leaf(&mut b);
        }
        {
            let mut raw = dir.raw_mut();
            let flags = le32(&raw, 0x20) | INDEX_FL;
            put32(&mut raw, 0x20, flags);
            self.mark_inode_dirty(h, dir, &mut raw)?;
        }
        let path =
            self.dx_probe(dir, DxKey::Name(name))?.map_err(|w| self.dx_corrupt(dir, Some(b0.blk), w))?;
        debug_assert_eq!(path.algo, algo);
        let leaf = self.dx_leaf_buf(dir, path.leaf)?;
        self.dx_split_leaf(h, dir, &path, &leaf, new)
    }

    /// Points `..` of indexed `dir` (in the root block) at `ino`.
    pub(super) fn dx_set_dotdot(&self, h: &Handle, dir: &Inode, ino: InodeNo, ft: u8) -> Result<InodeNo> {
        let Some((_, root)) = self.dir_block(dir, 0, DirBlockKind::Index)? else {
            return Err(self.dx_corrupt(dir, None, "htree root is a hole"));
        };
        let mut b = h.write(&root)?;
        if b[12 + 6] != 2 || &b[20..22] != b".." {
            return Err(self.dx_corrupt(dir, Some(root.blk), "missing '..'"));
        }
        let old = le32(&b, 12);
        put32(&mut b, 12, ino.0);
        if self.sbi.filetype {
            b[12 + 7] = ft;
        }
        self.dx_seal(dir, &mut b);
        Ok(InodeNo(old))
    }
}

#[cfg(test)]
mod tests {
    use super::split_point;

    #[test]
    fn leaves_split_by_bytes_and_mark_collisions() {
        // 40 entries of 24 bytes in a 1 KiB block: about 512 bytes (21 entries) move.
        let map: Vec<(u32, usize)> = (0..40).map(|i| (i * 2, 24)).collect();
        assert_eq!(split_point(&map, 1024), (19, false));
        // Three 264-byte entries (255-byte names): the top two move.
        assert_eq!(split_point(&[(2, 264), (4, 264), (6, 264)], 1024), (1, false));
        // The cut falls inside a run of one hash: the new leaf continues it.
        let map: Vec<(u32, usize)> =
            (0..40).map(|i| (if (15..25).contains(&i) { 100 } else { i * 2 }, 24)).collect();
        assert_eq!(split_point(&map, 1024), (19, true));
        // Every entry with one hash: still cut, and continued.
        assert_eq!(split_point(&[(8, 300), (8, 300), (8, 300)], 1024), (1, true));
        // Small entries that all fit in half a block: half of them move.
        assert_eq!(split_point(&[(2, 12), (4, 12), (6, 12), (8, 12)], 1024), (2, false));
        assert_eq!(split_point(&[(2, 12)], 1024), (0, false));
    }
}
