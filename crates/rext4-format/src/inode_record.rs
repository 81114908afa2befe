//! Typed writes into an inode record: [`InodeRecord`] names every field by its place in
//! [`Inode`] (no byte offsets at the call sites), keeps hi/lo halves together, and writes the
//! extra fields only as far as `i_extra_isize` reaches.
//!
//! A record is `inode_size` bytes: 128, or more with an extra area. Base fields are always
//! there; the extra ones (`*_extra` times, `i_crtime`, ...) exist only where
//! `128 + i_extra_isize` covers them, as the kernel's `EXT4_FITS_IN_INODE` says.

use crate::inode::{
    encode_time, Inode, Timestamp, GOOD_OLD_INODE_SIZE, N_BLOCKS, OFF_ATIME_EXTRA, OFF_CRTIME,
    OFF_CRTIME_EXTRA, OFF_CTIME_EXTRA, OFF_EXTRA_ISIZE, OFF_MTIME_EXTRA, OFF_PROJID,
};
use crate::split::{hi16, hi16_of_48, hi32, lo16, lo32};
use core::mem::offset_of;
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// Which of an inode's timestamps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeField {
    Atime,
    Ctime,
    Mtime,
    Crtime,
}

/// An inode record: `InodeRecord<&[u8]>` reads its fields, `InodeRecord<&mut [u8]>` also
/// writes them.
pub struct InodeRecord<B>(B);

/// A field's value at byte `off` of `raw`; zero where the record is too short (callers only
/// read base fields, which every record has).
fn get<T: FromBytes + Default>(raw: &[u8], off: usize) -> T {
    raw.get(off..).and_then(|b| T::read_from_prefix(b).ok()).map_or_else(T::default, |(v, _)| v)
}

impl<B: AsRef<[u8]>> InodeRecord<B> {
    /// The record in `raw`; `None` if it is shorter than the base inode.
    pub fn new(raw: B) -> Option<Self> {
        (raw.as_ref().len() >= GOOD_OLD_INODE_SIZE).then_some(InodeRecord(raw))
    }

    fn raw(&self) -> &[u8] {
        self.0.as_ref()
    }

    /// Whether the extra field at `off` of `size` bytes lies within `i_extra_isize`.
    pub fn has_field(&self, off: usize, size: usize) -> bool {
        self.raw().len() > GOOD_OLD_INODE_SIZE
            && off + size <= GOOD_OLD_INODE_SIZE + usize::from(self.extra_isize())
            && off + size <= self.raw().len()
    }

    /// `i_extra_isize`; 0 for 128-byte records.
    pub fn extra_isize(&self) -> u16 {
        if self.raw().len() < OFF_EXTRA_ISIZE + 2 {
            return 0;
        }
        get::<U16>(self.raw(), OFF_EXTRA_ISIZE).get()
    }
    pub fn mode(&self) -> u16 {
        get::<U16>(self.raw(), offset_of!(Inode, i_mode)).get()
    }
    pub fn size(&self) -> u64 {
        u64::from(get::<U32>(self.raw(), offset_of!(Inode, i_size_lo)).get())
            | u64::from(get::<U32>(self.raw(), offset_of!(Inode, i_size_high)).get()) << 32
    }
    /// `i_blocks` as stored (512-byte sectors, or filesystem blocks with HUGE_FILE_FL): 48 bits.
    pub fn blocks(&self) -> u64 {
        u64::from(get::<U32>(self.raw(), offset_of!(Inode, i_blocks_lo)).get())
            | u64::from(get::<U16>(self.raw(), offset_of!(Inode, i_blocks_high)).get()) << 32
    }
    pub fn flags(&self) -> u32 {
        get::<U32>(self.raw(), offset_of!(Inode, i_flags)).get()
    }
    /// A 32-bit id kept as 16-bit halves at `lo` and `hi`.
    fn halves(&self, lo: usize, hi: usize) -> u32 {
        u32::from(get::<U16>(self.raw(), lo).get()) | u32::from(get::<U16>(self.raw(), hi).get()) << 16
    }
    /// Owner, both halves.
    pub fn uid(&self) -> u32 {
        self.halves(offset_of!(Inode, i_uid), offset_of!(Inode, i_uid_high))
    }
    /// Group, both halves.
    pub fn gid(&self) -> u32 {
        self.halves(offset_of!(Inode, i_gid), offset_of!(Inode, i_gid_high))
    }
    /// `i_projid`, 0 where the record's extra area does not reach it (as e2fsprogs and the
    /// kernel read it).
    pub fn projid(&self) -> u32 {
        if self.has_field(OFF_PROJID, 4) {
            get::<U32>(self.raw(), OFF_PROJID).get()
        } else {
            0
        }
    }
    pub fn links_count(&self) -> u16 {
        get::<U16>(self.raw(), offset_of!(Inode, i_links_count)).get()
    }
    /// `i_dtime`: the deletion time, or the next inode of the orphan list.
    pub fn dtime(&self) -> u32 {
        get::<U32>(self.raw(), offset_of!(Inode, i_dtime)).get()
    }
    pub fn generation(&self) -> u32 {
        get::<U32>(self.raw(), offset_of!(Inode, i_generation)).get()
    }
    /// `i_version_lo` (an EA inode keeps the low half of its reference count there).
    pub fn version_lo(&self) -> u32 {
        get::<U32>(self.raw(), offset_of!(Inode, i_version_lo)).get()
    }
    /// The extended-attribute block (`i_file_acl`), 48 bits.
    pub fn file_acl(&self) -> u64 {
        u64::from(get::<U32>(self.raw(), offset_of!(Inode, i_file_acl_lo)).get())
            | u64::from(get::<U16>(self.raw(), offset_of!(Inode, i_file_acl_high)).get()) << 32
    }
    /// `i_block` (60 bytes): extent root, block map, fast symlink target, inline data or a
    /// device number.
    pub fn i_block(&self) -> &[u8] {
        let off = offset_of!(Inode, i_block);
        &self.raw()[off..off + 4 * N_BLOCKS]
    }
}

impl<B: AsRef<[u8]> + AsMut<[u8]>> InodeRecord<B> {
    fn put<T: IntoBytes + Immutable>(&mut self, off: usize, v: T) {
        let b = v.as_bytes();
        if let Some(dst) = self.0.as_mut().get_mut(off..off + b.len()) {
            dst.copy_from_slice(b);
        }
    }

    pub fn set_mode(&mut self, mode: u16) {
        self.put(offset_of!(Inode, i_mode), U16::new(mode));
    }
    pub fn set_uid(&mut self, uid: u32) {
        self.put(offset_of!(Inode, i_uid), U16::new(lo16(uid)));
        self.put(offset_of!(Inode, i_uid_high), U16::new(hi16(uid)));
    }
    pub fn set_gid(&mut self, gid: u32) {
        self.put(offset_of!(Inode, i_gid), U16::new(lo16(gid)));
        self.put(offset_of!(Inode, i_gid_high), U16::new(hi16(gid)));
    }
    pub fn set_size(&mut self, v: u64) {
        self.put(offset_of!(Inode, i_size_lo), U32::new(lo32(v)));
        self.put(offset_of!(Inode, i_size_high), U32::new(hi32(v)));
    }
    /// Stores `i_blocks` (its low 48 bits).
    pub fn set_blocks(&mut self, v: u64) {
        self.put(offset_of!(Inode, i_blocks_lo), U32::new(lo32(v)));
        self.put(offset_of!(Inode, i_blocks_high), U16::new(hi16_of_48(v)));
    }
    pub fn set_flags(&mut self, flags: u32) {
        self.put(offset_of!(Inode, i_flags), U32::new(flags));
    }
    pub fn set_links_count(&mut self, n: u16) {
        self.put(offset_of!(Inode, i_links_count), U16::new(n));
    }
    pub fn set_dtime(&mut self, v: u32) {
        self.put(offset_of!(Inode, i_dtime), U32::new(v));
    }
    /// Sets `i_projid` where the extra area reaches it.
    pub fn set_projid(&mut self, v: u32) {
        if self.has_field(OFF_PROJID, 4) {
            self.put(OFF_PROJID, U32::new(v));
        }
    }
    pub fn set_generation(&mut self, v: u32) {
        self.put(offset_of!(Inode, i_generation), U32::new(v));
    }
    pub fn set_version_lo(&mut self, v: u32) {
        self.put(offset_of!(Inode, i_version_lo), U32::new(v));
    }
    pub fn set_file_acl(&mut self, blk: u64) {
        self.put(offset_of!(Inode, i_file_acl_lo), U32::new(lo32(blk)));
        self.put(offset_of!(Inode, i_file_acl_high), U16::new(hi16_of_48(blk)));
    }
    /// `i_extra_isize`, in records that have an extra area.
    pub fn set_extra_isize(&mut self, v: u16) {
        if self.raw().len() > GOOD_OLD_INODE_SIZE {
            self.put(OFF_EXTRA_ISIZE, U16::new(v));
        }
    }
    pub fn i_block_mut(&mut self) -> &mut [u8] {
        let off = offset_of!(Inode, i_block);
        &mut self.0.as_mut()[off..off + 4 * N_BLOCKS]
    }

    /// Stores a device number as the kernel's `ext4_set_inode` does: the old 16-bit encoding in
    /// `i_block[0]` when major and minor fit in a byte each, else the new one in `i_block[1]`.
    pub fn set_device(&mut self, major: u32, minor: u32) {
        let b = self.i_block_mut();
        b.fill(0);
        if major < 256 && minor < 256 {
            b[..4].copy_from_slice(&((major << 8) | minor).to_le_bytes());
        } else {
            let new = (minor & 0xFF) | (major << 8) | ((minor & !0xFF) << 12);
            b[4..8].copy_from_slice(&new.to_le_bytes());
        }
    }

    /// Stores timestamp `which`: the seconds always (but `i_crtime`, an extra field), the
    /// nanoseconds and epoch bits where the record has the `_extra` word.
    pub fn set_time(&mut self, which: TimeField, t: Timestamp) {
        let (sec_off, extra_off) = match which {
            TimeField::Atime => (offset_of!(Inode, i_atime), OFF_ATIME_EXTRA),
            TimeField::Ctime => (offset_of!(Inode, i_ctime), OFF_CTIME_EXTRA),
            TimeField::Mtime => (offset_of!(Inode, i_mtime), OFF_MTIME_EXTRA),
            TimeField::Crtime => (OFF_CRTIME, OFF_CRTIME_EXTRA),
        };
        if sec_off >= GOOD_OLD_INODE_SIZE && !self.has_field(sec_off, 4) {
            return;
        }
        let (sec, extra) = encode_time(t);
        self.put(sec_off, U32::new(sec));
        if self.has_field(extra_off, 4) {
            self.put(extra_off, U32::new(extra));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_land_where_the_struct_says() {
        let mut raw = [0u8; 256];
        raw[OFF_EXTRA_ISIZE] = 32;
        let mut r = InodeRecord::new(&mut raw[..]).unwrap();
        r.set_uid(0x1234_5678);
        r.set_gid(0x9ABC_DEF0);
        r.set_size(0x1_2345_6789);
        r.set_blocks(0x7777_0000_0001);
        r.set_file_acl(0x42_0000_0007);
        r.set_links_count(3);
        r.set_flags(0x80000);
        r.set_time(TimeField::Mtime, Timestamp { sec: 5, nsec: 7 });
        r.set_time(TimeField::Crtime, Timestamp { sec: 9, nsec: 0 });
        let i = Inode::parse(&raw).unwrap();
        assert_eq!(
            (i.uid(), i.gid(), i.size(), i.file_acl()),
            (0x1234_5678, 0x9ABC_DEF0, 0x1_2345_6789, 0x42_0000_0007)
        );
        assert_eq!((i.links_count(), i.flags()), (3, 0x80000));
        assert_eq!(i.blocks_512(true, 4096), 0x7777_0000_0001);
        assert_eq!(i.mtime(256), Timestamp { sec: 5, nsec: 7 });
        assert_eq!(i.crtime(256), Some(Timestamp { sec: 9, nsec: 0 }));
    }

    #[test]
    fn extra_fields_only_within_extra_isize() {
        let mut raw = [0u8; 256];
        raw[OFF_EXTRA_ISIZE] = 8; // reaches i_ctime_extra, not i_mtime_extra
        let mut r = InodeRecord::new(&mut raw[..]).unwrap();
        r.set_time(TimeField::Mtime, Timestamp { sec: 5, nsec: 7 });
        r.set_time(TimeField::Ctime, Timestamp { sec: 6, nsec: 8 });
        r.set_time(TimeField::Crtime, Timestamp { sec: 9, nsec: 0 });
        assert_eq!(&raw[OFF_MTIME_EXTRA..OFF_MTIME_EXTRA + 4], &[0; 4]);
        assert_eq!(&raw[OFF_CRTIME..OFF_CRTIME + 4], &[0; 4]);
        assert_eq!(u32::from_le_bytes(raw[OFF_CTIME_EXTRA..OFF_CTIME_EXTRA + 4].try_into().unwrap()), 8 << 2);
        let mut small = [0u8; 128];
        let mut r = InodeRecord::new(&mut small[..]).unwrap();
        r.set_time(TimeField::Crtime, Timestamp { sec: 9, nsec: 0 });
        r.set_time(TimeField::Atime, Timestamp { sec: 1, nsec: 1 });
        assert_eq!(Inode::parse(&small).unwrap().atime(128), Timestamp { sec: 1, nsec: 0 });
        assert!(InodeRecord::new(&[0u8; 100][..]).is_none());
    }

    #[test]
    fn devices_round_trip_in_both_encodings() {
        for (ma, mi) in [(1, 3), (8, 1), (259, 70000), (4095, 0xFFFFF), (0, 0)] {
            let mut raw = [0u8; 128];
            InodeRecord::new(&mut raw[..]).unwrap().set_device(ma, mi);
            assert_eq!(Inode::parse(&raw).unwrap().device(), (ma, mi));
        }
    }
}
