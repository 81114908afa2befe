//! Extended attribute writes: placement in the inode and in blocks, shared blocks and their
//! reference counts, ACLs, the kernel's errnos. Every image is `e2fsck -fn` clean afterwards
//! and the kernel (`getfattr -d -m -`, `getfacl`) sees what rext4 wrote; where the kernel can
//! do the same thing, its result (errno, on-disk bytes) is the expected one.

mod common;

use common::{e2fsck_clean, KernelMount};
use rext4::{Fs, InodeNo, Options, XATTR_CREATE, XATTR_REPLACE};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

const U: u32 = u32::MAX;
const ACL_USER_OBJ: u16 = 0x01;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_GROUP: u16 = 0x08;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;

/// A 32 MiB image; 4 KiB blocks unless `args` say otherwise (mkfs picks 1 KiB for so small a
/// filesystem).
fn mkfs(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    let mut all = args.to_vec();
    if !args.contains(&"-b") {
        all.extend(["-b", "4096"]);
    }
    common::mkfs(None, &img, &all, "32M");
    img
}

fn rw(img: &Path) -> Fs {
    Fs::open_with(img, Options { writable: true, ..Options::default() }).unwrap()
}

#[track_caller]
fn ino(fs: &Fs, path: &str) -> InodeNo {
    fs.resolve(path, false).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn errno<T>(r: rext4::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.errno(),
    }
}

/// Every attribute of `path` as rext4 lists and reads it.
fn rext4_xattrs(fs: &Fs, path: &str) -> Xattrs {
    let i = ino(fs, path);
    let names = fs.listxattr(i).unwrap_or_else(|e| panic!("{path}: listxattr: {e}"));
    names
        .into_iter()
        .map(|n| {
            let v = fs.getxattr(i, &n).unwrap_or_else(|e| panic!("{path}: getxattr: {e}"));
            (n, v)
        })
        .collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

/// What `getfattr -h -d -m - -e hex` shows for `path` below the mount point `mnt`.
fn getfattr(mnt: &Path, path: &str) -> Xattrs {
    let full = mnt.join(path.trim_start_matches('/'));
    let o = Command::new(common::tool("getfattr"))
        .args(["-h", "-d", "-m", "-", "-e", "hex", "--absolute-names"])
        .arg(&full)
        .output()
        .expect("getfattr (package attr) is required");
    assert!(o.status.success(), "getfattr {}: {}", full.display(), String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (n, v) = l.split_once("=0x").unwrap_or_else(|| panic!("getfattr line {l:?}"));
            (n.as_bytes().to_vec(), unhex(v))
        })
        .collect()
}

/// Closes `fs`, then checks the image: `e2fsck -fn` clean, and every path's attributes as a
/// fresh rext4 open and the kernel see them equal to `expected`.
fn finish(fs: Fs, img: &Path, expected: &[(&str, Xattrs)]) {
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(img);
    let again = Fs::open(img).unwrap();
    for (p, want) in expected {
        assert_eq!(&rext4_xattrs(&again, p), want, "{p}: rext4 after reopening");
    }
    match KernelMount::ro(img) {
        Ok(km) => {
            for (p, want) in expected {
                assert_eq!(&getfattr(km.path(), p), want, "{p}: as the kernel sees it");
            }
            km.unmount().unwrap();
        }
        Err(e) => eprintln!("skipping the kernel comparison: {e}"),
    }
}

/// A POSIX ACL in the VFS xattr format.
fn vfs_acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

fn debugfs(img: &Path, req: &str) -> String {
    let o = Command::new(common::tool("debugfs")).arg("-R").arg(req).arg(img).output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The xattr block of `path` (`i_file_acl`), 0 if none.
fn file_acl(img: &Path, path: &str) -> u64 {
    let out = debugfs(img, &format!("stat {path}"));
    let v = out.split("File ACL: ").nth(1).unwrap_or_else(|| panic!("debugfs stat {path}: {out}"));
    v.split_whitespace().next().unwrap().parse().unwrap()
}

fn block_size(img: &Path) -> usize {
    let fs = Fs::open(img).unwrap();
    fs.block_size() as usize
}

fn read_block(img: &Path, blk: u64) -> Vec<u8> {
    let bs = block_size(img);
    let all = std::fs::read(img).unwrap();
    all[blk as usize * bs..(blk as usize + 1) * bs].to_vec()
}

fn refcount(img: &Path, blk: u64) -> u32 {
    let b = read_block(img, blk);
    u32::from_le_bytes([b[4], b[5], b[6], b[7]])
}

/// The on-disk inode record of `path` (`debugfs imap`).
fn inode_record(img: &Path, path: &str) -> Vec<u8> {
    let out = debugfs(img, &format!("imap {path}"));
    let at = out.split("located at block ").nth(1).unwrap_or_else(|| panic!("imap {path}: {out}"));
    let (blk, off) = at.trim().split_once(", offset 0x").unwrap();
    let blk: usize = blk.parse().unwrap();
    let off = usize::from_str_radix(off.trim(), 16).unwrap();
    let isize: usize = debugfs(img, "stats")
        .lines()
        .find_map(|l| l.strip_prefix("Inode size:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let all = std::fs::read(img).unwrap();
    let at = blk * block_size(img) + off;
    all[at..at + isize].to_vec()
}

#[track_caller]
fn set(fs: &Fs, path: &str, name: &str, value: &[u8]) {
    fs.setxattr(ino(fs, path), name.as_bytes(), value, 0).unwrap_or_else(|e| panic!("{path} {name}: {e}"));
}

fn map(pairs: &[(&str, &[u8])]) -> Xattrs {
    pairs.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.to_vec())).collect()
}

#[test]
fn set_replace_remove_in_inode_and_in_block() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [
        ("default", &[][..]),
        ("inode128", &["-I", "128"][..]),
        ("nocsum", &["-O", "^metadata_csum"][..]),
        ("ext2_1k", &["-t", "ext2", "-b", "1024"][..]),
    ] {
        let img = mkfs(dir.path(), name, args);
        let fs = rw(&img);
        let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
        let small_inode = args.contains(&"128");
        let sectors = fs.block_size() as u64 / 512;
        let before = fs.getattr(f).unwrap();
        // 128-byte records keep whole seconds.
        std::thread::sleep(std::time::Duration::from_millis(if small_inode { 1100 } else { 20 }));
        set(&fs, "/f", "user.a", b"alpha");
        let after = fs.getattr(f).unwrap();
        assert!(after.ctime > before.ctime, "{name}: ctime moves");
        assert_eq!(after.mtime, before.mtime, "{name}: mtime stays");
        // A small value lives in the inode where there is room; in a block otherwise.
        assert_eq!(after.blocks, if small_inode { sectors } else { 0 }, "{name}: blocks after a small value");
        // Setting the same value again changes nothing, not even ctime.
        set(&fs, "/f", "user.a", b"alpha");
        assert_eq!(fs.getattr(f).unwrap().ctime, after.ctime, "{name}: same value");
        set(&fs, "/f", "trusted.t", b"");
        set(&fs, "/f", "security.s", &[0, 1, 2, 255]);
        let big = vec![b'B'; 500];
        set(&fs, "/f", "user.big", &big);
        assert_eq!(fs.getattr(f).unwrap().blocks, sectors, "{name}: one xattr block");
        set(&fs, "/f", "user.a", &[b'A'; 300]);
        set(&fs, "/f", "user.a", b"short again");
        set(&fs, "/f", "user.big", &big[..499]);
        assert_eq!(errno(fs.setxattr(f, b"user.a", b"x", XATTR_CREATE)), libc::EEXIST);
        assert_eq!(errno(fs.setxattr(f, b"user.nope", b"x", XATTR_REPLACE)), libc::ENODATA);
        fs.setxattr(f, b"user.c", b"created", XATTR_CREATE).unwrap();
        fs.setxattr(f, b"user.c", b"replaced", XATTR_REPLACE).unwrap();
        assert_eq!(errno(fs.removexattr(f, b"user.nope")), libc::ENODATA);
        fs.removexattr(f, b"user.big").unwrap();
        assert_eq!(errno(fs.getxattr(f, b"user.big")), libc::ENODATA);
        let want = map(&[
            ("user.a", b"short again"),
            ("trusted.t", b""),
            ("security.s", &[0, 1, 2, 255]),
            ("user.c", b"replaced"),
        ]);
        assert_eq!(rext4_xattrs(&fs, "/f"), want, "{name}");
        // Everything removed: no block left, nothing listed.
        let g = fs.create(fs.root(), b"g", 0o644, 0, 0).unwrap().ino;
        set(&fs, "/g", "user.x", &[1; 900]);
        set(&fs, "/g", "user.y", b"y");
        fs.removexattr(g, b"user.x").unwrap();
        fs.removexattr(g, b"user.y").unwrap();
        assert_eq!(fs.getattr(g).unwrap().blocks, 0, "{name}: block released");
        assert!(fs.listxattr(g).unwrap().is_empty());
        // Directories take attributes too.
        fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap();
        set(&fs, "/d", "user.dir", b"on a directory");
        finish(
            fs,
            &img,
            &[("/f", want), ("/g", Xattrs::new()), ("/d", map(&[("user.dir", b"on a directory")]))],
        );
    }
}

#[test]
fn many_attributes_spill_into_a_block_until_full() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [("default", &[][..]), ("1k", &["-b", "1024"][..]), ("inode128", &["-I", "128"][..])]
    {
        let img = mkfs(dir.path(), name, args);
        let fs = rw(&img);
        let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
        let mut want = Xattrs::new();
        let mut full_at = None;
        for i in 0..400 {
            let n = format!("user.attr-{i:03}-{}", "n".repeat(i % 17)).into_bytes();
            let v: Vec<u8> = (0..(i * 7) % 90).map(|k| (i + k) as u8).collect();
            match fs.setxattr(f, &n, &v, 0) {
                Ok(()) => {
                    want.insert(n, v);
                }
                Err(e) => {
                    assert_eq!(e.errno(), libc::ENOSPC, "{name}: attribute {i}");
                    full_at = Some(i);
                    break;
                }
            }
        }
        let full_at = full_at.unwrap_or_else(|| panic!("{name}: never full"));
        assert!(full_at > 10, "{name}: full after {full_at}");
        assert_eq!(rext4_xattrs(&fs, "/f"), want, "{name}: all readable when full");
        // Removing every other one makes room again.
        let names: Vec<_> = want.keys().cloned().collect();
        for n in names.iter().step_by(2) {
            fs.removexattr(f, n).unwrap();
            want.remove(n);
        }
        set(&fs, "/f", "user.after", b"room again");
        want.insert(b"user.after".to_vec(), b"room again".to_vec());
        assert_eq!(rext4_xattrs(&fs, "/f"), want, "{name}");
        finish(fs, &img, &[("/f", want)]);
    }
}

/// The same operations done by the kernel on one image and by rext4 on another leave the
/// same bytes: the in-inode area and the xattr block (all but its checksum) match exactly.
#[test]
fn layout_matches_the_kernel() {
    if !common::kernel_can_mount() {
        eprintln!("skipping: the kernel cannot mount here");
        return;
    }
    let acl = vfs_acl(&[
        (ACL_USER_OBJ, 6, U),
        (ACL_USER, 4, 1000),
        (ACL_GROUP_OBJ, 4, U),
        (ACL_GROUP, 6, 50),
        (ACL_MASK, 6, U),
        (ACL_OTHER, 4, U),
    ]);
    let ops: Vec<(&str, Option<Vec<u8>>)> = vec![
        ("user.a", Some(vec![1; 10])),
        ("user.bb", Some(vec![2; 30])),
        ("trusted.t", Some(vec![3; 5])),
        ("user.a", Some(vec![4; 40])),
        ("user.big", Some(vec![5; 300])),
        ("security.s", Some(vec![6; 7])),
        ("user.bb", None),
        ("user.a", Some(vec![7; 3])),
        ("user.big", Some(vec![8; 299])),
        ("system.posix_acl_access", Some(acl)),
        ("user.c1", Some(vec![9; 100])),
        ("user.c22", Some(vec![])),
        ("trusted.c333", Some(vec![10; 61])),
        ("user.a", Some(vec![11; 90])),
        ("user.big", None),
        ("user.c1", Some(vec![12; 1])),
        ("security.s", None),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [("default", &[][..]), ("inode128", &["-I", "128"][..]), ("1k", &["-b", "1024"][..])]
    {
        let kimg = mkfs(dir.path(), &format!("{name}-kernel"), args);
        let rimg = mkfs(dir.path(), &format!("{name}-rext4"), args);
        {
            let km = KernelMount::rw(&kimg).unwrap();
            let p = km.path().join("f");
            std::fs::write(&p, b"").unwrap();
            for (n, v) in &ops {
                match v {
                    Some(v) => xattr::set(&p, n, v).unwrap_or_else(|e| panic!("kernel set {n}: {e}")),
                    None => xattr::remove(&p, n).unwrap(),
                }
            }
            km.unmount().unwrap();
        }
        let fs = rw(&rimg);
        let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
        for (n, v) in &ops {
            match v {
                Some(v) => {
                    fs.setxattr(f, n.as_bytes(), v, 0).unwrap_or_else(|e| panic!("rext4 set {n}: {e}"))
                }
                None => fs.removexattr(f, n.as_bytes()).unwrap(),
            }
        }
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&rimg);
        e2fsck_clean(&kimg);
        let (kr, rr) = (inode_record(&kimg, "/f"), inode_record(&rimg, "/f"));
        if kr.len() > 128 {
            let extra = 128 + usize::from(u16::from_le_bytes([kr[0x80], kr[0x81]]));
            assert_eq!(&kr[0x80..0x82], &rr[0x80..0x82], "{name}: i_extra_isize");
            assert_eq!(kr[extra..], rr[extra..], "{name}: in-inode area");
        }
        let (kb, rb) = (file_acl(&kimg, "/f"), file_acl(&rimg, "/f"));
        assert!(kb != 0 && rb != 0, "{name}: both have a block");
        let (mut kd, mut rd) = (read_block(&kimg, kb), read_block(&rimg, rb));
        kd[0x10..0x14].fill(0);
        rd[0x10..0x14].fill(0);
        assert!(
            kd == rd,
            "{name}: xattr block differs:\nkernel {:02x?}\nrext4  {:02x?}",
            &kd[..128],
            &rd[..128]
        );
        // i_blocks agree too.
        assert_eq!(kr[0x1C..0x20], rr[0x1C..0x20], "{name}: i_blocks");
    }
}

#[test]
fn acls_are_stored_as_the_kernel_stores_them() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "acl", &[]);
    let fs = rw(&img);
    let root = fs.root();
    let f = fs.create(root, b"f", 0o777, 0, 0).unwrap().ino;
    let d = fs.mkdir(root, b"d", 0o777, 0, 0).unwrap().ino;
    let e = fs.create(root, b"equiv", 0o777, 0, 0).unwrap().ino;
    let l = fs.symlink(root, b"l", b"f", 0, 0).unwrap().ino;
    let access = vfs_acl(&[
        (ACL_USER_OBJ, 6, U),
        (ACL_USER, 4, 1000),
        (ACL_USER, 7, 1001),
        (ACL_GROUP_OBJ, 4, U),
        (ACL_GROUP, 2, 100),
        (ACL_MASK, 6, U),
        (ACL_OTHER, 0, U),
    ]);
    let default = vfs_acl(&[
        (ACL_USER_OBJ, 7, U),
        (ACL_USER, 5, 1234),
        (ACL_GROUP_OBJ, 5, U),
        (ACL_MASK, 7, U),
        (ACL_OTHER, 5, U),
    ]);
    fs.setxattr(f, b"system.posix_acl_access", &access, 0).unwrap();
    // The group bits become the mask.
    assert_eq!(fs.getattr(f).unwrap().mode & 0o7777, 0o660);
    assert_eq!(fs.getxattr(f, b"system.posix_acl_access").unwrap(), access);
    fs.setxattr(d, b"system.posix_acl_default", &default, 0).unwrap();
    fs.setxattr(d, b"system.posix_acl_access", &access, 0).unwrap();
    // An ACL that says no more than a mode is the mode (ids of such entries are ignored).
    fs.setxattr(
        e,
        b"system.posix_acl_access",
        &vfs_acl(&[(ACL_USER_OBJ, 6, 5), (ACL_GROUP_OBJ, 4, 7), (ACL_OTHER, 1, 9)]),
        0,
    )
    .unwrap();
    assert_eq!(fs.getattr(e).unwrap().mode & 0o7777, 0o641);
    assert_eq!(errno(fs.getxattr(e, b"system.posix_acl_access")), libc::ENODATA);
    // Flags do not apply to ACLs; removing an absent one succeeds (as in the kernel).
    fs.setxattr(f, b"system.posix_acl_access", &access, XATTR_CREATE).unwrap();
    fs.removexattr(e, b"system.posix_acl_access").unwrap();
    fs.removexattr(f, b"system.posix_acl_default").unwrap();
    // An empty value, or a header alone, removes.
    let g = fs.create(root, b"g", 0o644, 0, 0).unwrap().ino;
    fs.setxattr(g, b"system.posix_acl_access", &access, 0).unwrap();
    fs.setxattr(g, b"system.posix_acl_access", b"", 0).unwrap();
    assert!(fs.listxattr(g).unwrap().is_empty());
    // Errors.
    assert_eq!(errno(fs.setxattr(f, b"system.posix_acl_default", &default, 0)), libc::EACCES);
    assert_eq!(errno(fs.setxattr(l, b"system.posix_acl_access", &access, 0)), libc::EOPNOTSUPP);
    assert_eq!(errno(fs.setxattr(f, b"system.posix_acl_access", &1u32.to_le_bytes(), 0)), libc::EOPNOTSUPP);
    let no_mask =
        vfs_acl(&[(ACL_USER_OBJ, 6, U), (ACL_USER, 4, 1), (ACL_GROUP_OBJ, 4, U), (ACL_OTHER, 0, U)]);
    assert_eq!(errno(fs.setxattr(f, b"system.posix_acl_access", &no_mask, 0)), libc::EINVAL);
    assert_eq!(
        errno(fs.setxattr(f, b"system.posix_acl_access", &access[..access.len() - 1], 0)),
        libc::EINVAL
    );

    let stored = |p: &str| rext4_xattrs(&fs, p);
    let (wf, wd) = (stored("/f"), stored("/d"));
    assert_eq!(wd.len(), 2);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    let Ok(km) = KernelMount::ro(&img) else {
        eprintln!("skipping the kernel comparison");
        return;
    };
    let getfacl = |p: &str| {
        let o =
            Command::new(common::tool("getfacl")).args(["-n", "-p"]).arg(km.path().join(p)).output().unwrap();
        assert!(o.status.success());
        let text = String::from_utf8(o.stdout).unwrap();
        text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')).collect::<Vec<_>>().join("\n")
    };
    assert_eq!(
        getfacl("f"),
        "user::rw-\nuser:1000:r--\nuser:1001:rwx\t#effective:rw-\ngroup::r--\ngroup:100:-w-\nmask::rw-\nother::---"
    );
    assert_eq!(
        getfacl("d"),
        "user::rw-\nuser:1000:r--\nuser:1001:rwx\t#effective:rw-\ngroup::r--\ngroup:100:-w-\nmask::rw-\nother::---\n\
         default:user::rwx\ndefault:user:1234:r-x\ndefault:group::r-x\ndefault:mask::rwx\ndefault:other::r-x"
    );
    assert_eq!(getfacl("equiv"), "user::rw-\ngroup::r--\nother::--x");
    assert_eq!(getfattr(km.path(), "f"), wf);
    assert_eq!(getfattr(km.path(), "d"), wd);
    km.unmount().unwrap();
}

fn close(fs: Fs) {
    fs.unmount().unwrap();
}

#[test]
fn identical_attributes_share_one_block() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [("default", &[][..]), ("nocsum", &["-O", "^metadata_csum"][..])] {
        let img = mkfs(dir.path(), name, args);
        let fs = rw(&img);
        let root = fs.root();
        let free0 = fs.statfs().unwrap().blocks_free;
        let used = |fs: &Fs| free0 - fs.statfs().unwrap().blocks_free;
        let shared = map(&[("user.shared", &[b'S'; 200]), ("user.other", &[b'o'; 100])]);
        for i in 0..10 {
            let f = fs.create(root, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
            for (n, v) in &shared {
                fs.setxattr(f, n, v, 0).unwrap();
            }
            assert_eq!(
                fs.getattr(f).unwrap().blocks,
                fs.block_size() as u64 / 512,
                "{name}: i_blocks of f{i}"
            );
        }
        assert_eq!(used(&fs), 1, "{name}: one block for ten files");
        // Changing one copies the block first; changing it back shares again and frees the copy.
        set(&fs, "/f3", "user.other", &[b'y'; 100]);
        assert_eq!(used(&fs), 2, "{name}: the changed inode has its own block");
        set(&fs, "/f3", "user.other", &[b'o'; 100]);
        assert_eq!(used(&fs), 1, "{name}: shared again, copy freed");
        close(fs);
        let b = file_acl(&img, "/f0");
        for i in 1..10 {
            assert_eq!(file_acl(&img, &format!("/f{i}")), b, "{name}: f{i} shares the block");
        }
        assert_eq!(refcount(&img, b), 10);
        e2fsck_clean(&img);

        // Deleting drops references.
        let fs = rw(&img);
        for i in 0..9 {
            fs.unlink(root, format!("f{i}").as_bytes()).unwrap();
        }
        assert_eq!(used(&fs), 1);
        close(fs);
        assert_eq!(refcount(&img, b), 1);
        e2fsck_clean(&img);

        // The sole user rewrites it in place; a later file with the same attributes shares it.
        let fs = rw(&img);
        fs.removexattr(ino(&fs, "/f9"), b"user.other").unwrap();
        fs.create(root, b"late", 0o644, 0, 0).unwrap();
        set(&fs, "/late", "user.shared", &[b'S'; 200]);
        assert_eq!(used(&fs), 1);
        let one = map(&[("user.shared", &[b'S'; 200])]);
        finish(fs, &img, &[("/f9", one.clone()), ("/late", one)]);
        assert_eq!(
            (file_acl(&img, "/f9"), file_acl(&img, "/late")),
            (b, b),
            "{name}: rewritten in place, shared"
        );
        assert_eq!(refcount(&img, b), 2);

        let fs = rw(&img);
        fs.unlink(root, b"f9").unwrap();
        fs.unlink(root, b"late").unwrap();
        assert_eq!(used(&fs), 0, "{name}: everything freed");
        finish(fs, &img, &[]);
    }
}

/// Past the kernel's `EXT4_XATTR_REFCOUNT_MAX` (1024) references a second block is started.
#[test]
fn shared_block_reference_limit() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "refmax", &["-N", "2048"]);
    let fs = rw(&img);
    let root = fs.root();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let v = vec![b'v'; 300];
    for i in 0..1030 {
        let f = fs.create(d, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.setxattr(f, b"user.same", &v, 0).unwrap();
    }
    close(fs);
    let (b0, b1) = (file_acl(&img, "/d/f0"), file_acl(&img, "/d/f1029"));
    assert_ne!(b0, b1);
    assert_eq!((refcount(&img, b0), refcount(&img, b1)), (1024, 6));
    // Dropping one reference from the full block makes it shareable again.
    let fs = rw(&img);
    let _ = rext4_xattrs(&fs, "/d/f1");
    fs.unlink(d, b"f0").unwrap();
    let g = fs.create(d, b"g", 0o644, 0, 0).unwrap().ino;
    fs.setxattr(g, b"user.same", &v, 0).unwrap();
    let want = map(&[("user.same", &v)]);
    finish(fs, &img, &[("/d/f1", want.clone()), ("/d/f1029", want.clone()), ("/d/g", want)]);
    assert_eq!(file_acl(&img, "/d/g"), b0);
    assert_eq!((refcount(&img, b0), refcount(&img, b1)), (1024, 6));
}

/// One operation of the errno table, done the same way on rext4 and on a kernel mount.
struct Case {
    path: &'static str,
    name: Vec<u8>,
    /// `None`: removexattr.
    value: Option<Vec<u8>>,
    flags: u32,
}

fn case(path: &'static str, name: &[u8], value: Option<&[u8]>, flags: u32) -> Case {
    Case { path, name: name.to_vec(), value: value.map(<[u8]>::to_vec), flags }
}

fn kernel_errno(mnt: &Path, c: &Case) -> i32 {
    let p = CString::new(mnt.join(c.path.trim_start_matches('/')).as_os_str().as_bytes()).unwrap();
    let n = CString::new(c.name.clone()).unwrap();
    // SAFETY: both strings are NUL-terminated and live across the call; the value pointer
    // and length describe a live slice.
    let r = unsafe {
        match &c.value {
            Some(v) => libc::lsetxattr(p.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), c.flags as i32),
            None => libc::lremovexattr(p.as_ptr(), n.as_ptr()),
        }
    };
    if r == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap()
    }
}

#[test]
fn errnos_match_the_kernel() {
    let acl = vfs_acl(&[
        (ACL_USER_OBJ, 6, U),
        (ACL_USER, 4, 7),
        (ACL_GROUP_OBJ, 4, U),
        (ACL_MASK, 4, U),
        (ACL_OTHER, 0, U),
    ]);
    let long = |n: usize| [b"user.".to_vec(), vec![b'n'; n - 5]].concat();
    let cases = vec![
        case("/f", b"user.x", Some(b"1"), XATTR_CREATE),
        case("/f", b"user.x", Some(b"2"), XATTR_CREATE),
        case("/f", b"user.x", Some(b"3"), XATTR_REPLACE),
        case("/f", b"user.y", Some(b"3"), XATTR_REPLACE),
        case("/f", b"user.x", Some(b"4"), XATTR_CREATE | XATTR_REPLACE),
        case("/f", b"user.x", Some(b"4"), 4),
        case("/f", b"user.y", None, 0),
        case("/f", b"user.x", None, 0),
        case("/f", b"user.x", None, 0),
        case("/f", b"", Some(b"1"), 0),
        case("/f", &long(255), Some(b"1"), 0),
        case("/f", &long(256), Some(b"1"), 0),
        case("/f", b"user.big", Some(&[1; 65537]), 0),
        case("/f", b"user.big", Some(&[1; 65536]), 0),
        case("/f", b"user.big", Some(&[1; 4000]), 0),
        case("/f", b"user.", Some(b"1"), 0),
        case("/f", b"bogus.x", Some(b"1"), 0),
        case("/f", b"system.data", Some(b"1"), 0),
        case("/f", b"system.posix_acl_accessx", Some(b"1"), 0),
        case("/f", b"bogus.x", None, 0),
        case("/f", b"user.", None, 0),
        case("/f", b"trusted.t", Some(b"t"), 0),
        case("/f", b"security.s", Some(b""), 0),
        case("/l", b"user.x", Some(b"1"), 0),
        case("/l", b"user.x", None, 0),
        case("/l", b"trusted.x", Some(b"1"), 0),
        case("/l", b"system.posix_acl_access", Some(&acl), 0),
        case("/l", b"system.posix_acl_access", None, 0),
        case("/p", b"user.x", Some(b"1"), 0),
        case("/p", b"security.x", Some(b"1"), 0),
        case("/f", b"system.posix_acl_default", Some(&acl), 0),
        case("/f", b"system.posix_acl_default", None, 0),
        case("/d", b"system.posix_acl_default", Some(&acl), XATTR_REPLACE),
        case("/d", b"system.posix_acl_default", Some(&acl), XATTR_CREATE),
        case("/d", b"system.posix_acl_access", None, 0),
        case("/f", b"system.posix_acl_access", Some(&acl[..6]), 0),
        case("/f", b"system.posix_acl_access", Some(&1u32.to_le_bytes()), 0),
        case("/f", b"system.posix_acl_access", Some(&acl), 0),
    ];
    let dir = tempfile::tempdir().unwrap();
    let rimg = mkfs(dir.path(), "rext4", &[]);
    let fs = rw(&rimg);
    let root = fs.root();
    fs.create(root, b"f", 0o644, 0, 0).unwrap();
    fs.mkdir(root, b"d", 0o755, 0, 0).unwrap();
    fs.symlink(root, b"l", b"f", 0, 0).unwrap();
    fs.mknod(root, b"p", 0o010644, (0, 0), 0, 0).unwrap();
    let got: Vec<i32> = cases
        .iter()
        .map(|c| {
            let i = ino(&fs, c.path);
            errno(match &c.value {
                Some(v) => fs.setxattr(i, &c.name, v, c.flags),
                None => fs.removexattr(i, &c.name),
            })
        })
        .collect();
    let paths = ["/f", "/d", "/l", "/p"];
    let views: Vec<(&str, Xattrs)> = paths.iter().map(|p| (*p, rext4_xattrs(&fs, p))).collect();
    finish(fs, &rimg, &views);
    // A read-only filesystem refuses.
    let ro = Fs::open(&rimg).unwrap();
    assert_eq!(errno(ro.setxattr(ino(&ro, "/f"), b"user.z", b"1", 0)), libc::EROFS);
    drop(ro);

    if !common::kernel_can_mount() {
        eprintln!("skipping the kernel comparison");
        return;
    }
    let kimg = mkfs(dir.path(), "kernel", &[]);
    let km = KernelMount::rw(&kimg).unwrap();
    let m = km.path().to_path_buf();
    std::fs::write(m.join("f"), b"").unwrap();
    std::fs::create_dir(m.join("d")).unwrap();
    std::os::unix::fs::symlink("f", m.join("l")).unwrap();
    nix::unistd::mkfifo(&m.join("p"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let want: Vec<i32> = cases.iter().map(|c| kernel_errno(&m, c)).collect();
    for (i, c) in cases.iter().enumerate() {
        assert_eq!(
            got[i],
            want[i],
            "case {i}: {} {} flags {}: rext4 errno {} kernel errno {}",
            c.path,
            String::from_utf8_lossy(&c.name[..c.name.len().min(40)]),
            c.flags,
            got[i],
            want[i]
        );
    }
    for (p, v) in &views {
        assert_eq!(&getfattr(&m, p), v, "{p}: kernel's own result vs rext4's");
    }
    km.unmount().unwrap();
}

#[test]
fn immutable_and_append_only_inodes_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "imm", &[]);
    let fs = rw(&img);
    fs.create(fs.root(), b"i", 0o644, 0, 0).unwrap();
    fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    for (p, fl) in [("/i", "0x80010"), ("/a", "0x80020")] {
        let o = Command::new(common::tool("debugfs"))
            .args(["-w", "-R", &format!("set_inode_field {p} flags {fl}")])
            .arg(&img)
            .output()
            .unwrap();
        assert!(o.status.success());
    }
    let fs = rw(&img);
    for p in ["/i", "/a"] {
        assert_eq!(errno(fs.setxattr(ino(&fs, p), b"user.x", b"1", 0)), libc::EPERM, "{p}");
        assert_eq!(errno(fs.removexattr(ino(&fs, p), b"user.x")), libc::EPERM, "{p}");
    }
    finish(fs, &img, &[("/i", Xattrs::new()), ("/a", Xattrs::new())]);
}

/// Attributes the kernel wrote (in the inode, in blocks, shared) changed by rext4.
#[test]
fn kernel_written_attributes_modified() {
    if !common::kernel_can_mount() {
        eprintln!("skipping: the kernel cannot mount here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [("default", &[][..]), ("nocsum", &["-O", "^metadata_csum"][..])] {
        let img = mkfs(dir.path(), name, args);
        {
            let km = KernelMount::rw(&img).unwrap();
            let m = km.path();
            for i in 0..4 {
                let p = m.join(format!("k{i}"));
                std::fs::write(&p, b"data").unwrap();
                xattr::set(&p, "user.small", b"in the inode").unwrap();
                xattr::set(&p, "user.big", &[b'K'; 500]).unwrap();
                xattr::set(&p, "trusted.t", b"tt").unwrap();
            }
            km.unmount().unwrap();
        }
        let before_free = {
            let fs = Fs::open(&img).unwrap();
            fs.statfs().unwrap().blocks_free
        };
        let kernel_block = file_acl(&img, "/k0");
        assert_eq!(refcount(&img, kernel_block), 4, "{name}: the kernel shared its block");
        let fs = rw(&img);
        // rext4 learns the kernel's block when reading it, and shares it.
        let _ = rext4_xattrs(&fs, "/k0");
        fs.create(fs.root(), b"r", 0o644, 0, 0).unwrap();
        set(&fs, "/r", "user.big", &[b'K'; 500]);
        set(&fs, "/r", "trusted.t", b"tt");
        assert_eq!(fs.statfs().unwrap().blocks_free, before_free, "{name}: no new block");
        // Change a shared one, replace and remove in-inode ones.
        set(&fs, "/k1", "user.big", &[b'Z'; 600]);
        set(&fs, "/k2", "user.small", b"replaced");
        fs.removexattr(ino(&fs, "/k3"), b"user.small").unwrap();
        fs.removexattr(ino(&fs, "/k3"), b"user.big").unwrap();
        let base = map(&[("user.small", b"in the inode"), ("user.big", &[b'K'; 500]), ("trusted.t", b"tt")]);
        let mut k1 = base.clone();
        k1.insert(b"user.big".to_vec(), vec![b'Z'; 600]);
        let mut k2 = base.clone();
        k2.insert(b"user.small".to_vec(), b"replaced".to_vec());
        let k3 = map(&[("trusted.t", b"tt")]);
        let r = map(&[("user.big", &[b'K'; 500]), ("trusted.t", b"tt")]);
        finish(fs, &img, &[("/k0", base), ("/k1", k1), ("/k2", k2), ("/k3", k3), ("/r", r)]);
        assert_eq!(file_acl(&img, "/r"), kernel_block);
        assert_eq!(refcount(&img, kernel_block), 3, "{name}: k0, k2, r (k1 copied, k3 dropped it)");
        // And the kernel can go on changing and removing them.
        let km = KernelMount::rw(&img).unwrap();
        for i in 0..4 {
            let p = km.path().join(format!("k{i}"));
            for n in xattr::list(&p).unwrap() {
                xattr::remove(&p, n).unwrap();
            }
        }
        std::fs::remove_file(km.path().join("r")).unwrap();
        km.unmount().unwrap();
        e2fsck_clean(&img);
    }
}

/// Threads giving many files the same attributes at once: references are counted right.
#[test]
fn concurrent_sharing_keeps_counts_right() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "conc", &[]);
    let fs = rw(&img);
    let root = fs.root();
    let dirs: Vec<InodeNo> =
        (0..4).map(|t| fs.mkdir(root, format!("t{t}").as_bytes(), 0o755, 0, 0).unwrap().ino).collect();
    let free0 = fs.statfs().unwrap().blocks_free;
    let mine = |t: usize| vec![b'0' + t as u8; 100];
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let writers: Vec<_> = dirs
            .iter()
            .enumerate()
            .map(|(t, &d)| {
                let fs = fs.clone();
                s.spawn(move || {
                    for i in 0..60 {
                        let f = fs.create(d, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
                        fs.setxattr(f, b"user.common", &[b'c'; 400], 0).unwrap();
                        if i % 3 == 0 {
                            fs.setxattr(f, b"user.mine", &mine(t), 0).unwrap();
                        }
                        if i % 5 == 0 {
                            fs.setxattr(f, b"user.common", &[b'd'; 400], 0).unwrap();
                        }
                        if i % 7 == 0 {
                            fs.unlink(d, format!("f{i}").as_bytes()).unwrap();
                        }
                    }
                })
            })
            .collect();
        // A reader meanwhile sees each attribute whole: one of the values ever set, or none.
        let reader = s.spawn(|| {
            let mut seen = 0;
            loop {
                let last = done.load(std::sync::atomic::Ordering::Acquire);
                for &d in &dirs {
                    fs.readdir(d, 0, |e| {
                        if e.name.starts_with(b"f") {
                            if let Ok(names) = fs.listxattr(e.ino) {
                                for n in names {
                                    match fs.getxattr(e.ino, &n) {
                                        Ok(v) => {
                                            seen += 1;
                                            let ok = v == [b'c'; 400]
                                                || v == [b'd'; 400]
                                                || (0..4).any(|t| v == mine(t));
                                            assert!(ok, "torn value of {}", String::from_utf8_lossy(&n));
                                        }
                                        // Removed meanwhile (a file unlinked meanwhile is
                                        // a stale number), never damage.
                                        Err(e) => {
                                            assert!([libc::ENODATA, libc::ESTALE].contains(&e.errno()), "{e}")
                                        }
                                    }
                                }
                            }
                        }
                        true
                    })
                    .unwrap();
                }
                if last {
                    break seen;
                }
            }
        });
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        assert!(reader.join().unwrap() > 0);
    });
    assert!(!fs.has_errors(), "a racing reader recorded an error");
    // Distinct blocks: common=c or d, with or without each thread's own attribute (two
    // threads missing the cache at once may each start a copy, as in the kernel).
    let used = free0 - fs.statfs().unwrap().blocks_free;
    assert!(used <= 16, "{used} blocks for ten distinct attribute sets");
    let mut expected = Vec::new();
    for t in 0..4 {
        for i in (0..60).filter(|i| i % 7 != 0) {
            let p: &'static str = Box::leak(format!("/t{t}/f{i}").into_boxed_str());
            let mut want = map(&[("user.common", &[if i % 5 == 0 { b'd' } else { b'c' }; 400])]);
            if i % 3 == 0 {
                want.insert(b"user.mine".to_vec(), mine(t));
            }
            expected.push((p, want));
        }
    }
    finish(fs, &img, &expected);
}

/// A reader of a file being unlinked must not offer the file's xattr block for sharing
/// once the unlink has freed it: the next file with the same attributes would take a
/// reference to a free block (e2fsck: "reference count 2, should be 1" and the block free in
/// the bitmap). The reader hammers each file while the test unlinks it.
#[test]
fn reading_a_dying_file_never_offers_its_freed_block() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "dying", &[]);
    let fs = rw(&img);
    let root = fs.root();
    // Each unlinked file's value is the next file's: a chance per pair to share a freed block.
    let value = |i: usize| format!("{:0>600}", i / 2).into_bytes();
    let target = std::sync::atomic::AtomicU32::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut expected = Vec::new();
    std::thread::scope(|s| {
        let (fs2, target, stop) = (fs.clone(), &target, &stop);
        s.spawn(move || {
            use std::sync::atomic::Ordering::Acquire;
            while !stop.load(Acquire) {
                let ino = InodeNo(target.load(Acquire));
                if ino.0 == 0 {
                    continue;
                }
                // A file unlinked meanwhile is a stale number (ESTALE, as the kernel answers a
                // file handle naming a freed inode); never a bad checksum or corruption (which
                // would mark the image as having errors).
                let ok = |e: rext4::Error| assert!([libc::ESTALE, libc::ENODATA].contains(&e.errno()), "{e}");
                match fs2.listxattr(ino) {
                    Ok(names) => names.iter().for_each(|n| fs2.getxattr(ino, n).map(drop).unwrap_or_else(ok)),
                    Err(e) => ok(e),
                }
            }
        });
        for i in 0..400 {
            let name = format!("f{i}");
            let f = fs.create(root, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
            fs.setxattr(f, b"user.big", &value(i), 0).unwrap();
            target.store(f.0, std::sync::atomic::Ordering::Release);
            if i % 2 == 0 {
                fs.unlink(root, name.as_bytes()).unwrap();
            } else {
                expected.push((
                    Box::leak(format!("/{name}").into_boxed_str()) as &str,
                    map(&[("user.big", &value(i))]),
                ));
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Release);
    });
    assert!(!fs.has_errors(), "a racing reader recorded an error");
    finish(fs, &img, &expected);
}

mod model {
    //! Random sequences of set / replace / remove / recreate on a few files against a map.
    use super::*;
    use proptest::prelude::*;
    use rext4::dev::MemDevice;
    use std::sync::Arc;

    const FILES: usize = 3;
    const NAMES: &[&str] = &[
        "user.a",
        "user.bb",
        "user.ccc",
        "user.a-rather-longer-name-for-the-entry",
        "trusted.t",
        "trusted.tt",
        "security.s",
        "user.x1",
        "user.x2",
        "user.x3",
    ];
    const LENS: &[usize] = &[0, 1, 3, 4, 5, 31, 60, 100, 300, 700, 1200, 2500, 9000];

    #[derive(Clone, Debug)]
    enum Op {
        Set { file: usize, name: usize, len: usize, byte: u8, flags: u32 },
        Remove { file: usize, name: usize },
        Recreate { file: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..FILES, 0..NAMES.len(), 0..LENS.len(), 0u8..2, prop_oneof![3 => Just(0u32), 1 => Just(XATTR_CREATE), 1 => Just(XATTR_REPLACE)])
                .prop_map(|(file, name, l, byte, flags)| Op::Set { file, name, len: LENS[l], byte, flags }),
            3 => (0..FILES, 0..NAMES.len()).prop_map(|(file, name)| Op::Remove { file, name }),
            1 => (0..FILES).prop_map(|file| Op::Recreate { file }),
        ]
    }

    fn size_of(m: &Xattrs) -> usize {
        // Entry (name without its prefix) and padded value, as a block would need.
        m.iter()
            .map(|(n, v)| {
                let suffix = n.len() - n.iter().position(|&c| c == b'.').unwrap() - 1;
                ((16 + suffix + 3) & !3) + ((v.len() + 3) & !3)
            })
            .sum()
    }

    fn image(args: &[&str]) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("m.img");
        common::mkfs(None, &img, args, "16M");
        std::fs::read(img).unwrap()
    }

    fn run(bytes: &[u8], ops: &[Op]) {
        let dev = Arc::new(MemDevice::new(bytes.to_vec()));
        let fs = Fs::from_device(dev.clone(), Options { writable: true, ..Options::default() }).unwrap();
        let root = fs.root();
        let bs = fs.block_size() as usize;
        let fname = |f: usize| format!("f{f}");
        let mut ino: Vec<InodeNo> =
            (0..FILES).map(|f| fs.create(root, fname(f).as_bytes(), 0o644, 0, 0).unwrap().ino).collect();
        let mut model: Vec<Xattrs> = vec![Xattrs::new(); FILES];
        for (k, op) in ops.iter().enumerate() {
            match *op {
                Op::Set { file, name, len, byte, flags } => {
                    let n = NAMES[name].as_bytes().to_vec();
                    let v = vec![byte; len];
                    let m = &mut model[file];
                    let r = fs.setxattr(ino[file], &n, &v, flags);
                    let exists = m.contains_key(&n);
                    let expect = if flags == XATTR_CREATE && exists {
                        libc::EEXIST
                    } else if flags == XATTR_REPLACE && !exists {
                        libc::ENODATA
                    } else {
                        0
                    };
                    match r {
                        // With `ea_inode` too: values may move to EA inodes, but their
                        // entries must still fit, and an empty value never moves (the kernel
                        // refuses both alike).
                        Err(e) if e.errno() == libc::ENOSPC && expect == 0 => {
                            let mut after = m.clone();
                            after.insert(n, v);
                            // Everything fitting in one block never runs out of room.
                            assert!(
                                size_of(&after) + 36 > bs,
                                "op {k}: ENOSPC with {} bytes",
                                size_of(&after)
                            );
                        }
                        r => {
                            assert_eq!(errno(r), expect, "op {k}: {op:?}");
                            if expect == 0 {
                                m.insert(n, v);
                            }
                        }
                    }
                }
                Op::Remove { file, name } => {
                    let n = NAMES[name].as_bytes();
                    let expect = if model[file].remove(n).is_some() { 0 } else { libc::ENODATA };
                    assert_eq!(errno(fs.removexattr(ino[file], n)), expect, "op {k}: {op:?}");
                }
                Op::Recreate { file } => {
                    fs.unlink(root, fname(file).as_bytes()).unwrap();
                    ino[file] = fs.create(root, fname(file).as_bytes(), 0o644, 0, 0).unwrap().ino;
                    model[file].clear();
                }
            }
            let f = match *op {
                Op::Set { file, .. } | Op::Remove { file, .. } | Op::Recreate { file } => file,
            };
            assert_eq!(rext4_xattrs(&fs, &format!("/{}", fname(f))), model[f], "after op {k}: {op:?}");
        }
        fs.unmount().unwrap();
        drop(fs);
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("m.img");
        std::fs::write(&img, dev.snapshot()).unwrap();
        let expected: Vec<(String, Xattrs)> =
            (0..FILES).map(|f| (format!("/{}", fname(f)), model[f].clone())).collect();
        let refs: Vec<(&str, Xattrs)> = expected.iter().map(|(p, m)| (p.as_str(), m.clone())).collect();
        let fs = Fs::open(&img).unwrap();
        finish(fs, &img, &refs);
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            // Each case makes and checks an image; PROPTEST_CASES asks for more.
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24),
            failure_persistence: None,
            ..ProptestConfig::default()
        })]
        #[test]
        fn random_sequences_match_a_map(ops in proptest::collection::vec(op(), 1..80), variant in 0..3u8) {
            static DEFAULT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
            static SMALL: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
            static EA: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
            let bytes = match variant {
                0 => SMALL.get_or_init(|| image(&["-I", "128", "-b", "1024", "-O", "^metadata_csum"])),
                1 => DEFAULT.get_or_init(|| image(&["-b", "4096"])),
                // Values in EA inodes, at once (over 968 bytes) or when the block is full.
                _ => EA.get_or_init(|| image(&["-b", "1024", "-O", "ea_inode"])),
            };
            run(bytes, &ops);
        }
    }
}

/// Inline-data files keep `system.data` (in the inode area next to the new attributes) and
/// their bytes.
#[test]
fn inline_data_files_keep_their_data() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("tiny"), b"tiny file").unwrap();
    std::fs::write(src.join("inline"), vec![b'i'; 100]).unwrap();
    let img = dir.path().join("inline.img");
    common::mkfs(Some(&src), &img, &["-O", "inline_data", "-b", "4096"], "32M");
    let fs = rw(&img);
    let f = ino(&fs, "/inline");
    assert_ne!(fs.getattr(f).unwrap().flags & 0x1000_0000, 0, "fixture: /inline has inline data");
    set(&fs, "/inline", "user.a", b"next to system.data");
    set(&fs, "/inline", "user.big", &[b'b'; 300]);
    set(&fs, "/tiny", "user.t", b"t");
    fs.removexattr(f, b"user.a").unwrap();
    set(&fs, "/inline", "user.c", b"c");
    assert_eq!(errno(fs.setxattr(f, b"system.data", b"", 0)), libc::EOPNOTSUPP);
    assert_eq!(fs.read_file("/inline").unwrap(), vec![b'i'; 100]);
    assert_eq!(fs.read_file("/tiny").unwrap(), b"tiny file");
    let want_inline = map(&[("user.big", &[b'b'; 300]), ("user.c", b"c")]);
    finish(fs, &img, &[("/inline", want_inline), ("/tiny", map(&[("user.t", b"t")]))]);
    let km = KernelMount::ro(&img);
    if let Ok(km) = km {
        assert_eq!(std::fs::read(km.path().join("inline")).unwrap(), vec![b'i'; 100]);
        km.unmount().unwrap();
    }
}

/// `len` bytes that differ from those of another `seed`.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Inodes in use, from the superblock (`debugfs stats`).
fn inodes_in_use(img: &Path) -> u64 {
    let out = debugfs(img, "stats");
    let free: u64 = out.lines().find_map(|l| l.strip_prefix("Free inodes:")).unwrap().trim().parse().unwrap();
    let count: u64 =
        out.lines().find_map(|l| l.strip_prefix("Inode count:")).unwrap().trim().parse().unwrap();
    count - free
}

/// With `ea_inode`: values too large for an xattr area go to EA inodes of their own, at once
/// or when neither area has room left; replacing, removing and unlinking free them again. The
/// kernel reads every value, and can go on removing them; e2fsck counts the references right.
#[test]
fn values_in_ea_inodes() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [("4k", &["-O", "ea_inode"][..]), ("1k", &["-b", "1024", "-O", "ea_inode"][..])] {
        let img = mkfs(dir.path(), name, args);
        let in_use = inodes_in_use(&img);
        let fs = rw(&img);
        let root = fs.root();
        for f in ["big", "two", "max", "gone", "shrink", "grow"] {
            fs.create(root, f.as_bytes(), 0o644, 1000, 1000).unwrap();
        }
        // A value over a block's worth goes to an EA inode at once.
        set(&fs, "/big", "user.big", &pattern(1, 10_000));
        set(&fs, "/big", "user.small", b"s");
        // Two values that each fit a block, but not together: the second goes to an EA inode.
        let bs = fs.block_size() as usize;
        set(&fs, "/two", "user.a", &pattern(2, bs * 3 / 4));
        set(&fs, "/two", "user.b", &pattern(3, bs * 3 / 4));
        // The largest value setxattr takes.
        set(&fs, "/max", "trusted.max", &pattern(4, 65_536));
        set(&fs, "/gone", "user.g", &pattern(5, 8_000));
        set(&fs, "/shrink", "user.s", &pattern(6, 9_000));
        // A value in the block that grows past the block's room moves to an EA inode, its
        // entry to the inode: the block's entry goes.
        set(&fs, "/grow", "user.a", &pattern(14, bs * 3 / 4));
        set(&fs, "/grow", "user.b", &pattern(15, bs / 8));
        set(&fs, "/grow", "user.b", &pattern(16, bs * 3 / 4));
        let names = fs.listxattr(ino(&fs, "/grow")).unwrap();
        assert_eq!(names.len(), 2, "{name}: {names:?}");
        let files = fs.statfs().unwrap().files_free;
        // Replaced by another large value: the old EA inode goes, a new one comes.
        set(&fs, "/big", "user.big", &pattern(7, 20_000));
        // Replaced by a small value: its EA inode goes.
        set(&fs, "/shrink", "user.s", b"small now");
        // Removed, and unlinked with its value: both EA inodes go.
        fs.removexattr(ino(&fs, "/max"), b"trusted.max").unwrap();
        fs.unlink(root, b"gone").unwrap();
        assert_eq!(fs.statfs().unwrap().files_free, files + 4, "{name}: three EA inodes and /gone freed");
        assert_eq!(errno(fs.getxattr(ino(&fs, "/max"), b"trusted.max")), libc::ENODATA);
        let big = map(&[("user.big", &pattern(7, 20_000)), ("user.small", b"s")]);
        let two = map(&[("user.a", &pattern(2, bs * 3 / 4)), ("user.b", &pattern(3, bs * 3 / 4))]);
        let shrink = map(&[("user.s", b"small now")]);
        let grow = map(&[("user.a", &pattern(14, bs * 3 / 4)), ("user.b", &pattern(16, bs * 3 / 4))]);
        assert_eq!(rext4_xattrs(&fs, "/big"), big, "{name}");
        finish(
            fs,
            &img,
            &[("/big", big), ("/two", two), ("/max", Xattrs::new()), ("/shrink", shrink), ("/grow", grow)],
        );
        // Five files and the three EA inodes still named.
        assert_eq!(inodes_in_use(&img), in_use + 8, "{name}");
        // The kernel takes them from here.
        match KernelMount::rw(&img) {
            Ok(km) => {
                for f in ["big", "two"] {
                    let p = km.path().join(f);
                    for n in xattr::list(&p).unwrap() {
                        xattr::remove(&p, n).unwrap();
                    }
                }
                km.unmount().unwrap();
                e2fsck_clean(&img);
                assert_eq!(inodes_in_use(&img), in_use + 6, "{name}: the kernel freed both EA inodes");
            }
            Err(e) => eprintln!("skipping the kernel's removal: {e}"),
        }
    }
}

/// Values the kernel put in EA inodes (one of them shared by several files' equal values) are
/// replaced, removed and unlinked by rext4 with the references counted right; a block the
/// kernel shares that names an EA inode is copied for the file that changes it.
#[test]
fn kernel_ea_inode_values_changed() {
    if !common::kernel_can_mount() {
        eprintln!("skipping: the kernel cannot mount here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "kea", &["-O", "ea_inode"]);
    let in_use = inodes_in_use(&img);
    {
        let km = KernelMount::rw(&img).unwrap();
        for f in ["a", "b", "c"] {
            let p = km.path().join(f);
            std::fs::write(&p, b"x").unwrap();
            xattr::set(&p, "user.v", &pattern(9, 12_000)).unwrap();
        }
        // The in-inode area full, the entry naming the EA inode goes to a block, shared.
        for f in ["e", "f"] {
            let p = km.path().join(f);
            std::fs::write(&p, b"y").unwrap();
            xattr::set(&p, "user.pad", &pattern(11, 100)).unwrap();
            xattr::set(&p, "user.w", &pattern(12, 12_000)).unwrap();
        }
        km.unmount().unwrap();
    }
    let shared = file_acl(&img, "/e");
    assert!(shared != 0 && file_acl(&img, "/f") == shared, "the kernel shares one block");
    let fs = rw(&img);
    set(&fs, "/e", "user.more", &pattern(13, 200));
    assert_eq!(rext4_xattrs(&fs, "/a"), map(&[("user.v", &pattern(9, 12_000))]));
    set(&fs, "/a", "user.v", &pattern(10, 5_000));
    fs.removexattr(ino(&fs, "/b"), b"user.v").unwrap();
    let c = map(&[("user.v", &pattern(9, 12_000))]);
    fs.unlink(fs.root(), b"c").unwrap();
    fs.create(fs.root(), b"d", 0o644, 0, 0).unwrap();
    set(&fs, "/d", "user.v", &pattern(9, 12_000));
    let a = map(&[("user.v", &pattern(10, 5_000))]);
    let f = map(&[("user.pad", &pattern(11, 100)), ("user.w", &pattern(12, 12_000))]);
    let mut e = f.clone();
    e.insert(b"user.more".to_vec(), pattern(13, 200));
    finish(fs, &img, &[("/a", a), ("/b", Xattrs::new()), ("/d", c), ("/e", e), ("/f", f)]);
    assert_ne!(file_acl(&img, "/e"), shared);
    assert_eq!(file_acl(&img, "/f"), shared);
    // a, b, d, e, f and the EA inodes of a's, d's and e's and f's values.
    assert_eq!(inodes_in_use(&img), in_use + 8);
}

/// A reader racing a writer that keeps replacing a value in an EA inode (freeing the old
/// one each time) always gets one whole value, never an error; the writer never runs out of
/// room while freed blocks wait for their commit.
#[test]
fn ea_inode_values_read_while_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "race", &["-O", "ea_inode"]);
    let fs = rw(&img);
    fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap();
    let f = ino(&fs, "/f");
    let (a, b) = (pattern(20, 10_000), pattern(21, 12_000));
    fs.setxattr(f, b"user.v", &a, 0).unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut reads = 0u32;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let v = fs.getxattr(f, b"user.v").unwrap_or_else(|e| panic!("read {reads}: {e}"));
                assert!(v == a || v == b, "read {reads}: a torn value of {} bytes", v.len());
                reads += 1;
            }
            reads
        });
        // Far more values than the image holds at once: the freed ones must come back.
        let wrote =
            (0..4000).try_for_each(|i| fs.setxattr(f, b"user.v", if i % 2 == 0 { &b } else { &a }, 0));
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        wrote.unwrap();
        assert!(reader.join().unwrap() > 0);
    });
    finish(fs, &img, &[("/f", map(&[("user.v", &a)]))]);
}

/// Old Lustre EA inodes (no reference count or value hash; `i_mtime` names the owner, the
/// generation is the owner's, and e2fsck charges their values to nobody): rext4 drops them
/// with the entry naming them, in the inode and in a block, and with their owner, as the
/// kernel does, without touching the owner's `i_blocks` for them.
#[test]
fn lustre_ea_inodes_are_dropped_with_their_entries() {
    if !common::kernel_can_mount() {
        eprintln!("skipping: the kernel cannot mount here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "lustre", &["-O", "ea_inode"]);
    let in_use = inodes_in_use(&img);
    // Values differ: the kernel would share one EA inode between equal ones.
    let big = |seed| pattern(seed, 8000);
    {
        let km = KernelMount::rw(&img).unwrap();
        for (seed, f) in [(40, "a"), (41, "b"), (42, "c")] {
            let p = km.path().join(f);
            std::fs::write(&p, b"x").unwrap();
            xattr::set(&p, "user.big", &big(seed)).unwrap();
        }
        // An xattr block beside the in-inode entry naming the EA inode.
        let p = km.path().join("e");
        std::fs::write(&p, b"y").unwrap();
        xattr::set(&p, "user.pad", &pattern(31, 100)).unwrap();
        xattr::set(&p, "user.big", &big(43)).unwrap();
        km.unmount().unwrap();
    }
    let le32 = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let mut cmds = String::new();
    for f in ["/a", "/b", "/c", "/e"] {
        let rec = inode_record(&img, f);
        let owner: u32 = debugfs(&img, &format!("stat {f}"))
            .split("Inode: ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap()
            .parse()
            .unwrap();
        // The entry naming the EA inode, in the inode's area or in the block.
        let named = |area: &[u8], mut o: usize| {
            while o + 16 <= area.len() && le32(area, o) != 0 {
                if le32(area, o + 4) != 0 {
                    return le32(area, o + 4);
                }
                o += (16 + usize::from(area[o]) + 3) & !3;
            }
            0
        };
        let acl = file_acl(&img, f);
        let mut ea = named(&rec, 128 + usize::from(u16::from_le_bytes([rec[0x80], rec[0x81]])) + 4);
        if ea == 0 && acl != 0 {
            ea = named(&read_block(&img, acl), 32);
        }
        assert_ne!(ea, 0, "{f}: no EA inode");
        let gen = le32(&rec, 0x64);
        let blocks = le32(&rec, 0x1C);
        cmds += &format!(
            "sif <{ea}> mtime @{owner}\nsif <{ea}> generation {gen}\nsif <{ea}> atime @12345\n\
             sif <{ea}> ctime @12345\nsif <{ea}> version 0\nsif {f} blocks {}\n",
            blocks - 16
        );
    }
    let script = dir.path().join("lustre.cmds");
    std::fs::write(&script, cmds).unwrap();
    let st =
        Command::new(common::tool("debugfs")).arg("-w").arg("-f").arg(&script).arg(&img).output().unwrap();
    assert!(st.status.success());
    e2fsck_clean(&img);
    assert_eq!(inodes_in_use(&img), in_use + 8);

    let fs = rw(&img);
    assert_eq!(rext4_xattrs(&fs, "/a"), map(&[("user.big", &big(40))]));
    fs.removexattr(ino(&fs, "/a"), b"user.big").unwrap();
    set(&fs, "/b", "user.big", &pattern(32, 100));
    fs.unlink(fs.root(), b"c").unwrap();
    fs.removexattr(ino(&fs, "/e"), b"user.big").unwrap();
    let b = map(&[("user.big", &pattern(32, 100))]);
    let e = map(&[("user.pad", &pattern(31, 100))]);
    finish(fs, &img, &[("/a", Xattrs::new()), ("/b", b), ("/e", e)]);
    // a, b and e; c and the four EA inodes are gone.
    assert_eq!(inodes_in_use(&img), in_use + 3);
}

/// Equal values share one EA inode, as the kernel shares them: across inodes, within one
/// inode, and with an EA inode the kernel made (learned when rext4 reads it). Its reference
/// count follows every entry naming it, which e2fsck checks.
#[test]
fn equal_values_share_one_ea_inode() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "share", &["-O", "ea_inode"]);
    let base = inodes_in_use(&img);
    let (v, w) = (pattern(50, 12_000), pattern(51, 9_000));
    let kernel = common::kernel_can_mount();
    if kernel {
        let km = KernelMount::rw(&img).unwrap();
        let p = km.path().join("k1");
        std::fs::write(&p, b"k").unwrap();
        xattr::set(&p, "user.w", &w).unwrap();
        km.unmount().unwrap();
    }
    let fs = rw(&img);
    for f in [&b"a"[..], b"b", b"c", b"k2"] {
        fs.create(fs.root(), f, 0o644, 0, 0).unwrap();
    }
    set(&fs, "/a", "user.v", &v);
    set(&fs, "/b", "user.v", &v);
    set(&fs, "/c", "user.x", &v);
    set(&fs, "/c", "user.y", &v);
    let kfiles = if kernel {
        assert_eq!(rext4_xattrs(&fs, "/k1"), map(&[("user.w", &w)]));
        set(&fs, "/k2", "user.w", &w);
        1
    } else {
        0
    };
    // a, b, c, k2 (and k1), one EA inode for v and, with the kernel's, one for w.
    let st = fs.statfs().unwrap();
    assert_eq!(st.files - st.files_free, base + 4 + 2 * kfiles + 1);
    fs.removexattr(ino(&fs, "/a"), b"user.v").unwrap();
    fs.unlink(fs.root(), b"b").unwrap();
    set(&fs, "/c", "user.x", &pattern(52, 50));
    let c = map(&[("user.x", &pattern(52, 50)), ("user.y", &v)]);
    let mut expected = vec![("/a", Xattrs::new()), ("/c", c)];
    if kernel {
        expected.push(("/k1", map(&[("user.w", &w)])));
        expected.push(("/k2", map(&[("user.w", &w)])));
    }
    finish(fs, &img, &expected);
    assert_eq!(inodes_in_use(&img), base + 3 + 2 * kfiles + 1);
}

/// A file with data whose xattr block has a damaged entry table loses its last name (by
/// unlink, by a rename over it, by the release that follows an unlink while it was held): the
/// deletion finds the damage before it frees anything, so the block is still counted as the
/// file's and the data blocks are still marked in use. As the kernel's, the operation succeeds;
/// the inode is left without links for e2fsck to free, and the damage is recorded.
#[test]
fn damaged_xattr_block_keeps_its_count_when_its_release_fails() {
    let dir = tempfile::tempdir().unwrap();
    for how in ["unlink", "rename", "release"] {
        // Without block checksums, so that the damage is found in the entries, not by the
        // checksum.
        let img = mkfs(dir.path(), how, &["-O", "ea_inode,^metadata_csum"]);
        let fs = rw(&img);
        let root = fs.root();
        let f = fs.create(root, b"f", 0o644, 1000, 1000).unwrap().ino;
        fs.write(f, 0, &pattern(2, 40_000)).unwrap();
        set(&fs, "/f", "user.a", &pattern(1, 1000));
        fs.create(root, b"g", 0o644, 0, 0).unwrap();
        fs.unmount().unwrap();
        let blk = file_acl(&img, "/f");
        assert_ne!(blk, 0, "the value went to a block");
        let data: Vec<u64> =
            debugfs(&img, "blocks /f").split_whitespace().map(|b| b.parse().unwrap()).collect();
        assert_eq!(data.len(), 10);
        // The first entry's e_value_size (the entry follows the 32-byte header; the field is
        // at 8) past the largest value an entry can have.
        let mut all = std::fs::read(&img).unwrap();
        let at = blk as usize * block_size(&img) + 32 + 8;
        all[at..at + 4].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
        std::fs::write(&img, &all).unwrap();
        let fs = rw(&img);
        match how {
            "unlink" => fs.unlink(root, b"f").unwrap(),
            "rename" => fs.rename(root, b"g", root, b"f", 0).unwrap(),
            _ => {
                fs.hold(f).unwrap();
                fs.unlink(root, b"f").unwrap();
                assert!(!fs.has_errors(), "nothing is freed before the release");
                fs.release(f).unwrap();
            }
        }
        assert!(fs.has_errors(), "{how}");
        assert_eq!(errno(fs.getattr(f)), libc::ESTALE, "{how}");
        fs.unmount().unwrap();
        assert_eq!(refcount(&img, blk), 1, "{how}: the damaged block is still counted as its file's");
        for b in data.iter().chain([&blk]) {
            let t = debugfs(&img, &format!("testb {b}"));
            assert!(t.contains("marked in use"), "{how}: block {b} was freed: {t}");
        }
        let fsck = Command::new(common::tool("e2fsck")).arg("-fn").arg(&img).output().unwrap();
        let text = String::from_utf8_lossy(&fsck.stdout).into_owned();
        assert!(text.contains(&format!("Deleted inode {} has zero dtime", f.0)), "{how}: {text}");
    }
}

/// A file whose in-inode area names two EA inodes, the second damaged (no longer flagged as an
/// EA inode), loses its last name: the deletion checks both before it drops either reference,
/// so the first keeps its value and stays allocated; the file is left for e2fsck.
#[test]
fn a_damaged_ea_inode_stops_a_deletion_before_it_changes_anything() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "eadamage", &["-O", "ea_inode"]);
    let fs = rw(&img);
    let root = fs.root();
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    set(&fs, "/f", "user.a", &pattern(1, 10_000));
    set(&fs, "/f", "user.b", &pattern(2, 12_000));
    fs.unmount().unwrap();
    drop(fs);
    // The two EA inodes, told apart by their sizes.
    let ea_of = |size: &str| -> u32 {
        (f.0 + 1..f.0 + 8)
            .find(|i| debugfs(&img, &format!("stat <{i}>")).contains(&format!("Size: {size}")))
            .unwrap_or_else(|| panic!("no EA inode of {size} bytes"))
    };
    let (a, b) = (ea_of("10000"), ea_of("12000"));
    let o = Command::new(common::tool("debugfs"))
        .args(["-w", "-R", &format!("set_inode_field <{b}> flags 0x80000")])
        .arg(&img)
        .output()
        .unwrap();
    assert!(o.status.success(), "debugfs: {}", String::from_utf8_lossy(&o.stderr));
    let fs = rw(&img);
    fs.unlink(root, b"f").unwrap();
    assert!(fs.has_errors());
    fs.unmount().unwrap();
    drop(fs);
    let in_use = |i: u32| debugfs(&img, &format!("testi <{i}>")).contains("marked in use");
    assert!(in_use(a), "the first EA inode was freed before the damage stopped the deletion");
    assert!(in_use(b) && in_use(f.0));
    let fsck = Command::new(common::tool("e2fsck")).arg("-fn").arg(&img).output().unwrap();
    let text = String::from_utf8_lossy(&fsck.stdout).into_owned();
    assert!(text.contains(&format!("Deleted inode {} has zero dtime", f.0)), "{text}");
}
