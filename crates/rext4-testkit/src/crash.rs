//! Crash images from a recorded `CrashDevice` run.

use crate::rng::Rng;

/// Every image a crash could leave, built one at a time (a long run has too many to hold):
/// the state at each flush, and the same with a random subset of the writes up to the next
/// flush (disks reorder unflushed writes). Only every `stride`th flush is handed to `f`, as
/// `(op index of the flush, image)`.
pub fn for_each_crash_image(
    ops: &[rext4::dev::Op],
    initial: &[u8],
    seed: u64,
    stride: usize,
    mut f: impl FnMut(usize, &[u8]),
) {
    let mut rng = Rng::new(seed);
    let flushes: Vec<usize> =
        ops.iter().enumerate().filter(|(_, o)| matches!(o, rext4::dev::Op::Flush)).map(|(i, _)| i).collect();
    let mut base = initial.to_vec();
    let mut done = 0;
    for (n, &k) in flushes.iter().enumerate() {
        rext4::dev::apply_ops(&mut base, ops, done, k, |_| true);
        done = k;
        let chosen = n % stride.max(1) == 0;
        if chosen {
            f(k, &base);
        }
        let next = flushes.get(n + 1).copied().unwrap_or(ops.len());
        if next > k + 2 {
            let mask = rng.next_u64();
            if chosen {
                let mut img = base.clone();
                rext4::dev::apply_ops(&mut img, ops, k + 1, next, |i| (mask >> (i % 64)) & 1 == 1);
                f(k, &img);
            }
        }
    }
}

/// The flushes recorded in `ops`.
pub fn flush_count(ops: &[rext4::dev::Op]) -> usize {
    ops.iter().filter(|o| matches!(o, rext4::dev::Op::Flush)).count()
}
