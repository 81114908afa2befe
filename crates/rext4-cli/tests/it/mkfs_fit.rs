//! `rext4 mkfs --size-to-fit`: an image no larger than `resize2fs -M` makes of
//! `mkfs.ext4 -d`'s, that holds the whole tree (the kernel sees it), with the slack asked for;
//! a directory and its archive fit the same size.

use crate::mkfs::{ok, rext4};
use crate::mkfs_from::{small_tree, tree};
use rext4_testkit::{diff_source, e2fsck_clean, walk_kernel, KernelMount, Report, SourceCmp};
use std::path::Path;
use std::process::Command;

/// A `dumpe2fs -h` field as a number.
fn field(img: &Path, name: &str) -> u64 {
    let o = Command::new("dumpe2fs").arg("-h").arg(img).output().expect("dumpe2fs");
    let text = String::from_utf8_lossy(&o.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(|v| v.trim().to_string()))
        .unwrap_or_else(|| panic!("{}: no {name} in dumpe2fs", img.display()))
        .parse()
        .unwrap_or_else(|e| panic!("{}: {name}: {e}", img.display()))
}

/// The journal's size (`dumpe2fs -h` says `4096k`, `16M`), 0 without one.
fn journal(img: &Path) -> u64 {
    let o = Command::new("dumpe2fs").arg("-h").arg(img).output().expect("dumpe2fs");
    let text = String::from_utf8_lossy(&o.stdout);
    let Some(v) = text.lines().find_map(|l| l.strip_prefix("Total journal size:")) else { return 0 };
    let v = v.trim();
    let (n, mult) = match v.strip_suffix('k') {
        Some(n) => (n, 1 << 10),
        None => (v.trim_end_matches('M'), 1 << 20),
    };
    n.parse::<u64>().expect("journal size") * mult
}

fn bytes(img: &Path) -> u64 {
    field(img, "Block count") * field(img, "Block size")
}

fn fit(src: &Path, img: &Path, slack: Option<&str>) {
    let flag = slack.map_or("--size-to-fit".to_string(), |s| format!("--size-to-fit={s}"));
    ok(&rext4(&[
        "mkfs",
        "-q",
        &flag,
        "--from",
        src.to_str().expect("utf-8 path"),
        img.to_str().expect("utf-8 path"),
    ]));
    e2fsck_clean(img);
    assert_eq!(std::fs::metadata(img).expect("image").len(), bytes(img), "the file is the filesystem");
}

#[test]
fn no_larger_than_resize2fs_min_and_the_kernel_sees_the_tree() {
    rext4_testkit::require_kernel!();
    let dir = tempfile::tempdir().expect("tempdir");
    let src = tree();
    // mke2fs's own fill of a large image, shrunk as far as resize2fs goes.
    let theirs = dir.path().join("theirs.img");
    std::fs::File::create(&theirs).and_then(|f| f.set_len(2 << 30)).expect("image");
    let o =
        Command::new("mkfs.ext4").args(["-q", "-F", "-d"]).arg(&src.dir).arg(&theirs).output().expect("mkfs");
    assert!(o.status.success(), "mkfs.ext4: {}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new("resize2fs").arg("-M").arg(&theirs).output().expect("resize2fs");
    assert!(o.status.success(), "resize2fs -M: {}", String::from_utf8_lossy(&o.stderr));
    e2fsck_clean(&theirs);

    let ours = dir.path().join("ours.img");
    fit(&src.dir, &ours, None);
    let (a, b) = (bytes(&ours), bytes(&theirs));
    eprintln!("size-to-fit: {a} bytes; resize2fs -M: {b} bytes");
    assert!(a <= b, "--size-to-fit made {a} bytes, resize2fs -M {b}");

    let mut report = Report::default();
    let m = KernelMount::ro(&ours).expect("mount");
    report.add(
        "kernel vs source",
        diff_source(&src.walk, &walk_kernel(m.path()), SourceCmp { mtime_ns: true }),
    );
    m.unmount().expect("umount");
    report.finish();
}

#[test]
fn slack_is_left_free_and_an_archive_fits_as_its_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    small_tree(&src, false);
    let tight = dir.path().join("tight.img");
    fit(&src, &tight, None);

    // 8 MiB to spare: at least that many blocks free after the fill, and not much more
    // (but the journal, which mke2fs sizes by the filesystem's size: none below 2048 blocks).
    let roomy = dir.path().join("roomy.img");
    fit(&src, &roomy, Some("8M"));
    let free = field(&roomy, "Free blocks") * field(&roomy, "Block size");
    assert!(free >= 8 << 20, "{free} bytes free");
    let (r, t) = (bytes(&roomy) - journal(&roomy), bytes(&tight) - journal(&tight));
    assert!(r <= t + (9 << 20), "{r} vs {t} bytes but the journal");

    // A share: half again what the tree takes.
    let half = dir.path().join("half.img");
    fit(&src, &half, Some("50%"));
    let used = |img: &Path| field(img, "Block count") - field(img, "Free blocks");
    assert!(field(&half, "Free blocks") * 2 >= used(&tight) - field(&tight, "Overhead clusters"));

    // The same tree from an archive: the same size.
    let ar = dir.path().join("src.tar.gz");
    let o = Command::new("tar")
        .args(["--format=posix", "--xattrs", "--xattrs-include=*", "--numeric-owner", "--gzip", "-cf"])
        .arg(&ar)
        .arg("-C")
        .arg(&src)
        .arg(".")
        .output()
        .expect("tar");
    assert!(o.status.success(), "tar: {}", String::from_utf8_lossy(&o.stderr));
    let from_ar = dir.path().join("ar.img");
    fit(&ar, &from_ar, None);
    assert_eq!(bytes(&from_ar), bytes(&tight));

    // The size depends on the tree alone: reproducible builds stay byte for byte the same.
    let mut sums = Vec::new();
    for i in 0..2 {
        let img = dir.path().join(format!("repro{i}.img"));
        let o = Command::new(env!("CARGO_BIN_EXE_rext4"))
            .args(["mkfs", "-q", "--size-to-fit=5%", "--from"])
            .arg(&src)
            .arg(&img)
            .env("SOURCE_DATE_EPOCH", "1600000000")
            .output()
            .expect("rext4 mkfs");
        ok(&o);
        sums.push(std::fs::read(&img).expect("image"));
    }
    assert!(sums[0] == sums[1], "two reproducible fitted builds differ");
}

#[test]
fn size_to_fit_needs_a_tree_and_no_size() {
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("x.img");
    let img = img.to_str().expect("utf-8 path");
    let o = rext4(&["mkfs", "-q", "--size-to-fit", img]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--from"));
    let src = dir.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    let o = rext4(&["mkfs", "-q", "--size-to-fit", "--from", src.to_str().expect("utf-8"), img, "64M"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not both"));
}

/// The estimate counts the tree, not what a manifest adds: extended attributes too large for
/// the inodes make the first fitted size too small, and the fill starts over larger until
/// it fits.
#[test]
fn a_fill_that_outgrows_the_estimate_grows_and_retries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    small_tree(&src, false);
    // Each of the 200 regular files gets a value of 3000 bytes, each its own (equal blocks
    // would be shared): a block apiece.
    let value = |d: usize, f: usize| format!("{d:02}{f}{}", "v".repeat(2997));
    let mut manifest = String::new();
    for d in 0..40 {
        for f in 0..5 {
            manifest.push_str(&format!("/d{d:02}/f{f} xattr.user.big={}\n", value(d, f)));
        }
    }
    let mf = dir.path().join("manifest");
    std::fs::write(&mf, manifest).expect("manifest");
    let s = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    // The size the estimate alone gives: the tree fits, the manifest's values do not.
    let plain = dir.path().join("plain.img");
    fit(&src, &plain, Some("0"));
    let first = bytes(&plain);
    let img = dir.path().join("img");
    let inodes = field(&plain, "Inode count").to_string();
    let o = rext4(&[
        "mkfs",
        "-q",
        "-b",
        "4096",
        "-m",
        "0",
        "-N",
        &inodes,
        "--manifest",
        &s(&mf),
        "--from",
        &s(&src),
        &s(&img),
        &format!("{first}B"),
    ]);
    assert!(!o.status.success(), "the manifest's values fit the tree's own size");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no space left"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Fitted: larger, clean, and every value there.
    ok(&rext4(&["mkfs", "-q", "--size-to-fit=0", "--manifest", &s(&mf), "--from", &s(&src), &s(&img)]));
    e2fsck_clean(&img);
    assert!(bytes(&img) > first, "{} <= {first}", bytes(&img));
    assert!(bytes(&img) < first + (8 << 20), "grew far past the need: {} from {first}", bytes(&img));
    for (path, value) in [("/d00/f0", value(0, 0)), ("/d39/f4", value(39, 4))] {
        let o = Command::new("debugfs")
            .arg("-R")
            .arg(format!("ea_get {path} user.big"))
            .arg(&img)
            .output()
            .expect("debugfs");
        assert!(String::from_utf8_lossy(&o.stdout).contains(&value[..100]), "{path}: no value");
    }
}

/// With bigalloc every file takes whole clusters: the fitted image (16 and 64 KiB clusters)
/// still holds the tree, e2fsck agrees, and the kernel sees the tree.
#[test]
fn bigalloc_images_fit_in_whole_clusters() {
    rext4_testkit::require_kernel!();
    let dir = tempfile::tempdir().expect("tempdir");
    let src = tree();
    let mut report = Report::default();
    for cluster in ["16k", "64k"] {
        let img = dir.path().join(format!("{cluster}.img"));
        ok(&rext4(&[
            "mkfs",
            "-q",
            "-O",
            "bigalloc",
            "-C",
            cluster,
            "--size-to-fit",
            "--from",
            src.dir.to_str().expect("utf-8 path"),
            img.to_str().expect("utf-8 path"),
        ]));
        e2fsck_clean(&img);
        assert_eq!(field(&img, "Cluster size"), parse(cluster));
        let m = KernelMount::ro(&img).expect("mount");
        report.add(
            format!("{cluster}: kernel vs source"),
            diff_source(&src.walk, &walk_kernel(m.path()), SourceCmp { mtime_ns: true }),
        );
        m.unmount().expect("umount");
    }
    report.finish();
}

fn parse(size: &str) -> u64 {
    size.trim_end_matches('k').parse::<u64>().expect("size") * 1024
}
