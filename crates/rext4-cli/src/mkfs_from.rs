//! `rext4 mkfs --from DIR`: fills a new filesystem with a host tree through the engine —
//! hard links, symbolic links, devices, fifos, sockets, extended attributes (ACLs included),
//! holes, nanosecond times — in name order, so the same tree always makes the same image.
//! Owners, modes, times and xattrs can be overridden by a manifest, `--all-root` and
//! `--uid-offset`/`--gid-offset`, with no root needed.

use crate::CliResult;
use rext4::{Fs, InodeNo, SetAttr, TimeSet, Timestamp};
use std::collections::{BTreeMap, HashMap};
use std::fs::Metadata;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

const CHUNK: usize = 1 << 20;

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

struct Ctx<'a> {
    fs: &'a Fs,
    policy: &'a Policy,
    links: HashMap<(u64, u64), InodeNo>,
    filled: Filled,
    bar: &'a indicatif::ProgressBar,
    buf: Vec<u8>,
}

/// Fills `fs`'s root from the tree at `src`.
pub(crate) fn fill(fs: &Fs, src: &Path, policy: &Policy, bar: &indicatif::ProgressBar) -> CliResult<Filled> {
    let meta = std::fs::symlink_metadata(src).map_err(|e| format!("{}: {e}", src.display()))?;
    if !meta.is_dir() {
        return Err(format!("{}: not a directory", src.display()));
    }
    let root = fs.resolve("/", true).map_err(|e| e.to_string())?;
    let mut cx =
        Ctx { fs, policy, links: HashMap::new(), filled: Filled::default(), bar, buf: vec![0; CHUNK] };
    dir(&mut cx, src, root, b"/")?;
    // The root takes the source directory's owner, mode and times.
    attrs(&mut cx, src, &meta, root, b"/")?;
    Ok(cx.filled)
}

fn err(p: &Path) -> impl Fn(rext4::Error) -> String + '_ {
    move |e| format!("{}: {e}", p.display())
}

/// Copies the entries of the host directory `host` into `ino`, in byte order of their names.
fn dir(cx: &mut Ctx<'_>, host: &Path, ino: InodeNo, path: &[u8]) -> CliResult {
    let mut entries: Vec<(Vec<u8>, PathBuf)> = std::fs::read_dir(host)
        .map_err(|e| format!("{}: {e}", host.display()))?
        .map(|e| e.map(|e| (e.file_name().as_bytes().to_vec(), e.path())))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", host.display()))?;
    entries.sort();
    for (name, hp) in entries {
        let mut child_path = path.to_vec();
        if path != b"/" {
            child_path.push(b'/');
        }
        child_path.extend_from_slice(&name);
        one(cx, &hp, ino, &name, &child_path)?;
    }
    Ok(())
}

fn one(cx: &mut Ctx<'_>, hp: &Path, parent: InodeNo, name: &[u8], path: &[u8]) -> CliResult {
    let m = std::fs::symlink_metadata(hp).map_err(|e| format!("{}: {e}", hp.display()))?;
    let fs = cx.fs;
    let o = cx.policy.manifest.get(path);
    let (uid, gid) = cx.policy.owner(&m, o);
    let perm = o.and_then(|o| o.mode).unwrap_or((m.mode() & 0o7777) as u16);
    let ft = m.file_type();
    let e = err(hp);
    if name == b"lost+found" && parent == fs.resolve("/", true).map_err(&e)? && ft.is_dir() {
        // The formatter made it: fill it.
        let ino = fs.lookup(parent, name).map_err(&e)?.ino;
        dir(cx, hp, ino, path)?;
        return attrs(cx, hp, &m, ino, path);
    }
    if !ft.is_dir() && m.nlink() > 1 {
        if let Some(&ino) = cx.links.get(&(m.dev(), m.ino())) {
            fs.link(ino, parent, name).map_err(&e)?;
            return Ok(());
        }
    }
    let ino = if ft.is_dir() {
        fs.mkdir(parent, name, perm, uid, gid).map_err(&e)?.ino
    } else if ft.is_symlink() {
        let target = std::fs::read_link(hp).map_err(|err| format!("{}: {err}", hp.display()))?;
        fs.symlink(parent, name, target.as_os_str().as_bytes(), uid, gid).map_err(&e)?.ino
    } else if ft.is_file() {
        let ino = fs.create(parent, name, perm, uid, gid).map_err(&e)?.ino;
        copy_data(cx, hp, ino, m.len())?;
        ino
    } else {
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
        fs.mknod(parent, name, kind | perm, dev, uid, gid).map_err(&e)?.ino
    };
    cx.filled.files += 1;
    if !ft.is_dir() && m.nlink() > 1 {
        cx.links.insert((m.dev(), m.ino()), ino);
    }
    if ft.is_dir() {
        dir(cx, hp, ino, path)?;
    }
    attrs(cx, hp, &m, ino, path)
}

/// Mode, owner, extended attributes and times, last (a directory's after its entries).
fn attrs(cx: &mut Ctx<'_>, hp: &Path, m: &Metadata, ino: InodeNo, path: &[u8]) -> CliResult {
    let mut xattrs: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    if let Ok(names) = xattr::list(hp) {
        for n in names {
            if let Ok(Some(v)) = xattr::get(hp, &n) {
                xattrs.push((n.as_bytes().to_vec(), v));
            }
        }
    }
    let src = SourceAttrs {
        uid: m.uid(),
        gid: m.gid(),
        mode: (!m.file_type().is_symlink()).then_some((m.mode() & 0o7777) as u16),
        mtime: (m.mtime(), m.mtime_nsec()),
        atime: Some((m.atime(), m.atime_nsec())),
        xattrs,
    };
    cx.policy.apply(cx.fs, ino, path, src).map_err(|e| format!("{}: {e}", hp.display()))
}

/// Copies a host file's data, skipping its holes (SEEK_DATA / SEEK_HOLE).
fn copy_data(cx: &mut Ctx<'_>, host: &Path, ino: InodeNo, len: u64) -> CliResult {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(host).map_err(|e| format!("{}: {e}", host.display()))?;
    let e = |err: rext4::Error| format!("{}: {err}", host.display());
    let mut pos = 0u64;
    while pos < len {
        let off = i64::try_from(pos).unwrap_or(i64::MAX);
        let data = match nix::unistd::lseek(&f, off, nix::unistd::Whence::SeekData) {
            Ok(d) => u64::try_from(d).unwrap_or(pos),
            Err(nix::errno::Errno::ENXIO) => break,
            Err(_) => pos,
        };
        let hole =
            nix::unistd::lseek(&f, i64::try_from(data).unwrap_or(i64::MAX), nix::unistd::Whence::SeekHole)
                .map_or(len, |h| u64::try_from(h).unwrap_or(len))
                .min(len);
        let mut at = data;
        while at < hole {
            let want = usize::try_from(hole - at).map_or(CHUNK, |n| n.min(CHUNK));
            let n = f.read_at(&mut cx.buf[..want], at).map_err(|err| format!("{}: {err}", host.display()))?;
            if n == 0 {
                break;
            }
            cx.fs.write(ino, at, &cx.buf[..n]).map_err(e)?;
            at += n as u64;
            cx.filled.bytes += n as u64;
            cx.bar.inc(n as u64);
        }
        if at <= pos {
            break;
        }
        pos = at;
    }
    if cx.fs.getattr(ino).map_err(e)?.size < len {
        cx.fs.setattr(ino, &SetAttr { size: Some(len), ..SetAttr::default() }).map_err(e)?;
    }
    Ok(())
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
