//! `mdtest` (seed 000): N workers, each in its own directory, create F empty files (open with
//! O_CREAT|O_EXCL, close), stat them, remove them; operations per second per phase.

use super::report::Out;
use super::targets::{ImageSpec, Node, Target};
use super::{parallel, Sizes};
use crate::CliResult;

pub(crate) fn image(sz: &Sizes, max_workers: usize) -> ImageSpec {
    let files = (max_workers * sz.files) as u64;
    ImageSpec {
        inodes: (files + files / 10 + 10_000).max(65_536),
        mib: 256 + files / 256,
        ..ImageSpec::default()
    }
}

fn name(w: usize, i: usize) -> String {
    format!("file.mdtest.{w}.{i}")
}

pub(crate) fn run(t: &dyn Target, workers: usize, sz: &Sizes) -> CliResult<Out> {
    let root = t.root();
    let dirs: Vec<Node> =
        (0..workers).map(|w| t.mkdir(root, &format!("mdtest.{w}"))).collect::<CliResult<_>>()?;
    let files = sz.files;
    let phase = |f: &(dyn Fn(&Node, usize, usize) -> CliResult + Sync)| -> CliResult<f64> {
        let took = parallel(workers, |w| (0..files).try_for_each(|i| f(&dirs[w], w, i)))?;
        Ok((workers * files) as f64 / took.as_secs_f64())
    };
    let mut out = Out::default();
    let c = phase(&|d, w, i| t.close(t.create(d, &name(w, i))?))?;
    let s = phase(&|d, w, i| t.stat(d, &name(w, i)).map(|_| ()))?;
    let r = phase(&|d, w, i| t.unlink(d, &name(w, i)))?;
    out.rate("create", "ops/s", c);
    out.rate("stat", "ops/s", s);
    out.rate("remove", "ops/s", r);
    for (w, d) in dirs.into_iter().enumerate() {
        t.close(d)?;
        t.rmdir(root, &format!("mdtest.{w}"))?;
    }
    Ok(out)
}
