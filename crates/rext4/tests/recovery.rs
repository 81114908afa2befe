//! Journal recovery, judged by tools nobody here wrote:
//! - journals written by debugfs (`jo`/`jw`/`jc`, checksum v3, v2, v1 and none, 32- and 64-bit,
//!   1 KiB and 4 KiB blocks) whose transactions carry the blocks another debugfs session changed
//!   on a copy of the image: rext4's replay (in memory at open, and onto the image with
//!   `recover_image`) must give exactly that copy, and e2fsck's replay the same blocks;
//! - journals the kernel wrote: an image copied while mounted, after fsyncs, must show what
//!   the kernel showed before the copy, and recover to what the kernel and e2fsck recover;
//! - torn, corrupt and hostile journals: what the kernel skips is skipped, what it refuses is
//!   refused with a typed error, and nothing panics or hangs.

mod common;

use common::{diff_full, tool, walk_kernel, walk_rext4, KernelMount};
use rext4::dev::MemDevice;
use rext4::{Error, Fs, Options, RecoveryReport};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

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
    if !common::kernel_can_mount() {
        return None;
    }
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

// ------------------------------------------------------------------------------------------
// debugfs-written journals
// ------------------------------------------------------------------------------------------

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
    let mut c = Command::new(tool("mkfs.ext4"));
    c.args(["-q", "-F", "-b", &case.bs.to_string()]).args(case.mkfs).arg("-d").arg(&src).arg(&img).arg("32M");
    let (code, text) = output(&mut c);
    assert_eq!(code, 0, "{}: mkfs: {text}", case.name);
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

#[test]
fn debugfs_journals_replay_like_e2fsck() {
    for case in CASES {
        let f = fixture(case);
        let name = case.name;
        let bytes_before = fs::read(&f.img).unwrap();

        // Read-only open: the replay is in memory; the tree is the target's.
        let fs_ro = Fs::open(&f.img).unwrap_or_else(|e| panic!("{name}: open: {e}"));
        let report = fs_ro.recovery().cloned().unwrap_or_else(|| panic!("{name}: no recovery report"));
        let r = &report;
        let t = f.transactions;
        let (hits, records) = if case.revokes { (2, 3) } else { (0, 0) };
        assert_eq!(
            (r.start_sequence, r.end_sequence, r.transactions, r.blocks_revoked, r.revoke_records),
            (1, t + 2, t, hits, records),
            "{name}: {report:?}"
        );
        let n = f.changed.len() as u64;
        assert_eq!((r.blocks_replayed, r.distinct_blocks), (n + 1, n), "{name}: {report:?}");
        let target = Fs::open(&f.target).unwrap();
        common::assert_no_diff(
            name,
            &diff_full("target", &walk_rext4(&target, None), "replayed", &walk_rext4(&fs_ro, None)),
        );
        let attr = fs_ro.metadata("/keep/f").unwrap();
        assert_eq!(attr.mode, 0o100600, "{name}: mode of /keep/f");
        assert!(!fs_ro.superblock().incompat().contains(rext4::format::features::Incompat::RECOVER));
        assert!(!fs_ro.read_only_reasons().is_empty(), "{name}: in-memory replay should say so");
        drop(fs_ro);
        assert!(fs::read(&f.img).unwrap() == bytes_before, "{name}: a read-only open modified the image");

        // Replay onto the image.
        let ours = copy(&f.img, &f.path("ours"));
        let r = rext4::recover_image(&ours).unwrap_or_else(|e| panic!("{name}: recover_image: {e}"));
        assert_eq!(r, report, "{name}");
        f.assert_replayed(&ours, None, &format!("{name} (rext4)"));
        assert_eq!(fs_incompat(&ours) & RECOVER, 0, "{name}");
        assert_eq!(journal_state(&ours, f.bs), (0, f.transactions + 2), "{name}: journal not emptied");
        assert_fsck_clean(&ours, name);
        assert_eq!(
            rext4::recover_image(&ours).unwrap(),
            RecoveryReport::default(),
            "{name}: second recovery"
        );
        let fs_ours = Fs::open(&ours).unwrap();
        assert!(fs_ours.recovery().is_none());
        common::assert_no_diff(
            name,
            &diff_full("target", &walk_rext4(&target, None), "recovered", &walk_rext4(&fs_ours, None)),
        );

        // e2fsck's replay of the same journal: the same bytes everywhere, the same journal
        // state, and (after its full check) the same tree.
        let theirs = copy(&f.img, &f.path("theirs"));
        e2fsck_replay(&theirs);
        assert_eq!(
            differing_blocks(&ours, &theirs, f.bs),
            Vec::<u64>::new(),
            "{name}: rext4 vs e2fsck replay"
        );
        assert_eq!(journal_state(&theirs, f.bs), (0, f.transactions + 2), "{name}: e2fsck's journal state");
        let (code, text) = e2fsck(&theirs, "-fy");
        assert!(code == 0 || code == 1, "{name}: e2fsck -fy exited {code}:\n{text}");
        let fs_theirs = Fs::open(&theirs).unwrap();
        common::assert_no_diff(
            name,
            &diff_full("e2fsck", &walk_rext4(&fs_theirs, None), "rext4", &walk_rext4(&fs_ours, None)),
        );

        // The kernel reads what rext4 recovered as rext4 does.
        if common::kernel_can_mount() {
            let m = KernelMount::ro(&ours).unwrap_or_else(|e| panic!("{name}: {e}"));
            common::assert_no_diff(
                name,
                &diff_full("kernel", &walk_kernel(m.path()), "rext4", &walk_rext4(&fs_ours, None)),
            );
        }
    }
}

/// Opening for writing replays in place first, as the kernel's mount does.
#[test]
fn writable_open_recovers_in_place() {
    let f = fixture(&CASES[0]);
    let img = copy(&f.img, &f.path("rw"));
    let fs = Fs::open_rw(&img).unwrap_or_else(|e| panic!("open_rw: {e}"));
    let r = fs.recovery().cloned().unwrap();
    assert_eq!((r.transactions, r.end_sequence), (3, 5));
    assert!(fs.read_only_reasons().is_empty(), "{:?}", fs.read_only_reasons());
    let target = Fs::open(&f.target).unwrap();
    common::assert_no_diff(
        "rw",
        &diff_full("target", &walk_rext4(&target, None), "recovered", &walk_rext4(&fs, None)),
    );
    fs.unmount().unwrap();
    drop(fs);
    f.assert_replayed(&img, None, "rw");
    assert_fsck_clean(&img, "rw");
    assert!(Fs::open(&img).unwrap().recovery().is_none());
}

/// debugfs's checksum v1 covers every block of the transaction, revoke blocks included; the
/// kernel's (`calc_chksums`) only descriptor and data blocks. e2fsck, whose recovery code is
/// the kernel's, finds such a transaction corrupt, and so does rext4.
#[test]
fn v1_checksum_leaves_out_revoke_blocks() {
    let dir = scratch();
    let src = source_tree(dir.path());
    let img = dir.path().join("img");
    common::mkfs(Some(&src), &img, &["-b", "4096", "-O", "^metadata_csum,^64bit"], "16M");
    let data = dir.path().join("data");
    fs::write(&data, vec![0u8; 4096]).unwrap();
    debugfs(&img, &format!("jo -c\njw -b 3000 -r 3001 {}\njc\n", data.display()), true);
    let e = open_err(&img);
    assert_eq!(e.errno(), libc::EUCLEAN, "{e}");
    let text = e2fsck_replay(&img);
    assert!(text.contains("transaction 1 was corrupt"), "e2fsck:\n{text}");
}

// ------------------------------------------------------------------------------------------
// Torn and corrupt transactions
// ------------------------------------------------------------------------------------------

/// The journal block of every commit block, in log order.
fn commit_blocks(img: &Path) -> Vec<u32> {
    logdump(img).into_iter().filter(|&(_, _, t)| t == 2).map(|(b, _, _)| b).collect()
}

#[test]
fn torn_and_corrupt_transactions() {
    for case in [&CASES[0], &CASES[3]] {
        let f = fixture(case);
        let name = case.name;
        let bs = f.bs;
        let commits = commit_blocks(&f.img);
        let phys = journal_blocks(&f.img, &commits);

        // A transaction cut short (its commit block never written) is not replayed; neither
        // is anything after it.
        let torn = copy(&f.img, &f.path("torn"));
        write_at(&torn, phys[1] * bs as u64, &vec![0u8; bs]);
        let fs = Fs::open(&torn).unwrap_or_else(|e| panic!("{name}: torn: {e}"));
        let r = fs.recovery().unwrap().clone();
        assert_eq!((r.transactions, r.end_sequence), (1, 3), "{name}: torn");
        drop(fs);
        let theirs = copy(&torn, &f.path("torn-e2fsck"));
        rext4::recover_image(&torn).unwrap();
        // T1 alone: the first half, plus its junk copy of y, which T2 no longer replaces.
        let y = f.second_half[0];
        for &b in &f.first_half {
            assert!(read_block(&torn, b, bs) == f.changed[&b], "{name}: torn: block {b} of T1 not replayed");
        }
        assert!(read_block(&torn, y, bs).iter().all(|&x| x == 0xEE), "{name}: torn: T1's copy of {y}");
        for &b in &f.second_half[1..] {
            assert!(
                read_block(&torn, b, bs) == read_block(&f.before, b, bs),
                "{name}: torn: T2 block {b} replayed"
            );
        }
        e2fsck_replay(&theirs);
        assert_eq!(differing_blocks(&torn, &theirs, bs), Vec::<u64>::new(), "{name}: torn: rext4 vs e2fsck");
        assert_eq!(journal_state(&torn, bs), journal_state(&theirs, bs), "{name}: torn: journal state");

        // A commit block whose header fails its checksum: the kernel refuses the journal
        // (after replaying what came before, as e2fsck does).
        let bad = copy(&f.img, &f.path("bad-commit"));
        let mut blk = read_block(&bad, phys[1], bs);
        blk[0x20] ^= 1;
        write_at(&bad, phys[1] * bs as u64, &blk);
        let snapshot = fs::read(&bad).unwrap();
        let e = open_err(&bad);
        assert_eq!(e.errno(), libc::EUCLEAN, "{name}: {e}");
        assert!(e.to_string().contains("journal"), "{e}");
        let e = rext4::recover_image(&bad).unwrap_err();
        assert_eq!(e.errno(), libc::EUCLEAN, "{name}: {e}");
        assert!(fs::read(&bad).unwrap() == snapshot, "{name}: a refused recovery wrote to the image");
        assert!(
            !kernel_accepts(&copy(&bad, &f.path("k"))).unwrap_or(false),
            "{name}: the kernel took a bad commit"
        );
        let text = e2fsck_replay(&bad);
        assert!(text.contains("transaction 2 was corrupt"), "{name}: e2fsck:\n{text}");

        // Only the commit block's header written, the rest of the block stale: committed, as
        // the kernel's `jbd2_commit_block_csum_verify_partial` decides.
        let partial = copy(&f.img, &f.path("partial-commit"));
        let mut blk = read_block(&partial, phys[1], bs);
        blk[bs - 1] ^= 0x55;
        write_at(&partial, phys[1] * bs as u64, &blk);
        let fs = Fs::open(&partial).unwrap_or_else(|e| panic!("{name}: partial commit: {e}"));
        assert_eq!(fs.recovery().unwrap().transactions, 3, "{name}: partial commit");
        drop(fs);
        if let Some(ok) = kernel_accepts(&copy(&partial, &f.path("k"))) {
            assert!(ok, "{name}: the kernel refused a commit block with a stale tail");
        }

        // A logged block whose tag checksum fails: the kernel skips it, replays the rest and
        // then fails the mount (EFSBADCRC); rext4 refuses without writing.
        let bad = copy(&f.img, &f.path("bad-data"));
        let desc = logdump(&bad).into_iter().find(|&(_, s, t)| s == 1 && t == 1).unwrap().0;
        let data = journal_blocks(&bad, &[desc + 1])[0];
        let mut blk = read_block(&bad, data, bs);
        blk[bs / 2] ^= 1;
        write_at(&bad, data * bs as u64, &blk);
        let snapshot = fs::read(&bad).unwrap();
        let e = open_err(&bad);
        assert_eq!(e.errno(), libc::EBADMSG, "{name}: {e}");
        assert!(rext4::recover_image(&bad).is_err());
        assert!(fs::read(&bad).unwrap() == snapshot, "{name}: a refused recovery wrote to the image");
        assert!(
            !kernel_accepts(&copy(&bad, &f.path("k"))).unwrap_or(false),
            "{name}: the kernel took a bad block"
        );
        let text = e2fsck_replay(&bad);
        assert!(text.contains("Invalid checksum recovering"), "{name}: e2fsck:\n{text}");

        // A descriptor block whose tail checksum fails, in a transaction whose commit looks
        // current: corruption, refused.
        let bad = copy(&f.img, &f.path("bad-desc"));
        let desc = logdump(&bad).into_iter().find(|&(_, s, t)| s == 2 && t == 1).unwrap().0;
        let p = journal_blocks(&bad, &[desc])[0];
        let mut blk = read_block(&bad, p, bs);
        blk[bs - 8] ^= 1;
        write_at(&bad, p * bs as u64, &blk);
        let e = open_err(&bad);
        assert_eq!(e.errno(), libc::EBADMSG, "{name}: {e}");
        assert!(
            !kernel_accepts(&copy(&bad, &f.path("k"))).unwrap_or(false),
            "{name}: the kernel took a bad descriptor"
        );
    }
}

// ------------------------------------------------------------------------------------------
// Hostile journals
// ------------------------------------------------------------------------------------------

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Opens an in-memory image; must not panic. Returns the error, or walks the root if it opened.
fn try_open(img: Vec<u8>) -> Result<RecoveryReport, Error> {
    let dev = Arc::new(MemDevice::new(img));
    let fs = Fs::from_device(dev, Options::default())?;
    let _ = fs.read_dir("/").map(|d| d.count());
    Ok(fs.recovery().cloned().unwrap_or_default())
}

fn jsb_set(img: &mut [u8], jsb_off: usize, field: usize, v: u32) {
    img[jsb_off + field..jsb_off + field + 4].copy_from_slice(&v.to_be_bytes());
    // s_checksum (v3 journals check it).
    let mut sb = img[jsb_off..jsb_off + 1024].to_vec();
    sb[0xFC..0x100].fill(0);
    let c = rext4::format::checksum::crc32c(!0, &sb);
    img[jsb_off + 0xFC..jsb_off + 0x100].copy_from_slice(&c.to_be_bytes());
}

#[test]
fn hostile_journals_never_panic_or_hang() {
    let f = fixture(&CASES[0]);
    let bs = f.bs;
    let base = fs::read(&f.img).unwrap();
    let jblocks: Vec<u32> = (0..64).collect();
    let map = journal_blocks(&f.img, &jblocks);
    let jsb_off = map[0] as usize * bs;
    let log_off = |n: usize| map[n] as usize * bs;
    let started = Instant::now();

    // The superblock fields the kernel checks.
    let cases: [(&str, usize, u32, i32); 6] = [
        ("s_start past s_maxlen", 0x1C, 5000, libc::EUCLEAN),
        ("s_first 0", 0x14, 0, libc::EUCLEAN),
        ("s_maxlen beyond the inode", 0x10, 100_000, libc::EUCLEAN),
        ("unknown incompat feature", 0x28, 0x13 | 0x1000, libc::EUCLEAN),
        ("bad magic", 0x0, 0x1234, libc::EUCLEAN),
        ("block size mismatch", 0xC, 1024, libc::EUCLEAN),
    ];
    for (what, field, v, errno) in cases {
        let mut img = base.clone();
        jsb_set(&mut img, jsb_off, field, v);
        let e = try_open(img).expect_err(what);
        assert_eq!(e.errno(), errno, "{what}: {e}");
    }
    let mut img = base.clone();
    img[jsb_off + 0x200] ^= 1;
    assert_eq!(try_open(img).unwrap_err().errno(), libc::EBADMSG, "journal superblock checksum");
    // s_start 0 with needs_recovery: nothing to replay.
    let mut img = base.clone();
    jsb_set(&mut img, jsb_off, 0x1C, 0);
    assert_eq!(try_open(img).unwrap().transactions, 0);

    // A log of random bytes has no transaction.
    for seed in 1..=8u64 {
        let mut rng = Rng(seed * 0x9E37_79B9);
        let mut img = base.clone();
        for n in 1..64 {
            for b in img[log_off(n)..log_off(n) + bs].iter_mut() {
                *b = rng.next() as u8;
            }
        }
        assert_eq!(try_open(img).unwrap().transactions, 0, "seed {seed}");
    }

    // A ring of revoke blocks all carrying the expected sequence: refused, not looped on.
    {
        let mut img = base.clone();
        let ring = journal_blocks(&f.img, &(0..1024).collect::<Vec<u32>>());
        let seed = rext4::format::jbd2::journal_csum_seed(&uuid(&base, jsb_off));
        for &p in &ring[1..] {
            let o = p as usize * bs;
            img[o..o + bs].fill(0);
            img[o..o + 4].copy_from_slice(&0xC03B_3998u32.to_be_bytes());
            img[o + 4..o + 8].copy_from_slice(&5u32.to_be_bytes());
            img[o + 8..o + 12].copy_from_slice(&1u32.to_be_bytes());
            img[o + 12..o + 16].copy_from_slice(&16u32.to_be_bytes());
            let c = rext4::format::jbd2::tail_checksum(&img[o..o + bs], seed);
            img[o + bs - 4..o + bs].copy_from_slice(&c.to_be_bytes());
        }
        let e = try_open(img).unwrap_err();
        assert_eq!(e.errno(), libc::EUCLEAN, "{e}");
    }

    // Mutations of a real log: header fields, counts, tag flags, bytes.
    let mut outcomes: BTreeMap<String, u32> = BTreeMap::new();
    for seed in 1..=300u64 {
        let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
        let mut img = base.clone();
        for _ in 0..1 + rng.below(6) {
            let n = 1 + rng.below(14) as usize;
            let o = log_off(n);
            match rng.below(8) {
                0 => img[o + rng.below(bs as u64) as usize] ^= 1 << rng.below(8),
                1 => img[o + 4..o + 8].copy_from_slice(&(rng.below(8) as u32).to_be_bytes()),
                2 => img[o + 8..o + 12].copy_from_slice(&(1 + rng.below(4) as u32).to_be_bytes()),
                3 => {
                    img[o + 12..o + 16].copy_from_slice(&(rng.next() as u32 % (bs as u32 + 64)).to_be_bytes())
                }
                4 => {
                    // Tag flags of the first tags.
                    let t = o + 12 + 16 * rng.below(4) as usize;
                    img[t + 4..t + 8].copy_from_slice(&(rng.below(16) as u32).to_be_bytes());
                }
                5 => jsb_set(&mut img, jsb_off, 0x1C, rng.below(1100) as u32),
                6 => jsb_set(&mut img, jsb_off, 0x18, rng.below(6) as u32),
                _ => {
                    let (a, b) = (log_off(1 + rng.below(14) as usize), log_off(1 + rng.below(14) as usize));
                    let blk = img[a..a + bs].to_vec();
                    img[b..b + bs].copy_from_slice(&blk);
                }
            }
        }
        let t = Instant::now();
        match try_open(img) {
            Ok(r) => *outcomes.entry(format!("opened, {} transactions", r.transactions)).or_insert(0) += 1,
            Err(e) => *outcomes.entry(e.to_string()).or_insert(0) += 1,
        }
        assert!(t.elapsed() < Duration::from_secs(10), "seed {seed}: recovery took {:?}", t.elapsed());
    }
    eprintln!("hostile journals ({:?}): {outcomes:#?}", started.elapsed());
}

fn uuid(img: &[u8], jsb_off: usize) -> [u8; 16] {
    let mut u = [0u8; 16];
    u.copy_from_slice(&img[jsb_off + 0x30..jsb_off + 0x40]);
    u
}

#[test]
fn refusals_are_clear() {
    // needs_recovery with an external journal.
    let dir = scratch();
    let img = dir.path().join("img");
    common::mkfs(None, &img, &["-O", "^has_journal"], "16M");
    let mut b = read_block(&img, 0, 4096);
    let sb = 1024;
    let compat = u32::from_le_bytes([b[sb + 0x5C], b[sb + 0x5D], b[sb + 0x5E], b[sb + 0x5F]]) | 0x4;
    b[sb + 0x5C..sb + 0x60].copy_from_slice(&compat.to_le_bytes());
    let inc = fs_incompat(&img) | RECOVER;
    b[sb + 0x60..sb + 0x64].copy_from_slice(&inc.to_le_bytes());
    b[sb + 0xE4..sb + 0xE8].copy_from_slice(&0x0801u32.to_le_bytes());
    let c = rext4::format::checksum::crc32c(!0, &b[sb..sb + 0x3FC]);
    b[sb + 0x3FC..sb + 0x400].copy_from_slice(&c.to_le_bytes());
    write_at(&img, 0, &b);
    let e = open_err(&img);
    assert!(matches!(e, Error::Incompatible(_)), "{e}");
    assert!(e.to_string().contains("external"), "{e}");
    assert!(rext4::recover_image(&img).is_err());
}

// ------------------------------------------------------------------------------------------
// Journals the kernel wrote
// ------------------------------------------------------------------------------------------

/// A read-write kernel mount with chosen options, unmounted on drop.
struct RwMount {
    dir: tempfile::TempDir,
    mounted: bool,
}

impl RwMount {
    fn new(img: &Path, opts: &str) -> Result<RwMount, String> {
        let dir = tempfile::Builder::new().prefix("rext4-rec-mnt").tempdir().map_err(|e| e.to_string())?;
        let (code, text) = output(
            Command::new(tool("mount"))
                .args(["-t", "ext4", "-o", &format!("loop,{opts}")])
                .arg(img)
                .arg(dir.path()),
        );
        if code != 0 {
            return Err(text);
        }
        Ok(RwMount { dir, mounted: true })
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
    fn unmount(&mut self) {
        if self.mounted {
            for _ in 0..20 {
                if output(Command::new(tool("umount")).arg(self.dir.path())).0 == 0 {
                    self.mounted = false;
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = Command::new(tool("umount")).arg("-l").arg(self.dir.path()).status();
            self.mounted = false;
        }
    }
}

impl Drop for RwMount {
    fn drop(&mut self) {
        self.unmount();
    }
}

fn fsync(p: &Path) {
    fs::File::open(p).unwrap().sync_all().unwrap();
}

fn write_synced(p: &Path, data: &[u8]) {
    fs::write(p, data).unwrap();
    fsync(p);
}

/// Changes the kernel makes: phase 1 is `sync`ed (written home and logged), phase 2 only
/// fsync'ed (in the log; its home blocks still stale when the image is copied).
fn kernel_workload(m: &Path, big: bool) {
    use std::os::unix::fs::symlink;
    for d in ["a", "a/b", "c", "gone-dir"] {
        fs::create_dir(m.join(d)).unwrap();
    }
    for i in 0..30 {
        fs::write(m.join(format!("a/f{i}")), format!("phase one {i}\n").repeat(i * 7 + 1)).unwrap();
    }
    fs::write(m.join("c/doomed"), b"unlinked in phase two").unwrap();
    fs::write(m.join("c/moved"), b"renamed in phase two").unwrap();
    symlink("a/f1", m.join("link1")).unwrap();
    xattr::set(m.join("a/f2"), "user.one", b"1").unwrap();
    let _ = Command::new("sync").status();

    for i in 0..40 {
        write_synced(&m.join(format!("a/b/n{i}")), &vec![i as u8; 100 * i + 1]);
    }
    if big {
        write_synced(&m.join("big"), &(0..3_000_000u32).flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    }
    fs::rename(m.join("c/moved"), m.join("a/moved-here")).unwrap();
    fs::remove_file(m.join("c/doomed")).unwrap();
    fs::remove_dir(m.join("gone-dir")).unwrap();
    fs::remove_file(m.join("a/f3")).unwrap();
    fs::hard_link(m.join("a/f4"), m.join("c/hard")).unwrap();
    fs::set_permissions(m.join("a/f5"), fs::Permissions::from_mode(0o600)).unwrap();
    xattr::set(m.join("a/f2"), "user.two", &[2u8; 300]).unwrap();
    xattr::set(m.join("c"), "user.dir", b"on a directory").unwrap();
    symlink("x".repeat(200), m.join("c/longlink")).unwrap();
    fs::create_dir(m.join("c/newdir")).unwrap();
    for i in 0..300 {
        fs::write(m.join(format!("c/newdir/e{i:03}")), b"").unwrap();
    }
    for d in ["", "a", "a/b", "c", "c/newdir"] {
        fsync(&m.join(d));
    }
    fsync(&m.join("a/f5"));
}

/// How a kernel case ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tail {
    /// With full commits.
    Commit,
    /// With an append and fsync that the kernel logs as a fast commit (`fast_commit` images).
    FastCommit,
}

fn kernel_case(name: &str, mkfs: &[&str], mount_opts: &str, tail: Tail) {
    let tmp = scratch();
    let dir = tmp.path().to_path_buf();
    // REXT4_KEEP=1 keeps the images for a look after a failure.
    let _tmp = if std::env::var_os("REXT4_KEEP").is_some() {
        eprintln!("{name}: images kept in {}", dir.display());
        let _ = tmp.keep();
        None
    } else {
        Some(tmp)
    };
    let img = dir.join("img");
    let mut args = vec!["-E", "lazy_itable_init=0,lazy_journal_init=0"];
    args.extend_from_slice(mkfs);
    common::mkfs(None, &img, &args, "96M");
    let crash = dir.join("crash");
    let model;
    {
        let mut m = match RwMount::new(&img, mount_opts) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("SKIP {name}: cannot mount with {mount_opts}: {e}");
                return;
            }
        };
        kernel_workload(m.path(), true);
        if tail == Tail::FastCommit {
            let p = m.path().join("a/f7");
            let mut f = fs::OpenOptions::new().append(true).open(&p).unwrap();
            std::io::Write::write_all(&mut f, b"appended after the last full commit\n").unwrap();
            f.sync_all().unwrap();
        }
        model = walk_kernel(m.path());
        // The crash: a copy of the image while the kernel still has it mounted.
        let (code, text) = output(Command::new("cp").arg("--sparse=always").arg(&img).arg(&crash));
        assert_eq!(code, 0, "{text}");
        m.unmount();
    }
    assert!(fs_incompat(&crash) & RECOVER != 0, "{name}: the copy does not need recovery");
    let snapshot = fs::read(&crash).unwrap();

    // rext4 reads the crashed image as the kernel showed it.
    if tail == Tail::FastCommit {
        // Fast commits are ext4's logical log, which rext4 does not replay: refused, untouched.
        let e = open_err(&crash);
        assert!(matches!(e, Error::NotSupported(_)), "{name}: {e}");
        assert!(e.to_string().contains("fast commit"), "{e}");
        let e = rext4::recover_image(&crash).unwrap_err();
        assert!(matches!(e, Error::NotSupported(_)), "{name}: {e}");
        assert!(fs::read(&crash).unwrap() == snapshot, "{name}: a refused recovery wrote to the image");
        return;
    }
    let fs_ro = Fs::open(&crash).unwrap_or_else(|e| panic!("{name}: open: {e}"));
    let report = fs_ro.recovery().cloned().unwrap();
    assert!(report.transactions > 0 && report.distinct_blocks > 0, "{name}: {report:?}");
    let ro_walk = walk_rext4(&fs_ro, None);
    common::assert_no_diff(
        &format!("{name}: kernel before the crash vs rext4 replay"),
        &diff_full("kernel", &model, "rext4", &ro_walk),
    );
    drop(fs_ro);
    assert!(fs::read(&crash).unwrap() == snapshot, "{name}: read-only open modified the image");

    // How much the replay mattered: the same image with the journal ignored.
    let stale = copy(&crash, &dir.join("stale"));
    let mut b = read_block(&stale, 0, 4096);
    let inc = fs_incompat(&stale) & !RECOVER;
    b[1024 + 0x60..1024 + 0x64].copy_from_slice(&inc.to_le_bytes());
    let c = rext4::format::checksum::crc32c(!0, &b[1024..1024 + 0x3FC]);
    b[1024 + 0x3FC..1024 + 0x400].copy_from_slice(&c.to_le_bytes());
    write_at(&stale, 0, &b);
    let stale_diffs = match Fs::open(&stale) {
        Ok(f) => diff_full("kernel", &model, "stale", &walk_rext4(&f, None)).len(),
        Err(_) => usize::MAX,
    };
    eprintln!("{name}: {report:?}; without replay {stale_diffs} differences");

    // rext4's recovery onto the image: clean, and what the kernel then mounts is the same.
    let ours = copy(&crash, &dir.join("ours"));
    let r = rext4::recover_image(&ours).unwrap_or_else(|e| panic!("{name}: recover_image: {e}"));
    assert_eq!(r, report, "{name}");
    // The kernel processes orphans at mount, after the replay; neither rext4's recovery nor
    // e2fsck's journal replay does. What e2fsck then finds must be only that, and the same.
    let theirs = copy(&crash, &dir.join("theirs"));
    let text = e2fsck_replay(&theirs);
    if text.contains("while recovering journal") {
        // e2fsprogs 1.47.0 fails ("Invalid argument while recovering journal") on a journal
        // with the fast-commit feature whose fast-commit area is stale, and then drops the
        // journal unreplayed; the kernel is the oracle there.
        assert!(mkfs.contains(&"fast_commit"), "{name}: e2fsck could not replay:\n{text}");
        eprintln!("{name}: e2fsck cannot replay this journal: {}", text.trim());
        assert_fsck_clean(&ours, name);
        return;
    }
    let (problems, theirs_problems) = (fsck_problems(&ours), fsck_problems(&theirs));
    assert_eq!(problems, theirs_problems, "{name}: e2fsck -fn after rext4's and after e2fsck's replay");
    for p in &problems {
        assert!(
            p.starts_with("Feature orphan_present is set but orphan file is clean"),
            "{name}: e2fsck -fn: {p}"
        );
    }
    let fs_ours = Fs::open(&ours).unwrap();
    let ours_walk = walk_rext4(&fs_ours, None);
    common::assert_no_diff(name, &diff_full("in-memory replay", &ro_walk, "recovered", &ours_walk));
    {
        let m = KernelMount::ro(&ours).unwrap_or_else(|e| panic!("{name}: {e}"));
        common::assert_no_diff(name, &diff_full("kernel", &walk_kernel(m.path()), "rext4", &ours_walk));
    }

    // e2fsck's replay of the same crash writes the same bytes; after its full check, the
    // tree is the same.
    let bs = fs_ours.block_size() as usize;
    assert_eq!(differing_blocks(&ours, &theirs, bs), Vec::<u64>::new(), "{name}: rext4 vs e2fsck replay");
    assert_eq!(
        journal_state(&ours, bs),
        journal_state(&theirs, bs),
        "{name}: journal superblock after recovery"
    );
    let (code, text) = e2fsck(&theirs, "-fy");
    assert!(code == 0 || code == 1, "{name}: e2fsck -fy exited {code}:\n{text}");
    let fs_theirs = Fs::open(&theirs).unwrap();
    common::assert_no_diff(name, &diff_full("e2fsck", &walk_rext4(&fs_theirs, None), "rext4", &ours_walk));
}

#[test]
fn kernel_written_journals() {
    if !common::kernel_can_mount() {
        return;
    }
    use Tail::*;
    kernel_case("default", &[], "noatime", Commit);
    kernel_case("csum-seed-orphan-file", &["-O", "metadata_csum_seed,orphan_file"], "noatime", Commit);
    kernel_case("no-metadata-csum", &["-O", "^metadata_csum"], "noatime", Commit);
    // Small images get 1 KiB blocks by default; 4 KiB puts the superblock inside block 0.
    kernel_case("4k-blocks", &["-b", "4096"], "noatime", Commit);
    // The kernel allows asynchronous commits only without data=ordered.
    kernel_case("async-commit", &["-b", "4096"], "noatime,data=writeback,journal_async_commit", Commit);
    // A fast-commit journal whose fast-commit area is stale replays like any other; one that
    // holds fast commits is refused.
    kernel_case("fast-commit-stale", &["-O", "fast_commit"], "noatime", Commit);
    kernel_case("fast-commit", &["-O", "fast_commit"], "noatime", FastCommit);
}
