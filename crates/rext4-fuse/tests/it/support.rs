//! Mounts of an image through rext4-fuse, served in process, and what the FUSE tests check
//! after one: the image clean and the kernel's view equal to the mount's.

use rext4_testkit::{
    assert_no_diff, diff_full, e2fsck_clean, require_kernel, walk_kernel, KernelMount, Walk,
};
use std::path::{Path, PathBuf};
use std::process::Command;

/// An image mounted through rext4-fuse, served by a thread of this process; unmounted on drop
/// (also when a test panics).
pub struct FuseMount {
    dir: tempfile::TempDir,
    bg: Option<rext4_fuse::Background>,
}

impl FuseMount {
    /// Mounts `img` with the `-o` options `opts`.
    pub fn new(img: &Path, opts: &str) -> FuseMount {
        Self::try_new(img, opts).unwrap_or_else(|e| panic!("mount {} -o {opts}: {e}", img.display()))
    }

    pub fn try_new(img: &Path, opts: &str) -> Result<FuseMount, String> {
        let o = rext4_fuse::MountOptions::parse(opts)?;
        let fs = rext4::Fs::open_with(img, o.engine_options()).map_err(|e| e.to_string())?;
        Self::serve(fs, &o)
    }

    /// Serves `fs` (opened by the caller with `o.engine_options()`).
    pub fn serve(fs: rext4::Fs, o: &rext4_fuse::MountOptions) -> Result<FuseMount, String> {
        let dir = tempfile::Builder::new().prefix("rext4-fuse").tempdir().map_err(|e| e.to_string())?;
        // Other users reach the mount too (allow_other tests).
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
        let bg = rext4_fuse::spawn(fs, dir.path(), o).map_err(|e| e.to_string())?;
        Ok(FuseMount { dir, bg: Some(bg) })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Requests served so far through io_uring queues, and the queues that served any.
    pub fn uring_served(&self) -> (u64, u64) {
        let s = self.bg.as_ref().expect("mounted").transport_stats();
        (s.uring_requests(), s.uring_queues())
    }

    pub fn join(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// Unmounts and waits until the image is committed and clean.
    pub fn unmount(mut self) {
        if let Some(bg) = self.bg.take() {
            bg.unmount().expect("unmount");
        }
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if let Some(bg) = self.bg.take() {
            if let Err(e) = bg.unmount() {
                eprintln!("warning: unmount: {e}");
            }
        }
    }
}

/// What a FUSE walk and a kernel walk of the same image may differ in, removed from both:
/// the root's inode number (FUSE's root is node 1, ext4's inode 2). Birth times are compared
/// (the daemon answers `FUSE_STATX`).
pub fn normalize_fuse(w: &mut Walk) {
    for (p, r) in w.recs.iter_mut() {
        if p == b"/" {
            r.ino = 2;
            r.dirent_ino = 2;
        }
    }
}

/// Walks the FUSE mount, unmounts it, checks the image with `e2fsck -fn`, mounts it read-only
/// in the kernel and asserts both describe the same tree (every stat field, bytes, xattrs,
/// link targets, flags).
pub fn unmount_and_compare(m: FuseMount, img: &Path) {
    let mut seen = walk_kernel(m.path());
    m.unmount();
    e2fsck_clean(img);
    require_kernel!();
    let k = KernelMount::ro(img).expect("kernel mount");
    let mut kw = walk_kernel(k.path());
    drop(k);
    normalize_fuse(&mut seen);
    normalize_fuse(&mut kw);
    assert_no_diff("FUSE mount vs kernel mount", &diff_full("fuse", &seen, "kernel", &kw));
}

/// Runs `sh -c script` as user/group 65534 (no supplementary groups); returns (status, output).
pub fn as_nobody(script: &str) -> (bool, String) {
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", script])
        .output()
        .expect("setpriv");
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    (o.status.success(), text)
}
