//! AES-256-XTS over whole data units (IEEE P1619, as the kernel's `xts(aes)` for fscrypt
//! contents): each 16-byte block is encrypted between two XORs with the unit's tweak, the
//! tweak multiplied by x in GF(2^128) from one block to the next. Units are multiples of 16
//! bytes, so no ciphertext stealing.
//!
//! Written here rather than taken from a crate: the blocks of a unit are independent once
//! their tweaks are known, so they go to the cipher 32 at a time, which AES-NI pipelines;
//! a block at a time (as the `xts-mode` crate does) ran contents at 420-500 MB/s against
//! the cipher's 2+ GB/s (docs/design.md, "Encrypted directories"). The tests check this
//! against that crate.

use aes::cipher::{BlockDecrypt, BlockEncrypt, KeyInit};

/// Blocks handed to the cipher at once.
const BATCH: usize = 32;

pub(crate) struct Xts {
    data: aes::Aes256,
    tweak: aes::Aes256,
}

impl Xts {
    /// A cipher over a 64-byte key: the data key, then the tweak key.
    pub(crate) fn new(key: &[u8]) -> Xts {
        // Cannot fail: the key is derived at exactly 64 bytes (keysetup.rs).
        let data = aes::Aes256::new_from_slice(&key[..32]).expect("32-byte half");
        let tweak = aes::Aes256::new_from_slice(&key[32..]).expect("32-byte half");
        Xts { data, tweak }
    }

    /// Encrypts `unit` (a multiple of 16 bytes) in place under tweak `index`.
    pub(crate) fn encrypt_unit(&self, unit: &mut [u8], index: u64) {
        self.unit(unit, index, true);
    }

    /// Decrypts `unit` in place, as [`Xts::encrypt_unit`] undoes.
    pub(crate) fn decrypt_unit(&self, unit: &mut [u8], index: u64) {
        self.unit(unit, index, false);
    }

    fn unit(&self, unit: &mut [u8], index: u64, encrypt: bool) {
        let mut t = aes::Block::from(u128::from(index).to_le_bytes());
        self.tweak.encrypt_block(&mut t);
        let mut t = u128::from_le_bytes(t.into());
        let mut blocks = [aes::Block::default(); BATCH];
        let mut tweaks = [0u128; BATCH];
        for chunk in unit.chunks_mut(16 * BATCH) {
            let n = chunk.len() / 16;
            for (i, b) in chunk.chunks_exact(16).enumerate() {
                tweaks[i] = t;
                let x = u128::from_le_bytes(b.try_into().unwrap_or_default()) ^ t;
                blocks[i] = aes::Block::from(x.to_le_bytes());
                // Times x in GF(2^128), little-endian: the bit shifted out comes back as 0x87.
                t = (t << 1) ^ ((t >> 127) * 0x87);
            }
            if encrypt {
                self.data.encrypt_blocks(&mut blocks[..n]);
            } else {
                self.data.decrypt_blocks(&mut blocks[..n]);
            }
            for (i, b) in chunk.chunks_exact_mut(16).enumerate() {
                let x = u128::from_le_bytes(blocks[i].into()) ^ tweaks[i];
                b.copy_from_slice(&x.to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_match_the_xts_mode_crate_both_ways() {
        let key: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(29).wrapping_add(3)).collect();
        let ours = Xts::new(&key);
        let c1 = aes::Aes256::new_from_slice(&key[..32]).unwrap();
        let c2 = aes::Aes256::new_from_slice(&key[32..]).unwrap();
        let theirs = xts_mode::Xts128::new(c1, c2);
        for (len, index) in
            [(16usize, 0u64), (512, 7), (4096, 123_456), (16 * 33, u64::MAX), (65536, 1 << 40)]
        {
            let plain: Vec<u8> = (0..len).map(|i| u8::try_from((i * 7 + len) % 256).unwrap()).collect();
            let mut a = plain.clone();
            ours.encrypt_unit(&mut a, index);
            let mut b = plain.clone();
            theirs.encrypt_sector(&mut b, u128::from(index).to_le_bytes());
            assert_eq!(a, b, "ciphertext of {len} bytes at {index}");
            ours.decrypt_unit(&mut a, index);
            assert_eq!(a, plain);
        }
    }
}
