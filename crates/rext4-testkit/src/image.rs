//! The one way the tests make images: `mkfs.ext4 -q -F`, with options added in order, or
//! rext4's own formatter (`rext4 mkfs`) with the same options.
//!
//! ```no_run
//! # use rext4_testkit::Image;
//! # let dir = std::path::Path::new("/tmp");
//! // mkfs.ext4 -q -F -b 1024 -O ^metadata_csum -d src dir/a.img 64M
//! let img = Image::ext4("64M")
//!     .block_size(1024)
//!     .features("^metadata_csum")
//!     .from_dir(dir.join("src"))
//!     .build_in(dir, "a.img");
//! // rext4 mkfs -q -F -b 1024 --from src dir/b.img 64M
//! let img = Image::ext4("64M")
//!     .block_size(1024)
//!     .from_dir(dir.join("src"))
//!     .rext4_mkfs("target/debug/rext4")
//!     .build_in(dir, "b.img");
//! ```

use crate::tools::{out_text, run, tool};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

/// An image to make with `mkfs.ext4 -q -F` (or `rext4 mkfs -q -F`). Options go on the
/// command line in the order they are added (so a list of raw options and the typed methods
/// give the same command), then `-d` (`--from`) with the source tree if there is one, the
/// image path and the size.
#[derive(Clone, Debug)]
#[must_use = "an Image does nothing until built"]
pub struct Image {
    size: String,
    args: Vec<OsString>,
    src: Option<PathBuf>,
    env: Vec<(OsString, OsString)>,
    /// The `rext4` program whose `mkfs` makes the image instead of mkfs.ext4.
    rext4: Option<PathBuf>,
}

impl Image {
    /// An image of `size` (as mkfs.ext4 reads it: "8M", "1G"), with this machine's mkfs
    /// defaults (`/etc/mke2fs.conf`) unless options say otherwise.
    pub fn ext4(size: &str) -> Image {
        Image { size: size.to_string(), args: Vec::new(), src: None, env: Vec::new(), rext4: None }
    }

    /// Raw mkfs options, as given (tests with tables of variants pass them this way).
    pub fn args<S: AsRef<OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Image {
        self.args.extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    fn opt(self, flag: &str, value: impl AsRef<OsStr>) -> Image {
        self.args([OsStr::new(flag), value.as_ref()])
    }

    /// `-t TYPE`: ext2 / ext3 / ext4 feature defaults.
    pub fn fs_type(self, t: &str) -> Image {
        self.opt("-t", t)
    }

    /// `-b SIZE`: the block size in bytes.
    pub fn block_size(self, bs: usize) -> Image {
        self.opt("-b", bs.to_string())
    }

    /// `-O LIST`: features to add, or with `^` to remove, comma-separated.
    pub fn features(self, list: &str) -> Image {
        self.opt("-O", list)
    }

    /// `-N COUNT`: at least this many inodes.
    pub fn inodes(self, n: u32) -> Image {
        self.opt("-N", n.to_string())
    }

    /// `-I SIZE`: the inode size in bytes.
    pub fn inode_size(self, n: u32) -> Image {
        self.opt("-I", n.to_string())
    }

    /// `-J OPTS`: journal options (`size=4`).
    pub fn journal(self, opts: &str) -> Image {
        self.opt("-J", opts)
    }

    /// `-E OPTS`: extended options (`root_owner=0:0`, `hash_seed=...`).
    pub fn extended(self, opts: &str) -> Image {
        self.opt("-E", opts)
    }

    /// `-U UUID`.
    pub fn uuid(self, uuid: &str) -> Image {
        self.opt("-U", uuid)
    }

    /// `-d DIR`: fills the image with the tree at `src`.
    pub fn from_dir(mut self, src: impl AsRef<Path>) -> Image {
        self.src = Some(src.as_ref().to_path_buf());
        self
    }

    /// Runs mkfs with `key=value` in its environment (`E2FSPROGS_FAKE_TIME` for images that
    /// are the same on every run).
    pub fn env(mut self, key: &str, value: &str) -> Image {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Makes the image with `rext4 mkfs` (the `rext4` program at `exe`, which a crate's
    /// tests find as `env!("CARGO_BIN_EXE_rext4")`) instead of mkfs.ext4: the same options,
    /// `--from` for the tree. Its defaults are e2fsprogs 1.47's own, not this machine's
    /// `/etc/mke2fs.conf`.
    pub fn rext4_mkfs(mut self, exe: impl AsRef<Path>) -> Image {
        self.rext4 = Some(exe.as_ref().to_path_buf());
        self
    }

    /// The mkfs command that makes the image at `path`.
    pub fn command(&self, path: &Path) -> Command {
        let mut c = match &self.rext4 {
            Some(exe) => {
                let mut c = Command::new(exe);
                c.arg("mkfs");
                c
            }
            None => Command::new(tool("mkfs.ext4")),
        };
        c.args(["-q", "-F"]).args(&self.args);
        if let Some(src) = &self.src {
            c.arg(if self.rext4.is_some() { "--from" } else { "-d" }).arg(src);
        }
        c.arg(path).arg(&self.size);
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    /// Makes the image at `path` (overwriting it); panics with mkfs's output on failure.
    pub fn build(&self, path: &Path) {
        let mut c = self.command(path);
        let o = run(&mut c);
        assert!(o.status.success(), "{c:?} failed:\n{}", out_text(&o));
        let quota = self.args.iter().any(|a| a.to_string_lossy().contains("quota"));
        if quota && self.src.is_some() && self.rext4.is_none() {
            // mke2fs 1.47.0 writes the quota files before `-d` fills the image, so their usage
            // leaves out the tree; e2fsck counts it in (exit 1: fixed).
            let mut f = Command::new(tool("e2fsck"));
            let o = run(f.arg("-fy").arg(path));
            assert!(matches!(o.status.code(), Some(0 | 1)), "{f:?} failed:\n{}", out_text(&o));
        }
    }

    /// Makes the image `dir/name` and returns its path.
    pub fn build_in(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        self.build(&path);
        path
    }
}
