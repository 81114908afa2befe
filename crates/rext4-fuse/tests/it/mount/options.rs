//! Mount options (read-only, `errors=`, flags) and a daemon that outlives panicking requests.

use super::*;

/// A read-only mount answers reads and refuses every change with EROFS; `norecovery` is
/// accepted only with `ro`.
#[test]
fn read_only_mount_refuses_changes() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d/f"), b"content").unwrap();
    let img = dir.path().join("ro.img");
    Image::ext4("64M").from_dir(&src).build(&img);
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
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("bad")).unwrap();
    for i in 0..50 {
        fs::write(src.join(format!("bad/entry-{i}")), b"").unwrap();
    }
    let img = dir.path().join("corrupt.img");
    Image::ext4("64M").block_size(4096).from_dir(&src).build(&img);
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
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let names: Vec<String> = (0..6).map(|i| format!("f{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        fs::write(src.join(n), vec![b'a' + i as u8; 5000]).unwrap();
    }
    let img = dir.path().join("panic.img");
    Image::ext4("64M").from_dir(&src).build(&img);
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
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").build_in(dir.path(), "chattr.img");
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

/// The mount's readahead window is one of the daemon's largest requests less a page (1020
/// KiB, so a window's reply can be spliced through a 1 MiB pipe), not the kernel's 128 KiB
/// for a new FUSE mount, and a large file read through it in one stream comes back whole.
#[test]
fn readahead_window_is_the_largest_request() {
    use std::os::unix::fs::MetadataExt;
    require_fuse!();
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP: only root may set a mount's readahead window");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("ra.img");
    Image::ext4("64M").build(&img);
    let m = FuseMount::new(&img, "rw");
    let dev = fs::metadata(m.path()).unwrap().dev();
    assert_eq!(nix::sys::stat::major(dev), 0, "a FUSE mount's device is anonymous");
    let sysfs =
        format!("/sys/class/bdi/{}:{}/read_ahead_kb", nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    assert_eq!(fs::read_to_string(&sysfs).unwrap().trim(), "1020", "{sysfs}");
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i * 7 + i / 4096) as u8).collect();
    fs::write(m.join("big"), &data).unwrap();
    // From the daemon, not the kernel's page cache.
    fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    assert!(fs::read(m.join("big")).unwrap() == data, "read back through a 1 MiB window");
    unmount_and_compare(m, &img);
}
