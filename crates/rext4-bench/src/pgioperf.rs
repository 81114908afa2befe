//! `pgioperf` (seed 003, after mmtests' PostgreSQL simulation): N random readers and one random
//! writer on a large file, while one more worker appends 8 KiB to a small file and fsyncs it in
//! a loop. Reports the fsync latency (mean, standard deviation, p99, maximum, top five: how long
//! a commit can be held up by data writeback), read and write rates, the readers' CPU time
//! per read beside the cost of the copy alone (`copy_floor`), and for rext4 in process the
//! journal's own commit times over the run.

use super::report::Out;
use super::targets::{ImageSpec, Target};
use super::Sizes;
use crate::rng::Rng;
use crate::CliResult;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PAGE: usize = 8192;
/// The small file wraps around at this size, as a WAL segment would be recycled.
const WAL_MAX: u64 = 16 << 20;

pub(crate) fn image(sz: &Sizes, _max_workers: usize) -> ImageSpec {
    ImageSpec { inodes: 16_384, mib: sz.pg_mib + sz.pg_mib / 4 + 128, ..ImageSpec::default() }
}

/// Latency figures (microseconds, fractional: a tmpfs fsync takes less than one) in seed 003's
/// terms.
pub(crate) fn summary(v: &[f64]) -> serde_json::Value {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|&x| (x - mean).powi(2)).sum::<f64>() / n;
    let mut s = v.to_vec();
    s.sort_unstable_by(|a, b| b.total_cmp(a));
    let p99 = s.get(s.len() / 100).copied().unwrap_or(0.0);
    serde_json::json!({
        "count": v.len(), "mean_us": mean, "stddev_us": var.sqrt(), "p99_us": p99,
        "max_us": s.first().copied().unwrap_or(0.0), "top5_us": s.iter().take(5).collect::<Vec<_>>(),
    })
}

pub(crate) fn run(t: &dyn Target, workers: usize, sz: &Sizes) -> CliResult<Out> {
    let root = t.root();
    let big = t.create(root, "pgio.big")?;
    let pages = (sz.pg_mib << 20) / PAGE as u64;
    let chunk: Vec<u8> = (0..1usize << 20).map(|i| (i * 7 + 3) as u8).collect();
    for off in (0..sz.pg_mib << 20).step_by(1 << 20) {
        t.write_at(&big, off, &chunk)?;
    }
    t.fsync(&big)?;
    let wal = t.create(root, "pgio.wal")?;
    let before = t.engine().and_then(|fs| fs.commit_stats()).unwrap_or_default();

    let stop = AtomicBool::new(false);
    let (reads, writes) = (AtomicU64::new(0), AtomicU64::new(0));
    // CPU time the readers used, in nanoseconds: on two cores the readers share the CPUs
    // with the writer and the fsync loop, so their rate also says how much CPU those left.
    let read_cpu = AtomicU64::new(0);
    let dur = Duration::from_secs_f64(sz.pg_secs);
    let start = Instant::now();
    let lat: CliResult<Vec<f64>> = std::thread::scope(|s| {
        let mut hs = Vec::new();
        for r in 0..workers {
            let (stop, reads, big, read_cpu) = (&stop, &reads, &big, &read_cpu);
            hs.push(s.spawn(move || -> CliResult {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (r as u64 + 1));
                let mut buf = vec![0u8; PAGE];
                let mut n = 0;
                let cpu0 = thread_cpu_ns();
                // At least one of each operation, however late a loaded machine runs the
                // thread: every figure has a sample.
                loop {
                    t.read_at(big, rng.next() % pages * PAGE as u64, &mut buf)?;
                    n += 1;
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
                read_cpu.fetch_add(thread_cpu_ns().saturating_sub(cpu0), Ordering::Relaxed);
                reads.fetch_add(n, Ordering::Relaxed);
                Ok(())
            }));
        }
        let (stop2, writes, big) = (&stop, &writes, &big);
        hs.push(s.spawn(move || -> CliResult {
            let mut rng = Rng(0xD1B5_4A32_D192_ED03);
            let page = vec![0x5Au8; PAGE];
            let mut n = 0;
            loop {
                t.write_at(big, rng.next() % pages * PAGE as u64, &page)?;
                n += 1;
                if stop2.load(Ordering::Relaxed) {
                    break;
                }
            }
            writes.fetch_add(n, Ordering::Relaxed);
            Ok(())
        }));
        let record = vec![0x17u8; PAGE];
        let mut lat = Vec::new();
        let mut off = 0u64;
        let mut r = Ok(());
        while lat.is_empty() || start.elapsed() < dur {
            let t0 = Instant::now();
            r = t.write_at(&wal, off, &record).and_then(|()| t.fsync(&wal));
            if r.is_err() {
                break;
            }
            lat.push(t0.elapsed().as_nanos() as f64 / 1e3);
            off = (off + PAGE as u64) % WAL_MAX;
        }
        stop.store(true, Ordering::Relaxed);
        for h in hs {
            h.join().map_err(|_| "worker panicked".to_string())??;
        }
        r.map(|()| lat)
    });
    let lat = lat?;
    let secs = start.elapsed().as_secs_f64();
    let mut out = Out::default();
    let sum = summary(&lat);
    let get = |k: &str| sum[k].as_f64().unwrap_or(0.0);
    out.time("fsync_mean", "us", get("mean_us"));
    out.extra(serde_json::json!({ "summary": sum, "latencies_us": lat }));
    out.time("fsync_stddev", "us", get("stddev_us"));
    out.time("fsync_p99", "us", get("p99_us"));
    out.time("fsync_max", "us", get("max_us"));
    out.rate("fsyncs", "ops/s", lat.len() as f64 / secs);
    let n_reads = reads.load(Ordering::Relaxed);
    out.rate("reads", "ops/s", n_reads as f64 / secs);
    // What a read costs its thread (user and system time: the kernel's system call too).
    out.time("read_cpu", "ns/op", read_cpu.load(Ordering::Relaxed) as f64 / n_reads.max(1) as f64);
    out.rate("writes", "ops/s", writes.load(Ordering::Relaxed) as f64 / secs);
    out.time("copy_floor", "ns/op", copy_floor(pages));
    if let Some(cs) = t.engine().and_then(|fs| fs.commit_stats()) {
        let n = (cs.commits - before.commits) as usize;
        let times = &cs.times_us[cs.times_us.len().saturating_sub(n)..];
        let c = summary(&times.iter().map(|&t| t as f64).collect::<Vec<_>>());
        out.time("commit_mean", "us", c["mean_us"].as_f64().unwrap_or(0.0));
        out.extra(serde_json::json!({ "summary": c, "commit_times_us": times }));
        // What held the slow commits up: on a machine with more busy threads than cores, a
        // committing thread that loses its CPU waits a scheduler tick or more.
        out.notes.push(format!(
            "{workers} readers: {} commits over 1 ms, {} of them preempted while committing, {:.1} ms of theirs waiting for handles",
            cs.slow - before.slow,
            cs.slow_preempted - before.slow_preempted,
            (cs.slow_drain_us - before.slow_drain_us) as f64 / 1e3
        ));
    }
    let top: Vec<String> = sum["top5_us"]
        .as_array()
        .map(|a| a.iter().map(|v| format!("{:.6}s", v.as_f64().unwrap_or(0.0) / 1e6)).collect())
        .unwrap_or_default();
    out.notes.push(format!("{workers} readers: fsync top 5 {}", top.join(", ")));
    t.close(big)?;
    t.close(wal)?;
    t.unlink(root, "pgio.big")?;
    t.unlink(root, "pgio.wal")?;
    Ok(out)
}

/// What a read cannot cost less than here: the CPU time of copying 8 KiB from a random place
/// in a buffer of `pages` pages (the big file's size) in this process, in nanoseconds. On a
/// working set larger than the processor's caches this is mostly waiting on memory, and it
/// is the same copy every target's read ends with.
fn copy_floor(pages: u64) -> f64 {
    let src: Vec<u8> = (0..pages as usize * PAGE).map(|i| (i * 13) as u8).collect();
    let mut dst = vec![0u8; PAGE];
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    const N: u64 = 100_000;
    let cpu0 = thread_cpu_ns();
    for _ in 0..N {
        let at = (rng.next() % pages) as usize * PAGE;
        dst.copy_from_slice(&src[at..at + PAGE]);
        std::hint::black_box(&mut dst);
    }
    thread_cpu_ns().saturating_sub(cpu0) as f64 / N as f64
}

/// CPU time of the calling thread so far, in nanoseconds (0 where the clock is missing).
fn thread_cpu_ns() -> u64 {
    use nix::time::{clock_gettime, ClockId};
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec()).unwrap_or(0)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn summary_figures() {
        let s = super::summary(&[1.0, 2.0, 3.0, 4.0, 10.0]);
        assert_eq!(s["mean_us"].as_f64(), Some(4.0));
        assert_eq!(s["max_us"].as_f64(), Some(10.0));
        assert_eq!(s["top5_us"].as_array().map(|a| a.len()), Some(5));
    }
}
