//! File locks compared with the kernel's: the same `fcntl` and `flock` calls, made on rext4's
//! lock engine and on a file of a loop-mounted ext4 image, must get the same answers.
//!
//! On the kernel side POSIX owners are helper processes (this test binary run again with
//! `REXT4_LOCK_SERVER` set, taking commands over a pipe: a POSIX owner is a process), and OFD
//! and `flock` owners are open file descriptions of this process. Blocked waits are
//! interrupted with a signal on the kernel side and a [`Cancel`] on rext4's. The kernel's
//! locks are read back from `/proc/PID/fdinfo` (per description, in the inode's list order),
//! and a lock server is seen waiting when its thread sleeps in a waiting lock call.
//!
//! Needs root and loop devices: skipped with the reason printed otherwise, or failed when
//! `REXT4_REQUIRE_MOUNT=1`. Its own test binary: the lock servers run it again, and its tests
//! take turns (see [`one_at_a_time`]).
#![allow(unreachable_pub, clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use rext4::{Cancel, Creds, FileLock, FlockOp, Fs, InodeNo, LockOwner, LockType, OpenFile, OpenFlags, Wait};
pub use rext4_testkit::{Image, KernelMount};
use std::cell::RefCell;
use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod blocking;
mod fcntl;
mod proc;
mod random;
mod server;
mod steps;

pub use fcntl::*;
pub use proc::*;
pub use server::*;

/// Both sides: rext4 on one image, the kernel on another. Fields drop in order: the
/// filesystem, the mount, then the directory holding the images.
pub struct Env {
    pub fs: Fs,
    pub mnt: KernelMount,
    _dir: tempfile::TempDir,
}

/// Held by each test for its whole run. A process another test spawns holds a copy of every
/// descriptor of this process from its fork to its exec (close-on-exec closes them only
/// then), so a "last close" of a description here would not be the last, and its OFD and
/// flock locks would outlive it.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

impl Env {
    pub fn new() -> Option<Env> {
        rext4_testkit::require_kernel!(None);
        let dir = tempfile::tempdir().expect("tempdir");
        let (kimg, rimg) = (dir.path().join("kernel.img"), dir.path().join("rext4.img"));
        Image::ext4("32M").build(&kimg);
        Image::ext4("32M").build(&rimg);
        let mnt = KernelMount::rw(&kimg).expect("the probe mounted an image: this one mounts too");
        let fs = Fs::open_rw(&rimg).expect("rext4 opens its image");
        Some(Env { fs, mnt, _dir: dir })
    }

    /// A new empty file on both sides.
    pub fn new_file(&self, name: &str) -> (PathBuf, String, InodeNo) {
        let path = self.mnt.path().join(name);
        std::fs::File::create(&path).expect("kernel create");
        let m = std::fs::metadata(&path).unwrap();
        // How /proc/locks and fdinfo name the inode.
        let devino = format!("{:02x}:{:02x}:{}", libc::major(m.dev()), libc::minor(m.dev()), m.ino());
        let ino = self.fs.create(self.fs.root(), name.as_bytes(), 0o644, 0, 0).expect("rext4 create").ino;
        (path, devino, ino)
    }

    pub fn open(&self, ino: InodeNo, flags: OpenFlags) -> OpenFile {
        self.fs.open_inode(&Creds::root(), ino, flags).expect("rext4 open")
    }
}

pub fn open_k(path: &Path) -> OwnedFd {
    // Close-on-exec (std's default): a descriptor leaked into a process another test spawns
    // would keep its description, and so its OFD and flock locks, alive.
    std::fs::OpenOptions::new().read(true).write(true).open(path).expect("kernel open").into()
}
