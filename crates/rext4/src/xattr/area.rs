//! One xattr area as bytes — the in-inode area after its magic, or a whole xattr block — and
//! the edits the kernel's `xattr.c` makes to it (`xattr_find_entry`, `ext4_xattr_set_entry`,
//! `ext4_xattr_rehash`, `ext4_xattr_cmp`), step for step, so that rext4 leaves the layout the
//! kernel would: entries grow down from `first`, values up from the end of the area; block
//! entries are kept sorted, in-inode ones in insertion order; only block entries get a hash.
//!
//! Value offsets count from the start of `base` (the block, or the first in-inode entry).
//! Nothing here panics on a hostile area: every offset is checked by [`entries`] first.

use rext4_format::hash::{xattr_block_hash, xattr_entry_hash, xattr_entry_hash_ea_inode};
use rext4_format::inode::GOOD_OLD_INODE_SIZE;
use rext4_format::xattr::{self as fx, entry_size, value_size, ENTRY_HEADER_SIZE, XATTR_MAGIC};

/// The largest value size the kernel accepts in an entry (`EXT4_XATTR_SIZE_MAX`).
const ENTRY_VALUE_MAX: usize = 1 << 24;
/// Offset of `h_hash` in a block header.
const H_HASH: usize = 0x0C;

/// An entry's fields, and where it is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    pub at: usize,
    pub name_len: usize,
    pub index: u8,
    pub value_offs: usize,
    pub value_inum: u32,
    pub value_size: usize,
    pub hash: u32,
}

impl Entry {
    pub(crate) fn name<'a>(&self, base: &'a [u8]) -> &'a [u8] {
        &base[self.at + ENTRY_HEADER_SIZE..self.at + ENTRY_HEADER_SIZE + self.name_len]
    }
    /// The value bytes of an entry whose value is in the area (checked by [`entries`]).
    pub(crate) fn value<'a>(&self, base: &'a [u8]) -> &'a [u8] {
        if self.value_size == 0 || self.value_inum != 0 {
            return &[];
        }
        &base[self.value_offs..self.value_offs + self.value_size]
    }
    fn in_area_value(&self) -> bool {
        self.value_inum == 0 && self.value_size != 0
    }
}

/// Why an area cannot be changed as asked.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AreaError {
    /// The change does not fit (`ENOSPC`).
    NoSpace,
    /// The area is malformed.
    Corrupt(&'static str),
}

fn u16_at(b: &[u8], o: usize) -> usize {
    usize::from(u16::from_le_bytes([b[o], b[o + 1]]))
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
// Cannot truncate: the values are offsets inside an area, itself at most a 64 KiB block.
#[allow(clippy::cast_possible_truncation)]
fn put_u16(b: &mut [u8], o: usize, v: usize) {
    b[o..o + 2].copy_from_slice(&(v as u16).to_le_bytes());
}
fn put_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

fn entry_at(base: &[u8], at: usize) -> Entry {
    Entry {
        at,
        name_len: usize::from(base[at]),
        index: base[at + 1],
        value_offs: u16_at(base, at + 2),
        value_inum: u32_at(base, at + 4),
        value_size: u32_at(base, at + 8) as usize,
        hash: u32_at(base, at + 12),
    }
}

/// The entries of the area starting at `first`, and the offset of the terminating zero word,
/// after the checks of the kernel's `check_xattrs`: every entry and its name end before the
/// area does, names hold no NUL, and in-area values (padded) lie inside the area after the
/// entry table.
pub(crate) fn entries(base: &[u8], first: usize) -> Result<(Vec<Entry>, usize), &'static str> {
    let mut out = Vec::new();
    let mut pos = first;
    loop {
        let Some(w) = base.get(pos..pos + 4) else { return Err("entry table runs past its area") };
        if w == [0; 4] {
            break;
        }
        if pos + ENTRY_HEADER_SIZE > base.len() {
            return Err("entry runs past its area");
        }
        let e = entry_at(base, pos);
        let next = pos + entry_size(e.name_len);
        if next >= base.len() {
            return Err("entry runs past its area");
        }
        if e.name(base).contains(&0) {
            return Err("bad name length");
        }
        out.push(e);
        pos = next;
    }
    for e in &out {
        if e.value_size > ENTRY_VALUE_MAX {
            return Err("value size too large");
        }
        if e.in_area_value() {
            let room = base.len().checked_sub(e.value_offs).ok_or("value outside its area")?;
            if e.value_offs < pos + 4 || value_size(e.value_size) > room {
                return Err("value overlaps the entries or runs past its area");
            }
        }
    }
    Ok((out, pos))
}

/// Where a name is, or would go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pos {
    /// Offset of the entry found, or of the entry to insert before (the terminator at the
    /// end).
    pub here: usize,
    pub found: bool,
}

/// `xattr_find_entry`: blocks keep entries sorted by (index, name length, name), so a search
/// there stops at the first entry not below the name; in-inode entries are unsorted.
pub(crate) fn find(base: &[u8], ents: &[Entry], end: usize, index: u8, name: &[u8], sorted: bool) -> Pos {
    for e in ents {
        let ord = index.cmp(&e.index).then(name.len().cmp(&e.name_len)).then_with(|| name.cmp(e.name(base)));
        if ord.is_le() && (sorted || ord.is_eq()) {
            return Pos { here: e.at, found: ord.is_eq() };
        }
    }
    Pos { here: end, found: false }
}

/// `ext4_xattr_value_same`: whether the entry at `pos` holds exactly `value` in the area.
pub(super) fn value_same(base: &[u8], pos: Pos, value: &[u8]) -> bool {
    if !pos.found {
        return false;
    }
    let e = entry_at(base, pos.here);
    e.value_inum == 0 && e.value_size == value.len() && e.value(base) == value
}

/// What an entry is set to hold.
#[derive(Clone, Copy, Debug)]
pub(crate) enum NewValue<'a> {
    /// These bytes, stored in the area.
    Bytes(&'a [u8]),
    /// A value stored in EA inode `ino` (`ea_inode`): its size and crc32c hash.
    Inode { ino: u32, size: u32, hash: u32 },
}

/// `ext4_xattr_set_entry`: sets (`Some`) or removes (`None`) the attribute at `pos` (from
/// [`find`] on the same bytes). `block` is `None` for the in-inode area; for a block, entries
/// get their hash and the block its `h_hash`, and a value stored in the area must leave
/// `Some(reserve)` bytes free for entries (`EXT4_XATTR_BLOCK_RESERVE`, 0 without
/// `ea_inode`). A value in an EA inode takes only its entry's room. An entry whose old value
/// was in an EA inode just stops naming it: its reference is the caller's to drop. On
/// `NoSpace` the area is unchanged.
pub(crate) fn set_entry(
    base: &mut [u8],
    first: usize,
    pos: Pos,
    index: u8,
    name: &[u8],
    value: Option<NewValue<'_>>,
    block: Option<usize>,
) -> Result<(), AreaError> {
    let (ents, last) = entries(base, first).map_err(AreaError::Corrupt)?;
    let here = pos.found.then(|| entry_at(base, pos.here));
    let Ok(name_len) = u8::try_from(name.len()) else {
        return Err(AreaError::Corrupt("bad name length"));
    };
    let bytes = match value {
        Some(NewValue::Bytes(v)) => Some(v),
        Some(NewValue::Inode { .. }) => Some(&[][..]),
        None => None,
    };
    let old_size = here.map_or(0, |e| if e.in_area_value() { value_size(e.value_size) } else { 0 });
    let new_size = bytes.map_or(0, |v| value_size(v.len()));
    let at = pos.here;

    if new_size != 0 && new_size == old_size {
        // Same padded size: the value is overwritten where it is.
        let (v, e) = (bytes.unwrap_or_default(), here.ok_or(AreaError::Corrupt("no entry"))?);
        // As long as the value it replaces in the area: a u32.
        put_u32(base, at + 8, u32::try_from(v.len()).map_err(|_| AreaError::NoSpace)?);
        base[e.value_offs..e.value_offs + v.len()].copy_from_slice(v);
        base[e.value_offs + v.len()..e.value_offs + new_size].fill(0);
    } else {
        let mut min_offs = base.len();
        for e in ents.iter().filter(|e| e.in_area_value()) {
            min_offs = min_offs.min(e.value_offs);
        }
        if bytes.is_some() {
            // `entries` checked that values start past the terminator.
            let mut free = min_offs - last - 4;
            if pos.found {
                free += entry_size(name.len()) + old_size;
            }
            if free < entry_size(name.len()) + new_size {
                return Err(AreaError::NoSpace);
            }
            // With `ea_inode`, a long value must not crowd out the names of the others.
            if let Some(reserve) = block {
                if new_size != 0 && (min_offs + old_size).saturating_sub(new_size) < reserve {
                    return Err(AreaError::NoSpace);
                }
            }
        }
        if let Some(e) = here.filter(|e| e.in_area_value()) {
            // Close the gap the old value leaves: the values below it move up.
            let offs = e.value_offs;
            base.copy_within(min_offs..offs, min_offs + old_size);
            base[min_offs..min_offs + old_size].fill(0);
            min_offs += old_size;
            for x in ents.iter().filter(|x| x.in_area_value() && x.value_offs < offs) {
                put_u16(base, x.at + 2, x.value_offs + old_size);
            }
        }
        if bytes.is_none() {
            let size = entry_size(name.len());
            let new_last = last - size;
            base.copy_within(at + size..last + 4, at);
            base[new_last..last].fill(0);
        } else if !pos.found {
            let size = entry_size(name.len());
            base.copy_within(at..last + 4, at + size);
            base[at..at + size].fill(0);
            base[at] = name_len;
            base[at + 1] = index;
            base[at + ENTRY_HEADER_SIZE..at + ENTRY_HEADER_SIZE + name.len()].copy_from_slice(name);
        } else {
            base[at + 2..at + 12].fill(0);
        }
        if let Some(v) = bytes {
            if !v.is_empty() {
                let off = min_offs - new_size;
                base[off..off + v.len()].copy_from_slice(v);
                base[off + v.len()..off + new_size].fill(0);
                put_u16(base, at + 2, off);
            }
            // It fitted in the area: a u32.
            put_u32(base, at + 8, u32::try_from(v.len()).map_err(|_| AreaError::NoSpace)?);
        }
    }

    match value {
        Some(NewValue::Bytes(v)) => {
            let hash = if block.is_some() { xattr_entry_hash(name, v, false) } else { 0 };
            put_u32(base, at + 12, hash);
        }
        Some(NewValue::Inode { ino, size, hash }) => {
            // The entry's hash mixes in the value's hash, wherever the entry sits.
            put_u32(base, at + 4, ino);
            put_u32(base, at + 8, size);
            put_u32(base, at + 12, xattr_entry_hash_ea_inode(name, hash, false));
        }
        None => {}
    }
    if block.is_some() {
        rehash_block(base, first).map_err(AreaError::Corrupt)?;
    }
    Ok(())
}

/// The EA inodes an area's entries name.
pub(super) fn ea_inodes(base: &[u8], first: usize) -> Result<Vec<u32>, &'static str> {
    Ok(entries(base, first)?.0.iter().filter(|e| e.value_inum != 0).map(|e| e.value_inum).collect())
}

/// `ext4_xattr_rehash`: the block's `h_hash` from its entries' hashes.
pub(super) fn rehash_block(block: &mut [u8], first: usize) -> Result<(), &'static str> {
    let (ents, _) = entries(block, first)?;
    let h = xattr_block_hash(ents.iter().map(|e| e.hash));
    put_u32(block, H_HASH, h);
    Ok(())
}

/// `ext4_xattr_cmp`: whether two blocks hold the same attributes (names, values, hashes;
/// where the values sit does not matter). A malformed block equals nothing.
pub(super) fn same_attributes(a: &[u8], b: &[u8], first: usize) -> bool {
    let (Ok((ea, _)), Ok((eb, _))) = (entries(a, first), entries(b, first)) else { return false };
    ea.len() == eb.len()
        && ea.iter().zip(&eb).all(|(x, y)| {
            x.hash == y.hash
                && x.index == y.index
                && x.name_len == y.name_len
                && x.value_size == y.value_size
                && x.value_inum == y.value_inum
                && x.name(a) == y.name(b)
                && x.value(a) == y.value(b)
        })
}

/// Where the in-inode entries start, if the record has room for an area
/// (`EXT4_INODE_HAS_XATTR_SPACE`: a nonzero `i_extra_isize`, the magic and one pad word).
pub(crate) fn ibody_first(raw: &[u8]) -> Option<usize> {
    if raw.len() <= GOOD_OLD_INODE_SIZE {
        return None;
    }
    let extra = usize::from(crate::inode::write::rec_ref(raw).extra_isize());
    let first = GOOD_OLD_INODE_SIZE + extra + fx::IBODY_HEADER_SIZE;
    (extra != 0 && first + 4 <= raw.len()).then_some(first)
}

pub(super) fn has_ibody_magic(raw: &[u8], first: usize) -> bool {
    raw[first - 4..first] == XATTR_MAGIC.to_le_bytes()
}

/// The record's in-inode attribute entries and values, when it holds any.
pub(crate) fn ibody_area(raw: &[u8]) -> Option<&[u8]> {
    ibody_first(raw).filter(|&first| has_ibody_magic(raw, first)).map(|first| &raw[first..])
}

/// How many entries of the area at `first` in `base` keep their value in an EA inode (0 for
/// a malformed area: its inode's use of it reports the damage).
pub(crate) fn ea_entry_count(base: &[u8], first: usize) -> u64 {
    entries(base, first).map_or(0, |(ents, _)| ents.iter().filter(|e| e.value_inum != 0).count() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRST: usize = 32;

    fn block(size: usize) -> Vec<u8> {
        let mut b = vec![0u8; size];
        b[0..4].copy_from_slice(&rext4_format::xattr::XATTR_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        b
    }

    fn set(b: &mut [u8], first: usize, sorted: bool, name: &[u8], v: Option<&[u8]>) -> Result<(), AreaError> {
        let (ents, end) = entries(b, first).unwrap();
        let pos = find(b, &ents, end, 1, name, sorted);
        set_entry(b, first, pos, 1, name, v.map(NewValue::Bytes), sorted.then_some(0))
    }

    fn names(b: &[u8], first: usize) -> Vec<Vec<u8>> {
        entries(b, first).unwrap().0.iter().map(|e| e.name(b).to_vec()).collect()
    }

    fn get(b: &[u8], first: usize, name: &[u8]) -> Option<Vec<u8>> {
        let (ents, _) = entries(b, first).unwrap();
        ents.iter().find(|e| e.name(b) == name).map(|e| e.value(b).to_vec())
    }

    #[test]
    fn block_entries_sorted_inode_entries_in_order() {
        let mut b = block(1024);
        for n in [&b"zz"[..], b"a", b"bb", b"ab"] {
            set(&mut b, FIRST, true, n, Some(n)).unwrap();
        }
        assert_eq!(names(&b, FIRST), [&b"a"[..], b"ab", b"bb", b"zz"]);
        let mut i = vec![0u8; 96];
        for n in [&b"zz"[..], b"a", b"bb"] {
            set(&mut i, 0, false, n, Some(n)).unwrap();
        }
        assert_eq!(names(&i, 0), [&b"zz"[..], b"a", b"bb"]);
        assert!(entries(&i, 0).unwrap().0.iter().all(|e| e.hash == 0));
    }

    #[test]
    fn values_pack_at_the_end_and_gaps_close() {
        let mut b = block(1024);
        set(&mut b, FIRST, true, b"one", Some(b"11111")).unwrap();
        set(&mut b, FIRST, true, b"two", Some(b"22")).unwrap();
        set(&mut b, FIRST, true, b"three", Some(b"333333333")).unwrap();
        let (ents, _) = entries(&b, FIRST).unwrap();
        let mut offs: Vec<usize> = ents.iter().map(|e| e.value_offs).collect();
        offs.sort();
        assert_eq!(offs, [1024 - 8 - 4 - 12, 1024 - 8 - 4, 1024 - 8]);
        // Removing the middle value moves the lower one up; the freed bytes are zero.
        set(&mut b, FIRST, true, b"two", None).unwrap();
        assert_eq!(get(&b, FIRST, b"one").unwrap(), b"11111");
        assert_eq!(get(&b, FIRST, b"three").unwrap(), b"333333333");
        let (ents, end) = entries(&b, FIRST).unwrap();
        let min = ents.iter().map(|e| e.value_offs).min().unwrap();
        assert_eq!(min, 1024 - 8 - 12);
        assert!(b[end..min].iter().all(|&x| x == 0));
        // Same padded size: in place; other size: moved.
        set(&mut b, FIRST, true, b"one", Some(b"abcdefg")).unwrap();
        assert_eq!(entries(&b, FIRST).unwrap().0[0].value_offs, 1024 - 8);
        set(&mut b, FIRST, true, b"one", Some(b"")).unwrap();
        assert_eq!(get(&b, FIRST, b"one").unwrap(), b"");
        assert_eq!(get(&b, FIRST, b"three").unwrap(), b"333333333");
    }

    #[test]
    fn no_space_leaves_the_area_alone() {
        let mut i = vec![0u8; 64];
        set(&mut i, 0, false, b"a", Some(&[7u8; 40])).unwrap();
        let before = i.clone();
        assert_eq!(set(&mut i, 0, false, b"b", Some(&[1u8; 4])), Err(AreaError::NoSpace));
        assert_eq!(i, before);
        // Exactly full: 20 (entry) + 40 (value) + 4 (terminator) = 64.
        let mut j = vec![0u8; 64];
        set(&mut j, 0, false, b"a", Some(&[7u8; 40])).unwrap();
        set(&mut j, 0, false, b"a", Some(&[9u8; 37])).unwrap();
        assert_eq!(get(&j, 0, b"a").unwrap(), [9u8; 37]);
    }

    #[test]
    fn hashes_and_comparison() {
        let mut a = block(1024);
        let mut b = block(1024);
        set(&mut a, FIRST, true, b"x", Some(b"1")).unwrap();
        set(&mut a, FIRST, true, b"y", Some(b"2")).unwrap();
        set(&mut b, FIRST, true, b"y", Some(b"2")).unwrap();
        set(&mut b, FIRST, true, b"x", Some(b"1")).unwrap();
        assert_ne!(u32_at(&a, H_HASH), 0);
        assert_eq!(u32_at(&a, H_HASH), u32_at(&b, H_HASH));
        assert!(same_attributes(&a, &b, FIRST));
        set(&mut b, FIRST, true, b"x", Some(b"3")).unwrap();
        assert!(!same_attributes(&a, &b, FIRST));
    }

    #[test]
    fn malformed_areas_are_refused() {
        let mut b = block(1024);
        b[FIRST] = 200; // name runs past nothing yet, but the value offset is wild
        b[FIRST + 1] = 1;
        b[FIRST + 2..FIRST + 4].copy_from_slice(&2000u16.to_le_bytes());
        b[FIRST + 8] = 4;
        b[FIRST + 16..FIRST + 216].fill(b'n');
        assert!(entries(&b, FIRST).is_err());
        let mut t = vec![0xFFu8; 40];
        assert!(entries(&t, 0).is_err());
        t.fill(0);
        t[0] = 30;
        assert!(entries(&t, 0).is_err());
    }
}
