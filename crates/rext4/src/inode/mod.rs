//! Inodes (the kernel's `inode.c`, `ioctl.c`, `orphan.c`): the in-memory inode and the inode
//! cache, record writes, inode flags, references (`hold`/`release`), eviction and orphans.
//!
//! | module | owns |
//! |---|---|
//! | this file | `Inode`, `iget`, inode-table locations, record checks |
//! | `write` | record writes, `setattr`, `fsync`, the typed record helpers |
//! | `flags` | `chattr` flags (`ext4_fileattr_set`) |
//! | `atime` | access times on reads (`touch_atime`, relatime) |
//! | `orphan` | orphan file and list records, references, eviction, recovery |
//!
//! # Locking
//! journal handle -> `Inode::raw` (write) -> inode-table `Buffer::data` (write); `op_lock`
//! outside the handle for namespace changes. See docs/locking.md.
//!
//! ## This module
//! In-memory inodes and the inode cache (the read side of the kernel's `inode.c`:
//! `__ext4_get_inode_loc`, `ext4_iget`).

pub(crate) mod atime;
pub(crate) mod flags;
pub(crate) mod orphan;
pub(crate) mod write;

use crate::attr::{Attr, FileType};
use crate::cache::{CacheMark, Cached, Evict};
use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::FsInner;
use crate::sync::RwLock;
use rext4_format::checksum::inode_csum_seed;
use rext4_format::group_desc::BG_INODE_UNINIT;
use rext4_format::inode::{self as fi, verify_inode_checksum, GOOD_OLD_INODE_SIZE};
use rext4_format::InodeNo;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// The hold count in `Inode::refs`.
pub(crate) const REF_COUNT: u32 = (1 << 30) - 1;
/// The last link went while references were held: the last release frees the inode.
pub(crate) const REF_UNLINKED: u32 = 1 << 30;
/// Freed (or being freed): no new references.
pub(crate) const REF_DEAD: u32 = 1 << 31;

/// `Inode::orphan`: no record.
pub(in crate::inode) const ORPHAN_NONE: u32 = 0;
/// `Inode::orphan`: on the superblock's list. (Other values: orphan-file slot plus one.)
pub(in crate::inode) const ORPHAN_LIST: u32 = u32::MAX;
/// An inode as the engine holds it.
///
/// Laid out by hand (`repr(C)`) for lookups: the allocation starts on a cache line (the
/// `Arc`'s counts, then these fields), and a `stat` reads the counts, `mark`, `ino`, `refs`,
/// the lock word and the record's bytes 0x00-0x34 and 0x64-0x98, which this order keeps in the
/// first four lines (`stat_reads_four_lines` checks it). Ordered by the compiler, the small
/// fields went after the 256-byte record: five lines a lookup.
#[repr(C)]
pub(crate) struct Inode {
    /// The inode cache's marks. [atomic]
    mark: CacheMark,
    /// Whether `last_tid` is meaningful. [atomic]
    pub dirtied: AtomicBool,
    /// Data was overwritten in place since the last `fsync` without a metadata change (so no
    /// commit will flush it): `fsync` must flush the device. [atomic]
    pub data_dirty: AtomicBool,
    /// A file made by `Fs::tmpfile` that has had no name yet: `link` may give it its first
    /// (the kernel's `I_LINKABLE`). [atomic; set before the inode is published, cleared by
    /// `link` under `op_lock` or when the inode is freed]
    pub linkable: AtomicBool,
    /// Made by `FsInner::new_inode` and not yet written: its first record write charges its
    /// quotas whole (quota/mod.rs). [atomic]
    pub quota_new: AtomicBool,
    pub ino: InodeNo,
    /// References taken by `Fs::hold`, plus the `REF_UNLINKED` / `REF_DEAD` bits (see
    /// inode/orphan.rs for the state machine). [atomic]
    pub refs: AtomicU32,
    /// Where this inode's orphan record is: `ORPHAN_NONE`, `ORPHAN_LIST`, or a slot of the
    /// orphan file plus one (see inode/orphan.rs). [atomic; changed by the holder of `op_lock`]
    pub orphan: AtomicU32,
    /// The on-disk record (`inode_size` bytes). [own lock]
    raw: RwLock<RawRecord>,
    /// Seed of this inode's metadata checksums (fixed: the generation never changes while
    /// cached). [immutable]
    pub csum_seed: u32,
    /// Transaction that last changed this inode's metadata (what `fsync` must wait for).
    /// [atomic]
    pub last_tid: std::sync::atomic::AtomicU32,
    /// Serialises namespace operations on this inode (the kernel's `i_rwsem`); taken before
    /// a journal handle is started, parent before child. [own lock]
    pub op_lock: crate::sync::Mutex<()>,
    /// Bumped before and after a name is removed from this directory (odd while it is), so
    /// that a lookup racing with the removal does not cache the old name (see cache/dcache.rs).
    /// [atomic]
    pub names_gen: std::sync::atomic::AtomicU64,
    /// Guards a regular file's block map against readers while it is edited (the kernel's
    /// `i_data_sem`): reads hold it shared across mapping and reading the data; writes,
    /// truncates and fallocate hold it exclusive while changing the map and writing newly
    /// mapped blocks. Taken after a journal handle, before `raw`. [own lock]
    pub data_sem: RwLock<()>,
    /// For a directory: the inode number after the last one given to a new file in it (0:
    /// none yet), where the next is sought first (see `FsInner::alloc_inode`). A hint, read
    /// and moved by creates, which this directory's `op_lock` serialises. [atomic]
    pub child_goal: AtomicU32,
    /// Generation of this file's pages in the page cache (see cache/page.rs): moved on, under
    /// `data_sem` held exclusive, when the map changes in a way no write describes. [atomic]
    pub pages_gen: std::sync::atomic::AtomicU64,
    /// The block after the last one a read missed in the page cache: a miss there is
    /// sequential and reads ahead. [atomic; a hint]
    pub ra_next: AtomicU32,
    /// Blocks set aside for this file's next appends (alloc/prealloc.rs); only while it is
    /// held open. [own mutex; taken before a group's bitmap lock]
    pub prealloc: crate::sync::Mutex<Option<crate::alloc::prealloc::Prealloc>>,
    /// Delayed-allocation pages and record changes not yet written back
    /// (data/delalloc.rs). [own mutex; a leaf, taken after `data_sem` and `raw`]
    pub dirty: crate::sync::Mutex<crate::data::delalloc::DirtyPages>,
    /// How many pages `dirty` holds (readers skip its mutex while 0). [atomic; changed by the
    /// holder of `op_lock`]
    pub dirty_pages: std::sync::atomic::AtomicU64,
    /// Listed in `Writeback`'s set of files to write back. [atomic]
    pub wb_listed: AtomicBool,
    /// Whether `quota_claims` holds anything (read without its lock on every record write).
    /// [atomic; set under `quota_claims`]
    pub quota_claimed: AtomicBool,
    /// Changes admitted against quota limits and not charged yet, until the next record write
    /// charges them or the change fails (quota/limits.rs). [own lock, before the pending
    /// tables' shards; changed by the holder of the record's lock, or by the maker of a new
    /// inode]
    pub quota_claims: crate::sync::Mutex<Vec<crate::quota::limits::Claim>>,
    /// An encrypted inode's context and keys (crypto/mod.rs), from its first use on; derived
    /// again when a key comes or goes (crypto/mod.rs, invariant 3). [atomic swap; never set
    /// back to `None`]
    pub crypt: arc_swap::ArcSwapOption<crate::crypto::InodeCrypt>,
}

impl Cached for Inode {
    fn mark(&self) -> &CacheMark {
        &self.mark
    }
    /// An orphan (unlinked while held, or recorded for a truncate) lives only in memory until
    /// it is freed; a held inode that still has its links parks its hold count. What else is
    /// only in memory (the transaction of the last change, overwrites not yet flushed) is
    /// assumed at the next load instead (see `FsInner::read_inode`).
    fn evict(&self) -> Evict {
        let s = self.refs.load(Ordering::Acquire);
        if s & REF_UNLINKED != 0 && s & REF_DEAD == 0 || self.orphan.load(Ordering::Acquire) != ORPHAN_NONE {
            return Evict::Keep;
        }
        // A reserve of blocks is known only here: kept until its file is released.
        if self.prealloc.try_lock().is_none_or(|p| p.is_some()) {
            return Evict::Keep;
        }
        let holds = s & REF_COUNT;
        if s & REF_DEAD != 0 || holds == 0 {
            Evict::Drop
        } else {
            Evict::Park(holds)
        }
    }

    fn unpark(&self, holds: u32) {
        self.refs.store(holds, Ordering::Release);
    }
}

/// Record bytes kept inside the inode (the default inode size), so that a stat reads the
/// record's lines right after the inode's own rather than behind one more pointer.
pub(crate) type RawRecord = crate::data::inline_bytes::InlineBytes<256>;

impl Inode {
    /// An inode over record `raw` (read from disk, or just allocated and not yet written).
    pub(crate) fn new_in_memory(ino: InodeNo, raw: RawRecord, csum_seed: u32) -> Self {
        Inode {
            ino,
            raw: RwLock::new(raw),
            csum_seed,
            mark: CacheMark::new(),
            last_tid: std::sync::atomic::AtomicU32::new(0),
            dirtied: AtomicBool::new(false),
            op_lock: crate::sync::Mutex::new(()),
            names_gen: std::sync::atomic::AtomicU64::new(0),
            data_sem: RwLock::new(()),
            data_dirty: AtomicBool::new(false),
            linkable: AtomicBool::new(false),
            quota_new: AtomicBool::new(false),
            quota_claimed: AtomicBool::new(false),
            quota_claims: crate::sync::Mutex::new(Vec::new()),
            refs: AtomicU32::new(0),
            orphan: AtomicU32::new(ORPHAN_NONE),
            child_goal: AtomicU32::new(0),
            pages_gen: std::sync::atomic::AtomicU64::new(crate::cache::page::next_gen()),
            ra_next: AtomicU32::new(u32::MAX),
            prealloc: crate::sync::Mutex::new(None),
            dirty: crate::sync::Mutex::default(),
            dirty_pages: std::sync::atomic::AtomicU64::new(0),
            wb_listed: AtomicBool::new(false),
            crypt: arc_swap::ArcSwapOption::empty(),
        }
    }

    /// Whether someone holds the inode open.
    pub(crate) fn is_held(&self) -> bool {
        self.refs.load(Ordering::Acquire) & REF_COUNT != 0
    }

    /// Drops every cached page of this file (the caller holds `data_sem` exclusive and has
    /// changed the map).
    pub(crate) fn invalidate_pages(&self) {
        self.pages_gen.store(crate::cache::page::next_gen(), Ordering::Release);
    }

    /// A decoded copy of the base and extra fields.
    pub(crate) fn disk(&self) -> fi::Inode {
        // Cannot fail: records are at least 128 bytes (checked at open).
        fi::Inode::parse(&self.raw.read()).unwrap()
    }

    /// The raw record bytes (for the in-inode xattr area).
    pub(crate) fn raw(&self) -> crate::sync::RwLockReadGuard<'_, RawRecord> {
        self.raw.read()
    }

    /// The record for changing (under a journal handle; see `inode/write.rs`).
    pub(crate) fn raw_mut(&self) -> crate::sync::RwLockWriteGuard<'_, RawRecord> {
        self.raw.write()
    }

    /// Runs `f` on the decoded record under the record's read lock: in place when the record
    /// holds the whole structure, on a copy otherwise. `f` must only read fields (it must not
    /// lock this inode again).
    pub(crate) fn with_disk<R>(&self, f: impl FnOnce(&fi::Inode) -> R) -> R {
        let raw = self.raw.read();
        match fi::Inode::view(&raw) {
            Some(d) => f(d),
            // Cannot fail: records are at least 128 bytes (checked at open).
            None => f(&fi::Inode::parse(&raw).unwrap()),
        }
    }

    pub(crate) fn file_type(&self) -> Option<FileType> {
        self.with_disk(|d| FileType::from_mode(d.mode()))
    }

    pub(crate) fn flags(&self) -> u32 {
        self.with_disk(|d| d.flags())
    }

    pub(crate) fn size(&self) -> u64 {
        self.with_disk(|d| d.size())
    }

    pub(crate) fn is_dir(&self) -> bool {
        self.with_disk(|d| d.file_type() == fi::S_IFDIR)
    }
}

impl FsInner {
    /// Whether an inode may have number `ino` (1 to `s_inodes_count`).
    pub(crate) fn ino_in_range(&self, ino: InodeNo) -> bool {
        ino.0 != 0 && ino.0 <= self.sbi.inodes_count
    }

    /// The inode `ino`, from the cache or the inode table.
    pub(crate) fn iget(&self, ino: InodeNo) -> Result<Arc<Inode>> {
        if !self.ino_in_range(ino) {
            return corrupt(CorruptKind::Inode { ino, what: "inode number out of range" });
        }
        self.icache.get_or_load(u64::from(ino.0), || self.read_inode(ino))
    }

    fn read_inode(&self, ino: InodeNo) -> Result<Inode> {
        let sbi = &self.sbi;
        let group = (ino.0 - 1) / sbi.inodes_per_group;
        let index = (ino.0 - 1) % sbi.inodes_per_group;
        let size = sbi.inode_size;
        // The live flags and mark, not the descriptor as read at open: allocation moves them.
        let st = &self.groups.state[group as usize];
        let flags = st.flags.load(Ordering::Acquire);
        let unused = st.itable_unused.load(Ordering::Acquire);
        let uninit = (sbi.metadata_csum || sbi.gdt_csum)
            && (flags & u32::from(BG_INODE_UNINIT) != 0
                || index >= sbi.inodes_per_group - unused.min(sbi.inodes_per_group));
        let raw = if uninit {
            // Never initialised on disk: reads as a free, zeroed inode.
            RawRecord::zeroed(size)
        } else {
            let (blk, off) = self.inode_location(ino);
            let buf = self.bread(blk, Some(ino))?;
            let data = buf.data();
            RawRecord::new(&data[off..off + size])
        };
        self.check_inode(ino, &raw)?;
        let generation = crate::inode::write::rec_ref(&raw).generation();
        let inode = Inode::new_in_memory(ino, raw, inode_csum_seed(sbi.csum_seed, ino.0, generation));
        // An earlier copy may have been evicted with a change not yet committed or an
        // overwrite not yet flushed; as the kernel's `ext4_iget`, assume the newest transaction
        // touched it, so an `fsync` of the new copy waits for that commit and flushes.
        if let Some(j) = self.journal.as_ref() {
            inode.last_tid.store(j.newest_tid(), Ordering::Release);
            inode.dirtied.store(true, Ordering::Release);
            inode.data_dirty.store(true, Ordering::Release);
        }
        Ok(inode)
    }

    /// The inode-table block holding `ino` and the record's byte offset in it.
    pub(crate) fn inode_location(&self, ino: InodeNo) -> (u64, usize) {
        let sbi = &self.sbi;
        let group = (ino.0 - 1) / sbi.inodes_per_group;
        let index = (ino.0 - 1) % sbi.inodes_per_group;
        let byte = u64::from(index) * sbi.inode_size as u64;
        let table = self.groups.get(group).inode_table(sbi.desc_size);
        (table + byte / u64::from(sbi.block_size), crate::num::usize_from(byte % u64::from(sbi.block_size)))
    }

    fn check_inode(&self, ino: InodeNo, raw: &[u8]) -> Result<()> {
        let sbi = &self.sbi;
        if raw.iter().all(|&b| b == 0) {
            return Ok(());
        }
        if sbi.inode_size > GOOD_OLD_INODE_SIZE {
            let extra = usize::from(crate::inode::write::rec_ref(raw).extra_isize());
            if extra > sbi.inode_size - GOOD_OLD_INODE_SIZE || extra % 4 != 0 {
                return corrupt(CorruptKind::Inode { ino, what: "bad i_extra_isize" });
            }
        }
        if sbi.metadata_csum {
            let generation = crate::inode::write::rec_ref(raw).generation();
            let seed = inode_csum_seed(sbi.csum_seed, ino.0, generation);
            if !verify_inode_checksum(raw, seed) {
                return corrupt(CorruptKind::InodeChecksum { ino });
            }
        }
        Ok(())
    }

    /// The inode `ino`, which must be in use: linked (what a directory entry may point at), or
    /// an orphan someone still holds (see inode/orphan.rs).
    pub(crate) fn iget_live(&self, ino: InodeNo) -> Result<Arc<Inode>> {
        let inode = self.iget(ino)?;
        self.check_live(&inode)?;
        Ok(inode)
    }

    /// The inode `ino` as a caller names it by number (an open file, a FUSE node, a file
    /// handle): `ESTALE` if no inode of that number is in use, as the kernel's `ext4_iget` for
    /// a file handle answers. A directory entry naming a free inode is corruption instead
    /// (`iget_live`).
    pub(crate) fn iget_by_number(&self, ino: InodeNo) -> Result<Arc<Inode>> {
        if !self.ino_in_range(ino) {
            return Err(Error::Stale);
        }
        let inode = self.iget(ino)?;
        // The root and the reserved inodes are never freed: one without links is corrupt.
        self.check_in_use(&inode, ino.0 >= self.sbi.sb.first_ino())?;
        Ok(inode)
    }

    /// Whether `inode` is in use (see `iget_live`).
    pub(crate) fn check_live(&self, inode: &Inode) -> Result<()> {
        self.check_in_use(inode, false)
    }

    /// `check_live`, where a freed inode is `ESTALE` if `freed_is_stale`, else corruption.
    /// The record is read once: an unlink may end between two readings.
    fn check_in_use(&self, inode: &Inode, freed_is_stale: bool) -> Result<()> {
        let (links, kind) = inode.with_disk(|d| (d.links_count(), FileType::from_mode(d.mode())));
        let ino = inode.ino;
        if links == 0 && !inode.is_held_orphan() && !inode.linkable.load(Ordering::Acquire) {
            if freed_is_stale {
                return Err(Error::Stale);
            }
            return corrupt(CorruptKind::Inode { ino, what: "deleted inode referenced" });
        }
        if kind.is_none() {
            return corrupt(CorruptKind::Inode { ino, what: "invalid file type" });
        }
        Ok(())
    }

    /// `st_blocks`: the on-disk count, plus, for regular files with inline data, the sectors
    /// their bytes would take, as the kernel reports so that tools do not take them for holes.
    fn stat_blocks(&self, d: &fi::Inode, kind: FileType) -> u64 {
        let n = d.blocks_512(self.sbi.huge_file, self.sbi.block_size);
        if kind == FileType::RegularFile && d.flags() & fi::INLINE_DATA_FL != 0 {
            n + d.size().saturating_add(511) / 512
        } else {
            n
        }
    }

    /// `stat(2)` of an inode.
    pub(crate) fn attr_of(&self, inode: &Inode) -> Result<Attr> {
        let mut a = inode.with_disk(|d| self.attr_from(inode.ino, d))?;
        // Blocks reserved for delayed writes count, as in the kernel's `ext4_getattr`, so
        // that a file just written does not look sparse.
        a.blocks += self.delalloc_blocks(inode) * u64::from(self.sbi.block_size / 512);
        // An encrypted symlink's size is its target's as shown, decrypted or as a no-key
        // name (`fscrypt_symlink_getattr`), not the stored ciphertext's.
        if a.kind == FileType::Symlink && inode.flags() & fi::ENCRYPT_FL != 0 {
            a.size = self.readlink(inode)?.len() as u64;
        }
        Ok(a)
    }

    fn attr_from(&self, ino: InodeNo, d: &fi::Inode) -> Result<Attr> {
        let sz = self.sbi.inode_size;
        let kind = FileType::from_mode(d.mode()).ok_or(Error::Corrupt(crate::error::Corrupt(
            CorruptKind::Inode { ino, what: "invalid file type" },
        )))?;
        let rdev = match kind {
            FileType::CharDevice | FileType::BlockDevice => d.device(),
            _ => (0, 0),
        };
        Ok(Attr {
            ino,
            kind,
            mode: d.mode(),
            nlink: u32::from(d.links_count()),
            uid: d.uid(),
            gid: d.gid(),
            size: d.size(),
            blocks: self.stat_blocks(d, kind),
            atime: d.atime(sz),
            mtime: d.mtime(sz),
            ctime: d.ctime(sz),
            crtime: d.crtime(sz),
            rdev,
            blksize: self.sbi.block_size,
            flags: d.flags(),
            generation: d.generation(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// The layout `Inode`'s comment promises: with the `Arc`'s two counts in front and the
    /// allocation on a line boundary (mimalloc's size classes for inodes are multiples of 64
    /// bytes), what a stat reads lies in the first four 64-byte lines.
    #[test]
    fn stat_reads_four_lines() {
        let arc = 2 * std::mem::size_of::<usize>();
        let line = |at: usize| (arc + at) / 64;
        let inode = Inode::new_in_memory(InodeNo(12), RawRecord::zeroed(256), 0);
        let bytes = {
            let r = inode.raw();
            r.as_ptr() as usize - &inode as *const Inode as usize
        };
        for small in [offset_of!(Inode, mark), offset_of!(Inode, ino), offset_of!(Inode, refs)] {
            assert_eq!(line(small), 0);
        }
        assert_eq!(line(offset_of!(Inode, raw)), 0, "the lock word");
        // Mode, uid, size, times, gid, links, blocks, flags; then generation, the high
        // halves, the extra size and the extra times up to crtime_extra.
        assert!(line(bytes + 0x34 - 1) <= 1, "record bytes at {bytes}");
        assert_eq!(line(bytes + 0x64), 2, "record bytes at {bytes}");
        assert_eq!(line(bytes + 0x98 - 1), 3, "record bytes at {bytes}");
    }
}
