//! The benchmark harness itself (no timing assertions): every workload runs at tiny size on
//! rext4 in process and on tmpfs and reports sane, non-zero figures in its tables, JSON and
//! plot; nothing stays mounted or on disk afterwards, also when interrupted.

// Tests build fixtures from small known values and share helpers between their modules:
// the cast and visibility lints are for the code that reads images.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SUITE: [&str; 7] = ["mdtest", "creat_clo", "stress_orphan", "lockperf", "pgioperf", "seqio", "app"];

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rext4-bench"))
}

/// Mount points a bench run with process id `pid` made that are still mounted.
fn mounts_of(pid: u32) -> Vec<String> {
    let tag = format!("rext4-bench-suite-{pid}");
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.contains(&tag))
        .map(str::to_string)
        .collect()
}

fn work_dir_of(pid: u32) -> PathBuf {
    work_dir_named("suite", pid)
}

/// The work directory the bench process `pid` makes for `what` (`suite`, `fsx`).
fn work_dir_named(what: &str, pid: u32) -> PathBuf {
    let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    base.join(format!("rext4-bench-{what}-{pid}"))
}

/// Runs the bench with `args` and `--json JSON`; it must succeed. Returns its process id, its
/// output, and the JSON.
fn run_json(args: &[&str], json: &Path) -> (u32, String, serde_json::Value) {
    let (pid, out) = run_ok(bench().args(args).arg("--json").arg(json));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    (pid, out, v)
}

/// Runs the bench command `cmd` with its output captured; it must succeed. Returns its
/// process id and standard output.
fn run_ok(cmd: &mut Command) -> (u32, String) {
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let (status, out, err) = wait_with_output(child);
    assert!(status.success(), "bench failed:\n{out}\n{err}");
    (pid, out)
}

fn wait_with_output(child: Child) -> (std::process::ExitStatus, String, String) {
    let out = child.wait_with_output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_workload_runs_in_process_and_on_tmpfs() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("b.json");
    let svg = dir.path().join("b.svg");
    let plot = ["--tiny", "--targets", "inproc,tmpfs", "--workers", "1,3", "--plot", svg.to_str().unwrap()];
    let (pid, out, v) = run_json(&plot, &json);
    let samples = v["samples"].as_array().unwrap();
    for wl in SUITE {
        for target in ["inproc", "tmpfs"] {
            let mine: Vec<_> =
                samples.iter().filter(|s| s["workload"] == wl && s["target"] == target).collect();
            assert!(!mine.is_empty(), "{wl} on {target}: no samples\n{out}");
            for w in [1, 3] {
                assert!(mine.iter().any(|s| s["workers"] == w), "{wl} on {target}: nothing for {w} workers");
            }
            for s in &mine {
                let x = s["value"].as_f64().unwrap();
                assert!(x.is_finite() && x > 0.0, "{wl} on {target}: {s}");
            }
        }
        assert!(out.contains(&format!("== {wl} ==")), "no table for {wl}:\n{out}");
    }
    // Rates are rates, latencies latencies; every fsync latency sample is kept.
    let fsync = samples
        .iter()
        .find(|s| s["workload"] == "pgioperf" && s["metric"] == "fsync_mean" && s["target"] == "inproc")
        .unwrap();
    assert_eq!(fsync["better"], "lower");
    let lat = fsync["extra"]["latencies_us"].as_array().unwrap();
    assert!(!lat.is_empty());
    assert_eq!(fsync["extra"]["summary"]["count"].as_u64(), Some(lat.len() as u64));
    // A read's CPU time comes with the cost of its copy alone, measured in the same run.
    let floor = samples.iter().find(|s| s["workload"] == "pgioperf" && s["metric"] == "copy_floor").unwrap();
    assert_eq!((floor["unit"].as_str(), floor["better"].as_str()), (Some("ns/op"), Some("lower")));
    let create = samples.iter().find(|s| s["metric"] == "create").unwrap();
    assert_eq!((create["unit"].as_str(), create["better"].as_str()), (Some("ops/s"), Some("higher")));
    // The engine's own report for each workload it ran, with the operations it must have done.
    let stats = v["engine_stats"].as_array().unwrap();
    let md = stats.iter().find(|e| e[0] == "mdtest").unwrap();
    let creates = md[1]["ops"].as_array().unwrap().iter().find(|o| o["name"] == "ext4_create").unwrap();
    // Estimated from one operation in `every` per thread: positive, a multiple of it.
    let every = md[1]["every"].as_u64().unwrap();
    let n = creates["count"].as_u64().unwrap();
    assert!(n > 0 && n % every == 0, "{creates} every {every}");
    assert!(out.contains("FUNC") && out.contains("TOTAL_TIME(us)") && out.contains("AVG(us)"));
    assert!(out.contains("journal commits:") && out.contains("journal blocks:"));
    // What held up slow commits, for every pgioperf run in process.
    assert!(
        out.lines().any(|l| l.contains("pgioperf / inproc: 1 readers: ") && l.contains("preempted while committing")),
        "{out}"
    );

    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.trim_end().ends_with("</svg>"));
    assert!(plot.contains("mdtest: create (ops/s)") && plot.matches("<polyline").count() >= 10);

    assert!(mounts_of(pid).is_empty());
    assert!(!work_dir_of(pid).exists(), "work directory left behind");
}

#[test]
fn unavailable_targets_are_skipped_with_a_note() {
    let out = bench()
        .args(["creat_clo", "--tiny", "--workers", "1", "--targets", "tmpfs,fuse2fs"])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("fuse2fs: skipped: fuse2fs is not installed"), "{text}");
    let bad = bench().args(["nosuch"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown workload nosuch"));
}

/// Ctrl-C while a mounted target runs: everything is unmounted and removed.
#[test]
fn interrupted_run_leaves_no_mount_behind() {
    rext4_testkit::require_kernel!();
    let mut targets = vec!["kernel"];
    // The fuse target runs the `rext4` beside rext4-bench, which cargo builds with the
    // workspace but not for this package's tests alone.
    let rext4 = Path::new(env!("CARGO_BIN_EXE_rext4-bench")).with_file_name("rext4");
    if Path::new("/dev/fuse").exists() && rext4.is_file() {
        targets.push("fuse");
    } else {
        eprintln!("fuse target skipped: no /dev/fuse or no {}", rext4.display());
    }
    if std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("fuse2fs").is_file()))
    {
        targets.push("fuse2fs");
    }
    for target in targets {
        let child = bench()
            .args(["pgioperf", "--tiny", "--workers", "2", "--secs", "60", "--targets", target])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = Instant::now();
        while mounts_of(pid).is_empty() {
            assert!(start.elapsed() < Duration::from_secs(60), "{target} never mounted");
            std::thread::sleep(Duration::from_millis(50));
        }
        // Let the workload start on it.
        std::thread::sleep(Duration::from_millis(500));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::SIGINT).unwrap();
        let (status, _, err) = wait_with_output(child);
        assert_eq!(status.code(), Some(130), "{target}: {err}");
        assert!(err.contains("unmounting and removing images"), "{err}");
        let until = Instant::now() + Duration::from_secs(10);
        while !mounts_of(pid).is_empty() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(mounts_of(pid).is_empty(), "{target}: still mounted: {:?}", mounts_of(pid));
        assert!(!work_dir_of(pid).exists(), "{target}: work directory left behind");
    }
}

/// mdtest and seqio on rext4 in process over NBD (nbdkit serving the image on a Unix socket
/// and on loopback TCP, default connections and one) beside the local image file: figures
/// for every target, the ratio columns, the images clean (the run fails otherwise), and no
/// server, socket or image left behind.
#[test]
fn nbd_targets_run_beside_the_local_file() {
    rext4_testkit::require_tool!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("b.json");
    let targets = ["inproc", "nbd-unix", "nbd-unix-1", "nbd-tcp", "nbd-tcp-1"];
    let list = targets.join(",");
    let args = ["mdtest", "seqio", "--tiny", "--workers", "1,2", "--no-stats", "--targets", &list];
    let (pid, out, v) = run_json(&args, &json);
    let samples = v["samples"].as_array().unwrap();
    for wl in ["mdtest", "seqio"] {
        for target in targets {
            for w in [1, 2] {
                let mine: Vec<_> = samples
                    .iter()
                    .filter(|s| s["workload"] == wl && s["target"] == target && s["workers"] == w)
                    .collect();
                assert!(!mine.is_empty(), "{wl} on {target} with {w} workers: no samples\n{out}");
                for s in mine {
                    let x = s["value"].as_f64().unwrap();
                    assert!(x.is_finite() && x > 0.0, "{wl} on {target}: {s}");
                }
            }
        }
    }
    for col in ["nbdU/inproc", "nbdT1/inproc", "nbdU/nbdU1", "nbdT/nbdT1"] {
        assert!(out.contains(col), "no {col} column:\n{out}");
    }
    assert!(!out.contains("skipped"), "{out}");
    assert!(!work_dir_of(pid).exists(), "work directory left behind");
    let servers =
        std::process::Command::new("pgrep").args(["-f", &format!("rext4-bench-suite-{pid}/")]).output();
    if let Ok(o) = servers {
        assert!(o.stdout.is_empty(), "a server is left: {}", String::from_utf8_lossy(&o.stdout));
    }
}

/// `fsx` at tiny size on kernel ext4 and, where FUSE and the `rext4` beside the bench are
/// there, on the mount by default and with `nodelalloc`: each configuration passes with its
/// seed and operation count in the table, and nothing stays in the work directory; an unknown
/// configuration is refused.
#[test]
fn fsx_workload_runs_each_configuration() {
    rext4_testkit::require_kernel!();
    let fsx_installed = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo/bin")))
        .any(|d| d.join("fsx").is_file());
    if !fsx_installed {
        eprintln!("SKIP: fsx is not installed (.ci/setup installs it)");
        return;
    }
    let mut configs = vec!["kernel"];
    let rext4 = Path::new(env!("CARGO_BIN_EXE_rext4-bench")).with_file_name("rext4");
    if Path::new("/dev/fuse").exists() && rext4.is_file() {
        configs.extend(["default", "nodelalloc"]);
    } else {
        eprintln!("fuse configurations skipped: no /dev/fuse or no {}", rext4.display());
    }
    let cwd = tempfile::tempdir().unwrap();
    let (pid, out) = run_ok(
        bench()
            .args(["fsx", "--tiny", "--seed", "7", "--configs", &configs.join(",")])
            .current_dir(cwd.path()),
    );
    for (name, seed) in [("kernel", 12), ("default", 7), ("nodelalloc", 11)] {
        if configs.contains(&name) {
            let line =
                out.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} row:\n{out}"));
            let cols: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(cols[1..3], [seed.to_string(), "2000".to_string()], "{line}");
            assert!(line.ends_with("pass"), "{line}");
        }
    }
    assert!(!work_dir_named("fsx", pid).exists(), "work directory left behind");
    assert_eq!(std::fs::read_dir(cwd.path()).unwrap().count(), 0, "nothing kept after passing runs");
    let bad = bench().args(["fsx", "--tiny", "--configs", "nosuch"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown configuration nosuch"));
}
