//! `rext4 mkfs --from DIR`: fills a new filesystem with a host tree through the engine —
//! hard links, symbolic links, devices, fifos, sockets, extended attributes (ACLs included),
//! holes, nanosecond times — in name order, so the same tree always makes the same image.
//! Owners, modes, times and xattrs can be overridden by a manifest, `--all-root` and
//! `--uid-offset`/`--gid-offset`, with no root needed.

use crate::CliResult;
use rext4::{Fs, InodeNo, SetAttr, TimeSet, Timestamp};
use std::collections::{BTreeMap, HashMap};
use std::fs::Metadata;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Bytes of a file written in one call: the progress bar moves between them.
const CHUNK: u64 = 8 << 20;

/// What a manifest line says about one path; `None` keeps the source's.
#[derive(Clone, Debug, Default)]
pub(crate) struct Override {
    pub(crate) uid: Option<u32>,
    pub(crate) gid: Option<u32>,
    pub(crate) mode: Option<u16>,
    pub(crate) mtime: Option<i64>,
    pub(crate) xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// How owners, modes and times are decided.
#[derive(Clone, Debug, Default)]
pub(crate) struct Policy {
    pub(crate) all_root: bool,
    pub(crate) uid_offset: i64,
    pub(crate) gid_offset: i64,
    /// Times later than this are clamped to it (reproducible builds).
    pub(crate) clamp: Option<i64>,
    /// By path in the image (`/a/b`).
    pub(crate) manifest: BTreeMap<Vec<u8>, Override>,
    /// SELinux labels by path (`--selinux`).
    pub(crate) selinux: Option<std::sync::Arc<crate::file_contexts::FileContexts>>,
}

/// Parses a manifest: one path per line, then `UID GID MODE` (any may be `-`), and/or
/// `uid=`, `gid=`, `mode=` (octal), `mtime=` (seconds), `xattr.NAME=VALUE` fields. `#` starts
/// a comment; paths are relative to the image's root, with or without a leading `/`.
pub(crate) fn parse_manifest(text: &str) -> CliResult<BTreeMap<Vec<u8>, Override>> {
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = |what: &str| format!("manifest line {}: {what}: {line}", n + 1);
        let mut words = line.split_whitespace();
        let path = words.next().ok_or_else(|| bad("no path"))?;
        let key = format!("/{}", path.trim_start_matches('/').trim_end_matches('/'));
        let mut o = Override::default();
        let mut pos = 0;
        for w in words {
            let num = |v: &str| v.parse::<u32>().map_err(|_| bad("bad number"));
            let mode = |v: &str| {
                u16::from_str_radix(v, 8).ok().filter(|m| *m <= 0o7777).ok_or_else(|| bad("bad mode"))
            };
            match w.split_once('=') {
                Some(("uid", v)) => o.uid = Some(num(v)?),
                Some(("gid", v)) => o.gid = Some(num(v)?),
                Some(("mode", v)) => o.mode = Some(mode(v)?),
                Some(("mtime", v)) => o.mtime = Some(v.parse().map_err(|_| bad("bad time"))?),
                Some((k, v)) if k.starts_with("xattr.") => {
                    o.xattrs.push((k.as_bytes()["xattr.".len()..].to_vec(), v.as_bytes().to_vec()))
                }
                Some(_) => return Err(bad("unknown field")),
                None => {
                    match (pos, w) {
                        (_, "-") => {}
                        (0, v) => o.uid = Some(num(v)?),
                        (1, v) => o.gid = Some(num(v)?),
                        (2, v) => o.mode = Some(mode(v)?),
                        _ => return Err(bad("too many fields")),
                    }
                    pos += 1;
                }
            }
        }
        out.insert(key.into_bytes(), o);
    }
    Ok(out)
}

impl Policy {
    /// Sets the SELinux label `--selinux` gives the inode `ino` at `path` in `xattrs`.
    pub(crate) fn label(
        &self,
        fs: &Fs,
        ino: InodeNo,
        path: &[u8],
        xattrs: &mut Vec<(Vec<u8>, Vec<u8>)>,
    ) -> CliResult {
        let Some(fc) = &self.selinux else { return Ok(()) };
        let kind = fs.getattr(ino).map_err(|e| format!("{}: {e}", String::from_utf8_lossy(path)))?.kind;
        if let Some(v) = fc.label(path, kind) {
            xattrs.retain(|(n, _)| n != b"security.selinux");
            xattrs.push((b"security.selinux".to_vec(), v));
        }
        Ok(())
    }

    /// Gives `ino` (at image path `path`) what the source says of it, as this policy
    /// decides: owner, mode (`None` for a symbolic link), the manifest's and the labels'
    /// extended attributes over the source's, and times (`atime` defaults to `mtime`).
    pub(crate) fn apply(&self, fs: &Fs, ino: InodeNo, path: &[u8], src: SourceAttrs) -> CliResult {
        let show = String::from_utf8_lossy(path);
        let o = self.manifest.get(path);
        let (uid, gid) = self.owner_of(src.uid, src.gid, o);
        let mut xattrs = src.xattrs;
        if let Some(o) = o {
            for (k, v) in &o.xattrs {
                xattrs.retain(|(n, _)| n != k);
                xattrs.push((k.clone(), v.clone()));
            }
        }
        self.label(fs, ino, path, &mut xattrs)?;
        xattrs.sort();
        for (n, v) in &xattrs {
            fs.setxattr(ino, n, v, 0)
                .map_err(|e| format!("{show}: xattr {}: {e}", String::from_utf8_lossy(n)))?;
        }
        let mtime = match o.and_then(|o| o.mtime) {
            Some(t) => self.time(t, 0),
            None => self.time(src.mtime.0, src.mtime.1),
        };
        let atime = src.atime.map_or(mtime, |(s, n)| self.time(s, n));
        let set = SetAttr {
            mode: src.mode.map(|m| o.and_then(|o| o.mode).unwrap_or(m)),
            uid: Some(uid),
            gid: Some(gid),
            atime: Some(TimeSet::At(atime)),
            mtime: Some(TimeSet::At(mtime)),
            ..SetAttr::default()
        };
        fs.setattr(ino, &set).map_err(|e| format!("{show}: {e}"))?;
        Ok(())
    }

    fn owner(&self, m: &Metadata, o: Option<&Override>) -> (u32, u32) {
        self.owner_of(m.uid(), m.gid(), o)
    }

    /// The owner of an entry the source says `uid`:`gid` own.
    pub(crate) fn owner_of(&self, uid: u32, gid: u32, o: Option<&Override>) -> (u32, u32) {
        let shift = |id: u32, off: i64| u32::try_from(i64::from(id) + off).unwrap_or(id);
        let (mut uid, mut gid) = if self.all_root { (0, 0) } else { (uid, gid) };
        uid = shift(uid, self.uid_offset);
        gid = shift(gid, self.gid_offset);
        if let Some(o) = o {
            uid = o.uid.unwrap_or(uid);
            gid = o.gid.unwrap_or(gid);
        }
        (uid, gid)
    }

    pub(crate) fn time(&self, sec: i64, nsec: i64) -> Timestamp {
        let t = Timestamp { sec, nsec: u32::try_from(nsec).unwrap_or(0) };
        match self.clamp {
            Some(c) if t.sec >= c => Timestamp { sec: c, nsec: 0 },
            _ => t,
        }
    }
}

/// What the source says of an entry, before the policy has its say.
pub(crate) struct SourceAttrs {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    /// `None` for a symbolic link (its mode is not set).
    pub(crate) mode: Option<u16>,
    pub(crate) mtime: (i64, i64),
    pub(crate) atime: Option<(i64, i64)>,
    pub(crate) xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// What a fill did.
#[derive(Debug, Default)]
pub(crate) struct Filled {
    pub(crate) files: u64,
    pub(crate) bytes: u64,
}

/// The engine's root directory.
pub(crate) fn root(fs: &Fs) -> CliResult<InodeNo> {
    fs.resolve("/", true).map_err(|e| e.to_string())
}

/// One step of the walk of the source tree, in the order the engine takes them: the walk
/// (stat, extended attributes, small files' bytes) runs on a thread of its own ahead of the
/// engine, which makes the same calls in the same order as a walk on one thread would, so
/// the image does not depend on which side is faster.
enum Step {
    /// An entry of the directory the engine is in; a directory's own entries follow it.
    Entry(Box<Entry>),
    /// The end of the directory the engine is in: its attributes, last.
    EndDir,
}

/// An entry of the source tree, as the walk found it.
struct Entry {
    host: PathBuf,
    name: Vec<u8>,
    /// Its path in the image (`/a/b`).
    path: Vec<u8>,
    meta: Metadata,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    body: Body,
}

enum Body {
    Dir,
    Symlink(Vec<u8>),
    /// The whole of a small file without holes.
    Data(Vec<u8>),
    /// A file the engine copies itself (large, or with holes).
    File,
    /// Another name of a file met earlier (hard link): nothing read.
    Link,
    /// A device, fifo or socket.
    Special,
}

/// Files up to this size (without holes) are read by the walk and written from memory.
const SMALL: u64 = 64 << 10;
/// Steps the walk may be ahead of the engine (and small files' bytes held between them).
const AHEAD: usize = 256;

struct Ctx<'a> {
    fs: &'a Fs,
    policy: &'a Policy,
    links: HashMap<(u64, u64), InodeNo>,
    filled: Filled,
    bar: &'a indicatif::ProgressBar,
}

/// Fills `fs`'s root from the tree at `src`.
pub(crate) fn fill(fs: &Fs, src: &Path, policy: &Policy, bar: &indicatif::ProgressBar) -> CliResult<Filled> {
    let meta = std::fs::symlink_metadata(src).map_err(|e| format!("{}: {e}", src.display()))?;
    if !meta.is_dir() {
        return Err(format!("{}: not a directory", src.display()));
    }
    let root = fs.resolve("/", true).map_err(|e| e.to_string())?;
    let mut cx = Ctx { fs, policy, links: HashMap::new(), filled: Filled::default(), bar };
    let top = Entry {
        host: src.to_path_buf(),
        name: Vec::new(),
        path: b"/".to_vec(),
        xattrs: xattrs_of(src),
        meta,
        body: Body::Dir,
    };
    let (tx, rx) = std::sync::mpsc::sync_channel::<CliResult<Step>>(AHEAD);
    std::thread::scope(|s| -> CliResult {
        std::thread::Builder::new()
            .name("rext4-walk".into())
            .spawn_scoped(s, move || {
                let mut seen = std::collections::HashSet::new();
                if let Err(e) = walk(&tx, &mut seen, src, b"/") {
                    // The engine side may have stopped already; then nobody needs to hear it.
                    let _ = tx.send(Err(e));
                }
                let _ = tx.send(Ok(Step::EndDir));
            })
            .map_err(|e| format!("walking {}: {e}", src.display()))?;
        // The engine's side; the walk ends when `rx` is dropped (an error here).
        let mut stack = vec![(root, Box::new(top))];
        for step in rx {
            match step? {
                Step::Entry(e) => {
                    let Some(&(parent, _)) = stack.last() else {
                        return Err("walk past the root".to_string());
                    };
                    if let Some(dir) = one(&mut cx, parent, e)? {
                        stack.push(dir);
                    }
                }
                Step::EndDir => {
                    let Some((ino, e)) = stack.pop() else { return Err("walk past the root".to_string()) };
                    // The root takes the source directory's owner, mode and times.
                    attrs(&mut cx, *e, ino)?;
                    if stack.is_empty() {
                        break;
                    }
                }
            }
        }
        Ok(())
    })?;
    Ok(cx.filled)
}

fn err(p: &Path) -> impl Fn(rext4::Error) -> String + '_ {
    move |e| format!("{}: {e}", p.display())
}

/// The extended attributes of a host path (none where it has none or cannot say).
fn xattrs_of(hp: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut xattrs = Vec::new();
    if let Ok(names) = xattr::list(hp) {
        for n in names {
            if let Ok(Some(v)) = xattr::get(hp, &n) {
                xattrs.push((n.as_bytes().to_vec(), v));
            }
        }
    }
    xattrs
}

/// Sends the steps for the entries of the host directory `host` (image path `path`), in
/// byte order of their names, depth first; false once the engine has stopped listening.
fn walk(
    tx: &std::sync::mpsc::SyncSender<CliResult<Step>>,
    seen: &mut std::collections::HashSet<(u64, u64)>,
    host: &Path,
    path: &[u8],
) -> CliResult<bool> {
    let mut entries: Vec<(Vec<u8>, PathBuf, Metadata)> = Vec::new();
    for e in std::fs::read_dir(host).map_err(|e| format!("{}: {e}", host.display()))? {
        let e = e.map_err(|e| format!("{}: {e}", host.display()))?;
        // Stat relative to the open directory (no walk of the whole path); not following
        // a symbolic link.
        let m = e.metadata().map_err(|err| format!("{}: {err}", e.path().display()))?;
        entries.push((e.file_name().into_vec(), e.path(), m));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, hp, m) in entries {
        let mut child = path.to_vec();
        if path != b"/" {
            child.push(b'/');
        }
        child.extend_from_slice(&name);
        let ft = m.file_type();
        let linked = !ft.is_dir() && m.nlink() > 1 && !seen.insert((m.dev(), m.ino()));
        let body = if linked {
            Body::Link
        } else if ft.is_dir() {
            Body::Dir
        } else if ft.is_symlink() {
            let target = std::fs::read_link(&hp).map_err(|e| format!("{}: {e}", hp.display()))?;
            Body::Symlink(target.into_os_string().into_vec())
        } else if ft.is_file() && m.len() <= SMALL && m.blocks() * 512 >= m.len() {
            Body::Data(std::fs::read(&hp).map_err(|e| format!("{}: {e}", hp.display()))?)
        } else if ft.is_file() {
            Body::File
        } else {
            Body::Special
        };
        let xattrs = if linked { Vec::new() } else { xattrs_of(&hp) };
        let below = ft.is_dir().then(|| (hp.clone(), child.clone()));
        let e = Entry { host: hp, name, path: child, meta: m, xattrs, body };
        if tx.send(Ok(Step::Entry(Box::new(e)))).is_err() {
            return Ok(false);
        }
        if let Some((hp, child)) = below {
            if !walk(tx, seen, &hp, &child)? || tx.send(Ok(Step::EndDir)).is_err() {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Makes the entry `e` in directory `parent`; returns the directory and its inode when it
/// is one (its entries come next), `None` when it is done.
fn one(cx: &mut Ctx<'_>, parent: InodeNo, e: Box<Entry>) -> CliResult<Option<(InodeNo, Box<Entry>)>> {
    let Some(ino) = make(cx, parent, &e)? else { return Ok(None) };
    if e.meta.is_dir() {
        return Ok(Some((ino, e)));
    }
    attrs(cx, *e, ino)?;
    Ok(None)
}

/// The inode for `e` in `parent` (`None` for another name of a file made already), its
/// data written.
fn make(cx: &mut Ctx<'_>, parent: InodeNo, e: &Entry) -> CliResult<Option<InodeNo>> {
    let (hp, m, name) = (&e.host, &e.meta, &e.name[..]);
    let fs = cx.fs;
    let o = cx.policy.manifest.get(&e.path);
    let (uid, gid) = cx.policy.owner(m, o);
    let perm = o.and_then(|o| o.mode).unwrap_or((m.mode() & 0o7777) as u16);
    let ft = m.file_type();
    let er = err(hp);
    if name == b"lost+found" && parent == fs.resolve("/", true).map_err(&er)? && ft.is_dir() {
        // The formatter made it: fill it.
        return Ok(Some(fs.lookup(parent, name).map_err(&er)?.ino));
    }
    if let Body::Link = e.body {
        let ino =
            cx.links.get(&(m.dev(), m.ino())).ok_or_else(|| format!("{}: lost hard link", hp.display()))?;
        fs.link(*ino, parent, name).map_err(&er)?;
        return Ok(None);
    }
    let ino = match &e.body {
        Body::Dir => fs.mkdir(parent, name, perm, uid, gid).map_err(&er)?.ino,
        Body::Symlink(target) => fs.symlink(parent, name, target, uid, gid).map_err(&er)?.ino,
        Body::Data(data) => {
            let ino = fs.create(parent, name, perm, uid, gid).map_err(&er)?.ino;
            if !data.is_empty() {
                write_all(fs, ino, data).map_err(&er)?;
                cx.filled.bytes += data.len() as u64;
                cx.bar.inc(data.len() as u64);
            }
            set_len(fs, ino, m.len()).map_err(&er)?;
            ino
        }
        Body::File => {
            let ino = fs.create(parent, name, perm, uid, gid).map_err(&er)?.ino;
            copy_data(cx, hp, ino, m)?;
            ino
        }
        Body::Link | Body::Special => {
            use rext4::format::inode::{S_IFBLK, S_IFCHR, S_IFIFO, S_IFSOCK};
            let kind = if ft.is_fifo() {
                S_IFIFO
            } else if ft.is_socket() {
                S_IFSOCK
            } else if ft.is_char_device() {
                S_IFCHR
            } else {
                S_IFBLK
            };
            let part =
                |n: u64| u32::try_from(n).map_err(|_| format!("{}: device number too large", hp.display()));
            let rdev = m.rdev();
            let dev = (part(nix::sys::stat::major(rdev))?, part(nix::sys::stat::minor(rdev))?);
            fs.mknod(parent, name, kind | perm, dev, uid, gid).map_err(&er)?.ino
        }
    };
    cx.filled.files += 1;
    if !ft.is_dir() && m.nlink() > 1 {
        cx.links.insert((m.dev(), m.ino()), ino);
    }
    Ok(Some(ino))
}

/// `data` written from the start of file `ino`, however many calls it takes.
fn write_all(fs: &Fs, ino: InodeNo, data: &[u8]) -> Result<(), rext4::Error> {
    let mut at = 0;
    while at < data.len() {
        at += fs.write(ino, at as u64, &data[at..])?;
    }
    Ok(())
}

/// A file shorter than the source says (holes at its end, or it shrank) grows to `len`.
fn set_len(fs: &Fs, ino: InodeNo, len: u64) -> Result<(), rext4::Error> {
    if fs.getattr(ino)?.size < len {
        fs.setattr(ino, &SetAttr { size: Some(len), ..SetAttr::default() })?;
    }
    Ok(())
}

/// Mode, owner, extended attributes and times, last (a directory's after its entries).
fn attrs(cx: &mut Ctx<'_>, e: Entry, ino: InodeNo) -> CliResult {
    let Entry { host, path, meta: m, xattrs, .. } = e;
    let src = SourceAttrs {
        uid: m.uid(),
        gid: m.gid(),
        mode: (!m.file_type().is_symlink()).then_some((m.mode() & 0o7777) as u16),
        mtime: (m.mtime(), m.mtime_nsec()),
        atime: Some((m.atime(), m.atime_nsec())),
        xattrs,
    };
    cx.policy.apply(cx.fs, ino, &path, src).map_err(|err| format!("{}: {err}", host.display()))
}

/// Copies a host file's data, skipping its holes (SEEK_DATA / SEEK_HOLE).
fn copy_data(cx: &mut Ctx<'_>, host: &Path, ino: InodeNo, m: &Metadata) -> CliResult {
    let f = std::fs::File::open(host).map_err(|e| format!("{}: {e}", host.display()))?;
    let e = |err: rext4::Error| format!("{}: {err}", host.display());
    let len = m.len();
    // Storage for every byte: no hole to look for (each look walks the file's page map).
    let dense = m.blocks() * 512 >= len;
    let mut pos = 0u64;
    while pos < len {
        let off = i64::try_from(pos).unwrap_or(i64::MAX);
        let found = if dense { Ok(off) } else { nix::unistd::lseek(&f, off, nix::unistd::Whence::SeekData) };
        let data = match found {
            Ok(d) => u64::try_from(d).unwrap_or(pos),
            Err(nix::errno::Errno::ENXIO) => break,
            Err(_) => pos,
        };
        let hole = if dense {
            len
        } else {
            nix::unistd::lseek(&f, i64::try_from(data).unwrap_or(i64::MAX), nix::unistd::Whence::SeekHole)
                .map_or(len, |h| u64::try_from(h).unwrap_or(len))
                .min(len)
        };
        let mut at = data;
        while at < hole {
            // The image takes the bytes from the kernel's copy of the file (copy_file_range
            // where the image is a file), a piece at a time for the progress bar.
            let want = (hole - at).min(CHUNK);
            let n = cx.fs.write_from_file(ino, at, &f, at, want).map_err(e)?;
            at += n;
            cx.filled.bytes += n;
            cx.bar.inc(n);
            if n < want {
                break;
            }
        }
        if at <= pos {
            break;
        }
        pos = at;
    }
    set_len(cx.fs, ino, len).map_err(e)
}

/// Bytes of data and files in the tree at `src`, for the progress bar and the size estimate.
pub(crate) fn measure(src: &Path) -> CliResult<(u64, u64, u64)> {
    let (mut bytes, mut files, mut dirs) = (0u64, 0u64, 0u64);
    let mut stack = vec![src.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))? {
            let e = e.map_err(|e| e.to_string())?;
            let m = e.metadata().map_err(|err| format!("{}: {err}", e.path().display()))?;
            files += 1;
            if m.is_dir() {
                dirs += 1;
                stack.push(e.path());
            } else if m.is_file() {
                bytes += m.blocks() * 512;
            }
        }
    }
    Ok((bytes, files, dirs))
}
