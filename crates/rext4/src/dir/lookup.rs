//! Name lookup (the read side of the kernel's `namei.c`): linear scans, inline directories,
//! and htree lookups by hash with the kernel's fallback to a linear scan when the index is
//! structurally unusable.

use crate::cache::buffer::Buffer;
use crate::cache::dcache::Hit;
use crate::dir::casefold::DirName;
use crate::dir::DirBlockKind;
use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use rext4_format::dirent::DirBlockIter;
use rext4_format::dx::{self, DxEntries};
use rext4_format::hash::{dx_hash, HashAlgo};
use rext4_format::inode::ENCRYPT_FL;
use rext4_format::InodeNo;
use std::sync::Arc;

/// Why an htree lookup gave up.
enum DxFail {
    /// The index cannot be used; search linearly instead.
    Fallback,
    /// A real error (I/O, checksum) to report.
    Err(Error),
}

impl From<Error> for DxFail {
    fn from(e: Error) -> Self {
        DxFail::Err(e)
    }
}

/// Room for a new entry, found by the same scan of an indexed directory's leaf that showed the
/// name absent (the kernel scans twice: `ext4_lookup`, then `add_dirent_to_buf`). Good only
/// while the caller holds the directory's `op_lock`, under which its leaves do not change.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Room {
    /// The leaf the index chose for the name.
    pub lblk: u32,
    /// A slot there (`dirent::probe`'s room); `None`: the leaf is full.
    pub slot: Option<rext4_format::dirent::Room>,
    /// The name's hash, and the algorithm it was computed with, so that the insert's own
    /// descent of the index does not hash the name again.
    pub hash: (HashAlgo, rext4_format::hash::DxHash),
}

/// One level of an htree descent.
struct Frame {
    buf: Arc<Buffer>,
    is_root: bool,
    at: usize,
}

impl Frame {
    fn with_entries<T>(&self, f: impl FnOnce(&DxEntries<'_>) -> T) -> Option<T> {
        let data = self.buf.data();
        let entries =
            if self.is_root { dx::parse_root(&data).ok()?.entries } else { dx::parse_node(&data).ok()? };
        Some(f(&entries))
    }
}

impl FsInner {
    /// Finds `name` in directory `dir`: its inode, which must be in use (as `iget_live`).
    pub(crate) fn lookup(&self, dir: &Inode, name: &[u8]) -> Result<Arc<Inode>> {
        if !dir.is_dir() {
            return Err(Error::NotDir);
        }
        if name.len() > 255 {
            return Err(Error::NameTooLong);
        }
        if name.is_empty() {
            return Err(Error::NotFound);
        }
        if name.contains(&b'/') || name.contains(&0) {
            return Err(Error::InvalidInput("name contains '/' or NUL"));
        }
        if dir.flags() & ENCRYPT_FL != 0 {
            let disk = self.disk_name(dir, name, crate::crypto::fname::NameUse::Find)?;
            return self.lookup_disk(dir, &disk);
        }
        self.lookup_disk(dir, name)
    }

    /// [`FsInner::lookup`] of an on-disk name (ciphertext in an encrypted directory).
    pub(crate) fn lookup_disk(&self, dir: &Inode, name: &[u8]) -> Result<Arc<Inode>> {
        // `.` and `..` are not cached: a removed directory's number may come back as another
        // directory with another parent.
        if name == b"." || name == b".." {
            return self.iget_live(self.lookup_uncached(dir, name)?);
        }
        let name = &self.dir_name(dir, name);
        let key = name.canonical();
        match self.dcache.get(dir.ino, key) {
            Some(Hit::Linked(inode)) => {
                self.check_live(&inode)?;
                return Ok(inode);
            }
            Some(Hit::Unlinked(ino)) => {
                let inode = self.iget_live(ino)?;
                self.dcache.relink(dir.ino, key, &inode);
                return Ok(inode);
            }
            None => {}
        }
        let gen = dir.names_gen.load(std::sync::atomic::Ordering::Acquire);
        let found = self.names_stable(dir, || self.lookup_once(dir, name))?;
        if found == dir.ino {
            // A name (not `.`) for its own directory: every operation on it would lock the
            // directory twice (`ext4_lookup`: "linked to parent dir").
            let what = "entry names its own directory";
            return corrupt(CorruptKind::DirEntry { ino: dir.ino, block: None, what });
        }
        let inode = self.iget_live(found)?;
        self.dcache.insert_found(dir, gen, key, &inode);
        Ok(inode)
    }

    pub(crate) fn lookup_uncached(&self, dir: &Inode, name: &[u8]) -> Result<InodeNo> {
        // An htree split moving names between blocks must not make a name look absent.
        let name = &self.dir_name(dir, name);
        self.names_stable(dir, || self.lookup_once(dir, name))
    }

    fn lookup_once(&self, dir: &Inode, name: &DirName<'_>) -> Result<InodeNo> {
        if self.has_inline_data(dir) {
            return self.lookup_inline(dir, name);
        }
        if self.is_dx(dir) && name.key().is_plain_name() {
            match self.dx_lookup(dir, name, None) {
                Ok((r, _)) => return r.ok_or(Error::NotFound),
                Err(DxFail::Err(e)) => return Err(e),
                Err(DxFail::Fallback) => {}
            }
        }
        self.lookup_linear(dir, name)
    }

    fn lookup_inline(&self, dir: &Inode, name: &DirName<'_>) -> Result<InodeNo> {
        let (parent, data) = self.inline_dir(dir)?;
        let key = name.key();
        match key.bytes() {
            b"." => return Ok(dir.ino),
            b".." => return Ok(parent),
            _ => {}
        }
        let ib = crate::data::inline::I_BLOCK_SIZE;
        let areas = [&data[4..ib.min(data.len())], data.get(ib..).unwrap_or(&[])];
        for area in areas {
            for e in DirBlockIter::new(area, self.sbi.block_size).flatten() {
                if e.inode != 0 && key.matches(e.name) {
                    return Ok(InodeNo(e.inode));
                }
            }
        }
        Err(Error::NotFound)
    }

    fn lookup_linear(&self, dir: &Inode, name: &DirName<'_>) -> Result<InodeNo> {
        let bs = u64::from(self.sbi.block_size);
        let nblocks = dir.size().div_ceil(bs);
        let mut next = 0u64;
        while let Some(lblk) = self.next_dir_block(dir, next, nblocks)? {
            next = u64::from(lblk) + 1;
            let found = match self.dir_block_any(dir, lblk)? {
                // Interior index nodes hold no names; the root holds `.` and `..`.
                Some((DirBlockKind::Index, buf)) if lblk == 0 => self.search_leaf(&buf, name, true),
                Some((DirBlockKind::Index, _)) | None => None,
                Some((DirBlockKind::Leaf, buf)) => self.search_leaf(&buf, name, false),
            };
            if let Some(ino) = found {
                return Ok(ino);
            }
        }
        Err(Error::NotFound)
    }

    fn search_leaf(&self, buf: &Buffer, name: &DirName<'_>, whole: bool) -> Option<InodeNo> {
        let data = buf.data();
        let area = if whole { &data[..] } else { self.leaf_entries(&data) };
        let (hit, _) = rext4_format::dirent::probe_key(area, self.sbi.block_size, name.key(), None, 0);
        hit.map(|h| InodeNo(h.inode))
    }

    /// `Ok(None)` if `name` is not in `dir` (whose `op_lock` the caller holds), with room for
    /// it when the directory is indexed; `Err(Exists)` if it is.
    pub(crate) fn ensure_absent(&self, dir: &Inode, name: &[u8]) -> Result<Option<Room>> {
        let plain = !dir.is_dir()
            || name == b"."
            || name == b".."
            || dir.flags() & ENCRYPT_FL != 0
            || self.has_inline_data(dir)
            || !self.is_dx(dir);
        if !plain {
            let key = self.dir_name(dir, name);
            if self.dcache.contains(dir.ino, key.canonical()) {
                return Err(Error::Exists);
            }
            let need = rext4_format::dirent::rec_len_for(name.len());
            match self.names_stable(dir, || Ok(self.dx_lookup(dir, &key, Some(need))))? {
                Ok((Some(_), _)) => return Err(Error::Exists),
                Ok((None, room)) => {
                    self.check_new_name(dir, name)?;
                    return Ok(room);
                }
                Err(DxFail::Err(e)) => return Err(e),
                Err(DxFail::Fallback) => {}
            }
        }
        match self.lookup_disk(dir, name) {
            Ok(_) => Err(Error::Exists),
            Err(Error::NotFound) => self.check_new_name(dir, name).map(|()| None),
            Err(e) => Err(e),
        }
    }

    /// One pass over a leaf's entries: `name`'s inode if present, else the slot for an entry
    /// of `need` bytes (`Some(None)`: the leaf is full). A leaf whose checksum tail is missing
    /// is searched as a whole (as [`FsInner::search_leaf`] does) and says nothing of room.
    fn scan_leaf(
        &self,
        buf: &Buffer,
        name: &DirName<'_>,
        need: usize,
    ) -> (Option<InodeNo>, Option<Option<rext4_format::dirent::Room>>) {
        let data = buf.data();
        let area = &data[..self.entry_area()];
        if self.leaf_entries(&data).len() != area.len() {
            return (self.search_leaf(buf, name, false), None);
        }
        // Only directories whose entries carry no hash come here (`ensure_absent`).
        match rext4_format::dirent::probe_key(area, self.sbi.block_size, name.key(), Some(need), 0) {
            (Some(hit), _) => (Some(InodeNo(hit.inode)), None),
            (None, room) => (None, Some(room)),
        }
    }

    /// An htree lookup: `Ok((None, _))` if the name is certainly absent. With `need`, also
    /// where an entry of that many bytes would go ([`Room`]).
    fn dx_lookup(
        &self,
        dir: &Inode,
        name: &DirName<'_>,
        need: Option<usize>,
    ) -> Result<(Option<InodeNo>, Option<Room>), DxFail> {
        let Some((_, root)) = self.dir_block(dir, 0, DirBlockKind::Index)? else {
            return Err(DxFail::Fallback);
        };
        let (algo, levels) = {
            let data = root.data();
            let r = dx::parse_root(&data).map_err(|_| DxFail::Fallback)?;
            let max = if self.sbi.large_dir { dx::MAX_LEVELS_LARGEDIR } else { dx::MAX_LEVELS };
            if r.info.indirect_levels >= max {
                return Err(DxFail::Fallback);
            }
            let algo = self.dx_algo(dir, r.info.hash_version).ok_or(DxFail::Fallback)?;
            (algo, r.info.indirect_levels)
        };
        let full = if self.hash_in_dirent(dir) {
            // Without the key the index cannot be followed: searched linearly.
            self.disk_name_siphash(dir, name.key().bytes()).map_err(|_| DxFail::Fallback)?
        } else {
            dx_hash(name.canonical(), algo, self.sbi.hash_seed)
        };
        let hash = full.major;
        let mut frames = vec![Frame { buf: root, is_root: true, at: 0 }];
        self.dx_descend(dir, &mut frames, hash, usize::from(levels))?;
        let mut room = None;
        let mut first = true;
        loop {
            let leaf =
                frames.last().and_then(|f| f.with_entries(|e| e.get(f.at).1)).ok_or(DxFail::Fallback)?;
            let Some((_, buf)) = self.dir_block(dir, leaf, DirBlockKind::Leaf)? else {
                return Err(DxFail::Fallback);
            };
            // Room is sought in the first leaf only: the one an insertion probes to.
            let found = match need.filter(|_| first) {
                Some(need) => {
                    let (found, slot) = self.scan_leaf(&buf, name, need);
                    room = slot.map(|slot| Room { lblk: leaf, slot, hash: (algo, full) });
                    found
                }
                None => self.search_leaf(&buf, name, false),
            };
            if found.is_some() {
                return Ok((found, None));
            }
            first = false;
            if !self.dx_next_block(dir, &mut frames, hash)? {
                return Ok((None, room));
            }
        }
    }

    /// Descends from the last frame to the leaf level, choosing by `hash`.
    fn dx_descend(
        &self,
        dir: &Inode,
        frames: &mut Vec<Frame>,
        hash: u32,
        levels: usize,
    ) -> Result<(), DxFail> {
        loop {
            let f = frames.last_mut().ok_or(DxFail::Fallback)?;
            let (at, child) = f
                .with_entries(|e| {
                    let at = e.find(hash);
                    (at, e.get(at).1)
                })
                .ok_or(DxFail::Fallback)?;
            f.at = at;
            if frames.len() > levels {
                return Ok(());
            }
            let node = self.dx_node(dir, child)?;
            frames.push(Frame { buf: node, is_root: false, at: 0 });
        }
    }

    fn dx_node(&self, dir: &Inode, lblk: u32) -> Result<Arc<Buffer>, DxFail> {
        // A block that is not shaped like an index node (a leaf where the root promised a
        // node) is a structural problem: fall back to a linear scan, as the kernel does.
        let Some((DirBlockKind::Index, buf)) = self.dir_block_any(dir, lblk)? else {
            return Err(DxFail::Fallback);
        };
        if dx::parse_node(&buf.data()).is_err() {
            return Err(DxFail::Fallback);
        }
        Ok(buf)
    }

    /// Moves to the next leaf if it may hold more names with `hash` (a hash collision continued
    /// across blocks: the next entry's hash equals ours apart from the low "continued" bit).
    fn dx_next_block(&self, dir: &Inode, frames: &mut Vec<Frame>, hash: u32) -> Result<bool, DxFail> {
        let levels = frames.len();
        // Climb until a frame has a next entry.
        let mut depth = levels;
        loop {
            if depth == 0 {
                return Ok(false);
            }
            let f = &mut frames[depth - 1];
            let count = f.with_entries(|e| e.len()).ok_or(DxFail::Fallback)?;
            if f.at + 1 < count {
                f.at += 1;
                break;
            }
            depth -= 1;
        }
        let f = &frames[depth - 1];
        let next_hash = f.with_entries(|e| e.get(f.at).0).ok_or(DxFail::Fallback)?;
        if next_hash & !1 != hash {
            return Ok(false);
        }
        // Re-descend to the leftmost leaf under the new position.
        frames.truncate(depth);
        while frames.len() < levels {
            let f = frames.last().ok_or(DxFail::Fallback)?;
            let child = f.with_entries(|e| e.get(f.at).1).ok_or(DxFail::Fallback)?;
            let node = self.dx_node(dir, child)?;
            frames.push(Frame { buf: node, is_root: false, at: 0 });
        }
        Ok(true)
    }
}
