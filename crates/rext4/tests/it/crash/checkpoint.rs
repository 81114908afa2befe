//! A small log wrapping under concurrent load, commits waiting for checkpoints, and freed
//! metadata reused as data while checkpoints write home.

use super::metadata::{check_model, Model};
use super::*;
use rext4::SetAttr;
use rext4_testkit::{kernel_can_mount, unlink_all, HookedDevice, KernelMount};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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
    let inos = file_inos(&fs, FILES);
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
                            unlink_all(&fs, pd);
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
    let flushes = flush_count(&ops);
    for_each_crash_image(&ops, dev.initial(), 0, flushes.div_ceil(40).max(1), |_, bytes| {
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
    let slow = Arc::new(HookedDevice::new(dev.clone()).on_write(|_, _| {
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
    Image::ext4("8M").block_size(1024).journal("size=1").extended("root_owner=0:0").build(&img);
    let watch = Arc::new(CheckpointWatch {
        block_size: 1024,
        begun: std::sync::Mutex::new(0),
        begun_cv: std::sync::Condvar::new(),
        home: std::sync::Mutex::new(std::collections::HashSet::new()),
        reused: AtomicU64::new(0),
    });
    let mem = Arc::new(rext4::dev::MemDevice::new(std::fs::read(&img).unwrap()));
    let dev = Arc::new(HookedDevice::new(mem.clone()).on_write({
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
            unlink_all(&fs, m);
            fs.rmdir(root, b"m").unwrap();
            // Data, written straight home in small pieces, on the blocks just freed (once the
            // freeing transaction has committed).
            fs.sync().unwrap();
            let d = fs.create(root, format!("d{r}").as_bytes(), 0o644, 0, 0).unwrap().ino;
            for (k, piece) in reuse_pattern(r, DATA).chunks(4096).enumerate() {
                fs.write(d, k as u64 * 4096, piece).unwrap();
            }
            // Delayed writes reach their blocks now, not after the file is gone.
            fs.fsync(d).unwrap();
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
    let kernel = if kernel_can_mount() { KernelMount::ro(&img).ok() } else { None };
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
