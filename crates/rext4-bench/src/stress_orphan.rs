//! `stress_orphan` (seed 001): N workers each truncate their own file byte by byte, from its
//! full size down to zero, for a number of rounds. Every shrinking truncate records the inode
//! as an orphan until its transaction ends, so this measures orphan handling under
//! concurrency; total time, as the seed's table reports it, and truncates per second.

use super::report::Out;
use super::targets::{ImageSpec, Node, Target};
use super::{parallel, Sizes};
use crate::CliResult;

pub(crate) fn image(_sz: &Sizes, max_workers: usize) -> ImageSpec {
    ImageSpec { inodes: 65_536, mib: 256 + max_workers as u64, ..ImageSpec::default() }
}

pub(crate) fn run(t: &dyn Target, workers: usize, sz: &Sizes) -> CliResult<Out> {
    let root = t.root();
    let dir = t.mkdir(root, "stress_orphan")?;
    let files: Vec<Node> =
        (0..workers).map(|w| t.create(&dir, &format!("orphan.{w}"))).collect::<CliResult<_>>()?;
    let (bytes, rounds) = (sz.trunc_bytes, sz.trunc_rounds);
    let data = vec![0xA5u8; bytes as usize];
    let took = parallel(workers, |w| {
        let f = &files[w];
        for _ in 0..rounds {
            t.write_at(f, 0, &data)?;
            for len in (0..bytes).rev() {
                t.set_len(f, len)?;
            }
        }
        Ok(())
    })?;
    for (w, f) in files.into_iter().enumerate() {
        t.close(f)?;
        t.unlink(&dir, &format!("orphan.{w}"))?;
    }
    t.close(dir)?;
    t.rmdir(root, "stress_orphan")?;
    let mut out = Out::default();
    out.total_time("time", took.as_secs_f64());
    out.rate("truncates", "ops/s", (workers as u64 * bytes * rounds) as f64 / took.as_secs_f64());
    Ok(out)
}
