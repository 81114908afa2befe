//! Hostile images (BRIEF non-negotiable 4): every corruption gives a typed error naming the
//! structure, inode and block, never a panic, hang or out-of-bounds access.
//!
//! Fixtures are real `mkfs.ext4 -d` images (several feature variants) built once per test
//! process into memory. Each test patches a copy of the bytes (re-computing the checksums it does
//! not mean to break, so structural checks are reached on metadata_csum images too), opens it
//! through a `MemDevice` and checks the error: checksum vs structural, and the inode and block.
//!
//! The sweeps (every superblock, descriptor and inode field set to hostile values) and the
//! seeded random corruption run their cases in child processes with a per-case watchdog, so a
//! hang or a crash that `catch_unwind` cannot catch (stack overflow, abort) is reported with the
//! case that caused it, and the remaining cases still run.
//!
//! Tests skip (and say so) where `mkfs.ext4`, `e2fsck` or `debugfs` is missing. Knobs:
//! `REXT4_CORRUPTION_ITERS` (random iterations per variant, default 120),
//! `REXT4_CORRUPTION_MAX_HANGS` (hangs/crashes before a sweep gives up, default 3) and
//! `REXT4_CORRUPTION_SKIP` (comma-separated substrings of case descriptions to skip, e.g. to
//! see past a known hang) and `REXT4_CORRUPTION_DUMP` (a directory to write the fixture images
//! to, for reproducing a reported case by hand: fixtures are deterministic).

use rext4::dev::{BlockDevice, MemDevice};
use rext4::format::checksum::{crc32c, inode_csum_seed};
use rext4::format::dirent;
use rext4::format::dx;
use rext4::format::extent::{self as fext, Node};
use rext4::format::group_desc::GroupDesc;
use rext4::format::inode as fi;
use rext4::format::superblock::Superblock;
use rext4::format::xattr as fx;
use rext4::{Corrupt, Error, FileType, Fs, InodeNo, Options};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------

/// The image variants the tests run against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Variant {
    /// mkfs defaults (metadata_csum, 64bit, flex_bg, journal), 4 KiB blocks.
    Csum4k,
    /// `-O ^metadata_csum,uninit_bg`: crc16 descriptor checksums only, 4 KiB blocks.
    NoCsum4k,
    /// `-t ext2`, 1 KiB blocks: block maps with indirect blocks, no checksums, and a
    /// 3000-entry directory (a two-level htree).
    Ext2,
    /// `-O inline_data,ea_inode`, 4 KiB blocks: inline files and directories, an EA inode.
    Inline,
    /// metadata_csum with 1 KiB blocks and a 3000-entry directory (a two-level htree).
    Csum1k,
}

const ALL_VARIANTS: [Variant; 5] =
    [Variant::Csum4k, Variant::NoCsum4k, Variant::Ext2, Variant::Inline, Variant::Csum1k];

impl Variant {
    fn mkfs_args(self) -> &'static [&'static str] {
        match self {
            Variant::Csum4k => &["-b", "4096"],
            Variant::NoCsum4k => &["-b", "4096", "-O", "^metadata_csum,uninit_bg"],
            Variant::Ext2 => &["-t", "ext2", "-b", "1024", "-N", "4096"],
            Variant::Inline => &["-b", "4096", "-O", "inline_data,ea_inode"],
            Variant::Csum1k => &["-b", "1024", "-N", "4096"],
        }
    }
    fn has_huge_dir(self) -> bool {
        matches!(self, Variant::Ext2 | Variant::Csum1k)
    }
}

/// Paths every fixture has (plus `/huge` where `has_huge_dir`).
const PATHS: &[&str] = &[
    "/dir1",
    "/dir1/sub",
    "/dir1/sub/file",
    "/dir1/a",
    "/big",
    "/big/entry_0123_padding_name",
    "/frag",
    "/small",
    "/medium",
    "/fastlink",
    "/slowlink",
    "/idir",
];

const SLOW_TARGET_REPEAT: usize = 50;
const FIXED_UUID: &str = "2f0b6c51-8d6e-4f7a-9a51-6c0de5e1a7b3";
const FAKE_TIME: &str = "1700000000";
/// The value of `user.big` on `/small`: too big for the inode, fits a 1 KiB xattr block.
const BIG_XATTR_LEN: usize = 700;

struct Fixture {
    variant: Variant,
    bytes: Vec<u8>,
    ino: HashMap<&'static str, u32>,
}

fn tool(name: &str) -> Option<String> {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| format!("{d}/{name}"))
        .find(|p| Path::new(p).exists())
}

fn run(cmd: &mut Command) -> std::process::Output {
    cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn huge_name(i: usize) -> String {
    format!("n{i:04}_{}", "q".repeat(50))
}

fn build_source_tree(root: &Path, variant: Variant) {
    use std::fs;
    use std::io::{Seek, SeekFrom};
    fs::create_dir_all(root.join("dir1/sub")).unwrap();
    fs::write(root.join("dir1/sub/file"), b"hello\n").unwrap();
    fs::write(root.join("dir1/a"), b"a\n").unwrap();
    fs::create_dir(root.join("big")).unwrap();
    for i in 0..500 {
        fs::write(root.join(format!("big/entry_{i:04}_padding_name")), format!("{i}\n")).unwrap();
    }
    // Twelve 4 KiB chunks separated by holes: more extents than fit in i_block (an extent tree
    // of depth 1), and indirect blocks on ext2.
    let mut f = fs::File::create(root.join("frag")).unwrap();
    for i in 0..12u8 {
        f.seek(SeekFrom::Start(u64::from(i) * 8192)).unwrap();
        f.write_all(&[b'A' + i; 4096]).unwrap();
    }
    drop(f);
    fs::write(root.join("small"), b"small file\n").unwrap();
    fs::write(root.join("medium"), [b'm'; 100]).unwrap();
    std::os::unix::fs::symlink("dir1/sub/file", root.join("fastlink")).unwrap();
    let slow = format!("{}target", "d/".repeat(SLOW_TARGET_REPEAT));
    std::os::unix::fs::symlink(slow, root.join("slowlink")).unwrap();
    fs::create_dir(root.join("idir")).unwrap();
    for n in ["alpha", "bravo"] {
        fs::write(root.join("idir").join(n), n).unwrap();
    }
    if variant.has_huge_dir() {
        fs::create_dir(root.join("huge")).unwrap();
        for i in 0..3000 {
            fs::File::create(root.join("huge").join(huge_name(i))).unwrap();
        }
    }
}

fn build_fixture(variant: Variant) -> Option<Fixture> {
    let (Some(mkfs), Some(fsck), Some(debugfs)) = (tool("mkfs.ext4"), tool("e2fsck"), tool("debugfs")) else {
        eprintln!("SKIP: mkfs.ext4 / e2fsck / debugfs not found; corruption tests need e2fsprogs");
        return None;
    };
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    build_source_tree(&src, variant);
    let img = dir.path().join("img");
    // A fixed UUID, hash seed and clock make every run build the same image, so a failing
    // random case (reported with its byte offsets) reproduces.
    let out = run(Command::new(&mkfs)
        .env("E2FSPROGS_FAKE_TIME", FAKE_TIME)
        .args(["-q", "-F", "-U", FIXED_UUID, "-E", &format!("hash_seed={FIXED_UUID}")])
        .args(variant.mkfs_args())
        .arg("-d")
        .arg(&src)
        .arg(&img)
        .arg("8M"));
    assert!(out.status.success(), "mkfs {variant:?}: {}", String::from_utf8_lossy(&out.stderr));
    // Attributes: a value too big for the inode (an xattr block), a small one (in the inode),
    // one on a directory, and on the ea_inode variant a value in an EA inode.
    let big = dir.path().join("big_value");
    std::fs::write(&big, vec![b'x'; BIG_XATTR_LEN]).unwrap();
    let huge = dir.path().join("huge_value");
    std::fs::write(&huge, vec![b'y'; 4096]).unwrap();
    let mut cmds = format!(
        "ea_set -f {} /small user.big\nea_set /small user.tiny abc\nea_set /dir1 user.d dirval\n",
        big.display()
    );
    if variant == Variant::Inline {
        cmds += &format!("ea_set -f {} /medium user.huge\n", huge.display());
    }
    let cmdfile = dir.path().join("cmds");
    std::fs::write(&cmdfile, cmds).unwrap();
    let out = run(Command::new(&debugfs)
        .env("E2FSPROGS_FAKE_TIME", FAKE_TIME)
        .arg("-w")
        .arg("-f")
        .arg(&cmdfile)
        .arg(&img));
    assert!(out.status.success(), "debugfs: {}", String::from_utf8_lossy(&out.stderr));
    // -D builds htree indexes (mkfs -d writes linear directories); it would also turn inline
    // directories into block directories, so the inline variant only gets a plain repair
    // (debugfs leaves i_blocks of an inode with an EA inode value short by the EA inode's).
    let fsck_opts = if variant == Variant::Inline { "-fy" } else { "-fyD" };
    let out = run(Command::new(&fsck).env("E2FSPROGS_FAKE_TIME", FAKE_TIME).arg(fsck_opts).arg(&img));
    assert!(
        out.status.code().unwrap_or(8) <= 1,
        "e2fsck {fsck_opts}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = run(Command::new(&fsck).arg("-fn").arg(&img));
    assert!(out.status.success(), "fixture {variant:?} not clean: {}", String::from_utf8_lossy(&out.stdout));
    let bytes = std::fs::read(&img).unwrap();
    if let Some(d) = std::env::var_os("REXT4_CORRUPTION_DUMP") {
        std::fs::write(Path::new(&d).join(format!("{variant:?}.img")), &bytes).unwrap();
    }

    // Inode numbers from debugfs (not from rext4: a bug in the engine's read path must fail
    // the tests about it, not every test).
    let mut paths: Vec<&'static str> = PATHS.to_vec();
    if variant.has_huge_dir() {
        paths.push("/huge");
    }
    let stat_cmds: String = paths.iter().map(|p| format!("stat {p}\n")).collect();
    std::fs::write(&cmdfile, stat_cmds).unwrap();
    let out = run(Command::new(&debugfs).env("PAGER", "__none__").arg("-f").arg(&cmdfile).arg(&img));
    let text = String::from_utf8_lossy(&out.stdout);
    let inos: Vec<u32> = text
        .lines()
        .filter_map(|l| l.strip_prefix("Inode: "))
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(inos.len(), paths.len(), "debugfs stat output:\n{text}");
    let ino: HashMap<&'static str, u32> = paths.into_iter().zip(inos).collect();
    Some(Fixture { variant, bytes, ino })
}

fn fixture(variant: Variant) -> Option<&'static Fixture> {
    static CELLS: [OnceLock<Option<Fixture>>; 5] =
        [OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let i = ALL_VARIANTS.iter().position(|&v| v == variant).unwrap();
    CELLS[i].get_or_init(|| build_fixture(variant)).as_ref()
}

/// `let img = img!(Variant::X);`: a patchable copy of a fixture, or skip the test.
macro_rules! img {
    ($v:expr) => {
        match fixture($v) {
            Some(f) => Img::new(f),
            None => return,
        }
    };
}

fn open_bytes(bytes: Vec<u8>) -> rext4::Result<Fs> {
    Fs::from_device(Arc::new(MemDevice::new(bytes)), Options::default())
}

// ---------------------------------------------------------------------------------------------
// Patching images
// ---------------------------------------------------------------------------------------------

/// Geometry read from the pristine superblock (tests patch the copy, not this).
#[derive(Clone, Copy)]
struct Geo {
    bs: usize,
    first_data_block: u64,
    blocks_count: u64,
    inodes_count: u32,
    ipg: u32,
    inode_size: usize,
    desc_size: usize,
    csum_seed: u32,
    metadata_csum: bool,
    gdt_csum: bool,
    uuid: [u8; 16],
}

const SB: usize = 1024;

/// A copy of a fixture being patched.
struct Img {
    f: &'static Fixture,
    b: Vec<u8>,
    g: Geo,
}

impl Img {
    fn new(f: &'static Fixture) -> Img {
        let sb = Superblock::parse(&f.bytes[SB..SB + 1024]).unwrap();
        let g = Geo {
            bs: sb.block_size().unwrap() as usize,
            first_data_block: u64::from(sb.s_first_data_block.get()),
            blocks_count: sb.blocks_count(),
            inodes_count: sb.s_inodes_count.get(),
            ipg: sb.s_inodes_per_group.get(),
            inode_size: usize::from(sb.inode_size()),
            desc_size: usize::from(sb.desc_size()),
            csum_seed: sb.csum_seed(),
            metadata_csum: sb.has_metadata_csum(),
            gdt_csum: sb.ro_compat().contains(rext4::format::features::RoCompat::GDT_CSUM),
            uuid: sb.s_uuid,
        };
        Img { f, b: f.bytes.clone(), g }
    }

    fn ino(&self, path: &str) -> u32 {
        *self.f.ino.get(path).unwrap_or_else(|| panic!("no fixture path {path}"))
    }

    fn open(&self) -> rext4::Result<Fs> {
        open_bytes(self.b.clone())
    }

    fn fs(&self) -> Fs {
        self.open().unwrap_or_else(|e| panic!("{:?}: patched image should still open: {e}", self.f.variant))
    }

    // --- raw access ---

    fn u16_at(&self, off: usize) -> u16 {
        u16::from_le_bytes([self.b[off], self.b[off + 1]])
    }
    fn u32_at(&self, off: usize) -> u32 {
        u32::from_le_bytes(self.b[off..off + 4].try_into().unwrap())
    }
    fn put16(&mut self, off: usize, v: u16) {
        self.b[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }
    fn put32(&mut self, off: usize, v: u32) {
        self.b[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn block_off(&self, blk: u64) -> usize {
        blk as usize * self.g.bs
    }
    fn block(&self, blk: u64) -> &[u8] {
        let o = self.block_off(blk);
        &self.b[o..o + self.g.bs]
    }
    fn block_mut(&mut self, blk: u64) -> &mut [u8] {
        let o = self.block_off(blk);
        let bs = self.g.bs;
        &mut self.b[o..o + bs]
    }

    // --- superblock ---

    fn fix_sb(&mut self) {
        if self.g.metadata_csum {
            let c = crc32c(!0, &self.b[SB..SB + 0x3FC]);
            self.put32(SB + 0x3FC, c);
        }
    }
    /// Sets a superblock field and re-checksums.
    fn sb32(&mut self, field: usize, v: u32) {
        self.put32(SB + field, v);
        self.fix_sb();
    }
    fn sb16(&mut self, field: usize, v: u16) {
        self.put16(SB + field, v);
        self.fix_sb();
    }

    // --- group descriptors ---

    fn gd_off(&self, g: u32) -> usize {
        self.block_off(self.g.first_data_block + 1) + g as usize * self.g.desc_size
    }
    fn gd(&self, g: u32) -> GroupDesc {
        let o = self.gd_off(g);
        GroupDesc::parse(&self.b[o..o + self.g.desc_size], self.g.desc_size).unwrap()
    }
    fn fix_gd(&mut self, g: u32) {
        let d = self.gd(g);
        let ds = self.g.desc_size;
        let c = if self.g.metadata_csum {
            d.csum_crc32c(self.g.csum_seed, g, ds)
        } else if self.g.gdt_csum {
            d.csum_crc16(&self.g.uuid, g, ds)
        } else {
            return;
        };
        let o = self.gd_off(g) + 0x1E;
        self.put16(o, c);
    }

    // --- inodes ---

    /// Where inode `ino` lives (by the pristine descriptors, whatever the patches did).
    fn inode_off(&self, ino: u32) -> usize {
        let group = (ino - 1) / self.g.ipg;
        let index = ((ino - 1) % self.g.ipg) as usize;
        let o = self.gd_off(group);
        let ds = self.g.desc_size;
        let table = GroupDesc::parse(&self.f.bytes[o..o + ds], ds).unwrap().inode_table(ds);
        self.block_off(table) + index * self.g.inode_size
    }
    fn inode_raw(&self, ino: u32) -> &[u8] {
        let o = self.inode_off(ino);
        &self.b[o..o + self.g.inode_size]
    }
    fn inode(&self, ino: u32) -> fi::Inode {
        fi::Inode::parse(self.inode_raw(ino)).unwrap()
    }
    fn inode_seed(&self, ino: u32) -> u32 {
        inode_csum_seed(self.g.csum_seed, ino, self.inode(ino).generation())
    }
    fn fix_inode(&mut self, ino: u32) {
        if self.g.metadata_csum {
            let o = self.inode_off(ino);
            let n = self.g.inode_size;
            fix_inode_record(&mut self.b[o..o + n], ino, self.g.csum_seed);
        }
    }
    /// Patches inode field bytes at `field` and re-checksums the inode.
    fn inode_put(&mut self, ino: u32, field: usize, bytes: &[u8]) {
        let o = self.inode_off(ino) + field;
        self.b[o..o + bytes.len()].copy_from_slice(bytes);
        self.fix_inode(ino);
    }
    fn inode32(&mut self, ino: u32, field: usize, v: u32) {
        self.inode_put(ino, field, &v.to_le_bytes());
    }
    fn inode16(&mut self, ino: u32, field: usize, v: u16) {
        self.inode_put(ino, field, &v.to_le_bytes());
    }
    fn set_size(&mut self, ino: u32, size: u64) {
        self.inode32(ino, 0x04, size as u32);
        self.inode32(ino, 0x6C, (size >> 32) as u32);
    }

    // --- block maps ---

    /// `(logical, physical)` of every mapped block of an extent- or block-mapped inode, and the
    /// extent tree / indirect blocks met on the way.
    fn mapping(&self, ino: u32) -> (Vec<(u64, u64)>, Vec<u64>) {
        let d = self.inode(ino);
        let mut data = Vec::new();
        let mut meta = Vec::new();
        if d.flags() & fi::EXTENTS_FL != 0 {
            self.walk_extents(d.i_block_bytes(), &mut data, &mut meta);
        } else {
            let ptrs = (self.g.bs / 4) as u64;
            for i in 0..12u64 {
                let p = u64::from(d.i_block[i as usize].get());
                if p != 0 {
                    data.push((i, p));
                }
            }
            let mut first = 12u64;
            for (slot, levels) in [(fi::IND_BLOCK, 1u32), (fi::DIND_BLOCK, 2), (fi::TIND_BLOCK, 3)] {
                let p = u64::from(d.i_block[slot].get());
                if p != 0 {
                    self.walk_indirect(p, levels, first, &mut data, &mut meta);
                }
                first += ptrs.pow(levels);
            }
        }
        (data, meta)
    }

    fn walk_indirect(
        &self,
        blk: u64,
        levels: u32,
        first: u64,
        data: &mut Vec<(u64, u64)>,
        meta: &mut Vec<u64>,
    ) {
        meta.push(blk);
        let ptrs = (self.g.bs / 4) as u64;
        let span = ptrs.pow(levels - 1);
        for i in 0..ptrs {
            let p = u64::from(self.u32_at(self.block_off(blk) + 4 * i as usize));
            if p == 0 {
                continue;
            }
            if levels == 1 {
                data.push((first + i, p));
            } else {
                self.walk_indirect(p, levels - 1, first + i * span, data, meta);
            }
        }
    }

    fn walk_extents(&self, node: &[u8], data: &mut Vec<(u64, u64)>, meta: &mut Vec<u64>) {
        let n = Node::parse(node).unwrap();
        for i in 0..n.len() {
            if n.depth() > 0 {
                let child = n.index(i).leaf();
                meta.push(child);
                let o = self.block_off(child);
                self.walk_extents(&self.b[o..o + self.g.bs], data, meta);
            } else {
                let e = n.extent(i);
                for k in 0..u64::from(e.len()) {
                    data.push((u64::from(e.ee_block.get()) + k, e.start() + k));
                }
            }
        }
    }

    /// Physical block of logical block `lblk` of `ino`.
    fn pblk(&self, ino: u32, lblk: u64) -> u64 {
        let (data, _) = self.mapping(ino);
        data.iter()
            .find(|(l, _)| *l == lblk)
            .map(|(_, p)| *p)
            .unwrap_or_else(|| panic!("ino {ino} lblk {lblk} unmapped"))
    }

    fn fix_extent_block(&mut self, ino: u32, blk: u64) {
        if self.g.metadata_csum {
            let seed = self.inode_seed(ino);
            fext::set_block_checksum(self.block_mut(blk), seed);
        }
    }
    fn fix_dir_leaf(&mut self, ino: u32, blk: u64) {
        if self.g.metadata_csum {
            let seed = self.inode_seed(ino);
            dirent::set_leaf_tail(self.block_mut(blk), seed);
        }
    }
    fn fix_dx(&mut self, ino: u32, blk: u64) {
        if self.g.metadata_csum {
            let seed = self.inode_seed(ino);
            dx::set_checksum(self.block_mut(blk), seed);
        }
    }
    fn fix_xattr_block(&mut self, blk: u64) {
        if self.g.metadata_csum {
            let seed = self.g.csum_seed;
            fx::set_block_checksum(self.block_mut(blk), seed, blk);
        }
    }

    /// Byte offsets (in the image) of the entries of a directory leaf block, with their names.
    fn dir_entries(&self, blk: u64) -> Vec<(usize, Vec<u8>)> {
        self.dir_entries_full(blk).into_iter().map(|(o, n, _)| (o, n)).collect()
    }

    /// Offsets, names and inode numbers of the entries of a directory leaf block.
    fn dir_entries_full(&self, blk: u64) -> Vec<(usize, Vec<u8>, u32)> {
        let base = self.block_off(blk);
        let data = self.block(blk);
        let area = if self.g.metadata_csum { &data[..data.len() - dirent::TAIL_SIZE] } else { data };
        dirent::DirBlockIter::new(area, self.g.bs as u32)
            .map_while(|e| e.ok())
            .map(|e| (base + e.offset, e.name.to_vec(), e.inode))
            .collect()
    }

    /// Offset of the entry named `name` in directory leaf block `blk`.
    fn entry_off(&self, blk: u64, name: &[u8]) -> usize {
        self.dir_entries(blk).into_iter().find(|(_, n)| n == name).map(|(o, _)| o).unwrap()
    }

    /// The offset (in the image) of the in-inode xattr entry `(index, name)` and the offset its
    /// values count from.
    fn ibody_xattr(&self, ino: u32, index: u8, name: &[u8]) -> (usize, usize) {
        let base = self.inode_off(ino);
        let raw = self.inode_raw(ino);
        let start = 128 + usize::from(u16::from_le_bytes([raw[0x80], raw[0x81]]));
        assert_eq!(u32::from_le_bytes(raw[start..start + 4].try_into().unwrap()), fx::XATTR_MAGIC);
        let area = &raw[start + 4..];
        let mut off = 0;
        for e in fx::XattrIter::new(area) {
            let e = e.unwrap();
            if e.index == index && e.name == name {
                return (base + start + 4 + off, base + start + 4);
            }
            off += fx::entry_size(e.name.len());
        }
        panic!("no in-inode xattr {index}.{}", String::from_utf8_lossy(name));
    }
}

/// Re-checksums an inode record in place (its seed depends on its own generation field).
fn fix_inode_record(rec: &mut [u8], ino: u32, fs_seed: u32) {
    let generation = u32::from_le_bytes(rec[0x64..0x68].try_into().unwrap());
    fi::set_inode_checksum(rec, inode_csum_seed(fs_seed, ino, generation));
}

// ---------------------------------------------------------------------------------------------
// Assertions
// ---------------------------------------------------------------------------------------------

const EBADMSG: i32 = 74;
const EUCLEAN: i32 = 117;

#[track_caller]
fn corrupt<T>(r: rext4::Result<T>) -> Corrupt {
    match r {
        Err(Error::Corrupt(c)) => c,
        Err(e) => panic!("expected a corruption error, got {e:?}"),
        Ok(_) => panic!("expected a corruption error, got success"),
    }
}

/// A structural (not checksum) corruption error about `ino`.
#[track_caller]
fn structural<T>(r: rext4::Result<T>, ino: u32) -> Corrupt {
    let c = corrupt(r);
    assert!(!c.is_checksum(), "expected a structural error, got checksum error {c}");
    assert_eq!(c.inode(), Some(InodeNo(ino)), "wrong inode in {c}");
    assert_eq!(Error::Corrupt(c.clone()).errno(), EUCLEAN);
    c
}

/// A checksum error about `ino` (and block `blk`, if given).
#[track_caller]
fn checksum<T>(r: rext4::Result<T>, ino: u32, blk: Option<u64>) -> Corrupt {
    let c = corrupt(r);
    assert!(c.is_checksum(), "expected a checksum error, got {c}");
    assert_eq!(c.inode(), Some(InodeNo(ino)), "wrong inode in {c}");
    if let Some(b) = blk {
        assert_eq!(c.block().map(|b| b.0), Some(b), "wrong block in {c}");
    }
    assert_eq!(Error::Corrupt(c.clone()).errno(), EBADMSG);
    c
}

#[track_caller]
fn block_is(c: &Corrupt, blk: u64) {
    assert_eq!(c.block().map(|b| b.0), Some(blk), "wrong block in {c}");
}

#[track_caller]
fn message_has(c: &Corrupt, words: &str) {
    let s = c.to_string();
    assert!(s.contains(words), "message {s:?} should mention {words:?}");
}

#[track_caller]
fn incompatible<T>(r: rext4::Result<T>, words: &str) {
    match r {
        Err(Error::Incompatible(m)) => assert!(m.contains(words), "message {m:?} should mention {words:?}"),
        Err(e) => panic!("expected Error::Incompatible({words:?}), got {e:?}"),
        Ok(_) => panic!("expected Error::Incompatible({words:?}), got success"),
    }
}

/// A superblock-level structural error (no inode, no group).
#[track_caller]
fn sb_corrupt<T>(r: rext4::Result<T>) -> Corrupt {
    let c = corrupt(r);
    assert_eq!(c.inode(), None, "{c}");
    assert_eq!(c.group(), None, "{c}");
    assert_eq!(Error::Corrupt(c.clone()).errno(), EUCLEAN);
    c
}

fn names(fs: &Fs, dir: u32) -> rext4::Result<Vec<Vec<u8>>> {
    let mut v = Vec::new();
    fs.readdir(InodeNo(dir), 0, |e| {
        v.push(e.name);
        true
    })?;
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// Child processes: tests that could abort or spin
// ---------------------------------------------------------------------------------------------

const CHILD_ENV: &str = "REXT4_CORRUPTION_CHILD";
const START_ENV: &str = "REXT4_CORRUPTION_START";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn in_child(name: &str) -> bool {
    std::env::var(CHILD_ENV).as_deref() == Ok(name)
}

/// Spawns this test binary running only test `name` in child mode, with `start` as the first
/// case. Returns the child and a thread collecting its stderr.
fn spawn_child(name: &str, start: usize) -> (std::process::Child, std::thread::JoinHandle<String>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .env(START_ENV, start.to_string())
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let h = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    });
    (child, h)
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs `body` in a child process (running only test `name`), killing it after `timeout`.
/// Fails if the child fails, crashes (stack overflow, abort) or times out.
fn isolated(name: &str, timeout: Duration, body: impl FnOnce()) {
    if in_child(name) {
        body();
        return;
    }
    let (mut child, err) = spawn_child(name, 0);
    let mut out = child.stdout.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = format!("{}\n{}", out.join().unwrap(), err.join().unwrap());
    match status {
        None => panic!("{name}: HANG, no result after {timeout:?}\n{}", tail(&text, 30)),
        Some(st) if !st.success() => {
            panic!(
                "{name}: child failed ({st}; a signal means a crash such as a stack overflow)\n{}",
                tail(&text, 40)
            )
        }
        Some(_) => {
            assert!(text.contains("1 passed"), "{name}: the child did not run the test\n{}", tail(&text, 10))
        }
    }
}

/// One sweep or random case: patches to one fixture, then a walk.
struct Case {
    desc: String,
    variant: Variant,
    patches: Vec<(usize, Vec<u8>)>,
    /// Full walk (everything reachable) rather than the light one (the fixture paths).
    full: bool,
}

/// The panic hook of sweep children: the message, location and the engine frames of the
/// backtrace, for the parent's report.
fn install_reporting_hook() {
    std::panic::set_hook(Box::new(|info| {
        let bt = std::backtrace::Backtrace::force_capture().to_string();
        let frames: Vec<String> = bt
            .lines()
            .map(str::trim)
            .filter(|l| l.contains("rext4") && !l.contains("corruption::") && !l.starts_with("at "))
            .take(8)
            .map(|l| l.split_once(": ").map_or(l, |x| x.1).to_string())
            .collect();
        *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) =
            format!("{} [engine frames: {}]", info.to_string().replace('\n', " "), frames.join(" <- "));
    }));
}

static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

/// Runs `cases()` in child processes. A child prints `CASE i` before each case and `PANIC i ...`
/// for a caught panic; a watchdog thread ends it (`HANG i ...`, exit 3) when a case runs longer
/// than `per_case`. The parent restarts after a hung or crashed case, so every case runs (up to
/// `REXT4_CORRUPTION_MAX_HANGS` hangs and crashes), then fails listing every problem.
fn run_cases(name: &str, per_case: Duration, cases: impl FnOnce() -> Vec<Case>) {
    if in_child(name) {
        run_cases_child(per_case, cases());
        return;
    }
    let max_hangs = env_usize("REXT4_CORRUPTION_MAX_HANGS", 3);
    let mut problems = Vec::new();
    let (mut start, mut hangs, mut ran) = (0usize, 0usize, 0usize);
    loop {
        let (mut child, err) = spawn_child(name, start);
        let (mut last, mut done, mut hung) = (None, false, false);
        for line in BufReader::new(child.stdout.take().unwrap()).lines() {
            let line = line.unwrap_or_default();
            if let Some(i) = line.strip_prefix("CASE ") {
                last = i.parse::<usize>().ok();
                ran += 1;
            } else if line.starts_with("PANIC ") {
                problems.push(line);
            } else if line.starts_with("HANG ") {
                problems.push(line);
                hung = true;
            } else if line == "DONE" {
                done = true;
            }
        }
        let status = child.wait().unwrap();
        let err = err.join().unwrap();
        if done && status.success() {
            break;
        }
        let Some(last) = last else {
            panic!("{name}: child failed before its first case ({status}):\n{}", tail(&err, 40));
        };
        if !hung {
            problems.push(format!("CRASH {last} ({status}): {}", tail(&err, 6).replace('\n', " | ")));
        }
        hangs += 1;
        if hangs >= max_hangs {
            problems.push(format!(
                "(stopped after {hangs} hangs/crashes; set REXT4_CORRUPTION_MAX_HANGS to go on)"
            ));
            break;
        }
        start = last + 1;
    }
    eprintln!("{name}: {ran} cases run");
    assert!(problems.is_empty(), "{name}: {} problems:\n{}", problems.len(), problems.join("\n"));
}

fn run_cases_child(per_case: Duration, cases: Vec<Case>) {
    install_reporting_hook();
    let start = env_usize(START_ENV, 0);
    let current: Arc<Mutex<(usize, String, Instant)>> =
        Arc::new(Mutex::new((start, String::new(), Instant::now())));
    let watched = current.clone();
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(100));
        let g = watched.lock().unwrap_or_else(|e| e.into_inner());
        if g.2.elapsed() > per_case {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "HANG {} {}: no result after {per_case:?}", g.0, g.1);
            let _ = out.flush();
            std::process::exit(3);
        }
    });
    let mut devs: HashMap<Variant, Arc<MemDevice>> = HashMap::new();
    // The harness has printed "test NAME ... " without a newline.
    println!();
    let skip: Vec<String> = std::env::var("REXT4_CORRUPTION_SKIP")
        .map(|v| v.split(',').filter(|s| !s.is_empty()).map(String::from).collect())
        .unwrap_or_default();
    for (i, c) in cases.iter().enumerate().skip(start) {
        if skip.iter().any(|s| c.desc.contains(s.as_str())) {
            continue;
        }
        *current.lock().unwrap() = (i, format!("{:?} {}", c.variant, c.desc), Instant::now());
        println!("CASE {i}");
        let f = fixture(c.variant).expect("fixture");
        let dev = devs.entry(c.variant).or_insert_with(|| Arc::new(MemDevice::new(f.bytes.clone())));
        for (o, b) in &c.patches {
            dev.write_at(b, *o as u64).unwrap();
        }
        let r = if c.full { open_and_walk(dev.clone()).map(|_| ()) } else { open_and_light_walk(dev) };
        for (o, b) in &c.patches {
            dev.write_at(&f.bytes[*o..*o + b.len()], *o as u64).unwrap();
        }
        if let Err(p) = r {
            println!("PANIC {i} {:?} {}: {}", c.variant, c.desc, p.replace('\n', " "));
        }
    }
    // Stop the watchdog from firing while the harness winds down.
    *current.lock().unwrap() = (usize::MAX, "done".into(), Instant::now() + Duration::from_secs(3600));
    println!("DONE");
}

// ---------------------------------------------------------------------------------------------
// Walks
// ---------------------------------------------------------------------------------------------

/// Visits everything reachable: readdir (twice, once resumed from the middle) and lookup of
/// every entry, getattr, bounded reads, readlink, listxattr/getxattr, statfs, and the path API
/// over the root's entries. Errors are fine; panics and unbounded work are not. Returns the
/// number of operations done.
fn walk(fs: &Fs) -> usize {
    const MAX_INODES: usize = 4000;
    const MAX_ENTRIES: usize = 4000;
    const MAX_READ: u64 = 256 << 10;
    let mut ops = 0usize;
    let _ = fs.statfs();
    let _ = fs.read_only_reasons();
    let mut seen = HashSet::new();
    let mut stack = vec![(fs.root(), 0u32)];
    let mut buf = vec![0u8; 64 << 10];
    while let Some((ino, depth)) = stack.pop() {
        if !seen.insert(ino) || seen.len() > MAX_INODES {
            continue;
        }
        ops += 1;
        if let Ok(names) = fs.listxattr(ino) {
            for n in names.iter().take(32) {
                let _ = fs.getxattr(ino, n);
            }
        }
        let _ = fs.getxattr(ino, b"user.absent");
        let Ok(attr) = fs.getattr(ino) else { continue };
        match attr.kind {
            FileType::Directory => {
                let mut entries = Vec::new();
                let _ = fs.readdir(ino, 0, |e| {
                    entries.push(e);
                    entries.len() < MAX_ENTRIES
                });
                if let Some(mid) = entries.get(entries.len() / 2) {
                    let _ = fs.readdir(ino, mid.next, |_| false);
                }
                for e in &entries {
                    ops += 1;
                    if e.name == b"." || e.name == b".." {
                        continue;
                    }
                    let _ = fs.lookup(ino, &e.name);
                    if depth < 12 {
                        stack.push((e.ino, depth + 1));
                    }
                }
                let _ = fs.lookup(ino, b"no-such-name-here");
            }
            FileType::RegularFile => {
                let mut off = 0u64;
                while off < attr.size.min(MAX_READ) {
                    ops += 1;
                    match fs.read(ino, off, &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => off += n as u64,
                    }
                }
                if attr.size > 0 {
                    let _ = fs.read(ino, attr.size - 1, &mut buf[..1]);
                    let _ = fs.read(ino, attr.size / 2, &mut buf[..4096]);
                }
                let _ = fs.read(ino, u64::MAX - 10, &mut buf[..16]);
            }
            FileType::Symlink => {
                let _ = fs.readlink(ino);
            }
            _ => {}
        }
    }
    // The path API over the root's entries (follows symlinks, ReadDir batching, File reads).
    if let Ok(rd) = fs.read_dir("/") {
        for e in rd.take(64).flatten() {
            let mut p = b"/".to_vec();
            p.extend_from_slice(&e.name);
            let p = std::path::PathBuf::from(
                <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(p),
            );
            let _ = fs.metadata(&p);
            let _ = fs.symlink_metadata(&p);
            let _ = fs.read_link(&p);
            if let Ok(rd) = fs.read_dir(&p) {
                ops += rd.take(MAX_ENTRIES).count();
            }
            if let Ok(mut f) = fs.open_file(&p) {
                let mut b = vec![0u8; 4096];
                let _ = f.read(&mut b);
            }
        }
    }
    for p in PATHS {
        let _ = fs.metadata(p);
    }
    ops
}

/// A cheap visit for sweeps: each fixture path through the path and inode APIs (bounded
/// reads, readdir, lookups, readlink, xattrs).
fn light_walk(fs: &Fs) {
    let _ = fs.statfs();
    let mut buf = vec![0u8; 16 << 10];
    let _ = names(fs, 2);
    for p in PATHS.iter().chain(&["/huge"]) {
        let _ = fs.metadata(p);
        let Ok(ino) = fs.resolve(p, false) else { continue };
        let _ = fs.listxattr(ino);
        let _ = fs.getxattr(ino, b"user.big");
        let _ = fs.getxattr(ino, b"user.huge");
        let Ok(a) = fs.getattr(ino) else { continue };
        match a.kind {
            FileType::Directory => {
                let mut n = 0;
                let _ = fs.readdir(ino, 0, |_| {
                    n += 1;
                    n < 1000
                });
                let _ = fs.lookup(ino, b"a");
                let _ = fs.lookup(ino, BIG_NAME);
                let _ = fs.lookup(ino, huge_name(1500).as_bytes());
                let _ = fs.lookup(ino, b"no-such-name");
            }
            FileType::RegularFile => {
                let _ = fs.read(ino, 0, &mut buf);
                let _ = fs.read(ino, a.size.saturating_sub(100), &mut buf);
                let _ = fs.read(ino, 8192 * 7, &mut buf);
            }
            FileType::Symlink => {
                let _ = fs.readlink(ino);
                let _ = fs.read_link(p);
            }
            _ => {}
        }
    }
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    let msg = p
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "non-string panic".into());
    let hook = std::mem::take(&mut *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()));
    if hook.is_empty() {
        msg
    } else {
        hook
    }
}

fn open_and_light_walk(dev: &Arc<MemDevice>) -> Result<(), String> {
    let dev: Arc<dyn BlockDevice> = dev.clone();
    catch_unwind(AssertUnwindSafe(|| {
        if let Ok(fs) = Fs::from_device(dev, Options::default()) {
            light_walk(&fs);
        }
    }))
    .map_err(panic_message)
}

fn open_and_walk(dev: Arc<MemDevice>) -> Result<usize, String> {
    catch_unwind(AssertUnwindSafe(|| match Fs::from_device(dev, Options::default()) {
        Ok(fs) => walk(&fs),
        Err(_) => 0,
    }))
    .map_err(panic_message)
}

// ---------------------------------------------------------------------------------------------
// Pristine images
// ---------------------------------------------------------------------------------------------

#[test]
fn pristine_fixtures_read_back() {
    for v in ALL_VARIANTS {
        let img = img!(v);
        let fs = img.fs();
        assert_eq!(fs.read_file("/dir1/sub/file").unwrap(), b"hello\n", "{v:?}");
        assert_eq!(fs.read_file("/fastlink").unwrap(), b"hello\n", "{v:?}");
        let slow = fs.read_link("/slowlink").unwrap();
        assert_eq!(slow.as_os_str().len(), SLOW_TARGET_REPEAT * 2 + 6, "{v:?}");
        let frag = fs.read_file("/frag").unwrap();
        assert_eq!(frag.len(), 11 * 8192 + 4096, "{v:?}");
        assert_eq!(frag[8192 * 3], b'D', "{v:?}");
        assert_eq!(frag[8192 * 3 + 4096], 0, "{v:?}");
        let small = InodeNo(img.ino("/small"));
        assert_eq!(fs.getxattr(small, b"user.big").unwrap().len(), BIG_XATTR_LEN, "{v:?}");
        assert_eq!(fs.getxattr(small, b"user.tiny").unwrap(), b"abc", "{v:?}");
        assert_eq!(fs.getxattr(InodeNo(img.ino("/dir1")), b"user.d").unwrap(), b"dirval", "{v:?}");
        if v == Variant::Inline {
            assert_eq!(fs.getxattr(InodeNo(img.ino("/medium")), b"user.huge").unwrap(), vec![b'y'; 4096]);
            assert_eq!(fs.read_file("/medium").unwrap(), vec![b'm'; 100]);
        }
    }
}

/// Indexed directories of pristine images read and look up (one- and two-level htrees, with
/// and without metadata_csum).
#[test]
fn pristine_htree_dirs_read_back() {
    let mut failures = Vec::new();
    for v in ALL_VARIANTS {
        let img = img!(v);
        let fs = img.fs();
        let r = catch_unwind(AssertUnwindSafe(|| {
            let n = fs.read_dir("/big").unwrap().collect::<rext4::Result<Vec<_>>>().unwrap().len();
            assert_eq!(n, 500);
            assert_eq!(fs.metadata("/big/entry_0123_padding_name").unwrap().size, 4);
            if v.has_huge_dir() {
                assert_eq!(
                    fs.read_dir("/huge").unwrap().collect::<rext4::Result<Vec<_>>>().unwrap().len(),
                    3000
                );
                for i in [0, 1234, 2999] {
                    fs.metadata(format!("/huge/{}", huge_name(i))).unwrap();
                }
            }
            assert!(walk(&fs) > 500);
        }));
        if let Err(p) = r {
            failures.push(format!("{v:?}: {}", panic_message(p)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The fixtures really contain the structures the tests below corrupt.
#[test]
fn fixtures_have_the_structures_under_test() {
    for v in [Variant::Csum4k, Variant::NoCsum4k, Variant::Ext2, Variant::Csum1k] {
        let img = img!(v);
        let big = img.ino("/big");
        assert!(img.inode(big).flags() & fi::INDEX_FL != 0, "{v:?}: /big should be indexed");
        assert_ne!(img.inode(img.ino("/small")).file_acl(), 0, "{v:?}: /small xattr block");
        if v != Variant::Ext2 {
            let frag = img.inode(img.ino("/frag"));
            assert!(Node::parse(frag.i_block_bytes()).unwrap().depth() >= 1, "{v:?}: /frag extent depth");
        }
    }
    for v in [Variant::Csum1k, Variant::Ext2] {
        let img = img!(v);
        let root = img.pblk(img.ino("/huge"), 0);
        assert_eq!(dx::parse_root(img.block(root)).unwrap().info.indirect_levels, 1, "{v:?}");
    }
    let img = img!(Variant::NoCsum4k);
    assert!(img.g.gdt_csum && !img.g.metadata_csum);
    let img = img!(Variant::Inline);
    assert!(img.inode(img.ino("/dir1")).flags() & fi::INLINE_DATA_FL != 0);
    assert!(img.inode(img.ino("/dir1/sub/file")).flags() & fi::INLINE_DATA_FL != 0);
    let img = img!(Variant::Ext2);
    assert_ne!(img.inode(img.ino("/frag")).i_block[fi::IND_BLOCK].get(), 0);
}

// ---------------------------------------------------------------------------------------------
// Superblock
// ---------------------------------------------------------------------------------------------

#[test]
fn sb_bad_magic_is_refused() {
    let mut img = img!(Variant::Csum4k);
    img.sb16(0x38, 0x1234);
    incompatible(img.open(), "magic");
}

#[test]
fn sb_checksum_mismatch() {
    let mut img = img!(Variant::Csum4k);
    img.b[SB + 0x78] ^= 0x55; // volume name, checksum not updated
    let c = corrupt(img.open());
    assert!(c.is_checksum(), "{c}");
    assert_eq!(c.inode(), None);
    assert_eq!(Error::Corrupt(c).errno(), EBADMSG);
}

#[test]
fn sb_log_block_size_out_of_range() {
    for v in [7u32, 31, u32::MAX] {
        let mut img = img!(Variant::Csum4k);
        img.sb32(0x18, v);
        img.sb32(0x1C, v); // cluster size alike, so the block size check is the one that fires
        message_has(&sb_corrupt(img.open()), "block size");
    }
    // A different but valid block size: geometry no longer matches the device or the groups.
    let mut img = img!(Variant::Csum4k);
    img.sb32(0x18, 4);
    img.sb32(0x1C, 4);
    assert!(img.open().is_err());
}

#[test]
fn sb_counts_out_of_range() {
    // blocks_count beyond the device.
    let mut img = img!(Variant::Csum4k);
    img.sb32(0x04, u32::MAX);
    incompatible(img.open(), "exceeds the device");
    // blocks_count 0.
    let mut img = img!(Variant::Csum4k);
    img.sb32(0x04, 0);
    sb_corrupt(img.open());
    // inodes_count not groups x inodes_per_group.
    let mut img = img!(Variant::Csum4k);
    let n = img.u32_at(SB);
    img.sb32(0x00, n + 1);
    message_has(&sb_corrupt(img.open()), "inode count");
    // first_data_block wrong for the block size.
    let mut img = img!(Variant::Csum4k);
    img.sb32(0x14, 1);
    message_has(&sb_corrupt(img.open()), "first data block");
    // blocks_per_group 0 and too many.
    for v in [0u32, 4096 * 8 + 1] {
        let mut img = img!(Variant::Csum4k);
        img.sb32(0x20, v);
        img.sb32(0x24, v);
        message_has(&sb_corrupt(img.open()), "blocks per group");
    }
}

#[test]
fn sb_inodes_per_group_out_of_range() {
    for v in [0u32, 1, 4096 * 8 + 1, u32::MAX] {
        let mut img = img!(Variant::Csum4k);
        img.sb32(0x28, v);
        sb_corrupt(img.open());
    }
    // Valid-looking but inconsistent with the inode count.
    let mut img = img!(Variant::Csum4k);
    let ipg = img.u32_at(SB + 0x28);
    img.sb32(0x28, ipg / 2);
    message_has(&sb_corrupt(img.open()), "inode count");
}

#[test]
fn sb_inode_size_and_first_ino() {
    for v in [0u16, 100, 129, 384, 8192, u16::MAX] {
        let mut img = img!(Variant::Csum4k);
        img.sb16(0x58, v);
        message_has(&sb_corrupt(img.open()), "inode size");
    }
    for v in [0u32, 5, u32::MAX] {
        let mut img = img!(Variant::Csum4k);
        img.sb32(0x54, v);
        message_has(&sb_corrupt(img.open()), "first inode");
    }
}

#[test]
fn sb_desc_size_out_of_range() {
    for v in [0u16, 32, 48, 65, 96, 2048, u16::MAX] {
        let mut img = img!(Variant::Csum4k);
        img.sb16(0xFE, v);
        message_has(&sb_corrupt(img.open()), "descriptor size");
    }
}

#[test]
fn sb_unknown_incompat_feature_is_refused_by_name() {
    let mut img = img!(Variant::Csum4k);
    let f = img.u32_at(SB + 0x60);
    img.sb32(0x60, f | 1 << 31);
    incompatible(img.open(), "FEATURE_I31");
    // Known to e2fsprogs but not implemented: named by its real name.
    let mut img = img!(Variant::Csum4k);
    img.sb32(0x60, f | 0x1000);
    incompatible(img.open(), "dirdata");
    let mut img = img!(Variant::Csum4k);
    img.sb32(0x60, f | 0x0001);
    incompatible(img.open(), "compression");
}

#[test]
fn sb_unknown_ro_compat_feature_opens_read_only() {
    let mut img = img!(Variant::Csum4k);
    let f = img.u32_at(SB + 0x64);
    img.sb32(0x64, f | 1 << 30);
    let fs = img.fs();
    let why = fs.read_only_reasons();
    assert!(!why.is_empty());
    assert!(why.iter().any(|r| r.contains("FEATURE_R30")), "{why:?}");
    // Still readable.
    assert_eq!(fs.read_file("/dir1/sub/file").unwrap(), b"hello\n");
}

#[test]
fn sb_needs_recovery_with_an_empty_log_opens_and_journal_device_is_refused() {
    let mut img = img!(Variant::Csum4k);
    let f = img.u32_at(SB + 0x60);
    img.sb32(0x60, f | 0x4);
    // Journal recovery runs at open (tests/recovery.rs); an empty log replays nothing.
    let fs = img.open().unwrap();
    assert_eq!(fs.recovery().map(|r| r.transactions), Some(0));
    let mut img = img!(Variant::Csum4k);
    img.sb32(0x60, f | 0x8);
    incompatible(img.open(), "journal device");
}

#[test]
fn sb_metadata_csum_with_uninit_bg_or_bad_type() {
    let mut img = img!(Variant::Csum4k);
    let f = img.u32_at(SB + 0x64);
    img.sb32(0x64, f | 0x10);
    sb_corrupt(img.open());
    let mut img = img!(Variant::Csum4k);
    img.b[SB + 0x175] = 7;
    img.fix_sb();
    message_has(&sb_corrupt(img.open()), "checksum type");
}

#[test]
fn device_too_small() {
    let img = img!(Variant::Csum4k);
    for len in [0usize, 1024, 2047, 4096, 1 << 20] {
        let r = open_bytes(img.b[..len].to_vec());
        assert!(matches!(r, Err(Error::Incompatible(_))), "len {len}: {:?}", r.err());
    }
}

/// Every 32-bit word of the superblock set to a few hostile values (re-checksummed), on a
/// 4 KiB metadata_csum image and a 1 KiB ext2 image: open fails cleanly or the image reads
/// without panicking or hanging.
#[test]
fn sb_field_sweep() {
    run_cases("sb_field_sweep", Duration::from_secs(5), || {
        let mut cases = Vec::new();
        for v in [Variant::Csum4k, Variant::Ext2] {
            let Some(f) = fixture(v) else { return cases };
            let img = Img::new(f);
            let orig = &img.b[SB..SB + 1024];
            for word in 0..(0x3FC / 4) {
                for val in [0u32, 1, 0xFFFF_FFFF, 0x8000_0000, 0x0000_FFFF] {
                    let mut sb = orig.to_vec();
                    sb[4 * word..4 * word + 4].copy_from_slice(&val.to_le_bytes());
                    if img.g.metadata_csum {
                        let c = crc32c(!0, &sb[..0x3FC]);
                        sb[0x3FC..].copy_from_slice(&c.to_le_bytes());
                    }
                    let desc = format!("sb word 0x{:x} = {val:#x}", 4 * word);
                    cases.push(Case { desc, variant: v, patches: vec![(SB, sb)], full: false });
                }
            }
        }
        cases
    });
}

// ---------------------------------------------------------------------------------------------
// Group descriptors
// ---------------------------------------------------------------------------------------------

#[test]
fn gd_checksum_mismatch_names_group() {
    for v in [Variant::Csum4k, Variant::NoCsum4k] {
        let mut img = img!(v);
        let o = img.gd_off(0) + 0x0C;
        img.b[o] ^= 1; // free blocks count, checksum not updated
        let c = corrupt(img.open());
        assert!(c.is_checksum(), "{v:?}: {c}");
        assert_eq!(c.group(), Some(0), "{v:?}: {c}");
    }
}

#[test]
fn gd_inode_table_out_of_range() {
    for v in [Variant::Csum4k, Variant::NoCsum4k, Variant::Ext2] {
        // (Block 1, the descriptor block itself, is accepted read-only, as by the kernel.)
        for bad in [0u32, 0x00FF_FFFF, u32::MAX] {
            let mut img = img!(v);
            let o = img.gd_off(0) + 0x08;
            img.put32(o, bad);
            img.fix_gd(0);
            let c = corrupt(img.open());
            assert!(!c.is_checksum(), "{v:?}: {c}");
            assert_eq!(c.group(), Some(0), "{v:?}: {c}");
            message_has(&c, "inode table");
        }
        // Straddling the end of the filesystem.
        let mut img = img!(v);
        let o = img.gd_off(0) + 0x08;
        let last = (img.g.blocks_count - 2) as u32;
        img.put32(o, last);
        img.fix_gd(0);
        let c = corrupt(img.open());
        assert_eq!(c.group(), Some(0), "{v:?}: {c}");
    }
}

#[test]
fn gd_bitmaps_and_counts() {
    for (field, words) in [(0x00usize, "block bitmap"), (0x04, "inode bitmap")] {
        for bad in [0u32, u32::MAX] {
            let mut img = img!(Variant::Csum4k);
            let o = img.gd_off(0) + field;
            img.put32(o, bad);
            img.fix_gd(0);
            let c = corrupt(img.open());
            assert_eq!(c.group(), Some(0), "{c}");
            message_has(&c, words);
        }
    }
    let mut img = img!(Variant::Csum4k);
    let o = img.gd_off(0) + 0x0E;
    img.put16(o, u16::MAX);
    img.fix_gd(0);
    assert_eq!(corrupt(img.open()).group(), Some(0));
}

/// A descriptor claiming its inode table is unused reads inodes as free: entries pointing at
/// them are "deleted inode referenced", not garbage.
#[test]
fn gd_itable_unused_hides_inodes() {
    let mut img = img!(Variant::Csum4k);
    let ipg = img.g.ipg;
    let o = img.gd_off(0) + 0x1C;
    img.put16(o, (ipg - 1) as u16);
    let o = img.gd_off(0) + 0x32;
    img.put16(o, 0);
    img.fix_gd(0);
    let fs = img.fs();
    // Root (inode 2) now lies in the "unused" part: reads as a zeroed inode.
    let r = fs.getattr(InodeNo(2));
    structural(r, 2);
    assert!(walk(&fs) < 10);
}

/// Every 16-bit word of the first descriptor set to hostile values (re-checksummed).
#[test]
fn gd_field_sweep() {
    run_cases("gd_field_sweep", Duration::from_secs(5), || {
        let mut cases = Vec::new();
        for v in [Variant::Csum4k, Variant::NoCsum4k, Variant::Ext2] {
            let Some(f) = fixture(v) else { return cases };
            let img = Img::new(f);
            let ds = img.g.desc_size;
            for word in 0..ds / 2 {
                for val in [0u16, 1, 0xFFFF, 0x8000, 0x00FF] {
                    let mut p = Img::new(f);
                    let o = p.gd_off(0);
                    p.put16(o + 2 * word, val);
                    p.fix_gd(0);
                    let desc = format!("gd0 word 0x{:x} = {val:#x}", 2 * word);
                    let patches = vec![(o, p.b[o..o + ds].to_vec())];
                    cases.push(Case { desc, variant: v, patches, full: false });
                }
            }
        }
        cases
    });
}

// ---------------------------------------------------------------------------------------------
// Inodes
// ---------------------------------------------------------------------------------------------

#[test]
fn inode_checksum_mismatch() {
    let mut img = img!(Variant::Csum4k);
    let ino = img.ino("/small");
    let o = img.inode_off(ino) + 0x10;
    img.b[o] ^= 0xFF; // mtime, checksum not updated
    let fs = img.fs();
    checksum(fs.getattr(InodeNo(ino)), ino, None);
    checksum(fs.lookup(InodeNo(2), b"small"), ino, None);
    checksum(fs.metadata("/small"), ino, None);
    checksum(fs.read_file("/small"), ino, None);
    // Other files are unaffected.
    assert_eq!(fs.read_file("/dir1/sub/file").unwrap(), b"hello\n");
}

#[test]
fn inode_root_checksum_mismatch() {
    let mut img = img!(Variant::Csum4k);
    let o = img.inode_off(2) + 0x20;
    img.b[o] ^= 0x01;
    let fs = img.fs();
    checksum(fs.getattr(InodeNo(2)), 2, None);
    checksum(fs.metadata("/dir1"), 2, None);
}

#[test]
fn inode_mode_garbage() {
    for mode in [0u16, 0xF1A4, 0x3000 | 0o644, 0xD000] {
        let mut img = img!(Variant::Csum4k);
        let ino = img.ino("/small");
        img.inode16(ino, 0x00, mode);
        let fs = img.fs();
        let c = structural(fs.getattr(InodeNo(ino)), ino);
        message_has(&c, "file type");
        structural(fs.lookup(InodeNo(2), b"small"), ino);
        walk(&fs);
    }
    // A directory turned into a regular file and vice versa: type errors, not corruption.
    let mut img = img!(Variant::Csum4k);
    let dir1 = img.ino("/dir1");
    let small = img.ino("/small");
    img.inode16(dir1, 0x00, fi::S_IFREG | 0o644);
    img.inode16(small, 0x00, fi::S_IFDIR | 0o755);
    let fs = img.fs();
    assert!(matches!(fs.read_dir("/dir1").map(|_| ()), Err(Error::NotDir)));
    assert!(matches!(fs.metadata("/dir1/sub"), Err(Error::NotDir)));
    // Reading a "file" that holds directory blocks is allowed (it is bytes).
    let _ = fs.read_file("/dir1");
    // Readdir of a "directory" whose data is file bytes: a typed error (a checksum error with
    // metadata_csum, since file data has no directory tail; structural without).
    let c = corrupt(names(&fs, small));
    assert_eq!(c.inode(), Some(InodeNo(small)), "{c}");
    let mut img = img!(Variant::NoCsum4k);
    let small = img.ino("/small");
    img.inode16(small, 0x00, fi::S_IFDIR | 0o755);
    structural(names(&img.fs(), small), small);
    walk(&fs);
}

#[test]
fn inode_links_zero_is_deleted() {
    let mut img = img!(Variant::Csum4k);
    let ino = img.ino("/small");
    img.inode16(ino, 0x1A, 0);
    let fs = img.fs();
    message_has(&structural(fs.lookup(InodeNo(2), b"small"), ino), "deleted");
    // Entries pointing to never-used inodes.
    let mut img = img!(Variant::Csum4k);
    let blk = img.pblk(img.ino("/dir1"), 0);
    let o = img.entry_off(blk, b"a");
    let free = img.g.ipg - 2; // far past the used inodes of group 0
    img.put32(o, free);
    img.fix_dir_leaf(img.ino("/dir1"), blk);
    let fs = img.fs();
    structural(fs.metadata("/dir1/a"), free);
}

#[test]
fn inode_bad_extra_isize() {
    for v in [2u16, 3, 200, 0xFFFF] {
        let mut img = img!(Variant::Csum4k);
        let ino = img.ino("/small");
        // Checksum computation itself depends on i_extra_isize; patch and re-checksum.
        img.inode16(ino, 0x80, v);
        let fs = img.fs();
        let r = fs.getattr(InodeNo(ino));
        let c = corrupt(r);
        assert_eq!(c.inode(), Some(InodeNo(ino)), "{c}");
    }
}

#[test]
fn inode_extent_root_corrupt() {
    // (field offset in i_block, value, expected words)
    let cases: &[(usize, u16, &str)] = &[
        (0, 0xBEEF, "magic"), // eh_magic
        (2, 5, "count"),      // eh_entries > eh_max (4)
        (4, 5, "count"),      // eh_max larger than i_block holds
        (6, 6, "depth"),      // eh_depth > 5
    ];
    for v in [Variant::Csum4k, Variant::NoCsum4k] {
        for &(field, val, words) in cases {
            let mut img = img!(v);
            let ino = img.ino("/frag");
            img.inode16(ino, 0x28 + field, val);
            let fs = img.fs();
            let mut b = [0u8; 16];
            let c = structural(fs.read(InodeNo(ino), 0, &mut b), ino);
            assert_eq!(c.block(), None, "{c}");
            message_has(&c, words);
            // getattr does not need the tree.
            assert!(fs.getattr(InodeNo(ino)).is_ok());
        }
    }
    // A directory's extent root: readdir and lookup report it.
    let mut img = img!(Variant::Csum4k);
    let ino = img.ino("/dir1");
    img.inode16(ino, 0x28, 0);
    let fs = img.fs();
    structural(names(&fs, ino), ino);
    structural(fs.metadata("/dir1/a"), ino);
}

#[test]
fn inode_extent_root_pointer_out_of_range() {
    for v in [Variant::Csum4k, Variant::Csum1k] {
        let mut img = img!(v);
        let ino = img.ino("/small");
        // Leaf extent 0 of the root: ee_start_lo at i_block + 12 + 8, ee_start_hi at +6.
        img.inode32(ino, 0x28 + 12 + 8, 0xFFFF_FFF0);
        let fs = img.fs();
        let mut b = [0u8; 16];
        let c = structural(fs.read(InodeNo(ino), 0, &mut b), ino);
        block_is(&c, 0xFFFF_FFF0);
        let mut img = img!(v);
        img.inode16(ino, 0x28 + 12 + 6, 0xFFFF);
        let fs = img.fs();
        let c = structural(fs.read(InodeNo(ino), 0, &mut b), ino);
        assert!(c.block().unwrap().0 > img.g.blocks_count, "{c}");
        // An extent running off the end of the filesystem.
        let mut img = img!(v);
        let last = (img.g.blocks_count - 1) as u32;
        img.inode32(ino, 0x28 + 12 + 8, last);
        img.inode16(ino, 0x28 + 12 + 4, 8);
        let fs = img.fs();
        structural(fs.read(InodeNo(ino), 0, &mut b), ino);
        // Pointing at block 0 (the boot block / superblock).
        let mut img = img!(v);
        img.inode32(ino, 0x28 + 12 + 8, 0);
        let fs = img.fs();
        let r = fs.read(InodeNo(ino), 0, &mut b);
        if v == Variant::Csum1k {
            // Block 0 is below s_first_data_block on 1 KiB filesystems.
            structural(r, ino);
        } else {
            let _ = r;
        }
    }
}

#[test]
fn inode_huge_size_file() {
    let mut img = img!(Variant::Csum4k);
    let ino = img.ino("/frag");
    img.set_size(ino, u64::MAX);
    let fs = img.fs();
    let mut b = vec![0u8; 8192];
    assert_eq!(fs.read(InodeNo(ino), 0, &mut b).unwrap(), 8192);
    assert_eq!(b[0], b'A');
    // Far beyond the last mapped block: zeros, quickly.
    for off in [1u64 << 40, (1 << 44) - 4096, u64::MAX - 8192, u64::MAX - 1] {
        let n = fs.read(InodeNo(ino), off, &mut b).unwrap();
        assert!(b[..n].iter().all(|&x| x == 0), "offset {off}");
    }
    assert_eq!(fs.getattr(InodeNo(ino)).unwrap().size, u64::MAX);
}

#[test]
fn inode_blocks_garbage() {
    for v in [Variant::Csum4k, Variant::Ext2] {
        let mut img = img!(v);
        let ino = img.ino("/small");
        img.inode32(ino, 0x1C, u32::MAX);
        img.inode16(ino, 0x74, u16::MAX);
        let f = img.inode(ino).flags();
        img.inode32(ino, 0x20, f | fi::HUGE_FILE_FL);
        let fs = img.fs();
        let a = fs.getattr(InodeNo(ino)).unwrap();
        assert!(a.blocks > 0);
        assert_eq!(fs.read_file("/small").unwrap(), b"small file\n");
        // A symlink whose block count says "slow" but whose target is in i_block.
        let mut img = img!(v);
        let ino = img.ino("/fastlink");
        img.inode32(ino, 0x1C, 8);
        let fs = img.fs();
        let _ = fs.readlink(InodeNo(ino));
        walk(&fs);
    }
}

/// A number no inode can have, passed by the caller: a stale handle (`ESTALE`, as the
/// kernel answers a file handle naming one), not damage to the image.
#[test]
fn inode_number_out_of_range() {
    let img = img!(Variant::Csum4k);
    let fs = img.fs();
    for ino in [0u32, img.g.inodes_count + 1, u32::MAX] {
        assert_eq!(fs.getattr(InodeNo(ino)).unwrap_err().errno(), libc::ESTALE);
        assert_eq!(fs.readdir(InodeNo(ino), 0, |_| true).unwrap_err().errno(), libc::ESTALE);
        let mut b = [0u8; 4];
        assert_eq!(fs.read(InodeNo(ino), 0, &mut b).unwrap_err().errno(), libc::ESTALE);
        assert_eq!(fs.listxattr(InodeNo(ino)).unwrap_err().errno(), libc::ESTALE);
    }
}

#[test]
fn inode_encrypted_flag_gives_enokey() {
    let mut img = img!(Variant::Csum4k);
    let ino = img.ino("/dir1");
    let f = img.inode(ino).flags();
    img.inode32(ino, 0x20, f | fi::ENCRYPT_FL);
    let fs = img.fs();
    assert!(matches!(fs.readdir(InodeNo(ino), 0, |_| true), Err(Error::NoKey)));
    assert!(matches!(fs.read_dir("/dir1").unwrap().next(), Some(Err(Error::NoKey))));
    assert!(matches!(fs.lookup(InodeNo(ino), b"a"), Err(Error::NoKey)));
}

/// Every byte of a few inodes (root, directories, indexed directory, files with extent trees,
/// block maps and inline data, symlinks) set to hostile values (re-checksummed).
#[test]
fn inode_field_sweep() {
    run_cases("inode_field_sweep", Duration::from_secs(5), || {
        let mut cases = Vec::new();
        for v in [Variant::Csum4k, Variant::Ext2, Variant::Inline] {
            let Some(f) = fixture(v) else { return cases };
            let img = Img::new(f);
            for path in [
                "/",
                "/frag",
                "/big",
                "/small",
                "/fastlink",
                "/slowlink",
                "/dir1",
                "/medium",
                "/dir1/sub/file",
            ] {
                let ino = if path == "/" { 2 } else { img.ino(path) };
                let off = img.inode_off(ino);
                let orig = img.inode_raw(ino);
                for field in 0..orig.len().min(176) {
                    for val in [0x00u8, 0xFF, 0x80, 0x01] {
                        if orig[field] == val {
                            continue;
                        }
                        let mut rec = orig.to_vec();
                        rec[field] = val;
                        if img.g.metadata_csum {
                            fix_inode_record(&mut rec, ino, img.g.csum_seed);
                        }
                        let desc = format!("{path} (inode {ino}) byte 0x{field:x} = {val:#x}");
                        cases.push(Case { desc, variant: v, patches: vec![(off, rec)], full: false });
                    }
                }
            }
        }
        cases
    });
}

// ---------------------------------------------------------------------------------------------
// Extent tree blocks
// ---------------------------------------------------------------------------------------------

/// `/frag`'s inode and its first extent tree block.
fn frag_etb(img: &Img) -> (u32, u64) {
    let ino = img.ino("/frag");
    let (_, meta) = img.mapping(ino);
    (ino, meta[0])
}

#[test]
fn extent_block_structure() {
    let cases: &[(usize, u16, &str)] = &[
        (0, 0x0000, "magic"),
        (2, 400, "count"),    // entries > max
        (4, 0xFFFF, "count"), // max beyond the block
        (6, 7, "depth"),      // > 5
    ];
    for v in [Variant::Csum4k, Variant::NoCsum4k, Variant::Csum1k] {
        for &(field, val, words) in cases {
            let mut img = img!(v);
            let (ino, etb) = frag_etb(&img);
            let o = img.block_off(etb) + field;
            img.put16(o, val);
            img.fix_extent_block(ino, etb);
            let fs = img.fs();
            let mut b = [0u8; 16];
            let c = structural(fs.read(InodeNo(ino), 0, &mut b), ino);
            block_is(&c, etb);
            message_has(&c, words);
        }
    }
}

#[test]
fn extent_block_depth_mismatch() {
    for v in [Variant::Csum4k, Variant::Csum1k] {
        // The leaf claims to be an index node: depth 1 under a root of depth 1.
        let mut img = img!(v);
        let (ino, etb) = frag_etb(&img);
        let o = img.block_off(etb) + 6;
        img.put16(o, 1);
        img.fix_extent_block(ino, etb);
        let fs = img.fs();
        let mut b = [0u8; 16];
        let c = structural(fs.read(InodeNo(ino), 0, &mut b), ino);
        block_is(&c, etb);
        message_has(&c, "depth");
        // The root claims depth 3 over a leaf: the leaf's depth 0 does not match 2.
        let mut img = img!(v);
        img.inode16(ino, 0x28 + 6, 3);
        let fs = img.fs();
        let c = structural(fs.read(InodeNo(ino), 0, &mut b), ino);
        message_has(&c, "depth");
    }
}

/// An index entry pointing back at its own block must not loop: depth decreases per level.
#[test]
fn extent_block_self_reference() {
    let mut img = img!(Variant::Csum4k);
    let (ino, etb) = frag_etb(&img);
    // Make the leaf an index node (depth 1 - but the root says 0 is expected) whose entries
    // point at itself, and also make the root deeper so depths agree for one level.
    img.inode16(ino, 0x28 + 6, 2);
    let o = img.block_off(etb);
    img.put16(o + 6, 1);
    let n = img.u16_at(o + 2) as usize;
    for i in 0..n {
        let e = o + 12 + 12 * i;
        img.put32(e + 4, etb as u32);
        img.put16(e + 8, 0);
    }
    img.fix_extent_block(ino, etb);
    let fs = img.fs();
    let mut b = [0u8; 16];
    let c = structural(fs.read(InodeNo(ino), 0, &mut b), ino);
    message_has(&c, "depth");
}

#[test]
fn extent_block_pointer_outside_fs() {
    for v in [Variant::Csum4k, Variant::Csum1k] {
        // The root's index entry.
        let mut img = img!(v);
        let (ino, _) = frag_etb(&img);
        img.inode32(ino, 0x28 + 12 + 4, 0x7FFF_FFFF);
        let fs = img.fs();
        let mut b = [0u8; 16];
        let c = structural(fs.read(InodeNo(ino), 0, &mut b), ino);
        block_is(&c, 0x7FFF_FFFF);
        // A leaf extent in the tree block.
        let mut img = img!(v);
        let (ino, etb) = frag_etb(&img);
        let o = img.block_off(etb) + 12;
        img.put32(o + 8, 0xFFFF_FF00);
        img.put16(o + 6, 0x00FF);
        img.fix_extent_block(ino, etb);
        let fs = img.fs();
        let c = structural(fs.read(InodeNo(ino), 0, &mut b), ino);
        block_is(&c, 0x00FF_FFFF_FF00);
        // Other extents of the same file still read.
        assert_eq!(fs.read(InodeNo(ino), 8192 * 5, &mut b).unwrap(), 16);
        assert_eq!(b[0], b'F');
    }
}

#[test]
fn extent_block_checksum() {
    for v in [Variant::Csum4k, Variant::Csum1k] {
        let mut img = img!(v);
        let (ino, etb) = frag_etb(&img);
        let o = img.block_off(etb) + 12;
        img.b[o] ^= 0x01; // ee_block of the first extent, checksum not updated
        let fs = img.fs();
        let mut b = [0u8; 16];
        checksum(fs.read(InodeNo(ino), 8192, &mut b), ino, Some(etb));
        // The tail itself.
        let mut img = img!(v);
        let max = img.u16_at(img.block_off(etb) + 4);
        let t = img.block_off(etb) + fext::tail_offset(max);
        img.b[t + 2] ^= 0x80;
        let fs = img.fs();
        checksum(fs.read(InodeNo(ino), 0, &mut b), ino, Some(etb));
    }
}

// ---------------------------------------------------------------------------------------------
// Directory blocks
// ---------------------------------------------------------------------------------------------

/// `/dir1`'s inode, its first block, and the offset of the entry `a` in it.
fn dir1(img: &Img) -> (u32, u64, usize) {
    let ino = img.ino("/dir1");
    let blk = img.pblk(ino, 0);
    (ino, blk, img.entry_off(blk, b"a"))
}

#[test]
fn dir_entry_structure() {
    // (field, bytes, expected words)
    let cases: &[(usize, &[u8], &str)] = &[
        (4, &[0, 0], "rec_len"),                 // rec_len 0
        (4, &[13, 0], "rec_len"),                // unaligned
        (4, &[8, 0], "rec_len"),                 // smaller than any entry
        (4, &[0xFC, 0x7F], "overrun"),           // past the block
        (6, &[255], "name_len"),                 // name longer than rec_len
        (0, &[0xFF, 0xFF, 0xFF, 0x7F], "inode"), // inode number out of range
    ];
    for v in [Variant::Csum4k, Variant::NoCsum4k, Variant::Ext2, Variant::Csum1k] {
        for &(field, bytes, words) in cases {
            let mut img = img!(v);
            let (ino, blk, e) = dir1(&img);
            img.b[e + field..e + field + bytes.len()].copy_from_slice(bytes);
            img.fix_dir_leaf(ino, blk);
            let fs = img.fs();
            let c = structural(names(&fs, ino), ino);
            block_is(&c, blk);
            message_has(&c, words);
            let c = structural(fs.lookup(InodeNo(ino), b"sub"), ino);
            block_is(&c, blk);
            assert_eq!(Error::Corrupt(c).errno(), EUCLEAN);
        }
    }
}

#[test]
fn dir_leaf_checksum() {
    for v in [Variant::Csum4k, Variant::Csum1k] {
        let mut img = img!(v);
        let (ino, blk, e) = dir1(&img);
        img.b[e + 8] ^= 0x20; // the name "a" -> "A", checksum not updated
        let fs = img.fs();
        checksum(names(&fs, ino), ino, Some(blk));
        checksum(fs.lookup(InodeNo(ino), b"a"), ino, Some(blk));
        // A leaf without a tail on a metadata_csum filesystem.
        let mut img = img!(v);
        let (ino, blk, _) = dir1(&img);
        let end = img.block_off(blk) + img.g.bs;
        img.b[end - 12..end].fill(0);
        let fs = img.fs();
        checksum(names(&fs, ino), ino, Some(blk));
    }
}

#[test]
fn dir_size_beyond_blocks_reads_holes() {
    // A directory whose size claims more blocks than are mapped: the missing ones are holes.
    let mut img = img!(Variant::Csum4k);
    let (ino, _, _) = dir1(&img);
    let bs = img.g.bs as u64;
    img.set_size(ino, bs * 4);
    let fs = img.fs();
    let n = names(&fs, ino).unwrap();
    assert!(n.contains(&b"a".to_vec()));
    assert!(matches!(fs.lookup(InodeNo(ino), b"zzz"), Err(Error::NotFound)));
}

/// A directory whose i_size is huge but whose blocks are mostly holes must not make readdir or
/// lookup step through 2^32 logical blocks one by one (the kernel skips holes by the mapped
/// length).
#[test]
fn dir_huge_size_terminates() {
    isolated("dir_huge_size_terminates", Duration::from_secs(15), || {
        for size in [1u64 << 44, u64::MAX] {
            let mut img = img!(Variant::Csum4k);
            let (ino, _, _) = dir1(&img);
            img.set_size(ino, size);
            let fs = img.fs();
            let t = Instant::now();
            let r = names(&fs, ino);
            eprintln!("size {size:#x}: readdir {:?} in {:?}", r.as_ref().map(|v| v.len()), t.elapsed());
            assert!(r.unwrap().contains(&b"a".to_vec()));
            let t = Instant::now();
            let r = fs.lookup(InodeNo(ino), b"no-such-name");
            eprintln!("size {size:#x}: lookup {:?} in {:?}", r.as_ref().map(|a| a.ino), t.elapsed());
            assert!(matches!(r, Err(Error::NotFound)));
            assert_eq!(fs.lookup(InodeNo(ino), b"a").unwrap().size, 2);
        }
    });
}

#[test]
fn dir_entry_to_bad_inodes() {
    let mut img = img!(Variant::Csum4k);
    let (ino, blk, e) = dir1(&img);
    img.put32(e, img.g.inodes_count + 1);
    img.fix_dir_leaf(ino, blk);
    let fs = img.fs();
    message_has(&structural(names(&fs, ino), ino), "inode");
    // The journal inode (8) is not a directory entry a user should reach, but it is valid to
    // stat; a name pointing at inode 1 (bad blocks inode, links 0) is a deleted inode.
    let mut img = img!(Variant::Csum4k);
    let (ino, blk, e) = dir1(&img);
    img.put32(e, 1);
    img.fix_dir_leaf(ino, blk);
    let fs = img.fs();
    let c = corrupt(fs.metadata("/dir1/a"));
    assert_eq!(c.inode(), Some(InodeNo(1)), "{c}");
}

/// A directory entry pointing at the directory itself or its parent: no infinite recursion in
/// path resolution (which is iterative) and the walk terminates.
#[test]
fn dir_entry_cycles() {
    let mut img = img!(Variant::Csum4k);
    let (ino, blk, e) = dir1(&img);
    img.put32(e, 2);
    img.b[e + 7] = 2; // file type: directory
    img.fix_dir_leaf(ino, blk);
    let fs = img.fs();
    assert_eq!(fs.resolve("/dir1/a/dir1/a/dir1/a/dir1", true).unwrap(), InodeNo(ino));
    walk(&fs);
}

// ---------------------------------------------------------------------------------------------
// htree (dx_root / dx_node)
// ---------------------------------------------------------------------------------------------

const BIG_NAME: &[u8] = b"entry_0123_padding_name";

/// Lookups of a few names in `/big` all still work.
#[track_caller]
fn big_lookups_work(fs: &Fs, big: u32) {
    for i in [0, 123, 250, 499] {
        let name = format!("entry_{i:04}_padding_name");
        let a = fs.lookup(InodeNo(big), name.as_bytes()).unwrap_or_else(|e| panic!("lookup {name}: {e}"));
        assert_eq!(a.size, format!("{i}\n").len() as u64);
    }
    assert!(matches!(fs.lookup(InodeNo(big), b"entry_9999_padding_name"), Err(Error::NotFound)));
    assert_eq!(names(fs, big).unwrap().len(), 502);
}

#[test]
fn dx_root_structural_corruption_falls_back_to_linear() {
    // (offset in the root block, bytes)
    let cases: &[(usize, &[u8])] = &[
        (0x22, &[0xFF, 0x7F]),       // count > limit
        (0x22, &[0, 0]),             // count 0
        (0x20, &[0xFF, 0x7F]),       // limit beyond the block
        (0x1C, &[9]),                // hash version unknown
        (0x1E, &[5]),                // indirect levels too deep
        (0x18, &[1, 0, 0, 0]),       // reserved_zero
        (0x1D, &[4]),                // info_length
        (0x24, &[0xFF, 0xFF, 0, 0]), // first leaf pointer past the directory
        (0x10, &[0x10, 0]),          // ".." rec_len: no longer a root
    ];
    for v in [Variant::Csum4k, Variant::NoCsum4k, Variant::Ext2, Variant::Csum1k] {
        for &(off, bytes) in cases {
            let mut img = img!(v);
            let big = img.ino("/big");
            let root = img.pblk(big, 0);
            let o = img.block_off(root) + off;
            img.b[o..o + bytes.len()].copy_from_slice(bytes);
            img.fix_dx(big, root);
            let fs = img.fs();
            let ctx = format!("{v:?} root+0x{off:x}={bytes:?}");
            if img.g.metadata_csum && !dx::verify_checksum(img.block(root), img.inode_seed(big)) {
                // No room for (or no way to compute) a checksum: like the kernel, a checksum
                // error, since the block cannot be verified.
                checksum(fs.lookup(InodeNo(big), BIG_NAME), big, Some(root));
                continue;
            }
            if off == 0x10 {
                // "." and ".." must still read; the rest of the root is not an entry area.
                let _ = names(&fs, big);
                for i in [0, 250] {
                    let n = format!("entry_{i:04}_padding_name");
                    fs.lookup(InodeNo(big), n.as_bytes()).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                }
                continue;
            }
            let r = catch_unwind(AssertUnwindSafe(|| big_lookups_work(&fs, big)));
            assert!(r.is_ok(), "{ctx}: {}", r.err().map(panic_message).unwrap_or_default());
        }
    }
}

/// A root claiming one level of interior nodes over what are leaves: the "nodes" are leaf
/// blocks with valid leaf checksums. The engine may fall back to a linear scan, or report the
/// structural problem (the kernel: "directory leaf block found instead of index block",
/// EFSCORRUPTED) naming the leaf; it must not call a good leaf a checksum failure.
#[test]
fn dx_root_levels_over_leaves() {
    for v in [Variant::Csum4k, Variant::NoCsum4k, Variant::Ext2, Variant::Csum1k] {
        let mut img = img!(v);
        let big = img.ino("/big");
        let root = img.pblk(big, 0);
        let o = img.block_off(root) + 0x1E;
        img.b[o] = 1;
        img.fix_dx(big, root);
        let fs = img.fs();
        for i in [0, 123, 250, 499] {
            let name = format!("entry_{i:04}_padding_name");
            match fs.lookup(InodeNo(big), name.as_bytes()) {
                Ok(a) => assert_eq!(a.size, format!("{i}\n").len() as u64, "{v:?}"),
                Err(e) => {
                    let c = structural(Err::<(), _>(e), big);
                    assert!(c.block().is_some_and(|b| b.0 != root), "{v:?}: {c}");
                }
            }
        }
        assert_eq!(names(&fs, big).unwrap().len(), 502, "{v:?}");
    }
}

#[test]
fn dx_root_wrong_leaf_pointer() {
    // Entries pointing at the wrong leaf: the kernel would not find the name (ENOENT); any
    // answer but a panic is acceptable, and other names keep working.
    let mut img = img!(Variant::Csum4k);
    let big = img.ino("/big");
    let root = img.pblk(big, 0);
    let count = img.u16_at(img.block_off(root) + 0x22) as usize;
    for i in 0..count {
        let o = img.block_off(root) + 0x20 + 8 * i + 4;
        img.put32(o, 1);
    }
    img.fix_dx(big, root);
    let fs = img.fs();
    for i in 0..500 {
        let n = format!("entry_{i:04}_padding_name");
        let _ = fs.lookup(InodeNo(big), n.as_bytes());
    }
    assert_eq!(names(&fs, big).unwrap().len(), 502);
    // Pointing at block 0 (the root itself).
    let mut img = img!(Variant::Csum4k);
    for i in 0..count {
        let o = img.block_off(root) + 0x20 + 8 * i + 4;
        img.put32(o, 0);
    }
    img.fix_dx(big, root);
    let fs = img.fs();
    let _ = fs.lookup(InodeNo(big), BIG_NAME);
}

#[test]
fn dx_root_checksum() {
    for v in [Variant::Csum4k, Variant::Csum1k] {
        let mut img = img!(v);
        let big = img.ino("/big");
        let root = img.pblk(big, 0);
        let o = img.block_off(root) + 0x28; // hash of entry 1, checksum not updated
        img.b[o] ^= 0x01;
        let fs = img.fs();
        checksum(fs.lookup(InodeNo(big), BIG_NAME), big, Some(root));
        checksum(names(&fs, big), big, Some(root));
    }
}

#[test]
fn dx_leaf_checksum_and_structure() {
    let mut img = img!(Variant::Csum4k);
    let big = img.ino("/big");
    let leaf = img.pblk(big, 1);
    let (e, name) = img.dir_entries(leaf)[0].clone();
    img.b[e + 8] ^= 0x01;
    let fs = img.fs();
    let c = checksum(names(&fs, big), big, Some(leaf));
    block_is(&c, leaf);
    let _ = fs.lookup(InodeNo(big), &name);
    // Structural corruption in a leaf (re-checksummed): reported by readdir and by lookups
    // that read it.
    let mut img = img!(Variant::Csum4k);
    img.put16(e + 4, 0);
    img.fix_dir_leaf(big, leaf);
    let fs = img.fs();
    let c = structural(names(&fs, big), big);
    block_is(&c, leaf);
    let mut n2 = name.clone();
    n2[0] ^= 0x20; // a different name; wherever it hashes, no panic
    let _ = fs.lookup(InodeNo(big), &n2);
}

/// The two-level tree of `/huge` (1 KiB blocks, with and without metadata_csum): interior node
/// corruption falls back to a linear scan; checksum errors are reported.
#[test]
fn dx_node_corruption() {
    for v in [Variant::Ext2, Variant::Csum1k] {
        let img0 = img!(v);
        let huge = img0.ino("/huge");
        let root = img0.pblk(huge, 0);
        let node_lblk = u64::from(img0.u32_at(img0.block_off(root) + 0x24));
        let node = img0.pblk(huge, node_lblk);
        assert!(dx::parse_node(img0.block(node)).is_ok());
        let probe = |fs: &Fs, ctx: &str| {
            for i in [0, 1500, 2999] {
                let n = huge_name(i);
                fs.lookup(InodeNo(huge), n.as_bytes())
                    .unwrap_or_else(|e| panic!("{v:?} {ctx}: lookup {n}: {e}"));
            }
        };
        // count > limit, count 0, limit beyond the block: linear scan (or a checksum error where
        // the checksum cannot be computed any more); fake dirent rec_len: see below.
        let cases: &[(usize, &[u8])] =
            &[(0x0A, &[0xFF, 0x7F]), (0x0A, &[0, 0]), (0x08, &[0xFF, 0x7F]), (0x04, &[0x10, 0])];
        for &(off, bytes) in cases {
            let mut img = Img::new(img0.f);
            let o = img.block_off(node) + off;
            img.b[o..o + bytes.len()].copy_from_slice(bytes);
            img.fix_dx(huge, node);
            let fs = img.fs();
            let ctx = format!("node+0x{off:x}={bytes:?}");
            if img.g.metadata_csum && !dx::verify_checksum(img.block(node), img.inode_seed(huge)) {
                // Names under this node: a checksum error; others may still be found.
                let r = fs.lookup(InodeNo(huge), huge_name(0).as_bytes());
                if r.is_err() {
                    checksum(r, huge, Some(node));
                }
                continue;
            }
            if off == 0x04 {
                // No longer shaped like a node: the kernel reports "directory leaf block found
                // instead of index block" (EFSCORRUPTED); falling back is fine too.
                for i in [0, 1500, 2999] {
                    if let Err(e) = fs.lookup(InodeNo(huge), huge_name(i).as_bytes()) {
                        block_is(&structural(Err::<(), _>(e), huge), node);
                    }
                }
                continue;
            }
            probe(&fs, &ctx);
        }
        // Checksum: reported for the names under that node, the others still found.
        if img0.g.metadata_csum {
            let mut img = Img::new(img0.f);
            let o = img.block_off(node) + 0x10;
            img.b[o] ^= 1;
            let fs = img.fs();
            let mut bad = 0;
            for i in 0..3000 {
                if let Err(e) = fs.lookup(InodeNo(huge), huge_name(i).as_bytes()) {
                    checksum(Err::<(), _>(e), huge, Some(node));
                    bad += 1;
                }
            }
            assert!(bad > 0 && bad < 3000, "{v:?}: {bad} of 3000 lookups failed");
        }
        // Node entries pointing at the root, at themselves and past the end: no loop, no panic.
        for target in [0u32, node_lblk as u32, 0xFFFF_FFF0] {
            let mut img = Img::new(img0.f);
            let count = img.u16_at(img.block_off(node) + 0x0A) as usize;
            for i in 0..count {
                let o = img.block_off(node) + 8 + 8 * i + 4;
                img.put32(o, target);
            }
            img.fix_dx(huge, node);
            let fs = img.fs();
            for i in [0, 1500, 2999] {
                let _ = fs.lookup(InodeNo(huge), huge_name(i).as_bytes());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Extended attributes
// ---------------------------------------------------------------------------------------------

fn xattr_block(img: &Img) -> (u32, u64) {
    let ino = img.ino("/small");
    (ino, img.inode(ino).file_acl())
}

#[test]
fn xattr_block_header() {
    for v in [Variant::Csum4k, Variant::NoCsum4k, Variant::Ext2] {
        for (field, val) in [(0usize, 0xEA01_0000u32), (8, 2), (8, 0)] {
            let mut img = img!(v);
            let (ino, blk) = xattr_block(&img);
            let o = img.block_off(blk) + field;
            img.put32(o, val);
            img.fix_xattr_block(blk);
            let fs = img.fs();
            let c = structural(fs.listxattr(InodeNo(ino)), ino);
            block_is(&c, blk);
            structural(fs.getxattr(InodeNo(ino), b"user.big"), ino);
            // The in-inode attribute is read first, but the whole set is checked.
            let _ = fs.getxattr(InodeNo(ino), b"user.tiny");
            // Data is unaffected.
            assert_eq!(fs.read_file("/small").unwrap(), b"small file\n");
        }
    }
}

#[test]
fn xattr_block_entries() {
    // (offset in the first entry, bytes, expected words)
    let cases: &[(usize, &[u8], &str)] = &[
        (2, &[0xF0, 0x0F], "value"),             // e_value_offs past the block
        (2, &[0x00, 0x00], "value"),             // value overlapping the entries
        (8, &[0xFF, 0xFF, 0xFF, 0x0F], "value"), // e_value_size huge
    ];
    for v in [Variant::Csum4k, Variant::NoCsum4k, Variant::Ext2] {
        for &(off, bytes, words) in cases {
            let mut img = img!(v);
            let (ino, blk) = xattr_block(&img);
            let e = img.block_off(blk) + fx::BLOCK_HEADER_SIZE + off;
            img.b[e..e + bytes.len()].copy_from_slice(bytes);
            img.fix_xattr_block(blk);
            let fs = img.fs();
            let c = structural(fs.listxattr(InodeNo(ino)), ino);
            block_is(&c, blk);
            message_has(&c, words);
            structural(fs.getxattr(InodeNo(ino), b"user.big"), ino);
        }
        // A name running over the next entry (still inside the area and before the values, as
        // the kernel checks): the set reads, with a garbage name.
        let mut img = img!(v);
        let (ino, blk) = xattr_block(&img);
        let e = img.block_off(blk) + fx::BLOCK_HEADER_SIZE;
        img.b[e] = 0xFF;
        img.fix_xattr_block(blk);
        let _ = img.fs().listxattr(InodeNo(ino));
        // No terminator: entries filling the block.
        let mut img = img!(v);
        let (ino, blk) = xattr_block(&img);
        let o = img.block_off(blk) + fx::BLOCK_HEADER_SIZE;
        let n = img.g.bs - fx::BLOCK_HEADER_SIZE;
        for i in (0..n).step_by(4) {
            img.b[o + i..o + i + 4].copy_from_slice(&[4, 1, 0, 0]);
        }
        img.fix_xattr_block(blk);
        let fs = img.fs();
        structural(fs.listxattr(InodeNo(ino)), ino);
    }
}

#[test]
fn xattr_block_checksum() {
    let mut img = img!(Variant::Csum4k);
    let (ino, blk) = xattr_block(&img);
    let o = img.block_off(blk) + img.g.bs - 1;
    img.b[o] ^= 1;
    let fs = img.fs();
    checksum(fs.listxattr(InodeNo(ino)), ino, Some(blk));
    checksum(fs.getxattr(InodeNo(ino), b"user.big"), ino, Some(blk));
}

#[test]
fn xattr_block_pointer_out_of_range() {
    for v in [Variant::Csum4k, Variant::Ext2] {
        let mut img = img!(v);
        let ino = img.ino("/small");
        img.inode32(ino, 0x68, 0xFFFF_FFF0);
        let fs = img.fs();
        let c = structural(fs.listxattr(InodeNo(ino)), ino);
        block_is(&c, 0xFFFF_FFF0);
        // Pointing at a block of another kind (the root directory's first block).
        let mut img = img!(v);
        let root_blk = img.pblk(2, 0);
        img.inode32(ino, 0x68, root_blk as u32);
        let fs = img.fs();
        let c = structural(fs.listxattr(InodeNo(ino)), ino);
        block_is(&c, root_blk);
        // ...and the directory still reads afterwards (the block is re-checked as a leaf).
        assert!(names(&fs, 2).is_ok());
    }
}

#[test]
fn xattr_in_inode_corrupt() {
    for v in [Variant::Csum4k, Variant::NoCsum4k] {
        let cases: &[(usize, &[u8], &str)] = &[
            (0, &[0xFF], "past the end"),      // e_name_len
            (2, &[0xF0, 0x00], "value"),       // value offset past the inode
            (8, &[0xFF, 0x00, 0, 0], "value"), // value size past the inode
        ];
        for &(off, bytes, words) in cases {
            let mut img = img!(v);
            let ino = img.ino("/small");
            let (e, _) = img.ibody_xattr(ino, fx::INDEX_USER, b"tiny");
            let field = e - img.inode_off(ino) + off;
            img.inode_put(ino, field, bytes);
            let fs = img.fs();
            let c = structural(fs.listxattr(InodeNo(ino)), ino);
            assert_eq!(c.block(), None, "{c}");
            message_has(&c, words);
        }
    }
}

#[test]
fn xattr_malformed_acl() {
    // Turn user.tiny into system.posix_acl_access (empty name, so the entry shrinks and a
    // terminator follows it) whose value "abc" is no ACL.
    let mut img = img!(Variant::Csum4k);
    let ino = img.ino("/small");
    let (e, _) = img.ibody_xattr(ino, fx::INDEX_USER, b"tiny");
    let field = e - img.inode_off(ino);
    img.inode_put(ino, field, &[0, fx::INDEX_POSIX_ACL_ACCESS]);
    img.inode_put(ino, field + 16, &[0, 0, 0, 0]);
    let fs = img.fs();
    let c = structural(fs.getxattr(InodeNo(ino), b"system.posix_acl_access"), ino);
    message_has(&c, "ACL");
}

#[test]
fn xattr_ea_inode_value_corrupt() {
    let img0 = img!(Variant::Inline);
    let ino = img0.ino("/medium");
    let (e, _) = img0.ibody_xattr(ino, fx::INDEX_USER, b"huge");
    let field = e - img0.inode_off(ino);
    let vino = u32::from_le_bytes(img0.inode_raw(ino)[field + 4..field + 8].try_into().unwrap());
    assert_ne!(vino, 0);
    // Value inode number out of range, pointing at a non-EA inode, size mismatch.
    for bad in [img0.g.inodes_count + 5, 2, img0.ino("/small")] {
        let mut img = Img::new(img0.f);
        img.inode_put(ino, field + 4, &bad.to_le_bytes());
        let fs = img.fs();
        let c = corrupt(fs.getxattr(InodeNo(ino), b"user.huge"));
        assert!(c.inode() == Some(InodeNo(ino)) || c.inode() == Some(InodeNo(bad)), "{c}");
    }
    let mut img = Img::new(img0.f);
    img.inode_put(ino, field + 8, &100_000u32.to_le_bytes());
    let fs = img.fs();
    structural(fs.getxattr(InodeNo(ino), b"user.huge"), ino);
    let mut img = Img::new(img0.f);
    img.inode_put(ino, field + 8, &4095u32.to_le_bytes());
    let fs = img.fs();
    structural(fs.getxattr(InodeNo(ino), b"user.huge"), ino);
    // The EA inode's own extent tree broken.
    let mut img = Img::new(img0.f);
    img.inode16(vino, 0x28, 0);
    let fs = img.fs();
    structural(fs.getxattr(InodeNo(ino), b"user.huge"), vino);
}

/// Attribute values that "live in" an EA inode which is the inode itself, or an inline EA inode
/// whose own `system.data` points back: typed errors or values, never unbounded recursion.
/// Runs in a child process because a stack overflow aborts.
#[test]
fn xattr_ea_inode_cycles() {
    isolated("xattr_ea_inode_cycles", Duration::from_secs(60), || {
        let img0 = img!(Variant::Inline);
        let small = img0.ino("/small");
        let (e, _) = img0.ibody_xattr(small, fx::INDEX_USER, b"tiny");
        let field = e - img0.inode_off(small);
        // The value inode is the inode itself.
        let mut img = Img::new(img0.f);
        img.inode_put(small, field + 4, &small.to_le_bytes());
        img.inode_put(small, field + 8, &11u32.to_le_bytes());
        structural(img.fs().getxattr(InodeNo(small), b"user.tiny"), small);
        // /small's value is in /dir1/sub/file, made an inline EA inode whose system.data value
        // is in turn "in" /small.
        let mut img = Img::new(img0.f);
        let file = img.ino("/dir1/sub/file");
        let fl = img.inode(file).flags();
        img.inode32(file, 0x20, fl | fi::EA_INODE_FL);
        let (e2, _) = img.ibody_xattr(file, fx::INDEX_SYSTEM, b"data");
        let f2 = e2 - img.inode_off(file);
        img.inode_put(file, f2 + 4, &small.to_le_bytes());
        img.inode_put(file, f2 + 8, &11u32.to_le_bytes());
        img.inode_put(small, field + 4, &file.to_le_bytes());
        img.inode_put(small, field + 8, &6u32.to_le_bytes());
        let fs = img.fs();
        eprintln!("getxattr: {:?}", fs.getxattr(InodeNo(small), b"user.tiny").map(|v| v.len()));
        let _ = fs.listxattr(InodeNo(small));
        let mut b = [0u8; 16];
        eprintln!("read: {:?}", fs.read(InodeNo(file), 0, &mut b));
        eprintln!("read: {:?}", fs.read(InodeNo(small), 0, &mut b));
        walk(&fs);
    });
}

// ---------------------------------------------------------------------------------------------
// Inline data
// ---------------------------------------------------------------------------------------------

/// An inline file whose i_size exceeds its inline bytes reads zeros past them, as in the
/// kernel (truncate can extend an inline file), bounded by the caller's buffer even for a huge
/// size.
#[test]
fn inline_file_size_beyond_data() {
    let mut img = img!(Variant::Inline);
    let ino = img.ino("/dir1/sub/file");
    img.set_size(ino, 61);
    let fs = img.fs();
    let mut b = [0xAAu8; 128];
    assert_eq!(fs.read(InodeNo(ino), 0, &mut b).unwrap(), 61);
    assert_eq!(&b[..6], b"hello\n");
    assert!(b[6..61].iter().all(|&x| x == 0));
    let mut img = img!(Variant::Inline);
    img.set_size(ino, u64::MAX);
    let fs = img.fs();
    assert_eq!(fs.read(InodeNo(ino), 0, &mut b).unwrap(), 128);
    assert_eq!(fs.read(InodeNo(ino), u64::MAX - 5, &mut b).unwrap(), 5);
    assert_eq!(fs.read(InodeNo(ino), 1 << 40, &mut b).unwrap(), 128);
    assert!(b.iter().all(|&x| x == 0));
    // /medium keeps 40 of its 100 bytes in system.data.
    let mut img = img!(Variant::Inline);
    let m = img.ino("/medium");
    img.set_size(m, 101);
    let fs = img.fs();
    assert_eq!(fs.read(InodeNo(m), 0, &mut b).unwrap(), 101);
    assert!(b[..100].iter().all(|&x| x == b'm') && b[100] == 0);
}

#[test]
fn inline_system_data_corrupt() {
    let img0 = img!(Variant::Inline);
    let m = img0.ino("/medium");
    let (e, _) = img0.ibody_xattr(m, fx::INDEX_SYSTEM, b"data");
    let field = e - img0.inode_off(m);
    for (off, bytes) in [(2usize, &[0xF0u8, 0x00][..]), (8, &[0xFF, 0, 0, 0][..]), (0, &[0xFF][..])] {
        let mut img = Img::new(img0.f);
        img.inode_put(m, field + off, bytes);
        let fs = img.fs();
        let mut b = [0u8; 128];
        structural(fs.read(InodeNo(m), 0, &mut b), m);
    }
    // system.data missing (renamed): the bytes past i_block read as zeros up to i_size, as in
    // the kernel.
    let mut img = Img::new(img0.f);
    img.inode_put(m, field + 16, b"date");
    let fs = img.fs();
    let mut b = [0u8; 128];
    assert_eq!(fs.read(InodeNo(m), 0, &mut b).unwrap(), 100);
    assert!(b[..60].iter().all(|&x| x == b'm') && b[60..100].iter().all(|&x| x == 0));
}

#[test]
fn inline_dir_corrupt() {
    let img0 = img!(Variant::Inline);
    let d = img0.ino("/dir1");
    let fs = img0.fs();
    assert!(names(&fs, d).unwrap().contains(&b"sub".to_vec()));
    // Bad parent.
    for parent in [0u32, img0.g.inodes_count + 1] {
        let mut img = Img::new(img0.f);
        img.inode32(d, 0x28, parent);
        let fs = img.fs();
        message_has(&structural(names(&fs, d), d), "parent");
        structural(fs.lookup(InodeNo(d), b"sub"), d);
    }
    // First entry's rec_len garbage / name_len too long.
    for (off, bytes) in [
        (4usize, &[0u8, 0][..]),
        (4, &[0xF0, 0x00][..]),
        (6, &[0xFF][..]),
        (0, &[0xFF, 0xFF, 0xFF, 0x7F][..]),
    ] {
        let mut img = Img::new(img0.f);
        img.inode_put(d, 0x28 + 4 + off, bytes);
        let fs = img.fs();
        let c = structural(names(&fs, d), d);
        assert_eq!(c.block(), None, "{c}");
        structural(fs.lookup(InodeNo(d), b"sub"), d);
    }
    // Size smaller than the parent pointer, larger than the inline area.
    for size in [0u64, 3, 61, 1 << 40] {
        let mut img = Img::new(img0.f);
        img.set_size(d, size);
        let fs = img.fs();
        structural(names(&fs, d), d);
    }
}

#[test]
fn inline_flag_without_feature() {
    let mut img = img!(Variant::Csum4k);
    let ino = img.ino("/small");
    let f = img.inode(ino).flags();
    img.inode32(ino, 0x20, f | fi::INLINE_DATA_FL);
    let d = img.ino("/dir1");
    let f = img.inode(d).flags();
    img.inode32(d, 0x20, f | fi::INLINE_DATA_FL);
    let fs = img.fs();
    let mut b = [0u8; 16];
    message_has(&structural(fs.read(InodeNo(ino), 0, &mut b), ino), "inline");
    structural(names(&fs, d), d);
    structural(fs.lookup(InodeNo(d), b"a"), d);
}

// ---------------------------------------------------------------------------------------------
// Symlinks
// ---------------------------------------------------------------------------------------------

#[test]
fn symlink_fast_corrupt() {
    for v in [Variant::Csum4k, Variant::Ext2, Variant::Inline] {
        let mut img = img!(v);
        let ino = img.ino("/fastlink");
        img.set_size(ino, 60);
        let fs = img.fs();
        message_has(&structural(fs.readlink(InodeNo(ino)), ino), "symlink");
        structural(fs.metadata("/fastlink"), ino);
        let mut img = img!(v);
        img.set_size(ino, 0);
        let fs = img.fs();
        structural(fs.readlink(InodeNo(ino)), ino);
        let mut img = img!(v);
        img.set_size(ino, u64::MAX);
        let fs = img.fs();
        structural(fs.readlink(InodeNo(ino)), ino);
    }
}

#[test]
fn symlink_slow_corrupt() {
    for v in [Variant::Csum4k, Variant::Ext2] {
        let img0 = img!(v);
        let ino = img0.ino("/slowlink");
        let bs = img0.g.bs as u64;
        for size in [bs, bs + 1, u64::MAX, 0] {
            let mut img = Img::new(img0.f);
            img.set_size(ino, size);
            let fs = img.fs();
            structural(fs.readlink(InodeNo(ino)), ino);
        }
        // Target block out of range.
        let mut img = Img::new(img0.f);
        if v == Variant::Ext2 {
            img.inode32(ino, 0x28, 0xFFFF_FF00);
        } else {
            img.inode32(ino, 0x28 + 12 + 8, 0xFFFF_FF00);
        }
        let fs = img.fs();
        let c = structural(fs.readlink(InodeNo(ino)), ino);
        block_is(&c, 0xFFFF_FF00);
        // A NUL inside the target.
        let mut img = Img::new(img0.f);
        let blk = img.pblk(ino, 0);
        let o = img.block_off(blk) + 3;
        img.b[o] = 0;
        let fs = img.fs();
        structural(fs.readlink(InodeNo(ino)), ino);
        // A hole instead of the target block.
        let mut img = Img::new(img0.f);
        if v == Variant::Ext2 {
            img.inode32(ino, 0x28, 0);
        } else {
            img.inode16(ino, 0x28 + 2, 0);
        }
        let fs = img.fs();
        structural(fs.readlink(InodeNo(ino)), ino);
    }
}

#[test]
fn symlink_loops_give_eloop() {
    let mut img = img!(Variant::Csum4k);
    let ino = img.ino("/fastlink");
    let target = b"/fastlink";
    img.inode_put(ino, 0x28, target);
    img.set_size(ino, target.len() as u64);
    let fs = img.fs();
    assert!(matches!(fs.metadata("/fastlink"), Err(Error::Loop)));
    assert!(matches!(fs.read_file("/fastlink"), Err(Error::Loop)));
    assert!(fs.symlink_metadata("/fastlink").is_ok());
    // A link to "." repeated: 40 links then ELOOP, no unbounded queue growth.
    let mut img = img!(Variant::Csum4k);
    let t = b"fastlink/fastlink/fastlink/fastlink/fastlink/fastl";
    img.inode_put(ino, 0x28, t);
    img.set_size(ino, t.len() as u64);
    let fs = img.fs();
    assert!(fs.metadata("/fastlink").is_err());
}

// ---------------------------------------------------------------------------------------------
// ext2 block maps
// ---------------------------------------------------------------------------------------------

#[test]
fn blockmap_pointers_out_of_range() {
    let img0 = img!(Variant::Ext2);
    let ino = img0.ino("/frag");
    let ind = u64::from(img0.inode(ino).i_block[fi::IND_BLOCK].get());
    let mut b = vec![0u8; 1024];
    // Direct pointer.
    let mut img = Img::new(img0.f);
    img.inode32(ino, 0x28, 0xFFFF_FFFF);
    let c = structural(img.fs().read(InodeNo(ino), 0, &mut b), ino);
    block_is(&c, 0xFFFF_FFFF);
    // Indirect block pointer.
    let mut img = Img::new(img0.f);
    img.inode32(ino, 0x28 + 4 * fi::IND_BLOCK, 0x00FF_FFFF);
    let c = structural(img.fs().read(InodeNo(ino), 16 * 1024, &mut b), ino);
    block_is(&c, 0x00FF_FFFF);
    // A pointer inside the indirect block.
    let mut img = Img::new(img0.f);
    let o = img.block_off(ind) + 4 * 4; // lblk 16
    img.put32(o, 0x7FFF_FFFF);
    let c = structural(img.fs().read(InodeNo(ino), 16 * 1024, &mut b), ino);
    block_is(&c, 0x7FFF_FFFF);
    // Double and triple indirect roots out of range.
    for slot in [fi::DIND_BLOCK, fi::TIND_BLOCK] {
        let mut img = Img::new(img0.f);
        img.inode32(ino, 0x28 + 4 * slot, 0x7FFF_FFFF);
        img.set_size(ino, 1 << 40);
        let fs = img.fs();
        let off = if slot == fi::DIND_BLOCK { (12 + 256) * 1024 } else { (12 + 256 + 65536) * 1024 };
        let c = structural(fs.read(InodeNo(ino), off, &mut b), ino);
        block_is(&c, 0x7FFF_FFFF);
    }
    // An indirect block pointing at itself, at the superblock, at the inode table: bytes, not
    // a loop.
    for target in [ind, 1, 5] {
        let mut img = Img::new(img0.f);
        img.inode32(ino, 0x28 + 4 * fi::DIND_BLOCK, target as u32);
        img.set_size(ino, 1 << 30);
        let fs = img.fs();
        let _ = fs.read(InodeNo(ino), (12 + 256) * 1024, &mut b);
        walk(&fs);
    }
}

/// Consecutive direct pointers are read as one run; the run must stop at the end of the
/// filesystem: a pointer just past the end is corruption, not an I/O error or a read of bytes
/// beyond the filesystem.
#[test]
fn blockmap_run_past_end_of_fs() {
    let mut img = img!(Variant::Ext2);
    let ino = img.ino("/frag");
    let last = img.g.blocks_count - 1;
    img.inode32(ino, 0x28, last as u32);
    img.inode32(ino, 0x28 + 4, (last + 1) as u32);
    let fs = img.fs();
    let mut b = vec![0u8; 2048];
    let r = fs.read(InodeNo(ino), 0, &mut b);
    let c = structural(r, ino);
    block_is(&c, last + 1);
}

// ---------------------------------------------------------------------------------------------
// Format-level parsers given short or hostile buffers
// ---------------------------------------------------------------------------------------------

/// `verify_inode_checksum` is documented for records of at least 128 bytes; any such record
/// must be accepted without panicking (the engine only passes power-of-two sizes, but the
/// format crate is public).
#[test]
fn format_inode_checksum_odd_record_sizes() {
    for len in [128usize, 129, 130, 131, 132, 133, 160, 255, 256] {
        let mut rec = vec![0xA5u8; len];
        if len > 0x81 {
            rec[0x80] = 0x20;
            rec[0x81] = 0;
        }
        let r = catch_unwind(|| fi::verify_inode_checksum(&rec, 1));
        assert!(r.is_ok(), "verify_inode_checksum panicked on a {len}-byte record");
    }
}

/// Found by the `dx_block` fuzz target: `dx::parse_root` on a buffer shorter than 24 bytes
/// whose "." and ".." headers look like a root (`rec_len` 12 and `len - 12`) slices
/// `block[ROOT_INFO_OFFSET..]` out of bounds instead of returning an error.
#[test]
fn format_dx_parse_root_short_block() {
    for len in 20..24usize {
        let mut b = vec![0u8; len];
        b[4..6].copy_from_slice(&12u16.to_le_bytes());
        b[16..18].copy_from_slice(&((len - 12) as u16).to_le_bytes());
        let r = catch_unwind(|| dx::parse_root(&b).map(|_| ()));
        assert!(r.is_ok(), "dx::parse_root panicked on a {len}-byte block");
    }
}

/// Every public parser of rext4-format given every short length and a few fill patterns:
/// errors or values, never a panic (a deterministic floor under the fuzz targets).
#[test]
fn format_parsers_short_buffers() {
    use rext4::format::jbd2::{self, CsumVersion, JournalParams};
    let mut failures = Vec::new();
    for len in 0..=80usize {
        for fill in [0x00u8, 0xFF, 0x0C, 0x01] {
            let b = vec![fill; len];
            let r = catch_unwind(|| {
                let _ = Superblock::parse(&b);
                let _ = GroupDesc::parse(&b, 32);
                let _ = GroupDesc::parse(&b, 64);
                let _ = fi::Inode::parse(&b);
                let _ = Node::parse(&b).map(|n| n.search(5));
                let _ = fext::verify_block_checksum(&b, 1);
                let _ = dirent::DirBlockIter::new(&b, 1024).count();
                let _ = dirent::tail(&b);
                let _ = dirent::verify_leaf_checksum(&b, 1);
                let _ = dx::parse_node(&b).map(|e| e.find(7));
                let _ = dx::count_offset(&b);
                let _ = dx::verify_checksum(&b, 1);
                let _ = fx::XattrIter::new(&b).count();
                let _ = fx::verify_block_checksum(&b, 1, 1);
                let _ = fx::acl_disk_to_xattr(&b);
                let _ = fx::acl_xattr_to_disk(&b);
                let _ = fx::split_name(&b);
                let _ = jbd2::JournalSuperblock::parse(&b).map(|j| j.params());
                let _ = jbd2::Header::parse(&b);
                for csum in [CsumVersion::None, CsumVersion::V2, CsumVersion::V3] {
                    let p = JournalParams { block_size: len, is_64bit: true, csum, csum_seed: 1 };
                    let _ = jbd2::DescriptorTags::parse(&b, &p).map(|d| d.count());
                    let _ = jbd2::CommitBlock::parse(&b, &p).map(|c| c.verify_checksum());
                    let _ = jbd2::RevokeBlock::parse(&b, &p).map(|r| r.blocks().count());
                    let _ = jbd2::verify_tail(&b, &p);
                }
            });
            if r.is_err() {
                failures.push(format!("len {len} fill {fill:#x}"));
            }
        }
    }
    // parse_root is covered by format_dx_parse_root_short_block (a known panic).
    assert!(failures.is_empty(), "parsers panicked on: {}", failures.join(", "));
}

// ---------------------------------------------------------------------------------------------
// Random corruption
// ---------------------------------------------------------------------------------------------

/// splitmix64: small, seedable, good enough to choose bytes.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[derive(Clone, Copy, Debug)]
enum BlockKind {
    Extent,
    DirLeaf,
    Dx,
    Xattr,
    /// Indirect blocks and slow symlink targets: no checksum.
    Plain,
}

/// The metadata of a fixture, found by parsing it (not through rext4): which block is what and
/// belongs to which inode, so random damage lands on metadata and can be re-checksummed.
struct MetaMap {
    owners: HashMap<u64, (u32, BlockKind)>,
    /// Every metadata block: superblock, descriptors, bitmaps, used inode-table blocks, and the
    /// owned blocks above.
    blocks: Vec<u64>,
    /// Inode-table blocks holding the inodes walked (all in group 0's table).
    itable: BTreeSet<u64>,
    /// Group 0's inode table.
    table: u64,
}

impl MetaMap {
    fn new(img: &Img) -> MetaMap {
        let mut owners = HashMap::new();
        let mut itable = BTreeSet::new();
        let mut stack: Vec<u32> = (1..=11).collect();
        stack.push(2);
        let mut seen = HashSet::new();
        while let Some(ino) = stack.pop() {
            if !seen.insert(ino) || ino == 0 || ino > img.g.inodes_count {
                continue;
            }
            itable.insert((img.inode_off(ino) / img.g.bs) as u64);
            let d = img.inode(ino);
            if d.links_count() == 0 && ino != 2 {
                continue;
            }
            if d.file_acl() != 0 {
                owners.insert(d.file_acl(), (ino, BlockKind::Xattr));
            }
            let inline = d.flags() & fi::INLINE_DATA_FL != 0;
            let fast_link = d.file_type() == fi::S_IFLNK && d.size() < 60;
            if inline || fast_link || d.file_type() == 0 {
                continue;
            }
            let is_dir = d.file_type() == fi::S_IFDIR;
            let is_link = d.file_type() == fi::S_IFLNK;
            // Regular files' data is not metadata (and the journal is big): only their maps.
            let (data, meta) = img.mapping(ino);
            let kind = if d.flags() & fi::EXTENTS_FL != 0 { BlockKind::Extent } else { BlockKind::Plain };
            for m in meta {
                owners.insert(m, (ino, kind));
            }
            if is_link {
                for (_, p) in &data {
                    owners.insert(*p, (ino, BlockKind::Plain));
                }
            }
            if is_dir {
                let dx_dir = d.flags() & fi::INDEX_FL != 0;
                for (l, p) in data {
                    let node = dx_dir && (l == 0 || dx::parse_node(img.block(p)).is_ok());
                    owners.insert(p, (ino, if node { BlockKind::Dx } else { BlockKind::DirLeaf }));
                    if !node {
                        for (_, name, child) in img.dir_entries_full(p) {
                            if child != 0 && name != b"." && name != b".." {
                                stack.push(child);
                            }
                        }
                    }
                }
            }
        }
        let mut blocks: BTreeSet<u64> = owners.keys().copied().collect();
        blocks.extend(itable.iter().copied());
        blocks.insert(img.g.first_data_block); // superblock (block 0 on 4 KiB, 1 on 1 KiB)
        blocks.insert(img.g.first_data_block + 1); // descriptors
        let gd = img.gd(0);
        blocks.insert(gd.block_bitmap(img.g.desc_size));
        blocks.insert(gd.inode_bitmap(img.g.desc_size));
        let table = gd.inode_table(img.g.desc_size);
        assert!(
            itable.iter().all(|&t| t >= table && t < table + u64::from(img.g.ipg)),
            "inodes outside group 0"
        );
        MetaMap { owners, blocks: blocks.into_iter().collect(), itable, table }
    }

    /// Recomputes every checksum a patch may have broken: the superblock, the descriptors,
    /// inodes in touched inode-table blocks, and touched extent, directory, dx and xattr blocks.
    fn refresh(&self, img: &mut Img, touched: &BTreeSet<u64>) {
        let groups = img.g.inodes_count / img.g.ipg;
        if img.g.metadata_csum || img.g.gdt_csum {
            for g in 0..groups {
                img.fix_gd(g);
            }
        }
        if !img.g.metadata_csum {
            return;
        }
        img.fix_sb();
        let per_block = (img.g.bs / img.g.inode_size) as u32;
        for &t in touched.iter().filter(|t| self.itable.contains(t)) {
            for k in 0..per_block {
                let ino = ((t - self.table) as u32) * per_block + k + 1;
                img.fix_inode(ino);
            }
        }
        for t in touched {
            match self.owners.get(t) {
                Some(&(ino, BlockKind::Extent)) => img.fix_extent_block(ino, *t),
                Some(&(ino, BlockKind::DirLeaf)) => img.fix_dir_leaf(ino, *t),
                Some(&(ino, BlockKind::Dx)) => img.fix_dx(ino, *t),
                Some(&(_, BlockKind::Xattr)) => img.fix_xattr_block(*t),
                _ => {}
            }
        }
    }
}

/// Random byte flips in the metadata of every fixture, then a full walk: no panic, no hang,
/// no crash. Half the cases re-checksum what they touched so the damage reaches structural
/// checks on metadata_csum images. `REXT4_CORRUPTION_ITERS` sets the cases per variant.
#[test]
fn random_metadata_corruption() {
    run_cases("random_metadata_corruption", Duration::from_secs(10), || {
        let iters = env_usize("REXT4_CORRUPTION_ITERS", 120) as u64;
        let mut cases = Vec::new();
        for v in ALL_VARIANTS {
            let Some(f) = fixture(v) else { return cases };
            let img0 = Img::new(f);
            let meta = MetaMap::new(&img0);
            for seed in 0..iters {
                let mut rng = Rng(seed ^ ((v as u64) << 32));
                let mut img = Img::new(f);
                let n = 1 + rng.below(8);
                let mut touched = BTreeSet::new();
                let mut flips = Vec::new();
                for _ in 0..n {
                    let blk = meta.blocks[rng.below(meta.blocks.len())];
                    // Half the flips land in the first 64 bytes, where headers live.
                    let within = if rng.below(2) == 0 { rng.below(64) } else { rng.below(img.g.bs) };
                    let off = img.block_off(blk) + within;
                    let x = (rng.below(255) + 1) as u8;
                    img.b[off] ^= x;
                    touched.insert(blk);
                    flips.push((off, x));
                }
                let refreshed = seed % 2 == 1;
                if refreshed {
                    meta.refresh(&mut img, &touched);
                }
                let patches = diff(&img0.b, &img.b);
                let desc = format!(
                    "seed {seed}{} flips (offset, xor) {flips:?}",
                    if refreshed { " re-checksummed" } else { "" }
                );
                cases.push(Case { desc, variant: v, patches, full: true });
            }
        }
        cases
    });
}

/// The byte ranges where `b` differs from `a`, as patches.
fn diff(a: &[u8], b: &[u8]) -> Vec<(usize, Vec<u8>)> {
    let mut out: Vec<(usize, Vec<u8>)> = Vec::new();
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        if x != y {
            match out.last_mut() {
                Some((o, v)) if *o + v.len() == i => v.push(*y),
                _ => out.push((i, vec![*y])),
            }
        }
    }
    out
}

/// The metadata map covers what the tests mean it to (guards the random test's aim).
#[test]
fn random_test_targets_metadata() {
    for v in ALL_VARIANTS {
        let img = img!(v);
        let m = MetaMap::new(&img);
        let kinds = |k: fn(&BlockKind) -> bool| m.owners.values().filter(|(_, kind)| k(kind)).count();
        assert!(kinds(|k| matches!(k, BlockKind::DirLeaf)) > 5, "{v:?}");
        assert!(kinds(|k| matches!(k, BlockKind::Xattr)) >= 1, "{v:?}");
        if !matches!(v, Variant::Inline) {
            assert!(kinds(|k| matches!(k, BlockKind::Dx)) >= 1, "{v:?}");
        }
        if v != Variant::Ext2 {
            assert!(kinds(|k| matches!(k, BlockKind::Extent)) >= 1, "{v:?}");
        }
        assert!(m.itable.len() >= 2, "{v:?}");
    }
}
