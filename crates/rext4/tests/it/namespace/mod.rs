//! Names: create, mkdir, unlink, rmdir through the journal, with the kernel's errno; every
//! image e2fsck-clean afterwards and the kernel seeing the same tree.
//!
//! `create.rs`: creating and removing names, alone and in parallel; `cache.rs`: names and
//! inodes through cache evictions and races; `links.rs`: links and renames; `special.rs`:
//! device nodes, FIFOs and sockets; `inline.rs`: inline directories.

mod cache;
mod create;
mod inline;
mod links;
mod special;

use rext4::{FileType, Fs, Options};
use rext4_testkit::{
    assert_no_diff, diff_full, e2fsck_clean as fsck_clean, require_kernel, walk_kernel, walk_rext4, Image,
    KernelMount,
};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

fn mkfs(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    Image::ext4("64M").args(args).build(&img);
    img
}

fn rw(img: &Path) -> Fs {
    Fs::open_with(img, Options { writable: true, ..Options::default() }).unwrap()
}
