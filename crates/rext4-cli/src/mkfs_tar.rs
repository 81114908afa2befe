//! `rext4 mkfs --from ARCHIVE`: fills a new filesystem from a tar archive (plain, gzip or
//! zstd, told apart by their first bytes) through the engine, in archive order: directories,
//! files (runs of zeros left as holes), symbolic and hard links, devices and fifos, with the
//! archive's owners, modes, nanosecond times (pax) and extended attributes
//! (`SCHILY.xattr.*`, as GNU tar and bsdtar write them). The same policy as a directory's
//! applies: manifest, `--all-root`, uid/gid offsets, times clamped for reproducible builds.
//!
//! Names from an archive are untrusted: a `..` component is refused, leading `/` and `.`
//! are dropped, and a path never leaves the image's root.

use crate::mkfs_from::{Filled, Policy, SourceAttrs};
use crate::CliResult;
use rext4::{Fs, InodeNo, SetAttr};
use std::io::Read;
use std::path::Path;
use tar::EntryType;

const CHUNK: usize = 1 << 20;

/// Whether `p` names an archive rather than a directory.
pub(crate) fn is_archive(p: &Path) -> bool {
    p.is_file()
}

/// The archive's entries, decompressed as its first bytes say.
pub(crate) fn open(p: &Path) -> CliResult<tar::Archive<Box<dyn Read>>> {
    let e = |err: std::io::Error| format!("{}: {err}", p.display());
    let mut f = std::fs::File::open(p).map_err(e)?;
    let mut magic = [0u8; 4];
    let n = f.read(&mut magic).map_err(e)?;
    let f = std::io::Cursor::new(magic[..n].to_vec()).chain(f);
    let r: Box<dyn Read> = match magic {
        [0x1f, 0x8b, ..] => Box::new(flate2::read::MultiGzDecoder::new(f)),
        [0x28, 0xb5, 0x2f, 0xfd] => Box::new(
            ruzstd::decoding::StreamingDecoder::new(f)
                .map_err(|err| format!("{}: zstd: {err}", p.display()))?,
        ),
        _ => Box::new(f),
    };
    Ok(tar::Archive::new(r))
}

/// Bytes of file data and entries in the archive, and its newest modification time.
pub(crate) fn measure(p: &Path) -> CliResult<(u64, u64, i64)> {
    let mut ar = open(p)?;
    let (mut bytes, mut files, mut newest) = (0u64, 0u64, 0i64);
    for e in ar.entries().map_err(|err| format!("{}: {err}", p.display()))? {
        let e = e.map_err(|err| format!("{}: {err}", p.display()))?;
        files += 1;
        if e.header().entry_type().is_file() {
            bytes += e.size();
        }
        newest = newest.max(e.header().mtime().ok().and_then(|t| i64::try_from(t).ok()).unwrap_or(0));
    }
    Ok((bytes, files, newest))
}

/// The components of an archive path in the image, or an error for one that would leave it.
fn components(raw: &[u8]) -> CliResult<Vec<&[u8]>> {
    let mut out = Vec::new();
    for c in raw.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err(format!("{}: a '..' in an archive path", String::from_utf8_lossy(raw))),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// The image path (`/a/b`) of components, as manifests name it.
fn image_path(parts: &[&[u8]]) -> Vec<u8> {
    let mut p = Vec::new();
    for c in parts {
        p.push(b'/');
        p.extend_from_slice(c);
    }
    if p.is_empty() {
        p.push(b'/');
    }
    p
}

struct Ctx<'a> {
    fs: &'a Fs,
    policy: &'a Policy,
    root: InodeNo,
    filled: Filled,
    bar: &'a indicatif::ProgressBar,
    /// Directories with their attributes, set once everything is in (their times would move).
    dirs: Vec<(InodeNo, Vec<u8>, SourceAttrs)>,
}

/// A pax time (`1700000000.123456789`) as seconds and nanoseconds.
fn pax_time(v: &[u8]) -> Option<(i64, i64)> {
    let s = std::str::from_utf8(v).ok()?;
    let (sec, frac) = s.split_once('.').unwrap_or((s, ""));
    let mut digits: String = frac.chars().take(9).collect();
    while digits.len() < 9 {
        digits.push('0');
    }
    let (sec, ns): (i64, i64) = (sec.parse().ok()?, digits.parse().ok()?);
    // `-1.25` is 1.25 s before the epoch: second -2, 750 ms into it.
    if sec < 0 || s.starts_with('-') {
        if ns == 0 {
            return Some((sec, 0));
        }
        return Some((sec - 1, 1_000_000_000 - ns));
    }
    Some((sec, ns))
}

/// Fills `fs`'s root from the archive at `src`.
pub(crate) fn fill(fs: &Fs, src: &Path, policy: &Policy, bar: &indicatif::ProgressBar) -> CliResult<Filled> {
    let root = crate::mkfs_from::root(fs)?;
    let mut cx = Ctx { fs, policy, root, filled: Filled::default(), bar, dirs: Vec::new() };
    let mut ar = open(src)?;
    let at = |err: std::io::Error| format!("{}: {err}", src.display());
    // Raw entries: the reader's own pax parsing splits records at newlines, which binary
    // xattr values hold; records are read here by their lengths, as POSIX defines them.
    let mut ext = Extended::default();
    for e in ar.entries().map_err(at)?.raw(true) {
        let mut e = e.map_err(at)?;
        let kind = e.header().entry_type();
        if kind.is_pax_local_extensions() || kind.is_gnu_longname() || kind.is_gnu_longlink() {
            let mut data = Vec::new();
            e.read_to_end(&mut data).map_err(at)?;
            if kind.is_pax_local_extensions() {
                ext.pax(&data);
            } else {
                let name = data.split(|&b| b == 0).next().unwrap_or_default().to_vec();
                if kind.is_gnu_longname() {
                    ext.path = Some(name);
                } else {
                    ext.link = Some(name);
                }
            }
            continue;
        }
        if kind.is_pax_global_extensions() {
            continue;
        }
        let this = std::mem::take(&mut ext);
        entry(&mut cx, &mut e, this).map_err(|err| format!("{}: {err}", src.display()))?;
    }
    // Deepest first, so a parent's times are set after its children's.
    let dirs = std::mem::take(&mut cx.dirs);
    for (ino, path, a) in dirs.into_iter().rev() {
        cx.policy.apply(fs, ino, &path, a)?;
    }
    Ok(cx.filled)
}

/// What extended headers say of the entry after them.
#[derive(Default)]
struct Extended {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    uid: Option<u32>,
    gid: Option<u32>,
    mtime: Option<(i64, i64)>,
    atime: Option<(i64, i64)>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Extended {
    /// Reads pax records (`LEN key=value\n`, LEN counting the whole record).
    fn pax(&mut self, mut data: &[u8]) {
        while let Some(sp) = data.iter().position(|&b| b == b' ') {
            let Some(len) = std::str::from_utf8(&data[..sp]).ok().and_then(|l| l.parse::<usize>().ok())
            else {
                return;
            };
            if len <= sp + 1 || len > data.len() {
                return;
            }
            let rec = &data[sp + 1..len];
            let rec = rec.strip_suffix(b"\n").unwrap_or(rec);
            if let Some(eq) = rec.iter().position(|&b| b == b'=') {
                let (k, v) = (&rec[..eq], &rec[eq + 1..]);
                match k {
                    b"path" => self.path = Some(v.to_vec()),
                    b"linkpath" => self.link = Some(v.to_vec()),
                    b"mtime" => self.mtime = pax_time(v),
                    // Ids past the header's octal field.
                    b"uid" => self.uid = std::str::from_utf8(v).ok().and_then(|x| x.parse().ok()),
                    b"gid" => self.gid = std::str::from_utf8(v).ok().and_then(|x| x.parse().ok()),
                    b"atime" => self.atime = pax_time(v),
                    _ => {
                        if let Some(name) = k.strip_prefix(b"SCHILY.xattr.") {
                            self.xattrs.push((name.to_vec(), v.to_vec()));
                        }
                    }
                }
            }
            data = &data[len..];
        }
    }
}

fn entry<R: Read>(cx: &mut Ctx<'_>, e: &mut tar::Entry<'_, R>, ext: Extended) -> CliResult {
    let raw = ext.path.clone().unwrap_or_else(|| e.path_bytes().into_owned());
    let parts = components(&raw)?;
    let path = image_path(&parts);
    let h = e.header();
    let kind = h.entry_type();
    let mode = h.mode().ok().and_then(|m| u16::try_from(m & 0o7777).ok()).unwrap_or(0o644);
    // What the entry says of itself; a symbolic link's mode is not set.
    let a = SourceAttrs {
        uid: ext.uid.or_else(|| h.uid().ok().and_then(|u| u32::try_from(u).ok())).unwrap_or(0),
        gid: ext.gid.or_else(|| h.gid().ok().and_then(|g| u32::try_from(g).ok())).unwrap_or(0),
        mode: (kind != EntryType::Symlink).then_some(mode),
        mtime: ext.mtime.unwrap_or((h.mtime().ok().and_then(|t| i64::try_from(t).ok()).unwrap_or(0), 0)),
        atime: ext.atime,
        xattrs: ext.xattrs,
    };
    let link = ext.link.or_else(|| e.link_name_bytes().map(|l| l.into_owned()));
    let dev = (h.device_major().ok().flatten().unwrap_or(0), h.device_minor().ok().flatten().unwrap_or(0));
    let fs = cx.fs;
    let show = String::from_utf8_lossy(&raw).into_owned();
    let err = |x: rext4::Error| format!("{show}: {x}");
    let Some((name, dirs)) = parts.split_last() else {
        // The archive's `./`: the root's own attributes.
        cx.dirs.push((cx.root, path, a));
        return Ok(());
    };
    let parent = parent_dir(cx, dirs)?;
    let o = cx.policy.manifest.get(&path);
    let (uid, gid) = cx.policy.owner_of(a.uid, a.gid, o);
    let perm = o.and_then(|o| o.mode).unwrap_or(mode);
    // A later entry of the same name replaces an earlier one, as tar does; a directory stays.
    let existing = fs.lookup(parent, name).ok();
    if let Some(x) = &existing {
        if kind.is_dir() && x.kind == rext4::FileType::Directory {
            cx.dirs.push((x.ino, path, a));
            return Ok(());
        }
        if x.kind == rext4::FileType::Directory {
            fs.rmdir(parent, name).map_err(err)?;
        } else {
            fs.unlink(parent, name).map_err(err)?;
        }
    }
    let ino = match kind {
        EntryType::Directory => {
            let ino = fs.mkdir(parent, name, perm, uid, gid).map_err(err)?.ino;
            cx.dirs.push((ino, path, a));
            cx.filled.files += 1;
            return Ok(());
        }
        EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
            let ino = fs.create(parent, name, perm, uid, gid).map_err(err)?.ino;
            copy_data(cx, e, ino).map_err(|x| format!("{show}: {x}"))?;
            ino
        }
        EntryType::Symlink => {
            let target = link.ok_or_else(|| format!("{show}: a symbolic link without a target"))?;
            fs.symlink(parent, name, &target, uid, gid).map_err(err)?.ino
        }
        EntryType::Link => {
            let target = link.ok_or_else(|| format!("{show}: a hard link without a target"))?;
            let tparts = components(&target)?;
            let (tname, tdirs) =
                tparts.split_last().ok_or_else(|| format!("{show}: a hard link to the root"))?;
            let tdir = parent_dir(cx, tdirs)?;
            let t = fs.lookup(tdir, tname).map_err(err)?;
            fs.link(t.ino, parent, name).map_err(err)?;
            return Ok(());
        }
        EntryType::Char | EntryType::Block | EntryType::Fifo => {
            use rext4::format::inode::{S_IFBLK, S_IFCHR, S_IFIFO};
            let ft = match kind {
                EntryType::Char => S_IFCHR,
                EntryType::Block => S_IFBLK,
                _ => S_IFIFO,
            };
            fs.mknod(parent, name, ft | perm, dev, uid, gid).map_err(err)?.ino
        }
        // Headers of the archive itself (pax globals, GNU long names the reader consumed).
        _ => return Ok(()),
    };
    cx.filled.files += 1;
    cx.policy.apply(fs, ino, &path, a)
}

/// The directory `dirs` names under the root, made (0755, root's) where the archive skipped it.
fn parent_dir(cx: &mut Ctx<'_>, dirs: &[&[u8]]) -> CliResult<InodeNo> {
    let mut cur = cx.root;
    for d in dirs {
        cur = match cx.fs.lookup(cur, d) {
            Ok(a) if a.kind == rext4::FileType::Directory => a.ino,
            Ok(_) => return Err(format!("{}: not a directory", String::from_utf8_lossy(d))),
            Err(rext4::Error::NotFound) => {
                let (uid, gid) = cx.policy.owner_of(0, 0, None);
                cx.fs.mkdir(cur, d, 0o755, uid, gid).map_err(|e| e.to_string())?.ino
            }
            Err(e) => return Err(e.to_string()),
        };
    }
    Ok(cur)
}

/// Copies an entry's data; whole blocks of zeros are left as holes.
fn copy_data<R: Read>(cx: &mut Ctx<'_>, e: &mut tar::Entry<'_, R>, ino: InodeNo) -> CliResult {
    let len = e.size();
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0u64;
    loop {
        let n = read_full(e, &mut buf).map_err(|x| x.to_string())?;
        if n == 0 {
            break;
        }
        let data = &buf[..n];
        // 4 KiB pieces: those all zero become holes.
        let mut off = 0;
        while off < n {
            let end = (off + 4096).min(n);
            if data[off..end].iter().any(|&b| b != 0) {
                cx.fs.write(ino, at + off as u64, &data[off..end]).map_err(|x| x.to_string())?;
            }
            off = end;
        }
        at += n as u64;
        cx.filled.bytes += n as u64;
        cx.bar.inc(n as u64);
    }
    let size = len.max(at);
    if cx.fs.getattr(ino).map_err(|x| x.to_string())?.size < size {
        cx.fs.setattr(ino, &SetAttr { size: Some(size), ..SetAttr::default() }).map_err(|x| x.to_string())?;
    }
    Ok(())
}

pub(crate) fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_paths_never_leave_the_root() {
        assert_eq!(components(b"./a//b/").unwrap(), vec![&b"a"[..], b"b"]);
        assert_eq!(components(b"/etc/passwd").unwrap(), vec![&b"etc"[..], b"passwd"]);
        assert!(components(b"a/../../x").is_err());
        assert!(components(b"..").is_err());
        assert_eq!(image_path(&[]), b"/");
        assert_eq!(pax_time(b"1700000000.5"), Some((1_700_000_000, 500_000_000)));
        assert_eq!(pax_time(b"12"), Some((12, 0)));
        assert_eq!(pax_time(b"-0.000000001"), Some((-1, 999_999_999)));
        assert_eq!(pax_time(b"-999999999.9999995"), Some((-1_000_000_000, 500)));
        let mut x = Extended::default();
        x.pax(b"27 SCHILY.xattr.user.a=\x00\n\xff\n15 path=d/\xe5\x90\x8d\x0a\n");
        assert_eq!(x.xattrs, vec![(b"user.a".to_vec(), b"\x00\n\xff".to_vec())]);
        assert_eq!(x.path.as_deref(), Some(&b"d/\xe5\x90\x8d\x0a"[..]));
    }
}
