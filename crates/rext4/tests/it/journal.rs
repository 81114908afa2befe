//! The journal's write path: handles, commits, checkpoints, clean close; judged by e2fsck and
//! by the kernel mounting what rext4 wrote.

use rext4::{Fs, Options, SetAttr, TimeSet, Timestamp};
use rext4_testkit::{e2fsck_clean as fsck_clean, require_kernel, HookedDevice, Image, KernelMount};
use std::path::{Path, PathBuf};
use std::process::Command;

fn mkfs(dir: &Path, name: &str, args: &[&str], files: usize) -> PathBuf {
    let src = dir.join(format!("{name}-src"));
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..files {
        std::fs::write(src.join(format!("f{i}")), format!("file {i}\n")).unwrap();
    }
    let img = dir.join(format!("{name}.img"));
    Image::ext4("32M").args(args).from_dir(&src).build(&img);
    img
}

/// Writable, with the given commit interval.
fn rw_options(commit_interval: std::time::Duration) -> Options {
    Options { writable: true, commit_interval, ..Options::default() }
}

/// Opens `img` for writing with the given commit interval.
/// Opens `img` for writing (commits only when asked) on its file through a device that
/// `hooks` set up.
fn hooked(
    img: &Path,
    hooks: impl FnOnce(HookedDevice<rext4::dev::FileDevice>) -> HookedDevice<rext4::dev::FileDevice>,
) -> Fs {
    let file = std::sync::Arc::new(rext4::dev::FileDevice::open(img, true).unwrap());
    let dev = std::sync::Arc::new(hooks(HookedDevice::new(file)));
    Fs::from_device(dev, rw_options(std::time::Duration::from_secs(3600))).unwrap()
}

fn open_rw(img: &Path, commit_interval: std::time::Duration) -> Fs {
    Fs::open_with(img, rw_options(commit_interval)).unwrap()
}

fn chmod_all(fs: &Fs, n: usize, base: u16) {
    for i in 0..n {
        let ino = fs.resolve(format!("/f{i}"), false).unwrap();
        let t = Timestamp { sec: 1_700_000_000 + i as i64, nsec: 123_456_789 };
        let ch = SetAttr {
            mode: Some(base + (i as u16 % 8)),
            uid: Some(1000 + i as u32),
            gid: Some(2000),
            mtime: Some(TimeSet::At(t)),
            atime: None,
            size: None,
            // Every other change keeps the clock's change time.
            ctime: (i % 2 == 0).then_some(Timestamp { sec: t.sec + 100_000, nsec: 7 }),
        };
        let before =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        let a = fs.setattr(ino, &ch).unwrap();
        assert_eq!(a.perm(), base + (i as u16 % 8));
        assert_eq!(a.uid, 1000 + i as u32);
        assert_eq!(a.mtime, t);
        match ch.ctime {
            Some(c) => assert_eq!(a.ctime, c),
            None => assert!(a.ctime.sec >= before),
        }
    }
}

fn check_all(fs: &Fs, n: usize, base: u16) {
    for i in 0..n {
        let a = fs.metadata(format!("/f{i}")).unwrap();
        assert_eq!(a.perm(), base + (i as u16 % 8), "f{i}");
        assert_eq!((a.uid, a.gid), (1000 + i as u32, 2000), "f{i}");
        assert_eq!(a.mtime, Timestamp { sec: 1_700_000_000 + i as i64, nsec: 123_456_789 }, "f{i}");
        if i % 2 == 0 {
            assert_eq!(a.ctime, Timestamp { sec: 1_700_100_000 + i as i64, nsec: 7 }, "f{i}");
        }
    }
}

#[test]
fn setattr_commits_and_closes_clean() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [
        ("default", &[][..]),
        ("upstream", &["-O", "metadata_csum_seed,orphan_file"][..]),
        ("nocsum", &["-O", "^metadata_csum"][..]),
        ("nojournal", &["-O", "^has_journal"][..]),
        ("ext3", &["-t", "ext3"][..]),
    ] {
        let img = mkfs(dir.path(), name, args, 200);
        {
            let fs = Fs::open_rw(&img).unwrap();
            chmod_all(&fs, 200, 0o600);
            fs.unmount().unwrap();
        }
        fsck_clean(&img);
        let fs = Fs::open(&img).unwrap();
        check_all(&fs, 200, 0o600);
    }
}

#[test]
fn fsync_is_durable_without_unmount() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "fsync", &[], 50);
    let fs = open_rw(&img, std::time::Duration::from_secs(3600));
    chmod_all(&fs, 50, 0o640);
    let ino = fs.resolve("/f49", false).unwrap();
    fs.fsync(ino).unwrap();
    let stats = fs.commit_stats().unwrap();
    assert!(stats.commits >= 1, "{stats:?}");
    // The image as it is now (as after a crash) holds a committed journal; e2fsck replays it.
    let copy = dir.path().join("crash.img");
    std::fs::copy(&img, &copy).unwrap();
    let out = Command::new("e2fsck").args(["-fy"]).arg(&copy).output().unwrap();
    assert!(out.status.code().unwrap_or(8) < 4, "{}", String::from_utf8_lossy(&out.stdout));
    fsck_clean(&copy);
    let crashed = Fs::open(&copy).unwrap();
    check_all(&crashed, 50, 0o640);
    fs.unmount().unwrap();
    fsck_clean(&img);
}

#[test]
fn many_threads_many_commits() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "threads", &[], 400);
    let fs = open_rw(&img, std::time::Duration::from_millis(20));
    std::thread::scope(|s| {
        for t in 0..8 {
            let fs = fs.clone();
            s.spawn(move || {
                for round in 0..20 {
                    for i in (t..400).step_by(8) {
                        let ino = fs.resolve(format!("/f{i}"), false).unwrap();
                        let m = 0o400 + ((i + round) % 64) as u16;
                        fs.setattr(ino, &SetAttr { mode: Some(m), ..SetAttr::default() }).unwrap();
                        if i % 50 == 0 {
                            fs.fsync(ino).unwrap();
                        }
                    }
                }
            });
        }
    });
    let stats = fs.commit_stats().unwrap();
    assert!(stats.commits > 1, "{stats:?}");
    fs.unmount().unwrap();
    fsck_clean(&img);
    let fs = Fs::open(&img).unwrap();
    for i in 0..400 {
        assert_eq!(fs.metadata(format!("/f{i}")).unwrap().perm(), 0o400 + ((i + 19) % 64) as u16);
    }
}

/// A commit that panics in an fsync caller's thread aborts the journal: later fsyncs and
/// changes fail at once instead of waiting for a commit that never ends, and the image the
/// abort leaves is recovered clean with everything committed before it.
#[test]
fn panicking_commit_aborts_instead_of_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "panic", &[], 64);
    // Writes panic once armed: a bug inside a commit.
    let armed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fs = hooked(&img, |d| {
        let armed = armed.clone();
        d.on_write(move |_, _| {
            if armed.load(std::sync::atomic::Ordering::Relaxed) {
                panic!("write while armed");
            }
        })
    });
    let ino = fs.resolve("/f0", false).unwrap();
    fs.setattr(ino, &SetAttr { mode: Some(0o640), ..SetAttr::default() }).unwrap();
    fs.fsync(ino).unwrap();
    fs.setattr(ino, &SetAttr { mode: Some(0o600), ..SetAttr::default() }).unwrap();
    armed.store(true, std::sync::atomic::Ordering::Relaxed);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fs.fsync(ino)));
    assert!(caught.is_err(), "the commit's write panics");
    armed.store(false, std::sync::atomic::Ordering::Relaxed);
    // Before the fix these waited forever for the commit flag the panic left set.
    let (tx, rx) = std::sync::mpsc::channel();
    let fs2 = fs.clone();
    std::thread::spawn(move || {
        let fsync = fs2.fsync(ino);
        let change = fs2.setattr(ino, &SetAttr { mode: Some(0o604), ..SetAttr::default() });
        let _ = tx.send((fsync.map_err(|e| e.errno()), change.map_err(|e| e.errno())));
    });
    let (fsync, change) =
        rx.recv_timeout(std::time::Duration::from_secs(20)).expect("fsync and setattr return");
    assert_eq!(fsync, Err(libc::EIO));
    assert_eq!(change.map(|_| ()), Err(libc::EROFS));
    drop(fs);
    // The log holds everything up to the last good commit: rext4's and e2fsck's recoveries
    // both give the fsynced mode, and e2fsck finds the result clean.
    assert_eq!(Fs::open(&img).unwrap().metadata("/f0").unwrap().perm(), 0o640);
    let out = Command::new("e2fsck").args(["-fy"]).arg(&img).output().unwrap();
    assert!(out.status.code().unwrap_or(8) < 4, "{}", String::from_utf8_lossy(&out.stdout));
    fsck_clean(&img);
    assert_eq!(Fs::open(&img).unwrap().metadata("/f0").unwrap().perm(), 0o640);
}

/// With no commit under way, fsync commits in the calling thread (no hand-off to the commit
/// thread and back); fsyncs racing each other and a metadata load share commits, all return,
/// and everything they covered is on disk.
#[test]
fn fsync_commits_in_the_calling_thread() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "caller", &[], 64);
    // Which threads flushed the device.
    let flushers = std::sync::Arc::new(std::sync::Mutex::new(Vec::<std::thread::ThreadId>::new()));
    let fs = hooked(&img, |d| {
        let flushers = flushers.clone();
        d.on_flush(move || flushers.lock().unwrap().push(std::thread::current().id()))
    });
    let ino = fs.resolve("/f0", false).unwrap();
    fs.setattr(ino, &SetAttr { mode: Some(0o604), ..SetAttr::default() }).unwrap();
    flushers.lock().unwrap().clear();
    let before = fs.commit_stats().unwrap().commits;
    fs.fsync(ino).unwrap();
    assert_eq!(fs.commit_stats().unwrap().commits, before + 1);
    let me = std::thread::current().id();
    let flushers = flushers.lock().unwrap().clone();
    // The commit flushes before and after its commit block.
    assert!(flushers.len() >= 2 && flushers.iter().all(|&t| t == me), "{flushers:?}");

    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..2u16 {
            let (fs, stop) = (fs.clone(), &stop);
            s.spawn(move || {
                let mut n = 0u16;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for i in (32 + t as usize..64).step_by(2) {
                        n = n.wrapping_add(1);
                        let ino = fs.resolve(format!("/f{i}"), false).unwrap();
                        fs.setattr(ino, &SetAttr { mode: Some(0o400 + n % 64), ..SetAttr::default() })
                            .unwrap();
                    }
                }
            });
        }
        let syncers: Vec<_> = (1..9u16)
            .map(|i| {
                let fs = fs.clone();
                s.spawn(move || {
                    let ino = fs.resolve(format!("/f{i}"), false).unwrap();
                    for round in 0..100u16 {
                        let m = 0o600 + (round + i) % 64;
                        fs.setattr(ino, &SetAttr { mode: Some(m), ..SetAttr::default() }).unwrap();
                        fs.fsync(ino).unwrap();
                    }
                })
            })
            .collect();
        for h in syncers {
            h.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let commits = fs.commit_stats().unwrap().commits - before;
    assert!((2..=801).contains(&commits), "{commits} commits for 800 fsyncs");
    // As after a crash now: the fsynced modes are in the journal.
    let copy = dir.path().join("crash.img");
    std::fs::copy(&img, &copy).unwrap();
    let crashed = Fs::open(&copy).unwrap();
    for i in 1..9u16 {
        assert_eq!(crashed.metadata(format!("/f{i}")).unwrap().perm(), 0o600 + (99 + i) % 64, "f{i}");
    }
    drop(crashed);
    fs.unmount().unwrap();
    fsck_clean(&img);
}

#[test]
fn read_only_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "ro", &[], 1);
    let fs = Fs::open(&img).unwrap();
    let ino = fs.resolve("/f0", false).unwrap();
    let e = fs.setattr(ino, &SetAttr { mode: Some(0o777), ..SetAttr::default() }).unwrap_err();
    assert_eq!(e.errno(), 30); // EROFS
}

/// The kernel replays a journal rext4 left behind (the image copied after an fsync, as after a
/// crash) and sees the fsync'ed attributes.
#[test]
fn kernel_replays_our_journal() {
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [
        ("k-default", &[][..]),
        ("k-upstream", &["-O", "metadata_csum_seed,orphan_file"][..]),
        ("k-nocsum", &["-O", "^metadata_csum,^64bit"][..]),
    ] {
        let img = mkfs(dir.path(), name, args, 60);
        let fs = open_rw(&img, std::time::Duration::from_secs(3600));
        chmod_all(&fs, 60, 0o700);
        fs.fsync(fs.resolve("/f59", false).unwrap()).unwrap();
        let copy = dir.path().join(format!("{name}-crash.img"));
        std::fs::copy(&img, &copy).unwrap();
        fs.unmount().unwrap();
        fsck_clean(&img);
        let k = match KernelMount::rw(&copy) {
            Ok(k) => k,
            Err(e) => {
                eprintln!("skipping: {e}");
                return;
            }
        };
        let mnt = k.path();
        let mut seen = Vec::new();
        for i in 0..60 {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::symlink_metadata(mnt.join(format!("f{i}"))).unwrap();
            seen.push((m.mode() & 0o7777, m.uid(), m.mtime(), m.mtime_nsec()));
        }
        k.unmount().unwrap();
        for (i, s) in seen.into_iter().enumerate() {
            assert_eq!(
                s,
                (0o700 + (i as u32 % 8), 1000 + i as u32, 1_700_000_000 + i as i64, 123_456_789),
                "{name} f{i}"
            );
        }
        fsck_clean(&copy);
    }
}

/// An operation that panics with its journal handle open (a bug) aborts the journal instead
/// of letting half of it commit: later changes get EROFS, reads go on, and the image keeps
/// what the last commit left, clean.
#[test]
fn operation_panicking_mid_handle_aborts() {
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "opanic", &["-O", "ea_inode"], 4);
    // Writes from the armed thread panic: the value blocks of an EA inode are written while
    // setxattr holds its handle.
    let armed: Arc<Mutex<Option<std::thread::ThreadId>>> = Arc::new(Mutex::new(None));
    let fs = hooked(&img, |d| {
        let armed = armed.clone();
        d.on_write(move |_, _| {
            if *armed.lock().unwrap() == Some(std::thread::current().id()) {
                panic!("write while armed");
            }
        })
    });
    let f = fs.resolve("/f0", false).unwrap();
    fs.setxattr(f, b"user.small", b"kept", 0).unwrap();
    fs.sync().unwrap();
    *armed.lock().unwrap() = Some(std::thread::current().id());
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        fs.setxattr(f, b"user.big", &vec![7u8; 20_000], 0)
    }));
    *armed.lock().unwrap() = None;
    assert!(caught.is_err(), "the value write panics");
    let e = fs.create(fs.root(), b"after", 0o644, 0, 0).unwrap_err();
    assert_eq!(e.errno(), libc::EROFS);
    assert_eq!(fs.getxattr(f, b"user.small").unwrap(), b"kept");
    drop(fs);
    let out = Command::new("e2fsck").args(["-fy"]).arg(&img).output().unwrap();
    assert!(out.status.code().unwrap_or(8) < 4, "{}", String::from_utf8_lossy(&out.stdout));
    fsck_clean(&img);
    let fs = Fs::open(&img).unwrap();
    let f = fs.resolve("/f0", false).unwrap();
    assert_eq!(fs.listxattr(f).unwrap(), vec![b"user.small".to_vec()]);
    assert!(fs.resolve("/after", false).is_err());
}

/// The journal file's bytes (`debugfs dump <8>`).
fn journal_bytes(img: &Path, dir: &Path) -> Vec<u8> {
    let out = dir.join("journal.bin");
    let o = Command::new("debugfs")
        .arg("-R")
        .arg(format!("dump <8> {}", out.display()))
        .arg(img)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::read(&out).unwrap()
}

/// On a journal with the fast-commit feature (as the kernel leaves it when it crashes with
/// fast commits on), the log wraps before the fast-commit area: many commits later the area
/// is as it was, and the kernel, whose recovery stops where the area begins, replays a crash.
#[test]
fn log_wraps_before_the_fast_commit_area() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "fc", &["-b", "4096", "-O", "fast_commit", "-J", "size=4"], 200);
    // The journal superblock: big-endian fields, incompat at 0x28, s_num_fc_blks at 0x54;
    // it lies in the journal's first block, which mkfs puts in one extent.
    let before = journal_bytes(&img, dir.path());
    let at = {
        let o = Command::new("debugfs").args(["-R", "bmap <8> 0"]).arg(&img).output().unwrap();
        String::from_utf8_lossy(&o.stdout).trim().parse::<u64>().unwrap() * 4096
    };
    let be32 = |b: &[u8], o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
    let (maxlen, fc) = (be32(&before, 0x10) as usize, be32(&before, 0x54) as usize);
    assert!(fc > 0 && maxlen == before.len() / 4096, "maxlen {maxlen}, fast-commit blocks {fc}");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        let incompat = be32(&before, 0x28) | 0x20; // JBD2_FEATURE_INCOMPAT_FAST_COMMIT
        f.write_all_at(&incompat.to_be_bytes(), at + 0x28).unwrap();
    }
    let area = (maxlen - fc) * 4096..maxlen * 4096;

    let fs = open_rw(&img, std::time::Duration::from_secs(3600));
    // Each round logs the 200 inodes' table blocks; 200 rounds go round the log a few times.
    for round in 0..200u16 {
        chmod_all(&fs, 200, 0o400 + round % 2 * 0o200);
        fs.fsync(fs.resolve("/f0", false).unwrap()).unwrap();
    }
    let stats = fs.commit_stats().unwrap();
    assert!(stats.blocks > 2 * maxlen as u64, "the log wrapped: {stats:?}");
    let crash = dir.path().join("fc-crash.img");
    std::fs::copy(&img, &crash).unwrap();
    fs.unmount().unwrap();
    fsck_clean(&img);
    let after = journal_bytes(&img, dir.path());
    assert!(after[area.clone()] == before[area.clone()], "the fast-commit area was written");

    require_kernel!();
    let k = match KernelMount::rw(&crash) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("skipping: {e}");
            return;
        }
    };
    let mnt = k.path();
    let modes: Vec<u32> = (0..200)
        .map(|i| {
            use std::os::unix::fs::MetadataExt;
            std::fs::symlink_metadata(mnt.join(format!("f{i}"))).unwrap().mode() & 0o7777
        })
        .collect();
    k.unmount().unwrap();
    for (i, m) in modes.into_iter().enumerate() {
        assert_eq!(m, 0o600 + (i as u32 % 8), "f{i} as the kernel replayed it");
    }
    fsck_clean(&crash);
}
