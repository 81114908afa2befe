//! Shared fixtures for the oracle tests: a deterministic source-tree generator, `mkfs.ext4` /
//! `e2fsck` / kernel-mount helpers, walkers that describe a tree as the kernel and as rext4 see
//! it, and diffs between those descriptions.
//!
//! Oracles: the source tree (bytes, modes, owners, xattrs, link targets, hard-link groups), the
//! Linux kernel's ext4 driver (everything `lstat`/`statx`/`getxattr`/`FS_IOC_GETFLAGS` report,
//! incl. inode numbers and nanosecond times) and `e2fsck -fn` (the fixtures themselves).
//!
//! Generated source trees live in `$CARGO_TARGET_TMPDIR/rext4-trees/` (one per test binary and
//! spec, regenerated on every run); images and mount points are temporary directories.
#![allow(dead_code)]

use rext4::{Attr, FileType, Fs};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, FileExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

// ------------------------------------------------------------------------------------------
// Deterministic PRNG (splitmix64)
// ------------------------------------------------------------------------------------------

/// A small deterministic generator: the same seed gives the same tree on every machine.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (0 if `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.fill(&mut v);
        v
    }
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

// ------------------------------------------------------------------------------------------
// Tools
// ------------------------------------------------------------------------------------------

/// Finds a tool on `PATH` or in the sbin directories.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    dirs.extend(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from));
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// Finds an e2fsprogs / util-linux tool; these tests cannot run without it.
pub fn tool(name: &str) -> PathBuf {
    find_tool(name)
        .unwrap_or_else(|| panic!("{name} is required for these tests (install e2fsprogs / util-linux)"))
}

fn run(cmd: &mut Command) -> std::process::Output {
    match cmd.output() {
        Ok(o) => o,
        Err(e) => panic!("cannot run {cmd:?}: {e}"),
    }
}

fn out_text(o: &std::process::Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `mkfs.ext4 -q -F [-d src] EXTRA... img size`; panics (with mkfs's output) on failure.
pub fn mkfs(src: Option<&Path>, img: &Path, extra: &[&str], size: &str) {
    let mut c = Command::new(tool("mkfs.ext4"));
    c.args(["-q", "-F"]);
    if let Some(s) = src {
        c.arg("-d").arg(s);
    }
    c.args(extra).arg(img).arg(size);
    let o = run(&mut c);
    assert!(o.status.success(), "mkfs.ext4 {extra:?} failed:\n{}", out_text(&o));
}

/// Asserts `e2fsck -fn img` finds nothing to fix.
pub fn e2fsck_clean(img: &Path) {
    let o = run(Command::new(tool("e2fsck")).arg("-fn").arg(img));
    assert_eq!(o.status.code(), Some(0), "e2fsck -fn {} is not clean:\n{}", img.display(), out_text(&o));
}

/// `e2fsck -fyD`: rebuilds every directory, turning big ones into htree (hash-indexed)
/// directories, which `mkfs.ext4 -d` does not build by itself.
pub fn e2fsck_reindex(img: &Path) {
    let o = run(Command::new(tool("e2fsck")).arg("-fyD").arg(img));
    assert!(
        matches!(o.status.code(), Some(0) | Some(1)),
        "e2fsck -fyD {} failed:\n{}",
        img.display(),
        out_text(&o)
    );
}

/// Levels below the root of the htree directory at `path` (`debugfs htree`), or None when
/// the directory is not indexed.
pub fn htree_levels(img: &Path, path: &str) -> Option<u8> {
    let o = run(Command::new(tool("debugfs")).arg("-R").arg(format!("htree {path}")).arg(img));
    let text = String::from_utf8_lossy(&o.stdout);
    text.lines().find_map(|l| l.trim().strip_prefix("Indirect levels:")).and_then(|v| v.trim().parse().ok())
}

/// How `debugfs stat` shows the file at `path`: its flags word, its inline data size (when
/// it keeps its data inline) and its size.
#[allow(dead_code)]
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

/// The feature names `dumpe2fs -h` lists for the image.
/// Depth of the extent tree of `path` in `img` (0: extents in the inode), from `debugfs ex`.
#[allow(dead_code)]
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

/// The value of `key` in `dumpe2fs -h`'s listing of `img` ("" if it has no such line).
pub fn sb_field(img: &Path, key: &str) -> String {
    let out = run(Command::new(tool("dumpe2fs")).arg("-h").arg(img));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

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

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

// ------------------------------------------------------------------------------------------
// Kernel mounts
// ------------------------------------------------------------------------------------------

/// A loop mount of an image by the kernel's ext4 driver; unmounted on drop (also when a test
/// panics while it is mounted).
pub struct KernelMount {
    dir: Option<tempfile::TempDir>,
    mounted: bool,
}

impl KernelMount {
    /// Mounts `img` read-only.
    pub fn ro(img: &Path) -> Result<KernelMount, String> {
        Self::mount(img, "loop,ro")
    }
    /// Mounts `img` read-write.
    pub fn rw(img: &Path) -> Result<KernelMount, String> {
        Self::mount(img, "loop")
    }
    fn mount(img: &Path, opts: &str) -> Result<KernelMount, String> {
        let dir = tempfile::Builder::new().prefix("rext4-mnt").tempdir().map_err(|e| e.to_string())?;
        let mut last = String::new();
        // Parallel tests race for free loop devices; mount(8) usually retries, but be sure.
        for _ in 0..3 {
            let o =
                run(Command::new(tool("mount")).args(["-t", "ext4", "-o", opts]).arg(img).arg(dir.path()));
            if o.status.success() {
                return Ok(KernelMount { dir: Some(dir), mounted: true });
            }
            last = out_text(&o);
            if last.contains("permission denied") || last.contains("must be superuser") {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(format!("mount -o {opts} {} failed: {last}", img.display()))
    }
    pub fn path(&self) -> &Path {
        match &self.dir {
            Some(d) => d.path(),
            None => Path::new("/nonexistent"),
        }
    }
    /// Unmounts, reporting failure.
    pub fn unmount(mut self) -> Result<(), String> {
        self.umount_inner()
    }
    fn umount_inner(&mut self) -> Result<(), String> {
        if !self.mounted {
            return Ok(());
        }
        let p = self.path().to_path_buf();
        let mut last = String::new();
        for _ in 0..20 {
            let o = run(Command::new(tool("umount")).arg(&p));
            if o.status.success() {
                self.mounted = false;
                return Ok(());
            }
            last = out_text(&o);
            std::thread::sleep(Duration::from_millis(100));
        }
        // Never let the TempDir's cleanup walk into a still-mounted filesystem.
        let _ = Command::new(tool("umount")).arg("-l").arg(&p).status();
        if let Some(d) = self.dir.take() {
            let _ = d.keep();
        }
        self.mounted = false;
        Err(format!("umount {} failed: {last}", p.display()))
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        if let Err(e) = self.umount_inner() {
            eprintln!("warning: {e}");
        }
    }
}

/// Whether this process can loop-mount images (root, loop devices, ext4 driver). Probed once;
/// the reason is printed when it cannot. With `REXT4_REQUIRE_MOUNT=1` a failed probe panics.
pub fn kernel_can_mount() -> bool {
    static CAN: OnceLock<Result<(), String>> = OnceLock::new();
    let r = CAN.get_or_init(|| {
        if !is_root() {
            return Err("not running as root".into());
        }
        if find_tool("mount").is_none() || find_tool("umount").is_none() {
            return Err("mount(8) / umount(8) not found".into());
        }
        let d = tempfile::tempdir().map_err(|e| e.to_string())?;
        let img = d.path().join("probe.img");
        mkfs(None, &img, &[], "8M");
        let m = KernelMount::ro(&img)?;
        m.unmount()
    });
    match r {
        Ok(()) => true,
        Err(why) => {
            if std::env::var_os("REXT4_REQUIRE_MOUNT").is_some_and(|v| v == "1") {
                panic!("REXT4_REQUIRE_MOUNT=1 but the kernel cannot mount images here: {why}");
            }
            eprintln!("SKIP kernel comparison: cannot loop-mount images here ({why})");
            false
        }
    }
}

// ------------------------------------------------------------------------------------------
// The source-tree generator
// ------------------------------------------------------------------------------------------

/// What to generate. All counts are exact; content is a function of `seed`.
#[derive(Clone, Debug)]
pub struct TreeSpec {
    pub seed: u64,
    /// Regular files spread over `dirs` nested directories under `tree/`.
    pub files: usize,
    pub dirs: usize,
    /// Entries in `bigdir/` (an htree directory once indexed).
    pub big_dir_entries: usize,
    /// Size of `big.bin` (random bytes).
    pub big_file: usize,
    /// Levels under `deep/`.
    pub deep: usize,
    /// `sparse/huge`: > 4 GiB apparent size, data around 4 GiB (triple-indirect territory
    /// for block maps) and near the end.
    pub huge_sparse: bool,
    /// Files that end in a hole (`sparse/tail_hole`, `sparse/all_hole`, and tails on the
    /// others). `mkfs.ext4` 1.47.0 `-d -O inline_data` mangles them: it rounds the size down
    /// to the end of the last data block, and makes an all-hole file an inline file.
    pub tail_holes: bool,
    /// Size of the one large `user.*` value (must fit an xattr block).
    pub big_xattr: usize,
    /// Number of small `user.*` attributes on `xattr/many`.
    pub many_xattrs: usize,
    /// Things only a kernel-written tree gets: fallocate'd (unwritten) ranges, punched holes,
    /// a hard-linked symlink (`mkfs.ext4 -d` does not keep symlink hard links).
    pub kernel_extras: bool,
}

impl TreeSpec {
    /// The default oracle tree: ~3,000 files, a 12,000-entry directory, a 20 MiB file.
    pub fn full() -> TreeSpec {
        TreeSpec {
            seed: 0x7265_7874_3421,
            files: 3000,
            dirs: 150,
            big_dir_entries: 12_000,
            big_file: 20 << 20,
            deep: 40,
            huge_sparse: true,
            tail_holes: true,
            big_xattr: 3000,
            many_xattrs: 20,
            kernel_extras: false,
        }
    }
    /// A smaller tree for the many feature variants (`mkfs.ext4 -d` inserts directory entries
    /// in quadratic time, so the big directory is what costs).
    pub fn medium() -> TreeSpec {
        TreeSpec { files: 1200, dirs: 80, big_dir_entries: 3000, big_file: 6 << 20, ..TreeSpec::full() }
    }
    /// The same with xattrs small enough for 1 KiB blocks, and a directory big enough for a
    /// two-level htree there.
    pub fn small_blocks(mut self) -> TreeSpec {
        self.big_dir_entries = 5000;
        self.big_xattr = 700;
        self.many_xattrs = 10;
        self
    }
}

/// Well-known paths in every generated tree (relative to its root).
pub mod paths {
    pub const FILE: &str = "file";
    pub const EMPTY: &str = "empty";
    pub const BIG: &str = "big.bin";
    pub const BIGDIR: &str = "bigdir";
    pub const SPARSE_HEAD: &str = "sparse/head_hole";
    pub const SPARSE_MULTI: &str = "sparse/multi";
    pub const SPARSE_TAIL: &str = "sparse/tail_hole";
    pub const SPARSE_ALL: &str = "sparse/all_hole";
    pub const SPARSE_FAR: &str = "sparse/far";
    pub const SPARSE_HUGE: &str = "sparse/huge";
    pub const LOOP_A: &str = "links/loop_a";
    pub const SELF_LOOP: &str = "links/self";
    /// `links/chain00` -> `chain01` -> ... -> `chain40` -> `../file`: 41 links from 00.
    pub const CHAIN_41: &str = "links/chain00";
    /// 40 links to `file`.
    pub const CHAIN_40: &str = "links/chain01";
    pub const DIR_LINK: &str = "links/to_deep";
    pub const XATTR_SMALL: &str = "xattr/small";
    pub const XATTR_BIG: &str = "xattr/big";
    pub const FALLOC_FULL: &str = "falloc/prealloc";
    pub const FALLOC_MIXED: &str = "falloc/mixed";
}

const NAME_PIECES: &[&str] = &[
    "a", "b", "k", "z", "Q", "X", "0", "7", "_", "-", ".", "~", " ", "é", "ß", "ø", "Ω", "中", "文", "字",
    "😀", "ĳ", "+", "=", "@", "#", "%", ",",
];

/// A name of exactly `len` bytes starting with `prefix` (which keeps names unique and never
/// `.`/`..`), filled with ASCII and multi-byte UTF-8.
pub fn name_of_len(rng: &mut Rng, prefix: &str, len: usize) -> Vec<u8> {
    let mut v = prefix.as_bytes().to_vec();
    while v.len() < len {
        let room = len - v.len();
        let p = rng.pick(NAME_PIECES).as_bytes();
        if p.len() <= room {
            v.extend_from_slice(p);
        } else {
            v.push(b'x');
        }
    }
    v
}

fn rand_name(rng: &mut Rng, prefix: &str) -> Vec<u8> {
    let len = match rng.below(100) {
        0..=59 => rng.range(prefix.len() as u64 + 1, 16),
        60..=94 => rng.range(17, 60),
        _ => rng.range(61, 255),
    } as usize;
    name_of_len(rng, prefix, len.max(prefix.len()))
}

/// A POSIX ACL in the VFS xattr format (`posix_acl_xattr_header` v2 + entries).
pub fn vfs_acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

const ACL_UNDEF: u32 = u32::MAX;

fn example_acl() -> Vec<u8> {
    vfs_acl(&[
        (0x01, 6, ACL_UNDEF), // USER_OBJ rw
        (0x02, 4, 1000),      // USER 1000 r
        (0x02, 6, 2000),      // USER 2000 rw
        (0x04, 4, ACL_UNDEF), // GROUP_OBJ r
        (0x08, 4, 100),       // GROUP 100 r
        (0x10, 6, ACL_UNDEF), // MASK rw
        (0x20, 0, ACL_UNDEF), // OTHER ---
    ])
}

fn example_default_acl() -> Vec<u8> {
    vfs_acl(&[
        (0x01, 7, ACL_UNDEF),
        (0x02, 5, 1234),
        (0x04, 5, ACL_UNDEF),
        (0x10, 7, ACL_UNDEF),
        (0x20, 5, ACL_UNDEF),
    ])
}

fn ft(sec: i64, nsec: u32) -> filetime::FileTime {
    filetime::FileTime::from_unix_time(sec, nsec)
}

/// Seconds and nanoseconds since the epoch.
type Time = (i64, u32);

struct Gen<'a> {
    root: &'a Path,
    rng: Rng,
    /// Everything created, parents before children: times are applied in reverse.
    created: Vec<Vec<u8>>,
    /// Explicit (atime, mtime) for some paths; the rest get random ones.
    times: BTreeMap<Vec<u8>, (Time, Time)>,
    /// Directory modes to apply at the end (after the children exist).
    dir_modes: Vec<(Vec<u8>, u32)>,
    root_user: bool,
}

fn ctx<T>(r: io::Result<T>, what: &str, p: &Path) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("generator: {what} {}: {e}", p.display()),
    }
}

impl Gen<'_> {
    fn p(&self, rel: &[u8]) -> PathBuf {
        self.root.join(OsStr::from_bytes(rel))
    }
    fn dir(&mut self, rel: &[u8]) {
        let p = self.p(rel);
        ctx(fs::create_dir(&p), "mkdir", &p);
        ctx(fs::set_permissions(&p, fs::Permissions::from_mode(0o755)), "chmod", &p);
        self.created.push(rel.to_vec());
    }
    fn file(&mut self, rel: &[u8], data: &[u8], mode: u32) {
        let p = self.p(rel);
        ctx(fs::write(&p, data), "write", &p);
        ctx(fs::set_permissions(&p, fs::Permissions::from_mode(mode)), "chmod", &p);
        self.created.push(rel.to_vec());
    }
    fn symlink(&mut self, target: &[u8], rel: &[u8]) {
        let p = self.p(rel);
        ctx(std::os::unix::fs::symlink(OsStr::from_bytes(target), &p), "symlink", &p);
        self.created.push(rel.to_vec());
    }
    fn hard_link(&mut self, existing: &[u8], rel: &[u8]) {
        let (a, b) = (self.p(existing), self.p(rel));
        ctx(fs::hard_link(&a, &b), "link", &b);
        self.created.push(rel.to_vec());
    }
    fn xattr(&mut self, rel: &[u8], name: &str, value: &[u8]) {
        let p = self.p(rel);
        ctx(xattr::set(&p, name, value), &format!("setxattr {name}"), &p);
    }
    fn chown(&mut self, rel: &[u8], uid: u32, gid: u32) {
        if self.root_user {
            let p = self.p(rel);
            ctx(std::os::unix::fs::lchown(&p, Some(uid), Some(gid)), "lchown", &p);
        }
    }
    fn chmod(&mut self, rel: &[u8], mode: u32) {
        let p = self.p(rel);
        ctx(fs::set_permissions(&p, fs::Permissions::from_mode(mode)), "chmod", &p);
    }
    fn sparse(&mut self, rel: &[u8], chunks: &[(u64, usize)], len: u64) {
        let p = self.p(rel);
        let f = ctx(fs::File::create(&p), "create", &p);
        for &(off, n) in chunks {
            let data = self.rng.bytes(n);
            ctx(f.write_all_at(&data, off), "pwrite", &p);
        }
        ctx(f.set_len(len), "truncate", &p);
        ctx(fs::set_permissions(&p, fs::Permissions::from_mode(0o644)), "chmod", &p);
        self.created.push(rel.to_vec());
    }
    fn set_time(&mut self, rel: &[u8], atime: (i64, u32), mtime: (i64, u32)) {
        self.times.insert(rel.to_vec(), (atime, mtime));
    }
    fn rand_time(&mut self) -> (i64, u32) {
        (self.rng.range(946_684_800, 1_900_000_000) as i64, self.rng.below(1_000_000_000) as u32)
    }
    fn file_content(&mut self) -> Vec<u8> {
        let n = match self.rng.below(100) {
            0..=9 => 0,
            10..=39 => self.rng.range(1, 60),
            40..=69 => self.rng.range(61, 4096),
            70..=94 => self.rng.range(4097, 32 << 10),
            _ => self.rng.range(32 << 10, 256 << 10),
        } as usize;
        if self.rng.chance(30) {
            // Text-like content.
            let mut v = Vec::with_capacity(n);
            while v.len() < n {
                let w = *self.rng.pick(&["lorem ", "ipsum ", "ext4 ", "inode ", "extent\n", "héllo "]);
                v.extend_from_slice(w.as_bytes());
            }
            v.truncate(n);
            v
        } else {
            self.rng.bytes(n)
        }
    }
}

/// Writes the tree described by `spec` under `root` (an existing, empty directory, or the
/// root of a fresh filesystem). Deterministic: the same spec gives the same tree.
pub fn generate(root: &Path, spec: &TreeSpec) {
    let mut g = Gen {
        root,
        rng: Rng::new(spec.seed),
        created: Vec::new(),
        times: BTreeMap::new(),
        dir_modes: Vec::new(),
        root_user: is_root(),
    };
    let g = &mut g;

    // --- top level files.
    g.file(b"file", b"hello, ext4\n", 0o644);
    g.file(b"empty", b"", 0o644);
    let big = g.rng.bytes(spec.big_file);
    g.file(b"big.bin", &big, 0o644);
    drop(big);

    // --- sparse files.
    g.dir(b"sparse");
    g.sparse(b"sparse/head_hole", &[((1 << 20) + 123, 5000)], (1 << 20) + 123 + 5000);
    g.sparse(
        b"sparse/multi",
        &[(0, 4096), (65_539, 10_000), (1 << 20, 1), ((10 << 20) - 7, 100_000)],
        (10 << 20) - 7 + 100_000,
    );
    let tail = if spec.tail_holes { 200_000 } else { 0 };
    if spec.tail_holes {
        g.sparse(b"sparse/tail_hole", &[(0, 7000)], (8 << 20) + 5);
        g.sparse(b"sparse/all_hole", &[], 3 << 20);
    }
    // 256 MiB: past the double-indirect range of 1 KiB block maps.
    g.sparse(b"sparse/far", &[((256 << 20) - 10, 20)], (256 << 20) + 10 + tail);
    if spec.huge_sparse {
        let size = (5u64 << 30) + 12_345;
        g.sparse(b"sparse/huge", &[((4 << 30) - 4096, 8192), (size - 300_000 - tail, 300_000)], size);
    }

    // --- nested tree of ordinary files.
    g.dir(b"tree");
    let mut dirs: Vec<(Vec<u8>, usize)> = vec![(b"tree".to_vec(), 0)];
    for i in 0..spec.dirs {
        let (parent, depth) = loop {
            let c = g.rng.pick(&dirs).clone();
            if c.1 < 8 {
                break c;
            }
        };
        let mut rel = parent.clone();
        rel.push(b'/');
        rel.extend(rand_name(&mut g.rng, &format!("d{i}_")));
        g.dir(&rel);
        dirs.push((rel, depth + 1));
    }
    let mut tree_files = Vec::new();
    for i in 0..spec.files {
        let parent = g.rng.pick(&dirs).0.clone();
        let mut rel = parent;
        rel.push(b'/');
        rel.extend(rand_name(&mut g.rng, &format!("f{i}_")));
        let data = g.file_content();
        let mode = *g.rng.pick(&[0o644, 0o644, 0o600, 0o755, 0o444]);
        g.file(&rel, &data, mode);
        if g.rng.chance(3) {
            let n = g.rng.range(0, 40) as usize;
            let v = g.rng.bytes(n);
            g.xattr(&rel, "user.note", &v);
        }
        tree_files.push(rel);
    }
    // A few directories with 0..3 entries (inline directories with inline_data).
    g.dir(b"tree/small_dirs");
    for i in 0..40 {
        let d = format!("tree/small_dirs/s{i}").into_bytes();
        g.dir(&d);
        for j in 0..(i % 4) {
            let f = format!("tree/small_dirs/s{i}/e{j}").into_bytes();
            let data = g.rng.bytes(j * 20);
            g.file(&f, &data, 0o644);
        }
    }

    // --- hard links (several names for one inode, across directories).
    g.dir(b"hard");
    g.dir(b"hard/sub");
    g.file(b"hard/a", b"one inode, five names\n", 0o640);
    g.hard_link(b"hard/a", b"hard/a2");
    g.hard_link(b"hard/a", b"hard/sub/a3");
    g.hard_link(b"hard/a", b"tree/a_link");
    g.file(b"hard/empty", b"", 0o644);
    g.hard_link(b"hard/empty", b"hard/sub/empty2");
    let data = g.rng.bytes(10_000);
    g.file(b"hard/with_xattr", &data, 0o644);
    g.xattr(b"hard/with_xattr", "user.shared", b"same inode");
    g.hard_link(b"hard/with_xattr", b"hard/sub/with_xattr2");

    // --- one big directory.
    g.dir(b"bigdir");
    for i in 0..spec.big_dir_entries {
        let name = {
            let max = if g.rng.chance(5) { 255 } else { 40 };
            let len = g.rng.range(8, max) as usize;
            name_of_len(&mut g.rng, &format!("e{i:05}_"), len)
        };
        let mut rel = b"bigdir/".to_vec();
        rel.extend(&name);
        match g.rng.below(100) {
            0..=87 => g.file(&rel, b"", 0o644),
            88..=94 => {
                let n = g.rng.range(1, 300) as usize;
                let data = g.rng.bytes(n);
                g.file(&rel, &data, 0o644)
            }
            95..=96 => g.hard_link(b"hard/a", &rel),
            97..=98 => g.symlink(b"../file", &rel),
            _ => g.dir(&rel),
        }
    }

    // --- deep nesting.
    g.dir(b"deep");
    let mut rel = b"deep".to_vec();
    for i in 0..spec.deep {
        rel.extend(format!("/l{i:02}").as_bytes());
        g.dir(&rel);
        let mut f = rel.clone();
        f.extend(b"/f");
        g.file(&f, format!("level {i}\n").as_bytes(), 0o644);
    }
    rel.extend(b"/leaf");
    g.file(&rel, b"the bottom\n", 0o644);

    // --- names.
    g.dir(b"names");
    let long_ascii = [b"L".as_slice(), &[b'n'; 254]].concat();
    let mut odd: Vec<Vec<u8>> = vec![
        long_ascii,
        {
            let mut r = Rng::new(2);
            name_of_len(&mut r, "u255_", 255)
        },
        "é".repeat(127).into_bytes(), // 254 bytes of 2-byte chars
        ["😀".repeat(63), "abc".into()].concat().into_bytes(), // 255 bytes, 4-byte chars
        vec![b'm'; 254],
        vec![b'q'; 253],
        b"x".to_vec(),
        b"Y".to_vec(),
        b"with space".to_vec(),
        b"tab\there".to_vec(),
        b"new\nline".to_vec(),
        b"back\\slash".to_vec(),
        b"-leading-dash".to_vec(),
        b".hidden".to_vec(),
        b"..dotdot".to_vec(),
        b"...".to_vec(),
        b"star*?[x]".to_vec(),
        vec![0xff, 0xfe, b'b', b'a', b'd'], // not UTF-8
        vec![0x80],
        vec![1, 2, 3, 0x7f],
        "日本語のファイル名".as_bytes().to_vec(),
    ];
    for n in &odd {
        assert!(n.len() <= 255 && !n.contains(&b'/') && !n.contains(&0));
    }
    for (i, n) in odd.iter_mut().enumerate() {
        let mut rel = b"names/".to_vec();
        rel.extend(n.iter());
        let content = format!("name {i}\n");
        g.file(&rel, content.as_bytes(), 0o644);
    }
    let mut long_dir = b"names/".to_vec();
    long_dir.extend(vec![b'D'; 255]);
    g.dir(&long_dir);
    let mut inner = long_dir.clone();
    inner.push(b'/');
    inner.extend(vec![b'F'; 255]);
    g.file(&inner, b"255/255\n", 0o644);

    // --- symbolic links.
    g.dir(b"links");
    g.symlink(b"../file", b"links/fast");
    let exact = |n: usize| -> Vec<u8> {
        let mut t = b"../".to_vec();
        t.extend(vec![b't'; n - 3]);
        t
    };
    g.symlink(&exact(59), b"links/len59");
    g.symlink(&exact(60), b"links/len60");
    g.symlink(&exact(61), b"links/len61");
    for n in [100usize, 500, 1000] {
        let mut t = Vec::new();
        while t.len() < n {
            t.extend(b"../");
            t.extend(name_of_len(&mut g.rng, "s", 20));
        }
        t.truncate(n);
        g.symlink(&t, format!("links/slow{n}").as_bytes());
    }
    g.symlink(b"does/not/exist", b"links/dangling");
    g.symlink(b"/file", b"links/abs_file");
    g.symlink(b"/tree", b"links/abs_dir");
    g.symlink(b"../deep", b"links/to_deep");
    g.symlink("../names/日本語のファイル名".as_bytes(), b"links/utf8");
    g.symlink(b"loop_b", b"links/loop_a");
    g.symlink(b"loop_a", b"links/loop_b");
    g.symlink(b"self", b"links/self");
    for i in 0..=40 {
        let name = format!("links/chain{i:02}");
        let target = if i == 40 { "../file".to_string() } else { format!("chain{:02}", i + 1) };
        g.symlink(target.as_bytes(), name.as_bytes());
    }

    // --- extended attributes.
    g.dir(b"xattr");
    g.file(b"xattr/small", b"x", 0o644);
    g.xattr(b"xattr/small", "user.a", b"1");
    g.xattr(b"xattr/small", "user.empty", b"");
    let v = g.rng.bytes(40);
    g.xattr(b"xattr/small", "user.bin", &v);
    g.xattr(b"xattr/small", "user.名前", "値".as_bytes());
    g.file(b"xattr/big", b"big xattr", 0o644);
    let v = g.rng.bytes(spec.big_xattr);
    g.xattr(b"xattr/big", "user.big", &v);
    g.file(b"xattr/many", b"", 0o644);
    for i in 0..spec.many_xattrs {
        let n = g.rng.range(1, 30) as usize;
        let v = g.rng.bytes(n);
        g.xattr(b"xattr/many", &format!("user.k{i:02}"), &v);
    }
    // Two files with identical attribute sets big enough for a block: shared (refcount 2).
    for f in [b"xattr/shared1".as_slice(), b"xattr/shared2"] {
        g.file(f, b"shared block", 0o644);
        g.xattr(f, "user.shared_value", &[0x5a; 300]);
    }
    g.dir(b"xattr/dir");
    g.xattr(b"xattr/dir", "user.on_dir", b"directory attribute");
    if g.root_user {
        g.file(b"xattr/trusted", b"t", 0o644);
        g.xattr(b"xattr/trusted", "trusted.t", b"trusted value");
        g.xattr(b"xattr/trusted", "security.s", b"security value");
        g.xattr(b"xattr/trusted", "user.u", b"user value");
        g.symlink(b"../file", b"xattr/symlink");
        g.xattr(b"xattr/symlink", "trusted.on_link", b"link attribute");
    }
    g.file(b"xattr/acl", b"acl", 0o644);
    g.xattr(b"xattr/acl", "system.posix_acl_access", &example_acl());
    g.dir(b"xattr/acl_dir");
    g.xattr(b"xattr/acl_dir", "system.posix_acl_default", &example_default_acl());
    g.xattr(b"xattr/acl_dir", "system.posix_acl_access", &example_acl());
    // Inherits the default ACL.
    let p = g.p(b"xattr/acl_dir/inherited");
    ctx(fs::write(&p, b"inherits"), "write", &p);
    g.created.push(b"xattr/acl_dir/inherited".to_vec());

    // --- modes.
    g.dir(b"modes");
    for m in [0o000, 0o777, 0o4755, 0o2755, 0o6777, 0o1777, 0o444, 0o7777, 0o4000] {
        if !g.root_user && m & 0o400 == 0 {
            continue;
        }
        let rel = format!("modes/f{m:04o}").into_bytes();
        g.file(&rel, format!("mode {m:o}\n").as_bytes(), 0o644);
        g.chmod(&rel, m);
    }
    for m in [0o600, 0o000, 0o1777, 0o2775, 0o700, 0o7777] {
        if !g.root_user && m & 0o500 != 0o500 {
            continue;
        }
        let rel = format!("modes/d{m:04o}").into_bytes();
        g.dir(&rel);
        let f = format!("modes/d{m:04o}/inside").into_bytes();
        g.file(&f, b"inside\n", 0o644);
        g.dir_modes.push((rel, m));
    }

    // --- owners.
    g.dir(b"owners");
    if g.root_user {
        let ids: [(u32, u32); 6] =
            [(1, 1), (1000, 1000), (65534, 65534), (70_000, 80_000), (4_000_000_000, 3), (0, 123_456)];
        for (uid, gid) in ids {
            let rel = format!("owners/u{uid}_g{gid}").into_bytes();
            g.file(&rel, b"owned\n", 0o644);
            g.chown(&rel, uid, gid);
        }
        g.dir(b"owners/dir");
        g.chown(b"owners/dir", 70_000, 70_001);
        g.symlink(b"../file", b"owners/link");
        g.chown(b"owners/link", 4321, 8765);
        // chown clears set-id bits: set them afterwards.
        g.file(b"owners/setid", b"setid\n", 0o644);
        g.chown(b"owners/setid", 1000, 100);
        g.chmod(b"owners/setid", 0o6755);
    }

    // --- special files.
    g.dir(b"special");
    {
        let p = g.p(b"special/fifo");
        let mode = nix::sys::stat::Mode::from_bits_truncate(0o640);
        if let Err(e) = nix::unistd::mkfifo(&p, mode) {
            panic!("mkfifo {}: {e}", p.display());
        }
        g.chmod(b"special/fifo", 0o640);
        g.created.push(b"special/fifo".to_vec());
    }
    if g.root_user {
        use nix::sys::stat::{makedev, mknod, Mode, SFlag};
        let devs: [(&[u8], SFlag, u64, u64); 4] = [
            (b"special/null", SFlag::S_IFCHR, 1, 3),
            (b"special/sda1", SFlag::S_IFBLK, 8, 1),
            (b"special/bigchr", SFlag::S_IFCHR, 300, 70_000),
            (b"special/bigblk", SFlag::S_IFBLK, 4095, 1_048_575),
        ];
        for (rel, kind, ma, mi) in devs {
            let p = g.p(rel);
            if let Err(e) = mknod(&p, kind, Mode::from_bits_truncate(0o660), makedev(ma, mi)) {
                panic!("mknod {}: {e}", p.display());
            }
            g.chmod(rel, 0o660);
            g.created.push(rel.to_vec());
        }
    }
    {
        let p = g.p(b"special/socket");
        drop(ctx(std::os::unix::net::UnixListener::bind(&p), "bind", &p));
        g.chmod(b"special/socket", 0o755);
        g.created.push(b"special/socket".to_vec());
    }

    // --- explicit timestamps.
    g.dir(b"times");
    let stamps: [(i64, u32); 10] = [
        (0, 0),
        (1, 1),
        (-1, 999_999_999),
        (-1_000_000_000, 500),
        (i32::MIN as i64, 0),
        (i32::MAX as i64, 999_999_999),
        (1_700_000_000, 123_456_789),
        (1_234_567_890, 987_654_321),
        (1 << 31, 0),                 // first second past 2038
        (4_102_444_800, 123_456_789), // 2100
    ];
    for (i, &t) in stamps.iter().enumerate() {
        let rel = format!("times/t{i}").into_bytes();
        g.file(&rel, b"t", 0o644);
        let a = stamps[(i + 3) % stamps.len()];
        g.set_time(&rel, a, t);
    }

    // --- fallocate'd and punched files (kernel-written trees only).
    if spec.kernel_extras {
        use nix::fcntl::{fallocate, FallocateFlags as F};
        g.dir(b"falloc");
        let mk = |g: &mut Gen, rel: &[u8]| -> fs::File {
            let p = g.p(rel);
            g.created.push(rel.to_vec());
            ctx(fs::File::create(&p), "create", &p)
        };
        let f = mk(g, b"falloc/prealloc");
        fallocate(&f, F::empty(), 0, 1 << 20).expect("fallocate prealloc");
        let f = mk(g, b"falloc/keep_size");
        let d = g.rng.bytes(1000);
        ctx(f.write_all_at(&d, 0), "pwrite", Path::new("keep_size"));
        fallocate(&f, F::FALLOC_FL_KEEP_SIZE, 0, 2 << 20).expect("fallocate keep_size");
        let f = mk(g, b"falloc/mixed");
        fallocate(&f, F::empty(), 0, 1 << 20).expect("fallocate mixed");
        let d = g.rng.bytes(10_000);
        ctx(f.write_all_at(&d, 300_000), "pwrite", Path::new("mixed"));
        let f = mk(g, b"falloc/punched");
        let d = g.rng.bytes(1 << 20);
        ctx(f.write_all_at(&d, 0), "pwrite", Path::new("punched"));
        fallocate(&f, F::FALLOC_FL_PUNCH_HOLE | F::FALLOC_FL_KEEP_SIZE, 100_000, 500_000)
            .expect("punch hole");
        let f = mk(g, b"falloc/zeroed");
        let d = g.rng.bytes(300_000);
        ctx(f.write_all_at(&d, 0), "pwrite", Path::new("zeroed"));
        fallocate(&f, F::FALLOC_FL_ZERO_RANGE, 4096 * 5, 4096 * 20).expect("zero range");
        drop(f);
        for rel in ["falloc/prealloc", "falloc/keep_size", "falloc/mixed", "falloc/punched", "falloc/zeroed"]
        {
            g.chmod(rel.as_bytes(), 0o644);
        }
        g.hard_link(b"links/fast", b"links/fast_hardlink");
    }

    // --- final pass: directory modes, then times (children before parents).
    for (rel, m) in std::mem::take(&mut g.dir_modes) {
        g.chmod(&rel, m);
    }
    let created = std::mem::take(&mut g.created);
    for rel in created.iter().rev() {
        let (a, m) = match g.times.get(rel) {
            Some(&t) => t,
            None => (g.rand_time(), g.rand_time()),
        };
        let p = g.p(rel);
        ctx(filetime::set_symlink_file_times(&p, ft(a.0, a.1), ft(m.0, m.1)), "utimensat", &p);
    }
}

/// Changes a generated tree the way a user would (unlink, rename, truncate, append, punch),
/// leaving deleted entries and freed inodes behind. Deterministic, like [`generate`].
pub fn mutate(root: &Path, spec: &TreeSpec) {
    let mut rng = Rng::new(spec.seed ^ 0xdead_beef);
    let p = |rel: &str| root.join(rel);
    let mut touched: Vec<PathBuf> = Vec::new();
    // Unlink every third entry of bigdir that is not a directory, rename every 17th.
    let mut names: Vec<_> = ctx(fs::read_dir(p(paths::BIGDIR)), "readdir", &p(paths::BIGDIR))
        .map(|e| ctx(e, "readdir", root).file_name())
        .collect();
    names.sort();
    for (i, n) in names.iter().enumerate() {
        let path = p(paths::BIGDIR).join(n);
        let md = ctx(fs::symlink_metadata(&path), "lstat", &path);
        if md.is_dir() {
            continue;
        }
        if i % 3 == 0 {
            ctx(fs::remove_file(&path), "unlink", &path);
        } else if i % 17 == 0 {
            let to = p("tree").join(format!("moved_{i}"));
            ctx(fs::rename(&path, &to), "rename", &path);
            touched.push(to);
        }
    }
    touched.push(p(paths::BIGDIR));
    touched.push(p("tree"));
    // Shrink the big file to an unaligned size, grow a small one, append to a few files.
    let f = ctx(fs::OpenOptions::new().write(true).open(p(paths::BIG)), "open", &p(paths::BIG));
    let len = (spec.big_file as u64).saturating_sub(12_345);
    ctx(f.set_len(len), "truncate", &p(paths::BIG));
    touched.push(p(paths::BIG));
    let f = ctx(fs::OpenOptions::new().write(true).open(p(paths::FILE)), "open", &p(paths::FILE));
    ctx(f.set_len(100_000), "truncate", &p(paths::FILE));
    let d = rng.bytes(333);
    ctx(f.write_all_at(&d, 50_000), "pwrite", &p(paths::FILE));
    touched.push(p(paths::FILE));
    // Remove a directory subtree.
    ctx(fs::remove_dir_all(p("tree/small_dirs/s3")), "rmdir", &p("tree/small_dirs/s3"));
    touched.push(p("tree/small_dirs"));
    // Re-stamp what changed so the source and the image agree to the nanosecond.
    for t in touched {
        let a = (rng.range(946_684_800, 1_900_000_000) as i64, rng.below(1_000_000_000) as u32);
        let m = (rng.range(946_684_800, 1_900_000_000) as i64, rng.below(1_000_000_000) as u32);
        ctx(filetime::set_symlink_file_times(&t, ft(a.0, a.1), ft(m.0, m.1)), "utimensat", &t);
    }
}

/// A generated source tree kept for the life of the test process, and its description.
pub struct SourceTree {
    pub dir: PathBuf,
    pub spec: TreeSpec,
    pub walk: Walk,
}

/// Generates (once per process and `key`) the tree for `spec` under the target's tmp dir,
/// replacing any left from an earlier run.
pub fn source_tree(cell: &'static OnceLock<SourceTree>, key: &str, spec: TreeSpec) -> &'static SourceTree {
    cell.get_or_init(|| make_source_tree(key, spec, false))
}

/// Like [`source_tree`], then [`mutate`]s it.
pub fn mutated_source_tree(
    cell: &'static OnceLock<SourceTree>,
    key: &str,
    spec: TreeSpec,
) -> &'static SourceTree {
    cell.get_or_init(|| make_source_tree(key, spec, true))
}

fn make_source_tree(key: &str, spec: TreeSpec, mutated: bool) -> SourceTree {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("rext4-trees");
    let dir = base.join(key);
    if dir.exists() {
        // Earlier runs may have left odd modes behind.
        let _ = Command::new("chmod").arg("-R").arg("u+rwx").arg(&dir).status();
        ctx(fs::remove_dir_all(&dir), "rm -r", &dir);
    }
    ctx(fs::create_dir_all(&dir), "mkdir -p", &dir);
    generate(&dir, &spec);
    if mutated {
        mutate(&dir, &spec);
    }
    let walk = walk_kernel(&dir);
    assert!(walk.problems.is_empty(), "walking the source tree: {:#?}", walk.problems);
    check_fixture(&walk, &spec, mutated);
    SourceTree { dir, spec, walk }
}

/// Guards the generator: the tree has what the tests claim to cover.
pub fn check_fixture(w: &Walk, spec: &TreeSpec, mutated: bool) {
    let get = |p: &str| w.recs.get(p.as_bytes()).unwrap_or_else(|| panic!("fixture lacks {p}"));
    let children = |d: &str| {
        let prefix = format!("{d}/");
        w.recs
            .keys()
            .filter(|k| k.starts_with(prefix.as_bytes()) && !k[prefix.len()..].contains(&b'/'))
            .count()
    };
    if !mutated {
        assert_eq!(children("/bigdir"), spec.big_dir_entries, "fixture: /bigdir entries");
    } else {
        assert!(children("/bigdir") >= spec.big_dir_entries / 2, "fixture: /bigdir entries");
    }
    let tree_files = w.recs.iter().filter(|(k, r)| k.starts_with(b"/tree/") && r.kind == Kind::File).count();
    assert!(tree_files >= spec.files, "fixture: {tree_files} files under /tree");
    assert_eq!(get("/xattr/big").xattrs.get(b"user.big".as_slice()).map(Vec::len), Some(spec.big_xattr));
    assert!(get("/xattr/acl").xattrs.contains_key(b"system.posix_acl_access".as_slice()), "fixture: ACL");
    assert!(
        get("/xattr/acl_dir").xattrs.contains_key(b"system.posix_acl_default".as_slice()),
        "fixture: ACL"
    );
    assert!(get("/hard/a").nlink >= 5, "fixture: hard links");
    assert_eq!(get("/links/len59").target.as_ref().map(Vec::len), Some(59));
    assert_eq!(get("/links/len60").target.as_ref().map(Vec::len), Some(60));
    assert_eq!(get("/links/slow1000").target.as_ref().map(Vec::len), Some(1000));
    let max_name = w.recs.keys().map(|k| k.rsplit(|&b| b == b'/').next().map_or(0, <[u8]>::len)).max();
    assert_eq!(max_name, Some(255), "fixture: 255-byte names");
    let depth = w.recs.keys().map(|k| k.iter().filter(|&&b| b == b'/').count()).max().unwrap_or(0);
    assert!(depth > spec.deep, "fixture: depth {depth}");
    let kinds: BTreeSet<Kind> = w.recs.values().map(|r| r.kind).collect();
    assert!(kinds.contains(&Kind::Fifo) && kinds.contains(&Kind::Socket), "fixture: special files {kinds:?}");
    if is_root() {
        assert!(kinds.contains(&Kind::Char) && kinds.contains(&Kind::Block), "fixture: devices {kinds:?}");
        let t = get("/xattr/trusted");
        assert!(
            t.xattrs.contains_key(b"trusted.t".as_slice()) && t.xattrs.contains_key(b"security.s".as_slice())
        );
        assert!(w.recs.values().any(|r| r.uid == 4_000_000_000), "fixture: 32-bit uid");
        assert_eq!(get("/owners/setid").mode & 0o7777, 0o6755, "fixture: set-id bits");
    }
    let ns = w.recs.values().filter(|r| r.mtime.1 != 0).count();
    assert!(ns * 2 > w.recs.len(), "fixture: nanosecond times");
}

// ------------------------------------------------------------------------------------------
// Descriptions of a tree
// ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Char,
    Block,
    Fifo,
    Socket,
}

impl Kind {
    fn of_std(t: fs::FileType) -> Option<Kind> {
        Some(if t.is_file() {
            Kind::File
        } else if t.is_dir() {
            Kind::Dir
        } else if t.is_symlink() {
            Kind::Symlink
        } else if t.is_char_device() {
            Kind::Char
        } else if t.is_block_device() {
            Kind::Block
        } else if t.is_fifo() {
            Kind::Fifo
        } else if t.is_socket() {
            Kind::Socket
        } else {
            return None;
        })
    }
    fn of_rext4(t: FileType) -> Kind {
        match t {
            FileType::RegularFile => Kind::File,
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Symlink,
            FileType::CharDevice => Kind::Char,
            FileType::BlockDevice => Kind::Block,
            FileType::Fifo => Kind::Fifo,
            FileType::Socket => Kind::Socket,
        }
    }
}

/// A content digest: length plus two independent 64-bit hashes (of the whole file, or of
/// sample windows for files over [`CONTENT_LIMIT`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Digest {
    pub len: u64,
    pub h: [u64; 2],
}

/// Files larger than this are compared by sample windows, not in full.
pub const CONTENT_LIMIT: u64 = 64 << 20;

fn mix(mut h: u64, w: u64) -> u64 {
    h ^= w;
    h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ (h >> 29)
}

struct Hasher([u64; 2]);

impl Hasher {
    fn new() -> Hasher {
        Hasher([0x1234_5678_9abc_def0, 0x0fed_cba9_8765_4321])
    }
    fn feed(&mut self, data: &[u8]) {
        let mut it = data.chunks_exact(8);
        for c in it.by_ref() {
            let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            self.0[0] = mix(self.0[0], w);
            self.0[1] = mix(self.0[1].rotate_left(17), w ^ 0xa5a5_a5a5_a5a5_a5a5);
        }
        let mut last = [0u8; 8];
        let r = it.remainder();
        last[..r.len()].copy_from_slice(r);
        self.0[0] = mix(self.0[0], u64::from_le_bytes(last) ^ ((r.len() as u64) << 59));
        self.0[1] = mix(self.0[1], u64::from_le_bytes(last).rotate_left(7) ^ r.len() as u64);
    }
}

/// Digest of a whole buffer.
pub fn digest(data: &[u8]) -> Digest {
    let mut h = Hasher::new();
    h.feed(data);
    Digest { len: data.len() as u64, h: h.0 }
}

/// The sample windows read from a file over [`CONTENT_LIMIT`]: the first and last MiB, and
/// 128 KiB around every power of two.
pub fn sample_windows(size: u64) -> Vec<(u64, u64)> {
    let mut w = vec![(0, 1 << 20)];
    let mut k = 21;
    while (1u64 << k) < size {
        w.push(((1u64 << k) - (64 << 10), 128 << 10));
        k += 1;
    }
    w.push((size.saturating_sub(1 << 20), 1 << 20));
    w.into_iter().map(|(o, l)| (o, l.min(size - o.min(size)))).collect()
}

fn digest_windows(
    size: u64,
    mut read_at: impl FnMut(u64, &mut [u8]) -> Result<(), String>,
) -> Result<Digest, String> {
    let mut h = Hasher::new();
    for (off, len) in sample_windows(size) {
        let mut buf = vec![0u8; len as usize];
        read_at(off, &mut buf)?;
        h.feed(&off.to_le_bytes());
        h.feed(&buf);
    }
    Ok(Digest { len: size, h: h.0 })
}

/// Everything the oracles compare about one path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rec {
    pub kind: Kind,
    /// The type recorded in the parent's directory entry (None for the root).
    pub dtype: Option<Kind>,
    /// The inode number in the parent's directory entry.
    pub dirent_ino: u64,
    pub ino: u64,
    pub mode: u32,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub blocks: u64,
    pub blksize: u64,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub crtime: Option<(i64, u32)>,
    pub rdev: (u32, u32),
    /// `FS_IOC_GETFLAGS` and `FS_IOC_GETVERSION` (regular files and directories only).
    pub flags: Option<u32>,
    pub generation: Option<u32>,
    pub target: Option<Vec<u8>>,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    pub content: Option<Digest>,
}

/// A described tree: path ("/", "/a/b", as bytes) -> record, plus whatever went wrong while
/// walking (errors, duplicate entries, inconsistent answers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Walk {
    pub recs: BTreeMap<Vec<u8>, Rec>,
    pub problems: Vec<String>,
}

/// Displays a path of bytes.
pub fn show(p: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(p))
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut v = dir.to_vec();
    if v != b"/" {
        v.push(b'/');
    }
    v.extend_from_slice(name);
    v
}

fn systime(t: io::Result<SystemTime>) -> Option<(i64, u32)> {
    let t = t.ok()?;
    Some(match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
            if n == 0 {
                (-s, 0)
            } else {
                (-s - 1, 1_000_000_000 - n)
            }
        }
    })
}

nix::ioctl_read!(fs_ioc_getflags, b'f', 1, std::ffi::c_long);
nix::ioctl_read!(fs_ioc_getversion, b'v', 1, std::ffi::c_long);

/// `FS_IOC_GETFLAGS` and `FS_IOC_GETVERSION` of a regular file or directory.
fn kernel_flags(p: &Path) -> Result<(u32, u32), String> {
    let f = fs::File::open(p).map_err(|e| format!("open: {e}"))?;
    let (mut flags, mut gen): (std::ffi::c_long, std::ffi::c_long) = (0, 0);
    // SAFETY: both ioctls write one int through a pointer to a (larger) zeroed c_long.
    unsafe {
        fs_ioc_getflags(f.as_raw_fd(), &mut flags).map_err(|e| format!("FS_IOC_GETFLAGS: {e}"))?;
        fs_ioc_getversion(f.as_raw_fd(), &mut gen).map_err(|e| format!("FS_IOC_GETVERSION: {e}"))?;
    }
    Ok((flags as u32, gen as u32))
}

fn dev_split(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

/// Describes the tree under `root` as the running kernel shows it (`lstat`, `statx` btime,
/// `llistxattr`/`lgetxattr`, `readlink`, file contents, ioctls).
pub fn walk_kernel(root: &Path) -> Walk {
    let mut w = Walk::default();
    match fs::symlink_metadata(root) {
        Ok(md) => {
            let ino = md.ino();
            kernel_visit(root, b"/", &md, None, ino, &mut w);
        }
        Err(e) => w.problems.push(format!("lstat {}: {e}", root.display())),
    }
    w
}

fn kernel_visit(
    full: &Path,
    rel: &[u8],
    md: &fs::Metadata,
    dtype: Option<Kind>,
    dirent_ino: u64,
    w: &mut Walk,
) {
    let Some(kind) = Kind::of_std(md.file_type()) else {
        w.problems.push(format!("{}: unknown file type", show(rel)));
        return;
    };
    let mut problems = Vec::new();
    let mut xattrs = BTreeMap::new();
    match xattr::list(full) {
        Ok(names) => {
            for n in names {
                match xattr::get(full, &n) {
                    Ok(Some(v)) => {
                        xattrs.insert(n.as_bytes().to_vec(), v);
                    }
                    Ok(None) => problems.push(format!("{}: listed xattr {n:?} is missing", show(rel))),
                    Err(e) => problems.push(format!("{}: getxattr {n:?}: {e}", show(rel))),
                }
            }
        }
        Err(e) => problems.push(format!("{}: listxattr: {e}", show(rel))),
    }
    let target = if kind == Kind::Symlink {
        match fs::read_link(full) {
            Ok(t) => Some(t.into_os_string().as_bytes().to_vec()),
            Err(e) => {
                problems.push(format!("{}: readlink: {e}", show(rel)));
                None
            }
        }
    } else {
        None
    };
    let content = if kind == Kind::File {
        let r = if md.size() <= CONTENT_LIMIT {
            fs::File::open(full)
                .and_then(|mut f| {
                    let mut v = Vec::with_capacity(md.size() as usize);
                    f.read_to_end(&mut v).map(|_| v)
                })
                .map(|v| digest(&v))
                .map_err(|e| e.to_string())
        } else {
            fs::File::open(full).map_err(|e| e.to_string()).and_then(|f| {
                digest_windows(md.size(), |off, buf| f.read_exact_at(buf, off).map_err(|e| e.to_string()))
            })
        };
        match r {
            Ok(d) => Some(d),
            Err(e) => {
                problems.push(format!("{}: read: {e}", show(rel)));
                None
            }
        }
    } else {
        None
    };
    let (flags, generation) = if matches!(kind, Kind::File | Kind::Dir) {
        match kernel_flags(full) {
            Ok((f, g)) => (Some(f), Some(g)),
            Err(e) => {
                problems.push(format!("{}: {e}", show(rel)));
                (None, None)
            }
        }
    } else {
        (None, None)
    };
    let rec = Rec {
        kind,
        dtype,
        dirent_ino,
        ino: md.ino(),
        mode: md.mode(),
        nlink: md.nlink(),
        uid: md.uid(),
        gid: md.gid(),
        size: md.size(),
        blocks: md.blocks(),
        blksize: md.blksize(),
        atime: (md.atime(), md.atime_nsec() as u32),
        mtime: (md.mtime(), md.mtime_nsec() as u32),
        ctime: (md.ctime(), md.ctime_nsec() as u32),
        crtime: systime(md.created()),
        rdev: dev_split(md.rdev()),
        flags,
        generation,
        target,
        xattrs,
        content,
    };
    w.problems.extend(problems);
    if w.recs.insert(rel.to_vec(), rec).is_some() {
        w.problems.push(format!("{}: listed twice", show(rel)));
        return;
    }
    if kind != Kind::Dir {
        return;
    }
    let rd = match fs::read_dir(full) {
        Ok(rd) => rd,
        Err(e) => {
            w.problems.push(format!("{}: readdir: {e}", show(rel)));
            return;
        }
    };
    for e in rd {
        let e = match e {
            Ok(e) => e,
            Err(e) => {
                w.problems.push(format!("{}: readdir: {e}", show(rel)));
                return;
            }
        };
        let name = e.file_name();
        let child_rel = join(rel, name.as_bytes());
        let child = full.join(&name);
        let dtype = e.file_type().ok().and_then(Kind::of_std);
        match fs::symlink_metadata(&child) {
            Ok(cmd) => kernel_visit(&child, &child_rel, &cmd, dtype, e.ino(), w),
            Err(err) => w.problems.push(format!("{}: lstat: {err}", show(&child_rel))),
        }
    }
}

fn ts(t: rext4::Timestamp) -> (i64, u32) {
    (t.sec, t.nsec)
}

/// Describes the tree as rext4 shows it, through both APIs: entries from the path-level
/// `read_dir`, attributes from `lookup` (inode level) cross-checked against
/// `symlink_metadata` (path level) and the entry's inode number, targets from `read_link` and
/// `readlink`, contents from `read_file` / `read_at`, xattrs from `listxattr`/`getxattr`.
/// With `order`, each directory's children are visited in a shuffled order.
pub fn walk_rext4(fs: &Fs, order: Option<u64>) -> Walk {
    let mut w = Walk::default();
    let mut rng = order.map(Rng::new);
    let root = fs.root();
    match fs.getattr(root) {
        Ok(attr) => {
            match fs.symlink_metadata("/") {
                Ok(a) if a == attr => {}
                Ok(a) => w.problems.push(format!("\"/\": symlink_metadata {a:?} != getattr {attr:?}")),
                Err(e) => w.problems.push(format!("\"/\": symlink_metadata: {e}")),
            }
            rext4_visit(fs, b"/", &attr, None, u64::from(root.0), &mut w, &mut rng);
        }
        Err(e) => w.problems.push(format!("getattr(root): {e}")),
    }
    w
}

fn rext4_visit(
    fs: &Fs,
    rel: &[u8],
    attr: &Attr,
    dtype: Option<Kind>,
    dirent_ino: u64,
    w: &mut Walk,
    rng: &mut Option<Rng>,
) {
    let kind = Kind::of_rext4(attr.kind);
    let path = Path::new(OsStr::from_bytes(rel));
    let ino = attr.ino;
    let mut problems = Vec::new();
    let mut xattrs = BTreeMap::new();
    match fs.listxattr(ino) {
        Ok(names) => {
            for n in names {
                match fs.getxattr(ino, &n) {
                    Ok(v) => {
                        if xattrs.insert(n.clone(), v).is_some() {
                            problems.push(format!("{}: xattr {} listed twice", show(rel), show(&n)));
                        }
                    }
                    Err(e) => problems.push(format!("{}: getxattr {}: {e}", show(rel), show(&n))),
                }
            }
        }
        Err(e) => problems.push(format!("{}: listxattr: {e}", show(rel))),
    }
    let target = if kind == Kind::Symlink {
        match (fs.read_link(path), fs.readlink(ino)) {
            (Ok(p), Ok(t)) => {
                let p = p.into_os_string().as_bytes().to_vec();
                if p != t {
                    problems.push(format!("{}: read_link {} != readlink {}", show(rel), show(&p), show(&t)));
                }
                Some(t)
            }
            (Err(e), _) | (_, Err(e)) => {
                problems.push(format!("{}: readlink: {e}", show(rel)));
                None
            }
        }
    } else {
        None
    };
    let content = if kind == Kind::File {
        let r = if attr.size <= CONTENT_LIMIT {
            fs.read_file(path).map(|v| digest(&v)).map_err(|e| e.to_string())
        } else {
            fs.open_file(path).map_err(|e| e.to_string()).and_then(|f| {
                digest_windows(attr.size, |off, buf| {
                    let mut done = 0;
                    while done < buf.len() {
                        match f.read_at(&mut buf[done..], off + done as u64) {
                            Ok(0) => return Err(format!("short read at {}", off + done as u64)),
                            Ok(n) => done += n,
                            Err(e) => return Err(e.to_string()),
                        }
                    }
                    Ok(())
                })
            })
        };
        match r {
            Ok(d) => Some(d),
            Err(e) => {
                problems.push(format!("{}: read: {e}", show(rel)));
                None
            }
        }
    } else {
        None
    };
    let (flags, generation) = if matches!(kind, Kind::File | Kind::Dir) {
        (Some(attr.flags), Some(attr.generation))
    } else {
        (None, None)
    };
    let rec = Rec {
        kind,
        dtype,
        dirent_ino,
        ino: u64::from(ino.0),
        mode: u32::from(attr.mode),
        nlink: u64::from(attr.nlink),
        uid: attr.uid,
        gid: attr.gid,
        size: attr.size,
        blocks: attr.blocks,
        blksize: u64::from(attr.blksize),
        atime: ts(attr.atime),
        mtime: ts(attr.mtime),
        ctime: ts(attr.ctime),
        crtime: attr.crtime.map(ts),
        rdev: attr.rdev,
        flags,
        generation,
        target,
        xattrs,
        content,
    };
    w.problems.extend(problems);
    if w.recs.insert(rel.to_vec(), rec).is_some() {
        w.problems.push(format!("{}: listed twice", show(rel)));
        return;
    }
    if kind != Kind::Dir {
        return;
    }
    let mut entries = Vec::new();
    match fs.read_dir(path) {
        Ok(rd) => {
            for e in rd {
                match e {
                    Ok(e) => entries.push(e),
                    Err(e) => {
                        w.problems.push(format!("{}: read_dir: {e}", show(rel)));
                        break;
                    }
                }
            }
        }
        Err(e) => {
            w.problems.push(format!("{}: read_dir: {e}", show(rel)));
            return;
        }
    }
    if let Some(r) = rng.as_mut() {
        r.shuffle(&mut entries);
    }
    for e in entries {
        let child_rel = join(rel, &e.name);
        if e.name == b"." || e.name == b".." || e.name.is_empty() {
            w.problems.push(format!("{}: read_dir returned {}", show(rel), show(&e.name)));
            continue;
        }
        let a = match fs.lookup(ino, &e.name) {
            Ok(a) => a,
            Err(err) => {
                w.problems.push(format!("{}: lookup: {err}", show(&child_rel)));
                continue;
            }
        };
        if a.ino != e.ino {
            w.problems.push(format!(
                "{}: lookup gives inode {} but the entry says {}",
                show(&child_rel),
                a.ino.0,
                e.ino.0
            ));
        }
        match fs.symlink_metadata(Path::new(OsStr::from_bytes(&child_rel))) {
            Ok(b) if b == a => {}
            Ok(b) => w.problems.push(format!("{}: symlink_metadata {b:?} != lookup {a:?}", show(&child_rel))),
            Err(err) => w.problems.push(format!("{}: symlink_metadata: {err}", show(&child_rel))),
        }
        rext4_visit(fs, &child_rel, &a, e.kind.map(Kind::of_rext4), u64::from(e.ino.0), w, rng);
    }
}

// ------------------------------------------------------------------------------------------
// Diffs
// ------------------------------------------------------------------------------------------

fn field_diffs(a: &Rec, b: &Rec, out: &mut Vec<String>, path: &[u8], an: &str, bn: &str) {
    macro_rules! cmp {
        ($($f:ident),*) => {$(
            if a.$f != b.$f {
                out.push(format!("{}: {}: {an}={:?} {bn}={:?}", show(path), stringify!($f), a.$f, b.$f));
            }
        )*};
    }
    cmp!(
        kind, dtype, dirent_ino, ino, mode, nlink, uid, gid, size, blocks, blksize, atime, mtime, ctime,
        crtime, rdev, flags, generation, target, content
    );
    xattr_diffs(&a.xattrs, &b.xattrs, out, path, an, bn);
}

fn xattr_diffs(
    a: &BTreeMap<Vec<u8>, Vec<u8>>,
    b: &BTreeMap<Vec<u8>, Vec<u8>>,
    out: &mut Vec<String>,
    path: &[u8],
    an: &str,
    bn: &str,
) {
    for (k, v) in a {
        match b.get(k) {
            None => out.push(format!("{}: xattr {} only in {an}", show(path), show(k))),
            Some(w) if w != v => {
                out.push(format!("{}: xattr {}: {an}={v:02x?} {bn}={w:02x?}", show(path), show(k)))
            }
            _ => {}
        }
    }
    for k in b.keys().filter(|k| !a.contains_key(*k)) {
        out.push(format!("{}: xattr {} only in {bn}", show(path), show(k)));
    }
}

fn problems_of(w: &Walk, name: &str, out: &mut Vec<String>) {
    out.extend(w.problems.iter().map(|p| format!("{name} walk: {p}")));
}

/// Every difference between two complete descriptions (e.g. kernel vs rext4): all fields,
/// including inode numbers, nanosecond times, flags and xattrs.
pub fn diff_full(an: &str, a: &Walk, bn: &str, b: &Walk) -> Vec<String> {
    let mut out = Vec::new();
    problems_of(a, an, &mut out);
    problems_of(b, bn, &mut out);
    for (p, ra) in &a.recs {
        match b.recs.get(p) {
            None => out.push(format!("{}: only in {an}", show(p))),
            Some(rb) => field_diffs(ra, rb, &mut out, p, an, bn),
        }
    }
    for p in b.recs.keys().filter(|p| !a.recs.contains_key(*p)) {
        out.push(format!("{}: only in {bn}", show(p)));
    }
    out
}

/// How an image is compared with the tree it was made from.
#[derive(Clone, Copy, Debug)]
pub struct SourceCmp {
    /// Compare mtime nanoseconds too (kernel-written images; `mkfs.ext4 -d` drops them).
    pub mtime_ns: bool,
}

fn link_groups(w: &Walk) -> BTreeSet<Vec<Vec<u8>>> {
    let mut by_ino: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    for (p, r) in &w.recs {
        if r.kind != Kind::Dir && r.nlink > 1 {
            by_ino.entry(r.ino).or_default().push(p.clone());
        }
    }
    by_ino.into_values().collect()
}

/// Differences between a source tree and an image made from it: what the tree specifies
/// (type, permissions, owners, size, bytes, targets, xattrs, link counts, devices, mtime,
/// hard-link groups). The image's root and `lost+found` are not part of the source.
pub fn diff_source(src: &Walk, img: &Walk, cmp: SourceCmp) -> Vec<String> {
    let mut out = Vec::new();
    problems_of(src, "source", &mut out);
    problems_of(img, "image", &mut out);
    let (an, bn) = ("source", "image");
    for (p, s) in &src.recs {
        if p == b"/" {
            continue;
        }
        let Some(r) = img.recs.get(p) else {
            out.push(format!("{}: missing from the image", show(p)));
            continue;
        };
        macro_rules! cmp {
            ($($f:ident),*) => {$(
                if s.$f != r.$f {
                    out.push(format!("{}: {}: {an}={:?} {bn}={:?}", show(p), stringify!($f), s.$f, r.$f));
                }
            )*};
        }
        cmp!(kind, dtype, mode, uid, gid, nlink, rdev, target, content);
        if s.kind != Kind::Dir && s.size != r.size {
            out.push(format!("{}: size: {an}={} {bn}={}", show(p), s.size, r.size));
        }
        // Seconds outside the signed 32-bit range need the extra epoch bits, which
        // mkfs.ext4 1.47.0 -d does not write; the kernel comparison covers those.
        let in_range = i32::try_from(s.mtime.0).is_ok();
        if (cmp.mtime_ns || in_range) && s.mtime.0 != r.mtime.0 {
            out.push(format!("{}: mtime seconds: {an}={:?} {bn}={:?}", show(p), s.mtime, r.mtime));
        }
        if cmp.mtime_ns && s.mtime.1 != r.mtime.1 {
            out.push(format!("{}: mtime ns: {an}={:?} {bn}={:?}", show(p), s.mtime, r.mtime));
        }
        xattr_diffs(&s.xattrs, &r.xattrs, &mut out, p, an, bn);
    }
    for p in img.recs.keys() {
        let lf = p == b"/lost+found" || p.starts_with(b"/lost+found/");
        if !lf && p != b"/" && !src.recs.contains_key(p) {
            out.push(format!("{}: in the image but not in the source", show(p)));
        }
    }
    let (gs, gi) = (link_groups(src), link_groups(img));
    for g in gs.symmetric_difference(&gi) {
        let names: Vec<String> = g.iter().map(|p| show(p)).collect();
        let side = if gs.contains(g) { an } else { bn };
        out.push(format!("hard-link group only in {side}: {names:?}"));
    }
    out
}

/// Sections of differences found by one test, reported together at the end.
#[derive(Default)]
pub struct Report(Vec<(String, Vec<String>)>);

impl Report {
    pub fn add(&mut self, what: impl Into<String>, diffs: Vec<String>) {
        if !diffs.is_empty() {
            self.0.push((what.into(), diffs));
        }
    }
    /// Runs `f`, recording a panic in it as a difference.
    pub fn run(&mut self, what: &str, f: impl FnOnce()) {
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            self.0.push((what.into(), vec![msg]));
        }
    }
    /// Panics listing every section, if there are any differences.
    #[track_caller]
    pub fn finish(self) {
        if self.0.is_empty() {
            return;
        }
        // REXT4_DIFF_ALL=1 lists every difference, not just the first 25 of each section.
        let shown = if std::env::var_os("REXT4_DIFF_ALL").is_some() { usize::MAX } else { 25 };
        let mut text = String::new();
        for (what, diffs) in &self.0 {
            text.push_str(&format!("\n{what}: {} difference(s)\n", diffs.len()));
            for d in diffs.iter().take(shown) {
                text.push_str(&format!("  {d}\n"));
            }
        }
        panic!("{text}");
    }
}

/// Panics listing the differences, if there are any.
#[track_caller]
pub fn assert_no_diff(what: &str, diffs: &[String]) {
    if diffs.is_empty() {
        return;
    }
    let shown: Vec<&String> = diffs.iter().take(40).collect();
    panic!(
        "{what}: {} difference(s); first {}:\n{}",
        diffs.len(),
        shown.len(),
        shown.iter().map(|s| format!("  {s}")).collect::<Vec<_>>().join("\n")
    );
}

/// Differences between rext4's `statfs` and the kernel's `statvfs` of its mount.
pub fn statfs_diff(fs: &Fs, mount: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let k = match nix::sys::statvfs::statvfs(mount) {
        Ok(k) => k,
        Err(e) => return vec![format!("statvfs {}: {e}", mount.display())],
    };
    let r = match fs.statfs() {
        Ok(r) => r,
        Err(e) => return vec![format!("rext4 statfs: {e}")],
    };
    let pairs: [(&str, u64, u64); 8] = [
        ("block size", k.block_size(), u64::from(r.block_size)),
        ("blocks", k.blocks(), r.blocks),
        ("free blocks", k.blocks_free(), r.blocks_free),
        ("available blocks", k.blocks_available(), r.blocks_avail),
        ("inodes", k.files(), r.files),
        ("free inodes", k.files_free(), r.files_free),
        ("name max", k.name_max(), u64::from(r.name_max)),
        ("fsid", k.filesystem_id(), r.fsid),
    ];
    for (what, kv, rv) in pairs {
        if kv != rv {
            out.push(format!("statfs {what}: kernel={kv} rext4={rv}"));
        }
    }
    out
}

// ------------------------------------------------------------------------------------------
// Checks shared by the test files
// ------------------------------------------------------------------------------------------

/// Reads a directory with the inode-level `readdir`, stopping after every `step` entries and
/// resuming at the last entry's `next`: the result must be the same as one uninterrupted
/// pass, without duplicates, and include `.` and `..`.
pub fn readdir_resume(fs: &Fs, path: &str, step: usize) {
    let ino = fs.resolve(path, true).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut all = Vec::new();
    fs.readdir(ino, 0, |e| {
        all.push((e.name.clone(), e.ino));
        true
    })
    .unwrap_or_else(|e| panic!("readdir {path}: {e}"));
    let mut resumed = Vec::new();
    let mut pos = 0;
    let mut calls = 0;
    loop {
        let mut got = 0;
        fs.readdir(ino, pos, |e| {
            pos = e.next;
            resumed.push((e.name.clone(), e.ino));
            got += 1;
            got < step
        })
        .unwrap_or_else(|e| panic!("readdir {path} from {pos}: {e}"));
        calls += 1;
        if got < step || calls > all.len() + 5 {
            break;
        }
    }
    assert!(
        all.iter().any(|e| e.0 == b".") && all.iter().any(|e| e.0 == b".."),
        "{path}: readdir lacks . or .."
    );
    let mut names: Vec<_> = all.iter().map(|e| &e.0).collect();
    names.sort();
    let n = names.len();
    names.dedup();
    assert_eq!(names.len(), n, "{path}: readdir returned duplicate names");
    assert!(
        resumed == all,
        "{path}: readdir resumed every {step} entries differs ({} vs {} entries)",
        resumed.len(),
        all.len()
    );
}

/// Walks the image from `threads` threads at once (half share `fs`, half open their own
/// handle with tiny caches), each in its own order, while another thread keeps dropping the
/// shared caches; every walk must equal `expected`.
pub fn concurrent_walks(img: &Path, fs: &Fs, expected: &Walk, threads: u64) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let dropper = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                fs.drop_caches();
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
        });
        let walkers: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let own;
                    let f = if t % 2 == 0 {
                        fs
                    } else {
                        let opts =
                            rext4::Options { cache_bytes: 256 << 10, inode_cache: 64, ..Default::default() };
                        own = Fs::open_with(img, opts).expect("open image again");
                        &own
                    };
                    walk_rext4(f, Some(t + 1))
                })
            })
            .collect();
        let results: Vec<_> = walkers.into_iter().map(|h| h.join()).collect();
        stop.store(true, Ordering::Relaxed);
        dropper.join().expect("cache dropper panicked");
        for (t, r) in results.into_iter().enumerate() {
            match r {
                Ok(w) => assert_no_diff(
                    &format!("thread {t} vs single-threaded walk"),
                    &diff_full("single", expected, "thread", &w),
                ),
                Err(_) => panic!("walker thread {t} panicked"),
            }
        }
    });
}

/// Every image a crash could leave, built one at a time (a long run has too many to hold):
/// the state at each flush, and the same with a random subset of the writes up to the next
/// flush (disks reorder unflushed writes). Only every `stride`th flush is handed to `f`, as
/// `(op index of the flush, image)`.
pub fn for_each_crash_image(
    ops: &[rext4::dev::Op],
    initial: &[u8],
    seed: u64,
    stride: usize,
    mut f: impl FnMut(usize, &[u8]),
) {
    let mut rng = Rng::new(seed);
    let flushes: Vec<usize> =
        ops.iter().enumerate().filter(|(_, o)| matches!(o, rext4::dev::Op::Flush)).map(|(i, _)| i).collect();
    let mut base = initial.to_vec();
    let mut done = 0;
    for (n, &k) in flushes.iter().enumerate() {
        rext4::dev::apply_ops(&mut base, ops, done, k, |_| true);
        done = k;
        let chosen = n % stride.max(1) == 0;
        if chosen {
            f(k, &base);
        }
        let next = flushes.get(n + 1).copied().unwrap_or(ops.len());
        if next > k + 2 {
            let mask = rng.next_u64();
            if chosen {
                let mut img = base.clone();
                rext4::dev::apply_ops(&mut img, ops, k + 1, next, |i| (mask >> (i % 64)) & 1 == 1);
                f(k, &img);
            }
        }
    }
}

/// The flushes recorded in `ops`.
pub fn flush_count(ops: &[rext4::dev::Op]) -> usize {
    ops.iter().filter(|o| matches!(o, rext4::dev::Op::Flush)).count()
}

/// A write hook of [`HookedDevice`]: the bytes and the byte offset about to be written.
type WriteHook = Box<dyn Fn(&[u8], u64) + Send + Sync>;

/// A device that passes every call to `inner`, running a hook before each write and each
/// flush: tests watch, slow down or break the engine's I/O with it.
pub struct HookedDevice<D: ?Sized> {
    pub inner: std::sync::Arc<D>,
    on_write: WriteHook,
    on_flush: Box<dyn Fn() + Send + Sync>,
}

impl<D: rext4::dev::BlockDevice + ?Sized> HookedDevice<D> {
    pub fn new(inner: std::sync::Arc<D>) -> Self {
        HookedDevice { inner, on_write: Box::new(|_, _| {}), on_flush: Box::new(|| {}) }
    }

    pub fn on_write(mut self, f: impl Fn(&[u8], u64) + Send + Sync + 'static) -> Self {
        self.on_write = Box::new(f);
        self
    }

    pub fn on_flush(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_flush = Box::new(f);
        self
    }
}

impl<D: rext4::dev::BlockDevice + ?Sized> rext4::dev::BlockDevice for HookedDevice<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        (self.on_write)(buf, offset);
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        (self.on_flush)();
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

/// Unlinks every entry of directory `dir` (which holds files only) through the engine.
pub fn unlink_all(fs: &Fs, dir: rext4::InodeNo) {
    let mut names = Vec::new();
    fs.readdir(dir, 0, |e| {
        if e.name != b"." && e.name != b".." {
            names.push(e.name.to_vec());
        }
        true
    })
    .unwrap();
    for n in names {
        fs.unlink(dir, &n).unwrap();
    }
}
