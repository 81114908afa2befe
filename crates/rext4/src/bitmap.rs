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

/// The first clear bit in `start..end`, if any; aligned 64-bit words of set bits are skipped
/// at once (a nearly full inode bitmap is scanned on every allocation).
pub(crate) fn find_zero(map: &[u8], start: usize, end: usize) -> Option<usize> {
    let end = end.min(map.len() * 8);
    let mut i = start;
    while i < end {
        if i % 64 == 0 && i + 64 <= end {
            let w = u64::from_le_bytes(map[i / 8..i / 8 + 8].try_into().ok()?);
            if w == u64::MAX {
                i += 64;
                continue;
            }
            // Little-endian bit order: the lowest clear bit of the word is the first.
            return Some(i + (!w).trailing_zeros() as usize);
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

    #[test]
    fn word_scan_matches_bit_scan() {
        let mut rng = 0x1234_5678_9abc_def0u64;
        for _ in 0..300 {
            let mut m = vec![0xFFu8; 40];
            for _ in 0..(rng % 4) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                clear(&mut m, (rng % 320) as usize);
            }
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let (a, b) = ((rng % 330) as usize, ((rng >> 20) % 330) as usize);
            let (start, end) = (a.min(b), a.max(b));
            let slow = (start..end.min(320)).find(|&i| !test(&m, i));
            assert_eq!(find_zero(&m, start, end), slow, "{start}..{end}");
        }
    }
}
