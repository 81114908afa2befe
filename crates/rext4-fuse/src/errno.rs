//! Engine errors to FUSE replies, and the `errors=` policy for corruption found while mounted.
//!
//! The errno itself is the engine's ([`rext4::Error::errno`], the one place that maps errors to
//! the kernel's ext4 errno). What this module adds is what the daemon does about corruption:
//! log it once per inode/block and, under `errors=remount-ro`, refuse later changes. It never
//! stops the daemon.

use crate::options::ErrorBehavior;
use fuser::Errno;
use rext4::sync::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

/// How many distinct corruption reports are logged before the log goes quiet.
const LOG_LIMIT: usize = 100;

/// The daemon's error policy.
pub struct ErrorPolicy {
    behavior: ErrorBehavior,
    /// Set once corruption was found under `errors=remount-ro`. [atomic]
    read_only: AtomicBool,
    /// Corruption reports already logged. [own mutex; only taken on corruption]
    logged: Mutex<HashSet<String>>,
}

impl ErrorPolicy {
    pub fn new(behavior: ErrorBehavior) -> Self {
        ErrorPolicy { behavior, read_only: AtomicBool::new(false), logged: Mutex::new(HashSet::new()) }
    }

    /// Whether corruption has turned the mount read-only.
    pub fn forced_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    /// The errno to answer `e` with, after applying the policy to corruption.
    pub fn errno(&self, op: &str, e: &rext4::Error) -> Errno {
        if let rext4::Error::Corrupt(c) = e {
            self.corruption(op, &c.to_string());
        }
        Errno::from_i32(e.errno())
    }

    fn corruption(&self, op: &str, what: &str) {
        let newly_ro =
            self.behavior == ErrorBehavior::RemountRo && !self.read_only.swap(true, Ordering::AcqRel);
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
