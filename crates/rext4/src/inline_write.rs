//! Changing inline directories (the write side of the kernel's `inline.c` for directories).
//!
//! An inline directory keeps its entries in `i_block` (after the parent's inode number) and in
//! the `system.data` attribute. Before its first change, its entries move into a block of
//! their own and the directory becomes an ordinary one-block directory, as the kernel does
//! once an inline directory is full (`ext4_convert_inline_data_nolock`); every change then
//! goes through the block code. New directories are created in blocks.

use crate::dir_write::put_entry;
use crate::dx_write::NamesMoving;
use crate::error::{corrupt, CorruptKind, Result};
use crate::fs::FsInner;
use crate::inline::I_BLOCK_SIZE;
use crate::inode::Inode;
use crate::inode_write::raw_flags;
use crate::jbd2::transaction::Handle;
use rext4_format::dirent::{self as fd, DirBlockIter};
use rext4_format::inode::{EXTENTS_FL, INLINE_DATA_FL};
use rext4_format::InodeNo;

/// Entry-area offset of the first entry after the parent's inode number.
const FIRST_ENTRY: usize = 4;

impl FsInner {
    /// Turns record `raw` of inode `ino` from inline into an empty block-mapped one: no
    /// `system.data` attribute, no inline flag, and an empty extent root (or block map) in
    /// `i_block`, ready for blocks to be mapped (files and directories alike).
    pub(crate) fn clear_inline_record(&self, ino: InodeNo, raw: &mut [u8]) -> Result<()> {
        self.ibody_remove(ino, raw, rext4_format::xattr::INDEX_SYSTEM, b"data")?;
        let extents = self.sbi.sb.incompat().contains(rext4_format::features::Incompat::EXTENTS);
        let flags = (raw_flags(raw) & !INLINE_DATA_FL) | if extents { EXTENTS_FL } else { 0 };
        raw[0x20..0x24].copy_from_slice(&flags.to_le_bytes());
        raw[crate::extents_write::I_BLOCK].fill(0);
        if extents {
            crate::extents_write::init_root(raw);
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
        let _d = self.stats.write(crate::stats::LockClass::DataSem, &dir.data_sem);
        let mut raw = dir.raw_mut();
        self.clear_inline_record(dir.ino, &mut raw)?;
        let pblk = self.append_block(h, dir, &mut raw, 0)?;
        let buf = self.bcache.get_fresh(pblk);
        h.write(&buf)?.copy_from_slice(&block);
        self.mark_inode_dirty(h, dir, &mut raw)
    }
}
