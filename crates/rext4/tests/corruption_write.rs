//! Changes to damaged images: every operation returns the kernel's error (`EUCLEAN` for
//! corruption) and none hangs or panics. Cases come from the `image_write` fuzz target
//! (fuzz/README.md); each image is made with mkfs.ext4 and damaged with debugfs, and each
//! test checks the kernel's errno on the same image where the kernel can mount. The images stay
//! damaged, so instead of a clean e2fsck, a test that changes one checks that e2fsck finds
//! the same problems after rext4's changes as before them.

mod common;

use rext4::{Fs, InodeNo, Options};
use std::path::{Path, PathBuf};
use std::process::Command;

const EUCLEAN: i32 = 117;

fn image(dir: &Path, name: &str, debugfs_cmds: &str) -> PathBuf {
    image_with(dir, name, &["-b", "4096"], debugfs_cmds)
}

fn image_with(dir: &Path, name: &str, mkfs_args: &[&str], debugfs_cmds: &str) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    common::mkfs(None, &img, mkfs_args, "32M");
    let script = dir.join(format!("{name}.cmds"));
    std::fs::write(&script, debugfs_cmds).unwrap();
    let out =
        Command::new(common::tool("debugfs")).arg("-w").arg("-f").arg(&script).arg(&img).output().unwrap();
    assert!(out.status.success(), "debugfs: {}", String::from_utf8_lossy(&out.stderr));
    img
}

fn rw(img: &Path) -> Fs {
    Fs::open_with(img, Options { writable: true, ..Options::default() }).unwrap()
}

fn errno<T>(r: rext4::Result<T>) -> i32 {
    r.map_or_else(|e| e.errno(), |_| 0)
}

/// Runs `f` on a thread of its own and fails if it takes longer than `secs` (a hang, such as
/// a lock taken twice, must fail the test, not stall the suite).
fn within(secs: u64, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("hung for {secs} s"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("panicked (see above)"),
    }
}

/// The problems `e2fsck -fn` finds in `img` (each line before a "? no"), but the free counts,
/// which a clean unmount rewrites.
fn fsck_problems(img: &Path) -> Vec<String> {
    let out = Command::new(common::tool("e2fsck")).arg("-fn").arg(img).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[1].ends_with("? no"))
        .map(|w| w[0].trim().to_string())
        .filter(|p| !p.starts_with("Free blocks count wrong") && !p.starts_with("Free inodes count wrong"))
        .collect()
}

/// The errno of an operation on the kernel's mount of `img` (0 on success).
fn kernel_errno(img: &Path, op: impl FnOnce(&Path) -> std::io::Result<()>) -> Option<i32> {
    let km = common::KernelMount::rw(img).ok()?;
    let e = op(km.path()).err().map_or(0, |e| e.raw_os_error().unwrap_or(-1));
    km.unmount().unwrap();
    Some(e)
}

/// A name in a directory that names the directory itself: every operation on it would take
/// the directory's lock twice. The kernel's lookup refuses it ("linked to parent dir").
#[test]
fn entry_naming_its_own_directory() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "self", "mkdir /d\nln /d /d/self\n");
    let before = fsck_problems(&img);
    assert!(!before.is_empty(), "e2fsck sees no damage: the fixture tests nothing");
    let fs = rw(&img);
    within(30, move || changes_on_self_entry(fs));
    assert_eq!(fsck_problems(&img), before, "rext4's changes added problems");
    for (what, want) in [("stat", EUCLEAN), ("unlink", EUCLEAN), ("rename", EUCLEAN), ("link", EUCLEAN)] {
        let got = kernel_errno(&img, |m| match what {
            "stat" => std::fs::metadata(m.join("d/self")).map(|_| ()),
            "unlink" => std::fs::remove_file(m.join("d/self")),
            "link" => std::fs::hard_link(m.join("d"), m.join("d/self")),
            _ => std::fs::rename(m.join("d/self"), m.join("x")),
        });
        if let Some(got) = got {
            assert_eq!(got, want, "the kernel's {what}");
        }
    }
}

fn changes_on_self_entry(fs: Fs) {
    let d = fs.resolve("/d", false).unwrap();
    let root = fs.root();
    assert_eq!(errno(fs.lookup(d, b"self")), EUCLEAN);
    assert_eq!(errno(fs.unlink(d, b"self")), EUCLEAN);
    assert_eq!(errno(fs.rmdir(d, b"self")), EUCLEAN);
    assert_eq!(errno(fs.rename(d, b"self", root, b"x", 0)), EUCLEAN);
    assert_eq!(errno(fs.link(d, d, b"self")), EUCLEAN, "the new name is looked up first");
    assert_eq!(errno(fs.create(d, b"self", 0o644, 0, 0)), EUCLEAN);
    // The directory itself still works.
    let f = fs.create(d, b"f", 0o644, 0, 0).unwrap().ino;
    assert_ne!(f, InodeNo(0));
    fs.unlink(d, b"f").unwrap();
    fs.unmount().unwrap();
}

/// A group's block bitmap on the descriptor block: a read-write open is refused, as the
/// kernel's `ext4_check_descriptors` refuses the mount ("overlaps block group descriptors").
/// Before, the first commit filled the descriptor block under its lock and then waited for
/// that same lock to checksum the "bitmap". A read-only open still reads the tree.
#[test]
fn bitmap_on_a_descriptor_block() {
    let dir = tempfile::tempdir().unwrap();
    // No checksums, so that debugfs's change needs no new descriptor checksum.
    let args = ["-b", "4096", "-O", "^metadata_csum,^uninit_bg"];
    let img = image_with(dir.path(), "gdt", &args, "mkdir /d\nset_bg 0 block_bitmap 1\n");
    let path = img.clone();
    within(30, move || {
        let r = Fs::open_with(&path, Options { writable: true, ..Options::default() });
        assert_eq!(errno(r), EUCLEAN);
        let fs = Fs::open(&path).unwrap();
        assert!(fs.resolve("/d", false).is_ok());
    });
    if let Some(got) = kernel_errno(&img, |_| Ok(())) {
        panic!("the kernel mounted it read-write (errno {got})");
    }
}
