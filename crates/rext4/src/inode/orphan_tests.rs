//! The crate-internal orphan API for truncates that span several transactions: a record made
//! with `orphan_add` and not yet removed by `orphan_del` makes the next writable open truncate
//! the inode to its `i_size`.

use crate::test_image::{fsck_clean, mkfs_image, open_mem as open};

/// Drops the last reference to the removed `ino`: its record goes, its `blocks` and the
/// inode are free again against `before`, and the closed image is clean.
fn release_last(
    fs: crate::Fs,
    dev: &crate::dev::MemDevice,
    ino: crate::InodeNo,
    before: &crate::StatFs,
    blocks: u64,
) {
    fs.release(ino).unwrap();
    assert!(fs.orphans().is_empty());
    let after = fs.statfs().unwrap();
    assert_eq!((after.blocks_free, after.files_free), (before.blocks_free + blocks, before.files_free + 1));
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&dev.snapshot());
}

fn image(args: &[&str]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("big"), vec![7u8; 300 << 10]).unwrap();
    let mut all = vec!["-b", "1024"];
    all.extend_from_slice(args);
    mkfs_image(Some(&src), &all, "16M")
}

#[test]
fn truncate_records_survive_a_crash_and_are_finished_at_open() {
    for args in [&[][..], &["-O", "orphan_file"][..]] {
        let (fs, dev) = open(image(args));
        let inner = &fs.inner;
        let ino = fs.resolve("/big", false).unwrap();
        let inode = inner.iget(ino).unwrap();
        let blocks = fs.getattr(ino).unwrap().blocks / 2;
        let before = fs.statfs().unwrap();
        // The first transaction of a truncate to zero: the new size and the record.
        {
            let _l = inode.op_lock.lock();
            let h = inner.journal().unwrap().start(8).unwrap();
            inner.orphan_add(&h, &inode).unwrap();
            inner.orphan_add(&h, &inode).unwrap(); // a second add is a no-op
            let mut raw = inode.raw_mut();
            crate::inode::write::raw_set_size(&mut raw, 0);
            inner.mark_inode_dirty(&h, &inode, &mut raw).unwrap();
        }
        assert_eq!(fs.orphans(), vec![ino], "{args:?}");
        fs.sync().unwrap();
        // A crash now: the next open finishes the truncate.
        let crashed = dev.snapshot();
        let (fs2, dev2) = open(crashed);
        assert_eq!(fs2.orphans_recovered(), (0, 1), "{args:?}");
        let a = fs2.getattr(ino).unwrap();
        assert_eq!((a.size, a.blocks, a.nlink), (0, 0, 1));
        assert_eq!(fs2.statfs().unwrap().blocks_free, before.blocks_free + blocks);
        fs2.unmount().unwrap();
        drop(fs2);
        fsck_clean(&dev2.snapshot());

        // Without a crash the truncate's last transaction removes the record; a record made
        // by an unlink of a held inode is not the truncate's to remove.
        {
            let _l = inode.op_lock.lock();
            let h = inner.journal().unwrap().start(8).unwrap();
            inner.free_data_blocks(&h, &inode).unwrap();
            inner.orphan_del(&h, &inode).unwrap();
        }
        assert!(fs.orphans().is_empty());
        fs.hold(ino).unwrap();
        fs.unlink(fs.root(), b"big").unwrap();
        {
            let _l = inode.op_lock.lock();
            let h = inner.journal().unwrap().start(8).unwrap();
            inner.orphan_add(&h, &inode).unwrap();
            inner.orphan_del(&h, &inode).unwrap();
        }
        assert_eq!(fs.orphans(), vec![ino], "{args:?}: the unlink's record stays");
        release_last(fs, &dev, ino, &before, blocks);
    }
}

/// `Fs::free_unlinked_data`: a held file whose last link went loses its blocks at once and
/// keeps its orphan record until released; a crash in between leaves recovery to free the
/// inode; a linked file is left alone.
#[test]
fn unlinked_data_goes_before_the_inode() {
    for args in [&[][..], &["-O", "orphan_file"][..], &["-O", "^extent,^64bit"][..]] {
        let (fs, dev) = open(image(args));
        let ino = fs.resolve("/big", false).unwrap();
        let blocks = fs.getattr(ino).unwrap().blocks / 2;
        let before = fs.statfs().unwrap();
        // Linked: nothing happens.
        fs.hold(ino).unwrap();
        fs.free_unlinked_data(ino).unwrap();
        assert_eq!(fs.getattr(ino).unwrap().size, 300 << 10, "{args:?}");
        fs.unlink(fs.root(), b"big").unwrap();
        assert_eq!(fs.statfs().unwrap().blocks_free, before.blocks_free, "{args:?}");
        fs.free_unlinked_data(ino).unwrap();
        let mid = fs.statfs().unwrap();
        assert_eq!(mid.blocks_free, before.blocks_free + blocks, "{args:?}: data freed");
        assert_eq!(mid.files_free, before.files_free, "{args:?}: the inode stays");
        assert_eq!(fs.orphans(), vec![ino], "{args:?}");
        assert_eq!(fs.getattr(ino).unwrap().blocks, 0);
        // A crash now: recovery frees the inode.
        fs.sync().unwrap();
        let (fs2, dev2) = open(dev.snapshot());
        assert_eq!(fs2.orphans_recovered(), (1, 0), "{args:?}");
        assert_eq!(fs2.statfs().unwrap().files_free, before.files_free + 1);
        fs2.unmount().unwrap();
        drop(fs2);
        fsck_clean(&dev2.snapshot());
        // Without one, the release frees it.
        release_last(fs, &dev, ino, &before, blocks);
    }
}
