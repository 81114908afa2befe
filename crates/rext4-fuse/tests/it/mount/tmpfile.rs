//! Unnamed files through the mount (`open(O_TMPFILE)`, `FUSE_TMPFILE`), against kernel ext4:
//! the same steps on both leave the same tree (a file written unnamed and linked in, with the
//! directory's default ACL; one closed unnamed, which leaves nothing; one opened `O_EXCL`,
//! which cannot be linked), and a clean image.

use super::*;
use nix::fcntl::AtFlags;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

fn unnamed(dir: &Path, extra: i32) -> std::io::Result<File> {
    OpenOptions::new().read(true).write(true).mode(0o640).custom_flags(libc::O_TMPFILE | extra).open(dir)
}

/// What the test does on either mount; returns the errno of linking the `O_EXCL` file.
fn steps(root: &Path) -> i32 {
    let d = root.join("d");
    fs::create_dir(&d).unwrap();
    let acl = std::process::Command::new("setfacl").args(["-d", "-m", "u:1234:r"]).arg(&d).status().unwrap();
    assert!(acl.success(), "setfacl on {}", d.display());
    let mut f = unnamed(&d, 0).unwrap();
    f.write_all(b"written before it had a name").unwrap();
    let cwd = File::open(root).unwrap();
    nix::unistd::linkat(f.as_fd(), "", cwd.as_fd(), "named", AtFlags::AT_EMPTY_PATH).unwrap();
    f.write_all(b", and after").unwrap();
    drop(f);
    let mut gone = unnamed(&d, 0).unwrap();
    gone.write_all(&[7u8; 20_000]).unwrap();
    drop(gone);
    let excl = unnamed(&d, libc::O_EXCL).unwrap();
    let e = nix::unistd::linkat(excl.as_fd(), "", cwd.as_fd(), "never", AtFlags::AT_EMPTY_PATH).unwrap_err();
    assert_eq!(fs::read(root.join("named")).unwrap(), b"written before it had a name, and after");
    e as i32
}

#[test]
fn unnamed_files_as_kernel_ext4() {
    require_fuse!();
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    let kimg = dir.path().join("kernel.img");
    let fimg = dir.path().join("fuse.img");
    Image::ext4("32M").block_size(4096).build(&kimg);
    fs::copy(&kimg, &fimg).unwrap();

    let used = |p: &Path| {
        let s = nix::sys::statvfs::statvfs(p).unwrap();
        (s.blocks() - s.blocks_free(), s.files() - s.files_free())
    };
    let km = KernelMount::with_options(&kimg, "loop").unwrap();
    let kernel_errno = steps(km.path());
    let kernel_used = used(km.path());
    km.unmount().unwrap();
    e2fsck_clean(&kimg);

    let m = FuseMount::new(&fimg, "");
    let fuse_errno = steps(m.path());
    assert_eq!(fuse_errno, kernel_errno, "linking an O_EXCL unnamed file");
    assert_eq!(kernel_errno, libc::ENOENT);
    // The unnamed files' blocks and inodes come back once the kernel has sent their last
    // FORGET (in the background, after the close): the same use as on ext4.
    let t = std::time::Instant::now();
    while used(m.path()) != kernel_used && t.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(used(m.path()), kernel_used, "blocks and inodes in use");
    unmount_and_compare(m, &fimg);
    let k = KernelMount::ro(&fimg).unwrap();
    let acl = std::process::Command::new("getfacl")
        .args(["-c", "-p"])
        .arg(k.path().join("named"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&acl.stdout).contains("user:1234:r"), "inherited ACL");
    k.unmount().unwrap();
}
