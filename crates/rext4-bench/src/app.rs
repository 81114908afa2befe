//! `app`: application-shaped work, step by step, the same on every target: extract a source
//! tree (as `tar -x` does: create, write, close, in archive order), copy it (as `cp -a`:
//! readdir, read each file, write its copy), walk both trees stat-ing every entry (as a
//! no-change `rsync` or `find` pass), a compile-like pass (each worker reads its share of the
//! sources with three headers each and writes an object file beside each source), a
//! small-transaction loop (a write-ahead log appended and fsync'ed per transaction, the
//! database written at checkpoints, as SQLite in WAL mode does), and the removal of both trees
//! (as `rm -rf`). Each step's time is a metric; the tables give its ratio to kernel ext4.
//!
//! The tree is generated from a fixed seed: directories of 25 files, sizes as in a source
//! tree (most a few KiB, some tens of KiB, a few hundred KiB).

use super::report::Out;
use super::targets::{ImageSpec, Node, Target};
use super::{parallel, Sizes};
use crate::rng::Rng;
use crate::CliResult;
use std::time::Instant;

const PER_DIR: usize = 25;
const CHUNK: usize = 64 << 10;
const PAGE: usize = 4096;

/// One file of the generated tree.
struct Spec {
    dir: usize,
    name: String,
    size: usize,
    /// Where its bytes start in the shared pattern.
    seed: usize,
}

struct Tree {
    /// Directory paths, parents before children (`top`, `top/sub`).
    dirs: Vec<Vec<String>>,
    files: Vec<Spec>,
    pattern: Vec<u8>,
}

impl Tree {
    fn new(files: usize) -> Tree {
        let mut rng = Rng(0x5EED_0FA9);
        let leaves = files.div_ceil(PER_DIR).max(1);
        let tops = (leaves as f64).sqrt().ceil() as usize;
        let mut dirs = Vec::new();
        let mut leaf_dirs = Vec::new();
        for t in 0..tops {
            dirs.push(vec![format!("mod{t}")]);
            for s in 0..leaves.div_ceil(tops) {
                if leaf_dirs.len() == leaves {
                    break;
                }
                leaf_dirs.push(dirs.len());
                dirs.push(vec![format!("mod{t}"), format!("part{s}")]);
            }
        }
        let files = (0..files)
            .map(|i| {
                let r = rng.next() % 100;
                let size = match r {
                    0..70 => 1024 + (rng.next() % 7168) as usize,
                    70..95 => 8192 + (rng.next() % 40960) as usize,
                    _ => 65536 + (rng.next() % 458_752) as usize,
                };
                let ext = if i % 4 == 0 { "c" } else { "h" };
                let seed = (rng.next() % (1 << 20)) as usize;
                Spec { dir: leaf_dirs[i / PER_DIR], name: format!("f{i}.{ext}"), size, seed }
            })
            .collect();
        let mut p = Rng(0xB17E5);
        let pattern = (0..(2 << 20)).map(|_| p.next() as u8).collect();
        Tree { dirs, files, pattern }
    }

    fn bytes(&self, f: &Spec) -> &[u8] {
        // The pattern is 2 MiB and sizes stay under 1 MiB: always in range.
        &self.pattern[f.seed..f.seed + f.size]
    }

    fn total(&self) -> usize {
        self.files.iter().map(|f| f.size).sum()
    }
}

pub(crate) fn image(sz: &Sizes, _max_workers: usize) -> ImageSpec {
    let t = Tree::new(sz.app_files);
    let mib = (t.total() as u64 * 3) >> 20;
    ImageSpec { inodes: sz.app_files as u64 * 4 + 65_536, mib: mib + 256, ..ImageSpec::default() }
}

/// Opens directory `path` below `root`.
fn open_path(t: &dyn Target, root: &Node, path: &[String]) -> CliResult<Node> {
    let mut cur = t.open_dir(root, &path[0])?;
    for p in &path[1..] {
        let next = t.open_dir(&cur, p)?;
        t.close(cur)?;
        cur = next;
    }
    Ok(cur)
}

fn write_all(t: &dyn Target, f: &Node, data: &[u8]) -> CliResult {
    for (i, c) in data.chunks(CHUNK).enumerate() {
        t.write_at(f, (i * CHUNK) as u64, c)?;
    }
    Ok(())
}

fn read_all(t: &dyn Target, f: &Node, buf: &mut Vec<u8>) -> CliResult<usize> {
    buf.clear();
    let mut chunk = vec![0u8; CHUNK];
    loop {
        let n = t.read_at(f, buf.len() as u64, &mut chunk)?;
        if n == 0 {
            return Ok(buf.len());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// `tar -x`: the directories, then each file created, written and closed in archive order.
fn extract(t: &dyn Target, top: &Node, tree: &Tree) -> CliResult {
    let mut open: Vec<Node> = Vec::with_capacity(tree.dirs.len());
    for d in &tree.dirs {
        // A subdirectory's top directory was made before it, at the same index in `open`.
        let parent = match tree.dirs.iter().position(|x| x[..] == d[..1]) {
            Some(i) if d.len() > 1 => &open[i],
            _ => top,
        };
        open.push(t.mkdir(parent, &d[d.len() - 1])?);
    }
    for f in &tree.files {
        let n = t.create(&open[f.dir], &f.name)?;
        write_all(t, &n, tree.bytes(f))?;
        t.close(n)?;
    }
    for d in open {
        t.close(d)?;
    }
    Ok(())
}

/// `cp -a src dst`: whatever readdir finds, directories made and files copied.
fn copy(t: &dyn Target, src: &Node, dst: &Node, buf: &mut Vec<u8>) -> CliResult<usize> {
    let mut files = 0;
    for name in t.readdir(src)? {
        // Files of the generated tree have an extension, directories none.
        if name.contains('.') {
            let s = t.open(src, &name)?;
            read_all(t, &s, buf)?;
            t.close(s)?;
            let d = t.create(dst, &name)?;
            write_all(t, &d, buf)?;
            t.close(d)?;
            files += 1;
        } else {
            let sd = t.open_dir(src, &name)?;
            let dd = t.mkdir(dst, &name)?;
            files += copy(t, &sd, &dd, buf)?;
            t.close(sd)?;
            t.close(dd)?;
        }
    }
    Ok(files)
}

/// A `find`/`rsync` pass: readdir and stat every entry; returns the bytes seen.
fn walk(t: &dyn Target, dir: &Node) -> CliResult<u64> {
    let mut bytes = 0;
    for name in t.readdir(dir)? {
        bytes += t.stat(dir, &name)?;
        if !name.contains('.') {
            let d = t.open_dir(dir, &name)?;
            bytes += walk(t, &d)?;
            t.close(d)?;
        }
    }
    Ok(bytes)
}

/// `rm -rf`: files unlinked, directories removed once empty.
fn remove(t: &dyn Target, parent: &Node, name: &str) -> CliResult {
    let d = t.open_dir(parent, name)?;
    for n in t.readdir(&d)? {
        if n.contains('.') {
            t.unlink(&d, &n)?;
        } else {
            remove(t, &d, &n)?;
        }
    }
    t.close(d)?;
    t.rmdir(parent, name)
}

/// The compile-like pass: worker `w` of `workers` takes every source file its turn gives it,
/// reads it and three headers, and writes an object file half its size beside it.
fn compile(t: &dyn Target, top: &Node, tree: &Tree, w: usize, workers: usize) -> CliResult {
    let mut buf = Vec::new();
    let mut hdr = Vec::new();
    let sources: Vec<usize> = (0..tree.files.len()).step_by(4).skip(w).step_by(workers).collect();
    for i in sources {
        let f = &tree.files[i];
        let dir = open_path(t, top, &tree.dirs[f.dir])?;
        let n = t.open(&dir, &f.name)?;
        if read_all(t, &n, &mut buf)? != f.size {
            return Err(format!("app: {} read back short", f.name));
        }
        t.close(n)?;
        for k in 1..=3 {
            let h = &tree.files[(i + k * 7) % tree.files.len()];
            let hd = open_path(t, top, &tree.dirs[h.dir])?;
            let hn = t.open(&hd, &h.name)?;
            read_all(t, &hn, &mut hdr)?;
            t.close(hn)?;
            t.close(hd)?;
        }
        let o = t.create(&dir, &format!("{}.o", &f.name[..f.name.len() - 2]))?;
        write_all(t, &o, &buf[..buf.len() / 2])?;
        t.close(o)?;
        t.close(dir)?;
    }
    Ok(())
}

/// SQLite in WAL mode, roughly: each transaction appends a page and a frame header to the log
/// and fsyncs it; every 100 the log is checkpointed into the database (ten pages written
/// where they belong, the database fsync'ed, the log truncated).
fn transactions(t: &dyn Target, top: &Node, n: usize) -> CliResult {
    let db = t.create(top, "app.db")?;
    let wal = t.create(top, "app.db-wal")?;
    let page = vec![0xA5u8; PAGE];
    write_all(t, &db, &vec![0u8; 256 * PAGE])?;
    t.fsync(&db)?;
    let mut rng = Rng(0x7A5C);
    let mut end = 0u64;
    for i in 0..n {
        t.write_at(&wal, end, &page[..24])?;
        t.write_at(&wal, end + 24, &page)?;
        end += 24 + PAGE as u64;
        t.fsync(&wal)?;
        if i % 100 == 99 {
            for _ in 0..10 {
                t.write_at(&db, (rng.next() % 256) * PAGE as u64, &page)?;
            }
            t.fsync(&db)?;
            t.set_len(&wal, 0)?;
            end = 0;
        }
    }
    t.close(db)?;
    t.close(wal)?;
    t.unlink(top, "app.db")?;
    t.unlink(top, "app.db-wal")
}

pub(crate) fn run(t: &dyn Target, workers: usize, sz: &Sizes) -> CliResult<Out> {
    let tree = Tree::new(sz.app_files);
    let root = t.root();
    let mut out = Out::default();
    let step = |out: &mut Out, name: &str, f: &mut dyn FnMut() -> CliResult| -> CliResult {
        let t0 = Instant::now();
        f()?;
        out.time(name, "s", t0.elapsed().as_secs_f64());
        Ok(())
    };
    let src = t.mkdir(root, "src")?;
    step(&mut out, "extract", &mut || extract(t, &src, &tree))?;
    let dst = t.mkdir(root, "copy")?;
    let mut buf = Vec::new();
    let mut copied = 0;
    step(&mut out, "copy", &mut || {
        copied = copy(t, &src, &dst, &mut buf)?;
        Ok(())
    })?;
    if copied != tree.files.len() {
        return Err(format!("app: copied {copied} files of {}", tree.files.len()));
    }
    let mut seen = 0;
    step(&mut out, "walk", &mut || {
        seen = walk(t, &src)? + walk(t, &dst)?;
        Ok(())
    })?;
    if seen < 2 * tree.total() as u64 {
        return Err(format!("app: the walk saw {seen} bytes of {}", 2 * tree.total()));
    }
    let took = parallel(workers, |w| compile(t, &src, &tree, w, workers))?;
    out.time("compile", "s", took.as_secs_f64());
    step(&mut out, "txn", &mut || transactions(t, root, sz.app_txns))?;
    t.close(src)?;
    t.close(dst)?;
    step(&mut out, "remove", &mut || {
        remove(t, root, "src")?;
        remove(t, root, "copy")?;
        t.sync()
    })?;
    Ok(out)
}
