//! `rext4-bench orphan`: seed 001's stress-orphan, in the shape of reaim's `creat_clo`. N
//! workers, each in its own directory, loop over create, hold (open), unlink (the inode
//! becomes an orphan), release (close: the orphan is freed). Orphans recorded in the orphan
//! file (lock-free slots) against the superblock list (one lock), and against no orphan at all
//! (unlink before anything holds the inode); the kernel runs the same loop on a loop mount
//! (open(O_CREAT), unlink, close) with and without the orphan file.

use super::targets::KernelMount;
use crate::CliResult;
use rext4::{Fs, InodeNo, Options};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn mkfs(img: &Path, features: &str) -> CliResult {
    let spec = super::targets::ImageSpec {
        inodes: 200_000,
        mib: 1024,
        extra: vec!["-O".into(), features.into()],
        ..Default::default()
    };
    super::targets::mkfs(img, &spec)
}

/// Runs `op(worker, i)` in a loop on `workers` threads for `secs`; returns loops per second.
fn timed(workers: usize, secs: f64, op: impl Fn(usize, u64) -> CliResult + Sync) -> CliResult<f64> {
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let t = Instant::now();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..workers)
            .map(|w| {
                let (stop, done, op) = (&stop, &done, &op);
                s.spawn(move || -> CliResult {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        op(w, i)?;
                        i += 1;
                    }
                    done.fetch_add(i, Ordering::Relaxed);
                    Ok(())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        hs.into_iter().try_for_each(|h| h.join().map_err(|_| "worker panicked".to_string())?)
    })?;
    Ok(done.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64())
}

/// rext4 in process; `hold`: whether the file is held across its unlink (an orphan).
fn run_rext4(img: &Path, workers: usize, secs: f64, hold: bool) -> CliResult<f64> {
    let e = |e: rext4::Error| e.to_string();
    let fs = Fs::open_with(img, Options { writable: true, ..Options::default() }).map_err(e)?;
    let root = fs.root();
    let dirs: Vec<InodeNo> = (0..workers)
        .map(|w| fs.mkdir(root, format!("w{w}").as_bytes(), 0o755, 0, 0).map(|a| a.ino).map_err(e))
        .collect::<CliResult<_>>()?;
    let rate = timed(workers, secs, |w, i| {
        let name = format!("f{i}");
        let ino = fs.create(dirs[w], name.as_bytes(), 0o644, 0, 0).map_err(e)?.ino;
        if hold {
            fs.hold(ino).map_err(e)?;
        }
        fs.unlink(dirs[w], name.as_bytes()).map_err(e)?;
        if hold {
            fs.release(ino).map_err(e)?;
        }
        Ok(())
    })?;
    for w in 0..workers {
        fs.rmdir(root, format!("w{w}").as_bytes()).map_err(e)?;
    }
    fs.unmount().map_err(e)?;
    Ok(rate)
}

/// The kernel: open(O_CREAT), unlink, close.
fn run_kernel(root: &Path, workers: usize, secs: f64) -> CliResult<f64> {
    let dirs: Vec<PathBuf> = (0..workers).map(|w| root.join(format!("w{w}"))).collect();
    for d in &dirs {
        std::fs::create_dir(d).map_err(|e| e.to_string())?;
    }
    let e = |e: std::io::Error| e.to_string();
    let rate = timed(workers, secs, |w, i| {
        let p = dirs[w].join(format!("f{i}"));
        let f = std::fs::OpenOptions::new().write(true).create_new(true).open(&p).map_err(e)?;
        std::fs::remove_file(&p).map_err(e)?;
        drop(f);
        Ok(())
    })?;
    for d in &dirs {
        std::fs::remove_dir(d).map_err(|e| e.to_string())?;
    }
    Ok(rate)
}

pub(crate) fn run(workers: &[usize], secs: f64) -> CliResult {
    let dir = super::work_dir("orphan");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let r = run_in(&dir, workers, secs);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn run_in(dir: &Path, workers: &[usize], secs: f64) -> CliResult {
    let file_img = dir.join("orphan-file.img");
    mkfs(&file_img, "orphan_file")?;
    let list_img = dir.join("list.img");
    mkfs(&list_img, "^orphan_file")?;
    let kfile = dir.join("k-orphan-file.img");
    mkfs(&kfile, "orphan_file")?;
    let klist = dir.join("k-list.img");
    mkfs(&klist, "^orphan_file")?;
    let km_file = KernelMount::new_rw(&kfile, &dir.join("mnt-file"));
    let km_list = KernelMount::new_rw(&klist, &dir.join("mnt-list"));
    if let Err(why) = &km_file {
        println!("kernel targets skipped: {why}");
    }
    println!("stress-orphan: each worker loops create, hold, unlink, release in its own directory ({secs} s per cell)");
    println!(
        "loops/s; rext4: orphan file (lock-free), superblock list (one lock), no orphan (unlinked unheld)"
    );
    println!(
        "{:>7} {:>12} {:>12} {:>12} {:>12} {:>12}   file/list  file/none  file/k-file",
        "workers", "file", "list", "none", "k-file", "k-list"
    );
    for &w in workers {
        let file = run_rext4(&file_img, w, secs, true)?;
        let list = run_rext4(&list_img, w, secs, true)?;
        let none = run_rext4(&file_img, w, secs, false)?;
        let kf = match &km_file {
            Ok(m) => run_kernel(&m.dir, w, secs)?,
            Err(_) => f64::NAN,
        };
        let kl = match &km_list {
            Ok(m) => run_kernel(&m.dir, w, secs)?,
            Err(_) => f64::NAN,
        };
        println!(
            "{w:>7} {file:>12.0} {list:>12.0} {none:>12.0} {kf:>12.0} {kl:>12.0}   {:>9.2} {:>10.2} {:>11.2}",
            file / list,
            file / none,
            file / kf
        );
    }
    Ok(())
}
