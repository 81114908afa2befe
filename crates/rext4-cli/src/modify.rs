//! Commands that change an image: chmod, chown, touch. Each opens the image for writing,
//! makes its change through the journal, and closes it clean.

use crate::imagepath::ImagePath;
use crate::CliResult;
use rext4::{Fs, Options, SetAttr, TimeSet, Timestamp};

fn open_rw(p: &ImagePath) -> CliResult<Fs> {
    Fs::open_with(&p.image, Options { writable: true, ..Options::default() })
        .map_err(|e| format!("{}: {e}", p.image.display()))
}

fn apply(target: &str, ch: &SetAttr, follow: bool) -> CliResult {
    let p = ImagePath::parse(target)?;
    let fs = open_rw(&p)?;
    let r = fs.resolve(&p.path, follow).and_then(|ino| fs.setattr(ino, ch));
    let closed = fs.unmount();
    r.map_err(|e| p.err(e))?;
    closed.map_err(|e| p.err(e))
}

/// `rext4 chmod MODE IMAGE:/path` (octal mode).
pub(crate) fn chmod(mode: &str, target: &str) -> CliResult {
    let m = u16::from_str_radix(mode, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("invalid mode: '{mode}'"))?;
    apply(target, &SetAttr { mode: Some(m), ..SetAttr::default() }, true)
}

/// `rext4 chown UID[:GID] IMAGE:/path` (numeric ids; does not follow a final symlink, like
/// `chown -h`).
pub(crate) fn chown(owner: &str, target: &str) -> CliResult {
    let bad = || format!("invalid owner: '{owner}'");
    let (u, g) = match owner.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (owner, None),
    };
    let uid = if u.is_empty() { None } else { Some(u.parse::<u32>().map_err(|_| bad())?) };
    let gid = match g {
        Some(g) if !g.is_empty() => Some(g.parse::<u32>().map_err(|_| bad())?),
        _ => None,
    };
    apply(target, &SetAttr { uid, gid, ..SetAttr::default() }, false)
}

/// `rext4 touch [-d SECONDS[.NANOS]] IMAGE:/path`: sets access and modification times of an
/// existing file to now or to the given time.
pub(crate) fn touch(date: Option<&str>, target: &str) -> CliResult {
    let t = match date {
        None => TimeSet::Now,
        Some(d) => {
            let bad = || format!("invalid time: '{d}' (seconds since the epoch, optionally .nanoseconds)");
            let (s, n) = d.split_once('.').unwrap_or((d, "0"));
            let sec: i64 = s.parse().map_err(|_| bad())?;
            if n.is_empty() || n.len() > 9 || !n.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            let nsec: u32 = format!("{n:0<9}").parse().map_err(|_| bad())?;
            TimeSet::At(Timestamp { sec, nsec })
        }
    };
    apply(target, &SetAttr { atime: Some(t), mtime: Some(t), ..SetAttr::default() }, true)
}

/// Splits an image path into its parent directory and last name.
fn split(path: &str) -> CliResult<(&str, &str)> {
    let p = path.trim_end_matches('/');
    match p.rsplit_once('/') {
        Some((parent, name)) if !name.is_empty() => Ok((if parent.is_empty() { "/" } else { parent }, name)),
        _ => Err(format!("{path}: not a path below the root")),
    }
}

fn parent_of(fs: &Fs, p: &ImagePath, path: &str) -> CliResult<(rext4::InodeNo, Vec<u8>)> {
    let (parent, name) = split(path)?;
    let dir = fs.resolve(parent, true).map_err(|e| p.err(e))?;
    Ok((dir, name.as_bytes().to_vec()))
}

fn with_rw(target: &str, f: impl FnOnce(&Fs, &ImagePath) -> CliResult) -> CliResult {
    let p = ImagePath::parse(target)?;
    let fs = open_rw(&p)?;
    let r = f(&fs, &p);
    let closed = fs.unmount();
    r?;
    closed.map_err(|e| p.err(e))
}

/// `rext4 mkdir [-p] IMAGE:/path`.
pub(crate) fn mkdir(target: &str, parents: bool) -> CliResult {
    with_rw(target, |fs, p| {
        let comps: Vec<&str> = p.path.split('/').filter(|c| !c.is_empty()).collect();
        let cannot = |e: &dyn std::fmt::Display| {
            format!("cannot create directory '{}:{}': {e}", p.image.display(), p.path)
        };
        if comps.is_empty() {
            return Err(cannot(&"file exists"));
        }
        let mut dir = fs.root();
        for (i, c) in comps.iter().enumerate() {
            let last = i + 1 == comps.len();
            match fs.lookup(dir, c.as_bytes()) {
                Ok(a) if !last || parents => {
                    if a.kind != rext4::FileType::Directory {
                        return Err(p.err("not a directory"));
                    }
                    dir = a.ino;
                }
                Ok(_) => return Err(cannot(&"file exists")),
                Err(e) if e.errno() == 2 && (last || parents) => {
                    dir = fs.mkdir(dir, c.as_bytes(), 0o755, 0, 0).map_err(|e| cannot(&e))?.ino;
                }
                Err(e) => return Err(p.err(e)),
            }
        }
        Ok(())
    })
}

/// `rext4 rm [-r] IMAGE:/path`. Like coreutils' rm, `.`, `..` and the root are refused
/// before anything is touched.
pub(crate) fn rm(target: &str, recursive: bool) -> CliResult {
    let p = ImagePath::parse(target)?;
    let trimmed = p.path.trim_end_matches('/');
    let last = trimmed.rsplit('/').next().unwrap_or("");
    if last == "." || last == ".." {
        return Err(format!("refusing to remove '.' or '..' directory: skipping '{target}'"));
    }
    if trimmed.split('/').all(|c| c.is_empty() || c == ".") {
        return Err(if recursive {
            format!("it is dangerous to operate recursively on '{target}' (the image's root)")
        } else {
            format!("cannot remove '{target}': is a directory")
        });
    }
    with_rw(target, |fs, p| {
        let (dir, name) = parent_of(fs, p, &p.path)?;
        let a = fs.lookup(dir, &name).map_err(|e| p.err(e))?;
        if a.kind != rext4::FileType::Directory {
            return fs.unlink(dir, &name).map_err(|e| p.err(e));
        }
        if !recursive {
            return Err(p.err("is a directory (use -r)"));
        }
        remove_tree(fs, p, dir, &name, a.ino)
    })
}

/// Removes directory `ino` (named `name` in `parent`) and everything below it, depth first
/// with an explicit stack. A directory met twice (a crafted image's directory hard link, or
/// a cycle back to an ancestor) and names no directory may hold are reported and left, so
/// the walk ends; the directories holding them then cannot be removed.
fn remove_tree(
    fs: &Fs,
    p: &ImagePath,
    parent: rext4::InodeNo,
    name: &[u8],
    ino: rext4::InodeNo,
) -> CliResult {
    let top = p.path.trim_end_matches('/').to_string();
    let mut seen = std::collections::HashSet::from([ino]);
    let mut stack = vec![(parent, name.to_vec(), ino, top, false)];
    while let Some((par, n, dir, path, emptied)) = stack.pop() {
        if emptied {
            fs.rmdir(par, &n).map_err(|e| format!("{}:{path}: {e}", p.image.display()))?;
            continue;
        }
        stack.push((par, n, dir, path.clone(), true));
        for e in p.children(fs, dir)? {
            let child = format!("{path}/{}", crate::fmt::name(&e.name));
            if let Some(why) = crate::fmt::bad_name(&e.name) {
                eprintln!(
                    "rext4: warning: directory inode {dir}: {why}: '{}'; left",
                    crate::fmt::name(&e.name)
                );
                continue;
            }
            let kind = match e.kind {
                Some(k) => k,
                None => fs.getattr(e.ino).map_err(|err| p.err(err))?.kind,
            };
            if kind == rext4::FileType::Directory {
                if !seen.insert(e.ino) {
                    eprintln!(
                        "rext4: directory cycle at {}:{child} (inode {}); left",
                        p.image.display(),
                        e.ino
                    );
                    continue;
                }
                stack.push((dir, e.name, e.ino, child, false));
            } else {
                fs.unlink(dir, &e.name).map_err(|err| format!("{}:{child}: {err}", p.image.display()))?;
            }
        }
    }
    Ok(())
}

/// `rext4 mv IMAGE:/from IMAGE:/to` (within one image; into `to` if it is a directory).
pub(crate) fn mv(from: &str, to: &str) -> CliResult {
    let dest = ImagePath::parse(to)?;
    with_rw(from, |fs, p| {
        if dest.image != p.image {
            return Err("mv works within one image".into());
        }
        let (odir, oname) = parent_of(fs, p, &p.path)?;
        let (ndir, nname) = match fs.metadata(&dest.path) {
            Ok(a) if a.kind == rext4::FileType::Directory => (a.ino, oname.clone()),
            _ => parent_of(fs, &dest, &dest.path)?,
        };
        fs.rename(odir, &oname, ndir, &nname, 0).map_err(|e| p.err(e))
    })
}

/// `rext4 ln [-s] TARGET IMAGE:/path`: a hard link to `IMAGE:/target`, or with `-s` a
/// symbolic link holding TARGET as written.
pub(crate) fn ln(target: &str, link: &str, symbolic: bool) -> CliResult {
    with_rw(link, |fs, p| {
        let (dir, name) = parent_of(fs, p, &p.path)?;
        if symbolic {
            fs.symlink(dir, &name, target.as_bytes(), 0, 0).map(|_| ()).map_err(|e| p.err(e))
        } else {
            let t = ImagePath::parse(target).map(|t| t.path).unwrap_or_else(|_| target.to_string());
            let ino = fs.resolve(&t, false).map_err(|e| p.err(e))?;
            fs.link(ino, dir, &name).map(|_| ()).map_err(|e| p.err(e))
        }
    })
}

/// `rext4 truncate -s [+|-]SIZE[K|M|G|T] IMAGE:/path`, creating the file if it is missing.
pub(crate) fn truncate(size: &str, target: &str) -> CliResult {
    let bad = || format!("invalid size: '{size}'");
    let (rel, digits) = match size.as_bytes().first() {
        Some(b'+') => (1i8, &size[1..]),
        Some(b'-') => (-1, &size[1..]),
        _ => (0, size),
    };
    let (num, mult) = match digits.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(bad()),
            };
            (&digits[..i], m)
        }
        _ => (digits, 1),
    };
    let n = num.parse::<u64>().ok().and_then(|n| n.checked_mul(mult)).ok_or_else(bad)?;
    let p = ImagePath::parse(target)?;
    let fs = open_rw(&p)?;
    let r = (|| {
        let ino = match fs.resolve(&p.path, true) {
            Ok(ino) => ino,
            Err(rext4::Error::NotFound) => {
                let trimmed = p.path.trim_end_matches('/');
                let (dir, leaf) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
                let parent = fs.resolve(if dir.is_empty() { "/" } else { dir }, true)?;
                let (uid, gid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
                fs.create(parent, leaf.as_bytes(), 0o644, uid, gid)?.ino
            }
            Err(e) => return Err(e),
        };
        let cur = fs.getattr(ino)?.size;
        let new = match rel {
            1 => cur.checked_add(n).ok_or(rext4::Error::FileTooBig)?,
            -1 => cur.saturating_sub(n),
            _ => n,
        };
        fs.setattr(ino, &SetAttr { size: Some(new), ..SetAttr::default() }).map(|_| ())
    })();
    let closed = fs.unmount();
    r.map_err(|e| p.err(e))?;
    closed.map_err(|e| p.err(e))
}
