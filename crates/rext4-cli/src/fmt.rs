//! Formatting helpers shared by the commands: modes, times, sizes, names.

use rext4::{Attr, FileType, Timestamp};

/// `ls -l` style mode string, e.g. `drwxr-xr-x`.
pub(crate) fn mode_string(a: &Attr) -> String {
    let t = match a.kind {
        FileType::Directory => 'd',
        FileType::Symlink => 'l',
        FileType::CharDevice => 'c',
        FileType::BlockDevice => 'b',
        FileType::Fifo => 'p',
        FileType::Socket => 's',
        FileType::RegularFile => '-',
    };
    let m = a.mode;
    let bit = |mask: u16, c: char| if m & mask != 0 { c } else { '-' };
    let special = |x: u16, s: u16, lower: char, upper: char| match (m & x != 0, m & s != 0) {
        (true, true) => lower,
        (false, true) => upper,
        (true, false) => 'x',
        (false, false) => '-',
    };
    let mut s = String::with_capacity(10);
    s.push(t);
    s.push(bit(0o400, 'r'));
    s.push(bit(0o200, 'w'));
    s.push(special(0o100, 0o4000, 's', 'S'));
    s.push(bit(0o040, 'r'));
    s.push(bit(0o020, 'w'));
    s.push(special(0o010, 0o2000, 's', 'S'));
    s.push(bit(0o004, 'r'));
    s.push(bit(0o002, 'w'));
    s.push(special(0o001, 0o1000, 't', 'T'));
    s
}

/// UTC time as `YYYY-MM-DD HH:MM:SS.nnnnnnnnn`.
pub(crate) fn time(t: Timestamp) -> String {
    let days = t.sec.div_euclid(86400);
    let secs = t.sec.rem_euclid(86400);
    let (y, mo, d) = civil_from_days(days);
    format!("{y:04}-{mo:02}-{d:02} {:02}:{:02}:{:02}.{:09}", secs / 3600, secs / 60 % 60, secs % 60, t.nsec)
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
// Cannot truncate: the algorithm yields a day in 1..=31 and a month in 1..=12.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A name from the image as text: valid UTF-8 is kept; control characters, `/`, `\\` and
/// bytes that are not UTF-8 are written as `\\ooo` (octal), as `ls -b` does, so a crafted name
/// can neither drive the terminal nor pass for a path.
pub(crate) fn name(b: &[u8]) -> String {
    escape(b, true)
}

/// A symbolic link's target as text: escaped as [`name`] does, but for `/`, which a path
/// may hold.
pub(crate) fn target(b: &[u8]) -> String {
    escape(b, false)
}

fn escape(b: &[u8], slash: bool) -> String {
    let mut s = String::with_capacity(b.len());
    let octal = |s: &mut String, c: u8| s.push_str(&format!("\\{c:03o}"));
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() || (slash && c == '/') || c == '\\' {
                let mut buf = [0u8; 4];
                for &byte in c.encode_utf8(&mut buf).as_bytes() {
                    octal(&mut s, byte);
                }
            } else {
                s.push(c);
            }
        }
        for &byte in chunk.invalid() {
            octal(&mut s, byte);
        }
    }
    s
}

/// Why a directory entry's name cannot be a name on the host (the engine's rule: it holds `/`
/// or NUL, is empty, or is a second `.` or `..`).
pub(crate) use rext4::bad_name;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_times() {
        assert_eq!(time(Timestamp { sec: 0, nsec: 5 }), "1970-01-01 00:00:00.000000005");
        assert_eq!(time(Timestamp { sec: 951_782_400, nsec: 0 }), "2000-02-29 00:00:00.000000000");
        assert_eq!(time(Timestamp { sec: -1, nsec: 0 }), "1969-12-31 23:59:59.000000000");
    }

    #[test]
    fn escapes_names() {
        assert_eq!(name("caf\u{e9}.txt".as_bytes()), "caf\u{e9}.txt");
        assert_eq!(name(b"a/b\n\\\xff"), "a\\057b\\012\\134\\377");
        assert_eq!(target(b"../a\n"), "../a\\012");
        assert_eq!(bad_name(b"ok"), None);
        assert!(bad_name(b"..").is_some() && bad_name(b"a/b").is_some() && bad_name(b"a\0").is_some());
    }
}
