//! Filesystems whose journal is on a device of its own (`mke2fs -O journal_dev`, then
//! `mkfs.ext4 -J device=`), opened with `Options::journal_path` as the kernel mounts them
//! with `journal_path=`: written through their journal, recovered after a crash by rext4, by
//! e2fsck and by the kernel, a journal the kernel wrote replayed, and wrong devices refused.
//! mke2fs takes only a block device as the journal, so the images are made over loop devices
//! (root, as the kernel comparisons need).

use rext4::{Error, Fs, Options};
use rext4_testkit::{require_kernel, tool, KernelMount};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A loop device over an image file; detached on drop.
struct Loop(String);

impl Loop {
    fn attach(img: &Path) -> Loop {
        let o = Command::new(tool("losetup")).args(["-f", "--show"]).arg(img).output().unwrap();
        assert!(o.status.success(), "losetup: {}", String::from_utf8_lossy(&o.stderr));
        Loop(String::from_utf8(o.stdout).unwrap().trim().to_string())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new(tool("losetup")).arg("-d").arg(&self.0).status();
    }
}

fn run(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{cmd:?}: {text}");
    text
}

/// A 64 MiB filesystem (4 KiB blocks) in `fs.img` and its 8 MiB journal device in `j.img`.
fn images(dir: &Path, mkfs: &[&str]) -> (PathBuf, PathBuf) {
    let (img, jimg) = (dir.join("fs.img"), dir.join("j.img"));
    std::fs::File::create(&jimg).unwrap().set_len(8 << 20).unwrap();
    let j = Loop::attach(&jimg);
    run(Command::new(tool("mke2fs")).args(["-q", "-F", "-O", "journal_dev", "-b", "4096"]).arg(&j.0));
    run(Command::new(tool("mke2fs"))
        .args(["-q", "-F", "-t", "ext4", "-b", "4096", "-E", "lazy_itable_init=0"])
        .args(mkfs)
        .arg("-J")
        .arg(format!("device={}", j.0))
        .arg(&img)
        .arg("64M"));
    (img, jimg)
}

fn opts(journal: Option<&Path>, writable: bool) -> Options {
    Options { writable, journal_path: journal.map(Path::to_path_buf), ..Options::default() }
}

/// `e2fsck -fn` with the journal device: clean.
fn fsck_clean(img: &Path, jimg: &Path) {
    run(Command::new(tool("e2fsck")).arg("-fn").arg("-j").arg(jimg).arg(img));
}

/// Files `d/f0..f39` of distinct sizes and bytes.
fn workload(fs: &Fs) -> Vec<(String, Vec<u8>)> {
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    (0..40)
        .map(|k| {
            let name = format!("f{k}");
            let data: Vec<u8> = (0..k * 3001 + 17).map(|i| (i * 7 + k) as u8).collect();
            let f = fs.create(d, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
            fs.write(f, 0, &data).unwrap();
            fs.fsync(f).unwrap();
            (name, data)
        })
        .collect()
}

fn check_rext4(fs: &Fs, files: &[(String, Vec<u8>)]) {
    let d = fs.lookup(fs.root(), b"d").unwrap().ino;
    for (name, data) in files {
        let f = fs.lookup(d, name.as_bytes()).unwrap().ino;
        let mut buf = vec![0u8; data.len() + 1];
        let n = fs.read(f, 0, &mut buf).unwrap();
        assert_eq!(&buf[..n], &data[..], "{name}");
    }
}

/// What the kernel reads, mounted with the journal device on a loop device.
fn check_kernel(img: &Path, jimg: &Path, files: &[(String, Vec<u8>)]) {
    let j = Loop::attach(jimg);
    let m = KernelMount::with_options(img, &format!("loop,journal_path={}", j.0)).unwrap();
    for (name, data) in files {
        assert_eq!(&std::fs::read(m.path().join("d").join(name)).unwrap(), data, "kernel: {name}");
    }
    m.unmount().unwrap();
}

/// Where the log starts on the journal device, from its journal superblock (block 1): 0
/// when the log is empty.
fn log_start(jimg: &Path) -> u32 {
    let b = std::fs::read(jimg).unwrap();
    u32::from_be_bytes(b[4096 + 0x1c..4096 + 0x20].try_into().unwrap())
}

/// Writes go through the external journal (its log is in use while open, empty after a clean
/// unmount), the filesystem's own blocks stay clean of it, and the result is what e2fsck
/// checks clean and the kernel reads. Without the journal's path the image opens read-only
/// only.
#[test]
fn writes_go_through_the_external_journal() {
    require_kernel!();
    for mkfs in [&[][..], &["-O", "^metadata_csum,^64bit"][..]] {
        let dir = tempfile::tempdir().unwrap();
        let (img, jimg) = images(dir.path(), mkfs);
        match Fs::open_with(&img, opts(None, true)) {
            Err(e @ Error::Incompatible(_)) => assert_eq!(e.errno(), libc::EINVAL),
            other => panic!("writable without the journal: {:?}", other.err()),
        }
        // Read-only, with nothing to recover, it opens as the kernel's `noload` mount would.
        let ro = Fs::open(&img).unwrap();
        ro.readdir(ro.root(), 0, |_| true).unwrap();
        drop(ro);
        let fs = Fs::open_with(&img, opts(Some(&jimg), true)).unwrap();
        let files = workload(&fs);
        assert_ne!(log_start(&jimg), 0, "{mkfs:?}: the log is in use on the journal device");
        fs.unmount().unwrap();
        drop(fs);
        assert_eq!(log_start(&jimg), 0, "{mkfs:?}: empty after unmount");
        fsck_clean(&img, &jimg);
        check_kernel(&img, &jimg, &files);
        fsck_clean(&img, &jimg);
    }
}

/// A crash while the log holds committed transactions (copies of both devices taken while
/// rext4 has them open, after its last fsync): rext4 replays them (in memory for a read-only
/// open, in place for a writable one), and so do e2fsck and the kernel, each from its own
/// copy, with the same files and a clean check after.
#[test]
fn a_crash_recovers_from_the_external_journal() {
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    let (img, jimg) = images(dir.path(), &[]);
    let fs = Fs::open_with(&img, opts(Some(&jimg), true)).unwrap();
    let files = workload(&fs);
    let copy = |tag: &str| {
        let (i, j) = (dir.path().join(format!("{tag}.img")), dir.path().join(format!("{tag}.j")));
        std::fs::copy(&img, &i).unwrap();
        std::fs::copy(&jimg, &j).unwrap();
        (i, j)
    };
    let ours = copy("ours");
    let theirs = copy("e2fsck");
    let kernel = copy("kernel");
    drop(fs);
    assert_ne!(log_start(&ours.1), 0, "the crash copy has a log to replay");

    // Read-only: replayed in memory, neither device written.
    let before = (std::fs::read(&ours.0).unwrap(), std::fs::read(&ours.1).unwrap());
    match Fs::open(&ours.0) {
        Err(Error::Incompatible(_)) => {}
        other => panic!("recovery without the journal: {:?}", other.err()),
    }
    let ro = Fs::open_with(&ours.0, opts(Some(&ours.1), false)).unwrap();
    assert!(ro.recovery().is_some());
    check_rext4(&ro, &files);
    drop(ro);
    assert!(
        before == (std::fs::read(&ours.0).unwrap(), std::fs::read(&ours.1).unwrap()),
        "read-only open wrote"
    );
    // Writable: replayed in place.
    let rw = Fs::open_with(&ours.0, opts(Some(&ours.1), true)).unwrap();
    assert!(rw.recovery().is_some_and(|r| r.blocks_replayed > 0));
    check_rext4(&rw, &files);
    rw.unmount().unwrap();
    drop(rw);
    fsck_clean(&ours.0, &ours.1);

    // e2fsck's replay.
    let o = Command::new(tool("e2fsck")).arg("-fy").arg("-j").arg(&theirs.1).arg(&theirs.0).output().unwrap();
    assert!(matches!(o.status.code(), Some(0 | 1)), "e2fsck -fy: {}", String::from_utf8_lossy(&o.stdout));
    fsck_clean(&theirs.0, &theirs.1);
    check_rext4(&Fs::open(&theirs.0).unwrap(), &files);

    // The kernel's.
    check_kernel(&kernel.0, &kernel.1, &files);
    fsck_clean(&kernel.0, &kernel.1);
}

/// A log the kernel wrote (copies taken while it has the filesystem mounted, after a sync):
/// rext4's replay gives what e2fsck's gives.
#[test]
fn a_journal_the_kernel_wrote_is_replayed() {
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    let (img, jimg) = images(dir.path(), &[]);
    let j = Loop::attach(&jimg);
    let m = KernelMount::with_options(&img, &format!("loop,journal_path={},commit=600", j.0)).unwrap();
    std::fs::create_dir(m.path().join("d")).unwrap();
    let files: Vec<(String, Vec<u8>)> =
        (0..20).map(|k| (format!("f{k}"), (0..k * 5000 + 3).map(|i| (i ^ k) as u8).collect())).collect();
    for (name, data) in &files {
        std::fs::write(m.path().join("d").join(name), data).unwrap();
    }
    run(Command::new(tool("sync")).arg("-f").arg(m.path()));
    let (ours, theirs) = (dir.path().join("ours"), dir.path().join("theirs"));
    for d in [&ours, &theirs] {
        std::fs::create_dir(d).unwrap();
        std::fs::copy(&img, d.join("fs.img")).unwrap();
        // The loop device writes through to its file's pages: the file shows what it holds.
        std::fs::copy(&jimg, d.join("j.img")).unwrap();
    }
    m.unmount().unwrap();
    drop(j);
    let (oi, oj) = (ours.join("fs.img"), ours.join("j.img"));
    if log_start(&oj) == 0 {
        eprintln!("SKIP: the kernel checkpointed everything before the copy");
        return;
    }
    let fs = Fs::open_with(&oi, opts(Some(&oj), true)).unwrap();
    assert!(fs.recovery().is_some());
    check_rext4(&fs, &files);
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&oi, &oj);
    let (ti, tj) = (theirs.join("fs.img"), theirs.join("j.img"));
    let o = Command::new(tool("e2fsck")).arg("-fy").arg("-j").arg(&tj).arg(&ti).output().unwrap();
    assert!(matches!(o.status.code(), Some(0 | 1)), "e2fsck -fy: {}", String::from_utf8_lossy(&o.stdout));
    check_rext4(&Fs::open(&ti).unwrap(), &files);
}

/// Devices that are not this filesystem's journal are refused before anything is written: a
/// journal device made for another filesystem (UUID), a filesystem image given as the
/// journal, a journal for a filesystem with an internal one.
#[test]
fn wrong_journal_devices_are_refused() {
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    let (img, jimg) = images(dir.path(), &[]);
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let (other_img, other_j) = images(&other, &[]);
    let before = std::fs::read(&img).unwrap();
    for (j, what) in [(&other_j, "another filesystem's journal"), (&other_img, "a filesystem image")] {
        match Fs::open_with(&img, opts(Some(j), true)) {
            Err(e @ Error::Corrupt(_)) => assert_eq!(e.errno(), libc::EUCLEAN, "{what}"),
            other => panic!("{what}: {:?}", other.err()),
        }
    }
    assert!(before == std::fs::read(&img).unwrap(), "a refused open wrote");
    let internal = dir.path().join("internal.img");
    rext4_testkit::Image::ext4("16M").build(&internal);
    match Fs::open_with(&internal, opts(Some(&jimg), true)) {
        Err(Error::InvalidInput(_)) => {}
        other => panic!("journal for an internal one: {:?}", other.err()),
    }
}

/// A filesystem and its journal device made by rext4's own mkfs (image files, no root).
fn rext4_images(dir: &Path) -> (PathBuf, PathBuf) {
    use rext4::dev::FileDevice;
    let (img, jimg) = (dir.join("own.img"), dir.join("own.j"));
    std::fs::File::create(&jimg).unwrap().set_len(8 << 20).unwrap();
    std::fs::File::create(&img).unwrap().set_len(64 << 20).unwrap();
    let jdev = FileDevice::open(&jimg, true).unwrap();
    let fmt = rext4::FormatOptions { block_size: Some(4096), device_zeroed: true, ..Default::default() };
    Fs::format_journal_device(&jdev, &fmt).unwrap();
    let (uuid, bs) = Fs::journal_device(&jdev).unwrap();
    assert_eq!(bs, 4096);
    let dev = FileDevice::open(&img, true).unwrap();
    let journal_device = Some(rext4::JournalDeviceRef { uuid, dev_number: 0 });
    let r = Fs::format(&dev, &rext4::FormatOptions { journal_device, ..fmt }).unwrap();
    Fs::add_journal_user(&jdev, r.uuid).unwrap();
    (img, jimg)
}

/// Damaged journal devices: each field the open checks, changed on a journal device rext4
/// made, is refused with a typed error and nothing written; a device shorter than its
/// superblock says fails with an error, not a panic, when the log reaches past its end.
#[test]
fn damaged_journal_devices_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (img, jimg) = rext4_images(dir.path());
    // The pair works as made.
    let fs = Fs::open_with(&img, opts(Some(&jimg), true)).unwrap();
    workload(&fs);
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&img, &jimg);
    let good = std::fs::read(&jimg).unwrap();
    let fs_bytes = std::fs::read(&img).unwrap();
    let jsb = 4096;
    let be = |v: u32| v.to_be_bytes().to_vec();
    let cases: Vec<(&str, usize, Vec<u8>)> = vec![
        ("ext4 magic", 1024 + 0x38, vec![0, 0]),
        ("journal_dev feature", 1024 + 0x60, vec![0, 0, 0, 0]),
        ("uuid", 1024 + 0x68, vec![0xaa; 16]),
        ("block size", 1024 + 0x18, vec![0, 0, 0, 0]),
        ("device blocks", 1024 + 0x04, vec![1, 0, 0, 0]),
        ("journal magic", jsb, vec![0, 0, 0, 0]),
        ("journal block size", jsb + 0xc, be(1024)),
        ("journal length", jsb + 0x10, be(1 << 30)),
        ("first log block", jsb + 0x14, be(1)),
        ("two users", jsb + 0x40, be(2)),
    ];
    for (what, at, bytes) in cases {
        let mut j = good.clone();
        j[at..at + bytes.len()].copy_from_slice(&bytes);
        std::fs::write(&jimg, &j).unwrap();
        match Fs::open_with(&img, opts(Some(&jimg), true)) {
            Err(Error::Corrupt(_) | Error::Incompatible(_)) => {}
            other => panic!("{what}: {:?}", other.err()),
        }
        assert!(std::fs::read(&img).unwrap() == fs_bytes, "{what}: the filesystem was written");
        assert!(std::fs::read(&jimg).unwrap() == j, "{what}: the journal was written");
    }
    // Cut short: its superblock still says 8 MiB. An image file grows as the log reaches
    // past its end; either way no panic, and a clean pair after.
    std::fs::write(&jimg, &good[..64 << 10]).unwrap();
    let r = Fs::open_with(&img, opts(Some(&jimg), true)).and_then(|fs| {
        let f = fs.create(fs.root(), b"big", 0o644, 0, 0)?.ino;
        fs.write(f, 0, &vec![5u8; 2 << 20])?;
        fs.fsync(f)?;
        fs.unmount()
    });
    if r.is_ok() {
        fsck_clean(&img, &jimg);
    }
}
