//! Real FUSE mounts of images through rext4-fuse: workloads run through `std::fs` (and the
//! syscalls it lacks), then the mount is unmounted, `e2fsck -fn` must be clean, and a kernel
//! loop mount must show the same tree, bytes, times and xattrs the FUSE mount showed.
//! Skipped (with a message) where FUSE mounts are not possible.
//!
//! `tree.rs`: names, directories and handles; `data.rs`: file data and attributes;
//! `options.rs`: mount options, errors and daemon robustness; `atime.rs`: access times on
//! reads against kernel ext4; `access.rs`: permissions, ACLs
//! and group ownership for other users; `statx.rs`: birth times against kernel ext4; `tmpfile.rs`:
//! `O_TMPFILE` against kernel ext4; `handles.rs`: file handles against kernel ext4; `trim.rs`: `FITRIM` against kernel ext4; `label.rs`: the volume label against kernel ext4;
//! `writeback.rs`: times and append-only files under the writeback cache against kernel ext4;
//! `splice.rs`: large reads spliced from the image; `quota.rs`: quota usage kept through the mount;
//! `casefold.rs`: casefolded directories and the kernel's name cache; `bigalloc.rs`: a tree
//! written into a bigalloc image against the host and kernel ext4; `encrypt.rs`: encrypted
//! directories with and without their key against kernel ext4.

mod access;
mod atime;
mod bigalloc;
mod casefold;
mod data;
mod encrypt;
mod handles;
mod killpriv;
mod label;
mod options;
mod quota;
mod requests;
mod splice;
mod statx;
mod tmpfile;
mod tree;
mod trim;
mod writeback;

use crate::support::*;
use rext4_testkit::*;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{symlink, FileExt, MetadataExt, PermissionsExt};

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

#[track_caller]
fn expect_errno<T: std::fmt::Debug>(r: std::io::Result<T>, want: i32, what: &str) {
    match r {
        Ok(v) => panic!("{what}: succeeded ({v:?}), expected errno {want}"),
        Err(e) => assert_eq!(errno(&e), want, "{what}: {e}"),
    }
}

fn ft(sec: i64, nsec: u32) -> filetime::FileTime {
    filetime::FileTime::from_unix_time(sec, nsec)
}
