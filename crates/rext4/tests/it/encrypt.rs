//! Encrypted directories (`mkfs.ext4 -O encrypt`, fscrypt) against the kernel: the kernel
//! sets v2 and v1 policies on directories of a loop mount and writes files, names of every
//! length (up to the digested no-key form), symlinks short and long, sparse and preallocated
//! files and an indexed directory into them. rext4 must then show what the kernel shows with
//! the keys (every byte, name and attribute), and without them exactly the kernel's no-key
//! names, symlink targets and sizes, with `ENOKEY` for contents; it must remove files by
//! no-key names, refuse what needs a key as the kernel does, and leave e2fsck and the kernel
//! content after each change.

use rext4::{EncryptionKey, Error, Fs, Options};
use rext4_format::InodeNo;
use rext4_testkit::*;
use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;

const V1_DESC: [u8; 8] = *b"rext4v1!";

fn keys() -> (Vec<u8>, Vec<u8>) {
    let mut rng = Rng::new(0xfc);
    let v2: Vec<u8> = (0..64).map(|_| rng.next_u64() as u8).collect();
    let v1: Vec<u8> = (0..64).map(|_| rng.next_u64() as u8).collect();
    (v2, v1)
}

fn with_keys(writable: bool) -> Options {
    let (v2, v1) = keys();
    Options {
        writable,
        encryption_keys: vec![EncryptionKey::new(v2).unwrap(), EncryptionKey::v1(V1_DESC, v1).unwrap()],
        ..Options::default()
    }
}

fn add_both_keys(mnt: &Path) -> [u8; 16] {
    let (v2, v1) = keys();
    fscrypt_add_key(mnt, &v1, Some(V1_DESC));
    fscrypt_add_key(mnt, &v2, None)
}

fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.next_u64() as u8).collect()
}

/// The kernel makes the encrypted tree (keys added, policies set on empty directories).
fn kernel_writes_tree(img: &Path) {
    let m = KernelMount::rw(img).expect("mount");
    let root = m.path();
    let id = add_both_keys(root);
    let (v2, _) = keys();
    assert_eq!(
        EncryptionKey::new(v2).unwrap().id_hex(),
        id.iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
    std::fs::create_dir(root.join("plain")).unwrap();
    std::fs::write(root.join("plain/a.txt"), b"not encrypted").unwrap();
    for (d, key, flags) in [("enc", &id[..], 3u8), ("enc4", &id[..], 0), ("encv1", &V1_DESC[..], 2)] {
        let dir = root.join(d);
        std::fs::create_dir(&dir).unwrap();
        fscrypt_set_policy(&dir, key, flags);
        std::fs::write(dir.join("small.txt"), b"hello, encrypted world\n").unwrap();
        std::fs::write(dir.join("empty"), b"").unwrap();
        for (i, n) in [1usize, 4095, 4096, 5000, (1 << 20) + 123].into_iter().enumerate() {
            std::fs::write(dir.join(format!("size-{n}")), bytes(i as u64, n)).unwrap();
        }
        let f = std::fs::File::create(dir.join("sparse")).unwrap();
        f.write_all_at(&bytes(40, 4096), 0).unwrap();
        f.write_all_at(&bytes(41, 5000), 1 << 20).unwrap();
        f.set_len(3 << 20).unwrap();
        let f = std::fs::File::create(dir.join("prealloc")).unwrap();
        rustix_fallocate(&f, 65536);
        f.write_all_at(&bytes(42, 100), 10_000).unwrap();
        for n in [1usize, 15, 16, 17, 31, 32, 33, 100, 144, 145, 149, 150, 200, 255] {
            let name: String = (0..n).map(|i| (b'a' + (i % 26) as u8) as char).collect();
            std::fs::write(dir.join(&name), format!("named {n}")).unwrap();
        }
        std::fs::write(dir.join("é".repeat(127)), b"two-byte letters").unwrap();
        std::fs::create_dir_all(dir.join("sub/deeper")).unwrap();
        std::fs::write(dir.join("sub/deeper/x"), b"x").unwrap();
        std::os::unix::fs::symlink("small.txt", dir.join("link-short")).unwrap();
        std::os::unix::fs::symlink("/".to_string() + &"long/".repeat(60), dir.join("link-long")).unwrap();
        std::fs::hard_link(dir.join("small.txt"), dir.join("hardlink")).unwrap();
        nix::unistd::mkfifo(&dir.join("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let big = dir.join("bigdir");
        std::fs::create_dir(&big).unwrap();
        for i in 0..700 {
            std::fs::write(big.join(format!("file-{i:04}-with-a-longer-name")), i.to_string()).unwrap();
        }
    }
    m.unmount().expect("umount");
}

fn rustix_fallocate(f: &std::fs::File, len: i64) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor; fallocate writes nothing to our memory.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len) };
    assert_eq!(r, 0, "fallocate");
}

/// What a caller without the key sees of one entry.
#[derive(Debug, PartialEq, Eq)]
struct NoKeyView {
    mode: u32,
    size: u64,
    nlink: u64,
    target: Option<Vec<u8>>,
    read: Result<Vec<u8>, i32>,
}

/// Every path under `dir` (relative, by shown names) as the kernel shows it without keys.
fn kernel_nokey(root: &Path, rel: &str, out: &mut BTreeMap<Vec<u8>, NoKeyView>) {
    use std::os::unix::fs::MetadataExt;
    for e in std::fs::read_dir(root.join(rel.trim_start_matches('/'))).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().as_bytes().to_vec();
        let path = e.path();
        let md = std::fs::symlink_metadata(&path).unwrap();
        let target = md
            .file_type()
            .is_symlink()
            .then(|| std::fs::read_link(&path).unwrap().as_os_str().as_bytes().to_vec());
        let read = if md.file_type().is_file() {
            std::fs::read(&path).map_err(|e| e.raw_os_error().unwrap_or(0))
        } else {
            Err(0)
        };
        let key = [rel.as_bytes(), b"/", &name].concat();
        out.insert(
            key.clone(),
            NoKeyView { mode: md.mode(), size: md.size(), nlink: md.nlink(), target, read },
        );
        if md.is_dir() {
            kernel_nokey(
                root,
                std::str::from_utf8(&key).unwrap_or_else(|_| panic!("no-key names are ASCII")),
                out,
            );
        }
    }
}

fn rext4_nokey(fs: &Fs, dir: InodeNo, rel: &str, out: &mut BTreeMap<Vec<u8>, NoKeyView>) {
    for e in fs.children(dir).unwrap() {
        let a = fs
            .lookup(dir, &e.name)
            .unwrap_or_else(|x| panic!("lookup {rel}/{:?}: {x}", String::from_utf8_lossy(&e.name)));
        assert_eq!(a.ino, e.ino);
        let target = (a.kind == rext4::FileType::Symlink).then(|| fs.readlink(a.ino).unwrap());
        let read = if a.kind == rext4::FileType::RegularFile {
            let mut b = vec![0u8; a.size as usize];
            fs.read(a.ino, 0, &mut b).map(|n| b[..n].to_vec()).map_err(|e| e.errno())
        } else {
            Err(0)
        };
        let key = [rel.as_bytes(), b"/", &e.name].concat();
        let mode = u32::from(a.mode);
        out.insert(key.clone(), NoKeyView { mode, size: a.size, nlink: u64::from(a.nlink), target, read });
        if a.kind == rext4::FileType::Directory {
            rext4_nokey(fs, a.ino, std::str::from_utf8(&key).unwrap(), out);
        }
    }
}

fn nokey_views(img: &Path) -> (BTreeMap<Vec<u8>, NoKeyView>, BTreeMap<Vec<u8>, NoKeyView>) {
    let m = KernelMount::ro(img).expect("mount");
    let mut k = BTreeMap::new();
    kernel_nokey(m.path(), "", &mut k);
    m.unmount().unwrap();
    let fs = Fs::open(img).unwrap();
    let mut r = BTreeMap::new();
    rext4_nokey(&fs, fs.root(), "", &mut r);
    (k, r)
}

fn assert_same_views(what: &str, k: &BTreeMap<Vec<u8>, NoKeyView>, r: &BTreeMap<Vec<u8>, NoKeyView>) {
    let only = |a: &BTreeMap<Vec<u8>, NoKeyView>, b: &BTreeMap<Vec<u8>, NoKeyView>| {
        a.keys()
            .filter(|p| !b.contains_key(*p))
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .take(5)
            .collect::<Vec<_>>()
    };
    let (ko, ro) = (only(k, r), only(r, k));
    assert!(ko.is_empty() && ro.is_empty(), "{what}: names only the kernel shows {ko:?}, only rext4 {ro:?}");
    for (p, kv) in k {
        assert_eq!(Some(kv), r.get(p), "{what}: {}", String::from_utf8_lossy(p));
    }
}

/// Shown with the keys, rext4 and a kernel mount with the same keys must agree on
/// everything: names, bytes, attributes, xattrs, link targets.
fn with_keys_matches_kernel(img: &Path, what: &str) {
    with_keys_matches_kernel_at(img, what, "/enc/size-5000");
}

/// [`with_keys_matches_kernel`], where `shown` is a path the decrypted names must hold.
fn with_keys_matches_kernel_at(img: &Path, what: &str, shown: &str) {
    let fs = Fs::open_with(img, with_keys(false)).unwrap();
    let walk = walk_rext4(&fs, None);
    let m = KernelMount::ro(img).expect("mount");
    add_both_keys(m.path());
    let k = walk_kernel(m.path());
    m.unmount().unwrap();
    let mut report = Report::default();
    report
        .add(format!("{what}: rext4 with keys vs kernel with keys"), diff_full("kernel", &k, "rext4", &walk));
    report.finish();
    assert!(walk.recs.contains_key(shown.as_bytes()), "{what}: decrypted names are shown");
}

#[test]
fn kernel_encrypted_tree_read_with_and_without_keys() {
    require_fscrypt!();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("enc.img");
    Image::ext4("256M").features("encrypt").build(&img);
    kernel_writes_tree(&img);
    e2fsck_clean(&img);
    with_keys_matches_kernel(&img, "fresh");

    // The encrypted trees' bytes, by plaintext path, read through rext4.
    let fs = Fs::open_with(&img, with_keys(false)).unwrap();
    let mut f = fs.resolve("/enc/size-5000", true).map(|i| fs.getattr(i).unwrap()).unwrap();
    let mut b = vec![0u8; 5000];
    assert_eq!(fs.read(f.ino, 0, &mut b).unwrap(), 5000);
    assert_eq!(b, bytes(3, 5000));
    // Reads at every offset across block and run boundaries.
    f = fs.getattr(fs.resolve("/encv1/sparse", true).unwrap()).unwrap();
    let mut want = vec![0u8; 3 << 20];
    want[..4096].copy_from_slice(&bytes(40, 4096));
    want[1 << 20..(1 << 20) + 5000].copy_from_slice(&bytes(41, 5000));
    for (off, len) in
        [(0u64, 10usize), (4000, 200), (4095, 2), ((1 << 20) - 5, 5010), (1 << 20, 1 << 20), (3 << 20, 9)]
    {
        let mut got = vec![0xEEu8; len];
        let n = fs.read(f.ino, off, &mut got).unwrap();
        let end = (off as usize + len).min(want.len());
        assert_eq!(&got[..n], &want[(off as usize).min(end)..end], "sparse at {off}+{len}");
    }
    drop(fs);

    // Without keys: the kernel's no-key names (with the index's hashes in /enc*/bigdir),
    // symlink targets and sizes, ENOKEY for contents.
    let (k, r) = nokey_views(&img);
    assert!(k.values().any(|v| v.read == Err(libc::ENOKEY)), "the kernel refuses contents without keys");
    assert!(k.keys().any(|p| p.len() > 240), "some no-key names are of the digested form");
    assert_same_views("without keys", &k, &r);
}

/// Without keys: removal by no-key name (whole and digested forms, a subtree), and the
/// kernel's refusals of what needs a key; with keys: renames and links within a policy,
/// `EXDEV` across policies, removal by plaintext names.
#[test]
fn encrypted_names_changed_with_and_without_keys() {
    require_fscrypt!();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("enc.img");
    Image::ext4("256M").features("encrypt").build(&img);
    kernel_writes_tree(&img);

    let (k, _) = nokey_views(&img);
    let shown = |d: &str, pred: &dyn Fn(&NoKeyView) -> bool| -> Vec<Vec<u8>> {
        k.iter()
            .filter(|(p, v)| {
                p.starts_with(format!("/{d}/").as_bytes())
                    && p.iter().filter(|&&c| c == b'/').count() == 2
                    && pred(v)
            })
            .map(|(p, _)| p[d.len() + 2..].to_vec())
            .collect()
    };
    let fs = Fs::open_with(&img, Options { writable: true, ..Options::default() }).unwrap();
    let enc = fs.resolve("/enc", true).unwrap();
    // The longest names (digested) and a short one, without the key.
    let mut gone = shown("enc", &|v| v.read.is_err() && v.mode & 0o170000 == 0o100000);
    gone.sort_by_key(|n| std::cmp::Reverse(n.len()));
    gone.truncate(3);
    gone.push(shown("enc", &|v| v.size == 23 && v.nlink == 2)[0].clone());
    assert!(gone[0].len() > 240, "a digested no-key name is removed");
    for n in &gone {
        fs.unlink(enc, n).unwrap_or_else(|e| panic!("unlink {}: {e}", String::from_utf8_lossy(n)));
        assert!(matches!(fs.lookup(enc, n), Err(Error::NotFound)));
    }
    // A subtree by no-key names, as `rm -r` walks it.
    let sub_name = shown("enc", &|v| v.mode & 0o170000 == 0o040000 && v.nlink == 3)[0].clone();
    let sub = fs.lookup(enc, &sub_name).unwrap().ino;
    let deeper = fs.children(sub).unwrap()[0].clone();
    let x = fs.children(deeper.ino).unwrap()[0].clone();
    fs.unlink(deeper.ino, &x.name).unwrap();
    fs.rmdir(sub, &deeper.name).unwrap();
    fs.rmdir(enc, &sub_name).unwrap();
    // What needs the key.
    let any = shown("enc", &|v| v.size == 5000)[0].clone();
    let file = fs.lookup(enc, &any).unwrap().ino;
    assert!(matches!(fs.read(file, 0, &mut [0u8; 8]), Err(Error::NoKey)));
    assert!(matches!(fs.create(enc, b"new", 0o644, 0, 0), Err(Error::NoKey)));
    assert!(matches!(fs.mkdir(enc, b"new", 0o755, 0, 0), Err(Error::NoKey)));
    assert!(matches!(fs.symlink(enc, b"new", b"t", 0, 0), Err(Error::NoKey)));
    assert!(matches!(fs.create(enc, &any, 0o644, 0, 0), Err(Error::Exists)));
    assert!(matches!(fs.rename(enc, &any, enc, b"other", 0), Err(Error::NoKey)));
    assert!(matches!(fs.link(file, enc, b"other"), Err(Error::NoKey)));
    assert!(matches!(fs.unlink(enc, b"not-a-no-key-name!"), Err(Error::NotFound)));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    let (k2, r2) = nokey_views(&img);
    assert_same_views("after removals without keys", &k2, &r2);
    for n in &gone {
        assert!(!k2.contains_key(&[b"/enc/", &n[..]].concat()), "the kernel still lists a removed name");
    }
    with_keys_matches_kernel(&img, "after removals without keys");

    // With the keys.
    let fs = Fs::open_with(&img, with_keys(true)).unwrap();
    let enc = fs.resolve("/enc", true).unwrap();
    let enc4 = fs.resolve("/enc4", true).unwrap();
    let plain = fs.resolve("/plain", true).unwrap();
    fs.rename(enc, b"size-4096", enc, b"renamed-within", 0).unwrap();
    fs.rename(enc, b"size-4095", plain, b"moved-out", 0).unwrap();
    let small4 = fs.lookup(enc4, b"small.txt").unwrap().ino;
    fs.link(small4, enc4, b"second-name").unwrap();
    assert!(
        matches!(fs.link(small4, enc, b"x"), Err(Error::CrossPolicy)),
        "enc and enc4 pad names differently"
    );
    let a = fs.lookup(plain, b"a.txt").unwrap().ino;
    assert!(matches!(fs.rename(plain, b"a.txt", enc, b"in", 0), Err(Error::CrossPolicy)));
    assert!(matches!(fs.link(a, enc, b"in"), Err(Error::CrossPolicy)));
    fs.create(enc, b"new", 0o644, 0, 0).unwrap();
    assert!(matches!(fs.create(enc, b"new", 0o644, 0, 0), Err(Error::Exists)));
    fs.unlink(enc, b"new").unwrap();
    fs.unlink(enc4, b"size-1").unwrap();
    fs.rmdir(fs.resolve("/enc4/sub/deeper", true).unwrap(), b"x").unwrap_err();
    fs.unlink(fs.resolve("/enc4/sub/deeper", true).unwrap(), b"x").unwrap();
    // Grown past a block: indexed by the hashes of its ciphertext names, as the kernel does.
    let grown = fs.mkdir(enc, b"grown", 0o755, 0, 0).unwrap().ino;
    for i in 0..400 {
        fs.create(grown, format!("entry-{i:04}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    assert_ne!(fs.getattr(grown).unwrap().flags & rext4::format::inode::INDEX_FL, 0, "indexed");
    for i in (0..400).step_by(3) {
        fs.unlink(grown, format!("entry-{i:04}").as_bytes()).unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    with_keys_matches_kernel(&img, "after changes with keys");
    let (k3, r3) = nokey_views(&img);
    assert_same_views("an encrypted directory rext4 indexed, without keys", &k3, &r3);
    let fs = Fs::open_with(&img, with_keys(false)).unwrap();
    let mut b = vec![0u8; 4096];
    assert_eq!(fs.read(fs.resolve("/enc/renamed-within", true).unwrap(), 0, &mut b).unwrap(), 4096);
    assert_eq!(b, bytes(2, 4096));
    let mut b = vec![0u8; 4095];
    assert_eq!(fs.read(fs.resolve("/plain/moved-out", true).unwrap(), 0, &mut b).unwrap(), 4095);
    assert_eq!(b, bytes(1, 4095));
    assert!(fs.resolve("/enc4/size-1", true).is_err());
    assert_eq!(fs.getattr(small4).unwrap().nlink, 3);
    drop(fs);
    refusals_match_the_kernel(&img);
}

/// The errnos of what encryption refuses, from rext4 and from the kernel on copies of the
/// same image: with the keys, links and renames across policies; without, new names, renames
/// and links in an encrypted directory, and reads.
fn refusals_match_the_kernel(img: &Path) {
    let copy = |n: &str| {
        let p = img.with_file_name(n);
        std::fs::copy(img, &p).unwrap();
        p
    };
    let errno = |r: std::io::Result<()>| r.err().and_then(|e| e.raw_os_error()).unwrap_or(0);
    let (ours, theirs) = (copy("ours.img"), copy("theirs.img"));
    let mut kernel = Vec::new();
    for with_key in [true, false] {
        let m = KernelMount::rw(&theirs).expect("mount");
        let p = |s: &str| m.path().join(s);
        if with_key {
            add_both_keys(m.path());
            kernel.push(errno(std::fs::rename(p("plain/a.txt"), p("enc/in"))));
            kernel.push(errno(std::fs::hard_link(p("plain/a.txt"), p("enc/in"))));
            kernel.push(errno(std::fs::hard_link(p("enc4/small.txt"), p("enc/in"))));
            kernel.push(errno(std::fs::rename(p("enc4/small.txt"), p("encv1/in"))));
        } else {
            let some = std::fs::read_dir(p("enc"))
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|q| q.is_file())
                .unwrap();
            kernel.push(errno(std::fs::write(p("enc/new"), b"x")));
            kernel.push(errno(std::fs::create_dir(p("enc/new"))));
            kernel.push(errno(std::os::unix::fs::symlink("t", p("enc/new"))));
            kernel.push(errno(std::fs::rename(&some, p("enc/other"))));
            kernel.push(errno(std::fs::hard_link(&some, p("enc/other"))));
            kernel.push(errno(std::fs::read(&some).map(|_| ())));
        }
        m.unmount().unwrap();
    }
    let mut rext = Vec::new();
    let e = |r: rext4::Result<rext4::Attr>| r.err().map_or(0, |e| e.errno());
    for with_key in [true, false] {
        let opts = if with_key { with_keys(true) } else { Options { writable: true, ..Options::default() } };
        let fs = Fs::open_with(&ours, opts).unwrap();
        let at = |s: &str| fs.resolve(s, true).unwrap();
        let (enc, plain) = (at("/enc"), at("/plain"));
        if with_key {
            rext.push(fs.rename(plain, b"a.txt", enc, b"in", 0).err().map_or(0, |e| e.errno()));
            rext.push(e(fs.link(at("/plain/a.txt"), enc, b"in")));
            rext.push(e(fs.link(at("/enc4/small.txt"), enc, b"in")));
            rext.push(
                fs.rename(at("/enc4"), b"small.txt", at("/encv1"), b"in", 0).err().map_or(0, |e| e.errno()),
            );
        } else {
            let some = fs
                .children(enc)
                .unwrap()
                .into_iter()
                .find(|c| c.kind == Some(rext4::FileType::RegularFile))
                .unwrap();
            rext.push(e(fs.create(enc, b"new", 0o644, 0, 0)));
            rext.push(e(fs.mkdir(enc, b"new", 0o755, 0, 0)));
            rext.push(e(fs.symlink(enc, b"new", b"t", 0, 0)));
            rext.push(fs.rename(enc, &some.name, enc, b"other", 0).err().map_or(0, |e| e.errno()));
            rext.push(e(fs.link(some.ino, enc, b"other")));
            rext.push(fs.read(some.ino, 0, &mut [0u8; 8]).err().map_or(0, |e| e.errno()));
        }
        fs.unmount().unwrap();
    }
    assert_eq!(rext, kernel, "errnos: rext4 left, the kernel right");
    assert!(kernel.iter().all(|&x| x != 0), "every one is refused: {kernel:?}");
    e2fsck_clean(&ours);
}

/// One step of the write model.
fn model_step(fs: &Fs, rng: &mut Rng, ino: InodeNo, model: &mut Vec<u8>) {
    let bs = 4096u64;
    let size = model.len() as u64;
    let pick = |rng: &mut Rng, hi: u64| if hi == 0 { 0 } else { rng.below(hi) };
    match rng.below(8) {
        0..=2 => {
            // A write anywhere up to a little past the end, block-aligned or not.
            let off = if rng.below(3) == 0 { pick(rng, size / bs + 2) * bs } else { pick(rng, size + 9000) };
            let most = if rng.below(4) == 0 { 70_000 } else { 5000 };
            let len = 1 + pick(rng, most) as usize;
            let data = bytes(rng.next_u64(), len);
            assert_eq!(fs.write(ino, off, &data).unwrap(), len);
            let end = off as usize + len;
            if model.len() < end {
                model.resize(end, 0);
            }
            model[off as usize..end].copy_from_slice(&data);
        }
        3 => {
            let to = pick(rng, size + 3 * bs);
            fs.setattr(ino, &rext4::SetAttr { size: Some(to), ..rext4::SetAttr::default() }).unwrap();
            model.resize(to as usize, 0);
        }
        4 => {
            let off = pick(rng, size + 1);
            let len = 1 + pick(rng, 3 * bs);
            fs.fallocate(ino, rext4::FALLOC_FL_PUNCH_HOLE | rext4::FALLOC_FL_KEEP_SIZE, off, len).unwrap();
            let end = ((off + len) as usize).min(model.len());
            if (off as usize) < end {
                model[off as usize..end].fill(0);
            }
        }
        5 => {
            let off = pick(rng, size + 1);
            let len = 1 + pick(rng, 3 * bs);
            fs.fallocate(ino, rext4::FALLOC_FL_ZERO_RANGE, off, len).unwrap();
            let end = (off + len) as usize;
            if model.len() < end {
                model.resize(end, 0);
            }
            model[off as usize..end].fill(0);
        }
        6 => {
            // Preallocated space past the end, then written into in part.
            let off = size + pick(rng, bs);
            fs.fallocate(ino, rext4::FALLOC_FL_KEEP_SIZE, off, 3 * bs).unwrap();
            let data = bytes(rng.next_u64(), 100 + pick(rng, 2000) as usize);
            let at = off + pick(rng, bs);
            fs.write(ino, at, &data).unwrap();
            model.resize(at as usize, 0);
            model.extend_from_slice(&data);
        }
        _ => {
            let mut got = vec![0u8; model.len() + 10];
            let n = fs.read(ino, 0, &mut got).unwrap();
            let bad = got[..n].iter().zip(model.iter()).position(|(a, b)| a != b);
            assert!(
                n == model.len() && bad.is_none(),
                "read back {n} bytes of {}, first wrong at {bad:?}",
                model.len()
            );
        }
    }
}

/// rext4 makes files, directories, symlinks and special files in encrypted directories and
/// writes contents with the key (writes at any offset, truncates, punched and zeroed ranges,
/// preallocated space); e2fsck is clean, the kernel with the key reads exactly the model's
/// bytes and rext4's names and targets, and appends the kernel makes to rext4's files read
/// back in rext4. Without the key the kernel lists the new names as rext4 does.
#[test]
fn encrypted_files_written_with_keys() {
    require_fscrypt!();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("enc.img");
    Image::ext4("256M").features("encrypt").build(&img);
    kernel_writes_tree(&img);
    let fs = Fs::open_with(&img, with_keys(true)).unwrap();
    let mut models: Vec<(String, Vec<u8>)> = Vec::new();
    for (d, seed) in [("enc", 1u64), ("enc4", 2), ("encv1", 3)] {
        let parent = fs.resolve(format!("/{d}"), true).unwrap();
        let sub = fs.mkdir(parent, b"made-by-rext4", 0o755, 0, 0).unwrap().ino;
        let mut rng = Rng::new(seed);
        for f in 0..4 {
            let name = format!("file-{f}-{}", "x".repeat(f * 60));
            let ino = fs.create(sub, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
            let mut model = Vec::new();
            for _ in 0..40 {
                model_step(&fs, &mut rng, ino, &mut model);
            }
            models.push((format!("/{d}/made-by-rext4/{name}"), model));
        }
        fs.symlink(sub, b"short", b"file-0-", 0, 0).unwrap();
        fs.symlink(sub, b"long", "deep/".repeat(100).as_bytes(), 0, 0).unwrap();
        assert!(matches!(fs.symlink(sub, b"too-long", &[b'a'; 4094], 0, 0), Err(Error::NameTooLong)));
        fs.mknod(sub, b"fifo", libc::S_IFIFO as u16 | 0o644, (0, 0), 0, 0).unwrap();
        let t = fs.tmpfile(sub, 0o600, 0, 0).unwrap().ino;
        fs.write(t, 0, b"from a tmpfile").unwrap();
        fs.link(t, sub, b"was-tmpfile").unwrap();
        fs.release(t).unwrap();
        models.push((format!("/{d}/made-by-rext4/was-tmpfile"), b"from a tmpfile".to_vec()));
        let big = fs.mkdir(sub, b"many", 0o755, 0, 0).unwrap().ino;
        for i in 0..300 {
            fs.create(big, format!("entry-{i:04}-of-an-indexed-directory").as_bytes(), 0o644, 0, 0).unwrap();
        }
        assert!(matches!(fs.lookup(sub, b"file-1-"), Err(Error::NotFound)));
        assert!(matches!(
            fs.fallocate(
                fs.lookup(sub, b"was-tmpfile").unwrap().ino,
                rext4::FALLOC_FL_COLLAPSE_RANGE,
                0,
                4096
            ),
            Err(Error::NotSupported(_))
        ));
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    with_keys_matches_kernel(&img, "written by rext4");

    // The kernel reads the model's bytes, and appends; rext4 reads the appends.
    let m = KernelMount::rw(&img).expect("mount");
    add_both_keys(m.path());
    for (p, model) in &models {
        let got = std::fs::read(m.path().join(&p[1..])).unwrap();
        assert!(got == *model, "{p}: the kernel reads other bytes ({} against {})", got.len(), model.len());
        let mut f = std::fs::OpenOptions::new().append(true).open(m.path().join(&p[1..])).unwrap();
        std::io::Write::write_all(&mut f, b"kernel tail").unwrap();
    }
    assert_eq!(std::fs::read_link(m.path().join("enc/made-by-rext4/long")).unwrap().as_os_str().len(), 500);
    assert_eq!(std::fs::read_dir(m.path().join("enc4/made-by-rext4/many")).unwrap().count(), 300);
    m.unmount().unwrap();
    e2fsck_clean(&img);
    let fs = Fs::open_with(&img, with_keys(false)).unwrap();
    for (p, model) in &models {
        let ino = fs.resolve(p, true).unwrap();
        let mut got = vec![0u8; model.len() + 20];
        let n = fs.read(ino, 0, &mut got).unwrap();
        assert!(
            got[..n] == [&model[..], b"kernel tail"].concat()[..],
            "{p}: rext4 reads other bytes after the kernel's append"
        );
    }
    drop(fs);
    let (k, r) = nokey_views(&img);
    assert_same_views("rext4's files without keys", &k, &r);
}

/// rext4 encrypts empty directories itself (`FS_IOC_SET_ENCRYPTION_POLICY`), also on an
/// `inline_data` image whose new directories live in the record; what it makes in them the
/// kernel reads with the key and lists without it as rext4 does. The policy's refusals.
#[test]
fn policies_set_by_rext4_read_by_the_kernel() {
    require_fscrypt!();
    for (name, features) in [("plain", "encrypt"), ("inline", "encrypt,inline_data")] {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("p.img");
        Image::ext4("64M").features(features).build(&img);
        let fs = Fs::open_with(&img, with_keys(true)).unwrap();
        let (v2, v1) = keys();
        let (k2, k1) = (EncryptionKey::new(v2).unwrap(), EncryptionKey::v1(V1_DESC, v1).unwrap());
        let root = fs.root();
        for (d, key, pad) in [("v2", &k2, 16u8), ("v1", &k1, 32)] {
            let ino = fs.mkdir(root, d.as_bytes(), 0o755, 0, 0).unwrap().ino;
            fs.set_encryption_policy(ino, key, pad).unwrap();
            fs.set_encryption_policy(ino, key, pad).unwrap();
            assert!(matches!(fs.set_encryption_policy(ino, key, 4), Err(Error::Exists)), "{name}");
            let sub = fs.mkdir(ino, b"sub", 0o755, 0, 0).unwrap().ino;
            let f = fs.create(sub, b"file", 0o644, 0, 0).unwrap().ino;
            fs.write(f, 0, &bytes(9, 12_345)).unwrap();
            fs.symlink(ino, b"link", b"sub/file", 0, 0).unwrap();
            for i in 0..150 {
                fs.create(ino, format!("name-{i}").as_bytes(), 0o644, 0, 0).unwrap();
            }
            // The policy a file already has is no change, as for the kernel; another is EEXIST.
            fs.set_encryption_policy(f, key, pad).unwrap();
            assert!(
                matches!(fs.set_encryption_policy(f, key, 8), Err(Error::Exists)),
                "{name}: encrypted file"
            );
        }
        let full = fs.mkdir(root, b"full", 0o755, 0, 0).unwrap().ino;
        fs.create(full, b"x", 0o644, 0, 0).unwrap();
        assert!(matches!(fs.set_encryption_policy(full, &k2, 32), Err(Error::NotEmpty)));
        let file = fs.create(root, b"afile", 0o644, 0, 0).unwrap().ino;
        assert!(matches!(fs.set_encryption_policy(file, &k2, 32), Err(Error::NotDir)));
        let empty = fs.mkdir(root, b"empty", 0o755, 0, 0).unwrap().ino;
        assert!(matches!(fs.set_encryption_policy(empty, &k2, 5), Err(Error::InvalidInput(_))));
        let other = EncryptionKey::new(vec![1; 64]).unwrap();
        assert!(
            matches!(fs.set_encryption_policy(empty, &other, 32), Err(Error::NoKey)),
            "v2 needs its key added"
        );
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img);
        with_keys_matches_kernel_at(&img, name, "/v2/sub/file");
        let (k, r) = nokey_views(&img);
        assert_same_views(name, &k, &r);
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("n.img");
    Image::ext4("32M").build(&img);
    let fs = Fs::open_with(&img, with_keys(true)).unwrap();
    let (v2, _) = keys();
    assert!(matches!(
        fs.set_encryption_policy(fs.root(), &EncryptionKey::new(v2).unwrap(), 32),
        Err(Error::NotSupported(_))
    ));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}

/// Keys added and removed while the filesystem is open (`FS_IOC_ADD_ENCRYPTION_KEY`,
/// `_REMOVE_`, `_GET_KEY_STATUS`): one open filesystem shows the kernel's no-key view, then
/// with the keys added everything the kernel shows with them, then without them the no-key
/// view again; v2 keys held per user as the kernel holds them; policies set by a caller
/// (owner and key checks, the kernel's refusals), read back with their nonces; the files made
/// under them read by the kernel.
#[test]
fn keys_added_and_removed_while_open() {
    use rext4::format::fscrypt::{Context, KeySpec};
    use rext4::{Caps, Creds};
    require_fscrypt!();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("k.img");
    Image::ext4("256M").features("encrypt").build(&img);
    kernel_writes_tree(&img);
    let (kernel_nokey_view, _) = nokey_views(&img);
    let kernel_with_keys = {
        let m = KernelMount::ro(&img).expect("mount");
        add_both_keys(m.path());
        let w = walk_kernel(m.path());
        m.unmount().unwrap();
        w
    };

    // Without access times, so that the walks compare with the kernel's read-only mounts.
    let opts = Options { writable: true, atime: rext4::AtimeMode::NoAtime, ..Options::default() };
    let fs = Fs::open_with(&img, opts).unwrap();
    let nokey = |fs: &Fs| {
        let mut r = BTreeMap::new();
        rext4_nokey(fs, fs.root(), "", &mut r);
        r
    };
    assert_same_views("opened without keys", &kernel_nokey_view, &nokey(&fs));
    let (v2, v1) = keys();
    let (k2, k1) = (EncryptionKey::new(v2).unwrap(), EncryptionKey::v1(V1_DESC, v1).unwrap());
    let (root, alice, bob) = (Creds::root(), Creds::user(1000, 1000, &[]), Creds::user(1001, 1001, &[]));
    fn errno<T>(r: rext4::Result<T>) -> Result<(), i32> {
        r.map(|_| ()).map_err(|e| e.errno())
    }
    assert_eq!(errno(fs.add_encryption_key(&alice, &k1)), Err(libc::EACCES), "v1 keys are root's");
    fs.add_encryption_key(&root, &k1).unwrap();
    fs.add_encryption_key(&alice, &k2).unwrap();
    fs.add_encryption_key(&alice, &k2).unwrap();
    let mut report = Report::default();
    report.add(
        "keys added while open vs kernel with keys",
        diff_full("kernel", &kernel_with_keys, "rext4", &walk_rext4(&fs, None)),
    );
    report.finish();

    // Claims: the key stays while a user who added it has not removed it.
    fs.add_encryption_key(&bob, &k2).unwrap();
    let st = fs.encryption_key_status(&alice, k2.spec()).unwrap();
    assert_eq!((st.present, st.added_by_self, st.user_count), (true, true, 2));
    assert!(!fs.encryption_key_status(&root, k2.spec()).unwrap().added_by_self);
    assert_eq!(
        errno(fs.remove_encryption_key(&root, k2.spec(), false)),
        Err(libc::ENOKEY),
        "root never added it"
    );
    assert_eq!(errno(fs.remove_encryption_key(&bob, k2.spec(), true)), Err(libc::EACCES));
    assert_eq!(errno(fs.remove_encryption_key(&bob, k1.spec(), false)), Err(libc::EACCES), "v1 is root's");
    assert!(fs.remove_encryption_key(&bob, k2.spec(), false).unwrap(), "alice still holds it");
    assert_eq!(errno(fs.remove_encryption_key(&bob, k2.spec(), false)), Err(libc::ENOKEY));
    let enc_file = fs.resolve("/enc/size-5000", true).unwrap();
    let mut b = vec![0u8; 5000];
    assert_eq!(fs.read(enc_file, 0, &mut b).unwrap(), 5000, "still readable");
    assert!(!fs.remove_encryption_key(&alice, k2.spec(), false).unwrap());
    assert!(!fs.remove_encryption_key(&root, k1.spec(), false).unwrap());
    let st = fs.encryption_key_status(&alice, k2.spec()).unwrap();
    assert_eq!((st.present, st.added_by_self, st.user_count), (false, false, 0));
    // The inode read with the key a moment ago is without it now, as are all the others.
    assert_eq!(errno(fs.read(enc_file, 0, &mut b)), Err(libc::ENOKEY));
    assert_same_views("keys removed while open", &kernel_nokey_view, &nokey(&fs));
    let enc = fs.resolve("/enc", true).unwrap();
    assert_eq!(errno(fs.create(enc, b"new", 0o644, 0, 0)), Err(libc::ENOKEY));

    // Policies set by a caller.
    let plain = fs.resolve("/plain", true).unwrap();
    let mine = fs.mkdir(fs.root(), b"alice", 0o755, 1000, 1000).unwrap().ino;
    let policy = |key: &EncryptionKey, flags: u8| {
        let head: &[u8] = match key.spec() {
            KeySpec::Identifier(_) => &[2, 1, 4, flags, 0, 0, 0, 0],
            KeySpec::Descriptor(_) => &[0, 1, 4, flags],
        };
        let id: Vec<u8> = (0..key.id_hex().len() / 2)
            .map(|i| u8::from_str_radix(&key.id_hex()[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        Context::from_policy(&[head, &id].concat()).unwrap()
    };
    let p2 = policy(&k2, 3);
    assert_eq!(errno(fs.set_encryption_policy_as(&alice, mine, &p2)), Err(libc::ENOKEY), "key not added");
    assert_eq!(errno(fs.set_encryption_policy_as(&bob, mine, &p2)), Err(libc::EACCES), "not the owner");
    fs.add_encryption_key(&alice, &k2).unwrap();
    let mut bad = p2.clone();
    bad.filenames_mode = 6;
    assert_eq!(errno(fs.set_encryption_policy_as(&alice, mine, &bad)), Err(libc::EINVAL));
    bad.filenames_mode = 10;
    assert_eq!(errno(fs.set_encryption_policy_as(&alice, mine, &bad)), Err(libc::EOPNOTSUPP), "HCTR2");
    assert_eq!(errno(fs.set_encryption_policy_as(&alice, plain, &p2)), Err(libc::EACCES), "root's directory");
    assert_eq!(errno(fs.set_encryption_policy_as(&root, plain, &p2)), Err(libc::ENOTEMPTY), "FOWNER passes");
    assert_eq!(errno(fs.encryption_policy(plain)), Err(libc::ENODATA));
    fs.set_encryption_policy_as(&alice, mine, &p2).unwrap();
    fs.set_encryption_policy_as(&alice, mine, &p2).unwrap();
    assert_eq!(errno(fs.set_encryption_policy_as(&alice, mine, &policy(&k2, 0))), Err(libc::EEXIST));
    assert_eq!(fs.encryption_policy(mine).unwrap().to_policy(), p2.to_policy());
    let f = fs.create(mine, b"diary", 0o600, 1000, 1000).unwrap().ino;
    fs.write(f, 0, &bytes(77, 10_000)).unwrap();
    fs.mkdir(mine, b"sub", 0o700, 1000, 1000).unwrap();
    assert_ne!(fs.encryption_nonce(mine).unwrap(), fs.encryption_nonce(f).unwrap());
    // Another user's v2 policy is refused even with the key here; CAP_FOWNER passes.
    let theirs = fs.mkdir(fs.root(), b"bob", 0o755, 1001, 1001).unwrap().ino;
    assert_eq!(errno(fs.set_encryption_policy_as(&bob, theirs, &p2)), Err(libc::ENOKEY));
    fs.set_encryption_policy_as(&bob.clone().with_caps(Caps::FOWNER), theirs, &p2).unwrap();
    // The v1 key root adds again; a policy with it.
    fs.add_encryption_key(&root, &k1).unwrap();
    let v1dir = fs.mkdir(fs.root(), b"v1dir", 0o755, 0, 0).unwrap().ino;
    fs.set_encryption_policy_as(&root, v1dir, &policy(&k1, 1)).unwrap();
    let g = fs.create(v1dir, b"old-style", 0o644, 0, 0).unwrap().ino;
    fs.write(g, 0, b"v1 contents").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    with_keys_matches_kernel_at(&img, "policies set by callers", "/alice/diary");
    let (k, r) = nokey_views(&img);
    assert_same_views("policies set by callers, without keys", &k, &r);
}

/// A key removed and added again and again while a writer and readers work on encrypted
/// files (of 512 blocks, so most writes map new ones): every write either fails whole with
/// `ENOKEY` before it changes anything, or lands whole; every read returns exactly what the
/// successful writes left or `ENOKEY`; the image stays e2fsck-clean and the kernel reads each
/// file as the last successful writes left it.
#[test]
fn keys_come_and_go_under_writers_and_readers() {
    use rext4::Creds;
    use std::sync::atomic::{AtomicBool, Ordering};
    require_fscrypt!();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("race.img");
    Image::ext4("128M").features("encrypt").build(&img);
    let (v2, _) = keys();
    let key = EncryptionKey::new(v2).unwrap();
    let fs = Fs::open_with(&img, Options { writable: true, ..Options::default() }).unwrap();
    fs.add_encryption_key(&Creds::root(), &key).unwrap();
    let enc = fs.mkdir(fs.root(), b"enc", 0o755, 0, 0).unwrap().ino;
    fs.set_encryption_policy(enc, &key, 32).unwrap();
    const BLOCK: usize = 4096;
    const BLOCKS: u64 = 512;
    let files: Vec<InodeNo> =
        (0..2).map(|i| fs.create(enc, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino).collect();
    // Block b of a file holds a generation g written whole: 4096 bytes of (b, g) pairs.
    let block_of = |b: u64, g: u8| -> Vec<u8> { [b as u8, g].repeat(BLOCK / 2) };
    let stop = AtomicBool::new(false);
    // Each block's generation (0: never written), behind a lock of its own: a read of a block
    // waits for a write of that block (racing, it could see some of each, on ext4 too), but
    // not for writes of the file's other blocks, so readers and the writer meet in the file's
    // keys. What races here is the key.
    let models: Vec<Vec<std::sync::Mutex<u8>>> =
        files.iter().map(|_| (0..BLOCKS).map(|_| std::sync::Mutex::new(0u8)).collect()).collect();
    let (mut writes, mut refused) = (0u64, 0u64);
    let (fs_ref, key_ref, block_of) = (&fs, &key, &block_of);
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..300 {
                let _ = fs_ref.remove_encryption_key(&Creds::root(), key_ref.spec(), true);
                std::thread::yield_now();
                fs_ref.add_encryption_key(&Creds::root(), key_ref).unwrap();
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            stop.store(true, Ordering::Relaxed);
        });
        for (i, &f) in files.iter().enumerate() {
            let (stop, models, fs) = (&stop, &models, fs_ref);
            s.spawn(move || {
                let mut buf = vec![0u8; BLOCK];
                let mut rng = Rng::new(i as u64);
                while !stop.load(Ordering::Relaxed) {
                    let b = rng.next_u64() % BLOCKS;
                    let g = models[i][b as usize].lock().unwrap();
                    match fs.read(f, b * BLOCK as u64, &mut buf) {
                        // Past the end: never written (a later block may be, meanwhile).
                        Ok(0) => assert_eq!(*g, 0, "file {i} block {b}: written, read as past the end"),
                        Ok(n) => {
                            let want = if *g == 0 { vec![0; BLOCK] } else { block_of(b, *g) };
                            let at = buf[..n].iter().zip(&want).position(|(x, y)| x != y);
                            assert!(
                                n == BLOCK && at.is_none(),
                                "file {i} block {b}: {n} bytes, generation {} differs at byte {at:?}",
                                *g
                            );
                        }
                        Err(e) => assert_eq!(e.errno(), libc::ENOKEY, "read: {e}"),
                    }
                }
            });
        }
        let mut rng = Rng::new(99);
        while !stop.load(Ordering::Relaxed) {
            let i = (rng.next_u64() % 2) as usize;
            let b = rng.next_u64() % BLOCKS;
            let mut g = models[i][b as usize].lock().unwrap();
            let next = g.wrapping_add(1).max(1);
            match fs.write(files[i], b * BLOCK as u64, &block_of(b, next)) {
                Ok(n) => {
                    assert_eq!(n, BLOCK);
                    *g = next;
                    writes += 1;
                }
                Err(e) => {
                    assert_eq!(e.errno(), libc::ENOKEY, "write: {e}");
                    refused += 1;
                }
            }
        }
    });
    assert!(writes > 50 && refused > 0, "{writes} writes, {refused} refused: the race was run");
    let want: Vec<Vec<u8>> = models
        .iter()
        .map(|m| {
            let m: Vec<u8> = m.iter().map(|g| *g.lock().unwrap()).collect();
            let last = m.iter().rposition(|&g| g != 0).map_or(0, |p| p + 1);
            (0..last)
                .flat_map(|b| if m[b] == 0 { vec![0; BLOCK] } else { block_of(b as u64, m[b]) })
                .collect()
        })
        .collect();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    let m = KernelMount::ro(&img).expect("mount");
    fscrypt_add_key(m.path(), &keys().0, None);
    for (i, w) in want.iter().enumerate() {
        assert!(
            std::fs::read(m.path().join(format!("enc/f{i}"))).unwrap() == *w,
            "file {i} as the kernel reads it"
        );
    }
}

/// A key given at open belongs to no user: a user's claim on it comes and goes and the key
/// stays; only a removal for all users (root) takes it.
#[test]
fn keys_given_at_open_stay_until_removed_for_all_users() {
    use rext4::Creds;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("o.img");
    Image::ext4("32M").features("encrypt").build(&img);
    let fs = Fs::open_with(&img, with_keys(true)).unwrap();
    let (v2, _) = keys();
    let k = EncryptionKey::new(v2).unwrap();
    let user = Creds::user(1000, 1000, &[]);
    let st = fs.encryption_key_status(&user, k.spec()).unwrap();
    assert_eq!((st.present, st.added_by_self, st.user_count), (true, false, 0));
    assert_eq!(fs.remove_encryption_key(&user, k.spec(), false).map_err(|e| e.errno()), Err(libc::ENOKEY));
    fs.add_encryption_key(&user, &k).unwrap();
    assert!(fs.remove_encryption_key(&user, k.spec(), false).unwrap(), "the key stays");
    assert!(fs.encryption_key_status(&user, k.spec()).unwrap().present);
    assert!(!fs.remove_encryption_key(&Creds::root(), k.spec(), true).unwrap());
    assert!(!fs.encryption_key_status(&user, k.spec()).unwrap().present);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}
