//! Fast commits the kernel wrote: an image copied while the kernel has it mounted, after
//! changes it logged only as fast commits (each ended by an `fsync` of a regular file, which
//! ext4 answers with a fast commit when it can), must open in rext4 as the kernel showed it
//! before the copy, read-only (in memory) and writable (onto the image), and be clean under
//! e2fsck after rext4's recovery. The kernel's own replay of the same copy is run too, and
//! mounted: it must show the same files (its link counts and directory sizes are not always
//! right, and e2fsck finds that; see `fs/fast_commit.rs`).

use super::kernel_journals::{fsync, write_synced, RwMount};
use super::*;
use rext4_testkit::{Kind, Walk};

/// Fields a fast commit does not log for directories whose entries changed without their
/// record (their times), or that rext4 lays out on its own (their size and blocks: names are
/// added again, not copied), and link counts the kernel's replay gets wrong.
fn comparable(w: &Walk, dir_links: bool) -> Walk {
    let mut w = w.clone();
    for r in w.recs.values_mut() {
        if r.kind == Kind::Dir {
            r.atime = (0, 0);
            r.mtime = (0, 0);
            r.ctime = (0, 0);
            r.size = 0;
            r.blocks = 0;
            if !dir_links {
                r.nlink = 0;
            }
        }
    }
    w
}

fn write_file(p: &Path, data: &[u8]) {
    write_synced(p, data);
}

fn punch(p: &Path, off: i64, len: i64) {
    let f = fs::OpenOptions::new().write(true).open(p).unwrap();
    // FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
    let r = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 3, off, len) };
    assert_eq!(r, 0, "punch: {}", std::io::Error::last_os_error());
    f.sync_all().unwrap();
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed).to_le_bytes()[1]).collect()
}

/// Set up before the last full commit (`sync`).
fn base(m: &Path) {
    fs::create_dir(m.join("d")).unwrap();
    fs::create_dir(m.join("old")).unwrap();
    for i in 0..8 {
        fs::write(m.join(format!("d/f{i}")), pattern(i, 3000 * i as usize + 1)).unwrap();
    }
    fs::write(m.join("old/big"), pattern(99, 300_000)).unwrap();
    fs::write(m.join("old/gone"), pattern(98, 70_000)).unwrap();
    let _ = Command::new("sync").status();
}

/// Changes each case makes after it, every one followed by an fsync of a regular file.
fn scenario(name: &str, m: &Path) {
    match name {
        "creates" => {
            fs::create_dir(m.join("new")).unwrap();
            fs::create_dir(m.join("new/sub")).unwrap();
            write_file(&m.join("new/sub/leaf"), b"deep");
            write_file(&m.join("new/empty"), b"");
            write_file(&m.join("new/one"), b"1");
            write_file(&m.join("new/three-blocks"), &pattern(1, 10_000));
            write_file(&m.join("new/large"), &pattern(2, 500_000));
            // Enough long names to grow the directory past a block, into an index.
            for i in 0..150 {
                let p = m.join(format!("d/a-rather-long-name-to-fill-blocks-{i:04}"));
                write_file(&p, &pattern(i, i as usize * 37));
            }
        }
        "names" => {
            fs::hard_link(m.join("d/f1"), m.join("d/f1-link")).unwrap();
            fs::hard_link(m.join("d/f2"), m.join("old/f2-elsewhere")).unwrap();
            fs::remove_file(m.join("d/f3")).unwrap();
            fs::remove_file(m.join("old/gone")).unwrap();
            fs::rename(m.join("d/f4"), m.join("d/f4-renamed")).unwrap();
            fs::rename(m.join("d/f5"), m.join("old/f5-moved")).unwrap();
            fs::create_dir(m.join("d/tmpdir")).unwrap();
            fs::remove_dir(m.join("d/tmpdir")).unwrap();
            fs::remove_file(m.join("d/f1")).unwrap();
            // An fsync commits only for a file changed in the running transaction.
            write_file(&m.join("d/f0"), b"changed");
        }
        "ranges" => {
            let f = fs::OpenOptions::new().write(true).open(m.join("old/big")).unwrap();
            f.write_all_at(&pattern(7, 5000), 100_000).unwrap();
            f.sync_all().unwrap();
            f.set_len(200_000).unwrap();
            f.sync_all().unwrap();
            f.set_len(1_000_000).unwrap();
            f.write_all_at(b"tail", 999_996).unwrap();
            f.sync_all().unwrap();
            punch(&m.join("old/big"), 8192, 40_960);
            let g = fs::OpenOptions::new().append(true).open(m.join("d/f6")).unwrap();
            std::io::Write::write_all(&mut &g, &pattern(3, 9000)).unwrap();
            g.sync_all().unwrap();
            fs::OpenOptions::new().write(true).open(m.join("d/f7")).unwrap().set_len(10).unwrap();
            fsync(&m.join("d/f7"));
        }
        "reuse" => {
            // Blocks freed and taken again by another file within the fast commits.
            fs::remove_file(m.join("old/big")).unwrap();
            write_file(&m.join("old/new-big"), &pattern(11, 300_000));
            fs::OpenOptions::new().write(true).open(m.join("old/gone")).unwrap().set_len(0).unwrap();
            fsync(&m.join("old/gone"));
            write_file(&m.join("d/f2"), &pattern(12, 20_000));
        }
        "reincarnate" => {
            // A removed file's inode number taken by a smaller new file: the new file must
            // not keep the old one's blocks.
            fs::remove_file(m.join("old/big")).unwrap();
            write_file(&m.join("old/small"), &pattern(21, 5000));
        }
        "handover" => {
            // A removed file and a new one written after it (the kernel gives the new one
            // other blocks: freed blocks wait for the full commit).
            fs::write(m.join("old/next"), b"").unwrap();
            fs::remove_file(m.join("old/big")).unwrap();
            write_file(&m.join("old/next"), &pattern(22, 300_000));
        }
        "late" => {
            // Several changes, fsynced only at the end (the kernel's own replay of this one
            // leaves link counts and a directory's block count wrong).
            let a = fs::OpenOptions::new().append(true).open(m.join("d/f2")).unwrap();
            std::io::Write::write_all(&mut &a, b"appended\n").unwrap();
            fs::write(m.join("b"), pattern(5, 40_960)).unwrap();
            fs::create_dir(m.join("dd")).unwrap();
            fs::write(m.join("dd/f"), b"x\n").unwrap();
            for p in ["b", "d/f2", "dd/f"] {
                fsync(&m.join(p));
            }
        }
        _ => unreachable!("{name}"),
    }
}

/// A copy of an image taken while the kernel had it mounted, after `scenario(name)`, and what
/// the kernel showed just before the copy.
fn kernel_crash(name: &str, mkfs: &[&str], size: &str, dir: &Path) -> (PathBuf, Walk) {
    let img = dir.join("img");
    let mut args = vec!["-E", "lazy_itable_init=0,lazy_journal_init=0", "-O", "fast_commit"];
    args.extend_from_slice(mkfs);
    Image::ext4(size).args(&args).build(&img);
    let crash = dir.join("crash");
    let model;
    {
        // No periodic full commit may overtake the fast commits.
        let mut m = RwMount::new(&img, "noatime,commit=600").unwrap_or_else(|e| panic!("{name}: {e}"));
        base(m.path());
        scenario(name, m.path());
        model = walk_kernel(m.path());
        let (code, text) = output(Command::new("cp").arg("--sparse=always").arg(&img).arg(&crash));
        assert_eq!(code, 0, "{text}");
        m.unmount();
    }
    assert!(fs_incompat(&crash) & RECOVER != 0, "{name}: the copy does not need recovery");
    (crash, model)
}

fn fast_commit_case(name: &str, mkfs: &[&str]) {
    let tmp = scratch();
    let dir = tmp.path().to_path_buf();
    let (crash, model) = kernel_crash(name, mkfs, "96M", &dir);
    let snapshot = fs::read(&crash).unwrap();
    let want = comparable(&model, true);

    // Read-only: in memory, the image untouched.
    let fs_ro = Fs::open(&crash).unwrap_or_else(|e| panic!("{name}: open: {e}"));
    let report = fs_ro.recovery().cloned().unwrap();
    assert!(report.fast_commit_tags > 0, "{name}: the kernel logged no fast commit: {report:?}");
    let ro_walk = walk_rext4(&fs_ro, None);
    assert_no_diff(
        &format!("{name}: kernel before the crash vs rext4's read-only replay"),
        &diff_full("kernel", &want, "rext4", &comparable(&ro_walk, true)),
    );
    drop(fs_ro);
    assert!(fs::read(&crash).unwrap() == snapshot, "{name}: a read-only open wrote to the image");

    // Writable: onto the image, e2fsck-clean, the same tree in rext4 and in the kernel.
    let ours = copy(&crash, &dir.join("ours"));
    let r = rext4::recover_image(&ours).unwrap_or_else(|e| panic!("{name}: recover_image: {e}"));
    assert_eq!(r, report, "{name}");
    assert_eq!(fs_incompat(&ours) & RECOVER, 0, "{name}: still needs recovery");
    assert_fsck_clean(&ours, name);
    let ours_walk = walk_rext4(&Fs::open(&ours).unwrap(), None);
    assert_no_diff(name, &diff_full("kernel", &want, "recovered", &comparable(&ours_walk, true)));
    {
        let m = KernelMount::ro(&ours).unwrap_or_else(|e| panic!("{name}: {e}"));
        let k = walk_kernel(m.path());
        assert_no_diff(
            name,
            &diff_full("rext4", &comparable(&ours_walk, true), "kernel", &comparable(&k, true)),
        );
    }
    // A writable open replays the same way, and a second open finds nothing left to do.
    let again = copy(&crash, &dir.join("again"));
    {
        let fs = Fs::open_with(&again, Options { writable: true, ..Options::default() }).unwrap();
        assert_eq!(fs.recovery().map(|r| r.fast_commit_tags), Some(report.fast_commit_tags));
        fs.unmount().unwrap();
    }
    assert_fsck_clean(&again, name);
    let fs = Fs::open_with(&again, Options { writable: true, ..Options::default() }).unwrap();
    assert!(fs.recovery().is_none(), "{name}: recovery ran twice");
    fs.unmount().unwrap();
    assert_fsck_clean(&again, name);

    // The kernel's own replay of the same copy shows the same files, once e2fsck has
    // mended what that replay gets wrong (on bigalloc, `i_blocks` counted by blocks where
    // clusters are due; rext4's is clean, checked above).
    let theirs = copy(&crash, &dir.join("theirs"));
    RwMount::new(&theirs, "noatime").unwrap_or_else(|e| panic!("{name}: kernel replay: {e}")).unmount();
    let kernel_problems = fsck_problems(&theirs);
    eprintln!("{name}: {report:?}; e2fsck after the kernel's own replay: {kernel_problems:?}");
    if !kernel_problems.is_empty() {
        e2fsck(&theirs, "-fy");
    }
    {
        let m = KernelMount::ro(&theirs).unwrap_or_else(|e| panic!("{name}: {e}"));
        let k = walk_kernel(m.path());
        assert_no_diff(
            &format!("{name}: rext4's replay vs the kernel's"),
            &diff_full("rext4", &comparable(&ours_walk, false), "kernel", &comparable(&k, false)),
        );
    }
}

#[test]
fn kernel_fast_commits_replay() {
    require_kernel!();
    for (name, mkfs) in [
        ("creates", &[][..]),
        ("names", &["-O", "metadata_csum_seed,orphan_file"][..]),
        ("ranges", &["-b", "4096"][..]),
        ("reuse", &[][..]),
        ("late", &[][..]),
        ("reincarnate", &[][..]),
        ("handover", &[][..]),
        // Small files and directories inside their inodes.
        ("creates", &["-O", "inline_data"][..]),
        ("late", &["-O", "inline_data", "-b", "4096"][..]),
        // Clusters of four blocks: ranges added and removed inside them.
        ("ranges", &["-b", "4096", "-O", "bigalloc", "-C", "16384"][..]),
        ("reuse", &["-b", "1024", "-O", "bigalloc", "-C", "4096"][..]),
        ("handover", &["-b", "4096", "-O", "bigalloc", "-C", "16384"][..]),
    ] {
        fast_commit_case(name, mkfs);
    }
}

/// An image rext4 may only read (here for the `read-only` feature, which no ext4 writes) still
/// shows what its fast commits hold: they are applied over the copy-on-write view, whatever
/// keeps the image read-only, as the kernel applies them on a read-only mount; the image is
/// not written, and a writable open is refused. The same crash image without the feature
/// (`mmp`, which rext4 writes under multi-mount protection) is recovered by a writable open
/// and by `recover_image`, each leaving the MMP block clean.
#[test]
fn an_image_opened_read_only_for_its_features_replays_its_fast_commits() {
    require_kernel!();
    let tmp = scratch();
    // The kernel's number stands in the crash image: each writable open waits it out twice,
    // 11 s at the smallest interval.
    let mmp = ["-O", "mmp", "-E", "mmp_update_interval=1"];
    let (crash, model) = kernel_crash("creates", &mmp, "96M", tmp.path());
    let want = comparable(&model, true);
    let ro = copy(&crash, &tmp.path().join("read-only"));
    {
        let mut b = read_block(&ro, 0, 4096);
        let sb_at = 1024..1024 + rext4::format::superblock::SUPERBLOCK_SIZE;
        let mut sb = rext4::format::superblock::Superblock::parse(&b[sb_at.clone()]).unwrap();
        let ro_compat = sb.s_feature_ro_compat.get() | rext4::format::features::RoCompat::READONLY.bits();
        sb.s_feature_ro_compat.set(ro_compat);
        sb.update_checksum();
        b[sb_at].copy_from_slice(zerocopy::IntoBytes::as_bytes(&sb));
        write_at(&ro, 0, &b);
    }
    let snapshot = fs::read(&ro).unwrap();
    let fs = Fs::open(&ro).unwrap();
    assert!(!fs.read_only_reasons().is_empty());
    assert!(fs.recovery().unwrap().fast_commit_tags > 0, "the kernel logged no fast commit");
    let ours = walk_rext4(&fs, None);
    assert_no_diff(
        "kernel before the crash vs rext4's read-only replay",
        &diff_full("kernel", &want, "rext4", &comparable(&ours, true)),
    );
    drop(fs);
    let e = Fs::open_rw(&ro).err().expect("a writable open of a read-only image");
    assert!(matches!(e, Error::Incompatible(_)), "{e}");
    assert!(fs::read(&ro).unwrap() == snapshot, "the image was written");

    let mmp_clean = |img: &Path| {
        let fs = Fs::open(img).unwrap();
        let at = fs.superblock().s_mmp_block.get() * u64::from(fs.block_size());
        let b = read_block(img, at / 4096, 4096);
        let off = usize::try_from(at % 4096).unwrap();
        u32::from_le_bytes(b[off + 4..off + 8].try_into().unwrap()) == rext4::format::mmp::SEQ_CLEAN
    };
    let writable = copy(&crash, &tmp.path().join("writable"));
    {
        let fs = Fs::open_rw(&writable).unwrap();
        assert!(fs.recovery().unwrap().fast_commit_tags > 0);
        let ours = walk_rext4(&fs, None);
        assert_no_diff("writable replay", &diff_full("kernel", &want, "rext4", &comparable(&ours, true)));
        fs.unmount().unwrap();
    }
    assert_fsck_clean(&writable, "writable replay of an mmp image");
    assert!(mmp_clean(&writable));
    let recovered = copy(&crash, &tmp.path().join("recovered"));
    rext4::recover_image(&recovered).unwrap();
    assert_fsck_clean(&recovered, "recover_image of an mmp image");
    assert!(mmp_clean(&recovered));
    let ours = walk_rext4(&Fs::open(&recovered).unwrap(), None);
    assert_no_diff("recover_image", &diff_full("kernel", &want, "rext4", &comparable(&ours, true)));
}

/// A fast commit whose checksum fails, in the only fast commit there is, makes the kernel
/// refuse the journal (`EFSBADCRC`): rext4 refuses the open and writes nothing.
#[test]
fn a_corrupt_fast_commit_is_refused() {
    require_kernel!();
    let tmp = scratch();
    let img = tmp.path().join("img");
    Image::ext4("64M").args(["-O", "fast_commit", "-b", "4096"]).build(&img);
    let crash = tmp.path().join("crash");
    {
        let mut m = RwMount::new(&img, "noatime,commit=600").unwrap();
        // The transaction the mount starts cannot end in a fast commit: end it first.
        fs::write(m.path().join("first"), b"committed in full").unwrap();
        let _ = Command::new("sync").status();
        write_synced(&m.path().join("x"), b"only in a fast commit");
        let (code, text) = output(Command::new("cp").arg(&img).arg(&crash));
        assert_eq!(code, 0, "{text}");
        m.unmount();
    }
    assert!(Fs::open(&crash).unwrap().recovery().unwrap().fast_commit_tags > 0);
    // The journal superblock: s_maxlen at 0x10, s_num_fc_blks at 0x54 (0: 256).
    let jsb = read_block(&crash, journal_blocks(&crash, &[0])[0], 4096);
    let be = |o: usize| u32::from_be_bytes([jsb[o], jsb[o + 1], jsb[o + 2], jsb[o + 3]]);
    let fc = if be(0x54) == 0 { 256 } else { be(0x54) };
    let first = be(0x10) - fc + 1;
    let at = journal_blocks(&crash, &[first])[0];
    let mut b = read_block(&crash, at, 4096);
    assert_eq!(&b[..2], &[9, 0], "no fast-commit head where expected");
    b[20] ^= 0xff;
    write_at(&crash, at * 4096, &b);
    let snapshot = fs::read(&crash).unwrap();
    let e = open_err(&crash);
    assert!(matches!(e, Error::Corrupt(_)), "{e}");
    let e = rext4::recover_image(&crash).unwrap_err();
    assert!(matches!(e, Error::Corrupt(_)), "{e}");
    assert!(fs::read(&crash).unwrap() == snapshot, "a refused recovery wrote to the image");
}

/// A crash at any write of rext4's replay (the logged blocks, the fast commits, the unmount)
/// leaves an image that recovers to what the kernel showed, e2fsck-clean.
#[test]
fn a_crash_during_the_replay_loses_nothing() {
    require_kernel!();
    for name in ["names", "late"] {
        let tmp = scratch();
        let dir = tmp.path().to_path_buf();
        let (crash, model) = kernel_crash(name, &[], "32M", &dir);
        let want = comparable(&model, true);
        let bytes = fs::read(&crash).unwrap();
        let dev = Arc::new(rext4::dev::CrashDevice::new(bytes.clone()));
        let fs = Fs::from_device(dev.clone(), Options { writable: true, ..Options::default() }).unwrap();
        assert!(fs.recovery().unwrap().fast_commit_tags > 0, "{name}");
        fs.unmount().unwrap();
        drop(fs);
        let ops = dev.ops();
        let after = dir.join("after");
        let mut images = 0;
        rext4_testkit::for_each_crash_image(&ops, &bytes, 7, 1, |k, img| {
            images += 1;
            fs::write(&after, img).unwrap();
            let what = format!("{name}: crash at op {k}");
            let fs = Fs::open_with(&after, Options { writable: true, ..Options::default() })
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let got = comparable(&walk_rext4(&fs, None), true);
            fs.unmount().unwrap();
            drop(fs);
            assert_no_diff(&what, &diff_full("kernel", &want, "rext4", &got));
            assert_fsck_clean(&after, &what);
        });
        eprintln!("{name}: {images} crash images, {} flushes", rext4_testkit::flush_count(&ops));
        assert!(images > 4, "{name}: {images} crash images");
    }
}

/// Fast commits with valid checksums that name what no sound filesystem's would: refused
/// before anything is written when they name reserved inodes, metadata blocks or bad names;
/// left alone, with the rest replayed, when they name inodes not in use or non-directories
/// as parents.
#[test]
fn hostile_fast_commits() {
    use rext4::format::fast_commit::{write_area, Tag};
    require_kernel!();
    let tmp = scratch();
    let dir = tmp.path().to_path_buf();
    let (crash, _) = kernel_crash("names", &["-b", "4096"], "32M", &dir);
    let bs = 4096usize;
    let jsb = read_block(&crash, journal_blocks(&crash, &[0])[0], bs);
    let be = |o: usize| u32::from_be_bytes([jsb[o], jsb[o + 1], jsb[o + 2], jsb[o + 3]]);
    let fc = if be(0x54) == 0 { 256 } else { be(0x54) };
    let first = be(0x10) - fc + 1;
    let at = journal_blocks(&crash, &[first, first + 1]);
    assert_eq!(at[1], at[0] + 1, "fast-commit area not contiguous");
    let head = read_block(&crash, at[0], bs);
    assert_eq!(&head[..2], &[9, 0]);
    let tid = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    let (f0, d) = {
        let fs = Fs::open(&crash).unwrap();
        let d = fs.lookup(fs.root(), b"d").unwrap().ino;
        (fs.lookup(d, b"f0").unwrap().ino.0, d.0)
    };
    let with = |tags: Vec<Tag>| {
        let img = copy(&crash, &dir.join("hostile"));
        let mut all = vec![Tag::Head { tid }];
        all.extend(tags);
        all.push(Tag::Tail { tid });
        let area = write_area(&all, bs);
        assert!(area.len() <= 2 * bs);
        write_at(&img, at[0] * bs as u64, &area);
        img
    };
    let refused: Vec<(&str, Vec<Tag>)> = vec![
        ("the journal inode", vec![Tag::Inode { ino: 8, raw: vec![0; 256] }]),
        ("a reserved inode", vec![Tag::DelRange { ino: 7, lblk: 0, len: 1 }]),
        ("inode 0", vec![Tag::Link { parent: 2, ino: 0, name: b"zero".to_vec() }]),
        ("past the last inode", vec![Tag::Unlink { parent: 2, ino: u32::MAX, name: b"x".to_vec() }]),
        ("the superblock", vec![Tag::AddRange { ino: f0, lblk: 0, len: 1, pblk: 0, unwritten: false }]),
        (
            "the group descriptors",
            vec![Tag::AddRange { ino: f0, lblk: 9, len: 2, pblk: 1, unwritten: false }],
        ),
        ("past the end", vec![Tag::AddRange { ino: f0, lblk: 0, len: 8, pblk: 1 << 40, unwritten: false }]),
        ("a slash", vec![Tag::Link { parent: d, ino: f0, name: b"a/b".to_vec() }]),
        ("dot-dot", vec![Tag::Create { parent: d, ino: f0, name: b"..".to_vec() }]),
        ("a record too long", vec![Tag::Inode { ino: f0, raw: vec![0; 512] }]),
        (
            "the root made a file",
            vec![Tag::Inode { ino: 2, raw: [&0o100644u16.to_le_bytes()[..], &[0; 126]].concat() }],
        ),
        (
            "a bad i_extra_isize",
            vec![Tag::Inode { ino: f0, raw: [vec![0; 0x80], vec![0xff; 0x80]].concat() }],
        ),
        (
            "the journal's blocks",
            vec![Tag::AddRange { ino: f0, lblk: 0, len: 1, pblk: at[0], unwritten: false }],
        ),
        ("a range past 2^32", vec![Tag::DelRange { ino: f0, lblk: u32::MAX, len: 2 }]),
    ];
    for (what, tags) in refused {
        let img = with(tags);
        let before = fs::read(&img).unwrap();
        let e = open_err(&img);
        assert!(matches!(e, Error::Corrupt(_)), "{what}: {e}");
        let e = Fs::open_with(&img, Options { writable: true, ..Options::default() }).err();
        assert!(matches!(e, Some(Error::Corrupt(_))), "{what}: {e:?}");
        assert!(fs::read(&img).unwrap() == before, "{what}: a refused replay wrote to the image");
    }
    let free = 5000;
    let tolerated: Vec<(&str, Vec<Tag>)> = vec![
        (
            "a range of an inode not in use",
            vec![Tag::AddRange { ino: free, lblk: 0, len: 1, pblk: 5000, unwritten: false }],
        ),
        ("a file as parent", vec![Tag::Link { parent: f0, ino: f0, name: b"in-a-file".to_vec() }]),
        ("a free inode named", vec![Tag::Create { parent: d, ino: free, name: b"nobody".to_vec() }]),
        ("a name of another inode", vec![Tag::Unlink { parent: 2, ino: f0, name: b"d".to_vec() }]),
        ("a second name for a directory", vec![Tag::Link { parent: 2, ino: d, name: b"d-again".to_vec() }]),
    ];
    for (what, tags) in tolerated {
        let img = with(tags);
        let fs = Fs::open_with(&img, Options { writable: true, ..Options::default() })
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let mut names: Vec<Vec<u8>> = Vec::new();
        fs.readdir(fs.root(), 0, |e| {
            names.push(e.name);
            true
        })
        .unwrap();
        assert!(names.contains(&b"d".to_vec()) && !names.contains(&b"d-again".to_vec()), "{what}: {names:?}");
        fs.unmount().unwrap();
        drop(fs);
        assert_fsck_clean(&img, what);
    }
}
