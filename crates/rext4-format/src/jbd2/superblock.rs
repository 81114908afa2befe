//! The journal superblock (`journal_superblock_t`): the first 1024 bytes of journal block 0.

use super::{
    journal_csum_seed, tag_bytes, BlockType, CsumVersion, Header, Jbd2Error, JournalCompat, JournalIncompat,
    JournalParams, CHKSUM_CRC32C, DEFAULT_FAST_COMMIT_BLOCKS, KNOWN_INCOMPAT, KNOWN_RO_COMPAT,
    MIN_JOURNAL_BLOCKS,
};
use crate::checksum::crc32c;
use zerocopy::big_endian::{I32, U32};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Size of the journal superblock structure (the rest of block 0 is unused).
pub const JOURNAL_SUPERBLOCK_SIZE: usize = 1024;
/// Offset of `s_checksum`.
pub const JSB_CHECKSUM_OFFSET: usize = 0xFC;
/// Most filesystems `s_users` can list.
pub const USERS_MAX: usize = 48;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone)]
#[repr(C)]
pub struct JournalSuperblock {
    /*000*/ pub s_header: Header,
    // Static description of the journal.
    /*00C*/ pub s_blocksize: U32,
    /*010*/ pub s_maxlen: U32,
    /*014*/ pub s_first: U32,
    // Dynamic state of the log.
    /*018*/ pub s_sequence: U32,
    /*01C*/ pub s_start: U32,
    /*020*/ pub s_errno: I32,
    // Valid only in a v2 superblock from here on.
    /*024*/ pub s_feature_compat: U32,
    /*028*/ pub s_feature_incompat: U32,
    /*02C*/ pub s_feature_ro_compat: U32,
    /*030*/ pub s_uuid: [u8; 16],
    /*040*/ pub s_nr_users: U32,
    /*044*/ pub s_dynsuper: U32,
    /*048*/ pub s_max_transaction: U32,
    /*04C*/ pub s_max_trans_data: U32,
    /*050*/ pub s_checksum_type: u8,
    /*051*/ pub s_padding2: [u8; 3],
    /*054*/ pub s_num_fc_blks: U32,
    /*058*/ pub s_head: U32,
    /*05C*/ pub s_padding: [U32; 40],
    /*0FC*/ pub s_checksum: U32,
    /*100*/ pub s_users: [u8; 16 * USERS_MAX],
}
const _: () = assert!(core::mem::size_of::<JournalSuperblock>() == JOURNAL_SUPERBLOCK_SIZE);
const _: () = assert!(core::mem::offset_of!(JournalSuperblock, s_checksum) == JSB_CHECKSUM_OFFSET);

impl JournalSuperblock {
    /// Parses the first 1024 bytes of `bytes`; `None` if there are fewer. Nothing is validated:
    /// see [`Self::params`].
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        Self::read_from_prefix(bytes).ok().map(|(sb, _)| sb)
    }

    /// A fresh, empty v2 superblock as e2fsprogs creates it for an internal journal: log from
    /// block 1, sequence 1, one user, no features.
    pub fn new(block_size: u32, maxlen: u32, uuid: [u8; 16]) -> Self {
        let mut sb = Self::new_zeroed();
        sb.s_header = Header::new(BlockType::SuperblockV2, 0);
        sb.s_blocksize.set(block_size);
        sb.s_maxlen.set(maxlen);
        sb.s_first.set(1);
        sb.s_sequence.set(1);
        sb.s_nr_users.set(1);
        sb.s_uuid = uuid;
        sb
    }

    /// `SuperblockV1` or `SuperblockV2` when the magic is right and the type is one of these.
    pub fn version(&self) -> Option<BlockType> {
        if !self.s_header.has_magic() {
            return None;
        }
        match self.s_header.block_type() {
            Some(t @ (BlockType::SuperblockV1 | BlockType::SuperblockV2)) => Some(t),
            _ => None,
        }
    }
    /// Whether the fields after `s_errno` (features, UUID, ...) are meaningful.
    pub fn is_v2(&self) -> bool {
        self.version() == Some(BlockType::SuperblockV2)
    }

    pub fn block_size(&self) -> u32 {
        self.s_blocksize.get()
    }
    /// Total journal length in blocks, fast-commit area included.
    pub fn maxlen(&self) -> u32 {
        self.s_maxlen.get()
    }
    /// First block of the log (after the superblock).
    pub fn first(&self) -> u32 {
        self.s_first.get()
    }
    /// Sequence number of the first transaction expected in the log.
    pub fn sequence(&self) -> u32 {
        self.s_sequence.get()
    }
    pub fn set_sequence(&mut self, v: u32) {
        self.s_sequence.set(v);
    }
    /// Journal block where the log starts; 0 means the log is empty (nothing to recover).
    pub fn start(&self) -> u32 {
        self.s_start.get()
    }
    pub fn set_start(&mut self, v: u32) {
        self.s_start.set(v);
    }
    /// Negative errno recorded when the journal was aborted, else 0.
    pub fn errno(&self) -> i32 {
        self.s_errno.get()
    }
    pub fn set_errno(&mut self, v: i32) {
        self.s_errno.set(v);
    }
    /// Head of the log, kept up to date only while the filesystem is clean.
    pub fn head(&self) -> u32 {
        self.s_head.get()
    }

    /// Compat features; empty for a v1 superblock (whose feature words are meaningless).
    pub fn compat(&self) -> JournalCompat {
        JournalCompat::from_bits_retain(self.v2_word(self.s_feature_compat.get()))
    }
    /// Incompat features; empty for a v1 superblock.
    pub fn incompat(&self) -> JournalIncompat {
        JournalIncompat::from_bits_retain(self.v2_word(self.s_feature_incompat.get()))
    }
    /// Read-only compat features (none are defined); 0 for a v1 superblock.
    pub fn ro_compat(&self) -> u32 {
        self.v2_word(self.s_feature_ro_compat.get())
    }
    fn v2_word(&self, w: u32) -> u32 {
        if self.is_v2() {
            w
        } else {
            0
        }
    }
    pub fn set_compat(&mut self, f: JournalCompat) {
        self.s_feature_compat.set(f.bits());
    }
    pub fn set_incompat(&mut self, f: JournalIncompat) {
        self.s_feature_incompat.set(f.bits());
    }

    pub fn uuid(&self) -> [u8; 16] {
        self.s_uuid
    }
    pub fn nr_users(&self) -> u32 {
        self.s_nr_users.get()
    }
    /// The UUIDs of the filesystems sharing the journal (at most [`USERS_MAX`]); an internal
    /// journal lists one all-zero entry.
    pub fn users(&self) -> impl Iterator<Item = [u8; 16]> + '_ {
        let n = usize::try_from(self.nr_users()).map_or(USERS_MAX, |n| n.min(USERS_MAX));
        self.s_users.chunks_exact(16).take(n).map(|c| {
            let mut u = [0u8; 16];
            u.copy_from_slice(c);
            u
        })
    }
    pub fn checksum_type(&self) -> u8 {
        self.s_checksum_type
    }
    /// `s_num_fc_blks` as stored (0 means the default when fast commit is in use).
    pub fn num_fc_blks(&self) -> u32 {
        self.s_num_fc_blks.get()
    }
    /// Size of the fast-commit area if one is in use: `s_num_fc_blks`, or 256 when that is 0
    /// (`jbd2_journal_get_num_fc_blks`). Whether it is in use is the caller's call: the kernel
    /// looks at the journal's `FAST_COMMIT` feature, which it sets only while mounted with fast
    /// commits; e2fsprogs looks at the filesystem's `fast_commit` compat feature.
    pub fn fast_commit_blocks(&self) -> u32 {
        match self.num_fc_blks() {
            0 => DEFAULT_FAST_COMMIT_BLOCKS,
            n => n,
        }
    }
    pub fn has_fast_commit(&self) -> bool {
        self.incompat().contains(JournalIncompat::FAST_COMMIT)
    }
    /// End of the regular log (the kernel's `j_last`: log blocks lie below it): the journal's
    /// length, less the fast-commit area when the journal's `FAST_COMMIT` feature is set.
    pub fn log_end(&self) -> u32 {
        if self.has_fast_commit() {
            self.maxlen().saturating_sub(self.fast_commit_blocks())
        } else {
            self.maxlen()
        }
    }

    /// The checksum scheme in use. Conflicting features (rejected by [`Self::params`]) resolve
    /// to the highest version.
    pub fn csum_version(&self) -> CsumVersion {
        let inc = self.incompat();
        if inc.contains(JournalIncompat::CSUM_V3) {
            CsumVersion::V3
        } else if inc.contains(JournalIncompat::CSUM_V2) {
            CsumVersion::V2
        } else if self.compat().contains(JournalCompat::CHECKSUM) {
            CsumVersion::V1
        } else {
            CsumVersion::None
        }
    }
    pub fn has_csum_v2or3(&self) -> bool {
        matches!(self.csum_version(), CsumVersion::V2 | CsumVersion::V3)
    }
    pub fn is_64bit(&self) -> bool {
        self.incompat().contains(JournalIncompat::BIT64)
    }
    /// Size of a descriptor tag in this journal (`journal_tag_bytes`).
    pub fn tag_size(&self) -> usize {
        tag_bytes(self.csum_version(), self.is_64bit())
    }
    /// The seed of every checksum but the superblock's: crc32c of the UUID.
    pub fn csum_seed(&self) -> u32 {
        journal_csum_seed(&self.s_uuid)
    }

    /// crc32c (seed `!0`) of the 1024-byte superblock with `s_checksum` taken as zero.
    pub fn compute_checksum(&self) -> u32 {
        let b = self.as_bytes();
        let c = crc32c(!0, &b[..JSB_CHECKSUM_OFFSET]);
        let c = crc32c(c, &[0u8; 4]);
        crc32c(c, &b[JSB_CHECKSUM_OFFSET + 4..])
    }
    /// True if the checksum matches or the journal has no v2/v3 checksums.
    pub fn verify_checksum(&self) -> bool {
        !self.has_csum_v2or3() || self.compute_checksum() == self.s_checksum.get()
    }
    /// Recomputes `s_checksum` (only with checksum v2/v3, as the kernel does on every write).
    pub fn update_checksum(&mut self) {
        if self.has_csum_v2or3() {
            let c = self.compute_checksum();
            self.s_checksum.set(c);
        }
    }

    /// Validates the superblock as the kernel does before using a journal (magic, version,
    /// geometry, features, checksum type and checksum) and returns what block parsers need.
    /// The caller still has to compare `s_blocksize` with the filesystem's block size and
    /// `s_maxlen` with the journal inode's size.
    pub fn params(&self) -> Result<JournalParams, Jbd2Error> {
        if !self.s_header.has_magic() {
            return Err(Jbd2Error::BadMagic(self.s_header.h_magic.get()));
        }
        if self.version().is_none() {
            return Err(Jbd2Error::NotASuperblock(self.s_header.h_blocktype.get()));
        }
        let bs = self.block_size();
        if !bs.is_power_of_two() || !(1024..=65536).contains(&bs) {
            return Err(Jbd2Error::BadBlockSize(bs));
        }
        let (first, maxlen) = (self.first(), self.maxlen());
        if first == 0 || first >= maxlen {
            return Err(Jbd2Error::BadFirst { first, maxlen });
        }
        let fc_blocks = if self.has_fast_commit() { self.fast_commit_blocks() } else { 0 };
        if maxlen < MIN_JOURNAL_BLOCKS || maxlen - MIN_JOURNAL_BLOCKS < fc_blocks {
            return Err(Jbd2Error::TooShort { maxlen, fc_blocks });
        }
        let unknown = self.incompat().bits() & !KNOWN_INCOMPAT;
        if unknown != 0 {
            return Err(Jbd2Error::UnknownIncompat(unknown));
        }
        let unknown = self.ro_compat() & !KNOWN_RO_COMPAT;
        if unknown != 0 {
            return Err(Jbd2Error::UnknownRoCompat(unknown));
        }
        let inc = self.incompat();
        let v2or3 = inc.intersects(JournalIncompat::CSUM_V2 | JournalIncompat::CSUM_V3);
        if inc.contains(JournalIncompat::CSUM_V2 | JournalIncompat::CSUM_V3)
            || (v2or3 && self.compat().contains(JournalCompat::CHECKSUM))
        {
            return Err(Jbd2Error::ConflictingChecksums);
        }
        if v2or3 {
            if self.s_checksum_type != CHKSUM_CRC32C {
                return Err(Jbd2Error::BadChecksumType(self.s_checksum_type));
            }
            let computed = self.compute_checksum();
            if computed != self.s_checksum.get() {
                return Err(Jbd2Error::BadChecksum { stored: self.s_checksum.get(), computed });
            }
        }
        Ok(JournalParams {
            // Cannot truncate: at most 65536 (checked above).
            block_size: bs as usize,
            is_64bit: self.is_64bit(),
            csum: self.csum_version(),
            csum_seed: self.csum_seed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn offsets_match_the_kernel_layout() {
        assert_eq!(offset_of!(JournalSuperblock, s_blocksize), 0x0C);
        assert_eq!(offset_of!(JournalSuperblock, s_sequence), 0x18);
        assert_eq!(offset_of!(JournalSuperblock, s_errno), 0x20);
        assert_eq!(offset_of!(JournalSuperblock, s_feature_compat), 0x24);
        assert_eq!(offset_of!(JournalSuperblock, s_uuid), 0x30);
        assert_eq!(offset_of!(JournalSuperblock, s_nr_users), 0x40);
        assert_eq!(offset_of!(JournalSuperblock, s_max_transaction), 0x48);
        assert_eq!(offset_of!(JournalSuperblock, s_checksum_type), 0x50);
        assert_eq!(offset_of!(JournalSuperblock, s_num_fc_blks), 0x54);
        assert_eq!(offset_of!(JournalSuperblock, s_head), 0x58);
        assert_eq!(offset_of!(JournalSuperblock, s_padding), 0x5C);
        assert_eq!(offset_of!(JournalSuperblock, s_users), 0x100);
    }

    fn csum_sb() -> JournalSuperblock {
        let mut sb = JournalSuperblock::new(4096, 1024, [0x11; 16]);
        sb.set_incompat(JournalIncompat::CSUM_V3 | JournalIncompat::BIT64);
        sb.s_checksum_type = CHKSUM_CRC32C;
        sb.update_checksum();
        sb
    }

    #[test]
    fn new_round_trips_and_validates() {
        let sb = csum_sb();
        let bytes = sb.as_bytes().to_vec();
        assert_eq!(&bytes[..4], &[0xC0, 0x3B, 0x39, 0x98]);
        let back = JournalSuperblock::parse(&bytes).unwrap();
        assert_eq!(back.as_bytes(), &bytes[..]);
        assert!(back.verify_checksum());
        let p = back.params().unwrap();
        assert_eq!(p.block_size, 4096);
        assert!(p.is_64bit);
        assert_eq!(p.csum, CsumVersion::V3);
        assert_eq!(p.csum_seed, crc32c(!0, &[0x11; 16]));
        assert_eq!(back.tag_size(), 16);
        assert_eq!(back.users().count(), 1);
        assert!(JournalSuperblock::parse(&bytes[..1023]).is_none());
    }

    #[test]
    fn checksum_covers_everything_but_itself() {
        let mut sb = csum_sb();
        let stored = sb.s_checksum.get();
        let mut raw = sb.as_bytes().to_vec();
        raw[JSB_CHECKSUM_OFFSET..JSB_CHECKSUM_OFFSET + 4].fill(0);
        assert_eq!(crc32c(!0, &raw), stored);
        sb.s_users[700] = 1;
        assert!(!sb.verify_checksum());
        assert!(matches!(sb.params(), Err(Jbd2Error::BadChecksum { .. })));
        sb.update_checksum();
        assert!(sb.params().is_ok());
    }

    #[test]
    fn validation_rejects_bad_superblocks() {
        let good = csum_sb();
        let check = |f: &dyn Fn(&mut JournalSuperblock)| {
            let mut sb = good.clone();
            f(&mut sb);
            sb.update_checksum();
            sb.params()
        };
        assert!(matches!(check(&|sb| sb.s_header.h_magic.set(1)), Err(Jbd2Error::BadMagic(1))));
        assert_eq!(check(&|sb| sb.s_header.h_blocktype.set(2)), Err(Jbd2Error::NotASuperblock(2)));
        assert_eq!(check(&|sb| sb.s_blocksize.set(3000)), Err(Jbd2Error::BadBlockSize(3000)));
        assert_eq!(check(&|sb| sb.s_blocksize.set(512)), Err(Jbd2Error::BadBlockSize(512)));
        assert!(matches!(check(&|sb| sb.s_first.set(0)), Err(Jbd2Error::BadFirst { .. })));
        assert!(matches!(check(&|sb| sb.s_first.set(1024)), Err(Jbd2Error::BadFirst { .. })));
        assert!(matches!(check(&|sb| sb.s_maxlen.set(1000)), Err(Jbd2Error::TooShort { .. })));
        // Fast commit with the default 256 blocks needs 1024 + 256.
        assert!(matches!(
            check(&|sb| sb.set_incompat(sb.incompat() | JournalIncompat::FAST_COMMIT)),
            Err(Jbd2Error::TooShort { .. })
        ));
        assert!(check(&|sb| {
            sb.set_incompat(sb.incompat() | JournalIncompat::FAST_COMMIT);
            sb.s_maxlen.set(1024 + 256);
        })
        .is_ok());
        assert_eq!(
            check(&|sb| sb.s_feature_incompat.set(0x10 | 0x100)),
            Err(Jbd2Error::UnknownIncompat(0x100))
        );
        assert_eq!(check(&|sb| sb.s_feature_ro_compat.set(1)), Err(Jbd2Error::UnknownRoCompat(1)));
        assert_eq!(check(&|sb| sb.s_feature_incompat.set(0x8 | 0x10)), Err(Jbd2Error::ConflictingChecksums));
        assert_eq!(check(&|sb| sb.set_compat(JournalCompat::CHECKSUM)), Err(Jbd2Error::ConflictingChecksums));
        assert_eq!(check(&|sb| sb.s_checksum_type = 1), Err(Jbd2Error::BadChecksumType(1)));
    }

    #[test]
    fn v1_superblocks_have_no_features() {
        let mut sb = csum_sb();
        sb.s_header.h_blocktype.set(BlockType::SuperblockV1.raw());
        assert!(sb.incompat().is_empty());
        assert_eq!(sb.csum_version(), CsumVersion::None);
        assert_eq!(sb.tag_size(), 8);
        let p = sb.params().unwrap();
        assert!(!p.is_64bit);
        assert_eq!(p.csum, CsumVersion::None);
    }

    #[test]
    fn garbage_never_panics() {
        for fill in [0x00u8, 0xFF, 0x5A] {
            let sb = JournalSuperblock::parse(&[fill; 1024]).unwrap();
            let _ = sb.params();
            let _ = sb.users().count();
            let _ = (sb.tag_size(), sb.verify_checksum(), sb.fast_commit_blocks());
        }
        let mut sb = JournalSuperblock::parse(&[0xFF; 1024]).unwrap();
        sb.s_header = Header::new(BlockType::SuperblockV2, 0);
        assert_eq!(sb.users().count(), USERS_MAX);
        assert!(sb.params().is_err());
    }
}
