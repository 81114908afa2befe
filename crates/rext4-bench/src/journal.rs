//! `rext4-bench journal`: tiny metadata transactions (chmod of a file, one handle each) from
//! 1..N threads, on a journaled image and on the same image without a journal; then fsync
//! latency of one thread while the others keep changing metadata, against the kernel doing the
//! same on a loop mount of the same kind of image.

use super::targets::KernelMount;
use crate::CliResult;
use rext4::{Fs, InodeNo, Options, SetAttr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const FILES: usize = 4096;

fn make_image(dir: &Path, name: &str, extra: &[&str]) -> CliResult<PathBuf> {
    let src = dir.join("src");
    if !src.exists() {
        std::fs::create_dir_all(&src).map_err(|e| e.to_string())?;
        for i in 0..FILES {
            std::fs::write(src.join(format!("f{i}")), b"").map_err(|e| e.to_string())?;
        }
    }
    let img = dir.join(format!("{name}.img"));
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .args(extra)
        .arg("-d")
        .arg(&src)
        .arg(&img)
        .arg("256M")
        .output()
        .map_err(|e| format!("mkfs.ext4: {e}"))?;
    if !out.status.success() {
        return Err(format!("mkfs.ext4: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(img)
}

fn open_rw(img: &Path) -> CliResult<Fs> {
    Fs::open_with(img, Options { writable: true, ..Options::default() }).map_err(|e| e.to_string())
}

/// Runs `threads` workers for `dur`, each chmod-ing its own files; returns ops/s.
fn chmod_rate(fs: &Fs, inos: &[InodeNo], threads: usize, dur: Duration) -> f64 {
    let stop = AtomicBool::new(false);
    let total: u64 = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (fs, stop) = (fs.clone(), &stop);
                s.spawn(move || {
                    let mut n = 0u64;
                    // Each worker its own run of inodes, as files created in one directory get.
                    let per = inos.len().div_ceil(threads);
                    let mine: Vec<InodeNo> = inos.iter().copied().skip(t * per).take(per).collect();
                    while !stop.load(Ordering::Relaxed) {
                        for &ino in &mine {
                            let m = 0o600 | (n as u16 & 0o77);
                            if fs.setattr(ino, &SetAttr { mode: Some(m), ..SetAttr::default() }).is_err() {
                                return n;
                            }
                            n += 1;
                            if n.is_multiple_of(64) && stop.load(Ordering::Relaxed) {
                                break;
                            }
                        }
                    }
                    n
                })
            })
            .collect();
        std::thread::sleep(dur);
        stop.store(true, Ordering::Relaxed);
        workers.into_iter().map(|w| w.join().unwrap_or(0)).sum()
    });
    total as f64 / dur.as_secs_f64()
}

fn inodes(fs: &Fs) -> CliResult<Vec<InodeNo>> {
    (0..FILES).map(|i| fs.resolve(format!("/f{i}"), false).map_err(|e| e.to_string())).collect()
}

/// Latency figures in microseconds.
struct Lat {
    mean: f64,
    p99: u64,
    max: u64,
    n: usize,
    /// chmods per second of the load threads meanwhile.
    load: f64,
}

fn lat(mut v: Vec<u64>, load_ops: u64, dur: Duration) -> Lat {
    v.sort_unstable();
    let n = v.len().max(1);
    Lat {
        load: load_ops as f64 / dur.as_secs_f64(),
        mean: v.iter().sum::<u64>() as f64 / n as f64,
        p99: v.get((v.len() * 99 / 100).min(v.len().saturating_sub(1))).copied().unwrap_or(0),
        max: v.last().copied().unwrap_or(0),
        n: v.len(),
    }
}

/// One thread chmod+fsync in a loop while `load` threads chmod other files.
/// One thread chmod+fsync in a loop while `load` threads chmod other files, as fast as they
/// can or, with `pace`, at that many chmods per second in all (no faster: a thread ahead of
/// its share sleeps).
fn fsync_latency_rext4(fs: &Fs, inos: &[InodeNo], load: usize, dur: Duration, pace: Option<f64>) -> Lat {
    let stop = AtomicBool::new(false);
    let ops = AtomicU64::new(0);
    let began = Instant::now();
    let v = std::thread::scope(|s| {
        for t in 0..load {
            let (fs, stop, ops) = (fs.clone(), &stop, &ops);
            s.spawn(move || {
                let mut n = 0u16;
                let mut done = 0u64;
                let per = (inos.len() - 1) / load;
                while !stop.load(Ordering::Relaxed) {
                    for &ino in inos.iter().skip(1 + t * per).take(per) {
                        n = n.wrapping_add(1);
                        let _ = fs
                            .setattr(ino, &SetAttr { mode: Some(0o600 | (n & 0o77)), ..SetAttr::default() });
                        done += 1;
                        if let Some(rate) = pace.filter(|_| done.is_multiple_of(16)) {
                            let due = Duration::from_secs_f64(done as f64 * load as f64 / rate);
                            if let Some(ahead) = due.checked_sub(began.elapsed()) {
                                std::thread::sleep(ahead);
                            }
                        }
                    }
                }
                ops.fetch_add(done, Ordering::Relaxed);
            });
        }
        let mut v = Vec::new();
        let end = Instant::now() + dur;
        let mut n = 0u16;
        while Instant::now() < end {
            n = n.wrapping_add(1);
            let t = Instant::now();
            if fs.setattr(inos[0], &SetAttr { mode: Some(0o600 | (n & 0o77)), ..SetAttr::default() }).is_err()
                || fs.fsync(inos[0]).is_err()
            {
                break;
            }
            v.push(t.elapsed().as_micros() as u64);
        }
        stop.store(true, Ordering::Relaxed);
        v
    });
    lat(v, ops.load(Ordering::Relaxed), dur)
}

fn print_lat(target: &str, l: Option<&Lat>) {
    if let Some(l) = l {
        println!("{target:<28} {:>8} {:>10.0} {:>10} {:>10} {:>12.0}", l.n, l.mean, l.p99, l.max, l.load);
    }
}

/// The median of each figure over runs, taken separately.
fn median_lat(v: &[Lat]) -> Option<Lat> {
    fn med<T: Copy + PartialOrd>(mut x: Vec<T>) -> T {
        x.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        x[x.len() / 2]
    }
    if v.is_empty() {
        return None;
    }
    Some(Lat {
        n: med(v.iter().map(|l| l.n).collect()),
        mean: med(v.iter().map(|l| l.mean).collect()),
        p99: med(v.iter().map(|l| l.p99).collect()),
        max: med(v.iter().map(|l| l.max).collect()),
        load: med(v.iter().map(|l| l.load).collect()),
    })
}

fn fsync_latency_kernel(root: &Path, load: usize, dur: Duration) -> CliResult<Lat> {
    let stop = AtomicBool::new(false);
    let ops = AtomicU64::new(0);
    let paths: Vec<PathBuf> = (0..FILES).map(|i| root.join(format!("f{i}"))).collect();
    std::thread::scope(|s| {
        for t in 0..load {
            let (paths, stop, ops) = (&paths, &stop, &ops);
            s.spawn(move || {
                let mut n = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let per = (paths.len() - 1) / load;
                    for p in paths.iter().skip(1 + t * per).take(per) {
                        n = n.wrapping_add(1);
                        let _ =
                            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600 | (n & 0o77)));
                    }
                    ops.fetch_add(per as u64, Ordering::Relaxed);
                }
            });
        }
        let mut v = Vec::new();
        let end = Instant::now() + dur;
        let mut n = 0u32;
        let f = std::fs::File::open(&paths[0]).map_err(|e| e.to_string())?;
        while Instant::now() < end {
            n = n.wrapping_add(1);
            let t = Instant::now();
            f.set_permissions(std::fs::Permissions::from_mode(0o600 | (n & 0o77)))
                .map_err(|e| e.to_string())?;
            f.sync_all().map_err(|e| e.to_string())?;
            v.push(t.elapsed().as_micros() as u64);
        }
        stop.store(true, Ordering::Relaxed);
        Ok(lat(v, ops.load(Ordering::Relaxed), dur))
    })
}

pub(crate) fn run(threads: &[usize], secs: f64, runs: usize) -> CliResult {
    let dir = super::work_dir("journal");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let r = run_in(&dir, threads, Duration::from_secs_f64(secs), runs);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn run_in(dir: &Path, threads: &[usize], dur: Duration, runs: usize) -> CliResult {
    let journaled = make_image(dir, "journal", &[])?;
    let plain = make_image(dir, "nojournal", &["-O", "^has_journal"])?;

    println!("chmod (one handle each), {:.1} s per cell, ops/s", dur.as_secs_f64());
    println!(
        "{:>8} {:>14} {:>10} {:>14} {:>12} {:>14}",
        "threads", "journaled", "commits/s", "no journal", "ratio", "vs 1 thread"
    );
    let mut base = None;
    for &t in threads {
        let fs = open_rw(&journaled)?;
        let inos = inodes(&fs)?;
        let before = fs.commit_stats().map(|s| s.commits).unwrap_or(0);
        let rate_j = chmod_rate(&fs, &inos, t, dur);
        let commits = fs.commit_stats().map(|s| s.commits).unwrap_or(0) - before;
        fs.unmount().map_err(|e| e.to_string())?;
        let fs = open_rw(&plain)?;
        let inos = inodes(&fs)?;
        let rate_p = chmod_rate(&fs, &inos, t, dur);
        fs.unmount().map_err(|e| e.to_string())?;
        let b = *base.get_or_insert(rate_j);
        println!(
            "{t:>8} {rate_j:>14.0} {:>10.1} {rate_p:>14.0} {:>11.2}x {:>13.2}x",
            commits as f64 / dur.as_secs_f64(),
            rate_j / rate_p,
            rate_j / b
        );
    }

    let load = 4;
    println!(
        "\nfsync latency (chmod + fsync in a loop) with {load} threads of chmod load, microseconds; \
         the targets take turns, {runs} run(s) each"
    );
    println!(
        "{:<28} {:>8} {:>10} {:>10} {:>10} {:>12}",
        "target", "fsyncs", "mean", "p99", "max", "load chmod/s"
    );
    let kimg = make_image(dir, "kernel", &[])?;
    let kmount = KernelMount::new_rw(&kimg, &dir.join("mnt"));
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let mut commits = Vec::new();
    let mut paced = Vec::new();
    for _ in 0..runs {
        if let Ok(m) = &kmount {
            theirs.push(fsync_latency_kernel(&m.dir, load, dur)?);
            print_lat("kernel ext4 (loop on tmpfs)", theirs.last());
        }
        // Free-running, then with the load paced at the rate the kernel's load reached, so
        // that both fsync under the same metadata load.
        let pace = theirs.last().map(|k| k.load);
        for p in [None, pace] {
            if p.is_some_and(|r| r <= 0.0) {
                continue;
            }
            let fs = open_rw(&journaled)?;
            let inos = inodes(&fs)?;
            let l = fsync_latency_rext4(&fs, &inos, load, dur, p);
            commits.push(fs.commit_stats().map(|s| s.summary()).unwrap_or_default());
            fs.unmount().map_err(|e| e.to_string())?;
            match p {
                None => {
                    print_lat("rext4 in process", Some(&l));
                    ours.push(l);
                }
                Some(_) => {
                    print_lat("rext4, load paced to kernel's", Some(&l));
                    paced.push(l);
                }
            }
        }
    }
    if let Err(why) = &kmount {
        println!("kernel target skipped: {why}");
    }
    if runs > 1 {
        print_lat("rext4 in process, median", median_lat(&ours).as_ref());
        print_lat("rext4 paced, median", median_lat(&paced).as_ref());
        print_lat("kernel ext4, median", median_lat(&theirs).as_ref());
    }
    for c in commits {
        println!(
            "rext4 commits during an fsync run: {} (mean {:.0} us, stddev {:.0} us, max {} us, top 5 {:?})",
            c.commits, c.mean_us, c.stddev_us, c.max_us, c.top5_us
        );
    }
    Ok(())
}
