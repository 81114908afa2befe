//! `rext4 bench mdtest`: seed 000's workload. N workers, each in its own directory, create F
//! empty files, stat them, remove them; operations per second per phase, rext4 in process
//! against kernel ext4 on a loop image in tmpfs, same run.

use crate::bench::KernelMount;
use crate::CliResult;
use rext4::{Fs, InodeNo, Options};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn work_dir() -> PathBuf {
    let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    base.join(format!("rext4-bench-mdtest-{}", std::process::id()))
}

fn mkfs(img: &Path) -> CliResult {
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-N", "400000"])
        .arg(img)
        .arg("1G")
        .output()
        .map_err(|e| format!("mkfs.ext4: {e}"))?;
    if !out.status.success() {
        return Err(format!("mkfs.ext4: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

/// Ops/s of (create, stat, remove) for `workers` workers and `files` files each.
type Rates = (f64, f64, f64);

fn phase(workers: usize, files: usize, f: impl Fn(usize, usize) -> CliResult + Sync) -> CliResult<f64> {
    let t = Instant::now();
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> =
            (0..workers).map(|w| s.spawn(move || (0..files).try_for_each(|i| f(w, i)))).collect();
        hs.into_iter().try_for_each(|h| h.join().map_err(|_| "worker panicked".to_string())?)
    })?;
    Ok((workers * files) as f64 / t.elapsed().as_secs_f64())
}

fn run_rext4(img: &Path, workers: usize, files: usize) -> CliResult<Rates> {
    let fs =
        Fs::open_with(img, Options { writable: true, ..Options::default() }).map_err(|e| e.to_string())?;
    let root = fs.root();
    let dirs: Vec<InodeNo> = (0..workers)
        .map(|w| {
            fs.mkdir(root, format!("w{w}").as_bytes(), 0o755, 0, 0).map(|a| a.ino).map_err(|e| e.to_string())
        })
        .collect::<CliResult<_>>()?;
    let name = |i: usize| format!("file.mdtest.{i}");
    let e = |e: rext4::Error| e.to_string();
    let c = phase(workers, files, |w, i| {
        fs.create(dirs[w], name(i).as_bytes(), 0o644, 0, 0).map(|_| ()).map_err(e)
    })?;
    let s = phase(workers, files, |w, i| fs.lookup(dirs[w], name(i).as_bytes()).map(|_| ()).map_err(e))?;
    let r = phase(workers, files, |w, i| fs.unlink(dirs[w], name(i).as_bytes()).map_err(e))?;
    for w in 0..workers {
        fs.rmdir(root, format!("w{w}").as_bytes()).map_err(e)?;
    }
    fs.unmount().map_err(e)?;
    Ok((c, s, r))
}

pub(crate) fn run_kernel(root: &Path, workers: usize, files: usize) -> CliResult<Rates> {
    let dirs: Vec<PathBuf> = (0..workers).map(|w| root.join(format!("w{w}"))).collect();
    for d in &dirs {
        std::fs::create_dir(d).map_err(|e| e.to_string())?;
    }
    let p = |w: usize, i: usize| dirs[w].join(format!("file.mdtest.{i}"));
    let e = |e: std::io::Error| e.to_string();
    let c = phase(workers, files, |w, i| {
        std::fs::OpenOptions::new().write(true).create_new(true).open(p(w, i)).map(|_| ()).map_err(e)
    })?;
    let s = phase(workers, files, |w, i| std::fs::symlink_metadata(p(w, i)).map(|_| ()).map_err(e))?;
    let r = phase(workers, files, |w, i| std::fs::remove_file(p(w, i)).map_err(e))?;
    for d in &dirs {
        std::fs::remove_dir(d).map_err(|e| e.to_string())?;
    }
    Ok((c, s, r))
}

pub fn run(workers: &[usize], files: usize) -> CliResult {
    let dir = work_dir();
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let r = run_in(&dir, workers, files);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn run_in(dir: &Path, workers: &[usize], files: usize) -> CliResult {
    let img = dir.join("rext4.img");
    mkfs(&img)?;
    let kimg = dir.join("kernel.img");
    mkfs(&kimg)?;
    let kernel = KernelMount::new_rw(&kimg, &dir.join("mnt"));
    if let Err(why) = &kernel {
        println!("kernel target skipped: {why}");
    }
    println!(
        "mdtest: each worker creates, stats and removes {files} empty files in its own directory (ops/s)"
    );
    println!(
        "{:>7} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}   rext4/kernel c/s/r",
        "workers", "create", "k-create", "stat", "k-stat", "remove", "k-remove"
    );
    for &w in workers {
        let (c, s, r) = run_rext4(&img, w, files)?;
        let k = match &kernel {
            Ok(m) => Some(run_kernel(&m.dir, w, files)?),
            Err(_) => None,
        };
        let (kc, ks, kr) = k.unwrap_or((f64::NAN, f64::NAN, f64::NAN));
        println!(
            "{w:>7} {c:>12.0} {kc:>12.0} {s:>12.0} {ks:>12.0} {r:>12.0} {kr:>12.0}   {:.2}/{:.2}/{:.2}",
            c / kc,
            s / ks,
            r / kr
        );
    }
    Ok(())
}
