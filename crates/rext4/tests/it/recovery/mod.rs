//! Journal recovery, judged by tools nobody here wrote:
//! - journals written by debugfs (`jo`/`jw`/`jc`, checksum v3, v2, v1 and none, 32- and 64-bit,
//!   1 KiB and 4 KiB blocks) whose transactions carry the blocks another debugfs session changed
//!   on a copy of the image: rext4's replay (in memory at open, and onto the image with
//!   `recover_image`) must give exactly that copy, and e2fsck's replay the same blocks;
//! - journals the kernel wrote: an image copied while mounted, after fsyncs, must show what
//!   the kernel showed before the copy, and recover to what the kernel and e2fsck recover;
//! - torn, corrupt and hostile journals: what the kernel skips is skipped, what it refuses is
//!   refused with a typed error, and nothing panics or hangs.
//!
//! `debugfs_journals.rs`, `kernel_journals.rs`, and `torn.rs` / `hostile.rs` for the last.

mod debugfs_journals;
mod fast_commits;
mod hostile;
mod kernel_journals;
mod torn;

use rext4::dev::MemDevice;
use rext4::{Error, Fs, Options, RecoveryReport};
use rext4_testkit::{
    assert_no_diff, diff_full, kernel_can_mount, require_kernel, tool, walk_kernel, walk_rext4, Image,
    KernelMount,
};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn scratch() -> tempfile::TempDir {
    if Path::new("/dev/shm").is_dir() {
        if let Ok(d) = tempfile::tempdir_in("/dev/shm") {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

fn output(cmd: &mut Command) -> (i32, String) {
    let o = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    (o.status.code().unwrap_or(-1), text)
}

/// Runs debugfs commands (one per line) on `img`.
fn debugfs(img: &Path, cmds: &str, write: bool) -> String {
    let file = img.with_extension("cmds");
    fs::write(&file, cmds).unwrap();
    let mut c = Command::new(tool("debugfs"));
    if write {
        c.arg("-w");
    }
    let (code, text) = output(c.arg("-f").arg(&file).arg(img));
    assert_eq!(code, 0, "debugfs failed:\n{text}");
    text
}

fn e2fsck(img: &Path, opt: &str) -> (i32, String) {
    output(Command::new(tool("e2fsck")).arg(opt).arg(img))
}

/// What `e2fsck -fn` would fix, other than the superblock's free counts (which the kernel
/// updates only at unmount, and e2fsck does not count as errors).
fn fsck_problems(img: &Path) -> Vec<String> {
    let (_, text) = e2fsck(img, "-fn");
    let lines: Vec<&str> = text.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[1].ends_with("? no"))
        .map(|w| w[0].trim().to_string())
        .filter(|p| {
            !p.starts_with("Free blocks count wrong (") && !p.starts_with("Free inodes count wrong (")
        })
        .collect()
}

#[track_caller]
fn assert_fsck_clean(img: &Path, what: &str) {
    let (code, text) = e2fsck(img, "-fn");
    assert_eq!(code, 0, "{what}: e2fsck -fn is not clean:\n{text}");
}

/// e2fsck's journal replay and nothing else.
fn e2fsck_replay(img: &Path) -> String {
    let (code, text) = output(Command::new(tool("e2fsck")).args(["-y", "-E", "journal_only"]).arg(img));
    assert!(code == 0 || code == 1, "e2fsck -E journal_only {} exited {code}:\n{text}", img.display());
    text
}

/// Blocks that differ between two images of the same size, other than the primary
/// superblock's and the journal superblock's (whose bookkeeping fields differ by tool).
fn differing_blocks(a: &Path, b: &Path, bs: usize) -> Vec<u64> {
    let skip = [1024 / bs as u64, journal_blocks(a, &[0])[0]];
    let (a, b) = (fs::read(a).unwrap(), fs::read(b).unwrap());
    assert_eq!(a.len(), b.len());
    (0..(a.len() / bs) as u64)
        .filter(|n| !skip.contains(n))
        .filter(|&n| a[n as usize * bs..(n as usize + 1) * bs] != b[n as usize * bs..(n as usize + 1) * bs])
        .collect()
}

/// Whether the kernel will mount (and so recover) `img`; `None` if mounting is impossible here.
fn kernel_accepts(img: &Path) -> Option<bool> {
    require_kernel!(None);
    // Read-write: a read-only loop device cannot be recovered onto.
    Some(KernelMount::rw(img).is_ok())
}

fn read_block(img: &Path, n: u64, bs: usize) -> Vec<u8> {
    let mut b = vec![0u8; bs];
    fs::File::open(img).unwrap().read_exact_at(&mut b, n * bs as u64).unwrap();
    b
}

fn write_at(img: &Path, off: u64, bytes: &[u8]) {
    fs::OpenOptions::new().write(true).open(img).unwrap().write_all_at(bytes, off).unwrap();
}

fn copy(from: &Path, to: &Path) -> PathBuf {
    fs::copy(from, to).unwrap();
    to.to_path_buf()
}

/// Physical blocks of journal blocks `ns` (`bmap <8> n`).
fn journal_blocks(img: &Path, ns: &[u32]) -> Vec<u64> {
    let cmds: String = ns.iter().map(|n| format!("bmap <8> {n}\n")).collect();
    let out = debugfs(img, &cmds, false);
    let map: Vec<u64> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert_eq!(map.len(), ns.len(), "{out}");
    map
}

/// `logdump`: (journal block, sequence, block type) of every block of the log.
fn logdump(img: &Path) -> Vec<(u32, u32, u32)> {
    let out = debugfs(img, "logdump\n", false);
    let mut v = Vec::new();
    for line in out.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if let ["Found", "expected", "sequence", seq, "type", t, .., "at", "block", blk] = w[..] {
            v.push((
                blk.trim_end_matches(':').parse().unwrap(),
                seq.trim_end_matches(',').parse().unwrap(),
                t.parse().unwrap(),
            ));
        }
    }
    v
}

/// The journal superblock's (s_start, s_sequence).
fn journal_state(img: &Path, bs: usize) -> (u32, u32) {
    let b = read_block(img, journal_blocks(img, &[0])[0], bs);
    let be = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    (be(0x1C), be(0x18))
}

fn fs_incompat(img: &Path) -> u32 {
    let b = read_block(img, 0, 4096);
    u32::from_le_bytes([b[1024 + 0x60], b[1024 + 0x61], b[1024 + 0x62], b[1024 + 0x63]])
}

const RECOVER: u32 = 0x4;

fn open_err(img: &Path) -> Error {
    match Fs::open(img) {
        Ok(_) => panic!("{}: opened, expected a refusal", img.display()),
        Err(e) => e,
    }
}

// The debugfs-written journals the replay tests (and the torn and hostile ones) start from.

struct Case {
    name: &'static str,
    mkfs: &'static [&'static str],
    jo: &'static str,
    bs: usize,
    /// Whether the transactions carry revoke records. debugfs's checksum v1 covers revoke
    /// blocks, which the kernel's does not, so e2fsck and rext4 both find such transactions
    /// corrupt (see `v1_checksum_leaves_out_revoke_blocks`).
    revokes: bool,
}

const CASES: &[Case] = &[
    Case { name: "v3-64bit-4k", mkfs: &[], jo: "jo -c", bs: 4096, revokes: true },
    Case { name: "v3-64bit-1k", mkfs: &[], jo: "jo -c", bs: 1024, revokes: true },
    Case { name: "v2-64bit-2k", mkfs: &[], jo: "jo -c -v 2", bs: 2048, revokes: true },
    Case { name: "v2-32bit-4k", mkfs: &["-O", "^64bit"], jo: "jo -c -v 2", bs: 4096, revokes: true },
    Case { name: "v3-32bit-1k", mkfs: &["-O", "^64bit"], jo: "jo -c", bs: 1024, revokes: true },
    Case {
        name: "nocsum-32bit-4k",
        mkfs: &["-O", "^metadata_csum,^64bit"],
        jo: "jo",
        bs: 4096,
        revokes: true,
    },
    Case {
        name: "v1-32bit-4k",
        mkfs: &["-O", "^metadata_csum,^64bit"],
        jo: "jo -c",
        bs: 4096,
        revokes: false,
    },
    Case {
        name: "nocsum-ext3-1k",
        mkfs: &["-t", "ext3", "-O", "^metadata_csum"],
        jo: "jo",
        bs: 1024,
        revokes: true,
    },
];

/// An image whose journal holds three committed transactions that, replayed, turn it into
/// `target` (another debugfs session's work on a copy), with junk copies that revoke records
/// must suppress.
struct Fixture {
    dir: tempfile::TempDir,
    bs: usize,
    /// The image with the journal (never modified by the checks; they work on copies).
    img: PathBuf,
    /// The image as it was before the journal was written.
    before: PathBuf,
    /// What replay must produce.
    target: PathBuf,
    /// Every block the replay must change, with its new contents.
    changed: BTreeMap<u64, Vec<u8>>,
    /// Blocks logged with junk and revoked: they must keep their old contents.
    revoked: Vec<u64>,
    /// Committed transactions in the log.
    transactions: u32,
    /// Split of `changed` between the first two transactions.
    first_half: Vec<u64>,
    second_half: Vec<u64>,
}

fn source_tree(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    for d in ["keep", "dir1/sub", "gone-dir"] {
        fs::create_dir_all(src.join(d)).unwrap();
    }
    fs::write(src.join("keep/f"), b"the file whose mode changes\n").unwrap();
    fs::write(src.join("keep/g"), vec![7u8; 10000]).unwrap();
    fs::write(src.join("gone"), b"unlinked by the journal\n").unwrap();
    for i in 0..40 {
        fs::write(src.join(format!("dir1/sub/file{i:02}")), format!("{i}\n").repeat(i + 1)).unwrap();
    }
    fs::set_permissions(src.join("keep/f"), fs::Permissions::from_mode(0o644)).unwrap();
    src
}

fn fixture(case: &Case) -> Fixture {
    let dir = scratch();
    let src = source_tree(dir.path());
    let img = dir.path().join("img");
    Image::ext4("32M").block_size(case.bs).args(case.mkfs).from_dir(&src).build(&img);
    let before = copy(&img, &dir.path().join("before"));

    // The target: metadata changes made by debugfs on a copy.
    let target = copy(&img, &dir.path().join("target"));
    let newfile = dir.path().join("newfile");
    fs::write(&newfile, vec![0x5Au8; 5000]).unwrap();
    debugfs(
        &target,
        &format!(
            "sif /keep/f mode 0100600\nsif /keep uid 1234\nmkdir /newdir\nwrite {} /newdir/new\n\
             symlink /newdir/link /keep/f\nrm /gone\nrmdir /gone-dir\nea_set /keep/g user.color blue\n",
            newfile.display()
        ),
        true,
    );

    // Block-level difference before -> target.
    let bs = case.bs;
    // debugfs cannot log block 0 (`jw` mistakes it for the end of its list), so with blocks
    // above 1 KiB the superblock's block gets its new contents directly, as the kernel often
    // writes the superblock.
    if bs > 1024 {
        write_at(&img, 0, &read_block(&target, 0, bs));
    }
    let (a, b) = (fs::read(&img).unwrap(), fs::read(&target).unwrap());
    let changed: BTreeMap<u64, Vec<u8>> = a
        .chunks_exact(bs)
        .zip(b.chunks_exact(bs))
        .enumerate()
        .filter(|(_, (x, y))| x != y)
        .map(|(i, (_, y))| (i as u64, y.to_vec()))
        .collect();
    assert!(changed.len() >= 6, "{}: only {} blocks changed", case.name, changed.len());
    let total = a.len() / bs;
    // Free blocks near the end for junk (zero in both images, not changed).
    let free: Vec<u64> = (total as u64 - 200..total as u64 - 100)
        .filter(|n| {
            !changed.contains_key(n) && a[*n as usize * bs..(*n as usize + 1) * bs].iter().all(|&x| x == 0)
        })
        .take(2)
        .collect();
    let (x, z) = (free[0], free[1]);
    let keys: Vec<u64> = changed.keys().copied().collect();
    let (first_half, second_half) = keys.split_at(keys.len() / 2);
    let (y, w) = (second_half[0], second_half[1]);

    // T1: the first half, junk for y (rewritten by T2) and x (revoked by T2); revokes w (which
    // T2 then logs: a revoke does not cover later transactions).
    // T2: the second half; revokes x.  T3: junk for z, revoked in the same transaction.
    let junk = vec![0xEEu8; bs];
    // Without revoke records: T1 logs junk for y only, and there is no T3.
    let mut t1_blocks: Vec<u64> = first_half.to_vec();
    t1_blocks.push(y);
    let mut t1 = Vec::new();
    for b in first_half {
        t1.extend_from_slice(&changed[b]);
    }
    t1.extend_from_slice(&junk);
    if case.revokes {
        t1_blocks.push(x);
        t1.extend_from_slice(&junk);
    }
    let t2: Vec<u8> = second_half.iter().flat_map(|b| changed[b].clone()).collect();
    let files = [("t1", t1), ("t2", t2), ("t3", junk.clone())];
    for (n, data) in &files {
        fs::write(dir.path().join(n), data).unwrap();
    }
    let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    // One debugfs session per transaction: within one session, `jw` after a transaction with
    // revoke records overwrites that transaction's commit block (e2fsprogs 1.47.0).
    let rev = |b: u64| if case.revokes { format!("-r {b}") } else { String::new() };
    let mut jw = vec![
        format!("jw -b {} {} {}", list(&t1_blocks), rev(w), dir.path().join("t1").display()),
        format!("jw -b {} {} {}", list(second_half), rev(x), dir.path().join("t2").display()),
    ];
    if case.revokes {
        jw.push(format!("jw -b {z} -r {z} {}", dir.path().join("t3").display()));
    }
    let mut out = String::new();
    for (i, cmd) in jw.iter().enumerate() {
        let jo = if i == 0 { case.jo } else { "jo" };
        out += &debugfs(&img, &format!("{jo}\n{cmd}\njc\n"), true);
    }
    assert!(fs_incompat(&img) & RECOVER != 0, "{}: debugfs did not set needs_recovery:\n{out}", case.name);
    let commits = logdump(&img).iter().filter(|&&(_, _, t)| t == 2).count();
    assert_eq!(commits, jw.len(), "{}: {out}\n{}", case.name, debugfs(&img, "logdump\n", false));
    Fixture {
        bs,
        img,
        before,
        target,
        changed,
        revoked: if case.revokes { vec![x, z] } else { Vec::new() },
        transactions: jw.len() as u32,
        first_half: first_half.to_vec(),
        second_half: second_half.to_vec(),
        dir,
    }
}

impl Fixture {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Checks the blocks replay touches in `img`: changed ones hold the target's contents
    /// (only those of `replayed` when given), revoked ones their old contents.
    #[track_caller]
    fn assert_replayed(&self, img: &Path, replayed: Option<&[u64]>, what: &str) {
        for (&b, new) in &self.changed {
            let now = read_block(img, b, self.bs);
            let want = if replayed.is_none_or(|r| r.contains(&b)) {
                new.clone()
            } else {
                read_block(&self.before, b, self.bs)
            };
            assert!(now == want, "{what}: block {b} does not hold what replay should give");
        }
        for &b in &self.revoked {
            assert!(
                read_block(img, b, self.bs).iter().all(|&x| x == 0),
                "{what}: revoked block {b} was replayed"
            );
        }
    }
}
