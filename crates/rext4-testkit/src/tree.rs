//! The deterministic source-tree generator: every file type, odd names, sparse files, hard
//! links, xattrs and ACLs, modes, owners and timestamps, and the changes a user would make.

use crate::rng::Rng;
use crate::spec::{paths, TreeSpec};
use crate::tools::is_root;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

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

pub(crate) fn ctx<T>(r: io::Result<T>, what: &str, p: &Path) -> T {
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
