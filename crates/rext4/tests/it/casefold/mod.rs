//! Casefolded directories (`casefold` images, `chattr +F`).

mod dirs;
mod encrypted;
mod folding;
mod kernel;

// What the tests against the VM's kernel share: listings printed by its shell and read back.

use std::collections::BTreeSet;

/// The lines of `out` between `start` and the next `end`.
pub(super) fn section(out: &str, start: &str, end: &str) -> BTreeSet<String> {
    let a = out.find(start).unwrap_or_else(|| panic!("no {start} in:\n{out}")) + start.len();
    let b = a + out[a..].find(end).unwrap_or_else(|| panic!("no {end} in:\n{out}"));
    out[a..b].lines().filter(|l| !l.is_empty()).map(str::to_string).collect()
}

/// Panics naming the first differences unless listings `got` and `want` hold the same names.
pub(super) fn same(what: &str, got: &BTreeSet<String>, want: &BTreeSet<String>) {
    let extra: Vec<_> = got.difference(want).take(5).collect();
    let missing: Vec<_> = want.difference(got).take(5).collect();
    assert!(extra.is_empty() && missing.is_empty(), "{what}: unexpected {extra:?}, missing {missing:?}");
}

/// A script fragment listing `dir` between markers `tag`-BEGIN and `tag`-END.
pub(super) fn list(dir: &str, tag: &str) -> String {
    format!("echo {tag}-BEGIN; for f in {dir}/*; do echo \"${{f##*/}}\"; done; echo {tag}-END\n")
}
