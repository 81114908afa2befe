//! The time the filesystem stamps: the wall clock, or one fixed instant a caller pins with
//! [`set_fixed_time`] (reproducible builds: an image edited twice the same way comes out byte
//! for byte the same; the `rext4` command pins `SOURCE_DATE_EPOCH`). The library reads no
//! environment variable: a program embedding it decides.
//!
//! Under a fixed time, inode generation numbers follow a fixed sequence too.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A time set by [`set_fixed_time`]; `i64::MIN` for none.
static FIXED: AtomicI64 = AtomicI64::new(i64::MIN);

/// Pins every timestamp this process's filesystems write to `t` seconds since the epoch
/// (`None`: back to the wall clock).
pub fn set_fixed_time(t: Option<i64>) {
    FIXED.store(t.unwrap_or(i64::MIN), Ordering::Relaxed);
}

/// The fixed time in force, if any.
pub fn fixed_time() -> Option<i64> {
    let t = FIXED.load(Ordering::Relaxed);
    (t != i64::MIN).then_some(t)
}

/// Now, as (seconds, nanoseconds): the fixed time with no nanoseconds, else the clock.
pub(crate) fn now() -> (i64, u32) {
    if let Some(t) = fixed_time() {
        return (t, 0);
    }
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    (i64::try_from(d.as_secs()).unwrap_or(i64::MAX), d.subsec_nanos())
}

/// Now from the kernel's coarse clock (`CLOCK_REALTIME_COARSE`, moved once a scheduler tick):
/// the time the kernel stamps files with where it keeps their times itself (`current_time`
/// on a filesystem without fine-grained timestamps, such as a FUSE mount's writeback cache).
/// The fixed time wins here too.
pub(crate) fn coarse_now() -> (i64, u32) {
    if let Some(t) = fixed_time() {
        return (t, 0);
    }
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME_COARSE) {
        Ok(ts) => (ts.tv_sec(), u32::try_from(ts.tv_nsec()).unwrap_or(0)),
        Err(_) => now(),
    }
}
