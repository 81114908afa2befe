//! Directory hashes (legacy, half-MD4, TEA; signed and unsigned), xattr hashes and casefolding,
//! on any name and seed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rext4_format::casefold;
use rext4_format::hash::{self, HashAlgo};

fuzz_target!(|data: &[u8]| {
    let mut padded = data.to_vec();
    padded.resize(padded.len().max(17), 0);
    let (head, name) = padded.split_at(17);
    let mut seed = [0u32; 4];
    for (i, s) in seed.iter_mut().enumerate() {
        *s = u32::from_le_bytes(head[1 + 4 * i..5 + 4 * i].try_into().unwrap());
    }
    let _ = HashAlgo::for_dir(head[0], head[0] & 0x80 != 0);
    if let Some(algo) = HashAlgo::from_version(head[0] % 8) {
        let h = hash::dx_hash(name, algo, seed);
        assert_eq!(h.major & 1, 0, "major hash has its low bit set");
        assert_eq!(algo.version() % 8, head[0] % 8);
    }
    let signed = head[0] & 1 != 0;
    let split = usize::from(head[1]).min(name.len());
    let a = hash::xattr_entry_hash(&name[..split], &name[split..], signed);
    let b = hash::xattr_entry_hash_ea_inode(&name[..split], a, signed);
    let _ = hash::xattr_block_hash([a, b, seed[0]]);
    if let Some(folded) = casefold::fold(name) {
        assert!(casefold::matches_folded(&folded, name), "a name does not match its own folded form");
        assert!(casefold::is_valid(name));
    }
});
