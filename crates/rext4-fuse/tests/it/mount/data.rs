//! File data and extended attributes through the mount, compared with the kernel.

use super::*;
use nix::fcntl::FallocateFlags;

/// File data through the mount: sizes around block and extent boundaries, overwrites,
/// appends, sparse files, truncates (incl. huge ones), fallocate modes, copy_file_range,
/// SEEK_DATA / SEEK_HOLE, O_TRUNC, fsync.
#[test]
fn data_workload_matches_kernel() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("512M").build_in(dir.path(), "data.img");
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
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").build_in(dir.path(), "xattr.img");
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
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").features("ea_inode").build_in(dir.path(), "ea.img");
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

/// Appends to an append-only file with the writeback cache: the kernel writes whole pages
/// back, starting before the file's end, and those writes still go through (the bytes
/// already there are not written again); the file holds every append.
#[test]
fn append_only_with_the_writeback_cache() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").build_in(dir.path(), "wbapp.img");
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

/// Data written before a file becomes immutable or append-only reaches the image, with the
/// writeback cache too, as on kernel ext4 (which writes a file's dirty pages back whatever its
/// flags): the kernel holds such writes in its own cache, and the daemon refuses writes to a
/// file with either flag, so the kernel must send them before the flag's change. `fsync`
/// after the change succeeds and the bytes are on disk.
#[test]
fn data_written_before_chattr_reaches_the_image() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
    // What each side does: write, make the file immutable or append-only, fsync, read back.
    let run = |root: &std::path::Path| -> Vec<(String, std::io::Result<()>)> {
        let mut out = Vec::new();
        for flag in ["+i", "+a"] {
            let name = format!("f{}", &flag[1..]);
            let f = root.join(&name);
            let mut h = OpenOptions::new().write(true).create(true).truncate(true).open(&f).unwrap();
            h.write_all(&data).unwrap();
            let set = std::process::Command::new("chattr").arg(flag).arg(&f).output().unwrap();
            assert!(set.status.success(), "chattr {flag}: {}", String::from_utf8_lossy(&set.stderr));
            out.push((name.clone(), h.sync_all()));
            drop(h);
            let clear =
                std::process::Command::new("chattr").arg(flag.replace('+', "-")).arg(&f).output().unwrap();
            assert!(clear.status.success());
        }
        out
    };
    let img = Image::ext4("64M").build_in(dir.path(), "wbflags.img");
    let m = FuseMount::new(&img, "rw,writeback_cache");
    let mine = run(m.path());
    m.unmount();
    e2fsck_clean(&img);
    for (name, r) in &mine {
        assert!(r.is_ok(), "fsync of {name} after the flag: {r:?}");
        let fs = rext4::Fs::open(&img).unwrap();
        let ino = fs.resolve(format!("/{name}"), false).unwrap();
        let mut got = vec![0u8; data.len() + 1];
        let n = fs.read(ino, 0, &mut got).unwrap();
        assert!(n == data.len() && got[..n] == data[..], "{name}: {n} bytes on the image");
    }
    if kernel_can_mount() {
        let kimg = Image::ext4("64M").build_in(dir.path(), "kflags.img");
        let k = KernelMount::rw(&kimg).expect("kernel mount");
        let theirs = run(k.path());
        for ((name, a), (_, b)) in mine.iter().zip(&theirs) {
            assert_eq!(a.is_ok(), b.is_ok(), "{name}: fsync here {a:?}, on kernel ext4 {b:?}");
            assert_eq!(fs::read(k.path().join(name)).unwrap(), data, "{name} on kernel ext4");
        }
        drop(k);
        e2fsck_clean(&kimg);
    }
}

/// Device nodes made and removed through the mount free no block (their device number is not
/// a block map), and a file whose extent names the journal is refused with `EUCLEAN` instead of
/// being written over it: the image stays as e2fsck found it.
#[test]
fn device_nodes_and_metadata_aimed_extents_leave_the_image_whole() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").build_in(dir.path(), "dev.img");
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

/// A removed file's space is free when `unlink(2)` or a replacing `rename(2)` returns, as on
/// kernel ext4 (which frees it before returning): `statfs` shows it and the next writes get
/// it, although the kernel forgets the inode (and the daemon drops it) only later. A file
/// still open keeps its bytes until closed. Block-mapped files too, whose freeing takes
/// longest.
#[test]
fn removed_files_free_their_space_at_once() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    // Space a process without privileges may use, in MiB.
    let avail = |root: &std::path::Path| {
        let s = nix::sys::statvfs::statvfs(root).unwrap();
        (s.blocks_available() * s.fragment_size()) >> 20
    };
    // What each side does; returns what it saw, as (step, fits or freed).
    let run = |root: &std::path::Path| -> Vec<(&'static str, bool)> {
        let mut seen = Vec::new();
        let chunk = vec![0x5au8; 1 << 20];
        let fill = |name: &str, mib: u64| -> bool {
            let mut f = File::create(root.join(name)).unwrap();
            let ok = (0..mib).all(|_| f.write_all(&chunk).is_ok());
            drop(f);
            // The kernel sends a closed file's RELEASE in the background; a removal made
            // before the daemon has it counts the file as open (and frees it at the
            // RELEASE). A moment's wait keeps the test to the case of a file closed earlier.
            std::thread::sleep(std::time::Duration::from_millis(100));
            ok
        };
        // 128 MiB image, about 107 MiB available: a second file of 60% fits only where the
        // first one's space is free again.
        let empty = avail(root);
        let big = empty * 6 / 10;
        let small = empty / 5;
        seen.push(("first file fits", fill("big", big)));
        fs::remove_file(root.join("big")).unwrap();
        // Within a MiB of what the journal and the directory took.
        seen.push(("freed by unlink", avail(root) + 1 >= empty));
        seen.push(("second file fits", fill("big2", big)));
        seen.push(("replacing file fits", fill("big3", small)));
        fs::rename(root.join("big3"), root.join("big2")).unwrap();
        seen.push(("freed by rename", avail(root) + 1 >= empty - small));
        seen.push(("third file fits", fill("big4", big)));
        fs::remove_file(root.join("big4")).unwrap();
        fs::remove_file(root.join("big2")).unwrap();
        // Open: the bytes stay until the last close.
        fs::write(root.join("held"), vec![7u8; 3 << 20]).unwrap();
        let h = File::open(root.join("held")).unwrap();
        fs::remove_file(root.join("held")).unwrap();
        let mut back = Vec::new();
        (&h).read_to_end(&mut back).unwrap();
        seen.push(("open file keeps its bytes", back == vec![7u8; 3 << 20]));
        drop(h);
        seen
    };
    for (name, opts) in
        [("default", &[][..]), ("blockmap", &["-O", "^extent,^flex_bg,^64bit,^metadata_csum"][..])]
    {
        let img = Image::ext4("128M").args(opts).build_in(dir.path(), &format!("{name}.img"));
        let m = FuseMount::new(&img, "rw");
        let mine = run(m.path());
        m.unmount();
        e2fsck_clean(&img);
        assert!(mine.iter().all(|(_, ok)| *ok), "{name}: {mine:?}");
        if kernel_can_mount() {
            let kimg = Image::ext4("128M").args(opts).build_in(dir.path(), &format!("k{name}.img"));
            let k = KernelMount::rw(&kimg).expect("kernel mount");
            let theirs = run(k.path());
            drop(k);
            e2fsck_clean(&kimg);
            assert_eq!(mine, theirs, "{name}");
        }
    }
}

/// The root-reserved blocks (5% by default) are root's to fill, as on kernel ext4: a user's
/// writes stop where `statfs` says nothing is available, root's go on into the reserve.
#[test]
fn root_fills_the_reserved_blocks() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    // MiB written to `name` before the filesystem was full, as root or as nobody. On rext4,
    // nobody then tries a directory, which must find no room either (a directory block
    // comes from what data may take: `ext4_has_free_clusters`). Kernel ext4's `dd` stops
    // with a few dozen blocks still available, so a directory may fit there.
    let fill = |root: &std::path::Path, name: &str, as_root: bool, rext4: bool| -> u64 {
        let f = root.join(name);
        let cmd = format!("dd if=/dev/zero of={} bs=64k status=none 2>/dev/null; true", f.display());
        if as_root {
            let ok = std::process::Command::new("sh").args(["-c", &cmd]).status().unwrap();
            assert!(ok.success());
        } else {
            let d = root.join("user-dir");
            let (ok, out) = as_nobody(&format!("{cmd}; mkdir {} 2>&1 || true", d.display()));
            assert!(ok, "{out}");
            if rext4 {
                assert!(!d.exists() && out.contains("No space left"), "nobody's mkdir: {out}");
            } else if d.exists() {
                fs::remove_dir(&d).unwrap();
            }
        }
        let n = fs::metadata(&f).unwrap().len() >> 20;
        fs::remove_file(&f).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        n
    };
    let run = |root: &std::path::Path, rext4: bool| -> (u64, u64, u64) {
        let s = nix::sys::statvfs::statvfs(root).unwrap();
        let reserved = ((s.blocks_free() - s.blocks_available()) * s.fragment_size()) >> 20;
        fs::set_permissions(root, fs::Permissions::from_mode(0o1777)).unwrap();
        (fill(root, "user", false, rext4), fill(root, "root", true, rext4), reserved)
    };
    let img = Image::ext4("128M").build_in(dir.path(), "reserve.img");
    let m = FuseMount::new(&img, "rw,allow_other,default_permissions");
    let (user, root, reserved) = run(m.path(), true);
    m.unmount();
    e2fsck_clean(&img);
    // What statfs keeps back is the root reserve and a little metadata room, which root may
    // not fill either.
    assert!(root > user + reserved / 2, "root {root} MiB, user {user} MiB, kept back {reserved} MiB");
    if kernel_can_mount() {
        let kimg = Image::ext4("128M").build_in(dir.path(), "kreserve.img");
        let k = KernelMount::rw(&kimg).expect("kernel mount");
        let (kuser, kroot, kreserved) = run(k.path(), false);
        drop(k);
        e2fsck_clean(&kimg);
        assert!(kroot > kuser + kreserved / 2, "kernel: root {kroot}, user {kuser}, kept back {kreserved}");
        // The same space for each, within what the two keep back for metadata.
        assert!(
            user.abs_diff(kuser) <= 2 && root.abs_diff(kroot) <= 2,
            "rext4 {user}/{root}, kernel {kuser}/{kroot}"
        );
    }
}
