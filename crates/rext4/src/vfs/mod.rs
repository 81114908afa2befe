//! The VFS layer: what the kernel does above ext4 for a caller, so that programs built on the
//! library get the same answers a process gets from the kernel.
//!
//! | file | owns |
//! |---|---|
//! | `creds.rs` | [`Creds`]: ids, supplementary groups, capabilities |
//! | `permission.rs` | `generic_permission` with ACLs, `may_open`, `may_create`, `may_delete`, `inode_init_owner`, `setattr_prepare` |
//! | `open.rs` | [`OpenFile`]: an open file description holding its inode, its flags and lock identity |
//! | `user.rs` | [`UserFs`]: every namespace, attribute and xattr call with the VFS's checks |
//!
//! # Locking
//! No locks of its own but an open file's position mutex, taken around one read or write and
//! never while calling into another open file.

pub(crate) mod creds;
pub(crate) mod open;
pub(crate) mod permission;
pub(crate) mod user;

#[cfg(test)]
mod tests;
