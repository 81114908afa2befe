//! The `discard` option: the blocks a transaction freed are released on the device once it
//! has committed (a hole punched in an image file; `NBD_CMD_TRIM` through nbdkit, whose file
//! plugin punches the hole), and not without the option. The image stays clean.

use rext4::{Fs, Options};
use rext4_testkit::*;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

const BIG: usize = 32 << 20;

/// Bytes the image file takes on its filesystem.
fn allocated(img: &Path) -> u64 {
    std::fs::metadata(img).unwrap().blocks() * 512
}

fn keep() -> Vec<u8> {
    (0..1 << 20).map(|i: u32| (i * 7 % 251) as u8).collect()
}

/// Writes a big file and a small one through `addr`, deletes the big one; returns the image's
/// allocated bytes before and after the delete's commit. Ends with the image checked.
fn delete_big_file(addr: &str, img: &Path, discard: bool) -> (u64, u64) {
    let fs = Fs::open_with(addr, Options { writable: true, discard, ..Options::default() }).unwrap();
    fs.write_file("/big", vec![0x5a; BIG]).unwrap();
    fs.write_file("/keep", keep()).unwrap();
    fs.sync().unwrap();
    let before = allocated(img);
    fs.remove_file("/big").unwrap();
    fs.sync().unwrap();
    let after = allocated(img);
    // Blocks freed and discarded are allocated again as usual.
    fs.write_file("/again", vec![0xa5; 4 << 20]).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    (before, after)
}

fn check(img: &Path) {
    e2fsck_clean(img);
    let fs = Fs::open(img).unwrap();
    assert_eq!(fs.read_file("/keep").unwrap(), keep());
    assert_eq!(fs.read_file("/again").unwrap(), vec![0xa5; 4 << 20]);
    assert!(fs.read_file("/big").is_err());
}

#[test]
fn freed_blocks_are_punched_out_of_an_image_file_after_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    for discard in [false, true] {
        let img = dir.path().join(format!("d{discard}.img"));
        Image::ext4("128M").build(&img);
        let (before, after) = delete_big_file(img.to_str().unwrap(), &img, discard);
        assert!(before > BIG as u64, "the big file is in the image: {before}");
        if discard {
            assert!(after + (BIG as u64) * 15 / 16 <= before, "discarded: {before} -> {after}");
        } else {
            assert!(after + (1 << 20) >= before, "nothing discarded without the option: {before} -> {after}");
        }
        check(&img);
    }
}

#[test]
fn freed_blocks_are_trimmed_on_an_nbd_export() {
    require_tool!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    Image::ext4("128M").build(&img);
    let mut srv = NbdServe::nbdkit(Listen::Unix, &["file", img.to_str().unwrap()]);
    let (before, after) = delete_big_file(&srv.uri("", ""), &img, true);
    srv.terminate();
    assert!(before > BIG as u64, "the big file is in the image: {before}");
    assert!(after + (BIG as u64) * 15 / 16 <= before, "trimmed through the server: {before} -> {after}");
    check(&img);
}
