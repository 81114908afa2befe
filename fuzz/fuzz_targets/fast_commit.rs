//! The fast-commit area scan: any bytes, in blocks of any size, give tags or a refusal; what
//! it accepts encodes and scans back to the same tags.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rext4_format::fast_commit::{scan, write_area, Tag};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, area)) = data.split_first() else { return };
    let bs = [1024usize, 2048, 4096, 64][usize::from(sel & 3)];
    let inode_size = if sel & 4 != 0 { 128 } else { 256 };
    let tid = u32::from(sel >> 3);
    let block = |i: usize| area.get(i * bs..(i + 1) * bs).map(<[u8]>::to_vec);
    let Ok(tags) = scan(block, tid, inode_size) else { return };
    // Pads carry no meaning and are laid out anew; the rest survive a round trip.
    let kept: Vec<Tag> = tags.into_iter().filter(|t| *t != Tag::Pad).collect();
    if bs < 64 || kept.iter().any(|t| matches!(t, Tag::Inode { raw, .. } if raw.len() + 16 > bs)) {
        return;
    }
    let again = write_area(&kept, bs);
    let back = scan(|i| again.get(i * bs..(i + 1) * bs).map(<[u8]>::to_vec), tid, inode_size).unwrap();
    let back: Vec<Tag> = back.into_iter().filter(|t| *t != Tag::Pad).collect();
    assert_eq!(back, kept);
});
