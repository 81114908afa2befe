//! Engine errors to FUSE replies, and the `errors=` policy for corruption found while mounted.
//!
//! The errno itself is the engine's ([`rext4::Error::errno`], the one place that maps errors to
//! the kernel's ext4 errno), and so is the policy: the engine records corruption in the
//! superblock and, under `errors=remount-ro` (which `MountOptions::engine_options` passes on),
//! refuses later changes, which the adapter sees as `Fs::is_writable` turning false. What this
//! module adds is the daemon's log: each corruption once per inode/block, and the switch to
//! read-only. It never stops the daemon.

use crate::options::ErrorBehavior;
use fuser::Errno;
use rext4::sync::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

/// How many distinct corruption reports are logged before the log goes quiet.
const LOG_LIMIT: usize = 100;

/// The daemon's error policy.
pub(crate) struct ErrorPolicy {
    behavior: ErrorBehavior,
    /// Set once the switch to read-only was logged. [atomic]
    ro_logged: AtomicBool,
    /// Corruption reports already logged. [own mutex; only taken on corruption]
    logged: Mutex<HashSet<String>>,
}

impl ErrorPolicy {
    pub(crate) fn new(behavior: ErrorBehavior) -> Self {
        ErrorPolicy { behavior, ro_logged: AtomicBool::new(false), logged: Mutex::new(HashSet::new()) }
    }

    /// The errno to answer `e` with, after applying the policy to corruption.
    pub(crate) fn errno(&self, op: &str, e: &rext4::Error) -> Errno {
        if let rext4::Error::Corrupt(c) = e {
            self.corruption(op, &c.to_string());
        }
        Errno::from_i32(e.errno())
    }

    fn corruption(&self, op: &str, what: &str) {
        let newly_ro =
            self.behavior == ErrorBehavior::RemountRo && !self.ro_logged.swap(true, Ordering::AcqRel);
        let mut logged = self.logged.lock();
        if logged.len() < LOG_LIMIT && logged.insert(what.to_string()) {
            crate::log(&format!("{op}: filesystem corrupt: {what}"));
        }
        drop(logged);
        if newly_ro {
            crate::log("errors=remount-ro: refusing further changes (the mount is now read-only)");
        }
    }
}
