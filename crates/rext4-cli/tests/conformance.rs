//! pjdfstest and tests/conformance/behaviour.sh on kernel ext4 and on `rext4 mount`, through
//! `tests/conformance/run` (xfstests is not run: it needs a checkout): no test that
//! passes on the kernel may fail on rext4, and every image must be clean under `e2fsck -fn`,
//! except the differences listed with their causes in `tests/conformance/known-failures.txt`.
//! A listed difference that has gone away fails the test too, so the list only shrinks.
//! Skipped (with a message) without loop mounts, FUSE mounts or the `pjdfstest` command; under
//! `REXT4_REQUIRE_MOUNT=1` missing mounts fail it instead. A test binary of its own, so the
//! suites run alone rather than beside other mount tests.

// Tests build fixtures from small known values and share helpers between their modules:
// the cast and visibility lints are for the code that reads images.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, unreachable_pub)]

use rext4_testkit::{require_fuse, require_kernel};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn pjdfstest_found() -> bool {
    let cargo_bin = std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo/bin"));
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).chain(cargo_bin).any(|d| d.join("pjdfstest").is_file())
}

/// The allow-list: keys that may (flaky) or must (all others) show up as differences.
fn known_failures() -> (BTreeSet<String>, BTreeSet<String>) {
    let text = std::fs::read_to_string(repo().join("tests/conformance/known-failures.txt"))
        .expect("read tests/conformance/known-failures.txt");
    let (mut must, mut may) = (BTreeSet::new(), BTreeSet::new());
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (key, cause) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        if cause.trim_start().starts_with("flaky:") {
            may.insert(key.to_string());
        } else {
            must.insert(key.to_string());
        }
    }
    (must, may)
}

#[test]
fn rext4_matches_kernel_ext4() {
    require_kernel!();
    require_fuse!();
    if !pjdfstest_found() {
        eprintln!("SKIP: no pjdfstest command (cargo install --locked pjdfstest; .ci/setup does)");
        return;
    }
    let out = tempfile::tempdir().expect("tempdir");
    let run = Command::new(repo().join("tests/conformance/run"))
        .args(["--suite", "all", "--bin", env!("CARGO_BIN_EXE_rext4"), "--out"])
        .arg(out.path())
        .output()
        .expect("run tests/conformance/run");
    let report = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    let regressions = std::fs::read_to_string(out.path().join("regressions.txt")).unwrap_or_else(|e| {
        panic!("runner left no regressions.txt ({e}); status {}:\n{stderr}\n{report}", run.status)
    });
    assert!(matches!(run.status.code(), Some(0 | 1)), "runner failed ({}):\n{stderr}\n{report}", run.status);
    let found: BTreeSet<String> = regressions.lines().map(str::to_string).collect();
    let (must, may) = known_failures();
    let new: Vec<_> = found.iter().filter(|k| !must.contains(*k) && !may.contains(*k)).collect();
    let gone: Vec<_> = must.iter().filter(|k| !found.contains(*k)).collect();
    let details = |name: &str| std::fs::read_to_string(out.path().join(name)).unwrap_or_default();
    assert!(
        new.is_empty() && gone.is_empty(),
        "new differences from kernel ext4: {new:?}\nlisted in tests/conformance/known-failures.txt \
         but gone (take them off): {gone:?}\n{report}\npjdfstest failures on rext4:\n{}\n\
         behaviour, kernel (-) against rext4 (+):\n{}",
        details("pjdfstest-rext4.failures"),
        details("behaviour.diff"),
    );
    eprintln!("{report}");
}
