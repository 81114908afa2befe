//! Helpers for the crate's own tests: images made by mkfs.ext4, opened over memory, checked
//! by e2fsck.

use crate::dev::MemDevice;
use crate::fs::{Fs, Options};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

/// The bytes of a fresh `size` image made with `args` (and the tree `src`, if given).
pub(crate) fn mkfs_image(src: Option<&Path>, args: &[&str], size: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("a.img");
    let mut c = Command::new("mkfs.ext4");
    c.args(["-q", "-F"]);
    if let Some(s) = src {
        c.arg("-d").arg(s);
    }
    let out = c.args(args).arg(&img).arg(size).output().expect("mkfs.ext4 is required");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::read(&img).unwrap()
}

/// Asserts `e2fsck -fn` accepts the image `bytes`.
pub(crate) fn fsck_clean(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("a.img");
    std::fs::write(&img, bytes).unwrap();
    let out = Command::new("e2fsck").arg("-fn").arg(&img).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

/// A writable filesystem over the image `bytes` in memory, and its device.
pub(crate) fn open_mem(bytes: Vec<u8>) -> (Fs, Arc<MemDevice>) {
    let dev = Arc::new(MemDevice::new(bytes));
    let fs = Fs::from_device(dev.clone(), Options { writable: true, ..Options::default() }).unwrap();
    (fs, dev)
}
