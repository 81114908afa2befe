//! Bit operations on block and inode bitmaps (ext4 bitmaps are little-endian bit arrays: bit
//! `i` is bit `i % 8` of byte `i / 8`).

pub(crate) fn test(map: &[u8], i: usize) -> bool {
    map[i / 8] & (1 << (i % 8)) != 0
}

pub(crate) fn set(map: &mut [u8], i: usize) {
    map[i / 8] |= 1 << (i % 8);
}

pub(crate) fn clear(map: &mut [u8], i: usize) {
    map[i / 8] &= !(1 << (i % 8));
}

/// Sets bits `from..to`.
pub(crate) fn set_range(map: &mut [u8], from: usize, to: usize) {
    for i in from..to {
        set(map, i);
    }
}

/// The first clear bit in `start..end`, if any; whole bytes of set bits are skipped at once.
pub(crate) fn find_zero(map: &[u8], start: usize, end: usize) -> Option<usize> {
    let mut i = start;
    while i < end {
        if i % 8 == 0 && i + 8 <= end && map[i / 8] == 0xFF {
            i += 8;
            continue;
        }
        if !test(map, i) {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// The first run of `len` clear bits in `start..end`, else the longest shorter run (at least
/// one bit), as `(first, len)`.
pub(crate) fn find_zero_run(map: &[u8], start: usize, end: usize, len: usize) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize)> = None;
    let mut i = start;
    while i < end {
        let Some(z) = find_zero(map, i, end) else { break };
        let mut e = z + 1;
        while e < end && e - z < len && !test(map, e) {
            e += 1;
        }
        if e - z >= len {
            return Some((z, len));
        }
        if best.is_none_or(|(_, l)| e - z > l) {
            best = Some((z, e - z));
        }
        i = e;
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_bits_and_runs() {
        let mut m = vec![0xFFu8; 8];
        assert_eq!(find_zero(&m, 0, 64), None);
        clear(&mut m, 13);
        assert_eq!(find_zero(&m, 0, 64), Some(13));
        assert_eq!(find_zero(&m, 14, 64), None);
        for i in 40..50 {
            clear(&mut m, i);
        }
        assert_eq!(find_zero_run(&m, 0, 64, 4), Some((40, 4)));
        assert_eq!(find_zero_run(&m, 0, 64, 20), Some((40, 10)));
        assert_eq!(find_zero_run(&m, 45, 64, 2), Some((45, 2)));
        set_range(&mut m, 40, 50);
        assert_eq!(find_zero_run(&m, 0, 64, 1), Some((13, 1)));
        assert!(test(&m, 40));
    }
}
