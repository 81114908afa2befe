//! `sync` and `dirsync` with ext4's meaning: the kernel sends a FUSE filesystem no fsync
//! for a directory change (nor, for `sync`, an attribute change), so the daemon commits
//! each one before its reply, as ext4 does for such a mount (`ext4_handle_sync`). Writes
//! need nothing here: on a `sync` mount the kernel fsyncs after each one.

use crate::adapter::{Adapter, R};
use rext4::InodeNo;

impl Adapter {
    /// With `sync` or `dirsync`, commits the change `r` made to directory `dir`.
    pub(crate) fn dir_synced<T>(&self, dir: InodeNo, r: R<T>) -> R<T> {
        if r.is_ok() && self.shared.opts.dir_sync() {
            self.fs().fsync(dir).map_err(|e| self.err_in("dirsync", e))?;
        }
        r
    }

    /// With `sync`, commits the attribute change `r` made to `ino` (`IS_SYNC` in
    /// `ext4_setattr`).
    pub(crate) fn synced<T>(&self, ino: InodeNo, r: R<T>) -> R<T> {
        if r.is_ok() && self.shared.opts.sync {
            self.fs().fsync(ino).map_err(|e| self.err_in("sync", e))?;
        }
        r
    }
}
