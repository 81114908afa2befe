//! Appending to an extent tree (the write side of the kernel's `extents.c` for the case that
//! grows files and directories at their end: `ext4_ext_insert_extent` appending,
//! `ext4_ext_create_new_leaf`, `ext4_ext_grow_indepth`). Extends the last extent when the new
//! block continues it; otherwise adds an extent, adding a leaf (and growing the tree in depth)
//! when the rightmost leaf is full.

use crate::buffer::Buffer;
use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use crate::jbd2::transaction::Handle;
use rext4_format::extent::{
    self as fe, Extent, ExtentHeader, ExtentIndex, Node, ENTRY_SIZE, EXTENT_MAGIC, INIT_MAX_LEN,
};
use rext4_format::PhysBlock;
use std::sync::Arc;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

/// Where `i_block` lives in a raw inode record.
const I_BLOCK: std::ops::Range<usize> = 0x28..0x28 + 60;

fn header(node: &[u8]) -> Result<ExtentHeader> {
    ExtentHeader::read_from_prefix(node)
        .map(|(h, _)| h)
        .map_err(|_| Error::InvalidInput("extent node too short"))
}

fn set_entries(node: &mut [u8], n: usize) {
    node[2..4].copy_from_slice(&(n as u16).to_le_bytes());
}

fn put(node: &mut [u8], i: usize, entry: &[u8]) {
    node[ENTRY_SIZE * (i + 1)..ENTRY_SIZE * (i + 2)].copy_from_slice(entry);
}

fn new_node(node: &mut [u8], max: u16, depth: u16) {
    let h = ExtentHeader {
        eh_magic: EXTENT_MAGIC.into(),
        eh_entries: 0.into(),
        eh_max: max.into(),
        eh_depth: depth.into(),
        eh_generation: 0.into(),
    };
    node[..ENTRY_SIZE].copy_from_slice(h.as_bytes());
}

impl FsInner {
    fn ext_block_max(&self) -> u16 {
        ((self.sbi.block_size as usize - ENTRY_SIZE) / ENTRY_SIZE) as u16
    }

    fn seal_extent_block(&self, inode: &Inode, block: &mut [u8]) {
        if self.sbi.metadata_csum {
            fe::set_block_checksum(block, inode.csum_seed);
        }
    }

    /// Allocates a block for `lblk` (past every mapped block), next to the file's last block,
    /// and maps it in the extent tree of `inode`, whose record `raw` the caller holds for
    /// writing. Returns the block and how many tree blocks were allocated on the way.
    pub(crate) fn ext_append(
        &self,
        h: &Handle,
        inode: &Inode,
        raw: &mut [u8],
        lblk: u32,
    ) -> Result<(u64, u32)> {
        let ino = inode.ino;
        // Walk the rightmost path once: the root in the record, then blocks.
        let root_depth = header(&raw[I_BLOCK])?.eh_depth.get();
        let mut path: Vec<Arc<Buffer>> = Vec::new();
        let mut next = {
            let root = Node::parse(&raw[I_BLOCK]).map_err(|_| bad(inode, None, "bad root"))?;
            (root.depth() > 0 && !root.is_empty()).then(|| root.index(root.len() - 1).leaf())
        };
        while let Some(b) = next {
            if path.len() >= usize::from(root_depth) {
                return corrupt(CorruptKind::ExtentTree {
                    ino,
                    block: Some(PhysBlock(b)),
                    what: "deeper than the root says",
                });
            }
            let buf = self.bread(b, Some(ino))?;
            next = {
                let data = buf.data();
                let node = Node::parse(&data).map_err(|_| bad(inode, Some(b), "bad node"))?;
                (node.depth() > 0 && !node.is_empty()).then(|| node.index(node.len() - 1).leaf())
            };
            path.push(buf);
        }
        // The goal: right after the last extent of the rightmost leaf.
        let last_end = {
            let leaf_data = path.last().map(|b| b.data().to_vec());
            let leaf = leaf_data.as_deref().unwrap_or(&raw[I_BLOCK]);
            let node = Node::parse(leaf).map_err(|_| bad(inode, None, "bad leaf"))?;
            (node.depth() == 0 && !node.is_empty()).then(|| {
                let e = node.extent(node.len() - 1);
                e.start() + u64::from(e.len())
            })
        };
        let goal = last_end.unwrap_or_else(|| self.inode_goal(inode));
        let (pblk, _) = self.alloc_blocks(h, goal, 1, true)?;
        let mut e = Extent::new_zeroed();
        e.ee_block.set(lblk);
        e.ee_len.set(1);
        e.set_start(pblk);
        match self.ext_insert_last(h, inode, raw, &path, root_depth, e) {
            Ok(n) => Ok((pblk, n)),
            Err(e) => {
                self.free_blocks(h, pblk, 1, false)?;
                Err(e)
            }
        }
    }

    /// Puts extent `e` (past every mapped block) at the end of the tree whose rightmost path
    /// (below the root in `raw`) is `path`.
    fn ext_insert_last(
        &self,
        h: &Handle,
        inode: &Inode,
        raw: &mut [u8],
        path: &[Arc<Buffer>],
        root_depth: u16,
        e: Extent,
    ) -> Result<u32> {
        let (lblk, pblk) = (e.ee_block.get(), e.start());
        // Extend or add in the rightmost leaf if it has room.
        let added = if let Some(leaf) = path.last() {
            let mut data = h.write(leaf)?;
            let done = append_in_leaf(&mut data, &e)?;
            self.seal_extent_block(inode, &mut data);
            done
        } else {
            append_in_leaf(&mut raw[I_BLOCK], &e)?
        };
        if added {
            return Ok(0);
        }
        // The leaf is full: a new leaf holding just the new extent, hung off the lowest index
        // node with room (growing the tree by one level if none has).
        let mut allocated = 0;
        let goal = pblk.saturating_sub(1);
        let (leaf_blk, _) = self.alloc_blocks(h, goal, 1, true)?;
        allocated += 1;
        {
            let buf = self.bcache.get_fresh(leaf_blk);
            let mut data = h.write(&buf)?;
            data.fill(0);
            new_node(&mut data, self.ext_block_max(), 0);
            append_in_leaf(&mut data, &e)?;
            self.seal_extent_block(inode, &mut data);
        }
        let mut idx = ExtentIndex::new_zeroed();
        idx.ei_block.set(lblk);
        idx.set_leaf(leaf_blk);
        // Index nodes on the path, lowest first (path[..len-1]), then the root.
        for node in path.iter().rev().skip(1) {
            let mut data = h.write(node)?;
            if push_index(&mut data, &idx)? {
                self.seal_extent_block(inode, &mut data);
                return Ok(allocated);
            }
        }
        if push_index(&mut raw[I_BLOCK], &idx)? {
            return Ok(allocated);
        }
        // Every index level is full (or the root was the leaf): move the root's entries into a
        // new block one level down and make the root a single index entry over it.
        if usize::from(root_depth) + 1 > usize::from(fe::MAX_DEPTH) {
            return Err(Error::NoSpace);
        }
        if root_depth > 0 && path.len() > 1 {
            return Err(Error::NotSupported("splitting interior extent index nodes".into()));
        }
        let (moved_blk, _) = self.alloc_blocks(h, goal, 1, true)?;
        allocated += 1;
        let first_lblk = {
            let buf = self.bcache.get_fresh(moved_blk);
            let mut data = h.write(&buf)?;
            data.fill(0);
            let rh = header(&raw[I_BLOCK])?;
            new_node(&mut data, self.ext_block_max(), rh.eh_depth.get());
            let n = usize::from(rh.eh_entries.get());
            data[ENTRY_SIZE..ENTRY_SIZE * (n + 1)]
                .copy_from_slice(&raw[I_BLOCK][ENTRY_SIZE..ENTRY_SIZE * (n + 1)]);
            set_entries(&mut data, n);
            // The new leaf (or the index over it) goes into the moved node, which has room.
            let fits = if rh.eh_depth.get() == 0 {
                append_in_leaf(&mut data, &e)?
            } else {
                push_index(&mut data, &idx)?
            };
            if !fits {
                return Err(Error::InvalidInput("new extent node has no room"));
            }
            self.seal_extent_block(inode, &mut data);
            u32::from_le_bytes([data[12], data[13], data[14], data[15]])
        };
        if root_depth == 0 {
            // The leaf we allocated first is not needed: the moved leaf took the extent.
            self.free_blocks(h, leaf_blk, 1, true)?;
            allocated -= 1;
        }
        let root = &mut raw[I_BLOCK];
        root[ENTRY_SIZE..].fill(0);
        new_node(root, 4, root_depth + 1);
        let mut top = ExtentIndex::new_zeroed();
        top.ei_block.set(first_lblk);
        top.set_leaf(moved_blk);
        put(root, 0, top.as_bytes());
        set_entries(root, 1);
        Ok(allocated)
    }
}

fn bad(inode: &Inode, blk: Option<u64>, what: &'static str) -> Error {
    Error::Corrupt(crate::error::Corrupt(CorruptKind::ExtentTree {
        ino: inode.ino,
        block: blk.map(PhysBlock),
        what,
    }))
}

/// Extends the last extent of a leaf node with `e` or appends `e`; `false` if it is full.
fn append_in_leaf(node: &mut [u8], e: &Extent) -> Result<bool> {
    let h = header(node)?;
    let n = usize::from(h.eh_entries.get());
    if n > 0 {
        let at = ENTRY_SIZE * n;
        let mut last =
            Extent::read_from_bytes(&node[at..at + ENTRY_SIZE]).map_err(|_| Error::InvalidInput("extent"))?;
        let end = u64::from(last.ee_block.get()) + u64::from(last.len());
        if !last.is_unwritten()
            && end == u64::from(e.ee_block.get())
            && last.start() + u64::from(last.len()) == e.start()
            && last.ee_len.get() < INIT_MAX_LEN
        {
            last.ee_len.set(last.ee_len.get() + 1);
            node[at..at + ENTRY_SIZE].copy_from_slice(last.as_bytes());
            return Ok(true);
        }
    }
    if n >= usize::from(h.eh_max.get()) || ENTRY_SIZE * (n + 2) > node.len() {
        return Ok(false);
    }
    put(node, n, e.as_bytes());
    set_entries(node, n + 1);
    Ok(true)
}

/// Appends an index entry to an index node; `false` if it is full.
fn push_index(node: &mut [u8], idx: &ExtentIndex) -> Result<bool> {
    let h = header(node)?;
    let n = usize::from(h.eh_entries.get());
    if h.eh_depth.get() == 0 || n >= usize::from(h.eh_max.get()) || ENTRY_SIZE * (n + 2) > node.len() {
        return Ok(false);
    }
    put(node, n, idx.as_bytes());
    set_entries(node, n + 1);
    Ok(true)
}
