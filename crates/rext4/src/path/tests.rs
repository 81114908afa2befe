//! The path-level write API: `File` over an open file description, `OpenOptions` as std
//! checks them, and the `std::fs`-like helpers with the kernel's errno for each failure.

use crate::test_image::{fsck_clean, mkfs_image, open_mem};
use crate::{Creds, Error, Fs, Leftover, LockType, OpenFlags, Unremovable, Wait};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn fresh() -> (Fs, Arc<crate::dev::MemDevice>) {
    open_mem(mkfs_image(None, &["-O", "^metadata_csum_seed"], "32M"))
}

/// Syncs and asserts e2fsck finds nothing to fix.
fn clean(fs: &Fs, dev: &crate::dev::MemDevice) {
    fs.sync().unwrap();
    fsck_clean(&dev.snapshot());
}

fn errno<T: std::fmt::Debug>(r: crate::Result<T>) -> i32 {
    r.expect_err("an error").errno()
}

/// Files and options move between threads, as std's do.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<crate::File>();
    shared::<crate::OpenOptions>();
};

fn perm(mode: u32) -> std::fs::Permissions {
    std::fs::Permissions::from_mode(mode)
}

/// Runs debugfs's `-w -R` requests on image `bytes`.
fn debugfs(bytes: Vec<u8>, reqs: &[&str]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("a.img");
    std::fs::write(&img, bytes).unwrap();
    for r in reqs {
        let o = std::process::Command::new("debugfs").args(["-w", "-R", r]).arg(&img).output().unwrap();
        assert!(o.status.success() && !String::from_utf8_lossy(&o.stderr).contains("rror"), "{r}: {o:?}");
    }
    std::fs::read(&img).unwrap()
}

#[test]
fn whole_file_helpers_write_read_and_replace() {
    let (fs, dev) = fresh();
    fs.write_file("/a", b"hello").unwrap();
    assert_eq!(fs.read_file("/a").unwrap(), b"hello");
    assert_eq!(fs.read_to_string("/a").unwrap(), "hello");
    let a = fs.metadata("/a").unwrap();
    assert_eq!((a.perm(), a.uid, a.gid), (0o644, 0, 0));
    // Writing again cuts what was there.
    fs.write_file("/a", b"hi").unwrap();
    assert_eq!(fs.read_file("/a").unwrap(), b"hi");
    // Through a symbolic link, to its target.
    fs.create_symlink("a", "/l").unwrap();
    fs.write_file("/l", vec![7u8; 300_000]).unwrap();
    assert_eq!(fs.read_file("/a").unwrap(), vec![7u8; 300_000]);
    fs.write_file("/bin", [0xffu8, 0xfe]).unwrap();
    assert_eq!(errno(fs.read_to_string("/bin")), libc::EINVAL);
    fs.write_file("/empty", b"").unwrap();
    assert!(fs.read_file("/empty").unwrap().is_empty());
    fs.create_dir("/d").unwrap();
    assert_eq!(errno(fs.read_file("/d")), libc::EISDIR);
    assert_eq!(errno(fs.write_file("/d", b"x")), libc::EISDIR);
    assert_eq!(errno(fs.write_file("/missing/x", b"x")), libc::ENOENT);
    assert_eq!(errno(fs.write_file("/a/x", b"x")), libc::ENOTDIR);
    assert_eq!(errno(fs.write_file("/new/", b"x")), libc::EISDIR);
    assert_eq!(errno(fs.read_file("")), libc::ENOENT);
    clean(&fs, &dev);
}

#[test]
fn open_options_check_combinations_as_std_does() {
    let (fs, dev) = fresh();
    let o = || fs.open_options();
    assert_eq!(errno(o().open("/x")), libc::EINVAL, "neither read nor write");
    assert_eq!(errno(o().read(true).truncate(true).open("/x")), libc::EINVAL, "truncate without write");
    assert_eq!(errno(o().read(true).create(true).open("/x")), libc::EINVAL, "create without write");
    assert_eq!(errno(o().read(true).create_new(true).open("/x")), libc::EINVAL);
    assert_eq!(errno(o().append(true).truncate(true).open("/x")), libc::EINVAL, "truncate with append");
    assert_eq!(errno(o().write(true).open("/x")), libc::ENOENT, "no create: nothing made");
    assert!(!fs.exists("/x").unwrap());

    let mut f = o().write(true).create_new(true).mode(0o600).open("/x").unwrap();
    assert_eq!(f.metadata().unwrap().perm(), 0o600);
    f.write_all(b"0123456789").unwrap();
    drop(f);
    assert_eq!(errno(o().write(true).create_new(true).open("/x")), libc::EEXIST);
    fs.create_symlink("/nowhere", "/dangling").unwrap();
    assert_eq!(errno(o().write(true).create_new(true).open("/dangling")), libc::EEXIST);
    // create_new wins over create and truncate, as in std.
    assert_eq!(errno(o().write(true).create(true).truncate(true).create_new(true).open("/x")), libc::EEXIST);
    assert_eq!(fs.read_file("/x").unwrap(), b"0123456789");

    // Append: every write at the end, whatever the position says.
    let mut ap = o().append(true).open("/x").unwrap();
    assert!(ap.as_open_file().flags().contains(OpenFlags::APPEND | OpenFlags::WRITE));
    ap.seek(SeekFrom::Start(0)).unwrap();
    ap.write_all(b"ab").unwrap();
    assert_eq!(ap.write_at(b"cd", 0).unwrap(), 2);
    assert_eq!(ap.stream_position().unwrap(), 12);
    let mut buf = [0u8; 1];
    assert_eq!(
        ap.read(&mut buf).unwrap_err().raw_os_error(),
        Some(libc::EBADF),
        "append alone is write-only"
    );
    drop(ap);
    assert_eq!(fs.read_file("/x").unwrap(), b"0123456789abcd");
    let rw = o().read(true).append(true).open("/x").unwrap();
    assert_eq!(rw.read_at(&mut buf, 0).unwrap(), 1);

    // Truncate cuts an existing file; create alone keeps it.
    drop(o().write(true).create(true).open("/x").unwrap());
    assert_eq!(fs.metadata("/x").unwrap().size, 14);
    drop(o().write(true).truncate(true).open("/x").unwrap());
    assert_eq!(fs.metadata("/x").unwrap().size, 0);

    // Read-only files refuse writes with EBADF, and set_len with EINVAL.
    let mut ro = o().read(true).open("/x").unwrap();
    assert_eq!(ro.write(b"x").unwrap_err().raw_os_error(), Some(libc::EBADF));
    assert_eq!(errno(ro.set_len(3)), libc::EINVAL);

    // Custom flags: O_NOFOLLOW, O_DIRECTORY; access mode bits ignored; O_TMPFILE refused.
    fs.create_symlink("x", "/lx").unwrap();
    assert_eq!(errno(o().read(true).custom_flags(libc::O_NOFOLLOW).open("/lx")), libc::ELOOP);
    assert_eq!(errno(o().read(true).custom_flags(libc::O_DIRECTORY).open("/x")), libc::ENOTDIR);
    let f = o().read(true).custom_flags(libc::O_RDWR | libc::O_CLOEXEC).open("/x").unwrap();
    assert_eq!(f.as_open_file().flags(), OpenFlags::READ);
    assert_eq!(errno(o().write(true).custom_flags(libc::O_TMPFILE).open("/")), libc::EOPNOTSUPP);
    let sync = o().write(true).custom_flags(libc::O_SYNC).open("/x").unwrap();
    assert!(sync.as_open_file().flags().contains(OpenFlags::SYNC));
    assert_eq!(errno(o().write(true).create(true).open("/newdir/")), libc::EISDIR);
    assert_eq!(errno(o().write(true).open("/")), libc::EISDIR);
    clean(&fs, &dev);
}

#[test]
fn a_file_reads_writes_seeks_and_shares_its_position_with_clones() {
    let (fs, dev) = fresh();
    let mut f = fs.open_options().read(true).write(true).create(true).open("/f").unwrap();
    f.write_all(b"hello world").unwrap();
    assert_eq!(f.seek(SeekFrom::Current(-5)).unwrap(), 6);
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "world");
    assert_eq!(f.seek(SeekFrom::End(2)).unwrap(), 13);
    f.write_all(b"!").unwrap();
    let mut all = vec![0u8; 20];
    assert_eq!(f.read_at(&mut all, 0).unwrap(), 14);
    assert_eq!(&all[..14], b"hello world\0\0!");
    assert_eq!(f.seek(SeekFrom::Current(-100)).unwrap_err().raw_os_error(), Some(libc::EINVAL));
    // A clone is a dup: one position.
    let mut g = f.try_clone().unwrap();
    g.seek(SeekFrom::Start(0)).unwrap();
    let mut five = [0u8; 5];
    (&f).read_exact(&mut five).unwrap();
    assert_eq!(&five, b"hello");
    assert_eq!(g.stream_position().unwrap(), 5);
    assert_eq!(f.write_at(b"J", 0).unwrap(), 1);
    f.set_len(5).unwrap();
    assert_eq!(f.metadata().unwrap().size, 5);
    f.sync_all().unwrap();
    f.sync_data().unwrap();
    f.set_permissions(perm(0o640)).unwrap();
    assert_eq!(fs.metadata("/f").unwrap().perm(), 0o640);
    // The description takes locks: a second one sees the first's OFD lock.
    let lock = crate::FileLock::new(LockType::Write, 0, 5, crate::LockOwner::Ofd(0));
    f.as_open_file().setlk(lock, None, Wait::No).unwrap();
    let other = fs.open_options().read(true).write(true).open("/f").unwrap();
    assert!(matches!(other.as_open_file().setlk(lock, None, Wait::No), Err(Error::WouldBlock)));
    drop((f, g));
    other.as_open_file().setlk(lock, None, Wait::No).unwrap();
    drop(other);
    assert_eq!(fs.read_file("/f").unwrap(), b"Jello");
    // The read-only open the path API always had still reads, through links.
    fs.create_symlink("/f", "/lf").unwrap();
    let mut r = fs.open_file("/lf").unwrap();
    let mut v = Vec::new();
    r.read_to_end(&mut v).unwrap();
    assert_eq!(v, b"Jello");
    assert_eq!(errno(fs.open_file("/nothing")), libc::ENOENT);
    clean(&fs, &dev);
}

#[test]
fn an_unlinked_open_file_keeps_working_and_is_freed_on_drop() {
    let (fs, dev) = fresh();
    let before = fs.statfs().unwrap();
    let mut f = fs.create_file("/tmpdata").unwrap();
    f.write_all(&vec![5u8; 200_000]).unwrap();
    let mut r = fs.open_file("/tmpdata").unwrap();
    fs.remove_file("/tmpdata").unwrap();
    assert!(!fs.exists("/tmpdata").unwrap());
    // Both handles still work: no ESTALE.
    f.write_all(b"tail").unwrap();
    let mut v = Vec::new();
    r.read_to_end(&mut v).unwrap();
    assert_eq!(v.len(), 200_004);
    assert_eq!(&v[200_000..], b"tail");
    assert_eq!(r.metadata().unwrap().nlink, 0);
    f.set_len(10).unwrap();
    assert_eq!(r.metadata().unwrap().size, 10);
    let ino = f.ino();
    drop(f);
    assert_eq!(r.read_at(&mut [0u8; 4], 0).unwrap(), 4, "the reader still holds it");
    drop(r);
    assert!(matches!(fs.getattr(ino), Err(Error::NotFound | Error::Stale)));
    let after = fs.statfs().unwrap();
    assert_eq!((after.blocks_free, after.files_free), (before.blocks_free, before.files_free));
    clean(&fs, &dev);
}

#[test]
fn create_dir_and_create_dir_all_answer_as_mkdir_does() {
    let (fs, dev) = fresh();
    fs.create_dir("/a").unwrap();
    assert_eq!(fs.metadata("/a").unwrap().perm(), 0o755);
    assert_eq!(errno(fs.create_dir("/a")), libc::EEXIST);
    assert_eq!(errno(fs.create_dir("/")), libc::EEXIST);
    assert_eq!(errno(fs.create_dir("/a/..")), libc::EEXIST);
    assert_eq!(errno(fs.create_dir("/missing/b")), libc::ENOENT);
    fs.create_dir("/a/b/").unwrap();
    fs.write_file("/file", b"x").unwrap();
    assert_eq!(errno(fs.create_dir("/file/b")), libc::ENOTDIR);
    assert_eq!(errno(fs.create_dir(format!("/{}", "n".repeat(256)))), libc::ENAMETOOLONG);

    fs.create_dir_all("/a/b/c/d/e").unwrap();
    fs.create_dir_all("/a/b/c/d/e").unwrap();
    fs.create_dir_all("/").unwrap();
    fs.create_dir_all("/a/./b/../b/c2/").unwrap();
    assert!(fs.metadata("/a/b/c2").unwrap().kind == crate::FileType::Directory);
    assert_eq!(errno(fs.create_dir_all("/file/x/y")), libc::ENOTDIR);
    assert_eq!(errno(fs.create_dir_all("/file")), libc::EEXIST);
    // Through a link to a directory, and onto one; a dangling link takes its name.
    fs.create_symlink("a/b", "/lb").unwrap();
    fs.create_dir_all("/lb/via/link").unwrap();
    assert!(fs.exists("/a/b/via/link").unwrap());
    fs.create_dir_all("/lb").unwrap();
    fs.create_symlink("/nowhere", "/dangling").unwrap();
    assert_eq!(errno(fs.create_dir_all("/dangling/x")), libc::EEXIST);
    fs.create_symlink("file", "/lfile").unwrap();
    assert_eq!(errno(fs.create_dir_all("/lfile/x")), libc::ENOTDIR);
    assert!(!fs.exists("/nowhere").unwrap());
    clean(&fs, &dev);
}

#[test]
fn removals_refuse_what_unlink_and_rmdir_refuse() {
    let (fs, dev) = fresh();
    fs.create_dir_all("/d/sub").unwrap();
    fs.write_file("/d/f", b"x").unwrap();
    fs.create_symlink("/d", "/ld").unwrap();
    assert_eq!(errno(fs.remove_file("/d")), libc::EISDIR);
    assert_eq!(errno(fs.remove_file("/")), libc::EISDIR);
    assert_eq!(errno(fs.remove_file("/d/.")), libc::EISDIR);
    assert_eq!(errno(fs.remove_file("/d/f/")), libc::ENOTDIR);
    assert_eq!(errno(fs.remove_file("/d/gone")), libc::ENOENT);
    assert_eq!(errno(fs.remove_dir("/d")), libc::ENOTEMPTY);
    assert_eq!(errno(fs.remove_dir("/d/f")), libc::ENOTDIR);
    assert_eq!(errno(fs.remove_dir("/ld")), libc::ENOTDIR, "a link is not followed");
    assert_eq!(errno(fs.remove_dir("/")), libc::EBUSY);
    assert_eq!(errno(fs.remove_dir("/d/sub/.")), libc::EINVAL);
    assert_eq!(errno(fs.remove_dir("/d/sub/..")), libc::ENOTEMPTY);
    // A link is removed, not what it names.
    fs.remove_file("/ld").unwrap();
    assert!(fs.exists("/d/f").unwrap());
    fs.remove_file("/d/f").unwrap();
    fs.remove_dir("/d/sub/").unwrap();
    fs.remove_dir("/d").unwrap();
    assert!(!fs.exists("/d").unwrap());
    clean(&fs, &dev);
}

#[test]
fn remove_dir_all_removes_trees_without_following_links_out() {
    let (fs, dev) = fresh();
    let before = fs.statfs().unwrap();
    fs.create_dir_all("/keep/inner").unwrap();
    fs.write_file("/keep/inner/precious", b"keep me").unwrap();
    fs.write_file("/keep/file", b"me too").unwrap();
    fs.create_dir_all("/t/a/b").unwrap();
    for i in 0..300 {
        fs.write_file(format!("/t/a/f{i}"), vec![1u8; 2000]).unwrap();
    }
    fs.create_symlink("/keep", "/t/abs").unwrap();
    fs.create_symlink("../../keep/inner", "/t/a/rel").unwrap();
    fs.create_symlink("/keep/file", "/t/a/b/tofile").unwrap();
    fs.create_symlink("/t", "/t/a/b/up").unwrap();
    fs.hard_link("/keep/file", "/t/hard").unwrap();
    fs.create_dir("/t/empty").unwrap();
    // A symbolic link given as the path is removed itself.
    fs.create_symlink("/keep", "/link-to-keep").unwrap();
    fs.remove_dir_all("/link-to-keep").unwrap();
    assert!(fs.exists("/keep/inner/precious").unwrap());
    // A trailing slash would follow it: refused instead.
    fs.create_symlink("/keep", "/link-to-keep").unwrap();
    assert_eq!(errno(fs.remove_dir_all("/link-to-keep/")), libc::ENOTDIR);
    fs.remove_file("/link-to-keep").unwrap();
    assert_eq!(errno(fs.remove_dir_all("/keep/file")), libc::ENOTDIR);
    assert_eq!(errno(fs.remove_dir_all("/")), libc::EBUSY);
    assert_eq!(errno(fs.remove_dir_all("/t/.")), libc::EINVAL);
    assert_eq!(errno(fs.remove_dir_all("/t/a/..")), libc::ENOTEMPTY);
    assert_eq!(errno(fs.remove_dir_all("/nothing")), libc::ENOENT);
    assert!(fs.exists("/t/a/f299").unwrap(), "refusals touch nothing");

    fs.remove_dir_all("/t").unwrap();
    assert!(!fs.exists("/t").unwrap());
    assert_eq!(fs.read_file("/keep/inner/precious").unwrap(), b"keep me");
    assert_eq!(fs.read_file("/keep/file").unwrap(), b"me too");
    assert_eq!(fs.metadata("/keep/file").unwrap().nlink, 1);
    fs.remove_dir_all("/keep").unwrap();
    let after = fs.statfs().unwrap();
    assert_eq!((after.blocks_free, after.files_free), (before.blocks_free, before.files_free));
    clean(&fs, &dev);
}

#[test]
fn remove_dir_all_handles_a_tree_two_thousand_levels_deep() {
    let (fs, dev) = fresh();
    let deep: String = "/deep".to_string() + &"/d".repeat(1999);
    fs.create_dir_all(&deep).unwrap();
    fs.write_file(format!("{deep}/leaf"), b"bottom").unwrap();
    fs.create_symlink("/", format!("{deep}/root")).unwrap();
    assert_eq!(fs.read_file(format!("{deep}/leaf")).unwrap(), b"bottom");
    fs.remove_dir_all("/deep").unwrap();
    assert!(!fs.exists("/deep").unwrap());
    assert_eq!(fs.read_dir("/").unwrap().filter(|e| e.as_ref().unwrap().name != b"lost+found").count(), 0);
    clean(&fs, &dev);
}

#[test]
fn remove_dir_all_leaves_directory_links_of_a_crafted_image() {
    // `/a/b/loop` is a second name of `/a`, `/a/out` one of `/outside`: neither is followed.
    let img = debugfs(
        mkfs_image(None, &["-O", "^metadata_csum_seed"], "32M"),
        &["mkdir /a", "mkdir /a/b", "mkdir /outside", "link /a /a/b/loop", "link /outside /a/out"],
    );
    let (fs, dev) = open_mem(img);
    fs.write_file("/a/b/file", b"x").unwrap();
    fs.write_file("/outside/precious", b"keep").unwrap();
    let a = fs.metadata("/a").unwrap().ino;
    let outside = fs.metadata("/outside").unwrap().ino;
    // Plain: the first one met stops the walk as corruption.
    let e = fs.remove_dir_all("/a").unwrap_err();
    assert_eq!(e.errno(), libc::EUCLEAN, "{e}");
    assert!(e.as_corrupt().is_some());
    // With a callback: both are left and reported; everything else goes.
    let mut left: Vec<(PathBuf, Vec<u8>, crate::InodeNo, Unremovable)> = Vec::new();
    let r = fs.remove_dir_all_with("/a", |l: &Leftover<'_>| {
        left.push((l.dir_path.to_path_buf(), l.entry.name.clone(), l.entry.ino, l.why));
        Ok(())
    });
    assert_eq!(errno(r), libc::ENOTEMPTY);
    left.sort_by(|x, y| (&x.0, &x.1).cmp(&(&y.0, &y.1)));
    assert_eq!(
        left,
        vec![
            (PathBuf::from("/a"), b"out".to_vec(), outside, Unremovable::DirectoryLink),
            (PathBuf::from("/a/b"), b"loop".to_vec(), a, Unremovable::DirectoryLink),
        ]
    );
    assert!(!fs.exists("/a/b/file").unwrap());
    assert_eq!(fs.read_file("/outside/precious").unwrap(), b"keep");
    // A callback's error stops the walk with it.
    let r = fs.remove_dir_all_with("/a", |_| Err(Error::Interrupted));
    assert_eq!(errno(r), libc::EINTR);
    fs.unmount().unwrap();
    let fixed = debugfs(dev.snapshot(), &["unlink /a/b/loop", "unlink /a/out"]);
    let (fs, dev) = open_mem(fixed);
    fs.remove_dir_all("/a").unwrap();
    assert_eq!(fs.read_file("/outside/precious").unwrap(), b"keep");
    clean(&fs, &dev);
}

#[test]
fn rename_and_links_by_path() {
    let (fs, dev) = fresh();
    fs.create_dir_all("/d/sub").unwrap();
    fs.write_file("/d/f", b"one").unwrap();
    fs.write_file("/g", b"two").unwrap();
    fs.rename_path("/d/f", "/d/sub/f2").unwrap();
    assert_eq!(fs.read_file("/d/sub/f2").unwrap(), b"one");
    fs.rename_path("/g", "/d/sub/f2").unwrap();
    assert_eq!(fs.read_file("/d/sub/f2").unwrap(), b"two");
    assert_eq!(errno(fs.rename_path("/d", "/d/sub/inside")), libc::EINVAL);
    fs.create_dir("/e").unwrap();
    assert_eq!(errno(fs.rename_path("/e", "/d")), libc::ENOTEMPTY);
    assert_eq!(errno(fs.rename_path("/d/sub/f2", "/e/")), libc::ENOTDIR);
    assert_eq!(errno(fs.rename_path("/d/sub/f2/", "/x")), libc::ENOTDIR);
    assert_eq!(errno(fs.rename_path("/", "/x")), libc::EBUSY);
    assert_eq!(errno(fs.rename_path("/e", "/d/..")), libc::EBUSY);
    assert_eq!(errno(fs.rename_path("/gone", "/x")), libc::ENOENT);
    fs.rename_path("/e/", "/e2/").unwrap();

    fs.hard_link("/d/sub/f2", "/h").unwrap();
    assert_eq!(fs.metadata("/h").unwrap().nlink, 2);
    assert_eq!(errno(fs.hard_link("/d/sub/f2", "/h")), libc::EEXIST);
    assert_eq!(errno(fs.hard_link("/d", "/dl")), libc::EPERM);
    assert_eq!(errno(fs.hard_link("/d/sub/f2", "/")), libc::EEXIST);
    assert_eq!(errno(fs.hard_link("/d/sub/f2", "/new/")), libc::ENOENT);
    assert_eq!(errno(fs.hard_link("/d/sub/f2", "/h/")), libc::EEXIST);
    fs.create_symlink("h", "/s").unwrap();
    assert_eq!(fs.read_link("/s").unwrap(), Path::new("h"));
    // link(2) links a symbolic link itself.
    fs.hard_link("/s", "/s2").unwrap();
    assert_eq!(fs.symlink_metadata("/s2").unwrap().kind, crate::FileType::Symlink);
    assert_eq!(errno(fs.create_symlink("x", "/s")), libc::EEXIST);
    assert_eq!(errno(fs.create_symlink("", "/empty")), libc::ENOENT);
    clean(&fs, &dev);
}

#[test]
fn exists_and_canonicalize_resolve_as_stat_and_realpath() {
    let (fs, dev) = fresh();
    fs.create_dir_all("/a/b/c").unwrap();
    fs.write_file("/a/b/c/file", b"x").unwrap();
    fs.create_symlink("b/c", "/a/rel").unwrap();
    fs.create_symlink("/a/b", "/abs").unwrap();
    fs.create_symlink("../../abs/c/file", "/a/b/up").unwrap();
    fs.create_symlink("loop2", "/loop1").unwrap();
    fs.create_symlink("loop1", "/loop2").unwrap();
    fs.create_symlink("/missing", "/dangling").unwrap();
    let odd = std::ffi::OsStr::from_bytes(b"/caf\xe9\n");
    fs.create_dir(odd).unwrap();

    assert!(fs.exists("/a/rel/file").unwrap());
    assert!(!fs.exists("/dangling").unwrap());
    assert!(!fs.exists("/a/nothing").unwrap());
    assert_eq!(errno(fs.exists("/loop1")), libc::ELOOP);
    assert_eq!(errno(fs.exists("/a/b/c/file/x")), libc::ENOTDIR);

    let canon = |p: &str| fs.canonicalize(p).map(|p| p.to_string_lossy().into_owned());
    assert_eq!(canon("/a/rel/file").unwrap(), "/a/b/c/file");
    assert_eq!(canon("abs/./c/../c/").unwrap(), "/a/b/c");
    assert_eq!(canon("/a/b/up").unwrap(), "/a/b/c/file");
    assert_eq!(canon("/a/rel/..").unwrap(), "/a/b", "`..` after a link is the link's target's parent");
    assert_eq!(canon("/../..").unwrap(), "/");
    assert_eq!(canon("/").unwrap(), "/");
    assert_eq!(errno(canon("/loop1")), libc::ELOOP);
    assert_eq!(errno(canon("/dangling")), libc::ENOENT);
    assert_eq!(errno(canon("/a/b/c/file/")), libc::ENOTDIR);
    assert_eq!(errno(canon("/a/b/c/file/..")), libc::ENOTDIR);
    assert_eq!(errno(canon("")), libc::ENOENT);
    let p = fs.canonicalize(std::ffi::OsStr::from_bytes(b"/a/../caf\xe9\n/.")).unwrap();
    assert_eq!(p.as_os_str().as_bytes(), b"/caf\xe9\n", "names are bytes, kept as they are");
    // `file/.` is not a directory either (resolution checks before skipping `.`).
    assert_eq!(errno(fs.metadata("/a/b/c/file/.")), libc::ENOTDIR);
    fs.set_permissions("/abs", perm(0o700)).unwrap();
    assert_eq!(fs.metadata("/a/b").unwrap().perm(), 0o700, "set_permissions follows links");
    clean(&fs, &dev);
}

#[test]
fn a_user_meets_the_kernels_permission_checks() {
    let (fs, dev) = fresh();
    let alice = fs.as_user(Creds::user(1000, 1000, &[]));
    let bob = fs.as_user(Creds::user(2000, 2000, &[]));
    // Root's directories are not hers to change.
    assert_eq!(errno(alice.create_dir("/mine")), libc::EACCES);
    assert_eq!(errno(alice.write_file("/f", b"x")), libc::EACCES);
    fs.create_dir("/home").unwrap();
    fs.set_permissions("/home", perm(0o1777)).unwrap();
    alice.create_dir_all("/home/alice/deep/er").unwrap();
    let a = alice.metadata("/home/alice/deep").unwrap();
    assert_eq!((a.uid, a.gid, a.perm()), (1000, 1000, 0o755));
    alice.write_file("/home/alice/notes", b"private").unwrap();
    alice.set_permissions("/home/alice/notes", perm(0o600)).unwrap();
    assert_eq!(errno(bob.read_file("/home/alice/notes")), libc::EACCES);
    assert_eq!(errno(bob.set_permissions("/home/alice/notes", perm(0o666))), libc::EPERM);
    assert_eq!(errno(bob.remove_file("/home/alice/notes")), libc::EACCES);
    assert_eq!(errno(bob.create_dir_all("/home/alice/bob")), libc::EACCES);
    assert_eq!(errno(bob.open_options().write(true).open("/home/alice/notes")), libc::EACCES);
    // fchmod checks the credentials the file was opened with.
    alice.write_file("/home/alice/shared", b"s").unwrap();
    let f = bob.open_file("/home/alice/shared").unwrap();
    assert_eq!(errno(f.set_permissions(perm(0o666))), libc::EPERM);
    alice.open_file("/home/alice/shared").unwrap().set_permissions(perm(0o640)).unwrap();
    assert_eq!(f.metadata().unwrap().perm(), 0o640);
    // The sticky /home: Bob may not remove or rename Alice's directory.
    bob.create_dir("/home/bob").unwrap();
    assert_eq!(errno(bob.remove_dir_all("/home/alice")), libc::EACCES);
    assert_eq!(errno(bob.rename_path("/home/alice", "/home/bob/stolen")), libc::EPERM);
    // Listing needs read permission, walking needs search permission.
    alice.create_dir("/home/alice/locked").unwrap();
    alice.write_file("/home/alice/locked/x", b"x").unwrap();
    alice.set_permissions("/home/alice/locked", perm(0o300)).unwrap();
    assert_eq!(errno(alice.read_dir("/home/alice/locked")), libc::EACCES);
    assert_eq!(errno(alice.remove_dir_all("/home/alice/locked")), libc::EACCES);
    alice.set_permissions("/home/alice/locked", perm(0o600)).unwrap();
    assert_eq!(errno(alice.exists("/home/alice/locked/x")), libc::EACCES);
    assert_eq!(errno(alice.canonicalize("/home/alice/locked/x")), libc::EACCES);
    assert_eq!(errno(alice.read_to_string("/home/alice/locked/x")), libc::EACCES);
    // Root passes where the owner does not.
    assert!(fs.exists("/home/alice/locked/x").unwrap());
    alice.set_permissions("/home/alice/locked", perm(0o700)).unwrap();
    alice.remove_dir_all("/home/alice").unwrap();
    assert_eq!(bob.read_dir("/home").unwrap().count(), 1);
    clean(&fs, &dev);
}
