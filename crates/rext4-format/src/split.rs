//! The halves of values ext4 stores across a `_lo` field and a `_hi` field.
//!
//! Each function keeps only the bits its field holds: dropping the rest is the format's split,
//! not an accident, so the narrowing casts live here and nowhere else. A caller whose value may
//! be wider than the whole field (low and high halves together) must check that first.
#![allow(clippy::cast_possible_truncation)]

/// Bits 0-7.
#[inline]
pub const fn lo8(x: u32) -> u8 {
    x as u8
}

/// Bits 0-15.
#[inline]
pub const fn lo16(x: u32) -> u16 {
    x as u16
}

/// Bits 16-31.
#[inline]
pub const fn hi16(x: u32) -> u16 {
    (x >> 16) as u16
}

/// Bits 0-31.
#[inline]
pub const fn lo32(x: u64) -> u32 {
    x as u32
}

/// Bits 32-63.
#[inline]
pub const fn hi32(x: u64) -> u32 {
    (x >> 32) as u32
}

/// Bits 32-47, the high half of a 48-bit field (extent starts, `i_blocks`, `i_file_acl`).
#[inline]
pub const fn hi16_of_48(x: u64) -> u16 {
    (x >> 32) as u16
}

/// Bits 32-39, the high byte of a 40-bit seconds count (the superblock's `_hi` time bytes).
#[inline]
pub const fn hi8_of_40(x: u64) -> u8 {
    (x >> 32) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_rejoin() {
        let x = 0x0000_ABCD_1234_5678u64;
        assert_eq!(u64::from(lo32(x)) | u64::from(hi16_of_48(x)) << 32, x);
        assert_eq!(u64::from(lo32(x)) | u64::from(hi32(x)) << 32, x);
        let y = 0x9876_5432u32;
        assert_eq!(u32::from(lo16(y)) | u32::from(hi16(y)) << 16, y);
        assert_eq!(lo8(0x1ff), 0xff);
        assert_eq!(hi8_of_40(0x12_3456_7890), 0x12);
    }
}
