//! Names, directories, links and handles through the mount, compared with the kernel.

use super::*;
use nix::fcntl::{renameat2, RenameFlags, AT_FDCWD};
use std::sync::OnceLock;

static MEDIUM: OnceLock<SourceTree> = OnceLock::new();

/// A tree made by `mkfs.ext4 -d`, read through the mount: every stat field, byte, xattr and
/// link target as the kernel's ext4 shows them.
#[test]
fn read_tree_matches_kernel() {
    require_fuse!();
    let tree = source_tree(&MEDIUM, "fuse-medium", TreeSpec::medium());
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("tree.img");
    Image::ext4("1G").from_dir(&tree.dir).build(&img);
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
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("256M").build_in(dir.path(), "ns.img");
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
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").build_in(dir.path(), "names.img");
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
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").build_in(dir.path(), "handles.img");
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

/// Many workers creating, listing and removing in parallel directories and one shared one.
#[test]
fn parallel_namespace_workload() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("256M").build_in(dir.path(), "par.img");
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
