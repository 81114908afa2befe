//! The metadata buffer cache: one entry per filesystem block, in a [`ShardedCache`] (no global
//! lock; see its locking notes). Buffer contents have their own `RwLock`.

use crate::cache::{CacheMark, Cached, ShardedCache};
use crate::dev::BlockDevice;
use crate::error::Result;
use crate::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// What a buffer was last verified as (checksum and structure), so a check runs once per load
/// rather than on every use, and a block read as two different kinds is checked as each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Verified {
    None = 0,
    ExtentBlock = 1,
    DirLeaf = 2,
    DxBlock = 3,
    XattrBlock = 4,
}

/// One cached block.
pub(crate) struct Buffer {
    /// The block number. [immutable]
    pub blk: u64,
    /// Block contents. Written only through a journal handle (`Handle::write`). [own lock]
    data: RwLock<Box<[u8]>>,
    /// Serial of the transaction this buffer last joined (0: none, or revoked since), so that
    /// a handle touching a buffer already in its transaction takes no lock; the writer whose
    /// compare-and-swap moves it to a transaction puts the buffer in. [atomic]
    pub(crate) jserial: AtomicU64,
    /// The buffer cache's marks. [atomic]
    mark: CacheMark,
    /// A `Verified` value. [atomic]
    verified: AtomicU8,
    /// Serial of the transaction whose changes the contents hold and whose commit has not
    /// copied them yet (0: none). A writer of a later transaction that finds one takes that
    /// copy before changing anything (the kernel's frozen data), so a commit marks nothing
    /// buffer by buffer while handles wait. [atomic; changed under `data`'s write lock, or
    /// by the commit of that transaction under the read lock]
    uncopied: AtomicU64,
    /// The copy a writer took for the committing transaction, with that transaction's
    /// serial. [own mutex, leaf]
    frozen: Mutex<Option<(u64, Arc<[u8]>)>>,
    /// `LEAF_SEAL | seed` for a directory leaf edited in place whose tail checksum (with that
    /// seed) is computed in each commit's copy rather than on every edit: once a transaction
    /// instead of once an entry (checksums out of the operations). The cached block's
    /// tail then holds no valid checksum, which nothing reads: a leaf is verified when read
    /// from the device, and one with a deferred seal stays verified through later write
    /// accesses (each leaves it a leaf of the same directory, or changes nothing). 0: the
    /// contents are complete. Dropped where a block changes role: a block allocated anew
    /// (`BufferCache::get_fresh`) and a leaf turned into an htree root (`not_a_leaf`).
    /// [atomic; changed only under `data`'s write lock]
    leaf_seal: AtomicU64,
}

/// The flag in `Buffer::leaf_seal` above the 32-bit seed.
const LEAF_SEAL: u64 = 1 << 32;

impl Cached for Buffer {
    fn mark(&self) -> &CacheMark {
        &self.mark
    }
}

impl Buffer {
    /// A buffer for block `blk` holding `data`, in no transaction and checked for nothing.
    fn new(blk: u64, data: Box<[u8]>) -> Buffer {
        Buffer {
            blk,
            jserial: AtomicU64::new(0),
            data: RwLock::new(data),
            mark: CacheMark::new(),
            verified: AtomicU8::new(Verified::None as u8),
            uncopied: AtomicU64::new(0),
            frozen: Mutex::new(None),
            leaf_seal: AtomicU64::new(0),
        }
    }

    pub(crate) fn data(&self) -> RwLockReadGuard<'_, Box<[u8]>> {
        self.data.read()
    }

    /// Write access to the contents for a change in transaction `serial` (0: outside any
    /// transaction, as at open and close). Only the journal hands this out (see
    /// `Handle::write`), after adding the buffer to that transaction.
    pub(crate) fn data_mut(&self, serial: u64) -> RwLockWriteGuard<'_, Box<[u8]>> {
        let data = self.data.write();
        self.begin_change(&data, serial);
        data
    }

    /// [`Buffer::data_mut`], with the wait for the lock counted in `stats`.
    pub(crate) fn data_mut_timed(
        &self,
        serial: u64,
        stats: &crate::fs::stats::Stats,
    ) -> RwLockWriteGuard<'_, Box<[u8]>> {
        let data = stats.write(crate::fs::stats::LockClass::BufferData, &self.data);
        self.begin_change(&data, serial);
        data
    }

    /// Under the write lock, before a change in transaction `serial`: takes the copy still
    /// owed to an earlier transaction's commit (sealed as the contents were), then forgets
    /// what was verified of the old contents, unless the block is a leaf with a deferred seal
    /// (see `leaf_seal`). Inside the lock, so that a reader who finds the block unverified
    /// and then waits for the lock sees what the writer marked (see `verify`).
    fn begin_change(&self, data: &[u8], serial: u64) {
        let owed = self.uncopied.load(Ordering::Acquire);
        if owed != serial {
            // Owed to the committing transaction (every earlier commit took all of its copies
            // before the next one began), or to one that revoked the block and so never
            // takes it: a wasted copy, replaced by the next.
            if owed != 0 {
                *self.frozen.lock() = Some((owed, self.commit_copy(data)));
            }
            self.uncopied.store(serial, Ordering::Release);
        }
        if self.leaf_seal.load(Ordering::Acquire) == 0 {
            self.verified.store(Verified::None as u8, Ordering::Release);
        }
    }

    /// Drops a deferred leaf seal and what was verified: the block is becoming something
    /// else (`data` is the write guard's contents: the lock is held).
    pub(crate) fn not_a_leaf(&self, _data: &mut [u8]) {
        self.leaf_seal.store(0, Ordering::Release);
        self.verified.store(Verified::None as u8, Ordering::Release);
    }

    /// A copy of `data` (the contents, under their lock) for a commit, with a deferred leaf
    /// checksum filled in.
    fn commit_copy(&self, data: &[u8]) -> Arc<[u8]> {
        let mut copy: Arc<[u8]> = Arc::from(data);
        let seal = self.leaf_seal.load(Ordering::Acquire);
        if seal & LEAF_SEAL != 0 {
            // Cannot fail: `copy` was made just now and is not shared.
            let block = Arc::get_mut(&mut copy).unwrap();
            // The seed is the low half, below LEAF_SEAL.
            rext4_format::dirent::set_leaf_tail(block, rext4_format::split::lo32(seal));
        }
        copy
    }

    /// Called by the writer of a directory leaf that it left complete but for its tail
    /// checksum (computed with `seed` in each commit copy), holding the write lock (`data`
    /// is the guard's contents: the lock is held).
    pub(crate) fn seal_leaf_later(&self, data: &mut [u8], seed: u32) {
        rext4_format::dirent::put_leaf_tail(data, 0);
        self.leaf_seal.store(LEAF_SEAL | u64::from(seed), Ordering::Release);
    }

    /// Marks contents its writer just produced (holding the write lock) as verified as
    /// `kind`: our own changes need no check.
    pub(crate) fn mark_verified(&self, kind: Verified) {
        self.verified.store(kind as u8, Ordering::Release);
    }

    /// For a block the commit completes from atomics (see `FreezeHook`): runs `fill` on the
    /// contents themselves, then copies them. Filling the cached block too, not only the copy,
    /// keeps what `fill` cannot recompute later: a bitmap checksum stays right in its
    /// descriptor block after the bitmap leaves the cache. Called while no handle is open:
    /// the copy is the one the committing transaction is owed.
    pub(crate) fn fill_and_copy(&self, fill: impl FnOnce(&mut [u8])) -> Arc<[u8]> {
        let mut data = self.data.write();
        fill(&mut data);
        self.uncopied.store(0, Ordering::Release);
        Arc::from(&data[..])
    }

    /// The copy of the contents transaction `serial` commits (called by its commit, after
    /// the next transaction started): made now, unless a writer of the next transaction took
    /// it before its change. A buffer that transaction only joined has not changed since.
    pub(crate) fn take_frozen(&self, serial: u64) -> Arc<[u8]> {
        let data = self.data.read();
        // Writers change `uncopied` only under the write lock, so it cannot change here.
        let owed = self.uncopied.load(Ordering::Acquire);
        if owed == serial || owed == 0 {
            let copy = self.commit_copy(&data);
            if owed != 0 {
                self.uncopied.store(0, Ordering::Release);
            }
            return copy;
        }
        drop(data);
        // A writer moved `uncopied` on and stored the copy in the same critical section.
        match self.frozen.lock().take() {
            Some((s, copy)) if s == serial => copy,
            _ => unreachable!("uncopied moved on without a copy"),
        }
    }

    /// Runs `check` unless the buffer already passed a check of the same kind.
    pub(crate) fn verify(&self, kind: Verified, check: impl FnOnce(&[u8]) -> Result<()>) -> Result<()> {
        if self.verified.load(Ordering::Acquire) == kind as u8 {
            return Ok(());
        }
        let data = self.data();
        // Again under the lock: a writer may have marked its change verified meanwhile (a
        // leaf edited in place is only complete in commit copies, see `leaf_seal`).
        if self.verified.load(Ordering::Acquire) == kind as u8 {
            return Ok(());
        }
        check(&data)?;
        self.verified.store(kind as u8, Ordering::Release);
        Ok(())
    }
}

pub(crate) struct BufferCache {
    dev: Arc<dyn BlockDevice>,
    block_size: usize,
    cache: ShardedCache<Buffer>,
}

impl BufferCache {
    /// A cache holding about `capacity_bytes` of blocks.
    pub(crate) fn new(dev: Arc<dyn BlockDevice>, block_size: usize, capacity_bytes: usize) -> Self {
        BufferCache { dev, block_size, cache: ShardedCache::new(capacity_bytes / block_size, 64) }
    }

    /// The buffer for block `blk`, read from the device on a miss. Callers check that `blk`
    /// lies inside the filesystem first.
    pub(crate) fn get(&self, blk: u64) -> Result<Arc<Buffer>> {
        self.cache.get_or_load(blk, || {
            let mut data = vec![0u8; self.block_size].into_boxed_slice();
            let off = blk
                .checked_mul(self.block_size as u64)
                .ok_or(std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
            self.dev.read_at(&mut data, off)?;
            Ok(Buffer::new(blk, data))
        })
    }

    /// The cached buffer for `blk`, if any, without reading.
    pub(crate) fn peek(&self, blk: u64) -> Option<Arc<Buffer>> {
        self.cache.get(blk)
    }

    /// A buffer for a block about to be filled from scratch (newly allocated metadata): the
    /// cached one if there is one, else a zeroed one; the device is not read.
    pub(crate) fn get_fresh(&self, blk: u64) -> Arc<Buffer> {
        // One buffer per block even when threads race here (the first insert wins): two
        // copies of a bitmap would hand out the same bit twice.
        let made = self
            .cache
            .get_or_load(blk, || Ok(Buffer::new(blk, vec![0u8; self.block_size].into_boxed_slice())));
        // Cannot fail: the loader above never returns an error.
        let buf = made.unwrap();
        // A cached block freed by its old owner: whatever it was, it is something new now.
        buf.not_a_leaf(&mut buf.data.write());
        buf
    }

    /// Number of cached blocks.
    pub(crate) fn len(&self) -> usize {
        self.cache.len()
    }

    /// Drops every cached block nobody holds.
    pub(crate) fn shrink(&self) {
        self.cache.shrink()
    }
}

#[cfg(test)]
// Fixtures are built from small known values; a narrowing cast there is the clearest form.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
mod tests {
    use super::*;
    use crate::dev::MemDevice;

    fn cache() -> BufferCache {
        let image: Vec<u8> = (0..4 * 1024).map(|i| (i / 1024) as u8).collect();
        BufferCache::new(Arc::new(MemDevice::new(image)), 1024, 1 << 20)
    }

    #[test]
    fn commit_copy_is_taken_by_the_first_writer() {
        let c = cache();
        let b = c.get(2).unwrap();
        // Changed in transaction 1, whose commit has not copied it yet.
        b.data_mut(1)[2] = 0x11;
        b.data_mut(2)[0] = 0xAA;
        // A second change must not replace the copy taken before the first.
        b.data_mut(2)[1] = 0xBB;
        let frozen = b.take_frozen(1);
        assert_eq!(&frozen[..4], &[2, 2, 0x11, 2], "the copy holds transaction 1's contents");
        assert_eq!(&b.data()[..3], &[0xAA, 0xBB, 0x11]);
    }

    #[test]
    fn commit_copy_is_taken_by_the_commit_without_writers() {
        let c = cache();
        let b = c.get(3).unwrap();
        b.data_mut(1)[0] = 7;
        let frozen = b.take_frozen(1);
        assert_eq!(frozen[0], 7);
        assert!(frozen[1..].iter().all(|&x| x == 3));
        // Taken: later writes copy nothing more.
        b.data_mut(2)[0] = 1;
        assert!(b.frozen.lock().is_none());
        // A transaction that only joined the buffer gets its contents as they are.
        assert_eq!(b.take_frozen(2)[0], 1);
        assert_eq!(b.take_frozen(3)[0], 1);
    }

    #[test]
    fn a_copy_never_taken_is_replaced_by_the_next() {
        // Transaction 1 changed the block, then revoked it: its commit never copies it.
        let c = cache();
        let b = c.get(1).unwrap();
        b.data_mut(1)[0] = 10;
        b.data_mut(2)[0] = 20;
        b.data_mut(3)[0] = 30;
        assert_eq!(b.take_frozen(2)[0], 20, "transaction 2's copy, not the one owed to 1");
        assert_eq!(b.take_frozen(3)[0], 30);
    }

    /// A one-entry leaf of `seed`'s directory, sealed later, as `seal_leaf_in` leaves it.
    fn edit_leaf(b: &Buffer, seed: u32, ino: u8, serial: u64) {
        let mut d = b.data_mut(serial);
        d.fill(0);
        d[0] = ino;
        // rec_len: the whole entry area (the block less the 12-byte tail).
        d[4..6].copy_from_slice(&(1024u16 - 12).to_le_bytes());
        d[6] = 1;
        d[8] = b'a';
        b.seal_leaf_later(&mut d, seed);
        b.mark_verified(Verified::DirLeaf);
    }

    #[test]
    fn deferred_leaf_checksums_are_in_commit_copies() {
        use rext4_format::dirent::verify_leaf_checksum;
        let c = cache();
        let seed = 0x1234_5678;
        // The commit takes the copy.
        let b = c.get(1).unwrap();
        edit_leaf(&b, seed, 7, 1);
        assert_eq!(verify_leaf_checksum(&b.data(), seed), Some(false), "the cached tail is stale");
        assert_eq!(verify_leaf_checksum(&b.take_frozen(1), seed), Some(true));
        // The next writer takes it, sealed as the contents were before its change.
        edit_leaf(&b, seed, 7, 2);
        edit_leaf(&b, seed, 9, 3);
        let frozen = b.take_frozen(2);
        assert_eq!((frozen[0], verify_leaf_checksum(&frozen, seed)), (7, Some(true)));
        // A write access that changes nothing (a writer whose second look found nothing to
        // do) keeps the seal and the verified mark: the block is still that leaf.
        drop(b.data_mut(3));
        assert_eq!(verify_leaf_checksum(&b.take_frozen(3), seed), Some(true));
        let unchecked = |b: &Buffer| {
            let mut checked = false;
            b.verify(Verified::DirLeaf, |_| {
                checked = true;
                Ok(())
            })
            .unwrap();
            !checked
        };
        assert!(unchecked(&b));
        // A leaf turned into something else is sealed no more, and checked again.
        {
            let mut d = b.data_mut(4);
            d[100] = 0xEE;
            b.not_a_leaf(&mut d);
        }
        let frozen = b.take_frozen(4);
        assert_eq!(frozen[100], 0xEE);
        assert_eq!(verify_leaf_checksum(&frozen, seed), Some(false), "sealed though no longer a leaf");
        assert!(!unchecked(&b));
        // So is a block allocated anew.
        let b2 = c.get(2).unwrap();
        edit_leaf(&b2, seed, 5, 1);
        assert_eq!(verify_leaf_checksum(&b2.take_frozen(1), seed), Some(true));
        let b2 = c.get_fresh(2);
        b2.data_mut(2)[0] = 1;
        assert_eq!(verify_leaf_checksum(&b2.take_frozen(2), seed), Some(false));
    }

    #[test]
    fn commit_copies_race_with_writers() {
        // Every round, the copy is the contents the committing transaction left, whoever
        // takes it: the commit, or the next transaction's writer.
        let c = cache();
        let b = c.get(1).unwrap();
        for round in 0..2000u64 {
            let (serial, v) = (2 * round + 1, round as u8);
            b.data_mut(serial)[0] = v;
            let frozen = std::thread::scope(|s| {
                s.spawn(|| b.data_mut(serial + 1)[0] = v.wrapping_add(1));
                b.take_frozen(serial)
            });
            assert_eq!(frozen[0], v, "round {round}");
            assert_eq!(b.data()[0], v.wrapping_add(1));
        }
    }
}
