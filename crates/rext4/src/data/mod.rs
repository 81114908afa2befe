//! File data (the kernel's `file.c`, `inode.c` write paths, `inline.c`, `symlink.c`): reads
//! through the block map, writes and their allocation, fallocate in every mode, truncation,
//! inline data, symlink targets.
//!
//! | module | owns |
//! |---|---|
//! | `read` | data reads; holes and unwritten extents as zeros |
//! | `write` | writes, truncation of the block map, SEEK_DATA/SEEK_HOLE |
//! | `delalloc` | delayed writes into dirty pages, their block reservations |
//! | `writeback` | writing dirty pages back, the flusher, `sync`'s writeback |
//! | `fallocate` | fallocate in every mode: preallocate, punch, zero, collapse, insert |
//! | `truncate` | freeing all of an inode's blocks (deletion) |
//! | `inline`, `inline_bytes`, `inline_write` | inline data: reading, the bytes' layout, changes |
//! | `symlink` | link targets (fast, slow, inline) |
//!
//! # Locking
//! inode `op_lock` -> journal handle -> inode `data_sem` (write while the map changes) ->
//! inode record -> buffers. Readers take `data_sem` shared; see docs/locking.md.

pub(crate) mod delalloc;
pub(crate) mod fallocate;
pub(crate) mod inline;
pub(crate) mod inline_bytes;
pub(crate) mod inline_write;
pub(crate) mod read;
pub(crate) mod symlink;
pub(crate) mod truncate;
pub(crate) mod write;
pub(crate) mod writeback;
