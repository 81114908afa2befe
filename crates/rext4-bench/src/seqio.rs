//! `seqio`: data throughput. N workers each write their own large file sequentially in 1 MiB
//! writes (the total size fixed, split between them) and fsync it, then read it back after
//! the caches are dropped, checking every byte; MB/s. Then a log writer's pattern: each
//! worker sets space aside past the end of a new file (`fallocate` with `KEEP_SIZE`, as
//! RocksDB and other log writers do) and appends to it 4 KiB at a time, with an `fsync` every
//! 1 MiB; MB/s. Then small files: each worker writes files of 16 KiB in its own directory,
//! then the filesystem is synced; files per second.

use super::report::Out;
use super::targets::{ImageSpec, Node, Target};
use super::{parallel, Sizes};
use crate::CliResult;

const CHUNK: usize = 1 << 20;
const SMALL: usize = 16 << 10;
/// The log phase's appends, and how many of them go between two `fsync`s.
const APPEND: usize = 4 << 10;
const APPENDS_PER_SYNC: usize = CHUNK / APPEND;

pub(crate) fn image(sz: &Sizes, max_workers: usize) -> ImageSpec {
    let small = (max_workers * sz.small_files * SMALL) as u64 >> 20;
    ImageSpec {
        inodes: (max_workers * sz.small_files) as u64 + 65_536,
        mib: sz.seq_mib + sz.seq_mib / 4 + small * 2 + 128,
        ..ImageSpec::default()
    }
}

fn pattern(i: usize) -> Vec<u8> {
    (0..CHUNK).map(|k| (k as u8).wrapping_mul(31).wrapping_add(i as u8)).collect()
}

pub(crate) fn run(t: &dyn Target, workers: usize, sz: &Sizes) -> CliResult<Out> {
    let root = t.root();
    let chunks = (sz.seq_mib as usize / workers).max(1);
    let total = (chunks * workers * CHUNK) as f64;
    let bufs: Vec<Vec<u8>> = (0..4).map(pattern).collect();
    let files: Vec<Node> =
        (0..workers).map(|w| t.create(root, &format!("seq.{w}"))).collect::<CliResult<_>>()?;
    let wrote = parallel(workers, |w| {
        for i in 0..chunks {
            t.write_at(&files[w], (i * CHUNK) as u64, &bufs[(i + w) % 4])?;
        }
        t.fsync(&files[w])
    })?;
    t.drop_caches();
    let read = parallel(workers, |w| {
        let mut buf = vec![0u8; CHUNK];
        for i in 0..chunks {
            let n = t.read_at(&files[w], (i * CHUNK) as u64, &mut buf)?;
            if n != CHUNK || buf != bufs[(i + w) % 4] {
                return Err(format!("read back wrong data in file {w} at MiB {i}"));
            }
        }
        Ok(())
    })?;
    for (w, f) in files.into_iter().enumerate() {
        t.close(f)?;
        t.unlink(root, &format!("seq.{w}"))?;
    }
    let mut out = Out::default();
    out.rate("write", "MB/s", total / wrote.as_secs_f64() / 1e6);
    out.rate("read", "MB/s", total / read.as_secs_f64() / 1e6);

    // A quarter of the data again, as a log: preallocated, appended, synced every MiB.
    let log_chunks = (chunks / 4).max(1);
    let files: Vec<Node> =
        (0..workers).map(|w| t.create(root, &format!("log.{w}"))).collect::<CliResult<_>>()?;
    let logged = parallel(workers, |w| {
        let f = &files[w];
        t.preallocate(f, 0, (log_chunks * CHUNK) as u64)?;
        let buf = &bufs[w % 4];
        for i in 0..log_chunks * APPENDS_PER_SYNC {
            let at = i * APPEND;
            t.write_at(f, at as u64, &buf[at % CHUNK..at % CHUNK + APPEND])?;
            if (i + 1) % APPENDS_PER_SYNC == 0 {
                t.fsync(f)?;
            }
        }
        Ok(())
    })?;
    for (w, f) in files.into_iter().enumerate() {
        let mut back = vec![0u8; CHUNK];
        if t.read_at(&f, ((log_chunks - 1) * CHUNK) as u64, &mut back)? != CHUNK || back != bufs[w % 4] {
            return Err(format!("log file {w} reads back wrong"));
        }
        t.close(f)?;
        t.unlink(root, &format!("log.{w}"))?;
    }
    out.rate("log_append", "MB/s", (log_chunks * workers * CHUNK) as f64 / logged.as_secs_f64() / 1e6);

    let dirs: Vec<Node> =
        (0..workers).map(|w| t.mkdir(root, &format!("small.{w}"))).collect::<CliResult<_>>()?;
    let body = vec![0x5Au8; SMALL];
    let n = sz.small_files;
    let took = parallel(workers, |w| {
        for i in 0..n {
            let f = t.create(&dirs[w], &format!("f{i}"))?;
            t.write_at(&f, 0, &body)?;
            t.close(f)?;
        }
        Ok(())
    })?;
    let t0 = std::time::Instant::now();
    t.sync()?;
    let took = took + t0.elapsed();
    out.rate("small_files", "files/s", (workers * n) as f64 / took.as_secs_f64());
    for d in &dirs {
        for i in 0..n {
            t.unlink(d, &format!("f{i}"))?;
        }
    }
    for (w, d) in dirs.into_iter().enumerate() {
        t.close(d)?;
        t.rmdir(root, &format!("small.{w}"))?;
    }
    Ok(out)
}
