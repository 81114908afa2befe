//! `rext4 cp [-r] HOSTPATH IMAGE:/path`: copy files and trees into an image through the
//! journal, keeping modes, owners (as root), times to the nanosecond, symbolic links, hard
//! links, device nodes, fifos, sockets, extended attributes and holes.

use crate::fmt::name;
use crate::imagepath::ImagePath;
use crate::CliResult;
use indicatif::{ProgressBar, ProgressStyle};
use rext4::{Error, FileType, Fs, InodeNo, SetAttr, TimeSet, Timestamp};
use std::collections::HashMap;
use std::fs::{File, Metadata};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

const CHUNK: usize = 1 << 20;

/// One thing to create in the image: host path, parent directory in the image, name, and
/// where that is (`IMAGE:/path`, for messages).
struct Item {
    host: PathBuf,
    meta: Metadata,
    parent: InodeNo,
    name: Vec<u8>,
    shown: String,
}

fn open_rw(p: &ImagePath) -> CliResult<Fs> {
    Fs::open_with(&p.image, crate::modify::writable_options())
        .map_err(|e| format!("{}: {e}", p.image.display()))
}

/// Where the copy of `source` goes: into `p.path` if that is a directory, else at it.
fn destination(fs: &Fs, p: &ImagePath, source: &Path) -> CliResult<(InodeNo, Vec<u8>)> {
    let base = source
        .file_name()
        .map(|n| n.as_bytes().to_vec())
        .ok_or_else(|| format!("{}: cannot copy a path without a name", source.display()))?;
    match fs.metadata(&p.path) {
        Ok(a) if a.kind == FileType::Directory => Ok((a.ino, base)),
        Ok(_) | Err(Error::NotFound) => {
            let trimmed = p.path.trim_end_matches('/');
            let (dir, leaf) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
            if leaf.is_empty() {
                return Err(p.err("no name to create"));
            }
            let parent = fs.resolve(if dir.is_empty() { "/" } else { dir }, true).map_err(|e| p.err(e))?;
            Ok((parent, leaf.as_bytes().to_vec()))
        }
        Err(e) => Err(p.err(e)),
    }
}

/// `rext4 cp [-r] HOSTPATH IMAGE:/path`.
pub(crate) fn copy_in(source: &Path, target: &str, recursive: bool, quiet: bool) -> CliResult {
    let p = ImagePath::parse(target)?;
    // Like cp: without -r a symlink operand is followed, and a fifo or device is read for its
    // bytes into a regular file; with -r they are copied as what they are.
    let meta = if recursive { std::fs::symlink_metadata(source) } else { std::fs::metadata(source) }
        .map_err(|e| format!("cannot stat '{}': {e}", source.display()))?;
    if meta.is_dir() && !recursive {
        return Err(format!("-r not specified; omitting directory '{}'", source.display()));
    }
    let fs = open_rw(&p)?;
    let r = if recursive || meta.is_file() || meta.is_dir() {
        copy_tree(&fs, &p, source, meta, quiet)
    } else {
        copy_stream(&fs, &p, source, &meta)
    };
    let closed = fs.unmount();
    r?;
    closed.map_err(|e| p.err(e))
}

/// Copies the bytes read from a fifo or device into a regular file, as `cp` without -r does.
fn copy_stream(fs: &Fs, p: &ImagePath, source: &Path, m: &Metadata) -> CliResult {
    use std::io::Read;
    let (parent, leaf) = destination(fs, p, source)?;
    let shown = top_shown(p, fs, parent, &leaf);
    let mut f =
        File::open(source).map_err(|e| format!("cannot open '{}' for reading: {e}", source.display()))?;
    let it = Item { host: source.to_path_buf(), meta: m.clone(), parent, name: leaf, shown: shown.clone() };
    replace(fs, &it).map_err(|e| format!("cannot create regular file '{shown}': {e}"))?;
    let (uid, gid) = ids(nix::unistd::geteuid().is_root(), m);
    // As cp makes a new file: the source's permission bits less the umask.
    let umask = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    nix::sys::stat::umask(umask);
    let perm = (m.mode() & 0o777 & !umask.bits()) as u16;
    let ino = fs
        .create(parent, &it.name, perm, uid, gid)
        .map_err(|e| format!("cannot create regular file '{shown}': {e}"))?
        .ino;
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(|e| format!("error reading '{}': {e}", source.display()))?;
        if n == 0 {
            return Ok(());
        }
        fs.write(ino, at, &buf[..n]).map_err(|e| format!("error writing '{shown}': {e}"))?;
        at += n as u64;
    }
}

/// `IMAGE:/path` of the copy's top: `p.path` itself, or the source's name inside it.
fn top_shown(p: &ImagePath, fs: &Fs, parent: InodeNo, leaf: &[u8]) -> String {
    let into_dir = fs.metadata(&p.path).is_ok_and(|a| a.kind == FileType::Directory && a.ino == parent);
    let path = p.path.trim_end_matches('/');
    if into_dir {
        format!("{}:{path}/{}", p.image.display(), name(leaf))
    } else {
        format!("{}:{path}", p.image.display())
    }
}

fn copy_tree(fs: &Fs, p: &ImagePath, source: &Path, meta: Metadata, quiet: bool) -> CliResult {
    let (parent, leaf) = destination(fs, p, source)?;
    // Total bytes first, for the progress bar.
    let mut total = 0u64;
    let mut stack = vec![source.to_path_buf()];
    while let Some(d) = stack.pop() {
        let m = std::fs::symlink_metadata(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        if m.is_dir() {
            for e in std::fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))? {
                stack.push(e.map_err(|e| e.to_string())?.path());
            }
        } else if m.is_file() {
            total += m.len();
        }
    }
    let bar = if quiet { ProgressBar::hidden() } else { ProgressBar::new(total) };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let root = nix::unistd::geteuid().is_root();
    let mut links: HashMap<(u64, u64), InodeNo> = HashMap::new();
    let mut warnings = Vec::new();
    // Directories get their times after their contents are written.
    let mut dir_times: Vec<(InodeNo, Metadata)> = Vec::new();
    let shown = top_shown(p, fs, parent, &leaf);
    let mut queue = vec![Item { host: source.to_path_buf(), meta, parent, name: leaf, shown }];
    while let Some(it) = queue.pop() {
        let ino = copy_one(fs, &it, root, &mut links, &bar)
            .map_err(|e| format!("cannot copy '{}' to '{}': {e}", it.host.display(), it.shown))?;
        let Some(ino) = ino else { continue };
        copy_xattrs(fs, &it.host, ino, &mut warnings);
        if it.meta.is_dir() {
            let rd = std::fs::read_dir(&it.host).map_err(|e| format!("{}: {e}", it.host.display()))?;
            for e in rd {
                let e = e.map_err(|e| e.to_string())?;
                let meta = e.metadata().map_err(|err| format!("{}: {err}", e.path().display()))?;
                let n = e.file_name().as_bytes().to_vec();
                let shown = format!("{}/{}", it.shown, name(&n));
                queue.push(Item { host: e.path(), meta, parent: ino, name: n, shown });
            }
            dir_times.push((ino, it.meta));
        } else {
            set_times(fs, ino, &it.meta).map_err(|e| format!("{}: {e}", it.host.display()))?;
        }
    }
    for (ino, m) in dir_times.iter().rev() {
        set_times(fs, *ino, m).map_err(|e| e.to_string())?;
    }
    bar.finish_and_clear();
    for w in warnings {
        eprintln!("rext4: warning: {w}");
    }
    Ok(())
}

fn ids(root: bool, m: &Metadata) -> (u32, u32) {
    if root {
        (m.uid(), m.gid())
    } else {
        (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw())
    }
}

/// Creates one item; `None` when it became a hard link to something already copied.
fn copy_one(
    fs: &Fs,
    it: &Item,
    root: bool,
    links: &mut HashMap<(u64, u64), InodeNo>,
    bar: &ProgressBar,
) -> Result<Option<InodeNo>, String> {
    let m = &it.meta;
    let (uid, gid) = ids(root, m);
    let perm = (m.mode() & 0o7777) as u16;
    let e = |e: Error| e.to_string();
    let ft = m.file_type();
    if !ft.is_dir() && m.nlink() > 1 {
        if let Some(&ino) = links.get(&(m.dev(), m.ino())) {
            fs.link(ino, it.parent, &it.name).map_err(e)?;
            return Ok(None);
        }
    }
    let ino = if ft.is_dir() {
        match fs.lookup(it.parent, &it.name) {
            Ok(a) if a.kind == FileType::Directory => a.ino,
            Ok(_) => return Err("exists and is not a directory".into()),
            Err(Error::NotFound) => fs.mkdir(it.parent, &it.name, perm, uid, gid).map_err(e)?.ino,
            Err(err) => return Err(err.to_string()),
        }
    } else if ft.is_symlink() {
        let target = std::fs::read_link(&it.host).map_err(|e| e.to_string())?;
        replace(fs, it)?;
        let ino = fs.symlink(it.parent, &it.name, target.as_os_str().as_bytes(), uid, gid).map_err(e)?.ino;
        ino
    } else if ft.is_file() {
        replace(fs, it)?;
        let ino = fs.create(it.parent, &it.name, perm, uid, gid).map_err(e)?.ino;
        copy_data(fs, &it.host, ino, m.len(), bar)?;
        ino
    } else {
        let kind = if ft.is_fifo() {
            rext4::format::inode::S_IFIFO
        } else if ft.is_socket() {
            rext4::format::inode::S_IFSOCK
        } else if ft.is_char_device() {
            rext4::format::inode::S_IFCHR
        } else {
            rext4::format::inode::S_IFBLK
        };
        let rdev = m.rdev();
        let part =
            |n: u64| u32::try_from(n).map_err(|_| format!("device number {n} does not fit ext4's 32 bits"));
        let dev = (part(nix::sys::stat::major(rdev))?, part(nix::sys::stat::minor(rdev))?);
        replace(fs, it)?;
        fs.mknod(it.parent, &it.name, kind | perm, dev, uid, gid).map_err(e)?.ino
    };
    if !ft.is_dir() && m.nlink() > 1 {
        links.insert((m.dev(), m.ino()), ino);
    }
    // Modes with set-id bits survive as given (create applies them as passed).
    if !ft.is_symlink() {
        fs.setattr(ino, &SetAttr { mode: Some(perm), ..SetAttr::default() }).map_err(e)?;
    }
    Ok(Some(ino))
}

/// Removes a non-directory already at the destination name, as `cp` overwrites.
fn replace(fs: &Fs, it: &Item) -> Result<(), String> {
    match fs.lookup(it.parent, &it.name) {
        Ok(a) if a.kind == FileType::Directory => Err("exists and is a directory".into()),
        Ok(_) => fs.unlink(it.parent, &it.name).map_err(|e| e.to_string()),
        Err(Error::NotFound) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// Copies a host file's data, skipping its holes (SEEK_DATA / SEEK_HOLE).
fn copy_data(fs: &Fs, host: &Path, ino: InodeNo, len: u64, bar: &ProgressBar) -> Result<(), String> {
    use std::os::unix::fs::FileExt;
    let f = File::open(host).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; CHUNK];
    let mut pos = 0u64;
    while pos < len {
        let fd = &f;
        let data = match nix::unistd::lseek(fd, pos as i64, nix::unistd::Whence::SeekData) {
            // An offset lseek returned: not negative.
            Ok(d) => u64::try_from(d).unwrap_or(pos),
            Err(nix::errno::Errno::ENXIO) => break,
            // No SEEK_DATA on this filesystem: copy everything.
            Err(_) => pos,
        };
        let hole = nix::unistd::lseek(fd, data as i64, nix::unistd::Whence::SeekHole)
            .map_or(len, |h| u64::try_from(h).unwrap_or(len))
            .min(len);
        bar.inc(data.saturating_sub(pos));
        let mut at = data;
        while at < hole {
            let want = usize::try_from(hole - at).map_or(CHUNK, |n| n.min(CHUNK));
            let n = f.read_at(&mut buf[..want], at).map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            fs.write(ino, at, &buf[..n]).map_err(|e| e.to_string())?;
            at += n as u64;
            bar.inc(n as u64);
        }
        if at <= pos {
            break;
        }
        pos = at;
    }
    // A trailing hole: the size still counts it.
    if fs.getattr(ino).map_err(|e| e.to_string())?.size < len {
        fs.setattr(ino, &SetAttr { size: Some(len), ..SetAttr::default() }).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn set_times(fs: &Fs, ino: InodeNo, m: &Metadata) -> rext4::Result<()> {
    // The system gives nanoseconds in 0..1e9.
    let nsec = |n: i64| u32::try_from(n).unwrap_or(0);
    let at = Timestamp { sec: m.atime(), nsec: nsec(m.atime_nsec()) };
    let mt = Timestamp { sec: m.mtime(), nsec: nsec(m.mtime_nsec()) };
    fs.setattr(
        ino,
        &SetAttr { atime: Some(TimeSet::At(at)), mtime: Some(TimeSet::At(mt)), ..SetAttr::default() },
    )
    .map(|_| ())
}

fn copy_xattrs(fs: &Fs, host: &Path, ino: InodeNo, warnings: &mut Vec<String>) {
    let Ok(names) = xattr::list(host) else { return };
    for n in names {
        let Ok(Some(v)) = xattr::get(host, &n) else { continue };
        if let Err(e) = fs.setxattr(ino, n.as_bytes(), &v, 0) {
            warnings.push(format!("{}: xattr {}: {e}", host.display(), n.to_string_lossy()));
        }
    }
}
