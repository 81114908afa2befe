//! Metadata changes (owners and modes of many files) with fsyncs: every crash point recovers
//! to what was fsync'ed, by rext4, e2fsck and the kernel.

use super::*;
use rext4::SetAttr;

/// What the workload did: every uid each file had, and what fsync made durable when.
pub(super) struct Model {
    /// Versions (uids) each file has had, in order; the first is the initial one.
    pub(super) history: Vec<Vec<u32>>,
    /// (log position when fsync returned, file, version it made durable).
    pub(super) durable: Vec<(usize, usize, u32)>,
}

pub(super) fn run_workload(dev: &Arc<CrashDevice>, rounds: usize, seed: u64) -> Model {
    let fs = open_rw(dev);
    let mut rng = Rng(seed);
    let inos = file_inos(&fs, FILES);
    let mut history: Vec<Vec<u32>> = inos.iter().map(|&ino| vec![fs.getattr(ino).unwrap().uid]).collect();
    let mut durable = Vec::new();
    let mut version = 10_000u32;
    let mut last = 0usize;
    for _ in 0..rounds {
        // A burst of changes (several transactions' worth), then an fsync of one file.
        for _ in 0..(rng.next() % 40 + 1) {
            let f = (rng.next() % FILES as u64) as usize;
            version += 1;
            fs.setattr(
                inos[f],
                &SetAttr {
                    uid: Some(version),
                    mode: Some(0o600 | (version as u16 & 0o77)),
                    ..SetAttr::default()
                },
            )
            .unwrap();
            history[f].push(version);
            last = f;
        }
        // Usually the file changed last (a commit), sometimes any file (often nothing to do).
        let f = if rng.next().is_multiple_of(4) { (rng.next() % FILES as u64) as usize } else { last };
        fs.fsync(inos[f]).unwrap();
        durable.push((dev.position(), f, *history[f].last().unwrap()));
    }
    fs.unmount().unwrap();
    Model { history, durable }
}

/// Checks a recovered image against the model for a crash at log position `pos`.
pub(super) fn check_model(img: &Path, model: &Model, pos: usize, how: &str) {
    let fs = Fs::open(img).unwrap_or_else(|e| panic!("{how}: open after recovery: {e}"));
    for (f, hist) in model.history.iter().enumerate() {
        let uid = fs.metadata(format!("/f{f}")).unwrap().uid;
        let at = hist
            .iter()
            .position(|&v| v == uid)
            .unwrap_or_else(|| panic!("{how}: f{f} has uid {uid}, never written"));
        for &(p, df, v) in &model.durable {
            if df == f && p <= pos {
                let need = hist.iter().position(|&x| x == v).unwrap();
                assert!(at >= need, "{how}: crash at {pos}: f{f} lost fsync'ed version {v} (has {uid})");
            }
        }
    }
}

fn run(name: &str, mkfs_args: &[&str], seed: u64) {
    run_with(name, mkfs_args, seed, run_workload, check_model);
}

impl Durable for Model {
    fn fsyncs(&self) -> usize {
        self.durable.len()
    }
}

#[test]
fn crash_default_features() {
    run("default", &[], 1);
}

#[test]
fn crash_upstream_features() {
    run("upstream", &["-O", "metadata_csum_seed,orphan_file"], 2);
}

/// Every change of owner names a new user: the quota files take a new entry each time, their
/// tree and data blocks grow in the same transactions, and any crash leaves them consistent.
#[test]
fn crash_quota() {
    run("quota", &["-O", "quota,project", "-E", "quotatype=usrquota:grpquota:prjquota"], 9);
}

/// bigalloc (1 KiB blocks in 4 KiB clusters): cluster bitmaps, partial clusters of
/// directories and files, a cluster per tree and xattr block.
#[test]
fn crash_bigalloc() {
    run("bigalloc", &["-O", "bigalloc", "-C", "4096"], 10);
}

#[test]
fn crash_no_metadata_csum() {
    run("nocsum", &["-O", "^metadata_csum,^64bit"], 3);
}
