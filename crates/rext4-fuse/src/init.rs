//! What the daemon asks of the kernel when the connection starts.

use crate::adapter::MAX_IO;
use crate::options::LockMode;
use fuser::{InitFlags, KernelConfig};
use std::time::Duration;

/// The connection's settings, asked of the kernel at `init` (memfs.rs asks the same).
pub(crate) fn negotiate(config: &mut KernelConfig, writeback_cache: bool, io_uring: Option<bool>) {
    let mut want = InitFlags::FUSE_ASYNC_READ
        | InitFlags::FUSE_BIG_WRITES
        | InitFlags::FUSE_PARALLEL_DIROPS
        | InitFlags::FUSE_DO_READDIRPLUS
        | InitFlags::FUSE_READDIRPLUS_AUTO
        | InitFlags::FUSE_CACHE_SYMLINKS
        | InitFlags::FUSE_MAX_PAGES;
    if writeback_cache {
        want |= InitFlags::FUSE_WRITEBACK_CACHE;
    }
    if io_uring != Some(false) {
        // Offered only where the kernel has it and the fuse module's `enable_uring` is set.
        want |= InitFlags::FUSE_OVER_IO_URING;
        if io_uring == Some(true) && !config.capabilities().contains(InitFlags::FUSE_OVER_IO_URING) {
            crate::log("io_uring: not offered by the kernel (enable_uring off?), reading /dev/fuse");
        }
    }
    // Each flag the kernel lacks is simply not used.
    let _ = config.add_capabilities(want & config.capabilities());
    if writeback_cache && !config.capabilities().contains(InitFlags::FUSE_WRITEBACK_CACHE) {
        crate::log("writeback_cache: not supported by this kernel, writing through");
    }
    let _ = config.set_max_write(MAX_IO);
    let _ = config.set_max_readahead(MAX_IO).or_else(|max| config.set_max_readahead(max));
    let _ = config.set_max_background(64);
    let _ = config.set_time_granularity(Duration::from_nanos(1));
}

/// Whether directories are to be opened without a request: where the kernel can
/// (`FUSE_NO_OPENDIR_SUPPORT`), the first `OPENDIR` is answered `ENOSYS` and the kernel sends
/// no more, nor any `RELEASEDIR`, and treats every open directory as opened with
/// `FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR`, which is what the daemon answers anyway: a listing
/// takes no handle here (readdir.rs reads by offset). Not with `locks=engine`, where a
/// directory's `flock` locks go at its last close, which only `RELEASEDIR` reports.
pub(crate) fn zero_message_opendir(config: &KernelConfig, locks: LockMode) -> bool {
    locks == LockMode::Kernel && config.capabilities().contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT)
}
