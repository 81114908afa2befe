//! `rext4-bench walk`: readdir + stat of every inode of a large image, warm cache, rext4 in
//! process against the same image mounted read-only by the kernel.

use super::targets::KernelMount;
use crate::CliResult;
use rext4::{FileType, Fs};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// `rext4-bench walk`.
pub(crate) fn run(image: Option<PathBuf>, files: usize, rounds: usize) -> CliResult {
    let work = super::work_dir("walk");
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let r = walk_in(&work, image, files, rounds.max(1));
    let _ = std::fs::remove_dir_all(&work);
    r
}

fn walk_in(work: &Path, image: Option<PathBuf>, files: usize, rounds: usize) -> CliResult {
    let image = match image {
        Some(i) => i,
        None => {
            let src = work.join("src");
            eprintln!("building a tree of {files} files ...");
            make_tree(&src, files)?;
            let img = work.join("walk.img");
            let size_mb = (files as u64 * 6 / 1024 + 64).max(64);
            let out = Command::new("mkfs.ext4")
                .args(["-q", "-F", "-N"])
                .arg((files + files / 50 + 1024).to_string())
                .arg("-d")
                .arg(&src)
                .arg(&img)
                .arg(format!("{size_mb}M"))
                .output()
                .map_err(|e| format!("mkfs.ext4: {e}"))?;
            if !out.status.success() {
                return Err(format!("mkfs.ext4: {}", String::from_utf8_lossy(&out.stderr)));
            }
            let _ = std::fs::remove_dir_all(&src);
            img
        }
    };

    let fs = Fs::open(&image).map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    let n_warm = walk_rext4(&fs)?; // warm the caches
    let best = best_of(rounds, || walk_rext4(&fs))?;
    rows.push(("rext4 in process", n_warm, best));
    let rss = peak_rss_kib();

    match KernelMount::new(&image, &work.join("mnt")) {
        Ok(m) => {
            let n = walk_kernel(&m.dir)?;
            let best = best_of(rounds, || walk_kernel(&m.dir))?;
            rows.push(("kernel ext4 (loop, ro)", n, best));
        }
        Err(why) => eprintln!("note: kernel target skipped: {why}"),
    }

    println!("walk + stat of every inode, warm cache, best of {rounds}");
    println!("{:<24} {:>10} {:>12} {:>14} {:>10}", "target", "inodes", "seconds", "inodes/s", "vs kernel");
    let kernel_rate = rows.iter().find(|r| r.0.starts_with("kernel")).map(|r| r.1 as f64 / r.2);
    for (name, n, secs) in &rows {
        let rate = *n as f64 / secs;
        let ratio = kernel_rate.map(|k| format!("{:.2}x", rate / k)).unwrap_or_else(|| "-".into());
        println!("{name:<24} {n:>10} {secs:>12.4} {rate:>14.0} {ratio:>10}");
    }
    if let Some(kib) = rss {
        println!("peak RSS of this process (rext4 walk): {:.1} MiB", kib as f64 / 1024.0);
    }
    let (blocks, inodes) = fs.cache_counts();
    println!("rext4 caches after the walk: {blocks} metadata blocks, {inodes} inodes");
    Ok(())
}

fn best_of(rounds: usize, mut f: impl FnMut() -> CliResult<u64>) -> CliResult<f64> {
    let mut best = f64::MAX;
    for _ in 0..rounds {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// Every inode below the root: readdir each directory and stat each entry.
pub(crate) fn walk_rext4(fs: &Fs) -> CliResult<u64> {
    let mut stack = vec![fs.root()];
    let mut n = 0u64;
    let mut entries = Vec::new();
    while let Some(dir) = stack.pop() {
        entries.clear();
        fs.readdir(dir, 0, |e| {
            if e.name != b"." && e.name != b".." {
                entries.push(e.ino);
            }
            true
        })
        .map_err(|e| e.to_string())?;
        for &ino in &entries {
            let a = fs.getattr(ino).map_err(|e| e.to_string())?;
            n += 1;
            if a.kind == FileType::Directory {
                stack.push(ino);
            }
        }
    }
    Ok(n)
}

/// The same walk through the kernel: getdents + lstat, as `find -ls` does.
fn walk_kernel(root: &Path) -> CliResult<u64> {
    let mut stack = vec![root.to_path_buf()];
    let mut n = 0u64;
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).map_err(|e| e.to_string())? {
            let e = e.map_err(|e| e.to_string())?;
            let m = std::fs::symlink_metadata(e.path()).map_err(|e| e.to_string())?;
            n += 1;
            std::hint::black_box(m.ino());
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    Ok(n)
}

fn make_tree(src: &Path, files: usize) -> CliResult {
    let per_dir = 1000;
    for i in 0..files {
        let d = src.join(format!("d{:04}", i / per_dir));
        if i % per_dir == 0 {
            std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
        }
        let body = if i % 10 == 0 { vec![b'x'; 100] } else { Vec::new() };
        std::fs::write(d.join(format!("f{i}")), body).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn peak_rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
