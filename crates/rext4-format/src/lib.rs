//! On-disk structures of ext4 and jbd2, declared once for reading and writing.
//!
//! Every struct here is a byte-exact image of its on-disk form (`zerocopy`, little-endian for
//! ext4, big-endian for jbd2), with its byte offsets in comments and a compile-time size assert.
//! Fields split into `_lo`/`_hi` halves are read and written through accessors. This crate does
//! no I/O and holds no state: checksums and hashes are pure functions of bytes.
#![forbid(unsafe_code)]

pub mod casefold;
pub mod checksum;
pub mod dirent;
pub mod dx;
pub mod extent;
pub mod fast_commit;
pub mod features;
pub mod fscrypt;
pub mod group_desc;
pub mod hash;
pub mod inode;
pub mod inode_record;
pub mod jbd2;
pub mod mmp;
pub mod orphan;
pub mod quota;
pub mod split;
pub mod superblock;
pub mod types;
pub mod xattr;

pub use types::{InodeNo, PhysBlock};
