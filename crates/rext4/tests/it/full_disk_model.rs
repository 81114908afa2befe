//! A full disk, checked against a byte model: random writes (delayed and not, sparse ones
//! needing tree blocks), directories with attribute blocks, truncates, punches and fsyncs
//! on a small image nearly filled first, as a user and as root. A refusal is only ever
//! `ENOSPC` (or a short write), and nothing accepted is lost: `fsync`, truncate and punch
//! never fail, and every file reads as the model says before and after reopening.

use proptest::prelude::*;
use rext4::{Fs, InodeNo, Options, SetAttr};
use rext4_testkit::{e2fsck_clean, Image};
use std::path::Path;

const FILES: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Write { file: usize, off: u64, len: usize, root: bool },
    Dir { root: bool },
    Truncate { file: usize, size: u64 },
    Punch { file: usize, off: u64, len: u64 },
    Fsync { file: usize },
    RemoveDir,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        // Small (delayed) and large (allocated at once) writes, anywhere in 4 MiB.
        6 => (0..FILES, 0u64..4 << 20, prop_oneof![1usize..20_000, 60_000usize..300_000], any::<bool>())
            .prop_map(|(file, off, len, root)| Op::Write { file, off, len, root }),
        3 => any::<bool>().prop_map(|root| Op::Dir { root }),
        1 => (0..FILES, 0u64..4 << 20).prop_map(|(file, size)| Op::Truncate { file, size }),
        1 => (0..FILES, 0u64..4 << 20, 1u64..200_000).prop_map(|(file, off, len)| Op::Punch { file, off, len }),
        1 => (0..FILES).prop_map(|file| Op::Fsync { file }),
        1 => Just(Op::RemoveDir),
    ]
}

fn as_caller<T>(root: bool, f: impl FnOnce() -> T) -> T {
    if root {
        rext4::with_reserved_blocks(f)
    } else {
        f()
    }
}

fn expect_enospc(r: rext4::Result<impl Sized>, what: &str) {
    if let Err(e) = r {
        assert_eq!(e.errno(), libc::ENOSPC, "{what}: {e}");
    }
}

fn check(fs: &Fs, inos: &[InodeNo], model: &[Vec<u8>], when: &str) {
    for (k, (&ino, m)) in inos.iter().zip(model).enumerate() {
        let size = fs.getattr(ino).unwrap().size;
        assert_eq!(size, m.len() as u64, "{when}: file {k}'s size");
        let mut buf = vec![0u8; m.len()];
        let mut done = 0;
        while done < m.len() {
            let n = fs.read(ino, done as u64, &mut buf[done..]).unwrap();
            assert!(n > 0, "{when}: short read");
            done += n;
        }
        if let Some(at) = buf.iter().zip(m).position(|(a, b)| a != b) {
            panic!("{when}: file {k} differs at byte {at}");
        }
    }
}

fn run(img: &Path, filler: u64, ops: &[Op], extents: bool) {
    let fs = Fs::open_with(img, Options { writable: true, ..Options::default() }).unwrap();
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
    let inos: Vec<InodeNo> = (0..FILES)
        .map(|k| fs.create(root, format!("f{k}").as_bytes(), 0o666, 1000, 1000).unwrap().ino)
        .collect();
    let mut model = vec![Vec::<u8>::new(); FILES];
    let mut dirs: Vec<Vec<u8>> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let what = format!("op {i} {op:?}");
        match *op {
            Op::Write { file, off, len, root } => {
                let data: Vec<u8> = (0..len).map(|j| (i * 31 + j / 511) as u8 | 1).collect();
                match as_caller(root, || fs.write(inos[file], off, &data)) {
                    Ok(n) => {
                        let m = &mut model[file];
                        let end = off as usize + n;
                        if m.len() < end {
                            m.resize(end, 0);
                        }
                        m[off as usize..end].copy_from_slice(&data[..n]);
                    }
                    Err(e) => expect_enospc(Err::<(), _>(e), &what),
                }
            }
            Op::Dir { root } => {
                let name = format!("d{i}").into_bytes();
                let made = as_caller(root, || {
                    let uid = if root { 0 } else { 1000 };
                    fs.mkdir(fs.root(), &name, 0o755, uid, uid).inspect(|a| {
                        expect_enospc(fs.setxattr(a.ino, b"user.v", &[7u8; 3000], 0), &what);
                    })
                });
                match made {
                    Ok(_) => dirs.push(name),
                    Err(e) => expect_enospc(Err::<(), _>(e), &what),
                }
            }
            Op::Truncate { file, size } => {
                fs.setattr(inos[file], &SetAttr { size: Some(size), ..SetAttr::default() })
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                model[file].resize(size as usize, 0);
            }
            Op::Punch { file, off, len } => {
                if !extents {
                    continue;
                }
                let mode = rext4::FALLOC_FL_PUNCH_HOLE | rext4::FALLOC_FL_KEEP_SIZE;
                fs.fallocate(inos[file], mode, off, len).unwrap_or_else(|e| panic!("{what}: {e}"));
                let m = &mut model[file];
                let (a, z) = ((off as usize).min(m.len()), ((off + len) as usize).min(m.len()));
                m[a..z].fill(0);
            }
            Op::Fsync { file } => fs.fsync(inos[file]).unwrap_or_else(|e| panic!("{what}: {e}")),
            Op::RemoveDir => {
                if let Some(name) = dirs.pop() {
                    fs.rmdir(root, &name).unwrap_or_else(|e| panic!("{what}: {e}"));
                }
            }
        }
    }
    check(&fs, &inos, &model, "before writeback");
    for &ino in &inos {
        fs.fsync(ino).unwrap_or_else(|e| panic!("final fsync: {e}"));
    }
    check(&fs, &inos, &model, "after writeback");
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(img);
    let fs = Fs::open(img).unwrap();
    check(&fs, &inos, &model, "after reopen");
}

fn config() -> ProptestConfig {
    ProptestConfig { cases: 16, max_shrink_iters: 300, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn full_disk_ext4(filler in 20u64..26, reserve in prop_oneof![Just("0"), Just("5")],
                      ops in proptest::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("f.img");
        Image::ext4("32M").block_size(4096).args(["-m", reserve]).build(&img);
        run(&img, filler << 20, &ops, true);
    }

    #[test]
    fn full_disk_ext3(filler in 20u64..26, reserve in prop_oneof![Just("0"), Just("5")],
                      ops in proptest::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("f.img");
        Image::ext4("32M").block_size(4096).fs_type("ext3").args(["-m", reserve]).build(&img);
        run(&img, filler << 20, &ops, false);
    }
}
