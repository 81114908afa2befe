//! The metadata buffer cache: one entry per filesystem block, in a [`ShardedCache`] (no global
//! lock; see its locking notes). Buffer contents have their own `RwLock`.

use crate::cache::{Cached, ShardedCache};
use crate::dev::BlockDevice;
use crate::error::Result;
use crate::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
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
    /// Serial of the transaction this buffer last joined (0: none), so that a handle touching
    /// a buffer already in its transaction takes no lock. [atomic]
    pub(crate) jserial: AtomicU64,
    /// Set on every use, cleared by the clock hand. [atomic]
    referenced: AtomicBool,
    /// A `Verified` value. [atomic]
    verified: AtomicU8,
}

impl Cached for Buffer {
    fn referenced(&self) -> &AtomicBool {
        &self.referenced
    }
}

impl Buffer {
    pub fn data(&self) -> RwLockReadGuard<'_, Box<[u8]>> {
        self.data.read()
    }

    /// Write access to the contents. Only the journal hands this out (see `Handle::write`),
    /// after adding the buffer to the running transaction.
    pub(crate) fn data_mut(&self) -> RwLockWriteGuard<'_, Box<[u8]>> {
        // Whatever was verified no longer describes what will be there.
        self.verified.store(Verified::None as u8, Ordering::Release);
        self.data.write()
    }

    /// [`Buffer::data_mut`], with the wait for the lock counted in `stats`.
    pub(crate) fn data_mut_timed(&self, stats: &crate::stats::Stats) -> RwLockWriteGuard<'_, Box<[u8]>> {
        self.verified.store(Verified::None as u8, Ordering::Release);
        stats.write(crate::stats::LockClass::BufferData, &self.data)
    }

    /// Runs `check` unless the buffer already passed a check of the same kind.
    pub fn verify(&self, kind: Verified, check: impl FnOnce(&[u8]) -> Result<()>) -> Result<()> {
        if self.verified.load(Ordering::Acquire) == kind as u8 {
            return Ok(());
        }
        check(&self.data())?;
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
    pub fn new(dev: Arc<dyn BlockDevice>, block_size: usize, capacity_bytes: usize) -> Self {
        BufferCache { dev, block_size, cache: ShardedCache::new(capacity_bytes / block_size) }
    }

    /// The buffer for block `blk`, read from the device on a miss. Callers check that `blk`
    /// lies inside the filesystem first.
    pub fn get(&self, blk: u64) -> Result<Arc<Buffer>> {
        self.cache.get_or_load(blk, || {
            let mut data = vec![0u8; self.block_size].into_boxed_slice();
            let off = blk
                .checked_mul(self.block_size as u64)
                .ok_or(std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
            self.dev.read_at(&mut data, off)?;
            Ok(Buffer {
                blk,
                jserial: AtomicU64::new(0),
                data: RwLock::new(data),
                referenced: AtomicBool::new(true),
                verified: AtomicU8::new(Verified::None as u8),
            })
        })
    }

    /// The cached buffer for `blk`, if any, without reading.
    pub fn peek(&self, blk: u64) -> Option<Arc<Buffer>> {
        self.cache.get(blk)
    }

    /// A buffer for a block about to be filled from scratch (newly allocated metadata): the
    /// cached one if there is one, else a zeroed one; the device is not read.
    pub fn get_fresh(&self, blk: u64) -> Arc<Buffer> {
        // One buffer per block even when threads race here (the first insert wins): two
        // copies of a bitmap would hand out the same bit twice.
        let made = self.cache.get_or_load(blk, || {
            Ok(Buffer {
                blk,
                jserial: AtomicU64::new(0),
                data: RwLock::new(vec![0u8; self.block_size].into_boxed_slice()),
                referenced: AtomicBool::new(true),
                verified: AtomicU8::new(Verified::None as u8),
            })
        });
        // Cannot fail: the loader above never returns an error.
        made.unwrap()
    }

    /// Number of cached blocks.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Drops every cached block nobody holds.
    pub fn shrink(&self) {
        self.cache.shrink()
    }
}
