//! A full disk, checked against a model: random writes (delayed and not, sparse ones needing
//! tree blocks, tiny ones that may stay inline), fallocate in every mode, directories sharing
//! one attribute block, slow symlinks, attributes on the files (several names; values in the
//! inode, in blocks that files share and copy when one changes, and in EA inodes), files
//! replaced by rename, truncates, punches, fsyncs and remounts, on a small image nearly filled
//! first, as a user and as root, on extent and block-map layouts with 1 KiB and 4 KiB blocks,
//! inline data, quota, `ea_inode` with and without quota, and an image that runs out of inodes
//! first.
//!
//! What must hold:
//! - a refusal is only ever `ENOSPC` (or a short write), or the errno the kernel gives the
//!   request whatever the space (`EINVAL` for a shift past the end, `EOPNOTSUPP` for
//!   fallocate on a block map);
//! - a refused request changes nothing (an allocating fallocate may keep what it allocated
//!   and a zero range what it zeroed, as the kernel's do);
//! - nothing accepted is lost: `fsync`, truncate, punch and collapse never fail (but a
//!   truncate up, punch and collapse may on an inline file, which they first move to a
//!   block), and every
//!   file, attribute and link reads as the model says before writeback, after it, after every
//!   remount and after the last;
//! - after writeback no reservation is left (`delalloc_blocks` 0, and the free count the same
//!   after a reopen), and e2fsck (quota usage included) is clean at every remount.

use proptest::prelude::*;
use rext4::{Fs, InodeNo, Options, SetAttr};
use rext4::{FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE, FALLOC_FL_KEEP_SIZE};
use rext4::{FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE};
use rext4_testkit::{e2fsck_clean, Image};
use std::collections::BTreeMap;
use std::path::Path;

const FILES: usize = 3;
/// Attribute names per file (`user.m0`..).
const NAMES: u8 = 3;
/// How far into a file the ops reach.
const SPAN: u64 = 4 << 20;

#[derive(Debug, Clone, Copy)]
enum Falloc {
    Alloc,
    KeepSize,
    Zero,
    Collapse,
    Insert,
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        file: usize,
        off: u64,
        len: usize,
        root: bool,
    },
    Fallocate {
        file: usize,
        kind: Falloc,
        off: u64,
        len: u64,
        root: bool,
    },
    Dir {
        root: bool,
    },
    Symlink {
        len: usize,
        root: bool,
    },
    /// Attribute `user.m{name}`; `shared`: a value every file may have too, so that files
    /// share one attribute block and a change to it copies the block.
    Xattr {
        file: usize,
        name: u8,
        len: usize,
        shared: bool,
        root: bool,
    },
    RemoveXattr {
        file: usize,
        name: u8,
    },
    Replace {
        file: usize,
        len: usize,
        root: bool,
    },
    Truncate {
        file: usize,
        size: u64,
    },
    Punch {
        file: usize,
        off: u64,
        len: u64,
    },
    Fsync {
        file: usize,
    },
    RemoveDir,
    Remount,
}

fn op() -> impl Strategy<Value = Op> {
    let file = 0..FILES;
    prop_oneof![
        // Small (delayed), tiny (inline where the image has it) and large (allocated at
        // once) writes, anywhere in the span.
        8 => (file.clone(), prop_oneof![0u64..SPAN, 0u64..200], prop_oneof![3 => 1usize..20_000, 1 => 1usize..100, 2 => 60_000usize..300_000], any::<bool>())
            .prop_map(|(file, off, len, root)| Op::Write { file, off, len, root }),
        2 => (file.clone(), prop_oneof![Just(Falloc::Alloc), Just(Falloc::KeepSize), Just(Falloc::Zero), Just(Falloc::Collapse), Just(Falloc::Insert)],
              0u64..SPAN / 1024, 1u64..256, any::<bool>())
            .prop_map(|(file, kind, off, len, root)| Op::Fallocate { file, kind, off: off * 1024, len: len * 1024, root }),
        3 => any::<bool>().prop_map(|root| Op::Dir { root }),
        1 => (1usize..1024, any::<bool>()).prop_map(|(len, root)| Op::Symlink { len, root }),
        // In-inode, block-sized, and (with `ea_inode`) EA-inode values; without `ea_inode`
        // a value larger than a block is refused with `ENOSPC`, as the kernel's is.
        2 => (file.clone(), 0..NAMES, prop_oneof![2 => 1usize..100, 2 => 500usize..3000, 1 => 3000usize..20_000],
              any::<bool>(), any::<bool>())
            .prop_map(|(file, name, len, shared, root)| {
                // Shared values come in a few sizes, so that equal ones meet.
                let len = if shared { [40, 900, 2000, 6000][len % 4] } else { len };
                Op::Xattr { file, name, len, shared, root }
            }),
        1 => (file.clone(), 0..NAMES).prop_map(|(file, name)| Op::RemoveXattr { file, name }),
        1 => (file.clone(), 0usize..200_000, any::<bool>()).prop_map(|(file, len, root)| Op::Replace { file, len, root }),
        1 => (file.clone(), 0u64..SPAN).prop_map(|(file, size)| Op::Truncate { file, size }),
        1 => (file.clone(), 0u64..SPAN, 1u64..200_000).prop_map(|(file, off, len)| Op::Punch { file, off, len }),
        1 => file.prop_map(|file| Op::Fsync { file }),
        1 => Just(Op::RemoveDir),
        1 => Just(Op::Remount),
    ]
}

fn as_caller<T>(root: bool, f: impl FnOnce() -> T) -> T {
    if root {
        rext4::with_reserved_blocks(f)
    } else {
        f()
    }
}

fn ids(root: bool) -> u32 {
    if root {
        0
    } else {
        1000
    }
}

fn expect_errno(e: rext4::Error, allowed: &[i32], what: &str) {
    assert!(allowed.contains(&e.errno()), "{what}: {e} (errno {})", e.errno());
}

/// What the files, their attributes and the links should hold.
#[derive(Default)]
struct Model {
    inos: Vec<InodeNo>,
    data: Vec<Vec<u8>>,
    /// Each file's attributes, by name.
    xattrs: Vec<BTreeMap<u8, Vec<u8>>>,
    /// Directories made, by name.
    dirs: Vec<Vec<u8>>,
    /// Symlinks made: name -> target.
    links: BTreeMap<Vec<u8>, Vec<u8>>,
}

fn xattr_name(name: u8) -> Vec<u8> {
    format!("user.m{name}").into_bytes()
}

fn read_all(fs: &Fs, ino: InodeNo, len: usize, when: &str) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let n = fs.read(ino, done as u64, &mut buf[done..]).unwrap_or_else(|e| panic!("{when}: read: {e}"));
        assert!(n > 0, "{when}: short read at {done} of {len}");
        done += n;
    }
    buf
}

fn check(fs: &Fs, m: &Model, when: &str) {
    for (k, (&ino, data)) in m.inos.iter().zip(&m.data).enumerate() {
        let size = fs.getattr(ino).unwrap().size;
        assert_eq!(size, data.len() as u64, "{when}: file {k}'s size");
        let buf = read_all(fs, ino, data.len(), when);
        if let Some(at) = buf.iter().zip(data).position(|(a, b)| a != b) {
            panic!("{when}: file {k} differs at byte {at}: {} not {}", buf[at], data[at]);
        }
        for name in 0..NAMES {
            match (m.xattrs[k].get(&name), fs.getxattr(ino, &xattr_name(name))) {
                (Some(v), Ok(got)) => assert!(got == *v, "{when}: file {k}'s attribute {name}"),
                (None, Err(e)) => assert_eq!(e.errno(), libc::ENODATA, "{when}: file {k}'s attribute {name}"),
                (want, got) => panic!(
                    "{when}: file {k}'s attribute {name}: want {:?}, got {:?}",
                    want.map(Vec::len),
                    got.map(|v| v.len())
                ),
            }
        }
        let mut names = fs.listxattr(ino).unwrap_or_else(|e| panic!("{when}: listxattr: {e}"));
        names.sort();
        let want: Vec<Vec<u8>> = m.xattrs[k].keys().map(|&n| xattr_name(n)).collect();
        assert_eq!(names, want, "{when}: file {k}'s attribute names");
    }
    for (name, target) in &m.links {
        let ino =
            fs.lookup(fs.root(), name).unwrap_or_else(|e| panic!("{when}: lookup of a symlink: {e}")).ino;
        assert!(fs.readlink(ino).unwrap() == *target, "{when}: a symlink's target");
    }
    for name in &m.dirs {
        fs.lookup(fs.root(), name).unwrap_or_else(|e| panic!("{when}: lookup of a directory: {e}"));
    }
}

fn open(img: &Path) -> Fs {
    Fs::open_with(img, Options { writable: true, ..Options::default() }).unwrap()
}

/// Writes every file back, checks that no reservation is left, unmounts, checks the image
/// and opens it again; the free count must not change across the reopen.
fn remount(fs: Fs, img: &Path, m: &Model, when: &str) -> Fs {
    check(&fs, m, &format!("{when}, before writeback"));
    for &ino in &m.inos {
        fs.fsync(ino).unwrap_or_else(|e| panic!("{when}: fsync: {e}"));
    }
    check(&fs, m, &format!("{when}, after writeback"));
    assert_eq!(fs.writeback_stats().delalloc_blocks, 0, "{when}: reservations left after writeback");
    let free = fs.statfs().unwrap().blocks_free;
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(img);
    let fs = open(img);
    assert_eq!(fs.statfs().unwrap().blocks_free, free, "{when}: free blocks across a reopen");
    check(&fs, m, &format!("{when}, after reopen"));
    fs
}

/// What the image can do.
#[derive(Clone, Copy)]
struct Layout {
    extents: bool,
    /// Files start inline: fallocate's punch and collapse convert them to blocks first,
    /// which may fail with `ENOSPC` (`ext4_fallocate` calls `ext4_convert_inline_data`).
    inline: bool,
}

/// `unit`: the bytes collapse and insert range shift by (a block, or a cluster with bigalloc).
fn step(fs: &Fs, m: &mut Model, i: usize, op: &Op, layout: Layout, bs: u64, unit: u64) {
    let what = format!("op {i} {op:?}");
    let root = fs.root();
    match *op {
        Op::Write { file, off, len, root } => {
            let data: Vec<u8> = (0..len).map(|j| (i * 31 + j / 511) as u8 | 1).collect();
            match as_caller(root, || fs.write(m.inos[file], off, &data)) {
                Ok(n) => {
                    let d = &mut m.data[file];
                    let end = off as usize + n;
                    if d.len() < end {
                        d.resize(end, 0);
                    }
                    d[off as usize..end].copy_from_slice(&data[..n]);
                }
                Err(e) => expect_errno(e, &[libc::ENOSPC], &what),
            }
        }
        Op::Fallocate { file, kind, off, len, root } => {
            let (off, len) = match kind {
                // The shifts take whole blocks (clusters with bigalloc).
                Falloc::Collapse | Falloc::Insert => (off / unit * unit, len.div_ceil(unit) * unit),
                _ => (off, len),
            };
            let mode = match kind {
                Falloc::Alloc => 0,
                Falloc::KeepSize => FALLOC_FL_KEEP_SIZE,
                Falloc::Zero => FALLOC_FL_ZERO_RANGE,
                Falloc::Collapse => FALLOC_FL_COLLAPSE_RANGE,
                Falloc::Insert => FALLOC_FL_INSERT_RANGE,
            };
            let ino = m.inos[file];
            let d = &mut m.data[file];
            let size = d.len() as u64;
            let r = as_caller(root, || fs.fallocate(ino, mode, off, len));
            let (o, e) = (off as usize, (off + len) as usize);
            if !layout.extents {
                expect_errno(r.expect_err("fallocate on a block map"), &[libc::EOPNOTSUPP], &what);
                return;
            }
            match (kind, r) {
                (Falloc::Collapse | Falloc::Insert, Err(err))
                    if layout.inline && err.errno() == libc::ENOSPC =>
                {
                    // Refused converting inline data, which comes before the range checks (as
                    // in `ext4_fallocate`: the kernel answers an insert past the end of a full
                    // disk's inline file with ENOSPC too); checked unchanged later.
                }
                (Falloc::Collapse, r) if off + len >= size => {
                    expect_errno(r.expect_err("collapse past the end"), &[libc::EINVAL], &what)
                }
                (Falloc::Insert, r) if off >= size => {
                    expect_errno(r.expect_err("insert past the end"), &[libc::EINVAL], &what)
                }
                (Falloc::Collapse, r) => {
                    r.unwrap_or_else(|e| panic!("{what}: {e}"));
                    d.drain(o..e);
                }
                (Falloc::Insert, Ok(())) => {
                    d.splice(o..o, std::iter::repeat_n(0, len as usize));
                }
                (Falloc::Insert, Err(e)) => expect_errno(e, &[libc::ENOSPC], &what),
                (Falloc::Alloc, Ok(())) if d.len() < e => d.resize(e, 0),
                (Falloc::Zero, Ok(())) => {
                    let n = d.len();
                    d[o.min(n)..e.min(n)].fill(0);
                    d.resize(n.max(e), 0);
                }
                (Falloc::Alloc | Falloc::KeepSize, Ok(())) => {}
                (Falloc::Alloc | Falloc::KeepSize | Falloc::Zero, Err(err)) => {
                    expect_errno(err, &[libc::ENOSPC], &what);
                    // What was allocated before the refusal may stay, reading as zeros,
                    // and the size may have grown over it (`ext4_alloc_file_blocks`).
                    let now = fs.getattr(ino).unwrap().size;
                    let grows = matches!(kind, Falloc::Alloc | Falloc::Zero);
                    assert!(now == size || (grows && now > size && now <= e as u64), "{what}: size {now}");
                    d.resize(now as usize, 0);
                    if matches!(kind, Falloc::Zero) {
                        let got = read_all(fs, ino, d.len(), &what);
                        for j in o.min(d.len())..e.min(d.len()) {
                            assert!(got[j] == d[j] || got[j] == 0, "{what}: byte {j} neither old nor zero");
                            d[j] = got[j];
                        }
                    }
                }
            }
        }
        Op::Dir { root } => {
            let name = format!("d{i}").into_bytes();
            let made = as_caller(root, || {
                fs.mkdir(fs.root(), &name, 0o755, ids(root), ids(root)).inspect(|a| {
                    if let Err(e) = fs.setxattr(a.ino, b"user.v", &[7u8; 3000], 0) {
                        expect_errno(e, &[libc::ENOSPC], &what);
                    }
                })
            });
            match made {
                Ok(_) => m.dirs.push(name),
                Err(e) => expect_errno(e, &[libc::ENOSPC], &what),
            }
        }
        Op::Symlink { len, root } => {
            let name = format!("l{i}").into_bytes();
            let len = len.min(bs as usize - 1);
            let target: Vec<u8> = (0..len).map(|j| b'a' + ((i + j) % 26) as u8).collect();
            match as_caller(root, || fs.symlink(fs.root(), &name, &target, ids(root), ids(root))) {
                Ok(_) => {
                    m.links.insert(name, target);
                }
                Err(e) => expect_errno(e, &[libc::ENOSPC], &what),
            }
        }
        Op::Xattr { file, name, len, shared, root } => {
            let value: Vec<u8> = if shared {
                (0..len).map(|j| (len + j / 97) as u8).collect()
            } else {
                (0..len).map(|j| (i + j / 89) as u8).collect()
            };
            match as_caller(root, || fs.setxattr(m.inos[file], &xattr_name(name), &value, 0)) {
                Ok(()) => {
                    m.xattrs[file].insert(name, value);
                }
                Err(e) => expect_errno(e, &[libc::ENOSPC], &what),
            }
        }
        Op::RemoveXattr { file, name } => match fs.removexattr(m.inos[file], &xattr_name(name)) {
            Ok(()) => {
                assert!(m.xattrs[file].remove(&name).is_some(), "{what}: removed an attribute never set")
            }
            // Removing may need a block: one shared with other files is copied first.
            Err(e) if e.errno() == libc::ENOSPC => assert!(m.xattrs[file].contains_key(&name), "{what}"),
            Err(e) => {
                assert_eq!(e.errno(), libc::ENODATA, "{what}: {e}");
                assert!(!m.xattrs[file].contains_key(&name), "{what}: the attribute is gone");
            }
        },
        Op::Replace { file, len, root } => {
            // A new file written and renamed over the old one, whose blocks (and delayed
            // pages, and reservations) go with it.
            let uid = ids(root);
            let made = as_caller(root, || fs.create(fs.root(), b"new", 0o666, uid, uid));
            let ino = match made {
                Ok(a) => a.ino,
                Err(e) => return expect_errno(e, &[libc::ENOSPC], &what),
            };
            let data: Vec<u8> = (0..len).map(|j| (i * 17 + j / 301) as u8 | 2).collect();
            let n = match as_caller(root, || fs.write(ino, 0, &data)) {
                Ok(n) => n,
                Err(e) => {
                    expect_errno(e, &[libc::ENOSPC], &what);
                    0
                }
            };
            let name = format!("f{file}").into_bytes();
            fs.rename(fs.root(), b"new", fs.root(), &name, 0)
                .unwrap_or_else(|e| panic!("{what}: rename: {e}"));
            m.inos[file] = ino;
            m.data[file] = data[..n].to_vec();
            m.xattrs[file].clear();
        }
        Op::Truncate { file, size } => {
            match fs.setattr(m.inos[file], &SetAttr { size: Some(size), ..SetAttr::default() }) {
                // Growing an inline file past what the record can hold moves it to a block.
                Err(e) if layout.inline && e.errno() == libc::ENOSPC => return,
                r => r.unwrap_or_else(|e| panic!("{what}: {e}")),
            };
            m.data[file].resize(size as usize, 0);
        }
        Op::Punch { file, off, len } => {
            let mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
            match fs.fallocate(m.inos[file], mode, off, len) {
                Err(e) if layout.inline && e.errno() == libc::ENOSPC => return,
                r => r.unwrap_or_else(|e| panic!("{what}: {e}")),
            }
            let d = &mut m.data[file];
            let (a, z) = ((off as usize).min(d.len()), ((off + len) as usize).min(d.len()));
            d[a..z].fill(0);
        }
        Op::Fsync { file } => fs.fsync(m.inos[file]).unwrap_or_else(|e| panic!("{what}: {e}")),
        Op::RemoveDir => {
            if let Some(name) = m.dirs.pop() {
                fs.rmdir(root, &name).unwrap_or_else(|e| panic!("{what}: {e}"));
            }
        }
        Op::Remount => unreachable!("run() remounts"),
    }
}

fn run(img: &Path, filler: u64, ops: &[Op], layout: Layout) {
    let mut fs = open(img);
    let (bs, unit) = (u64::from(fs.block_size()), fs.cluster_size());
    let root = fs.root();
    // Most of the disk, written and committed, so that the ops meet the end of it.
    let fill = fs.create(root, b"filler", 0o644, 0, 0).unwrap().ino;
    let chunk = vec![9u8; 1 << 20];
    let mut at = 0;
    while at < filler {
        match fs.write(fill, at, &chunk[..(filler - at).min(1 << 20) as usize]) {
            Ok(n) => at += n as u64,
            Err(_) => break,
        }
    }
    fs.fsync(fill).unwrap();
    let mut m = Model {
        inos: (0..FILES)
            .map(|k| fs.create(root, format!("f{k}").as_bytes(), 0o666, 1000, 1000).unwrap().ino)
            .collect(),
        data: vec![Vec::new(); FILES],
        xattrs: vec![BTreeMap::new(); FILES],
        ..Model::default()
    };
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Remount => fs = remount(fs, img, &m, &format!("op {i} remount")),
            op => step(&fs, &mut m, i, op, layout, bs, unit),
        }
    }
    remount(fs, img, &m, "at the end");
}

fn config() -> ProptestConfig {
    ProptestConfig {
        // Each case makes and checks an image; PROPTEST_CASES asks for more.
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(16),
        max_shrink_iters: 300,
        ..ProptestConfig::default()
    }
}

/// A 32 MiB image of `kind` with `-m reserve`, nearly filled, then `ops`.
fn case(kind: &str, reserve: &str, filler: u64, ops: &[Op]) {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("f.img");
    let image = Image::ext4("32M").args(["-m", reserve]);
    let (extents, inline) = (Layout { extents: true, inline: false }, Layout { extents: true, inline: true });
    let block_map = Layout { extents: false, inline: false };
    let (image, layout) = match kind {
        "ext4" => (image.block_size(4096), extents),
        "ext4-1k" => (image.block_size(1024), extents),
        "ext3" => (image.block_size(4096).fs_type("ext3"), block_map),
        "ext3-1k" => (image.block_size(1024).fs_type("ext3"), block_map),
        "inline_data" => (image.block_size(4096).features("inline_data"), inline),
        "quota" => (image.block_size(4096).features("quota"), extents),
        // Values too large for a block's attribute area live in EA inodes.
        "ea_inode" => (image.block_size(1024).features("ea_inode"), extents),
        "ea_inode_quota" => (image.block_size(4096).features("ea_inode,quota"), extents),
        // Inodes run out before blocks do, in some cases.
        "few_inodes" => (image.block_size(4096).inodes(24), extents),
        "bigalloc" => (image.block_size(4096).features("bigalloc").args(["-C", "16384"]), extents),
        "bigalloc-1k" => (image.block_size(1024).features("bigalloc").args(["-C", "4096"]), extents),
        // Usage charged in whole clusters, which e2fsck checks for every id.
        "bigalloc-quota" => {
            (image.block_size(4096).features("bigalloc,quota").args(["-C", "16384"]), extents)
        }
        _ => unreachable!("layout {kind}"),
    };
    image.build(&img);
    run(&img, filler << 20, ops, layout);
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op(), 1..80)
}

fn reserve() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("0"), Just("5")]
}

/// One proptest per layout, each with its own case count and regressions.
macro_rules! layouts {
    ($($test:ident => $kind:literal),* $(,)?) => {
        proptest! {
            #![proptest_config(config())]
            $(
                #[test]
                fn $test(filler in 20u64..26, reserve in reserve(), ops in ops()) {
                    case($kind, reserve, filler, &ops);
                }
            )*
        }
    };
}

layouts! {
    full_disk_ext4 => "ext4",
    full_disk_ext4_1k => "ext4-1k",
    full_disk_ext3 => "ext3",
    full_disk_ext3_1k => "ext3-1k",
    full_disk_inline_data => "inline_data",
    full_disk_few_inodes => "few_inodes",
    full_disk_ea_inode => "ea_inode",
    full_disk_ea_inode_quota => "ea_inode_quota",
    full_disk_quota => "quota",
    full_disk_bigalloc => "bigalloc",
    full_disk_bigalloc_1k => "bigalloc-1k",
    full_disk_bigalloc_quota => "bigalloc-quota",
}

/// The case that found a block map's new indirect blocks leaked when the data block after
/// them could not be had (a 760-byte write to a file's first block past the direct ones, on
/// a full disk).
#[test]
fn full_disk_ext3_indirect_branch_on_a_full_disk() {
    let w = |file, off, len, root| Op::Write { file, off, len, root };
    let ops = [
        w(1, 640239, 15122, false),
        w(0, 491520, 147457, false),
        w(2, 225555, 7918, false),
        w(0, 0, 8193, false),
        w(0, 640512, 219649, false),
        w(2, 287943, 19258, true),
        Op::Dir { root: false },
        Op::Dir { root: false },
        w(2, 209410, 14435, true),
        Op::Dir { root: true },
        Op::Dir { root: true },
        w(1, 892873, 9414, false),
        Op::Dir { root: true },
        w(1, 250167, 254774, false),
        w(1, 2296264, 17947, true),
        Op::Dir { root: true },
        w(1, 3075577, 145265, false),
        w(2, 3909022, 12684, false),
        w(1, 1209239, 7144, true),
        w(2, 3010387, 19996, false),
        Op::Dir { root: true },
        Op::RemoveDir,
        w(0, 489843, 760, false),
    ];
    case("ext3", "0", 25, &ops);
}

/// A zero range refused part way on a full disk: the extents it had already converted and
/// the blocks it had allocated stayed in memory only, so the image leaked those blocks and,
/// after a reopen, the range read its old bytes where reads had shown zeros.
#[test]
fn full_disk_zero_range_refused_part_way() {
    let w = |file, off, len| Op::Write { file, off, len, root: false };
    let ops = [
        w(0, 466219, 185046),
        w(1, 1700, 289117),
        w(0, 1280882, 173199),
        w(1, 3176102, 287846),
        Op::Write { file: 0, off: 443613, len: 1119, root: true },
        w(0, 187, 268793),
        Op::Fallocate { file: 2, kind: Falloc::KeepSize, off: 1692672, len: 86016, root: false },
        Op::Remount,
        Op::Fallocate { file: 0, kind: Falloc::Zero, off: 421888, len: 69632, root: false },
    ];
    for kind in ["ext4", "quota"] {
        case(kind, "0", 24, &ops);
    }
}

/// An insert past the end of an inline file on a full disk: the conversion out of the inode
/// comes first and is refused (ENOSPC), as the kernel answers it, before the range check that
/// gives EINVAL where there is room. The model expected EINVAL.
#[test]
fn full_disk_inline_insert_past_the_end() {
    let ops = [
        Op::Write { file: 2, off: 0, len: 1, root: false },
        Op::Fallocate { file: 0, kind: Falloc::Alloc, off: 0, len: 156672, root: false },
        Op::Write { file: 1, off: 0, len: 167937, root: false },
        Op::Fallocate { file: 2, kind: Falloc::Insert, off: 4096, len: 1024, root: false },
    ];
    case("inline_data", "0", 25, &ops);
}
