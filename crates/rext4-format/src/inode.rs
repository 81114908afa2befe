//! The on-disk inode (`struct ext4_inode`): 128 bytes, plus `i_extra_isize` extra bytes in
//! larger inode records.

use crate::checksum::crc32c;
use crate::split::{hi16, hi32, lo16, lo32};
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Size of the base inode that every revision has.
pub const GOOD_OLD_INODE_SIZE: usize = 128;
/// Size of this struct: the base inode plus every extra field the kernel knows.
pub const INODE_STRUCT_SIZE: usize = 160;
/// Number of `u32` slots in `i_block`.
pub const N_BLOCKS: usize = 15;
/// Direct block pointers in a block-mapped inode.
pub const NDIR_BLOCKS: usize = 12;
/// `i_block` index of the single-indirect block.
pub const IND_BLOCK: usize = 12;
/// `i_block` index of the double-indirect block.
pub const DIND_BLOCK: usize = 13;
/// `i_block` index of the triple-indirect block.
pub const TIND_BLOCK: usize = 14;

// i_mode file types.
pub const S_IFMT: u16 = 0o170000;
pub const S_IFSOCK: u16 = 0o140000;
pub const S_IFLNK: u16 = 0o120000;
pub const S_IFREG: u16 = 0o100000;
pub const S_IFBLK: u16 = 0o060000;
pub const S_IFDIR: u16 = 0o040000;
pub const S_IFCHR: u16 = 0o020000;
pub const S_IFIFO: u16 = 0o010000;

// i_flags.
pub const SECRM_FL: u32 = 0x0000_0001;
pub const UNRM_FL: u32 = 0x0000_0002;
pub const COMPR_FL: u32 = 0x0000_0004;
pub const SYNC_FL: u32 = 0x0000_0008;
pub const IMMUTABLE_FL: u32 = 0x0000_0010;
pub const APPEND_FL: u32 = 0x0000_0020;
pub const NODUMP_FL: u32 = 0x0000_0040;
pub const NOATIME_FL: u32 = 0x0000_0080;
pub const ENCRYPT_FL: u32 = 0x0000_0800;
pub const INDEX_FL: u32 = 0x0000_1000;
pub const IMAGIC_FL: u32 = 0x0000_2000;
pub const JOURNAL_DATA_FL: u32 = 0x0000_4000;
pub const NOTAIL_FL: u32 = 0x0000_8000;
pub const DIRSYNC_FL: u32 = 0x0001_0000;
pub const TOPDIR_FL: u32 = 0x0002_0000;
pub const HUGE_FILE_FL: u32 = 0x0004_0000;
pub const EXTENTS_FL: u32 = 0x0008_0000;
pub const VERITY_FL: u32 = 0x0010_0000;
pub const EA_INODE_FL: u32 = 0x0020_0000;
pub const INLINE_DATA_FL: u32 = 0x1000_0000;
pub const PROJINHERIT_FL: u32 = 0x2000_0000;
pub const CASEFOLD_FL: u32 = 0x4000_0000;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Debug)]
#[repr(C)]
pub struct Inode {
    /*00*/ pub i_mode: U16,
    /*02*/ pub i_uid: U16,
    /*04*/ pub i_size_lo: U32,
    /*08*/ pub i_atime: U32,
    /*0C*/ pub i_ctime: U32,
    /*10*/ pub i_mtime: U32,
    /*14*/ pub i_dtime: U32,
    /*18*/ pub i_gid: U16,
    /*1A*/ pub i_links_count: U16,
    /*1C*/ pub i_blocks_lo: U32,
    /*20*/ pub i_flags: U32,
    /*24*/ pub i_version_lo: U32,
    /*28*/ pub i_block: [U32; N_BLOCKS],
    /*64*/ pub i_generation: U32,
    /*68*/ pub i_file_acl_lo: U32,
    /*6C*/ pub i_size_high: U32,
    /*70*/ pub i_obso_faddr: U32,
    /*74*/ pub i_blocks_high: U16,
    /*76*/ pub i_file_acl_high: U16,
    /*78*/ pub i_uid_high: U16,
    /*7A*/ pub i_gid_high: U16,
    /*7C*/ pub i_checksum_lo: U16,
    /*7E*/ pub i_reserved: U16,
    // Extra fields; present only as far as i_extra_isize reaches.
    /*80*/
    pub i_extra_isize: U16,
    /*82*/ pub i_checksum_hi: U16,
    /*84*/ pub i_ctime_extra: U32,
    /*88*/ pub i_mtime_extra: U32,
    /*8C*/ pub i_atime_extra: U32,
    /*90*/ pub i_crtime: U32,
    /*94*/ pub i_crtime_extra: U32,
    /*98*/ pub i_version_hi: U32,
    /*9C*/ pub i_projid: U32,
}
const _: () = assert!(core::mem::size_of::<Inode>() == INODE_STRUCT_SIZE);

/// Offsets used by the checksum and by "does the extra area reach this field" tests.
pub const OFF_CHECKSUM_LO: usize = 0x7C;
pub const OFF_EXTRA_ISIZE: usize = 0x80;
pub const OFF_CHECKSUM_HI: usize = 0x82;
pub const OFF_CTIME_EXTRA: usize = 0x84;
pub const OFF_MTIME_EXTRA: usize = 0x88;
pub const OFF_ATIME_EXTRA: usize = 0x8C;
pub const OFF_CRTIME: usize = 0x90;
pub const OFF_CRTIME_EXTRA: usize = 0x94;
pub const OFF_VERSION_HI: usize = 0x98;
pub const OFF_PROJID: usize = 0x9C;

/// A timestamp: seconds since the epoch and nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp {
    pub sec: i64,
    pub nsec: u32,
}

/// Decodes a 32-bit seconds field and its `_extra` word: the low two bits extend the signed
/// seconds beyond 2038, the upper 30 bits are nanoseconds.
pub fn decode_time(sec: u32, extra: Option<u32>) -> Timestamp {
    let base = i64::from(sec as i32);
    match extra {
        Some(x) => Timestamp { sec: base + (i64::from(x & 3) << 32), nsec: x >> 2 },
        None => Timestamp { sec: base, nsec: 0 },
    }
}

/// Encodes a timestamp as (seconds field, extra word).
// The seconds field keeps the low 32 bits and the epoch the next two: the format's split.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn encode_time(t: Timestamp) -> (u32, u32) {
    let sec = t.sec as u32;
    let epoch = ((t.sec - i64::from(sec as i32)) >> 32) as u32 & 3;
    (sec, (t.nsec << 2) | epoch)
}

impl Inode {
    /// Decodes an inode record (`inode_size` bytes, at least 128). Fields beyond the record read
    /// as zero; callers must also respect `i_extra_isize` (see [`Inode::has_field`]).
    pub fn parse(record: &[u8]) -> Option<Self> {
        if record.len() < GOOD_OLD_INODE_SIZE {
            return None;
        }
        let mut raw = [0u8; INODE_STRUCT_SIZE];
        let n = record.len().min(INODE_STRUCT_SIZE);
        raw[..n].copy_from_slice(&record[..n]);
        Self::read_from_bytes(&raw).ok()
    }

    /// The record decoded in place, without a copy, when it holds every field of the
    /// structure (records of 160 bytes or more: every `inode_size` but 128).
    pub fn view(record: &[u8]) -> Option<&Self> {
        Self::ref_from_prefix(record).ok().map(|(i, _)| i)
    }

    /// Whether the extra field at byte `offset` of size `size` lies within `i_extra_isize` of a
    /// record of `inode_size` bytes.
    pub fn has_field(&self, inode_size: usize, offset: usize, size: usize) -> bool {
        inode_size > GOOD_OLD_INODE_SIZE
            && offset + size <= GOOD_OLD_INODE_SIZE + usize::from(self.i_extra_isize.get())
    }

    pub fn mode(&self) -> u16 {
        self.i_mode.get()
    }
    pub fn file_type(&self) -> u16 {
        self.mode() & S_IFMT
    }
    pub fn flags(&self) -> u32 {
        self.i_flags.get()
    }
    pub fn uid(&self) -> u32 {
        u32::from(self.i_uid.get()) | u32::from(self.i_uid_high.get()) << 16
    }
    pub fn gid(&self) -> u32 {
        u32::from(self.i_gid.get()) | u32::from(self.i_gid_high.get()) << 16
    }
    /// File size. `i_size_high` is honoured for every file type, as the kernel does.
    pub fn size(&self) -> u64 {
        u64::from(self.i_size_lo.get()) | u64::from(self.i_size_high.get()) << 32
    }
    pub fn set_size(&mut self, v: u64) {
        self.i_size_lo.set(lo32(v));
        self.i_size_high.set(hi32(v));
    }
    pub fn links_count(&self) -> u16 {
        self.i_links_count.get()
    }
    pub fn generation(&self) -> u32 {
        self.i_generation.get()
    }
    /// The extended-attribute block (`i_file_acl`), 48 bits.
    pub fn file_acl(&self) -> u64 {
        u64::from(self.i_file_acl_lo.get()) | u64::from(self.i_file_acl_high.get()) << 32
    }

    /// Blocks used, in 512-byte units, as `stat(2)` reports them. `huge_file` says whether the
    /// high half and the HUGE_FILE_FL unit (filesystem blocks) apply.
    pub fn blocks_512(&self, huge_file: bool, block_size: u32) -> u64 {
        let lo = u64::from(self.i_blocks_lo.get());
        if !huge_file {
            return lo;
        }
        let n = lo | u64::from(self.i_blocks_high.get()) << 32;
        if self.flags() & HUGE_FILE_FL != 0 {
            n.saturating_mul(u64::from(block_size / 512))
        } else {
            n
        }
    }

    fn extra_time(&self, inode_size: usize, off: usize, v: u32) -> Option<u32> {
        self.has_field(inode_size, off, 4).then_some(v)
    }
    pub fn atime(&self, inode_size: usize) -> Timestamp {
        let x = self.extra_time(inode_size, OFF_ATIME_EXTRA, self.i_atime_extra.get());
        decode_time(self.i_atime.get(), x)
    }
    pub fn mtime(&self, inode_size: usize) -> Timestamp {
        let x = self.extra_time(inode_size, OFF_MTIME_EXTRA, self.i_mtime_extra.get());
        decode_time(self.i_mtime.get(), x)
    }
    pub fn ctime(&self, inode_size: usize) -> Timestamp {
        let x = self.extra_time(inode_size, OFF_CTIME_EXTRA, self.i_ctime_extra.get());
        decode_time(self.i_ctime.get(), x)
    }
    /// Creation time, if the record has room for it.
    pub fn crtime(&self, inode_size: usize) -> Option<Timestamp> {
        if !self.has_field(inode_size, OFF_CRTIME, 4) {
            return None;
        }
        let x = self.extra_time(inode_size, OFF_CRTIME_EXTRA, self.i_crtime_extra.get());
        Some(decode_time(self.i_crtime.get(), x))
    }
    pub fn dtime(&self) -> u32 {
        self.i_dtime.get()
    }

    /// `i_block` as raw little-endian bytes (60 bytes): extent root, block map, fast symlink
    /// target or inline data.
    pub fn i_block_bytes(&self) -> &[u8] {
        self.i_block.as_bytes()
    }

    /// Device number of a character or block device, as `(major, minor)`: the old 16-bit
    /// encoding in `i_block[0]`, else the new one in `i_block[1]`.
    pub fn device(&self) -> (u32, u32) {
        let old = self.i_block[0].get();
        if old != 0 {
            ((old >> 8) & 0xFF, old & 0xFF)
        } else {
            let new = self.i_block[1].get();
            ((new & 0xFFF00) >> 8, (new & 0xFF) | ((new >> 12) & 0xFFF00))
        }
    }
}

/// Whether a record stores the high 16 bits of its checksum: it reaches `i_checksum_hi` and
/// `i_extra_isize` says the field is in use.
fn has_checksum_hi(record: &[u8]) -> bool {
    if record.len() < OFF_CHECKSUM_HI + 2 {
        return false;
    }
    let extra = u16::from_le_bytes([record[OFF_EXTRA_ISIZE], record[OFF_EXTRA_ISIZE + 1]]);
    GOOD_OLD_INODE_SIZE + usize::from(extra) >= OFF_CHECKSUM_HI + 2
}

/// The metadata_csum checksum of an inode record. `inode_csum_seed` comes from
/// [`crate::checksum::inode_csum_seed`]. The two checksum fields count as zero. For 128-byte
/// records only the low 16 bits are stored. Records of any length are accepted (an engine only
/// passes whole `inode_size` records).
pub fn inode_checksum(record: &[u8], inode_csum_seed: u32) -> u32 {
    let n = record.len();
    // The common record, in one pass over a copy with the fields zeroed: six short calls over
    // unaligned pieces cost several times as much (docs/bench.md, "After one scan per create,
    // cheaper checksums, LTO and sharded revokes").
    if n == 256 {
        let mut copy = [0u8; 256];
        copy.copy_from_slice(record);
        copy[OFF_CHECKSUM_LO..OFF_CHECKSUM_LO + 2].fill(0);
        if has_checksum_hi(record) {
            copy[OFF_CHECKSUM_HI..OFF_CHECKSUM_HI + 2].fill(0);
        }
        return crc32c(inode_csum_seed, &copy);
    }
    inode_checksum_pieces(record, inode_csum_seed)
}

/// [`inode_checksum`] over the record's pieces around the checksum fields (any length).
fn inode_checksum_pieces(record: &[u8], inode_csum_seed: u32) -> u32 {
    let zero = [0u8; 2];
    let n = record.len();
    let mut c = crc32c(inode_csum_seed, &record[..OFF_CHECKSUM_LO.min(n)]);
    if n >= OFF_CHECKSUM_LO + 2 {
        c = crc32c(c, &zero);
        c = crc32c(c, &record[OFF_CHECKSUM_LO + 2..GOOD_OLD_INODE_SIZE.min(n)]);
    }
    if n > GOOD_OLD_INODE_SIZE {
        if has_checksum_hi(record) {
            c = crc32c(c, &record[GOOD_OLD_INODE_SIZE..OFF_CHECKSUM_HI]);
            c = crc32c(c, &zero);
            c = crc32c(c, &record[OFF_CHECKSUM_HI + 2..]);
        } else {
            c = crc32c(c, &record[GOOD_OLD_INODE_SIZE..]);
        }
    }
    c
}

/// The checksum stored in an inode record, and whether it holds all 32 bits.
pub fn stored_inode_checksum(record: &[u8]) -> (u32, bool) {
    let Some(l) = record.get(OFF_CHECKSUM_LO..OFF_CHECKSUM_LO + 2) else { return (0, false) };
    let lo = u32::from(u16::from_le_bytes([l[0], l[1]]));
    if has_checksum_hi(record) {
        let hi = u16::from_le_bytes([record[OFF_CHECKSUM_HI], record[OFF_CHECKSUM_HI + 1]]);
        return (lo | u32::from(hi) << 16, true);
    }
    (lo, false)
}

/// Checks a record's checksum; `record` must be at least 128 bytes.
pub fn verify_inode_checksum(record: &[u8], inode_csum_seed: u32) -> bool {
    let (stored, full) = stored_inode_checksum(record);
    let computed = inode_checksum(record, inode_csum_seed);
    if full {
        stored == computed
    } else {
        stored == computed & 0xFFFF
    }
}

/// Stores the checksum into a record.
pub fn set_inode_checksum(record: &mut [u8], inode_csum_seed: u32) {
    if record.len() < OFF_CHECKSUM_LO + 2 {
        return;
    }
    let c = inode_checksum(record, inode_csum_seed);
    record[OFF_CHECKSUM_LO..OFF_CHECKSUM_LO + 2].copy_from_slice(&lo16(c).to_le_bytes());
    let (_, full) = stored_inode_checksum(record);
    if full {
        record[OFF_CHECKSUM_HI..OFF_CHECKSUM_HI + 2].copy_from_slice(&hi16(c).to_le_bytes());
    }
}

#[cfg(test)]
// Fixtures are built from small known values; a narrowing cast there is the clearest form.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
mod tests {
    use super::*;
    use zerocopy::FromZeros;

    #[test]
    fn view_reads_what_parse_copies() {
        let mut rec = vec![0u8; 256];
        for (i, b) in rec.iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let (v, p) = (Inode::view(&rec).unwrap(), Inode::parse(&rec).unwrap());
        assert_eq!(v.as_bytes(), p.as_bytes());
        assert_eq!((v.mode(), v.size(), v.flags()), (p.mode(), p.size(), p.flags()));
        // A 128-byte record lacks the extra fields: no view; parse reads them as zero.
        assert!(Inode::view(&rec[..128]).is_none());
        assert!(Inode::parse(&rec[..128]).unwrap().as_bytes()[128..].iter().all(|&b| b == 0));
    }

    #[test]
    fn time_round_trips_across_epochs() {
        for sec in [0i64, 1, -1, i64::from(i32::MAX), i64::from(i32::MIN), 1 << 32, (3 << 32) - 5] {
            let t = Timestamp { sec, nsec: 999_999_999 };
            let (s, x) = encode_time(t);
            assert_eq!(decode_time(s, Some(x)), t, "sec {sec}");
        }
    }

    #[test]
    fn checksum_never_panics_on_odd_lengths() {
        for n in 0..300 {
            let mut rec = vec![0xA5u8; n];
            let _ = verify_inode_checksum(&rec, 1);
            set_inode_checksum(&mut rec, 1);
            if n >= OFF_CHECKSUM_LO + 2 {
                assert!(verify_inode_checksum(&rec, 1), "length {n}");
            }
        }
    }

    #[test]
    fn checksum_round_trips() {
        let mut rec = vec![0u8; 256];
        rec[OFF_EXTRA_ISIZE] = 32;
        rec[0] = 0xA4;
        set_inode_checksum(&mut rec, 1234);
        assert!(verify_inode_checksum(&rec, 1234));
        rec[5] ^= 1;
        assert!(!verify_inode_checksum(&rec, 1234));
        let mut small = vec![0u8; 128];
        set_inode_checksum(&mut small, 99);
        assert!(verify_inode_checksum(&small, 99));
    }

    #[test]
    fn whole_record_checksum_matches_the_pieces() {
        // Records with and without room for checksum_hi, and with both fields set (they count
        // as zero either way).
        for extra in [0u8, 2, 4, 28, 32, 160] {
            let mut rec: Vec<u8> = (0..256u32).map(|i| (i * 37 + u32::from(extra)) as u8).collect();
            rec[OFF_EXTRA_ISIZE..OFF_EXTRA_ISIZE + 2].copy_from_slice(&u16::from(extra).to_le_bytes());
            assert_eq!(inode_checksum(&rec, 77), inode_checksum_pieces(&rec, 77), "extra_isize {extra}");
        }
    }

    #[test]
    fn device_numbers_decode_both_encodings() {
        let mut ino = Inode::new_zeroed();
        ino.i_block[0].set((8 << 8) | 1);
        assert_eq!(ino.device(), (8, 1));
        ino.i_block[0].set(0);
        // major 259, minor 70000 in the new encoding.
        let (maj, min) = (259u32, 70000u32);
        ino.i_block[1].set((min & 0xFF) | (maj << 8) | ((min & !0xFF) << 12));
        assert_eq!(ino.device(), (maj, min));
    }
}
