//! Orphans (seed 001): held inodes outlive their last name, are recorded in the orphan file or
//! on the superblock's list, and are freed at the last release; what a crash (or the kernel)
//! leaves recorded is freed at the next writable open. Oracles: `e2fsck -fn`, the kernel's
//! view and counts, `debugfs`.
//!
//! `held.rs`: inodes held open past their last name; `recorded.rs`: records the kernel or
//! debugfs left; `crash.rs`: crashes with orphans held and in the middle of truncates.

mod crash;
mod held;
mod recorded;

use rext4::{Fs, InodeNo, Options};
use rext4_testkit::{tool, Image, Rng};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Feature variants: the list only, the orphan file, a two-block orphan file that fills up,
/// no checksums, no journal (no records at all).
const VARIANTS: &[(&str, &[&str])] = &[
    ("list", &[]),
    ("orphan-file", &["-O", "metadata_csum_seed,orphan_file"]),
    ("tiny-orphan-file", &["-O", "orphan_file", "-E", "orphan_file_size=2"]),
    ("nocsum", &["-O", "^metadata_csum,^64bit"]),
    ("nojournal", &["-O", "^has_journal"]),
];

fn journaled(args: &[&str]) -> bool {
    !args.contains(&"^has_journal")
}

/// A source tree: `dN/fM` files with data (1..6 KiB, so blocks are freed), `data` (40 KiB with
/// an xattr), and an empty directory `emptydir`.
fn source(dir: &Path, dirs: usize, files: usize) -> PathBuf {
    let src = dir.join("src");
    let mut rng = Rng::new(7);
    for d in 0..dirs {
        let p = src.join(format!("d{d}"));
        std::fs::create_dir_all(&p).unwrap();
        for f in 0..files {
            let n = rng.range(1024, 6000) as usize;
            std::fs::write(p.join(format!("f{f}")), rng.bytes(n)).unwrap();
        }
    }
    std::fs::write(src.join("data"), rng.bytes(40 << 10)).unwrap();
    xattr::set(src.join("data"), "user.note", b"kept until the last release").unwrap();
    std::fs::create_dir_all(src.join("emptydir")).unwrap();
    src
}

fn image(dir: &Path, name: &str, args: &[&str], dirs: usize, files: usize) -> PathBuf {
    let src = source(&dir.join(name), dirs, files);
    let img = dir.join(format!("{name}.img"));
    // Extended options go in one -E.
    let mut ext = vec!["root_owner=0:0".to_string()];
    let mut all: Vec<String> = ["-b", "1024", "-N", "4096"].map(String::from).to_vec();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match *a {
            "-E" => ext.push(it.next().unwrap().to_string()),
            a => all.push(a.to_string()),
        }
    }
    all.extend(["-E".to_string(), ext.join(",")]);
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    Image::ext4("32M").args(&all).from_dir(&src).build(&img);
    img
}

fn rw(img: &Path) -> Fs {
    Fs::open_with(img, Options { writable: true, ..Options::default() }).unwrap()
}

fn read_all(fs: &Fs, ino: InodeNo) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size as usize;
    let mut buf = vec![0u8; size + 10];
    let n = fs.read(ino, 0, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// Blocks the inode takes, in filesystem blocks.
fn fs_blocks(fs: &Fs, ino: InodeNo) -> u64 {
    fs.getattr(ino).unwrap().blocks / u64::from(fs.block_size() / 512)
}

/// Whether debugfs says the inode is allocated.
fn in_use(img: &Path, ino: InodeNo) -> bool {
    let o =
        Command::new(tool("debugfs")).arg("-R").arg(format!("testi <{}>", ino.0)).arg(img).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    if text.contains("is marked in use") {
        return true;
    }
    assert!(text.contains("is not in use"), "debugfs testi: {text}");
    false
}

/// A read-only look at the image as the journal would leave it: the list head and the inodes in
/// the orphan file.
fn recorded(img: &Path) -> (u32, BTreeSet<u32>) {
    let fs = Fs::open(img).unwrap();
    let head = fs.superblock().s_last_orphan.get();
    let mut file = BTreeSet::new();
    let oino = fs.superblock().s_orphan_file_inum.get();
    if oino != 0 {
        let size = fs.getattr(InodeNo(oino)).unwrap().size as usize;
        let mut buf = vec![0u8; size];
        fs.read(InodeNo(oino), 0, &mut buf).unwrap();
        for b in buf.chunks(fs.block_size() as usize) {
            file.extend(rext4::format::orphan::slots(b));
        }
    }
    (head, file)
}

fn copy(from: &Path, to: &Path) -> PathBuf {
    std::fs::copy(from, to).unwrap();
    to.to_path_buf()
}

/// "Free blocks" and "Free inodes" as the superblock records them (`dumpe2fs -h`).
fn superblock_free_counts(img: &Path) -> (u64, u64) {
    let o = Command::new(tool("dumpe2fs")).arg("-h").arg(img).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let field = |name: &str| -> u64 {
        text.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().parse().unwrap()).unwrap()
    };
    (field("Free blocks:"), field("Free inodes:"))
}

fn free_counts(img: &Path) -> (u64, u64) {
    let s = Fs::open(img).unwrap().statfs().unwrap();
    (s.blocks_free, s.files_free)
}

fn fsck(img: &Path, fix: bool) -> (i32, String) {
    let o = Command::new(tool("e2fsck")).arg(if fix { "-fy" } else { "-fn" }).arg(img).output().unwrap();
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).into_owned())
}
