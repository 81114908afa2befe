//! Block devices (the bottom of the stack): the device trait, image files, memory, a
//! read-only overlay (journal replay in memory) and the crash-recording device for tests.
//!
//! | module | owns |
//! |---|---|
//! | this file | `BlockDevice`, `FileDevice`, `MemDevice` |
//! | `overlay` | `OverlayDevice`: blocks replaced from memory |
//! | `crash` | `CrashDevice`: records writes and flushes, rebuilds the image at any point |
//! | `image_lock` | one writer per image: the writer's `flock`, kernel mounts refused |
//! | `partition` | `PartitionDevice`: one partition of a GPT or MBR disk |
//! | `nbd` | `NbdDevice`: an export of an NBD server (TCP or Unix socket) |
//! | `address` | image addresses: `disk.img@2`, `nbd://host/export`, `nbd+unix:///export?socket=` |
//!
//! ## This module
//! Block devices: where the bytes of an image live.
//!
//! Every access is positional (`pread`/`pwrite` style), so a device shared by many threads needs
//! no lock of its own.

pub mod address;
pub(crate) mod crash;
pub(crate) mod image_lock;
pub mod nbd;
pub(crate) mod overlay;
pub mod partition;

pub use crate::dev::crash::{apply as apply_ops, CrashDevice, Op};
use crate::dev::image_lock::ImageLock;
use crate::sync::RwLock;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;

pub use crate::dev::address::{open, Address};
pub use crate::dev::nbd::{NbdConfig, NbdDevice, NbdServer};
pub use crate::dev::overlay::OverlayDevice;
pub use crate::dev::partition::{PartitionDevice, Selector};

/// Byte-addressed storage under a filesystem.
pub trait BlockDevice: Send + Sync {
    /// Fills `buf` from byte `offset`; reading past the end is an error.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes `buf` at byte `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Writes `bufs` one after another from byte `offset` (in one system call where the
    /// device can: the journal writes a transaction's blocks from where they lie).
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let mut at = offset;
        for b in bufs {
            self.write_at(b, at)?;
            at += b.len() as u64;
        }
        Ok(())
    }
    /// Writes the `len` bytes of the host file `src` from `src_offset` at byte `offset` (a
    /// file's data copied in whole). This reads and writes them through memory in pieces; an
    /// image file has the kernel copy them (`copy_file_range`). A source shorter than `len`
    /// is an `UnexpectedEof` error.
    fn write_from_file(&self, src: &File, src_offset: u64, offset: u64, len: u64) -> io::Result<()> {
        copy_through_memory(self, src, src_offset, offset, len)
    }
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Writes `buf` at `offset` and returns once it is durable (a journal's commit block,
    /// after a flush of what it commits). A device with forced-unit-access writes (NBD's
    /// FUA) saves the flush after it.
    fn write_durable(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)?;
        self.flush()
    }
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Tells the device the `len` bytes from `offset` hold nothing anyone will read (freed
    /// blocks, the `discard` option): it may release their storage. Advisory: a device that
    /// cannot does nothing.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }
    /// Gives up a writable open's claim on the image once the filesystem on it is closed
    /// clean, so the next writer need not wait for the last handle to be dropped.
    fn release_claim(&self) {}
    /// Where the `len` bytes from `offset` lie in a host file, as that file and the position
    /// there: for a caller that moves them on without reading them through memory (a FUSE
    /// reply spliced from the image). `None` where they are not all in one, as for devices in
    /// memory or over the network, or that keep writes elsewhere.
    fn host_range(&self, offset: u64, len: u64) -> Option<(BorrowedFd<'_>, u64)> {
        let _ = (offset, len);
        None
    }
}

/// Bytes copied from a host file through a buffer, a MiB at a time: what a device that cannot
/// have the kernel copy does for [`BlockDevice::write_from_file`].
fn copy_through_memory<D: BlockDevice + ?Sized>(
    dev: &D,
    src: &File,
    src_offset: u64,
    offset: u64,
    len: u64,
) -> io::Result<()> {
    const PIECE: usize = 1 << 20;
    thread_local! {
        // One buffer a thread, kept between calls (a fill makes many).
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUF.with_borrow_mut(|buf| {
        let mut done = 0u64;
        while done < len {
            let n = usize::try_from(len - done).map_or(PIECE, |n| n.min(PIECE));
            if buf.len() < n {
                buf.resize(n, 0);
            }
            src.read_exact_at(&mut buf[..n], src_offset + done)?;
            dev.write_at(&buf[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    })
}

/// An image file or block device opened from the host.
pub struct FileDevice {
    file: File,
    size: u64,
    /// A writable open's claim on the image (see image_lock.rs). [own lock: taken only at
    /// open and at a clean close]
    lock: crate::sync::Mutex<Option<ImageLock>>,
}

impl FileDevice {
    /// Opens `path`, for writing too if `writable`. A writable open claims the image: it
    /// fails with `ErrorKind::ResourceBusy` while another process writes it (rext4 or a
    /// kernel mount), and holds it until the device is dropped.
    pub fn open(path: &Path, writable: bool) -> io::Result<Self> {
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        let mut oo = std::fs::OpenOptions::new();
        oo.read(true).write(writable);
        if writable && std::fs::metadata(path)?.file_type().is_block_device() {
            // The kernel refuses O_EXCL on a block device while it is mounted or claimed.
            oo.custom_flags(libc::O_EXCL);
        }
        let file = oo.open(path).map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => io::Error::new(io::ErrorKind::ResourceBusy, "device is in use (mounted?)"),
            _ => e,
        })?;
        let lock = if writable { Some(crate::dev::image_lock::claim(&file)?) } else { None };
        let dev = Self::from_file(file)?;
        *dev.lock.lock() = lock;
        Ok(dev)
    }

    /// Wraps an open file; its size is taken now (block devices report it through seeking).
    /// Claims nothing: the caller answers for other writers.
    pub fn from_file(mut file: File) -> io::Result<Self> {
        use std::io::Seek;
        let size = file.seek(io::SeekFrom::End(0))?;
        Ok(FileDevice { file, size, lock: crate::sync::Mutex::new(None) })
    }
}

impl BlockDevice for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        if let [one] = bufs {
            return self.write_at(one, offset);
        }
        // Linux takes at most IOV_MAX (1024) pieces a call, and may write fewer bytes than
        // asked: go on from wherever the last call stopped.
        let (mut i, mut skip, mut at) = (0usize, 0usize, offset);
        loop {
            while i < bufs.len() && bufs[i].len() == skip {
                (i, skip) = (i + 1, 0);
            }
            if i == bufs.len() {
                return Ok(());
            }
            let iov: Vec<io::IoSlice<'_>> = std::iter::once(&bufs[i][skip..])
                .chain(bufs[i + 1..].iter().copied())
                .take(1024)
                .map(io::IoSlice::new)
                .collect();
            let off = i64::try_from(at).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            let mut n = match nix::sys::uio::pwritev(&self.file, &iov, off) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            };
            at += n as u64;
            while n > 0 {
                let left = bufs[i].len() - skip;
                if n < left {
                    skip += n;
                    n = 0;
                } else {
                    n -= left;
                    (i, skip) = (i + 1, 0);
                }
            }
        }
    }
    fn write_from_file(&self, src: &File, src_offset: u64, offset: u64, len: u64) -> io::Result<()> {
        // The kernel copies within its page cache (one copy instead of a read and a write
        // through ours), or shares the blocks where the filesystem under both can reflink.
        let overflow = || io::Error::from(io::ErrorKind::InvalidInput);
        let mut from = i64::try_from(src_offset).map_err(|_| overflow())?;
        let mut to = i64::try_from(offset).map_err(|_| overflow())?;
        let mut left = len;
        while left > 0 {
            let n = usize::try_from(left).unwrap_or(usize::MAX);
            match nix::fcntl::copy_file_range(src, Some(&mut from), &self.file, Some(&mut to), n) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(k) => left -= k as u64,
                Err(nix::errno::Errno::EINTR) => {}
                // Files the kernel will not copy between (other filesystems on old kernels,
                // special files): through memory.
                Err(
                    nix::errno::Errno::EXDEV
                    | nix::errno::Errno::EINVAL
                    | nix::errno::Errno::EOPNOTSUPP
                    | nix::errno::Errno::ENOSYS,
                ) => {
                    let done = len - left;
                    return copy_through_memory(self, src, src_offset + done, offset + done, left);
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        // A hole in an image file (the kernel discards a block device's range for the same
        // call); a filesystem or device that cannot punch holes keeps the bytes.
        let (Ok(off), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Err(io::ErrorKind::InvalidInput.into());
        };
        let mode = nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
            | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
        match nix::fcntl::fallocate(&self.file, mode, off, n) {
            Ok(()) | Err(nix::Error::EOPNOTSUPP | nix::Error::ENOSYS) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
    fn release_claim(&self) {
        self.lock.lock().take();
    }
    fn host_range(&self, offset: u64, len: u64) -> Option<(BorrowedFd<'_>, u64)> {
        offset.checked_add(len).filter(|&end| end <= self.size).map(|_| (self.file.as_fd(), offset))
    }
}

/// A device that has a size and nothing else: what a dry run of `Fs::format`
/// (`FormatOptions::dry_run`) works a filesystem out on, for an image not made yet. Reads and
/// writes fail.
pub struct SizeOnlyDevice(pub u64);

impl BlockDevice for SizeOnlyDevice {
    fn read_at(&self, _: &mut [u8], _: u64) -> io::Result<()> {
        Err(io::Error::other("a device of a size only holds nothing to read"))
    }
    fn write_at(&self, _: &[u8], _: u64) -> io::Result<()> {
        Err(io::Error::other("a device of a size only takes no writes"))
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.0
    }
}

/// An image held in memory (tests, fuzzing, images built in a process).
pub struct MemDevice {
    /// The image bytes. [own lock: readers share, writers exclude]
    data: RwLock<Vec<u8>>,
}

impl MemDevice {
    pub fn new(data: Vec<u8>) -> Self {
        MemDevice { data: RwLock::new(data) }
    }
    /// A copy of the current bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        self.data.read().clone()
    }
}

fn range(len: usize, offset: u64, n: usize) -> io::Result<core::ops::Range<usize>> {
    let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
    let end = start.checked_add(n).filter(|&e| e <= len).ok_or(io::ErrorKind::UnexpectedEof)?;
    Ok(start..end)
}

impl BlockDevice for MemDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let d = self.data.read();
        buf.copy_from_slice(&d[range(d.len(), offset, buf.len())?]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut d = self.data.write();
        let r = range(d.len(), offset, buf.len())?;
        d[r].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.data.read().len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectored_writes_land_in_order() {
        let f = tempfile::tempfile().unwrap();
        f.set_len(1 << 20).unwrap();
        let d = FileDevice::from_file(f).unwrap();
        // More pieces than one call takes, of uneven sizes, some empty.
        let pieces: Vec<Vec<u8>> =
            (0..2500u32).map(|i| vec![(i % 251) as u8; (i % 7) as usize * 3]).collect();
        let refs: Vec<&[u8]> = pieces.iter().map(|p| &p[..]).collect();
        d.write_vectored_at(&refs, 4096).unwrap();
        let want: Vec<u8> = pieces.concat();
        let mut got = vec![0u8; want.len()];
        d.read_at(&mut got, 4096).unwrap();
        assert_eq!(got, want);
        d.write_vectored_at(&[], 0).unwrap();
        d.write_vectored_at(&[&[], &[]], 0).unwrap();
    }

    #[test]
    fn mem_device_bounds() {
        let d = MemDevice::new(vec![1, 2, 3, 4]);
        let mut b = [0u8; 2];
        d.read_at(&mut b, 2).unwrap();
        assert_eq!(b, [3, 4]);
        assert!(d.read_at(&mut b, 3).is_err());
        assert!(d.read_at(&mut b, u64::MAX).is_err());
        d.write_at(&[9], 0).unwrap();
        assert_eq!(d.snapshot(), vec![9, 2, 3, 4]);
    }
}
