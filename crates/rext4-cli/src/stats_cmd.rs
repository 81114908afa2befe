//! `rext4 stats MOUNTPOINT`: the engine's statistics for a filesystem served by `rext4 mount`,
//! as a function profile (FUNC, TOTAL_TIME(us), COUNT, AVG(us)), then lock waits per lock class
//! and journal commit times (mean, stddev, top 5); docs/bench.md describes the output.
//!
//! The daemon answers on a Unix socket in a runtime directory (`/run/rext4` for root, else
//! `$XDG_RUNTIME_DIR/rext4` or `/tmp/rext4-UID`), named after the mount's device number as
//! `/proc/self/mountinfo` shows it, so the command finds it from the mount point alone without
//! a request through the mount itself. A request is one line, `stats` or `reset`; the answer is
//! the report as one JSON line.

use crate::CliResult;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The engine's report in a serialisable form.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct Report {
    pub ops: Vec<OpRow>,
    pub locks: Vec<LockRow>,
    pub commits: Option<Commits>,
    /// Operation figures are estimated from one top-level operation in this many.
    #[serde(default)]
    pub every: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct OpRow {
    pub name: String,
    pub count: u64,
    pub total_ns: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct LockRow {
    pub name: String,
    pub acquired: u64,
    pub contended: u64,
    pub wait_ns: u64,
    pub max_wait_ns: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct Commits {
    pub commits: u64,
    pub mean_us: f64,
    pub stddev_us: f64,
    pub max_us: u64,
    pub top5_us: Vec<u64>,
    /// Handles and blocks the commits logged, blocks checkpoints wrote home.
    #[serde(default)]
    pub handles: u64,
    #[serde(default)]
    pub blocks: u64,
    #[serde(default)]
    pub checkpoint_blocks: u64,
}

impl From<&rext4::StatsReport> for Report {
    fn from(r: &rext4::StatsReport) -> Self {
        Report {
            ops: r
                .ops
                .iter()
                .map(|o| OpRow { name: o.name.to_string(), count: o.count, total_ns: o.total_ns })
                .collect(),
            locks: r
                .locks
                .iter()
                .map(|l| LockRow {
                    name: l.name.to_string(),
                    acquired: l.acquired,
                    contended: l.contended,
                    wait_ns: l.wait_ns,
                    max_wait_ns: l.max_wait_ns,
                })
                .collect(),
            commits: r.commits.as_ref().map(|c| Commits {
                commits: c.commits,
                mean_us: c.mean_us,
                stddev_us: c.stddev_us,
                max_us: c.max_us,
                top5_us: c.top5_us.clone(),
                handles: c.handles,
                blocks: c.blocks,
                checkpoint_blocks: c.checkpoint_blocks,
            }),
            every: r.every,
        }
    }
}

impl Report {
    /// The three tables, operations by total time, only what was used.
    pub(crate) fn print(&self) {
        let mut ops: Vec<&OpRow> = self.ops.iter().filter(|o| o.count > 0).collect();
        ops.sort_by_key(|o| std::cmp::Reverse(o.total_ns));
        if self.every > 1 {
            println!("(operations: estimated from one top-level operation in {} per thread)", self.every);
        }
        println!("{:<34} {:>16} {:>12} {:>12}", "FUNC", "TOTAL_TIME(us)", "COUNT", "AVG(us)");
        for o in ops {
            let us = o.total_ns as f64 / 1e3;
            println!("{:<34} {:>16.0} {:>12} {:>12.2}", o.name, us, o.count, us / o.count as f64);
        }
        println!();
        println!(
            "{:<38} {:>12} {:>10} {:>14} {:>10} {:>12}",
            "LOCK", "ACQUIRED", "WAITED", "WAIT_TIME(us)", "AVG(us)", "MAX(us)"
        );
        for l in self.locks.iter().filter(|l| l.acquired > 0) {
            let us = l.wait_ns as f64 / 1e3;
            let avg = if l.contended > 0 { us / l.contended as f64 } else { 0.0 };
            println!(
                "{:<38} {:>12} {:>10} {:>14.0} {:>10.2} {:>12.1}",
                l.name,
                l.acquired,
                l.contended,
                us,
                avg,
                l.max_wait_ns as f64 / 1e3
            );
        }
        println!();
        match &self.commits {
            Some(c) if c.commits > 0 => {
                let top: Vec<String> = c.top5_us.iter().map(|t| format!("{:.6}s", *t as f64 / 1e6)).collect();
                println!(
                    "journal commits: {}, mean {:.6}s, stddev {:.6}s, max {:.6}s; top 5: {}",
                    c.commits,
                    c.mean_us / 1e6,
                    c.stddev_us / 1e6,
                    c.max_us as f64 / 1e6,
                    top.join(", ")
                );
                println!(
                    "journal blocks: {} logged for {} handles ({:.3} a handle), {} written home by checkpoints",
                    c.blocks,
                    c.handles,
                    c.blocks as f64 / c.handles.max(1) as f64,
                    c.checkpoint_blocks
                );
            }
            Some(_) => println!("journal commits: none yet"),
            None => println!("journal commits: none (read-only)"),
        }
    }
}

/// Where daemons put their statistics sockets.
fn runtime_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/run/rext4");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("rext4"),
        _ => std::env::temp_dir().join(format!("rext4-{}", nix::unistd::geteuid())),
    }
}

/// The device number (`major:minor`) of what is mounted at `dir`, from mountinfo.
fn mount_dev(dir: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let d = dir.to_string_lossy();
    // The last mount on a directory is the visible one.
    info.lines()
        .rfind(|l| l.split(' ').nth(4) == Some(&*d))
        .and_then(|l| l.split(' ').nth(2))
        .map(str::to_string)
}

fn socket_path(dev: &str) -> PathBuf {
    runtime_dir().join(format!("stats-{}.sock", dev.replace(':', "_")))
}

/// Serves statistics for `fs`, mounted at `mountpoint`, on a background thread; returns the
/// socket's path (removed by the caller when the daemon ends). Called by the daemon once the
/// mount exists.
pub(crate) fn serve(fs: rext4::Fs, mountpoint: &Path) -> CliResult<PathBuf> {
    let dev = mount_dev(mountpoint).ok_or_else(|| format!("{}: not in mountinfo", mountpoint.display()))?;
    let path = socket_path(&dev);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    }
    // A socket left by a daemon that died with the same device number.
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    std::thread::Builder::new()
        .name("rext4-stats".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                let mut line = String::new();
                let _ = BufReader::new(&conn).read_line(&mut line);
                let report = Report::from(&fs.stats());
                if line.trim() == "reset" {
                    fs.reset_stats();
                }
                if let Ok(s) = serde_json::to_string(&report) {
                    let _ = writeln!(conn, "{s}");
                }
            }
        })
        .map_err(|e| format!("cannot start the statistics thread: {e}"))?;
    Ok(path)
}

/// Asks the daemon serving `mountpoint` for its report (and to reset it, after reporting).
pub(crate) fn fetch(mountpoint: &Path, reset: bool) -> CliResult<Report> {
    let dir = mountpoint.canonicalize().map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    let dev = mount_dev(&dir).ok_or_else(|| format!("{}: not a mount point", dir.display()))?;
    let path = socket_path(&dev);
    let mut conn = UnixStream::connect(&path).map_err(|e| {
        format!("{}: no rext4 daemon serves this mount ({}: {e})", dir.display(), path.display())
    })?;
    conn.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    writeln!(conn, "{}", if reset { "reset" } else { "stats" }).map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line).map_err(|e| format!("reading the report: {e}"))?;
    serde_json::from_str(&line).map_err(|e| format!("the daemon's report: {e}"))
}

/// `rext4 stats MOUNTPOINT [--json] [--reset]`.
pub(crate) fn run(mountpoint: &Path, json: bool, reset: bool) -> CliResult {
    let r = fetch(mountpoint, reset)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?);
    } else {
        r.print();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_round_trips_through_json() {
        let r = Report {
            ops: vec![OpRow { name: "ext4_create".into(), count: 3, total_ns: 4500 }],
            locks: vec![LockRow {
                name: "x".into(),
                acquired: 5,
                contended: 1,
                wait_ns: 10,
                max_wait_ns: 10,
            }],
            commits: Some(Commits {
                commits: 2,
                mean_us: 1.5,
                stddev_us: 0.5,
                max_us: 2,
                top5_us: vec![2, 1],
                handles: 7,
                blocks: 5,
                checkpoint_blocks: 3,
            }),
            every: 16,
        };
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Report>(&s).unwrap(), r);
    }
}
