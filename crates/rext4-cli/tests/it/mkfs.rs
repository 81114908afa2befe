//! `rext4 mkfs` against `mke2fs`: the same arguments, a pinned UUID, hash seed and clock,
//! give the same `dumpe2fs` output (every group, not just the header); every image is clean
//! under `e2fsck -fn` and mounts in the kernel.

use rext4_testkit::{e2fsck_clean, tool, Image, KernelMount};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const UUID: &str = "11111111-2222-4333-8444-555555555555";
const HASH_SEED: &str = "66666666-7777-4888-9999-aaaaaaaaaaaa";
const TIME: &str = "1700000000";

/// e2fsprogs 1.47's stock configuration (what `rext4 mkfs` follows), for `mke2fs` to read
/// instead of the distribution's, which may leave out `orphan_file` and `metadata_csum_seed`.
const UPSTREAM_CONF: &str = "[defaults]
\tbase_features = sparse_super,large_file,filetype,resize_inode,dir_index,ext_attr
\tdefault_mntopts = acl,user_xattr
\tenable_periodic_fsck = 0
\tblocksize = 4096
\tinode_size = 256
\tinode_ratio = 16384
[fs_types]
\text3 = {
\t\tfeatures = has_journal
\t}
\text4 = {
\t\tfeatures = has_journal,extent,huge_file,flex_bg,metadata_csum,metadata_csum_seed,64bit,dir_nlink,extra_isize,orphan_file
\t}
\tsmall = {
\t\tblocksize = 1024
\t\tinode_ratio = 4096
\t}
\tfloppy = {
\t\tblocksize = 1024
\t\tinode_ratio = 8192
\t}
\tbig = {
\t\tinode_ratio = 32768
\t}
\thuge = {
\t\tinode_ratio = 65536
\t}
\tnews = {
\t\tinode_ratio = 4096
\t}
";

pub(crate) fn rext4(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rext4")).args(args).output().expect("run rext4")
}

pub(crate) fn ok(o: &Output) {
    assert!(
        o.status.success(),
        "rext4 failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `dumpe2fs` output without what cannot agree: the lifetime-writes count (each tool counts
/// its own I/O) and the superblock checksum that covers it.
fn dump(img: &Path) -> String {
    let o = Command::new(tool("dumpe2fs")).arg(img).output().expect("dumpe2fs");
    assert!(o.status.success(), "dumpe2fs {}: {}", img.display(), String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.starts_with("Lifetime writes:") && !l.starts_with("Checksum:"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn size_bytes(s: &str) -> u64 {
    let (n, unit) = s.split_at(s.len() - 1);
    let n: u64 = n.parse().expect("size");
    n << match unit {
        "M" => 20,
        "G" => 30,
        _ => panic!("size unit"),
    }
}

/// Makes the same filesystem with mke2fs and `rext4 mkfs`; returns both paths.
fn both(dir: &Path, name: &str, size: &str, args: &[&str]) -> (PathBuf, PathBuf) {
    let conf = dir.join("mke2fs.conf");
    std::fs::write(&conf, UPSTREAM_CONF).expect("write mke2fs.conf");
    let theirs = dir.join(format!("{name}.mke2fs.img"));
    let ours = dir.join(format!("{name}.rext4.img"));
    let mut pinned = vec!["-U", UUID, "-E"];
    let seed = format!("hash_seed={HASH_SEED}");
    pinned.push(&seed);
    // An existing file, which mke2fs discards (punches) and then knows to read as zeroes,
    // as `rext4 mkfs` always does: its inode tables are then marked zeroed.
    std::fs::File::create(&theirs).and_then(|f| f.set_len(size_bytes(size))).expect("create image");
    Image::ext4(size)
        .args(args)
        .args(&pinned)
        .env("MKE2FS_CONFIG", conf.to_str().expect("utf-8 path"))
        .env("E2FSPROGS_FAKE_TIME", TIME)
        .build(&theirs);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rext4"));
    cmd.arg("mkfs").arg("-q").args(args).args(&pinned).arg(&ours).arg(size).env("E2FSPROGS_FAKE_TIME", TIME);
    let o = cmd.output().expect("run rext4 mkfs");
    ok(&o);
    (theirs, ours)
}

/// Every variant the issue names, and the layouts mke2fs switches between.
const VARIANTS: &[(&str, &str, &[&str])] = &[
    ("ext4", "64M", &["-t", "ext4"]),
    ("ext4_debian", "64M", &["-t", "ext4", "-O", "^metadata_csum_seed,^orphan_file"]),
    ("ext2", "64M", &["-t", "ext2"]),
    ("ext3", "64M", &["-t", "ext3"]),
    ("ext4_4k", "600M", &["-t", "ext4"]),
    ("ext4_1k", "96M", &["-t", "ext4", "-b", "1024"]),
    ("ext4_2k", "64M", &["-t", "ext4", "-b", "2048"]),
    ("ext4_64k", "512M", &["-t", "ext4", "-b", "65536"]),
    ("ext4_128", "64M", &["-t", "ext4", "-I", "128"]),
    ("inline_data", "64M", &["-t", "ext4", "-O", "inline_data"]),
    ("large_dir", "64M", &["-t", "ext4", "-O", "large_dir"]),
    ("no_csum", "64M", &["-t", "ext4", "-O", "^metadata_csum"]),
    ("uninit_bg", "64M", &["-t", "ext4", "-O", "^metadata_csum,uninit_bg"]),
    ("no_flex_bg", "64M", &["-t", "ext4", "-O", "^flex_bg"]),
    ("meta_bg", "300M", &["-t", "ext4", "-O", "^resize_inode,meta_bg"]),
    ("no_64bit", "64M", &["-t", "ext4", "-O", "^64bit"]),
    ("no_journal", "64M", &["-t", "ext4", "-O", "^has_journal"]),
    ("tiny", "2M", &["-t", "ext4"]),
    ("options", "64M", &["-t", "ext4", "-G", "4", "-N", "30000", "-m", "1", "-L", "label", "-J", "size=8"]),
];

#[test]
fn variants_match_mke2fs_and_pass_e2fsck() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut diffs = Vec::new();
    for (name, size, args) in VARIANTS {
        let (theirs, ours) = both(dir.path(), name, size, args);
        let (a, b) = (dump(&theirs), dump(&ours));
        if a != b {
            let first: Vec<String> = a
                .lines()
                .zip(b.lines())
                .filter(|(x, y)| x != y)
                .take(6)
                .map(|(x, y)| format!("  mke2fs: {x}\n  rext4:  {y}"))
                .collect();
            diffs.push(format!("{name} ({}):\n{}", args.join(" "), first.join("\n")));
        }
        e2fsck_clean(&ours);
        std::fs::remove_file(&theirs).ok();
        std::fs::remove_file(&ours).ok();
    }
    assert!(diffs.is_empty(), "dumpe2fs differs:\n{}", diffs.join("\n"));
}

#[test]
fn a_large_filesystem_with_a_multi_extent_journal_matches_mke2fs() {
    // 200 GiB: a 1 GiB journal in eight extents under a leaf block, 1600 groups.
    let dir = tempfile::tempdir().expect("tempdir");
    // Without writing the gigabyte of journal zeroes (the image stays sparse).
    let (theirs, ours) = both(dir.path(), "large", "200G", &["-t", "ext4", "-E", "lazy_journal_init=1"]);
    assert_eq!(dump(&theirs), dump(&ours));
    e2fsck_clean(&ours);
}

#[test]
fn the_kernel_mounts_every_variant() {
    rext4_testkit::require_kernel!();
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, size, args) in VARIANTS {
        let img = dir.path().join(format!("{name}.img"));
        let mut a = vec!["mkfs", "-q"];
        a.extend_from_slice(args);
        let p = img.to_str().expect("utf-8 path");
        a.push(p);
        a.push(size);
        ok(&rext4(&a));
        // Blocks larger than the page are beyond what this kernel mounts.
        if args.contains(&"65536") {
            continue;
        }
        let m = KernelMount::rw(&img).unwrap_or_else(|e| panic!("{name}: kernel mount: {e}"));
        let lpf = std::fs::symlink_metadata(m.path().join("lost+found")).expect("lost+found");
        assert!(lpf.is_dir(), "{name}");
        std::fs::write(m.path().join("f"), b"kernel").expect("write through the kernel");
        m.unmount().unwrap_or_else(|e| panic!("{name}: unmount: {e}"));
        e2fsck_clean(&img);
        std::fs::remove_file(&img).ok();
    }
}

#[test]
fn sizes_with_suffixes_and_bad_arguments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("s.img");
    let p = img.to_str().expect("utf-8 path");
    ok(&rext4(&["mkfs", "-q", p, "65536"]));
    assert_eq!(std::fs::metadata(&img).expect("image").len(), 64 << 20);
    ok(&rext4(&["mkfs", "-q", "-b", "4096", p, "4096"]));
    assert_eq!(std::fs::metadata(&img).expect("image").len(), 16 << 20);
    ok(&rext4(&["mkfs", "-q", p, "1G"]));
    assert_eq!(std::fs::metadata(&img).expect("image").len(), 1 << 30);
    e2fsck_clean(&img);
    for bad in [
        &["mkfs", "-q", "-O", "no_such_feature", p, "8M"][..],
        &["mkfs", "-q", "-b", "3000", p, "8M"],
        &["mkfs", "-q", "-I", "128", "-O", "inline_data", p, "8M"],
        &["mkfs", "-q", "-t", "ext5", p, "8M"],
        &["mkfs", "-q", p, "8X"],
    ] {
        let o = rext4(bad);
        assert!(!o.status.success(), "{bad:?} succeeded");
    }
}
