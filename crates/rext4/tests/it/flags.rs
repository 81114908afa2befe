//! Inode flags: `chattr` through `Fs::set_flags`, and what the immutable and append-only
//! flags forbid. Every case runs on its own copy of an image whose flags the kernel set
//! (`chattr` on a loop mount), once through rext4 and once through the kernel: the errnos must
//! match, and the image rext4 leaves must be clean.

use rext4::format::inode::{APPEND_FL, IMMUTABLE_FL, NODUMP_FL};
use rext4::{Fs, InodeNo, Options, SetAttr, TimeSet, Timestamp};
use rext4_testkit::{e2fsck_clean, layout, require_kernel, tool, Image, KernelMount};
use std::path::{Path, PathBuf};
use std::process::Command;

const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
const DIRSYNC_FL: u32 = 0x0001_0000;

/// The image: `imm` (+i) and `app` (+a) files with data, `idir` (+i) and `adir` (+a)
/// directories holding `f`, and a plain file and directory.
fn base(dir: &Path) -> Option<PathBuf> {
    require_kernel!(None);
    let img = dir.join("base.img");
    Image::ext4("32M").block_size(4096).build(&img);
    let km = KernelMount::rw(&img).unwrap();
    let m = km.path();
    for f in ["imm", "app", "plain"] {
        std::fs::write(m.join(f), b"0123456789").unwrap();
    }
    for d in ["idir", "adir", "pdir"] {
        std::fs::create_dir(m.join(d)).unwrap();
        std::fs::write(m.join(d).join("f"), b"x").unwrap();
    }
    for (flag, path) in [("+i", "imm"), ("+a", "app"), ("+i", "idir"), ("+a", "adir")] {
        let st = Command::new(tool("chattr")).arg(flag).arg(m.join(path)).status().unwrap();
        assert!(st.success(), "chattr {flag} {path}");
    }
    km.unmount().unwrap();
    Some(img)
}

fn rw(img: &Path) -> Fs {
    Fs::open_with(img, Options { writable: true, ..Options::default() }).unwrap()
}

fn errno<T>(r: rext4::Result<T>) -> i32 {
    r.map_or_else(|e| e.errno(), |_| 0)
}

fn io_errno<T>(r: std::io::Result<T>) -> i32 {
    r.map_or_else(|e| e.raw_os_error().unwrap_or(-1), |_| 0)
}

fn nix_errno<T>(r: nix::Result<T>) -> i32 {
    r.map_or_else(|e| e as i32, |_| 0)
}

pub(crate) fn ino(fs: &Fs, p: &str) -> InodeNo {
    fs.resolve(p, false).unwrap_or_else(|e| panic!("{p}: {e}"))
}

type RextOp = fn(&Fs) -> i32;
type KernelOp = fn(&Path) -> i32;

fn setflags(path: &Path, flags: u32) -> i32 {
    use std::os::fd::AsRawFd;
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => return e.raw_os_error().unwrap_or(-1),
    };
    let v = flags as libc::c_int;
    // SAFETY: FS_IOC_SETFLAGS reads one int from the pointer, which outlives the call.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_SETFLAGS as _, &v) };
    if r == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }
}

/// `chattr` through rext4: `change` of the flags `lsattr` would show; the errno.
pub(crate) fn rext4_chflags(fs: &Fs, path: &str, change: impl Fn(u32) -> u32) -> i32 {
    let i = ino(fs, path);
    let flags = fs.getattr(i).unwrap().flags & rext4::FL_USER_VISIBLE;
    errno(fs.set_flags(i, change(flags)))
}

/// `chattr` through the kernel: `change` of `path`'s flags; the errno.
pub(crate) fn kernel_chflags(path: &Path, change: impl Fn(u32) -> u32) -> i32 {
    setflags(path, change(flags_of(path)))
}

/// `lsattr`'s flags for `path` on a mount, read with FS_IOC_GETFLAGS.
pub(crate) fn flags_of(path: &Path) -> u32 {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    let mut v: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int through the pointer, which outlives the call.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), 0x8008_6601u32 as _, &mut v) };
    assert_eq!(r, 0, "FS_IOC_GETFLAGS {}", path.display());
    v as u32
}

/// `touch` (both times set to now) through rext4; the errno.
fn rext4_touch(fs: &Fs, path: &str) -> i32 {
    let now = SetAttr { atime: Some(TimeSet::Now), mtime: Some(TimeSet::Now), ..SetAttr::default() };
    errno(fs.setattr(ino(fs, path), &now))
}

/// `touch` through the kernel; the errno.
fn kernel_touch(path: &Path) -> i32 {
    let now = nix::sys::time::TimeSpec::UTIME_NOW;
    nix_errno(nix::sys::stat::utimensat(
        nix::fcntl::AT_FDCWD,
        path,
        &now,
        &now,
        nix::sys::stat::UtimensatFlags::FollowSymlink,
    ))
}

fn cases() -> Vec<(&'static str, RextOp, KernelOp)> {
    vec![
        (
            "write to an immutable file",
            |fs| errno(fs.write(ino(fs, "/imm"), 0, b"x")),
            |m| io_errno(std::fs::OpenOptions::new().write(true).open(m.join("imm"))),
        ),
        (
            "write into an append-only file",
            |fs| errno(fs.write(ino(fs, "/app"), 0, b"x")),
            |m| io_errno(std::fs::OpenOptions::new().write(true).open(m.join("app"))),
        ),
        (
            "append to an append-only file",
            |fs| errno(fs.write(ino(fs, "/app"), 10, b"more")),
            |m| {
                use std::io::Write;
                io_errno(
                    std::fs::OpenOptions::new()
                        .append(true)
                        .open(m.join("app"))
                        .and_then(|mut f| f.write_all(b"more")),
                )
            },
        ),
        (
            "truncate an append-only file",
            |fs| errno(fs.setattr(ino(fs, "/app"), &SetAttr { size: Some(3), ..SetAttr::default() })),
            |m| nix_errno(nix::unistd::truncate(&m.join("app"), 3)),
        ),
        (
            "chmod an immutable file",
            |fs| errno(fs.setattr(ino(fs, "/imm"), &SetAttr { mode: Some(0o600), ..SetAttr::default() })),
            |m| {
                nix_errno(nix::sys::stat::fchmodat(
                    nix::fcntl::AT_FDCWD,
                    &m.join("imm"),
                    nix::sys::stat::Mode::from_bits_truncate(0o600),
                    nix::sys::stat::FchmodatFlags::FollowSymlink,
                ))
            },
        ),
        (
            "chown an append-only file",
            |fs| errno(fs.setattr(ino(fs, "/app"), &SetAttr { uid: Some(7), ..SetAttr::default() })),
            |m| io_errno(std::os::unix::fs::chown(m.join("app"), Some(7), None)),
        ),
        (
            "set times of an append-only file",
            |fs| {
                let at = TimeSet::At(Timestamp { sec: 1_600_000_000, nsec: 0 });
                errno(fs.setattr(ino(fs, "/app"), &SetAttr { mtime: Some(at), ..SetAttr::default() }))
            },
            |m| {
                let t = filetime::FileTime::from_unix_time(1_600_000_000, 0);
                io_errno(filetime::set_file_mtime(m.join("app"), t))
            },
        ),
        ("touch an append-only file", |fs| rext4_touch(fs, "/app"), |m| kernel_touch(&m.join("app"))),
        ("touch an immutable file", |fs| rext4_touch(fs, "/imm"), |m| kernel_touch(&m.join("imm"))),
        (
            "unlink an immutable file",
            |fs| errno(fs.unlink(fs.root(), b"imm")),
            |m| io_errno(std::fs::remove_file(m.join("imm"))),
        ),
        (
            "unlink an append-only file",
            |fs| errno(fs.unlink(fs.root(), b"app")),
            |m| io_errno(std::fs::remove_file(m.join("app"))),
        ),
        (
            "rename an immutable file",
            |fs| errno(fs.rename(fs.root(), b"imm", fs.root(), b"x", 0)),
            |m| io_errno(std::fs::rename(m.join("imm"), m.join("x"))),
        ),
        (
            "rename over an append-only file",
            |fs| errno(fs.rename(fs.root(), b"plain", fs.root(), b"app", 0)),
            |m| io_errno(std::fs::rename(m.join("plain"), m.join("app"))),
        ),
        (
            "link an append-only file",
            |fs| errno(fs.link(ino(fs, "/app"), fs.root(), b"x")),
            |m| io_errno(std::fs::hard_link(m.join("app"), m.join("x"))),
        ),
        (
            "create in an immutable directory",
            |fs| errno(fs.create(ino(fs, "/idir"), b"new", 0o644, 0, 0)),
            |m| io_errno(std::fs::File::create(m.join("idir/new"))),
        ),
        (
            "create an existing name in an immutable directory",
            |fs| errno(fs.mkdir(ino(fs, "/idir"), b"f", 0o755, 0, 0)),
            |m| io_errno(std::fs::create_dir(m.join("idir/f"))),
        ),
        (
            "symlink in an immutable directory",
            |fs| errno(fs.symlink(ino(fs, "/idir"), b"s", b"f", 0, 0)),
            |m| io_errno(std::os::unix::fs::symlink("f", m.join("idir/s"))),
        ),
        (
            "unlink a missing name in an immutable directory",
            |fs| errno(fs.unlink(ino(fs, "/idir"), b"none")),
            |m| io_errno(std::fs::remove_file(m.join("idir/none"))),
        ),
        (
            "unlink in an immutable directory",
            |fs| errno(fs.unlink(ino(fs, "/idir"), b"f")),
            |m| io_errno(std::fs::remove_file(m.join("idir/f"))),
        ),
        (
            "rmdir a non-empty immutable directory",
            |fs| errno(fs.rmdir(fs.root(), b"idir")),
            |m| io_errno(std::fs::remove_dir(m.join("idir"))),
        ),
        (
            "create in an append-only directory",
            |fs| errno(fs.create(ino(fs, "/adir"), b"new", 0o644, 0, 0)),
            |m| io_errno(std::fs::File::create(m.join("adir/new"))),
        ),
        (
            "unlink in an append-only directory",
            |fs| errno(fs.unlink(ino(fs, "/adir"), b"f")),
            |m| io_errno(std::fs::remove_file(m.join("adir/f"))),
        ),
        (
            "rename out of an append-only directory",
            |fs| errno(fs.rename(ino(fs, "/adir"), b"f", fs.root(), b"g", 0)),
            |m| io_errno(std::fs::rename(m.join("adir/f"), m.join("g"))),
        ),
        (
            "rename into an append-only directory",
            |fs| errno(fs.rename(fs.root(), b"plain", ino(fs, "/adir"), b"p", 0)),
            |m| io_errno(std::fs::rename(m.join("plain"), m.join("adir/p"))),
        ),
        (
            "rename into an immutable directory",
            |fs| errno(fs.rename(fs.root(), b"plain", ino(fs, "/idir"), b"p", 0)),
            |m| io_errno(std::fs::rename(m.join("plain"), m.join("idir/p"))),
        ),
        (
            "set an xattr on an immutable file",
            |fs| errno(fs.setxattr(ino(fs, "/imm"), b"user.x", b"v", 0)),
            |m| io_errno(xattr::set(m.join("imm"), "user.x", b"v")),
        ),
        (
            "punch a hole in an append-only file",
            |fs| errno(fs.fallocate(ino(fs, "/app"), 3, 0, 4)),
            |m| {
                let f = std::fs::OpenOptions::new().append(true).open(m.join("app")).unwrap();
                let mode = nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                    | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
                nix_errno(nix::fcntl::fallocate(&f, mode, 0, 4))
            },
        ),
        (
            "allocate past the end of an append-only file",
            |fs| errno(fs.fallocate(ino(fs, "/app"), 1, 0, 8192)),
            |m| {
                let f = std::fs::OpenOptions::new().append(true).open(m.join("app")).unwrap();
                nix_errno(nix::fcntl::fallocate(&f, nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE, 0, 8192))
            },
        ),
        (
            "clear the immutable flag",
            |fs| rext4_chflags(fs, "/imm", |f| f & !IMMUTABLE_FL),
            |m| kernel_chflags(&m.join("imm"), |f| f & !IMMUTABLE_FL),
        ),
        (
            "set another flag on an immutable file",
            |fs| rext4_chflags(fs, "/imm", |f| f | NODUMP_FL),
            |m| kernel_chflags(&m.join("imm"), |f| f | NODUMP_FL),
        ),
        (
            "set a directory flag on a file",
            |fs| rext4_chflags(fs, "/plain", |f| f | DIRSYNC_FL),
            |m| kernel_chflags(&m.join("plain"), |f| f | DIRSYNC_FL),
        ),
        (
            "make a directory append-only",
            |fs| rext4_chflags(fs, "/pdir", |f| f | APPEND_FL),
            |m| kernel_chflags(&m.join("pdir"), |f| f | APPEND_FL),
        ),
    ]
}

/// Every case gives the kernel's errno; rext4's image stays clean, and what it changed (or
/// left) is what the kernel changed (or left): the flags and sizes of every file.
#[test]
fn immutable_and_append_only_match_the_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let Some(base) = base(dir.path()) else { return };
    let mut failures = Vec::new();
    for (i, (what, ours, theirs)) in cases().into_iter().enumerate() {
        let a = dir.path().join(format!("r{i}.img"));
        let b = dir.path().join(format!("k{i}.img"));
        std::fs::copy(&base, &a).unwrap();
        std::fs::copy(&base, &b).unwrap();
        let fs = rw(&a);
        let got = ours(&fs);
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&a);
        let km = KernelMount::rw(&b).unwrap();
        let want = theirs(km.path());
        km.unmount().unwrap();
        if got != want {
            failures.push(format!("{what}: rext4 {got}, kernel {want}"));
            continue;
        }
        // The same state: flags (as lsattr shows them) and sizes.
        let (ka, kb) = (KernelMount::ro(&a).unwrap(), KernelMount::ro(&b).unwrap());
        for p in [
            "imm", "app", "plain", "idir", "adir", "pdir", "idir/f", "adir/f", "x", "g", "adir/p", "adir/new",
        ] {
            let (x, y) = (ka.path().join(p), kb.path().join(p));
            let state = |q: &Path| std::fs::symlink_metadata(q).ok().map(|m| (m.len(), flags_of(q)));
            if state(&x) != state(&y) {
                failures.push(format!("{what}: {p}: rext4 left {:?}, the kernel {:?}", state(&x), state(&y)));
            }
        }
        ka.unmount().unwrap();
        kb.unmount().unwrap();
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// New inodes take their directory's inheritable flags as the kernel gives them: a
/// directory with `suSDdAct` set (by chattr through the kernel on one image, through rext4 on
/// another) gets a file, a directory, a fast symlink, a slow one and a fifo made in it by
/// each side; every new inode's whole flag word (debugfs) is the kernel's, and both images
/// are clean. Inline-data directories inherit too.
#[test]
fn new_inodes_inherit_their_directorys_flags() {
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    let set = "+s +u +S +D +d +A +c +t";
    let names = ["f", "sub", "fast", "slow", "fifo"];
    for (label, args) in [("plain", &["-b", "4096"][..]), ("inline", &["-O", "inline_data"][..])] {
        let theirs = dir.path().join(format!("{label}-kernel.img"));
        let ours = dir.path().join(format!("{label}-rext4.img"));
        Image::ext4("32M").args(args).build(&theirs);
        Image::ext4("32M").args(args).build(&ours);
        {
            let km = KernelMount::rw(&theirs).unwrap();
            let p = km.path().join("p");
            std::fs::create_dir(&p).unwrap();
            let st = Command::new(tool("chattr")).args(set.split(' ')).arg(&p).status().unwrap();
            assert!(st.success(), "chattr {set}");
            std::fs::write(p.join("f"), b"").unwrap();
            std::fs::create_dir(p.join("sub")).unwrap();
            std::os::unix::fs::symlink("t", p.join("fast")).unwrap();
            std::os::unix::fs::symlink("s".repeat(100), p.join("slow")).unwrap();
            nix::unistd::mkfifo(&p.join("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
            km.unmount().unwrap();
        }
        let want = layout(&theirs, "/p").0;
        {
            let fs = rw(&ours);
            let p = fs.mkdir(fs.root(), b"p", 0o755, 0, 0).unwrap().ino;
            // The flags chattr set on the kernel's side, as lsattr shows them.
            assert_eq!(errno(fs.set_flags(p, want & rext4::FL_USER_VISIBLE)), 0);
            fs.create(p, b"f", 0o644, 0, 0).unwrap();
            fs.mkdir(p, b"sub", 0o755, 0, 0).unwrap();
            fs.symlink(p, b"fast", b"t", 0, 0).unwrap();
            fs.symlink(p, b"slow", "s".repeat(100).as_bytes(), 0, 0).unwrap();
            fs.mknod(p, b"fifo", libc::S_IFIFO as u16 | 0o644, (0, 0), 0, 0).unwrap();
            fs.unmount().unwrap();
        }
        e2fsck_clean(&ours);
        e2fsck_clean(&theirs);
        assert_eq!(layout(&ours, "/p").0, want, "{label}: the directory's flags");
        let mut inherited = 0;
        for n in names {
            let path = format!("/p/{n}");
            let (got, kernel) = (layout(&ours, &path).0, layout(&theirs, &path).0);
            assert_eq!(got, kernel, "{label}: flags of {n}: {got:#x} against the kernel's {kernel:#x}");
            inherited += usize::from(got & NODUMP_FL != 0);
        }
        assert_eq!(inherited, names.len(), "{label}: every new inode took nodump");
    }
}
