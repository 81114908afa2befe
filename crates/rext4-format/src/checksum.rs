//! The checksums ext4 uses: raw crc32c (metadata_csum) and crc16 (gdt_csum / uninit_bg).
//!
//! ext4's `ext4_chksum(seed, data)` is the bare crc32c register update: no inversion on the way in
//! or out. The `crc32c` crate computes the standard (inverted) form, so we invert around it.

/// crc32c register update as ext4 and jbd2 use it: `crc32c_le(seed, data)` without inversions.
#[inline]
pub fn crc32c(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
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
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_known_vector() {
        // Standard check value of CRC-32C over "123456789" is 0xE3069283; the raw form starting
        // at !0 is its complement.
        assert_eq!(!crc32c(!0, b"123456789"), 0xE306_9283);
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
