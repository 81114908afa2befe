//! The benchmark harness itself (no timing assertions): every workload runs at tiny size on
//! rext4 in process and on tmpfs and reports sane, non-zero figures in its tables, JSON and
//! plot; nothing stays mounted or on disk afterwards, also when interrupted.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SUITE: [&str; 6] = ["mdtest", "creat_clo", "stress_orphan", "lockperf", "pgioperf", "seqio"];

fn rext4() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rext4"))
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
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
    let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    base.join(format!("rext4-bench-suite-{pid}"))
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
    let child = rext4()
        .args(["bench", "--tiny", "--targets", "inproc,tmpfs", "--workers", "1,3", "--json"])
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (status, out, err) = wait_with_output(child);
    assert!(status.success(), "bench failed:\n{out}\n{err}");

    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let samples = v["samples"].as_array().unwrap();
    for wl in SUITE {
        for target in ["inproc", "tmpfs"] {
            let mine: Vec<_> =
                samples.iter().filter(|s| s["workload"] == wl && s["target"] == target).collect();
            if wl == "lockperf" && target == "inproc" {
                // No file-lock API in the engine: skipped, and said so.
                assert!(mine.is_empty());
                let notes = v["notes"].as_array().unwrap();
                assert!(
                    notes.iter().any(|n| n.as_str().unwrap().starts_with("lockperf / inproc: skipped")),
                    "{notes:?}"
                );
                continue;
            }
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

    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.trim_end().ends_with("</svg>"));
    assert!(plot.contains("mdtest: create (ops/s)") && plot.matches("<polyline").count() >= 10);

    assert!(mounts_of(pid).is_empty());
    assert!(!work_dir_of(pid).exists(), "work directory left behind");
}

#[test]
fn unavailable_targets_are_skipped_with_a_note() {
    let out = rext4()
        .args(["bench", "creat_clo", "--tiny", "--workers", "1", "--targets", "tmpfs,fuse2fs"])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("fuse2fs: skipped: fuse2fs is not installed"), "{text}");
    let bad = rext4().args(["bench", "nosuch"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown workload nosuch"));
}

/// Ctrl-C while a mounted target runs: everything is unmounted and removed.
#[test]
fn interrupted_run_leaves_no_mount_behind() {
    if !is_root() {
        eprintln!("skipped: mounting needs root");
        return;
    }
    let mut targets = vec!["kernel"];
    if Path::new("/dev/fuse").exists() {
        targets.push("fuse");
    }
    if std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("fuse2fs").is_file()))
    {
        targets.push("fuse2fs");
    }
    for target in targets {
        let child = rext4()
            .args(["bench", "pgioperf", "--tiny", "--workers", "2", "--secs", "60", "--targets", target])
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

#[test]
fn stats_needs_a_rext4_mount() {
    let out = rext4().args(["stats", "/"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no rext4 daemon serves this mount"), "{err}");
    let out = rext4().args(["stats", "/nonexistent-dir"]).output().unwrap();
    assert!(!out.status.success());
}

/// `rext4 stats` on a mount served by `rext4 mount`: the daemon's operation table, lock waits
/// and commits; `--reset` zeroes the operations; the socket goes with the daemon.
#[test]
fn stats_of_a_rext4_mount() {
    if !is_root() || std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").is_err() {
        eprintln!("skipped: FUSE mounts need root and /dev/fuse");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (img, mp) = (dir.path().join("img"), dir.path().join("mnt"));
    std::fs::create_dir(&mp).unwrap();
    let o = Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img).arg("64M").output().unwrap();
    assert!(o.status.success());
    let o = rext4().arg("mount").arg(&img).arg(&mp).args(["-o", "rw"]).output().unwrap();
    assert!(o.status.success(), "mount: {}", String::from_utf8_lossy(&o.stderr));
    /// Detaches the mount if an assertion fails before the test unmounts it.
    struct Detach(PathBuf);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).stderr(Stdio::null()).status();
        }
    }
    let _detach = Detach(mp.clone());
    for i in 0..300 {
        std::fs::write(mp.join(format!("f{i}")), b"x").unwrap();
    }
    let json = |extra: &[&str]| -> serde_json::Value {
        let o = rext4().arg("stats").arg(&mp).arg("--json").args(extra).output().unwrap();
        assert!(o.status.success(), "stats: {}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let count = |v: &serde_json::Value, name: &str| {
        v["ops"].as_array().unwrap().iter().find(|o| o["name"] == name).unwrap()["count"].as_u64().unwrap()
    };
    let v = json(&["--reset"]);
    assert!(count(&v, "ext4_create") > 0, "{v}");
    assert!(v["locks"].as_array().unwrap().iter().any(|l| l["acquired"].as_u64() > Some(0)));
    assert!(v["commits"].is_object(), "a writable mount reports commits: {v}");
    let after = json(&[]);
    assert_eq!(count(&after, "ext4_create"), 0, "--reset zeroes operations");
    let text = rext4().arg("stats").arg(&mp).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("FUNC") && text.contains("LOCK") && text.contains("journal commits"), "{text}");

    assert!(Command::new("umount").arg(&mp).status().unwrap().success());
    // The daemon commits, removes its socket and lets go of the image.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let f = std::fs::File::open(&img).unwrap();
        if nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok() {
            break;
        }
        assert!(Instant::now() < until, "the daemon did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = rext4().arg("stats").arg(&mp).output().unwrap();
    assert!(!o.status.success(), "no daemon after umount");
    let o = Command::new("e2fsck").arg("-fn").arg(&img).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
}

/// `rext4 memfs`, the FUSE ceiling the bench measures: names come and go through a real
/// mount with the kernel's errnos for the cases it serves, and unmounting ends it cleanly.
#[test]
fn memfs_serves_names_through_a_mount() {
    if !is_root() || !Path::new("/dev/fuse").exists() {
        eprintln!("not root or no /dev/fuse: skipping");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mnt = mnt.canonicalize().unwrap();
    let child = rext4().arg("memfs").arg(&mnt).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    // Takes the mount and the daemon down if an assertion fails first.
    struct Down(PathBuf, Option<Child>);
    impl Drop for Down {
        fn drop(&mut self) {
            if let Some(mut c) = self.1.take() {
                let _ = Command::new("umount").arg("-l").arg(&self.0).status();
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    let mut down = Down(mnt.clone(), Some(child));
    let mounted = |p: &Path| {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(p.to_str().unwrap()))
    };
    let start = Instant::now();
    while !mounted(&mnt) {
        let c = down.1.as_mut().unwrap();
        assert!(c.try_wait().unwrap().is_none(), "memfs exited before mounting");
        assert!(start.elapsed() < Duration::from_secs(20), "memfs did not mount");
        std::thread::sleep(Duration::from_millis(20));
    }
    let errno = |r: std::io::Result<()>| r.err().and_then(|e| e.raw_os_error());
    let d = mnt.join("d");
    std::fs::create_dir(&d).unwrap();
    for i in 0..50 {
        std::fs::File::create(d.join(format!("f{i}"))).unwrap();
    }
    let excl = std::fs::OpenOptions::new().write(true).create_new(true).open(d.join("f7"));
    assert_eq!(errno(excl.map(|_| ())), Some(libc::EEXIST));
    assert!(std::fs::metadata(d.join("f7")).unwrap().is_file());
    assert_eq!(std::fs::metadata(&d).unwrap().nlink(), 2);
    let mut names: Vec<String> =
        std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    let mut want: Vec<String> = (0..50).map(|i| format!("f{i}")).collect();
    want.sort();
    assert_eq!(names, want);
    assert_eq!(errno(std::fs::remove_dir(&d)), Some(libc::ENOTEMPTY));
    assert_eq!(errno(std::fs::remove_file(&d)), Some(libc::EISDIR));
    for i in 0..50 {
        std::fs::remove_file(d.join(format!("f{i}"))).unwrap();
    }
    assert_eq!(errno(std::fs::metadata(d.join("f7")).map(|_| ())), Some(libc::ENOENT));
    std::fs::remove_dir(&d).unwrap();
    assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0);
    let st = Command::new("umount").arg(&mnt).status().unwrap();
    assert!(st.success(), "umount failed");
    let (status, _, err) = wait_with_output(down.1.take().unwrap());
    assert!(status.success(), "memfs exited with {status}: {err}");
}
