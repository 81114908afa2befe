//! Oracle tests for the read path: images made by `mkfs.ext4 -d` from a generated tree, in
//! every feature variant that matters, read by rext4 and compared with the kernel's view of
//! the same image (all stat fields incl. inode numbers and nanosecond times, xattrs, link
//! targets, flags, statfs) and with the source tree (bytes, modes, owners, xattrs, links).
//! Where the kernel cannot mount (not root, no loop devices), the kernel half is skipped and
//! says so.

use rext4::Fs;
use rext4_testkit::*;
use std::ffi::OsStr;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

static FULL: OnceLock<SourceTree> = OnceLock::new();
static MEDIUM: OnceLock<SourceTree> = OnceLock::new();
static MEDIUM_1K: OnceLock<SourceTree> = OnceLock::new();
static MEDIUM_NO_TAILS: OnceLock<SourceTree> = OnceLock::new();

fn full() -> &'static SourceTree {
    source_tree(&FULL, "read_variants-full", TreeSpec::full())
}
fn medium() -> &'static SourceTree {
    source_tree(&MEDIUM, "read_variants-medium", TreeSpec::medium())
}
fn medium_1k() -> &'static SourceTree {
    source_tree(&MEDIUM_1K, "read_variants-medium-1k", TreeSpec::medium().small_blocks())
}
fn medium_no_tail_holes() -> &'static SourceTree {
    source_tree(
        &MEDIUM_NO_TAILS,
        "read_variants-medium-no-tails",
        TreeSpec { tail_holes: false, ..TreeSpec::medium() },
    )
}

const EXT4_INDEX_FL: u32 = 0x1000;
const EXT4_EXTENTS_FL: u32 = 0x80000;
const EXT4_INLINE_DATA_FL: u32 = 0x1000_0000;

/// One `mkfs.ext4` variant.
struct Variant {
    name: &'static str,
    args: &'static [&'static str],
    tree: &'static SourceTree,
    /// Run `e2fsck -fyD` so big directories become htree directories.
    reindex: bool,
    /// Features the image must / must not have (guards the fixture).
    on: &'static [&'static str],
    off: &'static [&'static str],
    /// Why the kernel may refuse to mount this image (the comparison is then against the
    /// source only).
    kernel_may_refuse: Option<&'static str>,
}

struct Built {
    _dir: tempfile::TempDir,
    img: PathBuf,
    fs: Fs,
    walk: Walk,
}

fn build(v: &Variant) -> Built {
    let t = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join(format!("{}.img", v.name));
    Image::ext4("1G").args(v.args).from_dir(&v.tree.dir).build(&img);
    if v.reindex {
        e2fsck_reindex(&img);
    }
    e2fsck_clean(&img);
    assert_features(&img, v.on, v.off);
    eprintln!("{}: image built and checked in {:?}", v.name, t.elapsed());
    let t = Instant::now();
    let fs = Fs::open(&img).unwrap_or_else(|e| panic!("rext4 cannot open the {} image: {e}", v.name));
    let walk = walk_rext4(&fs, None);
    eprintln!("{}: rext4 walk of {} paths in {:?}", v.name, walk.recs.len(), t.elapsed());
    Built { _dir: dir, img, fs, walk }
}

/// The whole oracle comparison for one variant.
fn check_variant(v: Variant) -> Built {
    let b = build(&v);
    let mut report = Report::default();
    let name = v.name;
    report.add(
        format!("{name}: rext4 vs source tree"),
        diff_source(&v.tree.walk, &b.walk, SourceCmp { mtime_ns: false }),
    );
    if v.reindex {
        let flags = b.walk.recs.get(b"/bigdir".as_slice()).and_then(|r| r.flags);
        assert!(
            flags.is_some_and(|f| f & EXT4_INDEX_FL != 0),
            "{name}: fixture: /bigdir should be an htree directory (flags {flags:x?})"
        );
    }
    let t = Instant::now();
    report.run(&format!("{name}: reads"), || read_checks(&b.fs, v.tree));
    report.run(&format!("{name}: readdir"), || {
        readdir_resume(&b.fs, "/bigdir", 37);
        readdir_resume(&b.fs, "/names", 1);
    });
    eprintln!("{name}: read and readdir checks in {:?}", t.elapsed());
    if kernel_can_mount() {
        match KernelMount::ro(&b.img) {
            Ok(m) => {
                let t = Instant::now();
                let k = walk_kernel(m.path());
                eprintln!("{name}: kernel walk of {} paths in {:?}", k.recs.len(), t.elapsed());
                report.add(format!("{name}: rext4 vs kernel"), diff_full("kernel", &k, "rext4", &b.walk));
                report.add(format!("{name}: statfs"), statfs_diff(&b.fs, m.path()));
                m.unmount().expect("umount");
            }
            Err(e) => {
                match v.kernel_may_refuse {
                    Some(why) => {
                        eprintln!("NOTE {name}: kernel refused the image ({why}); compared with the source only: {e}")
                    }
                    None => panic!("{name}: {e}"),
                }
            }
        }
    }
    let t = Instant::now();
    report.run(&format!("{name}: concurrent walks"), || concurrent_walks(&b.img, &b.fs, &b.walk, 8));
    eprintln!("{name}: 8 concurrent walks in {:?}", t.elapsed());
    report.finish();
    b
}

/// Reads `len` bytes at `off` through rext4, looping over short reads.
fn rext4_read(fs: &Fs, ino: rext4::InodeNo, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        match fs.read(ino, off + done as u64, &mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) => panic!("read inode {} at {}: {e}", ino.0, off + done as u64),
        }
    }
    buf.truncate(done);
    buf
}

/// Random positional reads of big and sparse files compared with the source bytes; reads at
/// and past EOF; `Read + Seek` on a `File`.
fn read_checks(fs: &Fs, tree: &SourceTree) {
    let mut rng = Rng::new(99);
    let files = [
        paths::BIG,
        paths::SPARSE_HEAD,
        paths::SPARSE_MULTI,
        paths::SPARSE_TAIL,
        paths::SPARSE_ALL,
        paths::SPARSE_FAR,
        paths::SPARSE_HUGE,
    ];
    let exists = |rel: &str| tree.walk.recs.contains_key(format!("/{rel}").as_bytes());
    for rel in files.into_iter().filter(|r| exists(r)) {
        let src = std::fs::File::open(tree.dir.join(rel)).expect("open source file");
        let size = src.metadata().expect("stat source").len();
        let attr = fs.metadata(format!("/{rel}")).unwrap_or_else(|e| panic!("{rel}: {e}"));
        assert_eq!(attr.size, size, "{rel}: size");
        for i in 0..120 {
            let off = match i % 4 {
                0 => rng.below(size + 1),
                1 => rng.below(size / 4096 + 1) * 4096,
                2 => size.saturating_sub(rng.below(70_000)),
                _ => rng.below(size.min(1 << 22)),
            };
            let len = match i % 3 {
                0 => rng.range(0, 4096),
                1 => rng.range(4096, 300_000),
                _ => rng.range(1, 17),
            } as usize;
            let got = rext4_read(fs, attr.ino, off, len);
            let want_len = len.min(size.saturating_sub(off) as usize);
            let mut want = vec![0u8; want_len];
            src.read_exact_at(&mut want, off).expect("read source");
            if got != want {
                let first = got.iter().zip(&want).position(|(a, b)| a != b);
                panic!(
                    "{rel}: read({off}, {len}) gave {} bytes, want {want_len}; first difference at {first:?}",
                    got.len()
                );
            }
        }
        // At and past EOF.
        let mut buf = [0u8; 100];
        for off in [size, size + 1, size + 4096, size + (1 << 40)] {
            let n = fs.read(attr.ino, off, &mut buf).unwrap_or_else(|e| panic!("{rel}: read at {off}: {e}"));
            assert_eq!(n, 0, "{rel}: read at {off} (size {size}) should give 0 bytes");
        }
        assert_eq!(fs.read(attr.ino, 0, &mut []).expect("empty read"), 0, "{rel}: empty buffer");
    }
    // Holes read as zeros (sparse/multi: data at 0..4096, then a hole up to 65539).
    let multi = fs.metadata(format!("/{}", paths::SPARSE_MULTI)).expect("stat multi");
    let hole = rext4_read(fs, multi.ino, 4096, 65_539 - 4096);
    assert_eq!(hole.len(), 65_539 - 4096);
    assert!(hole.iter().all(|&b| b == 0), "sparse/multi: hole is not zero");
    if exists(paths::SPARSE_ALL) {
        let all = fs.read_file(format!("/{}", paths::SPARSE_ALL)).expect("read all_hole");
        assert_eq!(all.len(), 3 << 20);
        assert!(all.iter().all(|&b| b == 0), "sparse/all_hole is not all zeros");
    }
    assert!(fs.read_file("/empty").expect("read empty").is_empty());

    // Read + Seek.
    let src = std::fs::read(tree.dir.join(paths::BIG)).expect("read source big.bin");
    let size = src.len() as u64;
    let mut f = fs.open_file("/big.bin").expect("open big.bin");
    assert_eq!(f.seek(SeekFrom::End(-100)).expect("seek end"), size - 100);
    let mut tail = Vec::new();
    f.read_to_end(&mut tail).expect("read tail");
    assert_eq!(tail, &src[src.len() - 100..], "Seek End -100 then read");
    assert_eq!(f.seek(SeekFrom::End(0)).expect("seek end"), size);
    let mut b = [0u8; 10];
    assert_eq!(f.read(&mut b).expect("read at EOF"), 0, "read at EOF");
    assert_eq!(f.seek(SeekFrom::End(1000)).expect("seek past end"), size + 1000);
    assert_eq!(f.read(&mut b).expect("read past EOF"), 0, "read past EOF");
    assert_eq!(f.seek(SeekFrom::Start(5000)).expect("seek start"), 5000);
    assert_eq!(f.seek(SeekFrom::Current(-1000)).expect("seek current"), 4000);
    f.read_exact(&mut b).expect("read after seek");
    assert_eq!(&b, &src[4000..4010]);
    assert!(f.seek(SeekFrom::Current(-100_000)).is_err(), "seeking before 0 must fail");
    let mut all = Vec::new();
    f.seek(SeekFrom::Start(0)).expect("rewind");
    let mut chunk = vec![0u8; 65_537];
    loop {
        let n = f.read(&mut chunk).expect("read chunk");
        if n == 0 {
            break;
        }
        all.extend_from_slice(&chunk[..n]);
    }
    assert!(all == src, "big.bin read in 64 KiB + 1 chunks differs from the source");
    assert_eq!(f.metadata().expect("File::metadata").size, size);
}

// ------------------------------------------------------------------------------------------
// The variants
// ------------------------------------------------------------------------------------------

/// `mkfs.ext4` with this machine's (Debian's) defaults: no `-O`.
#[test]
fn debian_defaults() {
    check_variant(Variant {
        name: "debian",
        args: &[],
        tree: full(),
        reindex: true,
        on: &["has_journal", "extent", "flex_bg", "metadata_csum", "64bit", "dir_index"],
        off: &["metadata_csum_seed", "orphan_file", "inline_data"],
        kernel_may_refuse: None,
    });
}

/// Upstream e2fsprogs 1.47 defaults add `metadata_csum_seed` and `orphan_file`.
#[test]
fn upstream_1_47_defaults() {
    check_variant(Variant {
        name: "upstream",
        args: &["-O", "metadata_csum_seed,orphan_file"],
        tree: full(),
        reindex: true,
        on: &["metadata_csum_seed", "orphan_file", "metadata_csum", "extent"],
        off: &[],
        kernel_may_refuse: None,
    });
}

/// ext2: block maps, no journal; directories left linear (no reindex).
#[test]
fn ext2_block_maps() {
    let b = check_variant(Variant {
        name: "ext2",
        args: &["-t", "ext2"],
        tree: medium(),
        reindex: false,
        on: &[],
        off: &["has_journal", "extent", "flex_bg", "metadata_csum"],
        kernel_may_refuse: None,
    });
    let extents = b.walk.recs.values().filter(|r| r.flags.is_some_and(|f| f & EXT4_EXTENTS_FL != 0)).count();
    assert_eq!(extents, 0, "ext2: no inode may use extents");
}

/// ext3: block maps with a journal, htree directories.
#[test]
fn ext3() {
    check_variant(Variant {
        name: "ext3",
        args: &["-t", "ext3"],
        tree: medium(),
        reindex: true,
        on: &["has_journal", "dir_index"],
        off: &["extent", "metadata_csum"],
        kernel_may_refuse: None,
    });
}

/// 1 KiB blocks: two-level htree for the big directory, triple-indirect-range offsets.
#[test]
fn block_size_1k() {
    let b = check_variant(Variant {
        name: "1k",
        args: &["-b", "1024"],
        tree: medium_1k(),
        reindex: true,
        on: &["extent", "metadata_csum"],
        off: &[],
        kernel_may_refuse: None,
    });
    assert_eq!(htree_levels(&b.img, "/bigdir"), Some(1), "fixture: /bigdir should be a two-level htree");
}

/// 64 KiB blocks. The kernel mounts ext4 only with block size <= page size (it says "bad
/// block size 65536" on x86-64), so unless it can, rext4 is compared with the source only.
#[test]
fn block_size_64k() {
    check_variant(Variant {
        name: "64k",
        args: &["-b", "65536"],
        tree: medium(),
        reindex: true,
        on: &["extent"],
        off: &[],
        kernel_may_refuse: Some("block size larger than the page size"),
    });
}

/// bigalloc, 64 KiB clusters of 4 KiB blocks: files start on cluster boundaries, block
/// bitmaps and free counts count clusters (statfs compared with the kernel's).
#[test]
fn bigalloc() {
    check_variant(Variant {
        name: "bigalloc",
        args: &["-O", "bigalloc", "-C", "65536"],
        tree: medium(),
        reindex: true,
        on: &["bigalloc", "extent", "metadata_csum"],
        off: &[],
        kernel_may_refuse: None,
    });
}

/// bigalloc with 1 KiB blocks in 16 KiB clusters: the filesystem starts at block 0 (a boot
/// block, then the superblock at block 1 and the descriptors after it).
#[test]
fn bigalloc_1k() {
    let b = check_variant(Variant {
        name: "bigalloc-1k",
        args: &["-b", "1024", "-O", "bigalloc", "-C", "16384"],
        tree: medium_1k(),
        reindex: true,
        on: &["bigalloc", "extent"],
        off: &[],
        kernel_may_refuse: None,
    });
    assert_eq!(sb_field(&b.img, "First block"), "0", "fixture");
}

/// 128-byte inodes: no extra fields (no nanoseconds, no crtime, no in-inode xattrs).
#[test]
fn inode_size_128() {
    let b = check_variant(Variant {
        name: "i128",
        args: &["-I", "128"],
        tree: medium(),
        reindex: true,
        on: &["extent"],
        off: &[],
        kernel_may_refuse: None,
    });
    assert!(b.walk.recs.values().all(|r| r.crtime.is_none()), "128-byte inodes have no crtime");
}

/// No metadata_csum: group descriptors use the older gdt_csum (uninit_bg).
#[test]
fn no_metadata_csum() {
    check_variant(Variant {
        name: "nocsum",
        args: &["-O", "^metadata_csum,uninit_bg"],
        tree: medium(),
        reindex: true,
        on: &["uninit_bg", "extent"],
        off: &["metadata_csum"],
        kernel_may_refuse: None,
    });
}

/// inline_data: small files and small directories live in the inode. (The tree has no files
/// ending in holes: `mkfs.ext4` 1.47.0 mangles those with inline_data, see the next test.)
#[test]
fn inline_data() {
    let b = check_variant(Variant {
        name: "inline",
        args: &["-O", "inline_data"],
        tree: medium_no_tail_holes(),
        reindex: true,
        on: &["inline_data"],
        off: &[],
        kernel_may_refuse: None,
    });
    let inline = |k: Kind| {
        b.walk
            .recs
            .values()
            .filter(|r| r.kind == k && r.flags.is_some_and(|f| f & EXT4_INLINE_DATA_FL != 0))
            .count()
    };
    let (files, dirs) = (inline(Kind::File), inline(Kind::Dir));
    assert!(files >= 300, "fixture: only {files} inline files");
    assert!(dirs >= 30, "fixture: only {dirs} inline directories");
}

/// `mkfs.ext4 -d -O inline_data` (1.47.0) turns a file that is all hole into an inline file
/// whose i_size (3 MiB) is far beyond its 60 inline bytes, and cuts a trailing hole off other
/// files. `e2fsck -fn` passes such images and the kernel reads the all-hole file as 3 MiB of
/// zeros; rext4 must read them as the kernel does.
#[test]
fn inline_data_files_ending_in_holes() {
    let src = tempfile::tempdir().expect("tempdir");
    let data: Vec<u8> = (0..7000u32).map(|i| (i % 251) as u8).collect();
    let f = std::fs::File::create(src.path().join("tail_hole")).expect("create");
    f.write_all_at(&data, 0).expect("write");
    f.set_len((8 << 20) + 5).expect("truncate");
    let f = std::fs::File::create(src.path().join("all_hole")).expect("create");
    f.set_len(3 << 20).expect("truncate");
    std::fs::write(src.path().join("tiny"), b"tiny").expect("write");
    drop(f);
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("inline-holes.img");
    Image::ext4("64M").features("inline_data").from_dir(src.path()).build(&img);
    e2fsck_clean(&img);
    let fs = Fs::open(&img).expect("open image");
    let walk = walk_rext4(&fs, None);
    let mut report = Report::default();
    if kernel_can_mount() {
        let m = KernelMount::ro(&img).expect("mount");
        let k = walk_kernel(m.path());
        report.add("rext4 vs kernel", diff_full("kernel", &k, "rext4", &walk));
        for name in ["all_hole", "tail_hole", "tiny"] {
            let want = std::fs::read(m.path().join(name)).expect("kernel read");
            match fs.read_file(format!("/{name}")) {
                Ok(got) if got == want => {}
                Ok(got) => {
                    report.add(name, vec![format!("rext4 read {} bytes, kernel {}", got.len(), want.len())])
                }
                Err(e) => report
                    .add(name, vec![format!("rext4 read fails: {e} (kernel reads {} bytes)", want.len())]),
            }
        }
    } else {
        report.add("rext4 walk", walk.problems.clone());
    }
    report.finish();
}

/// ea_inode with 1 KiB blocks: the 3000-byte `user.big` value fits neither the inode nor an
/// xattr block, so it goes to an EA inode.
#[test]
fn ea_inode() {
    let b = check_variant(Variant {
        name: "ea_inode",
        args: &["-b", "1024", "-O", "ea_inode"],
        tree: medium(),
        reindex: true,
        on: &["ea_inode"],
        off: &[],
        kernel_may_refuse: None,
    });
    let o = std::process::Command::new(tool("debugfs"))
        .arg("-R")
        .arg("stat /xattr/big")
        .arg(&b.img)
        .output()
        .expect("debugfs");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("File ACL: 0"), "fixture: /xattr/big should have no xattr block:\n{text}");
}

/// large_dir (3-level htree allowed, > 2 GiB directories).
#[test]
fn large_dir() {
    check_variant(Variant {
        name: "large_dir",
        args: &["-O", "large_dir"],
        tree: medium(),
        reindex: true,
        on: &["large_dir"],
        off: &[],
        kernel_may_refuse: None,
    });
}

/// 32-bit block numbers and 32-byte group descriptors.
#[test]
fn no_64bit() {
    check_variant(Variant {
        name: "no64",
        args: &["-O", "^64bit"],
        tree: medium(),
        reindex: true,
        on: &["extent"],
        off: &["64bit"],
        kernel_may_refuse: None,
    });
}

/// meta_bg group descriptor layout (needs resize_inode off).
#[test]
fn meta_bg() {
    check_variant(Variant {
        name: "meta_bg",
        args: &["-O", "meta_bg,^resize_inode"],
        tree: medium(),
        reindex: true,
        on: &["meta_bg"],
        off: &["resize_inode"],
        kernel_may_refuse: None,
    });
}

/// ext4 without extents (block maps with flex_bg and metadata_csum); 64bit requires extents.
#[test]
fn ext4_no_extent() {
    let b = check_variant(Variant {
        name: "noextent",
        args: &["-O", "^extent,^64bit"],
        tree: medium(),
        reindex: true,
        on: &["metadata_csum", "flex_bg"],
        off: &["extent", "64bit"],
        kernel_may_refuse: None,
    });
    let extents = b.walk.recs.values().filter(|r| r.flags.is_some_and(|f| f & EXT4_EXTENTS_FL != 0)).count();
    assert_eq!(extents, 0, "no inode may use extents");
}

// ------------------------------------------------------------------------------------------
// Error semantics
// ------------------------------------------------------------------------------------------

fn rerr<T>(r: rext4::Result<T>) -> Result<(), i32> {
    r.map(drop).map_err(|e| e.errno())
}

fn kerr<T>(r: std::io::Result<T>) -> Result<(), i32> {
    r.map(drop).map_err(|e| e.raw_os_error().unwrap_or(-1))
}

/// Errnos for bad paths and bad operations: rext4 must give what the kernel gives (and what
/// POSIX says, where the kernel cannot be asked).
#[test]
fn error_semantics() {
    let tree = medium();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("errors.img");
    Image::ext4("1G").from_dir(&tree.dir).build(&img);
    e2fsck_reindex(&img);
    e2fsck_clean(&img);
    let fs = Fs::open(&img).expect("open image");
    let mount = if kernel_can_mount() { Some(KernelMount::ro(&img).expect("mount")) } else { None };
    let k =
        |rel: &str| -> Option<PathBuf> { mount.as_ref().map(|m| m.path().join(rel.trim_start_matches('/'))) };
    let mut failures = Vec::new();
    let mut check =
        |what: &str, want: Result<(), i32>, got: Result<(), i32>, kernel: Option<Result<(), i32>>| {
            if got != want {
                failures.push(format!("{what}: rext4 gives {got:?}, want {want:?}"));
            }
            if let Some(kr) = kernel {
                if kr != want {
                    failures.push(format!(
                        "{what}: the kernel gives {kr:?} (test expectation {want:?} is wrong)"
                    ));
                }
            }
        };
    use libc::{EINVAL, EISDIR, ELOOP, ENAMETOOLONG, ENODATA, ENOENT, ENOTDIR, EOPNOTSUPP};
    let lstat = |p: &str| k(p).map(|p| kerr(std::fs::symlink_metadata(p)));
    let stat = |p: &str| k(p).map(|p| kerr(std::fs::metadata(p)));

    check("lstat /missing", Err(ENOENT), rerr(fs.symlink_metadata("/missing")), lstat("/missing"));
    check("stat /tree/missing/x", Err(ENOENT), rerr(fs.metadata("/tree/missing/x")), stat("/tree/missing/x"));
    check("lookup(root, missing)", Err(ENOENT), rerr(fs.lookup(fs.root(), b"missing")), None);
    check("lstat /file/x", Err(ENOTDIR), rerr(fs.symlink_metadata("/file/x")), lstat("/file/x"));
    check("lstat /file/", Err(ENOTDIR), rerr(fs.symlink_metadata("/file/")), lstat("/file/"));
    check(
        "lstat /links/fast/ (symlink to a file)",
        Err(ENOTDIR),
        rerr(fs.symlink_metadata("/links/fast/")),
        lstat("/links/fast/"),
    );
    let file = fs.metadata("/file").expect("stat /file");
    check("lookup(file, x)", Err(ENOTDIR), rerr(fs.lookup(file.ino, b"x")), None);
    check("readdir(file)", Err(ENOTDIR), rerr(fs.readdir(file.ino, 0, |_| true)), None);
    check(
        "read_dir /file",
        Err(ENOTDIR),
        rerr(fs.read_dir("/file")),
        k("/file").map(|p| kerr(std::fs::read_dir(p))),
    );
    let long = format!("/{}", "a".repeat(256));
    check("lstat 256-byte name", Err(ENAMETOOLONG), rerr(fs.symlink_metadata(&long)), lstat(&long));
    check("lookup 256-byte name", Err(ENAMETOOLONG), rerr(fs.lookup(fs.root(), &[b'a'; 256])), None);
    let long_mid = format!("/tree/{}/x", "b".repeat(256));
    check(
        "lstat 256-byte middle component",
        Err(ENAMETOOLONG),
        rerr(fs.symlink_metadata(&long_mid)),
        lstat(&long_mid),
    );
    let ok255 = format!("/names/{}", "m".repeat(254));
    check("lstat 254-byte name", Ok(()), rerr(fs.symlink_metadata(&ok255)), lstat(&ok255));
    check("stat symlink loop", Err(ELOOP), rerr(fs.metadata("/links/loop_a")), stat("/links/loop_a"));
    check("lstat symlink loop", Ok(()), rerr(fs.symlink_metadata("/links/loop_a")), lstat("/links/loop_a"));
    check(
        "lstat through a loop",
        Err(ELOOP),
        rerr(fs.symlink_metadata("/links/loop_a/x")),
        lstat("/links/loop_a/x"),
    );
    check("stat self loop", Err(ELOOP), rerr(fs.metadata("/links/self")), stat("/links/self"));
    check("stat chain of 41 links", Err(ELOOP), rerr(fs.metadata("/links/chain00")), stat("/links/chain00"));
    check("stat chain of 40 links", Ok(()), rerr(fs.metadata("/links/chain01")), stat("/links/chain01"));
    check("stat dangling", Err(ENOENT), rerr(fs.metadata("/links/dangling")), stat("/links/dangling"));
    check("lstat dangling", Ok(()), rerr(fs.symlink_metadata("/links/dangling")), lstat("/links/dangling"));
    check(
        "open dangling",
        Err(ENOENT),
        rerr(fs.open_file("/links/dangling")),
        k("/links/dangling").map(|p| kerr(std::fs::File::open(p))),
    );
    let tree_dir = fs.metadata("/tree").expect("stat /tree");
    let mut buf = [0u8; 16];
    check("read(dir)", Err(EISDIR), rerr(fs.read(tree_dir.ino, 0, &mut buf)), None);
    check(
        "read_file /tree",
        Err(EISDIR),
        rerr(fs.read_file("/tree")),
        k("/tree").map(|p| kerr(std::fs::read(p))),
    );
    let kx = |rel: &str, name: &str| {
        k(rel).map(|p| match xattr::get(p, name) {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(ENODATA),
            Err(e) => Err(e.raw_os_error().unwrap_or(-1)),
        })
    };
    let small = fs.metadata("/xattr/small").expect("stat xattr/small");
    check(
        "getxattr missing",
        Err(ENODATA),
        rerr(fs.getxattr(small.ino, b"user.nope")),
        kx("/xattr/small", "user.nope"),
    );
    check("getxattr present", Ok(()), rerr(fs.getxattr(small.ino, b"user.a")), kx("/xattr/small", "user.a"));
    check(
        "getxattr unknown namespace",
        Err(EOPNOTSUPP),
        rerr(fs.getxattr(small.ino, b"nosuch.a")),
        kx("/xattr/small", "nosuch.a"),
    );
    check(
        "getxattr no ACL",
        Err(ENODATA),
        rerr(fs.getxattr(file.ino, b"system.posix_acl_access")),
        kx("/file", "system.posix_acl_access"),
    );
    check(
        "readlink(regular file)",
        Err(EINVAL),
        rerr(fs.readlink(file.ino)),
        k("/file").map(|p| kerr(std::fs::read_link(p))),
    );
    check(
        "read_link /tree",
        Err(EINVAL),
        rerr(fs.read_link("/tree")),
        k("/tree").map(|p| kerr(std::fs::read_link(p))),
    );
    if !failures.is_empty() {
        panic!("{} errno mismatch(es):\n  {}", failures.len(), failures.join("\n  "));
    }

    // Successful resolutions land on the right inode.
    let same = |a: &str, b: &str| {
        let (x, y) = (fs.metadata(a), fs.metadata(b));
        match (x, y) {
            (Ok(x), Ok(y)) => assert_eq!(x.ino, y.ino, "{a} and {b} should be the same inode"),
            (x, y) => panic!("{a}: {x:?}, {b}: {y:?}"),
        }
    };
    same("/links/chain01", "/file");
    same("/links/fast", "/file");
    same("/links/abs_file", "/file"); // absolute targets resolve inside the image
    same("/tree/../file", "/file");
    same("/../../file", "/file");
    same("/./tree/./", "/tree");
    same("//tree///", "/tree");
    same("/links/to_deep/l00/f", "/deep/l00/f");
    same("/links/abs_dir/a_link", "/hard/a");
    assert_eq!(fs.resolve("/", true).expect("resolve /"), fs.root());
    assert_eq!(fs.read_link("/links/dangling").expect("read_link").as_os_str().as_bytes(), b"does/not/exist");
    let read = fs.read_file("/links/chain01").expect("read through 40 links");
    assert_eq!(read, b"hello, ext4\n");
    // Symlink metadata is the link's own.
    let l = fs.symlink_metadata("/links/len60").expect("lstat len60");
    assert_eq!(l.kind, rext4::FileType::Symlink);
    assert_eq!(l.size, 60);
    let t = fs.read_link(Path::new(OsStr::from_bytes(b"/links/len60"))).expect("read_link len60");
    assert_eq!(t.as_os_str().len(), 60);
    drop(mount);
}
