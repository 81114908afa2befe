//! Random namespace operation sequences against an in-memory model: every call must succeed
//! or fail exactly as the model (the kernel's rules and errno) says, the tree must match after
//! each sequence, the image must be e2fsck-clean, and the kernel must see the same tree.

use proptest::prelude::*;
use rext4::{Fs, InodeNo, Options, RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT};
use rext4_testkit::{e2fsck_clean, kernel_can_mount, Image, KernelMount};
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Clone, Debug)]
enum Node {
    Dir(BTreeMap<String, usize>),
    File,
    Symlink(String),
    /// What a `RENAME_WHITEOUT` leaves at the old name.
    Whiteout,
}

/// The model: nodes by id (0 is the root), each directory's entries, and the engine's inode
/// number for each node.
struct Model {
    nodes: Vec<Node>,
    ino: Vec<InodeNo>,
    parent: Vec<usize>,
}

#[derive(Clone, Debug)]
enum Op {
    Create(u8, u8),
    Mkdir(u8, u8),
    Unlink(u8, u8),
    Rmdir(u8, u8),
    Link(u8, u8, u8, u8),
    Symlink(u8, u8),
    Rename(u8, u8, u8, u8, u32),
}

const NAMES: [&str; 4] = ["a", "b", "c", "dd"];

fn op() -> impl Strategy<Value = Op> {
    let d = 0u8..8;
    let n = 0u8..4;
    prop_oneof![
        4 => (d.clone(), n.clone()).prop_map(|(d, n)| Op::Create(d, n)),
        3 => (d.clone(), n.clone()).prop_map(|(d, n)| Op::Mkdir(d, n)),
        2 => (d.clone(), n.clone()).prop_map(|(d, n)| Op::Unlink(d, n)),
        2 => (d.clone(), n.clone()).prop_map(|(d, n)| Op::Rmdir(d, n)),
        1 => (d.clone(), n.clone(), d.clone(), n.clone()).prop_map(|(a, b, c, e)| Op::Link(a, b, c, e)),
        1 => (d.clone(), n.clone()).prop_map(|(d, n)| Op::Symlink(d, n)),
        4 => (
            d.clone(),
            n.clone(),
            d,
            n,
            prop_oneof![Just(0u32), Just(RENAME_NOREPLACE), Just(RENAME_EXCHANGE), Just(RENAME_WHITEOUT)]
        )
            .prop_map(|(a, b, c, e, f)| Op::Rename(a, b, c, e, f)),
    ]
}

impl Model {
    fn dirs(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| matches!(self.nodes[i], Node::Dir(_)) && self.reachable(i))
            .collect()
    }

    fn reachable(&self, mut i: usize) -> bool {
        for _ in 0..=self.nodes.len() {
            if i == 0 {
                return true;
            }
            let p = self.parent[i];
            match &self.nodes[p] {
                Node::Dir(m) if m.values().any(|&c| c == i) => i = p,
                _ => return false,
            }
        }
        false
    }

    fn entries(&self, d: usize) -> &BTreeMap<String, usize> {
        match &self.nodes[d] {
            Node::Dir(m) => m,
            _ => unreachable!("not a directory"),
        }
    }

    fn entries_mut(&mut self, d: usize) -> &mut BTreeMap<String, usize> {
        match &mut self.nodes[d] {
            Node::Dir(m) => m,
            _ => unreachable!("not a directory"),
        }
    }

    fn is_dir(&self, i: usize) -> bool {
        matches!(self.nodes[i], Node::Dir(_))
    }

    /// Whether `a` is `b` or an ancestor of it.
    fn is_ancestor(&self, a: usize, mut b: usize) -> bool {
        loop {
            if a == b {
                return true;
            }
            if b == 0 {
                return false;
            }
            b = self.parent[b];
        }
    }

    fn add(&mut self, node: Node, ino: InodeNo, parent: usize) -> usize {
        self.nodes.push(node);
        self.ino.push(ino);
        self.parent.push(parent);
        self.nodes.len() - 1
    }
}

/// The errno the model expects, or `Ok` after applying the change to the model.
fn step(fs: &Fs, m: &mut Model, op: &Op) -> Result<(), String> {
    let dirs = m.dirs();
    let dir = |k: u8| dirs[k as usize % dirs.len()];
    let name = |k: u8| NAMES[k as usize].to_string();
    let errno = |r: rext4::Result<()>| r.err().map(|e| e.errno());
    let check = |what: &str, got: Option<i32>, want: Option<i32>| -> Result<(), String> {
        if got == want {
            Ok(())
        } else {
            Err(format!("{what}: engine gave {got:?}, model expects {want:?}"))
        }
    };
    match *op {
        Op::Create(d, n) | Op::Mkdir(d, n) | Op::Symlink(d, n) => {
            let (d, n) = (dir(d), name(n));
            let exists = m.entries(d).contains_key(&n);
            let r = match op {
                Op::Create(..) => fs.create(m.ino[d], n.as_bytes(), 0o644, 0, 0),
                Op::Mkdir(..) => fs.mkdir(m.ino[d], n.as_bytes(), 0o755, 0, 0),
                _ => fs.symlink(m.ino[d], n.as_bytes(), format!("target-{n}").as_bytes(), 0, 0),
            };
            let want = exists.then_some(libc::EEXIST);
            match r {
                Ok(a) => {
                    check(&format!("{op:?}"), None, want)?;
                    let node = match op {
                        Op::Create(..) => Node::File,
                        Op::Mkdir(..) => Node::Dir(BTreeMap::new()),
                        _ => Node::Symlink(format!("target-{n}")),
                    };
                    let id = m.add(node, a.ino, d);
                    m.entries_mut(d).insert(n, id);
                    Ok(())
                }
                Err(e) => check(&format!("{op:?}"), Some(e.errno()), want),
            }
        }
        Op::Unlink(d, n) | Op::Rmdir(d, n) => {
            let (d, n) = (dir(d), name(n));
            let rmdir = matches!(op, Op::Rmdir(..));
            let target = m.entries(d).get(&n).copied();
            let want = match target {
                None => Some(libc::ENOENT),
                Some(t) if rmdir && !m.is_dir(t) => Some(libc::ENOTDIR),
                Some(t) if rmdir && !m.entries(t).is_empty() => Some(libc::ENOTEMPTY),
                Some(t) if !rmdir && m.is_dir(t) => Some(libc::EISDIR),
                Some(_) => None,
            };
            let r = if rmdir { fs.rmdir(m.ino[d], n.as_bytes()) } else { fs.unlink(m.ino[d], n.as_bytes()) };
            check(&format!("{op:?}"), errno(r), want)?;
            if want.is_none() {
                m.entries_mut(d).remove(&n);
            }
            Ok(())
        }
        Op::Link(sd, sn, dd, dn) => {
            let (sd, sn, dd, dn) = (dir(sd), name(sn), dir(dd), name(dn));
            let src = m.entries(sd).get(&sn).copied();
            let want = match src {
                None => Some(libc::ENOENT),
                // The kernel's linkat looks the new name up before vfs_link sees a directory.
                Some(_) if m.entries(dd).contains_key(&dn) => Some(libc::EEXIST),
                Some(s) if m.is_dir(s) => Some(libc::EPERM),
                Some(_) => None,
            };
            let r = match src {
                Some(s) => fs.link(m.ino[s], m.ino[dd], dn.as_bytes()).map(|_| ()),
                // The kernel resolves the source first: a missing one is ENOENT.
                None => fs.lookup(m.ino[sd], sn.as_bytes()).map(|_| ()),
            };
            check(&format!("{op:?}"), errno(r), want)?;
            if let (None, Some(s)) = (want, src) {
                m.entries_mut(dd).insert(dn, s);
            }
            Ok(())
        }
        Op::Rename(sd, sn, dd, dn, flags) => {
            let (sd, sn, dd, dn) = (dir(sd), name(sn), dir(dd), name(dn));
            let src = m.entries(sd).get(&sn).copied();
            let dst = m.entries(dd).get(&dn).copied();
            // The kernel's order: flags, source below itself, target an ancestor of the
            // source's parent, same inode, then the types.
            let want = match (src, dst) {
                (None, _) => Some(libc::ENOENT),
                (Some(_), Some(_)) if flags == RENAME_NOREPLACE => Some(libc::EEXIST),
                (Some(_), None) if flags == RENAME_EXCHANGE => Some(libc::ENOENT),
                (Some(s), _) if sd != dd && m.is_dir(s) && m.is_ancestor(s, dd) => Some(libc::EINVAL),
                (Some(s), Some(t)) if sd != dd && s != t && m.is_dir(t) && m.is_ancestor(t, sd) => {
                    Some(if flags == RENAME_EXCHANGE { libc::EINVAL } else { libc::ENOTEMPTY })
                }
                (Some(s), Some(t)) if s == t => None,
                _ if flags == RENAME_EXCHANGE => None,
                (Some(s), Some(t)) if m.is_dir(s) && !m.is_dir(t) => Some(libc::ENOTDIR),
                (Some(s), Some(t)) if !m.is_dir(s) && m.is_dir(t) => Some(libc::EISDIR),
                (Some(_), Some(t)) if m.is_dir(t) && !m.entries(t).is_empty() => Some(libc::ENOTEMPTY),
                _ => None,
            };
            let r = fs.rename(m.ino[sd], sn.as_bytes(), m.ino[dd], dn.as_bytes(), flags);
            check(&format!("{op:?}"), errno(r), want)?;
            if want.is_some() {
                return Ok(());
            }
            let (Some(s), dst) = (src, dst) else { return Ok(()) };
            if dst == Some(s) {
                // Two names of one inode: the kernel does nothing.
                return Ok(());
            }
            if flags == RENAME_EXCHANGE {
                let t = dst.unwrap_or(s);
                m.entries_mut(sd).insert(sn, t);
                m.entries_mut(dd).insert(dn, s);
                m.parent[t] = sd;
                m.parent[s] = dd;
            } else {
                m.entries_mut(sd).remove(&sn);
                m.entries_mut(dd).insert(dn, s);
                m.parent[s] = dd;
                if flags == RENAME_WHITEOUT {
                    let w =
                        fs.lookup(m.ino[sd], sn.as_bytes()).map_err(|e| format!("{op:?}: whiteout: {e}"))?;
                    let id = m.add(Node::Whiteout, w.ino, sd);
                    m.entries_mut(sd).insert(sn, id);
                }
            }
            Ok(())
        }
    }
}

/// The tree as (path, kind, link target, link count) lines.
fn model_tree(m: &Model) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![(0usize, String::new())];
    let mut links: BTreeMap<usize, usize> = BTreeMap::new();
    for d in m.dirs() {
        for &c in m.entries(d).values() {
            *links.entry(c).or_default() += 1;
        }
    }
    while let Some((d, path)) = stack.pop() {
        for (n, &c) in m.entries(d) {
            let p = format!("{path}/{n}");
            match &m.nodes[c] {
                Node::Dir(e) => {
                    let sub = e.values().filter(|&&x| m.is_dir(x)).count();
                    out.push(format!("{p} dir links={}", 2 + sub));
                    stack.push((c, p));
                }
                Node::File => out.push(format!("{p} file links={}", links[&c])),
                Node::Whiteout => out.push(format!("{p} whiteout links={}", links[&c])),
                Node::Symlink(t) => out.push(format!("{p} -> {t}")),
            }
        }
    }
    out.sort();
    out
}

fn engine_tree(fs: &Fs) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![(fs.root(), String::new())];
    while let Some((d, path)) = stack.pop() {
        let mut entries = Vec::new();
        fs.readdir(d, 0, |e| {
            if e.name != b"." && e.name != b".." && e.name != b"lost+found" {
                entries.push(e);
            }
            true
        })
        .unwrap();
        for e in entries {
            let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
            let a = fs.getattr(e.ino).unwrap();
            match a.kind {
                rext4::FileType::Directory => {
                    out.push(format!("{p} dir links={}", a.nlink));
                    stack.push((e.ino, p));
                }
                rext4::FileType::Symlink => {
                    out.push(format!("{p} -> {}", String::from_utf8_lossy(&fs.readlink(e.ino).unwrap())))
                }
                rext4::FileType::CharDevice if a.rdev == (0, 0) && a.mode & 0o7777 == 0 => {
                    out.push(format!("{p} whiteout links={}", a.nlink))
                }
                _ => out.push(format!("{p} file links={}", a.nlink)),
            }
        }
    }
    out.sort();
    out
}

fn kernel_tree(root: &Path) -> Vec<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut out = Vec::new();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((d, path)) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let n = e.file_name().to_string_lossy().into_owned();
            if path.is_empty() && n == "lost+found" {
                continue;
            }
            let p = format!("{path}/{n}");
            let md = std::fs::symlink_metadata(e.path()).unwrap();
            if md.is_dir() {
                out.push(format!("{p} dir links={}", md.nlink()));
                stack.push((e.path(), p));
            } else if md.file_type().is_symlink() {
                out.push(format!("{p} -> {}", std::fs::read_link(e.path()).unwrap().to_string_lossy()));
            } else if md.file_type().is_char_device() && md.rdev() == 0 && md.mode() & 0o7777 == 0 {
                out.push(format!("{p} whiteout links={}", md.nlink()));
            } else {
                out.push(format!("{p} file links={}", md.nlink()));
            }
        }
    }
    out.sort();
    out
}

fn run(args: &[&str], ops: &[Op]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("n.img");
    Image::ext4("32M").args(args).build(&img);
    let fs = Fs::open_with(&img, Options { writable: true, ..Options::default() }).unwrap();
    let mut m = Model { nodes: vec![Node::Dir(BTreeMap::new())], ino: vec![fs.root()], parent: vec![0] };
    for (i, op) in ops.iter().enumerate() {
        if let Err(e) = step(&fs, &mut m, op) {
            return Err(TestCaseError::fail(format!("op {i}: {e}")));
        }
    }
    let want = model_tree(&m);
    prop_assert_eq!(&engine_tree(&fs), &want);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    if kernel_can_mount() {
        let k = KernelMount::ro(&img).unwrap();
        let seen = kernel_tree(k.path());
        k.unmount().unwrap();
        prop_assert_eq!(&seen, &want);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, max_shrink_iters: 300, ..ProptestConfig::default() })]

    #[test]
    fn namespace_model_default(ops in proptest::collection::vec(op(), 1..80)) {
        run(&[], &ops)?;
    }

    #[test]
    fn namespace_model_ext3_1k(ops in proptest::collection::vec(op(), 1..80)) {
        run(&["-t", "ext3", "-b", "1024"], &ops)?;
    }

    /// Clusters of four 1 KiB blocks: directories grow inside their clusters first.
    #[test]
    fn namespace_model_bigalloc(ops in proptest::collection::vec(op(), 1..80)) {
        run(&["-b", "1024", "-O", "bigalloc", "-C", "4096"], &ops)?;
    }

    /// Directories kept inline (in the inode) while their names fit.
    #[test]
    fn namespace_model_inline_data(ops in proptest::collection::vec(op(), 1..80)) {
        run(&["-O", "inline_data"], &ops)?;
    }
}
