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
/// its own I/O) and the superblock checksum that covers it; the MMP block's device name (each
/// image's own path) and the time mke2fs stamps it with (the clock's, not the fake time).
fn dump(img: &Path) -> String {
    let o = Command::new(tool("dumpe2fs")).arg(img).output().expect("dumpe2fs");
    assert!(o.status.success(), "dumpe2fs {}: {}", img.display(), String::from_utf8_lossy(&o.stderr));
    let differs =
        ["Lifetime writes:", "Checksum:", "mmp_device_name:", "mmp_update_date:", "mmp_update_time:"];
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !differs.iter().any(|d| l.trim_start().starts_with(d)))
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
    // mke2fs reads only the last -E: the hash seed joins the test's own, if it has one.
    let seed = format!("hash_seed={HASH_SEED}");
    let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    match args.iter().position(|a| a == "-E") {
        Some(i) if i + 1 < args.len() => args[i + 1] = format!("{},{seed}", args[i + 1]),
        _ => args.extend(["-E".to_string(), seed]),
    }
    let pinned = ["-U", UUID];
    // An existing file, which mke2fs discards (punches) and then knows to read as zeroes,
    // as `rext4 mkfs` always does: its inode tables are then marked zeroed.
    std::fs::File::create(&theirs).and_then(|f| f.set_len(size_bytes(size))).expect("create image");
    Image::ext4(size)
        .args(&args)
        .args(pinned)
        .env("MKE2FS_CONFIG", conf.to_str().expect("utf-8 path"))
        .env("E2FSPROGS_FAKE_TIME", TIME)
        .build(&theirs);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rext4"));
    cmd.arg("mkfs").arg("-q").args(&args).args(pinned).arg(&ours).arg(size).env("E2FSPROGS_FAKE_TIME", TIME);
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
    ("mmp", "64M", &["-t", "ext4", "-O", "mmp"]),
    ("mmp_ext3", "64M", &["-t", "ext3", "-O", "mmp", "-E", "mmp_update_interval=17"]),
    ("mmp_4k_no_journal", "600M", &["-t", "ext4", "-O", "mmp,^has_journal"]),
    ("encrypt", "64M", &["-t", "ext4", "-O", "encrypt"]),
    // Clusters of 16 blocks by default: 1 KiB blocks in one group, 4 KiB, several groups.
    ("bigalloc", "64M", &["-t", "ext4", "-O", "bigalloc"]),
    ("bigalloc_4k", "600M", &["-t", "ext4", "-O", "bigalloc"]),
    ("bigalloc_groups", "600M", &["-t", "ext4", "-b", "1024", "-O", "bigalloc"]),
    ("bigalloc_64k_clusters", "600M", &["-t", "ext4", "-O", "bigalloc", "-C", "64k"]),
    ("bigalloc_2k", "300M", &["-t", "ext4", "-b", "2048", "-O", "bigalloc", "-C", "8192"]),
    ("bigalloc_2k_clusters", "64M", &["-t", "ext4", "-b", "1024", "-O", "bigalloc", "-C", "2048"]),
    ("bigalloc_one_block", "64M", &["-t", "ext4", "-b", "4096", "-O", "bigalloc", "-C", "4096"]),
    ("bigalloc_no_flex_bg", "600M", &["-t", "ext4", "-b", "1024", "-O", "bigalloc,^flex_bg"]),
    ("bigalloc_meta_bg", "300M", &["-t", "ext4", "-b", "1024", "-O", "bigalloc,^resize_inode,meta_bg"]),
    ("bigalloc_inline", "64M", &["-t", "ext4", "-O", "bigalloc,inline_data"]),
    ("bigalloc_no_journal", "64M", &["-t", "ext4", "-O", "bigalloc,^has_journal", "-m", "0"]),
    ("bigalloc_mmp_encrypt", "64M", &["-t", "ext4", "-O", "bigalloc,mmp,encrypt"]),
    ("bigalloc_64k", "2G", &["-t", "ext4", "-b", "65536", "-O", "bigalloc", "-C", "1M"]),
    // Blocks (clusters) per group, and mke2fs's -j, -e and -M.
    ("blocks_per_group", "64M", &["-t", "ext4", "-g", "4096"]),
    ("blocks_per_group_1k", "300M", &["-t", "ext4", "-b", "1024", "-g", "1024", "-N", "100000"]),
    ("clusters_per_group", "600M", &["-t", "ext4", "-O", "bigalloc", "-g", "2048"]),
    // Backups in group 1 and the last only (sparse_super2), in one group, in none.
    ("sparse_super2", "600M", &["-t", "ext4", "-O", "sparse_super2"]),
    ("sparse_super2_one", "600M", &["-t", "ext4", "-O", "sparse_super2", "-E", "num_backup_sb=1"]),
    (
        "sparse_super2_none",
        "300M",
        &["-t", "ext4", "-b", "1024", "-O", "sparse_super2,^flex_bg", "-E", "num_backup_sb=0"],
    ),
    // RAID hints (staggering the bitmaps without flex_bg), growth room asked for.
    ("stride_no_flex_bg", "600M", &["-t", "ext4", "-O", "^flex_bg", "-E", "stride=16,stripe_width=64"]),
    ("stride_ext3", "300M", &["-t", "ext3", "-E", "stride=7,stripe_width=20"]),
    ("resize", "600M", &["-t", "ext4", "-E", "resize=4000000"]),
    ("resize_32bit", "1G", &["-t", "ext4", "-O", "^64bit", "-E", "resize=1T"]),
    // An orphan file size in bytes (256 blocks), and in blocks.
    ("orphan_file_1m", "600M", &["-t", "ext4", "-E", "orphan_file_size=1M"]),
    ("orphan_file_blocks", "64M", &["-t", "ext4", "-b", "1024", "-E", "orphan_file_size=64"]),
    ("long_label", "64M", &["-t", "ext4", "-L", "a label longer than sixteen bytes"]),
    ("ext2_j_e_m", "64M", &["-t", "ext2", "-j", "-e", "remount-ro", "-M", "/mnt/data"]),
    // Fast-commit areas: a 64th of the journal, a size asked for, on bigalloc.
    ("fast_commit", "64M", &["-t", "ext4", "-O", "fast_commit"]),
    (
        "fast_commit_sized",
        "600M",
        &["-t", "ext4", "-O", "fast_commit", "-J", "size=64,fast_commit_size=2048"],
    ),
    ("fast_commit_bigalloc", "600M", &["-t", "ext4", "-O", "fast_commit,bigalloc"]),
    // Not `-e panic`: the kernel mounts these, and a panic would take the machine.
    (
        "errors_long_dir",
        "64M",
        &[
            "-t",
            "ext4",
            "-e",
            "continue",
            "-M",
            "/a/path/longer/than/the/sixty/four/bytes/the/superblock/keeps/of/it",
        ],
    ),
];

/// Images with quota files, beside `VARIANTS`: this kernel may lack the quota format and then
/// mounts them read-only only, so they are kept out of `the_kernel_mounts_every_variant`.
const QUOTA_VARIANTS: &[(&str, &str, &[&str])] = &[
    ("quota", "64M", &["-t", "ext4", "-O", "quota"]),
    ("quota_project", "64M", &["-t", "ext4", "-O", "quota,project"]),
    ("quota_prj_only", "64M", &["-t", "ext4", "-O", "quota", "-E", "quotatype=prjquota"]),
    ("quota_usr_only", "64M", &["-t", "ext4", "-O", "quota", "-E", "quotatype=usr"]),
    // Two ids in the user and group files: a second tree branch in the same data block.
    (
        "quota_owner",
        "96M",
        &["-t", "ext4", "-b", "1024", "-O", "quota,project", "-E", "root_owner=1000:1001"],
    ),
    ("quota_2k", "64M", &["-t", "ext4", "-b", "2048", "-O", "quota,project"]),
    ("quota_4k", "600M", &["-t", "ext4", "-O", "quota,project"]),
    ("quota_64k", "512M", &["-t", "ext4", "-b", "65536", "-O", "quota"]),
    ("quota_ext3", "64M", &["-t", "ext3", "-O", "quota"]),
    ("quota_ext2", "64M", &["-t", "ext2", "-O", "quota"]),
    ("quota_debian", "64M", &["-t", "ext4", "-O", "quota,project,^metadata_csum_seed,^orphan_file"]),
    // A cluster holding every quota block, and quota blocks over several clusters.
    ("quota_bigalloc", "64M", &["-t", "ext4", "-O", "bigalloc,quota,project"]),
    (
        "quota_bigalloc_2k",
        "64M",
        &[
            "-t",
            "ext4",
            "-b",
            "1024",
            "-O",
            "bigalloc,quota,project",
            "-C",
            "2048",
            "-E",
            "root_owner=1000:1001",
        ],
    ),
];

/// Images with casefolding (`s_encoding`, strict or not), beside `VARIANTS`: this kernel
/// lacks `CONFIG_UNICODE` and mounts none.
const CASEFOLD_VARIANTS: &[(&str, &str, &[&str])] = &[
    ("casefold", "64M", &["-t", "ext4", "-O", "casefold"]),
    ("casefold_strict", "64M", &["-t", "ext4", "-E", "encoding=utf8,encoding_flags=strict"]),
    ("casefold_ext2", "64M", &["-t", "ext2", "-E", "encoding=utf8-12.1"]),
];

/// `debugfs stat` of the files mkfs makes beside the quota files: the root, the resize
/// inode, the journal, lost+found and the orphan file (block counts, sizes and maps, which
/// dumpe2fs does not show).
fn special_files(img: &Path) -> String {
    [2, 7, 8, 11, 12]
        .iter()
        .map(|ino| {
            let o = Command::new(tool("debugfs")).arg("-R").arg(format!("stat <{ino}>")).arg(img).output();
            String::from_utf8_lossy(&o.expect("debugfs").stdout).into_owned()
        })
        .collect()
}

/// The quota files `dumpe2fs -h` names, with their bytes and `debugfs stat`.
fn quota_files(img: &Path) -> Vec<(u32, Vec<u8>, String)> {
    let o = Command::new(tool("dumpe2fs")).arg("-h").arg(img).output().expect("dumpe2fs");
    let head = String::from_utf8_lossy(&o.stdout).into_owned();
    let inos = head
        .lines()
        .filter(|l| l.contains("quota inode:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse().ok());
    let debugfs =
        |cmd: String| Command::new(tool("debugfs")).arg("-R").arg(cmd).arg(img).output().expect("debugfs");
    inos.map(|ino: u32| {
        let (cat, stat) = (debugfs(format!("cat <{ino}>")), debugfs(format!("stat <{ino}>")));
        (ino, cat.stdout, String::from_utf8_lossy(&stat.stdout).into_owned())
    })
    .collect()
}

#[test]
fn variants_match_mke2fs_and_pass_e2fsck() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut diffs = Vec::new();
    for (name, size, args) in VARIANTS.iter().chain(QUOTA_VARIANTS).chain(CASEFOLD_VARIANTS) {
        let (theirs, ours) = both(dir.path(), name, size, args);
        let (qa, qb) = (quota_files(&theirs), quota_files(&ours));
        assert_eq!(qa.len(), qb.len(), "{name}: quota files");
        assert_eq!(qa.is_empty(), !QUOTA_VARIANTS.iter().any(|v| v.0 == *name), "{name}: quota files");
        for ((ino, bytes, stat), (ino2, bytes2, stat2)) in qa.iter().zip(&qb) {
            assert_eq!(ino, ino2, "{name}: quota inode");
            assert!(bytes.len() >= 6 * 1024 && bytes == bytes2, "{name}: quota file in inode {ino} differs");
            assert_eq!(stat, stat2, "{name}: quota inode {ino}");
        }
        let (a, b) = (dump(&theirs) + &special_files(&theirs), dump(&ours) + &special_files(&ours));
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
    assert_eq!(special_files(&theirs), special_files(&ours));
    e2fsck_clean(&ours);
    // With bigalloc: the leaf block is taken once the fifth extent is, in the journal's
    // midst; 100 groups of 2 GiB, and clusters of 256 KiB.
    for (name, args) in [
        ("large_bigalloc", &["-t", "ext4", "-O", "bigalloc", "-E", "lazy_journal_init=1"][..]),
        ("large_256k", &["-t", "ext4", "-O", "bigalloc", "-C", "256k", "-E", "lazy_journal_init=1"]),
    ] {
        let (theirs, ours) = both(dir.path(), name, "200G", args);
        assert_eq!(dump(&theirs), dump(&ours), "{name}");
        assert_eq!(special_files(&theirs), special_files(&ours), "{name}");
        e2fsck_clean(&ours);
        std::fs::remove_file(&theirs).ok();
        std::fs::remove_file(&ours).ok();
    }
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
    // `-d`, as mkfs.ext4 spells --from.
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("x")).expect("mkdir");
    std::fs::write(src.join("x/f"), b"from -d").expect("write");
    ok(&rext4(&["mkfs", "-q", "-d", src.to_str().expect("utf-8 path"), p, "16M"]));
    assert_eq!(rext4(&["cat", &format!("{p}:/x/f")]).stdout, b"from -d");
    e2fsck_clean(&img);
    for bad in [
        &["mkfs", "-q", "-O", "no_such_feature", p, "8M"][..],
        &["mkfs", "-q", "-b", "3000", p, "8M"],
        &["mkfs", "-q", "-I", "128", "-O", "inline_data", p, "8M"],
        &["mkfs", "-q", "-I", "128", "-O", "quota,project", p, "8M"],
        &["mkfs", "-q", "-O", "quota", "-E", "quotatype=usr:other", p, "8M"],
        &["mkfs", "-q", "-O", "mmp", "-E", "mmp_update_interval=301", p, "8M"],
        &["mkfs", "-q", "-O", "mmp", "-E", "mmp_update_interval=soon", p, "8M"],
        &["mkfs", "-q", "-t", "ext5", p, "8M"],
        &["mkfs", "-q", "-E", "encoding=utf16", p, "8M"],
        &["mkfs", "-q", "-E", "encoding_flags=strict", p, "8M"],
        &["mkfs", "-q", "-O", "casefold", "-E", "encoding_flags=loose", p, "8M"],
        &["mkfs", "-q", p, "8X"],
        // Fewer inodes than the reserved ones and lost+found (mke2fs fails too).
        &["mkfs", "-q", "-N", "8", p, "2M"],
        // Clusters: not a power of two, below 2 KiB, smaller than the block, without bigalloc,
        // bigalloc without extents.
        &["mkfs", "-q", "-O", "bigalloc", "-C", "3000", p, "8M"],
        &["mkfs", "-q", "-O", "bigalloc", "-b", "1024", "-C", "1024", p, "8M"],
        &["mkfs", "-q", "-O", "bigalloc", "-b", "4096", "-C", "2048", p, "8M"],
        &["mkfs", "-q", "-C", "16384", p, "8M"],
        &["mkfs", "-q", "-t", "ext3", "-O", "bigalloc", p, "8M"],
        // Blocks per group: not a multiple of 8, below 256, past a bitmap block; errors.
        &["mkfs", "-q", "-g", "1001", p, "8M"],
        &["mkfs", "-q", "-g", "128", p, "8M"],
        &["mkfs", "-q", "-b", "4096", "-g", "40000", p, "8M"],
        &["mkfs", "-q", "-e", "ignore", p, "8M"],
        // Growth to less than the size; a stride that is no number.
        &["mkfs", "-q", "-E", "resize=1000", p, "64M"],
        &["mkfs", "-q", "-E", "stride=abc", p, "64M"],
        &["mkfs", "-q", "-O", "sparse_super2", "-E", "num_backup_sb=3", p, "64M"],
        // Orphan files of no blocks and of more than there are.
        &["mkfs", "-q", "-E", "orphan_file_size=0", p, "64M"],
        &["mkfs", "-q", "-E", "orphan_file_size=60M", p, "64M"],
        // A journal size whose blocks pass 32 bits.
        &["mkfs", "-q", "-J", "size=5000000", p, "64M"],
        // Journals over half the free blocks.
        &["mkfs", "-q", "-J", "size=40", p, "64M"],
        &["mkfs", "-q", "-O", "fast_commit", "-J", "fast_commit_size=40000", p, "64M"],
        &["mkfs", "-q", "-O", "quota,project", "-N", "12", p, "2M"],
    ] {
        let o = rext4(bad);
        assert!(!o.status.success(), "{bad:?} succeeded");
        // A refusal, not a crash.
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "{bad:?}: {:?}\n{err}", o.status);
    }
}

/// `mkfs -O quota,project --from` a tree whose files belong to several users and groups (by a
/// manifest): e2fsck, which recounts every id's usage, agrees with the quota files; each id
/// holds its own files; and the kernel reads the files (read-only where it lacks the quota
/// format).
#[test]
fn quota_images_are_filled_from_a_tree() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("d")).expect("mkdir");
    std::fs::create_dir_all(src.join("e")).expect("mkdir");
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(src.join("d/a"), &big).expect("write");
    std::fs::write(src.join("d/b"), b"small").expect("write");
    std::os::unix::fs::symlink("a", src.join("d/s")).expect("symlink");
    let mf = dir.path().join("manifest");
    std::fs::write(&mf, "/d/a 1234 55 0644\n/e 77 88 0755\n").expect("manifest");
    for (name, extra) in
        [("ext4", &["-t", "ext4", "-O", "quota,project"][..]), ("ext3", &["-t", "ext3", "-O", "quota"])]
    {
        let img = dir.path().join(format!("{name}.img"));
        let (s, m, i) =
            (src.to_str().expect("utf-8"), mf.to_str().expect("utf-8"), img.to_str().expect("utf-8"));
        let mut a = vec!["mkfs", "-q"];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--from", s, "--manifest", m, i, "64M"]);
        ok(&rext4(&a));
        e2fsck_clean(&img);
        let usage =
            |ty, id| rext4_testkit::quota_usage(&img, ty, id).unwrap_or_else(|| panic!("{name}: {ty} {id}"));
        let (space, inodes) = usage("user", 1234);
        assert_eq!(inodes, 1, "{name}");
        assert!((100_000..=110_000).contains(&space), "{name}: {space} bytes for a 100,000-byte file");
        assert_eq!(usage("group", 55), (space, 1), "{name}");
        assert_eq!(usage("user", 77).1, 1, "{name}");
        assert_eq!(usage("group", 88).1, 1, "{name}");
        // The root, lost+found, d, d/b and d/s.
        assert_eq!(usage("user", 0).1, 5, "{name}");
        if name == "ext4" {
            assert_eq!(usage("project", 0).1, 7, "{name}: every file is in project 0");
        }
        if let Some(why) = rext4_testkit::why_no_kernel_mount() {
            rext4_testkit::skip_note(module_path!(), line!(), "cannot loop-mount images here", why);
            continue;
        }
        let m = KernelMount::rw(&img).or_else(|_| KernelMount::ro(&img)).expect("kernel mount");
        assert_eq!(std::fs::read(m.path().join("d/a")).expect("read through the kernel"), big, "{name}");
        m.unmount().expect("unmount");
        e2fsck_clean(&img);
    }
}

/// An `mmp` image from `rext4 mkfs`: `rext4 info` shows its MMP block where dumpe2fs does, a
/// command writing into it takes and leaves the block as the kernel would (clean again), and
/// e2fsck agrees with the result.
#[test]
fn mmp_images_are_made_shown_and_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("m.img");
    let p = img.to_str().expect("utf-8 path");
    ok(&rext4(&["mkfs", "-q", "-O", "mmp", "-E", "mmp_update_interval=2", p, "64M"]));
    let info = String::from_utf8_lossy(&rext4(&["info", p]).stdout).into_owned();
    let block = rext4_testkit::sb_field(&img, "MMP block number");
    assert!(!block.is_empty());
    assert!(info.contains(&format!("MMP block number:         {block}\n")), "{info}");
    assert!(info.contains("MMP update interval:      2\n"), "{info}");
    let src = dir.path().join("f");
    std::fs::write(&src, b"under protection").expect("write source");
    ok(&rext4(&["cp", src.to_str().expect("utf-8 path"), &format!("{p}:/f")]));
    let o = Command::new(tool("debugfs")).args(["-R", "dump_mmp"]).arg(&img).output().expect("debugfs");
    let mmp = String::from_utf8_lossy(&o.stdout);
    assert!(mmp.contains("sequence: ff4d4d50"), "clean after the command: {mmp}");
    assert!(mmp.contains(&format!("device_name: {}", &p[..p.len().min(32)])), "{mmp}");
    let o = Command::new(tool("debugfs")).args(["-R", "cat /f"]).arg(&img).output().expect("debugfs");
    assert_eq!(o.stdout, b"under protection");
    e2fsck_clean(&img);
}

/// A `casefold` image from `rext4 mkfs`: `rext4 info` names its encoding as dumpe2fs does, and
/// a file copied in is found by e2fsprogs in a directory rext4 then casefolds.
#[test]
fn casefold_images_are_made_and_shown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("c.img");
    let p = img.to_str().expect("utf-8 path");
    ok(&rext4(&["mkfs", "-q", "-E", "encoding=utf8,encoding_flags=strict", p, "32M"]));
    let info = String::from_utf8_lossy(&rext4(&["info", p]).stdout).into_owned();
    assert_eq!(rext4_testkit::sb_field(&img, "Character encoding"), "utf8-12.1");
    assert!(info.contains("Character encoding:       utf8-12.1\n"), "{info}");
    assert!(info.contains("casefold"), "{info}");
    // dumpe2fs does not show the flags: `s_encoding` 1 and `s_encoding_flags` strict.
    let raw = std::fs::read(&img).expect("image");
    let sb = rext4::format::superblock::Superblock::parse(&raw[1024..2048]).expect("superblock");
    assert_eq!((sb.s_encoding.get(), sb.s_encoding_flags.get()), (1, 1));
    let src = dir.path().join("f");
    std::fs::write(&src, b"folded").expect("write source");
    ok(&rext4(&["cp", src.to_str().expect("utf-8 path"), &format!("{p}:/Readme")]));
    let o = Command::new(tool("debugfs")).args(["-R", "cat /Readme"]).arg(&img).output().expect("debugfs");
    assert_eq!(o.stdout, b"folded");
    e2fsck_clean(&img);
}

/// `rext4 mkfs -O journal_dev` makes the same bytes as `mke2fs -O journal_dev` (4 KiB and
/// 1 KiB blocks, sizes that pick each), and `rext4 mkfs -J device=` the same filesystem as
/// `mke2fs -J device=` (which takes only a block device: a loop device over its copy of the
/// journal) but for the device number it records, with the same users listed on the journal
/// device after; e2fsck with the journal device is clean, and the kernel mounts it with
/// `journal_path=` and reads a file rext4 wrote through the journal.
#[test]
fn external_journal_devices_match_mke2fs() {
    rext4_testkit::require_kernel!();
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("mke2fs.conf");
    std::fs::write(&conf, UPSTREAM_CONF).expect("write mke2fs.conf");
    let seed = format!("hash_seed={HASH_SEED}");
    let mke2fs = |args: &[&str]| {
        let o = Command::new(tool("mke2fs"))
            .args(["-q", "-F"])
            .args(args)
            .env("MKE2FS_CONFIG", &conf)
            .env("E2FSPROGS_FAKE_TIME", TIME)
            .output()
            .expect("mke2fs");
        assert!(o.status.success(), "mke2fs {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    let ours = |args: &[&str]| {
        ok(&Command::new(env!("CARGO_BIN_EXE_rext4"))
            .arg("mkfs")
            .arg("-q")
            .args(args)
            .env("E2FSPROGS_FAKE_TIME", TIME)
            .output()
            .expect("rext4 mkfs"))
    };
    for (name, size, extra) in [
        ("4k", "8M", &["-b", "4096"][..]),
        ("1k", "4M", &["-b", "1024"][..]),
        ("small", "8M", &[][..]),
        ("64m", "64M", &[][..]),
    ] {
        let (a, b) = (dir.path().join(format!("{name}.mke2fs")), dir.path().join(format!("{name}.rext4")));
        for p in [&a, &b] {
            std::fs::File::create(p).and_then(|f| f.set_len(size_bytes(size))).expect("create");
        }
        let common = |p: &Path| -> Vec<String> {
            let mut v: Vec<String> =
                ["-O", "journal_dev", "-U", UUID, "-E", &seed].iter().map(|s| s.to_string()).collect();
            v.extend(extra.iter().map(|s| s.to_string()));
            v.push(p.to_str().unwrap().to_string());
            v
        };
        mke2fs(&common(&a).iter().map(String::as_str).collect::<Vec<_>>());
        ours(&common(&b).iter().map(String::as_str).collect::<Vec<_>>());
        assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(), "{name}: journal devices differ");
    }

    // A filesystem on the 8 MiB journal device, each tool on its own copy.
    let (ja, jb) = (dir.path().join("4k.mke2fs"), dir.path().join("4k.rext4"));
    let (fa, fb) = (dir.path().join("fs.mke2fs"), dir.path().join("fs.rext4"));
    for p in [&fa, &fb] {
        std::fs::File::create(p).and_then(|f| f.set_len(64 << 20)).expect("create");
    }
    let o = Command::new(tool("losetup")).args(["-f", "--show"]).arg(&ja).output().expect("losetup");
    assert!(o.status.success());
    let lo = String::from_utf8(o.stdout).unwrap().trim().to_string();
    let args = |j: &str, f: &Path| -> Vec<String> {
        [
            "-t",
            "ext4",
            "-U",
            "21111111-2222-4333-8444-555555555555",
            "-E",
            &seed,
            "-J",
            &format!("device={j}"),
            f.to_str().unwrap(),
            "64M",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    mke2fs(&args(&lo, &fa).iter().map(String::as_str).collect::<Vec<_>>());
    let _ = Command::new(tool("losetup")).arg("-d").arg(&lo).status();
    ours(&args(jb.to_str().unwrap(), &fb).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        std::fs::read(&ja).unwrap() == std::fs::read(&jb).unwrap(),
        "journal devices after -J device= differ"
    );
    let strip =
        |s: String| s.lines().filter(|l| !l.starts_with("Journal device:")).collect::<Vec<_>>().join("\n");
    assert_eq!(strip(dump(&fa)), strip(dump(&fb)), "filesystems made with -J device= differ");
    let fsck = |f: &Path, j: &Path| {
        let o = Command::new(tool("e2fsck")).arg("-fn").arg("-j").arg(j).arg(f).output().expect("e2fsck");
        assert!(o.status.success(), "e2fsck {}: {}", f.display(), String::from_utf8_lossy(&o.stdout));
    };
    fsck(&fb, &jb);

    // Written through the journal by rext4, read by the kernel.
    let src = dir.path().join("hello");
    std::fs::write(&src, b"through a journal rext4 made\n").unwrap();
    ok(&rext4(&[
        "--journal",
        jb.to_str().unwrap(),
        "cp",
        src.to_str().unwrap(),
        &format!("{}:/hello", fb.display()),
    ]));
    fsck(&fb, &jb);
    let o = Command::new(tool("losetup")).args(["-f", "--show"]).arg(&jb).output().expect("losetup");
    let lo = String::from_utf8(o.stdout).unwrap().trim().to_string();
    let m = KernelMount::with_options(&fb, &format!("loop,journal_path={lo}")).expect("kernel mount");
    assert_eq!(std::fs::read(m.path().join("hello")).unwrap(), b"through a journal rext4 made\n");
    m.unmount().unwrap();
    let _ = Command::new(tool("losetup")).arg("-d").arg(&lo).status();
    fsck(&fb, &jb);
}

/// A small deterministic generator for `random_option_mixes_match_mke2fs` (xorshift64*).
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() % from.len() as u64) as usize]
    }
}

/// Options the variants above do not combine, mixed at random (a fixed sequence): block,
/// cluster, inode and image sizes, features on and off, flex group sizes and reserves. For
/// each mix, mke2fs and `rext4 mkfs` both refuse it, or make the same filesystem (`dumpe2fs`
/// and the special files' `debugfs stat`), e2fsck-clean.
#[test]
fn random_option_mixes_match_mke2fs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("mke2fs.conf");
    std::fs::write(&conf, UPSTREAM_CONF).expect("write mke2fs.conf");
    let mut rng = Mix(0x005e_ed0f_e2f5);
    let (mut made, mut refused, mut failures) = (0, 0, Vec::new());
    for case in 0..64 {
        let fs_type = rng.pick(&["ext4", "ext4", "ext4", "ext4", "ext2", "ext3"]);
        let mut args: Vec<String> = vec!["-t".into(), fs_type.into()];
        let bs = rng.pick(&["", "", "1024", "2048", "4096"]);
        if !bs.is_empty() {
            args.extend(["-b".into(), bs.into()]);
        }
        let size = rng.pick(&["3M", "8M", "20M", "64M", "100M", "300M", "600M", "1G", "3G", "10G"]);
        let mut features: Vec<&str> = Vec::new();
        for (f, p) in [
            ("bigalloc", 40),
            ("^flex_bg", 15),
            ("^has_journal", 10),
            ("inline_data", 25),
            ("^metadata_csum", 15),
            ("^64bit", 10),
            ("quota", 15),
            ("project", 10),
            ("^orphan_file", 10),
            ("encrypt", 10),
            ("large_dir", 10),
            ("^resize_inode", 10),
            ("^sparse_super", 5),
            ("^dir_index", 5),
            ("fast_commit", 10),
            ("sparse_super2", 8),
        ] {
            if rng.chance(p) {
                features.push(f);
            }
        }
        if features.contains(&"^resize_inode") && rng.chance(50) {
            features.push("meta_bg");
        }
        if fs_type != "ext4" && features.contains(&"bigalloc") {
            features.push("extent");
        }
        if !features.is_empty() {
            args.extend(["-O".into(), features.join(",")]);
        }
        if features.contains(&"bigalloc") && rng.chance(70) {
            let b: u64 = if bs.is_empty() { 4096 } else { bs.parse().expect("block size") };
            let shift = [0u32, 1, 2, 3, 4, 5, 6, 8][(rng.next() % 8) as usize];
            args.extend(["-C".into(), (b << shift).max(2048).to_string()]);
        }
        if rng.chance(20) {
            args.extend(["-I".into(), rng.pick(&["128", "512", "1024"]).into()]);
        }
        if rng.chance(20) {
            args.extend(["-i".into(), rng.pick(&["4096", "65536", "262144"]).into()]);
        }
        // Few inodes put lost+found and the orphan file in a later group.
        if rng.chance(25) {
            args.extend(["-N".into(), rng.pick(&["16", "100", "300", "5000"]).into()]);
        }
        if rng.chance(20) {
            args.extend(["-m".into(), rng.pick(&["0", "1", "10"]).into()]);
        }
        if rng.chance(10) {
            args.extend(["-g".into(), rng.pick(&["1024", "2048", "8192"]).into()]);
        }
        if rng.chance(15) && !features.contains(&"^flex_bg") {
            args.extend(["-G".into(), rng.pick(&["1", "4", "64"]).into()]);
        }
        let mut extended = format!("hash_seed={HASH_SEED},lazy_journal_init=1");
        if rng.chance(10) {
            extended += &format!(",stride={}", rng.pick(&["4", "7", "16"]));
        }
        if rng.chance(10) {
            extended += &format!(",resize={}", rng.pick(&["16G", "1T", "8000000"]));
        }
        args.extend(["-U".into(), UUID.into(), "-E".into(), extended]);
        let what = format!("case {case}: {size} {}", args.join(" "));
        let (theirs, ours) = (dir.path().join("mke2fs.img"), dir.path().join("rext4.img"));
        std::fs::File::create(&theirs).and_then(|f| f.set_len(size_bytes(size))).expect("create image");
        std::fs::remove_file(&ours).ok();
        let a = Command::new(tool("mke2fs"))
            .args(["-q", "-F"])
            .args(&args)
            .arg(&theirs)
            .arg(size)
            .env("MKE2FS_CONFIG", &conf)
            .env("E2FSPROGS_FAKE_TIME", TIME)
            .output()
            .expect("mke2fs");
        let b = Command::new(env!("CARGO_BIN_EXE_rext4"))
            .args(["mkfs", "-q"])
            .args(&args)
            .arg(&ours)
            .arg(size)
            .env("E2FSPROGS_FAKE_TIME", TIME)
            .output()
            .expect("rext4 mkfs");
        let err = String::from_utf8_lossy(&b.stderr).into_owned();
        assert!(!err.contains("panicked"), "{what}: {err}");
        match (a.status.success(), b.status.success()) {
            (false, false) => refused += 1,
            (true, true) => {
                made += 1;
                let (x, y) = (dump(&theirs) + &special_files(&theirs), dump(&ours) + &special_files(&ours));
                if x != y {
                    let first = x.lines().zip(y.lines()).find(|(p, q)| p != q);
                    failures.push(format!("{what}: differs first at {first:?}"));
                }
                e2fsck_clean(&ours);
            }
            (ok_a, _) => failures.push(format!(
                "{what}: mke2fs {}, rext4 {}: {}{err}",
                if ok_a { "made it" } else { "refused" },
                if ok_a { "refused" } else { "made it" },
                String::from_utf8_lossy(&a.stderr)
            )),
        }
    }
    eprintln!("{made} made alike, {refused} refused by both");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(made >= 40, "too few mixes made a filesystem: {made}");
}

/// The block numbers after "Superblock backups stored on blocks:" in `text` (mke2fs wraps
/// them over lines).
fn backups_listed(text: &str) -> Vec<u64> {
    let Some(at) = text.find("Superblock backups stored on blocks:") else { return Vec::new() };
    text[at..]
        .split_once(':')
        .map_or("", |(_, rest)| rest)
        .split(|c: char| c == ',' || c.is_whitespace())
        .map_while(|w| if w.is_empty() { Some(None) } else { w.parse().ok().map(Some) })
        .flatten()
        .collect()
}

/// `rext4 mkfs -n` writes nothing (no new image file appears, an existing image keeps its
/// bytes) and lists the backup superblocks where `mke2fs -n` lists them, the way to find
/// one to repair a damaged primary from.
#[test]
fn dry_run_writes_nothing_and_lists_the_backups_mke2fs_lists() {
    let dir = tempfile::tempdir().expect("tempdir");
    let existing = dir.path().join("existing.img");
    ok(&rext4(&["mkfs", "-q", existing.to_str().expect("utf-8 path"), "64M"]));
    let before = std::fs::read(&existing).expect("image");
    for (size, args) in [
        ("600M", &["-t", "ext4"][..]),
        ("3G", &["-t", "ext4", "-O", "^flex_bg"]),
        ("600M", &["-t", "ext4", "-b", "1024", "-O", "bigalloc"]),
        ("300M", &["-t", "ext2", "-O", "^sparse_super,^resize_inode"]),
        ("600M", &["-t", "ext4", "-O", "sparse_super2"]),
    ] {
        let theirs = dir.path().join("mke2fs.img");
        std::fs::File::create(&theirs).and_then(|f| f.set_len(size_bytes(size))).expect("create");
        let o =
            Command::new(tool("mke2fs")).args(["-F", "-n"]).args(args).arg(&theirs).output().expect("mke2fs");
        assert!(o.status.success(), "mke2fs -n {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        let want = backups_listed(&String::from_utf8_lossy(&o.stdout));
        assert!(!want.is_empty(), "mke2fs -n {args:?} listed no backups");
        let new = dir.path().join("new.img");
        let mut a = vec!["mkfs", "-n"];
        a.extend_from_slice(args);
        a.extend([new.to_str().expect("utf-8 path"), size]);
        let o = rext4(&a);
        ok(&o);
        assert_eq!(backups_listed(&String::from_utf8_lossy(&o.stdout)), want, "{size} {args:?}");
        assert!(!new.exists(), "-n made an image file");
        // On an existing image, grown to the size asked for, it writes nothing either.
        let mut a = vec!["mkfs", "-n"];
        a.extend_from_slice(args);
        a.extend([existing.to_str().expect("utf-8 path"), size]);
        let o = rext4(&a);
        ok(&o);
        assert_eq!(backups_listed(&String::from_utf8_lossy(&o.stdout)), want, "{size} {args:?}");
        assert!(std::fs::read(&existing).expect("image") == before, "-n changed the image");
    }
    e2fsck_clean(&existing);
}

/// `rext4 mkfs DISK@N` formats partition N in place, as `mkfs.ext4 /dev/sdaN` would: the
/// partition's size unless a smaller one is given (a larger one is refused), nothing outside
/// it written, `-n` writing nothing at all; a reproducible fill keeps `-M`'s directory. Each
/// partition, copied out, is e2fsck-clean, and the kernel reads it at its offset.
#[test]
fn partitions_are_formatted_in_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk).and_then(|f| f.set_len(200 << 20)).expect("disk");
    let mut c = Command::new(tool("sfdisk"))
        .args(["--quiet", "--no-reread", "--no-tell-kernel"])
        .arg(&disk)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("sfdisk");
    std::io::Write::write_all(c.stdin.as_mut().expect("stdin"), b"label: gpt\n,80M,L\n,,L\n")
        .expect("script");
    drop(c.stdin.take());
    assert!(c.wait().expect("sfdisk").success());
    // Where sfdisk put them: "disk.img1 : start=2048, size=163840, ..." in sectors.
    let dump = Command::new(tool("sfdisk")).arg("-d").arg(&disk).output().expect("sfdisk -d");
    let parts: Vec<(u64, u64)> = String::from_utf8_lossy(&dump.stdout)
        .lines()
        .filter(|l| l.contains("start="))
        .map(|l| {
            let field = |k: &str| -> u64 {
                let v = l.split(k).nth(1).expect("field").trim_start();
                v[..v.find(',').unwrap_or(v.len())].trim().parse::<u64>().expect("number") * 512
            };
            (field("start="), field("size="))
        })
        .collect();
    let [(p1, l1), (p2, l2)] = parts[..] else { panic!("two partitions: {parts:?}") };
    let d = disk.to_str().expect("utf-8 path");
    let before = std::fs::read(&disk).expect("disk");
    ok(&rext4(&["mkfs", "-n", &format!("{d}@2")]));
    assert!(std::fs::read(&disk).expect("disk") == before, "-n wrote to the disk");
    let big = rext4(&["mkfs", "-q", &format!("{d}@1"), "500M"]);
    assert!(!big.status.success(), "a filesystem larger than the partition was made");
    ok(&rext4(&["mkfs", "-q", &format!("{d}@2")]));
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    std::fs::write(src.join("f"), b"in partition 1").expect("write");
    let o = Command::new(env!("CARGO_BIN_EXE_rext4"))
        .args(["mkfs", "-q", "-t", "ext2", "-M", "/data", "--from", src.to_str().expect("utf-8 path")])
        .arg(format!("{d}@1"))
        .arg("64M")
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .output()
        .expect("rext4 mkfs");
    ok(&o);
    ok(&rext4(&["cp", "/etc/hostname", &format!("{d}@2:/h")]));
    let after = std::fs::read(&disk).expect("disk");
    let outside = |b: &[u8]| [b[..p1 as usize].to_vec(), b[(p2 + l2) as usize..].to_vec()].concat();
    assert!(outside(&after) == outside(&before), "bytes outside the partitions changed");
    assert!(
        after[(p1 + (64 << 20)) as usize..(p1 + l1) as usize]
            == before[(p1 + (64 << 20)) as usize..(p1 + l1) as usize],
        "the 64 MiB filesystem wrote past its size in partition 1"
    );
    for (n, start, len) in [(1, p1, 64u64 << 20), (2, p2, l2)] {
        let part = dir.path().join(format!("p{n}.img"));
        std::fs::write(&part, &after[start as usize..(start + len) as usize]).expect("copy out");
        e2fsck_clean(&part);
    }
    assert_eq!(rext4_testkit::sb_field(&dir.path().join("p1.img"), "Last mounted on"), "/data");
    rext4_testkit::require_kernel!();
    let m = KernelMount::with_options(&disk, &format!("loop,ro,offset={p1},sizelimit={}", 64u64 << 20))
        .expect("mount partition 1");
    assert_eq!(std::fs::read(m.path().join("f")).expect("read"), b"in partition 1");
    m.unmount().expect("unmount");
    let m = KernelMount::with_options(&disk, &format!("loop,ro,offset={p2},sizelimit={l2}"))
        .expect("mount partition 2");
    assert_eq!(
        std::fs::read(m.path().join("h")).expect("read"),
        std::fs::read("/etc/hostname").expect("hostname")
    );
    m.unmount().expect("unmount");
}
