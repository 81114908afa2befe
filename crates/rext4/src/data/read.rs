//! Reading file data (the read side of the kernel's `file.c` / `readpage`): through the block
//! map straight from the device, holes and unwritten extents as zeros.

use crate::error::{Error, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use crate::map::Mapping;
use rext4_format::inode::{ENCRYPT_FL, S_IFDIR, S_IFLNK, S_IFREG};

impl FsInner {
    /// `read(2)` on a regular file.
    pub(crate) fn read(&self, inode: &Inode, offset: u64, buf: &mut [u8]) -> Result<usize> {
        match inode.disk().file_type() {
            S_IFREG => {}
            S_IFDIR => return Err(Error::IsDir),
            _ => return Err(Error::InvalidInput("not a regular file")),
        }
        if inode.flags() & ENCRYPT_FL != 0 {
            return Err(Error::NoKey);
        }
        // Writers change the map under this lock exclusively (and fill new blocks first).
        let _d = inode.data_sem.read();
        self.read_data(inode, offset, buf)
    }

    /// Reads the data of any block- or extent-mapped or inline inode, up to its size.
    pub(crate) fn read_data(&self, inode: &Inode, offset: u64, buf: &mut [u8]) -> Result<usize> {
        if self.has_inline_data(inode) {
            return self.read_inline(inode, offset, buf);
        }
        let size = inode.size();
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let total = buf.len().min(usize::try_from(size - offset).unwrap_or(usize::MAX));
        let bs = u64::from(self.sbi.block_size);
        let mut done = 0usize;
        while done < total {
            let pos = offset + done as u64;
            let Ok(lblk) = u32::try_from(pos / bs) else {
                // Past the last addressable block: nothing is stored there.
                buf[done..total].fill(0);
                break;
            };
            let in_block = pos % bs;
            let (len, pblk) = match self.map_block(inode, lblk)? {
                Mapping::Hole { len } => (len, None),
                Mapping::Mapped { len, unwritten: true, .. } => (len, None),
                Mapping::Mapped { pblk, len, unwritten: false } => (len, Some(pblk)),
            };
            let avail = len.saturating_mul(bs) - in_block;
            let n = (total - done).min(usize::try_from(avail).unwrap_or(usize::MAX));
            let dst = &mut buf[done..done + n];
            match pblk {
                None => dst.fill(0),
                Some(p) => self.dev.read_at(dst, p * bs + in_block)?,
            }
            done += n;
        }
        Ok(total)
    }

    /// Whether `inode` is a symlink whose target is stored in `i_block`.
    pub(super) fn is_fast_symlink(&self, inode: &Inode) -> bool {
        let d = inode.disk();
        if d.file_type() != S_IFLNK || self.has_inline_data(inode) {
            return false;
        }
        if d.flags() & rext4_format::inode::EA_INODE_FL != 0 {
            return d.size() > 0 && d.size() < 60;
        }
        let ea_blocks = if d.file_acl() != 0 { u64::from(self.sbi.block_size / 512) } else { 0 };
        d.blocks_512(self.sbi.huge_file, self.sbi.block_size).saturating_sub(ea_blocks) == 0
    }
}
