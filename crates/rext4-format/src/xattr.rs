//! Extended attributes: the block header (`ext4_xattr_header`), the in-inode header, entries
//! (`ext4_xattr_entry`), name prefixes, the block checksum, and the POSIX ACL encodings.

use crate::checksum::crc32c;
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `h_magic` of xattr blocks and of the in-inode area.
pub const XATTR_MAGIC: u32 = 0xEA02_0000;
/// Size of the block header.
pub const BLOCK_HEADER_SIZE: usize = 32;
/// Size of the in-inode header (just the magic).
pub const IBODY_HEADER_SIZE: usize = 4;
/// Size of an entry without its name.
pub const ENTRY_HEADER_SIZE: usize = 16;
/// Largest reference count of a shared xattr block.
pub const REFCOUNT_MAX: u32 = 1024;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct XattrHeader {
    /*00*/ pub h_magic: U32,
    /*04*/ pub h_refcount: U32,
    /*08*/ pub h_blocks: U32,
    /*0C*/ pub h_hash: U32,
    /*10*/ pub h_checksum: U32,
    /*14*/ pub h_reserved: [U32; 3],
}
const _: () = assert!(core::mem::size_of::<XattrHeader>() == BLOCK_HEADER_SIZE);
const H_CHECKSUM_OFFSET: usize = 0x10;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct XattrEntryHeader {
    /*00*/ pub e_name_len: u8,
    /*01*/ pub e_name_index: u8,
    /*02*/ pub e_value_offs: U16,
    /*04*/ pub e_value_inum: U32,
    /*08*/ pub e_value_size: U32,
    /*0C*/ pub e_hash: U32,
}
const _: () = assert!(core::mem::size_of::<XattrEntryHeader>() == ENTRY_HEADER_SIZE);

/// Space an entry with a name of `name_len` bytes takes (4-byte aligned).
pub const fn entry_size(name_len: usize) -> usize {
    (ENTRY_HEADER_SIZE + name_len + 3) & !3
}
/// Space a value of `size` bytes takes (4-byte aligned).
pub const fn value_size(size: usize) -> usize {
    (size + 3) & !3
}

// Name indexes.
pub const INDEX_USER: u8 = 1;
pub const INDEX_POSIX_ACL_ACCESS: u8 = 2;
pub const INDEX_POSIX_ACL_DEFAULT: u8 = 3;
pub const INDEX_TRUSTED: u8 = 4;
pub const INDEX_LUSTRE: u8 = 5;
pub const INDEX_SECURITY: u8 = 6;
pub const INDEX_SYSTEM: u8 = 7;
pub const INDEX_RICHACL: u8 = 8;
pub const INDEX_ENCRYPTION: u8 = 9;
pub const INDEX_HURD: u8 = 10;

const PREFIXES: &[(u8, &[u8])] = &[
    (INDEX_USER, b"user."),
    (INDEX_POSIX_ACL_ACCESS, b"system.posix_acl_access"),
    (INDEX_POSIX_ACL_DEFAULT, b"system.posix_acl_default"),
    (INDEX_TRUSTED, b"trusted."),
    (INDEX_SECURITY, b"security."),
    (INDEX_SYSTEM, b"system."),
    (INDEX_RICHACL, b"system.richacl"),
];

/// The prefix a name index stands for, or `None` for indexes the VFS does not show
/// (e.g. encryption context, lustre, hurd, unknown).
pub fn index_prefix(index: u8) -> Option<&'static [u8]> {
    PREFIXES.iter().find(|(i, _)| *i == index).map(|(_, p)| *p)
}

/// The full name of an entry: prefix + suffix, `None` if the index is not user-visible.
pub fn full_name(index: u8, suffix: &[u8]) -> Option<Vec<u8>> {
    let p = index_prefix(index)?;
    let mut v = Vec::with_capacity(p.len() + suffix.len());
    v.extend_from_slice(p);
    v.extend_from_slice(suffix);
    Some(v)
}

/// Splits a full name into (index, suffix) the way the kernel stores it; `None` if the
/// namespace is not one ext4 stores.
pub fn split_name(name: &[u8]) -> Option<(u8, &[u8])> {
    // Exact ACL names first: they are whole names, not prefixes.
    for (idx, p) in PREFIXES {
        let exact =
            *idx == INDEX_POSIX_ACL_ACCESS || *idx == INDEX_POSIX_ACL_DEFAULT || *idx == INDEX_RICHACL;
        if exact && name == *p {
            return Some((*idx, &[]));
        }
    }
    for (idx, p) in PREFIXES {
        let exact =
            *idx == INDEX_POSIX_ACL_ACCESS || *idx == INDEX_POSIX_ACL_DEFAULT || *idx == INDEX_RICHACL;
        if !exact && name.len() > p.len() && name.starts_with(p) {
            return Some((*idx, &name[p.len()..]));
        }
    }
    None
}

/// One entry as found in an xattr area.
#[derive(Clone, Copy, Debug)]
pub struct RawXattr<'a> {
    pub index: u8,
    pub name: &'a [u8],
    pub value_offs: u16,
    pub value_inum: u32,
    pub value_size: u32,
    pub hash: u32,
}

/// Why an xattr area is invalid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrError {
    BadMagic,
    /// An entry runs past the area, or the list is not terminated.
    EntryPastEnd,
    /// A value lies outside the value area or overlaps the entries.
    ValuePastEnd,
}

/// Walks the entries of an xattr area. `entries` starts at the first entry and runs to the end
/// of the area; entries end at a zero `u32`.
pub struct XattrIter<'a> {
    buf: &'a [u8],
    pos: usize,
    done: bool,
}

impl<'a> XattrIter<'a> {
    pub fn new(entries: &'a [u8]) -> Self {
        XattrIter { buf: entries, pos: 0, done: false }
    }
    /// Offset just past the terminator, once iteration has finished.
    pub fn end(&self) -> usize {
        self.pos + 4
    }
}

impl<'a> Iterator for XattrIter<'a> {
    type Item = Result<RawXattr<'a>, XattrError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let rest = &self.buf[self.pos.min(self.buf.len())..];
        match rest.get(..4) {
            None => {
                self.done = true;
                return Some(Err(XattrError::EntryPastEnd));
            }
            Some(w) if w == [0, 0, 0, 0] => {
                self.done = true;
                return None;
            }
            Some(_) => {}
        }
        let Ok((h, after)) = XattrEntryHeader::read_from_prefix(rest) else {
            self.done = true;
            return Some(Err(XattrError::EntryPastEnd));
        };
        let n = usize::from(h.e_name_len);
        if after.len() < n || rest.len() < entry_size(n) {
            self.done = true;
            return Some(Err(XattrError::EntryPastEnd));
        }
        self.pos += entry_size(n);
        Some(Ok(RawXattr {
            index: h.e_name_index,
            name: &after[..n],
            value_offs: h.e_value_offs.get(),
            value_inum: h.e_value_inum.get(),
            value_size: h.e_value_size.get(),
            hash: h.e_hash.get(),
        }))
    }
}

/// The bytes of an in-area value: `values` is the region value offsets count from (the block,
/// or the in-inode area after its magic); `entries_end` is where the entry table ends (values
/// must not overlap it).
pub fn value_slice<'a>(
    values: &'a [u8],
    entries_end: usize,
    e: &RawXattr<'_>,
) -> Result<&'a [u8], XattrError> {
    let off = usize::from(e.value_offs);
    let end = off.checked_add(e.value_size as usize).ok_or(XattrError::ValuePastEnd)?;
    if e.value_size == 0 {
        return Ok(&[]);
    }
    if off < entries_end || end > values.len() {
        return Err(XattrError::ValuePastEnd);
    }
    Ok(&values[off..end])
}

/// The metadata_csum checksum of an xattr block at physical block `blk`.
pub fn block_checksum(block: &[u8], fs_seed: u32, blk: u64) -> u32 {
    let mut c = crc32c(fs_seed, &blk.to_le_bytes());
    c = crc32c(c, &block[..H_CHECKSUM_OFFSET]);
    c = crc32c(c, &[0; 4]);
    crc32c(c, &block[H_CHECKSUM_OFFSET + 4..])
}

pub fn verify_block_checksum(block: &[u8], fs_seed: u32, blk: u64) -> bool {
    block.len() >= BLOCK_HEADER_SIZE
        && block[H_CHECKSUM_OFFSET..H_CHECKSUM_OFFSET + 4]
            == block_checksum(block, fs_seed, blk).to_le_bytes()
}

pub fn set_block_checksum(block: &mut [u8], fs_seed: u32, blk: u64) {
    let c = block_checksum(block, fs_seed, blk);
    block[H_CHECKSUM_OFFSET..H_CHECKSUM_OFFSET + 4].copy_from_slice(&c.to_le_bytes());
}

// POSIX ACLs. ext4 stores them compactly (version 1, 4-byte entries for the owner/group/mask/
// other tags); the VFS xattr form is version 2 with 8-byte entries throughout.
pub const ACL_EXT4_VERSION: u32 = 1;
pub const ACL_XATTR_VERSION: u32 = 2;
pub const ACL_USER_OBJ: u16 = 0x01;
pub const ACL_USER: u16 = 0x02;
pub const ACL_GROUP_OBJ: u16 = 0x04;
pub const ACL_GROUP: u16 = 0x08;
pub const ACL_MASK: u16 = 0x10;
pub const ACL_OTHER: u16 = 0x20;
pub const ACL_UNDEFINED_ID: u32 = u32::MAX;

/// Converts an ACL from ext4's on-disk encoding to the VFS xattr encoding; `None` if malformed.
pub fn acl_disk_to_xattr(disk: &[u8]) -> Option<Vec<u8>> {
    let version = u32::from_le_bytes(disk.get(..4)?.try_into().ok()?);
    if version != ACL_EXT4_VERSION {
        return None;
    }
    let mut out = ACL_XATTR_VERSION.to_le_bytes().to_vec();
    let mut p = 4;
    while p < disk.len() {
        let tag = u16::from_le_bytes(disk.get(p..p + 2)?.try_into().ok()?);
        let perm = u16::from_le_bytes(disk.get(p + 2..p + 4)?.try_into().ok()?);
        let id = match tag {
            ACL_USER_OBJ | ACL_GROUP_OBJ | ACL_MASK | ACL_OTHER => {
                p += 4;
                ACL_UNDEFINED_ID
            }
            ACL_USER | ACL_GROUP => {
                let id = u32::from_le_bytes(disk.get(p + 4..p + 8)?.try_into().ok()?);
                p += 8;
                id
            }
            _ => return None,
        };
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    Some(out)
}

/// Converts an ACL from the VFS xattr encoding to ext4's on-disk encoding; `None` if malformed.
pub fn acl_xattr_to_disk(x: &[u8]) -> Option<Vec<u8>> {
    let version = u32::from_le_bytes(x.get(..4)?.try_into().ok()?);
    if version != ACL_XATTR_VERSION || !(x.len() - 4).is_multiple_of(8) {
        return None;
    }
    let mut out = ACL_EXT4_VERSION.to_le_bytes().to_vec();
    for e in x[4..].chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        out.extend_from_slice(&e[..4]);
        match tag {
            ACL_USER_OBJ | ACL_GROUP_OBJ | ACL_MASK | ACL_OTHER => {}
            ACL_USER | ACL_GROUP => out.extend_from_slice(&e[4..8]),
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_and_join() {
        assert_eq!(split_name(b"user.foo"), Some((INDEX_USER, &b"foo"[..])));
        assert_eq!(split_name(b"system.posix_acl_access"), Some((INDEX_POSIX_ACL_ACCESS, &b""[..])));
        assert_eq!(split_name(b"system.data"), Some((INDEX_SYSTEM, &b"data"[..])));
        assert_eq!(split_name(b"user."), None);
        assert_eq!(split_name(b"bogus.x"), None);
        assert_eq!(full_name(INDEX_TRUSTED, b"t").unwrap(), b"trusted.t");
        assert_eq!(full_name(INDEX_ENCRYPTION, b"c"), None);
    }

    #[test]
    fn entries_iterate_and_stop_at_garbage() {
        let mut area = vec![0u8; 64];
        area[0] = 3; // name_len
        area[1] = INDEX_USER;
        area[2..4].copy_from_slice(&40u16.to_le_bytes());
        area[8..12].copy_from_slice(&5u32.to_le_bytes());
        area[16..19].copy_from_slice(b"abc");
        area[40..45].copy_from_slice(b"hello");
        let mut it = XattrIter::new(&area);
        let e = it.next().unwrap().unwrap();
        assert_eq!(e.name, b"abc");
        assert!(it.next().is_none());
        assert_eq!(value_slice(&area, it.end(), &e).unwrap(), b"hello");
        let bad = RawXattr { value_offs: 60, value_size: 10, ..e };
        assert_eq!(value_slice(&area, it.end(), &bad).unwrap_err(), XattrError::ValuePastEnd);
        // No terminator within the area.
        let mut it = XattrIter::new(&area[..20]);
        assert!(it.next().unwrap().is_ok());
        assert_eq!(it.next().unwrap().unwrap_err(), XattrError::EntryPastEnd);
    }

    #[test]
    fn acl_encodings_round_trip() {
        let mut x = ACL_XATTR_VERSION.to_le_bytes().to_vec();
        for (tag, perm, id) in [
            (ACL_USER_OBJ, 6u16, ACL_UNDEFINED_ID),
            (ACL_USER, 4, 1000),
            (ACL_GROUP_OBJ, 4, ACL_UNDEFINED_ID),
            (ACL_MASK, 4, ACL_UNDEFINED_ID),
            (ACL_OTHER, 0, ACL_UNDEFINED_ID),
        ] {
            x.extend_from_slice(&tag.to_le_bytes());
            x.extend_from_slice(&perm.to_le_bytes());
            x.extend_from_slice(&id.to_le_bytes());
        }
        let d = acl_xattr_to_disk(&x).unwrap();
        assert_eq!(d.len(), 4 + 4 + 8 + 4 + 4 + 4);
        assert_eq!(acl_disk_to_xattr(&d).unwrap(), x);
        assert!(acl_disk_to_xattr(&d[..d.len() - 1]).is_none());
    }
}
