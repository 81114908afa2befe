//! `lockperf` (seed 002): each worker takes and drops a whole-file exclusive lock in a loop.
//! `posix01` / `flock01`: all workers lock one shared file (they contend); `posix02` /
//! `flock02`: each worker its own file (no contention: what is measured is the cost of the
//! lock path itself, and whether anything global sits on it). Each worker opens the file
//! itself, so the locks belong to different open files. Total time per test.

use super::report::Out;
use super::targets::{ImageSpec, LockKind, Node, Target};
use super::{parallel, Sizes};
use crate::CliResult;

pub(crate) fn image(_sz: &Sizes, _max_workers: usize) -> ImageSpec {
    ImageSpec { inodes: 65_536, mib: 256, ..ImageSpec::default() }
}

pub(crate) const TESTS: [(&str, LockKind, bool); 4] = [
    ("posix01", LockKind::Posix, true),
    ("posix02", LockKind::Posix, false),
    ("flock01", LockKind::Flock, true),
    ("flock02", LockKind::Flock, false),
];

pub(crate) fn run(t: &dyn Target, workers: usize, sz: &Sizes) -> CliResult<Out> {
    let mut out = Out::default();
    if !t.has_locks() {
        out.notes.push("skipped: this target takes no file locks".into());
        return Ok(out);
    }
    let root = t.root();
    let dir = t.mkdir(root, "lockperf")?;
    for w in 0..workers {
        t.close(t.create(&dir, &format!("lock.{w}"))?)?;
    }
    let iters = sz.lock_iters;
    for (test, kind, shared) in TESTS {
        let files: Vec<Node> = (0..workers)
            .map(|w| t.open(&dir, &format!("lock.{}", if shared { 0 } else { w })))
            .collect::<CliResult<_>>()?;
        let took = parallel(workers, |w| {
            for _ in 0..iters {
                t.lock(&files[w], kind, true)?;
                t.lock(&files[w], kind, false)?;
            }
            Ok(())
        })?;
        for f in files {
            t.close(f)?;
        }
        out.total_time(test, took.as_secs_f64());
    }
    for w in 0..workers {
        t.unlink(&dir, &format!("lock.{w}"))?;
    }
    t.close(dir)?;
    t.rmdir(root, "lockperf")?;
    Ok(out)
}
