//! The `std::fs`-like helpers: each is the system call sequence a program makes with `std::fs`
//! on Linux, with the kernel's errno for each failure. They live on [`UserFs`], checked as
//! that caller, and on [`Fs`] as root ([`Creds::root`]).
//!
//! Where an inode-level call already has the std name (`write`, `rename`, `symlink`), the
//! path form is `write_file`, `rename_path` and `create_symlink`.
//!
//! Names read from the image are untrusted bytes: walks work on (directory inode, name) and
//! never turn a name back into a path to resolve, so a name holding `/` or `..` cannot lead
//! anywhere.

use super::file::{read_all, write_all, DEFAULT_FILE_MODE};
use super::{components, ReadDir, MAX_SYMLINKS};
use crate::attr::{Attr, DirEntry, FileType};
use crate::error::{Corrupt, CorruptKind, Error, Result};
use crate::fs::Fs;
use crate::inode::write::SetAttr;
use crate::vfs::creds::Creds;
use crate::vfs::open::OpenFlags;
use crate::vfs::permission::Access;
use crate::vfs::user::UserFs;
use rext4_format::InodeNo;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The mode of directories the helpers make: std's `0o777` under the usual umask 022 (there
/// is no umask here).
const DEFAULT_DIR_MODE: u16 = 0o755;

/// A path's last component, as the kernel classes it (`LAST_ROOT`, `LAST_DOT`, ...).
enum Last<'a> {
    Root,
    Dot,
    DotDot,
    Name(&'a [u8]),
}

/// A path cut before its last component.
struct Split<'a> {
    dir: &'a OsStr,
    last: Last<'a>,
    /// The path ended in `/`.
    slash: bool,
}

fn split(path: &Path) -> Result<Split<'_>> {
    let b = path.as_os_str().as_bytes();
    if b.is_empty() {
        return Err(Error::NotFound);
    }
    let end = b.iter().rposition(|&c| c != b'/').map_or(0, |i| i + 1);
    let trimmed = &b[..end];
    let (dir, name) = match trimmed.iter().rposition(|&c| c == b'/') {
        Some(0) => (&b"/"[..], &trimmed[1..]),
        Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
        None => (&b"/"[..], trimmed),
    };
    let last = match name {
        b"" => Last::Root,
        b"." => Last::Dot,
        b".." => Last::DotDot,
        n => Last::Name(n),
    };
    Ok(Split { dir: OsStr::from_bytes(dir), last, slash: end != b.len() })
}

/// Why an entry's name cannot be a name in a directory: empty, a second dot entry, or holding
/// `/` or NUL (the real `.` and `..` never reach this check). Names come from the image: a
/// caller that makes paths or host files of them checks each first.
pub fn bad_name(b: &[u8]) -> Option<&'static str> {
    if b.is_empty() {
        Some("empty name")
    } else if b == b"." || b == b".." {
        Some("a second dot entry")
    } else if b.contains(&b'/') {
        Some("name holds '/'")
    } else if b.contains(&0) {
        Some("name holds NUL")
    } else {
        None
    }
}

/// Why [`UserFs::remove_dir_all_with`] cannot remove an entry. Neither happens in an image
/// the kernel or e2fsprogs wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unremovable {
    /// A directory met a second time in the walk, or whose `..` names another directory: a
    /// directory hard link. Descending could leave the tree or never end.
    DirectoryLink,
    /// A name no directory may hold (the reason says which); the engine refuses it as a name.
    BadName(&'static str),
}

impl std::fmt::Display for Unremovable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unremovable::DirectoryLink => f.write_str("directory hard link or cycle"),
            Unremovable::BadName(why) => f.write_str(why),
        }
    }
}

/// An entry [`UserFs::remove_dir_all_with`] leaves in place, handed to its caller.
#[derive(Debug)]
pub struct Leftover<'a> {
    /// The directory holding the entry.
    pub dir: InodeNo,
    /// That directory's path: the path given, then names from the image. Those are untrusted
    /// bytes (escape them to show them), though none holds `/`.
    pub dir_path: &'a Path,
    /// The entry as the directory lists it.
    pub entry: &'a DirEntry,
    pub why: Unremovable,
}

impl Leftover<'_> {
    /// The error [`UserFs::remove_dir_all`] stops with: corruption of the directory holding
    /// the entry (`EUCLEAN`).
    pub fn to_error(&self) -> Error {
        let what = match self.why {
            Unremovable::DirectoryLink => "directory hard link (met twice, or its .. names another parent)",
            Unremovable::BadName(why) => why,
        };
        Error::Corrupt(Corrupt(CorruptKind::DirEntry { ino: self.dir, block: None, what }))
    }
}

/// A directory [`UserFs::remove_dir_all_with`] has yet to empty, or has emptied.
struct Frame {
    parent: InodeNo,
    name: Vec<u8>,
    ino: InodeNo,
    path: PathBuf,
    emptied: bool,
}

impl UserFs {
    fn parent_dir(&self, s: &Split<'_>) -> Result<InodeNo> {
        self.resolve(s.dir, true)
    }

    /// Attributes of the file at `path`, following symbolic links (`stat(2)`).
    pub fn metadata(&self, path: impl AsRef<Path>) -> Result<Attr> {
        self.fs().getattr(self.resolve(path, true)?)
    }

    /// Attributes of `path` itself, not following a final symbolic link (`lstat(2)`).
    pub fn symlink_metadata(&self, path: impl AsRef<Path>) -> Result<Attr> {
        self.fs().getattr(self.resolve(path, false)?)
    }

    /// The target of the symbolic link at `path`.
    pub fn read_link(&self, path: impl AsRef<Path>) -> Result<PathBuf> {
        let target = self.fs().readlink(self.resolve(path, false)?)?;
        Ok(PathBuf::from(OsStr::from_bytes(&target)))
    }

    /// The entries of the directory at `path`, without `.` and `..`; listing needs read
    /// permission on it (`opendir`).
    pub fn read_dir(&self, path: impl AsRef<Path>) -> Result<ReadDir> {
        let a = self.metadata(path)?;
        if a.kind != FileType::Directory {
            return Err(Error::NotDir);
        }
        self.fs().permission(self.creds(), &a, Access::READ)?;
        Ok(ReadDir::new(self.fs(), a.ino))
    }

    /// The whole content of the file at `path` (`std::fs::read`).
    pub fn read_file(&self, path: impl AsRef<Path>) -> Result<Vec<u8>> {
        read_all(&self.open(path, OpenFlags::READ, 0)?)
    }

    /// The content of the file at `path` as text; `EINVAL` if it is not UTF-8.
    pub fn read_to_string(&self, path: impl AsRef<Path>) -> Result<String> {
        String::from_utf8(self.read_file(path)?).map_err(|_| Error::InvalidInput("file content is not UTF-8"))
    }

    /// Makes `path` hold `data` (`std::fs::write`): creates it (mode `0o644`) or cuts it to
    /// length 0 first, following a final symbolic link.
    pub fn write_file(&self, path: impl AsRef<Path>, data: impl AsRef<[u8]>) -> Result<()> {
        let flags = OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::TRUNCATE;
        write_all(&self.open(path, flags, DEFAULT_FILE_MODE)?, data.as_ref())
    }

    /// Makes directory `path` (`mkdir(2)`, mode `0o755`): `EEXIST` if the name is taken
    /// (the root, `.` and `..` included), `ENOENT` if its parent is missing.
    pub fn create_dir(&self, path: impl AsRef<Path>) -> Result<()> {
        let s = split(path.as_ref())?;
        let Last::Name(name) = s.last else { return Err(Error::Exists) };
        self.mkdir(self.parent_dir(&s)?, name, DEFAULT_DIR_MODE).map(|_| ())
    }

    /// Makes directory `path` and any missing parents (`mkdir -p`, mode `0o755`): nothing to
    /// do if it is a directory already (a symbolic link to one counts); `ENOTDIR` if a
    /// parent is not a directory, `EEXIST` if `path` itself names something else. One lookup
    /// per component, so deep paths cost no more than their length.
    pub fn create_dir_all(&self, path: impl AsRef<Path>) -> Result<()> {
        let bytes = path.as_ref().as_os_str().as_bytes();
        let comps = components(bytes);
        let mut cur = self.fs().root();
        // The path walked so far, to resolve a symbolic link met on the way as the kernel would.
        let mut walked = Vec::with_capacity(bytes.len() + 1);
        for (i, c) in comps.iter().enumerate() {
            let last = i + 1 == comps.len();
            walked.push(b'/');
            walked.extend_from_slice(c);
            if c == b"." {
                continue;
            }
            let a = match self.lookup(cur, c) {
                Ok(a) => a,
                Err(Error::NotFound) => match self.mkdir(cur, c, DEFAULT_DIR_MODE) {
                    Ok(a) => {
                        cur = a.ino;
                        continue;
                    }
                    // Made by someone else meanwhile: use it.
                    Err(Error::Exists) => self.lookup(cur, c)?,
                    Err(e) => return Err(e),
                },
                Err(e) => return Err(e),
            };
            let a = if a.kind == FileType::Symlink {
                match self.resolve(OsStr::from_bytes(&walked), true) {
                    Ok(ino) => self.fs().getattr(ino)?,
                    // A dangling link takes the name; mkdir -p says so too.
                    Err(Error::NotFound) => return Err(Error::Exists),
                    Err(e) => return Err(e),
                }
            } else {
                a
            };
            if a.kind != FileType::Directory {
                return Err(if last { Error::Exists } else { Error::NotDir });
            }
            cur = a.ino;
        }
        Ok(())
    }

    /// Removes the non-directory at `path` (`unlink(2)`), a symbolic link itself rather than
    /// its target: `EISDIR` for a directory (and the root, `.`, `..`); a trailing `/` is
    /// `ENOTDIR` on anything else.
    pub fn remove_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let s = split(path.as_ref())?;
        let Last::Name(name) = s.last else { return Err(Error::IsDir) };
        let dir = self.parent_dir(&s)?;
        if s.slash {
            let a = self.lookup(dir, name)?;
            return Err(if a.kind == FileType::Directory { Error::IsDir } else { Error::NotDir });
        }
        self.unlink(dir, name)
    }

    /// Removes the empty directory at `path` (`rmdir(2)`): `ENOTEMPTY` if it holds anything,
    /// `ENOTDIR` for anything else (a symbolic link is not followed), `EBUSY` for the root,
    /// `EINVAL` for a path ending in `.`.
    pub fn remove_dir(&self, path: impl AsRef<Path>) -> Result<()> {
        let s = split(path.as_ref())?;
        let name = match s.last {
            Last::Root => return Err(Error::Busy),
            Last::Dot => return Err(Error::InvalidInput("rmdir of .")),
            Last::DotDot => return Err(Error::NotEmpty),
            Last::Name(n) => n,
        };
        self.rmdir(self.parent_dir(&s)?, name)
    }

    /// Removes the directory at `path` and everything below it (`std::fs::remove_dir_all`);
    /// a symbolic link at `path` is removed itself, and no link is ever followed. The walk
    /// keeps its own stack, so any depth is fine. On a crafted image, a directory hard link
    /// or a name no directory may hold stops it with `EUCLEAN` ([`Leftover::to_error`]);
    /// [`UserFs::remove_dir_all_with`] can leave those and go on instead.
    pub fn remove_dir_all(&self, path: impl AsRef<Path>) -> Result<()> {
        self.remove_dir_all_with(path, |left| Err(left.to_error()))
    }

    /// [`UserFs::remove_dir_all`], asking `on_left` about each entry it cannot remove: `Ok`
    /// leaves it and goes on (the directories holding it then fail with `ENOTEMPTY`), an
    /// error stops the walk with that error. Removes depth first, each directory's
    /// non-directories as they are listed, then the directory once its subdirectories are gone.
    /// The root is refused (`EBUSY`) before anything is touched, as are paths ending in `.`
    /// (`EINVAL`) or `..` (`ENOTEMPTY`); a non-directory other than a symbolic link is `ENOTDIR`.
    pub fn remove_dir_all_with(
        &self,
        path: impl AsRef<Path>,
        mut on_left: impl FnMut(&Leftover<'_>) -> Result<()>,
    ) -> Result<()> {
        let path = path.as_ref();
        let s = split(path)?;
        let name = match s.last {
            Last::Root => return Err(Error::Busy),
            Last::Dot => return Err(Error::InvalidInput("rmdir of .")),
            Last::DotDot => return Err(Error::NotEmpty),
            Last::Name(n) => n,
        };
        let parent = self.parent_dir(&s)?;
        let top = self.lookup(parent, name)?;
        match top.kind {
            FileType::Directory => {}
            FileType::Symlink if !s.slash => return self.unlink(parent, name),
            _ => return Err(Error::NotDir),
        }
        let mut seen = HashSet::from([top.ino]);
        let mut stack = vec![Frame {
            parent,
            name: name.to_vec(),
            ino: top.ino,
            path: path.to_path_buf(),
            emptied: false,
        }];
        while let Some(mut f) = stack.pop() {
            if f.emptied {
                self.rmdir(f.parent, &f.name)?;
                continue;
            }
            let entries = self.children(f.ino)?;
            let mut subs = Vec::new();
            for e in &entries {
                let left = |why| Leftover { dir: f.ino, dir_path: &f.path, entry: e, why };
                if let Some(why) = bad_name(&e.name) {
                    on_left(&left(Unremovable::BadName(why)))?;
                    continue;
                }
                let kind = match e.kind {
                    Some(k) => k,
                    None => self.fs().getattr(e.ino)?.kind,
                };
                if kind != FileType::Directory {
                    self.unlink(f.ino, &e.name)?;
                    continue;
                }
                // A directory's own `..` names the directory it lives in; one whose `..` is
                // elsewhere is another directory's link, which could lead out of the tree.
                if !seen.insert(e.ino) || self.fs().lookup(e.ino, b"..")?.ino != f.ino {
                    on_left(&left(Unremovable::DirectoryLink))?;
                    continue;
                }
                let path = f.path.join(OsStr::from_bytes(&e.name));
                subs.push(Frame { parent: f.ino, name: e.name.clone(), ino: e.ino, path, emptied: false });
            }
            // Below its subdirectories on the stack: removed once they are.
            f.emptied = true;
            stack.push(f);
            stack.extend(subs);
        }
        Ok(())
    }

    /// A directory's entries but its own `.` and `..` (the first of each: a crafted image may
    /// hold more, which are returned for the caller to judge). Listing needs read permission.
    fn children(&self, dir: InodeNo) -> Result<Vec<DirEntry>> {
        self.fs().permission(self.creds(), &self.fs().getattr(dir)?, Access::READ)?;
        self.fs().children(dir)
    }

    /// Renames `from` to `to` (`rename(2)`), replacing a file at `to`, or an empty directory
    /// when `from` is one: `EBUSY` for the root, `.` or `..` on either side, `ENOTDIR` for a
    /// trailing `/` on a non-directory, `EINVAL` for a directory moved below itself.
    pub fn rename_path(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<()> {
        let (f, t) = (split(from.as_ref())?, split(to.as_ref())?);
        let (Last::Name(old), Last::Name(new)) = (&f.last, &t.last) else { return Err(Error::Busy) };
        let (old_dir, new_dir) = (self.parent_dir(&f)?, self.parent_dir(&t)?);
        if (f.slash || t.slash) && self.lookup(old_dir, old)?.kind != FileType::Directory {
            return Err(Error::NotDir);
        }
        self.rename(old_dir, old, new_dir, new, 0)
    }

    /// The directory and name for a new entry at `path` (`filename_create`): `EEXIST` for the
    /// root, `.` and `..`; a trailing `/` is `EEXIST` if the name is taken and `ENOENT` if not.
    fn new_name<'p>(&self, path: &'p Path) -> Result<(InodeNo, &'p [u8])> {
        let s = split(path)?;
        let Last::Name(name) = s.last else { return Err(Error::Exists) };
        let dir = self.parent_dir(&s)?;
        if s.slash {
            self.lookup(dir, name)?;
            return Err(Error::Exists);
        }
        Ok((dir, name))
    }

    /// Gives the file at `original` the further name `link` (`link(2)`): a symbolic link at
    /// `original` is linked itself, not followed; `EPERM` for a directory, `EEXIST` if `link`
    /// is taken.
    pub fn hard_link(&self, original: impl AsRef<Path>, link: impl AsRef<Path>) -> Result<()> {
        let ino = self.resolve(original, false)?;
        let (dir, name) = self.new_name(link.as_ref())?;
        UserFs::link(self, ino, dir, name).map(|_| ())
    }

    /// Makes a symbolic link at `link` holding `target` as given (`symlink(2)`): `ENOENT` for
    /// an empty target, `EEXIST` if `link` is taken.
    pub fn create_symlink(&self, target: impl AsRef<Path>, link: impl AsRef<Path>) -> Result<()> {
        let (dir, name) = self.new_name(link.as_ref())?;
        UserFs::symlink(self, dir, name, target.as_ref().as_os_str().as_bytes()).map(|_| ())
    }

    /// Sets the permission bits of the file at `path`, following symbolic links (`chmod(2)`):
    /// the owner or `CAP_FOWNER` only; set-ID bits go as the kernel drops them.
    pub fn set_permissions(&self, path: impl AsRef<Path>, perm: std::fs::Permissions) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let ino = self.resolve(path, true)?;
        let mode = Some((perm.mode() & 0o7777) as u16);
        self.setattr(ino, &SetAttr { mode, ..SetAttr::default() }).map(|_| ())
    }

    /// Whether `path` names something, following symbolic links (`std::fs::exists`): a
    /// dangling link is `Ok(false)`; errors other than `ENOENT` (`EACCES`, `ENOTDIR`, `ELOOP`)
    /// are errors.
    pub fn exists(&self, path: impl AsRef<Path>) -> Result<bool> {
        match self.resolve(path, true) {
            Ok(_) => Ok(true),
            Err(Error::NotFound) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The absolute path of `path` with every symbolic link resolved and no `.` or `..`
    /// (`realpath(3)`): `ENOENT` if something on the way is missing, `ENOTDIR` if a
    /// non-directory is passed through, `ELOOP` after 40 links. `..` goes up the path as
    /// resolved so far, as `realpath` does.
    pub fn canonicalize(&self, path: impl AsRef<Path>) -> Result<PathBuf> {
        let bytes = path.as_ref().as_os_str().as_bytes();
        if bytes.is_empty() {
            return Err(Error::NotFound);
        }
        let must_be_dir = bytes.ends_with(b"/");
        let mut queue = components(bytes);
        let root = self.fs().root();
        // The names from the root down with their inodes. Each comes from the caller's path
        // or a link's target split at `/`, so none holds `/`.
        let mut stack: Vec<(Vec<u8>, InodeNo)> = Vec::new();
        let (mut cur, mut cur_is_dir) = (root, true);
        let mut links = 0u32;
        while let Some(c) = queue.pop_front() {
            if !cur_is_dir {
                return Err(Error::NotDir);
            }
            if c == b"." {
                continue;
            }
            if c == b".." {
                stack.pop();
                cur = stack.last().map_or(root, |&(_, ino)| ino);
                continue;
            }
            let a = self.lookup(cur, &c)?;
            if a.kind == FileType::Symlink {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(Error::Loop);
                }
                let target = self.fs().readlink(a.ino)?;
                if target.is_empty() {
                    return Err(Error::NotFound);
                }
                if target.starts_with(b"/") {
                    stack.clear();
                    cur = root;
                }
                for t in components(&target).into_iter().rev() {
                    queue.push_front(t);
                }
                continue;
            }
            cur = a.ino;
            cur_is_dir = a.kind == FileType::Directory;
            stack.push((c, a.ino));
        }
        if must_be_dir && !cur_is_dir {
            return Err(Error::NotDir);
        }
        let mut out = Vec::with_capacity(stack.iter().map(|(n, _)| n.len() + 1).sum::<usize>().max(1));
        for (name, _) in &stack {
            out.push(b'/');
            out.extend_from_slice(name);
        }
        if out.is_empty() {
            out.push(b'/');
        }
        Ok(PathBuf::from(OsStr::from_bytes(&out)))
    }
}

/// The helpers as root. Each is [`UserFs`]'s of the same name, called by [`Creds::root`]:
/// the checks root still meets apply (`EROFS`, immutable and append-only inodes).
impl Fs {
    /// The entries of directory `dir` but its own `.` and `..`: the first entry of each dot
    /// name is the real one; a crafted image may hold more, and those are returned for the
    /// caller to judge ([`bad_name`]).
    pub fn children(&self, dir: InodeNo) -> Result<Vec<DirEntry>> {
        let (mut dot, mut dotdot) = (false, false);
        let mut v = Vec::new();
        self.readdir(dir, 0, |e| {
            if e.name == b"." && !dot {
                dot = true;
            } else if e.name == b".." && !dotdot {
                dotdot = true;
            } else {
                v.push(e);
            }
            true
        })?;
        Ok(v)
    }

    fn root_user(&self) -> UserFs {
        self.as_user(Creds::root())
    }

    /// [`UserFs::read_file`] as root.
    pub fn read_file(&self, path: impl AsRef<Path>) -> Result<Vec<u8>> {
        self.root_user().read_file(path)
    }

    /// [`UserFs::read_to_string`] as root.
    pub fn read_to_string(&self, path: impl AsRef<Path>) -> Result<String> {
        self.root_user().read_to_string(path)
    }

    /// [`UserFs::write_file`] as root.
    pub fn write_file(&self, path: impl AsRef<Path>, data: impl AsRef<[u8]>) -> Result<()> {
        self.root_user().write_file(path, data)
    }

    /// [`UserFs::create_dir`] as root.
    pub fn create_dir(&self, path: impl AsRef<Path>) -> Result<()> {
        self.root_user().create_dir(path)
    }

    /// [`UserFs::create_dir_all`] as root.
    pub fn create_dir_all(&self, path: impl AsRef<Path>) -> Result<()> {
        self.root_user().create_dir_all(path)
    }

    /// [`UserFs::remove_file`] as root.
    pub fn remove_file(&self, path: impl AsRef<Path>) -> Result<()> {
        self.root_user().remove_file(path)
    }

    /// [`UserFs::remove_dir`] as root.
    pub fn remove_dir(&self, path: impl AsRef<Path>) -> Result<()> {
        self.root_user().remove_dir(path)
    }

    /// [`UserFs::remove_dir_all`] as root.
    pub fn remove_dir_all(&self, path: impl AsRef<Path>) -> Result<()> {
        self.root_user().remove_dir_all(path)
    }

    /// [`UserFs::remove_dir_all_with`] as root.
    pub fn remove_dir_all_with(
        &self,
        path: impl AsRef<Path>,
        on_left: impl FnMut(&Leftover<'_>) -> Result<()>,
    ) -> Result<()> {
        self.root_user().remove_dir_all_with(path, on_left)
    }

    /// [`UserFs::rename_path`] as root.
    pub fn rename_path(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<()> {
        self.root_user().rename_path(from, to)
    }

    /// [`UserFs::hard_link`] as root.
    pub fn hard_link(&self, original: impl AsRef<Path>, link: impl AsRef<Path>) -> Result<()> {
        self.root_user().hard_link(original, link)
    }

    /// [`UserFs::create_symlink`] as root.
    pub fn create_symlink(&self, target: impl AsRef<Path>, link: impl AsRef<Path>) -> Result<()> {
        self.root_user().create_symlink(target, link)
    }

    /// [`UserFs::set_permissions`] as root.
    pub fn set_permissions(&self, path: impl AsRef<Path>, perm: std::fs::Permissions) -> Result<()> {
        self.root_user().set_permissions(path, perm)
    }

    /// [`UserFs::exists`] as root.
    pub fn exists(&self, path: impl AsRef<Path>) -> Result<bool> {
        self.root_user().exists(path)
    }

    /// [`UserFs::canonicalize`] as root.
    pub fn canonicalize(&self, path: impl AsRef<Path>) -> Result<PathBuf> {
        self.root_user().canonicalize(path)
    }
}
