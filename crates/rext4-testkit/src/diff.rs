//! Differences between descriptions of a tree, and how a test reports them.

use crate::walk::{show, Kind, Rec, Walk};
use rext4::Fs;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn field_diffs(a: &Rec, b: &Rec, out: &mut Vec<String>, path: &[u8], an: &str, bn: &str) {
    macro_rules! cmp {
        ($($f:ident),*) => {$(
            if a.$f != b.$f {
                out.push(format!("{}: {}: {an}={:?} {bn}={:?}", show(path), stringify!($f), a.$f, b.$f));
            }
        )*};
    }
    cmp!(
        kind, dtype, dirent_ino, ino, mode, nlink, uid, gid, size, blocks, blksize, atime, mtime, ctime,
        crtime, rdev, flags, generation, target, content
    );
    xattr_diffs(&a.xattrs, &b.xattrs, out, path, an, bn);
}

fn xattr_diffs(
    a: &BTreeMap<Vec<u8>, Vec<u8>>,
    b: &BTreeMap<Vec<u8>, Vec<u8>>,
    out: &mut Vec<String>,
    path: &[u8],
    an: &str,
    bn: &str,
) {
    for (k, v) in a {
        match b.get(k) {
            None => out.push(format!("{}: xattr {} only in {an}", show(path), show(k))),
            Some(w) if w != v => {
                out.push(format!("{}: xattr {}: {an}={v:02x?} {bn}={w:02x?}", show(path), show(k)))
            }
            _ => {}
        }
    }
    for k in b.keys().filter(|k| !a.contains_key(*k)) {
        out.push(format!("{}: xattr {} only in {bn}", show(path), show(k)));
    }
}

fn problems_of(w: &Walk, name: &str, out: &mut Vec<String>) {
    out.extend(w.problems.iter().map(|p| format!("{name} walk: {p}")));
}

/// Every difference between two complete descriptions (e.g. kernel vs rext4): all fields,
/// including inode numbers, nanosecond times, flags and xattrs.
pub fn diff_full(an: &str, a: &Walk, bn: &str, b: &Walk) -> Vec<String> {
    let mut out = Vec::new();
    problems_of(a, an, &mut out);
    problems_of(b, bn, &mut out);
    for (p, ra) in &a.recs {
        match b.recs.get(p) {
            None => out.push(format!("{}: only in {an}", show(p))),
            Some(rb) => field_diffs(ra, rb, &mut out, p, an, bn),
        }
    }
    for p in b.recs.keys().filter(|p| !a.recs.contains_key(*p)) {
        out.push(format!("{}: only in {bn}", show(p)));
    }
    out
}

/// How an image is compared with the tree it was made from.
#[derive(Clone, Copy, Debug)]
pub struct SourceCmp {
    /// Compare mtime nanoseconds too (kernel-written images; `mkfs.ext4 -d` drops them).
    pub mtime_ns: bool,
}

fn link_groups(w: &Walk) -> BTreeSet<Vec<Vec<u8>>> {
    let mut by_ino: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    for (p, r) in &w.recs {
        if r.kind != Kind::Dir && r.nlink > 1 {
            by_ino.entry(r.ino).or_default().push(p.clone());
        }
    }
    by_ino.into_values().collect()
}

/// Differences between a source tree and an image made from it: what the tree specifies
/// (type, permissions, owners, size, bytes, targets, xattrs, link counts, devices, mtime,
/// hard-link groups). The image's root and `lost+found` are not part of the source.
pub fn diff_source(src: &Walk, img: &Walk, cmp: SourceCmp) -> Vec<String> {
    let mut out = Vec::new();
    problems_of(src, "source", &mut out);
    problems_of(img, "image", &mut out);
    let (an, bn) = ("source", "image");
    for (p, s) in &src.recs {
        if p == b"/" {
            continue;
        }
        let Some(r) = img.recs.get(p) else {
            out.push(format!("{}: missing from the image", show(p)));
            continue;
        };
        macro_rules! cmp {
            ($($f:ident),*) => {$(
                if s.$f != r.$f {
                    out.push(format!("{}: {}: {an}={:?} {bn}={:?}", show(p), stringify!($f), s.$f, r.$f));
                }
            )*};
        }
        cmp!(kind, dtype, mode, uid, gid, nlink, rdev, target, content);
        if s.kind != Kind::Dir && s.size != r.size {
            out.push(format!("{}: size: {an}={} {bn}={}", show(p), s.size, r.size));
        }
        // Seconds outside the signed 32-bit range need the extra epoch bits, which
        // mkfs.ext4 1.47.0 -d does not write; the kernel comparison covers those.
        let in_range = i32::try_from(s.mtime.0).is_ok();
        if (cmp.mtime_ns || in_range) && s.mtime.0 != r.mtime.0 {
            out.push(format!("{}: mtime seconds: {an}={:?} {bn}={:?}", show(p), s.mtime, r.mtime));
        }
        if cmp.mtime_ns && s.mtime.1 != r.mtime.1 {
            out.push(format!("{}: mtime ns: {an}={:?} {bn}={:?}", show(p), s.mtime, r.mtime));
        }
        xattr_diffs(&s.xattrs, &r.xattrs, &mut out, p, an, bn);
    }
    for p in img.recs.keys() {
        let lf = p == b"/lost+found" || p.starts_with(b"/lost+found/");
        if !lf && p != b"/" && !src.recs.contains_key(p) {
            out.push(format!("{}: in the image but not in the source", show(p)));
        }
    }
    let (gs, gi) = (link_groups(src), link_groups(img));
    for g in gs.symmetric_difference(&gi) {
        let names: Vec<String> = g.iter().map(|p| show(p)).collect();
        let side = if gs.contains(g) { an } else { bn };
        out.push(format!("hard-link group only in {side}: {names:?}"));
    }
    out
}

/// Sections of differences found by one test, reported together at the end.
#[derive(Default)]
pub struct Report(Vec<(String, Vec<String>)>);

impl Report {
    pub fn add(&mut self, what: impl Into<String>, diffs: Vec<String>) {
        if !diffs.is_empty() {
            self.0.push((what.into(), diffs));
        }
    }
    /// Runs `f`, recording a panic in it as a difference.
    pub fn run(&mut self, what: &str, f: impl FnOnce()) {
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            self.0.push((what.into(), vec![msg]));
        }
    }
    /// Panics listing every section, if there are any differences.
    #[track_caller]
    pub fn finish(self) {
        if self.0.is_empty() {
            return;
        }
        // REXT4_DIFF_ALL=1 lists every difference, not just the first 25 of each section.
        let shown = if std::env::var_os("REXT4_DIFF_ALL").is_some() { usize::MAX } else { 25 };
        let mut text = String::new();
        for (what, diffs) in &self.0 {
            text.push_str(&format!("\n{what}: {} difference(s)\n", diffs.len()));
            for d in diffs.iter().take(shown) {
                text.push_str(&format!("  {d}\n"));
            }
        }
        panic!("{text}");
    }
}

/// Panics listing the differences, if there are any.
#[track_caller]
pub fn assert_no_diff(what: &str, diffs: &[String]) {
    if diffs.is_empty() {
        return;
    }
    let shown: Vec<&String> = diffs.iter().take(40).collect();
    panic!(
        "{what}: {} difference(s); first {}:\n{}",
        diffs.len(),
        shown.len(),
        shown.iter().map(|s| format!("  {s}")).collect::<Vec<_>>().join("\n")
    );
}

/// Differences between rext4's `statfs` and the kernel's `statvfs` of its mount.
pub fn statfs_diff(fs: &Fs, mount: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let k = match nix::sys::statvfs::statvfs(mount) {
        Ok(k) => k,
        Err(e) => return vec![format!("statvfs {}: {e}", mount.display())],
    };
    let r = match fs.statfs() {
        Ok(r) => r,
        Err(e) => return vec![format!("rext4 statfs: {e}")],
    };
    let pairs: [(&str, u64, u64); 8] = [
        ("block size", k.block_size(), u64::from(r.block_size)),
        ("blocks", k.blocks(), r.blocks),
        ("free blocks", k.blocks_free(), r.blocks_free),
        ("available blocks", k.blocks_available(), r.blocks_avail),
        ("inodes", k.files(), r.files),
        ("free inodes", k.files_free(), r.files_free),
        ("name max", k.name_max(), u64::from(r.name_max)),
        ("fsid", k.filesystem_id(), r.fsid),
    ];
    for (what, kv, rv) in pairs {
        if kv != rv {
            out.push(format!("statfs {what}: kernel={kv} rext4={rv}"));
        }
    }
    out
}
