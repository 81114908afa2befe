//! `rext4 setfattr` and `rext4 getfattr`: extended attributes, with the value encodings of
//! the attr package's `setfattr(1)` / `getfattr(1)`: `"text"` (octal escapes), `0x` hex and
//! `0s` base64.

use crate::imagepath::ImagePath;
use crate::CliResult;
use rext4::Fs;

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// How `getfattr` prints values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Encoding {
    /// Quoted text with octal escapes; binary values in base64, as getfattr does.
    Text,
    Hex,
    Base64,
}

/// What `setfattr` does.
pub(crate) enum Change {
    Set { name: String, value: Option<String> },
    Remove { name: String },
}

/// Parses a `-v` value: `0x..` hex, `0s..` base64, `"..."` text with backslash escapes, or
/// the bytes as given.
pub(crate) fn decode_value(v: &str) -> CliResult<Vec<u8>> {
    let bad = |what: &str| format!("invalid {what} value: '{v}'");
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        if h.len() % 2 != 0 {
            return Err(bad("hex"));
        }
        return (0..h.len() / 2)
            .map(|i| {
                h.get(2 * i..2 * i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()).ok_or_else(|| bad("hex"))
            })
            .collect();
    }
    if let Some(b) = v.strip_prefix("0s").or_else(|| v.strip_prefix("0S")) {
        return base64_decode(b).ok_or_else(|| bad("base64"));
    }
    if let Some(q) = v.strip_prefix('"').and_then(|q| q.strip_suffix('"')) {
        return unescape(q).ok_or_else(|| bad("quoted"));
    }
    Ok(v.as_bytes().to_vec())
}

fn unescape(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let octal = b.get(i + 1..i + 4).filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (octal, b.get(i + 1)) {
            (Some(d), _) => {
                out.push(u8::try_from(d.iter().fold(0u32, |a, c| a * 8 + u32::from(c - b'0'))).ok()?);
                i += 4;
            }
            (None, Some(&c)) => {
                out.push(c);
                i += 2;
            }
            (None, None) => return None,
        }
    }
    Some(out)
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes() {
        let v = u32::try_from(B64.iter().position(|&x| x == c)?).ok()?;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            // The byte completed; bits above it are consumed ones.
            out.push((acc >> bits).to_le_bytes()[0]);
        }
    }
    Some(out)
}

fn base64_encode(v: &[u8]) -> String {
    let mut out = String::with_capacity(v.len().div_ceil(3) * 4);
    for chunk in v.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |a, (i, &b)| a | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A value as getfattr prints it.
pub(crate) fn encode_value(v: &[u8], enc: Encoding) -> String {
    match enc {
        Encoding::Hex => format!("0x{}", v.iter().map(|b| format!("{b:02x}")).collect::<String>()),
        Encoding::Base64 => format!("0s{}", base64_encode(v)),
        Encoding::Text => {
            // Text while at most one byte in eight is not printable (getfattr's rule, a
            // trailing NUL aside).
            let body = v.strip_suffix(&[0]).unwrap_or(v);
            let unprintable = body.iter().filter(|c| !(0x20..0x7f).contains(*c)).count();
            if body.len() < unprintable * 8 {
                return encode_value(v, Encoding::Base64);
            }
            let mut s = String::from("\"");
            for &c in v {
                match c {
                    b'"' | b'\\' => {
                        s.push('\\');
                        s.push(c as char);
                    }
                    0x20..=0x7e => s.push(c as char),
                    _ => s.push_str(&format!("\\{c:03o}")),
                }
            }
            s.push('"');
            s
        }
    }
}

/// `rext4 setfattr -n NAME [-v VALUE] IMAGE:/path` / `rext4 setfattr -x NAME IMAGE:/path`.
pub(crate) fn setfattr(change: &Change, target: &str, follow: bool) -> CliResult {
    let p = ImagePath::parse(target)?;
    let (name, value) = match change {
        Change::Set { name, value } => {
            (name, Some(value.as_deref().map(decode_value).transpose()?.unwrap_or_default()))
        }
        Change::Remove { name } => (name, None),
    };
    let fs = Fs::open_with(&p.image, crate::modify::writable_options())
        .map_err(|e| format!("{}: {e}", p.image.display()))?;
    // A missing file is the path's error; the attribute is named only when it is the problem.
    let r = fs.resolve(&p.path, follow).map_err(|e| p.err(e)).and_then(|ino| {
        match &value {
            Some(v) => fs.setxattr(ino, name.as_bytes(), v, 0),
            None => fs.removexattr(ino, name.as_bytes()),
        }
        .map_err(|e| p.err(format!("{name}: {e}")))
    });
    let closed = fs.unmount();
    r?;
    closed.map_err(|e| p.err(e))
}

/// `rext4 getfattr [-n NAME] [-e ENC] IMAGE:/path`: one attribute, or all of them (every
/// namespace, like `getfattr -d -m -`).
pub(crate) fn getfattr(name: Option<&str>, enc: Encoding, target: &str, follow: bool) -> CliResult {
    let p = ImagePath::parse(target)?;
    let fs = p.open()?;
    let ino = fs.resolve(&p.path, follow).map_err(|e| p.err(e))?;
    let names = match name {
        Some(n) => vec![n.as_bytes().to_vec()],
        None => fs.listxattr(ino).map_err(|e| p.err(e))?,
    };
    let mut out = format!("# file: {}\n", p.path);
    for n in names {
        let v = fs.getxattr(ino, &n).map_err(|e| p.err(format!("{}: {e}", String::from_utf8_lossy(&n))))?;
        out.push_str(&format!("{}={}\n", String::from_utf8_lossy(&n), encode_value(&v, enc)));
    }
    println!("{out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_round_trip() {
        for v in [&b""[..], b"a", b"ab", b"abc", b"hello \"world\"\n\\", &[0, 1, 2, 255, 254]] {
            for enc in [Encoding::Hex, Encoding::Base64, Encoding::Text] {
                let s = encode_value(v, enc);
                assert_eq!(decode_value(&s).unwrap(), v, "{enc:?} {s}");
            }
        }
        assert_eq!(encode_value(b"blue", Encoding::Text), "\"blue\"");
        assert_eq!(encode_value(&[0, 255], Encoding::Text), "0sAP8=");
        assert_eq!(encode_value(b"a\nb", Encoding::Text), "0sYQpi");
        assert_eq!(encode_value(b"line one\n", Encoding::Text), "\"line one\\012\"");
        assert_eq!(encode_value(b"any carnal pleas", Encoding::Base64), "0sYW55IGNhcm5hbCBwbGVhcw==");
        assert_eq!(decode_value("plain").unwrap(), b"plain");
        assert!(decode_value("0x1").is_err());
        assert!(decode_value("0s!!").is_err());
    }
}
