//! What `debugfs` and `dumpe2fs` say about an image: layouts, features, superblock fields.

use crate::tools::{out_text, run, tool};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Levels below the root of the htree directory at `path` (`debugfs htree`), or None when
/// the directory is not indexed.
pub fn htree_levels(img: &Path, path: &str) -> Option<u8> {
    let o = run(Command::new(tool("debugfs")).arg("-R").arg(format!("htree {path}")).arg(img));
    let text = String::from_utf8_lossy(&o.stdout);
    text.lines().find_map(|l| l.trim().strip_prefix("Indirect levels:")).and_then(|v| v.trim().parse().ok())
}

/// How `debugfs stat` shows the file at `path`: its flags word, its inline data size (when
/// it keeps its data inline) and its size.
pub fn layout(img: &Path, path: &str) -> (u32, Option<u64>, u64) {
    let o = run(Command::new(tool("debugfs")).arg("-R").arg(format!("stat {path}")).arg(img));
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let after =
        |key: &str| text.split(key).nth(1).and_then(|t| t.split_whitespace().next()).map(str::to_string);
    let flags = after("Flags: 0x").and_then(|v| u32::from_str_radix(&v, 16).ok());
    let size = after("  Size: ").or_else(|| after("\tSize: ")).and_then(|v| v.parse().ok());
    let inline = after("Size of inline data: ").and_then(|v| v.parse().ok());
    match (flags, size) {
        (Some(f), Some(s)) => (f, inline, s),
        _ => panic!("no flags or size for {path}:\n{text}"),
    }
}

/// Depth of the extent tree of `path` in `img` (0: extents in the inode), from `debugfs ex`.
pub fn extent_depth(img: &Path, path: &str) -> u32 {
    let o = run(Command::new(tool("debugfs")).arg("-R").arg(format!("ex {path}")).arg(img));
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    // Data lines start with "level/ max".
    text.lines()
        .filter_map(|l| {
            let (_, max) = l.trim_start().split_once('/')?;
            max.split_whitespace().next()?.parse::<u32>().ok()
        })
        .next()
        .unwrap_or_else(|| panic!("no extent listing for {path}:\n{text}"))
}

/// Extents of the file at `path` in `img` (leaf entries of `debugfs ex`).
pub fn extent_count(img: &Path, path: &str) -> usize {
    let o = run(Command::new(tool("debugfs")).arg("-R").arg(format!("ex {path}")).arg(img));
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    // Data lines start with "level/ max"; leaves have level == max.
    text.lines()
        .filter(|l| {
            let Some((lv, rest)) = l.trim_start().split_once('/') else { return false };
            let max = rest.split_whitespace().next().and_then(|m| m.parse::<u32>().ok());
            lv.trim().parse::<u32>().ok().is_some_and(|lv| Some(lv) == max)
        })
        .count()
}

/// `(space in bytes, inodes)` that `debugfs`'s `get_quota` reads from the quota file of type
/// `ty` (`user`, `group`, `project`) for `id`; `None` where the id has no entry.
pub fn quota_usage(img: &Path, ty: &str, id: u32) -> Option<(u64, u64)> {
    let o = run(Command::new(tool("debugfs")).arg("-R").arg(format!("get_quota {ty} {id}")).arg(img));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    // "   user id      space    quota    limit      inodes    quota    limit", then a row.
    let row = out.lines().find(|l| l.split_whitespace().next() == Some(&id.to_string()))?;
    let f: Vec<&str> = row.split_whitespace().collect();
    Some((f.get(1)?.parse().ok()?, f.get(4)?.parse().ok()?))
}

/// The value of `key` in `dumpe2fs -h`'s listing of `img` ("" if it has no such line).
pub fn sb_field(img: &Path, key: &str) -> String {
    let out = run(Command::new(tool("dumpe2fs")).arg("-h").arg(img));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

/// The feature names `dumpe2fs -h` lists for the image.
pub fn features(img: &Path) -> BTreeSet<String> {
    let o = run(Command::new(tool("dumpe2fs")).arg("-h").arg(img));
    assert!(o.status.success(), "dumpe2fs -h failed:\n{}", out_text(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("Filesystem features:"))
        .unwrap_or_else(|| panic!("no feature line in dumpe2fs output:\n{text}"));
    line.split_whitespace().map(str::to_string).collect()
}

/// Asserts that the image has every feature in `on` and none in `off`.
pub fn assert_features(img: &Path, on: &[&str], off: &[&str]) {
    let f = features(img);
    for x in on {
        assert!(f.contains(*x), "fixture should have feature {x}, has {f:?}");
    }
    for x in off {
        assert!(!f.contains(*x), "fixture should not have feature {x}, has {f:?}");
    }
}
