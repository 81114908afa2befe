//! Outside exercisers on a real FUSE mount: `fsx` (the Rust port, crate `fsx`: random reads,
//! writes, truncates, fallocate, hole punching, copy_file_range, sendfile, fadvise, mmap reads
//! and writes: every operation it has, each read checked against a model; `rext4-bench fsx`
//! runs the same mix for a million operations) and `stress-ng`'s filesystem stressors. After each run the
//! image must be clean under `e2fsck -fn`. Skipped (with a message) where FUSE mounts or the
//! tools are not available; `REXT4_REQUIRE_TOOLS=1` turns a missing tool into a failure.

use crate::support::*;
use rext4_testkit::*;
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) fn tool_or_skip(name: &str) -> Option<PathBuf> {
    let found = find_tool(name).or_else(|| {
        let home = std::env::var_os("HOME")?;
        let p = Path::new(&home).join(".cargo/bin").join(name);
        p.exists().then_some(p)
    });
    if found.is_none() {
        if std::env::var_os("REXT4_REQUIRE_TOOLS").is_some_and(|v| v == "1") {
            panic!("REXT4_REQUIRE_TOOLS=1 but {name} is not installed");
        }
        eprintln!("SKIP: {name} is not installed (.ci/setup installs it)");
    }
    found
}

/// The operation mix `rext4-bench fsx` runs (every operation fsx 0.3 has).
const FSX_CONFIG: &str = include_str!("../../../rext4-bench/fsx.toml");

/// Runs `fsx` with `ops` operations on a fresh file on `mount`.
pub(crate) fn run_fsx(fsx: &Path, mount: &Path, work: &Path, seed: u64, ops: u64) {
    let cfg = work.join("fsx.toml");
    std::fs::write(&cfg, FSX_CONFIG).unwrap();
    let file = mount.join(format!("fsx-{seed}"));
    let out = Command::new(fsx)
        .arg("-N")
        .arg(ops.to_string())
        .arg("-S")
        .arg(seed.to_string())
        .arg("-f")
        .arg(&cfg)
        .arg("-P")
        .arg(work)
        .arg(&file)
        .output()
        .expect("run fsx");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "fsx seed {seed} failed:\n{}", tail(&text, 60));
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Tens of thousands of random operations, with and without the kernel's writeback cache.
#[test]
fn fsx_finds_no_miscompare() {
    require_fuse!();
    let Some(fsx) = tool_or_skip("fsx") else { return };
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("512M").build_in(dir.path(), "fsx.img");
    for (opts, seeds) in [("rw", [1u64, 2]), ("rw,writeback_cache", [3, 4])] {
        let m = FuseMount::new(&img, opts);
        std::thread::scope(|s| {
            for seed in seeds {
                let (mp, work, fsx) = (m.path(), dir.path(), fsx.as_path());
                s.spawn(move || run_fsx(fsx, mp, work, seed, 20_000));
            }
        });
        m.unmount();
        e2fsck_clean(&img);
    }
}

/// stress-ng's directory, dentry, link, rename, xattr, open, seek, chattr (flags, `chattr
/// +e`/`-e` conversions among them), fallocate, hole-punching, I/O-mix, OFD-lock and utime
/// stressors, a few seconds each with two workers, each followed by `e2fsck -fn`. None may
/// skip itself as unsupported.
#[test]
fn stress_ng_stressors_pass() {
    require_fuse!();
    let Some(sng) = tool_or_skip("stress-ng") else { return };
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("1G").build_in(dir.path(), "stress.img");
    for stressor in [
        "dir",
        "dentry",
        "link",
        "symlink",
        "rename",
        "xattr",
        "open",
        "seek",
        "chattr",
        "fallocate",
        "fpunch",
        "iomix",
        "lockofd",
        "utime",
    ] {
        let m = FuseMount::new(&img, "rw");
        let work = m.join(stressor);
        std::fs::create_dir(&work).unwrap();
        let out = Command::new(&sng)
            .arg(format!("--{stressor}"))
            .arg("2")
            .args(["--timeout", "4", "--verify", "--metrics-brief"])
            // iomix's file is 1 GiB by default, the image's size.
            .args(if stressor == "iomix" { &["--iomix-bytes", "128m"][..] } else { &[] })
            .arg("--temp-path")
            .arg(&work)
            // Some stressors (open) also make files in the working directory.
            .current_dir(&work)
            .output()
            .expect("run stress-ng");
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "stress-ng --{stressor} failed:\n{}", tail(&text, 40));
        assert!(!text.contains("fail"), "stress-ng --{stressor} reported failures:\n{}", tail(&text, 40));
        assert!(!text.contains("skipping stressor"), "stress-ng --{stressor} skipped:\n{}", tail(&text, 40));
        eprintln!("stress-ng --{stressor}: ok");
        m.unmount();
        e2fsck_clean(&img);
    }
}
