//! Name folding for casefolded directories: the `utf8-12.1` encoding (`s_encoding` 1).
//!
//! In a directory with `EXT4_CASEFOLD_FL` the kernel hashes and compares names by their
//! folded form: every code point replaced by its full case folding or, where it has none, its
//! canonical decomposition (Unicode 12.1 tables, applied until nothing changes), default-
//! ignorable code points dropped, and each run of combining marks put in canonical order. The
//! hash of a folded directory's name is the hash of that form, so it must be bit-exact with the
//! kernel's and e2fsprogs' (`utf8_casefold`, `utf8byte`): an htree lookup only finds a name
//! hashed the way its writer hashed it, and e2fsck checks every hash.
//!
//! A name that is not valid UTF-8 has no folded form; the kernel then hashes and compares its
//! bytes as they are, or refuses to create it where the superblock asks for strict encoding.

mod tables;

/// `s_encoding` of the only encoding ext4 defines: UTF-8 with Unicode 12.1's tables.
pub const ENCODING_UTF8_12_1: u16 = 1;
/// `s_encoding_flags`: names that are not valid UTF-8 are refused in casefolded directories.
pub const ENCODING_FLAG_STRICT: u16 = 0x0001;
/// Every `s_encoding_flags` bit the kernel knows.
pub const ENCODING_FLAGS_KNOWN: u16 = ENCODING_FLAG_STRICT;

/// The kernel folds into a `PATH_MAX` buffer and treats a name whose folded form does not fit
/// (with its terminating NUL) as unfoldable.
const FOLD_LIMIT: usize = 4096;

/// The encoding's name as `dumpe2fs` and `mkfs.ext4 -E encoding=` spell it.
pub fn encoding_name(encoding: u16) -> Option<&'static str> {
    (encoding == ENCODING_UTF8_12_1).then_some("utf8-12.1")
}

/// The `s_encoding` for a name `mkfs.ext4 -E encoding=` accepts.
pub fn encoding_from_name(name: &str) -> Option<u16> {
    matches!(name, "utf8" | "utf8-12.1").then_some(ENCODING_UTF8_12_1)
}

/// The part of a name the kernel's cursor reads: it stops at a NUL byte.
fn c_string(name: &[u8]) -> &[u8] {
    name.iter().position(|&b| b == 0).map_or(name, |end| &name[..end])
}

/// Whether a strict-encoding filesystem accepts `name` in a casefolded directory: valid UTF-8
/// (no surrogates, no overlong forms), as the kernel's `utf8_validate`.
pub fn is_valid(name: &[u8]) -> bool {
    std::str::from_utf8(c_string(name)).is_ok()
}

/// The folded form of `name`, or `None` where it has none (not UTF-8, or folding past the
/// kernel's buffer).
pub fn fold(name: &[u8]) -> Option<Vec<u8>> {
    let name = c_string(name);
    if name.is_ascii() {
        // No ASCII character is ignorable, decomposes or combines: its lower case.
        return (name.len() < FOLD_LIMIT).then(|| name.to_ascii_lowercase());
    }
    let text = std::str::from_utf8(name).ok()?;
    let mut f = Folder { sink: String::with_capacity(text.len()), marks: Vec::new() };
    for c in text.chars() {
        f.push_folded(c);
    }
    f.end_run();
    (f.sink.len() < FOLD_LIMIT).then(|| f.sink.into_bytes())
}

/// Whether `name` folds to `folded` (another name's folded form, computed once per search).
/// Stops at the first byte that differs, as the kernel's `utf8_strncasecmp_folded`, and
/// allocates nothing unless `name` has combining marks to put in order.
pub fn matches_folded(folded: &[u8], name: &[u8]) -> bool {
    let name = c_string(name);
    if name.is_ascii() {
        return name.len() == folded.len()
            && name.iter().zip(folded).all(|(a, b)| a.to_ascii_lowercase() == *b);
    }
    let Ok(text) = std::str::from_utf8(name) else { return false };
    let mut f = Folder { sink: Compare { want: folded, at: 0 }, marks: Vec::new() };
    text.chars().all(|c| f.push_folded(c)) && f.end_run() && f.sink.at == folded.len()
}

/// Where a folded form goes, a character at a time; `false` stops the folding.
trait Sink {
    fn put(&mut self, c: char) -> bool;
}

impl Sink for String {
    fn put(&mut self, c: char) -> bool {
        self.push(c);
        true
    }
}

/// Compares a folded form with one known already.
struct Compare<'a> {
    want: &'a [u8],
    at: usize,
}

impl Sink for Compare<'_> {
    fn put(&mut self, c: char) -> bool {
        let mut buf = [0u8; 4];
        let bytes = c.encode_utf8(&mut buf).as_bytes();
        let end = self.at + bytes.len();
        if self.want.get(self.at..end) != Some(bytes) {
            return false;
        }
        self.at = end;
        true
    }
}

/// A folded form being built: combining marks wait in `marks` until the next starter, then
/// go out in ascending combining class (a stable sort, as canonical ordering requires).
struct Folder<S> {
    sink: S,
    marks: Vec<(u8, char)>,
}

impl<S: Sink> Folder<S> {
    fn push_folded(&mut self, c: char) -> bool {
        if c.is_ascii() {
            // No ASCII character is ignorable, decomposes or combines: the common case needs
            // no table.
            return self.push_starter(c.to_ascii_lowercase());
        }
        let cp = u32::from(c);
        if is_ignorable(cp) {
            // Folds to nothing, but ends a run of marks as a starter would.
            self.end_run()
        } else if let Some(jamo) = hangul(cp) {
            jamo.into_iter().flatten().all(|j| self.push(j))
        } else if let Some(mapped) = mapping(cp) {
            mapped.chars().all(|m| self.push(m))
        } else {
            self.push(c)
        }
    }

    fn push(&mut self, c: char) -> bool {
        match combining_class(u32::from(c)) {
            0 => self.push_starter(c),
            class => {
                self.marks.push((class, c));
                true
            }
        }
    }

    fn push_starter(&mut self, c: char) -> bool {
        self.end_run() && self.sink.put(c)
    }

    fn end_run(&mut self) -> bool {
        if self.marks.is_empty() {
            return true;
        }
        self.marks.sort_by_key(|&(class, _)| class);
        let ok = self.marks.iter().all(|&(_, c)| self.sink.put(c));
        self.marks.clear();
        ok
    }
}

fn is_ignorable(cp: u32) -> bool {
    let i = tables::IGNORABLE.partition_point(|&(_, last)| last < cp);
    tables::IGNORABLE.get(i).is_some_and(|&(first, _)| first <= cp)
}

fn mapping(cp: u32) -> Option<&'static str> {
    let i = tables::FOLDS.binary_search_by_key(&cp, |&(c, _, _)| c).ok()?;
    let (_, start, end) = tables::FOLDS[i];
    tables::FOLDED.get(usize::from(start)..usize::from(end))
}

fn combining_class(cp: u32) -> u8 {
    tables::COMBINING.binary_search_by_key(&cp, |&(c, _)| c).map_or(0, |i| tables::COMBINING[i].1)
}

/// A Hangul syllable's jamo, by the arithmetic of Unicode's section 3.12.
fn hangul(cp: u32) -> Option<[Option<char>; 3]> {
    const S_BASE: u32 = 0xAC00;
    const L_BASE: u32 = 0x1100;
    const V_BASE: u32 = 0x1161;
    const T_BASE: u32 = 0x11A7;
    const T_COUNT: u32 = 28;
    const N_COUNT: u32 = 21 * T_COUNT;
    const S_COUNT: u32 = 19 * N_COUNT;
    let index = cp.checked_sub(S_BASE).filter(|&i| i < S_COUNT)?;
    let t = index % T_COUNT;
    Some([
        char::from_u32(L_BASE + index / N_COUNT),
        char::from_u32(V_BASE + (index % N_COUNT) / T_COUNT),
        (t != 0).then(|| char::from_u32(T_BASE + t)).flatten(),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &str) -> String {
        String::from_utf8(fold(s.as_bytes()).expect("foldable")).expect("utf-8")
    }

    #[test]
    fn folds_case_and_decomposes() {
        assert_eq!(f("Hello"), "hello");
        assert_eq!(f("Straße"), "strasse");
        assert_eq!(f("\u{C5}"), "a\u{30A}");
        assert_eq!(f("\u{212B}"), "a\u{30A}"); // ANGSTROM SIGN
        assert_eq!(f("\u{130}"), "i\u{307}");
        assert_eq!(f("\u{D55C}"), "\u{1112}\u{1161}\u{11AB}");
        assert_eq!(f("\u{AC00}"), "\u{1100}\u{1161}");
    }

    #[test]
    fn drops_ignorables_and_orders_marks_within_runs() {
        assert_eq!(f("a\u{200D}b"), "ab");
        // Below-dot (220) before acute (230) within one run ...
        assert_eq!(f("a\u{301}\u{323}"), "a\u{323}\u{301}");
        // ... but an ignorable between them ends the run, as in the kernel.
        assert_eq!(f("a\u{301}\u{200B}\u{323}"), "a\u{301}\u{323}");
    }

    /// The streaming comparison says what comparing whole folded forms says, for names of
    /// letters, marks in and out of order, ignorables and invalid bytes.
    #[test]
    fn matching_agrees_with_folding() {
        const POOL: &[&str] = &[
            "a", "A", "ß", "SS", "s", "\u{301}", "\u{323}", "\u{200B}", "\u{C5}", "\u{212B}", "e",
            "\u{1E9E}", "\u{D55C}", "\u{1112}", "\u{345}", "\u{3B9}", "\u{FB03}", "ffi", "\u{FF}",
        ];
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            usize::try_from(x % n as u64).unwrap_or(0)
        };
        let name = |next: &mut dyn FnMut(usize) -> usize| -> Vec<u8> {
            let mut s = String::new();
            for _ in 0..1 + next(5) {
                s.push_str(POOL[next(POOL.len())]);
            }
            let mut b = s.into_bytes();
            if next(10) == 0 {
                b.push(0xff);
            }
            b
        };
        let (mut same, mut checked) = (0, 0);
        for _ in 0..200_000 {
            let (a, b) = (name(&mut next), name(&mut next));
            let Some(fa) = fold(&a) else { continue };
            let whole = fold(&b).is_some_and(|fb| fb == fa);
            assert_eq!(matches_folded(&fa, &b), whole, "{a:x?} / {b:x?}");
            checked += 1;
            same += usize::from(whole);
        }
        assert!(checked > 100_000 && same > 500, "{checked} pairs, {same} the same");
    }

    #[test]
    fn invalid_names_have_no_folded_form() {
        assert_eq!(fold(b"a\xffb"), None);
        assert_eq!(fold(b"\xed\xa0\x80"), None); // a surrogate
        assert_eq!(fold(b"\xc0\xaf"), None); // overlong '/'
        assert!(!is_valid(b"a\xffb"));
        assert!(is_valid("Ünïcode".as_bytes()));
        assert_eq!(fold(b"ab\0\xff").as_deref(), Some(&b"ab"[..]));
        assert!(!matches_folded(b"a", b"A\xff"));
        assert!(matches_folded(&fold(b"FOO").unwrap(), b"foo"));
    }
}
