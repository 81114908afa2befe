//! Crashes with orphans held, and in the middle of truncates.

use super::*;
use rext4::dev::CrashDevice;
use rext4::SetAttr;
use rext4_testkit::{e2fsck_clean, flush_count, for_each_crash_image, kernel_can_mount, KernelMount};
use std::sync::Arc;

/// After any recovery: each of `files` (name, inode) either still has its name and inode, or
/// has neither; a replaced name points at the inode that replaced it.
fn check_crash_model(img: &Path, files: &[(&str, InodeNo)], replaced: (&str, InodeNo, InodeNo), how: &str) {
    let fs = Fs::open(img).unwrap_or_else(|e| panic!("{how}: open: {e}"));
    for &(path, ino) in files {
        match fs.resolve(path, false) {
            Ok(i) => {
                assert_eq!(i, ino, "{how}: {path}");
                assert_eq!(fs.getattr(ino).unwrap().nlink, 1, "{how}: {path}");
            }
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOENT, "{how}: {path}: {e}");
                assert!(fs.getattr(ino).is_err(), "{how}: {path} gone but inode {ino:?} still live");
            }
        }
    }
    let (path, old, new) = replaced;
    let now = fs.resolve(path, false).unwrap_or_else(|e| panic!("{how}: {path}: {e}"));
    assert!(now == old || now == new, "{how}: {path} is {now:?}");
    if now == new {
        assert!(fs.getattr(old).is_err(), "{how}: replaced inode {old:?} still live");
    }
}

fn crash_run(name: &str, args: &[&str], seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), name, args, 1, 6);
    let dev = Arc::new(CrashDevice::new(std::fs::read(&img).unwrap()));
    let opts = Options {
        writable: true,
        commit_interval: std::time::Duration::from_secs(3600),
        ..Options::default()
    };
    let fs = Fs::from_device(dev.clone(), opts).unwrap();
    let d = fs.resolve("/d0", false).unwrap();
    let ino = |n: &str| fs.lookup(d, n.as_bytes()).unwrap().ino;
    let (f0, f1, f2, f3, f4) = (ino("f0"), ino("f1"), ino("f2"), ino("f3"), ino("f4"));
    let data0 = read_all(&fs, f0);
    for i in [f0, f1, f2, f3] {
        fs.hold(i).unwrap();
    }
    fs.unlink(d, b"f0").unwrap();
    fs.sync().unwrap();
    fs.unlink(d, b"f1").unwrap();
    fs.rename(d, b"f4", d, b"f2", 0).unwrap();
    fs.sync().unwrap();
    assert_eq!(read_all(&fs, f0), data0);
    fs.release(f0).unwrap();
    fs.sync().unwrap();
    fs.release(f1).unwrap();
    fs.release(f3).unwrap();
    // f2 is still held at unmount.
    fs.unmount().unwrap();
    drop(fs);
    let done = dir.path().join("final.img");
    std::fs::write(&done, dev.snapshot()).unwrap();
    e2fsck_clean(&done);

    let files = [("/d0/f0", f0), ("/d0/f1", f1), ("/d0/f3", f3)];
    let replaced = ("/d0/f2", f2, f4);
    let ops = dev.ops();
    // A kernel without quota support (CONFIG_QFMT_V2) mounts quota images read-only only:
    // probed once, on a copy.
    let probe = dir.path().join("probe.img");
    std::fs::copy(&done, &probe).unwrap();
    let kernel = kernel_can_mount()
        && KernelMount::rw(&probe)
            .map(|m| m.unmount().unwrap())
            .map_err(|e| eprintln!("{name}: no kernel recovery: {e}"))
            .is_ok();
    let c = dir.path().join("c.img");
    let (mut with_orphans, mut checked) = (0, 0);
    for_each_crash_image(&ops, dev.initial(), seed, 1, |pos, bytes| {
        let how = format!("{name} crash #{checked} at op {pos}");
        checked += 1;
        // rext4: journal replay and orphan recovery at a writable open.
        std::fs::write(&c, bytes).unwrap();
        let fs = rw(&c);
        let (freed, _) = fs.orphans_recovered();
        if freed > 0 {
            with_orphans += 1;
        }
        fs.unmount().unwrap();
        drop(fs);
        let (code, out) = fsck(&c, false);
        assert_eq!(code, 0, "{how} (rext4 recovery): e2fsck -fn:\n{out}");
        check_crash_model(&c, &files, replaced, &format!("{how} (rext4)"));
        // e2fsck's.
        std::fs::write(&c, bytes).unwrap();
        let (code, out) = fsck(&c, true);
        assert!(code < 4, "{how}: e2fsck -fy failed ({code}):\n{out}");
        let (code, out) = fsck(&c, false);
        assert_eq!(code, 0, "{how} (e2fsck recovery): e2fsck -fn:\n{out}");
        check_crash_model(&c, &files, replaced, &format!("{how} (e2fsck)"));
        // The kernel's.
        if kernel {
            std::fs::write(&c, bytes).unwrap();
            KernelMount::rw(&c).unwrap().unmount().unwrap();
            let (code, out) = fsck(&c, false);
            assert_eq!(code, 0, "{how} (kernel recovery): e2fsck -fn:\n{out}");
            check_crash_model(&c, &files, replaced, &format!("{how} (kernel)"));
        }
    });
    assert!(with_orphans >= 2, "{name}: only {with_orphans} of {checked} crash images held orphans");
    eprintln!("{name}: {checked} crash images, {with_orphans} with orphans to recover");
}

#[test]
fn crash_with_held_orphans_list() {
    crash_run("list", VARIANTS[0].1, 11);
}

#[test]
fn crash_with_held_orphans_orphan_file() {
    crash_run("orphan-file", VARIANTS[1].1, 12);
}

/// Orphans freed by recovery give their usage back: quota files stay what e2fsck counts.
#[test]
fn crash_with_held_orphans_quota() {
    crash_run("quota", &["-O", "quota,project", "-E", "quotatype=usrquota:grpquota:prjquota"], 13);
}

/// A truncate of a file with many extents takes many transactions, and commits land between
/// them (another thread syncs all along). A crash at any of them leaves the file at its old
/// size, or at its new size with an orphan record that recovery uses to free the rest.
fn crash_truncate_run(name: &str, args: &[&str], seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), name, args, 1, 1);
    let opts = |ms| Options {
        writable: true,
        commit_interval: std::time::Duration::from_millis(ms),
        ..Options::default()
    };
    let setup = Arc::new(CrashDevice::new(std::fs::read(&img).unwrap()));
    let (ino, old_size, old_blocks) = {
        let fs = Fs::from_device(setup.clone(), opts(3_600_000)).unwrap();
        let a = fs.create(fs.root(), b"frag", 0o644, 0, 0).unwrap();
        // Every other 1 KiB block: one extent each.
        for i in 0..12000u64 {
            fs.write(a.ino, i * 2048, &[i as u8 | 1; 1024]).unwrap();
        }
        // Blocks chosen (delayed writes written back), so the tree is on disk.
        fs.fsync(a.ino).unwrap();
        let got = fs.getattr(a.ino).unwrap();
        assert!(got.blocks > 2 * 12000, "{name}: an extent tree with index blocks");
        fs.unmount().unwrap();
        (a.ino, got.size, got.blocks)
    };
    let base = setup.snapshot();
    drop(setup);
    let kernel = kernel_can_mount();
    let c = dir.path().join("c.img");
    let (mut mid_truncate, mut checked) = (0, 0);
    // Whether a commit lands inside the truncate depends on timing: try a few times.
    for attempt in 0..8 {
        let dev = Arc::new(CrashDevice::new(base.clone()));
        {
            let fs = Fs::from_device(dev.clone(), opts(1)).unwrap();
            let done = std::sync::atomic::AtomicBool::new(false);
            std::thread::scope(|s| {
                s.spawn(|| {
                    while !done.load(std::sync::atomic::Ordering::Acquire) {
                        fs.sync().unwrap();
                    }
                });
                fs.setattr(ino, &SetAttr { size: Some(0), ..SetAttr::default() }).unwrap();
                done.store(true, std::sync::atomic::Ordering::Release);
            });
            assert_eq!(fs.getattr(ino).unwrap().blocks, 0);
            fs.unmount().unwrap();
        }
        // At most 16 per attempt (two per chosen flush), spread over the run, built one at a
        // time: the run may have thousands of flushes.
        let ops = dev.ops();
        let stride = flush_count(&ops).div_ceil(8).max(1);
        for_each_crash_image(&ops, dev.initial(), seed + attempt, stride, |pos, bytes| {
            let how = format!("{name} truncate attempt {attempt} crash #{checked} at op {pos}");
            checked += 1;
            std::fs::write(&c, bytes).unwrap();
            let fs = rw(&c);
            mid_truncate += usize::from(fs.orphans_recovered().1 > 0);
            fs.unmount().unwrap();
            drop(fs);
            let (code, out) = fsck(&c, false);
            assert_eq!(code, 0, "{how} (rext4 recovery): e2fsck -fn:\n{out}");
            let truncated_or_not = |img: &Path, how: &str| {
                let a = Fs::open(img).unwrap().getattr(ino).unwrap();
                let ok = (a.size == old_size && a.blocks == old_blocks) || (a.size == 0 && a.blocks == 0);
                assert!(ok, "{how}: size {} blocks {}", a.size, a.blocks);
            };
            truncated_or_not(&c, &format!("{how} (rext4)"));
            if kernel {
                std::fs::write(&c, bytes).unwrap();
                KernelMount::rw(&c).unwrap().unmount().unwrap();
                let (code, out) = fsck(&c, false);
                assert_eq!(code, 0, "{how} (kernel recovery): e2fsck -fn:\n{out}");
                truncated_or_not(&c, &format!("{how} (kernel)"));
            }
            // e2fsck: a consistent image. Its orphan truncation of a half-truncated two-level
            // tree gives up ("Already cleared indirect block"), though the replayed journal
            // alone leaves tree and bitmaps consistent; it then sets i_size from the blocks
            // left, so the file keeps the prefix not yet freed (rext4 and the kernel finish the
            // truncate).
            std::fs::write(&c, bytes).unwrap();
            let (code, out0) = fsck(&c, true);
            assert!(code < 4, "{how}: e2fsck -fy failed ({code}):\n{out0}");
            let (code, out) = fsck(&c, false);
            assert_eq!(code, 0, "{how} (e2fsck recovery): e2fsck -fn:\n{out}");
            let a = Fs::open(&c).unwrap().getattr(ino).unwrap();
            assert!(
                a.size <= old_size && a.blocks <= old_blocks,
                "{how} (e2fsck): size {} blocks {}\n{out0}",
                a.size,
                a.blocks
            );
        });
        if mid_truncate > 0 {
            break;
        }
    }
    eprintln!("{name}: {checked} truncate crash images checked, {mid_truncate} mid-truncate");
    assert!(mid_truncate >= 1, "{name}: no crash image caught the truncate half done");
}

#[test]
fn crash_mid_truncate_list() {
    crash_truncate_run("list", VARIANTS[0].1, 21);
}

#[test]
fn crash_mid_truncate_orphan_file() {
    crash_truncate_run("orphan-file", VARIANTS[1].1, 22);
}
