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
//! shaped like `std::fs` ([`Fs::metadata`], [`Fs::read_dir`], [`Fs::open_file`],
//! [`Fs::open_options`], [`Fs::write_file`], [`Fs::create_dir_all`], [`Fs::remove_dir_all`],
//! ...). The inode-level calls make no permission checks; the path-level ones that change
//! anything or open a file make the kernel's, as root on [`Fs`] and as the caller on a
//! [`UserFs`] ([`Fs::as_user`]).
//!
//! ```no_run
//! use std::io::Write;
//! let fs = rext4::Fs::open_rw("disk.img")?;
//! fs.create_dir_all("/srv/www")?;
//! fs.write_file("/srv/www/index.html", b"<p>hello</p>\n")?;
//! let mut log = fs.open_options().append(true).create(true).open("/srv/www/log")?;
//! log.write_all(b"started\n")?;
//! let alice = fs.as_user(rext4::Creds::user(1000, 1000, &[]));
//! assert!(alice.remove_dir_all("/srv").is_err()); // EACCES: root's directory
//! drop(log);
//! fs.unmount()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Locking
//! There is no filesystem-wide lock on any operation. The full lock order is in
//! `docs/locking.md`; in short, from outermost to innermost:
//! inode cache shard -> (released) -> inode record lock -> buffer cache shard -> (released) ->
//! buffer data lock. Cache shard locks are never held across I/O or while taking another lock.
#![forbid(unsafe_code)]

mod alloc;
mod attr;
mod cache;
pub mod clock;
pub mod crypto;
mod data;
pub mod dev;
mod dir;
mod error;
mod fs;
mod inode;
mod jbd2;
mod locks;
mod map;
mod mkfs;
mod namei;
mod num;
mod path;
mod quota;
pub mod sync;
#[cfg(test)]
mod test_image;
mod vfs;
mod xattr;

pub use alloc::reserved::{may_use as may_use_reserved_blocks, with_reserved_blocks};
pub use attr::{Attr, DirEntry, FileType, StatFs, Timestamp};
pub use crypto::{EncryptionKey, KeyStatus};
pub use data::fallocate::{
    FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE,
    FALLOC_FL_ZERO_RANGE,
};
pub use data::read::HostRange;
pub use error::{Corrupt, Error, Result};
pub use fs::stats::{LockStat, OpStat, StatsReport};
pub use fs::{ErrorBehavior, Fs, Options, PageCacheStats, WritebackStats};
pub use inode::atime::AtimeMode;
pub use inode::flags::{FL_USER_MODIFIABLE, FL_USER_VISIBLE};
pub use inode::write::{SetAttr, TimeSet};
pub use jbd2::recovery::RecoveryReport;
pub use jbd2::replay::{recover_image, recover_image_with};
pub use jbd2::{CommitStats, CommitSummary};
pub use locks::{Cancel, FileLock, FlockOp, LockOwner, LockType, Wait};
pub use mkfs::{FormatOptions, FormatReport, FsType, JournalDeviceRef, SizeIn};
pub use namei::rename::{RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT};
pub use path::file::{File, OpenOptions};
pub use path::ops::{bad_name, Leftover, Unremovable};
pub use path::ReadDir;
pub use quota::limits::{with_quota_limits_ignored, QuotaEnforcement};
pub use quota::report::{QuotaEntry, QuotaLimits, QuotaReport, QuotaType};
pub use rext4_format as format;
pub use rext4_format::{InodeNo, PhysBlock};
pub use vfs::creds::{Caps, Creds};
pub use vfs::open::{OpenFile, OpenFlags};
pub use vfs::permission::{init_owner, Access};
pub use vfs::user::UserFs;
pub use xattr::acl::InheritedAcl;
pub use xattr::set::{XATTR_CREATE, XATTR_REPLACE};
