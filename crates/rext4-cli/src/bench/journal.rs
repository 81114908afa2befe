//! `rext4 bench journal`: tiny metadata transactions (chmod of a file, one handle each) from
//! 1..N threads, on a journaled image and on the same image without a journal; then fsync
//! latency of one thread while the others keep changing metadata, against the kernel doing the
//! same on a loop mount of the same kind of image.

use super::targets::KernelMount;
use crate::CliResult;
use rext4::{Fs, InodeNo, Options, SetAttr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
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
                            if n % 64 == 0 && stop.load(Ordering::Relaxed) {
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
}

fn lat(mut v: Vec<u64>) -> Lat {
    v.sort_unstable();
    let n = v.len().max(1);
    Lat {
        mean: v.iter().sum::<u64>() as f64 / n as f64,
        p99: v.get((v.len() * 99 / 100).min(v.len().saturating_sub(1))).copied().unwrap_or(0),
        max: v.last().copied().unwrap_or(0),
        n: v.len(),
    }
}

/// One thread chmod+fsync in a loop while `load` threads chmod other files.
fn fsync_latency_rext4(fs: &Fs, inos: &[InodeNo], load: usize, dur: Duration) -> Lat {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..load {
            let (fs, stop) = (fs.clone(), &stop);
            s.spawn(move || {
                let mut n = 0u16;
                while !stop.load(Ordering::Relaxed) {
                    let per = (inos.len() - 1) / load;
                    for &ino in inos.iter().skip(1 + t * per).take(per) {
                        n = n.wrapping_add(1);
                        let _ = fs
                            .setattr(ino, &SetAttr { mode: Some(0o600 | (n & 0o77)), ..SetAttr::default() });
                    }
                }
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
        lat(v)
    })
}

fn fsync_latency_kernel(root: &Path, load: usize, dur: Duration) -> CliResult<Lat> {
    let stop = AtomicBool::new(false);
    let paths: Vec<PathBuf> = (0..FILES).map(|i| root.join(format!("f{i}"))).collect();
    std::thread::scope(|s| {
        for t in 0..load {
            let (paths, stop) = (&paths, &stop);
            s.spawn(move || {
                let mut n = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let per = (paths.len() - 1) / load;
                    for p in paths.iter().skip(1 + t * per).take(per) {
                        n = n.wrapping_add(1);
                        let _ =
                            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600 | (n & 0o77)));
                    }
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
        Ok(lat(v))
    })
}

pub fn run(threads: &[usize], secs: f64) -> CliResult {
    let dir = super::work_dir("journal");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let r = run_in(&dir, threads, Duration::from_secs_f64(secs));
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn run_in(dir: &Path, threads: &[usize], dur: Duration) -> CliResult {
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
    println!("\nfsync latency (chmod + fsync in a loop) with {load} threads of chmod load, microseconds");
    println!("{:<28} {:>8} {:>10} {:>10} {:>10}", "target", "fsyncs", "mean", "p99", "max");
    let fs = open_rw(&journaled)?;
    let inos = inodes(&fs)?;
    let l = fsync_latency_rext4(&fs, &inos, load, dur);
    let commit = fs.commit_stats().map(|s| s.summary()).unwrap_or_default();
    fs.unmount().map_err(|e| e.to_string())?;
    println!("{:<28} {:>8} {:>10.0} {:>10} {:>10}", "rext4 in process", l.n, l.mean, l.p99, l.max);
    let kimg = make_image(dir, "kernel", &[])?;
    match KernelMount::new_rw(&kimg, &dir.join("mnt")) {
        Ok(m) => {
            let k = fsync_latency_kernel(&m.dir, load, dur)?;
            println!(
                "{:<28} {:>8} {:>10.0} {:>10} {:>10}",
                "kernel ext4 (loop on tmpfs)", k.n, k.mean, k.p99, k.max
            );
        }
        Err(why) => println!("kernel target skipped: {why}"),
    }
    println!(
        "\nrext4 commits during the fsync run: {} (mean {:.0} us, stddev {:.0} us, max {} us, top 5 {:?})",
        commit.commits, commit.mean_us, commit.stddev_us, commit.max_us, commit.top5_us
    );
    Ok(())
}
