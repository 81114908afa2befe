//! Crash consistency: run a workload over a device that records every write and flush, rebuild
//! the image a crash would leave at every flush point (and with random subsets of the writes
//! after it, as disks reorder unflushed writes), and recover each one three ways: rext4's
//! recovery, e2fsck's, and the kernel's. Each must give an image `e2fsck -fn` accepts in which
//! everything fsync'ed before the crash is present.
//!
//! `REXT4_CRASH_ROUNDS` scales the workload (default 60 rounds; each adds about two crash
//! points).

mod abort;
mod checkpoint;
mod data;
mod fsync;
mod metadata;
mod migrate;
mod xattr;

use rext4::dev::CrashDevice;
use rext4::{Fs, Options};
use rext4_testkit::{
    flush_count, for_each_crash_image, kernel_can_mount, require_kernel, Image, KernelMount,
};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

const FILES: usize = 64;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The inodes of the base image's files `/f0`.. `/f{n-1}` (see `make_image`).
fn file_inos(fs: &Fs, n: usize) -> Vec<rext4::InodeNo> {
    (0..n).map(|i| fs.resolve(format!("/f{i}"), false).unwrap()).collect()
}

fn tmpdir() -> tempfile::TempDir {
    // Hundreds of image files: keep them in memory where possible.
    if Path::new("/dev/shm").is_dir() {
        if let Ok(d) = tempfile::tempdir_in("/dev/shm") {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

fn make_image(dir: &Path, args: &[&str]) -> Vec<u8> {
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..FILES {
        std::fs::write(src.join(format!("f{i}")), b"x").unwrap();
    }
    let img = dir.join("base.img");
    Image::ext4("8M").block_size(1024).extended("root_owner=0:0").args(args).from_dir(&src).build(&img);
    std::fs::read(&img).unwrap()
}

/// A writable filesystem over the recording device that commits only when asked, so every
/// commit in the log comes from an fsync (or the close).
fn open_rw(dev: &Arc<CrashDevice>) -> Fs {
    let opts = Options { writable: true, commit_interval: Duration::from_secs(3600), ..Options::default() };
    Fs::from_device(dev.clone(), opts).unwrap()
}

fn fsck(img: &Path, fix: bool) -> (i32, String) {
    let out = Command::new("e2fsck").arg(if fix { "-fy" } else { "-fn" }).arg(img).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

fn assert_clean(img: &Path, how: &str) {
    let (code, out) = fsck(img, false);
    assert_eq!(code, 0, "{how}: e2fsck -fn not clean:\n{out}");
}

/// Mounts and unmounts `img` in the kernel, which replays its journal; false where the kernel
/// cannot mount images (see `kernel_can_mount`) or refuses this one.
fn kernel_recover(img: &Path) -> bool {
    require_kernel!(false);
    match KernelMount::rw(img) {
        Ok(m) => {
            m.unmount().unwrap();
            true
        }
        Err(e) => {
            eprintln!("kernel mount failed: {e}");
            false
        }
    }
}

/// What a workload must report for the harness: how many fsyncs it made durable.
trait Durable {
    fn fsyncs(&self) -> usize;
}

/// Runs `workload` with `seed` (changed by `REXT4_CRASH_SEED=N`, for campaigns beyond the
/// suite's fixed seeds) for `REXT4_CRASH_ROUNDS` rounds, then checks every crash image.
fn run_with<M: Durable>(
    name: &str,
    mkfs_args: &[&str],
    seed: u64,
    workload: fn(&Arc<CrashDevice>, usize, u64) -> M,
    check_model: fn(&Path, &M, usize, &str),
) {
    let rounds: usize = std::env::var("REXT4_CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
    let seed = seed
        ^ std::env::var("REXT4_CRASH_SEED")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            .wrapping_mul(0x9E37_79B9);
    let dir = tmpdir();
    let image = make_image(dir.path(), mkfs_args);
    let dev = Arc::new(CrashDevice::new(image));
    let model = workload(&dev, rounds, seed);
    check_crashes(name, dir.path(), &dev, &model, seed, check_model, usize::MAX);
}

/// Checks the image after the clean close, then the crash images of the recorded run: those
/// of every flush, or of about `max_flushes` flushes spread evenly over the run.
fn check_crashes<M: Durable>(
    name: &str,
    dir: &Path,
    dev: &CrashDevice,
    model: &M,
    seed: u64,
    check_model: fn(&Path, &M, usize, &str),
    max_flushes: usize,
) {
    // The image after a clean close.
    assert_snapshot_clean(dev, dir, &format!("{name}: after unmount"));

    let ops = dev.ops();
    let flushes = flush_count(&ops);
    let stride = flushes.div_ceil(max_flushes.max(1)).max(1);
    // The kernel recovers crash images only if it mounts the clean one (it mounts no image
    // with quotas here, lacking `CONFIG_QUOTA`): trying each image would only fail slowly.
    let kernel = kernel_can_mount() && {
        let done = dir.join("final.img");
        std::fs::write(&done, dev.snapshot()).unwrap();
        let ok = kernel_recover(&done);
        if !ok {
            eprintln!("{name}: the kernel does not mount the clean image: no kernel recovery");
        }
        ok
    };
    let mut checked = 0usize;
    for_each_crash_image(&ops, dev.initial(), seed ^ 0xABCDEF, stride, |pos, bytes| {
        let n = checked;
        checked += 1;
        let how = format!("{name} crash #{n} at op {pos}");
        // rext4: read-only open replays in memory and must show what was fsync'ed.
        let img = dir.join("c.img");
        std::fs::write(&img, bytes).unwrap();
        check_model(&img, model, pos, &format!("{how} (rext4 in-memory replay)"));
        rext4::recover_image(&img).unwrap_or_else(|e| panic!("{how}: rext4 recovery: {e}"));
        // The journal replay alone leaves orphan_present as a crash of a writable mount set it
        // (so does e2fsck's replay); a writable open then processes orphans and clears it.
        let (code, out) = fsck(&img, false);
        let orphan_flag_only = out.contains("Feature orphan_present is set but orphan file is clean")
            && out.matches("? no").count() == 1;
        assert!(code == 0 || orphan_flag_only, "{how} (rext4 journal replay): e2fsck -fn:\n{out}");
        check_model(&img, model, pos, &format!("{how} (rext4 journal replay)"));
        let opts = Options { writable: true, ..Options::default() };
        Fs::open_with(&img, opts)
            .and_then(|f| f.unmount())
            .unwrap_or_else(|e| panic!("{how}: rext4 open: {e}"));
        assert_clean(&img, &format!("{how} (rext4 recovery)"));
        check_model(&img, model, pos, &format!("{how} (rext4 recovery)"));
        // e2fsck's recovery.
        std::fs::write(&img, bytes).unwrap();
        let (code, out) = fsck(&img, true);
        assert!(code < 4, "{how}: e2fsck -fy failed ({code}):\n{out}");
        assert_clean(&img, &format!("{how} (e2fsck recovery)"));
        check_model(&img, model, pos, &format!("{how} (e2fsck recovery)"));
        // The kernel's recovery, on every other image to bound the run time.
        if kernel && n.is_multiple_of(2) {
            std::fs::write(&img, bytes).unwrap();
            if kernel_recover(&img) {
                assert_clean(&img, &format!("{how} (kernel recovery)"));
                check_model(&img, model, pos, &format!("{how} (kernel recovery)"));
            }
        }
    });
    eprintln!(
        "{name}: {checked} crash images checked ({} operations, {flushes} flushes, {} fsyncs)",
        ops.len(),
        model.fsyncs()
    );
}

/// `e2fsck -fn` on the device's current contents.
fn assert_snapshot_clean(dev: &CrashDevice, dir: &Path, how: &str) {
    let done = dir.join("final.img");
    std::fs::write(&done, dev.snapshot()).unwrap();
    assert_clean(&done, how);
}
