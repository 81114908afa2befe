//! Extended attributes with fsyncs: values in the inode, in xattr blocks (shared by files with
//! equal attributes, copied when one changes) and in EA inodes (whose blocks are written like
//! file data, before the transaction naming them commits), set, replaced and removed, with
//! owner changes between them, on an image with quotas. Every crash point recovers to a state
//! each file had, no older than what fsync made durable, with reference counts, `i_blocks` and
//! quota usage as e2fsck counts them.

use super::*;
use rext4::SetAttr;
use std::collections::BTreeMap;

/// Attribute names per file.
const NAMES: u64 = 3;

/// A file's attributes and owner at one point: name -> (version, length), and the uid.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(super) struct State {
    attrs: BTreeMap<u64, (u32, usize)>,
    uid: u32,
}

pub(super) struct Model {
    /// The states each file has had, in order; the first is the initial one.
    history: Vec<Vec<State>>,
    /// (log position when fsync returned, file, index in its history made durable).
    durable: Vec<(usize, usize, usize)>,
}

impl Durable for Model {
    fn fsyncs(&self) -> usize {
        self.durable.len()
    }
}

fn name(k: u64) -> Vec<u8> {
    format!("user.attr{k}").into_bytes()
}

/// Version `v`'s value of `len` (at least 8) bytes: the version, then bytes that depend on
/// it all the way to the end.
fn value(v: u32, len: usize) -> Vec<u8> {
    let mut b: Vec<u8> = (0..len).map(|j| (v as usize).wrapping_mul(31).wrapping_add(j / 7) as u8).collect();
    b[..4].copy_from_slice(&v.to_le_bytes());
    b
}

pub(super) fn run_workload(dev: &Arc<CrashDevice>, rounds: usize, seed: u64) -> Model {
    let fs = open_rw(dev);
    let mut rng = Rng(seed);
    let inos = file_inos(&fs, FILES);
    let mut history: Vec<Vec<State>> = inos
        .iter()
        .map(|&ino| vec![State { attrs: BTreeMap::new(), uid: fs.getattr(ino).unwrap().uid }])
        .collect();
    let mut durable = Vec::new();
    let mut version = 1u32;
    let mut last = 0usize;
    for _ in 0..rounds {
        for _ in 0..(rng.next() % 24 + 1) {
            let f = (rng.next() % FILES as u64) as usize;
            let mut st = history[f].last().unwrap().clone();
            version += 1;
            let k = rng.next() % NAMES;
            match rng.next() % 8 {
                0 if st.attrs.contains_key(&k) => {
                    fs.removexattr(inos[f], &name(k)).unwrap();
                    st.attrs.remove(&k);
                }
                1 => {
                    // Owners among a few users, so that quota entries move both ways.
                    st.uid = 1000 + (version % 5);
                    fs.setattr(inos[f], &SetAttr { uid: Some(st.uid), ..SetAttr::default() }).unwrap();
                }
                r => {
                    // In the inode, in a block (1 KiB blocks here), or in an EA inode. Equal
                    // small values (version 0) make files share one block.
                    let (v, len) = match r % 4 {
                        0 => (0, 24),
                        1 => (version, 8 + (rng.next() % 60) as usize),
                        2 => (version, 300 + (rng.next() % 500) as usize),
                        _ => (version, 2_000 + (rng.next() % 14_000) as usize),
                    };
                    if st.attrs.get(&k) == Some(&(v, len)) {
                        continue;
                    }
                    fs.setxattr(inos[f], &name(k), &value(v, len), 0).unwrap();
                    st.attrs.insert(k, (v, len));
                }
            }
            if st != *history[f].last().unwrap() {
                history[f].push(st);
                last = f;
            }
        }
        let f = if rng.next().is_multiple_of(4) { (rng.next() % FILES as u64) as usize } else { last };
        fs.fsync(inos[f]).unwrap();
        durable.push((dev.position(), f, history[f].len() - 1));
    }
    fs.unmount().unwrap();
    Model { history, durable }
}

/// The state file `f` of `fs` is in.
fn read_state(fs: &Fs, f: usize, how: &str) -> State {
    let path = format!("/f{f}");
    let ino = fs.resolve(&path, false).unwrap();
    let mut attrs = BTreeMap::new();
    for n in fs.listxattr(ino).unwrap_or_else(|e| panic!("{how}: listxattr {path}: {e}")) {
        let k: u64 = std::str::from_utf8(&n)
            .ok()
            .and_then(|s| s.strip_prefix("user.attr"))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{how}: {path} has attribute {}", String::from_utf8_lossy(&n)));
        let got = fs.getxattr(ino, &n).unwrap_or_else(|e| panic!("{how}: getxattr {path}: {e}"));
        // Which version it is: the first bytes tell, the rest must agree.
        let v = got.get(..4).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        assert!(
            got.len() >= 8 && value(v, got.len()) == got,
            "{how}: {path}'s {k} holds bytes no version wrote"
        );
        attrs.insert(k, (v, got.len()));
    }
    State { attrs, uid: fs.getattr(ino).unwrap().uid }
}

/// Checks a recovered image against the model for a crash at log position `pos`.
pub(super) fn check_model(img: &Path, model: &Model, pos: usize, how: &str) {
    let fs = Fs::open(img).unwrap_or_else(|e| panic!("{how}: open after recovery: {e}"));
    for (f, hist) in model.history.iter().enumerate() {
        let st = read_state(&fs, f, how);
        // The latest state equal to it (a shared value may bring an earlier state back).
        let at =
            hist.iter().rposition(|s| *s == st).unwrap_or_else(|| panic!("{how}: f{f} is {st:?}, never"));
        for &(p, df, need) in &model.durable {
            if df == f && p <= pos {
                assert!(at >= need, "{how}: crash at {pos}: f{f} lost its fsync'ed state {need} (has {at})");
            }
        }
    }
}

/// With quotas (which this kernel cannot mount: rext4's and e2fsck's recoveries only).
#[test]
fn crash_xattrs_quota() {
    run_with("xattr-quota", &["-O", "ea_inode,quota"], 11, run_workload, check_model);
}

/// Without quotas: the kernel's recovery of rext4's log too.
#[test]
fn crash_xattrs() {
    run_with("xattr", &["-O", "ea_inode"], 12, run_workload, check_model);
}
