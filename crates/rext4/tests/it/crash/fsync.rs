//! What fsync must make durable even when no commit carries it.

use super::*;

/// A recording device over a fresh image whose `/f0` holds 8 KiB of `a`, written and fsynced.
fn f0_written_and_fsynced(dir: &Path) -> (Arc<CrashDevice>, Fs, rext4::InodeNo) {
    let dev = Arc::new(CrashDevice::new(make_image(dir, &[])));
    let fs = open_rw(&dev);
    let ino = fs.resolve("/f0", false).unwrap();
    fs.write(ino, 0, &[b'a'; 8192]).unwrap();
    fs.fsync(ino).unwrap();
    (dev, fs, ino)
}

/// The image as of the device's last flush: what a crash right now would leave.
fn flushed_fs(dev: &CrashDevice, dir: &Path) -> Fs {
    let ops = dev.ops();
    let last_flush = ops.iter().rposition(|o| matches!(o, rext4::dev::Op::Flush)).unwrap();
    let mut img = dev.initial().to_vec();
    rext4::dev::apply_ops(&mut img, &ops, 0, last_flush, |_| true);
    let path = dir.join("flushed.img");
    std::fs::write(&path, &img).unwrap();
    Fs::open(&path).unwrap()
}

#[test]
fn fsync_after_eviction_still_commits() {
    // The inode's last change (and an overwrite in place) must reach the device even when its
    // in-memory copy was evicted between the change and the fsync.
    let dir = tmpdir();
    let (dev, fs, ino) = f0_written_and_fsynced(dir.path());
    for round in 0..10u8 {
        let mode = 0o600 + u16::from(round);
        fs.setattr(ino, &rext4::SetAttr { mode: Some(mode), ..Default::default() }).unwrap();
        let patch = [b'A' + round; 16];
        fs.write(ino, 200 + u64::from(round) * 16, &patch).unwrap();
        fs.drop_caches();
        fs.fsync(ino).unwrap();
        let got = flushed_fs(&dev, dir.path());
        let a = got.getattr(got.resolve("/f0", false).unwrap()).unwrap();
        assert_eq!(a.perm(), mode, "round {round}: fsync'ed chmod lost after eviction");
        let data = got.read_file("/f0").unwrap();
        let at = 200 + usize::from(round) * 16;
        assert_eq!(&data[at..at + 16], &patch, "round {round}: fsync'ed overwrite lost after eviction");
    }
    fs.unmount().unwrap();
    assert_snapshot_clean(&dev, dir.path(), "after the evicted fsyncs");
}

/// An overwrite in place changes no metadata within a clock tick, so no commit carries it:
/// fsync must still flush it. A crash right after fsync returns keeps the new bytes.
#[test]
fn fsync_flushes_overwrites_in_place() {
    let dir = tmpdir();
    let (dev, fs, ino) = f0_written_and_fsynced(dir.path());
    for round in 0..20u8 {
        let patch = [b'A' + round; 16];
        fs.write(ino, 100 + u64::from(round) * 16, &patch).unwrap();
        fs.fsync(ino).unwrap();
        // Only what the device was told to flush survives.
        let got = flushed_fs(&dev, dir.path()).read_file("/f0").unwrap();
        let at = 100 + usize::from(round) * 16;
        assert_eq!(&got[at..at + 16], &patch, "round {round}: fsync'ed overwrite lost");
    }
    fs.unmount().unwrap();
    assert_snapshot_clean(&dev, dir.path(), "after the overwrites");
}
