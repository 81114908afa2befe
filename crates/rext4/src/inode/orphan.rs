//! Orphans (the kernel's `orphan.c`; docs/design.md, Orphans): inodes whose last link is gone
//! while they are still in use, or that are being truncated over several transactions,
//! recorded on disk so that a crash cannot leak them; a writable open frees or truncates
//! whatever is recorded.
//!
//! # References
//! `Inode::refs` counts [`Fs::hold`]s in its low 30 bits; two more bits make it a small state
//! machine, changed only by compare-and-swap:
//! - removing the last link (under the inode's `op_lock`) of an inode nobody holds sets
//!   `REF_DEAD` and frees the inode in the same handle; with references it sets
//!   `REF_UNLINKED`, leaves the inode with no links and records it as an orphan;
//! - `hold` fails (`ENOENT`) once `REF_DEAD` is set, and on an inode without links that is
//!   not an unlinked orphan;
//! - the release that drops the last reference of a `REF_UNLINKED` inode sets `REF_DEAD` and
//!   frees it in one handle (under `op_lock`, so it waits for the unlink that orphaned it);
//! - `Fs::tmpfile` makes an inode in that state from the start (held once, no links, an
//!   orphan record) and marks it `linkable`; `link` may then give it a first name, clearing
//!   `REF_UNLINKED` by compare-and-swap before the name is added (a release meanwhile then
//!   only drops its count) and removing the record in the same handle.
//!
//! An inode that lost its last link while held, or that has an orphan record, stays in the
//! inode cache (`Evict::Keep`): that state exists only there. A held inode that still has links
//! may be evicted: the cache parks its hold count and gives it back to the next copy it loads
//! (`Evict::Park`), so a FUSE mount's lookups do not pin every inode the kernel knows.
//!
//! # Records
//! With `orphan_file`, an orphan's number goes in a free slot of the orphan file. Slots live in
//! memory as atomics: a thread takes a block by decrementing its free count if positive
//! (starting at a block that depends on the thread, so threads spread out), then claims a slot
//! in it with a compare-and-swap from 0. No lock is taken: the block only joins the handle's
//! transaction, and the commit's freeze hook writes the slots and the block checksum into the
//! frozen copy. When every block is full, or without the feature, the orphan goes
//! on the classic list: `s_last_orphan` in the superblock is the head and each orphan's
//! `i_dtime` the next number; the list is changed under `Orphans::list`, and the head, too, is
//! written into the superblock when the commit freezes it.
//!
//! As in the kernel, only journaled filesystems keep records: without a journal an unlinked
//! inode is freed at its last release and a crash leaves it to e2fsck.
//!
//! # Locking
//! inode `op_lock` (the caller's) -> journal handle -> `Orphans::list` -> `Inode::raw` (the
//! orphan's, or its predecessor's on the list) -> inode-table buffer. `orphan_add` and
//! `orphan_del` must be called without any inode record lock held; orphan-file slots take no
//! lock at all.

use crate::cache::buffer::Buffer;
use crate::error::{corrupt, Corrupt, CorruptKind, Error, Result};
use crate::fs::{Fs, FsInner};
use crate::inode::write::rec;
use crate::inode::Inode;
use crate::inode::{ORPHAN_LIST, ORPHAN_NONE, REF_COUNT, REF_DEAD, REF_UNLINKED};
use crate::jbd2::transaction::Handle;
use crate::map::Mapping;
use crate::sync::Mutex;
use rext4_format::features::Compat;
use rext4_format::inode::{EXTENTS_FL, HUGE_FILE_FL, INLINE_DATA_FL};
use rext4_format::orphan as fo;
use rext4_format::superblock::STATE_ERROR;
use rext4_format::{InodeNo, PhysBlock};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

/// Credits to free an orphan: its bitmaps and descriptors in a few groups, tree blocks, the
/// inode-table blocks of it and its list neighbour, the orphan block, the superblock.
const EVICT_CREDITS: u32 = 32;

/// One block of the orphan file.
struct OrphanBlock {
    /// Its buffer, pinned for as long as the filesystem is open. [immutable]
    buf: Arc<Buffer>,
    /// Free slots (what may still be claimed; a claimer decrements first). [atomic]
    free: AtomicI32,
    /// The inode numbers in the block (0: free); the on-disk block is written from these at
    /// commit. [atomic; a slot is claimed by compare-and-swap from 0]
    slots: Box<[AtomicU32]>,
}

/// The orphan file, as loaded at a writable open (`ext4_init_orphan_info`).
struct OrphanFile {
    ino: InodeNo,
    blocks: Box<[OrphanBlock]>,
    /// (physical block, index in `blocks`), sorted: what the freeze hook looks up. [immutable]
    by_blk: Box<[(u64, usize)]>,
    /// The orphan file inode's checksum seed, which the block checksums use. [immutable]
    csum_seed: u32,
}

/// The in-memory doubly linked view of the on-disk list (the kernel's `s_orphan`), so that an
/// orphan in the middle can be unlinked from its predecessor.
#[derive(Default)]
struct ListLinks {
    next: HashMap<u32, u32>,
    /// 0: the orphan is the head.
    prev: HashMap<u32, u32>,
}

/// Orphan records of an open filesystem.
pub(crate) struct Orphans {
    /// Whether new orphans are recorded (writable and journaled). [immutable]
    active: bool,
    /// Whether orphan blocks carry checksums. [immutable]
    metadata_csum: bool,
    file: Option<OrphanFile>,
    /// The classic list (the kernel's `s_orphan_lock`: this list only). [own lock]
    list: Mutex<ListLinks>,
    /// `s_last_orphan`: written under `list`, copied into the superblock when a commit freezes
    /// it. [atomic]
    head: AtomicU32,
    /// Orphans freed and truncated by the recovery at open. [atomic]
    cleaned: (AtomicU32, AtomicU32),
}

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    /// A number per thread: where its search for a free orphan block starts.
    static THREAD_NO: usize = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

/// Decrements `c` if it is positive; returns whether it did (`atomic_dec_if_positive`).
fn dec_if_positive(c: &AtomicI32) -> bool {
    c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| (v > 0).then(|| v - 1)).is_ok()
}

impl Orphans {
    /// No records: a read-only filesystem.
    pub(crate) fn inactive() -> Orphans {
        Orphans {
            active: false,
            metadata_csum: false,
            file: None,
            list: Mutex::new(ListLinks::default()),
            head: AtomicU32::new(0),
            cleaned: (AtomicU32::new(0), AtomicU32::new(0)),
        }
    }

    /// Loads the orphan file (checking every block's magic and checksum, as the kernel does
    /// before it mounts read-write) and the list head, for a writable open. `journaled`: whether
    /// new orphans are recorded.
    pub(crate) fn load(fs: &FsInner, journaled: bool) -> Result<Orphans> {
        let file = if fs.sbi.sb.compat().contains(Compat::ORPHAN_FILE) { Some(load_file(fs)?) } else { None };
        Ok(Orphans {
            active: journaled,
            metadata_csum: fs.sbi.metadata_csum,
            file,
            list: Mutex::new(ListLinks::default()),
            head: AtomicU32::new(fs.sbi.sb.s_last_orphan.get()),
            cleaned: (AtomicU32::new(0), AtomicU32::new(0)),
        })
    }

    /// Inode numbers recorded as orphans at open: the orphan file's slots and the classic
    /// list, followed through `i_dtime` (at most `limit` entries: a corrupt list may loop).
    pub(crate) fn recorded(&self, fs: &FsInner, limit: usize) -> HashSet<u32> {
        let mut out: HashSet<u32> = HashSet::new();
        if let Some(f) = &self.file {
            for b in f.blocks.iter() {
                out.extend(b.slots.iter().map(|s| s.load(Ordering::Acquire)).filter(|&i| i != 0));
            }
        }
        let mut ino = self.head();
        while ino != 0 && out.len() < limit && out.insert(ino) {
            ino = match fs.iget(InodeNo(ino)) {
                Ok(i) => i.disk().dtime(),
                Err(_) => 0,
            };
        }
        out
    }

    /// The list head to store in the superblock.
    pub(crate) fn head(&self) -> u32 {
        self.head.load(Ordering::Acquire)
    }

    /// Whether nothing is recorded (the orphan file empty and the list too).
    pub(crate) fn is_empty(&self) -> bool {
        self.head() == 0
            && self.file.as_ref().is_none_or(|f| {
                f.blocks.iter().all(|b| usize::try_from(b.free.load(Ordering::Acquire)) == Ok(b.slots.len()))
            })
    }

    /// Whether `blk` is a block of the orphan file (completed by `freeze_block`).
    pub(crate) fn is_file_block(&self, blk: u64) -> bool {
        self.file.as_ref().is_some_and(|f| f.by_blk.binary_search_by_key(&blk, |e| e.0).is_ok())
    }

    /// The commit's hook for orphan-file blocks: writes the slots and the checksum into the
    /// frozen copy `data` of block `blk` (no-op for other blocks). No handle is open while it
    /// runs, so the slots are those of the transaction's end.
    pub(crate) fn freeze_block(&self, blk: u64, data: &mut [u8]) {
        let Some(f) = &self.file else { return };
        let Ok(k) = f.by_blk.binary_search_by_key(&blk, |e| e.0) else { return };
        let b = &f.blocks[f.by_blk[k].1];
        for (chunk, slot) in data.chunks_exact_mut(4).zip(b.slots.iter()) {
            chunk.copy_from_slice(&slot.load(Ordering::Acquire).to_le_bytes());
        }
        if self.metadata_csum {
            fo::set_tail(data, f.csum_seed, blk);
        }
    }
}

/// Maps and checks every block of the orphan file.
fn load_file(fs: &FsInner) -> Result<OrphanFile> {
    let ino = InodeNo(fs.sbi.sb.s_orphan_file_inum.get());
    let bad = |block: Option<u64>, what| {
        corrupt(CorruptKind::OrphanFile { ino, block: block.map(PhysBlock), what })
    };
    if ino.0 == 0 || ino.0 > fs.sbi.inodes_count {
        return bad(None, "orphan file inode out of range");
    }
    let inode = fs.iget(ino)?;
    let d = inode.disk();
    if d.links_count() == 0
        || d.file_type() != rext4_format::inode::S_IFREG
        || d.flags() & INLINE_DATA_FL != 0
    {
        return bad(None, "not a regular file with blocks");
    }
    let bs = u64::from(fs.sbi.block_size);
    let per = fo::inodes_per_block(fs.sbi.block_size as usize) as u64;
    // Slot numbers (block * slots per block + slot) are u32s.
    let Some(nblocks) =
        u32::try_from(d.size() / bs).ok().filter(|&n| u64::from(n) <= u64::from(u32::MAX) / per)
    else {
        return bad(None, "orphan file too large");
    };
    let mut blocks = Vec::with_capacity(nblocks as usize);
    let mut by_blk = Vec::with_capacity(nblocks as usize);
    for lblk in 0..nblocks {
        let pblk = match fs.map_block(&inode, lblk)? {
            Mapping::Mapped { pblk, unwritten: false, .. } => pblk,
            _ => return bad(None, "hole in the orphan file"),
        };
        let buf = fs.bread(pblk, Some(ino))?;
        let (slots, free) = {
            let data = buf.data();
            if fo::tail(&data).is_none_or(|t| t.ob_magic.get() != fo::ORPHAN_BLOCK_MAGIC) {
                return bad(Some(pblk), "bad orphan block magic");
            }
            if !fo::verify_block(&data, inode.csum_seed, pblk, fs.sbi.metadata_csum) {
                return corrupt(CorruptKind::OrphanFileChecksum { ino, block: PhysBlock(pblk) });
            }
            let per = fo::inodes_per_block(data.len());
            let slots: Box<[AtomicU32]> = data[..per * 4]
                .chunks_exact(4)
                .map(|c| AtomicU32::new(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect();
            let free: i32 = slots.iter().map(|s| i32::from(s.load(Ordering::Relaxed) == 0)).sum();
            (slots, free)
        };
        by_blk.push((pblk, blocks.len()));
        blocks.push(OrphanBlock { buf, free: AtomicI32::new(free), slots });
    }
    by_blk.sort_unstable();
    if by_blk.windows(2).any(|w| w[0].0 == w[1].0) {
        return bad(None, "a block mapped twice");
    }
    Ok(OrphanFile {
        ino,
        blocks: blocks.into_boxed_slice(),
        by_blk: by_blk.into_boxed_slice(),
        csum_seed: inode.csum_seed,
    })
}

/// The number of slot `j` of the orphan file's block `i`, of `per` slots each.
// Cannot truncate: `load` refuses a file with more slots than a u32 numbers.
#[allow(clippy::cast_possible_truncation)]
fn slot_index(i: usize, per: usize, j: usize) -> u32 {
    (i * per + j) as u32
}

impl OrphanFile {
    /// Claims a slot for `ino` (`ext4_orphan_file_add`); `None` when the file is full.
    fn claim(&self, h: &Handle, ino: InodeNo) -> Result<Option<u32>> {
        let n = self.blocks.len();
        if n == 0 {
            return Ok(None);
        }
        let start = THREAD_NO.with(|t| *t).wrapping_mul(13) % n;
        let Some(i) = (0..n).map(|k| (start + k) % n).find(|&i| dec_if_positive(&self.blocks[i].free)) else {
            return Ok(None);
        };
        let b = &self.blocks[i];
        if let Err(e) = h.join(&b.buf) {
            b.free.fetch_add(1, Ordering::AcqRel);
            return Err(e);
        }
        // The decrement reserved a free slot in this block; find it. Other claimers may take
        // the zeros seen first, so go round again, but not forever (a slot cleared and taken
        // again and again, or a block whose count lies): then the list takes the orphan.
        let per = b.slots.len();
        let mut j = 0;
        for _ in 0..4 * per {
            if b.slots[j].load(Ordering::Relaxed) == 0
                && b.slots[j].compare_exchange(0, ino.0, Ordering::AcqRel, Ordering::Relaxed).is_ok()
            {
                return Ok(Some(slot_index(i, per, j)));
            }
            j = (j + 1) % per;
        }
        b.free.fetch_add(1, Ordering::AcqRel);
        Ok(None)
    }

    /// Frees slot `idx` (`ext4_orphan_file_del`).
    fn unclaim(&self, h: &Handle, idx: u32) -> Result<()> {
        let per = self.blocks.first().map_or(1, |b| b.slots.len());
        let (i, j) = (idx as usize / per, idx as usize % per);
        let Some(b) = self.blocks.get(i) else {
            return corrupt(CorruptKind::OrphanFile {
                ino: self.ino,
                block: None,
                what: "slot out of range",
            });
        };
        h.join(&b.buf)?;
        b.slots[j].store(0, Ordering::Release);
        b.free.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}

impl Inode {
    /// Whether this inode lost its last link while held and is not freed yet.
    pub(crate) fn is_held_orphan(&self) -> bool {
        let s = self.refs.load(Ordering::Acquire);
        s & REF_UNLINKED != 0 && s & REF_DEAD == 0
    }
}

impl FsInner {
    /// Decides what removing the last link of `inode` does (the caller holds its `op_lock`
    /// and has a handle open): `false` — nobody holds it, free it now (and refuse new holds);
    /// `true` — it is held, keep it as an orphan until the last release.
    pub(crate) fn unlinked_while_held(&self, inode: &Inode) -> bool {
        let mut s = inode.refs.load(Ordering::Acquire);
        loop {
            let held = s & REF_COUNT != 0;
            let new = if held { s | REF_UNLINKED } else { REF_DEAD };
            match inode.refs.compare_exchange_weak(s, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return held,
                Err(x) => s = x,
            }
        }
    }

    /// Frees an inode whose last link is gone, in `h`: every block, the xattr block, the
    /// record and the inode bit (what the kernel's `ext4_evict_inode` does at the last `iput`).
    pub(crate) fn delete_inode(&self, h: &Handle, inode: &Inode) -> Result<()> {
        let is_dir = inode.is_dir();
        inode.linkable.store(false, Ordering::Release);
        // Delayed writes of a deleted file are never written (their blocks were never chosen).
        self.drop_dirty(inode);
        let owned = self.deletion_checks(h, inode)?;
        // Values in EA inodes first, while the record can still be read.
        self.ea_inodes_release_ibody(h, inode)?;
        self.free_all_blocks(h, inode, owned)?;
        let mut raw = inode.raw_mut();
        self.clear_freed_record(&mut raw);
        self.mark_inode_dirty(h, inode, &mut raw)?;
        self.quota_free_inode(h, inode, &raw)?;
        drop(raw);
        self.free_inode(h, inode.ino, is_dir)
    }

    /// [`FsInner::delete_inode`] for an inode whose last name went and that nobody holds, as
    /// the kernel's eviction: if the image turns out damaged (before anything is freed: see
    /// `free_all_blocks`), the inode is left allocated without links for e2fsck to free, and
    /// the damage is returned for the caller to record once its handle is done
    /// ([`FsInner::record_error`]); the operation that removed the name has succeeded.
    pub(crate) fn delete_or_leave(&self, h: &Handle, inode: &Inode) -> Result<Option<Corrupt>> {
        match self.delete_inode(h, inode) {
            Err(Error::Corrupt(c)) => {
                let mut raw = inode.raw_mut();
                crate::inode::write::raw_set_links(&mut raw, 0);
                self.mark_inode_dirty(h, inode, &mut raw)?;
                Ok(Some(c))
            }
            r => r.map(|()| None),
        }
    }

    /// Ends handle `h`, then records `damage` (from [`FsInner::delete_or_leave`]) as `op`'s.
    pub(crate) fn record_after(&self, h: Handle<'_>, op: crate::fs::stats::Op, damage: Option<Corrupt>) {
        drop(h);
        if let Some(c) = damage {
            self.record_error(op, &c);
        }
    }

    /// Frees an orphan that nobody holds any more, with its record, in one handle.
    pub(crate) fn evict(&self, inode: &Inode) -> Result<()> {
        // Waits for the unlink that orphaned it to finish.
        let _t = self.stats.time(crate::fs::stats::Op::Evict);
        let _l = self.stats.lock(crate::fs::stats::LockClass::OpLock, &inode.op_lock);
        let h = self.journal()?.start(EVICT_CREDITS)?;
        self.orphan_remove(&h, inode)?;
        let damage = self.delete_or_leave(&h, inode)?;
        self.record_after(h, crate::fs::stats::Op::Evict, damage);
        Ok(())
    }

    /// Records `inode` as an orphan in `h` (the kernel's `ext4_orphan_add`); a no-op if it
    /// already has a record, or when the filesystem keeps none (read-only, no journal).
    ///
    /// For a truncate that spans several transactions: call it in the first one, with the new
    /// size already in the record (recovery truncates an orphan that has links to its
    /// `i_size`), and [`FsInner::orphan_del`] in the last. The caller holds the inode's
    /// `op_lock` and no inode record lock.
    pub(crate) fn orphan_add(&self, h: &Handle, inode: &Inode) -> Result<()> {
        let _t = self.stats.time(crate::fs::stats::Op::OrphanAdd);
        let o = &self.orphans;
        if !o.active || inode.orphan.load(Ordering::Acquire) != ORPHAN_NONE {
            return Ok(());
        }
        if let Some(f) = &o.file {
            if let Some(slot) = f.claim(h, inode.ino)? {
                inode.orphan.store(slot + 1, Ordering::Release);
                return Ok(());
            }
        }
        self.orphan_list_add(h, inode)
    }

    /// Removes the record [`FsInner::orphan_add`] made for a truncate (the kernel's
    /// `ext4_orphan_del` at the end of `ext4_truncate`). A no-op when there is none, or when
    /// the inode has lost its last link meanwhile: that record is the unlink's, and the last
    /// release removes it. Same locking rules as `orphan_add`.
    pub(crate) fn orphan_del(&self, h: &Handle, inode: &Inode) -> Result<()> {
        if inode.refs.load(Ordering::Acquire) & REF_UNLINKED != 0 {
            return Ok(());
        }
        self.orphan_remove(h, inode)
    }

    /// Removes whatever record `inode` has.
    fn orphan_remove(&self, h: &Handle, inode: &Inode) -> Result<()> {
        let _t = self.stats.time(crate::fs::stats::Op::OrphanDel);
        match inode.orphan.load(Ordering::Acquire) {
            ORPHAN_NONE => Ok(()),
            ORPHAN_LIST => self.orphan_list_del(h, inode),
            slot => {
                let Some(f) = &self.orphans.file else { return Ok(()) };
                f.unclaim(h, slot - 1)?;
                inode.orphan.store(ORPHAN_NONE, Ordering::Release);
                Ok(())
            }
        }
    }

    /// Puts `inode` at the head of the superblock's list.
    fn orphan_list_add(&self, h: &Handle, inode: &Inode) -> Result<()> {
        let o = &self.orphans;
        h.join(&self.sb_buf)?;
        let ino = inode.ino.0;
        let mut l = self.stats.lock(crate::fs::stats::LockClass::OrphanList, &o.list);
        let head = o.head.load(Ordering::Acquire);
        let mut raw = inode.raw_mut();
        rec(&mut raw).set_dtime(head);
        l.next.insert(ino, head);
        l.prev.insert(ino, 0);
        if head != 0 {
            l.prev.insert(head, ino);
        }
        o.head.store(ino, Ordering::Release);
        inode.orphan.store(ORPHAN_LIST, Ordering::Release);
        drop(l);
        self.mark_inode_dirty(h, inode, &mut raw)
    }

    /// Unlinks `inode` from the superblock's list: its predecessor (or the head) takes its
    /// next pointer.
    fn orphan_list_del(&self, h: &Handle, inode: &Inode) -> Result<()> {
        let o = &self.orphans;
        let ino = inode.ino.0;
        let mut l = self.stats.lock(crate::fs::stats::LockClass::OrphanList, &o.list);
        let next = l.next.remove(&ino).unwrap_or(0);
        let prev = l.prev.remove(&ino).unwrap_or(0);
        if next != 0 {
            l.prev.insert(next, prev);
        }
        if prev == 0 {
            h.join(&self.sb_buf)?;
            o.head.store(next, Ordering::Release);
            drop(l);
        } else {
            l.next.insert(prev, next);
            // Pinned (it has a record), so this finds it in the cache without I/O.
            let p = self.iget(InodeNo(prev))?;
            let mut praw = p.raw_mut();
            rec(&mut praw).set_dtime(next);
            drop(l);
            self.mark_inode_dirty(h, &p, &mut praw)?;
        }
        inode.orphan.store(ORPHAN_NONE, Ordering::Release);
        let mut raw = inode.raw_mut();
        rec(&mut raw).set_dtime(0);
        self.mark_inode_dirty(h, inode, &mut raw)
    }

    /// A directory to look names up in or change: one removed while held has no names and
    /// takes none (`ENOENT`, the VFS's dead-directory rule).
    pub(crate) fn iget_dir(&self, ino: InodeNo) -> Result<Arc<Inode>> {
        let d = self.iget_by_number(ino)?;
        if d.is_held_orphan() {
            return Err(Error::NotFound);
        }
        Ok(d)
    }

    // ---------------------------------------------------------------------------------------
    // Recovery and unmount
    // ---------------------------------------------------------------------------------------

    /// Frees every recorded orphan without links and truncates every one with links to its
    /// size (the kernel's `ext4_orphan_cleanup`), list first, then the orphan file; called at a
    /// writable open once the journal runs. Skipped on a filesystem marked with errors, as
    /// the kernel does (e2fsck then handles them). An orphan found damaged is recorded as an
    /// error and left where it is, and the open goes on, as the kernel's mount does.
    pub(crate) fn orphan_cleanup(&self) -> Result<()> {
        if self.sbi.sb.s_state.get() & STATE_ERROR != 0 {
            return Ok(());
        }
        let o = &self.orphans;
        let mut seen = HashSet::new();
        loop {
            let ino = o.head();
            if ino == 0 {
                break;
            }
            let inode = if seen.insert(ino) { self.orphan_get(ino)? } else { None };
            let Some(inode) = inode else {
                // A bad entry ends the list (`ext4_orphan_cleanup` does the same).
                let h = self.journal()?.start(2)?;
                h.join(&self.sb_buf)?;
                o.head.store(0, Ordering::Release);
                break;
            };
            {
                let mut l = o.list.lock();
                l.next.insert(ino, inode.disk().dtime());
                l.prev.insert(ino, 0);
            }
            inode.orphan.store(ORPHAN_LIST, Ordering::Release);
            // Left on the list when damaged: the next pass finds it seen and ends the list.
            self.process_or_record(&inode)?;
            if self.stopped_by_error() {
                return Ok(());
            }
        }
        let Some(f) = &o.file else { return Ok(()) };
        for (i, b) in f.blocks.iter().enumerate() {
            for (j, slot) in b.slots.iter().enumerate() {
                let ino = slot.load(Ordering::Acquire);
                if ino == 0 {
                    continue;
                }
                let idx = slot_index(i, b.slots.len(), j);
                match self.orphan_get(ino)? {
                    Some(inode) if inode.orphan.load(Ordering::Acquire) == ORPHAN_NONE => {
                        inode.orphan.store(idx + 1, Ordering::Release);
                        self.process_or_record(&inode)?;
                        if self.stopped_by_error() {
                            return Ok(());
                        }
                    }
                    // Not an inode in use, or recorded twice: drop the entry.
                    _ => {
                        let h = self.journal()?.start(2)?;
                        f.unclaim(&h, idx)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The inode a recovered orphan record names, if it can be one (`ext4_orphan_get`): a
    /// non-reserved number in range, allocated in its bitmap, with a readable record.
    fn orphan_get(&self, ino: u32) -> Result<Option<Arc<Inode>>> {
        let sb = &self.sbi.sb;
        let special = [sb.s_journal_inum.get(), sb.s_orphan_file_inum.get()];
        if ino < sb.first_ino() || ino > self.sbi.inodes_count || special.contains(&ino) {
            return Ok(None);
        }
        if !self.inode_in_bitmap(InodeNo(ino))? {
            return Ok(None);
        }
        match self.iget(InodeNo(ino)) {
            Ok(i) if i.file_type().is_some() => Ok(Some(i)),
            Ok(_) | Err(Error::Corrupt(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`FsInner::process_orphan`], recording damage instead of failing the open with it.
    fn process_or_record(&self, inode: &Arc<Inode>) -> Result<()> {
        match self.process_orphan(inode) {
            Err(Error::Corrupt(c)) => {
                self.record_error(crate::fs::stats::Op::Truncate, &c);
                Ok(())
            }
            r => r,
        }
    }

    /// Frees (no links) or truncates (links left) a recovered orphan, and drops its record.
    fn process_orphan(&self, inode: &Arc<Inode>) -> Result<()> {
        let d = inode.disk();
        if d.links_count() == 0 {
            inode.refs.store(REF_DEAD, Ordering::Release);
            self.evict(inode)?;
            self.orphans.cleaned.0.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        // A truncate that did not finish: cut the file at its recorded size, over as many
        // transactions as it takes (the record stays until the end).
        let truncated = if d.file_type() == rext4_format::inode::S_IFREG {
            match self.truncate(inode.ino, d.size()) {
                Ok(()) => true,
                // Files the data path does not write (inline data, encrypted without a key).
                Err(Error::NotSupported(_) | Error::NoKey) => false,
                Err(e) => return Err(e),
            }
        } else {
            false
        };
        let _t = self.stats.time(crate::fs::stats::Op::Evict);
        let _l = self.stats.lock(crate::fs::stats::LockClass::OpLock, &inode.op_lock);
        let h = self.journal()?.start(EVICT_CREDITS)?;
        if !truncated && d.size() == 0 {
            self.free_data_blocks(&h, inode)?;
        }
        self.orphan_del(&h, inode)?;
        self.orphans.cleaned.1.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Truncates an inode that keeps its links to nothing: frees its mapped blocks (not its
    /// xattr block) and empties its block map.
    fn free_data_blocks(&self, h: &Handle, inode: &Inode) -> Result<()> {
        let owned = self.owned_blocks(inode)?;
        if owned.data.is_empty() && owned.meta.is_empty() {
            return Ok(());
        }
        let journaled = inode.with_disk(|d| {
            matches!(d.file_type(), rext4_format::inode::S_IFDIR | rext4_format::inode::S_IFLNK)
        });
        self.free_owned(h, &owned, journaled)?;
        let acl = inode.with_disk(|d| d.file_acl());
        // A sum of value sizes: never negative.
        let charged = u64::try_from(self.ea_charge_total(inode.ino, &inode.raw())?).unwrap_or(0);
        let mut raw = inode.raw_mut();
        let flags = crate::inode::write::raw_flags(&raw);
        // What is left in i_blocks is the xattr block and the values in EA inodes, in the
        // record's unit.
        let unit = if self.sbi.huge_file && flags & HUGE_FILE_FL != 0 {
            u64::from(self.sbi.block_size)
        } else {
            512
        };
        let left = (if acl != 0 { self.sbi.cluster_bytes() } else { 0 } + charged) / unit;
        let mut r = rec(&mut raw);
        // Below 2^32 (value sizes are checked to 2^24 per entry), so i_blocks_high stays 0,
        // as it must without huge_file.
        r.set_blocks(left);
        r.i_block_mut().fill(0);
        if flags & EXTENTS_FL != 0 {
            crate::map::extents_write::init_root(&mut raw);
        }
        self.mark_inode_dirty(h, inode, &mut raw)
    }

    /// At unmount: frees the orphans still held (the kernel evicts every inode before it
    /// writes the superblock clean).
    pub(crate) fn evict_held_orphans(&self) -> Result<()> {
        if self.stopped_by_error() {
            // No more changes after an error: they stay recorded for e2fsck (a mount of an
            // image with errors does not clean orphans up either).
            return Ok(());
        }
        for inode in self.icache.collect(|i| i.is_held_orphan()) {
            let s = inode.refs.swap(REF_DEAD, Ordering::AcqRel);
            if s & REF_UNLINKED != 0 && s & REF_DEAD == 0 {
                self.evict(&inode)?;
            }
        }
        Ok(())
    }
}

impl FsInner {
    /// Whether `ino` is a regular file with data whose last link is gone while references
    /// to it are held.
    fn unlinked_with_data(&self, ino: InodeNo) -> Result<bool> {
        let inode = self.iget(ino)?;
        let s = inode.refs.load(Ordering::Acquire);
        let sized = inode.with_disk(|d| d.file_type() == rext4_format::inode::S_IFREG && d.size() > 0);
        Ok(s & REF_UNLINKED != 0 && s & REF_DEAD == 0 && sized)
    }
}

impl Fs {
    /// Takes a reference to `ino` (an open file, or a FUSE lookup): while any reference is
    /// held, removing its last link leaves it readable and writable by number, recorded as an
    /// orphan so that a crash cannot leak it. `ENOENT` if the inode is not in use.
    pub fn hold(&self, ino: InodeNo) -> Result<()> {
        self.inner.op(crate::fs::stats::Op::Open, || {
            if !self.inner.ino_in_range(ino) {
                return Err(Error::NotFound);
            }
            let inode = self.inner.iget(ino)?;
            let mut s = inode.refs.load(Ordering::Acquire);
            loop {
                if s & REF_DEAD != 0 || (s & REF_UNLINKED == 0 && inode.with_disk(|d| d.links_count()) == 0) {
                    return Err(Error::NotFound);
                }
                if s & REF_COUNT == REF_COUNT {
                    return Err(Error::InvalidInput("too many references to one inode"));
                }
                match inode.refs.compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return Ok(()),
                    Err(x) => s = x,
                }
            }
        })
    }

    /// Drops a reference taken by [`Fs::hold`]; the last one frees an inode with no links
    /// (blocks, xattr block, inode) and its orphan record, in one journal handle. `EINVAL` if
    /// the inode is not held.
    pub fn release(&self, ino: InodeNo) -> Result<()> {
        self.inner.op(crate::fs::stats::Op::Release, || {
            let not_held = Error::InvalidInput("inode not held");
            if !self.inner.ino_in_range(ino) {
                return Err(not_held);
            }
            // Loading an evicted copy gets its parked hold count back.
            let inode = self.inner.iget(ino)?;
            let mut s = inode.refs.load(Ordering::Acquire);
            loop {
                let count = s & REF_COUNT;
                if count == 0 {
                    return Err(not_held);
                }
                let last_of_orphan = count == 1 && s & REF_UNLINKED != 0;
                let new = if last_of_orphan { REF_DEAD } else { s - 1 };
                match inode.refs.compare_exchange_weak(s, new, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) if last_of_orphan => {
                        self.inner.discard_prealloc(&inode);
                        return self.inner.evict(&inode);
                    }
                    Ok(_) => {
                        if count == 1 {
                            self.inner.discard_prealloc(&inode);
                            // Closed by everyone: lock state that holds nothing goes.
                            self.inner.locks.forget_idle(ino.0);
                        }
                        return Ok(());
                    }
                    Err(x) => s = x,
                }
            }
        })
    }

    /// Frees the blocks of `ino` now if its last link is gone while references to it are
    /// still held (a FUSE lookup the kernel has not forgotten yet), for a caller that knows
    /// nothing can read the file any more (no open file): ext4 frees a removed file's space
    /// before `unlink(2)` returns, so `statfs` and the next allocation see it at once. The
    /// inode and its orphan record stay until the last reference goes. Nothing happens to
    /// any other inode.
    pub fn free_unlinked_data(&self, ino: InodeNo) -> Result<()> {
        if !self.inner.ino_in_range(ino) || !self.inner.unlinked_with_data(ino)? {
            return Ok(());
        }
        // Held meanwhile, so that a last release racing in (the kernel's FORGET on another
        // thread) cannot evict the inode under the truncate: it waits for ours.
        match self.hold(ino) {
            Ok(()) => {}
            Err(Error::NotFound) | Err(Error::InvalidInput(_)) => return Ok(()),
            Err(e) => return Err(e),
        }
        let freed = self.free_held_unlinked_data(ino);
        let released = self.release(ino);
        freed.and(released)
    }

    fn free_held_unlinked_data(&self, ino: InodeNo) -> Result<()> {
        self.inner.noting(crate::fs::stats::Op::Release, || {
            if !self.inner.unlinked_with_data(ino)? {
                return Ok(());
            }
            self.inner.truncate(ino, 0)
        })
    }

    /// The inodes recorded as orphans (list and orphan file), as this filesystem holds them.
    pub fn orphans(&self) -> Vec<InodeNo> {
        let o = &self.inner.orphans;
        let mut v: Vec<InodeNo> = o.list.lock().next.keys().map(|&i| InodeNo(i)).collect();
        if let Some(f) = &o.file {
            for b in f.blocks.iter() {
                v.extend(b.slots.iter().map(|s| s.load(Ordering::Acquire)).filter(|&i| i != 0).map(InodeNo));
            }
        }
        v.sort_unstable_by_key(|i| i.0);
        v
    }

    /// What the recovery at open did: (orphans freed, orphans truncated).
    pub fn orphans_recovered(&self) -> (u32, u32) {
        let c = &self.inner.orphans.cleaned;
        (c.0.load(Ordering::Relaxed), c.1.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
#[path = "orphan_tests.rs"]
mod tests;
