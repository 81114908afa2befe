//! `rext4-bench mkfs`: `rext4 mkfs --from DIR` against `mkfs.ext4 -d DIR`, the same tree, the
//! same size and defaults, in the same run: a tree of many small files and one of large ones,
//! built in tmpfs, images in tmpfs. Each image is checked with `e2fsck -fn` after its run.

use crate::CliResult;
use rext4_cli::rng::Rng;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// `rext4-bench mkfs`: `files` small files, then `mib` MiB in large ones; the median of
/// `rounds`, the two programs taking turns.
pub(crate) fn run(files: usize, mib: u64, rounds: usize) -> CliResult {
    let work = super::work_dir("mkfs");
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let r = run_in(&work, files, mib, rounds.max(1));
    let _ = std::fs::remove_dir_all(&work);
    r
}

fn run_in(work: &Path, files: usize, mib: u64, rounds: usize) -> CliResult {
    let rext4 = super::targets::rext4_exe().ok_or("no rext4 program beside rext4-bench or on PATH")?;
    println!("mkfs --from a tree against mkfs.ext4 -d, median of {rounds}");
    println!("{:<28} {:>10} {:>12} {:>12} {:>10}", "tree", "MiB", "rext4 s", "mkfs.ext4 s", "speedup");
    for (name, build) in [
        ("small", Box::new(|src: &Path| small_tree(src, files)) as Box<dyn Fn(&Path) -> CliResult<u64>>),
        ("large", Box::new(|src: &Path| large_tree(src, mib))),
    ] {
        let src = work.join(name);
        eprintln!("building the {name} tree ...");
        let bytes = build(&src)?;
        // Room for the data, the metadata of the files and a journal.
        let size = format!("{}M", bytes * 5 / 4 / (1 << 20) + files as u64 / 64 + 512);
        let img = work.join(format!("{name}.img"));
        // Taking turns, so that a change in the machine's load falls on both.
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let mut c = Command::new(&rext4);
            c.args(["mkfs", "-q", "--from"]).arg(&src).arg(&img).arg(&size);
            ours.push(timed(c, &img)?);
            let mut c = Command::new("mkfs.ext4");
            c.args(["-q", "-F", "-d"]).arg(&src).arg(&img).arg(&size);
            theirs.push(timed(c, &img)?);
        }
        let (ours, theirs) = (median(&mut ours), median(&mut theirs));
        let label = if name == "small" { format!("{files} files") } else { "large files".to_string() };
        println!("{:<28} {:>10} {:>12.2} {:>12.2} {:>9.2}x", label, bytes >> 20, ours, theirs, theirs / ours);
        let _ = std::io::stdout().flush();
        std::fs::remove_dir_all(&src).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Runs `c` on a fresh image file, timed; then checks the image and removes it.
fn timed(mut c: Command, img: &Path) -> CliResult<f64> {
    let _ = std::fs::remove_file(img);
    let t = Instant::now();
    let o = c.output().map_err(|e| format!("{c:?}: {e}"))?;
    let secs = t.elapsed().as_secs_f64();
    if !o.status.success() {
        return Err(format!("{c:?}: {}", String::from_utf8_lossy(&o.stderr)));
    }
    let f = Command::new("e2fsck").arg("-fn").arg(img).output().map_err(|e| format!("e2fsck: {e}"))?;
    if !f.status.success() {
        return Err(format!(
            "{c:?} made an image e2fsck finds wrong:\n{}",
            String::from_utf8_lossy(&f.stdout)
        ));
    }
    std::fs::remove_file(img).map_err(|e| e.to_string())?;
    Ok(secs)
}

/// `files` files of 0 to 8 KiB in directories of 1,000; returns their bytes.
fn small_tree(src: &Path, files: usize) -> CliResult<u64> {
    let mut rng = Rng(0x6d6b_6673);
    let mut bytes = 0u64;
    for i in 0..files {
        let d = src.join(format!("d{:03}", i / 1000));
        if i % 1000 == 0 {
            std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
        }
        let n = (rng.next() % 8192) as usize;
        std::fs::write(d.join(format!("f{i:06}")), rng.bytes(n)).map_err(|e| e.to_string())?;
        bytes += n as u64;
    }
    Ok(bytes)
}

/// `mib` MiB in files of 64 MiB (the last smaller) of random bytes.
fn large_tree(src: &Path, mib: u64) -> CliResult<u64> {
    std::fs::create_dir_all(src).map_err(|e| e.to_string())?;
    let mut rng = Rng(0x6269_6773);
    let chunk = rng.bytes(1 << 20);
    let mut left = mib;
    let mut i = 0;
    while left > 0 {
        let n = left.min(64);
        let mut f = std::fs::File::create(src.join(format!("big{i:03}"))).map_err(|e| e.to_string())?;
        for k in 0..n {
            // Each MiB differs from the others: the chunk with a counter in front.
            f.write_all(&(i * 64 + k).to_le_bytes()).map_err(|e| e.to_string())?;
            f.write_all(&chunk[8..]).map_err(|e| e.to_string())?;
        }
        left -= n;
        i += 1;
    }
    Ok(mib << 20)
}
