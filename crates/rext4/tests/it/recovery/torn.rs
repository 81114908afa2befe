//! Torn and corrupt transactions: skipped where the kernel skips them.

use super::*;

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
