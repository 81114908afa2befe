//! The `rext4` command on crafted images: names no directory may hold, a symbolic link and a
//! directory of one name, directory cycles. Exports never write outside their directory,
//! walks end, and every problem is reported.

use rext4_testkit::{e2fsck_clean, Image};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn rext4(args: &[&str]) -> Output {
    // A walker that loops must fail the test, not hang it.
    let mut child = Command::new(env!("CARGO_BIN_EXE_rext4"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rext4");
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("rext4 {args:?} did not finish");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn debugfs(image: &Path, req: &str) {
    let o = Command::new("debugfs").args(["-w", "-R", req]).arg(image).output().expect("debugfs");
    assert!(o.status.success() && !String::from_utf8_lossy(&o.stderr).contains("rror"), "{req}: {o:?}");
}

/// An image without metadata checksums, so directory blocks can be patched by hand.
fn image(dir: &Path, src: &Path) -> PathBuf {
    let image = dir.join("h.img");
    Image::ext4("16M").features("^metadata_csum").from_dir(src).build(&image);
    image
}

/// Replaces the one occurrence of `from` in the image with `to` (same length).
fn patch(image: &Path, from: &[u8], to: &[u8]) {
    assert_eq!(from.len(), to.len());
    let mut all = std::fs::read(image).unwrap();
    let hits: Vec<usize> =
        all.windows(from.len()).enumerate().filter(|(_, w)| *w == from).map(|(i, _)| i).collect();
    assert_eq!(hits.len(), 1, "{} found {} times", String::from_utf8_lossy(from), hits.len());
    all[hits[0]..hits[0] + to.len()].copy_from_slice(to);
    std::fs::write(image, all).unwrap();
}

fn at(image: &Path, path: &str) -> String {
    format!("{}:{path}", image.display())
}

/// A name holding `/` (`../../../escape` in a directory two levels below the export's
/// parent) and a second `..` entry: skipped with a warning naming the directory's inode and
/// the escaped name, the export ends non-zero, and nothing appears outside it. `ls` and
/// `tree` show the entries, escaped.
#[test]
fn export_rejects_names_that_leave_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("d/..X..X..Xescape"), b"outside\n").unwrap();
    std::fs::write(src.join("d/DOTDOTNAME"), b"dots\n").unwrap();
    std::fs::write(src.join("d/fine"), b"fine\n").unwrap();
    let img = image(dir.path(), &src);
    patch(&img, b"..X..X..Xescape", b"../../../escape");
    // The entry's name length is patched too, to make a second `..` entry.
    patch(&img, b"\x0a\x01DOTDOTNAME", b"\x02\x01..\0\0\0\0\0\0\0\0");

    let ls = rext4(&["ls", "-a", &at(&img, "/d")]);
    let shown = String::from_utf8_lossy(&ls.stdout);
    assert!(shown.contains("..\\057..\\057..\\057escape"), "{shown}");
    let tree = rext4(&["tree", &at(&img, "/d")]);
    assert!(String::from_utf8_lossy(&tree.stdout).contains("..\\057..\\057..\\057escape"), "{tree:?}");

    let out = dir.path().join("a/b/out");
    std::fs::create_dir_all(&out).unwrap();
    let o = rext4(&["cp", "-r", "-q", &at(&img, "/d"), out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("..\\057..\\057..\\057escape"), "{err}");
    assert!(err.contains("directory inode 12"), "{err}");
    assert!(!dir.path().join("escape").exists() && !dir.path().join("a/escape").exists());
    assert_eq!(std::fs::read(out.join("d/fine")).unwrap(), b"fine\n");
    assert_eq!(std::fs::read_dir(out.join("d")).unwrap().count(), 1);
}

/// A symbolic link and a directory of the same name in one directory: the export makes the
/// link and refuses the directory, rather than writing the directory's files through the
/// link. A symbolic link already in the target is not written through either.
#[test]
fn export_never_follows_a_symlink_in_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("d/victim"), b"from the image\n").unwrap();
    let img = image(dir.path(), &src);
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let f = dir.path().join("f");
    std::fs::write(&f, b"payload\n").unwrap();
    debugfs(&img, &format!("symlink /d/escapelink1 {}", outside.display()));
    debugfs(&img, "mkdir /d/escapelink2");
    debugfs(&img, &format!("write {} /d/escapelink2/payload", f.display()));
    patch(&img, b"escapelink2", b"escapelink1");

    let out = dir.path().join("out");
    std::fs::create_dir_all(out.join("d")).unwrap();
    let precious = dir.path().join("precious");
    std::fs::write(&precious, b"keep me\n").unwrap();
    std::os::unix::fs::symlink(&precious, out.join("d/victim")).unwrap();

    let o = rext4(&["cp", "-r", "-q", &at(&img, "/d"), out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("escapelink1: exists and is not a directory"), "{err}");
    assert!(err.contains("victim: exists and is a symbolic link"), "{err}");
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "wrote through the image's symlink");
    assert_eq!(std::fs::read(&precious).unwrap(), b"keep me\n", "wrote through a host symlink");
    assert_eq!(std::fs::read_link(out.join("d/escapelink1")).unwrap(), outside);
}

/// A directory hard-linked into its own subtree: tree, cp -r and rm -r each report the cycle
/// and end. After rm, removing the crafted link by hand leaves an image e2fsck passes.
#[test]
fn directory_cycles_are_reported_and_walks_end() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    std::fs::write(src.join("a/b/file"), b"x").unwrap();
    std::fs::write(src.join("a/top"), b"y").unwrap();
    let img = image(dir.path(), &src);
    debugfs(&img, "link /a /a/b/loop");
    let a_ino = rext4(&["stat", &at(&img, "/a")]);
    let a_ino: String = String::from_utf8_lossy(&a_ino.stdout)
        .split("Inode: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_default()
        .to_string();
    let want = format!("directory cycle at {} (inode {a_ino})", at(&img, "/a/b/loop"));

    let o = rext4(&["tree", &at(&img, "/a")]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains(&want), "{o:?}");

    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let o = rext4(&["cp", "-r", "-q", &at(&img, "/a"), out.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("directory cycle at {} (inode {a_ino})", out.join("a/b/loop").display())),
        "{err}"
    );
    assert_eq!(std::fs::read(out.join("a/b/file")).unwrap(), b"x");

    let o = rext4(&["rm", "-r", &at(&img, "/a")]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains(&want), "{o:?}");
    debugfs(&img, "unlink /a/b/loop");
    e2fsck_clean(&img);
}
