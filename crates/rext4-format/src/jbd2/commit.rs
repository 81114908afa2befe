//! Commit blocks (`struct commit_header`): the block that makes a transaction valid.
//!
//! With checksum v2/v3, `h_chksum[0]` holds the crc32c (journal seed) of the whole block taken
//! with `h_chksum[0]` zero; the kernel zeroes `h_chksum_type` and `h_chksum_size` before
//! computing it. With checksum v1, `h_chksum[0]` is a crc32 (big-endian variant) of the
//! transaction's descriptor and data blocks, typed `CHKSUM_CRC32` / size 4; that sum is not
//! computed here.

use super::{
    check_block, BlockType, Header, Jbd2Error, JournalParams, CHECKSUM_WORDS, CHKSUM_CRC32, CRC32_CHKSUM_SIZE,
};
use crate::checksum::crc32c;
use zerocopy::big_endian::{U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Size of [`CommitHeader`]; the rest of the block is zero.
pub const COMMIT_HEADER_SIZE: usize = 0x3C;
/// Offset of `h_chksum[0]`.
pub const COMMIT_CHECKSUM_OFFSET: usize = 0x10;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct CommitHeader {
    /*00*/ pub h_header: Header,
    /*0C*/ pub h_chksum_type: u8,
    /*0D*/ pub h_chksum_size: u8,
    /*0E*/ pub h_padding: [u8; 2],
    /*10*/ pub h_chksum: [U32; CHECKSUM_WORDS],
    /*30*/ pub h_commit_sec: U64,
    /*38*/ pub h_commit_nsec: U32,
}
const _: () = assert!(core::mem::size_of::<CommitHeader>() == COMMIT_HEADER_SIZE);
const _: () = assert!(core::mem::offset_of!(CommitHeader, h_chksum) == COMMIT_CHECKSUM_OFFSET);

impl CommitHeader {
    /// A commit header for transaction `sequence` committed at `sec`.`nsec` (Unix time).
    pub fn new(sequence: u32, sec: u64, nsec: u32) -> Self {
        let mut h = Self::new_zeroed();
        h.h_header = Header::new(BlockType::Commit, sequence);
        h.h_commit_sec.set(sec);
        h.h_commit_nsec.set(nsec);
        h
    }
    /// Decodes the first 60 bytes of `bytes`; `None` if there are fewer. Nothing is validated.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        Self::read_from_prefix(bytes).ok().map(|(h, _)| h)
    }
    pub fn sequence(&self) -> u32 {
        self.h_header.sequence()
    }
    /// Commit time: seconds and nanoseconds since the epoch.
    pub fn commit_time(&self) -> (u64, u32) {
        (self.h_commit_sec.get(), self.h_commit_nsec.get())
    }
    /// `h_chksum[0]`: the v2/v3 block checksum, or the v1 transaction crc32.
    pub fn stored_checksum(&self) -> u32 {
        self.h_chksum[0].get()
    }
    /// Records a v1 (`COMPAT_CHECKSUM`) transaction crc32.
    pub fn set_v1_checksum(&mut self, crc: u32) {
        self.h_chksum_type = CHKSUM_CRC32;
        self.h_chksum_size = CRC32_CHKSUM_SIZE;
        self.h_chksum[0].set(crc);
    }
    /// The v1 transaction crc32 if the header carries one.
    pub fn v1_checksum(&self) -> Option<u32> {
        (self.h_chksum_type == CHKSUM_CRC32 && self.h_chksum_size == CRC32_CHKSUM_SIZE)
            .then(|| self.stored_checksum())
    }

    /// The commit block: this header, zeros to the block size, and the v2/v3 checksum if the
    /// journal has one (which replaces any v1 fields, as in the kernel).
    pub fn to_block(&self, params: &JournalParams) -> Vec<u8> {
        let mut block = vec![0u8; params.block_size.max(COMMIT_HEADER_SIZE)];
        block[..COMMIT_HEADER_SIZE].copy_from_slice(self.as_bytes());
        set_commit_checksum(&mut block, params);
        block
    }
}

/// crc32c over a commit block with `h_chksum[0]` taken as zero. Blocks shorter than the header
/// are summed as they are.
pub fn commit_checksum(block: &[u8], csum_seed: u32) -> u32 {
    match block.get(COMMIT_CHECKSUM_OFFSET + 4..) {
        Some(rest) => {
            let c = crc32c(csum_seed, &block[..COMMIT_CHECKSUM_OFFSET]);
            crc32c(crc32c(c, &[0u8; 4]), rest)
        }
        None => crc32c(csum_seed, block),
    }
}

/// Writes the v2/v3 checksum of a commit block, zeroing `h_chksum_type` and `h_chksum_size`
/// first as the kernel does (no-op without v2/v3 or for a block shorter than the header).
pub fn set_commit_checksum(block: &mut [u8], params: &JournalParams) {
    if !params.has_csum_v2or3() || block.len() < COMMIT_HEADER_SIZE {
        return;
    }
    block[0x0C] = 0;
    block[0x0D] = 0;
    let c = commit_checksum(block, params.csum_seed);
    block[COMMIT_CHECKSUM_OFFSET..COMMIT_CHECKSUM_OFFSET + 4].copy_from_slice(&c.to_be_bytes());
}

/// A validated commit block.
#[derive(Clone, Debug)]
pub struct CommitBlock<'a> {
    header: CommitHeader,
    block: &'a [u8],
    params: JournalParams,
}

impl<'a> CommitBlock<'a> {
    /// Checks the block's length (`params.block_size`), magic and type; not the checksum.
    pub fn parse(block: &'a [u8], params: &JournalParams) -> Result<Self, Jbd2Error> {
        check_block(block, params, BlockType::Commit)?;
        let header = CommitHeader::parse(block)
            .ok_or(Jbd2Error::BadLength { expected: params.block_size, found: block.len() })?;
        Ok(CommitBlock { header, block, params: *params })
    }
    pub fn header(&self) -> &CommitHeader {
        &self.header
    }
    pub fn sequence(&self) -> u32 {
        self.header.sequence()
    }
    pub fn commit_time(&self) -> (u64, u32) {
        self.header.commit_time()
    }
    /// The v2/v3 checksum computed over the block.
    pub fn compute_checksum(&self) -> u32 {
        commit_checksum(self.block, self.params.csum_seed)
    }
    /// Whether the v2/v3 checksum matches (true without v2/v3, `jbd2_commit_block_csum_verify`).
    pub fn verify_checksum(&self) -> bool {
        !self.params.has_csum_v2or3() || self.compute_checksum() == self.header.stored_checksum()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{journal_csum_seed, CsumVersion};
    use super::*;

    fn params(csum: CsumVersion) -> JournalParams {
        JournalParams { block_size: 2048, is_64bit: true, csum, csum_seed: journal_csum_seed(&[0x42; 16]) }
    }

    #[test]
    fn offsets_match_the_kernel_layout() {
        use core::mem::offset_of;
        assert_eq!(offset_of!(CommitHeader, h_chksum_type), 0x0C);
        assert_eq!(offset_of!(CommitHeader, h_chksum_size), 0x0D);
        assert_eq!(offset_of!(CommitHeader, h_commit_sec), 0x30);
        assert_eq!(offset_of!(CommitHeader, h_commit_nsec), 0x38);
    }

    #[test]
    fn round_trip_and_checksum() {
        for csum in [CsumVersion::V2, CsumVersion::V3] {
            let p = params(csum);
            let mut h = CommitHeader::new(17, 0x1_0000_0002, 999_999_999);
            h.set_v1_checksum(0xAAAA_AAAA);
            let block = h.to_block(&p);
            assert_eq!(block.len(), 2048);
            let c = CommitBlock::parse(&block, &p).unwrap();
            assert_eq!(c.sequence(), 17);
            assert_eq!(c.commit_time(), (0x1_0000_0002, 999_999_999));
            assert!(c.verify_checksum());
            // v2/v3 wipe the v1 fields before summing.
            assert_eq!(c.header().v1_checksum(), None);
            assert_eq!(c.header().h_chksum_type, 0);
            let mut zeroed = block.clone();
            zeroed[16..20].fill(0);
            assert_eq!(crc32c(p.csum_seed, &zeroed), c.header().stored_checksum());
            let mut bad = block.clone();
            bad[2000] = 1;
            assert!(!CommitBlock::parse(&bad, &p).unwrap().verify_checksum());
        }
    }

    #[test]
    fn v1_and_plain_commits() {
        let p = params(CsumVersion::V1);
        let mut h = CommitHeader::new(3, 1, 2);
        h.set_v1_checksum(0x1234_5678);
        let block = h.to_block(&p);
        let c = CommitBlock::parse(&block, &p).unwrap();
        assert_eq!(c.header().v1_checksum(), Some(0x1234_5678));
        assert!(c.verify_checksum());
        let p = params(CsumVersion::None);
        let block = CommitHeader::new(3, 1, 2).to_block(&p);
        assert!(block[12..].iter().take(36).all(|&b| b == 0));
        assert!(CommitBlock::parse(&block, &p).unwrap().verify_checksum());
    }

    #[test]
    fn garbage_is_rejected_without_panics() {
        let p = params(CsumVersion::V3);
        assert!(matches!(CommitBlock::parse(&[0xFF; 2048], &p), Err(Jbd2Error::BadMagic(_))));
        assert!(CommitBlock::parse(&[0xFF; 20], &p).is_err());
        let mut b = vec![0xFFu8; 2048];
        b[..12].copy_from_slice(Header::new(BlockType::Commit, 1).as_bytes());
        let c = CommitBlock::parse(&b, &p).unwrap();
        assert!(!c.verify_checksum());
        assert_eq!(c.commit_time(), (u64::MAX, u32::MAX));
        let _ = commit_checksum(&[1, 2, 3], 0);
        let mut short = [0u8; 30];
        set_commit_checksum(&mut short, &p);
        assert_eq!(short, [0u8; 30]);
        let tiny = JournalParams { block_size: 16, ..p };
        assert!(CommitBlock::parse(&b[..16], &tiny).is_err());
    }
}
