//! One writer per image: a CLI writer refuses an image another process holds the rext4 lock
//! on, or that the kernel has mounted; read-only commands keep working beside either.

use rext4_testkit::{e2fsck_clean, require_kernel, Image, KernelMount};
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn rext4(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rext4")).args(args).output().expect("run rext4")
}

fn mkfs(img: &Path) {
    Image::ext4("16M").rext4_mkfs(env!("CARGO_BIN_EXE_rext4")).build(img);
}

/// The lock the FUSE daemon and every writer take (an exclusive flock, here held by
/// flock(1)): a writer is refused and names the holder; readers go on.
#[test]
fn a_writer_refuses_a_locked_image() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("l.img");
    mkfs(&img);
    // -o: the lock stays with flock(1) alone, so killing it frees the image.
    let mut holder = Command::new("flock")
        .args(["-x", "-o"])
        .arg(&img)
        .args(["sleep", "60"])
        .stdin(Stdio::null())
        .spawn()
        .expect("flock(1) from util-linux");
    // Wait until the lock is taken.
    for _ in 0..200 {
        let probe = Command::new("flock").args(["-n", "-x"]).arg(&img).arg("true").status().unwrap();
        if !probe.success() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let t = format!("{}:/x", img.display());
    let o = rext4(&["mkdir", &t]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    let ls = rext4(&["ls", &format!("{}:/", img.display())]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(!o.status.success());
    assert!(err.contains("image is in use by another rext4 process (pid "), "{err}");
    assert!(ls.status.success(), "a reader beside the lock: {}", String::from_utf8_lossy(&ls.stderr));
    let o = rext4(&["mkdir", &t]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    e2fsck_clean(&img);
}

/// An image the kernel has mounted through a loop device is refused to writers, naming the
/// loop device and mount point; readers go on.
#[test]
fn a_writer_refuses_an_image_the_kernel_has_mounted() {
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("k.img");
    mkfs(&img);
    let k = KernelMount::rw(&img).expect("kernel mount");
    let mnt = k.path().to_path_buf();
    let o = rext4(&["mkdir", &format!("{}:/x", img.display())]);
    let ls = rext4(&["ls", &format!("{}:/", img.display())]);
    k.unmount().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    let want = format!("rext4: {}: image is mounted by the kernel (loop", img.display());
    assert!(err.starts_with(&want), "{err}");
    assert!(err.contains(&format!(" on {}); unmount it first", mnt.display())), "{err}");
    assert!(ls.status.success(), "{}", String::from_utf8_lossy(&ls.stderr));
    let o = rext4(&["mkdir", &format!("{}:/x", img.display())]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    e2fsck_clean(&img);
}

/// The lock is the engine's: a second writable open in the same process is refused with
/// EBUSY while the first is open, a read-only open is not, and a clean unmount frees the image
/// even while the first handle still exists.
#[test]
fn library_writers_exclude_each_other_until_unmount() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("lib.img");
    mkfs(&img);
    let first = rext4::Fs::open_rw(&img).unwrap();
    let e = rext4::Fs::open_rw(&img).err().expect("a second writer is refused");
    assert_eq!(e.errno(), libc::EBUSY);
    assert!(e.to_string().contains("image is in use by another rext4 process (pid "), "{e}");
    assert!(rext4::Fs::open(&img).is_ok(), "a reader beside the writer");
    first.unmount().unwrap();
    let second = rext4::Fs::open_rw(&img).unwrap();
    second.mkdir(second.root(), b"after", 0o755, 0, 0).unwrap();
    second.unmount().unwrap();
    drop(first);
    e2fsck_clean(&img);
}
