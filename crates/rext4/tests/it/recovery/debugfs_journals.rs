//! Journals written by debugfs, replayed by rext4 and by e2fsck to the same blocks.

use super::*;

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
        assert_no_diff(
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
        assert_no_diff(
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
        assert_no_diff(
            name,
            &diff_full("e2fsck", &walk_rext4(&fs_theirs, None), "rext4", &walk_rext4(&fs_ours, None)),
        );

        // The kernel reads what rext4 recovered as rext4 does.
        if kernel_can_mount() {
            let m = KernelMount::ro(&ours).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_no_diff(
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
    assert_no_diff(
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
    Image::ext4("16M").block_size(4096).features("^metadata_csum,^64bit").from_dir(&src).build(&img);
    let data = dir.path().join("data");
    fs::write(&data, vec![0u8; 4096]).unwrap();
    debugfs(&img, &format!("jo -c\njw -b 3000 -r 3001 {}\njc\n", data.display()), true);
    let e = open_err(&img);
    assert_eq!(e.errno(), libc::EUCLEAN, "{e}");
    let text = e2fsck_replay(&img);
    assert!(text.contains("transaction 1 was corrupt"), "e2fsck:\n{text}");
}
