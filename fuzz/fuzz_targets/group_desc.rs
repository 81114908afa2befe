//! Group descriptor decoding and both checksums, for every descriptor size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rext4_format::group_desc::GroupDesc;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let ds = [32usize, 64, 128, 1024, 0, 31, 63, 65][usize::from(sel & 7)];
    let group = u32::from(sel >> 3).wrapping_mul(0x0101_0101);
    if GroupDesc::parse(rest, ds).is_none() {
        assert!(rest.len() < ds.min(64), "a long enough descriptor must parse");
    }
    let mut padded = rest.to_vec();
    padded.resize(padded.len().max(ds), 0);
    let rest = &padded[..];
    let Some(d) = GroupDesc::parse(rest, ds) else { return };
    let _ = (d.block_bitmap(ds), d.inode_bitmap(ds), d.inode_table(ds));
    let _ = (d.free_blocks_count(ds), d.free_inodes_count(ds), d.used_dirs_count(ds));
    let _ = (d.itable_unused(ds), d.block_bitmap_csum(ds), d.inode_bitmap_csum(ds), d.flags());
    let seed = rest.get(..4).map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()));
    let _ = d.csum_crc32c(seed, group, ds);
    let mut uuid = [0u8; 16];
    let n = rest.len().min(16);
    uuid[..n].copy_from_slice(&rest[..n]);
    let _ = d.csum_crc16(&uuid, group, ds);
    let mut out = vec![0u8; ds];
    d.encode_into(&mut out, ds);
});
