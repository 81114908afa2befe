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
        let mut v = inode.disk().i_block_bytes().to_vec();
        if let Some(extra) = self.system_data(inode)? {
            v.extend_from_slice(&extra);
        }
        Ok(v)
    }

    /// Reads inline file content at `offset`.
    pub(crate) fn read_inline(&self, inode: &Inode, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let size = inode.size();
        let data = self.inline_bytes(inode)?;
        if size > data.len() as u64 {
            return corrupt(CorruptKind::InlineData { ino: inode.ino, what: "size exceeds inline data" });
        }
        if offset >= size {
            return Ok(0);
        }
        let n = buf.len().min((size - offset) as usize);
        let off = offset as usize;
        buf[..n].copy_from_slice(&data[off..off + n]);
        Ok(n)
    }
}
