//! A small deterministic generator (xorshift64*): demo trees and benchmark offsets need
//! repeatable numbers, nothing better.

pub struct Rng(pub u64);

impl Rng {
    // A generator, not an iterator: it never ends, and callers want one number at a time.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next().to_le_bytes()[0]).collect()
    }
}
