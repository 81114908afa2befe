//! The checksums ext4 uses: raw crc32c (metadata_csum) and crc16 (gdt_csum / uninit_bg).
//!
//! ext4's `ext4_chksum(seed, data)` is the bare crc32c register update: no inversion on the way in
//! or out. `crc_fast` starts from a given register state but inverts its result (CRC-32/ISCSI's
//! final xor), so we invert that back.
//!
//! `crc_fast` folds with carry-less multiplies (VPCLMULQDQ where the CPU has it), faster on
//! whole blocks than the `crc32c` crate's three-way `crc32` instruction loop and no slower on
//! short inputs (docs/bench.md has the comparison). Journal commits checksum every block they
//! log, directory leaves and bitmaps whole.

use crc_fast::{CrcAlgorithm, Digest};

/// crc32c register update as ext4 and jbd2 use it: `crc32c_le(seed, data)` without inversions.
#[inline]
pub fn crc32c(seed: u32, data: &[u8]) -> u32 {
    let mut d = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(seed));
    d.update(data);
    // A CRC-32 comes back in the low half of crc_fast's u64.
    !crate::split::lo32(d.finalize())
}

/// The filesystem-wide checksum seed for a UUID when `metadata_csum_seed` is absent.
pub fn csum_seed_from_uuid(uuid: &[u8; 16]) -> u32 {
    crc32c(!0, uuid)
}

/// The per-inode checksum seed: the fs seed, then the inode number, then its generation.
pub fn inode_csum_seed(fs_seed: u32, ino: u32, generation: u32) -> u32 {
    let c = crc32c(fs_seed, &ino.to_le_bytes());
    crc32c(c, &generation.to_le_bytes())
}

/// CRC-16 (polynomial 0x8005, reflected) as `lib/crc16.c`; ext4 starts it at `!0`.
pub fn crc16(mut crc: u16, data: &[u8]) -> u16 {
    for &b in data {
        crc ^= u16::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xA001 } else { crc >> 1 };
        }
    }
    crc
}

#[cfg(test)]
// Fixtures are built from small known values; a narrowing cast there is the clearest form.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_known_vector() {
        // Standard check value of CRC-32C over "123456789" is 0xE3069283; the raw form starting
        // at !0 is its complement.
        assert_eq!(!crc32c(!0, b"123456789"), 0xE306_9283);
    }

    /// Every length class of the folding code (short tails, one and several 64-byte blocks,
    /// large buffers) against the bit-by-bit definition, from arbitrary register states.
    #[test]
    fn crc32c_matches_the_definition() {
        fn bitwise(mut crc: u32, data: &[u8]) -> u32 {
            for &b in data {
                crc ^= u32::from(b);
                for _ in 0..8 {
                    crc = if crc & 1 != 0 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
                }
            }
            crc
        }
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for len in [0, 1, 3, 8, 15, 16, 31, 63, 64, 65, 127, 255, 256, 257, 1000, 1024, 4095, 4096, 65536] {
            let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let seed = next() as u32;
            assert_eq!(crc32c(seed, &data), bitwise(seed, &data), "{len} bytes");
        }
    }

    #[test]
    fn crc32c_chains() {
        let whole = crc32c(7, b"hello world");
        let split = crc32c(crc32c(7, b"hello "), b"world");
        assert_eq!(whole, split);
    }

    #[test]
    fn crc16_matches_known_vector() {
        // CRC-16/ARC check value over "123456789" (init 0) is 0xBB3D.
        assert_eq!(crc16(0, b"123456789"), 0xBB3D);
        // CRC-16/MODBUS is the same polynomial started at 0xFFFF: 0x4B37.
        assert_eq!(crc16(0xFFFF, b"123456789"), 0x4B37);
    }
}
