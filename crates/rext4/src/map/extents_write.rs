//! Changing extent trees (the write side of the kernel's `extents.c`: `ext4_ext_insert_extent`,
//! `ext4_split_extent`, `ext4_ext_remove_space`, `ext4_ext_create_new_leaf`,
//! `ext4_ext_grow_indepth`, `ext4_ext_rm_idx`, `ext4_ext_correct_indexes`).
//!
//! Every change is one primitive, [`FsInner::ext_remap`]: give logical range `lo..hi` a new
//! mapping (a physical run, written or unwritten) or none. It walks to the leaf holding `lo`,
//! cuts what the leaf maps in the range, inserts the new run (merging with neighbours), and
//! stores the leaf back: splitting it when full (the parent gains an index, splitting in turn,
//! the root moving down a level when it overflows), freeing it when empty (the parent loses
//! the index), and keeping every index key equal to its child's first key, as e2fsck
//! requires. A range spanning several leaves is handled leaf by leaf.
//!
//! Callers hold the inode's `data_sem` (regular files) or `op_lock` (directories) and its
//! record for writing; the tree's blocks go through the journal handle.

use crate::alloc::reserved::Pool;
use crate::cache::buffer::Buffer;
use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::FsInner;
use crate::inode::write::{raw_add_blocks, raw_sub_blocks};
use crate::inode::Inode;
use crate::jbd2::transaction::Handle;
use rext4_format::extent::{
    self as fe, Extent, ExtentHeader, ExtentIndex, ENTRY_SIZE, EXTENT_MAGIC, INIT_MAX_LEN, UNINIT_MAX_LEN,
};
use rext4_format::PhysBlock;
use std::sync::Arc;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

/// Where `i_block` lives in a raw inode record.
pub(crate) const I_BLOCK: std::ops::Range<usize> = 0x28..0x28 + 60;

/// One past the largest logical block an extent can map.
pub(crate) const LBLK_END: u64 = 1 << 32;

/// Entries the root in `i_block` holds.
const ROOT_MAX: usize = 4;

/// An extent as edited in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ext {
    pub lblk: u64,
    pub len: u64,
    pub pblk: u64,
    pub unwritten: bool,
}

impl Ext {
    fn end(&self) -> u64 {
        self.lblk + self.len
    }

    fn max_len(unwritten: bool) -> u64 {
        u64::from(if unwritten { UNINIT_MAX_LEN } else { INIT_MAX_LEN })
    }

    // Cannot truncate: every extent is checked at its way in (parsed from a node, or given
    // to `ext_remap`) to end by LBLK_END (2^32), and `insert` splits runs longer than
    // `max_len` (below 2^16).
    #[allow(clippy::cast_possible_truncation)]
    fn to_disk(self) -> [u8; ENTRY_SIZE] {
        let mut e = Extent::new_zeroed();
        e.ee_block.set(self.lblk as u32);
        let len = self.len as u16 + if self.unwritten { INIT_MAX_LEN } else { 0 };
        e.ee_len.set(len);
        e.set_start(self.pblk);
        let mut out = [0u8; ENTRY_SIZE];
        out.copy_from_slice(e.as_bytes());
        out
    }
}

/// The entries of one node.
#[derive(Clone, Debug)]
enum Entries {
    Leaf(Vec<Ext>),
    /// (first logical block of the child, child block)
    Index(Vec<(u64, u64)>),
}

impl Entries {
    fn len(&self) -> usize {
        match self {
            Entries::Leaf(v) => v.len(),
            Entries::Index(v) => v.len(),
        }
    }

    fn first_key(&self) -> Option<u64> {
        match self {
            Entries::Leaf(v) => v.first().map(|e| e.lblk),
            Entries::Index(v) => v.first().map(|e| e.0),
        }
    }

    fn split_off(&mut self, at: usize) -> Entries {
        match self {
            Entries::Leaf(v) => Entries::Leaf(v.split_off(at)),
            Entries::Index(v) => Entries::Index(v.split_off(at)),
        }
    }
}

/// One node on the path from the root to a leaf.
struct Level {
    /// `None` for the root in `i_block`.
    buf: Option<Arc<Buffer>>,
    depth: u16,
    max: usize,
    entries: Entries,
    /// Index levels: which child the path follows.
    pos: usize,
}

impl Level {
    fn blk(&self) -> Option<u64> {
        self.buf.as_ref().map(|b| b.blk)
    }
}

/// Where the range of a path's leaf ends: where the nearest right sibling's subtree begins.
fn leaf_end(path: &[Level]) -> u64 {
    path.iter()
        .filter_map(|l| match &l.entries {
            Entries::Index(v) => v.get(l.pos + 1).map(|e| e.0),
            Entries::Leaf(_) => None,
        })
        .min()
        .unwrap_or(LBLK_END)
}

fn header(node: &[u8]) -> Result<ExtentHeader> {
    ExtentHeader::read_from_prefix(node)
        .map(|(h, _)| h)
        .map_err(|_| Error::InvalidInput("extent node too short"))
}

/// An empty extent root in `i_block` of record `raw`.
pub(crate) fn init_root(raw: &mut [u8]) {
    encode(&mut raw[I_BLOCK], 0, ROOT_MAX, &Entries::Leaf(Vec::new()));
}

/// Writes a node: header and entries, the rest of the entry area zeroed.
// Cannot truncate: `max` is a node's capacity (eh_max as read, or what a block holds: at most
// 5460 entries of 12 bytes), `entries` at most that, and index keys are extents' first
// blocks (below 2^32, see `Ext::to_disk`).
#[allow(clippy::cast_possible_truncation)]
fn encode(node: &mut [u8], depth: u16, max: usize, entries: &Entries) {
    let h = ExtentHeader {
        eh_magic: EXTENT_MAGIC.into(),
        eh_entries: (entries.len() as u16).into(),
        eh_max: (max as u16).into(),
        eh_depth: depth.into(),
        eh_generation: 0.into(),
    };
    node[..ENTRY_SIZE].copy_from_slice(h.as_bytes());
    let area_end = (ENTRY_SIZE * (max + 1)).min(node.len());
    node[ENTRY_SIZE..area_end].fill(0);
    let mut put = |i: usize, bytes: &[u8]| {
        node[ENTRY_SIZE * (i + 1)..ENTRY_SIZE * (i + 2)].copy_from_slice(bytes);
    };
    match entries {
        Entries::Leaf(v) => {
            for (i, e) in v.iter().enumerate() {
                put(i, &e.to_disk());
            }
        }
        Entries::Index(v) => {
            for (i, &(key, child)) in v.iter().enumerate() {
                let mut x = ExtentIndex::new_zeroed();
                x.ei_block.set(key as u32);
                x.set_leaf(child);
                put(i, x.as_bytes());
            }
        }
    }
}

impl FsInner {
    fn ext_block_max(&self) -> usize {
        (self.sbi.block_size as usize - ENTRY_SIZE) / ENTRY_SIZE
    }

    fn ext_bad(&self, inode: &Inode, blk: Option<u64>, what: &'static str) -> Error {
        Error::Corrupt(crate::error::Corrupt(CorruptKind::ExtentTree {
            ino: inode.ino,
            block: blk.map(PhysBlock),
            what,
        }))
    }

    /// Parses and checks one node (sorted, non-overlapping, in range).
    fn ext_parse(&self, inode: &Inode, blk: Option<u64>, node: &[u8]) -> Result<(u16, usize, Entries)> {
        let h = header(node)?;
        let n = usize::from(h.eh_entries.get());
        let max = usize::from(h.eh_max.get());
        if h.eh_magic.get() != EXTENT_MAGIC || n > max || ENTRY_SIZE * (max + 1) > node.len() {
            return Err(self.ext_bad(inode, blk, "bad node header"));
        }
        let depth = h.eh_depth.get();
        if depth > fe::MAX_DEPTH {
            return Err(self.ext_bad(inode, blk, "depth too large"));
        }
        let raw = |i: usize| &node[ENTRY_SIZE * (i + 1)..ENTRY_SIZE * (i + 2)];
        let mut prev_end = 0u64;
        let entries = if depth == 0 {
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                let e = Extent::read_from_bytes(raw(i)).map_err(|_| Error::InvalidInput("extent"))?;
                let x = Ext {
                    lblk: u64::from(e.ee_block.get()),
                    len: u64::from(e.len()),
                    pblk: e.start(),
                    unwritten: e.is_unwritten(),
                };
                if x.len == 0 || x.lblk < prev_end || x.end() > LBLK_END {
                    return Err(self.ext_bad(inode, blk, "extents overlap or out of order"));
                }
                self.check_range(inode.ino, x.pblk, x.len)?;
                prev_end = x.end();
                v.push(x);
            }
            Entries::Leaf(v)
        } else {
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                let x = ExtentIndex::read_from_bytes(raw(i)).map_err(|_| Error::InvalidInput("index"))?;
                let key = u64::from(x.ei_block.get());
                if i > 0 && key <= prev_end {
                    return Err(self.ext_bad(inode, blk, "index keys out of order"));
                }
                self.check_range(inode.ino, x.leaf(), 1)?;
                prev_end = key;
                v.push((key, x.leaf()));
            }
            Entries::Index(v)
        };
        Ok((depth, max, entries))
    }

    /// The path from the root (in `raw`) to the leaf that holds, or would hold, `lblk`.
    fn ext_walk(&self, inode: &Inode, raw: &[u8], lblk: u64) -> Result<Vec<Level>> {
        let (depth, max, entries) = self.ext_parse(inode, None, &raw[I_BLOCK])?;
        let mut path = vec![Level { buf: None, depth, max, entries, pos: 0 }];
        while let Some(level) = path.last_mut() {
            let Entries::Index(v) = &level.entries else { break };
            if v.is_empty() {
                return Err(self.ext_bad(inode, level.blk(), "empty index node"));
            }
            let pos = v.iter().rposition(|&(k, _)| k <= lblk).unwrap_or(0);
            level.pos = pos;
            let (child, want_depth) = (v[pos].1, level.depth - 1);
            let buf = self.read_extent_block(inode, child)?;
            let (depth, max, entries) = {
                let data = buf.data();
                self.ext_parse(inode, Some(child), &data)?
            };
            if depth != want_depth {
                return Err(self.ext_bad(inode, Some(child), "depth does not match parent"));
            }
            if path.len() > usize::from(fe::MAX_DEPTH) {
                return Err(self.ext_bad(inode, Some(child), "tree too deep"));
            }
            path.push(Level { buf: Some(buf), depth, max, entries, pos: 0 });
        }
        Ok(path)
    }

    /// Maps logical range `lo..hi` of the extent-mapped `inode` (record `raw`, held for
    /// writing) to `new` — `(first physical block, unwritten)` — or to nothing. Returns what
    /// was mapped there before, so the caller can free it (or not, when it remaps the same
    /// blocks). Tree blocks allocated or freed are counted in the record's `i_blocks`.
    /// Callers bound the work of one handle by the range they pass (see `ext_tail_start`).
    pub(crate) fn ext_remap(
        &self,
        h: &Handle,
        inode: &Inode,
        raw: &mut [u8],
        range: std::ops::Range<u64>,
        new: Option<(u64, bool)>,
    ) -> Result<Vec<Ext>> {
        let (lo, hi) = (range.start, range.end);
        if lo >= hi || hi > LBLK_END {
            return Err(Error::InvalidInput("extent range"));
        }
        let mut old = Vec::new();
        let mut pending = new.map(|(pblk, unwritten)| Ext { lblk: lo, len: hi - lo, pblk, unwritten });
        let mut cur = lo;
        while cur < hi {
            let path = self.ext_walk(inode, raw, cur)?;
            let leaf_hi = leaf_end(&path);
            if leaf_hi <= cur {
                return Err(self.ext_bad(inode, path.last().and_then(Level::blk), "index keys out of order"));
            }
            let seg_hi = hi.min(leaf_hi);
            let Some(Entries::Leaf(mut exts)) = path.last().map(|l| l.entries.clone()) else {
                return Err(self.ext_bad(inode, None, "path does not end in a leaf"));
            };
            let changed = cut(&mut exts, cur, seg_hi, &mut old);
            let mut tail = false;
            let mut touched = changed;
            if let Some(n) = pending.take() {
                tail = insert(&mut exts, n);
                touched = true;
            }
            if touched {
                let last = path.len() - 1;
                let mut spare = Vec::new();
                let stored =
                    self.ext_store(h, inode, raw, &path, last, Entries::Leaf(exts), tail, &mut spare);
                // A store refused part way (damage found) gives back the blocks it did not use.
                for b in spare {
                    self.free_blocks(h, b, 1, true)?;
                }
                stored?;
            }
            cur = seg_hi;
        }
        Ok(old)
    }

    /// Stores `entries` as the contents of `path[lvl]`, splitting, freeing or growing the tree
    /// as needed and fixing the parent's keys. `tail` says the change was at the node's end
    /// (an append), so a split moves only the last entry to the new node.
    ///
    /// A split that runs up the path takes every new block it needs before it changes any
    /// node (`spare`, filled at the first overflow, as `ext4_ext_split` does): out of space,
    /// the tree is left as it was, never with a split node its parent does not name.
    #[allow(clippy::too_many_arguments)]
    fn ext_store(
        &self,
        h: &Handle,
        inode: &Inode,
        raw: &mut [u8],
        path: &[Level],
        lvl: usize,
        mut entries: Entries,
        tail: bool,
        spare: &mut Vec<u64>,
    ) -> Result<()> {
        let level = &path[lvl];
        let sectors = self.meta_sectors();
        let n = entries.len();
        if n == 0 && lvl > 0 {
            // An empty node goes; its parent loses the index.
            let blk = level.blk().unwrap_or_default();
            self.free_blocks(h, blk, 1, true)?;
            raw_sub_blocks(raw, sectors);
            let parent = &path[lvl - 1];
            let Entries::Index(mut pv) = parent.entries.clone() else { return unreachable_leaf() };
            pv.remove(parent.pos);
            return self.ext_store(h, inode, raw, path, lvl - 1, Entries::Index(pv), false, spare);
        }
        if n == 0 {
            // The tree is empty: the root becomes an empty leaf.
            encode(&mut raw[I_BLOCK], 0, ROOT_MAX, &Entries::Leaf(Vec::new()));
            return Ok(());
        }
        if n <= level.max {
            if lvl == 0 {
                if let Some(pulled) = self.ext_try_collapse(h, inode, raw, level, &entries)? {
                    encode(&mut raw[I_BLOCK], level.depth - 1, ROOT_MAX, &pulled);
                    return Ok(());
                }
                encode(&mut raw[I_BLOCK], level.depth, ROOT_MAX, &entries);
                return Ok(());
            }
            self.ext_write_node(h, inode, level.buf.as_ref(), level.depth, level.max, &entries)?;
            return self.ext_fix_key(h, inode, raw, path, lvl, entries.first_key(), spare);
        }
        // Overflow.
        let goal = level
            .blk()
            .or_else(|| path.get(1).and_then(Level::blk))
            .unwrap_or_else(|| self.inode_goal(inode));
        if spare.is_empty() {
            self.ext_take_split_blocks(h, path, lvl, goal, spare)?;
        }
        // Filled just above with one block for each level the split reaches.
        let Some(blk) = spare.pop() else { return Err(Error::NoSpace) };
        if lvl == 0 {
            // The root moves into a new block one level down (`ext4_ext_grow_indepth`).
            raw_add_blocks(raw, sectors);
            let buf = self.bcache.get_fresh(blk);
            let max = self.ext_block_max();
            if n > max {
                return Err(Error::InvalidInput("extent root overflow beyond a block"));
            }
            self.ext_write_node(h, inode, Some(&buf), level.depth, max, &entries)?;
            let key = entries.first_key().unwrap_or(0);
            encode(&mut raw[I_BLOCK], level.depth + 1, ROOT_MAX, &Entries::Index(vec![(key, blk)]));
            return Ok(());
        }
        // Split: the right part goes to a new block; the parent gains its index.
        let at = if tail && n - 1 <= level.max { n - 1 } else { n / 2 };
        let right = entries.split_off(at);
        raw_add_blocks(raw, sectors);
        let buf = self.bcache.get_fresh(blk);
        self.ext_write_node(h, inode, Some(&buf), level.depth, self.ext_block_max(), &right)?;
        self.ext_write_node(h, inode, level.buf.as_ref(), level.depth, level.max, &entries)?;
        let parent = &path[lvl - 1];
        let Entries::Index(mut pv) = parent.entries.clone() else { return unreachable_leaf() };
        pv[parent.pos].0 = entries.first_key().unwrap_or(pv[parent.pos].0);
        pv.insert(parent.pos + 1, (right.first_key().unwrap_or(0), blk));
        let tail = tail && parent.pos + 2 == pv.len();
        self.ext_store(h, inode, raw, path, lvl - 1, Entries::Index(pv), tail, spare)
    }

    /// Allocates, into `spare`, one block for each node a split of `path[lvl]` overflows:
    /// that node, each full parent above it, and the root's move down if the split reaches
    /// it. All of them or none.
    fn ext_take_split_blocks(
        &self,
        h: &Handle,
        path: &[Level],
        lvl: usize,
        goal: u64,
        spare: &mut Vec<u64>,
    ) -> Result<()> {
        let mut need = 1;
        let mut l = lvl;
        while l > 0 && path[l - 1].entries.len() + 1 > path[l - 1].max {
            need += 1;
            l -= 1;
        }
        if l == 0 && usize::from(path[0].depth) >= usize::from(fe::MAX_DEPTH) {
            // The root would have to move down past the deepest tree the format allows.
            return Err(Error::NoSpace);
        }
        while spare.len() < need {
            let want = u32::try_from(need - spare.len()).unwrap_or(1);
            match self.alloc_blocks(h, goal, want, Pool::NoFail) {
                Ok((blk, n)) => spare.extend((0..u64::from(n)).map(|k| blk + k).rev()),
                Err(e) => {
                    for &b in spare.iter() {
                        self.free_blocks(h, b, 1, true)?;
                    }
                    spare.clear();
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// After `path[lvl]` was stored with first key `first`: makes the parent's index key
    /// equal to it (and so on up while keys change).
    #[allow(clippy::too_many_arguments)]
    fn ext_fix_key(
        &self,
        h: &Handle,
        inode: &Inode,
        raw: &mut [u8],
        path: &[Level],
        lvl: usize,
        first: Option<u64>,
        spare: &mut Vec<u64>,
    ) -> Result<()> {
        if lvl == 0 {
            return Ok(());
        }
        let parent = &path[lvl - 1];
        let Entries::Index(mut pv) = parent.entries.clone() else { return unreachable_leaf() };
        let Some(first) = first else { return Ok(()) };
        if pv[parent.pos].0 == first {
            return Ok(());
        }
        pv[parent.pos].0 = first;
        self.ext_store(h, inode, raw, path, lvl - 1, Entries::Index(pv), false, spare)
    }

    /// A root with a single child small enough to live in `i_block` takes the child's
    /// entries, and the child block is freed (the tree shrinks a level).
    fn ext_try_collapse(
        &self,
        h: &Handle,
        inode: &Inode,
        raw: &mut [u8],
        root: &Level,
        entries: &Entries,
    ) -> Result<Option<Entries>> {
        let Entries::Index(v) = entries else { return Ok(None) };
        if v.len() != 1 {
            return Ok(None);
        }
        let child = v[0].1;
        let buf = self.read_extent_block(inode, child)?;
        let (depth, _, centries) = {
            let data = buf.data();
            self.ext_parse(inode, Some(child), &data)?
        };
        if depth + 1 != root.depth || centries.len() > ROOT_MAX {
            return Ok(None);
        }
        self.free_blocks(h, child, 1, true)?;
        raw_sub_blocks(raw, self.meta_sectors());
        Ok(Some(centries))
    }

    /// What a metadata block of a file (a tree block, an xattr block) adds to its `i_blocks`:
    /// the sectors of a cluster (a block without bigalloc; map/cluster.rs invariant 5).
    pub(crate) fn meta_sectors(&self) -> u64 {
        self.sbi.cluster_bytes() / 512
    }

    /// Writes a tree block (new or existing) through the journal, with its checksum.
    fn ext_write_node(
        &self,
        h: &Handle,
        inode: &Inode,
        buf: Option<&Arc<Buffer>>,
        depth: u16,
        max: usize,
        entries: &Entries,
    ) -> Result<()> {
        let Some(buf) = buf else { return Err(Error::InvalidInput("tree block expected")) };
        let mut data = h.write(buf)?;
        encode(&mut data, depth, max, entries);
        if self.sbi.metadata_csum {
            fe::set_block_checksum(&mut data, inode.csum_seed);
        }
        Ok(())
    }

    /// Tree blocks [`FsInner::ext_build`] needs for `runs` extents: leaves packed full,
    /// index levels above them until the root in `i_block` holds the top.
    pub(crate) fn ext_build_blocks(&self, runs: usize) -> u64 {
        let per = self.ext_block_max();
        let (mut total, mut nodes) = (0u64, runs);
        while nodes > ROOT_MAX {
            nodes = nodes.div_ceil(per);
            total += nodes as u64;
        }
        total
    }

    /// Builds the extent tree of `runs` (sorted, disjoint, written, each at most an extent
    /// long, below `LBLK_END`) in `raw`, whose `i_block` the caller has cleared: leaves
    /// packed full, index levels above them, the top in the record (what `ext4_ext_migrate`
    /// inserts extent by extent). Every tree block is allocated before anything is written
    /// or the record changes, so that a full filesystem fails it with nothing changed.
    /// `i_blocks` counts the tree blocks.
    pub(crate) fn ext_build(&self, h: &Handle, inode: &Inode, raw: &mut [u8], runs: &[Ext]) -> Result<()> {
        if runs.len() <= ROOT_MAX {
            encode(&mut raw[I_BLOCK], 0, ROOT_MAX, &Entries::Leaf(runs.to_vec()));
            return Ok(());
        }
        // No deeper than `MAX_DEPTH` (5): runs lie below 2^32 blocks, and even 1 KiB blocks
        // (84 entries a node) hold 4 * 84^5 > 2^32 of them in five levels.
        let per = self.ext_block_max();
        let total = self.ext_build_blocks(runs.len());
        let mut blocks: Vec<u64> = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
        let goal = self.inode_goal(inode);
        while (blocks.len() as u64) < total {
            let want = u32::try_from(total - blocks.len() as u64).unwrap_or(u32::MAX);
            match self.alloc_blocks(h, blocks.last().map_or(goal, |b| b + 1), want, Pool::NoFail) {
                Ok((b, n)) => blocks.extend(b..b + u64::from(n)),
                Err(e) => {
                    for &b in &blocks {
                        self.free_blocks(h, b, 1, true)?;
                    }
                    return Err(e);
                }
            }
        }
        let mut next = blocks.into_iter();
        // (first logical block, node block) of the level below, starting with the leaves.
        let mut below: Vec<(u64, u64)> = Vec::new();
        for chunk in runs.chunks(per) {
            let blk = next.next().ok_or(Error::NoSpace)?;
            let buf = self.bcache.get_fresh(blk);
            self.ext_write_node(h, inode, Some(&buf), 0, per, &Entries::Leaf(chunk.to_vec()))?;
            below.push((chunk[0].lblk, blk));
        }
        let mut depth = 1u16;
        while below.len() > ROOT_MAX {
            let mut level = Vec::with_capacity(below.len().div_ceil(per));
            for chunk in below.chunks(per) {
                let blk = next.next().ok_or(Error::NoSpace)?;
                let buf = self.bcache.get_fresh(blk);
                self.ext_write_node(h, inode, Some(&buf), depth, per, &Entries::Index(chunk.to_vec()))?;
                level.push((chunk[0].0, blk));
            }
            below = level;
            depth += 1;
        }
        encode(&mut raw[I_BLOCK], depth, ROOT_MAX, &Entries::Index(below));
        raw_add_blocks(raw, total * self.meta_sectors());
        Ok(())
    }

    /// Allocates a block from `pool` for `lblk` (a directory growing at its end), next to the
    /// block before it, and maps it. Returns the block; `i_blocks` counts it and any tree
    /// block.
    pub(crate) fn ext_append(
        &self,
        h: &Handle,
        inode: &Inode,
        raw: &mut [u8],
        lblk: u32,
        pool: Pool,
    ) -> Result<u64> {
        let goal = self.ext_goal(inode, raw, u64::from(lblk))?;
        let lblk = u64::from(lblk);
        // Quota was asked by the caller; with bigalloc the block may go in a cluster the
        // directory has (map/cluster.rs).
        let a = self.ext_alloc_data(h, inode, raw, lblk, goal, 1, false, pool, false)?;
        if let Err(e) = self.ext_remap(h, inode, raw, lblk..lblk + 1, Some((a.p, false))) {
            if a.fresh.1 > 0 {
                self.free_blocks(h, a.fresh.0, a.fresh.1, false)?;
            }
            return Err(e);
        }
        raw_add_blocks(raw, a.fresh.1 * u64::from(self.sbi.block_size / 512));
        Ok(a.p)
    }

    /// Where a new block for `lblk` should go (`ext4_ext_find_goal`): continuing the nearest
    /// extent at or before it, else the inode's group.
    pub(crate) fn ext_goal(&self, inode: &Inode, raw: &[u8], lblk: u64) -> Result<u64> {
        let path = self.ext_walk(inode, raw, lblk)?;
        if let Some(Level { entries: Entries::Leaf(v), .. }) = path.last() {
            if let Some(e) = v.iter().rev().find(|e| e.lblk <= lblk) {
                return Ok(e.pblk + (lblk - e.lblk));
            }
            if let Some(e) = v.first() {
                return Ok(e.pblk.saturating_sub(e.lblk - lblk));
            }
        }
        Ok(self.inode_goal(inode))
    }

    /// Moves every key at or past `from` by `delta` blocks, in every node (`COLLAPSE_RANGE`
    /// and `INSERT_RANGE`). The caller made sure no extent straddles `from` and the moved
    /// keys land in free space, so order and the index-equals-first-key rule still hold.
    pub(crate) fn ext_shift(
        &self,
        h: &Handle,
        inode: &Inode,
        raw: &mut [u8],
        from: u64,
        delta: i64,
    ) -> Result<()> {
        let moved = |k: u64| -> Result<u64> {
            k.checked_add_signed(delta).filter(|&v| v < LBLK_END).ok_or(Error::FileTooBig)
        };
        let (depth, max, mut entries) = self.ext_parse(inode, None, &raw[I_BLOCK])?;
        let mut children = Vec::new();
        shift_entries(&mut entries, from, &moved, &mut children)?;
        encode(&mut raw[I_BLOCK], depth, max, &entries);
        let mut stack = children;
        while let Some(child) = stack.pop() {
            let buf = self.read_extent_block(inode, child)?;
            let (depth, max, mut entries) = {
                let data = buf.data();
                self.ext_parse(inode, Some(child), &data)?
            };
            let mut below = Vec::new();
            if shift_entries(&mut entries, from, &moved, &mut below)? {
                self.ext_write_node(h, inode, Some(&buf), depth, max, &entries)?;
            }
            stack.extend(below);
        }
        Ok(())
    }

    /// Where the last `n` extents mapped in `lo..hi` begin, looking only at the leaf that holds
    /// the end of the range (so freeing from the end costs one walk per step); `None` when
    /// nothing is mapped there.
    pub(crate) fn ext_tail_start(
        &self,
        inode: &Inode,
        raw: &[u8],
        lo: u64,
        hi: u64,
        n: usize,
    ) -> Result<Option<u64>> {
        if lo >= hi {
            return Ok(None);
        }
        let path = self.ext_walk(inode, raw, hi - 1)?;
        let Some(Level { entries: Entries::Leaf(v), .. }) = path.last() else { return Ok(None) };
        let inside: Vec<&Ext> = v.iter().filter(|e| e.end() > lo && e.lblk < hi).collect();
        Ok(inside
            .len()
            .checked_sub(n.max(1))
            .map_or(inside.first(), |i| inside.get(i))
            .map(|e| e.lblk.max(lo)))
    }

    /// Every extent of the tree in `raw` overlapping `lo..hi`, in order (read-only walk).
    pub(crate) fn ext_collect(&self, inode: &Inode, raw: &[u8], lo: u64, hi: u64) -> Result<Vec<Ext>> {
        let mut out = Vec::new();
        let mut cur = lo;
        while cur < hi {
            let path = self.ext_walk(inode, raw, cur)?;
            let leaf_hi = leaf_end(&path);
            if leaf_hi <= cur {
                return Err(self.ext_bad(inode, None, "index keys out of order"));
            }
            if let Some(Level { entries: Entries::Leaf(v), .. }) = path.last() {
                out.extend(v.iter().filter(|e| e.end() > cur && e.lblk < hi.min(leaf_hi)).copied());
            }
            cur = leaf_hi;
        }
        Ok(out)
    }
}

/// Shifts the keys at or past `from` of one node; lists the children whose subtrees may hold
/// such keys. Returns whether anything moved.
fn shift_entries(
    entries: &mut Entries,
    from: u64,
    moved: &dyn Fn(u64) -> Result<u64>,
    children: &mut Vec<u64>,
) -> Result<bool> {
    let mut any = false;
    match entries {
        Entries::Leaf(v) => {
            for e in v.iter_mut().filter(|e| e.lblk >= from) {
                e.lblk = moved(e.lblk)?;
                if e.lblk + e.len > LBLK_END {
                    return Err(Error::FileTooBig);
                }
                any = true;
            }
        }
        Entries::Index(v) => {
            let n = v.len();
            for i in 0..n {
                let next = if i + 1 < n { v[i + 1].0 } else { LBLK_END };
                if next > from {
                    children.push(v[i].1);
                }
                if v[i].0 >= from {
                    v[i].0 = moved(v[i].0)?;
                    any = true;
                }
            }
        }
    }
    Ok(any)
}

fn unreachable_leaf<T>() -> Result<T> {
    corrupt(CorruptKind::ExtentTree { ino: rext4_format::InodeNo(0), block: None, what: "leaf above a leaf" })
}

/// Removes `lo..hi` from the sorted extents `v`, splitting those that cross the ends; the
/// removed pieces go to `old`. Returns whether anything changed.
fn cut(v: &mut Vec<Ext>, lo: u64, hi: u64, old: &mut Vec<Ext>) -> bool {
    let mut out = Vec::with_capacity(v.len() + 1);
    let mut changed = false;
    for &e in v.iter() {
        if e.end() <= lo || e.lblk >= hi {
            out.push(e);
            continue;
        }
        changed = true;
        if e.lblk < lo {
            out.push(Ext { len: lo - e.lblk, ..e });
        }
        let a = e.lblk.max(lo);
        let b = e.end().min(hi);
        old.push(Ext { lblk: a, len: b - a, pblk: e.pblk + (a - e.lblk), unwritten: e.unwritten });
        if e.end() > hi {
            out.push(Ext {
                lblk: hi,
                len: e.end() - hi,
                pblk: e.pblk + (hi - e.lblk),
                unwritten: e.unwritten,
            });
        }
    }
    *v = out;
    changed
}

/// Inserts `n` (whose range is free in `v`) in order, merging with neighbours that continue
/// it physically and in kind, and splitting it into extents no longer than the format allows.
/// Returns whether it ended up last (an append).
fn insert(v: &mut Vec<Ext>, n: Ext) -> bool {
    let max = Ext::max_len(n.unwritten);
    let at = v.partition_point(|e| e.lblk < n.lblk);
    let mut pieces = Vec::new();
    let mut rest = n;
    // Fill the left neighbour up first.
    if at > 0 {
        let l = &mut v[at - 1];
        if l.end() == rest.lblk && l.pblk + l.len == rest.pblk && l.unwritten == rest.unwritten && l.len < max
        {
            let take = (max - l.len).min(rest.len);
            l.len += take;
            rest = Ext { lblk: rest.lblk + take, len: rest.len - take, pblk: rest.pblk + take, ..rest };
        }
    }
    while rest.len > 0 {
        let take = rest.len.min(max);
        pieces.push(Ext { len: take, ..rest });
        rest = Ext { lblk: rest.lblk + take, len: rest.len - take, pblk: rest.pblk + take, ..rest };
    }
    // Merge the last piece with the right neighbour when both fit in one extent.
    if let (Some(last), Some(r)) = (pieces.last_mut(), v.get(at).copied()) {
        if last.end() == r.lblk
            && last.pblk + last.len == r.pblk
            && last.unwritten == r.unwritten
            && last.len + r.len <= max
        {
            last.len += r.len;
            v.remove(at);
        }
    } else if pieces.is_empty() && at > 0 && at < v.len() {
        // Everything went into the left neighbour; it may now touch the right one.
        let (l, r) = (v[at - 1], v[at]);
        if l.end() == r.lblk && l.pblk + l.len == r.pblk && l.unwritten == r.unwritten && l.len + r.len <= max
        {
            v[at - 1].len += r.len;
            v.remove(at);
        }
    }
    let np = pieces.len();
    v.splice(at..at, pieces);
    at + np >= v.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(lblk: u64, len: u64, pblk: u64) -> Ext {
        Ext { lblk, len, pblk, unwritten: false }
    }

    #[test]
    fn cut_splits_and_reports() {
        let mut v = vec![x(0, 10, 100), x(20, 10, 200)];
        let mut old = Vec::new();
        assert!(cut(&mut v, 5, 25, &mut old));
        assert_eq!(v, vec![x(0, 5, 100), x(25, 5, 205)]);
        assert_eq!(old, vec![x(5, 5, 105), x(20, 5, 200)]);
        let mut v = vec![x(0, 10, 100)];
        let mut old = Vec::new();
        cut(&mut v, 3, 6, &mut old);
        assert_eq!(v, vec![x(0, 3, 100), x(6, 4, 106)]);
        assert_eq!(old, vec![x(3, 3, 103)]);
    }

    #[test]
    fn insert_merges_both_sides_and_splits_long_runs() {
        let mut v = vec![x(0, 5, 100), x(10, 5, 110)];
        insert(&mut v, x(5, 5, 105));
        assert_eq!(v, vec![x(0, 15, 100)]);
        let mut v = vec![];
        assert!(insert(&mut v, x(0, 70000, 1000)));
        assert_eq!(v, vec![x(0, 32768, 1000), x(32768, 32768, 33768), x(65536, 4464, 66536)]);
        let mut v = vec![x(0, 5, 100)];
        let u = Ext { unwritten: true, ..x(5, 5, 105) };
        assert!(insert(&mut v, u));
        assert_eq!(v.len(), 2);
    }
}

#[cfg(test)]
#[path = "extents_write_tests.rs"]
mod full_disk_tests;
