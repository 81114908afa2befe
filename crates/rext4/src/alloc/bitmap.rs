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

/// Sets bits `from..to` (whole bytes at once in the middle).
pub(super) fn set_range(map: &mut [u8], from: usize, to: usize) {
    fill_range(map, from, to, true);
}

/// Clears bits `from..to`.
pub(super) fn clear_range(map: &mut [u8], from: usize, to: usize) {
    fill_range(map, from, to, false);
}

fn fill_range(map: &mut [u8], from: usize, to: usize, on: bool) {
    let mut i = from;
    while i < to {
        if i.is_multiple_of(8) && i + 8 <= to {
            let bytes = (to - i) / 8;
            map[i / 8..i / 8 + bytes].fill(if on { 0xFF } else { 0 });
            i += bytes * 8;
            continue;
        }
        if on {
            set(map, i);
        } else {
            clear(map, i);
        }
        i += 1;
    }
}

/// The first clear bit in `start..end`, if any; aligned 64-bit words of set bits are skipped
/// at once (a nearly full inode bitmap is scanned on every allocation).
pub(super) fn find_zero(map: &[u8], start: usize, end: usize) -> Option<usize> {
    let end = end.min(map.len() * 8);
    let mut i = start;
    while i < end {
        if i.is_multiple_of(64) && i + 64 <= end {
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

/// The first clear bit at a multiple of `len` in `start..end` that begins `len` clear bits
/// (an inode-table block's worth of free inodes, `len` a power of two; runs over 64 bits are
/// looked for as 64). Whole words of set bits are skipped at once.
pub(super) fn find_zero_aligned(map: &[u8], start: usize, end: usize, len: usize) -> Option<usize> {
    let end = end.min(map.len() * 8);
    let len = len.clamp(1, 64);
    debug_assert!(len.is_power_of_two());
    let mask = if len == 64 { u64::MAX } else { (1u64 << len) - 1 };
    let mut i = start.next_multiple_of(len);
    while i + len <= end {
        let word = i / 64 * 64;
        if word + 64 <= end {
            let w = u64::from_le_bytes(map[word / 8..word / 8 + 8].try_into().ok()?);
            if w == u64::MAX {
                i = word + 64;
                continue;
            }
            if (w >> (i - word)) & mask == 0 {
                return Some(i);
            }
        } else if (i..i + len).all(|b| !test(map, b)) {
            return Some(i);
        }
        i += len;
    }
    None
}

/// The first run of `len` clear bits in `start..end`, else the longest shorter run (at least
/// one bit), as `(first, len)`.
#[cfg(test)]
pub(super) fn find_zero_run(map: &[u8], start: usize, end: usize, len: usize) -> Option<(usize, usize)> {
    find_free_run(map, start, end, len, |_| None)
}

/// [`find_zero_run`] where bits in the ranges `blocked` reports also count as set:
/// `blocked(i)` is the first range (`start..end`) that ends after bit `i`, if any.
pub(super) fn find_free_run(
    map: &[u8],
    start: usize,
    end: usize,
    len: usize,
    blocked: impl Fn(usize) -> Option<(usize, usize)>,
) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize)> = None;
    for (z, l) in free_runs(map, start, end, len, blocked) {
        if l >= len {
            return Some((z, len));
        }
        if best.is_none_or(|(_, b)| l > b) {
            best = Some((z, l));
        }
    }
    best
}

/// The runs of clear bits in `start..end` outside what `blocked` reports (as for
/// [`find_free_run`]), in order, each cut at `cap` bits (the rest of a longer run comes next),
/// as `(first, len)`.
pub(super) fn free_runs<'a>(
    map: &'a [u8],
    start: usize,
    end: usize,
    cap: usize,
    blocked: impl Fn(usize) -> Option<(usize, usize)> + 'a,
) -> impl Iterator<Item = (usize, usize)> + 'a {
    let mut i = start;
    std::iter::from_fn(move || {
        while i < end {
            let z = find_zero(map, i, end)?;
            let next = blocked(z);
            if let Some((b, e)) = next {
                if b <= z {
                    i = e.max(z + 1);
                    continue;
                }
            }
            let stop = next.map_or(end, |(b, _)| b.min(end));
            let mut e = z + 1;
            while e < stop && e - z < cap && !test(map, e) {
                e += 1;
            }
            i = e;
            return Some((z, e - z));
        }
        None
    })
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
    fn blocked_ranges_count_as_set() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _ in 0..2000 {
            let mut m = vec![0u8; 40];
            for _ in 0..(next() % 40) {
                set(&mut m, (next() % 320) as usize);
            }
            // Sorted, disjoint blocked ranges.
            let mut ranges = Vec::new();
            let mut at = (next() % 20) as usize;
            while at < 320 && ranges.len() < (next() % 8) as usize {
                let l = 1 + (next() % 30) as usize;
                ranges.push((at, (at + l).min(320)));
                at += l + 1 + (next() % 40) as usize;
            }
            let mut marked = m.clone();
            for &(b, e) in &ranges {
                set_range(&mut marked, b, e);
            }
            let blocked = |i: usize| ranges.iter().copied().find(|&(_, e)| e > i);
            let len = 1 + (next() % 24) as usize;
            let (a, b) = ((next() % 330) as usize, (next() % 330) as usize);
            let (start, end) = (a.min(b), a.max(b).min(320));
            assert_eq!(
                find_free_run(&m, start, end, len, blocked),
                find_zero_run(&marked, start, end, len),
                "{start}..{end} len {len} {ranges:?}"
            );
        }
    }

    #[test]
    fn ranges_fill_whole_bytes_and_edges() {
        for (from, to) in [(0, 0), (3, 5), (0, 64), (5, 61), (8, 16), (7, 9), (13, 300)] {
            let mut m = vec![0u8; 40];
            set_range(&mut m, from, to);
            assert!((0..320).all(|i| test(&m, i) == (from..to).contains(&i)), "{from}..{to}");
            clear_range(&mut m, from, to);
            assert!(m.iter().all(|&b| b == 0));
        }
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

    #[test]
    fn aligned_scan_matches_bit_scan() {
        let mut rng = 0x0ddc_0ffe_e123_4567u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for round in 0..2000 {
            // Mostly full maps with a few holes, and mostly empty ones with a few set bits.
            let full = round % 2 == 0;
            let mut m = vec![if full { 0xFFu8 } else { 0 }; 40];
            for _ in 0..(next() % 48) {
                let i = (next() % 320) as usize;
                if full {
                    clear(&mut m, i);
                    // Holes come in runs, some long enough to count.
                    for j in i..(i + (next() % 40) as usize).min(320) {
                        clear(&mut m, j);
                    }
                } else {
                    set(&mut m, i);
                }
            }
            let len = 1 << (next() % 8);
            let (a, b) = ((next() % 330) as usize, (next() % 330) as usize);
            let (start, end) = (a.min(b), a.max(b));
            let run = len.min(64);
            let slow = (start.next_multiple_of(run)..end.min(320))
                .step_by(run)
                .find(|&i| i + run <= end.min(320) && (i..i + run).all(|b| !test(&m, b)));
            assert_eq!(find_zero_aligned(&m, start, end, len), slow, "{start}..{end} by {len}");
        }
    }
}
