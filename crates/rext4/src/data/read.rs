//! Reading file data (the read side of the kernel's `file.c`, `filemap.c`, `readpage` and
//! `readahead.c`): small reads of regular files through the page cache (cache/page.rs), with
//! readahead when a miss follows the last one; large reads, and everything that is not a
//! regular file's data, through the block map straight from the device (which always holds
//! what the pages hold: the cache is write-through, docs/pagecache.md). Holes and unwritten
//! extents read as zeros, except where a delayed write's dirty page covers a hole
//! (data/delalloc.rs): those bytes come from the page.

use crate::error::{Error, Result};
use crate::fs::FsInner;
use crate::inode::atime::AtimeFacts;
use crate::inode::Inode;
use crate::map::Mapping;
use crate::num::usize_from;
use rext4_format::inode::{ENCRYPT_FL, INLINE_DATA_FL, S_IFDIR, S_IFLNK, S_IFREG};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::Ordering::{Acquire, Relaxed};

/// A run of a file's bytes where they lie in the host file under the image
/// ([`crate::Fs::read_in_place`]).
#[derive(Clone, Copy, Debug)]
pub struct HostRange<'a> {
    /// The host file (the image, or the disk it is a partition of).
    pub fd: BorrowedFd<'a>,
    /// Where the bytes start in it.
    pub offset: u64,
    /// How many there are.
    pub len: usize,
}

/// Reads at least this long go straight to the device, without the page cache: a stream
/// gains nothing from copies of its blocks (and the device holds what the pages hold).
const DIRECT_READ: usize = 64 << 10;
/// Whether a read of `len` bytes may be handed over in place ([`FsInner::read_in_place`]):
/// shorter ones go through the page cache.
pub(crate) fn may_read_in_place(len: usize) -> bool {
    len >= DIRECT_READ
}

/// Blocks a sequential miss reads ahead of itself (128 KiB of 4 KiB blocks, the kernel's
/// default `read_ahead_kb`).
const READAHEAD_BLOCKS: u64 = 32;
/// Most blocks one miss reads.
pub(crate) const MAX_RUN_BLOCKS: u64 = 64;

impl FsInner {
    /// `read(2)` on a regular file; with `touch`, then its access time as the mount's mode
    /// says (inode/atime.rs), as `filemap_read` ends with `file_accessed`.
    pub(crate) fn read(&self, inode: &Inode, offset: u64, buf: &mut [u8], touch: bool) -> Result<usize> {
        let (n, facts) = {
            // Writers change the map under this lock exclusively (and fill new blocks first).
            let _d = inode.data_sem.read();
            // A read of no bytes touches nothing (`filemap_read`).
            let (flags, size, facts) = self.read_facts(inode, touch && !buf.is_empty())?;
            let n = if flags & ENCRYPT_FL != 0 {
                self.read_encrypted(inode, size, offset, buf)?
            } else if buf.len() >= DIRECT_READ || !self.pcache.enabled() || flags & INLINE_DATA_FL != 0 {
                if buf.len() >= DIRECT_READ {
                    self.pcache.stats.direct.fetch_add(1, Relaxed);
                }
                self.read_data(inode, offset, buf)?
            } else {
                self.read_cached(inode, size, offset, buf)?
            };
            // Delayed writes are in memory only: their pages cover the holes just read.
            self.overlay_dirty(inode, offset, &mut buf[..n]);
            (n, facts)
        };
        // With `data_sem` let go: an update starts a handle, which must come before it.
        if let Some(facts) = facts {
            self.touch_atime(inode, &facts);
        }
        Ok(n)
    }

    /// What a read of `inode` takes from its record, once, under the caller's `data_sem`: its
    /// flags and size, and with `touch` (where the mount's mode may set an access time) the
    /// times the access-time check needs. Every lock taken on a hot read is a cache line the
    /// readers of a file pass between cores. Anything but a regular file is refused.
    fn read_facts(&self, inode: &Inode, touch: bool) -> Result<(u32, u64, Option<AtimeFacts>)> {
        let touch = touch && self.atime_may_change();
        let (file_type, flags, size, facts) = inode.with_disk(|d| {
            (d.file_type(), d.flags(), d.size(), touch.then(|| AtimeFacts::of(d, self.sbi.inode_size)))
        });
        match file_type {
            S_IFREG => Ok((flags, size, facts)),
            S_IFDIR => Err(Error::IsDir),
            _ => Err(Error::InvalidInput("not a regular file")),
        }
    }

    /// Where the `len` bytes of `inode` from `offset` lie in the host file under the image,
    /// handed to `f` while no writer can change them (`data_sem` held): for a caller that moves
    /// them on without reading them (a FUSE reply spliced from the image), as a large
    /// [`FsInner::read`] would read them from the device. `None`, and `f` not called, where a
    /// read would take anything else: a short read (the page cache serves those), a hole or
    /// unwritten extent (zeros), delayed writes (pages in memory), inline data, an encrypted
    /// file, a device that is no host file. At or past the end, `f` gets no ranges. Sets the
    /// access time as `read` does, once `f` has run.
    pub(crate) fn read_in_place<R>(
        &self,
        inode: &Inode,
        offset: u64,
        len: usize,
        touch: bool,
        f: impl FnOnce(&[HostRange<'_>]) -> R,
    ) -> Result<Option<R>> {
        if !may_read_in_place(len) {
            return Ok(None);
        }
        let (r, facts) = {
            let _d = inode.data_sem.read();
            let (flags, size, facts) = self.read_facts(inode, touch)?;
            if flags & (ENCRYPT_FL | INLINE_DATA_FL) != 0 || inode.dirty_pages.load(Acquire) != 0 {
                return Ok(None);
            }
            let total = u64::try_from(len).unwrap_or(u64::MAX).min(size.saturating_sub(offset));
            let bs = u64::from(self.sbi.block_size);
            let mut ranges: Vec<HostRange<'_>> = Vec::new();
            let mut done = 0u64;
            while done < total {
                let pos = offset + done;
                let Ok(lblk) = u32::try_from(pos / bs) else {
                    return Ok(None);
                };
                let in_block = pos % bs;
                let Mapping::Mapped { pblk, len: run, unwritten: false } = self.map_block(inode, lblk)?
                else {
                    return Ok(None);
                };
                // A mapping covers at least the block asked for; anything else is not spliced.
                let Some(avail) =
                    run.checked_mul(bs).and_then(|b| b.checked_sub(in_block)).filter(|&a| a > 0)
                else {
                    return Ok(None);
                };
                let n = (total - done).min(avail);
                let Some((fd, at)) = pblk.checked_mul(bs).and_then(|b| self.dev.host_range(b + in_block, n))
                else {
                    return Ok(None);
                };
                match ranges.last_mut() {
                    Some(last)
                        if last.fd.as_raw_fd() == fd.as_raw_fd() && last.offset + last.len as u64 == at =>
                    {
                        last.len += usize_from(n);
                    }
                    _ => ranges.push(HostRange { fd, offset: at, len: usize_from(n) }),
                }
                done += n;
            }
            self.pcache.stats.spliced.fetch_add(1, Relaxed);
            (f(&ranges), facts)
        };
        if let Some(facts) = facts {
            self.touch_atime(inode, &facts);
        }
        Ok(Some(r))
    }

    /// A read through the page cache: copies from the pages it finds; a miss reads the run of
    /// blocks from there to the end of the request (and further when it follows the last miss:
    /// readahead) in one device read and caches it. The caller holds `data_sem` shared, under
    /// which it read the file's `size`.
    fn read_cached(&self, inode: &Inode, size: u64, offset: u64, buf: &mut [u8]) -> Result<usize> {
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let total = buf.len().min(usize::try_from(size - offset).unwrap_or(usize::MAX));
        let bs = u64::from(self.sbi.block_size);
        let bsz = usize_from(bs);
        let gen = inode.pages_gen.load(Acquire);
        let ino = inode.ino.0;
        let last_blk = (size - 1) / bs;
        let mut done = 0usize;
        while done < total {
            let pos = offset + done as u64;
            let in_block = usize_from(pos % bs);
            let Ok(lblk) = u32::try_from(pos / bs) else {
                buf[done..total].fill(0);
                break;
            };
            let n = self.pcache.copy(ino, lblk, gen, in_block, &mut buf[done..total]);
            if n > 0 {
                done += n;
                continue;
            }
            // A miss: the blocks up to the end of the request, or a readahead window past it
            // when this miss follows the last one.
            let want_end = (offset + total as u64 - 1) / bs;
            let sequential = inode.ra_next.load(Relaxed) == lblk;
            let mut end =
                if sequential { want_end.max(u64::from(lblk) + READAHEAD_BLOCKS) } else { want_end };
            end = end.min(last_blk).min(u64::from(lblk) + MAX_RUN_BLOCKS - 1).min(u64::from(u32::MAX));
            let (len, pblk) = self.map_for_read(inode, lblk)?;
            let n_blocks = (end - u64::from(lblk) + 1).min(len.max(1));
            // Cannot overflow: at most MAX_RUN_BLOCKS.
            let nb = usize_from(n_blocks);
            // Cannot fail: `end` is at most u32::MAX.
            let run_end = u32::try_from(u64::from(lblk) + n_blocks - 1).unwrap_or(u32::MAX);
            let loads: Vec<_> = (lblk..=run_end).map(|b| self.pcache.begin_load(ino, b)).collect();
            let mut run = vec![0u8; nb * bsz];
            let res = match pblk {
                None => Ok(()),
                Some(p) => self.dev.read_at(&mut run, p * bs).map_err(Error::from),
            };
            // After an error: unregistered, nothing cached.
            self.pcache.end_loads(loads, gen, if res.is_ok() { &run } else { &[] });
            res?;
            let avail = nb * bsz - in_block;
            let n = (total - done).min(avail);
            buf[done..done + n].copy_from_slice(&run[in_block..in_block + n]);
            done += n;
            let stats = &self.pcache.stats;
            stats.misses.fetch_add(1, Relaxed);
            if sequential {
                stats.readahead.fetch_add(1, Relaxed);
            }
            inode.ra_next.store(run_end.saturating_add(1), Relaxed);
        }
        Ok(total)
    }

    /// Reads the data of any block- or extent-mapped or inline inode, up to its size.
    pub(crate) fn read_data(&self, inode: &Inode, offset: u64, buf: &mut [u8]) -> Result<usize> {
        if self.has_inline_data(inode) {
            return self.read_inline(inode, offset, buf);
        }
        let size = inode.size();
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let total = buf.len().min(usize::try_from(size - offset).unwrap_or(usize::MAX));
        let bs = u64::from(self.sbi.block_size);
        let mut done = 0usize;
        while done < total {
            let pos = offset + done as u64;
            let Ok(lblk) = u32::try_from(pos / bs) else {
                // Past the last addressable block: nothing is stored there.
                buf[done..total].fill(0);
                break;
            };
            let in_block = pos % bs;
            let (len, pblk) = self.map_for_read(inode, lblk)?;
            let avail = len.saturating_mul(bs) - in_block;
            let n = (total - done).min(usize::try_from(avail).unwrap_or(usize::MAX));
            let dst = &mut buf[done..done + n];
            match pblk {
                None => dst.fill(0),
                Some(p) => self.dev.read_at(dst, p * bs + in_block)?,
            }
            done += n;
        }
        Ok(total)
    }

    /// The blocks from `lblk` that read alike: `len` of them, stored from the physical block
    /// given, or reading as zeros (a hole or unwritten extent) where none is.
    pub(crate) fn map_for_read(&self, inode: &Inode, lblk: u32) -> Result<(u64, Option<u64>)> {
        Ok(match self.map_block(inode, lblk)? {
            Mapping::Hole { len } | Mapping::Mapped { len, unwritten: true, .. } => (len, None),
            Mapping::Mapped { pblk, len, unwritten: false } => (len, Some(pblk)),
        })
    }

    /// Whether `inode` is a symlink whose target is stored in `i_block`.
    pub(crate) fn is_fast_symlink(&self, inode: &Inode) -> bool {
        let d = inode.disk();
        if d.file_type() != S_IFLNK || self.has_inline_data(inode) {
            return false;
        }
        if d.flags() & rext4_format::inode::EA_INODE_FL != 0 {
            return d.size() > 0 && d.size() < 60;
        }
        let ea_blocks = if d.file_acl() != 0 { self.meta_sectors() } else { 0 };
        d.blocks_512(self.sbi.huge_file, self.sbi.block_size).saturating_sub(ea_blocks) == 0
    }
}
