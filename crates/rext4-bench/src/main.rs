//! `rext4-bench`: the seeds' workloads as one suite, run side by side on rext4 in process, rext4
//! mounted through FUSE, kernel ext4 (loop device over tmpfs), fuse2fs and plain tmpfs, each on
//! a fresh image made by `mkfs.ext4` with the same arguments. Results: a table per workload and
//! metric with ratio columns against kernel ext4, every sample as JSON, an SVG plot of rates
//! against workers, and the in-process engine's own statistics (`rext4 stats` format).
//!
//! Workloads are written once against [`targets::Target`]. The suite makes and removes its own
//! images and mounts under one work directory in tmpfs; Ctrl-C (or SIGTERM, SIGHUP) takes down
//! every mount and daemon and removes the directory before exiting.
//!
//! `walk`, `journal` and `orphan` are comparisons of their own (an image walked; journaled
//! against unjournaled chmod; orphan file against orphan list); `fuse` is `mdtest` on the
//! mounted targets.

// Timings, sizes and report formatting of the host's own numbers; the cast lints are for
// the code that reads images.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
#![forbid(unsafe_code)]

mod app;
mod creat_clo;
mod fsx;
mod journal;
mod lockperf;
mod mdtest;
mod mkfs;
mod orphan;
mod pgioperf;
mod report;
mod seqio;
mod stress_orphan;
mod targets;
mod walk;

use clap::Parser;
use report::{Out, Results};
use rext4_cli::{rng, CliResult};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use targets::{ImageSpec, Kind, Target};

// The allocator the `rext4` binary runs the engine with (its main.rs says why), so that the
// in-process target measures the engine as the FUSE daemon runs it.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `rext4-bench [WORKLOAD...] [options]`.
#[derive(Parser, Debug)]
#[command(
    name = "rext4-bench",
    version,
    about = "The seeds' workloads as one benchmark suite, side by side on rext4 in process, rext4 \
             through FUSE, kernel ext4, fuse2fs and tmpfs"
)]
pub struct BenchArgs {
    /// Workloads to run: mdtest, creat_clo, stress_orphan, lockperf, pgioperf, seqio, app (default:
    /// all of them); also fsx (the fsx exerciser through the mount in each page cache and
    /// transport configuration, --ops operations each), mkfs (`rext4 mkfs --from` against `mkfs.ext4 -d`: --files small
    /// files, then --mib MiB of large ones), walk, journal, orphan (orphan file against list, in process and the
    /// kernel) and fuse (mdtest on fuse, kernel and fuse2fs).
    workloads: Vec<String>,
    /// Targets, in any order: inproc, fuse, kernel, fuse2fs, tmpfs.
    #[arg(long, alias = "target", value_delimiter = ',')]
    targets: Option<Vec<String>>,
    /// Worker counts (threads).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 8, 48])]
    workers: Vec<usize>,
    /// Smaller sizes: the whole suite in a few minutes.
    #[arg(long)]
    quick: bool,
    /// Tiny sizes, for testing the harness itself.
    #[arg(long, hide = true)]
    tiny: bool,
    /// Repetitions of each measurement (tables show the median; JSON has every sample).
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Write every sample as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write an SVG plot of every rate against workers to FILE.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Files per worker (mdtest), loops per worker (creat_clo); walk: files in its image.
    #[arg(long)]
    files: Option<usize>,
    /// Size in MiB of the large files (seqio: total; pgioperf: the large file).
    #[arg(long)]
    mib: Option<u64>,
    /// Seconds per measurement (pgioperf, journal).
    #[arg(long)]
    secs: Option<f64>,
    /// fsx: operations per configuration (default 1,000,000; --quick 100,000).
    #[arg(long)]
    ops: Option<u64>,
    /// fsx: the seed of the first configuration (each next one takes the next number).
    #[arg(long, default_value_t = 1001)]
    seed: u64,
    /// fsx: configurations to run (default all: default, writeback_cache, io_uring,
    /// io_uring+writeback_cache, nodelalloc, kernel).
    #[arg(long, value_delimiter = ',')]
    configs: Option<Vec<String>>,
    /// walk: use this image instead of building one.
    #[arg(long)]
    image: Option<PathBuf>,
    /// walk: timed rounds per target (the best is reported); mkfs: rounds of each program
    /// (the median is reported).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Extra mkfs.ext4 arguments for every image, e.g. "-O orphan_file" or "-J size=1024".
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    mkfs: Option<String>,
    /// rext4's metadata cache in MiB (default: the engine's, a sixteenth of memory and at least
    /// 64 MiB), in process and for the daemon (`-o cache=`); in process the inode and name
    /// caches grow with it (4,096 entries a MiB). The kernel's page cache is bounded only by
    /// memory.
    #[arg(long, value_name = "MIB")]
    cache: Option<u64>,
    /// More `-o` options for the daemon of the fuse target, e.g. "locks=engine" or
    /// "writeback_cache".
    #[arg(long, value_name = "OPTS")]
    fuse_opts: Option<String>,
    /// rext4 without delayed allocation (every write allocates at once), in process and for
    /// the daemon (`-o nodelalloc`).
    #[arg(long)]
    nodelalloc: bool,
    /// In process: quota limits enforced (usrquota, grpquota, prjquota), with limits no
    /// workload reaches set for root's ids; the image needs the quota feature (`--mkfs`).
    #[arg(long)]
    quota_limits: bool,
    /// In process: every directory the workloads make is casefolded (`chattr +F`); the image
    /// needs the casefold feature (`--mkfs "-O casefold"`).
    #[arg(long)]
    casefold_dirs: bool,
    /// Skip the unrecorded first run of each workload on each target (caches, daemon threads
    /// and the journal warmed up, as the seeds' mdtest runs did).
    #[arg(long)]
    no_warmup: bool,
    /// Do not print the in-process engine's statistics.
    #[arg(long)]
    no_stats: bool,
    /// Let the scheduler place workers even when there are no more of them than CPUs (by
    /// default worker `w` is bound to the `w`-th CPU this process may use, as MPI binds the
    /// seeds' mdtest ranks).
    #[arg(long)]
    no_pin: bool,
    /// The `rext4` program serving the fuse and fusemem targets (default: the one beside this
    /// program, else the one on PATH).
    #[arg(long, value_name = "PATH")]
    rext4: Option<PathBuf>,
}

fn main() -> ExitCode {
    match run(BenchArgs::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rext4-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Sizes of everything, by mode.
#[derive(Clone, Debug)]
pub struct Sizes {
    /// mdtest: files per worker.
    pub files: usize,
    /// creat_clo: loops per worker.
    pub creat: usize,
    /// stress_orphan: file size truncated byte by byte, and rounds.
    pub trunc_bytes: u64,
    pub trunc_rounds: u64,
    /// lockperf: lock/unlock pairs per worker and test.
    pub lock_iters: usize,
    /// pgioperf: large file MiB, seconds.
    pub pg_mib: u64,
    pub pg_secs: f64,
    /// seqio: total MiB, small files per worker.
    pub seq_mib: u64,
    pub small_files: usize,
    /// app: files in the generated source tree, transactions of the fsync loop.
    pub app_files: usize,
    pub app_txns: usize,
}

impl Sizes {
    fn new(a: &BenchArgs) -> Sizes {
        let mut s = if a.tiny {
            Sizes {
                files: 20,
                creat: 20,
                trunc_bytes: 32,
                trunc_rounds: 1,
                lock_iters: 50,
                pg_mib: 4,
                pg_secs: 0.3,
                seq_mib: 4,
                small_files: 5,
                app_files: 60,
                app_txns: 20,
            }
        } else if a.quick {
            Sizes {
                files: 500,
                creat: 500,
                trunc_bytes: 512,
                trunc_rounds: 1,
                lock_iters: 2000,
                pg_mib: 64,
                pg_secs: 1.0,
                seq_mib: 256,
                small_files: 100,
                app_files: 1000,
                app_txns: 300,
            }
        } else {
            Sizes {
                files: 2000,
                creat: 2000,
                trunc_bytes: 2048,
                trunc_rounds: 1,
                lock_iters: 10_000,
                pg_mib: 256,
                pg_secs: 5.0,
                seq_mib: 1024,
                small_files: 500,
                app_files: 5000,
                app_txns: 2000,
            }
        };
        if let Some(f) = a.files {
            (s.files, s.creat) = (f, f);
        }
        if let Some(m) = a.mib {
            (s.seq_mib, s.pg_mib) = (m, m);
        }
        if let Some(t) = a.secs {
            s.pg_secs = t;
        }
        s
    }
}

/// A workload of the suite.
struct Workload {
    name: &'static str,
    image: fn(&Sizes, usize) -> ImageSpec,
    run: fn(&dyn Target, usize, &Sizes) -> CliResult<Out>,
}

const SUITE: [Workload; 7] = [
    Workload { name: "mdtest", image: mdtest::image, run: mdtest::run },
    Workload { name: "creat_clo", image: creat_clo::image, run: creat_clo::run },
    Workload { name: "stress_orphan", image: stress_orphan::image, run: stress_orphan::run },
    Workload { name: "lockperf", image: lockperf::image, run: lockperf::run },
    Workload { name: "pgioperf", image: pgioperf::image, run: pgioperf::run },
    Workload { name: "seqio", image: seqio::image, run: seqio::run },
    Workload { name: "app", image: app::image, run: app::run },
];

/// Whether `parallel` binds its workers to CPUs (cleared by `--no-pin`). [set before any
/// workload runs]
static PIN: AtomicBool = AtomicBool::new(true);

/// The CPUs this thread may run on, in order (empty if they cannot be read).
fn allowed_cpus() -> Vec<usize> {
    use nix::sched::{sched_getaffinity, CpuSet};
    let Ok(set) = sched_getaffinity(nix::unistd::Pid::from_raw(0)) else { return Vec::new() };
    (0..CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect()
}

/// Binds the calling thread to `cpu`. Unbound, two workers started together were seen
/// time-sliced on one CPU, 4 ms each, while the other CPU idled: a phase lasts 50 ms.
fn pin_to(cpu: usize) {
    use nix::sched::{sched_setaffinity, CpuSet};
    let mut set = CpuSet::new();
    if set.set(cpu).is_ok() {
        // Best effort: an unbound worker only measures less evenly.
        let _ = sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

/// Runs `f(worker)` on `workers` threads released together; the wall time from their release
/// until the last one finished (taken by the workers, so that a main thread scheduled late
/// does not stretch or shrink it).
pub fn parallel(workers: usize, f: impl Fn(usize) -> CliResult + Sync) -> CliResult<Duration> {
    // Timed from the first worker leaving the barrier (all of them spawned and waiting) to the
    // last one done, so thread creation is not part of the phase.
    let barrier = std::sync::Barrier::new(workers);
    // Bound only when each worker can have a CPU of its own, as MPI binds ranks by default;
    // oversubscribed workers are left to the scheduler, which moves them off a CPU whose
    // share finished early.
    let mut cpus = if PIN.load(Ordering::Relaxed) { allowed_cpus() } else { Vec::new() };
    if workers > cpus.len() {
        cpus.clear();
    }
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..workers)
            .map(|w| {
                let (b, f) = (&barrier, &f);
                let cpu = cpus.get(w).copied();
                s.spawn(move || {
                    if let Some(cpu) = cpu {
                        pin_to(cpu);
                    }
                    b.wait();
                    let start = Instant::now();
                    f(w).map(|()| (start, Instant::now()))
                })
            })
            .collect();
        let mut span: CliResult<Option<(Instant, Instant)>> = Ok(None);
        for h in hs {
            let x = h.join().map_err(|_| "worker panicked".to_string()).and_then(|x| x);
            span = match (span, x) {
                (Ok(None), Ok(b)) => Ok(Some(b)),
                (Ok(Some(a)), Ok(b)) => Ok(Some((a.0.min(b.0), a.1.max(b.1)))),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
        }
        span.map(|s| s.map_or(Duration::ZERO, |(a, b)| b - a))
    })
}

/// The journal size in MiB that mkfs arguments ask for (`-J size=N`), if any.
fn journal_mib(args: &[String]) -> Option<u64> {
    let opts = args.iter().zip(args.iter().skip(1)).filter(|(a, _)| *a == "-J").map(|(_, o)| o.as_str());
    let glued = args.iter().filter_map(|a| a.strip_prefix("-J")).filter(|o| !o.is_empty());
    opts.chain(glued).flat_map(|o| o.split(',')).find_map(|o| o.strip_prefix("size=")?.parse().ok())
}

/// Work directories alive now, removed by the Ctrl-C handler. [own mutex]
static WORK_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// A fresh work directory in tmpfs (like the seeds' ramdisks), or the temporary directory.
pub fn work_dir(what: &str) -> PathBuf {
    let base = targets::tmpfs_base().unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("rext4-bench-{what}-{}", std::process::id()));
    WORK_DIRS.lock().unwrap_or_else(|p| p.into_inner()).push(dir.clone());
    dir
}

fn remove_work_dir(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    WORK_DIRS.lock().unwrap_or_else(|p| p.into_inner()).retain(|d| d != dir);
}

/// Blocks the stop signals in this thread (so in every thread started after) and leaves them
/// to one thread that, on the first, takes down every mount and work directory, puts the
/// fuse module's `enable_uring` back, and exits.
fn install_signal_handler() -> CliResult {
    use nix::sys::signal::{SigSet, SigmaskHow, Signal};
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None)
        .map_err(|e| format!("cannot block signals: {e}"))?;
    std::thread::Builder::new()
        .name("bench-signals".into())
        .spawn(move || {
            if let Ok(sig) = set.wait() {
                eprintln!("\nrext4-bench: {sig}: unmounting and removing images");
                targets::teardown_all();
                // The daemons are gone: the fuse module's io_uring switch goes back too.
                targets::restore_uring();
                for d in std::mem::take(&mut *WORK_DIRS.lock().unwrap_or_else(|p| p.into_inner())) {
                    let _ = std::fs::remove_dir_all(d);
                }
                std::process::exit(130);
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    Ok(())
}

/// The progress line on standard error.
struct Progress {
    tty: bool,
    started: Instant,
}

impl Progress {
    fn show(&self, msg: &str) {
        let mut e = std::io::stderr();
        let secs = self.started.elapsed().as_secs();
        if self.tty {
            let _ = write!(e, "\r\x1b[2K[{:>3}:{:02}] {msg}", secs / 60, secs % 60);
        } else {
            let _ = writeln!(e, "[{:>3}:{:02}] {msg}", secs / 60, secs % 60);
        }
        let _ = e.flush();
    }

    fn done(&self) {
        if self.tty {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}

/// `rext4-bench`.
fn run(a: BenchArgs) -> CliResult {
    if a.workers.is_empty() || a.workers.contains(&0) || a.runs == 0 {
        return Err("bench: --workers needs counts of at least 1, --runs at least 1".into());
    }
    install_signal_handler()?;
    PIN.store(!a.no_pin, Ordering::Relaxed);
    targets::set_rext4(a.rext4.clone());
    let names: Vec<String> = if a.workloads.is_empty() {
        SUITE.iter().map(|w| w.name.to_string()).collect()
    } else {
        a.workloads.clone()
    };
    let mut suite = Vec::new();
    let mut targets = a.targets.clone();
    for n in &names {
        match n.as_str() {
            "mkfs" => mkfs::run(a.files.unwrap_or(100_000), a.mib.unwrap_or(4096), a.rounds.max(1))?,
            "walk" => walk::run(a.image.clone(), a.files.unwrap_or(100_000), a.rounds.max(1))?,
            "journal" => journal::run(&a.workers, a.secs.unwrap_or(2.0), a.runs)?,
            "orphan" => orphan::run(&a.workers, a.secs.unwrap_or(1.0))?,
            "fsx" => fsx::run(
                a.ops.unwrap_or(if a.tiny { 2_000 } else if a.quick { 100_000 } else { 1_000_000 }),
                a.seed,
                a.configs.as_deref(),
            )?,
            "fuse" => {
                targets.get_or_insert_with(|| {
                    vec!["fuse".into(), "fusemem".into(), "kernel".into(), "fuse2fs".into()]
                });
                suite.push("mdtest");
            }
            _ => match SUITE.iter().find(|w| w.name == n) {
                Some(w) => suite.push(w.name),
                None => {
                    return Err(format!(
                        "unknown workload {n} (mdtest, creat_clo, stress_orphan, lockperf, pgioperf, seqio, walk, journal, orphan, fuse, fsx, mkfs)"
                    ))
                }
            },
        }
    }
    if suite.is_empty() {
        return Ok(());
    }
    let mut kinds: Vec<Kind> = match &targets {
        Some(t) => t.iter().map(|s| Kind::parse(s)).collect::<CliResult<_>>()?,
        // The FUSE ceiling holds names only: asked for by name (and by `fuse`).
        // Nor the NBD targets (`--targets inproc,nbd-unix,...`).
        // Nor the io_uring variants, which turn on the fuse module's `enable_uring`.
        None => {
            Kind::ALL.into_iter().filter(|&k| k != Kind::FuseMem && !k.is_nbd() && !k.is_uring()).collect()
        }
    };
    kinds.sort();
    kinds.dedup();
    let work = work_dir("suite");
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let r = run_suite(&a, &suite, &kinds, &work);
    targets::restore_uring();
    remove_work_dir(&work);
    r
}

fn run_suite(a: &BenchArgs, suite: &[&str], kinds: &[Kind], work: &Path) -> CliResult {
    let sizes = Sizes::new(a);
    let mut results = Results {
        machine: report::Machine {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            quick: a.quick,
            tiny: a.tiny,
        },
        ..Results::default()
    };
    for &k in kinds {
        if let Some(why) = targets::unavailable(k) {
            results.note(format!("{}: skipped: {why}", k.name()));
        }
    }
    let kinds: Vec<Kind> = kinds.iter().copied().filter(|&k| targets::unavailable(k).is_none()).collect();
    let max_workers = a.workers.iter().copied().max().unwrap_or(1);
    let p = Progress { tty: std::io::stderr().is_terminal(), started: Instant::now() };
    let steps = suite.len() * kinds.len() * a.workers.len() * a.runs;
    let mut step = 0;
    let mut failures = 0;
    for wl in SUITE.iter().filter(|w| suite.contains(&w.name)) {
        let mut spec = (wl.image)(&sizes, max_workers);
        spec.extra = a.mkfs.as_deref().unwrap_or("").split_whitespace().map(str::to_string).collect();
        spec.cache_mib = a.cache;
        spec.fuse_opts = a.fuse_opts.clone();
        spec.nodelalloc = a.nodelalloc;
        spec.quota_limits = a.quota_limits;
        spec.casefold_dirs = a.casefold_dirs;
        // mkfs refuses a journal over half the filesystem (seed 000 used `-J size=4096`).
        if let Some(j) = journal_mib(&spec.extra) {
            spec.mib = spec.mib.max(2 * j + 256);
        }
        for &kind in &kinds {
            p.show(&format!("{}: setting up {} ({} MiB image)", wl.name, kind.name(), spec.mib));
            let built = match Built::new(kind, work, &spec) {
                Ok(b) => b,
                Err(why) => {
                    results.note(format!("{}: skipped: {why}", kind.name()));
                    step += a.workers.len() * a.runs;
                    continue;
                }
            };
            if !a.no_warmup {
                p.show(&format!("{}: warming up {}", wl.name, kind.name()));
                if let Err(e) = (wl.run)(built.target(), a.workers[0], &sizes) {
                    results.note(format!("{} / {}: warm-up failed: {e}", wl.name, kind.name()));
                }
                if let Some(fs) = built.target().engine() {
                    fs.reset_stats();
                }
            }
            let base = step;
            'workers: for &w in &a.workers {
                for run in 0..a.runs {
                    step += 1;
                    p.show(&format!("[{step}/{steps}] {} · {} · {w} workers", wl.name, kind.name()));
                    match (wl.run)(built.target(), w, &sizes) {
                        Ok(out) => results.add(wl.name, kind, w, run, out),
                        Err(e) => {
                            failures += 1;
                            results.note(format!(
                                "{} / {}: FAILED with {w} workers: {e}",
                                wl.name,
                                kind.name()
                            ));
                            step = base + a.workers.len() * a.runs;
                            break 'workers;
                        }
                    }
                }
            }
            p.show(&format!("{}: taking down {}", wl.name, kind.name()));
            if let Some(mib) = built.target().daemon().and_then(targets::peak_rss_mib) {
                results.note(format!("{} / {}: daemon peak RSS {mib:.1} MiB", wl.name, kind.name()));
            }
            if let Some(fs) = built.target().engine() {
                results.engine_stats.push((wl.name, fs.stats()));
            }
            if let Err(e) = built.finish(work) {
                failures += 1;
                results.note(format!("{} / {}: {e}", wl.name, kind.name()));
            }
        }
    }
    p.done();
    print_header(&results, &sizes, kinds.as_slice(), a.mkfs.as_deref());
    results.print_tables();
    if !a.no_stats {
        for (wl, r) in &results.engine_stats {
            println!("\n== rext4 in process: engine statistics during {wl} ==");
            print!("{}", rext4_cli::stats::tables(r));
        }
    }
    if let Some(path) = &a.json {
        results.write_json(path)?;
        println!("\nsamples written to {}", path.display());
    }
    if let Some(path) = &a.plot {
        std::fs::write(path, results.svg()).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("plot written to {}", path.display());
    }
    if failures > 0 {
        return Err(format!("{failures} run(s) failed; see the notes"));
    }
    Ok(())
}

fn print_header(r: &Results, sz: &Sizes, kinds: &[Kind], mkfs: Option<&str>) {
    println!(
        "rext4-bench on {} CPUs, Linux {}{}",
        r.machine.cpus,
        r.machine.kernel,
        if r.machine.tiny {
            " (tiny sizes)"
        } else if r.machine.quick {
            " (quick sizes)"
        } else {
            ""
        }
    );
    for k in kinds {
        println!("  {:<8} {}", k.name(), k.describe());
    }
    println!(
        "sizes: mdtest {} files/worker; creat_clo {} loops/worker; stress_orphan {} bytes x {}; lockperf {} locks/worker; pgioperf {} MiB, {} s; seqio {} MiB, {} small files/worker; app {} files, {} transactions",
        sz.files,
        sz.creat,
        sz.trunc_bytes,
        sz.trunc_rounds,
        sz.lock_iters,
        sz.pg_mib,
        sz.pg_secs,
        sz.seq_mib,
        sz.small_files,
        sz.app_files,
        sz.app_txns
    );
    println!(
        "images: mkfs.ext4 -N INODES {}IMAGE SIZE, the same for every target",
        mkfs.map_or(String::new(), |m| format!("{m} "))
    );
}

/// A target set up for one workload.
enum Built {
    InProc(targets::InProc),
    Mounted(targets::Mounted),
}

impl Built {
    fn new(kind: Kind, work: &Path, spec: &ImageSpec) -> CliResult<Built> {
        Ok(match kind {
            Kind::InProc => Built::InProc(targets::inproc(work, spec)?),
            k if k.is_nbd() => Built::InProc(targets::nbd(k, work, spec)?),
            _ => Built::Mounted(targets::mount(kind, work, spec)?),
        })
    }

    fn target(&self) -> &dyn Target {
        match self {
            Built::InProc(t) => t,
            Built::Mounted(t) => t,
        }
    }

    /// Unmounts and removes the image. rext4's own image must come out clean (`e2fsck -fn`).
    fn finish(self, work: &Path) -> CliResult {
        let kind = self.target().kind();
        let img = targets::image_path(work, kind);
        let r = match self {
            Built::InProc(t) => t.unmount().and_then(|()| fsck(&img)),
            Built::Mounted(m) => {
                drop(m);
                Ok(())
            }
        };
        let _ = std::fs::remove_file(&img);
        let _ = std::fs::remove_dir(work.join(format!("mnt-{}", kind.name())));
        r
    }
}

/// `e2fsck -fn`, if e2fsprogs is there.
fn fsck(img: &Path) -> CliResult {
    let Ok(out) = std::process::Command::new("e2fsck").arg("-fn").arg(img).output() else { return Ok(()) };
    if out.status.success() {
        Ok(())
    } else {
        let text = String::from_utf8_lossy(&out.stdout);
        Err(format!(
            "the image rext4 left is not clean (e2fsck -fn): {}",
            text.lines().take(6).collect::<Vec<_>>().join(" | ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::{allowed_cpus, journal_mib, parallel};
    use std::sync::Mutex;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn journal_size_from_mkfs_arguments() {
        assert_eq!(journal_mib(&args("-J size=4096")), Some(4096));
        assert_eq!(journal_mib(&args("-O orphan_file -Jsize=64,fast_commit_size=8")), Some(64));
        assert_eq!(journal_mib(&args("-J fast_commit_size=8,size=32 -b 4096")), Some(32));
        assert_eq!(journal_mib(&args("-O ^has_journal")), None);
        assert_eq!(journal_mib(&args("-J")), None);
    }

    #[test]
    fn images_have_4k_blocks_unless_mkfs_arguments_choose() {
        use super::targets::{mkfs, ImageSpec};
        let dir = tempfile::tempdir().unwrap();
        let block_size = |extra: &str| {
            let img = dir.path().join("img");
            let spec = ImageSpec { inodes: 4096, mib: 64, extra: args(extra), ..ImageSpec::default() };
            mkfs(&img, &spec).unwrap();
            let raw = std::fs::read(&img).unwrap();
            // s_log_block_size, at byte 24 of the superblock (which starts at byte 1024).
            1024u32 << u32::from_le_bytes(raw[1048..1052].try_into().unwrap())
        };
        // mke2fs alone would give a 64 MiB image 1 KiB blocks.
        assert_eq!(block_size(""), 4096);
        assert_eq!(block_size("-O orphan_file"), 4096);
        assert_eq!(block_size("-b 1024"), 1024);
        assert_eq!(block_size("-T small"), 1024);
    }

    #[test]
    fn workers_are_bound_only_when_each_has_a_cpu() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty(), "the process's CPUs can be read");
        let seen = Mutex::new(Vec::new());
        let record = |w: usize| {
            seen.lock().map_err(|_| "poisoned".to_string())?.push((w, allowed_cpus()));
            Ok(())
        };
        parallel(cpus.len(), record).unwrap();
        let mut got = std::mem::take(&mut *seen.lock().unwrap());
        got.sort();
        let want: Vec<_> = cpus.iter().enumerate().map(|(w, &c)| (w, vec![c])).collect();
        assert_eq!(got, want, "worker w runs on the w-th CPU only");
        parallel(cpus.len() + 1, record).unwrap();
        let got = std::mem::take(&mut *seen.lock().unwrap());
        assert_eq!(got.len(), cpus.len() + 1);
        assert!(got.iter().all(|(_, c)| *c == cpus), "oversubscribed workers keep every CPU");
    }
}
