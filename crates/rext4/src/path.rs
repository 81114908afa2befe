//! The path-level API, shaped like `std::fs`: resolve paths (following symbolic links the way
//! the kernel does, ELOOP after 40), read directories, open files, and change the namespace.
//!
//! | file | owns |
//! |---|---|
//! | `path.rs` | resolution, `metadata`, `read_dir`, `read_link` |
//! | `path/file.rs` | [`File`] and [`OpenOptions`]: open files over the VFS's [`crate::OpenFile`] |
//! | `path/ops.rs` | the `std::fs`-like helpers (`write_file`, `create_dir_all`, `remove_dir_all`, ...) on [`crate::UserFs`], and on [`Fs`] as root |

use crate::attr::{Attr, DirEntry, FileType};
use crate::error::{Error, Result};
use crate::fs::Fs;
use rext4_format::InodeNo;
use std::collections::VecDeque;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub(crate) mod file;
pub(crate) mod ops;
#[cfg(test)]
mod tests;

/// Most symbolic links followed while resolving one path (the kernel's `MAXSYMLINKS`).
pub(crate) const MAX_SYMLINKS: u32 = 40;

impl Fs {
    /// Resolves `path` (absolute, or relative to the root) to an inode; a final symbolic link
    /// is followed if `follow` is set. A trailing `/` requires a directory; an empty path is
    /// `ENOENT`.
    pub fn resolve(&self, path: impl AsRef<Path>, follow: bool) -> Result<InodeNo> {
        self.resolve_as(None, path.as_ref(), follow)
    }

    /// [`Fs::resolve`], checking that `creds` (if any) may search every directory passed.
    pub(crate) fn resolve_as(
        &self,
        creds: Option<&crate::Creds>,
        path: &Path,
        follow: bool,
    ) -> Result<InodeNo> {
        self.inner.noting(crate::fs::stats::Op::Lookup, || {
            let bytes = path.as_os_str().as_bytes();
            if bytes.is_empty() {
                // As every path call in the kernel answers for "".
                return Err(Error::NotFound);
            }
            let must_be_dir = bytes.ends_with(b"/") && bytes.iter().any(|&b| b != b'/');
            let mut queue: VecDeque<Vec<u8>> = components(bytes);
            let root = self.inner.iget_live(self.root())?;
            let mut cur = root.clone();
            let mut links = 0u32;
            while let Some(c) = queue.pop_front() {
                // Before `.` is skipped: `file/.` is ENOTDIR, as in the kernel.
                if !cur.is_dir() {
                    return Err(Error::NotDir);
                }
                if c == b"." {
                    continue;
                }
                if c.len() > 255 {
                    return Err(Error::NameTooLong);
                }
                if let Some(creds) = creds {
                    self.permission(creds, &self.inner.attr_of(&cur)?, crate::Access::EXEC)?;
                }
                let inode = self.inner.lookup(&cur, &c)?;
                let last = queue.is_empty();
                if inode.file_type() == Some(FileType::Symlink) && (!last || follow || must_be_dir) {
                    links += 1;
                    if links > MAX_SYMLINKS {
                        return Err(Error::Loop);
                    }
                    // Following a link reads it (`pick_link`'s `touch_atime`).
                    let target = self.inner.readlink_touching(&inode, true)?;
                    if target.starts_with(b"/") {
                        cur = root.clone();
                    }
                    for t in components(&target).into_iter().rev() {
                        queue.push_front(t);
                    }
                    continue;
                }
                cur = inode;
            }
            if must_be_dir && !cur.is_dir() {
                return Err(Error::NotDir);
            }
            Ok(cur.ino)
        })
    }

    /// Attributes of the file at `path`, following symbolic links (`stat(2)`).
    pub fn metadata(&self, path: impl AsRef<Path>) -> Result<Attr> {
        self.getattr(self.resolve(path, true)?)
    }

    /// Attributes of `path` itself, not following a final symbolic link (`lstat(2)`).
    pub fn symlink_metadata(&self, path: impl AsRef<Path>) -> Result<Attr> {
        self.getattr(self.resolve(path, false)?)
    }

    /// The target of the symbolic link at `path`.
    pub fn read_link(&self, path: impl AsRef<Path>) -> Result<PathBuf> {
        let target = self.readlink(self.resolve(path, false)?)?;
        Ok(PathBuf::from(std::ffi::OsStr::from_bytes(&target)))
    }

    /// The entries of the directory at `path`, without `.` and `..`.
    pub fn read_dir(&self, path: impl AsRef<Path>) -> Result<ReadDir> {
        let ino = self.resolve(path, true)?;
        if self.getattr(ino)?.kind != FileType::Directory {
            return Err(Error::NotDir);
        }
        Ok(ReadDir::new(self, ino))
    }
}

pub(crate) fn components(path: &[u8]) -> VecDeque<Vec<u8>> {
    path.split(|&b| b == b'/').filter(|c| !c.is_empty()).map(<[u8]>::to_vec).collect()
}

/// Iterator over a directory's entries (without `.` and `..`), fetched in batches; each batch
/// sets the directory's access time as `getdents(2)` does ([`crate::Options::atime`]), unless
/// made with [`ReadDir::noatime`].
pub struct ReadDir {
    fs: Fs,
    ino: InodeNo,
    pos: u64,
    buf: VecDeque<DirEntry>,
    done: bool,
    /// List without setting the access time (`O_NOATIME`).
    noatime: bool,
}

impl std::fmt::Debug for ReadDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadDir").field("ino", &self.ino).field("pos", &self.pos).finish()
    }
}

impl ReadDir {
    pub(crate) fn new(fs: &Fs, ino: InodeNo) -> ReadDir {
        ReadDir { fs: fs.clone(), ino, pos: 0, buf: VecDeque::new(), done: false, noatime: false }
    }

    /// Lists without setting the directory's access time, as a directory opened with
    /// `O_NOATIME` is listed (a tree walk that must leave what it looks at as it was).
    pub fn noatime(mut self) -> ReadDir {
        self.noatime = true;
        self
    }
}

impl Iterator for ReadDir {
    type Item = Result<DirEntry>;
    fn next(&mut self) -> Option<Self::Item> {
        while self.buf.is_empty() && !self.done {
            let mut got = 0;
            let buf = &mut self.buf;
            let mut pos = self.pos;
            let take = |e: DirEntry| {
                pos = e.next;
                got += 1;
                if e.name != b"." && e.name != b".." {
                    buf.push_back(e);
                }
                got < 256
            };
            let r = if self.noatime {
                self.fs.readdir_noatime(self.ino, self.pos, take)
            } else {
                self.fs.readdir(self.ino, self.pos, take)
            };
            if let Err(e) = r {
                self.done = true;
                return Some(Err(e));
            }
            self.pos = pos;
            if got < 256 {
                self.done = true;
            }
        }
        self.buf.pop_front().map(Ok)
    }
}
