//! `rext4-bench fsx`: the `fsx` exerciser (the Rust port, crate `fsx`, with every operation it
//! has) on one file through rext4's mount in each configuration of the kernel's page cache and
//! the transport, and on kernel ext4 as the reference for the time. Each configuration gets a
//! fresh image, seed `--seed` + its index, and `e2fsck -fn` after the unmount. A failure keeps
//! fsx's log and its good/bad copies of the file in `fsx-CONFIG-SEED/` in the current
//! directory; the log ends with the operations that led to it, and `fsx -S CHUNKSEED -N N`
//! replays the chunk (`-v` prints each operation, `-m FROM:TO` watches a byte range).

use super::targets::{self, ImageSpec, Kind};
use crate::CliResult;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// Every operation of fsx 0.3, also the adapter's stress tests' mix (`fsx.toml` says why
/// its operations are at least a byte long).
const CONFIG: &str = include_str!("../fsx.toml");

/// Operations per fsx process (see `one`).
const CHUNK: u64 = 100_000;

/// A configuration: its name, the target and the daemon's extra options.
struct Config {
    name: &'static str,
    kind: Kind,
    opts: Option<&'static str>,
    nodelalloc: bool,
}

const CONFIGS: [Config; 6] = [
    Config { name: "default", kind: Kind::Fuse, opts: None, nodelalloc: false },
    Config { name: "writeback_cache", kind: Kind::Fuse, opts: Some("writeback_cache"), nodelalloc: false },
    Config { name: "io_uring", kind: Kind::FuseUring, opts: None, nodelalloc: false },
    Config {
        name: "io_uring+writeback_cache",
        kind: Kind::FuseUring,
        opts: Some("writeback_cache"),
        nodelalloc: false,
    },
    Config { name: "nodelalloc", kind: Kind::Fuse, opts: None, nodelalloc: true },
    Config { name: "kernel", kind: Kind::Kernel, opts: None, nodelalloc: false },
];

/// The names `--configs` takes.
pub(crate) fn names() -> String {
    CONFIGS.iter().map(|c| c.name).collect::<Vec<_>>().join(", ")
}

/// `rext4-bench fsx`: `ops` operations in each of `only` (default: every configuration).
pub(crate) fn run(ops: u64, seed: u64, only: Option<&[String]>) -> CliResult {
    if let Some(only) = only {
        if let Some(bad) = only.iter().find(|n| !CONFIGS.iter().any(|c| c.name == n.as_str())) {
            return Err(format!("fsx: unknown configuration {bad} ({})", names()));
        }
    }
    let fsx = find_fsx().ok_or("fsx is not installed (`cargo install fsx`; .ci/setup does)")?;
    let work = super::work_dir("fsx");
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let r = run_in(&fsx, &work, ops, seed, only);
    targets::restore_uring();
    super::remove_work_dir(&work);
    r
}

fn find_fsx() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let home = std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo/bin"));
    std::env::split_paths(&path).chain(home).map(|d| d.join("fsx")).find(|p| p.is_file())
}

fn run_in(fsx: &Path, work: &Path, ops: u64, seed: u64, only: Option<&[String]>) -> CliResult {
    let cfg = work.join("fsx.toml");
    std::fs::write(&cfg, CONFIG).map_err(|e| e.to_string())?;
    println!("fsx, {ops} operations each (every operation fsx has), one configuration at a time");
    println!(
        "{:<26} {:>10} {:>10} {:>10} {:>8}  result",
        "configuration", "seed", "ops", "seconds", "/kernel"
    );
    let mut failures = 0;
    let mut kernel_secs = None;
    // The kernel first: its time is the reference of the others.
    let (kernel, rext4): (Vec<_>, Vec<_>) =
        CONFIGS.iter().enumerate().partition(|(_, c)| c.kind == Kind::Kernel);
    for (i, c) in kernel.into_iter().chain(rext4) {
        if only.is_some_and(|o| !o.iter().any(|n| n == c.name)) {
            continue;
        }
        let seed = seed + i as u64;
        if let Some(why) = targets::unavailable(c.kind) {
            println!("{:<26} {seed:>10} {:>10} {:>10} {:>8}  skipped: {why}", c.name, "-", "-", "-");
            continue;
        }
        let dir = work.join(c.name.replace('+', "-"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let (secs, result) = match one(fsx, &cfg, &dir, c, ops, seed) {
            Ok(secs) => (Some(secs), "pass".to_string()),
            Err((secs, why)) => {
                failures += 1;
                (secs, format!("FAILED: {why}"))
            }
        };
        if c.kind == Kind::Kernel {
            kernel_secs = secs;
        }
        let ratio = match (secs, kernel_secs) {
            (Some(s), Some(k)) if k > 0.0 => format!("{:.2}x", s / k),
            _ => "-".to_string(),
        };
        let secs = secs.map_or("-".to_string(), |s| format!("{s:.1}"));
        println!("{:<26} {seed:>10} {ops:>10} {secs:>10} {ratio:>8}  {result}", c.name);
        let _ = std::io::stdout().flush();
        let _ = std::fs::remove_dir_all(&dir);
    }
    if failures > 0 {
        return Err(format!("fsx: {failures} configuration(s) failed"));
    }
    Ok(())
}

/// One configuration on a fresh image: fsx's time, or why it failed (with the time if fsx ran).
fn one(
    fsx: &Path,
    cfg: &Path,
    dir: &Path,
    c: &Config,
    ops: u64,
    seed: u64,
) -> Result<f64, (Option<f64>, String)> {
    let spec = ImageSpec {
        inodes: 4096,
        mib: 512,
        fuse_opts: c.opts.map(str::to_string),
        nodelalloc: c.nodelalloc,
        ..ImageSpec::default()
    };
    eprintln!("fsx: {} (seed {seed}) ...", c.name);
    let m = targets::mount(c.kind, dir, &spec).map_err(|e| (None, e))?;
    let art = dir.join("artifacts");
    std::fs::create_dir_all(&art).map_err(|e| (None, e.to_string()))?;
    let file = m.dir().join(format!("fsx-{seed}"));
    let start = Instant::now();
    let mut log = String::new();
    let mut status = None;
    // fsx 0.3 never unmaps a mapped read: one process running a million operations would reach
    // `vm.max_map_count` (and slows down as its mappings pile up), and its `-b` (start at an
    // operation) performs the skipped copy_file_range calls for real. So the operations are
    // run by one fsx process per chunk, one after another on the same file of the same mount,
    // chunk k with seed `seed * 1000 + k`; each starts from an empty file.
    let mut done = 0;
    while done < ops {
        let n = CHUNK.min(ops - done);
        let chunk_seed = seed * 1000 + done / CHUNK;
        let out = Command::new(fsx)
            .arg("-N")
            .arg(n.to_string())
            .arg("-S")
            .arg(chunk_seed.to_string())
            .arg("-f")
            .arg(cfg)
            .arg("-P")
            .arg(&art)
            .arg(&file)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| (None, format!("fsx: {e}")))?;
        log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if !out.status.success() {
            status = Some(format!("fsx -S {chunk_seed} -N {n} {}", out.status));
            break;
        }
        done += n;
    }
    let secs = start.elapsed().as_secs_f64();
    // Unmounts and waits for the daemon to write everything back and exit.
    drop(m);
    let fsck = if c.kind == Kind::Kernel { Ok(()) } else { e2fsck(&targets::image_path(dir, c.kind)) };
    if status.is_none() && fsck.is_ok() {
        return Ok(secs);
    }
    let keep = Path::new(&format!("fsx-{}-{seed}", c.name.replace('+', "-"))).to_path_buf();
    let _ = std::fs::remove_dir_all(&keep);
    let _ = std::fs::rename(&art, &keep).or_else(|_| std::fs::create_dir_all(&keep));
    let _ = std::fs::write(keep.join("fsx.log"), &log);
    let why = match status {
        None => fsck.err().unwrap_or_default(),
        Some(st) => {
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            let fsck = fsck.err().map(|e| format!("; {e}")).unwrap_or_default();
            format!("{st}; kept in {}/: {}{fsck}", keep.display(), tail.join(" / "))
        }
    };
    Err((Some(secs), why))
}

/// `e2fsck -fn` on an image: clean, or its complaint.
fn e2fsck(img: &Path) -> Result<(), String> {
    let out = Command::new("e2fsck")
        .arg("-fn")
        .arg(img)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("e2fsck: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Err(format!("e2fsck -fn: {}", text.lines().take(8).collect::<Vec<_>>().join(" / ")))
}
