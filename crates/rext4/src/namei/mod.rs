//! Changing names (the write side of the kernel's `namei.c`): create, mkdir, mknod, tmpfile,
//! unlink, rmdir, link, symlink and rename, with the kernel's errno and order of checks. The
//! read side (lookup) is `dir::lookup`.
//!
//! | module | owns |
//! |---|---|
//! | `create` | new inodes' records, create/mkdir/mknod/tmpfile, unlink/rmdir |
//! | `link` | hard links and symlinks |
//! | `rename` | rename, `RENAME_NOREPLACE`, `RENAME_EXCHANGE`, `RENAME_WHITEOUT` |
//!
//! # Locking
//! parent `op_lock` -> child `op_lock` -> journal handle -> inode records (parent, then child)
//! -> buffers; cross-directory renames take `FsInner::rename_lock` first. Operations in
//! different directories share no lock; see docs/locking.md.

pub(crate) mod create;
pub(crate) mod link;
pub(crate) mod rename;
