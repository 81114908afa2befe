//! Changes to damaged images: every operation returns the kernel's error (`EUCLEAN` for
//! corruption) and none hangs or panics. Cases come from the `image_write` fuzz target
//! (fuzz/README.md); each image is made with mkfs.ext4 and damaged with debugfs, and each
//! test checks the kernel's errno on the same image where the kernel can mount. The images stay
//! damaged, so instead of a clean e2fsck, a test that changes one checks that e2fsck finds
//! the same problems after rext4's changes as before them.

use rext4::{Fs, InodeNo, Options};
use rext4_testkit::{debugfs_write, e2fsck_clean, sb_field, tool, Image, KernelMount};
use std::path::{Path, PathBuf};
use std::process::Command;

const EUCLEAN: i32 = 117;

fn image(dir: &Path, name: &str, debugfs_cmds: &str) -> PathBuf {
    image_with(dir, name, &["-b", "4096"], debugfs_cmds)
}

fn image_with(dir: &Path, name: &str, mkfs_args: &[&str], debugfs_cmds: &str) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    Image::ext4("32M").args(mkfs_args).build(&img);
    debugfs_write(&img, debugfs_cmds);
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
    let out = Command::new(tool("e2fsck")).arg("-fn").arg(img).output().unwrap();
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
    let km = KernelMount::rw(img).ok()?;
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

/// The superblock's error record, as `dumpe2fs -h` shows it.
fn error_record(img: &Path) -> [String; 5] {
    ["Filesystem state", "FS Error count", "First error inode #", "First error err", "Last error err"]
        .map(|k| sb_field(img, k))
}

/// A file `/f` whose xattr block's first entry claims a value larger than any: a file the
/// kernel and rext4 both fail to free (`ext4_xattr_delete_inode`: "e_value size too large").
/// Without checksums, so that the entry, not the checksum, is found wrong. Returns the image
/// and the file's inode.
fn damaged_xattr_image(dir: &Path, name: &str) -> (PathBuf, InodeNo) {
    let img = image_with(dir, name, &["-b", "4096", "-O", "ea_inode,^metadata_csum"], "write /dev/null f\n");
    let fs = rw(&img);
    let f = fs.resolve("/f", false).unwrap();
    fs.setxattr(f, b"user.a", &[7; 1000], 0).unwrap();
    fs.unmount().unwrap();
    let out = Command::new(tool("debugfs")).arg("-R").arg("stat /f").arg(&img).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let blk: usize =
        text.split("File ACL: ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert_ne!(blk, 0, "the value went to a block");
    let mut all = std::fs::read(&img).unwrap();
    // The first entry follows the 32-byte header; its e_value_size is at 8.
    all[blk * 4096 + 40..blk * 4096 + 44].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
    std::fs::write(&img, &all).unwrap();
    (img, f)
}

/// Corruption found on a writable filesystem is recorded in the superblock as the kernel
/// records it: the image is marked as having errors, with the error counted and the inode and
/// kind kept, so that `e2fsck -p` checks it instead of passing it as clean. The filesystem
/// goes on taking changes (`errors=continue`, mkfs's default).
#[test]
fn corruption_is_recorded_in_the_superblock() {
    let dir = tempfile::tempdir().unwrap();
    let (img, f) = damaged_xattr_image(dir.path(), "rec");
    let kimg = dir.path().join("kernel.img");
    std::fs::copy(&img, &kimg).unwrap();
    assert_eq!(sb_field(&img, "Filesystem state"), "clean");
    let fs = rw(&img);
    assert!(!fs.has_errors());
    // As the kernel's: the name goes and the unlink succeeds; the inode that could not be
    // freed is left without links for e2fsck, and the damage is recorded.
    fs.unlink(fs.root(), b"f").unwrap();
    assert!(fs.has_errors());
    assert!(fs.is_writable());
    fs.create(fs.root(), b"after", 0o644, 0, 0).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let want = ["clean with errors", "1", &f.0.to_string(), "EFSCORRUPTED", "EFSCORRUPTED"].map(String::from);
    assert_eq!(error_record(&img), want);
    assert_eq!(sb_field(&img, "First error function"), "ext4_unlink");
    assert!(Fs::open(&img).is_ok_and(|fs| fs.has_errors()), "reopened, the mark is there");
    let ours = fsck_report(&img);
    assert!(ours.iter().any(|l| l.starts_with(&format!("Deleted inode {} has zero dtime", f.0))), "{ours:?}");
    if let Some(got) = kernel_errno(&kimg, |m| std::fs::remove_file(m.join("f"))) {
        // The kernel frees the inode after the unlink returned, and logs the failure.
        assert_eq!(got, 0);
        assert_eq!(error_record(&kimg), want, "the kernel's record");
        assert_eq!(fsck_report(&kimg), ours, "e2fsck on the kernel's image");
    }
    // A preening e2fsck checks it (a clean image it would pass over).
    let out = Command::new(tool("e2fsck")).arg("-p").arg(&img).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("contains a file system with errors, check forced"), "e2fsck -p: {text}");
}

/// What `e2fsck -fn` reports of `img`, without its passes and the lines naming the image.
fn fsck_report(img: &Path) -> Vec<String> {
    let out = Command::new(tool("e2fsck")).arg("-fn").arg(img).output().unwrap();
    let name = img.to_string_lossy().into_owned();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Pass ") && !l.contains(&name))
        .map(str::to_string)
        .collect()
}

/// A bad checksum is recorded as `EFSBADCRC` (the operation returned `EBADMSG`), as the kernel
/// records it; a read-only open records nothing and leaves the image as it was.
#[test]
fn a_bad_checksum_is_recorded_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "crc", "mkdir /d\nwrite /dev/null /d/x\n");
    let out = Command::new(tool("debugfs")).arg("-R").arg("blocks /d").arg(&img).output().unwrap();
    let blk: usize = String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().parse().unwrap();
    let mut all = std::fs::read(&img).unwrap();
    // A byte of the last entry's free space: the block still parses, its checksum is wrong.
    all[blk * 4096 + 2048] ^= 0xFF;
    std::fs::write(&img, &all).unwrap();
    let kimg = dir.path().join("kernel.img");
    std::fs::copy(&img, &kimg).unwrap();
    {
        let fs = Fs::open(&img).unwrap();
        let d = fs.resolve("/d", false).unwrap();
        assert_eq!(errno(fs.lookup(d, b"x")), libc::EBADMSG);
        assert!(!fs.has_errors());
    }
    assert_eq!(std::fs::read(&img).unwrap(), all, "a read-only open wrote");
    let fs = rw(&img);
    let d = fs.resolve("/d", false).unwrap();
    assert_eq!(errno(fs.lookup(d, b"x")), libc::EBADMSG);
    fs.unmount().unwrap();
    let want = ["clean with errors", "1", &d.0.to_string(), "EFSBADCRC", "EFSBADCRC"].map(String::from);
    assert_eq!(error_record(&img), want);
    assert_eq!(sb_field(&img, "First error function"), "ext4_lookup");
    let ours = fsck_report(&img);
    assert!(ours.iter().any(|l| l.contains("checksum")), "e2fsck sees the damage: {ours:?}");
    if let Some(got) = kernel_errno(&kimg, |m| std::fs::metadata(m.join("d/x")).map(|_| ())) {
        assert_eq!(got, libc::EBADMSG);
        assert_eq!(error_record(&kimg), want, "the kernel's record");
        assert_eq!(fsck_report(&kimg), ours, "e2fsck on the kernel's image");
    }
}

/// With `errors=remount-ro` in the superblock, the first error stops changes (`EROFS`) while
/// reads go on, as the kernel's remount does; the error is recorded before they stop.
#[test]
fn errors_remount_ro_stops_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (img, f) = damaged_xattr_image(dir.path(), "ro");
    let out = Command::new(tool("tune2fs")).args(["-e", "remount-ro"]).arg(&img).output().unwrap();
    assert!(out.status.success(), "tune2fs: {}", String::from_utf8_lossy(&out.stderr));
    let kimg = dir.path().join("kernel.img");
    std::fs::copy(&img, &kimg).unwrap();
    let fs = rw(&img);
    let root = fs.root();
    fs.create(root, b"before", 0o644, 0, 0).unwrap();
    fs.unlink(root, b"f").unwrap();
    assert!(!fs.is_writable());
    assert_eq!(errno(fs.create(root, b"after", 0o644, 0, 0)), libc::EROFS);
    assert_eq!(errno(fs.unlink(root, b"before")), libc::EROFS);
    assert!(fs.lookup(root, b"before").is_ok(), "reads go on");
    fs.unmount().unwrap();
    let want = ["clean with errors", "1", &f.0.to_string(), "EFSCORRUPTED", "EFSCORRUPTED"].map(String::from);
    assert_eq!(error_record(&img), want);
    let fs = Fs::open(&img).unwrap();
    assert!(fs.has_errors());
    assert!(fs.lookup(root, b"before").is_ok(), "the change before the error stayed");
    assert_eq!(errno(fs.lookup(root, b"after")), libc::ENOENT);
    drop(fs);
    let ours = fsck_report(&img);
    assert!(ours.iter().any(|l| l.starts_with(&format!("Deleted inode {} has zero dtime", f.0))), "{ours:?}");
    if let Some(got) = kernel_errno(&kimg, |m| {
        std::fs::remove_file(m.join("f"))?;
        std::fs::write(m.join("after"), b"")
    }) {
        // (The kernel's journal is aborted there, its image left needing recovery: its
        // e2fsck report is not comparable.)
        assert_eq!(got, libc::EROFS, "the kernel's change after the error");
        assert_eq!(error_record(&kimg), want, "the kernel's record");
    }
}

/// `Options::errors` overrides the superblock's setting, as the kernel's mount option does.
#[test]
fn the_errors_option_overrides_the_superblock() {
    let dir = tempfile::tempdir().unwrap();
    for (sb_says, option, stops) in [
        ("remount-ro", Some(rext4::ErrorBehavior::Continue), false),
        ("continue", Some(rext4::ErrorBehavior::RemountRo), true),
        ("panic", None, true),
    ] {
        let (img, f) = damaged_xattr_image(dir.path(), sb_says);
        let out = Command::new(tool("tune2fs")).args(["-e", sb_says]).arg(&img).output().unwrap();
        assert!(out.status.success(), "tune2fs: {}", String::from_utf8_lossy(&out.stderr));
        let fs =
            Fs::open_with(&img, Options { writable: true, errors: option, ..Options::default() }).unwrap();
        fs.unlink(fs.root(), b"f").unwrap();
        assert_eq!(fs.is_writable(), !stops, "{sb_says} / {option:?}");
        let created = errno(fs.create(fs.root(), b"g", 0o644, 0, 0));
        assert_eq!(created, if stops { libc::EROFS } else { 0 }, "{sb_says} / {option:?}");
        fs.unmount().unwrap();
        drop(fs);
        assert_eq!(sb_field(&img, "Filesystem state"), "clean with errors");
        let report = fsck_report(&img);
        let deleted = format!("Deleted inode {} has zero dtime", f.0);
        assert!(report.iter().any(|l| l.starts_with(&deleted)), "{sb_says}: {report:?}");
    }
}

/// A file one of whose blocks is already free in the bitmap (damage) is unlinked: freeing
/// checks every block before it frees any, so none of the others is freed while the inode still
/// names them; the inode is left for e2fsck and the damage recorded, the unlink succeeds.
#[test]
fn a_file_with_a_free_block_is_left_whole() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "freeb", "");
    let fs = rw(&img);
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &[3u8; 40_960]).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let out = Command::new(tool("debugfs")).arg("-R").arg("blocks /f").arg(&img).output().unwrap();
    let blocks: Vec<u64> =
        String::from_utf8_lossy(&out.stdout).split_whitespace().map(|b| b.parse().unwrap()).collect();
    assert_eq!(blocks.len(), 10);
    let out = Command::new(tool("debugfs"))
        .args(["-w", "-R", &format!("freeb {}", blocks[5])])
        .arg(&img)
        .output()
        .unwrap();
    assert!(out.status.success());
    let fs = rw(&img);
    fs.unlink(fs.root(), b"f").unwrap();
    assert!(fs.has_errors());
    fs.unmount().unwrap();
    drop(fs);
    for (i, b) in blocks.iter().enumerate() {
        let out =
            Command::new(tool("debugfs")).arg("-R").arg(format!("testb {b}")).arg(&img).output().unwrap();
        let t = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(t.contains("marked in use"), i != 5, "block {b}: {t}");
    }
    assert_eq!(sb_field(&img, "Filesystem state"), "clean with errors");
    let report = fsck_report(&img);
    assert!(
        report.iter().any(|l| l.starts_with(&format!("Deleted inode {} has zero dtime", f.0))),
        "{report:?}"
    );
}

/// Numbers no inode can have, given to the by-number calls that change things: `ESTALE`, and
/// the image is not marked as having errors (a caller's bad number is not damage).
#[test]
fn out_of_range_numbers_mark_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("n.img");
    Image::ext4("32M").build(&img);
    let fs = Fs::open_with(&img, Options { writable: true, ..Options::default() }).unwrap();
    let count = fs.superblock().s_inodes_count.get();
    for ino in [InodeNo(0), InodeNo(count + 1), InodeNo(u32::MAX)] {
        let set = rext4::SetAttr { mode: Some(0o600), ..rext4::SetAttr::default() };
        assert_eq!(fs.setattr(ino, &set).unwrap_err().errno(), libc::ESTALE);
        assert_eq!(fs.fsync(ino).unwrap_err().errno(), libc::ESTALE);
        assert_eq!(fs.write(ino, 0, b"x").unwrap_err().errno(), libc::ESTALE);
        assert_eq!(fs.setxattr(ino, b"user.a", b"v", 0).unwrap_err().errno(), libc::ESTALE);
        assert_eq!(fs.link(ino, fs.root(), b"l").unwrap_err().errno(), libc::ENOENT);
        assert_eq!(fs.create(ino, b"c", 0o644, 0, 0).unwrap_err().errno(), libc::ESTALE);
        assert_eq!(fs.hold(ino).unwrap_err().errno(), libc::ENOENT);
    }
    assert!(!fs.has_errors());
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    let out = std::process::Command::new(tool("dumpe2fs")).arg("-h").arg(&img).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("with errors"));
}

/// A truncate recorded on the orphan list, of an inode whose extent header is damaged: the
/// writable open records the damage and goes on, as the kernel's mount does (before, the open
/// failed, so no change could ever be made to the image). Both leave the same e2fsck report.
#[test]
fn a_damaged_orphan_does_not_stop_the_open() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::write(&data, vec![7u8; 40_960]).unwrap();
    // Inode 12 is the first after lost+found: the file, recorded as an orphan that keeps its
    // link (a truncate to its size), its extent header's magic overwritten.
    let cmds = format!(
        "write {} f\nssv last_orphan 12\nsif <12> dtime 0\nsif <12> block[0] 0x1234\n",
        data.display()
    );
    let img = image(dir.path(), "orphan", &cmds);
    let kimg = dir.path().join("kernel.img");
    std::fs::copy(&img, &kimg).unwrap();
    let fs = rw(&img);
    assert!(fs.has_errors());
    fs.mkdir(fs.root(), b"x", 0o755, 0, 0).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let record = error_record(&img);
    assert_eq!(record, ["clean with errors", "1", "12", "EFSCORRUPTED", "EFSCORRUPTED"].map(String::from));
    let ours = fsck_report(&img);
    assert!(ours.iter().any(|l| l.starts_with("Inode 12 has corrupt extent header")), "{ours:?}");
    if let Some(got) = kernel_errno(&kimg, |_| Ok(())) {
        assert_eq!(got, 0);
        assert_eq!(fsck_report(&kimg), ours, "e2fsck on the kernel's image");
        let theirs = error_record(&kimg);
        assert_eq!((&theirs[0], &theirs[2], &theirs[3]), (&record[0], &record[2], &record[3]));
    }
}

/// Output of `debugfs -R CMD IMG`.
fn debugfs_out(img: &Path, cmd: &str) -> String {
    let out = Command::new(tool("debugfs")).arg("-R").arg(cmd).arg(img).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether `debugfs testb` finds each of `len` blocks from `blk` in use.
fn all_in_use(img: &Path, blk: u64, len: u64) -> bool {
    (blk..blk + len).all(|b| debugfs_out(img, &format!("testb {b}")).contains("marked in use"))
}

/// Whether any of `len` blocks from `blk` holds `byte` repeated over 64 bytes.
fn holds_pattern(img: &Path, blk: u64, len: u64, bs: u64, byte: u8) -> bool {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(img).unwrap();
    let mut buf = vec![0u8; (len * bs) as usize];
    f.read_exact_at(&mut buf, blk * bs).unwrap();
    buf.windows(64).any(|w| w.iter().all(|&b| b == byte))
}

/// The metadata of a 32 MiB image with 1 KiB blocks (four groups; flex_bg puts the bitmaps
/// and tables of all in group 0), each a place an extent can be aimed at.
fn metadata_targets(img: &Path) -> Vec<(&'static str, u64)> {
    let itable = debugfs_out(img, "imap <12>");
    let itable: u64 =
        itable.split("located at block ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
    let journal: u64 = debugfs_out(img, "bmap <8> 10").trim().parse().unwrap();
    let out = Command::new(tool("dumpe2fs")).arg(img).output().unwrap();
    let groups = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(groups.contains("Backup superblock at 8193") && groups.contains("Reserved GDT blocks at 8195-"));
    let bitmap: u64 =
        groups.split("Block bitmap at ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    vec![
        ("inode table", itable),
        ("block bitmap", bitmap),
        ("backup superblock", 8193),
        ("reserved descriptor blocks", 8195),
        ("journal", journal),
    ]
}

/// A write of 1 KiB at 0 to `/f` through the kernel's mount of a copy of `img`.
fn kernel_write_errno(img: &Path) -> Option<i32> {
    use std::os::unix::fs::FileExt;
    let copy = img.with_extension("kernel.img");
    std::fs::copy(img, &copy).unwrap();
    kernel_errno(&copy, |p| {
        std::fs::OpenOptions::new().write(true).open(p.join("f"))?.write_at(&[0x5A; 1024], 0).map(drop)
    })
}

/// Every change to `/f` of `img` (whose map is aimed at `len` metadata blocks from `blk`) is
/// refused with `EUCLEAN`, as the kernel's `ext4_inode_block_valid` refuses it; nothing is
/// written into the metadata and e2fsck finds what it found before. Then the unlink: the inode
/// is left for e2fsck and the metadata stays in use.
fn refused_everywhere(img: &Path, what: &str, blk: u64, len: u64) {
    // The problems, without the times e2fsck names inodes by (a refused truncate may still
    // have stamped the file).
    let problems = |img: &Path| -> Vec<String> {
        fsck_problems(img)
            .into_iter()
            .map(|l| l.split(", mod time").next().unwrap_or("").to_string())
            .collect()
    };
    let before = problems(img);
    if let Some(k) = kernel_write_errno(img) {
        assert_eq!(k, EUCLEAN, "{what}: the kernel's write");
    }
    let fs = rw(img);
    let f = fs.lookup(fs.root(), b"f").unwrap().ino;
    let mut buf = vec![0u8; 4096];
    assert_eq!(errno(fs.read(f, 0, &mut buf)), EUCLEAN, "{what}: read");
    assert_eq!(errno(fs.write(f, 0, &[0xA5; 1024])), EUCLEAN, "{what}: write");
    assert_eq!(errno(fs.write(f, 512, &[0xA5; 2048])), EUCLEAN, "{what}: write across");
    let trunc = rext4::SetAttr { size: Some(1000), ..Default::default() };
    assert_eq!(errno(fs.setattr(f, &trunc)), EUCLEAN, "{what}: truncate");
    if fs.getattr(f).unwrap().flags & 0x80000 != 0 {
        // Hole punching and zeroing are for extent-mapped files.
        assert_eq!(errno(fs.fallocate(f, 0x3, 0, 2048)), EUCLEAN, "{what}: punch");
        assert_eq!(errno(fs.fallocate(f, 0x10, 0, 2048)), EUCLEAN, "{what}: zero range");
    }
    fs.unmount().unwrap();
    drop(fs);
    assert!(!holds_pattern(img, blk, len, 1024, 0xA5), "{what}: data written into metadata");
    assert_eq!(problems(img), before, "{what}: new problems");
    let fs = rw(img);
    fs.unlink(fs.root(), b"f").unwrap();
    assert!(fs.has_errors(), "{what}: the damage is recorded");
    fs.unmount().unwrap();
    drop(fs);
    assert!(all_in_use(img, blk, len), "{what}: metadata freed");
    assert!(!holds_pattern(img, blk, len, 1024, 0xA5), "{what}: data written into metadata");
}

/// A file whose extent names metadata blocks (the system zone: superblock and descriptor
/// copies, reserved descriptor blocks, bitmaps, inode tables, the journal): no read, write,
/// truncate or free reaches them.
#[test]
fn extents_aimed_at_metadata_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::write(&data, vec![7u8; 4096]).unwrap();
    let probe = image_with(dir.path(), "probe", &["-b", "1024"], "");
    for (what, blk) in metadata_targets(&probe) {
        // i_block[5] is the low word of the first extent's start.
        let cmds = format!("write {} f\nset_inode_field /f block[5] {blk}\n", data.display());
        let img = image_with(dir.path(), &what.replace(' ', "-"), &["-b", "1024"], &cmds);
        refused_everywhere(&img, what, blk, 4);
    }
}

/// The same on a block-mapped (ext3) file: a direct pointer, then the indirect block.
#[test]
fn block_maps_aimed_at_metadata_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::write(&data, vec![7u8; 4096]).unwrap();
    let ext3 = ["-t", "ext3", "-b", "1024"];
    let probe = image_with(dir.path(), "probe3", &ext3, "");
    let targets = metadata_targets(&probe);
    for (what, blk) in targets.iter().filter(|t| t.0 != "journal") {
        let cmds = format!("write {} f\nset_inode_field /f block[0] {blk}\n", data.display());
        let img = image_with(dir.path(), &format!("d-{}", what.replace(' ', "-")), &ext3, &cmds);
        refused_everywhere(&img, what, *blk, 1);
    }
    // 16 KiB: twelve direct blocks and an indirect one, aimed at a superblock copy (which
    // nothing writes, unlike the inode table holding the file's own record).
    std::fs::write(&data, vec![7u8; 16384]).unwrap();
    let backup = targets[2].1;
    let cmds = format!("write {} f\nset_inode_field /f block[IND] {backup}\n", data.display());
    let img = image_with(dir.path(), "ind", &ext3, &cmds);
    let direct: Vec<u64> =
        debugfs_out(&img, "blocks /f").split_whitespace().take(12).map(|b| b.parse().unwrap()).collect();
    assert_eq!(direct.len(), 12);
    let fs = rw(&img);
    let f = fs.lookup(fs.root(), b"f").unwrap().ino;
    let mut buf = vec![0u8; 1024];
    assert_eq!(errno(fs.read(f, 13 * 1024, &mut buf)), EUCLEAN, "read through the indirect block");
    assert_eq!(errno(fs.write(f, 13 * 1024, &[0xA5; 1024])), EUCLEAN);
    let trunc = rext4::SetAttr { size: Some(1024), ..Default::default() };
    assert_eq!(errno(fs.setattr(f, &trunc)), EUCLEAN);
    fs.unmount().unwrap();
    drop(fs);
    // The failed truncate freed none of the direct blocks the record still names.
    assert!(direct.iter().all(|&b| all_in_use(&img, b, 1)), "a direct block was freed");
    assert!(!holds_pattern(&img, backup, 1, 1024, 0xA5));
}

/// An xattr block number aimed at the inode table: refused, never read as attributes, never
/// released into the free space.
#[test]
fn an_xattr_block_aimed_at_metadata_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let probe = image_with(dir.path(), "probe", &["-b", "1024"], "");
    let itable = metadata_targets(&probe)[0].1;
    let img = image_with(
        dir.path(),
        "xa",
        &["-b", "1024"],
        &format!("write /dev/null f\nset_inode_field /f file_acl {itable}\n"),
    );
    let before = fsck_problems(&img);
    let fs = rw(&img);
    let f = fs.lookup(fs.root(), b"f").unwrap().ino;
    assert_eq!(errno(fs.getxattr(f, b"user.a")), EUCLEAN);
    assert_eq!(errno(fs.listxattr(f)), EUCLEAN);
    assert_eq!(errno(fs.setxattr(f, b"user.a", b"v", 0)), EUCLEAN);
    fs.unmount().unwrap();
    drop(fs);
    assert_eq!(fsck_problems(&img), before);
    let fs = rw(&img);
    fs.unlink(fs.root(), b"f").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    assert!(all_in_use(&img, itable, 1));
}

/// A block bitmap that calls inode-table blocks free: the allocator never hands them out.
/// The allocation that meets them fails with `EUCLEAN` after marking them in use (the kernel's
/// "Allocating blocks which overlap fs metadata"), and later ones succeed elsewhere.
#[test]
fn metadata_called_free_is_never_allocated() {
    let dir = tempfile::tempdir().unwrap();
    let probe = image_with(dir.path(), "probe", &["-b", "1024"], "");
    let itable = metadata_targets(&probe)[0].1;
    // The rest of group 0's table, and everything free after it in the group, handed back.
    let img = image_with(dir.path(), "freed", &["-b", "1024"], &format!("freeb {itable} 64\n"));
    let fs = rw(&img);
    let (mut refused, mut written) = (0, 0);
    for i in 0..64 {
        let name = format!("f{i}");
        let Ok(a) = fs.create(fs.root(), name.as_bytes(), 0o644, 0, 0) else { continue };
        // Blocks are chosen at writeback: fsync makes that happen now.
        match fs.write(a.ino, 0, &[0xA5; 8192]).and_then(|_| fs.fsync(a.ino)) {
            Ok(()) => written += 1,
            Err(e) => {
                assert_eq!(e.errno(), EUCLEAN, "{e}");
                refused += 1;
            }
        }
    }
    assert!(written > 50, "{written} files written, {refused} refused");
    assert!(refused >= 1 && fs.has_errors(), "no allocation met the damage");
    fs.unmount().unwrap();
    drop(fs);
    assert!(all_in_use(&img, itable, 64));
    assert!(!holds_pattern(&img, itable, 64, 1024, 0xA5), "data written into the inode table");
    // The bitmap is whole again, and the counts were never wrong: nothing left to fix.
    assert_eq!(fsck_report(&img), Vec::<String>::new());
}

/// A file whose values live in two EA inodes, one of them with its map aimed at the inode
/// table: the deletion meets the damage before it drops any reference, so the other EA inode
/// stays allocated with its blocks (before, it could be freed while the file, left for e2fsck,
/// still named it). Each EA inode is damaged in turn, as the order they are dropped in is the
/// area's.
#[test]
fn a_damaged_ea_inode_stops_the_deletion_before_anything_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["-b", "1024", "-O", "ea_inode", "-I", "256"];
    for damaged in 0..2 {
        let img = image_with(dir.path(), &format!("ea{damaged}"), &args, "");
        let fs = rw(&img);
        let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
        fs.setxattr(f, b"user.a", &[b'a'; 6000], 0).unwrap();
        fs.setxattr(f, b"user.b", &[b'b'; 6000], 0).unwrap();
        fs.unmount().unwrap();
        drop(fs);
        let eas: Vec<u32> = (f.0 + 1..f.0 + 8)
            .filter(|i| debugfs_out(&img, &format!("stat <{i}>")).contains("Flags: 0x280000"))
            .collect();
        assert_eq!(eas.len(), 2, "EA inodes {eas:?}");
        let itable = metadata_targets(&img)[0].1;
        let out = Command::new(tool("debugfs"))
            .args(["-w", "-R", &format!("set_inode_field <{}> block[5] {itable}", eas[damaged])])
            .arg(&img)
            .output()
            .unwrap();
        assert!(out.status.success());
        let other = eas[1 - damaged];
        let other_blocks: Vec<u64> = debugfs_out(&img, &format!("blocks <{other}>"))
            .split_whitespace()
            .map(|b| b.parse().unwrap())
            .collect();
        assert!(!other_blocks.is_empty());
        let fs = rw(&img);
        fs.unlink(fs.root(), b"f").unwrap();
        assert!(fs.has_errors());
        fs.unmount().unwrap();
        drop(fs);
        assert!(
            debugfs_out(&img, &format!("testi <{other}>")).contains("marked in use"),
            "EA inode {other} freed"
        );
        assert!(other_blocks.iter().all(|&b| all_in_use(&img, b, 1)), "EA inode {other}'s blocks freed");
        assert!(all_in_use(&img, itable, 1));
        // What e2fsck finds is the damage and the file left for it, never a block or inode in
        // use but marked free.
        let report = fsck_report(&img);
        assert!(
            report.iter().any(|l| l.starts_with(&format!("Deleted inode {} has zero dtime", f.0))),
            "{report:?}"
        );
        assert!(!report.iter().any(|l| l.contains("bitmap differences:  +")), "{report:?}");
    }
}
