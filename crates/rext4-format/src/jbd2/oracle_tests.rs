//! The oracle: journals written by e2fsprogs (mkfs.ext4, and debugfs's `jo`/`jw`/`jc`) parsed
//! with this module and cross-checked against `debugfs logdump -a`; and transactions built with
//! this module's builders written into a real journal, then read by `logdump` and replayed by
//! `e2fsck`. Skipped (with a message) when e2fsprogs is not installed.

use super::*;
use crate::features::Incompat;
use crate::superblock::Superblock;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

const BS: usize = 4096;

struct Tools {
    mkfs: PathBuf,
    debugfs: PathBuf,
    e2fsck: PathBuf,
}

fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn tools_or_skip(test: &str) -> Option<Tools> {
    let t = (|| {
        Some(Tools {
            mkfs: find_tool("mkfs.ext4")?,
            debugfs: find_tool("debugfs")?,
            e2fsck: find_tool("e2fsck")?,
        })
    })();
    if t.is_none() {
        println!("{test}: skipped, mkfs.ext4 / debugfs / e2fsck not found");
    }
    t
}

/// A temporary directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("rext4-jbd2-{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn run(cmd: &mut Command, ok_codes: &[i32]) -> String {
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let code = out.status.code().unwrap_or(-1);
    assert!(ok_codes.contains(&code), "{cmd:?} exited {code}:\n{text}");
    text
}

fn mkfs(t: &Tools, dir: &Scratch, opts: &[&str]) -> PathBuf {
    let img = dir.path("img");
    run(Command::new(&t.mkfs).args(["-q", "-F", "-b", "4096"]).args(opts).arg(&img).arg("64M"), &[0]);
    img
}

/// Runs debugfs commands (one per line) on the image.
fn debugfs(t: &Tools, img: &Path, cmds: &str, write: bool) -> String {
    let file = img.with_extension("cmds");
    fs::write(&file, cmds).unwrap();
    let mut c = Command::new(&t.debugfs);
    if write {
        c.arg("-w");
    }
    run(c.arg("-f").arg(&file).arg(img), &[0])
}

/// The journal inode's contents: journal block n is at n * BS.
fn dump_journal(t: &Tools, img: &Path) -> Vec<u8> {
    let out = img.with_extension("journal");
    debugfs(t, img, &format!("dump <8> {}\n", out.display()), false);
    fs::read(&out).unwrap()
}

/// Physical blocks of journal blocks 0..n (`bmap <8> i`).
fn journal_map(t: &Tools, img: &Path, n: u32) -> Vec<u64> {
    let cmds: String = (0..n).map(|i| format!("bmap <8> {i}\n")).collect();
    let out = debugfs(t, img, &cmds, false);
    let map: Vec<u64> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert_eq!(map.len(), n as usize, "{out}");
    map
}

/// A recognisable block: every word holds (index, word number); block indices 2, 9, 16, ...
/// start with the jbd2 magic so they get escaped.
fn pattern(i: usize) -> Vec<u8> {
    let mut v = vec![0u8; BS];
    for (k, w) in v.chunks_exact_mut(4).enumerate() {
        w.copy_from_slice(&(((i as u32) << 16) | k as u32 | 0x8000_0000).to_be_bytes());
    }
    if i % 7 == 2 {
        v[..4].copy_from_slice(&JBD2_MAGIC_NUMBER.to_be_bytes());
    }
    v
}

/// What a walk of the log found.
#[derive(Default, Debug)]
struct Log {
    /// (target block, flags, journal block) of every tag, in order.
    tags: Vec<(u64, u16, u32)>,
    /// The journal copies, unescaped.
    data: Vec<Vec<u8>>,
    /// Whether each tag carried a UUID.
    uuids: Vec<bool>,
    revoked: Vec<u64>,
    commits: Vec<CommitHeader>,
    descriptors: usize,
    descriptors_without_last_tag: usize,
    revoke_blocks: usize,
}

/// Walks the log from `s_start` the way recovery's scan pass does, checking every checksum.
fn walk(journal: &[u8], sb: &JournalSuperblock, p: &JournalParams) -> Log {
    let block = |n: u32| &journal[n as usize * p.block_size..(n as usize + 1) * p.block_size];
    let next = |n: u32| {
        if n + 1 >= sb.maxlen() {
            sb.first()
        } else {
            n + 1
        }
    };
    let mut log = Log::default();
    let mut seq = sb.sequence();
    let mut blk = sb.start();
    assert_ne!(blk, 0, "the log is empty");
    loop {
        let b = block(blk);
        let h = Header::parse(b).unwrap();
        if !h.has_magic() || h.sequence() != seq {
            break;
        }
        match h.block_type() {
            Some(BlockType::Descriptor) => {
                let tags = DescriptorTags::parse(b, p).unwrap();
                assert!(tags.verify_checksum(), "descriptor at {blk}");
                log.descriptors += 1;
                let mut saw_last = false;
                for tag in tags {
                    blk = next(blk);
                    let d = block(blk);
                    assert!(tag.verify_data(p, seq, d), "data block {blk}");
                    if p.has_csum_v2or3() {
                        let mut bad = d.to_vec();
                        bad[BS / 2] ^= 1;
                        assert!(!tag.verify_data(p, seq, &bad));
                    }
                    let mut d = d.to_vec();
                    if tag.is_escaped() {
                        unescape_block(&mut d);
                    }
                    log.tags.push((tag.block, tag.flags.bits(), blk));
                    log.data.push(d);
                    log.uuids.push(tag.uuid.is_some());
                    saw_last |= tag.is_last();
                }
                if !saw_last {
                    log.descriptors_without_last_tag += 1;
                }
            }
            Some(BlockType::Revoke) => {
                let r = RevokeBlock::parse(b, p).unwrap();
                assert!(r.verify_checksum(), "revoke block at {blk}");
                log.revoke_blocks += 1;
                log.revoked.extend(r.blocks());
            }
            Some(BlockType::Commit) => {
                let c = CommitBlock::parse(b, p).unwrap();
                assert!(c.verify_checksum(), "commit block at {blk}");
                if p.has_csum_v2or3() {
                    let mut bad = b.to_vec();
                    bad[BS - 1] ^= 1;
                    assert!(!CommitBlock::parse(&bad, p).unwrap().verify_checksum());
                }
                log.commits.push(*c.header());
                seq = seq.wrapping_add(1);
            }
            _ => break,
        }
        blk = next(blk);
    }
    log
}

/// `debugfs logdump -a`: (target, journal block, flags) of each tag, and the revoked blocks.
fn logdump(t: &Tools, img: &Path) -> (Vec<(u64, u16, u32)>, Vec<u64>, String) {
    let out = debugfs(t, img, "logdump -a\n", false);
    let mut tags = Vec::new();
    let mut revoked = Vec::new();
    for line in out.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if let ["FS", "block", target, "logged", "at", "journal", "block", jblk, "(flags", flags] = w[..] {
            let flags = flags.trim_start_matches("0x").trim_end_matches(')');
            tags.push((
                target.parse().unwrap(),
                u16::from_str_radix(flags, 16).unwrap(),
                jblk.parse().unwrap(),
            ));
        } else if let ["Revoke", "FS", "block", b] = w[..] {
            revoked.push(b.parse().unwrap());
        }
    }
    (tags, revoked, out)
}

struct Case {
    name: &'static str,
    mkfs: &'static [&'static str],
    jo: &'static str,
    csum: CsumVersion,
    is_64bit: bool,
    tag_size: usize,
}

const CASES: &[Case] = &[
    Case { name: "v3-64bit", mkfs: &[], jo: "jo -c", csum: CsumVersion::V3, is_64bit: true, tag_size: 16 },
    Case {
        name: "v2-64bit",
        mkfs: &[],
        jo: "jo -c -v 2",
        csum: CsumVersion::V2,
        is_64bit: true,
        tag_size: 14,
    },
    Case {
        name: "v3-32bit",
        mkfs: &["-O", "^64bit"],
        jo: "jo -c",
        csum: CsumVersion::V3,
        is_64bit: false,
        tag_size: 16,
    },
    Case {
        name: "v2-32bit",
        mkfs: &["-O", "^64bit"],
        jo: "jo -c -v 2",
        csum: CsumVersion::V2,
        is_64bit: false,
        tag_size: 10,
    },
    Case {
        name: "nocsum-64bit",
        mkfs: &["-O", "^metadata_csum"],
        jo: "jo",
        csum: CsumVersion::None,
        is_64bit: true,
        tag_size: 12,
    },
    Case {
        name: "nocsum-32bit",
        mkfs: &["-O", "^metadata_csum,^64bit"],
        jo: "jo",
        csum: CsumVersion::None,
        is_64bit: false,
        tag_size: 8,
    },
    Case {
        name: "v1-32bit",
        mkfs: &["-O", "^metadata_csum,^64bit"],
        jo: "jo -c",
        csum: CsumVersion::V1,
        is_64bit: false,
        tag_size: 8,
    },
];

#[test]
fn mkfs_journal_superblock() {
    let Some(t) = tools_or_skip("mkfs_journal_superblock") else {
        return;
    };
    for (opts, fc) in [(&[][..], 0u32), (&["-O", "fast_commit"][..], 16)] {
        let dir = Scratch::new("mkfs");
        let img = mkfs(&t, &dir, opts);
        let j = dump_journal(&t, &img);
        let sb = JournalSuperblock::parse(&j).unwrap();
        assert!(sb.s_header.has_magic());
        assert_eq!(sb.version(), Some(BlockType::SuperblockV2));
        assert_eq!(sb.block_size(), 4096);
        assert_eq!(sb.maxlen() as usize * BS, j.len());
        assert_eq!(sb.maxlen(), 1024 + fc);
        assert_eq!(sb.num_fc_blks(), fc);
        assert_eq!((sb.first(), sb.sequence(), sb.start()), (1, 1, 0));
        assert_eq!((sb.errno(), sb.nr_users()), (0, 1));
        // mke2fs 1.47 leaves the journal features empty: the kernel adds 64bit and csum v3 at
        // mount time (and debugfs's `jo -c`, below).
        assert_eq!(sb.compat(), JournalCompat::empty());
        assert_eq!(sb.incompat(), JournalIncompat::empty());
        assert_eq!(sb.csum_version(), CsumVersion::None);
        assert_eq!(sb.tag_size(), 8);
        assert!(sb.verify_checksum());
        assert_eq!(sb.users().collect::<Vec<_>>(), vec![[0u8; 16]]);
        let p = sb.params().unwrap();
        assert_eq!(p.block_size, BS);
        // The journal UUID is the filesystem's.
        let raw = fs::read(&img).unwrap();
        let fs_sb = Superblock::parse(&raw[1024..]).unwrap();
        assert_eq!(sb.uuid(), fs_sb.s_uuid);
        assert_eq!(fs_sb.s_journal_inum.get(), 8);
    }
}

#[test]
fn debugfs_written_transactions() {
    let Some(t) = tools_or_skip("debugfs_written_transactions") else {
        return;
    };
    // 300 blocks fill more than one descriptor in every layout but the 8-byte one; debugfs
    // sets LAST_TAG only in the final descriptor, so the first ones end at the tail.
    let targets: Vec<u64> = (100..400).chain([16000]).collect();
    let revokes: Vec<u64> = (1000..1600).collect();
    for case in CASES {
        let dir = Scratch::new(case.name);
        let img = mkfs(&t, &dir, case.mkfs);
        let data_file = dir.path("data");
        let data: Vec<u8> = (0..targets.len()).flat_map(pattern).collect();
        fs::write(&data_file, &data).unwrap();
        let out = debugfs(
            &t,
            &img,
            &format!("{}\njw -b 100-399,16000 -r 1000-1599 {}\njc\n", case.jo, data_file.display()),
            true,
        );
        let j = dump_journal(&t, &img);
        let sb = JournalSuperblock::parse(&j).unwrap();
        let p = sb.params().unwrap_or_else(|e| panic!("{}: {e}\n{out}", case.name));
        assert_eq!(p.csum, case.csum, "{}", case.name);
        assert_eq!(p.is_64bit, case.is_64bit, "{}", case.name);
        assert_eq!(p.tag_size(), case.tag_size, "{}", case.name);
        assert!(sb.incompat().contains(JournalIncompat::REVOKE));
        if p.has_csum_v2or3() {
            assert_eq!(sb.checksum_type(), CHKSUM_CRC32C);
            assert_eq!(sb.compute_checksum(), sb.s_checksum.get());
        }
        assert_eq!((sb.start(), sb.sequence()), (1, 1));

        let log = walk(&j, &sb, &p);
        let name = case.name;
        assert!(log.tags.iter().map(|t| t.0).eq(targets.iter().copied()), "{name}");
        for (i, d) in log.data.iter().enumerate() {
            assert!(*d == pattern(i), "{name}: data of tag {i}");
        }
        for (i, &(_, flags, _)) in log.tags.iter().enumerate() {
            let escaped = flags & TagFlags::ESCAPE.bits() != 0;
            assert_eq!(escaped, i % 7 == 2, "{name}: escape flag of tag {i}");
        }
        assert_eq!(log.revoked, revokes, "{name}");
        let cap = DescriptorBuilder::capacity(&p);
        assert_eq!(log.descriptors, targets.len().div_ceil(cap), "{name}");
        assert_eq!(log.descriptors_without_last_tag, log.descriptors - 1, "{name}");
        assert_eq!(log.uuids.iter().filter(|&&u| u).count(), log.descriptors, "{name}");
        let rcap = RevokeBuilder::capacity(&p);
        assert_eq!(log.revoke_blocks, revokes.len().div_ceil(rcap), "{name}");
        assert_eq!(log.commits.len(), 1, "{name}");
        let commit = &log.commits[0];
        assert_eq!(commit.sequence(), 1);
        assert_eq!(commit.v1_checksum().is_some(), case.csum == CsumVersion::V1, "{name}");

        let (tags, revoked, dump) = logdump(&t, &img);
        assert_eq!(tags, log.tags, "{name}: logdump disagrees:\n{dump}");
        assert_eq!(revoked, log.revoked, "{name}");
    }
}

/// Reads or writes one 4 KiB block of the image.
fn read_block(img: &Path, n: u64) -> Vec<u8> {
    let mut b = vec![0u8; BS];
    fs::File::open(img).unwrap().read_exact_at(&mut b, n * BS as u64).unwrap();
    b
}
fn write_at(img: &Path, off: u64, bytes: &[u8]) {
    fs::OpenOptions::new().write(true).open(img).unwrap().write_all_at(bytes, off).unwrap();
}

/// What to damage (after checksumming) before e2fsck sees the journal.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Corrupt {
    Nothing,
    /// A byte of the commit block: the transaction must not be replayed.
    Commit,
    /// A byte of the journal copy of `targets[i]`: that block alone must not be replayed.
    Data(usize),
}

/// Builds a transaction with this module, writes it into a fresh image's journal, marks the
/// filesystem as needing recovery, and lets e2fsck replay it.
fn replay(t: &Tools, name: &str, opts: &[&str], csum: CsumVersion, is_64bit: bool, corrupt: Corrupt) {
    let dir = Scratch::new(name);
    let img = mkfs(t, &dir, opts);
    let map = journal_map(t, &img, 10);

    let mut jsb = JournalSuperblock::parse(&read_block(&img, map[0])).unwrap();
    let mut inc = jsb.incompat() | JournalIncompat::REVOKE;
    inc.set(JournalIncompat::BIT64, is_64bit);
    match csum {
        CsumVersion::V2 => inc |= JournalIncompat::CSUM_V2,
        CsumVersion::V3 => inc |= JournalIncompat::CSUM_V3,
        CsumVersion::V1 | CsumVersion::None => {}
    }
    jsb.set_incompat(inc);
    if csum == CsumVersion::V1 {
        jsb.set_compat(JournalCompat::CHECKSUM);
    }
    if matches!(csum, CsumVersion::V2 | CsumVersion::V3) {
        jsb.s_checksum_type = CHKSUM_CRC32C;
    }
    jsb.update_checksum();
    let p = jsb.params().unwrap();
    let seq = jsb.sequence();

    // Free blocks of a fresh 64 MiB filesystem; 10002 is revoked in the same transaction.
    let targets = [10000u64, 10001, 10002, 10003, 16000];
    let revoked = 10002u64;
    let originals: Vec<Vec<u8>> = (0..targets.len()).map(|i| pattern(i + 1)).collect();
    for &b in &targets {
        assert!(read_block(&img, b).iter().all(|&x| x == 0), "{name}: block {b} in use");
    }
    let mut desc = DescriptorBuilder::new(&p, seq, jsb.uuid());
    let mut copies = originals.clone();
    for (&b, d) in targets.iter().zip(&mut copies) {
        desc.push_block(b, d).unwrap();
    }
    let mut rev = RevokeBuilder::new(&p, seq);
    rev.push(revoked).unwrap();
    let mut commit = CommitHeader::new(seq, 1_700_000_000, 5).to_block(&p);
    if corrupt == Corrupt::Commit {
        commit[BS - 1] ^= 1;
    }
    if let Corrupt::Data(i) = corrupt {
        copies[i][100] ^= 1;
    }
    let mut blocks = vec![desc.finish().unwrap()];
    blocks.extend(copies);
    blocks.push(rev.finish().unwrap());
    blocks.push(commit);
    for (i, b) in blocks.iter().enumerate() {
        write_at(&img, map[i + 1] * BS as u64, b);
    }
    jsb.set_start(jsb.first());
    jsb.update_checksum();
    write_at(&img, map[0] * BS as u64, jsb.as_bytes());
    let raw = read_block(&img, 0);
    let mut fsb = Superblock::parse(&raw[1024..]).unwrap();
    fsb.s_feature_incompat.set(fsb.s_feature_incompat.get() | Incompat::RECOVER.bits());
    fsb.update_checksum();
    write_at(&img, 1024, fsb.as_bytes());

    // logdump reads our blocks as we meant them.
    let (tags, revs, dump) = logdump(t, &img);
    let expect: Vec<(u64, u16, u32)> = targets
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            let mut f = if i > 0 { TagFlags::SAME_UUID } else { TagFlags::empty() };
            if i == targets.len() - 1 {
                f |= TagFlags::LAST_TAG;
            }
            if i % 7 == 1 {
                f |= TagFlags::ESCAPE;
            }
            (b, f.bits(), i as u32 + 2)
        })
        .collect();
    assert_eq!(tags, expect, "{name}:\n{dump}");
    assert_eq!(revs, vec![revoked], "{name}");
    assert!(dump.contains("type 2 (commit block) at block 8"), "{name}:\n{dump}");

    let fsck = run(Command::new(&t.e2fsck).arg("-fy").arg(&img), &[0, 1]);
    match corrupt {
        Corrupt::Nothing => assert!(!fsck.contains("checksum"), "{name}:\n{fsck}"),
        Corrupt::Commit => assert!(fsck.contains("transaction 1 was corrupt"), "{name}:\n{fsck}"),
        Corrupt::Data(i) => {
            let msg = format!("Invalid checksum recovering data block {}", targets[i]);
            assert!(fsck.contains(&msg), "{name}:\n{fsck}");
        }
    }
    for (i, (&b, orig)) in targets.iter().zip(&originals).enumerate() {
        let now = read_block(&img, b);
        if b == revoked || corrupt == Corrupt::Commit || corrupt == Corrupt::Data(i) {
            assert!(now.iter().all(|&x| x == 0), "{name}: block {b} replayed:\n{fsck}");
        } else {
            assert!(now == *orig, "{name}: block {b} not replayed:\n{fsck}");
        }
    }
    let jsb = JournalSuperblock::parse(&read_block(&img, map[0])).unwrap();
    assert_eq!(jsb.start(), 0, "{name}: journal not emptied");
    run(Command::new(&t.e2fsck).arg("-fn").arg(&img), &[0]);
}

#[test]
fn e2fsck_replays_built_transactions() {
    let Some(t) = tools_or_skip("e2fsck_replays_built_transactions") else {
        return;
    };
    replay(&t, "replay-v3-64bit", &[], CsumVersion::V3, true, Corrupt::Nothing);
    replay(&t, "replay-v2-32bit", &["-O", "^64bit"], CsumVersion::V2, false, Corrupt::Nothing);
    replay(&t, "replay-v2-64bit", &[], CsumVersion::V2, true, Corrupt::Nothing);
    replay(
        &t,
        "replay-nocsum-32bit",
        &["-O", "^metadata_csum,^64bit"],
        CsumVersion::None,
        false,
        Corrupt::Nothing,
    );
    replay(&t, "replay-v3-badcommit", &[], CsumVersion::V3, true, Corrupt::Commit);
    replay(&t, "replay-v3-baddata", &[], CsumVersion::V3, true, Corrupt::Data(3));
    replay(&t, "replay-v2-baddata", &["-O", "^64bit"], CsumVersion::V2, false, Corrupt::Data(0));
}
