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
