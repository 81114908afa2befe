//! Hard and symbolic links (the kernel's `ext4_link`, `ext4_symlink`): a new name for an
//! existing inode, and a new inode holding a path — in `i_block` up to 59 bytes ("fast"), else
//! in one block.
//!
//! # Locking
//! As for other name operations: parent `op_lock` (and the target's for `link`) -> handle ->
//! records -> buffers.

use crate::alloc::reserved::Pool;
use crate::attr::Attr;
use crate::error::{Error, Result};
use crate::fs::{Fs, FsInner};
use crate::inode::write::{
    raw_flags, raw_links, raw_set_flags, raw_set_links, raw_set_size, raw_touch_c, raw_touch_cm, rec,
};
use crate::inode::Inode;
use crate::inode::{REF_COUNT, REF_DEAD, REF_UNLINKED};
use crate::namei::create::LINK_MAX;
use rext4_format::dirent::FT_SYMLINK;
use rext4_format::inode::{self as fi, EXTENTS_FL};
use rext4_format::InodeNo;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Longest target stored in `i_block` (the 60 bytes, less a NUL).
const FAST_MAX: usize = 59;
/// Credits: as for create, plus a data block for a slow symlink.
const CREDITS: u32 = 36;

/// Takes a `tmpfile` inode out of the unlinked state before its first name is added: `false`
/// if its last release has already begun freeing it.
fn claim_linked(inode: &Inode) -> bool {
    let mut s = inode.refs.load(Ordering::Acquire);
    loop {
        if s & REF_DEAD != 0 || s & REF_UNLINKED == 0 {
            return false;
        }
        match inode.refs.compare_exchange_weak(s, s & !REF_UNLINKED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(x) => s = x,
        }
    }
}

/// Undoes [`claim_linked`] after the name could not be added; `true` if the inode's last hold
/// went meanwhile, so that the caller must free it.
fn unclaim_linked(inode: &Inode) -> bool {
    let mut s = inode.refs.load(Ordering::Acquire);
    loop {
        let gone = s & REF_COUNT == 0;
        let new = if gone { REF_DEAD } else { s | REF_UNLINKED };
        match inode.refs.compare_exchange_weak(s, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return gone,
            Err(x) => s = x,
        }
    }
}

impl FsInner {
    fn link(&self, ino: InodeNo, parent: InodeNo, name: &[u8]) -> Result<()> {
        // A freed file takes no name (`ENOENT`, as `vfs_link` for a file without links).
        let target = self.iget_by_number(ino).map_err(|e| match e {
            Error::Stale => Error::NotFound,
            e => e,
        })?;
        let mut evict = false;
        let r = self.link_to(&target, parent, name, &mut evict);
        if evict {
            // A file from `tmpfile` whose last hold went while it was being linked, and which
            // did not get its name: freed as its release would have (no lock held here).
            let _ = self.evict(&target);
        }
        r
    }

    fn link_to(&self, target: &Arc<Inode>, parent: InodeNo, name: &[u8], evict: &mut bool) -> Result<()> {
        let ino = target.ino;
        let (journal, dir) = self.name_op_target(parent, name)?;
        let _dl = self.stats.lock(crate::fs::stats::LockClass::OpLock, &dir.op_lock);
        // A taken name is EEXIST before anything about the target, as the kernel's
        // filename_create answers before vfs_link looks at it; in an encrypted directory the
        // name is then given as its ciphertext, which needs the key (`fscrypt_prepare_link`).
        let encrypted = dir.flags() & fi::ENCRYPT_FL != 0;
        let disk = match encrypted {
            false => None,
            // Kind 0: a new name only, no new inode to give a context.
            true => self.prepare_new_encrypted(&dir, Some(name), 0)?.0,
        };
        let name = disk.as_deref().unwrap_or(name);
        let room = self.ensure_absent(&dir, name)?;
        if target.is_dir() {
            return Err(Error::NotPermitted);
        }
        if encrypted && !self.permitted_context(&dir, target)? {
            return Err(Error::CrossPolicy);
        }
        let _tl = self.stats.lock(crate::fs::stats::LockClass::OpLock, &target.op_lock);
        crate::inode::flags::check_dir_open(&dir)?;
        crate::inode::flags::check_pinned(target)?;
        let links = target.disk().links_count();
        // A file without links takes a name only if it came from `tmpfile` and has had none
        // yet (`vfs_link`'s `I_LINKABLE`); it stops being an unlinked orphan first, so that a
        // release meanwhile does not free it (inode/orphan.rs).
        let first = links == 0 && target.linkable.load(Ordering::Acquire);
        if links == 0 && !(first && claim_linked(target)) {
            return Err(Error::NotFound);
        }
        if links >= LINK_MAX {
            return Err(Error::TooManyLinks);
        }
        if let Err(e) = self.check_same_project(&dir, target) {
            if first {
                *evict = unclaim_linked(target);
            }
            return Err(e);
        }
        let ft = crate::dir::dirent_type(target.disk().mode());
        let added = journal.start(CREDITS).and_then(|h| {
            self.add_entry_in(&h, &dir, name, ino, ft, room)?;
            Ok(h)
        });
        let h = match added {
            Ok(h) => h,
            Err(e) => {
                if first {
                    *evict = unclaim_linked(target);
                }
                return Err(e);
            }
        };
        if first {
            self.orphan_del(&h, target)?;
        }
        self.cache_name(&dir, name, target);
        let t = self.now();
        let mut traw = target.raw_mut();
        let links = raw_links(&traw);
        raw_set_links(&mut traw, links + 1);
        raw_touch_c(&mut traw, t);
        self.mark_inode_dirty(&h, target, &mut traw)?;
        drop(traw);
        // Only now that it has a link (`check_live` takes a linkable inode for a live one).
        target.linkable.store(false, Ordering::Release);
        let mut draw = dir.raw_mut();
        raw_touch_cm(&mut draw, t);
        self.mark_inode_dirty(&h, &dir, &mut draw)
    }

    fn symlink(&self, parent: InodeNo, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<InodeNo> {
        if target.is_empty() {
            return Err(Error::NotFound);
        }
        if target.len() >= self.sbi.block_size as usize || target.contains(&0) {
            return Err(Error::NameTooLong);
        }
        let (journal, dir) = self.name_op_target(parent, name)?;
        let _dl = self.stats.lock(crate::fs::stats::LockClass::OpLock, &dir.op_lock);
        let (disk, ctx) = match dir.flags() & fi::ENCRYPT_FL {
            0 => (None, None),
            _ => self.prepare_new_encrypted(&dir, Some(name), fi::S_IFLNK)?,
        };
        let name = disk.as_deref().unwrap_or(name);
        let room = self.ensure_absent(&dir, name)?;
        crate::inode::flags::check_dir_open(&dir)?;
        let inherited = crate::inode::flags::inherited_flags(dir.flags(), fi::S_IFLNK);
        let h = journal.start(CREDITS)?;
        let child = self.new_inode(&h, &dir, fi::S_IFLNK | 0o777, uid, gid, 1)?;
        let mut craw = child.raw_mut();
        // Encrypted: the stored target is its ciphertext with a length before it.
        let stored = match &ctx {
            Some(c) => match self
                .encrypt_symlink(child.ino, c, target)
                .and_then(|s| self.set_new_context(&child, &mut craw, c).map(|()| s))
            {
                Ok(s) => s,
                Err(e) => {
                    drop(craw);
                    self.abandon_new_inode(&h, &child, false)?;
                    return Err(e);
                }
            },
            None => target.to_vec(),
        };
        let target = &stored[..];
        let fast = target.len() <= FAST_MAX;
        // A fast symlink's target lives in i_block, which then holds no block map.
        let own = if fast { raw_flags(&craw) & !EXTENTS_FL } else { raw_flags(&craw) };
        raw_set_flags(&mut craw, own | inherited);
        if fast {
            let mut r = rec(&mut craw);
            let b = r.i_block_mut();
            b.fill(0);
            b[..target.len()].copy_from_slice(target);
            raw_set_size(&mut craw, target.len() as u64);
        } else {
            // Slow: one block, journaled like metadata (so freeing it revokes it). Without
            // room for it (a full disk, a quota) the inode is given up.
            let pblk = match self.append_block(&h, &child, &mut craw, 0, Pool::Ordinary) {
                Ok(p) => p,
                Err(e) => {
                    drop(craw);
                    self.abandon_new_inode(&h, &child, false)?;
                    return Err(e);
                }
            };
            let buf = self.bcache.get_fresh(pblk);
            let mut block = h.write(&buf)?;
            block.fill(0);
            block[..target.len()].copy_from_slice(target);
            drop(block);
            raw_set_size(&mut craw, target.len() as u64);
        }
        if let Err(e) = self.add_entry_in(&h, &dir, name, child.ino, FT_SYMLINK, room) {
            drop(craw);
            self.abandon_new_inode(&h, &child, false)?;
            return Err(e);
        }
        self.cache_name(&dir, name, &child);
        self.mark_inode_dirty(&h, &child, &mut craw)?;
        drop(craw);
        let mut draw = dir.raw_mut();
        raw_touch_cm(&mut draw, self.now());
        self.mark_inode_dirty(&h, &dir, &mut draw)?;
        Ok(child.ino)
    }
}

impl Fs {
    /// Gives inode `ino` the additional name `name` in `parent` (`link(2)`).
    pub fn link(&self, ino: InodeNo, parent: InodeNo, name: &[u8]) -> Result<Attr> {
        self.inner.op(crate::fs::stats::Op::Link, || self.inner.link(ino, parent, name))?;
        self.getattr(ino)
    }

    /// Creates symbolic link `name` in `parent` pointing at `target` (`symlink(2)`).
    pub fn symlink(&self, parent: InodeNo, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<Attr> {
        let ino = self
            .inner
            .op(crate::fs::stats::Op::Symlink, || self.inner.symlink(parent, name, target, uid, gid))?;
        self.getattr(ino)
    }
}
