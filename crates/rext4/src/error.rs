//! The one public error type, and the one function that maps it to an errno.

use core::fmt;
use rext4_format::{InodeNo, PhysBlock};
use std::io;

/// Result type of the engine.
pub type Result<T, E = Error> = core::result::Result<T, E>;

/// Everything that can go wrong. Each case maps to the errno the Linux ext4 driver gives in the
/// same situation (see [`Error::errno`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A path component or xattr does not exist (`ENOENT`).
    NotFound,
    /// A non-directory was used as a directory (`ENOTDIR`).
    NotDir,
    /// A directory was used where a non-directory is required (`EISDIR`).
    IsDir,
    /// A name longer than 255 bytes (`ENAMETOOLONG`).
    NameTooLong,
    /// Too many symbolic links while resolving a path (`ELOOP`).
    Loop,
    /// An argument is invalid (`EINVAL`).
    InvalidInput(&'static str),
    /// The extended attribute does not exist (`ENODATA`).
    NoData,
    /// The caller's buffer is too small for the result (`ERANGE`).
    Range,
    /// The filesystem is read-only (`EROFS`).
    ReadOnly,
    /// No free blocks or inodes are left (`ENOSPC`).
    NoSpace,
    /// A quota limit would be passed (`EDQUOT`; quota/limits.rs).
    QuotaExceeded,
    /// The name already exists (`EEXIST`).
    Exists,
    /// The directory is not empty (`ENOTEMPTY`).
    NotEmpty,
    /// The operation is not permitted on this kind of file (`EPERM`), e.g. a hard link to a
    /// directory.
    NotPermitted,
    /// The inode has as many links as it can (`EMLINK`).
    TooManyLinks,
    /// The name is in use in a way that forbids the operation (`EBUSY`), e.g. renaming `.`.
    Busy,
    /// The file is encrypted and no key is available (`ENOKEY`).
    NoKey,
    /// A size or offset past what the format can address (`EFBIG`).
    FileTooBig,
    /// `SEEK_DATA` / `SEEK_HOLE` from at or past the end of the file (`ENXIO`).
    NoSuchOffset,
    /// An extended attribute value larger than the VFS passes (`E2BIG`).
    TooBig,
    /// The operation is refused for this kind of file (`EACCES`), e.g. a default ACL on a
    /// non-directory, or the caller's credentials do not allow it (permission bits, ACLs).
    AccessDenied,
    /// The image uses something this engine does not implement (`EOPNOTSUPP`).
    NotSupported(String),
    /// The image cannot be opened: unknown incompat feature, external journal, ... (`EINVAL`).
    Incompatible(String),
    /// The device failed.
    Io(io::Error),
    /// The image is inconsistent.
    Corrupt(Corrupt),
    /// An inode named by number (an open file, a file handle) is no longer in use (`ESTALE`).
    Stale,
    /// A writable open found the image in use by another writer: another rext4 process or a
    /// kernel mount (`EBUSY`). The text says which.
    InUse(String),
    /// A lock request that may not wait found the range held (`EAGAIN`, which is also
    /// `EWOULDBLOCK`).
    WouldBlock,
    /// A blocking lock request would wait for an owner that waits for the caller (`EDEADLK`).
    Deadlock,
    /// A wait was cancelled before it was granted (`EINTR`).
    Interrupted,
    /// A link or rename into a directory that passes on a project (`PROJINHERIT`) of a file in
    /// another project (`EXDEV`, as ext4 answers so that tools copy instead).
    CrossProject,
    /// A link or rename into an encrypted directory of a file without its policy (`EXDEV`,
    /// the kernel's `fscrypt_has_permitted_context`).
    CrossPolicy,
}

impl Error {
    /// The errno a kernel filesystem would return.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::Loop => libc::ELOOP,
            Error::InvalidInput(_) => libc::EINVAL,
            Error::NoData => libc::ENODATA,
            Error::Range => libc::ERANGE,
            Error::ReadOnly => libc::EROFS,
            Error::NoSpace => libc::ENOSPC,
            Error::QuotaExceeded => libc::EDQUOT,
            Error::Exists => libc::EEXIST,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::NotPermitted => libc::EPERM,
            Error::TooManyLinks => libc::EMLINK,
            Error::Busy => libc::EBUSY,
            Error::NoKey => libc::ENOKEY,
            Error::FileTooBig => libc::EFBIG,
            Error::NoSuchOffset => libc::ENXIO,
            Error::TooBig => libc::E2BIG,
            Error::AccessDenied => libc::EACCES,
            Error::NotSupported(_) => libc::EOPNOTSUPP,
            Error::Incompatible(_) => libc::EINVAL,
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::Corrupt(c) => c.errno(),
            Error::Stale => libc::ESTALE,
            Error::InUse(_) => libc::EBUSY,
            Error::WouldBlock => libc::EAGAIN,
            Error::Deadlock => libc::EDEADLK,
            Error::Interrupted => libc::EINTR,
            Error::CrossProject | Error::CrossPolicy => libc::EXDEV,
        }
    }

    /// The corruption details, if this is a corruption error.
    pub fn as_corrupt(&self) -> Option<&Corrupt> {
        match self {
            Error::Corrupt(c) => Some(c),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotFound => f.write_str("no such file or directory"),
            Error::NotDir => f.write_str("not a directory"),
            Error::IsDir => f.write_str("is a directory"),
            Error::NameTooLong => f.write_str("file name too long"),
            Error::Loop => f.write_str("too many levels of symbolic links"),
            Error::InvalidInput(what) => write!(f, "invalid argument: {what}"),
            Error::NoData => f.write_str("no such attribute"),
            Error::Range => f.write_str("result too large for buffer"),
            Error::ReadOnly => f.write_str("read-only filesystem"),
            Error::NoSpace => f.write_str("no space left on device"),
            Error::QuotaExceeded => f.write_str("disk quota exceeded"),
            Error::Exists => f.write_str("file exists"),
            Error::NotEmpty => f.write_str("directory not empty"),
            Error::NotPermitted => f.write_str("operation not permitted"),
            Error::TooManyLinks => f.write_str("too many links"),
            Error::Busy => f.write_str("resource busy"),
            Error::NoKey => f.write_str("file is encrypted and no key is available"),
            Error::FileTooBig => f.write_str("file too large"),
            Error::NoSuchOffset => f.write_str("no such device or address"),
            Error::TooBig => f.write_str("argument list too long"),
            Error::AccessDenied => f.write_str("permission denied"),
            Error::NotSupported(what) => write!(f, "not supported: {what}"),
            Error::Incompatible(why) => write!(f, "cannot open image: {why}"),
            Error::Io(e) => write!(f, "I/O error: {e}"),
            Error::Corrupt(c) => write!(f, "filesystem corrupt: {c}"),
            Error::Stale => f.write_str("stale file handle"),
            Error::InUse(why) => f.write_str(why),
            Error::WouldBlock => f.write_str("resource temporarily unavailable"),
            Error::Deadlock => f.write_str("resource deadlock avoided"),
            Error::Interrupted => f.write_str("interrupted"),
            Error::CrossProject => {
                f.write_str("the file belongs to another project than the directory passes on")
            }
            Error::CrossPolicy => f.write_str("the file is not encrypted with the directory's policy"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        // A device's open refusing another writer (see FileDevice::open) carries its reason;
        // a bare EBUSY from the system stays an I/O error.
        if e.kind() == io::ErrorKind::ResourceBusy && e.raw_os_error().is_none() {
            return Error::InUse(e.to_string());
        }
        Error::Io(e)
    }
}

impl From<Corrupt> for Error {
    fn from(c: Corrupt) -> Self {
        Error::Corrupt(c)
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Io(e) => e,
            other => io::Error::from_raw_os_error(other.errno()),
        }
    }
}

/// A description of an inconsistency in the image: what structure, which inode and block.
/// Opaque so that detail can grow without breaking users.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrupt(pub(crate) CorruptKind);

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CorruptKind {
    Superblock(&'static str),
    Journal(&'static str),
    SuperblockChecksum,
    GroupDesc {
        group: u32,
        what: &'static str,
    },
    GroupDescChecksum {
        group: u32,
    },
    Inode {
        ino: InodeNo,
        what: &'static str,
    },
    InodeChecksum {
        ino: InodeNo,
    },
    /// A block number outside the filesystem.
    BlockRange {
        ino: Option<InodeNo>,
        block: PhysBlock,
    },
    /// A run of blocks named as data (or as an inode's own metadata) that overlaps the
    /// filesystem's metadata: superblock, descriptors, bitmaps, inode tables, journal.
    SystemZone {
        ino: Option<InodeNo>,
        block: PhysBlock,
        len: u64,
    },
    ExtentTree {
        ino: InodeNo,
        block: Option<PhysBlock>,
        what: &'static str,
    },
    ExtentChecksum {
        ino: InodeNo,
        block: PhysBlock,
    },
    BlockMap {
        ino: InodeNo,
        block: PhysBlock,
        what: &'static str,
    },
    DirEntry {
        ino: InodeNo,
        block: Option<PhysBlock>,
        what: &'static str,
    },
    DirChecksum {
        ino: InodeNo,
        block: PhysBlock,
    },
    DxChecksum {
        ino: InodeNo,
        block: PhysBlock,
    },
    Xattr {
        ino: InodeNo,
        block: Option<PhysBlock>,
        what: &'static str,
    },
    XattrChecksum {
        ino: InodeNo,
        block: PhysBlock,
    },
    InlineData {
        ino: InodeNo,
        what: &'static str,
    },
    Symlink {
        ino: InodeNo,
        what: &'static str,
    },
    /// A journal checksum does not match (superblock, a logged block, or a transaction).
    JournalChecksum(&'static str),
    /// The orphan file (inode `ino`) or one of its blocks.
    OrphanFile {
        ino: InodeNo,
        block: Option<PhysBlock>,
        what: &'static str,
    },
    OrphanFileChecksum {
        ino: InodeNo,
        block: PhysBlock,
    },
    /// A quota file (its header, tree or free lists).
    Quota(&'static str),
}

impl Corrupt {
    /// ext4 reports bad checksums as EFSBADCRC (= EBADMSG) and other corruption as
    /// EFSCORRUPTED (= EUCLEAN).
    pub(crate) fn errno(&self) -> i32 {
        if self.is_checksum() {
            libc::EBADMSG
        } else {
            libc::EUCLEAN
        }
    }

    /// The inode concerned, if one is.
    pub fn inode(&self) -> Option<InodeNo> {
        use CorruptKind::*;
        match &self.0 {
            Inode { ino, .. } | InodeChecksum { ino } | ExtentTree { ino, .. } => Some(*ino),
            ExtentChecksum { ino, .. } | BlockMap { ino, .. } | DirEntry { ino, .. } => Some(*ino),
            DirChecksum { ino, .. } | DxChecksum { ino, .. } => Some(*ino),
            Xattr { ino, .. } | XattrChecksum { ino, .. } | InlineData { ino, .. } => Some(*ino),
            Symlink { ino, .. } | OrphanFile { ino, .. } | OrphanFileChecksum { ino, .. } => Some(*ino),
            BlockRange { ino, .. } | SystemZone { ino, .. } => *ino,
            Superblock(_) | SuperblockChecksum | GroupDesc { .. } | GroupDescChecksum { .. } => None,
            Journal(_) | JournalChecksum(_) | Quota(_) => None,
        }
    }

    /// The block concerned, if one is known.
    pub fn block(&self) -> Option<PhysBlock> {
        use CorruptKind::*;
        match &self.0 {
            BlockRange { block, .. } | ExtentChecksum { block, .. } | BlockMap { block, .. } => Some(*block),
            SystemZone { block, .. } => Some(*block),
            DirChecksum { block, .. } | DxChecksum { block, .. } | XattrChecksum { block, .. } => {
                Some(*block)
            }
            ExtentTree { block, .. } | DirEntry { block, .. } => *block,
            Xattr { block, .. } | OrphanFile { block, .. } => *block,
            OrphanFileChecksum { block, .. } => Some(*block),
            _ => None,
        }
    }

    /// The block group concerned, if any.
    pub fn group(&self) -> Option<u32> {
        match &self.0 {
            CorruptKind::GroupDesc { group, .. } | CorruptKind::GroupDescChecksum { group } => Some(*group),
            _ => None,
        }
    }

    /// Whether this is a checksum mismatch (as opposed to a structural inconsistency).
    pub fn is_checksum(&self) -> bool {
        use CorruptKind::*;
        matches!(
            self.0,
            SuperblockChecksum
                | GroupDescChecksum { .. }
                | InodeChecksum { .. }
                | ExtentChecksum { .. }
                | DirChecksum { .. }
                | DxChecksum { .. }
                | XattrChecksum { .. }
                | OrphanFileChecksum { .. }
                | JournalChecksum(_)
        )
    }
}

impl fmt::Display for Corrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use CorruptKind::*;
        let blk = |b: &Option<PhysBlock>| b.map(|b| format!(", block {b}")).unwrap_or_default();
        match &self.0 {
            Superblock(what) => write!(f, "superblock: {what}"),
            SuperblockChecksum => f.write_str("superblock checksum mismatch"),
            GroupDesc { group, what } => write!(f, "group descriptor {group}: {what}"),
            GroupDescChecksum { group } => write!(f, "group descriptor {group}: checksum mismatch"),
            Inode { ino, what } => write!(f, "inode {ino}: {what}"),
            InodeChecksum { ino } => write!(f, "inode {ino}: checksum mismatch"),
            BlockRange { ino: Some(ino), block } => {
                write!(f, "inode {ino}: block {block} outside the filesystem")
            }
            BlockRange { ino: None, block } => write!(f, "block {block} outside the filesystem"),
            SystemZone { ino: Some(ino), block, len } => {
                write!(f, "inode {ino}: blocks {block}+{len} overlap filesystem metadata")
            }
            SystemZone { ino: None, block, len } => {
                write!(f, "blocks {block}+{len} overlap filesystem metadata")
            }
            ExtentTree { ino, block, what } => {
                write!(f, "inode {ino}{}: extent tree: {what}", blk(block))
            }
            ExtentChecksum { ino, block } => {
                write!(f, "inode {ino}, block {block}: extent block checksum mismatch")
            }
            BlockMap { ino, block, what } => {
                write!(f, "inode {ino}, block {block}: block map: {what}")
            }
            DirEntry { ino, block, what } => {
                write!(f, "directory inode {ino}{}: bad entry: {what}", blk(block))
            }
            DirChecksum { ino, block } => {
                write!(f, "directory inode {ino}, block {block}: checksum mismatch")
            }
            DxChecksum { ino, block } => {
                write!(f, "directory inode {ino}, block {block}: htree checksum mismatch")
            }
            Xattr { ino, block, what } => write!(f, "inode {ino}{}: xattr: {what}", blk(block)),
            XattrChecksum { ino, block } => {
                write!(f, "inode {ino}, block {block}: xattr block checksum mismatch")
            }
            InlineData { ino, what } => write!(f, "inode {ino}: inline data: {what}"),
            Symlink { ino, what } => write!(f, "inode {ino}: symlink: {what}"),
            Journal(what) | JournalChecksum(what) => write!(f, "journal: {what}"),
            Quota(what) => write!(f, "quota file: {what}"),
            OrphanFile { ino, block, what } => write!(f, "orphan file (inode {ino}){}: {what}", blk(block)),
            OrphanFileChecksum { ino, block } => {
                write!(f, "orphan file (inode {ino}), block {block}: checksum mismatch")
            }
        }
    }
}

/// Shorthand for building a corruption error.
pub(crate) fn corrupt<T>(kind: CorruptKind) -> Result<T> {
    Err(Error::Corrupt(Corrupt(kind)))
}
