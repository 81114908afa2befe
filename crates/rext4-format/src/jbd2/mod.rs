//! The jbd2 journal (ext4's journal) on-disk format: big-endian, one struct per block type.
//!
//! The log is a ring of journal blocks after the journal superblock. A transaction is a run of
//! descriptor blocks (each followed by the data blocks its tags describe), revoke blocks, and a
//! commit block, every one of them starting with a [`Header`] carrying the transaction's sequence
//! number. Which variant of the format a journal uses is decided by its superblock's features
//! and captured in [`JournalParams`], which every block parser takes.
//!
//! Checksums (csum v2/v3) are raw crc32c (`crate::checksum::crc32c`, the kernel's
//! `jbd2_chksum`) seeded with [`journal_csum_seed`], the crc32c of the journal UUID:
//! - descriptor and revoke blocks: a 4-byte tail at the end of the block, over the whole block
//!   with the tail zeroed ([`tail_checksum`]);
//! - data blocks: in their tag, over the big-endian sequence number then the block as it sits in
//!   the journal, i.e. after escaping ([`data_block_checksum`]); v2 keeps the low 16 bits;
//! - commit blocks: over the whole block with `h_chksum[0]` zeroed;
//! - the superblock: seeded with `!0`, over its 1024 bytes with `s_checksum` zeroed.

pub mod commit;
pub mod descriptor;
pub mod revoke;
pub mod superblock;

pub use commit::{CommitBlock, CommitHeader};
pub use descriptor::{BlockTag, BlockTag3, BlockTail, DescriptorBuilder, DescriptorTags, Tag};
pub use revoke::{RevokeBlock, RevokeBuilder, RevokeHeader};
pub use superblock::JournalSuperblock;

use crate::checksum::crc32c;
use crate::features::FeatureKind;
use bitflags::bitflags;
use zerocopy::big_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `h_magic` of every journal metadata block.
pub const JBD2_MAGIC_NUMBER: u32 = 0xC03B_3998;
/// Size of [`Header`].
pub const HEADER_SIZE: usize = 12;
/// Size of the checksum tail of descriptor and revoke blocks (`jbd2_journal_block_tail`).
pub const TAIL_SIZE: usize = 4;
/// Size of the UUID that follows a tag without [`TagFlags::SAME_UUID`].
pub const UUID_SIZE: usize = 16;
/// The smallest journal (in blocks, fast-commit area excluded) the kernel accepts.
pub const MIN_JOURNAL_BLOCKS: u32 = 1024;
/// Fast-commit blocks assumed when `s_num_fc_blks` is zero.
pub const DEFAULT_FAST_COMMIT_BLOCKS: u32 = 256;

/// `s_checksum_type` / `h_chksum_type`: crc32 (checksum v1 commit blocks).
pub const CHKSUM_CRC32: u8 = 1;
/// `h_chksum_type`: md5 (never implemented by Linux).
pub const CHKSUM_MD5: u8 = 2;
/// `h_chksum_type`: sha1 (never implemented by Linux).
pub const CHKSUM_SHA1: u8 = 3;
/// `s_checksum_type`: crc32c, the only type checksum v2/v3 journals may carry.
pub const CHKSUM_CRC32C: u8 = 4;
/// `h_chksum_size` of a v1 (crc32) commit block.
pub const CRC32_CHKSUM_SIZE: u8 = 4;
/// Number of 32-bit words in `h_chksum` (the kernel's `JBD2_CHECKSUM_BYTES`, a word count).
pub const CHECKSUM_WORDS: usize = 8;

/// The name dumpe2fs prints for a checksum type.
pub fn checksum_type_name(t: u8) -> &'static str {
    match t {
        CHKSUM_CRC32 => "crc32",
        CHKSUM_MD5 => "md5",
        CHKSUM_SHA1 => "sha1",
        CHKSUM_CRC32C => "crc32c",
        _ => "unknown",
    }
}

/// `h_blocktype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum BlockType {
    Descriptor = 1,
    Commit = 2,
    SuperblockV1 = 3,
    SuperblockV2 = 4,
    Revoke = 5,
    /// A fast-commit block (the area after the regular log; its content is ext4's, not jbd2's).
    FastCommit = 6,
}

impl BlockType {
    pub fn from_raw(v: u32) -> Option<Self> {
        Some(match v {
            1 => Self::Descriptor,
            2 => Self::Commit,
            3 => Self::SuperblockV1,
            4 => Self::SuperblockV2,
            5 => Self::Revoke,
            6 => Self::FastCommit,
            _ => return None,
        })
    }
    pub fn raw(self) -> u32 {
        self as u32
    }
}

bitflags! {
    /// Flags of a descriptor tag. Only the low 16 bits exist: v3 tags have a 32-bit `t_flags`
    /// but the kernel reads (and writes) just its low half.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct TagFlags: u16 {
        /// The block began with the jbd2 magic; its first 4 bytes were zeroed in the journal.
        const ESCAPE = 1;
        /// No UUID follows this tag (it has the previous tag's).
        const SAME_UUID = 2;
        /// Unused by jbd2 (historic: block deleted by this transaction).
        const DELETED = 4;
        /// The last tag of the descriptor block.
        const LAST_TAG = 8;
    }

    /// `s_feature_compat` of the journal superblock.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct JournalCompat: u32 {
        /// Checksum v1: a crc32 of the transaction's blocks in the commit block.
        const CHECKSUM = 0x1;
    }

    /// `s_feature_incompat` of the journal superblock.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct JournalIncompat: u32 {
        /// Revoke blocks may appear in the log.
        const REVOKE = 0x1;
        /// Tags and revoke records carry 64-bit block numbers.
        const BIT64 = 0x2;
        /// The commit block is written without waiting for the transaction's blocks.
        const ASYNC_COMMIT = 0x4;
        /// Checksum v2: per-block crc32c, 16 bits of it in tags.
        const CSUM_V2 = 0x8;
        /// Checksum v3: like v2 with 32-bit checksums in 16-byte tags.
        const CSUM_V3 = 0x10;
        /// A fast-commit area follows the regular log.
        const FAST_COMMIT = 0x20;
    }
}

/// Compat features this implementation understands (as the kernel's `JBD2_KNOWN_*`).
pub const KNOWN_COMPAT: u32 = JournalCompat::CHECKSUM.bits();
/// Incompat features this implementation understands; a journal with others must not be used.
pub const KNOWN_INCOMPAT: u32 = JournalIncompat::all().bits();
/// Read-only compat features understood: none are defined.
pub const KNOWN_RO_COMPAT: u32 = 0;

const COMPAT_NAMES: &[(u32, &str)] = &[(0x1, "journal_checksum")];
const INCOMPAT_NAMES: &[(u32, &str)] = &[
    (0x1, "journal_incompat_revoke"),
    (0x2, "journal_64bit"),
    (0x4, "journal_async_commit"),
    (0x8, "journal_checksum_v2"),
    (0x10, "journal_checksum_v3"),
];

/// The name e2fsprogs prints for one journal feature bit (`journal_checksum_v3`), or
/// `FEATURE_I5`-style for bits it does not name (e2fsprogs 1.47 has no name for fast commit).
pub fn feature_name(kind: FeatureKind, bit: u32) -> String {
    let (table, prefix) = match kind {
        FeatureKind::Compat => (COMPAT_NAMES, 'C'),
        FeatureKind::Incompat => (INCOMPAT_NAMES, 'I'),
        FeatureKind::RoCompat => (&[][..], 'R'),
    };
    match table.iter().find(|(b, _)| *b == bit) {
        Some((_, name)) => (*name).to_string(),
        None => format!("FEATURE_{prefix}{}", bit.trailing_zeros()),
    }
}

/// Names of every journal feature bit set in `word`, lowest bit first.
pub fn feature_names(kind: FeatureKind, word: u32) -> Vec<String> {
    (0..32).map(|i| 1u32 << i).filter(|b| word & b != 0).map(|b| feature_name(kind, b)).collect()
}

/// `journal_header_t`: the first 12 bytes of every journal metadata block.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Header {
    /*00*/ pub h_magic: U32,
    /*04*/ pub h_blocktype: U32,
    /*08*/ pub h_sequence: U32,
}
const _: () = assert!(core::mem::size_of::<Header>() == HEADER_SIZE);

impl Header {
    pub fn new(block_type: BlockType, sequence: u32) -> Self {
        Header {
            h_magic: JBD2_MAGIC_NUMBER.into(),
            h_blocktype: block_type.raw().into(),
            h_sequence: sequence.into(),
        }
    }
    /// Decodes the first 12 bytes of `bytes`; `None` if there are fewer.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        Self::read_from_prefix(bytes).ok().map(|(h, _)| h)
    }
    pub fn has_magic(&self) -> bool {
        self.h_magic.get() == JBD2_MAGIC_NUMBER
    }
    /// The block type, `None` for a value jbd2 does not define.
    pub fn block_type(&self) -> Option<BlockType> {
        BlockType::from_raw(self.h_blocktype.get())
    }
    pub fn sequence(&self) -> u32 {
        self.h_sequence.get()
    }
}

/// Which checksum scheme a journal uses (the features are mutually exclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CsumVersion {
    None,
    /// `COMPAT_CHECKSUM`: crc32 of the transaction in the commit block only.
    V1,
    V2,
    V3,
}

/// Size in bytes of a descriptor tag (the kernel's `journal_tag_bytes`).
///
/// v3: 16. Otherwise 12 (`journal_block_tag_t`), plus 2 with v2, minus the 4 bytes of
/// `t_blocknr_high` without 64bit: so 8, 10 (v2), 12 (64bit) or 14 (v2 + 64bit). The 2 bytes v2
/// adds are never used: its 16-bit checksum lives in `t_checksum`.
pub fn tag_bytes(csum: CsumVersion, is_64bit: bool) -> usize {
    if csum == CsumVersion::V3 {
        return core::mem::size_of::<BlockTag3>();
    }
    let mut sz = core::mem::size_of::<BlockTag>();
    if csum == CsumVersion::V2 {
        sz += 2;
    }
    if is_64bit {
        sz
    } else {
        sz - 4
    }
}

/// The checksum seed of a journal: crc32c of its UUID, seeded with `!0`.
pub fn journal_csum_seed(uuid: &[u8; 16]) -> u32 {
    crc32c(!0, uuid)
}

/// What block parsers need to know about the journal (derived from its superblock by
/// [`JournalSuperblock::params`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalParams {
    /// Journal block size in bytes; every block handed to a parser must be exactly this long.
    pub block_size: usize,
    /// `INCOMPAT_64BIT`: block numbers in tags and revoke records are 64-bit.
    pub is_64bit: bool,
    pub csum: CsumVersion,
    /// [`journal_csum_seed`] of the journal UUID (used only with checksum v2/v3).
    pub csum_seed: u32,
}

impl JournalParams {
    pub fn has_csum_v2or3(&self) -> bool {
        matches!(self.csum, CsumVersion::V2 | CsumVersion::V3)
    }
    /// Size of one descriptor tag.
    pub fn tag_size(&self) -> usize {
        tag_bytes(self.csum, self.is_64bit)
    }
    /// Bytes reserved for the checksum tail at the end of descriptor and revoke blocks.
    pub fn tail_size(&self) -> usize {
        if self.has_csum_v2or3() {
            TAIL_SIZE
        } else {
            0
        }
    }
    /// Size of one revoke record.
    pub fn revoke_record_size(&self) -> usize {
        if self.is_64bit {
            8
        } else {
            4
        }
    }
    /// The largest block number a tag or revoke record can hold.
    pub fn max_block(&self) -> u64 {
        if self.is_64bit {
            u64::MAX
        } else {
            u64::from(u32::MAX)
        }
    }
}

/// Why a journal block (or superblock) failed to decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Jbd2Error {
    /// The buffer is not the length the structure needs (the journal block size, or 1024 bytes
    /// for the superblock).
    BadLength { expected: usize, found: usize },
    /// `h_magic` is not [`JBD2_MAGIC_NUMBER`].
    BadMagic(u32),
    /// `h_blocktype` is not the type asked for.
    WrongBlockType { expected: BlockType, found: u32 },
    /// Superblock: `h_blocktype` is neither v1 nor v2.
    NotASuperblock(u32),
    /// Superblock: `s_blocksize` is not a power of two from 1 KiB to 64 KiB.
    BadBlockSize(u32),
    /// Superblock: `s_first` is 0 or not below `s_maxlen`.
    BadFirst { first: u32, maxlen: u32 },
    /// Superblock: too short for [`MIN_JOURNAL_BLOCKS`] plus the fast-commit area.
    TooShort { maxlen: u32, fc_blocks: u32 },
    /// Superblock: incompat bits this implementation does not know.
    UnknownIncompat(u32),
    /// Superblock: ro-compat bits this implementation does not know.
    UnknownRoCompat(u32),
    /// Superblock: two of checksum v1, v2 and v3 at once.
    ConflictingChecksums,
    /// Superblock: checksum v2/v3 with an `s_checksum_type` other than crc32c.
    BadChecksumType(u8),
    /// A stored checksum does not match the computed one.
    BadChecksum { stored: u32, computed: u32 },
    /// Revoke block: `r_count` runs past the end of the record area.
    BadRevokeCount(u32),
}

impl core::fmt::Display for Jbd2Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::BadLength { expected, found } => {
                write!(f, "journal block is {found} bytes, expected {expected}")
            }
            Self::BadMagic(m) => write!(f, "bad journal magic {m:#010x}"),
            Self::WrongBlockType { expected, found } => {
                write!(f, "journal block type {found}, expected {expected:?}")
            }
            Self::NotASuperblock(t) => write!(f, "journal superblock has block type {t}"),
            Self::BadBlockSize(s) => write!(f, "bad journal block size {s}"),
            Self::BadFirst { first, maxlen } => {
                write!(f, "journal first block {first} invalid for length {maxlen}")
            }
            Self::TooShort { maxlen, fc_blocks } => {
                write!(f, "journal of {maxlen} blocks too short for {fc_blocks} fast-commit blocks")
            }
            Self::UnknownIncompat(b) => write!(
                f,
                "unsupported journal features: {}",
                feature_names(FeatureKind::Incompat, b).join(" ")
            ),
            Self::UnknownRoCompat(b) => write!(
                f,
                "unsupported read-only journal features: {}",
                feature_names(FeatureKind::RoCompat, b).join(" ")
            ),
            Self::ConflictingChecksums => write!(f, "journal has several checksum versions"),
            Self::BadChecksumType(t) => write!(f, "unknown journal checksum type {t}"),
            Self::BadChecksum { stored, computed } => {
                write!(f, "journal checksum {stored:#010x} does not match {computed:#010x}")
            }
            Self::BadRevokeCount(c) => write!(f, "revoke block r_count {c} out of range"),
        }
    }
}

impl std::error::Error for Jbd2Error {}

/// Why a tag or revoke record could not be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushError {
    /// No room left in this block: finish it and start another.
    Full,
    /// The block number does not fit a 32-bit journal.
    BlockTooLarge(u64),
    /// The data block is not one journal block long.
    WrongLength { expected: usize, found: usize },
}

/// Checks a block's length against the journal block size and decodes its header, requiring the
/// magic and `expected` type.
pub(crate) fn check_block(
    block: &[u8],
    params: &JournalParams,
    expected: BlockType,
) -> Result<Header, Jbd2Error> {
    // A block size below header + tail would leave parsers no room; JournalParams built from a
    // validated superblock is at least 1024.
    if block.len() != params.block_size || block.len() < HEADER_SIZE + TAIL_SIZE {
        return Err(Jbd2Error::BadLength { expected: params.block_size, found: block.len() });
    }
    // Cannot fail: the block is longer than a header (checked just above).
    let h = Header::parse(block).unwrap();
    if !h.has_magic() {
        return Err(Jbd2Error::BadMagic(h.h_magic.get()));
    }
    if h.h_blocktype.get() != expected.raw() {
        return Err(Jbd2Error::WrongBlockType { expected, found: h.h_blocktype.get() });
    }
    Ok(h)
}

/// The checksum of a descriptor or revoke block: crc32c over the whole block with its last 4
/// bytes (the tail) taken as zero (`jbd2_descriptor_block_csum_verify`). Blocks shorter than the
/// tail checksum as all-tail.
pub fn tail_checksum(block: &[u8], csum_seed: u32) -> u32 {
    let body = block.len().saturating_sub(TAIL_SIZE);
    let c = crc32c(csum_seed, &block[..body]);
    crc32c(c, &[0u8; TAIL_SIZE][..block.len() - body])
}

/// The checksum stored in a block's tail, `None` if the block is shorter than the tail.
pub fn stored_tail_checksum(block: &[u8]) -> Option<u32> {
    let t = block.get(block.len().checked_sub(TAIL_SIZE)?..)?;
    Some(u32::from_be_bytes([t[0], t[1], t[2], t[3]]))
}

/// Whether a descriptor or revoke block's tail matches (true without checksum v2/v3).
pub fn verify_tail(block: &[u8], params: &JournalParams) -> bool {
    if !params.has_csum_v2or3() {
        return true;
    }
    stored_tail_checksum(block) == Some(tail_checksum(block, params.csum_seed))
}

/// Writes a descriptor or revoke block's tail checksum (no-op without checksum v2/v3).
pub fn set_tail(block: &mut [u8], params: &JournalParams) {
    if !params.has_csum_v2or3() || block.len() < TAIL_SIZE {
        return;
    }
    let c = tail_checksum(block, params.csum_seed);
    let n = block.len();
    block[n - TAIL_SIZE..].copy_from_slice(&c.to_be_bytes());
}

/// The full 32-bit checksum of a journalled data block (`jbd2_block_tag_csum_set`): crc32c of
/// the big-endian transaction sequence, then of the block exactly as written in the journal
/// (escaped). v3 tags store all of it, v2 tags its low 16 bits.
pub fn data_block_checksum(csum_seed: u32, sequence: u32, data: &[u8]) -> u32 {
    crc32c(crc32c(csum_seed, &sequence.to_be_bytes()), data)
}

/// Escapes a block for the journal: if it begins with the jbd2 magic (which would make it look
/// like a journal metadata block), zeroes those 4 bytes and returns true; the tag then needs
/// [`TagFlags::ESCAPE`].
pub fn escape_block(data: &mut [u8]) -> bool {
    match data.get_mut(..4) {
        Some(head) if head == JBD2_MAGIC_NUMBER.to_be_bytes() => {
            head.fill(0);
            true
        }
        _ => false,
    }
}

/// Undoes [`escape_block`] when replaying a tag with [`TagFlags::ESCAPE`].
pub fn unescape_block(data: &mut [u8]) {
    if let Some(head) = data.get_mut(..4) {
        head.copy_from_slice(&JBD2_MAGIC_NUMBER.to_be_bytes());
    }
}

/// Transaction IDs wrap: `x` is after `y` (the kernel's `tid_gt`).
pub fn tid_gt(x: u32, y: u32) -> bool {
    (x.wrapping_sub(y) as i32) > 0
}

/// `x` is `y` or after it (the kernel's `tid_geq`).
pub fn tid_geq(x: u32, y: u32) -> bool {
    (x.wrapping_sub(y) as i32) >= 0
}

#[cfg(all(test, unix))]
// Fixtures are built from small known values; a narrowing cast there is the clearest form.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
mod oracle_tests;

#[cfg(test)]
// Fixtures are built from small known values; a narrowing cast there is the clearest form.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
mod tests {
    use super::*;

    fn params(csum: CsumVersion, is_64bit: bool) -> JournalParams {
        JournalParams { block_size: 1024, is_64bit, csum, csum_seed: journal_csum_seed(&[7; 16]) }
    }

    #[test]
    fn tag_sizes_match_journal_tag_bytes() {
        use CsumVersion::*;
        assert_eq!(tag_bytes(None, false), 8);
        assert_eq!(tag_bytes(None, true), 12);
        assert_eq!(tag_bytes(V1, false), 8);
        assert_eq!(tag_bytes(V1, true), 12);
        assert_eq!(tag_bytes(V2, false), 10);
        assert_eq!(tag_bytes(V2, true), 14);
        assert_eq!(tag_bytes(V3, false), 16);
        assert_eq!(tag_bytes(V3, true), 16);
    }

    #[test]
    fn header_round_trip() {
        let h = Header::new(BlockType::Revoke, 0xDEAD_BEEF);
        let b = h.as_bytes();
        assert_eq!(b, &[0xC0, 0x3B, 0x39, 0x98, 0, 0, 0, 5, 0xDE, 0xAD, 0xBE, 0xEF]);
        let back = Header::parse(b).unwrap();
        assert_eq!(back, h);
        assert!(back.has_magic());
        assert_eq!(back.block_type(), Some(BlockType::Revoke));
        assert_eq!(back.sequence(), 0xDEAD_BEEF);
        assert_eq!(Header::parse(&b[..11]), None);
        assert_eq!(BlockType::from_raw(7), None);
        assert_eq!(BlockType::from_raw(6), Some(BlockType::FastCommit));
    }

    #[test]
    fn feature_names_follow_e2fsprogs() {
        assert_eq!(
            feature_names(FeatureKind::Incompat, 0x1 | 0x2 | 0x10),
            vec!["journal_incompat_revoke", "journal_64bit", "journal_checksum_v3"]
        );
        assert_eq!(feature_name(FeatureKind::Compat, 1), "journal_checksum");
        assert_eq!(feature_name(FeatureKind::Incompat, 0x20), "FEATURE_I5");
        assert_eq!(feature_name(FeatureKind::RoCompat, 1), "FEATURE_R0");
        assert_eq!(KNOWN_INCOMPAT, 0x3F);
        assert_eq!(checksum_type_name(CHKSUM_CRC32C), "crc32c");
    }

    #[test]
    fn tail_checksum_ignores_the_tail() {
        let p = params(CsumVersion::V3, true);
        let mut b = vec![0x5Au8; 1024];
        assert!(!verify_tail(&b, &p));
        set_tail(&mut b, &p);
        assert!(verify_tail(&b, &p));
        // The tail is zeroed for the computation, so the same block with any tail sums the same.
        let c = tail_checksum(&b, p.csum_seed);
        b[1020..].copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(tail_checksum(&b, p.csum_seed), c);
        let mut zeroed = b.clone();
        zeroed[1020..].fill(0);
        assert_eq!(crc32c(p.csum_seed, &zeroed), c);
        b[100] ^= 1;
        assert!(!verify_tail(&b, &p));
        // Without v2/v3 there is no tail to check or write.
        let p1 = params(CsumVersion::V1, true);
        assert!(verify_tail(&b, &p1));
        let before = b.clone();
        set_tail(&mut b, &p1);
        assert_eq!(b, before);
        // Degenerate lengths do not panic.
        assert_eq!(stored_tail_checksum(&[1, 2, 3]), None);
        let _ = tail_checksum(&[1, 2, 3], 0);
        let mut tiny = [0u8; 2];
        set_tail(&mut tiny, &p);
        assert!(!verify_tail(&tiny, &p));
    }

    #[test]
    fn escaping() {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&JBD2_MAGIC_NUMBER.to_be_bytes());
        b[4] = 9;
        let orig = b;
        assert!(escape_block(&mut b));
        assert_eq!(&b[..5], &[0, 0, 0, 0, 9]);
        assert!(!escape_block(&mut b));
        unescape_block(&mut b);
        assert_eq!(b, orig);
        assert!(!escape_block(&mut [0xC0, 0x3B]));
    }

    #[test]
    fn data_checksum_chains_sequence_then_data() {
        let seed = journal_csum_seed(&[1; 16]);
        let data = [3u8; 64];
        let mut joined = 42u32.to_be_bytes().to_vec();
        joined.extend_from_slice(&data);
        assert_eq!(data_block_checksum(seed, 42, &data), crc32c(seed, &joined));
    }

    #[test]
    fn tids_wrap() {
        assert!(tid_gt(1, 0));
        assert!(tid_gt(0, u32::MAX));
        assert!(!tid_gt(5, 5));
        assert!(tid_geq(5, 5));
        assert!(!tid_geq(u32::MAX, 0));
    }

    /// Random blocks with valid headers, through every parser and layout: no panics, and every
    /// tag or record lies inside the block.
    #[test]
    fn random_blocks_never_panic() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for csum in [CsumVersion::None, CsumVersion::V2, CsumVersion::V3] {
            for is_64bit in [false, true] {
                let p = params(csum, is_64bit);
                for _ in 0..300 {
                    let mut b: Vec<u8> = (0..p.block_size).map(|_| rand() as u8).collect();
                    // Make tag flags and r_count small often enough to get past the first tag.
                    if rand() % 2 == 0 {
                        for i in (12..p.block_size).step_by(p.tag_size()) {
                            if let Some(f) = b.get_mut(i + 7) {
                                *f &= !(TagFlags::LAST_TAG.bits() as u8);
                            }
                        }
                    }
                    b[12..16].copy_from_slice(&((rand() % 1100) as u32).to_be_bytes());
                    for t in [BlockType::Descriptor, BlockType::Revoke, BlockType::Commit] {
                        b[..12].copy_from_slice(Header::new(t, 1).as_bytes());
                        if let Ok(d) = DescriptorTags::parse(&b, &p) {
                            let _ = d.verify_checksum();
                            assert!(d.count() <= (p.block_size - 12) / p.tag_size());
                        }
                        if let Ok(r) = RevokeBlock::parse(&b, &p) {
                            let _ = r.verify_checksum();
                            assert!(r.blocks().count() <= p.block_size / 4);
                        }
                        if let Ok(c) = CommitBlock::parse(&b, &p) {
                            let _ = (c.verify_checksum(), c.commit_time());
                        }
                        let cut = (rand() as usize) % p.block_size;
                        assert!(DescriptorTags::parse(&b[..cut], &p).is_err());
                        assert!(RevokeBlock::parse(&b[..cut], &p).is_err());
                        assert!(CommitBlock::parse(&b[..cut], &p).is_err());
                    }
                }
            }
        }
    }

    #[test]
    fn check_block_rejects_bad_input() {
        let p = params(CsumVersion::V3, true);
        assert_eq!(
            check_block(&[0u8; 100], &p, BlockType::Commit),
            Err(Jbd2Error::BadLength { expected: 1024, found: 100 })
        );
        let mut b = vec![0xFFu8; 1024];
        assert_eq!(check_block(&b, &p, BlockType::Commit), Err(Jbd2Error::BadMagic(0xFFFF_FFFF)));
        b[..12].copy_from_slice(Header::new(BlockType::Revoke, 1).as_bytes());
        assert_eq!(
            check_block(&b, &p, BlockType::Commit),
            Err(Jbd2Error::WrongBlockType { expected: BlockType::Commit, found: 5 })
        );
        let tiny = JournalParams { block_size: 8, ..p };
        assert!(check_block(&[0u8; 8], &tiny, BlockType::Commit).is_err());
    }
}
