//! Sharded counters for filesystem-wide free counts (the kernel's `percpu_counter`):
//! every thread adds to its own cache line; only readers (statfs, the superblock at commit)
//! sum the shards.

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

const SHARDS: usize = 16;

#[repr(align(64))]
#[derive(Default)]
struct Padded(AtomicI64);

pub(crate) struct ShardedCounter {
    shards: [Padded; SHARDS],
}

static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static SLOT: Cell<usize> = Cell::new(NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % SHARDS);
}

impl ShardedCounter {
    pub(crate) fn new(v: i64) -> Self {
        let c = ShardedCounter { shards: Default::default() };
        c.shards[0].0.store(v, Ordering::Relaxed);
        c
    }

    /// Adds `d` (negative to subtract) on this thread's shard.
    pub(crate) fn add(&self, d: i64) {
        let i = SLOT.with(|s| s.get());
        self.shards[i].0.fetch_add(d, Ordering::Relaxed);
    }

    /// The exact sum (not atomic with respect to concurrent adds, like `percpu_counter_sum`).
    pub(crate) fn sum(&self) -> i64 {
        self.shards.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }

    /// The sum, never below zero.
    pub(crate) fn sum_positive(&self) -> u64 {
        u64::try_from(self.sum()).unwrap_or(0)
    }
}

/// The filesystem-wide counts the superblock carries.
pub(crate) struct Counters {
    pub free_blocks: ShardedCounter,
    pub free_inodes: ShardedCounter,
    pub dirs: ShardedCounter,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_across_threads() {
        let c = ShardedCounter::new(1000);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        c.add(-1);
                        c.add(2);
                    }
                });
            }
        });
        assert_eq!(c.sum(), 9000);
    }
}
