//! `rext4 mkfs --from DIR`: the kernel sees the source tree; the same input gives the same
//! bytes whatever the clock, time zone, umask or order the tree was made in; manifests,
//! `--all-root` and `--uid-offset` decide owners without root.

use crate::mkfs::{ok, rext4};
use rext4_testkit::{
    diff_source, e2fsck_clean, source_tree, walk_kernel, KernelMount, Report, SourceCmp, SourceTree, TreeSpec,
};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

static TREE: OnceLock<SourceTree> = OnceLock::new();
static TREE_1K: OnceLock<SourceTree> = OnceLock::new();

pub(crate) fn tree() -> &'static SourceTree {
    source_tree(&TREE, "mkfs-from", TreeSpec::medium())
}

/// With xattrs that fit a 1 KiB block.
fn tree_1k() -> &'static SourceTree {
    source_tree(&TREE_1K, "mkfs-from-1k", TreeSpec::medium().small_blocks())
}

#[test]
fn the_kernel_sees_the_source_tree() {
    rext4_testkit::require_kernel!();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut report = Report::default();
    for (name, args) in [
        ("ext4", &["-t", "ext4"][..]),
        ("ext4_1k", &["-t", "ext4", "-b", "1024"]),
        ("inline_data", &["-t", "ext4", "-O", "inline_data"]),
        ("no_csum", &["-t", "ext4", "-O", "^metadata_csum"]),
        ("ext3", &["-t", "ext3"]),
        ("bigalloc", &["-t", "ext4", "-O", "bigalloc"]),
        ("bigalloc_1k", &["-t", "ext4", "-b", "1024", "-O", "bigalloc", "-C", "4096"]),
    ] {
        let src = if args.contains(&"1024") { tree_1k() } else { tree() };
        let img = dir.path().join(format!("{name}.img"));
        let mut a = vec!["mkfs", "-q", "--from", src.dir.to_str().expect("utf-8 path")];
        a.extend_from_slice(args);
        a.push(img.to_str().expect("utf-8 path"));
        // Below 512 MiB mke2fs (and so rext4 mkfs) picks 1 KiB blocks.
        a.push(if args.contains(&"1024") { "256M" } else { "600M" });
        ok(&rext4(&a));
        e2fsck_clean(&img);
        let m = KernelMount::ro(&img).unwrap_or_else(|e| panic!("{name}: {e}"));
        let k = walk_kernel(m.path());
        report.add(
            format!("{name}: kernel vs source"),
            diff_source(&src.walk, &k, SourceCmp { mtime_ns: true }),
        );
        m.unmount().expect("umount");
        std::fs::remove_file(&img).ok();
    }
    report.finish();
}

/// Makes a small tree at `root`, its directories created in `order` (the on-disk order of
/// directory entries in the source then differs).
pub(crate) fn small_tree(root: &Path, reversed: bool) {
    let mut names: Vec<String> = (0..40).map(|i| format!("d{i:02}")).collect();
    if reversed {
        names.reverse();
    }
    for n in &names {
        let d = root.join(n);
        std::fs::create_dir_all(&d).expect("mkdir");
        for j in 0..5 {
            std::fs::write(d.join(format!("f{j}")), format!("{n}/{j}\n").repeat(j * 300)).expect("write");
        }
        std::os::unix::fs::symlink("f1", d.join("link")).expect("symlink");
        std::fs::hard_link(d.join("f2"), d.join("hard")).expect("link");
    }
    xattr::set(root.join("d01/f1"), "user.note", b"v").expect("xattr");
}

fn sha256(p: &Path) -> String {
    let o = Command::new("sha256sum").arg(p).output().expect("sha256sum");
    String::from_utf8_lossy(&o.stdout).split_whitespace().next().unwrap_or("").to_string()
}

#[test]
fn same_input_same_bytes_across_clock_zone_umask_and_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut sums = Vec::new();
    for (i, (tz, umask, reversed)) in [("UTC", "022", false), ("Asia/Tokyo", "077", true)].iter().enumerate()
    {
        let src = dir.path().join(format!("src{i}"));
        small_tree(&src, *reversed);
        // Different modification times on each run: clamped to the epoch below.
        let img = dir.path().join(format!("r{i}.img"));
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "umask {umask}; chmod -R u+rwX,go+rX {s}; exec \"$0\" mkfs -q --from {s} {img} 64M",
                s = src.display(),
                img = img.display()
            ))
            .arg(env!("CARGO_BIN_EXE_rext4"))
            .env("TZ", tz)
            .env("SOURCE_DATE_EPOCH", "1600000000")
            .output()
            .expect("run rext4 mkfs");
        ok(&o);
        e2fsck_clean(&img);
        sums.push(sha256(&img));
        std::thread::sleep(std::time::Duration::from_millis(1100));
    }
    assert_eq!(sums[0], sums[1], "two reproducible builds differ");

    // An edit under the same SOURCE_DATE_EPOCH keeps the image reproducible.
    let mut edited = Vec::new();
    for i in 0..2 {
        let img = dir.path().join(format!("r{i}.img"));
        let target = format!("{}:/new", img.display());
        let o = Command::new(env!("CARGO_BIN_EXE_rext4"))
            .args(["mkdir", &target])
            .env("SOURCE_DATE_EPOCH", "1600000000")
            .output()
            .expect("rext4 mkdir");
        ok(&o);
        edited.push(sha256(&img));
        std::thread::sleep(std::time::Duration::from_millis(1100));
    }
    assert_eq!(edited[0], edited[1], "the same edit made the images differ");
    assert_ne!(edited[0], sums[0]);
}

#[test]
fn manifest_all_root_and_uid_offset_decide_owners() {
    rext4_testkit::require_kernel!();
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("etc")).expect("mkdir");
    std::fs::write(src.join("etc/shadow"), b"secret\n").expect("write");
    std::fs::write(src.join("bin"), b"#!/bin/sh\n").expect("write");
    std::fs::write(src.join("plain"), b"x").expect("write");
    let manifest = dir.path().join("manifest");
    std::fs::write(
        &manifest,
        "# path uid gid mode\n/etc/shadow 0 42 0640\nbin uid=7 mode=4755 mtime=1234567890 xattr.user.origin=manifest\n",
    )
    .expect("write manifest");
    let img = dir.path().join("m.img");
    ok(&rext4(&[
        "mkfs",
        "-q",
        "--from",
        src.to_str().expect("utf-8"),
        "--uid-offset",
        "100000",
        "--gid-offset",
        "100000",
        "--all-root",
        "--manifest",
        manifest.to_str().expect("utf-8"),
        img.to_str().expect("utf-8"),
        "32M",
    ]));
    e2fsck_clean(&img);
    let m = KernelMount::ro(&img).expect("mount");
    let meta = |p: &str| std::fs::symlink_metadata(m.path().join(p)).expect("stat");
    let shadow = meta("etc/shadow");
    assert_eq!((shadow.uid(), shadow.gid(), shadow.mode() & 0o7777), (0, 42, 0o640));
    let bin = meta("bin");
    assert_eq!((bin.uid(), bin.gid(), bin.mode() & 0o7777, bin.mtime()), (7, 100_000, 0o4755, 1_234_567_890));
    assert_eq!(
        xattr::get(m.path().join("bin"), "user.origin").expect("xattr").as_deref(),
        Some(&b"manifest"[..])
    );
    let plain = meta("plain");
    assert_eq!((plain.uid(), plain.gid()), (100_000, 100_000));
    m.unmount().expect("umount");
}

#[test]
fn the_kernel_sees_an_archives_tree() {
    // The source tree archived by GNU tar in pax format (nanosecond times, xattrs, hard links,
    // devices), plain, gzip'ed and zstd'ed: each image holds the tree as the directory made it.
    rext4_testkit::require_kernel!();
    // .ci/setup installs zstd; elsewhere the zstd archive is skipped without it.
    let zstd = rext4_testkit::find_tool("zstd").is_some();
    let dir = tempfile::tempdir().expect("tempdir");
    let src = tree();
    // tar archives no sockets.
    let mut want = src.walk.clone();
    want.recs.retain(|_, r| r.kind != rext4_testkit::Kind::Socket);
    let mut report = Report::default();
    for (name, flag) in [("tar", None), ("tar.gz", Some("--gzip")), ("tar.zst", Some("--zstd"))] {
        if flag == Some("--zstd") && !zstd {
            eprintln!("SKIP tar.zst: no zstd here");
            continue;
        }
        let ar = dir.path().join(format!("tree.{name}"));
        let mut tar = Command::new("tar");
        tar.args(["--format=posix", "--xattrs", "--xattrs-include=*", "--numeric-owner", "-cf"]).arg(&ar);
        if let Some(f) = flag {
            tar.arg(f);
        }
        let o = tar.arg("-C").arg(&src.dir).arg(".").output().expect("tar");
        assert!(o.status.success(), "tar: {}", String::from_utf8_lossy(&o.stderr));
        let img = dir.path().join(format!("{name}.img"));
        ok(&rext4(&[
            "mkfs",
            "-q",
            "--from",
            ar.to_str().expect("utf-8"),
            img.to_str().expect("utf-8"),
            "600M",
        ]));
        e2fsck_clean(&img);
        let m = KernelMount::ro(&img).unwrap_or_else(|e| panic!("{name}: {e}"));
        let k = walk_kernel(m.path());
        report.add(format!("{name}: kernel vs source"), diff_source(&want, &k, SourceCmp { mtime_ns: true }));
        m.unmount().expect("umount");
        std::fs::remove_file(&img).ok();
    }
    // An archive naming a path outside the root is refused.
    let evil = dir.path().join("evil.tar");
    {
        let mut b = Vec::new();
        let mut h = [0u8; 512];
        h[..9].copy_from_slice(b"../escape");
        h[100..107].copy_from_slice(b"0000644");
        h[124..135].copy_from_slice(b"00000000000");
        h[136..147].copy_from_slice(b"00000000000");
        h[156] = b'0';
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&x| u32::from(x)).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        b.extend_from_slice(&h);
        b.extend_from_slice(&[0u8; 1024]);
        std::fs::write(&evil, b).expect("write");
    }
    let img = dir.path().join("evil.img");
    let out =
        rext4(&["mkfs", "-q", "--from", evil.to_str().expect("utf-8"), img.to_str().expect("utf-8"), "64M"]);
    assert!(!out.status.success(), "an archive with ../ was accepted");
    assert!(String::from_utf8_lossy(&out.stderr).contains(".."), "{}", String::from_utf8_lossy(&out.stderr));
    report.finish();
}

/// The raw `security.selinux` of `path` in `img`, as debugfs reads it (empty when none).
fn selinux_of(img: &Path, path: &str) -> Vec<u8> {
    let o = Command::new("debugfs")
        .arg("-R")
        .arg(format!("ea_get -V {path} security.selinux"))
        .arg(img)
        .output()
        .expect("debugfs");
    let mut v = o.stdout;
    // debugfs ends the value with a newline of its own.
    if v.last() == Some(&b'\n') {
        v.pop();
    }
    v
}

#[test]
fn selinux_labels_from_file_contexts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    small_tree(&src, false);
    std::fs::create_dir(src.join("tmp")).expect("mkdir");
    let fc = dir.path().join("file_contexts");
    std::fs::write(
        &fc,
        "/.*              u:object_r:default_t:s0\n\
         /d0[0-4](/.*)?    u:object_r:low_t:s0\n\
         /d01/f.*      --  u:object_r:f_t:s0\n\
         /d01/link     -l  u:object_r:link_t:s0\n\
         /d02/f1           u:object_r:exact_t:s0\n\
         /d02/f[0-9]       u:object_r:later_t:s0\n\
         /tmp(/.*)?        <<none>>\n",
    )
    .expect("write");
    // What libselinux reads beside the file: local lines after its own, and path
    // substitutions (/d06 is labelled as /d01, /d07 as /tmp).
    std::fs::write(
        dir.path().join("file_contexts.local"),
        "/d05/f1  u:object_r:local_t:s0\n/d0[0-4]/f4  u:object_r:local_re_t:s0\n",
    )
    .expect("write");
    std::fs::write(dir.path().join("file_contexts.subs"), "/d06 /d01\n").expect("write");
    std::fs::write(dir.path().join("file_contexts.subs_dist"), "/d07 /tmp\n").expect("write");
    let ar = dir.path().join("src.tar");
    let o = Command::new("tar")
        .args(["--format=posix", "--xattrs", "--xattrs-include=*", "--numeric-owner", "-cf"])
        .arg(&ar)
        .arg("-C")
        .arg(&src)
        .arg(".")
        .output()
        .expect("tar");
    assert!(o.status.success(), "tar: {}", String::from_utf8_lossy(&o.stderr));
    for from in [&src, &ar] {
        let img = dir.path().join("se.img");
        ok(&rext4(&[
            "mkfs",
            "-q",
            "--selinux",
            fc.to_str().expect("utf-8"),
            "--from",
            from.to_str().expect("utf-8"),
            img.to_str().expect("utf-8"),
            "32M",
        ]));
        e2fsck_clean(&img);
        for (path, want) in [
            ("/", "u:object_r:default_t:s0"),
            ("/d10/f1", "u:object_r:default_t:s0"),
            ("/d03", "u:object_r:low_t:s0"),
            ("/d01", "u:object_r:low_t:s0"),
            ("/d01/f3", "u:object_r:f_t:s0"),
            ("/d01/link", "u:object_r:link_t:s0"),
            // An exact path wins over a later regex.
            ("/d02/f1", "u:object_r:exact_t:s0"),
            ("/d02/f2", "u:object_r:later_t:s0"),
            ("/d05/f1", "u:object_r:local_t:s0"),
            ("/d03/f4", "u:object_r:local_re_t:s0"),
            ("/d06/f3", "u:object_r:f_t:s0"),
            ("/d06/link", "u:object_r:link_t:s0"),
            ("/d06", "u:object_r:low_t:s0"),
        ] {
            let mut want = want.as_bytes().to_vec();
            want.push(0);
            assert_eq!(selinux_of(&img, path), want, "{}: {path}", from.display());
        }
        assert_eq!(selinux_of(&img, "/tmp"), b"", "<<none>> leaves no label");
        assert_eq!(selinux_of(&img, "/d07/f1"), b"", "<<none>> through a substitution");
        if rext4_testkit::kernel_can_mount() {
            let m = KernelMount::ro(&img).expect("mount");
            for (path, want) in [
                ("d01/link", "u:object_r:link_t:s0"),
                ("d05/f1", "u:object_r:local_t:s0"),
                ("d06/link", "u:object_r:link_t:s0"),
                ("d06/f2", "u:object_r:f_t:s0"),
            ] {
                let o = Command::new("getfattr")
                    .args(["-h", "--only-values", "-n", "security.selinux"])
                    .arg(m.path().join(path))
                    .output()
                    .expect("getfattr");
                assert!(
                    o.stdout.starts_with(want.as_bytes()),
                    "{path}: {:?}",
                    String::from_utf8_lossy(&o.stdout)
                );
            }
            let o = Command::new("getfattr")
                .args(["-h", "-n", "security.selinux"])
                .arg(m.path().join("d07/f1"))
                .output();
            m.unmount().expect("umount");
            assert!(!o.expect("getfattr").status.success(), "d07/f1 has a label");
        }
        std::fs::remove_file(&img).ok();
    }
}
