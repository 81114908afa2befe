//! The `rext4` command's tests, in one binary: each module runs the built command
//! (`CARGO_BIN_EXE_rext4`) on images made here and checks them with `e2fsck -fn`. The
//! conformance run (`tests/conformance.rs`) and the benchmarks (`tests/bench.rs`) are binaries
//! of their own, which run alone.

// Tests build fixtures from small known values and share helpers between their modules:
// the cast and visibility lints are for the code that reads images.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, unreachable_pub)]

mod cli;
mod encrypt;
mod first_steps;
mod hostile;
mod image_lock;
mod journal_dev;
mod mkfs;
mod mkfs_fit;
mod mkfs_from;
mod mount;
mod nbd;
mod quota;
mod readme;
