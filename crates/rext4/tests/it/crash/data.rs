//! File data (`data=ordered`) across crashes.

use super::*;
use rext4::SetAttr;

/// File data (`data=ordered`): files that are only appended to (some of them into space
/// preallocated past their end) must, after any crash, hold their own bytes over their whole
/// size (data reaches the disk before the metadata that makes it reachable) and at least what
/// was fsync'ed; files that are overwritten, truncated,
/// punched and zeroed must never show another file's bytes (freed blocks are not reused
/// before the freeing transaction commits).
struct DataModel {
    /// (log position when fsync returned, file, size it made durable) for append-only files.
    durable: Vec<(usize, usize, u64)>,
}

impl Durable for DataModel {
    fn fsyncs(&self) -> usize {
        self.durable.len()
    }
}

const DATA_FILES: usize = 12;
const APPEND_FILES: usize = 6;

fn tag(f: usize) -> u8 {
    0xA0 + f as u8
}

fn data_workload(dev: &Arc<CrashDevice>, rounds: usize, seed: u64) -> DataModel {
    data_workload_with(dev, rounds, seed, true, open_rw(dev), "")
}

/// The data workload for block-mapped files: of fallocate, only holes are punched there.
fn data_workload_no_falloc(dev: &Arc<CrashDevice>, rounds: usize, seed: u64) -> DataModel {
    data_workload_with(dev, rounds, seed, false, open_rw(dev), "")
}

/// The data workload with delayed writes written back all along, between and during the
/// commits: the flusher runs every few milliseconds, and 512 KiB of dirty pages make writers
/// write their files back (data/writeback.rs).
fn data_workload_writeback(dev: &Arc<CrashDevice>, rounds: usize, seed: u64) -> DataModel {
    let opts = Options {
        writable: true,
        commit_interval: Duration::from_millis(7),
        page_cache_bytes: 1 << 20,
        dirty_expire: Duration::from_millis(3),
        ..Options::default()
    };
    data_workload_with(dev, rounds, seed, true, Fs::from_device(dev.clone(), opts).unwrap(), "")
}

/// Without delayed allocation: every write allocates in its own handle.
fn data_workload_nodelalloc(dev: &Arc<CrashDevice>, rounds: usize, seed: u64) -> DataModel {
    let opts = Options {
        writable: true,
        commit_interval: Duration::from_secs(3600),
        delalloc: false,
        ..Options::default()
    };
    data_workload_with(dev, rounds, seed, true, Fs::from_device(dev.clone(), opts).unwrap(), "")
}

/// The key of the encrypted workload's directory.
fn crash_key() -> rext4::EncryptionKey {
    rext4::EncryptionKey::new(vec![0x3c; 64]).unwrap()
}

/// The data workload in an encrypted directory: its files are made there (each with its own
/// context and key) and committed, then written as the others are, every partial block a
/// read-modify-write of an encrypted one.
fn data_workload_encrypted(dev: &Arc<CrashDevice>, rounds: usize, seed: u64) -> DataModel {
    let opts = Options {
        writable: true,
        commit_interval: Duration::from_secs(3600),
        encryption_keys: vec![crash_key()],
        ..Options::default()
    };
    let fs = Fs::from_device(dev.clone(), opts).unwrap();
    let enc = fs.mkdir(fs.root(), b"enc", 0o755, 0, 0).unwrap().ino;
    fs.set_encryption_policy(enc, &crash_key(), 32).unwrap();
    for f in 0..DATA_FILES {
        fs.create(enc, format!("f{f}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    fs.sync().unwrap();
    data_workload_with(dev, rounds, seed, true, fs, "/enc")
}

/// The data workload on the files `f0`.. of directory `dir` ("" for the root).
fn data_workload_with(
    dev: &Arc<CrashDevice>,
    rounds: usize,
    seed: u64,
    falloc: bool,
    fs: Fs,
    dir: &str,
) -> DataModel {
    let mut rng = Rng(seed);
    let inos: Vec<_> = (0..DATA_FILES).map(|i| fs.resolve(format!("{dir}/f{i}"), false).unwrap()).collect();
    // Held open, as a program's files are: appends then take blocks from reserves
    // (alloc/prealloc.rs), which must leave nothing behind across a crash.
    for &ino in &inos {
        fs.hold(ino).unwrap();
    }
    for (f, &ino) in inos.iter().enumerate() {
        fs.setattr(ino, &SetAttr { size: Some(0), ..SetAttr::default() }).unwrap();
        fs.write(ino, 0, &[tag(f); 100]).unwrap();
    }
    let mut sizes = [100u64; DATA_FILES];
    let mut durable = Vec::new();
    for _ in 0..rounds {
        for _ in 0..(rng.next() % 12 + 1) {
            let f = (rng.next() % DATA_FILES as u64) as usize;
            let len = rng.next() % 9000 + 1;
            let buf = vec![tag(f); len as usize];
            if f < APPEND_FILES {
                if sizes[f] <= 150_000 {
                    if falloc && rng.next().is_multiple_of(4) {
                        // Space set aside past the end first, as a log writer does: the
                        // appends then land in unwritten extents (delayed, converted at
                        // writeback) and must be as durable as appends into holes.
                        let ahead = (rng.next() % 16 + 1) * 4096;
                        fs.fallocate(inos[f], rext4::FALLOC_FL_KEEP_SIZE, sizes[f], ahead).unwrap();
                    }
                    fs.write(inos[f], sizes[f], &buf).unwrap();
                    sizes[f] += len;
                }
                continue;
            }
            let off = rng.next() % 120_000;
            let ino = inos[f];
            match rng.next() % if falloc { 6 } else { 4 } {
                0 | 1 => {
                    fs.write(ino, off, &buf).unwrap();
                }
                2 => {
                    fs.setattr(ino, &SetAttr { size: Some(off / 3), ..SetAttr::default() }).unwrap();
                }
                3 => fs
                    .fallocate(ino, rext4::FALLOC_FL_PUNCH_HOLE | rext4::FALLOC_FL_KEEP_SIZE, off, len * 3)
                    .unwrap(),
                4 => fs.fallocate(ino, rext4::FALLOC_FL_ZERO_RANGE, off, len).unwrap(),
                _ => fs.fallocate(ino, 0, off, len * 2).unwrap(),
            }
        }
        // A file that lives for a moment: with delayed allocation its blocks are never
        // chosen, unless writeback catches it first.
        let tmp = fs.create(fs.root(), b"tmp", 0o644, 0, 0).unwrap().ino;
        fs.write(tmp, 0, &vec![0x5A; (rng.next() % 20_000) as usize + 1]).unwrap();
        fs.unlink(fs.root(), b"tmp").unwrap();
        let f = (rng.next() % APPEND_FILES as u64) as usize;
        fs.fsync(inos[f]).unwrap();
        durable.push((dev.position(), f, sizes[f]));
    }
    for &ino in &inos {
        fs.release(ino).unwrap();
    }
    fs.unmount().unwrap();
    DataModel { durable }
}

fn check_data(img: &Path, model: &DataModel, pos: usize, how: &str) {
    let fs = Fs::open(img).unwrap_or_else(|e| panic!("{how}: open after recovery: {e}"));
    check_data_in(&fs, "", model, pos, how);
}

/// [`check_data`] of the encrypted workload, read with its key.
fn check_data_encrypted(img: &Path, model: &DataModel, pos: usize, how: &str) {
    let opts = Options { encryption_keys: vec![crash_key()], ..Options::default() };
    let fs = Fs::open_with(img, opts).unwrap_or_else(|e| panic!("{how}: open after recovery: {e}"));
    check_data_in(&fs, "/enc", model, pos, how);
}

fn check_data_in(fs: &Fs, dir: &str, model: &DataModel, pos: usize, how: &str) {
    for f in 0..DATA_FILES {
        let synced = model.durable.iter().any(|&(p, df, _)| df == f && p <= pos);
        let data = match fs.read_file(format!("{dir}/f{f}")) {
            // Not made yet at this point of the run (the encrypted workload makes its files).
            Err(rext4::Error::NotFound) if !dir.is_empty() && !synced => continue,
            r => r.unwrap_or_else(|e| panic!("{how}: read {dir}/f{f}: {e}")),
        };
        if data == b"x" && !synced {
            continue; // as made by mkfs: nothing committed yet
        }
        if let Some(b) = data.iter().position(|&b| b != 0 && b != tag(f)) {
            panic!("{how}: f{f} shows a byte {:#x} at {b} that it never held", data[b]);
        }
        if f < APPEND_FILES {
            if let Some(z) = data.iter().position(|&b| b != tag(f)) {
                panic!(
                    "{how}: append-only f{f} has a zero at {z} of {}: data lost behind its size",
                    data.len()
                );
            }
            for &(p, df, size) in &model.durable {
                if df == f && p <= pos {
                    assert!(
                        data.len() as u64 >= size,
                        "{how}: f{f} lost fsync'ed size {size} (has {})",
                        data.len()
                    );
                }
            }
        }
    }
}

#[test]
fn crash_file_data() {
    run_with("data", &[], 4, data_workload, check_data);
}

/// Delayed writes written back at every moment (flusher, dirty limit, commits every few
/// milliseconds): a crash at any flush keeps what was fsync'ed, and no file shows another's
/// bytes or data that was never written behind its size.
#[test]
fn crash_file_data_writeback_all_along() {
    run_with("data-writeback", &[], 7, data_workload_writeback, check_data);
}

#[test]
fn crash_file_data_nodelalloc() {
    run_with("data-nodelalloc", &[], 8, data_workload_nodelalloc, check_data);
}

/// The data workload on an `inline_data` filesystem: files start inline (100 bytes fit in
/// the record), and writes, truncates and fallocates move them into blocks or keep them
/// inline; every crash image must show each file's own bytes only.
/// bigalloc: data into the file's partial clusters and fresh ones, freed by whole clusters.
#[test]
fn crash_file_data_bigalloc() {
    run_with("data-bigalloc", &["-O", "bigalloc", "-C", "4096"], 11, data_workload, check_data);
}

/// The data workload in an encrypted directory: every crash image, recovered by rext4,
/// e2fsck and the kernel, shows each file's own bytes (decrypted with the key) and what was
/// fsync'ed; a block half written would decrypt to noise and show.
#[test]
fn crash_file_data_encrypted() {
    // The kernel's recovery is part of the check; without its encryption the rest still runs.
    run_with("data-encrypted", &["-O", "encrypt"], 12, data_workload_encrypted, check_data_encrypted);
}

#[test]
fn crash_file_data_inline() {
    run_with("data-inline", &["-O", "inline_data"], 6, data_workload, check_data);
}

#[test]
fn crash_file_data_block_maps() {
    run_with(
        "data-ext3",
        &["-t", "ext3", "-O", "^has_journal,has_journal"],
        5,
        data_workload_no_falloc,
        check_data,
    );
}
