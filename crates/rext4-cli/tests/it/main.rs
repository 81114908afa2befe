//! The `rext4` command's tests, in one binary: each module runs the built command
//! (`CARGO_BIN_EXE_rext4`) on images made here and checks them with `e2fsck -fn`. The
//! conformance run (`tests/conformance.rs`) and the benchmarks (`tests/bench.rs`) are binaries
//! of their own, which run alone.

mod cli;
mod first_steps;
mod hostile;
mod image_lock;
mod mount;
mod readme;
