//! Creating and removing names (the write side of the kernel's `namei.c`): create, mkdir,
//! unlink, rmdir, with the kernel's errno. Each is one journal handle, so a crash leaves it
//! done or not done.
//!
//! # Locking
//! parent `op_lock` -> child `op_lock` -> journal handle -> inode records (parent, then child)
//! -> buffers. Operations in different directories share no lock.

use crate::alloc::reserved::Pool;
use crate::attr::Attr;
use crate::error::{Error, Result};
use crate::fs::{Fs, FsInner};
use crate::inode::write::{
    raw_flags, raw_links, raw_set_flags, raw_set_links, raw_touch_c, raw_touch_cm, rec,
};
use crate::inode::Inode;
use crate::jbd2::journal::Journal;
use crate::jbd2::transaction::Handle;
use rext4_format::dirent::FT_DIR;
use rext4_format::inode::{self as fi, EXTENTS_FL};
use rext4_format::inode_record::TimeField;
use rext4_format::InodeNo;
use std::sync::Arc;

/// The kernel's `EXT4_LINK_MAX`: beyond it a directory's link count stays at 1 (dir_nlink).
pub(crate) const LINK_MAX: u16 = 65000;

/// Credits for one namespace operation: bitmaps, descriptors, superblock, inode-table blocks,
/// directory blocks (an htree insertion may split a leaf and index nodes on three levels),
/// and the blocks a freed file had in a few groups.
const NAME_CREDITS: u32 = 36;

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > 255 {
        return Err(Error::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(Error::InvalidInput("invalid name"));
    }
    Ok(())
}

/// Makes new record `raw` a device node, fifo or socket's: `flags` added, no extent root (special
/// files map no blocks), and `i_block` holding device number `rdev` (0:0 for the rest).
pub(super) fn make_special(raw: &mut [u8], flags: u32, rdev: (u32, u32)) {
    let mut r = rec(raw);
    let own = r.flags() & !EXTENTS_FL;
    r.set_flags(own | flags);
    r.set_device(rdev.0, rdev.1);
}

impl FsInner {
    /// The journal and the directory for an operation on `name` in `parent`, after the
    /// checks every name operation makes first.
    pub(super) fn name_op_target(&self, parent: InodeNo, name: &[u8]) -> Result<(Arc<Journal>, Arc<Inode>)> {
        check_name(name)?;
        let journal = self.journal()?.clone();
        let dir = self.iget_dir(parent)?;
        if !dir.is_dir() {
            return Err(Error::NotDir);
        }
        Ok((journal, dir))
    }

    fn create(&self, parent: InodeNo, name: &[u8], mode: u16, uid: u32, gid: u32) -> Result<InodeNo> {
        self.create_node(parent, name, mode, uid, gid, (0, 0))
    }

    /// Creates any kind of inode but a symlink; `rdev` is used for device nodes.
    fn create_node(
        &self,
        parent: InodeNo,
        name: &[u8],
        mode: u16,
        uid: u32,
        gid: u32,
        rdev: (u32, u32),
    ) -> Result<InodeNo> {
        let (journal, dir) = self.name_op_target(parent, name)?;
        let _dl = self.stats.lock(crate::fs::stats::LockClass::OpLock, &dir.op_lock);
        let kind = mode & fi::S_IFMT;
        // In an encrypted directory: the name's ciphertext, and the new inode's context.
        let (disk, ctx) = match dir.flags() & fi::ENCRYPT_FL {
            0 => (None, None),
            _ => self.prepare_new_encrypted(&dir, Some(name), kind)?,
        };
        let name = disk.as_deref().unwrap_or(name);
        let room = self.ensure_absent(&dir, name)?;
        crate::inode::flags::check_dir_open(&dir)?;
        let is_dir = mode & fi::S_IFMT == fi::S_IFDIR;
        let inherited = crate::inode::flags::inherited_flags(dir.flags(), mode);
        let h = journal.start(NAME_CREDITS)?;
        let child = self.new_inode(&h, &dir, mode, uid, gid, if is_dir { 2 } else { 1 })?;
        // Record locks are taken only around changes to the records: reading a directory
        // (to find room for the entry) reads its record too.
        let mut craw = child.raw_mut();
        if [fi::S_IFCHR, fi::S_IFBLK, fi::S_IFIFO, fi::S_IFSOCK].contains(&kind) {
            make_special(&mut craw, inherited, rdev);
        } else {
            let own = raw_flags(&craw);
            raw_set_flags(&mut craw, own | inherited);
        }
        // A directory without room for its first block (a full disk, a quota) is given up
        // as a failed entry is.
        let made = match &ctx {
            Some(c) => self.set_new_context(&child, &mut craw, c),
            None => Ok(()),
        };
        let made =
            made.and_then(|()| if is_dir { self.init_dir(&h, &child, &mut craw, parent) } else { Ok(()) });
        if let Err(e) = made
            .and_then(|()| self.add_entry_in(&h, &dir, name, child.ino, crate::dir::dirent_type(mode), room))
        {
            drop(craw);
            self.abandon_new_inode(&h, &child, is_dir)?;
            return Err(e);
        }
        self.cache_name(&dir, name, &child);
        let mut draw = dir.raw_mut();
        if is_dir {
            let links = raw_links(&draw);
            // dir_nlink: past the limit the count stays 1, meaning "many".
            let next = if links >= LINK_MAX - 1 || links == 1 { 1 } else { links + 1 };
            raw_set_links(&mut draw, next);
        }
        raw_touch_cm(&mut draw, self.now());
        self.mark_inode_dirty(&h, &child, &mut craw)?;
        self.mark_inode_dirty(&h, &dir, &mut draw)?;
        Ok(child.ino)
    }

    /// `ext4_tmpfile` (`O_TMPFILE`): a regular file near directory `parent` with no name,
    /// held once for the caller and recorded as an orphan, so that its last release (or a
    /// crash) frees it unless `link` gives it a name first.
    fn tmpfile(&self, parent: InodeNo, mode: u16, uid: u32, gid: u32) -> Result<InodeNo> {
        let journal = self.journal()?.clone();
        let dir = self.iget_dir(parent)?;
        if !dir.is_dir() {
            return Err(Error::NotDir);
        }
        // For the directory's allocation hint only: no name changes.
        let _dl = self.stats.lock(crate::fs::stats::LockClass::OpLock, &dir.op_lock);
        let ctx = match dir.flags() & fi::ENCRYPT_FL {
            0 => None,
            _ => self.prepare_new_encrypted(&dir, None, fi::S_IFREG)?.1,
        };
        crate::inode::flags::check_dir_open(&dir)?;
        let mode = fi::S_IFREG | (mode & 0o7777);
        let inherited = crate::inode::flags::inherited_flags(dir.flags(), mode);
        let h = journal.start(NAME_CREDITS)?;
        let child = self.new_inode(&h, &dir, mode, uid, gid, 0)?;
        // Until it is published below, the new inode has no links and no holds: a caller that
        // names its number is refused (`ESTALE`, `ENOENT` for a hold), so its record and orphan
        // record are made without its `op_lock` (which may not be taken after the handle).
        let made = (|| {
            let mut craw = child.raw_mut();
            let own = raw_flags(&craw);
            raw_set_flags(&mut craw, own | inherited);
            if let Some(c) = &ctx {
                self.set_new_context(&child, &mut craw, c)?;
            }
            self.mark_inode_dirty(&h, &child, &mut craw)?;
            drop(craw);
            self.orphan_add(&h, &child)
        })();
        if let Err(e) = made {
            self.abandon_new_inode(&h, &child, false)?;
            return Err(e);
        }
        child.linkable.store(true, std::sync::atomic::Ordering::Release);
        child.refs.store(1 | crate::inode::REF_UNLINKED, std::sync::atomic::Ordering::Release);
        Ok(child.ino)
    }

    /// A new directory's `.` and `..`: inline where the filesystem has `inline_data` and the
    /// record has room, else in a first block.
    pub(crate) fn init_dir(&self, h: &Handle, dir: &Inode, raw: &mut [u8], parent: InodeNo) -> Result<()> {
        // Never inline when encrypted (`ext4_set_context` clears `MAY_INLINE_DATA`).
        if self.sbi.inline_data && raw_flags(raw) & fi::ENCRYPT_FL == 0 {
            match self.init_inline_dir(dir, raw, parent) {
                Err(Error::NoSpace) => {}
                r => return r,
            }
        }
        let bs = self.sbi.block_size;
        let pblk = self.append_block(h, dir, raw, 0, Pool::Ordinary)?;
        let buf = self.bcache.get_fresh(pblk);
        let mut block = h.write(&buf)?;
        block.fill(0);
        let area = bs as usize - if self.sbi.metadata_csum { rext4_format::dirent::TAIL_SIZE } else { 0 };
        let ft = if self.sbi.filetype { FT_DIR } else { 0 };
        crate::dir::write::put_entry(&mut block, 0, bs, dir.ino.0, 12, b".", ft);
        crate::dir::write::put_entry(&mut block, 12, bs, parent.0, area - 12, b"..", ft);
        if self.sbi.metadata_csum {
            rext4_format::dirent::set_leaf_tail(&mut block, dir.csum_seed);
        }
        Ok(())
    }

    fn remove(&self, parent: InodeNo, name: &[u8], want_dir: bool) -> Result<()> {
        if name == b"." || name == b".." {
            return Err(if want_dir { Error::InvalidInput("cannot remove . or ..") } else { Error::IsDir });
        }
        let (journal, dir) = self.name_op_target(parent, name)?;
        let _dl = self.stats.lock(crate::fs::stats::LockClass::OpLock, &dir.op_lock);
        // Found by its on-disk name from here on; no key is needed to remove one.
        let name = &*self.disk_name(&dir, name, crate::crypto::fname::NameUse::Find)?;
        let child = self.lookup_disk(&dir, name)?;
        let ino = child.ino;
        let _cl = self.stats.lock(crate::fs::stats::LockClass::OpLock, &child.op_lock);
        crate::inode::flags::check_removable(&dir, &child)?;
        let is_dir = child.is_dir();
        match (want_dir, is_dir) {
            (true, false) => return Err(Error::NotDir),
            (false, true) => return Err(Error::IsDir),
            _ => {}
        }
        if is_dir && !self.dir_is_empty(&child)? {
            return Err(Error::NotEmpty);
        }
        let h = journal.start(NAME_CREDITS)?;
        // Odd while the name is being removed: lookups meanwhile do not cache (cache/dcache.rs).
        dir.names_gen.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let removed = self.remove_entry(&h, &dir, name);
        dir.names_gen.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.uncache_name(&dir, name);
        let removed = removed?;
        if removed != ino {
            return Err(Error::InvalidInput("directory changed under its lock"));
        }
        let mut draw = dir.raw_mut();
        let t = self.now();
        raw_touch_cm(&mut draw, t);
        if is_dir {
            let links = raw_links(&draw);
            if links > 2 {
                raw_set_links(&mut draw, links - 1);
            }
        }
        self.mark_inode_dirty(&h, &dir, &mut draw)?;
        drop(draw);
        let links = child.with_disk(|d| d.links_count());
        let left = if is_dir { 0 } else { links.saturating_sub(1) };
        if left == 0 && !self.unlinked_while_held(&child) {
            // The last name, and nobody holds the inode: free everything now, in this handle.
            let damage = self.delete_or_leave(&h, &child)?;
            let op = if want_dir { crate::fs::stats::Op::Rmdir } else { crate::fs::stats::Op::Unlink };
            self.record_after(h, op, damage);
            return Ok(());
        }
        let mut craw = child.raw_mut();
        raw_set_links(&mut craw, left);
        raw_touch_c(&mut craw, t);
        self.mark_inode_dirty(&h, &child, &mut craw)?;
        drop(craw);
        if left == 0 {
            // Still held: an orphan until the last release (inode/orphan.rs).
            self.orphan_add(&h, &child)?;
        }
        Ok(())
    }
}

impl FsInner {
    /// Frees a just-allocated inode whose name could not be added (a full htree index, a
    /// full disk), with any block it got, as the kernel's failed create drops the inode.
    pub(crate) fn abandon_new_inode(&self, h: &Handle, child: &Inode, is_dir: bool) -> Result<()> {
        let owned = self.deletion_checks(h, child)?;
        self.free_all_blocks(h, child, owned)?;
        let mut craw = child.raw_mut();
        self.clear_freed_record(&mut craw);
        self.mark_inode_dirty(h, child, &mut craw)?;
        self.quota_free_inode(h, child, &craw)?;
        drop(craw);
        self.free_inode(h, child.ino, is_dir)
    }

    /// Turns the record of an inode whose blocks were just freed into a deleted inode's:
    /// no links, size or blocks, an empty block map, and the deletion time.
    pub(crate) fn clear_freed_record(&self, raw: &mut [u8]) {
        let t = self.now();
        let mut r = rec(raw);
        r.set_links_count(0);
        r.set_blocks(0);
        r.set_file_acl(0);
        r.set_size(0);
        r.i_block_mut().fill(0);
        let extents = r.flags() & EXTENTS_FL != 0;
        r.set_time(TimeField::Ctime, t);
        // i_dtime holds the low 32 bits of the seconds, as the kernel stores it.
        r.set_dtime(rext4_format::split::lo32(t.sec.cast_unsigned()));
        if extents {
            crate::map::extents_write::init_root(raw);
        }
    }
}

impl Fs {
    /// Creates a regular file `name` in directory `parent` (`open(O_CREAT|O_EXCL)`); `mode`
    /// holds the permission bits.
    pub fn create(&self, parent: InodeNo, name: &[u8], mode: u16, uid: u32, gid: u32) -> Result<Attr> {
        let ino = self.inner.op(crate::fs::stats::Op::Create, || {
            self.inner.create(parent, name, fi::S_IFREG | (mode & 0o7777), uid, gid)
        })?;
        self.getattr(ino)
    }

    /// A regular file with no name in directory `parent`'s part of the disk (`open(2)` with
    /// `O_TMPFILE`), held once: [`Fs::release`] frees it, unless [`Fs::link`] has given it a
    /// name (`linkat(2)` with `AT_EMPTY_PATH`). A crash before either leaves it recorded as an
    /// orphan, freed at the next writable open.
    pub fn tmpfile(&self, parent: InodeNo, mode: u16, uid: u32, gid: u32) -> Result<Attr> {
        let ino =
            self.inner.op(crate::fs::stats::Op::Tmpfile, || self.inner.tmpfile(parent, mode, uid, gid))?;
        self.getattr(ino)
    }

    /// Creates a fifo, socket, or character or block device `name` in `parent` (`mknod(2)`);
    /// `mode` holds the file type and permission bits, `rdev` the device's (major, minor).
    pub fn mknod(
        &self,
        parent: InodeNo,
        name: &[u8],
        mode: u16,
        rdev: (u32, u32),
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        let ino = self.inner.op(crate::fs::stats::Op::Mknod, || {
            let kind = mode & fi::S_IFMT;
            if ![fi::S_IFCHR, fi::S_IFBLK, fi::S_IFIFO, fi::S_IFSOCK, fi::S_IFREG].contains(&kind) {
                return Err(Error::InvalidInput("mknod file type"));
            }
            self.inner.create_node(parent, name, mode, uid, gid, rdev)
        })?;
        self.getattr(ino)
    }

    /// Creates directory `name` in `parent` (`mkdir(2)`).
    pub fn mkdir(&self, parent: InodeNo, name: &[u8], mode: u16, uid: u32, gid: u32) -> Result<Attr> {
        let ino = self.inner.op(crate::fs::stats::Op::Mkdir, || {
            self.inner.create(parent, name, fi::S_IFDIR | (mode & 0o7777), uid, gid)
        })?;
        self.getattr(ino)
    }

    /// Removes the non-directory `name` from `parent` (`unlink(2)`).
    pub fn unlink(&self, parent: InodeNo, name: &[u8]) -> Result<()> {
        self.inner.op(crate::fs::stats::Op::Unlink, || self.inner.remove(parent, name, false))
    }

    /// Removes the empty directory `name` from `parent` (`rmdir(2)`).
    pub fn rmdir(&self, parent: InodeNo, name: &[u8]) -> Result<()> {
        self.inner.op(crate::fs::stats::Op::Rmdir, || self.inner.remove(parent, name, true))
    }
}
