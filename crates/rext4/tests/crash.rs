//! Crash consistency: run a workload over a device that records every write and flush, rebuild
//! the image a crash would leave at every flush point (and with random subsets of the writes
//! after it, as disks reorder unflushed writes), and recover each one three ways: rext4's
//! recovery, e2fsck's, and the kernel's. Each must give an image `e2fsck -fn` accepts in which
//! everything fsync'ed before the crash is present.
//!
//! `REXT4_CRASH_ROUNDS` scales the workload (default 60 rounds; each adds about two crash
//! points).

use rext4::dev::CrashDevice;
use rext4::{Fs, Options, SetAttr};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;

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
    let mut args_all = vec!["-b", "1024", "-E", "root_owner=0:0"];
    args_all.extend_from_slice(args);
    common::mkfs(Some(&src), &img, &args_all, "8M");
    std::fs::read(&img).unwrap()
}

/// What the workload did: every uid each file had, and what fsync made durable when.
struct Model {
    /// Versions (uids) each file has had, in order; the first is the initial one.
    history: Vec<Vec<u32>>,
    /// (log position when fsync returned, file, version it made durable).
    durable: Vec<(usize, usize, u32)>,
}

/// A writable filesystem over the recording device that commits only when asked, so every
/// commit in the log comes from an fsync (or the close).
fn open_rw(dev: &Arc<CrashDevice>) -> Fs {
    let opts = Options { writable: true, commit_interval: Duration::from_secs(3600), ..Options::default() };
    Fs::from_device(dev.clone(), opts).unwrap()
}

fn run_workload(dev: &Arc<CrashDevice>, rounds: usize, seed: u64) -> Model {
    let fs = open_rw(dev);
    let mut rng = Rng(seed);
    let inos: Vec<_> = (0..FILES).map(|i| fs.resolve(format!("/f{i}"), false).unwrap()).collect();
    let mut history: Vec<Vec<u32>> = inos.iter().map(|&ino| vec![fs.getattr(ino).unwrap().uid]).collect();
    let mut durable = Vec::new();
    let mut version = 10_000u32;
    let mut last = 0usize;
    for _ in 0..rounds {
        // A burst of changes (several transactions' worth), then an fsync of one file.
        for _ in 0..(rng.next() % 40 + 1) {
            let f = (rng.next() % FILES as u64) as usize;
            version += 1;
            fs.setattr(
                inos[f],
                &SetAttr {
                    uid: Some(version),
                    mode: Some(0o600 | (version as u16 & 0o77)),
                    ..SetAttr::default()
                },
            )
            .unwrap();
            history[f].push(version);
            last = f;
        }
        // Usually the file changed last (a commit), sometimes any file (often nothing to do).
        let f = if rng.next().is_multiple_of(4) { (rng.next() % FILES as u64) as usize } else { last };
        fs.fsync(inos[f]).unwrap();
        durable.push((dev.position(), f, *history[f].last().unwrap()));
    }
    fs.unmount().unwrap();
    Model { history, durable }
}

/// Checks a recovered image against the model for a crash at log position `pos`.
fn check_model(img: &Path, model: &Model, pos: usize, how: &str) {
    let fs = Fs::open(img).unwrap_or_else(|e| panic!("{how}: open after recovery: {e}"));
    for (f, hist) in model.history.iter().enumerate() {
        let uid = fs.metadata(format!("/f{f}")).unwrap().uid;
        let at = hist
            .iter()
            .position(|&v| v == uid)
            .unwrap_or_else(|| panic!("{how}: f{f} has uid {uid}, never written"));
        for &(p, df, v) in &model.durable {
            if df == f && p <= pos {
                let need = hist.iter().position(|&x| x == v).unwrap();
                assert!(at >= need, "{how}: crash at {pos}: f{f} lost fsync'ed version {v} (has {uid})");
            }
        }
    }
}

fn fsck(img: &Path, fix: bool) -> (i32, String) {
    let out = Command::new("e2fsck").arg(if fix { "-fy" } else { "-fn" }).arg(img).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

fn assert_clean(img: &Path, how: &str) {
    let (code, out) = fsck(img, false);
    assert_eq!(code, 0, "{how}: e2fsck -fn not clean:\n{out}");
}

fn kernel_recover(img: &Path, mnt: &Path) -> bool {
    std::fs::create_dir_all(mnt).unwrap();
    let out = Command::new("mount").args(["-o", "loop"]).arg(img).arg(mnt).output().unwrap();
    if !out.status.success() {
        eprintln!("kernel mount failed: {}", String::from_utf8_lossy(&out.stderr));
        return false;
    }
    assert!(Command::new("umount").arg(mnt).status().unwrap().success());
    true
}

fn run(name: &str, mkfs_args: &[&str], seed: u64) {
    run_with(name, mkfs_args, seed, run_workload, check_model);
}

/// What a workload must report for the harness: how many fsyncs it made durable.
trait Durable {
    fn fsyncs(&self) -> usize;
}

impl Durable for Model {
    fn fsyncs(&self) -> usize {
        self.durable.len()
    }
}

fn run_with<M: Durable>(
    name: &str,
    mkfs_args: &[&str],
    seed: u64,
    workload: fn(&Arc<CrashDevice>, usize, u64) -> M,
    check_model: fn(&Path, &M, usize, &str),
) {
    let rounds: usize = std::env::var("REXT4_CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
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
    let flushes = common::flush_count(&ops);
    let stride = flushes.div_ceil(max_flushes.max(1)).max(1);
    let kernel = common::is_root();
    if !kernel {
        eprintln!("{name}: skipping kernel recovery: loop mounts need root");
    }
    let mut checked = 0usize;
    common::for_each_crash_image(&ops, dev.initial(), seed ^ 0xABCDEF, stride, |pos, bytes| {
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
            if kernel_recover(&img, &dir.join("mnt")) {
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

#[test]
fn crash_default_features() {
    run("default", &[], 1);
}

#[test]
fn crash_upstream_features() {
    run("upstream", &["-O", "metadata_csum_seed,orphan_file"], 2);
}

#[test]
fn crash_no_metadata_csum() {
    run("nocsum", &["-O", "^metadata_csum,^64bit"], 3);
}

/// File data (`data=ordered`): files that are only appended to must, after any crash, hold
/// their own bytes over their whole size (data reaches the disk before the metadata that
/// makes it reachable) and at least what was fsync'ed; files that are overwritten, truncated,
/// punched and zeroed must never show another file's bytes (freed blocks are not reused
/// before the freeing transaction commits).
struct DataModel {
    /// (log position when fsync returned, file, size it made durable) for append-only files.
    durable: Vec<(usize, usize, u64)>,
}

impl Durable for DataModel {
    fn fsyncs(&self) -> usize {
        self.durable.len()
    }
}

const DATA_FILES: usize = 12;
const APPEND_FILES: usize = 6;

fn tag(f: usize) -> u8 {
    0xA0 + f as u8
}

fn data_workload(dev: &Arc<CrashDevice>, rounds: usize, seed: u64) -> DataModel {
    data_workload_with(dev, rounds, seed, true)
}

/// The data workload for block-mapped files: fallocate is not supported there.
fn data_workload_no_falloc(dev: &Arc<CrashDevice>, rounds: usize, seed: u64) -> DataModel {
    data_workload_with(dev, rounds, seed, false)
}

fn data_workload_with(dev: &Arc<CrashDevice>, rounds: usize, seed: u64, falloc: bool) -> DataModel {
    let fs = open_rw(dev);
    let mut rng = Rng(seed);
    let inos: Vec<_> = (0..DATA_FILES).map(|i| fs.resolve(format!("/f{i}"), false).unwrap()).collect();
    for (f, &ino) in inos.iter().enumerate() {
        fs.setattr(ino, &SetAttr { size: Some(0), ..SetAttr::default() }).unwrap();
        fs.write(ino, 0, &[tag(f); 100]).unwrap();
    }
    let mut sizes = [100u64; DATA_FILES];
    let mut durable = Vec::new();
    for _ in 0..rounds {
        for _ in 0..(rng.next() % 12 + 1) {
            let f = (rng.next() % DATA_FILES as u64) as usize;
            let len = rng.next() % 9000 + 1;
            let buf = vec![tag(f); len as usize];
            if f < APPEND_FILES {
                if sizes[f] <= 150_000 {
                    fs.write(inos[f], sizes[f], &buf).unwrap();
                    sizes[f] += len;
                }
                continue;
            }
            let off = rng.next() % 120_000;
            let ino = inos[f];
            match rng.next() % if falloc { 6 } else { 3 } {
                0 | 1 => {
                    fs.write(ino, off, &buf).unwrap();
                }
                2 => {
                    fs.setattr(ino, &SetAttr { size: Some(off / 3), ..SetAttr::default() }).unwrap();
                }
                3 => fs
                    .fallocate(ino, rext4::FALLOC_FL_PUNCH_HOLE | rext4::FALLOC_FL_KEEP_SIZE, off, len * 3)
                    .unwrap(),
                4 => fs.fallocate(ino, rext4::FALLOC_FL_ZERO_RANGE, off, len).unwrap(),
                _ => fs.fallocate(ino, 0, off, len * 2).unwrap(),
            }
        }
        let f = (rng.next() % APPEND_FILES as u64) as usize;
        fs.fsync(inos[f]).unwrap();
        durable.push((dev.position(), f, sizes[f]));
    }
    fs.unmount().unwrap();
    DataModel { durable }
}

fn check_data(img: &Path, model: &DataModel, pos: usize, how: &str) {
    let fs = Fs::open(img).unwrap_or_else(|e| panic!("{how}: open after recovery: {e}"));
    for f in 0..DATA_FILES {
        let data = fs.read_file(format!("/f{f}")).unwrap();
        if data == b"x" && !model.durable.iter().any(|&(p, df, _)| df == f && p <= pos) {
            continue; // as made by mkfs: nothing committed yet
        }
        if let Some(b) = data.iter().position(|&b| b != 0 && b != tag(f)) {
            panic!("{how}: f{f} shows a byte {:#x} at {b} that it never held", data[b]);
        }
        if f < APPEND_FILES {
            if let Some(z) = data.iter().position(|&b| b != tag(f)) {
                panic!(
                    "{how}: append-only f{f} has a zero at {z} of {}: data lost behind its size",
                    data.len()
                );
            }
            for &(p, df, size) in &model.durable {
                if df == f && p <= pos {
                    assert!(
                        data.len() as u64 >= size,
                        "{how}: f{f} lost fsync'ed size {size} (has {})",
                        data.len()
                    );
                }
            }
        }
    }
}

#[test]
fn crash_file_data() {
    run_with("data", &[], 4, data_workload, check_data);
}

/// The data workload on an `inline_data` filesystem: files start inline (100 bytes fit in
/// the record), and writes, truncates and fallocates move them into blocks or keep them
/// inline; every crash image must show each file's own bytes only.
#[test]
fn crash_file_data_inline() {
    run_with("data-inline", &["-O", "inline_data"], 6, data_workload, check_data);
}

#[test]
fn crash_file_data_block_maps() {
    run_with(
        "data-ext3",
        &["-t", "ext3", "-O", "^has_journal,has_journal"],
        5,
        data_workload_no_falloc,
        check_data,
    );
}

/// An I/O error while committing aborts the journal: later changes fail with EROFS and
/// nothing half-written is presented as committed.
#[test]
fn io_error_aborts_the_journal() {
    let dir = tmpdir();
    let image = make_image(dir.path(), &[]);
    let dev = Arc::new(CrashDevice::new(image));
    let fs = open_rw(&dev);
    let ino = fs.resolve("/f1", false).unwrap();
    fs.setattr(ino, &SetAttr { uid: Some(7), ..SetAttr::default() }).unwrap();
    dev.fail_writes_after(1);
    let e = fs.fsync(ino).unwrap_err();
    assert_eq!(e.errno(), 5, "fsync after an I/O error: {e}"); // EIO
    let e = fs.setattr(ino, &SetAttr { uid: Some(8), ..SetAttr::default() }).unwrap_err();
    assert_eq!(e.errno(), 30, "{e}");
    assert!(fs.unmount().is_err());
    // What reached the device recovers to a consistent image.
    let img = dir.path().join("aborted.img");
    std::fs::write(&img, dev.snapshot()).unwrap();
    let (code, out) = fsck(&img, true);
    assert!(code < 4, "{out}");
    assert_clean(&img, "after abort");
}

/// The superblock's record of an aborted journal, as `dumpe2fs -h` shows it.
fn abort_record(img: &Path) -> [String; 5] {
    ["Filesystem state", "FS Error count", "First error function", "First error err", "Journal errno"]
        .map(|k| common::sb_field(img, k))
}

/// A write error in the log aborts the journal, and the abort is recorded as the kernel
/// records it: the journal superblock keeps the errno (`jbd2_journal_abort`), and the
/// superblock marks the filesystem as having errors and counts one under
/// `ext4_journal_check_start` (`ext4_abort`, "Detected aborted journal"). Changes stop
/// (`EROFS`). The next mount, rext4's or the kernel's, replays what was committed, keeps the
/// record and clears the journal's errno, and e2fsck finds the image clean.
#[test]
fn an_aborted_journal_is_recorded() {
    let dir = tmpdir();
    let image = make_image(dir.path(), &[]);
    let base = dir.path().join("base.img");
    let out = Command::new("debugfs").args(["-R", "bmap <8> 0"]).arg(&base).output().unwrap();
    let jsb: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let total: u64 = common::sb_field(&base, "Total journal blocks").parse().unwrap();
    let dev = Arc::new(CrashDevice::new(image));
    let fs = open_rw(&dev);
    let ino = fs.resolve("/f1", false).unwrap();
    let uid = |u| SetAttr { uid: Some(u), ..SetAttr::default() };
    fs.setattr(ino, &uid(7)).unwrap();
    fs.fsync(ino).unwrap();
    assert!(!fs.has_errors());
    // Every log block after the journal superblock: the next commit cannot be written.
    dev.fail_writes_in((jsb + 1) * 1024..(jsb + total) * 1024);
    fs.setattr(ino, &uid(8)).unwrap();
    assert_eq!(fs.fsync(ino).unwrap_err().errno(), libc::EIO);
    assert!(fs.has_errors());
    assert!(!fs.is_writable());
    assert_eq!(fs.setattr(ino, &uid(9)).unwrap_err().errno(), libc::EROFS);
    assert_eq!(fs.create(fs.root(), b"new", 0o644, 0, 0).unwrap_err().errno(), libc::EROFS);
    assert!(fs.unmount().is_err());
    drop(fs);
    let img = dir.path().join("aborted.img");
    std::fs::write(&img, dev.snapshot()).unwrap();
    let recorded = ["clean with errors", "1", "ext4_journal_check_start", "EIO"].map(String::from);
    let mut want = recorded.clone().to_vec();
    want.push("-5".into());
    assert_eq!(abort_record(&img).to_vec(), want, "as the aborted filesystem left it");
    assert!(common::features(&img).contains("needs_recovery"));
    let kimg = dir.path().join("kernel.img");
    std::fs::copy(&img, &kimg).unwrap();
    let mut want = recorded.to_vec();
    want.push(String::new());
    {
        let opts = Options { writable: true, ..Options::default() };
        let fs = Fs::open_with(&img, opts).unwrap();
        assert!(fs.has_errors());
        assert_eq!(fs.metadata("/f1").unwrap().uid, 7, "the committed change was replayed");
        fs.unmount().unwrap();
    }
    assert_eq!(abort_record(&img).to_vec(), want, "after rext4's recovery");
    assert_clean(&img, "after rext4's recovery");
    if kernel_recover(&kimg, &dir.path().join("mnt")) {
        assert_eq!(abort_record(&kimg).to_vec(), want, "after the kernel's recovery");
        assert_clean(&kimg, "after the kernel's recovery");
    }
}

/// An errno in the journal superblock of an image that needs no recovery (left there by a
/// kernel that could write nothing else after its abort, say) marks the filesystem as having
/// errors at the next writable open, which then clears it (`ext4_clear_journal_err`), as the
/// kernel's mount does.
#[test]
fn a_journal_errno_marks_the_filesystem_at_open() {
    let dir = tmpdir();
    let mut image = make_image(dir.path(), &[]);
    let base = dir.path().join("base.img");
    let out = Command::new("debugfs").args(["-R", "bmap <8> 0"]).arg(&base).output().unwrap();
    let at = String::from_utf8_lossy(&out.stdout).trim().parse::<usize>().unwrap() * 1024;
    let mut jsb = rext4::format::jbd2::JournalSuperblock::parse(&image[at..]).unwrap();
    jsb.set_errno(-libc::EIO);
    jsb.update_checksum();
    image[at + 0x20..at + 0x24].copy_from_slice(&jsb.s_errno.get().to_be_bytes());
    image[at + 0xFC..at + 0x100].copy_from_slice(&jsb.s_checksum.get().to_be_bytes());
    let img = dir.path().join("errno.img");
    std::fs::write(&img, &image).unwrap();
    assert_eq!(common::sb_field(&img, "Journal errno"), "-5");
    assert_eq!(common::sb_field(&img, "Filesystem state"), "clean");
    let kimg = dir.path().join("kernel.img");
    std::fs::copy(&img, &kimg).unwrap();
    {
        let fs = Fs::open(&img).unwrap();
        assert!(!fs.has_errors(), "a read-only open changes nothing");
    }
    assert_eq!(std::fs::read(&img).unwrap(), image, "a read-only open wrote");
    let fs = Fs::open_with(&img, Options { writable: true, ..Options::default() }).unwrap();
    assert!(fs.has_errors());
    fs.unmount().unwrap();
    drop(fs);
    let fields = |img: &Path| ["Filesystem state", "Journal errno"].map(|k| common::sb_field(img, k));
    let want = ["clean with errors", ""].map(String::from);
    assert_eq!(fields(&img), want, "after rext4's open");
    assert_clean(&img, "after rext4's open");
    if kernel_recover(&kimg, &dir.path().join("mnt")) {
        assert_eq!(fields(&kimg), want, "after the kernel's mount");
        assert_clean(&kimg, "after the kernel's mount");
    }
}

/// The image as of the device's last flush: what a crash right now would leave.
/// `e2fsck -fn` on the device's current contents.
fn assert_snapshot_clean(dev: &CrashDevice, dir: &Path, how: &str) {
    let done = dir.join("final.img");
    std::fs::write(&done, dev.snapshot()).unwrap();
    assert_clean(&done, how);
}

/// A recording device over a fresh image whose `/f0` holds 8 KiB of `a`, written and fsynced.
fn f0_written_and_fsynced(dir: &Path) -> (Arc<CrashDevice>, Fs, rext4::InodeNo) {
    let dev = Arc::new(CrashDevice::new(make_image(dir, &[])));
    let fs = open_rw(&dev);
    let ino = fs.resolve("/f0", false).unwrap();
    fs.write(ino, 0, &[b'a'; 8192]).unwrap();
    fs.fsync(ino).unwrap();
    (dev, fs, ino)
}

fn flushed_fs(dev: &CrashDevice, dir: &Path) -> Fs {
    let ops = dev.ops();
    let last_flush = ops.iter().rposition(|o| matches!(o, rext4::dev::Op::Flush)).unwrap();
    let mut img = dev.initial().to_vec();
    rext4::dev::apply_ops(&mut img, &ops, 0, last_flush, |_| true);
    let path = dir.join("flushed.img");
    std::fs::write(&path, &img).unwrap();
    Fs::open(&path).unwrap()
}

#[test]
fn fsync_after_eviction_still_commits() {
    // The inode's last change (and an overwrite in place) must reach the device even when its
    // in-memory copy was evicted between the change and the fsync.
    let dir = tmpdir();
    let (dev, fs, ino) = f0_written_and_fsynced(dir.path());
    for round in 0..10u8 {
        let mode = 0o600 + u16::from(round);
        fs.setattr(ino, &rext4::SetAttr { mode: Some(mode), ..Default::default() }).unwrap();
        let patch = [b'A' + round; 16];
        fs.write(ino, 200 + u64::from(round) * 16, &patch).unwrap();
        fs.drop_caches();
        fs.fsync(ino).unwrap();
        let got = flushed_fs(&dev, dir.path());
        let a = got.getattr(got.resolve("/f0", false).unwrap()).unwrap();
        assert_eq!(a.perm(), mode, "round {round}: fsync'ed chmod lost after eviction");
        let data = got.read_file("/f0").unwrap();
        let at = 200 + usize::from(round) * 16;
        assert_eq!(&data[at..at + 16], &patch, "round {round}: fsync'ed overwrite lost after eviction");
    }
    fs.unmount().unwrap();
    assert_snapshot_clean(&dev, dir.path(), "after the evicted fsyncs");
}

/// An overwrite in place changes no metadata within a clock tick, so no commit carries it:
/// fsync must still flush it. A crash right after fsync returns keeps the new bytes.
#[test]
fn fsync_flushes_overwrites_in_place() {
    let dir = tmpdir();
    let (dev, fs, ino) = f0_written_and_fsynced(dir.path());
    for round in 0..20u8 {
        let patch = [b'A' + round; 16];
        fs.write(ino, 100 + u64::from(round) * 16, &patch).unwrap();
        fs.fsync(ino).unwrap();
        // Only what the device was told to flush survives.
        let got = flushed_fs(&dev, dir.path()).read_file("/f0").unwrap();
        let at = 100 + usize::from(round) * 16;
        assert_eq!(&got[at..at + 16], &patch, "round {round}: fsync'ed overwrite lost");
    }
    fs.unmount().unwrap();
    assert_snapshot_clean(&dev, dir.path(), "after the overwrites");
}

const WRAP_THREADS: usize = 4;

/// Several threads change their own files' attributes and create and remove entries and
/// directories of their own (freeing directory blocks), with commits every few milliseconds
/// and fsyncs, on a 1024-block log: the log wraps many times with checkpoints running beside
/// the commits.
/// `fs_dev` is what the filesystem writes through; it ends in `dev`, which records.
fn concurrent_workload(
    fs_dev: Arc<dyn rext4::dev::BlockDevice>,
    dev: &CrashDevice,
    rounds: usize,
    seed: u64,
) -> (Model, rext4::CommitStats) {
    let opts = Options { writable: true, commit_interval: Duration::from_millis(3), ..Options::default() };
    let fs = Fs::from_device(fs_dev, opts).unwrap();
    let inos: Vec<_> = (0..FILES).map(|i| fs.resolve(format!("/f{i}"), false).unwrap()).collect();
    let mut history: Vec<Vec<u32>> = inos.iter().map(|&ino| vec![fs.getattr(ino).unwrap().uid]).collect();
    let log_blocks = 1024u64;
    let per_thread = std::thread::scope(|s| {
        let workers: Vec<_> = (0..WRAP_THREADS)
            .map(|t| {
                let (fs, inos) = (fs.clone(), &inos);
                s.spawn(move || {
                    let mut rng = Rng(seed.wrapping_mul(31) + t as u64 + 1);
                    let root = fs.root();
                    let home = fs.mkdir(root, format!("t{t}").as_bytes(), 0o755, 0, 0).unwrap().ino;
                    let mine: Vec<usize> = (t..FILES).step_by(WRAP_THREADS).collect();
                    let mut changes: Vec<(usize, u32)> = Vec::new();
                    let mut durable = Vec::new();
                    let mut version = (t as u32 + 1) * 1_000_000;
                    let mut round = 0usize;
                    // At least `rounds` rounds, and on until the log has wrapped several times.
                    while round < rounds
                        || (fs.commit_stats().unwrap().blocks < 8 * log_blocks && round < rounds * 40)
                    {
                        let mut last = mine[0];
                        for _ in 0..(rng.next() % 16 + 1) {
                            let f = mine[(rng.next() % mine.len() as u64) as usize];
                            version += 1;
                            let ch = SetAttr {
                                uid: Some(version),
                                mode: Some(0o600 | (version as u16 & 0o77)),
                                ..SetAttr::default()
                            };
                            fs.setattr(inos[f], &ch).unwrap();
                            changes.push((f, version));
                            last = f;
                        }
                        // A file that stays (inode table and directory blocks that go cold, for
                        // the checkpoints to write home).
                        if round < 300 {
                            let keep = format!("k{round:03}{}", "k".repeat(120));
                            fs.create(home, keep.as_bytes(), 0o644, 0, 0).unwrap();
                        }
                        // A directory filled with long names, emptied and removed a round later.
                        let sub = format!("s{round}");
                        let d = fs.mkdir(home, sub.as_bytes(), 0o755, 0, 0).unwrap().ino;
                        for i in 0..(rng.next() % 12) {
                            let name = format!("{i:03}{}", "n".repeat(180));
                            fs.create(d, name.as_bytes(), 0o644, 0, 0).unwrap();
                        }
                        if round > 0 {
                            let prev = format!("s{}", round - 1);
                            let pd = fs.lookup(home, prev.as_bytes()).unwrap().ino;
                            common::unlink_all(&fs, pd);
                            fs.rmdir(home, prev.as_bytes()).unwrap();
                        }
                        let f = if rng.next().is_multiple_of(4) {
                            mine[(rng.next() % mine.len() as u64) as usize]
                        } else {
                            last
                        };
                        fs.fsync(inos[f]).unwrap();
                        let v = changes.iter().rev().find(|c| c.0 == f).map(|c| c.1);
                        if let Some(v) = v {
                            durable.push((dev.position(), f, v));
                        }
                        round += 1;
                    }
                    (changes, durable)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect::<Vec<_>>()
    });
    let stats = fs.commit_stats().unwrap();
    assert!(stats.blocks >= 4 * log_blocks, "the log did not wrap: {stats:?}");
    eprintln!(
        "load: {} commits, {} blocks logged, {} checkpoints ({} blocks home), {} log-full waits",
        stats.commits, stats.blocks, stats.checkpoints, stats.checkpoint_blocks, stats.log_full_waits
    );
    fs.unmount().unwrap();
    let mut durable = Vec::new();
    for (changes, d) in per_thread {
        for (f, v) in changes {
            history[f].push(v);
        }
        durable.extend(d);
    }
    (Model { history, durable }, stats)
}

/// A 1024-block log wrapping many times under concurrent metadata load, with checkpoints
/// beside the commits: crashes anywhere (also with the log tail in mid-log, after the log
/// wrapped) recover to what was fsync'ed, by rext4, e2fsck and the kernel.
#[test]
fn crash_small_log_wraps_under_concurrent_load() {
    let name = "wrap";
    let seed = 6;
    let rounds: usize = std::env::var("REXT4_CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
    let dir = tmpdir();
    let image = make_image(dir.path(), &["-J", "size=1"]);
    let dev = Arc::new(CrashDevice::new(image));
    let (model, stats) = concurrent_workload(dev.clone(), &dev, rounds, seed);
    assert!(stats.checkpoints >= 4, "too few checkpoints: {stats:?}");
    check_crashes(name, dir.path(), &dev, &model, seed, check_model, 100);
    // The crash points include logs whose tail is not at the log's start.
    let ops = dev.ops();
    let mut starts = Vec::new();
    let img = dir.path().join("jsb.img");
    let flushes = common::flush_count(&ops);
    common::for_each_crash_image(&ops, dev.initial(), 0, flushes.div_ceil(40).max(1), |_, bytes| {
        std::fs::write(&img, bytes).unwrap();
        let out = Command::new("dumpe2fs").arg("-h").arg(&img).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let start = text
            .lines()
            .find_map(|l| l.strip_prefix("Journal start:"))
            .and_then(|v| v.trim().parse::<u32>().ok())
            .unwrap_or(0);
        starts.push(start);
    });
    assert!(
        starts.iter().any(|&s| s > 512),
        "no crash image with the tail in the log's second half: {starts:?}"
    );
}

/// The same load with a checkpoint thread too slow to keep up: commits find the log full and
/// wait for it or checkpoint themselves. Crashes anywhere still recover.
#[test]
fn crash_log_full_commits_wait_for_checkpoints() {
    let name = "full";
    let seed = 7;
    let rounds: usize = std::env::var("REXT4_CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
    let dir = tmpdir();
    let image = make_image(dir.path(), &["-J", "size=1"]);
    let dev = Arc::new(CrashDevice::new(image));
    // Home writes from the checkpoint thread take a while: the log fills up faster than the
    // checkpoint thread frees it.
    let slow = Arc::new(common::HookedDevice::new(dev.clone()).on_write(|_, _| {
        if std::thread::current().name() == Some("rext4-checkpoint") {
            std::thread::sleep(Duration::from_millis(15));
        }
    }));
    let (model, stats) = concurrent_workload(slow, &dev, rounds, seed);
    assert!(stats.log_full_waits > 0, "the log never filled up: {stats:?}");
    check_crashes(name, dir.path(), &dev, &model, seed, check_model, 60);
}

/// Watches a device for `freed_metadata_reused_as_data_during_checkpoints`: holds the
/// checkpoint's home writes of the test's directory blocks (those holding its long names) in
/// flight for a while and tells the test when one begins, so that the test frees and reuses
/// the blocks meanwhile. It also counts user writes over blocks the checkpoint wrote before.
struct CheckpointWatch {
    block_size: u64,
    /// Home writes of the watched blocks begun so far. [own lock, with `begun_cv`]
    begun: std::sync::Mutex<u64>,
    begun_cv: std::sync::Condvar,
    /// Blocks the checkpoint thread wrote. [own lock]
    home: std::sync::Mutex<std::collections::HashSet<u64>>,
    /// User writes over blocks in `home`. [atomic]
    reused: AtomicU64,
}

impl CheckpointWatch {
    /// Waits (up to `limit`) for a watched home write to begin after `seen` had; returns the
    /// new count.
    fn wait_begun(&self, seen: u64, limit: Duration) -> u64 {
        let g = self.begun.lock().unwrap();
        let (g, _) = self.begun_cv.wait_timeout_while(g, limit, |n| *n == seen).unwrap();
        *g
    }

    /// The device's write hook.
    fn write(&self, buf: &[u8], offset: u64) {
        let first = offset / self.block_size;
        let blocks = first..first + (buf.len() as u64).div_ceil(self.block_size);
        match std::thread::current().name() {
            Some("rext4-checkpoint") => {
                if buf.windows(LONG_NAME_RUN).any(|w| w.iter().all(|&c| c == b'x')) {
                    *self.begun.lock().unwrap() += 1;
                    self.begun_cv.notify_all();
                    std::thread::sleep(Duration::from_millis(30));
                }
                self.home.lock().unwrap().extend(blocks);
            }
            Some("rext4-commit") => {}
            _ => {
                let home = self.home.lock().unwrap();
                let n = blocks.filter(|b| home.contains(b)).count() as u64;
                self.reused.fetch_add(n, Ordering::Relaxed);
            }
        }
    }
}

/// Bytes of `x` in a row that only the test's directory names hold.
const LONG_NAME_RUN: usize = 48;

fn reuse_pattern(round: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (round as u8).wrapping_mul(37) ^ (i / 1024) as u8 ^ 0x5A).collect()
}

/// Metadata blocks (directory blocks, extent tree leaves) are freed and reused as file data
/// while checkpoints write home beside the commits, slowly: no stale metadata copy may land
/// on the data. The contents are compared while running, after a remount and as the kernel
/// sees them, and e2fsck finds the image clean.
#[test]
fn freed_metadata_reused_as_data_during_checkpoints() {
    let dir = tmpdir();
    let img = dir.path().join("reuse.img");
    common::mkfs(None, &img, &["-b", "1024", "-J", "size=1", "-E", "root_owner=0:0"], "8M");
    let watch = Arc::new(CheckpointWatch {
        block_size: 1024,
        begun: std::sync::Mutex::new(0),
        begun_cv: std::sync::Condvar::new(),
        home: std::sync::Mutex::new(std::collections::HashSet::new()),
        reused: AtomicU64::new(0),
    });
    let mem = Arc::new(rext4::dev::MemDevice::new(std::fs::read(&img).unwrap()));
    let dev = Arc::new(common::HookedDevice::new(mem.clone()).on_write({
        let watch = watch.clone();
        move |buf, offset| watch.write(buf, offset)
    }));
    let opts = Options { writable: true, commit_interval: Duration::from_millis(2), ..Options::default() };
    let fs = Fs::from_device(dev.clone(), opts).unwrap();
    let root = fs.root();
    // Leave a small pool of free blocks, so that what is freed is soon allocated again.
    let filler = fs.create(root, b"filler", 0o644, 0, 0).unwrap().ino;
    let free = fs.statfs().unwrap().blocks_avail;
    let fill = free.saturating_sub(360) * 1024;
    let chunk = vec![0xEEu8; 64 << 10];
    let mut at = 0u64;
    while at < fill {
        let n = chunk.len().min((fill - at) as usize);
        fs.write(filler, at, &chunk[..n]).unwrap();
        at += n as u64;
    }
    let loaded: Vec<_> =
        (0..400).map(|i| fs.create(root, format!("l{i}").as_bytes(), 0o644, 0, 0).unwrap().ino).collect();
    fs.sync().unwrap();
    let mut raced = 0;

    const ROUNDS: usize = 40;
    const DATA: usize = 48 * 1024;
    let stop = AtomicBool::new(false);
    /// Stops the load thread also when a check fails (or the scope would wait for it forever).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        // Attribute changes keep commits coming and the log filling, so checkpoints run.
        s.spawn(|| {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                for &ino in &loaded {
                    n += 1;
                    fs.setattr(ino, &SetAttr { uid: Some(n), ..SetAttr::default() }).unwrap();
                }
                if n.is_multiple_of(2000) {
                    fs.fsync(loaded[0]).unwrap();
                }
            }
        });
        let _stop = Stop(&stop);
        for r in 0..ROUNDS {
            // Metadata: a directory of long names (several directory blocks) and a file of
            // many extents (an extent tree leaf), committed.
            let m = fs.mkdir(root, b"m", 0o755, 0, 0).unwrap().ino;
            for i in 0..20 {
                let name = format!("{i:02}{}", "x".repeat(200));
                fs.create(m, name.as_bytes(), 0o644, 0, 0).unwrap();
            }
            let frag = fs.create(m, b"frag", 0o644, 0, 0).unwrap().ino;
            for k in 0..24u64 {
                fs.write(frag, k * 2048, &[0xF0; 1024]).unwrap();
            }
            let seen = *watch.begun.lock().unwrap();
            fs.fsync(frag).unwrap();
            // Commits and checkpoints go on; once a checkpoint is writing one of these blocks
            // home, free them all and reuse them.
            if watch.wait_begun(seen, Duration::from_secs(2)) > seen {
                raced += 1;
            }
            common::unlink_all(&fs, m);
            fs.rmdir(root, b"m").unwrap();
            // Data, written straight home in small pieces, on the blocks just freed (once the
            // freeing transaction has committed).
            fs.sync().unwrap();
            let d = fs.create(root, format!("d{r}").as_bytes(), 0o644, 0, 0).unwrap().ino;
            for (k, piece) in reuse_pattern(r, DATA).chunks(4096).enumerate() {
                fs.write(d, k as u64 * 4096, piece).unwrap();
            }
            if r >= 2 {
                let old = format!("/d{}", r - 2);
                assert_eq!(fs.read_file(&old).unwrap(), reuse_pattern(r - 2, DATA), "{old} while running");
                fs.unlink(root, &old.as_bytes()[1..]).unwrap();
            }
        }
    });
    let stats = fs.commit_stats().unwrap();
    eprintln!(
        "reuse: {} commits, {} checkpoints ({} blocks home), {} log-full waits, {raced} rounds raced a \
         checkpoint, {} block writes over checkpointed blocks",
        stats.commits,
        stats.checkpoints,
        stats.checkpoint_blocks,
        stats.log_full_waits,
        watch.reused.load(Ordering::Relaxed)
    );
    assert!(raced >= ROUNDS / 2, "only {raced} rounds freed blocks during a checkpoint");
    assert!(watch.reused.load(Ordering::Relaxed) > 0, "no checkpointed block was reused");
    fs.unmount().unwrap();
    std::fs::write(&img, mem.snapshot()).unwrap();
    assert_clean(&img, "after the reuse rounds");
    let fs = Fs::open(&img).unwrap();
    let kernel = if common::is_root() { common::KernelMount::ro(&img).ok() } else { None };
    for r in ROUNDS - 2..ROUNDS {
        let want = reuse_pattern(r, DATA);
        assert_eq!(fs.read_file(format!("/d{r}")).unwrap(), want, "d{r} after remount");
        if let Some(k) = &kernel {
            assert_eq!(
                std::fs::read(k.path().join(format!("d{r}"))).unwrap(),
                want,
                "d{r} seen by the kernel"
            );
        }
    }
}
