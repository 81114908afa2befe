//! rext4: ext4 in userspace. A thread-safe, memory-safe engine over an image file or block
//! device, on-disk compatible with the Linux kernel and e2fsprogs.
//!
//! ```no_run
//! let fs = rext4::Fs::open("disk.img")?;
//! for entry in fs.read_dir("/etc")? {
//!     let entry = entry?;
//!     println!("{}", String::from_utf8_lossy(&entry.name));
//! }
//! let passwd = fs.read_file("/etc/passwd")?;
//! # Ok::<(), rext4::Error>(())
//! ```
//!
//! Two APIs sit over one [`Fs`]: an inode-level one ([`Fs::lookup`], [`Fs::getattr`],
//! [`Fs::readdir`], [`Fs::read`], ...) for FUSE and other VFS-like callers, and a path-level one
//! shaped like `std::fs` ([`Fs::metadata`], [`Fs::read_dir`], [`Fs::open_file`], ...).
//!
//! # Locking
//! There is no filesystem-wide lock on any operation. The full lock order is in
//! `docs/locking.md`; in short, from outermost to innermost:
//! inode cache shard -> (released) -> inode record lock -> buffer cache shard -> (released) ->
//! buffer data lock. Cache shard locks are never held across I/O or while taking another lock.
#![forbid(unsafe_code)]

mod acl;
#[cfg(test)]
mod alloc_tests;
mod attr;
mod balloc;
mod bitmap;
mod buffer;
mod cache;
mod counter;
mod dcache;
pub mod dev;
mod dev_crash;
mod dev_overlay;
mod dir;
mod dir_write;
mod dx_readdir;
mod dx_write;
mod error;
mod extents;
mod extents_write;
mod file;
mod file_write;
mod fs;
mod fs_error;
mod group;
mod ialloc;
mod image_lock;
mod indirect;
mod indirect_write;
mod inline;
mod inline_bytes;
mod inline_write;
mod inode;
mod inode_write;
mod ioctl;
mod jbd2;
mod link_write;
mod map;
mod mbcache;
mod mount;
mod namei;
mod namei_write;
mod orphan;
mod path;
mod rename;
mod replay;
mod stats;
mod super_block;
mod symlink;
pub mod sync;
#[cfg(test)]
mod test_image;
mod truncate;
mod xattr;
mod xattr_area;
mod xattr_inode;
mod xattr_write;

pub use attr::{Attr, DirEntry, FileType, StatFs, Timestamp};
pub use error::{Corrupt, Error, Result};
pub use file_write::{
    FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE,
    FALLOC_FL_ZERO_RANGE,
};
pub use fs::{ErrorBehavior, Fs, Options};
pub use inode_write::{SetAttr, TimeSet};
pub use ioctl::{FL_USER_MODIFIABLE, FL_USER_VISIBLE};
pub use jbd2::recovery::RecoveryReport;
pub use jbd2::{CommitStats, CommitSummary};
pub use path::{File, ReadDir};
pub use rename::{RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT};
pub use replay::recover_image;
pub use rext4_format as format;
pub use rext4_format::{InodeNo, PhysBlock};
pub use stats::{LockStat, OpStat, StatsReport};
pub use xattr_write::{XATTR_CREATE, XATTR_REPLACE};
