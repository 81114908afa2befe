//! Birth times through the mount (`FUSE_STATX`): `statx(2)` asking for `STATX_BTIME`, as
//! `Metadata::created` does, shows each inode's `i_crtime` as kernel ext4 shows it for the
//! same image; a file created through the mount is born at its creation; an image of 128-byte
//! inodes, which have no room for one, reports none, as ext4 does.

use super::*;
use std::path::Path;
use std::time::SystemTime;

const PATHS: [&str; 4] = ["f", "d", "l", "new"];

fn created(p: &Path) -> std::io::Result<SystemTime> {
    fs::symlink_metadata(p)?.created()
}

fn image(dir: &Path, inode_size: u32) -> std::path::PathBuf {
    let src = dir.join(format!("src{inode_size}"));
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("f"), b"data").unwrap();
    symlink("f", src.join("l")).unwrap();
    let img = dir.join(format!("statx{inode_size}.img"));
    Image::ext4("16M").block_size(4096).inode_size(inode_size).from_dir(&src).build(&img);
    img
}

#[test]
fn birth_times_as_kernel_ext4() {
    require_fuse!();
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), 256);
    let m = FuseMount::new(&img, "");
    let before = SystemTime::now();
    fs::write(m.join("new"), b"born here").unwrap();
    let after = SystemTime::now();
    let fuse: Vec<SystemTime> = PATHS.iter().map(|p| created(&m.join(p)).unwrap()).collect();
    m.unmount();
    e2fsck_clean(&img);
    let k = KernelMount::ro(&img).unwrap();
    let kernel: Vec<SystemTime> = PATHS.iter().map(|p| created(&k.path().join(p)).unwrap()).collect();
    k.unmount().unwrap();
    assert_eq!(fuse, kernel, "birth times of {PATHS:?} through the mount and through ext4");
    assert!(
        fuse[3] >= before && fuse[3] <= after,
        "new file born {:?}, created in {before:?}..{after:?}",
        fuse[3]
    );

    // 128-byte inodes hold no creation time: neither ext4 nor the mount shows one.
    let img = image(dir.path(), 128);
    let m = FuseMount::new(&img, "ro");
    for p in &PATHS[..3] {
        let e = created(&m.join(p)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::Unsupported, "{p} through the mount: {e}");
    }
    m.unmount();
    let k = KernelMount::ro(&img).unwrap();
    for p in &PATHS[..3] {
        let e = created(&k.path().join(p)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::Unsupported, "{p} through ext4: {e}");
    }
    k.unmount().unwrap();
    e2fsck_clean(&img);
}
