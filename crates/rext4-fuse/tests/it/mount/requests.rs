//! What the kernel sends the daemon per operation, counted with the kernel's own
//! `fuse:fuse_request_send` tracepoint (a tracefs instance of the test's own, filtered to
//! the mount's connection): the round trips the init flags are there to save.

use super::*;
use std::collections::BTreeMap;

/// A tracefs instance recording the FUSE requests sent on one connection.
struct RequestTrace {
    dir: std::path::PathBuf,
}

impl RequestTrace {
    /// Starts recording the requests of the mount at `mnt`; `None` without tracefs or the
    /// tracepoint (kernels before 6.16).
    fn start(mnt: &std::path::Path) -> Option<RequestTrace> {
        let base = std::path::Path::new("/sys/kernel/tracing/instances");
        if !base.join("../events/fuse/fuse_request_send").exists() {
            return None;
        }
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = base.join(format!("rext4-it-{}-{n}", std::process::id()));
        fs::create_dir(&dir).ok()?;
        let t = RequestTrace { dir };
        let ev = t.dir.join("events/fuse/fuse_request_send");
        // The connection is the mount's device number (minor only: FUSE's are anonymous).
        let dev = fs::metadata(mnt).ok()?.dev();
        fs::write(ev.join("filter"), format!("connection == {dev}")).ok()?;
        fs::write(ev.join("enable"), "1").ok()?;
        Some(t)
    }

    /// Stops and returns how many requests of each opcode were sent.
    fn stop(self) -> BTreeMap<String, usize> {
        // Requests sent in the background (a release) land just after the call returns.
        std::thread::sleep(std::time::Duration::from_millis(200));
        fs::write(self.dir.join("tracing_on"), "0").unwrap();
        let text = fs::read_to_string(self.dir.join("trace")).unwrap();
        let mut counts = BTreeMap::new();
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            if let Some(op) = l.split_whitespace().find(|w| w.starts_with("(FUSE_")) {
                *counts.entry(op.trim_matches(|c| c == '(' || c == ')').to_string()).or_default() += 1;
            }
        }
        counts
    }
}

impl Drop for RequestTrace {
    fn drop(&mut self) {
        let _ = fs::write(self.dir.join("events/fuse/fuse_request_send/enable"), "0");
        let _ = fs::remove_dir(&self.dir);
    }
}

fn count(c: &BTreeMap<String, usize>, op: &str) -> usize {
    c.get(op).copied().unwrap_or(0)
}

/// A new file written in four `write(2)` calls costs one `GETXATTR` of
/// `security.capability` (`FUSE_HANDLE_KILLPRIV_V2`: the kernel then knows the file has
/// none until its attributes change), not one per write; listing and walking directories
/// sends no `OPENDIR` or `RELEASEDIR` (`FUSE_NO_OPENDIR_SUPPORT`), and a second listing of an
/// unchanged directory is the kernel's cached one.
#[test]
fn round_trips_per_create_and_listing() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").build_in(dir.path(), "requests.img");
    let m = FuseMount::new(&img, "rw");
    fs::create_dir(m.join("d")).unwrap();
    for i in 0..3 {
        fs::write(m.join(&format!("d/old{i}")), b"x").unwrap();
    }
    // The connection's first OPENDIR is the one answered ENOSYS.
    assert_eq!(fs::read_dir(m.path()).unwrap().count(), 2);
    let Some(t) = RequestTrace::start(m.path()) else {
        eprintln!("SKIP: no fuse:fuse_request_send tracepoint in tracefs");
        unmount_and_compare(m, &img);
        return;
    };
    let mut f = OpenOptions::new().write(true).create_new(true).open(m.join("d/new")).unwrap();
    for _ in 0..4 {
        f.write_all(&[7u8; 4096]).unwrap();
    }
    drop(f);
    let c = t.stop();
    assert_eq!(count(&c, "FUSE_WRITE"), 4, "{c:?}");
    assert_eq!(count(&c, "FUSE_GETXATTR"), 1, "one capability check for four writes: {c:?}");
    assert_eq!(count(&c, "FUSE_CREATE"), 1, "{c:?}");

    let t = RequestTrace::start(m.path()).unwrap();
    for _ in 0..2 {
        let names: Vec<_> = fs::read_dir(m.join("d")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 4);
    }
    let c = t.stop();
    assert_eq!(count(&c, "FUSE_OPENDIR") + count(&c, "FUSE_RELEASEDIR"), 0, "{c:?}");
    assert!(count(&c, "FUSE_READDIRPLUS") + count(&c, "FUSE_READDIR") <= 2, "one listing asked: {c:?}");
    unmount_and_compare(m, &img);
}
