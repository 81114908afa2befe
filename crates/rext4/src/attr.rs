//! Public descriptions of inodes: file types, attributes, directory entries, statfs.

use rext4_format::dirent;
use rext4_format::inode as fi;
pub use rext4_format::inode::Timestamp;
pub(crate) use rext4_format::InodeNo;

/// The type of a file, from its mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    RegularFile,
    Directory,
    Symlink,
    CharDevice,
    BlockDevice,
    Fifo,
    Socket,
}

impl FileType {
    /// From the `S_IFMT` bits of a mode; `None` for an invalid type.
    pub fn from_mode(mode: u16) -> Option<Self> {
        Some(match mode & fi::S_IFMT {
            fi::S_IFREG => FileType::RegularFile,
            fi::S_IFDIR => FileType::Directory,
            fi::S_IFLNK => FileType::Symlink,
            fi::S_IFCHR => FileType::CharDevice,
            fi::S_IFBLK => FileType::BlockDevice,
            fi::S_IFIFO => FileType::Fifo,
            fi::S_IFSOCK => FileType::Socket,
            _ => return None,
        })
    }

    /// From a directory entry's `file_type` byte; `None` if unknown.
    pub fn from_dirent(ft: u8) -> Option<Self> {
        Some(match ft {
            dirent::FT_REG_FILE => FileType::RegularFile,
            dirent::FT_DIR => FileType::Directory,
            dirent::FT_SYMLINK => FileType::Symlink,
            dirent::FT_CHRDEV => FileType::CharDevice,
            dirent::FT_BLKDEV => FileType::BlockDevice,
            dirent::FT_FIFO => FileType::Fifo,
            dirent::FT_SOCK => FileType::Socket,
            _ => return None,
        })
    }

    /// The `d_type` value of `readdir(3)`.
    pub fn d_type(self) -> u8 {
        match self {
            FileType::Fifo => 1,
            FileType::CharDevice => 2,
            FileType::Directory => 4,
            FileType::BlockDevice => 6,
            FileType::RegularFile => 8,
            FileType::Symlink => 10,
            FileType::Socket => 12,
        }
    }
}

/// What `stat(2)` reports about an inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: InodeNo,
    pub kind: FileType,
    /// Full mode: type and permission bits.
    pub mode: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Space used, in 512-byte units.
    pub blocks: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    /// Creation time, where the inode has room for it.
    pub crtime: Option<Timestamp>,
    /// Device number of a device node, as (major, minor).
    pub rdev: (u32, u32),
    /// Preferred I/O size (the block size).
    pub blksize: u32,
    /// ext4 inode flags (`FS_IOC_GETFLAGS` style).
    pub flags: u32,
    pub generation: u32,
}

impl Attr {
    /// Permission bits only.
    pub fn perm(&self) -> u16 {
        self.mode & 0o7777
    }
    /// The device number encoded as glibc's `makedev`.
    pub fn rdev_encoded(&self) -> u64 {
        let (ma, mi) = (u64::from(self.rdev.0), u64::from(self.rdev.1));
        ((ma & 0xFFF) << 8) | ((ma & !0xFFF) << 32) | (mi & 0xFF) | ((mi & !0xFF) << 12)
    }
}

/// One directory entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: InodeNo,
    pub name: Vec<u8>,
    /// The type the entry records, if the filesystem records types.
    pub kind: Option<FileType>,
    /// The readdir position just after this entry (pass it back to continue).
    pub next: u64,
}

/// What `statfs(2)` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatFs {
    pub block_size: u32,
    /// Blocks available for data (total minus metadata overhead).
    pub blocks: u64,
    pub blocks_free: u64,
    /// Free blocks minus those reserved for root.
    pub blocks_avail: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
    /// The filesystem id the kernel derives from the UUID.
    pub fsid: u64,
}
