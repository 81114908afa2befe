//! Child processes for tests that could abort or spin: a hang or a crash `catch_unwind`
//! cannot catch (stack overflow, abort) is reported with the case that caused it.

use super::walk::{open_and_light_walk, open_and_walk};
use super::{fixture, Variant};
use rext4::dev::{BlockDevice, MemDevice};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(super) const CHILD_ENV: &str = "REXT4_CORRUPTION_CHILD";
pub(super) const START_ENV: &str = "REXT4_CORRUPTION_START";

pub(super) fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

pub(super) fn in_child(name: &str) -> bool {
    std::env::var(CHILD_ENV).as_deref() == Ok(name)
}

/// Spawns this test binary running only test `name` in child mode, with `start` as the first
/// case. Returns the child and a thread collecting its stderr.
pub(super) fn spawn_child(
    name: &str,
    start: usize,
) -> (std::process::Child, std::thread::JoinHandle<String>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .env(START_ENV, start.to_string())
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let h = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    });
    (child, h)
}

pub(super) fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs `body` in a child process (running only test `name`), killing it after `timeout`.
/// Fails if the child fails, crashes (stack overflow, abort) or times out.
pub(super) fn isolated(name: &str, timeout: Duration, body: impl FnOnce()) {
    if in_child(name) {
        body();
        return;
    }
    let (mut child, err) = spawn_child(name, 0);
    let mut out = child.stdout.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = format!("{}\n{}", out.join().unwrap(), err.join().unwrap());
    match status {
        None => panic!("{name}: HANG, no result after {timeout:?}\n{}", tail(&text, 30)),
        Some(st) if !st.success() => {
            panic!(
                "{name}: child failed ({st}; a signal means a crash such as a stack overflow)\n{}",
                tail(&text, 40)
            )
        }
        Some(_) => {
            assert!(text.contains("1 passed"), "{name}: the child did not run the test\n{}", tail(&text, 10))
        }
    }
}

/// One sweep or random case: patches to one fixture, then a walk.
pub(super) struct Case {
    pub(super) desc: String,
    pub(super) variant: Variant,
    pub(super) patches: Vec<(usize, Vec<u8>)>,
    /// Full walk (everything reachable) rather than the light one (the fixture paths).
    pub(super) full: bool,
}

/// The panic hook of sweep children: the message, location and the engine frames of the
/// backtrace, for the parent's report.
pub(super) fn install_reporting_hook() {
    std::panic::set_hook(Box::new(|info| {
        let bt = std::backtrace::Backtrace::force_capture().to_string();
        let frames: Vec<String> = bt
            .lines()
            .map(str::trim)
            .filter(|l| l.contains("rext4") && !l.contains("corruption::") && !l.starts_with("at "))
            .take(8)
            .map(|l| l.split_once(": ").map_or(l, |x| x.1).to_string())
            .collect();
        *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) =
            format!("{} [engine frames: {}]", info.to_string().replace('\n', " "), frames.join(" <- "));
    }));
}

pub(super) static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

/// Runs `cases()` in child processes. A child prints `CASE i` before each case and `PANIC i ...`
/// for a caught panic; a watchdog thread ends it (`HANG i ...`, exit 3) when a case runs longer
/// than `per_case`. The parent restarts after a hung or crashed case, so every case runs (up to
/// `REXT4_CORRUPTION_MAX_HANGS` hangs and crashes), then fails listing every problem.
pub(super) fn run_cases(name: &str, per_case: Duration, cases: impl FnOnce() -> Vec<Case>) {
    if in_child(name) {
        run_cases_child(per_case, cases());
        return;
    }
    let max_hangs = env_usize("REXT4_CORRUPTION_MAX_HANGS", 3);
    let mut problems = Vec::new();
    let (mut start, mut hangs, mut ran) = (0usize, 0usize, 0usize);
    loop {
        let (mut child, err) = spawn_child(name, start);
        let (mut last, mut done, mut hung) = (None, false, false);
        for line in BufReader::new(child.stdout.take().unwrap()).lines() {
            let line = line.unwrap_or_default();
            if let Some(i) = line.strip_prefix("CASE ") {
                last = i.parse::<usize>().ok();
                ran += 1;
            } else if line.starts_with("PANIC ") {
                problems.push(line);
            } else if line.starts_with("HANG ") {
                problems.push(line);
                hung = true;
            } else if line == "DONE" {
                done = true;
            }
        }
        let status = child.wait().unwrap();
        let err = err.join().unwrap();
        if done && status.success() {
            break;
        }
        let Some(last) = last else {
            panic!("{name}: child failed before its first case ({status}):\n{}", tail(&err, 40));
        };
        if !hung {
            problems.push(format!("CRASH {last} ({status}): {}", tail(&err, 6).replace('\n', " | ")));
        }
        hangs += 1;
        if hangs >= max_hangs {
            problems.push(format!(
                "(stopped after {hangs} hangs/crashes; set REXT4_CORRUPTION_MAX_HANGS to go on)"
            ));
            break;
        }
        start = last + 1;
    }
    eprintln!("{name}: {ran} cases run");
    assert!(problems.is_empty(), "{name}: {} problems:\n{}", problems.len(), problems.join("\n"));
}

pub(super) fn run_cases_child(per_case: Duration, cases: Vec<Case>) {
    install_reporting_hook();
    let start = env_usize(START_ENV, 0);
    let current: Arc<Mutex<(usize, String, Instant)>> =
        Arc::new(Mutex::new((start, String::new(), Instant::now())));
    let watched = current.clone();
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(100));
        let g = watched.lock().unwrap_or_else(|e| e.into_inner());
        if g.2.elapsed() > per_case {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "HANG {} {}: no result after {per_case:?}", g.0, g.1);
            let _ = out.flush();
            std::process::exit(3);
        }
    });
    let mut devs: HashMap<Variant, Arc<MemDevice>> = HashMap::new();
    // The harness has printed "test NAME ... " without a newline.
    println!();
    let skip: Vec<String> = std::env::var("REXT4_CORRUPTION_SKIP")
        .map(|v| v.split(',').filter(|s| !s.is_empty()).map(String::from).collect())
        .unwrap_or_default();
    for (i, c) in cases.iter().enumerate().skip(start) {
        if skip.iter().any(|s| c.desc.contains(s.as_str())) {
            continue;
        }
        *current.lock().unwrap() = (i, format!("{:?} {}", c.variant, c.desc), Instant::now());
        println!("CASE {i}");
        let f = fixture(c.variant).expect("fixture");
        let dev = devs.entry(c.variant).or_insert_with(|| Arc::new(MemDevice::new(f.bytes.clone())));
        for (o, b) in &c.patches {
            dev.write_at(b, *o as u64).unwrap();
        }
        let r = if c.full { open_and_walk(dev.clone()).map(|_| ()) } else { open_and_light_walk(dev) };
        for (o, b) in &c.patches {
            dev.write_at(&f.bytes[*o..*o + b.len()], *o as u64).unwrap();
        }
        if let Err(p) = r {
            println!("PANIC {i} {:?} {}: {}", c.variant, c.desc, p.replace('\n', " "));
        }
    }
    // Stop the watchdog from firing while the harness winds down.
    *current.lock().unwrap() = (usize::MAX, "done".into(), Instant::now() + Duration::from_secs(3600));
    println!("DONE");
}
