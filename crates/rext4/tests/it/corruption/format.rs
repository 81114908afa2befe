//! The format crate's parsers given short or hostile buffers.

use super::*;
use rext4::format::dirent;
use rext4::format::group_desc::GroupDesc;

/// `verify_inode_checksum` is documented for records of at least 128 bytes; any such record
/// must be accepted without panicking (the engine only passes power-of-two sizes, but the
/// format crate is public).
#[test]
fn format_inode_checksum_odd_record_sizes() {
    for len in [128usize, 129, 130, 131, 132, 133, 160, 255, 256] {
        let mut rec = vec![0xA5u8; len];
        if len > 0x81 {
            rec[0x80] = 0x20;
            rec[0x81] = 0;
        }
        let r = catch_unwind(|| fi::verify_inode_checksum(&rec, 1));
        assert!(r.is_ok(), "verify_inode_checksum panicked on a {len}-byte record");
    }
}

/// Found by the `dx_block` fuzz target: `dx::parse_root` on a buffer shorter than 24 bytes
/// whose "." and ".." headers look like a root (`rec_len` 12 and `len - 12`) slices
/// `block[ROOT_INFO_OFFSET..]` out of bounds instead of returning an error.
#[test]
fn format_dx_parse_root_short_block() {
    for len in 20..24usize {
        let mut b = vec![0u8; len];
        b[4..6].copy_from_slice(&12u16.to_le_bytes());
        b[16..18].copy_from_slice(&((len - 12) as u16).to_le_bytes());
        let r = catch_unwind(|| dx::parse_root(&b).map(|_| ()));
        assert!(r.is_ok(), "dx::parse_root panicked on a {len}-byte block");
    }
}

/// Every public parser of rext4-format given every short length and a few fill patterns:
/// errors or values, never a panic (a deterministic floor under the fuzz targets).
#[test]
fn format_parsers_short_buffers() {
    use rext4::format::jbd2::{self, CsumVersion, JournalParams};
    let mut failures = Vec::new();
    for len in 0..=80usize {
        for fill in [0x00u8, 0xFF, 0x0C, 0x01] {
            let b = vec![fill; len];
            let r = catch_unwind(|| {
                let _ = Superblock::parse(&b);
                let _ = GroupDesc::parse(&b, 32);
                let _ = GroupDesc::parse(&b, 64);
                let _ = fi::Inode::parse(&b);
                let _ = Node::parse(&b).map(|n| n.search(5));
                let _ = fext::verify_block_checksum(&b, 1);
                let _ = dirent::DirBlockIter::new(&b, 1024).count();
                let _ = dirent::tail(&b);
                let _ = dirent::verify_leaf_checksum(&b, 1);
                let _ = dx::parse_node(&b).map(|e| e.find(7));
                let _ = dx::count_offset(&b);
                let _ = dx::verify_checksum(&b, 1);
                let _ = fx::XattrIter::new(&b).count();
                let _ = fx::verify_block_checksum(&b, 1, 1);
                let _ = fx::acl_disk_to_xattr(&b);
                let _ = fx::acl_xattr_to_disk(&b);
                let _ = fx::split_name(&b);
                let _ = jbd2::JournalSuperblock::parse(&b).map(|j| j.params());
                let _ = jbd2::Header::parse(&b);
                for csum in [CsumVersion::None, CsumVersion::V2, CsumVersion::V3] {
                    let p = JournalParams { block_size: len, is_64bit: true, csum, csum_seed: 1 };
                    let _ = jbd2::DescriptorTags::parse(&b, &p).map(|d| d.count());
                    let _ = jbd2::CommitBlock::parse(&b, &p).map(|c| c.verify_checksum());
                    let _ = jbd2::RevokeBlock::parse(&b, &p).map(|r| r.blocks().count());
                    let _ = jbd2::verify_tail(&b, &p);
                }
            });
            if r.is_err() {
                failures.push(format!("len {len} fill {fill:#x}"));
            }
        }
    }
    // parse_root is covered by format_dx_parse_root_short_block (a known panic).
    assert!(failures.is_empty(), "parsers panicked on: {}", failures.join(", "));
}
