//! `rext4 demo`: rext4 on a default image, with nothing to prepare. Builds a varied tree, makes
//! an ext4 image of it with `mkfs.ext4 -d`, reads every file back through rext4 and checks it
//! against the source, reports the walk rate, then changes the image through the journal and
//! lets e2fsck judge it.

use crate::CliResult;
use rext4::{FileType, Fs};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::rng::Rng;

fn io<T>(r: std::io::Result<T>, what: &str) -> CliResult<T> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// Writes the demo tree under `src`; returns total bytes.
fn build_tree(src: &Path, files: usize) -> CliResult<u64> {
    let mut rng = Rng(0x5EED_0001);
    let mut total = 0u64;
    let dirs = (files / 500).max(1);
    for d in 0..dirs {
        let dir = src.join(format!("dir{d:03}"));
        io(std::fs::create_dir_all(&dir), "mkdir")?;
    }
    // One large directory, big enough to be indexed (htree).
    let big = src.join("many");
    io(std::fs::create_dir_all(&big), "mkdir")?;
    for i in 0..files {
        let (dir, fname) = if i % 4 == 0 {
            (big.clone(), format!("entry-{i:07}"))
        } else {
            (src.join(format!("dir{:03}", i % dirs)), format!("file{i}.txt"))
        };
        let len = (rng.next() % 2048) as usize;
        let data = rng.bytes(len);
        total += len as u64;
        io(std::fs::write(dir.join(fname), data), "write")?;
    }
    let large = rng.bytes(8 << 20);
    total += large.len() as u64;
    io(std::fs::write(src.join("large.bin"), &large), "write")?;
    io(
        std::fs::write(
            src.join("README.txt"),
            b"This image was made by `rext4 demo` and read back by rext4.\n",
        ),
        "write",
    )?;
    io(std::os::unix::fs::symlink("README.txt", src.join("readme-link")), "symlink")?;
    io(std::fs::hard_link(src.join("README.txt"), src.join("README.hardlink")), "link")?;
    let _ = xattr::set(src.join("README.txt"), "user.demo", b"rext4");
    Ok(total)
}

fn mkfs() -> CliResult<PathBuf> {
    for dir in ["/sbin", "/usr/sbin", "/usr/local/sbin", "/bin", "/usr/bin"] {
        let p = Path::new(dir).join("mkfs.ext4");
        if p.exists() {
            return Ok(p);
        }
    }
    Err("mkfs.ext4 not found: install e2fsprogs (apt-get install -y e2fsprogs)".into())
}

pub(crate) fn run(keep: Option<PathBuf>, files: usize) -> CliResult {
    let work = match &keep {
        Some(k) => k.clone(),
        None => std::env::temp_dir().join(format!("rext4-demo-{}", std::process::id())),
    };
    let src = work.join("src");
    let image = work.join("demo.img");
    let _ = std::fs::remove_dir_all(&src);
    io(std::fs::create_dir_all(&src), "create work directory")?;
    let r = demo(&src, &image, files);
    if keep.is_none() {
        let _ = std::fs::remove_dir_all(&work);
    } else {
        println!("kept {} and {}", src.display(), image.display());
    }
    r
}

fn demo(src: &Path, image: &Path, files: usize) -> CliResult {
    println!("building a tree of {files} files ...");
    let bytes = build_tree(src, files)?;
    let size_mb = (bytes * 2 / (1 << 20) + files as u64 * 8 / 1024 + 64).max(64);
    println!("mkfs.ext4 -d {} ({size_mb} MiB image) ...", src.display());
    let out = Command::new(mkfs()?)
        .args(["-q", "-F", "-t", "ext4", "-d"])
        .arg(src)
        .arg(image)
        .arg(format!("{size_mb}M"))
        .output()
        .map_err(|e| format!("mkfs.ext4: {e}"))?;
    if !out.status.success() {
        return Err(format!("mkfs.ext4 failed: {}", String::from_utf8_lossy(&out.stderr)));
    }

    let fs = Fs::open(image).map_err(|e| e.to_string())?;
    let st = fs.statfs().map_err(|e| e.to_string())?;
    println!(
        "opened {}: block size {}, {} inodes in use, {} of {} blocks free",
        image.display(),
        st.block_size,
        st.files - st.files_free,
        st.blocks_free,
        st.blocks
    );
    let readme = fs.read_file("/readme-link").map_err(|e| e.to_string())?;
    print!("/readme-link -> {}", String::from_utf8_lossy(&readme));
    let x = fs.getxattr(fs.resolve("/README.txt", true).map_err(|e| e.to_string())?, b"user.demo");
    if let Ok(v) = x {
        println!("user.demo = {}", String::from_utf8_lossy(&v));
    }

    // Walk and stat everything, twice: cold (first read of each block) and warm (cached).
    for pass in ["cold", "warm"] {
        let t = Instant::now();
        let n = walk(&fs)?;
        let secs = t.elapsed().as_secs_f64();
        println!("walk + stat ({pass}): {n} inodes in {:.3} s = {:.0} inodes/s", secs, n as f64 / secs);
    }

    // Every file's bytes against the source.
    let t = Instant::now();
    let (nfiles, nbytes) = verify(&fs, src, Path::new("/"))?;
    println!(
        "verified {nfiles} files, {nbytes} bytes identical to the source in {:.3} s",
        t.elapsed().as_secs_f64()
    );
    drop(fs);
    write_and_check(image)
}

/// Changes the image through the journal (create, rename, link, symlink, unlink, chmod),
/// closes it clean, and has e2fsck judge the result.
fn write_and_check(image: &Path) -> CliResult {
    let e = |e: rext4::Error| e.to_string();
    let fs = Fs::open_rw(image).map_err(e)?;
    let t = Instant::now();
    let root = fs.root();
    let dir = fs.mkdir(root, b"written-by-rext4", 0o755, 0, 0).map_err(e)?.ino;
    let n = 5000;
    for i in 0..n {
        fs.create(dir, format!("new-{i}").as_bytes(), 0o644, 0, 0).map_err(e)?;
    }
    for i in (0..n).step_by(2) {
        fs.rename(dir, format!("new-{i}").as_bytes(), dir, format!("renamed-{i}").as_bytes(), 0)
            .map_err(e)?;
    }
    for i in (1..n).step_by(4) {
        fs.unlink(dir, format!("new-{i}").as_bytes()).map_err(e)?;
    }
    let readme = fs.resolve("/README.txt", false).map_err(e)?;
    fs.link(readme, dir, b"README.link").map_err(e)?;
    fs.symlink(dir, b"up", b"..", 0, 0).map_err(e)?;
    fs.setattr(readme, &rext4::SetAttr { mode: Some(0o600), ..rext4::SetAttr::default() }).map_err(e)?;
    // File data: sizes from empty to a few MiB, written in pieces with holes between some,
    // then a truncate and a punched hole; everything read back and compared.
    let mut expect: Vec<(rext4::InodeNo, Vec<u8>)> = Vec::new();
    let mut data_bytes = 0u64;
    for iu in 0..200usize {
        let i = iu as u64;
        let ino = fs.create(dir, format!("data-{i}").as_bytes(), 0o644, 0, 0).map_err(e)?.ino;
        let len = ((i * 7919) % 97) * (1 + i % 5) * 1024 + i;
        // A byte pattern: the low byte of a counter.
        let mut model: Vec<u8> = (0..len).map(|k| (k * 31 + i).to_le_bytes()[0]).collect();
        let mut off = 0usize;
        while off < model.len() {
            let piece = (model.len() - off).min(48 * 1024 + (iu * 13) % 5000);
            if i.is_multiple_of(3) && off > 0 {
                // Leave a hole: zeros in the model, nothing written.
                model[off..off + piece].fill(0);
            } else {
                fs.write(ino, off as u64, &model[off..off + piece]).map_err(e)?;
            }
            off += piece;
        }
        if fs.getattr(ino).map_err(e)?.size < len {
            fs.setattr(ino, &rext4::SetAttr { size: Some(len), ..rext4::SetAttr::default() }).map_err(e)?;
        }
        if i % 4 == 1 && len > 10_000 {
            fs.fallocate(ino, rext4::FALLOC_FL_PUNCH_HOLE | rext4::FALLOC_FL_KEEP_SIZE, 1000, 5000)
                .map_err(e)?;
            model[1000..6000].fill(0);
            fs.setattr(ino, &rext4::SetAttr { size: Some(len / 2), ..rext4::SetAttr::default() })
                .map_err(e)?;
            model.truncate(model.len() / 2);
        }
        data_bytes += model.len() as u64;
        expect.push((ino, model));
    }
    for (ino, model) in &expect {
        let mut got = vec![0u8; model.len()];
        let n = fs.read(*ino, 0, &mut got).map_err(e)?;
        if n != model.len() || got != *model {
            return Err(format!("file data read back differs (inode {})", ino.0));
        }
    }
    println!(
        "wrote {} files ({data_bytes} bytes, with holes, punches and truncates) and read them back equal",
        expect.len()
    );
    fs.unmount().map_err(e)?;
    let stats = fs.commit_stats().map(|s| s.summary()).unwrap_or_default();
    println!(
        "wrote {} names through the journal in {:.3} s ({} commits, mean {:.0} us); closed clean",
        n + n / 2 + n / 4 + 2,
        t.elapsed().as_secs_f64(),
        stats.commits,
        stats.mean_us
    );
    let fsck = ["/sbin/e2fsck", "/usr/sbin/e2fsck"].into_iter().find(|p| Path::new(p).exists());
    if let Some(fsck) = fsck {
        let out = Command::new(fsck).arg("-fn").arg(image).output().map_err(|e| format!("e2fsck: {e}"))?;
        if !out.status.success() {
            return Err(format!("e2fsck -fn found problems:\n{}", String::from_utf8_lossy(&out.stdout)));
        }
        println!("e2fsck -fn: clean");
    }
    Ok(())
}

fn walk(fs: &Fs) -> CliResult<u64> {
    let mut stack = vec![fs.root()];
    let mut n = 0u64;
    while let Some(dir) = stack.pop() {
        let mut entries = Vec::new();
        fs.readdir(dir, 0, |e| {
            if e.name != b"." && e.name != b".." {
                entries.push(e.ino);
            }
            true
        })
        .map_err(|e| e.to_string())?;
        for ino in entries {
            let a = fs.getattr(ino).map_err(|e| e.to_string())?;
            n += 1;
            if a.kind == FileType::Directory {
                stack.push(ino);
            }
        }
    }
    Ok(n)
}

fn verify(fs: &Fs, host: &Path, image: &Path) -> CliResult<(u64, u64)> {
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut seen: HashMap<String, ()> = HashMap::new();
    for e in io(std::fs::read_dir(host), "read_dir")? {
        let e = io(e, "read_dir")?;
        let name = e.file_name();
        let ip = image.join(&name);
        let ft = io(e.file_type(), "stat")?;
        seen.insert(name.to_string_lossy().into_owned(), ());
        if ft.is_dir() {
            let (f, b) = verify(fs, &e.path(), &ip)?;
            files += f;
            bytes += b;
        } else if ft.is_file() {
            let want = io(std::fs::read(e.path()), "read")?;
            let got = fs.read_file(&ip).map_err(|err| format!("{}: {err}", ip.display()))?;
            if got != want {
                return Err(format!("{}: content differs from the source", ip.display()));
            }
            files += 1;
            bytes += want.len() as u64;
        } else if ft.is_symlink() {
            let want = io(std::fs::read_link(e.path()), "readlink")?;
            let got = fs.read_link(&ip).map_err(|err| format!("{}: {err}", ip.display()))?;
            if got != want {
                return Err(format!("{}: link target differs", ip.display()));
            }
        }
    }
    let in_image = fs.read_dir(image).map_err(|e| e.to_string())?.count();
    let extra = if image == Path::new("/") { 1 } else { 0 }; // lost+found
    if in_image != seen.len() + extra {
        return Err(format!(
            "{}: {} entries in the image, {} in the source",
            image.display(),
            in_image,
            seen.len()
        ));
    }
    Ok((files, bytes))
}
