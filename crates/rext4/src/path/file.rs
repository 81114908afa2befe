//! [`File`] and [`OpenOptions`], shaped like `std::fs::File` and `std::fs::OpenOptions`.
//!
//! A [`File`] wraps an open file description ([`OpenFile`]): it holds its inode, so a file
//! unlinked while open stays readable and writable and is freed when the last handle on it is
//! dropped. Opens go through [`UserFs::open`], so the caller's permissions are checked;
//! [`Fs::open_options`] opens as root ([`Creds::root`]), [`UserFs::open_options`] as that
//! caller.
//!
//! There is no umask: a mode is used as given. The default mode for new files is `0o644`, what
//! std's `0o666` becomes under the usual umask 022.

use crate::attr::Attr;
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::inode::write::SetAttr;
use crate::vfs::creds::Creds;
use crate::vfs::open::{OpenFile, OpenFlags};
use crate::vfs::user::UserFs;
use rext4_format::InodeNo;
use std::io;
use std::path::Path;

/// The mode new files get unless [`OpenOptions::mode`] says otherwise.
pub(crate) const DEFAULT_FILE_MODE: u16 = 0o644;

/// Options for opening a file, checked as `std::fs::OpenOptions` checks them. Made by
/// [`Fs::open_options`] (root) or [`UserFs::open_options`] (that caller):
///
/// ```no_run
/// # fn main() -> rext4::Result<()> {
/// let fs = rext4::Fs::open_rw("disk.img")?;
/// let mut f = fs.open_options().write(true).create(true).mode(0o600).open("/etc/app.conf")?;
/// std::io::Write::write_all(&mut f, b"key = value\n")?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct OpenOptions {
    user: UserFs,
    read: bool,
    write: bool,
    append: bool,
    truncate: bool,
    create: bool,
    create_new: bool,
    mode: u16,
    custom: i32,
}

impl std::fmt::Debug for OpenOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenOptions")
            .field("uid", &self.user.creds().uid)
            .field("flags", &self.flags())
            .field("mode", &format_args!("{:#o}", self.mode))
            .finish()
    }
}

impl OpenOptions {
    fn new(user: UserFs) -> OpenOptions {
        OpenOptions {
            user,
            read: false,
            write: false,
            append: false,
            truncate: false,
            create: false,
            create_new: false,
            mode: DEFAULT_FILE_MODE,
            custom: 0,
        }
    }

    pub fn read(&mut self, read: bool) -> &mut Self {
        self.read = read;
        self
    }

    pub fn write(&mut self, write: bool) -> &mut Self {
        self.write = write;
        self
    }

    /// Every write goes to the end of the file (`O_APPEND`); implies writing.
    pub fn append(&mut self, append: bool) -> &mut Self {
        self.append = append;
        self
    }

    /// Cut an existing file to length 0 (`O_TRUNC`); needs `write`.
    pub fn truncate(&mut self, truncate: bool) -> &mut Self {
        self.truncate = truncate;
        self
    }

    /// Create the file if it is missing (`O_CREAT`); needs `write` or `append`.
    pub fn create(&mut self, create: bool) -> &mut Self {
        self.create = create;
        self
    }

    /// Create the file, failing with `EEXIST` if the name is taken, even by a dangling
    /// symbolic link (`O_CREAT | O_EXCL`); `create` and `truncate` are then ignored.
    pub fn create_new(&mut self, create_new: bool) -> &mut Self {
        self.create_new = create_new;
        self
    }

    /// Permission bits of a file this open creates (`0o644` unless set; no umask applies).
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = (mode & 0o7777) as u16;
        self
    }

    /// More `open(2)` flags, as `std::os::unix::fs::OpenOptionsExt::custom_flags`: the access
    /// mode bits are ignored; `O_NOFOLLOW`, `O_DIRECTORY`, `O_NOATIME`, `O_SYNC` and the
    /// creation flags have their meaning; others (`O_CLOEXEC`, `O_NONBLOCK`, ...) have none
    /// here. `O_TMPFILE` is refused at open.
    pub fn custom_flags(&mut self, flags: i32) -> &mut Self {
        self.custom = flags;
        self
    }

    /// The open flags these options stand for, or `EINVAL` where std refuses the combination
    /// (nothing to do; creating or truncating without writing; truncating an append).
    pub fn flags(&self) -> Result<OpenFlags> {
        let mut f = match (self.read, self.write, self.append) {
            (false, false, false) => return Err(Error::InvalidInput("open for neither reading nor writing")),
            (true, false, false) => OpenFlags::READ,
            (false, true, false) => OpenFlags::WRITE,
            (true, true, false) => OpenFlags::READ | OpenFlags::WRITE,
            (r, _, true) => {
                let mut f = OpenFlags::WRITE | OpenFlags::APPEND;
                f.set(OpenFlags::READ, r);
                f
            }
        };
        if !self.write && !self.append && (self.truncate || self.create || self.create_new) {
            return Err(Error::InvalidInput("create or truncate without write"));
        }
        if self.append && self.truncate && !self.create_new {
            return Err(Error::InvalidInput("truncate with append"));
        }
        if self.create_new {
            f |= OpenFlags::CREATE | OpenFlags::EXCLUSIVE;
        } else {
            f.set(OpenFlags::CREATE, self.create);
            f.set(OpenFlags::TRUNCATE, self.truncate);
        }
        if self.custom & libc::O_TMPFILE == libc::O_TMPFILE {
            return Err(Error::NotSupported("O_TMPFILE through OpenOptions (Fs::tmpfile makes one)".into()));
        }
        // `from_libc` reads access mode 0 as O_RDONLY; the access mode here is the options'.
        Ok(f | (OpenFlags::from_libc(self.custom & !libc::O_ACCMODE) - OpenFlags::READ))
    }

    /// Opens `path` (absolute, or relative to the root) with these options.
    pub fn open(&self, path: impl AsRef<Path>) -> Result<File> {
        Ok(File::from(self.user.open(path, self.flags()?, self.mode)?))
    }
}

impl Fs {
    /// Options for opening files as root, as `std::fs::File::options()`.
    pub fn open_options(&self) -> OpenOptions {
        OpenOptions::new(self.as_user(Creds::root()))
    }

    /// Opens the file at `path` for reading (`std::fs::File::open`).
    pub fn open_file(&self, path: impl AsRef<Path>) -> Result<File> {
        self.open_options().read(true).open(path)
    }

    /// Opens the file at `path` for writing, creating it (mode `0o644`) or cutting it to
    /// length 0 (`std::fs::File::create`).
    pub fn create_file(&self, path: impl AsRef<Path>) -> Result<File> {
        self.open_options().write(true).create(true).truncate(true).open(path)
    }
}

impl UserFs {
    /// Options for opening files as this caller, as `std::fs::File::options()`.
    pub fn open_options(&self) -> OpenOptions {
        OpenOptions::new(self.clone())
    }

    /// Opens the file at `path` for reading (`std::fs::File::open`).
    pub fn open_file(&self, path: impl AsRef<Path>) -> Result<File> {
        self.open_options().read(true).open(path)
    }

    /// Opens the file at `path` for writing, creating it (mode `0o644`) or cutting it to
    /// length 0 (`std::fs::File::create`).
    pub fn create_file(&self, path: impl AsRef<Path>) -> Result<File> {
        self.open_options().write(true).create(true).truncate(true).open(path)
    }
}

/// An open file: `std::io::Read + Write + Seek` (also on `&File`, as for `std::fs::File`),
/// positional reads and writes, and the calls of `std::fs::File`. Dropping the last handle
/// on its description closes it: its OFD and `flock` locks go, and an unlinked file is freed.
#[derive(Debug)]
pub struct File {
    f: OpenFile,
}

impl From<OpenFile> for File {
    fn from(f: OpenFile) -> File {
        File { f }
    }
}

impl File {
    /// The file's inode number.
    pub fn ino(&self) -> InodeNo {
        self.f.ino()
    }

    /// The open file description, for locks ([`OpenFile::setlk`], [`OpenFile::flock`]) and
    /// the flags it was opened with.
    pub fn as_open_file(&self) -> &OpenFile {
        &self.f
    }

    pub fn into_open_file(self) -> OpenFile {
        self.f
    }

    /// Another handle on the same description, sharing its position (`dup(2)`).
    pub fn try_clone(&self) -> Result<File> {
        Ok(File { f: self.f.clone() })
    }

    /// Current attributes (`fstat`).
    pub fn metadata(&self) -> Result<Attr> {
        self.f.metadata()
    }

    /// Reads at `offset` without moving the position (`pread(2)`).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.f.read_at(buf, offset)
    }

    /// Writes at `offset` without moving the position (`pwrite(2)`); opened to append, the
    /// data goes to the end, as Linux does.
    pub fn write_at(&self, data: &[u8], offset: u64) -> Result<usize> {
        self.f.write_at(data, offset).map(|(_, n)| n)
    }

    /// Truncates or extends the file (`ftruncate(2)`): `EINVAL` unless open for writing.
    pub fn set_len(&self, size: u64) -> Result<()> {
        self.f.set_len(size)
    }

    /// Makes the file's data and metadata durable (`fsync(2)`).
    pub fn sync_all(&self) -> Result<()> {
        self.f.sync_all()
    }

    /// `fdatasync(2)`: the same commit as [`File::sync_all`], since a journal commit carries
    /// the inode with the data it orders.
    pub fn sync_data(&self) -> Result<()> {
        self.f.sync_all()
    }

    /// Changes the permission bits (`fchmod(2)`), checked against the credentials the file
    /// was opened with: the owner or `CAP_FOWNER` only.
    pub fn set_permissions(&self, perm: std::fs::Permissions) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let user = self.f.fs().as_user(self.f.creds().clone());
        let mode = Some((perm.mode() & 0o7777) as u16);
        user.setattr(self.f.ino(), &SetAttr { mode, ..SetAttr::default() }).map(|_| ())
    }
}

impl io::Read for &File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Ok(self.f.read(buf)?)
    }
}

impl io::Write for &File {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        Ok(self.f.write(data)?)
    }

    /// Nothing is buffered here; durability is [`File::sync_all`].
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl io::Seek for &File {
    fn seek(&mut self, to: io::SeekFrom) -> io::Result<u64> {
        Ok(self.f.seek(to)?)
    }
}

impl io::Read for File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        io::Read::read(&mut &*self, buf)
    }
}

impl io::Write for File {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        io::Write::write(&mut &*self, data)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl io::Seek for File {
    fn seek(&mut self, to: io::SeekFrom) -> io::Result<u64> {
        io::Seek::seek(&mut &*self, to)
    }
}

/// Reads the whole of `f` from offset 0, keeping the engine's errors typed (the reads of
/// `io::Read::read_to_end` would turn them into `Error::Io`).
pub(crate) fn read_all(f: &OpenFile) -> Result<Vec<u8>> {
    // The size is a hint only: an image's sizes are untrusted, so the first allocation is
    // bounded and the vector grows as data really arrives.
    let hint = f.metadata()?.size.min(1 << 24) as usize;
    let mut v = Vec::with_capacity(hint);
    loop {
        if v.len() == v.capacity() {
            // Full at the hinted size: most often the end, which a small read tells cheaply.
            let mut probe = [0u8; 64];
            let n = f.read_at(&mut probe, v.len() as u64)?;
            if n == 0 {
                return Ok(v);
            }
            v.extend_from_slice(&probe[..n]);
            v.reserve(v.len().max(1 << 16));
        }
        let len = v.len();
        v.resize(v.capacity(), 0);
        let n = f.read_at(&mut v[len..], len as u64)?;
        v.truncate(len + n);
        if n == 0 {
            return Ok(v);
        }
    }
}

/// Writes all of `data` at `f`'s position.
pub(crate) fn write_all(f: &OpenFile, mut data: &[u8]) -> Result<()> {
    while !data.is_empty() {
        match f.write(data)? {
            0 => return Err(Error::Io(io::ErrorKind::WriteZero.into())),
            n => data = &data[n..],
        }
    }
    Ok(())
}
