//! Checks several test files run on an engine handle: resumed readdir, concurrent walks.

use crate::diff::{assert_no_diff, diff_full};
use crate::walk::{walk_rext4, Walk};
use rext4::Fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Reads a directory with the inode-level `readdir`, stopping after every `step` entries and
/// resuming at the last entry's `next`: the result must be the same as one uninterrupted
/// pass, without duplicates, and include `.` and `..`.
pub fn readdir_resume(fs: &Fs, path: &str, step: usize) {
    let ino = fs.resolve(path, true).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut all = Vec::new();
    fs.readdir(ino, 0, |e| {
        all.push((e.name.clone(), e.ino));
        true
    })
    .unwrap_or_else(|e| panic!("readdir {path}: {e}"));
    let mut resumed = Vec::new();
    let mut pos = 0;
    let mut calls = 0;
    loop {
        let mut got = 0;
        fs.readdir(ino, pos, |e| {
            pos = e.next;
            resumed.push((e.name.clone(), e.ino));
            got += 1;
            got < step
        })
        .unwrap_or_else(|e| panic!("readdir {path} from {pos}: {e}"));
        calls += 1;
        if got < step || calls > all.len() + 5 {
            break;
        }
    }
    assert!(
        all.iter().any(|e| e.0 == b".") && all.iter().any(|e| e.0 == b".."),
        "{path}: readdir lacks . or .."
    );
    let mut names: Vec<_> = all.iter().map(|e| &e.0).collect();
    names.sort();
    let n = names.len();
    names.dedup();
    assert_eq!(names.len(), n, "{path}: readdir returned duplicate names");
    assert!(
        resumed == all,
        "{path}: readdir resumed every {step} entries differs ({} vs {} entries)",
        resumed.len(),
        all.len()
    );
}

/// Walks the image from `threads` threads at once (half share `fs`, half open their own
/// handle with tiny caches), each in its own order, while another thread keeps dropping the
/// shared caches; every walk must equal `expected`.
pub fn concurrent_walks(img: &Path, fs: &Fs, expected: &Walk, threads: u64) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let dropper = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                fs.drop_caches();
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
        });
        let walkers: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let own;
                    let f = if t % 2 == 0 {
                        fs
                    } else {
                        let opts =
                            rext4::Options { cache_bytes: 256 << 10, inode_cache: 64, ..Default::default() };
                        own = Fs::open_with(img, opts).expect("open image again");
                        &own
                    };
                    walk_rext4(f, Some(t + 1))
                })
            })
            .collect();
        let results: Vec<_> = walkers.into_iter().map(|h| h.join()).collect();
        stop.store(true, Ordering::Relaxed);
        dropper.join().expect("cache dropper panicked");
        for (t, r) in results.into_iter().enumerate() {
            match r {
                Ok(w) => assert_no_diff(
                    &format!("thread {t} vs single-threaded walk"),
                    &diff_full("single", expected, "thread", &w),
                ),
                Err(_) => panic!("walker thread {t} panicked"),
            }
        }
    });
}

/// Unlinks every entry of directory `dir` (which holds files only) through the engine.
pub fn unlink_all(fs: &Fs, dir: rext4::InodeNo) {
    let mut names = Vec::new();
    fs.readdir(dir, 0, |e| {
        if e.name != b"." && e.name != b".." {
            names.push(e.name.to_vec());
        }
        true
    })
    .unwrap();
    for n in names {
        fs.unlink(dir, &n).unwrap();
    }
}
