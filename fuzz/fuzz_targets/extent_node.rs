//! Extent nodes (root in i_block, or a tree block): header checks, entry access, search, and the
//! block tail checksum.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rext4_format::extent::{self as fe, Node};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, block)) = data.split_first() else { return };
    // As the root (60 bytes of i_block) or as a whole block.
    let buf = if sel & 1 == 0 { &block[..block.len().min(60)] } else { block };
    if let Ok(n) = Node::parse(buf) {
        let _ = (n.depth(), n.len(), n.is_empty());
        for i in 0..n.len() {
            let _ = (n.first_block(i), n.index(i).leaf(), n.extent(i));
            let e = n.extent(i);
            let _ = (e.start(), e.len(), e.is_unwritten(), e.is_empty());
        }
        for lblk in [0u32, 1, u32::from(sel) << 8, u32::MAX / 2, u32::MAX] {
            if let Some(i) = n.search(lblk) {
                assert!(i < n.len());
            }
        }
    }
    let _ = fe::verify_block_checksum(block, u32::from(sel));
    let mut copy = block.to_vec();
    fe::set_block_checksum(&mut copy, 7);
    let _ = fe::tail_offset(u16::from(sel) << 4);
});
