//! Freeing all of an inode's blocks (the kernel's `ext4_truncate` to zero, as done when the
//! last link goes): data runs and tree/indirect blocks, and its extended-attribute block.
//! Partial truncation arrives with file writes.

use crate::error::{corrupt, CorruptKind, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use crate::jbd2::transaction::Handle;
use rext4_format::extent::Node;
use rext4_format::inode::{EXTENTS_FL, INLINE_DATA_FL, S_IFDIR, S_IFLNK, S_IFREG};

/// Blocks an inode owns: data runs, and metadata blocks (tree or indirect blocks).
#[derive(Default)]
pub(crate) struct Owned {
    pub data: Vec<(u64, u64)>,
    pub meta: Vec<u64>,
}

impl FsInner {
    /// Every block `inode` maps (not its xattr block).
    pub(crate) fn owned_blocks(&self, inode: &Inode) -> Result<Owned> {
        let d = inode.disk();
        let mut out = Owned::default();
        // Only regular files, directories and slow symlinks map blocks (the kernel's
        // `ext4_can_truncate`): a device node keeps its device number in `i_block`, which
        // read as a block map would name some block of the filesystem.
        let maps_blocks = match d.file_type() {
            S_IFREG | S_IFDIR => true,
            S_IFLNK => !self.is_fast_symlink(inode),
            _ => false,
        };
        if !maps_blocks || d.flags() & INLINE_DATA_FL != 0 {
            return Ok(out);
        }
        if d.flags() & EXTENTS_FL != 0 {
            // Depth-first over the tree; depth strictly decreases, so this ends.
            let mut stack: Vec<(Vec<u8>, Option<u16>)> = vec![(d.i_block_bytes().to_vec(), None)];
            while let Some((bytes, expect)) = stack.pop() {
                let bad = |what| corrupt(CorruptKind::ExtentTree { ino: inode.ino, block: None, what });
                let Ok(node) = Node::parse(&bytes) else { return bad("bad node while freeing") };
                if expect.is_some_and(|e| e != node.depth()) {
                    return bad("depth does not match parent");
                }
                for i in 0..node.len() {
                    if node.depth() == 0 {
                        let e = node.extent(i);
                        self.check_range(inode.ino, e.start(), u64::from(e.len()))?;
                        if !e.is_empty() {
                            out.data.push((e.start(), u64::from(e.len())));
                        }
                    } else {
                        let child = node.index(i).leaf();
                        let buf = self.bread_owned(inode.ino, child)?;
                        out.meta.push(child);
                        stack.push((buf.data().to_vec(), Some(node.depth() - 1)));
                    }
                }
            }
        } else {
            let ptrs = self.sbi.block_size as usize / 4;
            let word = |b: &[u8], i: usize| {
                u64::from(u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]))
            };
            let ib = d.i_block_bytes().to_vec();
            for i in 0..12 {
                let p = word(&ib, i);
                if p != 0 {
                    self.check_range(inode.ino, p, 1)?;
                    out.data.push((p, 1));
                }
            }
            // (block, levels of indirection below it)
            let mut stack: Vec<(u64, u32)> = [(word(&ib, 12), 1), (word(&ib, 13), 2), (word(&ib, 14), 3)]
                .into_iter()
                .filter(|(b, _)| *b != 0)
                .collect();
            while let Some((blk, level)) = stack.pop() {
                let buf = self.bread_owned(inode.ino, blk)?;
                out.meta.push(blk);
                let data = buf.data();
                for i in 0..ptrs {
                    let p = word(&data, i);
                    if p == 0 {
                        continue;
                    }
                    if level == 1 {
                        self.check_range(inode.ino, p, 1)?;
                        out.data.push((p, 1));
                    } else {
                        stack.push((p, level - 1));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Frees `owned` (the blocks of a file going whole, or truncated to nothing): data
    /// clusters once each, and the tree or indirect blocks. `journaled`: the data went
    /// through the journal (directories, symlinks) and is revoked as metadata is.
    pub(crate) fn free_owned(&self, h: &Handle, owned: &Owned, journaled: bool) -> Result<()> {
        self.free_all_data(h, &owned.data)?;
        if journaled {
            for &(b, n) in &owned.data {
                for x in b..b + n {
                    h.revoke(x, self.bcache.peek(x).as_ref());
                }
            }
        }
        for &b in &owned.meta {
            self.free_blocks(h, b, 1, true)?;
        }
        Ok(())
    }

    /// What freeing all of `inode` takes, read and checked before anything changes: its block
    /// map, the bitmaps of the blocks it names, its xattr block, and the EA inodes it names. A
    /// deletion that fails half way would leave the record naming free blocks or dropped
    /// references; one that fails here has changed nothing.
    pub(crate) fn deletion_checks(&self, h: &Handle, inode: &Inode) -> Result<Owned> {
        let owned = self.owned_blocks(inode)?;
        for &(b, n) in &owned.data {
            self.check_blocks_in_use(h, b, n)?;
        }
        for &b in &owned.meta {
            self.check_blocks_in_use(h, b, 1)?;
        }
        let acl = inode.with_disk(|d| d.file_acl());
        let in_block = if acl != 0 { self.xattr_block_check(inode.ino, acl)? } else { Vec::new() };
        self.ea_inodes_check(h, inode, &in_block)?;
        Ok(owned)
    }

    /// Frees every block of `inode` (`owned`, from [`FsInner::deletion_checks`]) and its xattr
    /// block (drops one reference to a shared one). The caller clears the block map and counts
    /// in the record.
    pub(crate) fn free_all_blocks(&self, h: &Handle, inode: &Inode, owned: Owned) -> Result<()> {
        let (acl, generation) = inode.with_disk(|d| (d.file_acl(), d.generation()));
        // Directory and symlink blocks went through the journal: revoke them like metadata, so
        // an old copy is never replayed over the block's next owner.
        let journaled = inode.with_disk(|d| matches!(d.file_type(), rext4_format::inode::S_IFDIR | S_IFLNK));
        self.free_owned(h, &owned, journaled)?;
        if acl != 0 {
            let owner = crate::xattr::ea_inode::EaOwner { ino: inode.ino, gen: generation };
            // The inode stops counting the block's EA-inode values in its quotas (its record,
            // freed next, takes back the rest of its charge).
            let uncharge = if self.quota.is_on() {
                let raw = inode.raw().to_vec();
                let n = self.block_ea_count(inode.ino, &raw)?;
                Some((raw, -i64::try_from(n).unwrap_or(0)))
            } else {
                None
            };
            self.xattr_release_block(h, owner, acl)?;
            if let Some((raw, n)) = uncharge {
                self.quota_add_inodes(h, inode.ino, &raw, n)?;
            }
        }
        Ok(())
    }
}
