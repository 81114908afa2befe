//! Splits on a full disk: a split that runs up the tree takes all its new blocks first, so
//! running out of space part way leaves the tree as it was.

use super::{Ext, LBLK_END};
use crate::alloc::reserved::Pool;
use crate::dev::MemDevice;
use crate::test_image::{fsck_clean, mkfs_image, open_mem as open};
use crate::{Fs, InodeNo, FALLOC_FL_INSERT_RANGE};
use std::sync::Arc;

/// Leaves of a depth-1 tree on 1 KiB blocks hold 84 extents; the root in `i_block` 4.
const ROOT_FULL: u64 = 4 * 84;

/// A file whose tree is full to the root: unwritten extents of 3 blocks with a hole after
/// each, appended in order, so the leaves fill up (a split at the end moves only the last
/// extent) and the root holds 4 of them.
fn full_tree() -> (Fs, Arc<MemDevice>, InodeNo) {
    let (fs, dev) = open(mkfs_image(None, &["-b", "1024"], "16M"));
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    for k in 0..ROOT_FULL {
        fs.fallocate(f, 0, k * 4096, 3072).unwrap();
    }
    assert_eq!(tree_blocks(&fs, f), ROOT_FULL * 3 + 4, "4 full leaves under the root");
    (fs, dev, f)
}

fn tree_blocks(fs: &Fs, f: InodeNo) -> u64 {
    let inode = fs.inner.iget_by_number(f).unwrap();
    let raw = inode.raw();
    crate::inode::write::raw_blocks(&raw) / 2
}

fn extents(fs: &Fs, f: InodeNo) -> Vec<Ext> {
    let inode = fs.inner.iget_by_number(f).unwrap();
    let raw = inode.raw();
    fs.inner.ext_collect(&inode, &raw, 0, LBLK_END).unwrap()
}

fn free(fs: &Fs) -> u64 {
    fs.inner.counters.free_blocks.sum_positive()
}

/// Takes every free block but `left`, owned by nothing until [`release`].
fn hold_all_but(fs: &Fs, left: u64) -> Vec<(u64, u32)> {
    let h = fs.inner.journal().unwrap().start(64).unwrap();
    let mut held = Vec::new();
    while free(fs) > left {
        let want = u32::try_from(free(fs) - left).unwrap_or(u32::MAX);
        held.push(fs.inner.alloc_blocks(&h, 0, want, Pool::NoFail).unwrap());
    }
    h.stop();
    held
}

fn release(fs: Fs, dev: &MemDevice, held: Vec<(u64, u32)>) {
    let h = fs.inner.journal().unwrap().start(64).unwrap();
    for (blk, n) in held {
        fs.inner.free_blocks(&h, blk, u64::from(n), false).unwrap();
    }
    h.stop();
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&dev.snapshot());
}

#[test]
fn a_split_that_reaches_the_root_needs_all_its_blocks_or_changes_nothing() {
    // With one free block the leaf could split but the root could not move down; with
    // two, both happen.
    for free_left in [1u64, 2] {
        let (fs, dev, f) = full_tree();
        let held = hold_all_but(&fs, free_left);
        let before = extents(&fs, f);
        let last = *before.last().unwrap();
        {
            let inner = &fs.inner;
            let inode = inner.iget_by_number(f).unwrap();
            let h = inner.journal().unwrap().start(64).unwrap();
            let _d = inode.data_sem.write();
            let mut raw = inode.raw_mut();
            // Writing the middle block of the last extent splits it in three: the last leaf
            // overflows, and so does the root.
            let mid = last.lblk + 1..last.lblk + 2;
            let r = inner.ext_remap(&h, &inode, &mut raw, mid, Some((last.pblk + 1, false)));
            if free_left == 1 {
                assert!(matches!(r, Err(crate::Error::NoSpace)), "{r:?}");
            } else {
                r.unwrap();
            }
            inner.mark_inode_dirty(&h, &inode, &mut raw).unwrap();
        }
        let after = extents(&fs, f);
        if free_left == 1 {
            assert!(
                after == before,
                "the tree is as it was: {} extents, {} before",
                after.len(),
                before.len()
            );
            assert_eq!(tree_blocks(&fs, f), ROOT_FULL * 3 + 4);
            assert_eq!(free(&fs), 1, "the leaf's block was given back");
        } else {
            assert_eq!(after.len(), before.len() + 2);
            assert_eq!(tree_blocks(&fs, f), ROOT_FULL * 3 + 4 + 2, "a new leaf and the root's new block");
            assert_eq!(free(&fs), 0);
        }
        release(fs, &dev, held);
    }
}

#[test]
fn an_insert_range_without_room_for_its_split_leaves_the_file_as_it_was() {
    for free_left in [1u64, 2] {
        let (fs, dev, f) = full_tree();
        let size = fs.getattr(f).unwrap().size;
        let held = hold_all_but(&fs, free_left);
        let before = extents(&fs, f);
        let last = *before.last().unwrap();
        // Inside the last extent: its right part needs an entry of its own in the full leaf.
        let r = fs.fallocate(f, FALLOC_FL_INSERT_RANGE, (last.lblk + 1) * 1024, 1024);
        let after = extents(&fs, f);
        if free_left == 1 {
            assert!(matches!(r, Err(crate::Error::NoSpace)), "{r:?}");
            assert!(
                after == before,
                "the map is as it was: {} extents, {} before",
                after.len(),
                before.len()
            );
            assert_eq!(fs.getattr(f).unwrap().size, size);
        } else {
            r.unwrap();
            assert_eq!(after.len(), before.len() + 1);
            assert_eq!(fs.getattr(f).unwrap().size, size + 1024);
        }
        release(fs, &dev, held);
    }
}
