//! Inode record decoding, timestamps, and the inode checksum, for the record sizes an image can
//! have (128..=1024, powers of two; crates/rext4/tests/it/corruption/format.rs tries other
//! lengths).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rext4_format::checksum::inode_csum_seed;
use rext4_format::inode::{self as fi, Inode};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let size = [128usize, 256, 512, 1024][usize::from(sel & 3)];
    let mut rec = vec![0u8; size];
    let n = rest.len().min(size);
    rec[..n].copy_from_slice(&rest[..n]);
    let Some(ino) = Inode::parse(&rec) else { return };
    let _ = (ino.mode(), ino.file_type(), ino.flags(), ino.uid(), ino.gid(), ino.size());
    let _ = (ino.links_count(), ino.generation(), ino.file_acl(), ino.dtime(), ino.device());
    let _ = (ino.blocks_512(sel & 4 != 0, 1024 << (sel >> 5)), ino.i_block_bytes());
    let _ = (ino.atime(size), ino.mtime(size), ino.ctime(size), ino.crtime(size));
    let _ = ino.has_field(size, usize::from(sel), 4);
    let seed = inode_csum_seed(0x1234_5678, 12, ino.generation());
    let _ = fi::stored_inode_checksum(&rec);
    let _ = fi::verify_inode_checksum(&rec, seed);
    fi::set_inode_checksum(&mut rec, seed);
    assert!(fi::verify_inode_checksum(&rec, seed), "checksum does not verify after set");
});
