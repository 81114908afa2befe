//! `-o io_uring`: the mount served through FUSE-over-io_uring queues where the kernel offers
//! them (the fuse module's `enable_uring`, set here for the mount and put back after), and
//! through /dev/fuse reads where it does not. The same checks as the other mounts: file data,
//! names, xattrs, a lock wait answered from another thread, fsx; then `e2fsck -fn` and the
//! kernel's view.

use crate::stress::{run_fsx, tool_or_skip};
use crate::support::*;
use rext4_testkit::*;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Serializes the tests that set `enable_uring`: the kernel reads it once per connection, at
/// `FUSE_INIT`, which `FuseMount::new` completes. Other tests' mounts do not ask for io_uring.
static PARAM_LOCK: Mutex<()> = Mutex::new(());

/// Mounts `img` with `opts` while `enable_uring` is `on`; `None` (with a message) where the
/// kernel has no FUSE over io_uring or the setting cannot be changed.
fn mount_with_uring(img: &Path, opts: &str, on: bool) -> Option<FuseMount> {
    let _g = PARAM_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let Ok(old) = fs::read_to_string(PARAM) else {
        eprintln!("SKIP: this kernel has no FUSE over io_uring ({PARAM})");
        return None;
    };
    let want = if on { "Y" } else { "N" };
    if let Err(e) = fs::write(PARAM, want) {
        eprintln!("SKIP: cannot set {PARAM}: {e}");
        return None;
    }
    let m = FuseMount::try_new(img, opts);
    fs::write(PARAM, old.trim()).expect("restore enable_uring");
    Some(m.unwrap_or_else(|e| panic!("mount -o {opts}: {e}")))
}

/// Files of many sizes (the largest writes the kernel sends), names, renames, links, xattrs
/// (a name in the request's payload, a value in the reply's), a directory listing, and a flock
/// wait answered from another thread, all through io_uring; then the image is clean and the
/// kernel sees the same tree.
#[test]
fn io_uring_serves_the_mount() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("256M").build_in(dir.path(), "uring.img");
    let Some(m) = mount_with_uring(&img, "rw,io_uring,locks=engine", true) else { return };
    let p = |s: &str| m.join(s);
    let mut rng = Rng::new(31);
    for (i, size) in [0usize, 1, 4095, 4097, 65536, 1 << 20, (4 << 20) + 5].into_iter().enumerate() {
        let data = rng.bytes(size);
        fs::write(p(&format!("f{i}")), &data).unwrap();
        assert_eq!(fs::read(p(&format!("f{i}"))).unwrap(), data, "f{i} ({size} bytes)");
    }
    let f = OpenOptions::new().read(true).write(true).open(p("f5")).unwrap();
    f.write_all_at(&[0x5A; 9000], 4000).unwrap();
    let mut back = vec![0u8; 9000];
    f.read_exact_at(&mut back, 4000).unwrap();
    assert!(back.iter().all(|&b| b == 0x5A));
    f.sync_all().unwrap();
    drop(f);
    fs::create_dir_all(p("d/e")).unwrap();
    for i in 0..200 {
        fs::write(p(&format!("d/n{i:03}")), format!("{i}")).unwrap();
    }
    for i in (0..200).step_by(3) {
        fs::rename(p(&format!("d/n{i:03}")), p(&format!("d/e/r{i:03}"))).unwrap();
    }
    fs::hard_link(p("f2"), p("d/link")).unwrap();
    std::os::unix::fs::symlink("../f1", p("d/sym")).unwrap();
    assert_eq!(fs::read_dir(p("d")).unwrap().count(), 200 - 67 + 3);
    xattr::set(p("f1"), "user.k", &rng.bytes(700)).unwrap();
    assert_eq!(xattr::get(p("f1"), "user.k").unwrap().map(|v| v.len()), Some(700));
    assert!(xattr::list(p("f1")).unwrap().any(|n| n == "user.k"));

    // A blocked flock is answered by a thread of its own after the holder lets go.
    use nix::fcntl::{Flock, FlockArg};
    let holder = Flock::lock(File::open(p("f0")).unwrap(), FlockArg::LockExclusive).unwrap();
    let path = p("f0");
    let waiter = std::thread::spawn(move || {
        let f = File::open(path).unwrap();
        Flock::lock(f, FlockArg::LockExclusive).map(drop).map_err(|(_, e)| e.to_string())
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!waiter.is_finished(), "the second flock did not wait");
    // Other requests keep being served while one waits.
    assert_eq!(fs::read(p("f1")).unwrap().len(), 1);
    drop(holder.unlock().unwrap());
    waiter.join().unwrap().expect("the waiting flock");

    let (served, queues) = m.uring_served();
    assert!(served > 500, "only {served} requests came through io_uring");
    assert!(queues >= 1);
    unmount_and_compare(m, &img);
}

/// fsx through io_uring, with and without the kernel's writeback cache.
#[test]
fn io_uring_fsx_finds_no_miscompare() {
    require_fuse!();
    let Some(fsx) = tool_or_skip("fsx") else { return };
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("512M").build_in(dir.path(), "fsx.img");
    for (opts, seed) in [("rw,io_uring", 31u64), ("rw,io_uring,writeback_cache", 32)] {
        let Some(m) = mount_with_uring(&img, opts, true) else { return };
        run_fsx(&fsx, m.path(), dir.path(), seed, 20_000);
        let (served, _) = m.uring_served();
        assert!(served > 1000, "{opts}: only {served} requests came through io_uring");
        m.unmount();
        e2fsck_clean(&img);
    }
}

/// Where the kernel offers io_uring a mount takes it without being asked; `noio_uring` keeps
/// to /dev/fuse.
#[test]
fn io_uring_is_the_default_where_offered() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").build_in(dir.path(), "default.img");
    for (opts, uring) in [("rw", true), ("rw,noio_uring", false)] {
        let Some(m) = mount_with_uring(&img, opts, true) else { return };
        for i in 0..50 {
            fs::write(m.join(&format!("f{i}-{uring}")), [7u8; 100]).unwrap();
        }
        let (served, _) = m.uring_served();
        assert_eq!(served > 100, uring, "-o {opts}: {served} requests through io_uring");
        m.unmount();
        e2fsck_clean(&img);
    }
}

/// With `enable_uring` off the kernel does not offer io_uring: the mount asks for it, reads
/// /dev/fuse instead, and works.
#[test]
fn io_uring_falls_back_to_dev_fuse() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").build_in(dir.path(), "fallback.img");
    let Some(m) = mount_with_uring(&img, "rw,io_uring", false) else { return };
    let data = Rng::new(7).bytes(300_000);
    fs::write(m.join("a"), &data).unwrap();
    fs::create_dir(m.join("d")).unwrap();
    fs::rename(m.join("a"), m.join("d/b")).unwrap();
    assert_eq!(fs::read(m.join("d/b")).unwrap(), data);
    assert_eq!(m.uring_served(), (0, 0));
    unmount_and_compare(m, &img);
}
