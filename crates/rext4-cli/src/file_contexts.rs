//! `rext4 mkfs --selinux FILE_CONTEXTS`: SELinux labels by path, as libselinux's file backend
//! (`selabel_lookup`) gives them. A line is `REGEX [TYPE] CONTEXT`: the regex matches the
//! whole path (it is anchored at both ends); TYPE (`--` regular file, `-d`, `-l`, `-c`, `-b`,
//! `-p`, `-s`) restricts it to one kind of file; CONTEXT `<<none>>` means no label. The last
//! matching line wins, except that lines without regex metacharacters (exact paths) are
//! tried before every regex, as libselinux sorts them after the others and searches from the
//! end. The label is stored as `security.selinux` with the trailing NUL the kernel writes.

use crate::CliResult;
use rext4::FileType;

struct Spec {
    re: regex::bytes::Regex,
    kind: Option<FileType>,
    /// `None` for `<<none>>`.
    context: Option<Vec<u8>>,
}

/// A parsed file_contexts, in lookup order (the first match wins).
pub(crate) struct FileContexts {
    specs: Vec<Spec>,
}

impl std::fmt::Debug for FileContexts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileContexts({} specs)", self.specs.len())
    }
}

/// Whether a spec is a regex rather than an exact path (libselinux's `spec_hasMetaChars`:
/// a backslash escapes the next character).
fn has_meta(re: &str) -> bool {
    let mut chars = re.chars();
    while let Some(c) = chars.next() {
        match c {
            '.' | '^' | '$' | '?' | '*' | '+' | '|' | '[' | '(' | '{' => return true,
            '\\' => {
                chars.next();
            }
            _ => {}
        }
    }
    false
}

fn kind(field: &str) -> Option<FileType> {
    Some(match field {
        "--" => FileType::RegularFile,
        "-d" => FileType::Directory,
        "-l" => FileType::Symlink,
        "-c" => FileType::CharDevice,
        "-b" => FileType::BlockDevice,
        "-p" => FileType::Fifo,
        "-s" => FileType::Socket,
        _ => return None,
    })
}

impl FileContexts {
    pub(crate) fn parse(text: &str) -> CliResult<FileContexts> {
        let (mut exact, mut regexes) = (Vec::new(), Vec::new());
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |what: &str| format!("file_contexts line {}: {what}: {line}", n + 1);
            let words: Vec<&str> = line.split_whitespace().collect();
            let (re, ty, ctx) = match words.as_slice() {
                [re, ctx] => (*re, None, *ctx),
                [re, ty, ctx] => (*re, Some(kind(ty).ok_or_else(|| bad("unknown file type"))?), *ctx),
                _ => return Err(bad("expected REGEX [TYPE] CONTEXT")),
            };
            let compiled = regex::bytes::Regex::new(&format!("^(?:{re})$"))
                .map_err(|e| bad(&format!("bad regex: {e}")))?;
            let spec = Spec {
                re: compiled,
                kind: ty,
                context: (ctx != "<<none>>").then(|| ctx.as_bytes().to_vec()),
            };
            if has_meta(re) {
                regexes.push(spec);
            } else {
                exact.push(spec);
            }
        }
        // Exact paths first, then regexes, each group last line first.
        exact.reverse();
        regexes.reverse();
        exact.append(&mut regexes);
        Ok(FileContexts { specs: exact })
    }

    /// The `security.selinux` value for `path` (`/a/b`) of kind `kind`, NUL-terminated; `None`
    /// when nothing matches or the match says `<<none>>`.
    pub(crate) fn label(&self, path: &[u8], kind: FileType) -> Option<Vec<u8>> {
        let s = self.specs.iter().find(|s| s.kind.is_none_or(|k| k == kind) && s.re.is_match(path))?;
        let mut v = s.context.clone()?;
        v.push(0);
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FC: &str = r"
# comment
/.*                 system_u:object_r:default_t:s0
/etc(/.*)?          system_u:object_r:etc_t:s0
/etc/shadow.*   --  system_u:object_r:shadow_t:s0
/etc/passwd         system_u:object_r:passwd_file_t:s0
/etc/.*\.conf       system_u:object_r:conf_t:s0
/etc/link       -l  system_u:object_r:link_t:s0
/tmp(/.*)?          <<none>>
/etc                system_u:object_r:etc_dir_t:s0
";

    fn label(fc: &FileContexts, p: &str, k: FileType) -> Option<String> {
        fc.label(p.as_bytes(), k).map(|v| {
            assert_eq!(v.last(), Some(&0));
            String::from_utf8(v[..v.len() - 1].to_vec()).expect("utf-8")
        })
    }

    #[test]
    fn last_regex_wins_exact_paths_first_types_restrict() {
        let fc = FileContexts::parse(FC).expect("parse");
        let f = FileType::RegularFile;
        assert_eq!(label(&fc, "/", FileType::Directory).as_deref(), Some("system_u:object_r:default_t:s0"));
        assert_eq!(label(&fc, "/usr/bin", f).as_deref(), Some("system_u:object_r:default_t:s0"));
        assert_eq!(label(&fc, "/etc/hosts", f).as_deref(), Some("system_u:object_r:etc_t:s0"));
        // An exact path wins over a later regex that matches it too.
        assert_eq!(
            label(&fc, "/etc", FileType::Directory).as_deref(),
            Some("system_u:object_r:etc_dir_t:s0")
        );
        assert_eq!(label(&fc, "/etc/passwd", f).as_deref(), Some("system_u:object_r:passwd_file_t:s0"));
        assert_eq!(label(&fc, "/etc/shadow-", f).as_deref(), Some("system_u:object_r:shadow_t:s0"));
        // `--` is for regular files only.
        assert_eq!(
            label(&fc, "/etc/shadow.d", FileType::Directory).as_deref(),
            Some("system_u:object_r:etc_t:s0")
        );
        // Later lines win among regexes.
        assert_eq!(label(&fc, "/etc/a.conf", f).as_deref(), Some("system_u:object_r:conf_t:s0"));
        assert_eq!(
            label(&fc, "/etc/link", FileType::Symlink).as_deref(),
            Some("system_u:object_r:link_t:s0")
        );
        assert_eq!(label(&fc, "/etc/link", f).as_deref(), Some("system_u:object_r:etc_t:s0"));
        // Anchored: a regex matches the whole path, not a part of it.
        assert_eq!(label(&fc, "/x/etc/a.conf", f).as_deref(), Some("system_u:object_r:default_t:s0"));
        assert_eq!(label(&fc, "/tmp/x", f), None);
    }

    #[test]
    fn bad_lines_are_refused() {
        assert!(FileContexts::parse("/a -x ctx").is_err());
        assert!(FileContexts::parse("/a(").is_err());
        assert!(FileContexts::parse("/a( ctx").is_err());
        assert!(has_meta("/a.b") && !has_meta(r"/a\.b") && !has_meta("/usr/bin"));
    }
}
