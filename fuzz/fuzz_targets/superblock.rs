//! The ext4 superblock parser and its accessors, then the engine's open path (geometry checks,
//! descriptor table) over an image whose superblock is the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rext4_format::features::{feature_names, FeatureKind};
use rext4_format::superblock::Superblock;

fuzz_target!(|data: &[u8]| {
    // Short inputs are zero-padded so that every input is a superblock.
    let mut padded = data.to_vec();
    padded.resize(padded.len().max(1024), 0);
    let data = &padded[..];
    let sb = Superblock::parse(data).expect("1024 bytes parse");
    let _ = (sb.compat(), sb.incompat(), sb.ro_compat(), sb.is_64bit());
    let _ = (sb.blocks_count(), sb.r_blocks_count(), sb.free_blocks_count());
    let _ = (sb.block_size(), sb.cluster_size(), sb.inode_size(), sb.first_ino(), sb.desc_size());
    let _ = (sb.mtime(), sb.wtime(), sb.mkfs_time(), sb.lastcheck());
    let _ = (sb.csum_seed(), sb.has_metadata_csum(), sb.compute_checksum(), sb.verify_checksum());
    let _ = (sb.hash_seed(), sb.volume_name(), sb.last_mounted());
    let _ = feature_names(FeatureKind::Compat, sb.s_feature_compat.get());
    let _ = feature_names(FeatureKind::Incompat, sb.s_feature_incompat.get());
    let _ = feature_names(FeatureKind::RoCompat, sb.s_feature_ro_compat.get());
    // The engine: the input as the superblock of a small image whose other bytes are the
    // rest of the input repeated (so descriptor and inode table reads see varied bytes).
    let mut img = vec![0u8; 256 << 10];
    let rest = &data[1024.min(data.len())..];
    if !rest.is_empty() {
        for (i, b) in img.iter_mut().enumerate() {
            *b = rest[i % rest.len()];
        }
    }
    img[1024..2048].copy_from_slice(&data[..1024]);
    rext4_fuzz::open_and_walk(img);
});
