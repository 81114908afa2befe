//! The FUSE daemon's integration tests, in one binary: real mounts of images through
//! rext4-fuse (`mount`), `-o locks=engine` (`locks`), and outside exercisers on such mounts (`stress`). Each test is skipped
//! with a message where FUSE mounts are not possible, and fails instead under
//! `REXT4_REQUIRE_MOUNT=1`.

mod locks;
mod mount;
mod stress;
mod support;
