//! The engine's integration tests, in one binary so the engine and the test kit
//! (`rext4-testkit`) are linked once. One module per area; `cargo test -p rext4 --test it
//! corruption::` runs one of them.
//!
//! The oracles are `e2fsck -fn` (every image a test leaves), the kernel's ext4 driver through
//! loop mounts (skipped with a message where it cannot mount, a failure under
//! `REXT4_REQUIRE_MOUNT=1`), `debugfs` / `dumpe2fs`, and the source trees images are made from.

// Tests build fixtures from small known values and share helpers between their modules:
// the cast and visibility lints are for the code that reads images.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, unreachable_pub)]

mod atime;
mod casefold;
mod corruption;
mod corruption_write;
mod crash;
mod delalloc;
mod discard;
mod encrypt;
mod external_journal;
mod file_write;
mod flags;
mod full_disk_model;
mod htree;
mod journal;
mod kernel_written;
mod migrate;
mod mmp;
mod namespace;
mod namespace_model;
mod nbd;
mod orphan;
mod page_cache;
mod partition;
mod prealloc;
mod quota;
mod quota_limits;
mod read_variants;
mod recovery;
mod stats;
mod system_zone;
mod xattr_write;
