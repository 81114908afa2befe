//! Hashed (htree) directories written by rext4: indexing a growing directory, inserting with
//! leaf and index splits up to three levels (large_dir), every hash version, with and without
//! metadata_csum, removal, rename, concurrency, and readdir positions that survive splits.
//! Every image is judged by `e2fsck -fn` and, where it can mount, by the kernel.

use rext4::{Fs, InodeNo, Options};
use rext4_testkit::{
    e2fsck_clean, htree_levels, readdir_resume, require_kernel, tool, Image, KernelMount, Rng,
};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

const INDEX_FL: u32 = 0x1000;

fn mkfs(dir: &Path, name: &str, args: &[&str], size: &str) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    Image::ext4(size).args(args).build(&img);
    img
}

/// Runs `tool args img`, which must succeed.
fn run_on(name: &str, args: &[&str], img: &Path) {
    let o = std::process::Command::new(tool(name)).args(args).arg(img).output().unwrap();
    assert!(o.status.success(), "{name} {args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// An image whose default directory hash is `alg`, signed or unsigned.
fn mkfs_hash(dir: &Path, name: &str, args: &[&str], alg: &str, unsigned: bool) -> PathBuf {
    let img = mkfs(dir, name, args, "64M");
    run_on("tune2fs", &["-E", &format!("hash_alg={alg}")], &img);
    if unsigned {
        run_on("debugfs", &["-w", "-R", "ssv flags 2"], &img);
    }
    img
}

fn rw(img: &Path) -> Fs {
    Fs::open_with(img, Options { writable: true, ..Options::default() }).unwrap()
}

/// Every name in `dir` but `.` and `..`, read with the inode-level readdir.
fn names(fs: &Fs, dir: InodeNo) -> BTreeSet<Vec<u8>> {
    let mut v = Vec::new();
    fs.readdir(dir, 0, |e| {
        // The top bit marks block-order positions, used only when an index is unusable.
        assert_eq!(e.next >> 63, 0, "readdir fell back to block order");
        v.push(e.name);
        true
    })
    .unwrap();
    let n = v.len();
    let set: BTreeSet<_> = v.into_iter().filter(|n| n != b"." && n != b"..").collect();
    assert_eq!(set.len() + 2, n, "readdir repeated a name or lacks . / ..");
    set
}

/// What the kernel lists in `path` of `img` (None where it cannot mount).
fn kernel_names(img: &Path, path: &str) -> Option<BTreeSet<Vec<u8>>> {
    use std::os::unix::ffi::OsStrExt;
    require_kernel!(None);
    let km = KernelMount::ro(img).unwrap();
    let set = std::fs::read_dir(km.path().join(path.trim_start_matches('/')))
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    km.unmount().unwrap();
    Some(set)
}

fn big_name(i: usize) -> Vec<u8> {
    format!("file-{i:06}-{:x}", i.wrapping_mul(2_654_435_761) % 65521).into_bytes()
}

/// 200,000 creates into one directory: an htree, clean, the kernel lists the same names;
/// then every name removed: clean and empty.
#[test]
fn two_hundred_thousand_entries() {
    const N: usize = 200_000;
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "big", &["-N", "210000"], "512M");
    let fs = rw(&img);
    let d = fs.mkdir(fs.root(), b"big", 0o755, 0, 0).unwrap().ino;
    let t = Instant::now();
    for i in 0..N {
        fs.create(d, &big_name(i), 0o644, 0, 0).unwrap();
    }
    let secs = t.elapsed().as_secs_f64();
    eprintln!("{N} creates in {secs:.1} s ({:.0}/s)", N as f64 / secs);
    assert_ne!(fs.getattr(d).unwrap().flags & INDEX_FL, 0, "not indexed");
    let t = Instant::now();
    let seen = names(&fs, d);
    eprintln!("readdir of {N} in {:.2} s", t.elapsed().as_secs_f64());
    let want: BTreeSet<Vec<u8>> = (0..N).map(big_name).collect();
    assert!(seen == want, "rext4 readdir: {} names, want {N}", seen.len());
    fs.unmount().unwrap();
    drop(fs);
    let t = Instant::now();
    e2fsck_clean(&img);
    eprintln!("e2fsck in {:.1} s", t.elapsed().as_secs_f64());
    assert!(htree_levels(&img, "/big").is_some());
    if let Some(k) = kernel_names(&img, "/big") {
        assert!(k == want, "kernel lists {} names, want {N}", k.len());
    }

    let fs = rw(&img);
    let t = Instant::now();
    for i in 0..N {
        fs.unlink(d, &big_name(i)).unwrap();
    }
    let secs = t.elapsed().as_secs_f64();
    eprintln!("{N} unlinks in {secs:.1} s ({:.0}/s)", N as f64 / secs);
    assert!(names(&fs, d).is_empty());
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    if let Some(k) = kernel_names(&img, "/big") {
        assert!(k.is_empty(), "kernel still lists {} names", k.len());
    }
}

/// A name for variant tests; some carry bytes >= 0x80, whose hash depends on signedness.
fn vname(i: usize, len: usize) -> Vec<u8> {
    let mut n = format!("v{i:05}-").into_bytes();
    if i.is_multiple_of(3) {
        n.extend_from_slice(&[0xC3, 0xA9, 0xFF, 0x80]);
    }
    while n.len() < len {
        n.push(b'a' + (n.len() % 26) as u8);
    }
    n.truncate(len.max(8));
    n
}

/// Creates, renames (to new names, over existing ones, and the directory itself to another
/// parent, which repoints its `..` in the root block) and removes names in a directory that
/// becomes indexed; checks readdir and lookups, then e2fsck and the kernel.
fn exercise(img: &Path, n: usize, len: usize) {
    let fs = rw(img);
    let root = fs.root();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let mut want: BTreeSet<Vec<u8>> = BTreeSet::new();
    for i in 0..n {
        fs.create(d, &vname(i, len), 0o644, 0, 0).unwrap();
        want.insert(vname(i, len));
    }
    assert_ne!(fs.getattr(d).unwrap().flags & INDEX_FL, 0, "not indexed");
    assert_eq!(fs.create(d, &vname(0, len), 0o644, 0, 0).unwrap_err().errno(), 17);
    for i in (0..n).step_by(7) {
        let mut to = vname(i, len.min(250));
        to.extend_from_slice(b"-r");
        fs.rename(d, &vname(i, len), d, &to, 0).unwrap();
        want.remove(&vname(i, len));
        want.insert(to);
    }
    // Over an existing name: the entry is repointed in place.
    for i in (1..n - 1).step_by(11).filter(|i| i % 7 != 0 && (i + 1) % 7 != 0) {
        let from = vname(i, len);
        let to = vname(i + 1, len);
        if want.contains(&from) && want.contains(&to) {
            let ino = fs.lookup(d, &from).unwrap().ino;
            fs.rename(d, &from, d, &to, 0).unwrap();
            assert_eq!(fs.lookup(d, &to).unwrap().ino, ino);
            want.remove(&from);
        }
    }
    let victims: Vec<_> = want.iter().step_by(3).cloned().collect();
    for v in &victims {
        fs.unlink(d, v).unwrap();
        want.remove(v);
    }
    assert_eq!(fs.unlink(d, &victims[0]).unwrap_err().errno(), 2);
    assert!(names(&fs, d) == want, "rext4 readdir differs");
    readdir_resume(&fs, "/d", 37);
    let p2 = fs.mkdir(root, b"p2", 0o755, 0, 0).unwrap().ino;
    fs.rename(root, b"d", p2, b"d", 0).unwrap();
    assert_eq!(fs.lookup(d, b"..").unwrap().ino, p2);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(img);
    // A fresh open (no cached names): every name found by lookup.
    let fs = Fs::open(img).unwrap();
    for w in &want {
        fs.lookup(d, w).unwrap_or_else(|e| panic!("lookup {}: {e}", String::from_utf8_lossy(w)));
    }
    assert!(names(&fs, d) == want);
    drop(fs);
    if let Some(k) = kernel_names(img, "/p2/d") {
        assert!(k == want, "kernel lists {} names, want {}", k.len(), want.len());
    }
}

#[test]
fn hash_versions_and_features() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args, alg, n, len) in [
        ("half_md4-4k", &["-b", "4096"][..], "half_md4", 3000, 20),
        ("tea", &[][..], "tea", 3000, 20),
        ("legacy", &[][..], "legacy", 3000, 20),
        ("nocsum-4k", &["-b", "4096", "-O", "^metadata_csum"][..], "half_md4", 3000, 40),
        ("1k-two-levels", &["-b", "1024"][..], "half_md4", 4000, 120),
        ("1k-nocsum-tea", &["-b", "1024", "-O", "^metadata_csum,^has_journal"][..], "tea", 4000, 120),
        ("ext3", &["-t", "ext3"][..], "half_md4", 1500, 30),
    ] {
        for unsigned in [false, true] {
            if unsigned && args.len() > 2 {
                continue;
            }
            let name = format!("{name}{}", if unsigned { "-unsigned" } else { "" });
            eprintln!("{name}");
            let img = mkfs_hash(dir.path(), &name, args, alg, unsigned);
            exercise(&img, n, len);
            if name.starts_with("1k") {
                assert_eq!(htree_levels(&img, "/p2/d"), Some(1), "{name}");
            }
        }
    }
}

/// 255-byte names in 1 KiB blocks: with large_dir the index grows a third level; without it,
/// a full two-level index refuses more names with ENOSPC, as the kernel does.
#[test]
fn large_dir_three_levels_and_full_index() {
    let dir = tempfile::tempdir().unwrap();
    let long = |i: usize| vname(i, 255);
    for large in [true, false] {
        let features = if large { "large_dir" } else { "^large_dir" };
        let img = mkfs(dir.path(), features, &["-b", "1024", "-N", "70000", "-O", features], "160M");
        let fs = rw(&img);
        let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
        let t = Instant::now();
        let mut n = 0;
        let full = loop {
            match fs.create(d, &long(n), 0o644, 0, 0) {
                Ok(_) => n += 1,
                Err(e) => break Some(e),
            }
            if n == 45_000 {
                break None;
            }
        };
        eprintln!("{features}: {n} long names in {:.1} s, stopped by {full:?}", t.elapsed().as_secs_f64());
        if large {
            assert!(full.is_none(), "large_dir: {full:?} after {n}");
        } else {
            assert_eq!(full.map(|e| e.errno()), Some(28), "without large_dir the index fills");
        }
        // Remove a third, so leaves empty out (the kernel does not merge them either).
        for i in (0..n).step_by(3) {
            fs.unlink(d, &long(i)).unwrap();
        }
        let want: BTreeSet<Vec<u8>> = (0..n).filter(|i| i % 3 != 0).map(long).collect();
        assert!(names(&fs, d) == want);
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img);
        assert_eq!(htree_levels(&img, "/d"), Some(if large { 2 } else { 1 }), "{features}");
        if let Some(k) = kernel_names(&img, "/d") {
            assert!(k == want, "{features}: kernel lists {} names, want {}", k.len(), want.len());
        }
    }
}

/// Directories the kernel indexed (one and two levels), then changed by rext4: names added
/// and removed, and the kernel still agrees.
#[test]
fn kernel_indexed_directories() {
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    for (name, args, n) in [("4k", &["-b", "4096"][..], 5000), ("1k", &["-b", "1024"][..], 5000)] {
        let img = mkfs(dir.path(), name, args, "64M");
        {
            let km = KernelMount::rw(&img).unwrap();
            let k = km.path().join("k");
            std::fs::create_dir(&k).unwrap();
            for i in 0..n {
                std::fs::write(k.join(format!("kernel-{i:05}")), b"").unwrap();
            }
            km.unmount().unwrap();
        }
        let levels = htree_levels(&img, "/k");
        assert!(levels.is_some(), "{name}: the kernel did not index /k");
        let fs = rw(&img);
        let k = fs.resolve("/k", true).unwrap();
        let mut want: BTreeSet<Vec<u8>> = (0..n).map(|i| format!("kernel-{i:05}").into_bytes()).collect();
        for i in 0..n {
            let nm = format!("rext4-{i:05}-{}", "x".repeat(i % 40)).into_bytes();
            fs.create(k, &nm, 0o600, 0, 0).unwrap();
            want.insert(nm);
        }
        for i in (0..n).step_by(2) {
            let nm = format!("kernel-{i:05}").into_bytes();
            fs.unlink(k, &nm).unwrap();
            want.remove(&nm);
        }
        for i in (1..n).step_by(10) {
            let from = format!("kernel-{i:05}").into_bytes();
            let to = format!("renamed-{i:05}").into_bytes();
            fs.rename(k, &from, k, &to, 0).unwrap();
            want.remove(&from);
            want.insert(to);
        }
        assert!(names(&fs, k) == want);
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img);
        assert!(htree_levels(&img, "/k") >= levels);
        assert!(kernel_names(&img, "/k").unwrap() == want, "{name}: kernel view differs");
    }
}

/// Threads creating, renaming (within the shared directory and from their own into it) and
/// unlinking in one shared indexed directory and in their own, while another thread looks up
/// names that stay put and reads the shared directory: no lookup misses, no readdir repeats,
/// and afterwards every directory holds exactly what the threads left, clean for e2fsck and
/// the kernel.
#[test]
fn concurrent_name_operations() {
    const THREADS: usize = 6;
    const PER: usize = 2500;
    const STABLE: usize = 400;
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "conc", &["-b", "1024", "-N", "40000"], "256M");
    let fs = rw(&img);
    let root = fs.root();
    let shared = fs.mkdir(root, b"shared", 0o755, 0, 0).unwrap().ino;
    let stable: Vec<Vec<u8>> =
        (0..STABLE).map(|i| format!("stable-{i:04}-{}", "s".repeat(i % 50)).into_bytes()).collect();
    for s in &stable {
        fs.create(shared, s, 0o644, 0, 0).unwrap();
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    let t = Instant::now();
    let (results, reads) = std::thread::scope(|sc| {
        let reader = sc.spawn(|| {
            let mut rng = Rng::new(99);
            let mut reads = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                for _ in 0..200 {
                    let s = rng.pick(&stable);
                    fs.lookup(shared, s)
                        .unwrap_or_else(|e| panic!("lookup {}: {e}", String::from_utf8_lossy(s)));
                }
                let seen = names(&fs, shared);
                assert!(stable.iter().all(|s| seen.contains(s)), "readdir lost a stable name");
                reads += 1;
            }
            reads
        });
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let fs = &fs;
                sc.spawn(move || {
                    let own = fs.mkdir(root, format!("own-{t}").as_bytes(), 0o755, 0, 0).unwrap().ino;
                    let (mut in_shared, mut in_own) = (BTreeSet::new(), BTreeSet::new());
                    let mut rng = Rng::new(t as u64);
                    for i in 0..PER {
                        let pad = "p".repeat(rng.below(60) as usize);
                        let s = format!("t{t}-{i:05}-{pad}").into_bytes();
                        fs.create(shared, &s, 0o644, 0, 0).unwrap();
                        let o = format!("own{t}-{i:05}-{pad}").into_bytes();
                        fs.create(own, &o, 0o644, 0, 0).unwrap();
                        in_own.insert(o.clone());
                        if i % 3 == 0 {
                            let mut r = s.clone();
                            r.extend_from_slice(b"-r");
                            fs.rename(shared, &s, shared, &r, 0).unwrap();
                            in_shared.insert(r);
                        } else {
                            in_shared.insert(s);
                        }
                        if i % 5 == 0 {
                            let to = format!("moved-{t}-{i:05}").into_bytes();
                            fs.rename(own, &o, shared, &to, 0).unwrap();
                            in_own.remove(&o);
                            in_shared.insert(to);
                        }
                        if i % 4 == 0 {
                            let victim =
                                in_shared.iter().nth(rng.below(in_shared.len() as u64) as usize).cloned();
                            let victim = victim.unwrap();
                            fs.unlink(shared, &victim).unwrap();
                            in_shared.remove(&victim);
                        }
                    }
                    (own, in_shared, in_own)
                })
            })
            .collect();
        let results: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (results, reader.join().unwrap())
    });
    let ops = THREADS * PER * 2 + THREADS * (PER / 3 + PER / 5 + PER / 4);
    eprintln!(
        "{ops} operations from {THREADS} threads in {:.1} s; {reads} full reads",
        t.elapsed().as_secs_f64()
    );
    let mut want_shared: BTreeSet<Vec<u8>> = stable.iter().cloned().collect();
    for (own, in_shared, in_own) in &results {
        want_shared.extend(in_shared.iter().cloned());
        assert!(names(&fs, *own) == *in_own, "an own directory differs");
    }
    assert!(names(&fs, shared) == want_shared, "the shared directory differs");
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    assert!(htree_levels(&img, "/shared").is_some());
    if let Some(k) = kernel_names(&img, "/shared") {
        assert!(k == want_shared, "kernel: shared directory differs");
    }
    if let Some(k) = kernel_names(&img, "/own-0") {
        assert!(k == results[0].2, "kernel: own-0 differs");
    }
}

/// Reads `dir` a page of `step` entries at a time (each page a new readdir from the last
/// entry's `next`), calling `between` after each page; returns every name in order.
fn paged(fs: &Fs, dir: InodeNo, step: usize, mut between: impl FnMut(usize)) -> Vec<Vec<u8>> {
    let mut all = Vec::new();
    let mut pos = 0;
    for page in 0.. {
        let mut got = 0;
        fs.readdir(dir, pos, |e| {
            assert_eq!(e.next >> 63, 0, "readdir fell back to block order");
            pos = e.next;
            all.push(e.name);
            got += 1;
            got < step
        })
        .unwrap();
        if got < step {
            break;
        }
        between(page);
    }
    all
}

/// Every name in `before` seen exactly once, and no name seen twice.
#[track_caller]
fn once_each(seen: &[Vec<u8>], before: &BTreeSet<Vec<u8>>, ctx: &str) {
    let mut count = std::collections::BTreeMap::new();
    for n in seen {
        *count.entry(n.clone()).or_insert(0) += 1;
    }
    let dups: Vec<_> =
        count.iter().filter(|(_, &c)| c > 1).map(|(n, _)| String::from_utf8_lossy(n)).collect();
    assert!(dups.is_empty(), "{ctx}: repeated {dups:?}");
    let lost: Vec<_> =
        before.iter().filter(|n| !count.contains_key(*n)).map(|n| String::from_utf8_lossy(n)).collect();
    assert!(lost.is_empty(), "{ctx}: skipped {} names, e.g. {:?}", lost.len(), &lost[..lost.len().min(3)]);
}

/// Names inserted during a paginated readdir (splitting leaves and index nodes, and turning a
/// one-block directory into an indexed one) neither repeat nor hide entries that were there
/// from the start.
#[test]
fn readdir_positions_survive_splits() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "rd", &["-b", "1024", "-N", "60000"], "256M");
    let fs = rw(&img);
    let root = fs.root();
    let mut serial = 0usize;
    let mut fresh = || {
        serial += 1;
        format!("new-{serial:06}-{}", "n".repeat(serial % 37)).into_bytes()
    };

    // A one-block directory read an entry at a time while it becomes indexed and grows.
    let small = fs.mkdir(root, b"small", 0o755, 0, 0).unwrap().ino;
    let before: BTreeSet<Vec<u8>> = (0..20).map(|i| format!("orig-{i:02}").into_bytes()).collect();
    for n in &before {
        fs.create(small, n, 0o644, 0, 0).unwrap();
    }
    assert_eq!(fs.getattr(small).unwrap().flags & INDEX_FL, 0);
    let seen = paged(&fs, small, 1, |page| {
        for _ in 0..if page < 15 { 30 } else { 0 } {
            fs.create(small, &fresh(), 0o644, 0, 0).unwrap();
        }
    });
    assert_ne!(fs.getattr(small).unwrap().flags & INDEX_FL, 0);
    once_each(&seen, &before, "one block becoming indexed");

    // A two-level tree read in pages while inserts split leaves and nodes under the reader.
    let big = fs.mkdir(root, b"big", 0o755, 0, 0).unwrap().ino;
    let before: BTreeSet<Vec<u8>> =
        (0..8000).map(|i| format!("orig-{i:05}-{}", "o".repeat(i % 41)).into_bytes()).collect();
    for n in &before {
        fs.create(big, n, 0o644, 0, 0).unwrap();
    }
    let seen = paged(&fs, big, 40, |page| {
        for _ in 0..if page < 200 { 60 } else { 0 } {
            fs.create(big, &fresh(), 0o644, 0, 0).unwrap();
        }
    });
    once_each(&seen, &before, "paged with inserts between pages");

    // The same with a writer thread inserting (and removing its own names) meanwhile.
    let before = names(&fs, big);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (seen, written) = std::thread::scope(|sc| {
        let writer = sc.spawn(|| {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let name = format!("thread-{n:06}-{}", "t".repeat(n % 53)).into_bytes();
                fs.create(big, &name, 0o644, 0, 0).unwrap();
                if n % 3 == 0 {
                    fs.unlink(big, &name).unwrap();
                }
                n += 1;
            }
            n
        });
        let mut rounds = Vec::new();
        for step in [7, 64, 1000] {
            rounds.push(paged(&fs, big, step, |_| {}));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (rounds, writer.join().unwrap())
    });
    eprintln!("{written} names written during three paged reads");
    for (i, s) in seen.iter().enumerate() {
        once_each(s, &before, &format!("paged read {i} with a writer thread"));
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}

/// A directory that grows on a full disk, one block at a time: each refused name is
/// followed by a check of the image and one block set free. Where the index had to grow (a
/// new level) and then had no block for the leaf, the directory's record held the new block
/// in memory only: the journaled index named a block past the directory's journaled end,
/// until some later change to the directory journaled its record. The directory grows on
/// until index nodes under the root have split too (a node split taking the last block, the
/// leaf split then refused). Every name made stays, and the image is clean after every
/// refusal.
#[test]
fn an_index_growing_on_a_full_disk_stays_whole() {
    let tmp = tempfile::tempdir().unwrap();
    // 1 KiB blocks: three 255-byte names to a leaf, 124 leaves under the root.
    let img = mkfs(tmp.path(), "full", &["-b", "1024"], "8M");
    let mut fs = rw(&img);
    let root = fs.root();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let spares: Vec<Vec<u8>> = (0..900).map(|k| format!("spare{k}").into_bytes()).collect();
    for s in &spares {
        let f = fs.create(root, s, 0o644, 0, 0).unwrap().ino;
        fs.write(f, 0, b"x").unwrap();
    }
    let fill = fs.create(root, b"fill", 0o644, 0, 0).unwrap().ino;
    let chunk = vec![1u8; 1 << 16];
    let mut at = 0u64;
    rext4::with_reserved_blocks(|| {
        while let Ok(n) = fs.write(fill, at, &chunk) {
            at += n as u64;
        }
    });
    fs.sync().unwrap();
    let name = |i: usize| {
        let mut n = format!("{i:05}-").into_bytes();
        n.resize(255, b'a' + (i % 26) as u8);
        n
    };
    let (mut made, mut freed, mut refusals) = (Vec::new(), 0, 0);
    while made.len() < 1000 && freed < spares.len() {
        let i = made.len();
        match rext4::with_reserved_blocks(|| fs.create(d, &name(i), 0o644, 0, 0)) {
            Ok(_) => made.push(name(i)),
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOSPC, "name {i}: {e}");
                refusals += 1;
                fs.unmount().unwrap();
                drop(fs);
                e2fsck_clean(&img);
                fs = rw(&img);
                fs.unlink(root, &spares[freed]).unwrap();
                freed += 1;
                fs.sync().unwrap();
            }
        }
    }
    assert!(refusals > 100, "the disk was full for most names: {refusals} refusals");
    assert!(made.len() > 3 * 124, "the index grew a level: {} names", made.len());
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    let fs = Fs::open(&img).unwrap();
    assert_eq!(htree_levels(&img, "/d"), Some(1), "an index of two levels");
    let dump =
        std::process::Command::new(tool("debugfs")).args(["-R", "htree /d"]).arg(&img).output().unwrap();
    let dump = String::from_utf8_lossy(&dump.stdout);
    let root_count: usize = dump
        .lines()
        .find_map(|l| l.trim().strip_prefix("Number of entries (count):"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no root count in:\n{dump}"));
    assert!(root_count > 2, "index nodes split: the root names {root_count} nodes");
    let have = names(&fs, d);
    assert_eq!(have.len(), made.len());
    assert!(made.iter().all(|n| have.contains(n)), "every name made is listed");
}
