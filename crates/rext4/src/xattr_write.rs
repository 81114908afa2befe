//! Setting and removing extended attributes (the write side of the kernel's `xattr.c`).

use crate::error::{Error, Result};
use crate::fs::Fs;
use rext4_format::InodeNo;

/// `setxattr(2)` flag: fail with `EEXIST` if the attribute exists.
pub const XATTR_CREATE: u32 = 1;
/// `setxattr(2)` flag: fail with `ENODATA` if the attribute does not exist.
pub const XATTR_REPLACE: u32 = 2;

impl Fs {
    /// `setxattr(2)`: sets attribute `name` (with its namespace prefix, e.g. `user.foo`) of
    /// `ino` to `value`. `flags` is 0, [`XATTR_CREATE`] or [`XATTR_REPLACE`].
    pub fn setxattr(&self, ino: InodeNo, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        let _ = (ino, name, value, flags);
        Err(Error::NotSupported("setting extended attributes".into()))
    }

    /// `removexattr(2)`.
    pub fn removexattr(&self, ino: InodeNo, name: &[u8]) -> Result<()> {
        let _ = (ino, name);
        Err(Error::NotSupported("removing extended attributes".into()))
    }
}
