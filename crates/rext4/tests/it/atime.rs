//! Access times on reads (`Options::atime`, `nodiratime`, `O_NOATIME`, `chattr +A`): each case
//! gets an image made by mkfs.ext4 whose times debugfs set in the past, reads a file or lists
//! a directory through rext4, and checks the access time against the kernel's rules
//! (`atime_needs_update` / `relatime_need_update` in fs/inode.c). Every image a case changed is
//! then reopened (the new time is on disk) and checked with `e2fsck -fn`; the first case also
//! has the kernel read it back.

use rext4::format::inode::NOATIME_FL;
use rext4::{AtimeMode, Fs, Options, Timestamp};
use rext4_testkit::{debugfs_write, e2fsck_clean, kernel_can_mount, Image, KernelMount};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

const HOUR: i64 = 3600;
const DAY: i64 = 24 * HOUR;

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// Times of one path, as seconds before now: (atime, mtime, ctime).
type Ago = (i64, i64, i64);

/// An image holding `/f` (a file with data) and `/d` (a directory with two files), with
/// `f`'s and `d`'s times set by debugfs to `f_ago` and `d_ago` before now.
fn image(dir: &Path, inode_size: u32, f_ago: Ago, d_ago: Ago) -> PathBuf {
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("f"), vec![7u8; 5000]).unwrap();
    std::fs::write(src.join("d/a"), b"a").unwrap();
    std::fs::write(src.join("d/b"), b"b").unwrap();
    let img = dir.join("atime.img");
    Image::ext4("16M").block_size(4096).inode_size(inode_size).from_dir(&src).build(&img);
    set_times(&img, &[("/f", f_ago), ("/d", d_ago)]);
    img
}

/// Sets each path's (atime, mtime, ctime) to that many seconds before now, with debugfs.
fn set_times(img: &Path, times: &[(&str, Ago)]) {
    let t = now();
    let cmds: String = times
        .iter()
        .map(|(p, (a, m, c))| {
            format!("sif {p} atime @{}\nsif {p} mtime @{}\nsif {p} ctime @{}\n", t - a, t - m, t - c)
        })
        .collect();
    debugfs_write(img, &cmds);
}

fn open(img: &Path, atime: AtimeMode, nodiratime: bool) -> Fs {
    Fs::open_with(img, Options { writable: true, atime, nodiratime, ..Options::default() }).unwrap()
}

/// A case: the image of [`image`] (with `f_ago` and `d_ago`) opened writable with `atime` and
/// `nodiratime`; the directory holding it goes with the first element.
fn case(
    inode_size: u32,
    f_ago: Ago,
    d_ago: Ago,
    atime: AtimeMode,
    nodiratime: bool,
) -> (tempfile::TempDir, PathBuf, Fs) {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), inode_size, f_ago, d_ago);
    let fs = open(&img, atime, nodiratime);
    (dir, img, fs)
}

/// Reads `/f` and lists `/d`, and asserts that neither access time moved; returns them.
fn reads_keep_both(fs: &Fs) -> (Timestamp, Timestamp) {
    let (f0, d0) = (atime(fs, "/f"), atime(fs, "/d"));
    read_f(fs);
    list_d(fs);
    assert_eq!((atime(fs, "/f"), atime(fs, "/d")), (f0, d0));
    (f0, d0)
}

fn atime(fs: &Fs, p: &str) -> Timestamp {
    fs.symlink_metadata(p).unwrap().atime
}

/// Reads all of `/f` through an open file.
fn read_f(fs: &Fs) {
    assert_eq!(fs.read_file("/f").unwrap().len(), 5000);
}

/// Lists `/d` through the path-level iterator.
fn list_d(fs: &Fs) {
    assert_eq!(fs.read_dir("/d").unwrap().count(), 2);
}

/// Asserts `t` lies between `before` and now (whole seconds).
fn assert_now(t: Timestamp, before: i64, what: &str) {
    assert!(t.sec >= before && t.sec <= now(), "{what}: atime {t:?} is not now ({before})");
}

/// Closes `fs`, checks the image, and returns `p`'s access time as a fresh open reads it.
fn reopen_atime(fs: Fs, img: &Path, p: &str) -> Timestamp {
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(img);
    atime(&Fs::open(img).unwrap(), p)
}

#[test]
fn relatime_renews_an_atime_older_than_mtime() {
    let (_dir, img, fs) =
        case(256, (2 * HOUR, HOUR, HOUR), (2 * HOUR, HOUR, HOUR), AtimeMode::Relatime, false);
    let old = atime(&fs, "/f");
    let before = now();
    read_f(&fs);
    let new = atime(&fs, "/f");
    assert_now(new, before, "read after a change");
    // Newer than mtime and ctime now: a second read leaves it.
    read_f(&fs);
    assert_eq!(atime(&fs, "/f"), new, "second read");
    list_d(&fs);
    assert_now(atime(&fs, "/d"), before, "listing after a change");
    assert_ne!(old, new);
    assert_eq!(reopen_atime(fs, &img, "/f"), new, "on disk");
    if kernel_can_mount() {
        let km = KernelMount::ro(&img).unwrap();
        let md = std::fs::symlink_metadata(km.path().join("f")).unwrap();
        assert_eq!((md.atime(), md.atime_nsec() as u32), (new.sec, new.nsec), "the kernel's view");
        km.unmount().unwrap();
    }
}

#[test]
fn relatime_renews_an_atime_older_than_ctime_only() {
    let (_dir, img, fs) =
        case(256, (2 * HOUR, 3 * HOUR, HOUR), (HOUR, 2 * HOUR, 2 * HOUR), AtimeMode::Relatime, false);
    let before = now();
    read_f(&fs);
    assert_now(atime(&fs, "/f"), before, "ctime after atime");
    reopen_atime(fs, &img, "/f");
}

#[test]
fn relatime_keeps_a_recent_atime_newer_than_mtime_and_ctime() {
    let ago = (HOUR, 2 * HOUR, 2 * HOUR);
    let (_dir, img, fs) = case(256, ago, ago, AtimeMode::Relatime, false);
    let (f0, _) = reads_keep_both(&fs);
    assert_eq!(reopen_atime(fs, &img, "/f"), f0);
}

#[test]
fn relatime_renews_an_atime_a_day_old() {
    let ago = (DAY + HOUR, 3 * DAY, 3 * DAY);
    let (_dir, img, fs) = case(256, ago, ago, AtimeMode::Relatime, false);
    let before = now();
    read_f(&fs);
    list_d(&fs);
    assert_now(atime(&fs, "/f"), before, "file");
    assert_now(atime(&fs, "/d"), before, "directory");
    reopen_atime(fs, &img, "/f");
}

#[test]
fn noatime_flag_keeps_the_atime() {
    let ago = (2 * DAY, HOUR, HOUR);
    let (_dir, img, fs) = case(256, ago, ago, AtimeMode::StrictAtime, false);
    let f = fs.resolve("/f", false).unwrap();
    let flags = fs.getattr(f).unwrap().flags;
    fs.set_flags(f, flags | NOATIME_FL).unwrap();
    let t0 = atime(&fs, "/f");
    read_f(&fs);
    assert_eq!(atime(&fs, "/f"), t0, "chattr +A, even under strictatime");
    // The flag is the file's alone: the directory's is set.
    let before = now();
    list_d(&fs);
    assert_now(atime(&fs, "/d"), before, "directory without the flag");
    assert_eq!(reopen_atime(fs, &img, "/f"), t0);
}

#[test]
fn noatime_mode_keeps_every_atime() {
    let ago = (2 * DAY, HOUR, HOUR);
    let (_dir, img, fs) = case(256, ago, ago, AtimeMode::NoAtime, false);
    let (_, d0) = reads_keep_both(&fs);
    assert_eq!(reopen_atime(fs, &img, "/d"), d0);
}

#[test]
fn strictatime_renews_on_every_read() {
    // Newer than mtime and ctime and an hour old: relatime would keep it.
    let ago = (HOUR, 2 * HOUR, 2 * HOUR);
    let (_dir, img, fs) = case(256, ago, ago, AtimeMode::StrictAtime, false);
    let before = now();
    read_f(&fs);
    let first = atime(&fs, "/f");
    assert_now(first, before, "first read");
    std::thread::sleep(std::time::Duration::from_millis(20));
    read_f(&fs);
    let second = atime(&fs, "/f");
    assert!(second > first, "second read: {second:?} after {first:?}");
    list_d(&fs);
    assert_now(atime(&fs, "/d"), before, "directory");
    assert_eq!(reopen_atime(fs, &img, "/f"), second);
}

#[test]
fn nodiratime_keeps_directories_atime() {
    let ago = (2 * DAY, HOUR, HOUR);
    let (_dir, img, fs) = case(256, ago, ago, AtimeMode::StrictAtime, true);
    let d0 = atime(&fs, "/d");
    list_d(&fs);
    // The inode-level call too (what the FUSE daemon's READDIR makes).
    let d = fs.resolve("/d", false).unwrap();
    fs.readdir(d, 0, |_| true).unwrap();
    assert_eq!(atime(&fs, "/d"), d0, "directory under nodiratime");
    let before = now();
    read_f(&fs);
    assert_now(atime(&fs, "/f"), before, "files are read as before");
    assert_eq!(reopen_atime(fs, &img, "/d"), d0);
}

#[test]
fn read_only_never_changes_atime() {
    let dir = tempfile::tempdir().unwrap();
    let ago = (2 * DAY, HOUR, HOUR);
    let img = image(dir.path(), 256, ago, ago);
    let before = std::fs::read(&img).unwrap();
    let fs = Fs::open_with(&img, Options { atime: AtimeMode::StrictAtime, ..Options::default() }).unwrap();
    reads_keep_both(&fs);
    drop(fs);
    assert!(std::fs::read(&img).unwrap() == before, "a read-only open changed the image");
}

#[test]
fn o_noatime_and_empty_reads_keep_atime() {
    let ago = (2 * DAY, HOUR, HOUR);
    let (_dir, img, fs) = case(256, ago, ago, AtimeMode::StrictAtime, false);
    let f0 = atime(&fs, "/f");
    let f = fs.open_options().read(true).custom_flags(libc::O_NOATIME).open("/f").unwrap();
    let mut buf = vec![0u8; 8192];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), 5000);
    let ino = fs.resolve("/f", false).unwrap();
    assert_eq!(fs.read_noatime(ino, 0, &mut buf).unwrap(), 5000);
    // A read of no bytes reads nothing and touches nothing (`filemap_read`).
    assert_eq!(fs.read(ino, 0, &mut []).unwrap(), 0);
    assert_eq!(atime(&fs, "/f"), f0, "O_NOATIME");
    let d = fs.resolve("/d", false).unwrap();
    let d0 = atime(&fs, "/d");
    fs.readdir_noatime(d, 0, |_| true).unwrap();
    assert_eq!(atime(&fs, "/d"), d0, "readdir_noatime");
    // The same file opened plainly, and a read at the end (still a read, as in the kernel).
    let before = now();
    let g = fs.open_options().read(true).open("/f").unwrap();
    assert_eq!(g.read_at(&mut buf, 5000).unwrap(), 0);
    assert_now(atime(&fs, "/f"), before, "plain open");
    drop((f, g));
    reopen_atime(fs, &img, "/f");
}

#[test]
fn small_inodes_take_whole_seconds() {
    let ago = (2 * DAY, HOUR, HOUR);
    let (_dir, img, fs) = case(128, ago, ago, AtimeMode::StrictAtime, false);
    let before = now();
    read_f(&fs);
    let t = atime(&fs, "/f");
    assert_now(t, before, "128-byte inode");
    assert_eq!(t.nsec, 0, "no i_atime_extra to hold nanoseconds");
    assert_eq!(reopen_atime(fs, &img, "/f"), t);
}

/// An image holding `/f` and symbolic links to it: `fast` and `slow` (target in the record
/// and in a block), `walk` (only followed) and `keep` (access time newer than its changes),
/// each link's times set by debugfs: `(2h, 1h, 1h)` ago, `keep`'s `(1h, 2h, 2h)`.
fn link_image(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), b"target").unwrap();
    let slow = format!("{}f", "./".repeat(40));
    for (l, t) in [("fast", "f"), ("slow", slow.as_str()), ("walk", "f"), ("keep", "f")] {
        std::os::unix::fs::symlink(t, src.join(l)).unwrap();
    }
    let img = dir.join("links.img");
    Image::ext4("16M").block_size(4096).from_dir(&src).build(&img);
    let (renew, keep) = ((2 * HOUR, HOUR, HOUR), (HOUR, 2 * HOUR, 2 * HOUR));
    set_times(&img, &[("/fast", renew), ("/slow", renew), ("/walk", renew), ("/keep", keep)]);
    img
}

/// `readlink` and a path walk through a link set the link's access time as a read sets a
/// file's (the kernel's `do_readlinkat` and `pick_link`); `readlink_noatime`, `lstat` and
/// `noatime` leave it.
#[test]
fn symlinks_take_access_times_when_read_or_followed() {
    const LINKS: [&str; 4] = ["/fast", "/slow", "/walk", "/keep"];
    for (mode, want) in [
        (AtimeMode::Relatime, &["/fast", "/slow", "/walk"][..]),
        (AtimeMode::StrictAtime, &LINKS[..]),
        (AtimeMode::NoAtime, &[][..]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let img = link_image(dir.path());
        let fs = open(&img, mode, false);
        let old: Vec<Timestamp> = LINKS.iter().map(|p| atime(&fs, p)).collect();
        // What reads no link: lstat, and readlink_noatime.
        let fast = fs.symlink_metadata("/fast").unwrap().ino;
        assert_eq!(fs.readlink_noatime(fast).unwrap(), b"f");
        assert_eq!(atime(&fs, "/fast"), old[0], "{mode:?}: readlink_noatime");
        let before = now();
        assert_eq!(fs.readlink(fast).unwrap(), b"f");
        assert_eq!(fs.read_link("/slow").unwrap(), Path::new(&format!("{}f", "./".repeat(40))));
        assert_eq!(fs.metadata("/walk").unwrap().size, 6, "{mode:?}: stat through the link");
        assert_eq!(fs.read_link("/keep").unwrap(), Path::new("f"));
        let new: Vec<Timestamp> = LINKS.iter().map(|p| atime(&fs, p)).collect();
        for (i, p) in LINKS.iter().enumerate() {
            if want.contains(p) {
                assert_now(new[i], before, &format!("{mode:?}: {p}"));
            } else {
                assert_eq!(new[i], old[i], "{mode:?}: {p} kept");
            }
        }
        assert_eq!(reopen_atime(fs, &img, "/slow"), new[1], "{mode:?}: on disk");
    }
}
