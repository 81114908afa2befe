//! Who may allocate the root-reserved blocks (`s_r_blocks_count`): the kernel lets a caller
//! with `CAP_SYS_RESOURCE`, or the superblock's `s_def_resuid` / `s_def_resgid`, fill them
//! (`ext4_has_free_clusters`), so root can still work on a filesystem users have filled. The
//! engine has no caller identity on its write paths; the caller (the FUSE daemon, for the
//! request's sender) marks the calls made for such a caller, on the calling thread, as the
//! kernel's checks read the current task's credentials. [`Pool`] says which of the held-back
//! blocks (root reserve, metadata slack, delayed writes' reservations) an allocation may take.

use std::cell::Cell;

/// How far into the free blocks an allocation may reach: the tiers of the kernel's
/// `ext4_has_free_clusters`. Every tier leaves the blocks delayed writes reserved, but to
/// their own writeback ([`writing_back`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Pool {
    /// Data allocated at once, and directory, attribute and symlink blocks: leaves the
    /// metadata slack, and the root reserve unless the caller may use it.
    Ordinary,
    /// Blocks delayed writes reserved, allocated by their writeback: taken from those.
    Reserved,
    /// Index blocks of extent trees and block maps, and quota files' blocks: metadata a
    /// change cannot do without once it has begun (`EXT4_GET_BLOCKS_METADATA_NOFAIL`). May
    /// take the slack and the root reserve, which ordinary allocations leave for it, so that
    /// writeback, unwritten conversions and punches find their tree blocks on a full disk.
    NoFail,
}

thread_local! {
    /// Whether allocations on this thread may take the root-reserved blocks.
    static MAY_USE: Cell<bool> = const { Cell::new(false) };
    /// Whether this thread is writing delayed writes back (their blocks and the metadata
    /// their mapping needs come out of the reservations and the slack).
    static WRITING_BACK: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, writeback's allocation of delayed writes' blocks, as such: metadata it
/// allocates (extent splits, unwritten conversions) may take what the dirty pages reserved,
/// since the pages being written back are among them (the kernel takes their dirty clusters
/// off as it allocates their blocks, before the extent is inserted).
pub(crate) fn writing_back<T>(f: impl FnOnce() -> T) -> T {
    with_flag(&WRITING_BACK, f)
}

pub(crate) fn in_writeback() -> bool {
    WRITING_BACK.with(Cell::get)
}

/// Runs `f` with the root-reserved blocks available to the allocations it makes on this
/// thread (for a caller ext4 would let use them). Nests; restored even if `f` unwinds.
pub fn with_reserved_blocks<T>(f: impl FnOnce() -> T) -> T {
    with_flag(&MAY_USE, f)
}

/// Runs `f` with the thread's `flag` set, restoring it after (also if `f` unwinds): a
/// privilege the caller grants the calls it makes on this thread.
pub(crate) fn with_flag<T>(flag: &'static std::thread::LocalKey<Cell<bool>>, f: impl FnOnce() -> T) -> T {
    struct Restore(&'static std::thread::LocalKey<Cell<bool>>, bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            self.0.with(|m| m.set(self.1));
        }
    }
    let _restore = Restore(flag, flag.with(|m| m.replace(true)));
    f()
}

/// The kernel's rule for who may fill the reserve (`ext4_has_free_clusters`): a caller with
/// `CAP_SYS_RESOURCE` (`sys_resource`), the superblock's `s_def_resuid`, or a member
/// (`in_group`) of `s_def_resgid` when that is not root's group.
pub fn may_use(
    sb: &rext4_format::superblock::Superblock,
    uid: u32,
    in_group: impl Fn(u32) -> bool,
    sys_resource: bool,
) -> bool {
    let (resuid, resgid) = (u32::from(sb.s_def_resuid.get()), u32::from(sb.s_def_resgid.get()));
    sys_resource || uid == resuid || (resgid != 0 && in_group(resgid))
}

/// Whether the current call may take the root-reserved blocks.
pub(crate) fn may_use_reserved() -> bool {
    MAY_USE.with(Cell::get)
}

impl crate::fs::FsInner {
    /// The root-reserved blocks the current call must leave free: none for a caller marked
    /// with [`with_reserved_blocks`].
    pub(crate) fn root_reserve(&self) -> u64 {
        if may_use_reserved() {
            0
        } else {
            self.sbi.sb.r_blocks_count()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::with_reserved_blocks;
    use crate::test_image::{fsck_clean, mkfs_image, open_mem};

    /// Writes stop at the root reserve, and go on into it inside `with_reserved_blocks`, with
    /// delayed allocation (small writes) and without (large ones).
    #[test]
    fn the_reserve_is_for_marked_calls() {
        for chunk in [4096usize, 1 << 20] {
            let (fs, dev) = open_mem(mkfs_image(None, &["-m", "10"], "32M"));
            let ino = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
            let buf = vec![1u8; chunk];
            let fill = |mut off: u64| -> u64 {
                loop {
                    match fs.write(ino, off, &buf) {
                        Ok(n) if n > 0 => off += n as u64,
                        _ => break,
                    }
                    if fs.fsync(ino).is_err() {
                        break;
                    }
                }
                off
            };
            let user = fill(0);
            let root = with_reserved_blocks(|| fill(user));
            // 10% of 32 MiB is kept for root, less what metadata takes.
            assert!(root > user + (2 << 20), "chunk {chunk}: {user} then {root}");
            assert!(!super::may_use_reserved(), "restored after the call");
            fs.unmount().unwrap();
            drop(fs);
            fsck_clean(&dev.snapshot());
        }
    }
}
