//! Generated source trees kept for the life of a test process, and the guard that they hold
//! what the tests claim to cover.

use crate::spec::TreeSpec;
use crate::tools::is_root;
use crate::tree::{ctx, generate, mutate};
use crate::walk::{walk_kernel, Kind, Walk};
use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// A generated source tree kept for the life of the test process, and its description.
pub struct SourceTree {
    pub dir: PathBuf,
    pub spec: TreeSpec,
    pub walk: Walk,
}

/// Generates (once per process and `key`) the tree for `spec` under the target's tmp dir,
/// replacing any left from an earlier run.
pub fn source_tree(cell: &'static OnceLock<SourceTree>, key: &str, spec: TreeSpec) -> &'static SourceTree {
    cell.get_or_init(|| make_source_tree(key, spec, false))
}

/// Like [`source_tree`], then [`mutate`]s it.
pub fn mutated_source_tree(
    cell: &'static OnceLock<SourceTree>,
    key: &str,
    spec: TreeSpec,
) -> &'static SourceTree {
    cell.get_or_init(|| make_source_tree(key, spec, true))
}

/// Where trees are generated: `<target>/tmp/rext4-trees`, beside the test binaries (which run
/// from `<target>/<profile>/deps`); cargo only tells integration tests themselves, at build
/// time, where `<target>/tmp` is.
fn trees_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    match exe.ancestors().find(|d| d.ends_with("deps")).and_then(|d| d.parent()?.parent()) {
        Some(target) => target.join("tmp").join("rext4-trees"),
        None => std::env::temp_dir().join("rext4-trees"),
    }
}

fn make_source_tree(key: &str, spec: TreeSpec, mutated: bool) -> SourceTree {
    let base = trees_dir();
    let dir = base.join(key);
    if dir.exists() {
        // Earlier runs may have left odd modes behind.
        let _ = Command::new("chmod").arg("-R").arg("u+rwx").arg(&dir).status();
        ctx(fs::remove_dir_all(&dir), "rm -r", &dir);
    }
    ctx(fs::create_dir_all(&dir), "mkdir -p", &dir);
    generate(&dir, &spec);
    if mutated {
        mutate(&dir, &spec);
    }
    let walk = walk_kernel(&dir);
    assert!(walk.problems.is_empty(), "walking the source tree: {:#?}", walk.problems);
    check_fixture(&walk, &spec, mutated);
    SourceTree { dir, spec, walk }
}

/// Guards the generator: the tree has what the tests claim to cover.
pub fn check_fixture(w: &Walk, spec: &TreeSpec, mutated: bool) {
    let get = |p: &str| w.recs.get(p.as_bytes()).unwrap_or_else(|| panic!("fixture lacks {p}"));
    let children = |d: &str| {
        let prefix = format!("{d}/");
        w.recs
            .keys()
            .filter(|k| k.starts_with(prefix.as_bytes()) && !k[prefix.len()..].contains(&b'/'))
            .count()
    };
    if !mutated {
        assert_eq!(children("/bigdir"), spec.big_dir_entries, "fixture: /bigdir entries");
    } else {
        assert!(children("/bigdir") >= spec.big_dir_entries / 2, "fixture: /bigdir entries");
    }
    let tree_files = w.recs.iter().filter(|(k, r)| k.starts_with(b"/tree/") && r.kind == Kind::File).count();
    assert!(tree_files >= spec.files, "fixture: {tree_files} files under /tree");
    assert_eq!(get("/xattr/big").xattrs.get(b"user.big".as_slice()).map(Vec::len), Some(spec.big_xattr));
    assert!(get("/xattr/acl").xattrs.contains_key(b"system.posix_acl_access".as_slice()), "fixture: ACL");
    assert!(
        get("/xattr/acl_dir").xattrs.contains_key(b"system.posix_acl_default".as_slice()),
        "fixture: ACL"
    );
    assert!(get("/hard/a").nlink >= 5, "fixture: hard links");
    assert_eq!(get("/links/len59").target.as_ref().map(Vec::len), Some(59));
    assert_eq!(get("/links/len60").target.as_ref().map(Vec::len), Some(60));
    assert_eq!(get("/links/slow1000").target.as_ref().map(Vec::len), Some(1000));
    let max_name = w.recs.keys().map(|k| k.rsplit(|&b| b == b'/').next().map_or(0, <[u8]>::len)).max();
    assert_eq!(max_name, Some(255), "fixture: 255-byte names");
    let depth = w.recs.keys().map(|k| k.iter().filter(|&&b| b == b'/').count()).max().unwrap_or(0);
    assert!(depth > spec.deep, "fixture: depth {depth}");
    let kinds: BTreeSet<Kind> = w.recs.values().map(|r| r.kind).collect();
    assert!(kinds.contains(&Kind::Fifo) && kinds.contains(&Kind::Socket), "fixture: special files {kinds:?}");
    if is_root() {
        assert!(kinds.contains(&Kind::Char) && kinds.contains(&Kind::Block), "fixture: devices {kinds:?}");
        let t = get("/xattr/trusted");
        assert!(
            t.xattrs.contains_key(b"trusted.t".as_slice()) && t.xattrs.contains_key(b"security.s".as_slice())
        );
        assert!(w.recs.values().any(|r| r.uid == 4_000_000_000), "fixture: 32-bit uid");
        assert_eq!(get("/owners/setid").mode & 0o7777, 0o6755, "fixture: set-id bits");
    }
    let ns = w.recs.values().filter(|r| r.mtime.1 != 0).count();
    assert!(ns * 2 > w.recs.len(), "fixture: nanosecond times");
}
