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
pub fn chmod(mode: &str, target: &str) -> CliResult {
    let m = u16::from_str_radix(mode, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("invalid mode: '{mode}'"))?;
    apply(target, &SetAttr { mode: Some(m), ..SetAttr::default() }, true)
}

/// `rext4 chown UID[:GID] IMAGE:/path` (numeric ids; does not follow a final symlink, like
/// `chown -h`).
pub fn chown(owner: &str, target: &str) -> CliResult {
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
pub fn touch(date: Option<&str>, target: &str) -> CliResult {
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
