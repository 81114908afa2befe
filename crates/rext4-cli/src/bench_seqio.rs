//! `rext4 bench seqio`: sequential write (then fsync) and read of one large file, rext4 in
//! process against kernel ext4 on a loop image in tmpfs, same run; and how contiguous the file
//! rext4 wrote is (extents per 128 MiB, counted by `filefrag` on a kernel mount).

use crate::bench::KernelMount;
use crate::CliResult;
use rext4::{Fs, Options};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const CHUNK: usize = 1 << 20;

fn work_dir() -> PathBuf {
    let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    base.join(format!("rext4-bench-seqio-{}", std::process::id()))
}

fn mkfs(img: &Path, mib: u64) -> CliResult {
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(img)
        .arg(format!("{mib}M"))
        .output()
        .map_err(|e| format!("mkfs.ext4: {e}"))?;
    if !out.status.success() {
        return Err(format!("mkfs.ext4: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

fn pattern(i: usize) -> Vec<u8> {
    (0..CHUNK).map(|k| (k as u8).wrapping_mul(31).wrapping_add(i as u8)).collect()
}

/// (write MB/s including the final fsync, read MB/s)
fn run_rext4(img: &Path, size: u64) -> CliResult<(f64, f64)> {
    let e = |e: rext4::Error| e.to_string();
    let fs = Fs::open_with(img, Options { writable: true, ..Options::default() }).map_err(e)?;
    let ino = fs.create(fs.root(), b"big", 0o644, 0, 0).map_err(e)?.ino;
    let chunks = (size / CHUNK as u64) as usize;
    let bufs: Vec<Vec<u8>> = (0..4).map(pattern).collect();
    let t = Instant::now();
    for i in 0..chunks {
        fs.write(ino, (i * CHUNK) as u64, &bufs[i % 4]).map_err(e)?;
    }
    fs.fsync(ino).map_err(e)?;
    let w = size as f64 / t.elapsed().as_secs_f64() / 1e6;
    let mut buf = vec![0u8; CHUNK];
    let t = Instant::now();
    for i in 0..chunks {
        let n = fs.read(ino, (i * CHUNK) as u64, &mut buf).map_err(e)?;
        if n != CHUNK || buf != bufs[i % 4] {
            return Err(format!("rext4 read back wrong data at chunk {i}"));
        }
    }
    let r = size as f64 / t.elapsed().as_secs_f64() / 1e6;
    fs.unmount().map_err(e)?;
    Ok((w, r))
}

fn run_kernel(dir: &Path, size: u64) -> CliResult<(f64, f64)> {
    let e = |e: std::io::Error| e.to_string();
    let path = dir.join("big");
    let chunks = (size / CHUNK as u64) as usize;
    let bufs: Vec<Vec<u8>> = (0..4).map(pattern).collect();
    let t = Instant::now();
    let mut f = std::fs::File::create(&path).map_err(e)?;
    for i in 0..chunks {
        f.write_all(&bufs[i % 4]).map_err(e)?;
    }
    f.sync_all().map_err(e)?;
    let w = size as f64 / t.elapsed().as_secs_f64() / 1e6;
    drop(f);
    // Read from the device, not the page cache of the write.
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    let mut f = std::fs::File::open(&path).map_err(e)?;
    let mut buf = vec![0u8; CHUNK];
    let t = Instant::now();
    for i in 0..chunks {
        f.read_exact(&mut buf).map_err(e)?;
        if buf != bufs[i % 4] {
            return Err(format!("kernel read back wrong data at chunk {i}"));
        }
    }
    let r = size as f64 / t.elapsed().as_secs_f64() / 1e6;
    Ok((w, r))
}

/// Small files from `threads` threads, each in its own directory: create, write `size`
/// bytes, done. Files per second.
fn small_rext4(img: &Path, threads: usize, files: usize, size: usize) -> CliResult<f64> {
    let e = |e: rext4::Error| e.to_string();
    let fs = Fs::open_with(img, Options { writable: true, ..Options::default() }).map_err(e)?;
    let dirs: Vec<_> = (0..threads)
        .map(|t| fs.mkdir(fs.root(), format!("s{t}").as_bytes(), 0o755, 0, 0).map(|a| a.ino))
        .collect::<rext4::Result<_>>()
        .map_err(e)?;
    let body = vec![0x5Au8; size];
    let t = Instant::now();
    std::thread::scope(|s| {
        let hs: Vec<_> = dirs
            .iter()
            .map(|&d| {
                let (fs, body) = (&fs, &body);
                s.spawn(move || -> rext4::Result<()> {
                    for i in 0..files {
                        let ino = fs.create(d, format!("f{i}").as_bytes(), 0o644, 0, 0)?.ino;
                        fs.write(ino, 0, body)?;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter().try_for_each(|h| h.join().map_err(|_| "worker panicked".to_string())?.map_err(e))
    })?;
    fs.sync().map_err(e)?;
    let rate = (threads * files) as f64 / t.elapsed().as_secs_f64();
    fs.unmount().map_err(e)?;
    Ok(rate)
}

fn small_kernel(dir: &Path, threads: usize, files: usize, size: usize) -> CliResult<f64> {
    let e = |e: std::io::Error| e.to_string();
    let dirs: Vec<PathBuf> = (0..threads).map(|t| dir.join(format!("s{t}"))).collect();
    for d in &dirs {
        std::fs::create_dir(d).map_err(e)?;
    }
    let body = vec![0x5Au8; size];
    let t = Instant::now();
    std::thread::scope(|s| {
        let hs: Vec<_> = dirs
            .iter()
            .map(|d| {
                let body = &body;
                s.spawn(move || -> std::io::Result<()> {
                    for i in 0..files {
                        std::fs::write(d.join(format!("f{i}")), body)?;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter().try_for_each(|h| h.join().map_err(|_| "worker panicked".to_string())?.map_err(e))
    })?;
    nix::unistd::sync();
    Ok((threads * files) as f64 / t.elapsed().as_secs_f64())
}

/// Extents of `path` as `filefrag` counts them.
fn extents(path: &Path) -> Option<u64> {
    let out = Command::new("filefrag").arg(path).output().ok()?;
    let s = String::from_utf8_lossy(&out.stdout);
    s.split(':').nth(1)?.split_whitespace().next()?.parse().ok()
}

pub fn run(mib: u64) -> CliResult {
    let dir = work_dir();
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let r = run_in(&dir, mib);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn run_in(dir: &Path, mib: u64) -> CliResult {
    let size = mib << 20;
    let img_mib = mib + mib / 4 + 64;
    let img = dir.join("rext4.img");
    mkfs(&img, img_mib)?;
    println!("seqio: one {mib} MiB file written in 1 MiB writes then fsync'ed, then read back (MB/s)");
    let (w, r) = run_rext4(&img, size)?;
    let kimg = dir.join("kernel.img");
    mkfs(&kimg, img_mib)?;
    let k = match KernelMount::new_rw(&kimg, &dir.join("kmnt")) {
        Ok(m) => {
            let k = run_kernel(&m.dir, size)?;
            drop(m);
            Some(k)
        }
        Err(why) => {
            println!("kernel target skipped: {why}");
            None
        }
    };
    let _ = std::fs::remove_file(&kimg);
    println!("{:<24} {:>12} {:>12}", "target", "write MB/s", "read MB/s");
    println!("{:<24} {w:>12.0} {r:>12.0}", "rext4 in process");
    if let Some((kw, kr)) = k {
        println!("{:<24} {kw:>12.0} {kr:>12.0}", "kernel ext4 (loop)");
        println!("{:<24} {:>11.2}x {:>11.2}x", "rext4 / kernel", w / kw, r / kr);
    }
    if let Ok(m) = KernelMount::new(&img, &dir.join("rmnt")) {
        if let Some(n) = extents(&m.dir.join("big")) {
            let per = n as f64 / (mib as f64 / 128.0);
            println!("the file rext4 wrote has {n} extents (filefrag): {per:.1} per 128 MiB");
        }
    }
    let _ = std::fs::remove_file(&img);

    let (threads, files, size) = (8, 2000, 16 << 10);
    println!();
    println!("small files: {threads} threads each write {files} files of {} KiB in their own directory, then sync (files/s)", size >> 10);
    let img = dir.join("small.img");
    mkfs(&img, 1024)?;
    let r = small_rext4(&img, threads, files, size)?;
    let kimg = dir.join("ksmall.img");
    mkfs(&kimg, 1024)?;
    let k = match KernelMount::new_rw(&kimg, &dir.join("ksmnt")) {
        Ok(m) => Some(small_kernel(&m.dir, threads, files, size)?),
        Err(_) => None,
    };
    println!("{:<24} {:>12}", "target", "files/s");
    println!("{:<24} {r:>12.0}", "rext4 in process");
    if let Some(k) = k {
        println!("{:<24} {k:>12.0}", "kernel ext4 (loop)");
        println!("{:<24} {:>11.2}x", "rext4 / kernel", r / k);
    }
    Ok(())
}
