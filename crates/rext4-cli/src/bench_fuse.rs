//! `rext4 bench fuse`: the mdtest workload (N workers, own directories, create / stat / remove
//! of empty files) through mount points, in one run: rext4's FUSE daemon, kernel ext4 on a
//! loop device over tmpfs, and `fuse2fs`, each on a fresh image of the same kind. Reports
//! operations per second, ratios, and the FUSE daemons' peak RSS.

use crate::bench::KernelMount;
use crate::bench_mdtest::run_kernel as run_on_mount;
use crate::CliResult;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A mount target of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Fuse,
    Kernel,
    Fuse2fs,
}

impl Target {
    fn parse(s: &str) -> CliResult<Target> {
        match s {
            "fuse" | "rext4" => Ok(Target::Fuse),
            "kernel" => Ok(Target::Kernel),
            "fuse2fs" => Ok(Target::Fuse2fs),
            _ => Err(format!("unknown target {s} (fuse, kernel, fuse2fs)")),
        }
    }
    fn name(self) -> &'static str {
        match self {
            Target::Fuse => "rext4-fuse",
            Target::Kernel => "kernel",
            Target::Fuse2fs => "fuse2fs",
        }
    }
}

/// A mounted target; unmounted (and its daemon waited for) on drop.
enum Mounted {
    Daemon { child: Child, dir: PathBuf },
    Kernel(KernelMount),
}

impl Mounted {
    fn dir(&self) -> &Path {
        match self {
            Mounted::Daemon { dir, .. } => dir,
            Mounted::Kernel(k) => &k.dir,
        }
    }

    /// Peak RSS of the daemon so far, in MiB.
    fn daemon_rss_mib(&self) -> Option<f64> {
        let Mounted::Daemon { child, .. } = self else { return None };
        let s = std::fs::read_to_string(format!("/proc/{}/status", child.id())).ok()?;
        let kib: f64 =
            s.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / 1024.0)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Mounted::Daemon { child, dir } = self {
            for _ in 0..100 {
                if Command::new("umount").arg(&*dir).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
                {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.wait();
        }
    }
}

fn is_mounted(dir: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    let d = dir.to_string_lossy();
    info.lines().any(|l| l.split(' ').nth(4) == Some(&*d))
}

fn mount(t: Target, img: &Path, dir: &Path) -> CliResult<Mounted> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let dir = dir.canonicalize().map_err(|e| e.to_string())?;
    let mut cmd = match t {
        Target::Kernel => return KernelMount::new_rw(img, &dir).map(Mounted::Kernel),
        Target::Fuse => {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let mut c = Command::new(exe);
            c.arg("mount").arg(img).arg(&dir).args(["-o", "rw", "-f"]);
            c
        }
        Target::Fuse2fs => {
            let mut c = Command::new("fuse2fs");
            c.arg(img).arg(&dir).arg("-f");
            c
        }
    };
    let mut child =
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).spawn().map_err(|e| format!("{}: {e}", t.name()))?;
    let start = Instant::now();
    while !is_mounted(&dir) {
        if let Ok(Some(st)) = child.try_wait() {
            return Err(format!("{} exited before mounting: {st}", t.name()));
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            return Err(format!("{} did not mount within 30 s", t.name()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Mounted::Daemon { child, dir })
}

fn mkfs(img: &Path, inodes: usize, size: &str) -> CliResult {
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-N"])
        .arg(inodes.to_string())
        .arg(img)
        .arg(size)
        .output()
        .map_err(|e| format!("mkfs.ext4: {e}"))?;
    if !out.status.success() {
        return Err(format!("mkfs.ext4: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

/// `rext4 bench fuse`.
pub fn run(workers: &[usize], files: usize, targets: &[String]) -> CliResult {
    if !nix::unistd::geteuid().is_root() {
        return Err("bench fuse mounts images: run it as root".into());
    }
    let targets: Vec<Target> = targets.iter().map(|s| Target::parse(s)).collect::<CliResult<_>>()?;
    let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    let work = base.join(format!("rext4-bench-fuse-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let r = run_in(&work, workers, files, &targets);
    let _ = std::fs::remove_dir_all(&work);
    r
}

fn run_in(work: &Path, workers: &[usize], files: usize, targets: &[Target]) -> CliResult {
    let most = workers.iter().copied().max().unwrap_or(1) * files;
    let inodes = (most + most / 10 + 10_000).max(400_000);
    let size = if inodes > 600_000 { "4G" } else { "1G" };
    // (target, workers) -> (create, stat, remove) ops/s
    let mut results: Vec<(Target, usize, (f64, f64, f64))> = Vec::new();
    let mut rss = Vec::new();
    for &t in targets {
        let img = work.join(format!("{}.img", t.name()));
        mkfs(&img, inodes, size)?;
        let m = match mount(t, &img, &work.join(format!("mnt-{}", t.name()))) {
            Ok(m) => m,
            Err(why) => {
                println!("{}: skipped ({why})", t.name());
                continue;
            }
        };
        for &w in workers {
            let r = run_on_mount(m.dir(), w, files)?;
            eprintln!(
                "{:>10} {w:>3} workers: create {:.0}/s stat {:.0}/s remove {:.0}/s",
                t.name(),
                r.0,
                r.1,
                r.2
            );
            results.push((t, w, r));
        }
        if let Some(mib) = m.daemon_rss_mib() {
            rss.push((t, mib));
        }
        drop(m);
        let _ = std::fs::remove_file(&img);
    }
    let get = |t: Target, w: usize| results.iter().find(|r| r.0 == t && r.1 == w).map(|r| r.2);
    println!("mdtest through mount points: each worker creates, stats and removes {files} empty files in its own directory (ops/s)");
    println!(
        "{:<7} {:>7} {:>12} {:>12} {:>12} {:>13} {:>13}",
        "phase", "workers", "rext4-fuse", "kernel", "fuse2fs", "fuse/kernel", "fuse/fuse2fs"
    );
    for (i, phase) in ["create", "stat", "remove"].into_iter().enumerate() {
        for &w in workers {
            let pick = |t| get(t, w).map(|r: (f64, f64, f64)| [r.0, r.1, r.2][i]);
            let (f, k, f2) = (pick(Target::Fuse), pick(Target::Kernel), pick(Target::Fuse2fs));
            let num = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
            let ratio = |a: Option<f64>, b: Option<f64>, pct: bool| match (a, b) {
                (Some(a), Some(b)) if b > 0.0 => {
                    if pct {
                        format!("{:.0}%", 100.0 * a / b)
                    } else {
                        format!("{:.1}x", a / b)
                    }
                }
                _ => "-".into(),
            };
            println!(
                "{phase:<7} {w:>7} {:>12} {:>12} {:>12} {:>13} {:>13}",
                num(f),
                num(k),
                num(f2),
                ratio(f, k, true),
                ratio(f, f2, false)
            );
        }
    }
    for (t, mib) in rss {
        println!("{} daemon peak RSS: {mib:.1} MiB", t.name());
    }
    Ok(())
}
