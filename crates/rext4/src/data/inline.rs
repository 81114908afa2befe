//! Inline data (`inline_data` feature): small files and directories stored in `i_block` and
//! the `system.data` attribute instead of in blocks (the read side of the kernel's `inline.c`).

use crate::error::{corrupt, CorruptKind, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use rext4_format::inode::INLINE_DATA_FL;

/// Bytes of inline data that live in `i_block`.
pub(crate) const I_BLOCK_SIZE: usize = 60;

impl FsInner {
    /// Whether `inode` keeps its data inline.
    pub(crate) fn has_inline_data(&self, inode: &Inode) -> bool {
        inode.flags() & INLINE_DATA_FL != 0
    }

    /// All inline bytes: the 60 bytes of `i_block` followed by the `system.data` value.
    pub(crate) fn inline_bytes(&self, inode: &Inode) -> Result<Vec<u8>> {
        if !self.sbi.inline_data {
            return corrupt(CorruptKind::InlineData {
                ino: inode.ino,
                what: "inline data flag without the inline_data feature",
            });
        }
        // Both parts under one read of the record: an inline directory's names change in
        // either part under its write lock (data/inline_write.rs).
        let raw = inode.raw();
        let mut v = raw[crate::map::extents_write::I_BLOCK].to_vec();
        if let Some(extra) = self.system_data_in(inode.ino, &raw)? {
            v.extend_from_slice(&extra);
        }
        Ok(v)
    }

    /// Reads inline file content at `offset`.
    pub(super) fn read_inline(&self, inode: &Inode, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let size = inode.size();
        let data = self.inline_bytes(inode)?;
        if offset >= size {
            return Ok(0);
        }
        // Bytes past the inline data up to i_size read as zeros, as in the kernel (a file
        // extended by truncate keeps its data inline).
        let n = usize::try_from(size - offset).map_or(buf.len(), |left| buf.len().min(left));
        let off = usize::try_from(offset).unwrap_or(usize::MAX);
        let have = data.len().saturating_sub(off).min(n);
        if have > 0 {
            buf[..have].copy_from_slice(&data[off..off + have]);
        }
        buf[have..n].fill(0);
        Ok(n)
    }
}
