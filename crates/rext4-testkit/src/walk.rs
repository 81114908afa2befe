//! Descriptions of a tree as the kernel shows it (through a mount) and as rext4 shows it
//! (through both of its APIs).

use crate::digest::{digest, digest_windows, Digest, CONTENT_LIMIT};
use crate::rng::Rng;
use rext4::{Attr, FileType, Fs};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, FileExt, FileTypeExt, MetadataExt};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// The type of a file, as both sides report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Char,
    Block,
    Fifo,
    Socket,
}

impl Kind {
    fn of_std(t: fs::FileType) -> Option<Kind> {
        Some(if t.is_file() {
            Kind::File
        } else if t.is_dir() {
            Kind::Dir
        } else if t.is_symlink() {
            Kind::Symlink
        } else if t.is_char_device() {
            Kind::Char
        } else if t.is_block_device() {
            Kind::Block
        } else if t.is_fifo() {
            Kind::Fifo
        } else if t.is_socket() {
            Kind::Socket
        } else {
            return None;
        })
    }
    fn of_rext4(t: FileType) -> Kind {
        match t {
            FileType::RegularFile => Kind::File,
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Symlink,
            FileType::CharDevice => Kind::Char,
            FileType::BlockDevice => Kind::Block,
            FileType::Fifo => Kind::Fifo,
            FileType::Socket => Kind::Socket,
        }
    }
}

/// Everything the oracles compare about one path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rec {
    pub kind: Kind,
    /// The type recorded in the parent's directory entry (None for the root).
    pub dtype: Option<Kind>,
    /// The inode number in the parent's directory entry.
    pub dirent_ino: u64,
    pub ino: u64,
    pub mode: u32,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub blocks: u64,
    pub blksize: u64,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub crtime: Option<(i64, u32)>,
    pub rdev: (u32, u32),
    /// `FS_IOC_GETFLAGS` and `FS_IOC_GETVERSION` (regular files and directories only).
    pub flags: Option<u32>,
    pub generation: Option<u32>,
    pub target: Option<Vec<u8>>,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    pub content: Option<Digest>,
}

/// A described tree: path ("/", "/a/b", as bytes) -> record, plus whatever went wrong while
/// walking (errors, duplicate entries, inconsistent answers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Walk {
    pub recs: BTreeMap<Vec<u8>, Rec>,
    pub problems: Vec<String>,
}

/// Displays a path of bytes.
pub fn show(p: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(p))
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut v = dir.to_vec();
    if v != b"/" {
        v.push(b'/');
    }
    v.extend_from_slice(name);
    v
}

fn systime(t: io::Result<SystemTime>) -> Option<(i64, u32)> {
    let t = t.ok()?;
    Some(match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
            if n == 0 {
                (-s, 0)
            } else {
                (-s - 1, 1_000_000_000 - n)
            }
        }
    })
}

nix::ioctl_read!(fs_ioc_getflags, b'f', 1, std::ffi::c_long);
nix::ioctl_read!(fs_ioc_getversion, b'v', 1, std::ffi::c_long);

/// `FS_IOC_GETFLAGS` and `FS_IOC_GETVERSION` of a regular file or directory.
fn kernel_flags(p: &Path) -> Result<(u32, u32), String> {
    let f = fs::File::open(p).map_err(|e| format!("open: {e}"))?;
    let (mut flags, mut gen): (std::ffi::c_long, std::ffi::c_long) = (0, 0);
    // SAFETY: both ioctls write one int through a pointer to a (larger) zeroed c_long.
    unsafe {
        fs_ioc_getflags(f.as_raw_fd(), &mut flags).map_err(|e| format!("FS_IOC_GETFLAGS: {e}"))?;
        fs_ioc_getversion(f.as_raw_fd(), &mut gen).map_err(|e| format!("FS_IOC_GETVERSION: {e}"))?;
    }
    Ok((flags as u32, gen as u32))
}

fn dev_split(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

/// Describes the tree under `root` as the running kernel shows it (`lstat`, `statx` btime,
/// `llistxattr`/`lgetxattr`, `readlink`, file contents, ioctls).
pub fn walk_kernel(root: &Path) -> Walk {
    let mut w = Walk::default();
    match fs::symlink_metadata(root) {
        Ok(md) => {
            let ino = md.ino();
            kernel_visit(root, b"/", &md, None, ino, &mut w);
        }
        Err(e) => w.problems.push(format!("lstat {}: {e}", root.display())),
    }
    w
}

fn kernel_visit(
    full: &Path,
    rel: &[u8],
    md: &fs::Metadata,
    dtype: Option<Kind>,
    dirent_ino: u64,
    w: &mut Walk,
) {
    let Some(kind) = Kind::of_std(md.file_type()) else {
        w.problems.push(format!("{}: unknown file type", show(rel)));
        return;
    };
    let mut problems = Vec::new();
    let mut xattrs = BTreeMap::new();
    match xattr::list(full) {
        Ok(names) => {
            for n in names {
                match xattr::get(full, &n) {
                    Ok(Some(v)) => {
                        xattrs.insert(n.as_bytes().to_vec(), v);
                    }
                    Ok(None) => problems.push(format!("{}: listed xattr {n:?} is missing", show(rel))),
                    Err(e) => problems.push(format!("{}: getxattr {n:?}: {e}", show(rel))),
                }
            }
        }
        Err(e) => problems.push(format!("{}: listxattr: {e}", show(rel))),
    }
    let target = if kind == Kind::Symlink {
        match fs::read_link(full) {
            Ok(t) => Some(t.into_os_string().as_bytes().to_vec()),
            Err(e) => {
                problems.push(format!("{}: readlink: {e}", show(rel)));
                None
            }
        }
    } else {
        None
    };
    let content = if kind == Kind::File {
        let r = if md.size() <= CONTENT_LIMIT {
            fs::File::open(full)
                .and_then(|mut f| {
                    let mut v = Vec::with_capacity(md.size() as usize);
                    f.read_to_end(&mut v).map(|_| v)
                })
                .map(|v| digest(&v))
                .map_err(|e| e.to_string())
        } else {
            fs::File::open(full).map_err(|e| e.to_string()).and_then(|f| {
                digest_windows(md.size(), |off, buf| f.read_exact_at(buf, off).map_err(|e| e.to_string()))
            })
        };
        match r {
            Ok(d) => Some(d),
            Err(e) => {
                problems.push(format!("{}: read: {e}", show(rel)));
                None
            }
        }
    } else {
        None
    };
    let (flags, generation) = if matches!(kind, Kind::File | Kind::Dir) {
        match kernel_flags(full) {
            Ok((f, g)) => (Some(f), Some(g)),
            Err(e) => {
                problems.push(format!("{}: {e}", show(rel)));
                (None, None)
            }
        }
    } else {
        (None, None)
    };
    let rec = Rec {
        kind,
        dtype,
        dirent_ino,
        ino: md.ino(),
        mode: md.mode(),
        nlink: md.nlink(),
        uid: md.uid(),
        gid: md.gid(),
        size: md.size(),
        blocks: md.blocks(),
        blksize: md.blksize(),
        atime: kernel_atime_after(full, kind, md),
        mtime: (md.mtime(), md.mtime_nsec() as u32),
        ctime: (md.ctime(), md.ctime_nsec() as u32),
        crtime: systime(md.created()),
        rdev: dev_split(md.rdev()),
        flags,
        generation,
        target,
        xattrs,
        content,
    };
    w.problems.extend(problems);
    if w.recs.insert(rel.to_vec(), rec).is_some() {
        w.problems.push(format!("{}: listed twice", show(rel)));
        return;
    }
    if kind != Kind::Dir {
        return;
    }
    let rd = match fs::read_dir(full) {
        Ok(rd) => rd,
        Err(e) => {
            w.problems.push(format!("{}: readdir: {e}", show(rel)));
            return;
        }
    };
    let mut children = Vec::new();
    for e in rd {
        let e = match e {
            Ok(e) => e,
            Err(e) => {
                w.problems.push(format!("{}: readdir: {e}", show(rel)));
                return;
            }
        };
        children.push(e);
    }
    // The listing may have set the directory's access time.
    if let (Some(r), Ok(md)) = (w.recs.get_mut(rel), fs::symlink_metadata(full)) {
        r.atime = (md.atime(), md.atime_nsec() as u32);
    }
    for e in children {
        let name = e.file_name();
        let child_rel = join(rel, name.as_bytes());
        let child = full.join(&name);
        let dtype = e.file_type().ok().and_then(Kind::of_std);
        match fs::symlink_metadata(&child) {
            Ok(cmd) => kernel_visit(&child, &child_rel, &cmd, dtype, e.ino(), w),
            Err(err) => w.problems.push(format!("{}: lstat: {err}", show(&child_rel))),
        }
    }
}

/// A file's or link's access time once the walk has read its bytes or target: reading may set
/// it (relatime; there is no `O_NOATIME` for `readlink`), and what a walk records is the tree
/// as it leaves it, which is what a later look at the image finds.
fn kernel_atime_after(full: &Path, kind: Kind, md: &fs::Metadata) -> (i64, u32) {
    let fresh =
        if matches!(kind, Kind::File | Kind::Symlink) { fs::symlink_metadata(full).ok() } else { None };
    let m = fresh.as_ref().unwrap_or(md);
    (m.atime(), m.atime_nsec() as u32)
}

/// Opens a file for reading with `O_NOATIME`: a walk of a writable filesystem leaves the
/// access times it finds (so does its listing, `ReadDir::noatime`), and a later walk, or the
/// kernel's, sees the same tree.
fn noatime_open(fs: &Fs, path: &Path) -> rext4::Result<rext4::File> {
    fs.open_options().read(true).custom_flags(nix::libc::O_NOATIME).open(path)
}

fn ts(t: rext4::Timestamp) -> (i64, u32) {
    (t.sec, t.nsec)
}

/// Describes the tree as rext4 shows it, through both APIs: entries from the path-level
/// `read_dir`, attributes from `lookup` (inode level) cross-checked against
/// `symlink_metadata` (path level) and the entry's inode number, targets from
/// `readlink_noatime` of the inode a path-level `resolve` finds, contents from `read` / `read_at` of files opened with `O_NOATIME`, xattrs from
/// `listxattr`/`getxattr`. The walk sets no access time.
/// With `order`, each directory's children are visited in a shuffled order.
pub fn walk_rext4(fs: &Fs, order: Option<u64>) -> Walk {
    let mut w = Walk::default();
    let mut rng = order.map(Rng::new);
    let root = fs.root();
    match fs.getattr(root) {
        Ok(attr) => {
            match fs.symlink_metadata("/") {
                Ok(a) if a == attr => {}
                Ok(a) => w.problems.push(format!("\"/\": symlink_metadata {a:?} != getattr {attr:?}")),
                Err(e) => w.problems.push(format!("\"/\": symlink_metadata: {e}")),
            }
            rext4_visit(fs, b"/", &attr, None, u64::from(root.0), &mut w, &mut rng);
        }
        Err(e) => w.problems.push(format!("getattr(root): {e}")),
    }
    w
}

fn rext4_visit(
    fs: &Fs,
    rel: &[u8],
    attr: &Attr,
    dtype: Option<Kind>,
    dirent_ino: u64,
    w: &mut Walk,
    rng: &mut Option<Rng>,
) {
    let kind = Kind::of_rext4(attr.kind);
    let path = Path::new(OsStr::from_bytes(rel));
    let ino = attr.ino;
    let mut problems = Vec::new();
    let mut xattrs = BTreeMap::new();
    match fs.listxattr(ino) {
        Ok(names) => {
            for n in names {
                match fs.getxattr(ino, &n) {
                    Ok(v) => {
                        if xattrs.insert(n.clone(), v).is_some() {
                            problems.push(format!("{}: xattr {} listed twice", show(rel), show(&n)));
                        }
                    }
                    Err(e) => problems.push(format!("{}: getxattr {}: {e}", show(rel), show(&n))),
                }
            }
        }
        Err(e) => problems.push(format!("{}: listxattr: {e}", show(rel))),
    }
    let target = if kind == Kind::Symlink {
        // Both without touching the link's access time (`readlink(2)` would set it).
        match (fs.resolve(path, false), fs.readlink_noatime(ino)) {
            (Ok(p), Ok(t)) => {
                if p != ino {
                    problems.push(format!("{}: resolves to inode {p}, listed as {ino}", show(rel)));
                }
                Some(t)
            }
            (Err(e), _) | (_, Err(e)) => {
                problems.push(format!("{}: readlink: {e}", show(rel)));
                None
            }
        }
    } else {
        None
    };
    let content = if kind == Kind::File {
        let r = if attr.size <= CONTENT_LIMIT {
            noatime_open(fs, path)
                .and_then(|f| {
                    let mut v = Vec::new();
                    (&f).read_to_end(&mut v).map_err(rext4::Error::from)?;
                    Ok(v)
                })
                .map(|v| digest(&v))
                .map_err(|e| e.to_string())
        } else {
            noatime_open(fs, path).map_err(|e| e.to_string()).and_then(|f| {
                digest_windows(attr.size, |off, buf| {
                    let mut done = 0;
                    while done < buf.len() {
                        match f.read_at(&mut buf[done..], off + done as u64) {
                            Ok(0) => return Err(format!("short read at {}", off + done as u64)),
                            Ok(n) => done += n,
                            Err(e) => return Err(e.to_string()),
                        }
                    }
                    Ok(())
                })
            })
        };
        match r {
            Ok(d) => Some(d),
            Err(e) => {
                problems.push(format!("{}: read: {e}", show(rel)));
                None
            }
        }
    } else {
        None
    };
    let (flags, generation) = if matches!(kind, Kind::File | Kind::Dir) {
        (Some(attr.flags), Some(attr.generation))
    } else {
        (None, None)
    };
    let rec = Rec {
        kind,
        dtype,
        dirent_ino,
        ino: u64::from(ino.0),
        mode: u32::from(attr.mode),
        nlink: u64::from(attr.nlink),
        uid: attr.uid,
        gid: attr.gid,
        size: attr.size,
        blocks: attr.blocks,
        blksize: u64::from(attr.blksize),
        atime: ts(attr.atime),
        mtime: ts(attr.mtime),
        ctime: ts(attr.ctime),
        crtime: attr.crtime.map(ts),
        rdev: attr.rdev,
        flags,
        generation,
        target,
        xattrs,
        content,
    };
    w.problems.extend(problems);
    if w.recs.insert(rel.to_vec(), rec).is_some() {
        w.problems.push(format!("{}: listed twice", show(rel)));
        return;
    }
    if kind != Kind::Dir {
        return;
    }
    let mut entries = Vec::new();
    match fs.read_dir(path).map(rext4::ReadDir::noatime) {
        Ok(rd) => {
            for e in rd {
                match e {
                    Ok(e) => entries.push(e),
                    Err(e) => {
                        w.problems.push(format!("{}: read_dir: {e}", show(rel)));
                        break;
                    }
                }
            }
        }
        Err(e) => {
            w.problems.push(format!("{}: read_dir: {e}", show(rel)));
            return;
        }
    }
    if let Some(r) = rng.as_mut() {
        r.shuffle(&mut entries);
    }
    for e in entries {
        let child_rel = join(rel, &e.name);
        if e.name == b"." || e.name == b".." || e.name.is_empty() {
            w.problems.push(format!("{}: read_dir returned {}", show(rel), show(&e.name)));
            continue;
        }
        let a = match fs.lookup(ino, &e.name) {
            Ok(a) => a,
            Err(err) => {
                w.problems.push(format!("{}: lookup: {err}", show(&child_rel)));
                continue;
            }
        };
        if a.ino != e.ino {
            w.problems.push(format!(
                "{}: lookup gives inode {} but the entry says {}",
                show(&child_rel),
                a.ino.0,
                e.ino.0
            ));
        }
        match fs.symlink_metadata(Path::new(OsStr::from_bytes(&child_rel))) {
            Ok(b) if b == a => {}
            Ok(b) => w.problems.push(format!("{}: symlink_metadata {b:?} != lookup {a:?}", show(&child_rel))),
            Err(err) => w.problems.push(format!("{}: symlink_metadata: {err}", show(&child_rel))),
        }
        rext4_visit(fs, &child_rel, &a, e.kind.map(Kind::of_rext4), u64::from(e.ino.0), w, rng);
    }
}
