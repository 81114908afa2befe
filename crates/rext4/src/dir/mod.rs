//! Directories (the kernel's `dir.c`, `namei.c` lookup side): leaf and index blocks, readdir
//! (linear and in hash order), name lookup, adding and removing entries, htree splits.
//!
//! | module | owns |
//! |---|---|
//! | this file | reading and checking directory blocks, linear readdir |
//! | `lookup` | name lookup: linear, inline, htree probe with fallback |
//! | `dx_readdir` | hash-order readdir of htree directories |
//! | `write` | adding and removing entries, room in leaves |
//! | `dx_write` | htree inserts, leaf and index splits |
//! | `casefold` | how casefolded directories compare and hash names |
//!
//! # Locking
//! The directory's `op_lock` serialises its changes; readers take none and read blocks under
//! their buffers' data locks.
//!
//! ## This module
//! Directory blocks and `readdir` (the read side of the kernel's `dir.c`): reading and checking
//! leaf and index blocks, linear iteration with byte-position cookies, inline directories
//! (hash-order iteration is in dir/dx_readdir.rs).

pub(crate) mod casefold;
pub(crate) mod dx_readdir;
pub(crate) mod dx_write;
pub(crate) mod lookup;
pub(crate) mod write;

use crate::attr::{DirEntry, FileType};
use crate::cache::buffer::{Buffer, Verified};
use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use crate::map::Mapping;
use rext4_format::dirent::{self as fd, DirBlockIter, RawEntry};
use rext4_format::dx;
use rext4_format::inode::{ENCRYPT_FL, INDEX_FL};
use rext4_format::{InodeNo, PhysBlock};
use std::sync::Arc;

/// The directory-entry file type for an inode mode.
pub(crate) fn dirent_type(mode: u16) -> u8 {
    use rext4_format::dirent as fd;
    use rext4_format::inode as fi;
    match mode & fi::S_IFMT {
        fi::S_IFREG => fd::FT_REG_FILE,
        fi::S_IFDIR => fd::FT_DIR,
        fi::S_IFLNK => fd::FT_SYMLINK,
        fi::S_IFCHR => fd::FT_CHRDEV,
        fi::S_IFBLK => fd::FT_BLKDEV,
        fi::S_IFIFO => fd::FT_FIFO,
        fi::S_IFSOCK => fd::FT_SOCK,
        _ => fd::FT_UNKNOWN,
    }
}

/// How a directory block is to be read.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(in crate::dir) enum DirBlockKind {
    /// A leaf holding entries (checked: entries and tail checksum).
    Leaf,
    /// An htree index block (checked: dx tail checksum).
    Index,
}

/// Inline directories: readdir positions of `.` and `..`, and where entries start.
const INLINE_DOT: u64 = 0;
const INLINE_DOTDOT: u64 = 1;
const INLINE_FIRST: u64 = INLINE_FIRST_OFF as u64;
/// The offset of the first entry in the inline data: after the parent's inode number.
const INLINE_FIRST_OFF: usize = 4;

impl FsInner {
    /// Maps a directory block, shared with a growing directory's tree edits (`data_sem`), so
    /// a lookup never walks a half-split extent tree.
    pub(in crate::dir) fn dir_map(&self, dir: &Inode, lblk: u32) -> Result<crate::map::Mapping> {
        let _d = dir.data_sem.read();
        self.map_block(dir, lblk)
    }

    /// Whether `dir` uses an htree index.
    pub(in crate::dir) fn is_dx(&self, dir: &Inode) -> bool {
        self.sbi.dir_index && dir.flags() & INDEX_FL != 0
    }

    /// Reads logical block `lblk` of directory `dir` and checks it as `kind`; `None` for a
    /// hole.
    pub(in crate::dir) fn dir_block(
        &self,
        dir: &Inode,
        lblk: u32,
        kind: DirBlockKind,
    ) -> Result<Option<(u64, Arc<Buffer>)>> {
        let pblk = match self.dir_map(dir, lblk)? {
            Mapping::Mapped { pblk, unwritten: false, .. } => pblk,
            _ => return Ok(None),
        };
        let buf = self.bread(pblk, Some(dir.ino))?;
        match kind {
            DirBlockKind::Leaf => buf.verify(Verified::DirLeaf, |d| self.check_leaf(dir, pblk, d))?,
            DirBlockKind::Index => buf.verify(Verified::DxBlock, |d| self.check_dx(dir, pblk, d))?,
        }
        Ok(Some((pblk, buf)))
    }

    /// The part of a leaf block that holds entries (without the checksum tail).
    pub(in crate::dir) fn leaf_entries<'a>(&self, block: &'a [u8]) -> &'a [u8] {
        if self.sbi.metadata_csum && fd::tail(block).is_some() {
            &block[..block.len() - fd::TAIL_SIZE]
        } else {
            block
        }
    }

    fn check_leaf(&self, dir: &Inode, pblk: u64, data: &[u8]) -> Result<()> {
        let ino = dir.ino;
        if self.sbi.metadata_csum && fd::verify_leaf_checksum(data, dir.csum_seed) != Some(true) {
            return corrupt(CorruptKind::DirChecksum { ino, block: PhysBlock(pblk) });
        }
        self.check_entries(ino, Some(pblk), self.leaf_entries(data), self.sbi.block_size)
    }

    /// Checks every entry of an area (a leaf block, or an inline directory area).
    pub(in crate::dir) fn check_entries(
        &self,
        ino: InodeNo,
        pblk: Option<u64>,
        area: &[u8],
        bs: u32,
    ) -> Result<()> {
        let block = pblk.map(PhysBlock);
        for e in DirBlockIter::new(area, bs) {
            let what = match e {
                Err(fd::DirentError::RecLenTooSmall) => "rec_len is smaller than minimal",
                Err(fd::DirentError::RecLenUnaligned) => "rec_len % 4 != 0",
                Err(fd::DirentError::NameTooLong) => "rec_len is too small for name_len",
                Err(fd::DirentError::PastEnd) => "directory entry overrun",
                Ok(e) if e.inode > self.sbi.inodes_count => "inode out of bounds",
                Ok(_) => continue,
            };
            return corrupt(CorruptKind::DirEntry { ino, block, what });
        }
        Ok(())
    }

    fn check_dx(&self, dir: &Inode, pblk: u64, data: &[u8]) -> Result<()> {
        if self.sbi.metadata_csum && !dx::verify_checksum(data, dir.csum_seed) {
            return corrupt(CorruptKind::DxChecksum { ino: dir.ino, block: PhysBlock(pblk) });
        }
        Ok(())
    }

    /// Whether logical block `lblk` of an indexed directory is an index block (judged, like
    /// the kernel, by its disguise as an empty entry spanning the block).
    fn is_index_block(&self, dir: &Inode, lblk: u32, data: &[u8]) -> bool {
        if !self.is_dx(dir) {
            return false;
        }
        if lblk == 0 {
            return true;
        }
        let ino = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        let rec_len = fd::rec_len_from_disk(u16::from_le_bytes([data[4], data[5]]), self.sbi.block_size);
        ino == 0 && rec_len == self.sbi.block_size
    }

    /// `readdir`: calls `f` for each entry from position `pos` until it returns false.
    /// Indexed and one-block directories use hash positions (dir/dx_readdir.rs), others byte
    /// positions.
    /// Names are as stored (ciphertext in an encrypted directory: [`FsInner::readdir_shown`]
    /// shows them).
    pub(crate) fn readdir(&self, dir: &Inode, pos: u64, mut f: impl FnMut(DirEntry) -> bool) -> Result<()> {
        self.readdir_at(dir, pos, |e, _| f(e))
    }

    /// `readdir` as a caller sees it: in an encrypted directory, names decrypted or shown as
    /// no-key names (crypto/fname.rs).
    pub(crate) fn readdir_shown(
        &self,
        dir: &Inode,
        pos: u64,
        mut f: impl FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        if dir.flags() & ENCRYPT_FL == 0 || !dir.is_dir() {
            return self.readdir(dir, pos, f);
        }
        let crypt = self.inode_crypt(dir)?;
        let mut failed = None;
        self.readdir_at(dir, pos, |mut e, at| {
            // An entry's dirhash is its position's (`hash2pos` keeps all but the major's low
            // bit, which ext4's hashes never set); none outside hash order.
            let (major, minor) = at.map_or((0, 0), |p| {
                (rext4_format::split::lo32((p >> 32) << 1), rext4_format::split::lo32(p))
            });
            match self.present_name(&crypt, major, minor, &e.name) {
                Ok(n) => {
                    e.name = n;
                    f(e)
                }
                Err(x) => {
                    failed = Some(x);
                    false
                }
            }
        })?;
        failed.map_or(Ok(()), Err)
    }

    /// `readdir` whose callback also gets each entry's own hash position, where the listing
    /// is in hash order.
    fn readdir_at(
        &self,
        dir: &Inode,
        pos: u64,
        mut f: impl FnMut(DirEntry, Option<u64>) -> bool,
    ) -> Result<()> {
        if !dir.is_dir() {
            return Err(Error::NotDir);
        }
        if self.has_inline_data(dir) {
            // Taken whole, while its entries are not moving into a block (data/inline_write.rs).
            match self.names_stable(dir, || self.inline_dir(dir)) {
                Ok((parent, data)) => return self.readdir_inline(dir, parent, &data, pos, |e| f(e, None)),
                // Moved meanwhile: go on in the block, with the same position, as the
                // kernel's readdir does after a conversion.
                Err(_) if !self.has_inline_data(dir) => {}
                Err(e) => return Err(e),
            }
        }
        if self.hash_order_readdir(dir) {
            return self.dx_readdir(dir, pos, f);
        }
        self.readdir_linear(dir, pos, f)
    }

    /// `readdir` in block order, with byte positions; `f` also gets, in a directory whose
    /// entries carry their hashes, the hash position of each entry's stored hash (which a
    /// no-key name shows).
    pub(in crate::dir) fn readdir_linear(
        &self,
        dir: &Inode,
        pos: u64,
        mut f: impl FnMut(DirEntry, Option<u64>) -> bool,
    ) -> Result<()> {
        let stored = self.hash_in_dirent(dir);
        let bs = u64::from(self.sbi.block_size);
        let size = dir.size();
        let mut pos = pos;
        while pos < size {
            let Ok(lblk) = u32::try_from(pos / bs) else {
                break;
            };
            let start = pos % bs;
            let block_start = u64::from(lblk) * bs;
            pos = block_start + bs;
            // Skip holes whole: a corrupt size must not mean billions of empty iterations.
            if let Mapping::Hole { len } = self.dir_map(dir, lblk)? {
                pos = block_start.saturating_add(len.saturating_mul(bs));
                continue;
            }
            let Some((kind, buf)) = self.dir_block_any(dir, lblk)? else {
                continue;
            };
            // Copy the block's entries out so no buffer lock is held while `f` runs.
            let entries: Vec<(DirEntry, Option<u64>)> = {
                let data = buf.data();
                let area = match kind {
                    // Of an index root only `.` and `..` are entries; interior nodes have none.
                    DirBlockKind::Index if lblk == 0 => &data[..],
                    DirBlockKind::Index => continue,
                    DirBlockKind::Leaf => self.leaf_entries(&data),
                };
                let mut v = Vec::new();
                for e in DirBlockIter::new(area, self.sbi.block_size) {
                    let e = e.map_err(|_| {
                        let what = "bad entry in index root";
                        Error::Corrupt(crate::error::Corrupt(CorruptKind::DirEntry {
                            ino: dir.ino,
                            block: None,
                            what,
                        }))
                    })?;
                    if (e.offset as u64) < start || e.inode == 0 {
                        continue;
                    }
                    let next = block_start + e.offset as u64 + u64::from(e.rec_len);
                    let at = (stored && e.name != b"." && e.name != b"..")
                        .then(|| fd::stored_hash(area, e.offset, e.name.len()))
                        .flatten()
                        .map(|(major, minor)| dx_readdir::hash_pos(major, minor));
                    v.push((self.dir_entry(&e, next), at));
                }
                v
            };
            for (e, at) in entries {
                if !f(e, at) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// The first block at or after `lblk` (and before `end`) that holds data, skipping holes
    /// a run at a time.
    pub(in crate::dir) fn next_dir_block(&self, dir: &Inode, mut lblk: u64, end: u64) -> Result<Option<u32>> {
        while lblk < end {
            let Ok(l) = u32::try_from(lblk) else { return Ok(None) };
            match self.dir_map(dir, l)? {
                Mapping::Mapped { unwritten: false, .. } => return Ok(Some(l)),
                Mapping::Mapped { len, .. } | Mapping::Hole { len } => lblk = lblk.saturating_add(len.max(1)),
            }
        }
        Ok(None)
    }

    /// Reads block `lblk` of a directory, tells an index block from a leaf, and checks it as
    /// what it is; `None` for a hole.
    pub(in crate::dir) fn dir_block_any(
        &self,
        dir: &Inode,
        lblk: u32,
    ) -> Result<Option<(DirBlockKind, Arc<Buffer>)>> {
        let pblk = match self.dir_map(dir, lblk)? {
            Mapping::Mapped { pblk, unwritten: false, .. } => pblk,
            _ => return Ok(None),
        };
        let buf = self.bread(pblk, Some(dir.ino))?;
        let kind = if self.is_index_block(dir, lblk, &buf.data()) {
            DirBlockKind::Index
        } else {
            DirBlockKind::Leaf
        };
        match kind {
            DirBlockKind::Leaf => buf.verify(Verified::DirLeaf, |d| self.check_leaf(dir, pblk, d))?,
            DirBlockKind::Index => buf.verify(Verified::DxBlock, |d| self.check_dx(dir, pblk, d))?,
        }
        Ok(Some((kind, buf)))
    }

    pub(in crate::dir) fn dir_entry(&self, e: &RawEntry<'_>, next: u64) -> DirEntry {
        let kind = if self.sbi.filetype { FileType::from_dirent(e.file_type) } else { None };
        DirEntry { ino: InodeNo(e.inode), name: e.name.to_vec(), kind, next }
    }

    /// The parent and entry area of an inline directory.
    pub(crate) fn inline_dir(&self, dir: &Inode) -> Result<(InodeNo, Vec<u8>)> {
        let data = self.inline_bytes(dir)?;
        let size = usize::try_from(dir.size()).unwrap_or(usize::MAX);
        let ino = dir.ino;
        if size < INLINE_FIRST_OFF || size > data.len() {
            return corrupt(CorruptKind::InlineData {
                ino,
                what: "directory size does not match inline data",
            });
        }
        let parent = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        if parent == 0 || parent > self.sbi.inodes_count {
            return corrupt(CorruptKind::InlineData { ino, what: "bad parent inode" });
        }
        // The i_block part and the xattr part are separate entry areas; checking both keeps
        // an entry from straddling them.
        let ib = crate::data::inline::I_BLOCK_SIZE;
        self.check_entries(ino, None, &data[INLINE_FIRST_OFF..ib.min(size)], self.sbi.block_size)?;
        if size > ib {
            self.check_entries(ino, None, &data[ib..size], self.sbi.block_size)?;
        }
        Ok((InodeNo(parent), data[..size].to_vec()))
    }

    fn readdir_inline(
        &self,
        dir: &Inode,
        parent: InodeNo,
        data: &[u8],
        pos: u64,
        mut f: impl FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        let kind = self.sbi.filetype.then_some(FileType::Directory);
        if pos == INLINE_DOT && !f(DirEntry { ino: dir.ino, name: b".".to_vec(), kind, next: INLINE_DOTDOT })
        {
            return Ok(());
        }
        if pos <= INLINE_DOTDOT
            && !f(DirEntry { ino: parent, name: b"..".to_vec(), kind, next: INLINE_FIRST })
        {
            return Ok(());
        }
        let ib = crate::data::inline::I_BLOCK_SIZE;
        for (base, area) in [
            (INLINE_FIRST_OFF, &data[INLINE_FIRST_OFF..ib.min(data.len())]),
            (ib, data.get(ib..).unwrap_or(&[])),
        ] {
            for e in DirBlockIter::new(area, self.sbi.block_size).flatten() {
                let at = (base + e.offset) as u64;
                if at < pos || e.inode == 0 {
                    continue;
                }
                if !f(self.dir_entry(&e, at + u64::from(e.rec_len))) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}
