//! I/O errors that abort the journal, and how the abort is recorded and cleared.

use super::*;
use rext4::SetAttr;
use rext4_testkit::{features, sb_field};

/// An I/O error while committing aborts the journal: later changes fail with EROFS and
/// nothing half-written is presented as committed.
#[test]
fn io_error_aborts_the_journal() {
    let dir = tmpdir();
    let image = make_image(dir.path(), &[]);
    let dev = Arc::new(CrashDevice::new(image));
    let fs = open_rw(&dev);
    let ino = fs.resolve("/f1", false).unwrap();
    fs.setattr(ino, &SetAttr { uid: Some(7), ..SetAttr::default() }).unwrap();
    dev.fail_writes_after(1);
    let e = fs.fsync(ino).unwrap_err();
    assert_eq!(e.errno(), 5, "fsync after an I/O error: {e}"); // EIO
    let e = fs.setattr(ino, &SetAttr { uid: Some(8), ..SetAttr::default() }).unwrap_err();
    assert_eq!(e.errno(), 30, "{e}");
    assert!(fs.unmount().is_err());
    // What reached the device recovers to a consistent image.
    let img = dir.path().join("aborted.img");
    std::fs::write(&img, dev.snapshot()).unwrap();
    let (code, out) = fsck(&img, true);
    assert!(code < 4, "{out}");
    assert_clean(&img, "after abort");
}

/// The superblock's record of an aborted journal, as `dumpe2fs -h` shows it.
fn abort_record(img: &Path) -> [String; 5] {
    ["Filesystem state", "FS Error count", "First error function", "First error err", "Journal errno"]
        .map(|k| sb_field(img, k))
}

/// A write error in the log aborts the journal, and the abort is recorded as the kernel
/// records it: the journal superblock keeps the errno (`jbd2_journal_abort`), and the
/// superblock marks the filesystem as having errors and counts one under
/// `ext4_journal_check_start` (`ext4_abort`, "Detected aborted journal"). Changes stop
/// (`EROFS`). The next mount, rext4's or the kernel's, replays what was committed, keeps the
/// record and clears the journal's errno, and e2fsck finds the image clean.
#[test]
fn an_aborted_journal_is_recorded() {
    let dir = tmpdir();
    let image = make_image(dir.path(), &[]);
    let base = dir.path().join("base.img");
    let out = Command::new("debugfs").args(["-R", "bmap <8> 0"]).arg(&base).output().unwrap();
    let jsb: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let total: u64 = sb_field(&base, "Total journal blocks").parse().unwrap();
    let dev = Arc::new(CrashDevice::new(image));
    let fs = open_rw(&dev);
    let ino = fs.resolve("/f1", false).unwrap();
    let uid = |u| SetAttr { uid: Some(u), ..SetAttr::default() };
    fs.setattr(ino, &uid(7)).unwrap();
    fs.fsync(ino).unwrap();
    assert!(!fs.has_errors());
    // Every log block after the journal superblock: the next commit cannot be written.
    dev.fail_writes_in((jsb + 1) * 1024..(jsb + total) * 1024);
    fs.setattr(ino, &uid(8)).unwrap();
    assert_eq!(fs.fsync(ino).unwrap_err().errno(), libc::EIO);
    assert!(fs.has_errors());
    assert!(!fs.is_writable());
    assert_eq!(fs.setattr(ino, &uid(9)).unwrap_err().errno(), libc::EROFS);
    assert_eq!(fs.create(fs.root(), b"new", 0o644, 0, 0).unwrap_err().errno(), libc::EROFS);
    assert!(fs.unmount().is_err());
    drop(fs);
    let img = dir.path().join("aborted.img");
    std::fs::write(&img, dev.snapshot()).unwrap();
    let recorded = ["clean with errors", "1", "ext4_journal_check_start", "EIO"].map(String::from);
    let mut want = recorded.clone().to_vec();
    want.push("-5".into());
    assert_eq!(abort_record(&img).to_vec(), want, "as the aborted filesystem left it");
    assert!(features(&img).contains("needs_recovery"));
    let kimg = dir.path().join("kernel.img");
    std::fs::copy(&img, &kimg).unwrap();
    let mut want = recorded.to_vec();
    want.push(String::new());
    {
        let opts = Options { writable: true, ..Options::default() };
        let fs = Fs::open_with(&img, opts).unwrap();
        assert!(fs.has_errors());
        assert_eq!(fs.metadata("/f1").unwrap().uid, 7, "the committed change was replayed");
        fs.unmount().unwrap();
    }
    assert_eq!(abort_record(&img).to_vec(), want, "after rext4's recovery");
    assert_clean(&img, "after rext4's recovery");
    if kernel_recover(&kimg) {
        assert_eq!(abort_record(&kimg).to_vec(), want, "after the kernel's recovery");
        assert_clean(&kimg, "after the kernel's recovery");
    }
}

/// An errno in the journal superblock of an image that needs no recovery (left there by a
/// kernel that could write nothing else after its abort, say) marks the filesystem as having
/// errors at the next writable open, which then clears it (`ext4_clear_journal_err`), as the
/// kernel's mount does.
#[test]
fn a_journal_errno_marks_the_filesystem_at_open() {
    let dir = tmpdir();
    let mut image = make_image(dir.path(), &[]);
    let base = dir.path().join("base.img");
    let out = Command::new("debugfs").args(["-R", "bmap <8> 0"]).arg(&base).output().unwrap();
    let at = String::from_utf8_lossy(&out.stdout).trim().parse::<usize>().unwrap() * 1024;
    let mut jsb = rext4::format::jbd2::JournalSuperblock::parse(&image[at..]).unwrap();
    jsb.set_errno(-libc::EIO);
    jsb.update_checksum();
    image[at + 0x20..at + 0x24].copy_from_slice(&jsb.s_errno.get().to_be_bytes());
    image[at + 0xFC..at + 0x100].copy_from_slice(&jsb.s_checksum.get().to_be_bytes());
    let img = dir.path().join("errno.img");
    std::fs::write(&img, &image).unwrap();
    assert_eq!(sb_field(&img, "Journal errno"), "-5");
    assert_eq!(sb_field(&img, "Filesystem state"), "clean");
    let kimg = dir.path().join("kernel.img");
    std::fs::copy(&img, &kimg).unwrap();
    {
        let fs = Fs::open(&img).unwrap();
        assert!(!fs.has_errors(), "a read-only open changes nothing");
    }
    assert_eq!(std::fs::read(&img).unwrap(), image, "a read-only open wrote");
    let fs = Fs::open_with(&img, Options { writable: true, ..Options::default() }).unwrap();
    assert!(fs.has_errors());
    fs.unmount().unwrap();
    drop(fs);
    let fields = |img: &Path| ["Filesystem state", "Journal errno"].map(|k| sb_field(img, k));
    let want = ["clean with errors", ""].map(String::from);
    assert_eq!(fields(&img), want, "after rext4's open");
    assert_clean(&img, "after rext4's open");
    if kernel_recover(&kimg) {
        assert_eq!(fields(&kimg), want, "after the kernel's mount");
        assert_clean(&kimg, "after the kernel's mount");
    }
}
