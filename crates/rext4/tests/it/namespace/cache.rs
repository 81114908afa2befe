//! Names and inodes through cache evictions, reloads and racing removals.

use super::*;

/// A new image opened with caches of 16 inodes and 64 KiB of blocks, and a directory `d` in
/// it: every test of eviction works on many more.
fn tiny_caches(dir: &Path, name: &str) -> (PathBuf, Fs, rext4::InodeNo) {
    let img = mkfs(dir, name, &[]);
    let opts = Options { writable: true, inode_cache: 16, cache_bytes: 64 << 10, ..Options::default() };
    let fs = Fs::open_with(&img, opts).unwrap();
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    (img, fs, d)
}

/// New inodes beyond the group's never-used mark stay readable after the inode cache forgets
/// them (their group's live `itable_unused`, not the one read at open, decides).
#[test]
fn new_inodes_survive_cache_eviction() {
    let dir = tempfile::tempdir().unwrap();
    let (img, fs, d) = tiny_caches(dir.path(), "evict");
    for i in 0..2000 {
        fs.create(d, format!("f{i}").as_bytes(), 0o644, 7, 7).unwrap();
    }
    fs.drop_caches();
    for i in 0..2000 {
        assert_eq!(fs.lookup(d, format!("f{i}").as_bytes()).unwrap().uid, 7, "f{i}");
    }
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&img);
}

/// A cached name whose inode was evicted and loaded again gives the new copy, with changes
/// made through it, never the evicted one (whose memory may outlive the eviction a while).
#[test]
fn cached_names_follow_reloaded_inodes() {
    let dir = tempfile::tempdir().unwrap();
    let (img, fs, d) = tiny_caches(dir.path(), "relink");
    let files: Vec<_> =
        (0..200).map(|i| fs.create(d, format!("f{i}").as_bytes(), 0o644, 7, 7).unwrap().ino).collect();
    for round in 0..3u16 {
        fs.drop_caches();
        for (i, &ino) in files.iter().enumerate() {
            let mode = 0o600 | round << 3 | (i as u16 & 7);
            fs.setattr(ino, &rext4::SetAttr { mode: Some(mode), ..Default::default() }).unwrap();
            let a = fs.lookup(d, format!("f{i}").as_bytes()).unwrap();
            assert_eq!((a.ino, a.mode & 0o7777), (ino, mode), "f{i}, round {round}");
        }
    }
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&img);
}

/// Lookups racing with unlink and re-create of the same name never see a removed inode (the
/// name cache must not keep what a removal took away).
#[test]
fn lookups_racing_removals_see_only_live_inodes() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "race", &[]);
    let fs = rw(&img);
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..3 {
            let (fs, stop) = (fs.clone(), &stop);
            s.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for n in [&b"x"[..], b"y"] {
                        match fs.lookup(d, n) {
                            Ok(a) => assert_eq!(a.kind, FileType::RegularFile),
                            Err(e) => assert_eq!(e.errno(), 2, "lookup during removal: {e}"),
                        }
                    }
                }
            });
        }
        for i in 0..3000u32 {
            let n: &[u8] = if i % 2 == 0 { b"x" } else { b"y" };
            fs.create(d, n, 0o644, i, 0).unwrap();
            fs.unlink(d, n).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&img);
}

/// With an inode cache far smaller than the tree, lookups keep following names to inodes the
/// cache evicts and reloads (relinking the names) while other threads remove and re-create the
/// same names: a lookup sees only live inodes, and afterwards every name gives the inode it
/// names last, every removed name none.
#[test]
fn relinked_names_race_removals_and_evictions() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let dir = tempfile::tempdir().unwrap();
    let (img, fs, d) = tiny_caches(dir.path(), "relink-race");
    let names: Vec<Vec<u8>> = (0..64).map(|i| format!("n{i}").into_bytes()).collect();
    let stop = AtomicBool::new(false);
    let last: Vec<_> = std::thread::scope(|s| {
        for t in 0..2 {
            let (fs, stop, names) = (fs.clone(), &stop, &names);
            s.spawn(move || {
                while !stop.load(Relaxed) {
                    for n in names.iter().skip(t) {
                        // A file found may lose its name before its attributes are read
                        // (nlink 0), as with the kernel; an error other than ENOENT is a name
                        // left to an inode freed.
                        match fs.lookup(d, n) {
                            Ok(a) => assert_eq!(a.kind, FileType::RegularFile),
                            Err(e) => assert_eq!(e.errno(), 2, "lookup during removal: {e}"),
                        }
                    }
                }
            });
        }
        {
            let (fs, stop) = (fs.clone(), &stop);
            s.spawn(move || {
                while !stop.load(Relaxed) {
                    fs.drop_caches();
                    std::thread::yield_now();
                }
            });
        }
        // Stops the other threads however this one ends (a failed unwrap must not hang).
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Relaxed);
            }
        }
        let _stop = Stop(&stop);
        let mut last = vec![None; names.len()];
        for round in 0..999u32 {
            for (i, n) in names.iter().enumerate() {
                if last[i].is_some() {
                    fs.unlink(d, n).unwrap();
                }
                last[i] =
                    (round % 3 != 2 || i % 2 == 0).then(|| fs.create(d, n, 0o644, round, 0).unwrap().ino);
            }
        }
        last
    });
    for (n, want) in names.iter().zip(&last) {
        assert_eq!(fs.lookup(d, n).ok().map(|a| a.ino), *want, "{}", String::from_utf8_lossy(n));
    }
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&img);
}
