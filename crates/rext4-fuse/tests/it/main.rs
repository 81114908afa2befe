//! The FUSE daemon's integration tests, in one binary: real mounts of images through
//! rext4-fuse (`mount`), `-o locks=engine` (`locks`), outside exercisers on such mounts (`stress`), and mounts served through io_uring (`uring`). Each test is skipped
//! with a message where FUSE mounts are not possible, and fails instead under
//! `REXT4_REQUIRE_MOUNT=1`.

// Tests build fixtures from small known values and share helpers between their modules:
// the cast and visibility lints are for the code that reads images.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, unreachable_pub)]

mod locks;
mod mount;
mod stress;
mod support;
mod uring;
