//! Real FUSE mounts of images through rext4-fuse: workloads run through `std::fs` (and the
//! syscalls it lacks), then the mount is unmounted, `e2fsck -fn` must be clean, and a kernel
//! loop mount must show the same tree, bytes, times and xattrs the FUSE mount showed.
//! Skipped (with a message) where FUSE mounts are not possible.

mod common;

use common::*;
use nix::fcntl::{renameat2, FallocateFlags, RenameFlags, AT_FDCWD};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{symlink, FileExt, MetadataExt, PermissionsExt};
use std::sync::OnceLock;

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

#[track_caller]
fn expect_errno<T: std::fmt::Debug>(r: std::io::Result<T>, want: i32, what: &str) {
    match r {
        Ok(v) => panic!("{what}: succeeded ({v:?}), expected errno {want}"),
        Err(e) => assert_eq!(errno(&e), want, "{what}: {e}"),
    }
}

fn ft(sec: i64, nsec: u32) -> filetime::FileTime {
    filetime::FileTime::from_unix_time(sec, nsec)
}

static MEDIUM: OnceLock<SourceTree> = OnceLock::new();

/// A tree made by `mkfs.ext4 -d`, read through the mount: every stat field, byte, xattr and
/// link target as the kernel's ext4 shows them.
#[test]
fn read_tree_matches_kernel() {
    if !fuse_available() {
        return;
    }
    let tree = source_tree(&MEDIUM, "fuse-medium", TreeSpec::medium());
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("tree.img");
    mkfs(Some(&tree.dir), &img, &[], "1G");
    let m = FuseMount::new(&img, "ro");
    // Directory listings resume at the positions the mount hands out, with a cold and a warm
    // kernel cache.
    let big: Vec<_> = fs::read_dir(m.join(paths::BIGDIR)).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(big.len(), tree.spec.big_dir_entries);
    // The root's inode number, from stat and from readdir of `/` and of a child's `..`, is
    // ext4's 2 as on a kernel mount.
    assert_eq!(fs::metadata(m.join("")).unwrap().ino(), 2);
    let sub = fs::read_dir(m.join("")).unwrap().map(|e| e.unwrap()).find(|e| e.file_type().unwrap().is_dir());
    let sub = sub.expect("a directory under the root").path();
    assert_eq!(fs::metadata(sub.join("..")).unwrap().ino(), 2);
    let dots = dir_inos(&m.join(""));
    assert_eq!(dots.get("."), Some(&2), "d_ino of the root's .");
    assert_eq!(dir_inos(&sub).get(".."), Some(&2), "d_ino of a child's ..");
    unmount_and_compare(m, &img);
}

/// `d_ino` of each entry of `dir`, `.` and `..` included (`readdir(3)` through libc).
fn dir_inos(dir: &std::path::Path) -> std::collections::HashMap<String, u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    let mut out = std::collections::HashMap::new();
    // SAFETY: `c` is a valid C string; the stream is closed below and entries are copied out
    // before the next readdir call.
    unsafe {
        let d = libc::opendir(c.as_ptr());
        assert!(!d.is_null(), "opendir {}", dir.display());
        loop {
            let e = libc::readdir(d);
            if e.is_null() {
                break;
            }
            let name = std::ffi::CStr::from_ptr((*e).d_name.as_ptr()).to_string_lossy().into_owned();
            out.insert(name, (*e).d_ino);
        }
        libc::closedir(d);
    }
    out
}

/// Directories, names, links, renames, devices, owners, modes and nanosecond times through the
/// mount; then the kernel must see exactly the same.
#[test]
fn namespace_workload_matches_kernel() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = new_image(dir.path(), "ns.img", &[], "256M");
    let m = FuseMount::new(&img, "rw");
    let p = |s: &str| m.join(s);

    fs::create_dir_all(p("a/b/c")).unwrap();
    fs::create_dir(p("many")).unwrap();
    for i in 0..600 {
        File::create(p(&format!("many/file-{i:04}-{}", "x".repeat(i % 50)))).unwrap();
    }
    for i in (0..600).step_by(3) {
        fs::remove_file(p(&format!("many/file-{i:04}-{}", "x".repeat(i % 50)))).unwrap();
    }
    assert_eq!(fs::read_dir(p("many")).unwrap().count(), 400);

    symlink("short", p("a/fast")).unwrap();
    let long_target = "t/".repeat(100);
    symlink(&long_target, p("a/slow")).unwrap();
    assert_eq!(fs::read_link(p("a/slow")).unwrap().to_str().unwrap(), long_target);

    File::create(p("a/orig")).unwrap();
    fs::hard_link(p("a/orig"), p("a/b/link1")).unwrap();
    fs::hard_link(p("a/orig"), p("link2")).unwrap();
    assert_eq!(fs::metadata(p("a/orig")).unwrap().nlink(), 3);
    expect_errno(fs::hard_link(p("a"), p("dirlink")), libc::EPERM, "link to a directory");

    // Renames: within a directory, across directories, over a file, over an empty directory,
    // exchange, and no-replace.
    File::create(p("a/r1")).unwrap();
    fs::rename(p("a/r1"), p("a/r2")).unwrap();
    fs::rename(p("a/r2"), p("a/b/c/r3")).unwrap();
    File::create(p("victim")).unwrap();
    fs::rename(p("a/b/c/r3"), p("victim")).unwrap();
    fs::create_dir(p("d1")).unwrap();
    fs::create_dir(p("d2")).unwrap();
    File::create(p("d1/inside")).unwrap();
    fs::rename(p("d1"), p("d2")).unwrap();
    assert!(p("d2/inside").exists() && !p("d1").exists());
    fs::create_dir(p("x1")).unwrap();
    File::create(p("x2")).unwrap();
    renameat2(AT_FDCWD, &p("x1"), AT_FDCWD, &p("x2"), RenameFlags::RENAME_EXCHANGE).unwrap();
    assert!(p("x2").is_dir() && p("x1").is_file());
    let r = renameat2(AT_FDCWD, &p("x1"), AT_FDCWD, &p("x2"), RenameFlags::RENAME_NOREPLACE);
    assert_eq!(r, Err(nix::errno::Errno::EEXIST));
    // A whiteout (overlayfs's rename) takes the old name: a character device 0:0.
    File::create(p("w1")).unwrap();
    renameat2(AT_FDCWD, &p("w1"), AT_FDCWD, &p("w2"), RenameFlags::RENAME_WHITEOUT).unwrap();
    let w = fs::symlink_metadata(p("w1")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(&w.file_type()) && w.rdev() == 0);
    assert!(p("w2").is_file());
    fs::remove_file(p("w1")).unwrap();
    fs::create_dir(p("full")).unwrap();
    File::create(p("full/f")).unwrap();
    expect_errno(fs::rename(p("a/b"), p("full")), libc::ENOTEMPTY, "rename over a non-empty dir");
    expect_errno(fs::rename(p("a"), p("a/b/c/under")), libc::EINVAL, "rename into itself");

    // Devices, fifos, sockets.
    nix::unistd::mkfifo(&p("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o640)).unwrap();
    nix::sys::stat::mknod(
        &p("chr"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
        nix::sys::stat::makedev(4, 70000),
    )
    .unwrap();
    nix::sys::stat::mknod(
        &p("blk"),
        nix::sys::stat::SFlag::S_IFBLK,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
        nix::sys::stat::makedev(259, 3),
    )
    .unwrap();
    let rdev = fs::symlink_metadata(p("chr")).unwrap().rdev();
    assert_eq!((nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev)), (4, 70000));
    std::os::unix::net::UnixListener::bind(p("sock")).unwrap();

    // Owners, modes, set-group-ID inheritance.
    fs::create_dir(p("sgid")).unwrap();
    nix::unistd::chown(&p("sgid"), Some(1000.into()), Some(4242.into())).unwrap();
    fs::set_permissions(p("sgid"), fs::Permissions::from_mode(0o2775)).unwrap();
    File::create(p("sgid/f")).unwrap();
    fs::create_dir(p("sgid/sub")).unwrap();
    assert_eq!(fs::metadata(p("sgid/f")).unwrap().gid(), 4242);
    let sub = fs::metadata(p("sgid/sub")).unwrap();
    assert_eq!((sub.gid(), sub.mode() & 0o2000), (4242, 0o2000));
    nix::unistd::chown(&p("a/orig"), Some(123_456.into()), Some(654_321.into())).unwrap();
    fs::set_permissions(p("a/orig"), fs::Permissions::from_mode(0o4751)).unwrap();
    assert_eq!(fs::metadata(p("a/orig")).unwrap().mode() & 0o7777, 0o4751);

    // Nanosecond times, after 2038 and before 1970 too.
    let times = [(p("a/orig"), (1_234_567_890, 123_456_789)), (p("victim"), (4_102_444_800, 999_999_999))];
    for (f, (s, ns)) in &times {
        filetime::set_file_times(f, ft(*s, *ns), ft(*s - 1, ns / 2)).unwrap();
    }
    filetime::set_file_mtime(p("a/b/link1"), ft(-2, 500_000_000)).unwrap();
    filetime::set_symlink_file_times(p("a/fast"), ft(1, 1), ft(2, 2)).unwrap();
    let md = fs::metadata(p("victim")).unwrap();
    assert_eq!((md.atime(), md.atime_nsec()), (4_102_444_800, 999_999_999));
    assert_eq!((md.mtime(), md.mtime_nsec()), (4_102_444_799, 499_999_999));
    let md = fs::metadata(p("a/orig")).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (-2, 500_000_000), "a/b/link1 is a/orig");

    // Removal.
    fs::remove_dir_all(p("full")).unwrap();
    fs::remove_file(p("link2")).unwrap();
    expect_errno(fs::remove_dir(p("a")), libc::ENOTEMPTY, "rmdir of a non-empty dir");
    expect_errno(fs::remove_file(p("a")), libc::EISDIR, "unlink of a dir");
    expect_errno(fs::remove_dir(p("victim")), libc::ENOTDIR, "rmdir of a file");
    expect_errno(fs::create_dir(p("a")), libc::EEXIST, "mkdir over a dir");
    expect_errno(File::open(p("nope")), libc::ENOENT, "open of a missing file");

    let st = nix::sys::statvfs::statvfs(m.path()).unwrap();
    assert_eq!(st.name_max(), 255);
    unmount_and_compare(m, &img);
}

/// Names over 255 bytes give ENAMETOOLONG from every operation and write nothing.
#[test]
fn long_names_are_refused() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = new_image(dir.path(), "names.img", &[], "64M");
    let m = FuseMount::new(&img, "rw");
    let ok = "n".repeat(255);
    let long = "n".repeat(256);
    File::create(m.join(&ok)).unwrap();
    fs::create_dir(m.join("d")).unwrap();
    let l = m.join(&long);
    expect_errno(File::create(&l), libc::ENAMETOOLONG, "create");
    expect_errno(fs::create_dir(&l), libc::ENAMETOOLONG, "mkdir");
    expect_errno(symlink("x", &l), libc::ENAMETOOLONG, "symlink");
    expect_errno(fs::hard_link(m.join(&ok), &l), libc::ENAMETOOLONG, "link");
    expect_errno(fs::rename(m.join(&ok), &l), libc::ENAMETOOLONG, "rename");
    expect_errno(fs::metadata(&l), libc::ENAMETOOLONG, "lookup");
    expect_errno(fs::remove_file(&l), libc::ENAMETOOLONG, "unlink");
    let mut names: Vec<_> = fs::read_dir(m.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["d", "lost+found", ok.as_str()].map(std::ffi::OsString::from));
    unmount_and_compare(m, &img);
}

/// A directory handle whose directory was replaced by a rename, and a file handle whose file
/// was unlinked, still answer fstat (and the file still reads); once closed and forgotten,
/// nothing is left behind.
#[test]
fn handles_outlive_their_names() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = new_image(dir.path(), "handles.img", &[], "64M");
    let m = FuseMount::new(&img, "rw");
    fs::create_dir(m.join("src")).unwrap();
    fs::create_dir(m.join("dst")).unwrap();
    let before = fs::metadata(m.join("dst")).unwrap();
    let dst = File::open(m.join("dst")).unwrap();
    fs::rename(m.join("src"), m.join("dst")).unwrap();
    let md = dst.metadata().expect("fstat of a directory replaced by rename");
    assert_eq!(md.ino(), before.ino());
    assert!(md.is_dir());
    assert_eq!(md.nlink(), 0, "the replaced directory has no links left");
    drop(dst);

    fs::write(m.join("gone"), b"still here").unwrap_or_else(|e| {
        // Without engine writes an empty file still exercises the handle.
        eprintln!("note: write: {e}");
        File::create(m.join("gone")).map(drop).unwrap()
    });
    let mut f = File::open(m.join("gone")).unwrap();
    let len = f.metadata().unwrap().len();
    fs::remove_file(m.join("gone")).unwrap();
    let md = f.metadata().expect("fstat of an unlinked file");
    assert_eq!((md.nlink(), md.len()), (0, len));
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back.len() as u64, len);
    drop(f);
    unmount_and_compare(m, &img);
}

/// File data through the mount: sizes around block and extent boundaries, overwrites,
/// appends, sparse files, truncates (incl. huge ones), fallocate modes, copy_file_range,
/// SEEK_DATA / SEEK_HOLE, O_TRUNC, fsync.
#[test]
fn data_workload_matches_kernel() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = new_image(dir.path(), "data.img", &[], "512M");
    let m = FuseMount::new(&img, "rw");
    let p = |s: &str| m.join(s);
    let mut rng = Rng::new(42);

    for (i, size) in [0usize, 1, 4095, 4096, 4097, 65536, 1 << 20, (3 << 20) + 17].into_iter().enumerate() {
        let data = rng.bytes(size);
        fs::write(p(&format!("f{i}")), &data).unwrap();
        assert_eq!(fs::read(p(&format!("f{i}"))).unwrap(), data, "f{i} ({size} bytes)");
    }
    // Overwrite in the middle, across a block boundary.
    let f = OpenOptions::new().write(true).open(p("f6")).unwrap();
    f.write_all_at(&[0xAB; 10_000], 4000).unwrap();
    f.sync_all().unwrap();
    drop(f);
    // Appends.
    let mut a = OpenOptions::new().append(true).create(true).open(p("log")).unwrap();
    for i in 0..200 {
        writeln!(a, "line {i}").unwrap();
    }
    drop(a);
    assert_eq!(fs::read_to_string(p("log")).unwrap().lines().count(), 200);
    // Sparse: data far out, holes between.
    let s = File::create(p("sparse")).unwrap();
    s.write_all_at(b"head", 0).unwrap();
    s.write_all_at(b"far", 5 << 30).unwrap();
    assert_eq!(s.metadata().unwrap().len(), (5 << 30) + 3);
    let fd = &s;
    let data = nix::unistd::lseek(fd, 4096, nix::unistd::Whence::SeekData).unwrap();
    assert!(data > 4096 && data <= 5 << 30, "SEEK_DATA gave {data}");
    assert_eq!(nix::unistd::lseek(fd, 0, nix::unistd::Whence::SeekHole).unwrap() % 4096, 0);
    assert_eq!(
        nix::unistd::lseek(fd, (5 << 30) + 10, nix::unistd::Whence::SeekData),
        Err(nix::errno::Errno::ENXIO)
    );
    drop(s);
    // Truncates: shrink, grow, and past what ext4 can address.
    let t = OpenOptions::new().write(true).open(p("f7")).unwrap();
    t.set_len(12345).unwrap();
    t.set_len(1 << 22).unwrap();
    match t.set_len(1 << 60) {
        Ok(()) => assert_eq!(t.metadata().unwrap().len(), 1 << 60),
        Err(e) => assert_eq!(errno(&e), libc::EFBIG, "huge truncate: {e}"),
    }
    t.set_len(20000).unwrap();
    drop(t);
    // O_TRUNC.
    fs::write(p("f5"), b"short").unwrap();
    assert_eq!(fs::read(p("f5")).unwrap(), b"short");
    // fallocate: plain, keep-size, punch, zero range.
    let fa = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(p("falloc")).unwrap();
    nix::fcntl::fallocate(&fa, FallocateFlags::empty(), 0, 1 << 20).unwrap();
    assert_eq!(fa.metadata().unwrap().len(), 1 << 20);
    nix::fcntl::fallocate(&fa, FallocateFlags::FALLOC_FL_KEEP_SIZE, 1 << 20, 1 << 20).unwrap();
    assert_eq!(fa.metadata().unwrap().len(), 1 << 20);
    fa.write_all_at(&rng.bytes(300_000), 1000).unwrap();
    let punch = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    nix::fcntl::fallocate(&fa, punch, 8192, 65536).unwrap();
    nix::fcntl::fallocate(&fa, FallocateFlags::FALLOC_FL_ZERO_RANGE, 200_000, 50_000).unwrap();
    let mut buf = vec![0xFFu8; 65536];
    fa.read_exact_at(&mut buf, 8192).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "punched range reads as zeros");
    drop(fa);
    // copy_file_range (std's copy uses it between regular files).
    let mut src = File::open(p("f7")).unwrap();
    let mut dst = File::create(p("copy")).unwrap();
    std::io::copy(&mut src, &mut dst).unwrap();
    drop(dst);
    assert_eq!(fs::read(p("copy")).unwrap(), fs::read(p("f7")).unwrap());
    src.seek(SeekFrom::Start(0)).unwrap();
    drop(src);
    // Many small files with data.
    fs::create_dir(p("small")).unwrap();
    for i in 0..300 {
        fs::write(p(&format!("small/{i}")), rng.bytes(i * 37)).unwrap();
    }
    for i in (0..300).step_by(2) {
        fs::remove_file(p(&format!("small/{i}"))).unwrap();
    }
    unmount_and_compare(m, &img);
}

/// Extended attributes: set, replace, create-only, list, remove, ERANGE, ENODATA.
#[test]
fn xattrs_match_kernel() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = new_image(dir.path(), "xattr.img", &[], "64M");
    let m = FuseMount::new(&img, "rw");
    let f = m.join("f");
    File::create(&f).unwrap();
    fs::create_dir(m.join("d")).unwrap();
    xattr::set(&f, "user.small", b"v").unwrap();
    xattr::set(&f, "user.big", &vec![7u8; 700]).unwrap();
    // Too big for a 1 KiB block: ENOSPC, as the kernel says without ea_inode.
    expect_errno(xattr::set(&f, "user.huge", &vec![7u8; 3000]), libc::ENOSPC, "setxattr too big");
    xattr::set(m.join("d"), "user.dir", b"on a directory").unwrap();
    xattr::set(&f, "user.small", b"replaced").unwrap();
    xattr::set(&f, "user.gone", b"x").unwrap();
    xattr::remove(&f, "user.gone").unwrap();
    assert_eq!(xattr::get(&f, "user.small").unwrap().as_deref(), Some(&b"replaced"[..]));
    assert_eq!(xattr::get(&f, "user.gone").unwrap(), None);
    let mut names: Vec<_> = xattr::list(&f).unwrap().collect();
    names.sort();
    assert_eq!(names, ["user.big", "user.small"]);
    let r = nix::sys::stat::stat(&f).map(drop);
    assert!(r.is_ok());
    expect_errno(xattr::remove(&f, "user.none"), libc::ENODATA, "removexattr of a missing name");
    unmount_and_compare(m, &img);
}

/// With `ea_inode`, values up to the 64 KiB setxattr takes live in EA inodes: set, read,
/// replaced by a small value, removed; the kernel reads what is left.
#[test]
fn large_xattrs_in_ea_inodes() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = new_image(dir.path(), "ea.img", &["-O", "ea_inode"], "64M");
    let m = FuseMount::new(&img, "rw");
    let f = m.join("f");
    File::create(&f).unwrap();
    let big: Vec<u8> = (0..65_536u32).map(|i| (i * 7 % 251) as u8).collect();
    xattr::set(&f, "user.max", &big).unwrap();
    xattr::set(&f, "user.mid", &big[..5000]).unwrap();
    xattr::set(&f, "user.gone", &big[..9000]).unwrap();
    assert_eq!(xattr::get(&f, "user.max").unwrap().as_deref(), Some(&big[..]));
    xattr::set(&f, "user.mid", b"small now").unwrap();
    xattr::remove(&f, "user.gone").unwrap();
    assert_eq!(xattr::get(&f, "user.mid").unwrap().as_deref(), Some(&b"small now"[..]));
    expect_errno(xattr::set(&f, "user.over", &vec![1u8; 65_537]), libc::E2BIG, "setxattr over 64 KiB");
    unmount_and_compare(m, &img);
}

/// A read-only mount answers reads and refuses every change with EROFS; `norecovery` is
/// accepted only with `ro`.
#[test]
fn read_only_mount_refuses_changes() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d/f"), b"content").unwrap();
    let img = dir.path().join("ro.img");
    mkfs(Some(&src), &img, &[], "64M");
    for opts in ["ro", "ro,norecovery"] {
        let m = FuseMount::new(&img, opts);
        assert_eq!(fs::read(m.join("d/f")).unwrap(), b"content");
        expect_errno(File::create(m.join("new")), libc::EROFS, "create");
        expect_errno(fs::create_dir(m.join("nd")), libc::EROFS, "mkdir");
        expect_errno(fs::remove_file(m.join("d/f")), libc::EROFS, "unlink");
        expect_errno(OpenOptions::new().write(true).open(m.join("d/f")), libc::EROFS, "open for writing");
        m.unmount();
    }
    assert!(FuseMount::try_new(&img, "rw,norecovery").is_err());
    e2fsck_clean(&img);
}

/// Corruption found while mounted follows `errors=`: the operation fails with the kernel's
/// errno and the daemon goes on; under remount-ro later changes get EROFS.
#[test]
fn corruption_follows_errors_option() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("bad")).unwrap();
    for i in 0..50 {
        fs::write(src.join(format!("bad/entry-{i}")), b"").unwrap();
    }
    let img = dir.path().join("corrupt.img");
    mkfs(Some(&src), &img, &["-b", "4096"], "64M");
    let out = std::process::Command::new("debugfs").args(["-R", "blocks /bad"]).arg(&img).output().unwrap();
    let blk: u64 = String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().parse().unwrap();
    let f = OpenOptions::new().write(true).open(&img).unwrap();
    f.write_all_at(&[0x5A; 64], blk * 4096 + 24).unwrap();
    drop(f);

    for (opts, then_ok) in [("rw,errors=remount-ro", false), ("rw,errors=continue", true)] {
        let m = FuseMount::new(&img, opts);
        let r = fs::read_dir(m.join("bad")).and_then(|rd| rd.collect::<Result<Vec<_>, _>>());
        let e = r.expect_err("reading a corrupt directory");
        assert!([libc::EBADMSG, libc::EUCLEAN].contains(&errno(&e)), "{opts}: {e}");
        assert!(fs::metadata(m.path()).is_ok(), "{opts}: the daemon still answers");
        let made = fs::create_dir(m.join("after"));
        if then_ok {
            made.unwrap();
        } else {
            expect_errno(made, libc::EROFS, "mkdir after corruption under remount-ro");
        }
        m.unmount();
        // The error is recorded in the superblock, as the kernel records it.
        let out = std::process::Command::new("dumpe2fs").arg("-h").arg(&img).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            text.lines().any(|l| l.starts_with("Filesystem state:") && l.ends_with("clean with errors")),
            "{opts}: {text}"
        );
        assert!(text.contains("First error function:     ext4_readdir"), "{opts}: {text}");
    }
}

/// With allow_other, other users get the kernel's permission checks (default_permissions):
/// they work in what they own or may write, and are refused elsewhere.
#[test]
fn permissions_for_other_users() {
    if !fuse_available() || find_tool("setpriv").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = new_image(dir.path(), "perm.img", &[], "64M");
    let m = FuseMount::new(&img, "rw,allow_other");
    let root = m.path().to_str().unwrap().to_string();
    fs::create_dir(m.join("pub")).unwrap();
    fs::set_permissions(m.join("pub"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::create_dir(m.join("priv")).unwrap();
    fs::set_permissions(m.join("priv"), fs::Permissions::from_mode(0o700)).unwrap();
    File::create(m.join("pub/roots")).unwrap();
    fs::set_permissions(m.join("pub/roots"), fs::Permissions::from_mode(0o644)).unwrap();

    let (ok, out) = as_nobody(&format!("touch {root}/pub/mine && mkdir {root}/pub/mydir && ls {root}/pub"));
    assert!(ok, "nobody works in a world-writable dir: {out}");
    let md = fs::metadata(m.join("pub/mine")).unwrap();
    assert_eq!((md.uid(), md.gid()), (65534, 65534));
    for (what, script) in [
        ("create in a 0700 root dir", format!("touch {root}/priv/x")),
        ("list a 0700 root dir", format!("ls {root}/priv")),
        ("mkdir in the 0755 root", format!("mkdir {root}/x")),
        ("unlink root's file in a sticky dir", format!("rm -f {root}/pub/roots")),
        ("chmod root's file", format!("chmod 777 {root}/pub/roots")),
        ("write root's 0644 file", format!("echo x >> {root}/pub/roots")),
    ] {
        let (ok, out) = as_nobody(&script);
        assert!(!ok, "{what} must be refused: {out}");
        assert!(
            out.contains("Permission denied") || out.contains("Operation not permitted"),
            "{what}: {out}"
        );
    }
    assert!(m.join("pub/roots").exists());
    unmount_and_compare(m, &img);
}

/// Many workers creating, listing and removing in parallel directories and one shared one.
#[test]
fn parallel_namespace_workload() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = new_image(dir.path(), "par.img", &[], "256M");
    let m = FuseMount::new(&img, "rw,threads=4");
    let root = m.path().to_path_buf();
    fs::create_dir(root.join("shared")).unwrap();
    std::thread::scope(|s| {
        for w in 0..8 {
            let root = root.clone();
            s.spawn(move || {
                let own = root.join(format!("w{w}"));
                fs::create_dir(&own).unwrap();
                for i in 0..300 {
                    File::create(own.join(format!("f{i}"))).unwrap();
                    File::create(root.join(format!("shared/w{w}-{i}"))).unwrap();
                }
                assert_eq!(fs::read_dir(&own).unwrap().count(), 300);
                for i in (0..300).step_by(2) {
                    fs::remove_file(own.join(format!("f{i}"))).unwrap();
                    fs::rename(root.join(format!("shared/w{w}-{i}")), own.join(format!("moved{i}"))).unwrap();
                }
            });
        }
    });
    assert_eq!(fs::read_dir(root.join("shared")).unwrap().count(), 8 * 150);
    unmount_and_compare(m, &img);
}

/// A device whose reads panic, once armed, in the daemon's worker threads: a stand-in for a
/// bug the engine hits while serving a request.
struct PanickyReads {
    inner: rext4::dev::FileDevice,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl rext4::dev::BlockDevice for PanickyReads {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let worker = std::thread::current().name().is_some_and(|n| n.starts_with("fuser-"));
        if worker && self.armed.load(std::sync::atomic::Ordering::Relaxed) {
            panic!("read while armed");
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

/// A request that panics (a bug) gets EIO and costs neither its worker thread nor the mount:
/// more panics than there are workers, then every file reads back, changes go on, and the
/// image unmounts clean.
#[test]
fn panicking_requests_get_eio_and_the_daemon_lives() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let names: Vec<String> = (0..6).map(|i| format!("f{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        fs::write(src.join(n), vec![b'a' + i as u8; 5000]).unwrap();
    }
    let img = dir.path().join("panic.img");
    mkfs(Some(&src), &img, &[], "64M");
    let o = rext4_fuse::MountOptions::parse("rw,threads=2").unwrap();
    let armed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dev = PanickyReads { inner: rext4::dev::FileDevice::open(&img, true).unwrap(), armed: armed.clone() };
    let engine = rext4::Fs::from_device(std::sync::Arc::new(dev), o.engine_options()).unwrap();
    let m = FuseMount::serve(engine, &o).unwrap();
    // Names looked up first: the file data is what the armed reads fetch.
    for n in &names {
        assert_eq!(fs::metadata(m.join(n)).unwrap().len(), 5000);
    }
    armed.store(true, std::sync::atomic::Ordering::Relaxed);
    for n in &names {
        expect_errno(fs::read(m.join(n)), libc::EIO, "read while the device panics");
    }
    armed.store(false, std::sync::atomic::Ordering::Relaxed);
    for (i, n) in names.iter().enumerate() {
        assert_eq!(fs::read(m.join(n)).unwrap(), vec![b'a' + i as u8; 5000], "{n}");
    }
    fs::write(m.join("after"), b"still writable").unwrap();
    m.unmount();
    e2fsck_clean(&img);
    let check = rext4::Fs::open(&img).unwrap();
    assert_eq!(check.read_file("/after").unwrap(), b"still writable");
}

/// `chattr` and `lsattr` through the mount, and what the immutable and append-only flags
/// forbid there (the kernel's VFS knows nothing of ext4's flags on a FUSE inode, so the
/// daemon refuses); the kernel's mount shows the same flags afterwards.
#[test]
fn chattr_flags_through_the_mount() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = new_image(dir.path(), "chattr.img", &[], "64M");
    let m = FuseMount::new(&img, "rw");
    let chattr = |flag: &str, p: &std::path::Path| {
        let out = std::process::Command::new("chattr").arg(flag).arg(p).output().unwrap();
        assert!(out.status.success(), "chattr {flag}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let lsattr = |p: &std::path::Path| {
        let out = std::process::Command::new("lsattr").arg("-d").arg(p).output().unwrap();
        String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or("").to_string()
    };
    let f = m.join("f");
    fs::write(&f, b"data").unwrap();
    chattr("+i", &f);
    assert!(lsattr(&f).contains('i'), "lsattr: {}", lsattr(&f));
    expect_errno(OpenOptions::new().write(true).open(&f), libc::EPERM, "open an immutable file for writing");
    expect_errno(fs::remove_file(&f), libc::EPERM, "unlink an immutable file");
    expect_errno(fs::rename(&f, m.join("g")), libc::EPERM, "rename an immutable file");
    expect_errno(fs::set_permissions(&f, fs::Permissions::from_mode(0o600)), libc::EPERM, "chmod");
    chattr("-i", &f);
    chattr("+a", &f);
    expect_errno(
        OpenOptions::new().write(true).open(&f),
        libc::EPERM,
        "open an append-only file without O_APPEND",
    );
    OpenOptions::new().append(true).open(&f).unwrap().write_all(b"+more").unwrap();
    let trunc = nix::fcntl::open(
        &f,
        nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_APPEND | nix::fcntl::OFlag::O_TRUNC,
        nix::sys::stat::Mode::empty(),
    );
    assert_eq!(trunc.err(), Some(nix::errno::Errno::EPERM), "O_APPEND|O_TRUNC on an append-only file");
    expect_errno(fs::remove_file(&f), libc::EPERM, "unlink an append-only file");
    let d = m.join("d");
    fs::create_dir(&d).unwrap();
    chattr("+i", &d);
    expect_errno(File::create(d.join("x")), libc::EPERM, "create in an immutable directory");
    chattr("-i", &d);
    chattr("+d", &f);
    assert_eq!(fs::read(&f).unwrap(), b"data+more");
    unmount_and_compare(m, &img);
}

/// Appends to an append-only file with the writeback cache: the kernel writes whole pages
/// back, starting before the file's end, and those writes still go through (the bytes
/// already there are not written again); the file holds every append.
#[test]
fn append_only_with_the_writeback_cache() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = new_image(dir.path(), "wbapp.img", &[], "64M");
    let m = FuseMount::new(&img, "rw,writeback_cache");
    let f = m.join("log");
    fs::write(&f, b"start\n").unwrap();
    let out = std::process::Command::new("chattr").arg("+a").arg(&f).output().unwrap();
    assert!(out.status.success(), "chattr +a: {}", String::from_utf8_lossy(&out.stderr));
    let mut want = b"start\n".to_vec();
    for i in 0..50 {
        let line = format!("line {i}\n");
        let mut h = OpenOptions::new().append(true).open(&f).unwrap();
        h.write_all(line.as_bytes()).unwrap();
        h.sync_all().unwrap();
        want.extend_from_slice(line.as_bytes());
    }
    assert_eq!(fs::read(&f).unwrap(), want);
    let out = std::process::Command::new("chattr").arg("-a").arg(&f).output().unwrap();
    assert!(out.status.success());
    // Not a full comparison: with the writeback cache the kernel keeps its own change times
    // (see docs/fuse.md), so they differ from the stored ones until the next mount.
    m.unmount();
    e2fsck_clean(&img);
    if kernel_can_mount() {
        let k = KernelMount::ro(&img).expect("kernel mount");
        assert_eq!(fs::read(k.path().join("log")).unwrap(), want);
    }
}

/// Without `default_permissions` the daemon answers `access(2)` itself: a supplementary group
/// of the caller counts, as in the kernel's own check.
#[test]
fn access_counts_supplementary_groups() {
    if !fuse_available() || find_tool("setpriv").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = new_image(dir.path(), "groups.img", &[], "64M");
    let m = FuseMount::new(&img, "rw,allow_other,nodefault_permissions");
    let f = m.join("shared");
    fs::write(&f, b"x").unwrap();
    std::os::unix::fs::chown(&f, Some(0), Some(4242)).unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
    let path = f.to_str().unwrap();
    let access = |groups: &str| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", groups, "test", "-r", path])
            .status()
            .unwrap()
            .success()
    };
    assert!(access("--groups=4242"), "a supplementary group with read permission");
    assert!(!access("--clear-groups"), "no group with read permission");
    unmount_and_compare(m, &img);
}

/// Device nodes made and removed through the mount free no block (their device number is not
/// a block map), and a file whose extent names the journal is refused with `EUCLEAN` instead of
/// being written over it: the image stays as e2fsck found it.
#[test]
fn device_nodes_and_metadata_aimed_extents_leave_the_image_whole() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = new_image(dir.path(), "dev.img", &[], "64M");
    let m = FuseMount::new(&img, "rw");
    let before = rext4::Fs::open(&img).unwrap().statfs().unwrap().blocks_free;
    for (i, (ma, mi)) in [(1u32, 2u32), (1, 3), (8, 1), (259, 70000)].into_iter().enumerate() {
        let p =
            std::ffi::CString::new(m.join(&format!("c{i}")).into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: `p` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mknod(p.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(ma, mi)) }, 0);
    }
    for i in 0..4 {
        fs::remove_file(m.join(&format!("c{i}"))).unwrap();
    }
    m.unmount();
    e2fsck_clean(&img);
    assert_eq!(rext4::Fs::open(&img).unwrap().statfs().unwrap().blocks_free, before);

    // A one-block file whose extent is aimed at a block of the journal.
    let m = FuseMount::new(&img, "rw");
    fs::write(m.join("f"), [7u8; 4096]).unwrap();
    m.unmount();
    let journal_block =
        std::process::Command::new(tool("debugfs")).args(["-R", "bmap <8> 100"]).arg(&img).output().unwrap();
    let journal_block = String::from_utf8_lossy(&journal_block.stdout).trim().to_string();
    let out = std::process::Command::new(tool("debugfs"))
        .args(["-w", "-R", &format!("set_inode_field /f block[5] {journal_block}")])
        .arg(&img)
        .output()
        .unwrap();
    assert!(out.status.success());
    let m = FuseMount::new(&img, "rw");
    let f = fs::OpenOptions::new().write(true).open(m.join("f")).unwrap();
    let e = f.write_at(&[0xA5; 1024], 0).and_then(|_| f.sync_all()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EUCLEAN), "{e}");
    drop(f);
    m.unmount();
    let jb: u64 = journal_block.parse().unwrap();
    let bs = u64::from(rext4::Fs::open(&img).unwrap().block_size());
    let data = fs::read(&img).unwrap();
    let at = (jb * bs) as usize;
    let journal = &data[at..at + 4 * bs as usize];
    assert!(!journal.windows(64).any(|w| w.iter().all(|&b| b == 0xA5)), "written into the journal");
}

/// What the ACL script below shows of a tree: for each path, the mode and `getfacl`'s view.
const ACL_SCRIPT: &str = r#"set -e
cd "$1"
umask 022
mkdir d
setfacl -d -m u::r,g::r,o::- d
umask 0
touch d/f
mkdir d/sub
mknod d/fifo p
umask 077
touch d/g
umask 022
mkdir d2
setfacl -d -m u::rwx,u:1000:rwx,g::rx,m::rwx,o::x d2
touch d2/f
mkdir d2/sub
chmod 640 d2/f
umask 077
touch plain
setfacl -m u:65534:r plain
chmod 604 plain
touch denied
chmod 644 denied
setfacl -m u:65534:- denied
for f in d/f d/sub d/fifo d/g d2/f d2/sub plain denied; do
    stat -c '%A %n' "$f"
    getfacl -cp "$f"
done
"#;

/// POSIX ACLs as ext4 has them (xfstests generic/099): a new inode under a default ACL takes
/// it ANDed with the create mode, the umask not applied, and a new directory takes it as its
/// own default; without one the umask applies; chmod moves the ACL's mask; and the kernel
/// enforces an ACL entry that denies a user the mode would let in. The same script on a
/// kernel ext4 mount shows the same.
#[test]
fn acls_are_inherited_and_enforced_as_on_ext4() {
    if !fuse_available() {
        return;
    }
    let run = |dir: &std::path::Path| {
        let o = std::process::Command::new("sh").args(["-c", ACL_SCRIPT, "sh"]).arg(dir).output().unwrap();
        assert!(o.status.success(), "ACL script: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let dir = tempfile::tempdir().unwrap();
    let img = new_image(dir.path(), "acl.img", &[], "64M");
    let m = FuseMount::new(&img, "rw,allow_other");
    let fuse = run(m.path());
    assert!(fuse.contains("-r--r----- d/f\nuser::r--\ngroup::r--\nother::---\n"), "{fuse}");
    let (ok, why) = as_nobody(&format!("cat {}", m.join("denied").display()));
    assert!(!ok && why.contains("Permission denied"), "an ACL entry denies nobody: {why}");
    let (ok, why) = as_nobody(&format!("cat {}", m.join("plain").display()));
    assert!(ok, "an ACL entry lets nobody read: {why}");
    unmount_and_compare(m, &img);
    if !kernel_can_mount() {
        return;
    }
    let kimg = new_image(dir.path(), "kacl.img", &[], "64M");
    let k = KernelMount::rw(&kimg).expect("kernel mount");
    let kernel = run(k.path());
    k.unmount().unwrap();
    assert_eq!(fuse, kernel, "the FUSE mount against kernel ext4");
}

/// `grpid`: new files and directories take their directory's group, and a directory that
/// is not set-group-ID passes no set-group-ID bit on; the kernel's ext4 mounted with `grpid`
/// gives the same.
#[test]
fn grpid_gives_the_directory_group() {
    if !fuse_available() {
        return;
    }
    let show = |root: &std::path::Path| {
        fs::create_dir(root.join("g")).unwrap();
        nix::unistd::chown(&root.join("g"), None, Some(4242.into())).unwrap();
        File::create(root.join("g/f")).unwrap();
        fs::create_dir(root.join("g/sub")).unwrap();
        ["g/f", "g/sub"].map(|p| {
            let m = fs::metadata(root.join(p)).unwrap();
            (m.gid(), m.mode() & 0o2000)
        })
    };
    let dir = tempfile::tempdir().unwrap();
    let img = new_image(dir.path(), "grpid.img", &[], "64M");
    let m = FuseMount::new(&img, "rw,grpid");
    let fuse = show(m.path());
    assert_eq!(fuse, [(4242, 0), (4242, 0)]);
    unmount_and_compare(m, &img);
    if !kernel_can_mount() {
        return;
    }
    let kimg = new_image(dir.path(), "kgrpid.img", &[], "64M");
    let kdir = tempfile::tempdir().unwrap();
    let st = std::process::Command::new("mount")
        .args(["-t", "ext4", "-o", "loop,grpid"])
        .arg(&kimg)
        .arg(kdir.path())
        .status()
        .unwrap();
    assert!(st.success(), "kernel mount -o grpid");
    let kernel = show(kdir.path());
    let _ = std::process::Command::new("umount").arg(kdir.path()).status();
    assert_eq!(fuse, kernel, "the FUSE mount against kernel ext4 with grpid");
}
