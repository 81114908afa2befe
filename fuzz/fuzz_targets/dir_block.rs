//! Directory leaf blocks (and inline-data areas): entry iteration, the probe for a name and
//! room, the leaf tail and its checksum, rec_len encodings.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rext4_format::dirent::{self as fd, DirBlockIter};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, block)) = data.split_first() else { return };
    let bs = [1024u32, 2048, 4096, 65536][usize::from(sel & 3)];
    let mut end = 0usize;
    for e in DirBlockIter::new(block, bs) {
        match e {
            Ok(e) => {
                assert!(e.offset + e.rec_len as usize <= block.len());
                assert!(e.offset >= end);
                end = e.offset + e.rec_len as usize;
                let _ = (e.inode, e.file_type, e.name);
            }
            Err(_) => break,
        }
    }
    // The probe walks as the iterator does: it finds the first live entry's name, and any
    // room it reports lies inside the block.
    let first = DirBlockIter::new(block, bs).map_while(|e| e.ok()).find(|e| e.inode != 0);
    let name = first.map_or(&b"x"[..], |e| e.name);
    let (hit, room) = fd::probe(block, bs, name, Some(usize::from(sel >> 2) * 4));
    if first.is_some() {
        assert!(hit.is_some());
    }
    if let Some((off, len, used, _)) = room {
        assert!(off + len <= block.len() && used <= len);
    }
    let _ = fd::tail(block);
    let _ = fd::leaf_checksum(block, 42);
    let _ = fd::verify_leaf_checksum(block, 42);
    let mut copy = block.to_vec();
    fd::set_leaf_tail(&mut copy, 42);
    if copy.len() >= fd::TAIL_SIZE {
        assert_eq!(fd::verify_leaf_checksum(&copy, 42), Some(true));
    }
    if let Some(w) = block.get(..2) {
        let raw = u16::from_le_bytes([w[0], w[1]]);
        let len = fd::rec_len_from_disk(raw, bs);
        let _ = fd::rec_len_to_disk(len, bs);
    }
});
