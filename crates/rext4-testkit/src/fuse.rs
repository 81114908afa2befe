//! Whether FUSE mounts work here, and [`require_fuse!`](crate::require_fuse).

use crate::kernel::mounts_required;
use crate::tools::is_root;
use std::sync::OnceLock;

/// Why this process cannot make FUSE mounts (not root, no usable `/dev/fuse`), or None when it
/// can. Probed once. With `REXT4_REQUIRE_MOUNT=1` a failed probe panics.
pub fn why_no_fuse() -> Option<&'static str> {
    static CAN: OnceLock<Result<(), String>> = OnceLock::new();
    let r = CAN.get_or_init(|| {
        if !is_root() {
            return Err("not running as root".into());
        }
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .map(drop)
            .map_err(|e| format!("/dev/fuse: {e}"))
    });
    match r {
        Ok(()) => None,
        Err(why) if mounts_required() => {
            panic!("REXT4_REQUIRE_MOUNT=1 but FUSE mounts are not possible here: {why}")
        }
        Err(why) => Some(why),
    }
}

/// Whether this process can make FUSE mounts; says so when it cannot. Panics under
/// `REXT4_REQUIRE_MOUNT=1` where it cannot.
pub fn fuse_available() -> bool {
    match why_no_fuse() {
        None => true,
        Some(why) => {
            eprintln!("SKIP: cannot mount through FUSE here ({why})");
            false
        }
    }
}

/// Returns from the calling test when FUSE mounts are not possible here, printing why; panics
/// instead under `REXT4_REQUIRE_MOUNT=1`. `require_fuse!(value)` returns `value`.
#[macro_export]
macro_rules! require_fuse {
    () => {
        $crate::require_fuse!(())
    };
    ($ret:expr) => {
        $crate::skip_unless!($crate::why_no_fuse(), "cannot mount through FUSE here", $ret)
    };
}
