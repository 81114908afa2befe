//! Oracle tests for images the Linux kernel wrote: `mkfs.ext4` makes an empty image, the
//! kernel mounts it read-write and gets a generated tree written into it with `std::fs`
//! (xattrs, ACLs, hard links, symlinks, a 12,000-entry directory, sparse, fallocate'd and
//! punched files, nanosecond times), then unlinks, renames and truncates; after unmounting,
//! rext4's view must equal a fresh read-only kernel mount's and the source tree's.
//! These tests need loop mounts: without them they skip and say so.

use rext4::Fs;
use rext4_testkit::*;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

static SOURCE: OnceLock<SourceTree> = OnceLock::new();
static SOURCE_NO_EXTRAS: OnceLock<SourceTree> = OnceLock::new();

fn spec() -> TreeSpec {
    TreeSpec { kernel_extras: true, ..TreeSpec::full() }
}

/// The tree the kernel is given, generated and mutated the same way on the host.
fn source() -> &'static SourceTree {
    mutated_source_tree(&SOURCE, "kernel_written", spec())
}

/// For block-mapped files, which cannot fallocate: the medium tree without the extras.
fn source_no_extras() -> &'static SourceTree {
    mutated_source_tree(&SOURCE_NO_EXTRAS, "kernel_written-no-extras", TreeSpec::medium())
}

/// Makes an empty image with `args`, lets the kernel write the tree into it, and compares.
fn kernel_writes(name: &str, src: &SourceTree, args: &[&str], on: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join(format!("{name}.img"));
    Image::ext4("1G").args(args).build(&img);
    assert_features(&img, on, &[]);
    let t = Instant::now();
    {
        let m = KernelMount::rw(&img).unwrap_or_else(|e| panic!("{name}: {e}"));
        generate(m.path(), &src.spec);
        mutate(m.path(), &src.spec);
        m.unmount().unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    eprintln!("{name}: kernel wrote the tree in {:?}", t.elapsed());
    e2fsck_clean(&img);
    let fs = Fs::open(&img).unwrap_or_else(|e| panic!("{name}: rext4 cannot open the image: {e}"));
    let t = Instant::now();
    let walk = walk_rext4(&fs, None);
    eprintln!("{name}: rext4 walk of {} paths in {:?}", walk.recs.len(), t.elapsed());
    let mut report = Report::default();
    report.add(
        format!("{name}: rext4 vs source tree"),
        diff_source(&src.walk, &walk, SourceCmp { mtime_ns: true }),
    );
    let m = KernelMount::ro(&img).unwrap_or_else(|e| panic!("{name}: {e}"));
    let k = walk_kernel(m.path());
    report.add(format!("{name}: rext4 vs kernel"), diff_full("kernel", &k, "rext4", &walk));
    report.add(format!("{name}: statfs"), statfs_diff(&fs, m.path()));
    m.unmount().expect("umount");
    let bigdir = walk.recs.get(b"/bigdir".as_slice()).and_then(|r| r.flags);
    if bigdir.is_none_or(|f| f & 0x1000 == 0) {
        report.add(
            format!("{name}: fixture"),
            vec![format!("/bigdir is not an htree directory ({bigdir:x?})")],
        );
    }
    report.run(&format!("{name}: readdir"), || {
        readdir_resume(&fs, "/bigdir", 41);
        readdir_resume(&fs, "/tree", 1);
    });
    report.run(&format!("{name}: concurrent walks"), || concurrent_walks(&img, &fs, &walk, 8));
    report.finish();
}

/// The kernel writes into an image with this machine's (Debian's) mkfs defaults.
#[test]
fn kernel_written_debian_defaults() {
    require_kernel!();
    kernel_writes("debian", source(), &[], &["metadata_csum", "extent", "64bit"]);
}

/// ... with upstream 1.47 defaults (`metadata_csum_seed`, `orphan_file`).
#[test]
fn kernel_written_upstream_defaults() {
    require_kernel!();
    kernel_writes(
        "upstream",
        source(),
        &["-O", "metadata_csum_seed,orphan_file"],
        &["metadata_csum_seed", "orphan_file"],
    );
}

/// ... with inline_data: the kernel keeps small files and new directories in the inode.
#[test]
fn kernel_written_inline_data() {
    require_kernel!();
    kernel_writes("inline", source(), &["-O", "inline_data"], &["inline_data"]);
}

/// ... with bigalloc (16 KiB clusters): the kernel's partial clusters, fallocated and
/// punched ranges, read back by rext4 read-only.
#[test]
fn kernel_written_bigalloc() {
    require_kernel!();
    kernel_writes("bigalloc", source(), &["-O", "bigalloc", "-C", "16384"], &["bigalloc"]);
}

/// ... as ext3 (block maps, written and freed by the kernel's indirect-block code).
#[test]
fn kernel_written_ext3() {
    require_kernel!();
    kernel_writes("ext3", source_no_extras(), &["-t", "ext3"], &["has_journal"]);
}

/// `debugfs dump_extents` of `path` (the "Flags" column says "Uninit" for unwritten extents).
fn dump_extents(img: &Path, path: &str) -> String {
    let o = Command::new(tool("debugfs"))
        .arg("-R")
        .arg(format!("dump_extents {path}"))
        .arg(img)
        .output()
        .expect("debugfs");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Unwritten extents from `fallocate(1)` read as zeros, with the right size and block count;
/// written ranges inside them read back their bytes.
#[test]
fn unwritten_extents_read_as_zeros() {
    require_kernel!();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("falloc.img");
    Image::ext4("256M").build(&img);
    let data: Vec<u8> = (0..12_345u32).map(|i| (i * 7 % 253) as u8 + 1).collect();
    {
        let m = KernelMount::rw(&img).expect("mount rw");
        let p = |n: &str| m.path().join(n);
        let fallocate = |args: &[&str], file: &Path| {
            let o = Command::new(tool("fallocate")).args(args).arg(file).output().expect("run fallocate");
            assert!(o.status.success(), "fallocate {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        };
        fallocate(&["-l", "1M"], &p("one_mib"));
        fallocate(&["-l", "4M"], &p("partly_written"));
        let f = std::fs::OpenOptions::new().write(true).open(p("partly_written")).expect("open");
        std::os::unix::fs::FileExt::write_all_at(&f, &data, (1 << 20) + 5).expect("write");
        drop(f);
        std::fs::write(p("keep_size"), &data[..100]).expect("write");
        fallocate(&["-n", "-l", "2M"], &p("keep_size"));
        fallocate(&["-o", "3M", "-l", "1M"], &p("offset_only"));
        m.unmount().expect("umount");
    }
    e2fsck_clean(&img);
    for f in ["/one_mib", "/partly_written", "/keep_size", "/offset_only"] {
        let ext = dump_extents(&img, f);
        assert!(ext.contains("Uninit"), "fixture: {f} should have unwritten extents:\n{ext}");
    }
    let fs = Fs::open(&img).expect("open image");
    let one = fs.metadata("/one_mib").expect("stat one_mib");
    assert_eq!(one.size, 1 << 20);
    assert_eq!(one.blocks, 2048, "1 MiB allocated = 2048 sectors");
    let bytes = fs.read_file("/one_mib").expect("read one_mib");
    assert_eq!(bytes.len(), 1 << 20);
    assert!(bytes.iter().all(|&b| b == 0), "unwritten extent must read as zeros");

    let pw = fs.read_file("/partly_written").expect("read partly_written");
    assert_eq!(pw.len(), 4 << 20);
    let at = (1 << 20) + 5;
    assert!(pw[..at].iter().all(|&b| b == 0), "zeros before the written range");
    assert_eq!(&pw[at..at + data.len()], &data[..], "written range inside an unwritten extent");
    assert!(pw[at + data.len()..].iter().all(|&b| b == 0), "zeros after the written range");

    let ks = fs.read_file("/keep_size").expect("read keep_size");
    assert_eq!(ks, &data[..100], "blocks preallocated past EOF must not show");
    let ks_attr = fs.metadata("/keep_size").expect("stat keep_size");
    assert_eq!(ks_attr.size, 100);
    assert!(ks_attr.blocks >= 4096, "preallocated blocks past EOF are counted ({})", ks_attr.blocks);

    let oo = fs.read_file("/offset_only").expect("read offset_only");
    assert_eq!(oo.len(), 4 << 20);
    assert!(oo.iter().all(|&b| b == 0), "hole then unwritten extent read as zeros");

    let m = KernelMount::ro(&img).expect("mount ro");
    let k = walk_kernel(m.path());
    let r = walk_rext4(&fs, None);
    let mut report = Report::default();
    report.add("rext4 vs kernel", diff_full("kernel", &k, "rext4", &r));
    report.add("statfs", statfs_diff(&fs, m.path()));
    report.finish();
}
