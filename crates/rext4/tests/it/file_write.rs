//! File data: writes, truncates, fallocate modes and SEEK_DATA/SEEK_HOLE through the journal,
//! checked against an in-memory model, e2fsck, and what the kernel reads from the image.

use proptest::prelude::*;
use rext4::{Error, Fs, InodeNo, Options, SetAttr};
use rext4_testkit::{
    e2fsck_clean, extent_depth, kernel_can_mount, layout, require_kernel, Image, KernelMount, Rng,
};
use std::path::{Path, PathBuf};

const KEEP: u32 = rext4::FALLOC_FL_KEEP_SIZE;
const PUNCH: u32 = rext4::FALLOC_FL_PUNCH_HOLE;
const ZERO: u32 = rext4::FALLOC_FL_ZERO_RANGE;
const COLLAPSE: u32 = rext4::FALLOC_FL_COLLAPSE_RANGE;
const INSERT: u32 = rext4::FALLOC_FL_INSERT_RANGE;

fn mkfs(dir: &Path, name: &str, args: &[&str], size: &str) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    Image::ext4(size).args(args).build(&img);
    img
}

fn rw(img: &Path) -> Fs {
    Fs::open_with(img, Options { writable: true, ..Options::default() }).unwrap()
}

fn read_all(fs: &Fs, ino: InodeNo) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size as usize;
    let mut buf = vec![0u8; size];
    let mut done = 0;
    while done < size {
        let n = fs.read(ino, done as u64, &mut buf[done..]).unwrap();
        assert!(n > 0, "short read at {done} of {size}");
        done += n;
    }
    buf
}

/// Reads the whole file in pieces of `piece` bytes (small enough to go through the page cache).
pub(crate) fn read_pieces(fs: &Fs, ino: InodeNo, piece: usize) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size as usize;
    let mut buf = vec![0u8; size];
    let mut done = 0;
    while done < size {
        let end = (done + piece).min(size);
        let n = fs.read(ino, done as u64, &mut buf[done..end]).unwrap();
        assert!(n > 0, "short read at {done} of {size}");
        done += n;
    }
    buf
}

/// Checks the file against `model` through the page cache (pieces of odd sizes, so that
/// reads start and end inside blocks) and straight from the device (one large read).
fn check_both(fs: &Fs, ino: InodeNo, model: &[u8], what: &str) {
    let cached = read_pieces(fs, ino, 3000);
    assert!(cached == model, "{what}: cached reads differ (len {} vs {})", cached.len(), model.len());
    let mut whole = vec![0u8; model.len() + 70_000];
    let n = fs.read(ino, 0, &mut whole).unwrap();
    assert!(whole[..n] == *model, "{what}: direct read differs (len {n} vs {})", model.len());
}

fn truncate(fs: &Fs, ino: InodeNo, size: u64) -> rext4::Result<()> {
    fs.setattr(ino, &SetAttr { size: Some(size), ..SetAttr::default() }).map(|_| ())
}

/// Compares files on the kernel's mount of `img` with the expected contents.
fn kernel_reads(img: &Path, files: &[(String, Vec<u8>)]) {
    require_kernel!();
    let m = KernelMount::ro(img).unwrap();
    for (name, want) in files {
        let got = std::fs::read(m.path().join(name)).unwrap();
        assert!(got == *want, "kernel reads {name} differently ({} vs {} bytes)", got.len(), want.len());
    }
    m.unmount().unwrap();
}

#[derive(Clone, Debug)]
enum Op {
    Write {
        off: u64,
        len: usize,
        byte: u8,
    },
    Truncate(u64),
    Punch {
        off: u64,
        len: u64,
    },
    Zero {
        off: u64,
        len: u64,
        keep: bool,
    },
    Alloc {
        off: u64,
        len: u64,
        keep: bool,
    },
    Collapse {
        blk: u64,
        n: u64,
    },
    Insert {
        blk: u64,
        n: u64,
    },
    /// Writes the file's delayed pages back and commits.
    Fsync,
}

/// Offsets stay in the first 1 MiB plus a few far ones, so trees grow and holes are real.
fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![8 => 0u64..(1 << 20), 1 => (0u64..64).prop_map(|k| (k << 20) + 4093)]
}

fn op(extents: bool) -> impl Strategy<Value = Op> {
    let basic = prop_oneof![
        6 => (offset(), 1usize..40_000, any::<u8>()).prop_map(|(off, len, byte)| Op::Write { off, len, byte }),
        2 => offset().prop_map(Op::Truncate),
        1 => Just(Op::Fsync),
    ];
    if !extents {
        // Block maps punch holes too (and nothing else of fallocate).
        return prop_oneof![
            8 => basic,
            2 => (offset(), 1u64..100_000).prop_map(|(off, len)| Op::Punch { off, len }),
            1 => (0u64..(80 << 20), 1u64..(8 << 20)).prop_map(|(off, len)| Op::Punch { off, len }),
        ]
        .boxed();
    }
    prop_oneof![
        8 => basic,
        2 => (offset(), 1u64..100_000).prop_map(|(off, len)| Op::Punch { off, len }),
        2 => (offset(), 1u64..100_000, any::<bool>()).prop_map(|(off, len, keep)| Op::Zero { off, len, keep }),
        2 => (offset(), 1u64..100_000, any::<bool>()).prop_map(|(off, len, keep)| Op::Alloc { off, len, keep }),
        1 => (0u64..300, 1u64..20).prop_map(|(blk, n)| Op::Collapse { blk, n }),
        1 => (0u64..300, 1u64..20).prop_map(|(blk, n)| Op::Insert { blk, n }),
    ]
    .boxed()
}

/// [`op`] on a bigalloc image with `ratio` blocks a cluster: collapses and inserts by whole
/// clusters too (most of `op`'s are off the clusters, refused).
fn cluster_op(ratio: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => op(true),
        1 => (0u64..75, 1u64..5).prop_map(move |(c, n)| Op::Collapse { blk: c * ratio, n: n * ratio }),
        1 => (0u64..75, 1u64..5).prop_map(move |(c, n)| Op::Insert { blk: c * ratio, n: n * ratio }),
    ]
}

/// Small writes and truncates around the inline limit (60 bytes of `i_block`, about 128 in
/// a 256-byte record), with now and then an operation that needs blocks.
fn small_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u64..160, 1usize..140, any::<u8>()).prop_map(|(off, len, byte)| Op::Write { off, len, byte }),
        4 => (0u64..200).prop_map(Op::Truncate),
        1 => (0u64..5000, 1usize..5000, any::<u8>()).prop_map(|(off, len, byte)| Op::Write { off, len, byte }),
        1 => (0u64..200, 1u64..200).prop_map(|(off, len)| Op::Punch { off, len }),
        1 => (0u64..200, 1u64..200, any::<bool>()).prop_map(|(off, len, keep)| Op::Alloc { off, len, keep }),
    ]
}

/// Applies `op` to the engine and the model; both must agree on success or the errno.
/// `cluster`: the cluster size in bytes (the block size without bigalloc), which collapse
/// and insert range must be aligned to.
fn apply(fs: &Fs, ino: InodeNo, model: &mut Vec<u8>, op: &Op, bs: u64, cluster: u64) {
    let size = model.len() as u64;
    match *op {
        Op::Write { off, len, byte } => {
            let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8 / 7)).collect();
            assert_eq!(fs.write(ino, off, &data).unwrap(), len);
            let end = off as usize + len;
            if model.len() < end {
                model.resize(end, 0);
            }
            model[off as usize..end].copy_from_slice(&data);
        }
        Op::Truncate(s) => {
            truncate(fs, ino, s).unwrap();
            model.resize(s as usize, 0);
        }
        Op::Punch { off, len } => {
            fs.fallocate(ino, PUNCH | KEEP, off, len).unwrap();
            let (a, b) = ((off.min(size)) as usize, ((off + len).min(size)) as usize);
            model[a..b].fill(0);
        }
        Op::Zero { off, len, keep } => {
            fs.fallocate(ino, ZERO | if keep { KEEP } else { 0 }, off, len).unwrap();
            let end = off + len;
            if !keep && end > size {
                model.resize(end as usize, 0);
            }
            let (a, b) = ((off.min(model.len() as u64)) as usize, (end.min(model.len() as u64)) as usize);
            model[a..b].fill(0);
        }
        Op::Alloc { off, len, keep } => {
            fs.fallocate(ino, if keep { KEEP } else { 0 }, off, len).unwrap();
            if !keep && off + len > size {
                model.resize((off + len) as usize, 0);
            }
        }
        Op::Collapse { blk, n } => {
            let (off, len) = (blk * bs, n * bs);
            let r = fs.fallocate(ino, COLLAPSE, off, len);
            if off % cluster != 0 || len % cluster != 0 {
                assert!(matches!(r, Err(Error::InvalidInput(_))), "collapse off the clusters: {r:?}");
            } else if off + len >= size {
                assert!(matches!(r, Err(Error::InvalidInput(_))), "collapse past the end: {r:?}");
            } else {
                r.unwrap();
                model.drain(off as usize..(off + len) as usize);
            }
        }
        Op::Fsync => fs.fsync(ino).unwrap(),
        Op::Insert { blk, n } => {
            let (off, len) = (blk * bs, n * bs);
            let r = fs.fallocate(ino, INSERT, off, len);
            if off % cluster != 0 || len % cluster != 0 {
                assert!(matches!(r, Err(Error::InvalidInput(_))), "insert off the clusters: {r:?}");
            } else if off >= size {
                assert!(matches!(r, Err(Error::InvalidInput(_))), "insert past the end: {r:?}");
            } else {
                r.unwrap();
                let at = off as usize;
                model.splice(at..at, std::iter::repeat_n(0u8, len as usize));
            }
        }
    }
}

fn run_model(img: &Path, ops: &[Op], bs: u64) {
    run_model_with(img, ops, bs, Options { writable: true, ..Options::default() });
}

/// Applies `ops`, reading the file back after each one both through the page cache and
/// straight from the device (so every operation meets pages cached by the reads before it),
/// then checks the image with e2fsck and the kernel.
fn run_model_with(img: &Path, ops: &[Op], bs: u64, opts: Options) {
    run_model_clusters(img, ops, bs, bs, opts);
}

/// [`run_model_with`] on a bigalloc image of `cluster`-byte clusters.
fn run_model_clusters(img: &Path, ops: &[Op], bs: u64, cluster: u64, opts: Options) {
    let fs = Fs::open_with(img, opts).unwrap();
    let ino = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let mut model = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        apply(&fs, ino, &mut model, op, bs, cluster);
        check_both(&fs, ino, &model, &format!("after op {i} {op:?}"));
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(img);
    let fs = Fs::open(img).unwrap();
    let ino = fs.resolve("/f", false).unwrap();
    assert!(read_all(&fs, ino) == model, "contents differ after reopening");
    check_both(&fs, ino, &model, "after reopening");
    kernel_reads(img, &[("f".into(), model)]);
}

fn model_config() -> ProptestConfig {
    ProptestConfig { cases: 12, max_shrink_iters: 200, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(model_config())]

    #[test]
    fn model_4k_extents(ops in proptest::collection::vec(op(true), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let img = mkfs(dir.path(), "m", &[], "256M");
        run_model(&img, &ops, 4096);
    }

    #[test]
    fn model_bigalloc(ops in proptest::collection::vec(cluster_op(4), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let img = mkfs(dir.path(), "m", &["-O", "bigalloc", "-C", "16384"], "256M");
        run_model_clusters(&img, &ops, 4096, 16384, Options { writable: true, ..Options::default() });
    }

    #[test]
    fn model_bigalloc_1k(ops in proptest::collection::vec(cluster_op(4), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let img = mkfs(dir.path(), "m", &["-b", "1024", "-O", "bigalloc", "-C", "4096"], "256M");
        run_model_clusters(&img, &ops, 1024, 4096, Options { writable: true, ..Options::default() });
    }

    #[test]
    fn model_1k_extents_nocsum(ops in proptest::collection::vec(op(true), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let img = mkfs(dir.path(), "m", &["-b", "1024", "-O", "^metadata_csum"], "256M");
        run_model(&img, &ops, 1024);
    }

    #[test]
    fn model_inline_data(ops in proptest::collection::vec(small_op(), 1..30)) {
        let dir = tempfile::tempdir().unwrap();
        let img = mkfs(dir.path(), "m", &["-O", "inline_data", "-I", "256"], "64M");
        run_model(&img, &ops, 4096);
    }

    /// A page cache of 64 KiB: pages are evicted and loaded again between operations.
    #[test]
    fn model_4k_extents_small_page_cache(ops in proptest::collection::vec(op(true), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let img = mkfs(dir.path(), "m", &[], "256M");
        let opts = Options { writable: true, page_cache_bytes: 64 << 10, ..Options::default() };
        run_model_with(&img, &ops, 4096, opts);
    }

    /// Delayed writes written back all along: the flusher runs every few milliseconds and
    /// 1 MiB of dirty pages makes writers write back.
    #[test]
    fn model_4k_extents_writeback_all_along(ops in proptest::collection::vec(op(true), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let img = mkfs(dir.path(), "m", &[], "256M");
        let opts = Options {
            writable: true,
            page_cache_bytes: 256 << 10,
            dirty_expire: std::time::Duration::from_millis(2),
            ..Options::default()
        };
        run_model_with(&img, &ops, 4096, opts);
    }

    /// Without delayed allocation (`nodelalloc`): every write allocates.
    #[test]
    fn model_4k_extents_nodelalloc(ops in proptest::collection::vec(op(true), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let img = mkfs(dir.path(), "m", &[], "256M");
        let opts = Options { writable: true, delalloc: false, ..Options::default() };
        run_model_with(&img, &ops, 4096, opts);
    }

    #[test]
    fn model_block_map(ops in proptest::collection::vec(op(false), 1..30)) {
        let dir = tempfile::tempdir().unwrap();
        let img = mkfs(dir.path(), "m", &["-t", "ext3"], "256M");
        run_model(&img, &ops, 4096);
    }
}

/// A file with thousands of extents (every other block written) has a multi-level tree; it is
/// punched, collapsed and truncated back to nothing, freeing every tree block.
#[test]
fn deep_extent_tree_grows_and_shrinks() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "deep", &["-b", "1024"], "128M");
    let fs = rw(&img);
    let free0 = fs.statfs().unwrap().blocks_free;
    let ino = fs.create(fs.root(), b"frag", 0o644, 0, 0).unwrap().ino;
    let mut model = Vec::new();
    let mut rng = Rng::new(7);
    for i in 0..12_000u64 {
        let blk = i * 2;
        let data = rng.bytes(1024);
        fs.write(ino, blk * 1024, &data).unwrap();
        model.resize((blk as usize + 1) * 1024, 0);
        model[blk as usize * 1024..].copy_from_slice(&data);
    }
    assert!(read_all(&fs, ino) == model);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    let depth = extent_depth(&img, "/frag");
    assert!(depth >= 2, "12,000 extents in 1 KiB blocks need two index levels, got depth {depth}");
    kernel_reads(&img, &[("frag".into(), model.clone())]);

    let fs = rw(&img);
    let ino = fs.resolve("/frag", false).unwrap();
    for _ in 0..200 {
        let off = rng.below(model.len() as u64);
        let len = rng.range(1, 200_000);
        fs.fallocate(ino, PUNCH | KEEP, off, len).unwrap();
        let end = ((off + len) as usize).min(model.len());
        model[off as usize..end].fill(0);
    }
    fs.fallocate(ino, COLLAPSE, 1024 * 100, 1024 * 3001).unwrap();
    model.drain(1024 * 100..1024 * 3101);
    assert!(read_all(&fs, ino) == model);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    kernel_reads(&img, &[("frag".into(), model.clone())]);

    let fs = rw(&img);
    let ino = fs.resolve("/frag", false).unwrap();
    truncate(&fs, ino, 0).unwrap();
    assert_eq!(fs.getattr(ino).unwrap().blocks, 0, "every data and tree block freed");
    fs.unlink(fs.root(), b"frag").unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.statfs().unwrap().blocks_free, free0);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}

/// SEEK_DATA / SEEK_HOLE agree with the kernel's on the same file.
#[test]
fn seek_data_and_hole_match_the_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "seek", &[], "64M");
    let fs = rw(&img);
    let ino = fs.create(fs.root(), b"s", 0o644, 0, 0).unwrap().ino;
    fs.write(ino, 8192, &[1u8; 5000]).unwrap();
    fs.write(ino, 1 << 20, &[2u8; 100]).unwrap();
    fs.fallocate(ino, KEEP, 200_000, 50_000).unwrap();
    fs.write(ino, 3 << 20, &[3u8; 10]).unwrap();
    let size = fs.getattr(ino).unwrap().size;
    let probes: Vec<u64> = vec![
        0,
        1,
        4096,
        8191,
        8192,
        12000,
        13192,
        16384,
        199_999,
        220_000,
        1 << 20,
        (1 << 20) + 99,
        (3 << 20) + 5,
        size - 1,
        size,
        size + 10,
    ];
    let ours: Vec<(String, String)> = probes
        .iter()
        .map(|&p| {
            let show = |r: rext4::Result<u64>| match r {
                Ok(v) => v.to_string(),
                Err(e) => format!("errno {}", e.errno()),
            };
            (show(fs.seek_data(ino, p)), show(fs.seek_hole(ino, p)))
        })
        .collect();
    assert_eq!(ours[0], ("8192".to_string(), "0".to_string()));
    assert_eq!(ours[probes.len() - 1].0, format!("errno {}", libc::ENXIO));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    require_kernel!();
    let m = KernelMount::ro(&img).unwrap();
    let f = std::fs::File::open(m.path().join("s")).unwrap();
    use std::os::fd::AsRawFd;
    for (i, &p) in probes.iter().enumerate() {
        let k = |whence| {
            // SAFETY: lseek on a file descriptor `f` owns and keeps open.
            let r = unsafe { libc::lseek(f.as_raw_fd(), p as i64, whence) };
            if r < 0 {
                format!("errno {}", std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
            } else {
                r.to_string()
            }
        };
        assert_eq!(ours[i], (k(libc::SEEK_DATA), k(libc::SEEK_HOLE)), "probe {p}");
    }
    drop(f);
    m.unmount().unwrap();
}

/// Threads write, extend and truncate their own files while allocating from the same groups:
/// no block is lost or handed out twice, and every file holds what its thread wrote.
#[test]
fn concurrent_writers_share_groups() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [
        ("ext4", &[][..]),
        ("ext3", &["-t", "ext3"][..]),
        ("bigalloc", &["-O", "bigalloc", "-C", "16384"][..]),
    ] {
        let img = mkfs(dir.path(), name, args, "256M");
        let fs = rw(&img);
        let threads = 8;
        let results: Vec<(String, Vec<u8>)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let fs = fs.clone();
                    s.spawn(move || {
                        let mut rng = Rng::new(100 + t);
                        let mut out = Vec::new();
                        for k in 0..3 {
                            let name = format!("t{t}_{k}");
                            let ino = fs.create(fs.root(), name.as_bytes(), 0o644, 0, 0).unwrap().ino;
                            let mut model = Vec::new();
                            for _ in 0..60 {
                                match rng.below(10) {
                                    0 => {
                                        let s = rng.below(model.len() as u64 + 1);
                                        truncate(&fs, ino, s).unwrap();
                                        model.truncate(s as usize);
                                    }
                                    1..=6 => {
                                        let n = rng.range(1, 70_000) as usize;
                                        let data = rng.bytes(n);
                                        let off = model.len() as u64;
                                        fs.write(ino, off, &data).unwrap();
                                        model.extend_from_slice(&data);
                                    }
                                    _ => {
                                        let off = rng.below(model.len() as u64 + 50_000);
                                        let n = rng.range(1, 20_000) as usize;
                                        let data = rng.bytes(n);
                                        fs.write(ino, off, &data).unwrap();
                                        let end = off as usize + data.len();
                                        if model.len() < end {
                                            model.resize(end, 0);
                                        }
                                        model[off as usize..end].copy_from_slice(&data);
                                    }
                                }
                            }
                            assert!(read_all(&fs, ino) == model, "{name} differs");
                            out.push((name, model));
                        }
                        out
                    })
                })
                .collect();
            handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img);
        kernel_reads(&img, &results);
    }
}

/// Filling the filesystem from several threads: every write succeeds (maybe short) or gets
/// ENOSPC, the image stays clean, and freeing space makes writes work again.
#[test]
fn enospc_from_many_threads() {
    enospc_from_threads(&[]);
}

/// ... on bigalloc (4 KiB clusters of 1 KiB blocks): the last clusters go, then `ENOSPC`.
#[test]
fn enospc_from_many_threads_in_clusters() {
    enospc_from_threads(&["-b", "1024", "-O", "bigalloc", "-C", "4096"]);
}

fn enospc_from_threads(mkfs_args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "full", mkfs_args, "32M");
    let fs = rw(&img);
    let written: Vec<(String, u64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let fs = fs.clone();
                s.spawn(move || {
                    let name = format!("fill{t}");
                    let ino = fs.create(fs.root(), name.as_bytes(), 0o644, 1000, 1000).unwrap().ino;
                    let chunk = vec![t as u8 + 1; 256 * 1024];
                    let mut off = 0u64;
                    loop {
                        match fs.write(ino, off, &chunk) {
                            Ok(n) => off += n as u64,
                            Err(Error::NoSpace) => break,
                            Err(e) => panic!("{name}: {e}"),
                        }
                    }
                    (name, off)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let total: u64 = written.iter().map(|w| w.1).sum();
    assert!(total > 20 << 20, "wrote only {total} bytes into 32 MiB");
    let st = fs.statfs().unwrap();
    assert!(st.blocks_avail < 16, "{} blocks still available after ENOSPC", st.blocks_avail);
    for (name, len) in &written {
        let ino = fs.resolve(format!("/{name}"), false).unwrap();
        assert_eq!(fs.getattr(ino).unwrap().size, *len);
    }
    // Free the largest file (at least a quarter of what was written; the threads race, so any
    // other may hold nothing): writing works again, once its transaction commits (done on
    // demand).
    let big = (0..written.len()).max_by_key(|&i| written[i].1).unwrap();
    let other = &written[(big + 1) % written.len()];
    fs.unlink(fs.root(), written[big].0.as_bytes()).unwrap();
    let ino = fs.resolve(format!("/{}", other.0), false).unwrap();
    assert_eq!(fs.write(ino, other.1, &[9u8; 1 << 20]).unwrap(), 1 << 20);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}

/// Files the kernel wrote are extended, overwritten, punched and truncated by rext4; the image
/// stays clean and the kernel reads what rext4 says is there.
#[test]
fn kernel_written_files_are_extended_and_truncated() {
    require_kernel!();
    kernel_files_changed(&[]);
}

/// ... on bigalloc (16 KiB clusters): the kernel's partial clusters are extended into, and
/// punched and truncated clusters freed as the kernel would.
#[test]
fn kernel_written_files_are_extended_and_truncated_in_clusters() {
    require_kernel!();
    kernel_files_changed(&["-O", "bigalloc", "-C", "16384"]);
}

fn kernel_files_changed(mkfs_args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "k", mkfs_args, "128M");
    let mut rng = Rng::new(3);
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    {
        let m = KernelMount::rw(&img).unwrap();
        for (i, len) in [0usize, 1, 4095, 4096, 100_000, 3_000_000].into_iter().enumerate() {
            let data = rng.bytes(len);
            std::fs::write(m.path().join(format!("k{i}")), &data).unwrap();
            files.push((format!("k{i}"), data));
        }
        m.unmount().unwrap();
    }
    let fs = rw(&img);
    for (name, model) in files.iter_mut() {
        let ino = fs.resolve(format!("/{name}"), false).unwrap();
        assert!(read_all(&fs, ino) == *model);
        let n = rng.range(1, 300_000) as usize;
        let extra = rng.bytes(n);
        fs.write(ino, model.len() as u64, &extra).unwrap();
        model.extend_from_slice(&extra);
        let off = rng.below(model.len() as u64);
        let patch = rng.bytes(5000);
        fs.write(ino, off, &patch).unwrap();
        let end = off as usize + patch.len();
        if model.len() < end {
            model.resize(end, 0);
        }
        model[off as usize..end].copy_from_slice(&patch);
        let p = rng.below(model.len() as u64);
        fs.fallocate(ino, PUNCH | KEEP, p, 10_000).unwrap();
        let pe = (p as usize + 10_000).min(model.len());
        model[p as usize..pe].fill(0);
        let t = rng.below(model.len() as u64);
        truncate(&fs, ino, t).unwrap();
        model.truncate(t as usize);
        assert!(read_all(&fs, ino) == *model);
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    kernel_reads(&img, &files);
}

/// The format's limits: EFBIG at the largest size, huge sparse sizes work.
#[test]
fn file_size_limits() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args, max) in [
        ("ext4", &["-b", "4096"][..], ((1u64 << 32) - 1) * 4096),
        ("ext3", &["-t", "ext3", "-b", "4096"][..], 2196873666560u64),
        ("ext4-1k", &["-b", "1024"][..], ((1u64 << 32) - 1) * 1024),
    ] {
        let img = mkfs(dir.path(), name, args, "64M");
        let fs = rw(&img);
        let ino = fs.create(fs.root(), b"big", 0o644, 0, 0).unwrap().ino;
        assert!(matches!(fs.write(ino, max, b"x"), Err(Error::FileTooBig)), "{name}: write at the limit");
        assert_eq!(fs.write(ino, max - 1, b"xy").unwrap(), 1, "{name}: short write up to the limit");
        assert_eq!(fs.getattr(ino).unwrap().size, max);
        assert!(matches!(truncate(&fs, ino, max + 1), Err(Error::FileTooBig)));
        truncate(&fs, ino, 5 << 30).unwrap();
        let mut b = [7u8; 16];
        assert_eq!(fs.read(ino, (5 << 30) - 16, &mut b).unwrap(), 16);
        assert_eq!(b, [0u8; 16]);
        assert!(fs.write(ino, 0, b"start").is_ok());
        truncate(&fs, ino, 0).unwrap();
        assert_eq!(fs.getattr(ino).unwrap().blocks, 0, "{name}: truncate to 0 frees everything");
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img);
        if kernel_can_mount() {
            // The kernel draws the line at the same place.
            let m = KernelMount::rw(&img).unwrap();
            let f = std::fs::OpenOptions::new().write(true).open(m.path().join("big")).unwrap();
            f.set_len(max).unwrap();
            let e = f.set_len(max + 1).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "{name}");
            f.set_len(0).unwrap();
            drop(f);
            m.unmount().unwrap();
        }
    }
}

/// Small files the kernel stored inline (`inline_data`) are moved into blocks when rext4
/// writes, truncates or fallocates them past what fits in the record; their bytes and the
/// image stay right.
#[test]
fn inline_data_files_are_converted_on_write() {
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "inline", &["-O", "inline_data", "-b", "4096"], "64M");
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    {
        let m = KernelMount::rw(&img).unwrap();
        for (i, len) in [0usize, 10, 59, 60, 100, 150].into_iter().enumerate() {
            let data: Vec<u8> = (0..len).map(|k| (k * 7 + i) as u8).collect();
            std::fs::write(m.path().join(format!("i{i}")), &data).unwrap();
            files.push((format!("i{i}"), data));
        }
        m.unmount().unwrap();
    }
    let fs = rw(&img);
    for (i, (name, model)) in files.iter_mut().enumerate() {
        let ino = fs.resolve(format!("/{name}"), false).unwrap();
        assert!(read_all(&fs, ino) == *model);
        match i % 3 {
            0 => {
                let extra = vec![0xEE; 5000];
                fs.write(ino, model.len() as u64 + 3, &extra).unwrap();
                model.resize(model.len() + 3, 0);
                model.extend_from_slice(&extra);
            }
            1 => {
                truncate(&fs, ino, 20_000).unwrap();
                model.resize(20_000, 0);
            }
            _ => {
                fs.fallocate(ino, 0, 0, 9000).unwrap();
                model.resize(model.len().max(9000), 0);
            }
        }
        assert!(read_all(&fs, ino) == *model, "{name}");
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    kernel_reads(&img, &files);
}

/// What one file goes through in `small_files_stay_inline_as_in_the_kernel`.
#[derive(Clone, Copy, Debug)]
enum Step {
    Write(u64, usize),
    Truncate(u64),
}

/// On an `inline_data` filesystem, files whose bytes fit in the record are kept there, as
/// the kernel keeps them: the same writes and truncates, made by rext4 on one image and by
/// the kernel on another, leave every file with the same inline state, inline data size,
/// size and bytes (`debugfs stat`), and both images clean.
#[test]
fn small_files_stay_inline_as_in_the_kernel() {
    use Step::{Truncate as T, Write as W};
    require_kernel!();
    let scripts: Vec<(&str, Vec<Step>)> = vec![
        ("empty", vec![]),
        ("w10", vec![W(0, 10)]),
        ("w60", vec![W(0, 60)]),
        ("w61", vec![W(0, 61)]),
        ("w100", vec![W(0, 100)]),
        ("w128", vec![W(0, 128)]),
        ("w129", vec![W(0, 129)]),
        ("w4k", vec![W(0, 4096)]),
        ("append", vec![W(0, 50), W(50, 50)]),
        ("append_out", vec![W(0, 100), W(100, 100)]),
        ("hole", vec![W(100, 10)]),
        ("shrink", vec![W(0, 100), T(30)]),
        ("shrink70", vec![W(0, 100), T(70)]),
        ("grow_in", vec![W(0, 40), T(50)]),
        ("grow_out", vec![W(0, 40), T(90)]),
        ("grow_far", vec![W(0, 40), T(5000)]),
        ("sized_then_write", vec![T(50), W(0, 10)]),
        ("sized_big_then_write", vec![T(500), W(0, 10)]),
        ("rewrite", vec![W(0, 100), W(10, 5), T(0), W(0, 20)]),
    ];
    let bytes = |name: &str, off: u64, len: usize| -> Vec<u8> {
        (0..len).map(|i| (i as u64 + off) as u8 ^ name.len() as u8).collect()
    };
    let dir = tempfile::tempdir().unwrap();
    let args = ["-O", "inline_data", "-b", "4096", "-I", "256"];
    let ours = mkfs(dir.path(), "ours", &args, "64M");
    let theirs = mkfs(dir.path(), "theirs", &args, "64M");
    {
        let fs = rw(&ours);
        for (name, steps) in &scripts {
            let ino = fs.create(fs.root(), name.as_bytes(), 0o644, 0, 0).unwrap().ino;
            for &st in steps {
                match st {
                    W(off, len) => assert_eq!(fs.write(ino, off, &bytes(name, off, len)).unwrap(), len),
                    T(size) => truncate(&fs, ino, size).unwrap(),
                }
            }
        }
        fs.unmount().unwrap();
    }
    {
        use std::os::unix::fs::FileExt;
        let m = KernelMount::rw(&theirs).unwrap();
        for (name, steps) in &scripts {
            let f = std::fs::File::create(m.path().join(name)).unwrap();
            for &st in steps {
                match st {
                    W(off, len) => f.write_all_at(&bytes(name, off, len), off).unwrap(),
                    T(size) => f.set_len(size).unwrap(),
                }
            }
        }
        m.unmount().unwrap();
    }
    e2fsck_clean(&ours);
    e2fsck_clean(&theirs);
    let fs = Fs::open(&ours).unwrap();
    let m = KernelMount::ro(&theirs).unwrap();
    const INLINE_DATA_FL: u32 = 0x1000_0000;
    let mut inline = 0;
    for (name, _) in &scripts {
        let path = format!("/{name}");
        let (ours_flags, ours_inline, ours_size) = layout(&ours, &path);
        let (their_flags, their_inline, their_size) = layout(&theirs, &path);
        assert_eq!(
            (ours_flags & INLINE_DATA_FL, ours_inline, ours_size),
            (their_flags & INLINE_DATA_FL, their_inline, their_size),
            "{name}: inline flag, inline data size and size against the kernel's"
        );
        inline += usize::from(ours_inline.is_some());
        let ino = fs.resolve(&path, false).unwrap();
        let want = std::fs::read(m.path().join(name)).unwrap();
        assert!(read_all(&fs, ino) == want, "{name}: bytes differ from the kernel's");
    }
    m.unmount().unwrap();
    assert!(inline >= 10, "only {inline} files inline: the comparison shows little");
}

#[test]
fn write_from_file_copies_a_host_files_bytes() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(0x5eed_c0de);
    let src_bytes = rng.bytes(3 << 20);
    let src_path = dir.path().join("src");
    std::fs::write(&src_path, &src_bytes).unwrap();
    let src = std::fs::File::open(&src_path).unwrap();
    // The same bytes on another filesystem where there is one (tmpfs), which the kernel
    // does not copy from into this one (EXDEV): the image file copies through memory.
    let shm =
        tempfile::NamedTempFile::new_in("/dev/shm").or_else(|_| tempfile::NamedTempFile::new()).unwrap();
    std::fs::write(shm.path(), &src_bytes).unwrap();
    let other_fs_src = std::fs::File::open(shm.path()).unwrap();
    let img = mkfs(dir.path(), "img", &["-b", "4096"], "64M");
    // Copied by the kernel (an image file), then through memory (a device of other bytes).
    let file_fs = rw(&img);
    let mem = Arc::new(rext4::dev::MemDevice::new(std::fs::read(&img).unwrap()));
    let mem_fs = Fs::from_device(mem.clone(), Options { writable: true, ..Options::default() }).unwrap();
    let mut expect = Vec::new();
    for (fs, name, src) in [
        (&file_fs, "kernel_copy", &src),
        (&file_fs, "other_filesystem", &other_fs_src),
        (&mem_fs, "through_memory", &src),
    ] {
        let ino = fs.create(fs.root(), name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        let mut model = Vec::new();
        let put = |model: &mut Vec<u8>, off: u64, from: u64, len: u64| {
            let n = fs.write_from_file(ino, off, src, from, len).unwrap();
            assert_eq!(n, len, "{name}: short copy");
            let (o, f, l) = (off as usize, from as usize, len as usize);
            if model.len() < o + l {
                model.resize(o + l, 0);
            }
            model[o..o + l].copy_from_slice(&src_bytes[f..f + l]);
        };
        // Not block-aligned on either side, past a hole; then small (through memory either
        // way); then over bytes already read through the page cache, which must not keep
        // the old ones.
        put(&mut model, 5000, 100, (2 << 20) + 7);
        check_both(fs, ino, &model, name);
        put(&mut model, 100, 3, 1000);
        read_pieces(fs, ino, 3000);
        put(&mut model, 70_000, 1 << 20, 600_000);
        check_both(fs, ino, &model, name);
        // Fewer bytes in the source than asked: an error, nothing past what it holds.
        assert!(fs.write_from_file(ino, 0, src, (3 << 20) - 100_000, 200_000).is_err(), "{name}");
        expect.push((name.to_string(), read_all(fs, ino)));
    }
    file_fs.unmount().unwrap();
    mem_fs.unmount().unwrap();
    e2fsck_clean(&img);
    kernel_reads(&img, &expect[..2]);
    let mem_img = dir.path().join("mem.img");
    std::fs::write(&mem_img, mem.snapshot()).unwrap();
    e2fsck_clean(&mem_img);
    kernel_reads(&mem_img, &expect[2..]);
}

/// With `Fs::set_caller_write_times` (the mount's writeback cache, whose kernel stamps
/// writes itself), writes of every kind leave mtime and ctime as they were and still move
/// the size; without it they stamp both again.
#[test]
fn writes_leave_times_to_a_caller_that_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [("plain", &[][..]), ("inline", &["-O", "inline_data"][..])] {
        let img = mkfs(dir.path(), &format!("{name}.img"), args, "64M");
        let fs = rw(&img);
        let ino = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
        let before = fs.getattr(ino).unwrap();
        fs.set_caller_write_times(true);
        std::thread::sleep(std::time::Duration::from_millis(30));
        // Inline (on the inline image), delayed into holes, past 64 KiB (allocated at
        // once), in place after an fsync.
        fs.write(ino, 0, b"tiny").unwrap();
        fs.write(ino, 4, &[1u8; 20_000]).unwrap();
        fs.write(ino, 20_004, &[2u8; 100_000]).unwrap();
        fs.fsync(ino).unwrap();
        fs.write(ino, 10, &[3u8; 5000]).unwrap();
        let kept = fs.getattr(ino).unwrap();
        assert_eq!((kept.mtime, kept.ctime), (before.mtime, before.ctime), "{name}");
        assert_eq!(kept.size, 120_004, "{name}");
        fs.set_caller_write_times(false);
        fs.write(ino, 0, b"x").unwrap();
        let moved = fs.getattr(ino).unwrap();
        assert!(moved.mtime != before.mtime && moved.ctime != before.ctime, "{name}: stamped again");
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img);
        let fs = Fs::open(&img).unwrap();
        let a = fs.getattr(fs.lookup(fs.root(), b"f").unwrap().ino).unwrap();
        assert_eq!((a.mtime, a.size), (moved.mtime, 120_004), "{name}: after reopen");
    }
}

/// Under a caller that keeps the write times (FUSE's writeback cache), an fallocate that
/// grows the file leaves mtime and ctime to the caller, which stamps them for that case
/// (`fuse_file_fallocate`); the modes the caller does not stamp for still change ctime, as
/// ext4's do.
#[test]
fn a_growing_fallocate_leaves_times_to_a_caller_that_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "f.img", &[], "64M");
    let fs = rw(&img);
    let ino = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(ino, 0, &[7u8; 8192]).unwrap();
    fs.set_caller_write_times(true);
    let times = |fs: &Fs| {
        let a = fs.getattr(ino).unwrap();
        (a.mtime, a.ctime, a.size)
    };
    let tick = || std::thread::sleep(std::time::Duration::from_millis(30));
    let (m0, c0, _) = times(&fs);
    tick();
    fs.fallocate(ino, 0, 4096, 100_000).unwrap();
    fs.fallocate(ino, ZERO, 90_000, 30_000).unwrap();
    assert_eq!(times(&fs), (m0, c0, 120_000), "growing modes keep the caller's times");
    tick();
    fs.fallocate(ino, KEEP, 0, 500_000).unwrap();
    let (m1, c1, s1) = times(&fs);
    assert_eq!((m1, s1), (m0, 120_000), "KEEP_SIZE changes neither mtime nor size");
    assert_ne!(c1, c0, "KEEP_SIZE changes ctime, which the caller does not stamp");
    tick();
    fs.fallocate(ino, 0, 0, 50_000).unwrap();
    let (m2, c2, _) = times(&fs);
    assert_eq!(m2, m0, "an fallocate inside the size keeps mtime");
    assert_ne!(c2, c1, "and changes ctime");
    tick();
    fs.fallocate(ino, PUNCH | KEEP, 0, 4096).unwrap();
    let (m3, c3, _) = times(&fs);
    assert!(m3 != m2 && c3 != c2, "a punched hole changes both");
    fs.set_caller_write_times(false);
    tick();
    fs.fallocate(ino, 0, 0, 200_000).unwrap();
    let (m4, c4, s4) = times(&fs);
    assert!(m4 != m3 && c4 != c3 && s4 == 200_000, "stamped again without the flag");
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}
