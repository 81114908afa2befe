//! Random operation sequences on images whose files have extents (and an extent index) aimed
//! at metadata blocks: superblock and descriptor copies, reserved descriptor blocks, bitmaps,
//! inode tables, the journal. Whatever the operations and whatever they return, no data is
//! written into a metadata block and no metadata block is left free in the bitmaps (the
//! kernel's system zone, `block_validity.c`).

use proptest::prelude::*;
use rext4::{Fs, InodeNo, Options, SetAttr};
use rext4_testkit::{e2fsck_clean, extent_depth, tool, Image};
use std::collections::BTreeSet;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const BS: u64 = 1024;
/// Data written by the operations: 64 such bytes in a row never occur in metadata.
const PATTERN: u8 = 0xA5;

struct Base {
    _dir: tempfile::TempDir,
    img: PathBuf,
    /// Every metadata block of the image.
    zone: BTreeSet<u64>,
}

fn debugfs(img: &Path, write: bool, cmds: &str) -> String {
    let mut c = Command::new(tool("debugfs"));
    if write {
        c.arg("-w");
    }
    let out = c
        .arg("-f")
        .arg("-")
        .arg(img)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut child = out.spawn().unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(cmds.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Blocks listed as `A-B` or `A` after `key` in dumpe2fs's group lines.
fn ranges_after(text: &str, key: &str) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.split(key).nth(1) else { continue };
        let Some(r) = rest.split([' ', ',']).next() else { continue };
        let (a, b) = r.split_once('-').unwrap_or((r, r));
        if let (Ok(a), Ok(b)) = (a.parse::<u64>(), b.parse::<u64>()) {
            out.push((a, b));
        }
    }
    out
}

/// A 1 KiB-block image with files f0..f3 of a few extents each and a fragmented `big` whose
/// tree has an index level; its metadata blocks.
fn base() -> &'static Base {
    static B: OnceLock<Base> = OnceLock::new();
    B.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("base.img");
        Image::ext4("32M").block_size(1024).build(&img);
        let fs = Fs::open_with(&img, Options { writable: true, ..Options::default() }).unwrap();
        let root = fs.root();
        let big = fs.create(root, b"big", 0o644, 0, 0).unwrap().ino;
        let files: Vec<InodeNo> =
            (0..4).map(|i| fs.create(root, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino).collect();
        let pad = fs.create(root, b"pad", 0o644, 0, 0).unwrap().ino;
        // Interleaved appends: f0..f3 end up in three extents each (all in the inode), `big`
        // in more than the four its inode holds.
        for round in 0..12u64 {
            if round < 3 {
                for &f in &files {
                    fs.write(f, round * 2 * BS, &[7u8; BS as usize]).unwrap();
                }
            }
            fs.write(big, round * 2 * BS, &[7u8; BS as usize]).unwrap();
            fs.write(pad, round * BS, &[7u8; BS as usize]).unwrap();
        }
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img);
        assert_eq!(extent_depth(&img, "/big"), 1);
        assert_eq!(extent_depth(&img, "/f0"), 0);
        let out = Command::new(tool("dumpe2fs")).arg(&img).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut zone = BTreeSet::new();
        for key in [
            "superblock at ",
            "Group descriptors at ",
            "Reserved GDT blocks at ",
            "Block bitmap at ",
            "Inode bitmap at ",
            "Inode table at ",
        ] {
            for (a, b) in ranges_after(&text, key) {
                zone.extend(a..=b);
            }
        }
        let journal = debugfs(&img, false, "blocks <8>\n");
        zone.extend(journal.split_whitespace().filter_map(|b| b.parse::<u64>().ok()));
        assert!(zone.len() > 4000, "{} metadata blocks found", zone.len());
        Base { _dir: dir, img, zone }
    })
}

#[derive(Clone, Debug)]
enum Op {
    Write { file: usize, off: u64, len: usize },
    Truncate { file: usize, size: u64 },
    Punch { file: usize, off: u64, len: u64 },
    Zero { file: usize, off: u64, len: u64 },
    Setxattr { file: usize, len: usize },
    Unlink { file: usize },
    Create { len: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let file = 0usize..5;
    prop_oneof![
        4 => (file.clone(), 0u64..40_000, 1usize..6000).prop_map(|(file, off, len)| Op::Write { file, off, len }),
        2 => (file.clone(), 0u64..30_000).prop_map(|(file, size)| Op::Truncate { file, size }),
        1 => (file.clone(), 0u64..30_000, 1u64..9000).prop_map(|(file, off, len)| Op::Punch { file, off, len }),
        1 => (file.clone(), 0u64..30_000, 1u64..9000).prop_map(|(file, off, len)| Op::Zero { file, off, len }),
        1 => (file.clone(), 1usize..900).prop_map(|(file, len)| Op::Setxattr { file, len }),
        1 => file.prop_map(|file| Op::Unlink { file }),
        1 => (1usize..20_000).prop_map(|len| Op::Create { len }),
    ]
}

/// Aims: which file (0-3: f0..f3, 4: big), which root entry (for `big`, its index entry) and
/// which metadata block.
fn aim() -> impl Strategy<Value = (usize, usize, usize)> {
    (0usize..5, 0usize..3, any::<usize>())
}

const NAMES: [&str; 5] = ["f0", "f1", "f2", "f3", "big"];

fn run(aims: &[(usize, usize, usize)], ops: &[Op]) -> Result<(), TestCaseError> {
    let b = base();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("case.img");
    std::fs::copy(&b.img, &img).unwrap();
    let zone: Vec<u64> = b.zone.iter().copied().collect();
    let mut cmds = String::new();
    for &(file, entry, pick) in aims {
        let target = zone[pick % zone.len()];
        // Root entry k's start (a leaf's `ee_start_lo`, an index's `ei_leaf_lo`).
        let word = if file == 4 { 4 } else { 5 + 3 * entry };
        cmds.push_str(&format!("set_inode_field /{} block[{word}] {target}\n", NAMES[file]));
    }
    debugfs(&img, true, &cmds);
    {
        let fs = Fs::open_with(&img, Options { writable: true, ..Options::default() }).unwrap();
        let root = fs.root();
        let ino = |f: usize| fs.lookup(root, NAMES[f].as_bytes()).map(|a| a.ino);
        let data = vec![PATTERN; 20_000];
        // Xattr values are metadata (in the inode, in blocks): another byte.
        let value = vec![!PATTERN; 900];
        for (i, op) in ops.iter().enumerate() {
            // Results are not checked: damaged files fail, the others succeed; what matters
            // is where the bytes go.
            let _ = match *op {
                Op::Write { file, off, len } => {
                    ino(file).and_then(|f| fs.write(f, off, &data[..len]).map(drop))
                }
                Op::Truncate { file, size } => ino(file).and_then(|f| {
                    fs.setattr(f, &SetAttr { size: Some(size), ..Default::default() }).map(drop)
                }),
                Op::Punch { file, off, len } => ino(file).and_then(|f| fs.fallocate(f, 0x3, off, len)),
                Op::Zero { file, off, len } => ino(file).and_then(|f| fs.fallocate(f, 0x10, off, len)),
                Op::Setxattr { file, len } => {
                    ino(file).and_then(|f| fs.setxattr(f, b"user.x", &value[..len], 0))
                }
                Op::Unlink { file } => fs.unlink(root, NAMES[file].as_bytes()),
                Op::Create { len } => fs
                    .create(root, format!("n{i}").as_bytes(), 0o644, 0, 0)
                    .and_then(|a| fs.write(a.ino, 0, &data[..len]).map(drop)),
            };
        }
        fs.unmount().unwrap();
    }
    // Nothing written into metadata.
    let f = std::fs::File::open(&img).unwrap();
    let mut block = vec![0u8; BS as usize];
    for &z in &b.zone {
        f.read_exact_at(&mut block, z * BS).unwrap();
        let hit = block.windows(64).any(|w| w.iter().all(|&x| x == PATTERN));
        prop_assert!(!hit, "data written into metadata block {}", z);
    }
    // No metadata block free.
    let out = Command::new(tool("dumpe2fs")).arg(&img).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    for line in text.lines().filter(|l| l.trim_start().starts_with("Free blocks: ")) {
        for r in line.trim_start().trim_start_matches("Free blocks: ").split(", ").filter(|r| !r.is_empty()) {
            let (a, z) = r.split_once('-').unwrap_or((r, r));
            let (a, z): (u64, u64) = (a.trim().parse().unwrap(), z.trim().parse().unwrap());
            prop_assert!(b.zone.range(a..=z).next().is_none(), "metadata block free in {}-{}", a, z);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 100, ..ProptestConfig::default() })]

    #[test]
    fn no_write_or_free_lands_in_metadata(
        aims in proptest::collection::vec(aim(), 1..4),
        ops in proptest::collection::vec(op(), 1..30),
    ) {
        run(&aims, &ops)?;
    }
}
