//! htree root and node blocks: parsing, entry lookup by hash, checksums.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rext4_format::dx;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, block)) = data.split_first() else { return };
    let hash = u32::from(sel).wrapping_mul(0x0100_0193);
    if let Ok(r) = dx::parse_root(block) {
        let _ = (r.info.hash_version, r.info.indirect_levels);
        let e = r.entries;
        let at = e.find(hash);
        assert!(at < e.len());
        for i in 0..e.len() {
            let _ = e.get(i);
        }
    }
    if let Ok(e) = dx::parse_node(block) {
        let at = e.find(hash);
        assert!(at < e.len());
        let _ = e.get(at);
    }
    let _ = dx::count_offset(block);
    let _ = dx::checksum(block, hash);
    let _ = dx::verify_checksum(block, hash);
    let mut copy = block.to_vec();
    dx::set_checksum(&mut copy, hash);
    if dx::checksum(&copy, hash).is_some() {
        assert!(dx::verify_checksum(&copy, hash), "checksum does not verify after set");
    }
});
