//! Allocation (the kernel's `ialloc.c` and `balloc.c`, `mballoc.c` in spirit): the group
//! descriptors with their live counts, bitmaps, inode allocation (Orlov placement, search
//! without the group lock, test-and-set under it) and block allocation (per-group bitmap
//! locks, busy extents until commit), and the sharded free counters (docs/design.md,
//! Allocation).
//!
//! | module | owns |
//! |---|---|
//! | `group` | the descriptor table, `ext4_check_descriptors`, per-group atomics |
//! | `bitmap` | bit operations on bitmap blocks |
//! | `ialloc` | inode allocation and freeing (`__ext4_new_inode`, `ext4_free_inode`) |
//! | `balloc` | block allocation and freeing, BLOCK_UNINIT groups, busy extents |
//! | `counter` | sharded counters for the filesystem-wide free counts |
//! | `prealloc` | per-inode reserves of blocks for files that grow by appends |
//! | `reserved` | who may allocate the root-reserved blocks |
//! | `trim` | `FITRIM`: discarding the free blocks of a range (`ext4_trim_fs`) |
//!
//! # Locking
//! journal handle -> a group's bitmap `Buffer::data` (write: the group's allocation lock) ->
//! group state atomics. Different groups share no lock; see docs/locking.md.

pub(crate) mod balloc;
pub(crate) mod bitmap;
pub(crate) mod counter;
pub(crate) mod group;
pub(crate) mod ialloc;
pub(crate) mod prealloc;
pub(crate) mod reserved;
#[cfg(test)]
// Fixtures are built from small known values; a narrowing cast there is the clearest form.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
mod tests;
pub(crate) mod trim;
