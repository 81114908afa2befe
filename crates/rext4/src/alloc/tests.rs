//! Allocator tests against images made by mkfs.ext4: what is allocated and freed again leaves
//! an image e2fsck accepts, with the same counts; concurrent allocators never hand out the same
//! block or inode twice.

use crate::alloc::reserved::Pool;
use crate::test_image::{fsck_clean, mkfs_image, open_mem as open};
use std::collections::HashSet;

/// What one worker allocated: block runs and inode numbers.
type Taken = (Vec<(u64, u32)>, Vec<u32>);

fn image(args: &[&str]) -> Vec<u8> {
    mkfs_image(None, args, "64M")
}

#[test]
fn concurrent_block_and_inode_allocation_is_exclusive_and_balanced() {
    for args in [&[][..], &["-O", "^metadata_csum"][..], &["-O", "^has_journal"][..], &["-b", "1024"][..]] {
        let (fs, dev) = open(image(args));
        let before = fs.statfs().unwrap();
        let inner = &fs.inner;
        let journal = inner.journal().unwrap().clone();
        let root = inner.iget(fs.root()).unwrap();
        let results: Vec<Taken> = std::thread::scope(|s| {
            let ws: Vec<_> = (0..8)
                .map(|t| {
                    let (journal, root) = (journal.clone(), root.clone());
                    s.spawn(move || {
                        let mut blocks = Vec::new();
                        let mut inodes = Vec::new();
                        for i in 0..50u64 {
                            let h = journal.start(8).unwrap();
                            let goal = inner.sbi.first_data_block + t * 5000 + i * 7;
                            blocks.push(
                                inner.alloc_blocks(&h, goal, 1 + (i % 9) as u32, Pool::NoFail).unwrap(),
                            );
                            inodes.push(inner.alloc_inode(&h, root.ino, i % 3 == 0, None).unwrap().0);
                        }
                        (blocks, inodes)
                    })
                })
                .collect();
            ws.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let mut seen_blocks = HashSet::new();
        let mut seen_inodes = HashSet::new();
        for (blocks, inodes) in &results {
            for &(b, n) in blocks {
                for x in b..b + u64::from(n) {
                    assert!(seen_blocks.insert(x), "{args:?}: block {x} handed out twice");
                }
            }
            for &i in inodes {
                assert!(seen_inodes.insert(i), "{args:?}: inode {i} handed out twice");
                assert!(i >= inner.sbi.sb.first_ino(), "reserved inode {i} handed out");
            }
        }
        let mid = fs.statfs().unwrap();
        assert_eq!(mid.blocks_free, before.blocks_free - seen_blocks.len() as u64);
        assert_eq!(mid.files_free, before.files_free - seen_inodes.len() as u64);
        // Give everything back.
        for (blocks, inodes) in &results {
            let h = journal.start(64).unwrap();
            for (k, &(b, n)) in blocks.iter().enumerate() {
                inner.free_blocks(&h, b, u64::from(n), k % 2 == 0).unwrap();
            }
            for (k, &i) in inodes.iter().enumerate() {
                inner.free_inode(&h, crate::InodeNo(i), k % 3 == 0).unwrap();
            }
        }
        let after = fs.statfs().unwrap();
        assert_eq!((after.blocks_free, after.files_free), (before.blocks_free, before.files_free));
        fs.unmount().unwrap();
        drop(fs);
        fsck_clean(&dev.snapshot());
    }
}

#[test]
fn allocation_runs_out_with_enospc() {
    let (fs, dev) = open(image(&["-b", "4096", "-N", "64"]));
    let inner = &fs.inner;
    let journal = inner.journal().unwrap().clone();
    let mut got = Vec::new();
    loop {
        let h = journal.start(8).unwrap();
        match inner.alloc_blocks(&h, 0, 256, Pool::NoFail) {
            Ok(r) => got.push(r),
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                break;
            }
        }
    }
    assert_eq!(fs.statfs().unwrap().blocks_free, 0);
    let h = journal.start(64).unwrap();
    for (b, n) in got {
        inner.free_blocks(&h, b, u64::from(n), false).unwrap();
    }
    drop(h);
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&dev.snapshot());
}

/// A group's bitmap checksum stays right in its descriptor block after the bitmap left the
/// cache while the descriptor block stayed: a later commit of the descriptor block, for a
/// change in another group, must not bring back the checksum the bitmap had at mount.
#[test]
fn bitmap_checksums_survive_bitmap_eviction() {
    use crate::inode::write::SetAttr;
    // Eight groups sharing one descriptor block; a 1024-block log, so checkpoints come soon.
    let (fs, dev) =
        open(mkfs_image(None, &["-b", "4096", "-g", "4096", "-N", "8192", "-J", "size=4"], "128M"));
    let root = fs.root();
    let dirs: Vec<_> =
        (0..8).map(|i| fs.mkdir(root, format!("d{i}").as_bytes(), 0o755, 0, 0).unwrap().ino).collect();
    let groups: HashSet<u32> = dirs.iter().map(|d| (d.0 - 1) / fs.inner.sbi.inodes_per_group).collect();
    assert!(groups.len() > 2, "the directories went to too few groups: {groups:?}");
    let f0 = fs.create(dirs[0], b"f0", 0o644, 0, 0).unwrap().ino;
    for (i, d) in dirs.iter().enumerate().skip(1) {
        fs.create(*d, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    fs.sync().unwrap();
    // Small transactions until those above are home, so nothing pins their bitmaps.
    let mut mode = 0o600;
    while fs.commit_stats().unwrap().checkpoints < 2 {
        mode ^= 0o040;
        fs.setattr(f0, &SetAttr { mode: Some(mode), ..SetAttr::default() }).unwrap();
        fs.sync().unwrap();
    }
    // The descriptor block stays cached (as a hot block does); the bitmaps go.
    let desc = fs.inner.bcache.get(fs.inner.sbi.descriptor_block(0)).unwrap();
    fs.drop_caches();
    fs.create(dirs[0], b"late", 0o644, 0, 0).unwrap();
    fs.sync().unwrap();
    drop(desc);
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&dev.snapshot());
}

/// Files made in turn in two directories of one group keep to their own inode-table blocks
/// (each directory's next inode is sought after its last one, and past the other's run in a
/// fresh block), and a group filled that way still hands out every inode it has.
#[test]
fn directories_sharing_a_group_keep_to_their_own_table_blocks() {
    let (fs, dev) = open(image(&["-b", "4096", "-N", "2048"]));
    let ipg = fs.inner.sbi.inodes_per_group;
    let per_block = fs.inner.sbi.block_size / fs.inner.sbi.inode_size as u32;
    let root = fs.root();
    let dirs: Vec<_> =
        (0..2).map(|i| fs.mkdir(root, format!("d{i}").as_bytes(), 0o755, 0, 0).unwrap().ino).collect();
    let mut made: Vec<Vec<u32>> = vec![Vec::new(); 2];
    for i in 0..400 {
        for (d, m) in dirs.iter().zip(&mut made) {
            m.push(fs.create(*d, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino.0);
        }
    }
    let blocks = |m: &Vec<u32>| m.iter().map(|i| (i - 1) / per_block).collect::<HashSet<u32>>();
    let (a, b) = (blocks(&made[0]), blocks(&made[1]));
    let shared = a.intersection(&b).count();
    assert!(shared <= 2, "{shared} table blocks hold inodes of both directories");
    assert!(a.len() <= 400 / per_block as usize + 3, "the first directory's files span {} blocks", a.len());
    // One group: the test is about sharing within it.
    assert!(made.iter().flatten().all(|&i| (i - 1) / ipg == 0));
    // Fill the image in turn; the holes the runs left are handed out too.
    let mut n = 0;
    'fill: loop {
        for d in &dirs {
            match fs.create(*d, format!("g{n}").as_bytes(), 0o644, 0, 0) {
                Ok(_) => n += 1,
                Err(e) => {
                    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                    break 'fill;
                }
            }
        }
    }
    assert_eq!(fs.statfs().unwrap().files_free, 0, "inodes left unused after {n} more files");
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&dev.snapshot());
}

/// The records a jump past a group's used mark skips are zeroed: on a device that held other
/// data, mkfs leaves inode tables to lazy init, and e2fsck reads every record below the mark.
#[test]
fn runs_past_the_used_mark_zero_the_records_they_skip() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("a.img");
    // A device full of old data: every byte 0x5A (records that look like live inodes).
    std::fs::write(&img, vec![0x5Au8; 64 << 20]).unwrap();
    let out = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096", "-N", "2048", "-E", "lazy_itable_init=1,nodiscard"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (fs, dev) = open(std::fs::read(&img).unwrap());
    let root = fs.root();
    let dirs: Vec<_> =
        (0..3).map(|i| fs.mkdir(root, format!("d{i}").as_bytes(), 0o755, 0, 0).unwrap().ino).collect();
    for i in 0..100 {
        for d in &dirs {
            fs.create(*d, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
        }
    }
    // Some removed, so later runs find holes below the mark too.
    for i in (0..100).step_by(3) {
        fs.unlink(dirs[1], format!("f{i}").as_bytes()).unwrap();
    }
    for i in 100..150 {
        for d in &dirs {
            fs.create(*d, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
        }
    }
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&dev.snapshot());
}

/// An s_first_ino past all of group 0, with group 0 flagged INODE_UNINIT (a damaged image):
/// the allocator moves on to the next group instead of taking a bit past the bitmap's end.
#[test]
fn first_ino_past_group_zero_allocates_elsewhere() {
    // 1 KiB blocks, so 8192 bits per bitmap; 2048 inodes per group.
    let mut img = image(&["-b", "1024", "-N", "16384", "-O", "^metadata_csum,^uninit_bg"]);
    img[1024 + 0x54..1024 + 0x58].copy_from_slice(&9000u32.to_le_bytes());
    // Group 0's descriptor (block 2), bg_flags at 0x12.
    img[2048 + 0x12] |= 1;
    let (fs, _dev) = open(img);
    let inner = &fs.inner;
    let h = inner.journal().unwrap().start(8).unwrap();
    let ino = inner.alloc_inode(&h, fs.root(), false, None).unwrap();
    assert!(ino.0 > inner.sbi.inodes_per_group, "inode {ino} in group 0");
}

/// Allocations for a field narrower than the filesystem (block maps' 32-bit pointers) stay in
/// the groups that lie wholly below its limit, whatever the goal.
#[test]
fn allocation_below_a_limit_stays_in_the_groups_under_it() {
    let (fs, _dev) = open(image(&["-b", "1024", "-g", "1024", "-N", "2048"]));
    let inner = &fs.inner;
    let sbi = &inner.sbi;
    let end = sbi.group_first_block(2) + 100;
    assert_eq!(sbi.groups_below(end), 2);
    assert_eq!(sbi.groups_below(sbi.blocks_count), sbi.group_count);
    assert_eq!(sbi.groups_below(u64::MAX), sbi.group_count);
    let h = inner.journal().unwrap().start(8).unwrap();
    for goal in [0, sbi.group_first_block(5), sbi.blocks_count - 1] {
        let (b, n) = inner.alloc_blocks_below(&h, goal, 8, Pool::NoFail, end).unwrap();
        assert!(b + u64::from(n) <= sbi.group_first_block(2), "blocks {b}+{n} for goal {goal}");
    }
}

#[test]
fn busy_ranges_stay_sorted_merge_and_release() {
    use super::group::BusyList;
    let mut b = BusyList::default();
    b.push(100, 10, 5);
    b.push(110, 5, 5); // after the first, same transaction: merged
    b.push(90, 10, 5); // before it: merged
    b.push(10, 4, 6);
    b.push(200, 8, 4); // an older transaction
    b.push(115, 5, 7); // adjacent but another transaction: kept apart
    let v: Vec<_> = b.iter().copied().collect();
    assert_eq!(v, [(10, 4, 6), (90, 25, 5), (115, 5, 7), (200, 8, 4)]);
    assert_eq!(b.next_after(0), Some((10, 14)));
    assert_eq!(b.next_after(14), Some((90, 115)));
    assert_eq!(b.next_after(114), Some((90, 115)));
    assert_eq!(b.next_after(115), Some((115, 120)));
    assert_eq!(b.next_after(208), None);
    // Nothing committed up to 3; up to 5 drops transactions 4 and 5.
    b.release(3);
    assert_eq!(b.iter().count(), 4);
    b.release(5);
    let v: Vec<_> = b.iter().copied().collect();
    assert_eq!(v, [(10, 4, 6), (115, 5, 7)]);
    b.release(7);
    assert!(b.is_empty());
}

/// Blocks freed by a transaction that has not committed are not handed out again, however
/// many separate ranges the frees left (every other block of a run here), and are after it
/// commits.
#[test]
fn freed_blocks_wait_for_their_commit() {
    let (fs, dev) = open(image(&[]));
    let inner = &fs.inner;
    let journal = inner.journal().unwrap().clone();
    let h = journal.start(8).unwrap();
    let (start, n) = inner.alloc_blocks(&h, 0, 512, Pool::NoFail).unwrap();
    assert_eq!(n, 512);
    drop(h);
    journal.sync().unwrap();
    let h = journal.start(64).unwrap();
    for b in (start..start + 512).step_by(2) {
        inner.free_blocks(&h, b, 1, false).unwrap();
    }
    // 256 busy ranges: no allocation with the run as its goal may land in them.
    for k in 0..40 {
        let (b, got) = inner.alloc_blocks(&h, start + k, 1 + (k % 3) as u32, Pool::NoFail).unwrap();
        assert!(b + u64::from(got) <= start || b >= start + 512, "busy block {b} handed out");
        inner.free_blocks(&h, b, u64::from(got), false).unwrap();
    }
    drop(h);
    journal.sync().unwrap();
    let h = journal.start(8).unwrap();
    let (b, _) = inner.alloc_blocks(&h, start, 1, Pool::NoFail).unwrap();
    assert_eq!(b, start, "committed frees are free again");
    inner.free_blocks(&h, b, 1, false).unwrap();
    drop(h);
    // The blocks no file owns go back (the odd ones were never freed).
    let h = journal.start(64).unwrap();
    for b in (start + 1..start + 512).step_by(2) {
        inner.free_blocks(&h, b, 1, false).unwrap();
    }
    drop(h);
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&dev.snapshot());
}
