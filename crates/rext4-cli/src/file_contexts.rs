//! `rext4 mkfs --selinux FILE_CONTEXTS`: SELinux labels by path, as libselinux's file backend
//! (`selabel_lookup` with the file's path) gives them. A line is `REGEX [TYPE] CONTEXT`: the
//! regex matches the whole path (it is anchored at both ends); TYPE (`--` regular file, `-d`,
//! `-l`, `-c`, `-b`, `-p`, `-s`) restricts it to one kind of file; CONTEXT `<<none>>` means no
//! label. Beside the file, as libselinux reads them when they exist:
//!
//! - `FILE.homedirs` and `FILE.local`: more lines, read after the file's own (so a local
//!   line overrides a distribution's).
//! - `FILE.subs` and `FILE.subs_dist`: path substitutions, `ALIAS REAL` a line: a path that is
//!   ALIAS or lies below it is labelled as the same path below REAL. The first matching line
//!   from the end of `.subs` applies, then one of `.subs_dist` to the result.
//!
//! The last matching line wins, except that lines without regex metacharacters (exact paths)
//! are tried before every regex, as libselinux sorts them after the others and searches from
//! the end. The label is stored as `security.selinux` with the trailing NUL the kernel writes.

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
    /// `.subs` then `.subs_dist`, each in lookup order: `(alias, real)`.
    subs: [Vec<(Vec<u8>, Vec<u8>)>; 2],
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

/// A substitution file's `(alias, real)` pairs in lookup order (libselinux keeps them in a
/// list it prepends to): the first two words of each line; `#` comments a line.
fn parse_subs(text: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut subs: Vec<(Vec<u8>, Vec<u8>)> = text
        .lines()
        .map(str::trim_start)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.as_bytes().to_vec(), w.next()?.as_bytes().to_vec()))
        })
        .collect();
    subs.reverse();
    subs
}

/// `path` with the first of `subs` that covers it applied (`selabel_sub`): an alias matches
/// the path or a prefix of it ending before a `/`.
fn substitute(subs: &[(Vec<u8>, Vec<u8>)], path: &[u8]) -> Option<Vec<u8>> {
    subs.iter().find_map(|(alias, real)| {
        let rest = path.strip_prefix(&alias[..])?;
        if !(rest.is_empty() || rest[0] == b'/') {
            return None;
        }
        // Onto `/`: no doubled slash.
        let rest = if real == b"/" && !rest.is_empty() { &rest[1..] } else { rest };
        Some([&real[..], rest].concat())
    })
}

/// Reads `path` if it exists (`None` if not).
fn read_optional(path: &std::path::Path) -> CliResult<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

impl FileContexts {
    /// Reads the file_contexts at `path` and the files libselinux reads beside it.
    pub(crate) fn load(path: &std::path::Path) -> CliResult<FileContexts> {
        let beside = |suffix: &str| {
            let mut p = path.as_os_str().to_owned();
            p.push(suffix);
            std::path::PathBuf::from(p)
        };
        let base = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut texts = vec![(path.to_path_buf(), base)];
        for suffix in [".homedirs", ".local"] {
            let p = beside(suffix);
            if let Some(t) = read_optional(&p)? {
                texts.push((p, t));
            }
        }
        let named: Vec<(String, &str)> =
            texts.iter().map(|(p, t)| (p.display().to_string(), t.as_str())).collect();
        let mut fc = Self::parse_files(&named)?;
        for (i, suffix) in [".subs", ".subs_dist"].into_iter().enumerate() {
            if let Some(t) = read_optional(&beside(suffix))? {
                fc.subs[i] = parse_subs(&t);
            }
        }
        Ok(fc)
    }

    #[cfg(test)]
    fn parse(text: &str) -> CliResult<FileContexts> {
        Self::parse_files(&[("file_contexts".to_string(), text)])
    }

    /// The lines of `(name, text)` files, read one after another.
    fn parse_files(files: &[(String, &str)]) -> CliResult<FileContexts> {
        let (mut exact, mut regexes) = (Vec::new(), Vec::new());
        for (name, text) in files {
            Self::parse_into(name, text, &mut exact, &mut regexes)?;
        }
        // Exact paths first, then regexes, each group last line first.
        exact.reverse();
        regexes.reverse();
        exact.append(&mut regexes);
        Ok(FileContexts { specs: exact, subs: [Vec::new(), Vec::new()] })
    }

    fn parse_into(name: &str, text: &str, exact: &mut Vec<Spec>, regexes: &mut Vec<Spec>) -> CliResult {
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |what: &str| format!("{name} line {}: {what}: {line}", n + 1);
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
        Ok(())
    }

    /// The `security.selinux` value for `path` (`/a/b`) of kind `kind`, NUL-terminated; `None`
    /// when nothing matches or the match says `<<none>>`.
    pub(crate) fn label(&self, path: &[u8], kind: FileType) -> Option<Vec<u8>> {
        // As libselinux cleans the key: no doubled slashes, none at the end but the root's.
        let mut key: Vec<u8> = Vec::with_capacity(path.len());
        for &b in path {
            if !(b == b'/' && key.last() == Some(&b'/')) {
                key.push(b);
            }
        }
        if key.len() > 1 && key.last() == Some(&b'/') {
            key.pop();
        }
        let [subs, dist] = &self.subs;
        let key = match substitute(subs, &key) {
            Some(k) => substitute(dist, &k).unwrap_or(k),
            None => substitute(dist, &key).unwrap_or(key),
        };
        let s = self.specs.iter().find(|s| s.kind.is_none_or(|k| k == kind) && s.re.is_match(&key))?;
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
    fn local_lines_override_and_substitutions_apply_as_libselinux_does() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fc = dir.path().join("file_contexts");
        std::fs::write(&fc, FC).expect("write");
        std::fs::write(
            dir.path().join("file_contexts.local"),
            "/etc/hosts    system_u:object_r:hosts_t:s0\n/etc/.*\\.conf  system_u:object_r:local_conf_t:s0\n",
        )
        .expect("write");
        std::fs::write(
            dir.path().join("file_contexts.homedirs"),
            "/home/[^/]+(/.*)?  user_u:object_r:home_t:s0\n",
        )
        .expect("write");
        // Later lines are tried first; the second applies only where the first does not.
        std::fs::write(
            dir.path().join("file_contexts.subs"),
            "# comment\n/srv/etc /etc\n/srv/etc/x /tmp\n/web /srv/etc\n/r /\n",
        )
        .expect("write");
        std::fs::write(dir.path().join("file_contexts.subs_dist"), "/srv /etc\n/usr/etc /etc extra words\n")
            .expect("write");
        let fc = FileContexts::load(&fc).expect("load");
        let f = FileType::RegularFile;
        let d = FileType::Directory;
        // .local: an exact path and a later regex win over the base file's.
        assert_eq!(label(&fc, "/etc/hosts", f).as_deref(), Some("system_u:object_r:hosts_t:s0"));
        assert_eq!(label(&fc, "/etc/a.conf", f).as_deref(), Some("system_u:object_r:local_conf_t:s0"));
        assert_eq!(label(&fc, "/home/u/x", f).as_deref(), Some("user_u:object_r:home_t:s0"));
        // .subs: the alias itself and paths below it, not paths that merely start alike.
        assert_eq!(label(&fc, "/srv/etc", d).as_deref(), Some("system_u:object_r:etc_dir_t:s0"));
        assert_eq!(label(&fc, "/srv/etc/passwd", f).as_deref(), Some("system_u:object_r:passwd_file_t:s0"));
        assert_eq!(label(&fc, "/srvx/etc/passwd", f).as_deref(), Some("system_u:object_r:default_t:s0"));
        // .subs_dist where .subs has nothing: /srv/etcetera is /etc/etcetera.
        assert_eq!(label(&fc, "/srv/etcetera", f).as_deref(), Some("system_u:object_r:etc_t:s0"));
        // The last line that matches applies first: /srv/etc/x is /tmp.
        assert_eq!(label(&fc, "/srv/etc/x/y", f), None);
        // .subs then .subs_dist on its result: /web -> /srv/etc (subs) -> /etc/etc (dist).
        assert_eq!(label(&fc, "/web/passwd", f).as_deref(), Some("system_u:object_r:etc_t:s0"));
        // Onto the root: no doubled slash.
        assert_eq!(label(&fc, "/r/etc/passwd", f).as_deref(), Some("system_u:object_r:passwd_file_t:s0"));
        // .subs_dist alone; words past the second are ignored.
        assert_eq!(label(&fc, "/usr/etc/passwd", f).as_deref(), Some("system_u:object_r:passwd_file_t:s0"));
        // Keys are cleaned first.
        assert_eq!(label(&fc, "//etc//passwd/", f).as_deref(), Some("system_u:object_r:passwd_file_t:s0"));
        // Only the base file is needed.
        let alone = dir.path().join("alone");
        std::fs::write(&alone, FC).expect("write");
        assert!(FileContexts::load(&alone).is_ok());
        assert!(FileContexts::load(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn bad_lines_are_refused() {
        assert!(FileContexts::parse("/a -x ctx").is_err());
        assert!(FileContexts::parse("/a(").is_err());
        assert!(FileContexts::parse("/a( ctx").is_err());
        assert!(has_meta("/a.b") && !has_meta(r"/a\.b") && !has_meta("/usr/bin"));
    }
}
