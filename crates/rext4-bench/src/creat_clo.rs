//! `creat_clo` (reaim's, seeds 001 and 004): N workers loop creat, close, unlink in one shared
//! directory; operations (loops) per second. All workers meet on the one directory's lock and
//! on inode allocation and freeing.

use super::report::Out;
use super::targets::{ImageSpec, Target};
use super::{parallel, Sizes};
use crate::CliResult;

pub(crate) fn image(_sz: &Sizes, _max_workers: usize) -> ImageSpec {
    ImageSpec { inodes: 65_536, mib: 256, ..ImageSpec::default() }
}

pub(crate) fn run(t: &dyn Target, workers: usize, sz: &Sizes) -> CliResult<Out> {
    let root = t.root();
    let dir = t.mkdir(root, "creat_clo")?;
    let loops = sz.creat;
    let took = parallel(workers, |w| {
        for i in 0..loops {
            let name = format!("creat_clo.{w}.{i}");
            t.close(t.create(&dir, &name)?)?;
            t.unlink(&dir, &name)?;
        }
        Ok(())
    })?;
    t.close(dir)?;
    t.rmdir(root, "creat_clo")?;
    let mut out = Out::default();
    out.rate("creat_clo", "ops/s", (workers * loops) as f64 / took.as_secs_f64());
    Ok(out)
}
