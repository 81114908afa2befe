//! Rename (the kernel's `ext4_rename`, with `lock_rename`'s discipline): move a name within
//! or across directories, replacing a target (`RENAME_NOREPLACE` forbids that), or swap two
//! names (`RENAME_EXCHANGE`); directories moved across parents get their `..` and both parents'
//! link counts fixed; a directory cannot move into itself (`EINVAL`). With `RENAME_WHITEOUT`
//! (overlayfs's) the old name is not removed but names a new whiteout, a character device 0:0,
//! made in the same transaction (`ext4_whiteout_for_rename`).
//!
//! # Locking
//! Cross-directory renames first take the filesystem's rename lock (the kernel's
//! `s_vfs_rename_mutex`), which keeps the ancestry check true until the move is done; renames
//! within one directory do not. Then the parents' `op_lock`s, then those of the inodes moved
//! or replaced (parent before child, as in every name operation; ascending inode order within
//! each group, each inode once); then the handle.

use crate::crypto::fname::NameUse;
use crate::dir::dirent_type;
use crate::error::{Error, Result};
use crate::fs::{Fs, FsInner};
use crate::inode::write::{raw_links, raw_set_links, raw_touch_c, raw_touch_cm};
use crate::inode::Inode;
use crate::namei::create::LINK_MAX;
use rext4_format::dirent::{FT_CHRDEV, FT_DIR};
use rext4_format::inode::ENCRYPT_FL;
use rext4_format::InodeNo;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// `renameat2` flags.
pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;
pub const RENAME_WHITEOUT: u32 = 4;

const CREDITS: u32 = 40;

impl FsInner {
    /// Whether `dir` is `ancestor` or lies below it (walking `..` up to the root).
    fn is_within(&self, dir: InodeNo, ancestor: InodeNo) -> Result<bool> {
        let mut cur = self.iget_live(dir)?;
        for _ in 0..65536 {
            if cur.ino == ancestor {
                return Ok(true);
            }
            if cur.ino == rext4_format::types::ROOT_INO {
                return Ok(false);
            }
            cur = self.lookup(&cur, b"..")?;
        }
        Err(Error::Loop)
    }

    fn bump_links(&self, h: &crate::jbd2::transaction::Handle, inode: &Inode, delta: i32) -> Result<()> {
        let is_dir = inode.is_dir();
        let mut raw = inode.raw_mut();
        let links = raw_links(&raw);
        let next = i32::from(links) + delta;
        // dir_nlink: a directory at the limit (1 = "many") stays there, and one reaching it
        // goes there, as in mkdir (an image's count may be anything up to 65535).
        let next = if is_dir && (links == 1 || next >= i32::from(LINK_MAX)) {
            1
        } else {
            u16::try_from(next.max(0)).unwrap_or(u16::MAX)
        };
        raw_set_links(&mut raw, next);
        raw_touch_c(&mut raw, self.now());
        self.mark_inode_dirty(h, inode, &mut raw)
    }

    #[allow(clippy::too_many_arguments)]
    fn rename(
        &self,
        op: InodeNo,
        on: &[u8],
        np: InodeNo,
        nn: &[u8],
        flags: u32,
        owner: (u32, u32),
    ) -> Result<()> {
        let exchange = flags & RENAME_EXCHANGE != 0;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT) != 0
            || exchange && flags & (RENAME_NOREPLACE | RENAME_WHITEOUT) != 0
        {
            return Err(Error::InvalidInput("rename flags"));
        }
        for n in [on, nn] {
            if n == b"." || n == b".." {
                return Err(Error::Busy);
            }
        }
        let (journal, odir) = self.name_op_target(op, on)?;
        let (_, ndir) = self.name_op_target(np, nn)?;
        let _cross =
            (op != np).then(|| self.stats.lock(crate::fs::stats::LockClass::Rename, &self.rename_lock));
        // In encrypted directories the names are found by their on-disk form (crypto/mod.rs);
        // a new name needs the key, checked below in the kernel's order.
        let encrypted = (odir.flags() | ndir.flags()) & ENCRYPT_FL != 0;
        let on_disk = self.disk_name(&odir, on, NameUse::Find)?;
        let nn_found = match self.disk_name(&ndir, nn, NameUse::Find) {
            Ok(d) => Some(d),
            Err(Error::NotFound) if encrypted => None,
            Err(e) => return Err(e),
        };
        let src = self.lookup_disk(&odir, &on_disk)?;
        let src_ino = src.ino;
        let dst = match nn_found.as_deref().map(|d| self.lookup_disk(&ndir, d)) {
            Some(Ok(i)) => Some(i),
            None | Some(Err(Error::NotFound)) => None,
            Some(Err(e)) => return Err(e),
        };
        let dst_ino = dst.as_ref().map(|d| d.ino);
        // The kernel's order of checks (`do_renameat2`): the flags, then the source moving
        // below itself, then the target being an ancestor of the source.
        if flags & RENAME_NOREPLACE != 0 && dst_ino.is_some() {
            return Err(Error::Exists);
        }
        if flags & RENAME_EXCHANGE != 0 && dst_ino.is_none() {
            return Err(Error::NotFound);
        }
        if dst.is_none() {
            self.check_new_name(&ndir, nn)?;
        }
        if src.is_dir() && op != np && self.is_within(np, src_ino)? {
            return Err(Error::InvalidInput("directory moved into itself"));
        }
        if let Some(d) = &dst {
            if d.is_dir() && op != np && d.ino != src_ino && self.is_within(op, d.ino)? {
                return Err(if flags & RENAME_EXCHANGE != 0 {
                    Error::InvalidInput("directory moved into itself")
                } else {
                    Error::NotEmpty
                });
            }
        }
        if encrypted {
            // `fscrypt_prepare_rename`: names without the key are no-key names, which cannot
            // be given; across directories, each inode must be of its new directory's policy.
            self.require_key(&odir)?;
            self.require_key(&ndir)?;
            if op != np
                && (!self.permitted_context(&ndir, &src)?
                    || flags & RENAME_EXCHANGE != 0
                        && dst.as_ref().map(|d| self.permitted_context(&odir, d)).transpose()? == Some(false))
            {
                return Err(Error::CrossPolicy);
            }
        }
        // A name replaced keeps its entry (in a casefolded directory, maybe another case of
        // it); a new one is made from the name given.
        let nn_disk = match nn_found {
            Some(d) if dst.is_some() => d,
            _ => self.disk_name(&ndir, nn, NameUse::Make)?,
        };
        let (on, nn) = (&*on_disk, &*nn_disk);
        // Replacing a file by one written a moment ago (write a temporary, rename it over the
        // old): the new file's delayed writes go to the disk first, so that a crash after the
        // rename's commit shows its data, not holes (the kernel's `auto_da_alloc`).
        if dst.as_ref().is_some_and(|d| d.ino != src_ino)
            && src.file_type() == Some(crate::attr::FileType::RegularFile)
        {
            self.writeback_inode(&src)?;
        }
        // Lock the parents first (as every name operation does: parent before child), then the
        // inodes being moved or replaced; each group in ascending inode order, each inode once.
        let mut parents: Vec<&Arc<Inode>> = vec![&odir, &ndir];
        parents.sort_by_key(|i| i.ino.0);
        parents.dedup_by_key(|i| i.ino.0);
        let mut children: Vec<&Arc<Inode>> = std::iter::once(&src).chain(dst.as_ref()).collect();
        children.retain(|c| parents.iter().all(|p| p.ino != c.ino));
        children.sort_by_key(|i| i.ino.0);
        children.dedup_by_key(|i| i.ino.0);
        let _guards: Vec<_> = parents
            .iter()
            .chain(children.iter())
            .map(|i| self.stats.lock(crate::fs::stats::LockClass::OpLock, &i.op_lock))
            .collect();
        // Look again under the locks: the names may have changed meanwhile.
        if self.lookup_disk(&odir, on)?.ino != src_ino
            || self.lookup_disk(&ndir, nn).ok().map(|d| d.ino) != dst_ino
        {
            return Err(Error::Busy);
        }
        if dst_ino == Some(src_ino) {
            return Ok(()); // two names of one inode: nothing to do, as POSIX says
        }
        // `may_delete` of the source, then `may_create` or `may_delete` of the target.
        crate::inode::flags::check_removable(&odir, &src)?;
        match &dst {
            None => crate::inode::flags::check_dir_open(&ndir)?,
            Some(d) => crate::inode::flags::check_removable(&ndir, d)?,
        }
        let replaced = dst.as_ref().filter(|_| flags & RENAME_EXCHANGE == 0);
        if let Some(d) = replaced {
            match (src.is_dir(), d.is_dir()) {
                (true, false) => return Err(Error::NotDir),
                (false, true) => return Err(Error::IsDir),
                _ => {}
            }
        }
        // `ext4_rename` / `ext4_cross_rename`: nothing leaves the project its new directory
        // passes on (the VFS's type checks come first, the emptiness check after).
        self.check_same_project(&ndir, &src)?;
        if let (Some(d), true) = (&dst, flags & RENAME_EXCHANGE != 0) {
            self.check_same_project(&odir, d)?;
        }
        if let Some(d) = replaced {
            if src.is_dir() && d.is_dir() && !self.dir_is_empty(d)? {
                return Err(Error::NotEmpty);
            }
        }
        let h = journal.start(CREDITS)?;
        // Made first, as the kernel does: a rename that cannot have its whiteout changes nothing.
        let whiteout = match flags & RENAME_WHITEOUT {
            0 => None,
            _ => Some(self.new_whiteout(&h, &odir, owner)?),
        };
        let whiteout_named = std::cell::Cell::new(false);
        let src_ft = dirent_type(src.disk().mode());
        let t = self.now();
        // Names leave the cache before the directories change (see cache/dcache.rs): each distinct
        // directory's generation goes odd now and even again after.
        let dirs: &[&Arc<Inode>] = if op == np { &[&odir] } else { &[&odir, &ndir] };
        for d in dirs {
            d.names_gen.fetch_add(1, Ordering::AcqRel);
        }
        let mut damage = None;
        let result = (|| -> Result<()> {
            if flags & RENAME_EXCHANGE != 0 {
                // Cannot fail: RENAME_EXCHANGE with no target returned above.
                let d = dst.as_ref().unwrap();
                self.set_entry(&h, &ndir, nn, src_ino, src_ft)?;
                self.set_entry(&h, &odir, on, d.ino, dirent_type(d.disk().mode()))?;
                if op != np {
                    self.reparent(&h, &src, np, &odir, &ndir)?;
                    self.reparent(&h, d, op, &ndir, &odir)?;
                }
                return Ok(());
            }
            match &dst {
                Some(d) => {
                    self.set_entry(&h, &ndir, nn, src_ino, src_ft)?;
                    // The replaced inode loses this name; a directory loses its `..` too.
                    damage = self.drop_link(&h, &ndir, d)?;
                }
                None => self.add_entry(&h, &ndir, nn, src_ino, src_ft)?,
            }
            match &whiteout {
                Some(w) => {
                    self.set_entry(&h, &odir, on, w.ino, FT_CHRDEV)?;
                    whiteout_named.set(true);
                }
                None => {
                    self.remove_entry(&h, &odir, on)?;
                }
            }
            if op != np {
                self.reparent(&h, &src, np, &odir, &ndir)?;
            }
            Ok(())
        })();
        for d in dirs {
            d.names_gen.fetch_add(1, Ordering::AcqRel);
        }
        self.uncache_name(&odir, on);
        self.uncache_name(&ndir, nn);
        if let (Err(_), Some(w), false) = (&result, &whiteout, whiteout_named.get()) {
            // Not named yet: dropped, as the kernel's failed rename drops it.
            self.abandon_new_inode(&h, w, false)?;
        }
        result?;
        {
            let mut raw = src.raw_mut();
            raw_touch_c(&mut raw, t);
            self.mark_inode_dirty(&h, &src, &mut raw)?;
        }
        for d in [&odir, &ndir] {
            let mut raw = d.raw_mut();
            raw_touch_cm(&mut raw, t);
            self.mark_inode_dirty(&h, d, &mut raw)?;
            if op == np {
                break;
            }
        }
        // A replaced inode that could not be freed: the rename stands, as the kernel's does.
        self.record_after(h, crate::fs::stats::Op::Rename, damage);
        Ok(())
    }

    /// A new whiteout for a name in `dir` (`ext4_whiteout_for_rename`): a character device
    /// 0:0 with no permission bits, one link, owned by `owner`.
    fn new_whiteout(
        &self,
        h: &crate::jbd2::transaction::Handle,
        dir: &Inode,
        owner: (u32, u32),
    ) -> Result<Arc<Inode>> {
        let mode = rext4_format::inode::S_IFCHR;
        let inherited = crate::inode::flags::inherited_flags(dir.flags(), mode);
        let w = self.new_inode(h, dir, mode, owner.0, owner.1, 1)?;
        let mut raw = w.raw_mut();
        crate::namei::create::make_special(&mut raw, inherited, (0, 0));
        self.mark_inode_dirty(h, &w, &mut raw)?;
        drop(raw);
        Ok(w)
    }

    /// A directory `child` moved from `from` to `to` (parent `to_ino`): its `..` and both
    /// parents' link counts follow. Non-directories need nothing.
    fn reparent(
        &self,
        h: &crate::jbd2::transaction::Handle,
        child: &Inode,
        to_ino: InodeNo,
        from: &Inode,
        to: &Inode,
    ) -> Result<()> {
        if !child.is_dir() {
            return Ok(());
        }
        self.set_entry(h, child, b"..", to_ino, FT_DIR)?;
        self.bump_links(h, from, -1)?;
        self.bump_links(h, to, 1)
    }

    /// Removes one link of `victim`, whose name in `dir` was just taken over; frees it when
    /// no name is left and nobody holds it (returning the damage that kept it from being freed,
    /// see `delete_or_leave`), else makes it an orphan.
    fn drop_link(
        &self,
        h: &crate::jbd2::transaction::Handle,
        dir: &Inode,
        victim: &Inode,
    ) -> Result<Option<crate::error::Corrupt>> {
        let is_dir = victim.is_dir();
        let links = victim.disk().links_count();
        let left = if is_dir { 0 } else { links.saturating_sub(1) };
        if is_dir {
            // The victim's `..` no longer counts for `dir`.
            self.bump_links(h, dir, -1)?;
        }
        if left == 0 && !self.unlinked_while_held(victim) {
            return self.delete_or_leave(h, victim);
        }
        let mut raw = victim.raw_mut();
        raw_set_links(&mut raw, left);
        raw_touch_c(&mut raw, self.now());
        self.mark_inode_dirty(h, victim, &mut raw)?;
        drop(raw);
        if left == 0 {
            // Still held: an orphan until the last release (inode/orphan.rs).
            self.orphan_add(h, victim)?;
        }
        Ok(None)
    }
}

impl Fs {
    /// `renameat2(2)`: moves `old_name` in `old_parent` to `new_name` in `new_parent`.
    /// `flags` may hold [`RENAME_NOREPLACE`], [`RENAME_EXCHANGE`] or [`RENAME_WHITEOUT`] (a
    /// whiteout made by this call is owned by root; see [`Fs::rename_as`]).
    pub fn rename(
        &self,
        old_parent: InodeNo,
        old_name: &[u8],
        new_parent: InodeNo,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.rename_as(old_parent, old_name, new_parent, new_name, flags, 0, 0)
    }

    /// [`Fs::rename`] for the caller `uid`/`gid`, who owns the whiteout that
    /// [`RENAME_WHITEOUT`] leaves (the kernel gives it the caller's ids).
    #[allow(clippy::too_many_arguments)]
    pub fn rename_as(
        &self,
        old_parent: InodeNo,
        old_name: &[u8],
        new_parent: InodeNo,
        new_name: &[u8],
        flags: u32,
        uid: u32,
        gid: u32,
    ) -> Result<()> {
        self.inner.op(crate::fs::stats::Op::Rename, || {
            self.inner.rename(old_parent, old_name, new_parent, new_name, flags, (uid, gid))
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::inode::write::{raw_links, raw_set_links};
    use crate::test_image::{mkfs_image, open_mem};

    /// A directory moved into a parent whose link count is already the most the field holds
    /// (a damaged or foreign image) leaves the parent at 1 ("many"), not wrapped to 0.
    #[test]
    fn moving_a_directory_into_a_full_parent_keeps_its_count_nonzero() {
        let (fs, _dev) = open_mem(mkfs_image(None, &[], "16M"));
        let root = fs.root();
        let a = fs.mkdir(root, b"a", 0o755, 0, 0).unwrap().ino;
        let b = fs.mkdir(root, b"b", 0o755, 0, 0).unwrap().ino;
        fs.mkdir(a, b"c", 0o755, 0, 0).unwrap();
        let parent = fs.inner.iget(b).unwrap();
        raw_set_links(&mut parent.raw_mut(), u16::MAX);
        fs.rename(a, b"c", b, b"c", 0).unwrap();
        assert_eq!(raw_links(&parent.raw()), 1);
    }
}
