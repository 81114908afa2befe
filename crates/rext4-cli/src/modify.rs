//! Commands that change an image: chmod, chown, touch. Each opens the image for writing,
//! makes its change through the journal, and closes it clean.

use crate::imagepath::ImagePath;
use crate::CliResult;
use rext4::{Fs, Options, SetAttr, TimeSet, Timestamp};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn open_rw(p: &ImagePath) -> CliResult<Fs> {
    Fs::open_with(&p.image, writable_options()).map_err(|e| format!("{}: {e}", p.image.display()))
}

/// How the commands that change an image open it. Under a pinned clock (SOURCE_DATE_EPOCH)
/// every write allocates as it comes (no delayed allocation, whose writeback order follows
/// timers and memory), so the same input gives the same blocks. `noatime`: the directories a
/// command lists on its way (`rm -r`, `cp -r` into an image, `mkfs --from`) are the editor's
/// business, not a use of the files, and keep their access times, as debugfs leaves them.
pub(crate) fn writable_options() -> Options {
    Options {
        writable: true,
        delalloc: rext4::clock::fixed_time().is_none(),
        atime: rext4::AtimeMode::NoAtime,
        ..read_options()
    }
}

/// The journal device `--journal` names and the keys `--key` and `--key-v1` give, for every
/// open of the command.
static OPEN_ARGS: std::sync::OnceLock<(Option<std::path::PathBuf>, Vec<rext4::EncryptionKey>)> =
    std::sync::OnceLock::new();

/// Records `--journal`, `--key` and `--key-v1` (once, at start).
pub(crate) fn set_open_args(journal: Option<std::path::PathBuf>, keys: Vec<rext4::EncryptionKey>) {
    let _ = OPEN_ARGS.set((journal, keys));
}

/// How commands that only read open an image: with the journal device and keys given.
pub(crate) fn read_options() -> Options {
    let (journal_path, encryption_keys) = OPEN_ARGS.get().cloned().unwrap_or_default();
    Options { journal_path, encryption_keys, ..Options::default() }
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
        let r = if parents { fs.create_dir_all(&p.path) } else { fs.create_dir(&p.path) };
        r.map_err(|e| format!("cannot create directory '{}:{}': {e}", p.image.display(), p.path))
    })
}

/// The keys `--key` and `--key-v1` gave.
pub(crate) fn given_keys() -> Vec<rext4::EncryptionKey> {
    OPEN_ARGS.get().map(|(_, keys)| keys.clone()).unwrap_or_default()
}

/// `rext4 --key FILE encrypt [--padding N] IMAGE:/dir`: the first key given becomes the empty
/// directory's. A target that is a directory here is one on a mount (key_cmd.rs).
pub(crate) fn encrypt(target: &str, padding: u8) -> CliResult {
    let key = OPEN_ARGS.get().and_then(|(_, keys)| keys.first().cloned());
    let Some(key) = key else { return Err("encrypt: give the key with --key FILE (or --key-v1)".into()) };
    if std::path::Path::new(target).is_dir() {
        return crate::key_cmd::encrypt(std::path::Path::new(target), &key, padding);
    }
    with_rw(target, |fs, p| {
        fs.resolve(&p.path, true)
            .and_then(|ino| fs.set_encryption_policy(ino, &key, padding))
            .map_err(|e| format!("cannot encrypt '{}:{}': {e}", p.image.display(), p.path))
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
    with_rw(target, |fs, p| match fs.remove_file(&p.path) {
        Err(rext4::Error::IsDir) if !recursive => Err(p.err("is a directory (use -r)")),
        Err(rext4::Error::IsDir) => remove_tree(fs, p),
        r => r.map_err(|e| p.err(e)),
    })
}

/// Removes the directory at `p` and everything below it. A directory met twice (a crafted
/// image's directory hard link, or a cycle back to an ancestor) and names no directory may
/// hold are reported and left, so the walk ends; the directories holding them then cannot be
/// removed.
fn remove_tree(fs: &Fs, p: &ImagePath) -> CliResult {
    fs.remove_dir_all_with(&p.path, |left| {
        let name = crate::fmt::name(&left.entry.name);
        match left.why {
            rext4::Unremovable::DirectoryLink => {
                // The part below p.path holds names from the image: shown escaped.
                let below = left.dir_path.strip_prefix(&p.path).into_iter().flat_map(Path::iter);
                let below: String = below.map(|c| format!("/{}", crate::fmt::name(c.as_bytes()))).collect();
                eprintln!(
                    "rext4: directory cycle at {}:{}{below}/{name} (inode {}); left",
                    p.image.display(),
                    p.path.trim_end_matches('/'),
                    left.entry.ino
                );
            }
            why => eprintln!("rext4: warning: directory inode {}: {why}: '{name}'; left", left.dir),
        }
        Ok(())
    })
    .map_err(|e| p.err(e))
}

/// `rext4 mv IMAGE:/from IMAGE:/to` (within one image; into `to` if it is a directory).
pub(crate) fn mv(from: &str, to: &str) -> CliResult {
    let dest = ImagePath::parse(to)?;
    with_rw(from, |fs, p| {
        if dest.image != p.image {
            return Err("mv works within one image".into());
        }
        let (_, name) = split(&p.path)?;
        let to = match fs.metadata(&dest.path) {
            Ok(a) if a.kind == rext4::FileType::Directory => {
                format!("{}/{name}", dest.path.trim_end_matches('/'))
            }
            _ => dest.path.clone(),
        };
        fs.rename_path(&p.path, to).map_err(|e| p.err(e))
    })
}

/// `rext4 ln [-s] TARGET IMAGE:/path`: a hard link to `IMAGE:/target`, or with `-s` a
/// symbolic link holding TARGET as written.
pub(crate) fn ln(target: &str, link: &str, symbolic: bool) -> CliResult {
    with_rw(link, |fs, p| {
        let r = if symbolic {
            fs.create_symlink(target, &p.path)
        } else {
            let t = ImagePath::parse(target).map(|t| t.path).unwrap_or_else(|_| target.to_string());
            fs.hard_link(t, &p.path)
        };
        r.map_err(|e| p.err(e))
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
        // A new file is the invoking user's, as the kernel would make it; every capability
        // keeps the image's permission bits from standing in the way, as before.
        let (uid, gid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        let me = fs.as_user(rext4::Creds::user(uid, gid, &[]).with_caps(rext4::Caps::all()));
        let f = me.open_options().write(true).create(true).open(&p.path)?;
        let cur = f.metadata()?.size;
        let new = match rel {
            1 => cur.checked_add(n).ok_or(rext4::Error::FileTooBig)?,
            -1 => cur.saturating_sub(n),
            _ => n,
        };
        f.set_len(new)
    })();
    let closed = fs.unmount();
    r.map_err(|e| p.err(e))?;
    closed.map_err(|e| p.err(e))
}

/// `rext4 fstrim [-m MINIMUM] IMAGE`: discards every free run of at least MINIMUM bytes
/// (a bare number is bytes, as for fstrim(8)), as `FITRIM` does on a mount.
pub(crate) fn fstrim(image: &Path, minimum: &str) -> CliResult {
    let minlen = crate::mkfs_cmd::parse_size(minimum, Some(1))?;
    let fs = Fs::open_with(image, writable_options()).map_err(|e| format!("{}: {e}", image.display()))?;
    let r = fs.trim(0, u64::MAX, minlen);
    let closed = fs.unmount();
    let n = r.map_err(|e| format!("{}: {e}", image.display()))?;
    closed.map_err(|e| format!("{}: {e}", image.display()))?;
    println!("{}: {:.1} MiB ({n} bytes) trimmed", image.display(), n as f64 / f64::from(1u32 << 20));
    Ok(())
}
