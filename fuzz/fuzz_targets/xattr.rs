//! Extended attribute areas (block or in-inode): entry iteration, value slices, the block
//! checksum, name prefixes and POSIX ACL conversions; encryption contexts (the attribute
//! `c`) and the policies users hand the mount's ioctls.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rext4_format::fscrypt::Context;
use rext4_format::xattr::{self as fx, XattrIter};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, area)) = data.split_first() else { return };
    // Entries start after the block header, or at the start of an in-inode area.
    let entries_at = if sel & 1 == 0 { fx::BLOCK_HEADER_SIZE.min(area.len()) } else { 0 };
    let mut it = XattrIter::new(&area[entries_at..]);
    let mut found = Vec::new();
    for e in it.by_ref() {
        match e {
            Ok(e) => found.push(e),
            Err(_) => break,
        }
    }
    let end = entries_at + it.end();
    for e in &found {
        if let Ok(v) = fx::value_slice(area, end, e) {
            assert!(v.len() == e.value_size as usize);
            if e.index == fx::INDEX_POSIX_ACL_ACCESS {
                let _ = fx::acl_disk_to_xattr(v);
            }
        }
        let _ = fx::full_name(e.index, e.name);
    }
    let _ = fx::verify_block_checksum(area, 3, u64::from(sel));
    if area.len() >= fx::BLOCK_HEADER_SIZE {
        let mut copy = area.to_vec();
        fx::set_block_checksum(&mut copy, 3, u64::from(sel));
        assert!(fx::verify_block_checksum(&copy, 3, u64::from(sel)));
    }
    let _ = fx::split_name(area);
    if let Some(x) = fx::acl_disk_to_xattr(area) {
        // Round trip: VFS form back to disk form gives the same ACL.
        let d = fx::acl_xattr_to_disk(&x).expect("converted ACL converts back");
        assert_eq!(fx::acl_disk_to_xattr(&d).as_deref(), Some(&x[..]));
    }
    let _ = fx::acl_xattr_to_disk(area);
    if let Ok(c) = Context::parse(area) {
        // A v2 context's three reserved bytes are not kept; all else is.
        assert_eq!(c.to_bytes().len(), area.len(), "a context parses only at its exact size");
        assert_eq!(Context::parse(&c.to_bytes()), Ok(c.clone()));
        let _ = c.policy_valid(u32::from(sel % 20));
        let _ = c.encrypted_len(usize::from(sel), 255);
    }
    if let Ok(p) = Context::from_policy(area) {
        let again = Context::from_policy(&p.to_policy()).expect("a policy converts back");
        assert_eq!(again, p);
        let _ = p.policy_valid(u32::from(sel % 20));
    }
});
