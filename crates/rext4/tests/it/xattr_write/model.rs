//! Random sequences of set / replace / remove / recreate on a few files against a map.

use super::*;
use proptest::prelude::*;
use rext4::dev::MemDevice;
use std::sync::Arc;

const FILES: usize = 3;
const NAMES: &[&str] = &[
    "user.a",
    "user.bb",
    "user.ccc",
    "user.a-rather-longer-name-for-the-entry",
    "trusted.t",
    "trusted.tt",
    "security.s",
    "user.x1",
    "user.x2",
    "user.x3",
];
const LENS: &[usize] = &[0, 1, 3, 4, 5, 31, 60, 100, 300, 700, 1200, 2500, 9000];

#[derive(Clone, Debug)]
enum Op {
    Set { file: usize, name: usize, len: usize, byte: u8, flags: u32 },
    Remove { file: usize, name: usize },
    Recreate { file: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..FILES, 0..NAMES.len(), 0..LENS.len(), 0u8..2, prop_oneof![3 => Just(0u32), 1 => Just(XATTR_CREATE), 1 => Just(XATTR_REPLACE)])
            .prop_map(|(file, name, l, byte, flags)| Op::Set { file, name, len: LENS[l], byte, flags }),
        3 => (0..FILES, 0..NAMES.len()).prop_map(|(file, name)| Op::Remove { file, name }),
        1 => (0..FILES).prop_map(|file| Op::Recreate { file }),
    ]
}

fn size_of(m: &Xattrs) -> usize {
    // Entry (name without its prefix) and padded value, as a block would need.
    m.iter()
        .map(|(n, v)| {
            let suffix = n.len() - n.iter().position(|&c| c == b'.').unwrap() - 1;
            ((16 + suffix + 3) & !3) + ((v.len() + 3) & !3)
        })
        .sum()
}

fn image(args: &[&str]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("m.img");
    Image::ext4("16M").args(args).build(&img);
    std::fs::read(img).unwrap()
}

fn run(bytes: &[u8], ops: &[Op]) {
    let dev = Arc::new(MemDevice::new(bytes.to_vec()));
    let fs = Fs::from_device(dev.clone(), Options { writable: true, ..Options::default() }).unwrap();
    let root = fs.root();
    let bs = fs.block_size() as usize;
    let fname = |f: usize| format!("f{f}");
    let mut ino: Vec<InodeNo> =
        (0..FILES).map(|f| fs.create(root, fname(f).as_bytes(), 0o644, 0, 0).unwrap().ino).collect();
    let mut model: Vec<Xattrs> = vec![Xattrs::new(); FILES];
    for (k, op) in ops.iter().enumerate() {
        match *op {
            Op::Set { file, name, len, byte, flags } => {
                let n = NAMES[name].as_bytes().to_vec();
                let v = vec![byte; len];
                let m = &mut model[file];
                let r = fs.setxattr(ino[file], &n, &v, flags);
                let exists = m.contains_key(&n);
                let expect = if flags == XATTR_CREATE && exists {
                    libc::EEXIST
                } else if flags == XATTR_REPLACE && !exists {
                    libc::ENODATA
                } else {
                    0
                };
                match r {
                    // With `ea_inode` too: values may move to EA inodes, but their
                    // entries must still fit, and an empty value never moves (the kernel
                    // refuses both alike).
                    Err(e) if e.errno() == libc::ENOSPC && expect == 0 => {
                        let mut after = m.clone();
                        after.insert(n, v);
                        // Everything fitting in one block never runs out of room.
                        assert!(size_of(&after) + 36 > bs, "op {k}: ENOSPC with {} bytes", size_of(&after));
                    }
                    r => {
                        assert_eq!(errno(r), expect, "op {k}: {op:?}");
                        if expect == 0 {
                            m.insert(n, v);
                        }
                    }
                }
            }
            Op::Remove { file, name } => {
                let n = NAMES[name].as_bytes();
                let expect = if model[file].remove(n).is_some() { 0 } else { libc::ENODATA };
                assert_eq!(errno(fs.removexattr(ino[file], n)), expect, "op {k}: {op:?}");
            }
            Op::Recreate { file } => {
                fs.unlink(root, fname(file).as_bytes()).unwrap();
                ino[file] = fs.create(root, fname(file).as_bytes(), 0o644, 0, 0).unwrap().ino;
                model[file].clear();
            }
        }
        let f = match *op {
            Op::Set { file, .. } | Op::Remove { file, .. } | Op::Recreate { file } => file,
        };
        assert_eq!(rext4_xattrs(&fs, &format!("/{}", fname(f))), model[f], "after op {k}: {op:?}");
    }
    fs.unmount().unwrap();
    drop(fs);
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("m.img");
    std::fs::write(&img, dev.snapshot()).unwrap();
    let expected: Vec<(String, Xattrs)> =
        (0..FILES).map(|f| (format!("/{}", fname(f)), model[f].clone())).collect();
    let refs: Vec<(&str, Xattrs)> = expected.iter().map(|(p, m)| (p.as_str(), m.clone())).collect();
    let fs = Fs::open(&img).unwrap();
    finish(fs, &img, &refs);
}

proptest! {
    #![proptest_config(ProptestConfig {
        // Each case makes and checks an image; PROPTEST_CASES asks for more.
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]
    #[test]
    fn random_sequences_match_a_map(ops in proptest::collection::vec(op(), 1..80), variant in 0..4u8) {
        static DEFAULT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        static SMALL: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        static EA: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        static BIGALLOC: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        let bytes = match variant {
            0 => SMALL.get_or_init(|| image(&["-I", "128", "-b", "1024", "-O", "^metadata_csum"])),
            1 => DEFAULT.get_or_init(|| image(&["-b", "4096"])),
            // Each attribute block a cluster of its own, counted whole in i_blocks.
            2 => BIGALLOC.get_or_init(|| image(&["-b", "1024", "-O", "bigalloc,ea_inode", "-C", "4096"])),
            // Values in EA inodes, at once (over 968 bytes) or when the block is full.
            _ => EA.get_or_init(|| image(&["-b", "1024", "-O", "ea_inode"])),
        };
        run(bytes, &ops);
    }
}
