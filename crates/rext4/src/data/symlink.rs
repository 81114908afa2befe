//! Symbolic links (the kernel's `symlink.c`): fast (target in `i_block`), slow (target in a
//! data block) and inline-data links.

use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::FsInner;
use crate::inode::atime::AtimeFacts;
use crate::inode::Inode;
use crate::num::usize_from;
use rext4_format::inode::{ENCRYPT_FL, S_IFLNK};

impl FsInner {
    /// `readlink(2)`, or a path walk following the link: the target, and with `touch` the
    /// link's access time set as a read sets a file's (the kernel's `do_readlinkat` and
    /// `pick_link` call `touch_atime`). The caller holds no lock.
    pub(crate) fn readlink_touching(&self, inode: &Inode, touch: bool) -> Result<Vec<u8>> {
        let facts = (touch && self.atime_may_change())
            .then(|| inode.with_disk(|r| AtimeFacts::of(r, self.sbi.inode_size)));
        let target = self.readlink(inode)?;
        if let Some(facts) = facts {
            self.touch_atime(inode, &facts);
        }
        Ok(target)
    }

    /// The target of symbolic link `inode`; sets no access time.
    pub(crate) fn readlink(&self, inode: &Inode) -> Result<Vec<u8>> {
        let d = inode.disk();
        if d.file_type() != S_IFLNK {
            return Err(Error::InvalidInput("not a symbolic link"));
        }
        let encrypted = d.flags() & ENCRYPT_FL != 0;
        let stored = self.readlink_stored(inode, encrypted)?;
        if encrypted {
            return self.present_symlink(inode, &stored);
        }
        Ok(stored)
    }

    /// The bytes a symbolic link stores as its target (ciphertext and its length, for an
    /// encrypted one).
    fn readlink_stored(&self, inode: &Inode, encrypted: bool) -> Result<Vec<u8>> {
        let d = inode.disk();
        let ino = inode.ino;
        let size = d.size();
        let bad = |what| corrupt(CorruptKind::Symlink { ino, what });
        if size == 0 {
            return bad("empty target");
        }
        let len = usize_from(size);
        if self.is_fast_symlink(inode) {
            if size >= 60 {
                return bad("fast symlink longer than i_block");
            }
            return Ok(d.i_block_bytes()[..len].to_vec());
        }
        if size >= u64::from(self.sbi.block_size) {
            return bad("target longer than a block");
        }
        let v = if self.has_inline_data(inode) {
            let mut v = vec![0u8; len];
            self.read_data(inode, 0, &mut v)?;
            v
        } else {
            // Through the buffer cache: the block is written through the journal, and may not
            // be home yet.
            match self.map_block(inode, 0)? {
                crate::map::Mapping::Mapped { pblk, unwritten: false, .. } => {
                    self.bread(pblk, Some(ino))?.data()[..len].to_vec()
                }
                _ => return bad("target block missing"),
            }
        };
        // Ciphertext may hold any byte.
        if !encrypted && v.contains(&0) {
            return bad("target shorter than its size");
        }
        Ok(v)
    }
}
