//! Writing file data (the write side of the kernel's `file.c`, `inode.c` and `extents.c`):
//! `write(2)`, `fallocate(2)`, `lseek(2)`'s `SEEK_DATA` / `SEEK_HOLE`.

use crate::error::{Error, Result};
use crate::fs::Fs;
use rext4_format::InodeNo;

/// `fallocate(2)` mode: keep the file size even when allocating past it.
pub const FALLOC_FL_KEEP_SIZE: u32 = 0x01;
/// `fallocate(2)` mode: deallocate the range (with `KEEP_SIZE`).
pub const FALLOC_FL_PUNCH_HOLE: u32 = 0x02;
/// `fallocate(2)` mode: remove the range and shift the rest of the file down.
pub const FALLOC_FL_COLLAPSE_RANGE: u32 = 0x08;
/// `fallocate(2)` mode: make the range read as zeros, keeping it allocated.
pub const FALLOC_FL_ZERO_RANGE: u32 = 0x10;
/// `fallocate(2)` mode: insert a hole, shifting the rest of the file up.
pub const FALLOC_FL_INSERT_RANGE: u32 = 0x20;

impl Fs {
    /// `pwrite(2)` on a regular file: writes `data` at `offset`, allocating blocks as needed,
    /// and returns the number of bytes written.
    pub fn write(&self, ino: InodeNo, offset: u64, data: &[u8]) -> Result<usize> {
        let _ = (ino, offset, data);
        Err(Error::NotSupported("file writes".into()))
    }

    /// `fallocate(2)` with the kernel's mode flags (`FALLOC_FL_*`).
    pub fn fallocate(&self, ino: InodeNo, mode: u32, offset: u64, len: u64) -> Result<()> {
        let _ = (ino, mode, offset, len);
        Err(Error::NotSupported("fallocate".into()))
    }

    /// `lseek(2)` with `SEEK_DATA`: the first offset at or after `offset` holding data.
    pub fn seek_data(&self, ino: InodeNo, offset: u64) -> Result<u64> {
        let _ = (ino, offset);
        Err(Error::NotSupported("SEEK_DATA".into()))
    }

    /// `lseek(2)` with `SEEK_HOLE`: the first offset at or after `offset` in a hole (the end
    /// of the file counts as one).
    pub fn seek_hole(&self, ino: InodeNo, offset: u64) -> Result<u64> {
        let _ = (ino, offset);
        Err(Error::NotSupported("SEEK_HOLE".into()))
    }
}
