//! Revoke blocks (`jbd2_journal_revoke_header_t` and its records): filesystem blocks whose
//! copies in this and earlier transactions must not be replayed.
//!
//! After the 16-byte header come big-endian block numbers, 8 bytes each in 64bit journals and
//! 4 otherwise. `r_count` is the number of bytes used, header included. With checksum v2/v3 the
//! block ends with the same 4-byte tail as a descriptor block.

use super::{check_block, set_tail, verify_tail, BlockType, Header, Jbd2Error, JournalParams, PushError};
use zerocopy::big_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Size of [`RevokeHeader`]: the records start here.
pub const REVOKE_HEADER_SIZE: usize = 16;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct RevokeHeader {
    /*00*/ pub r_header: Header,
    /*0C*/ pub r_count: U32,
}
const _: () = assert!(core::mem::size_of::<RevokeHeader>() == REVOKE_HEADER_SIZE);

/// A validated revoke block.
#[derive(Clone, Debug)]
pub struct RevokeBlock<'a> {
    header: RevokeHeader,
    block: &'a [u8],
    records: &'a [u8],
    params: JournalParams,
}

impl<'a> RevokeBlock<'a> {
    /// Checks the block's length (`params.block_size`), magic, type, and that `r_count` stays
    /// before the tail (as `scan_revoke_records` does). An `r_count` below the header size
    /// means no records, and a trailing partial record is ignored, both as in the kernel. The
    /// tail checksum is not checked here: see [`Self::verify_checksum`].
    pub fn parse(block: &'a [u8], params: &JournalParams) -> Result<Self, Jbd2Error> {
        check_block(block, params, BlockType::Revoke)?;
        // Cannot fail: check_block guarantees at least HEADER_SIZE + TAIL_SIZE = 16 bytes.
        let (header, _) = RevokeHeader::read_from_prefix(block).unwrap();
        let count = header.r_count.get();
        let limit = block.len() - params.tail_size();
        let used = usize::try_from(count).unwrap_or(usize::MAX);
        if used > limit {
            return Err(Jbd2Error::BadRevokeCount(count));
        }
        let records = block.get(REVOKE_HEADER_SIZE..used).unwrap_or(&[]);
        Ok(RevokeBlock { header, block, records, params: *params })
    }
    pub fn header(&self) -> &RevokeHeader {
        &self.header
    }
    pub fn sequence(&self) -> u32 {
        self.header.r_header.sequence()
    }
    /// Number of revoked blocks listed.
    pub fn len(&self) -> usize {
        self.records.len() / self.params.revoke_record_size()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The revoked filesystem block numbers.
    pub fn blocks(&self) -> impl Iterator<Item = u64> + 'a {
        let size = self.params.revoke_record_size();
        self.records.chunks_exact(size).map(|r| r.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }
    /// Whether the tail checksum matches (true without checksum v2/v3).
    pub fn verify_checksum(&self) -> bool {
        verify_tail(self.block, &self.params)
    }
}

/// Builds a revoke block as the kernel's `write_one_revoke_record` / `flush_descriptor` do.
#[derive(Clone, Debug)]
pub struct RevokeBuilder {
    block: Vec<u8>,
    params: JournalParams,
    pos: usize,
}

impl RevokeBuilder {
    /// An empty revoke block for transaction `sequence`.
    pub fn new(params: &JournalParams, sequence: u32) -> Self {
        let mut block = vec![0u8; params.block_size];
        if let Some(h) = block.get_mut(..super::HEADER_SIZE) {
            h.copy_from_slice(Header::new(BlockType::Revoke, sequence).as_bytes());
        }
        RevokeBuilder { block, params: *params, pos: REVOKE_HEADER_SIZE }
    }
    /// The most records one revoke block can hold.
    pub fn capacity(params: &JournalParams) -> usize {
        params.block_size.saturating_sub(REVOKE_HEADER_SIZE + params.tail_size())
            / params.revoke_record_size()
    }
    pub fn len(&self) -> usize {
        (self.pos - REVOKE_HEADER_SIZE) / self.params.revoke_record_size()
    }
    pub fn is_empty(&self) -> bool {
        self.pos == REVOKE_HEADER_SIZE
    }
    /// Adds a revoked block number.
    pub fn push(&mut self, block: u64) -> Result<(), PushError> {
        if block > self.params.max_block() {
            return Err(PushError::BlockTooLarge(block));
        }
        let size = self.params.revoke_record_size();
        if self.pos + size > self.params.block_size.saturating_sub(self.params.tail_size()) {
            return Err(PushError::Full);
        }
        // In bounds: checked just above.
        let bytes = block.to_be_bytes();
        self.block[self.pos..self.pos + size].copy_from_slice(&bytes[8 - size..]);
        self.pos += size;
        Ok(())
    }
    /// The finished block with `r_count` and the tail checksum; `None` if nothing was added.
    pub fn finish(mut self) -> Option<Vec<u8>> {
        if self.is_empty() {
            return None;
        }
        // Cannot truncate: pos is at most the block size, itself at most a few MiB.
        #[allow(clippy::cast_possible_truncation)]
        let count = self.pos as u32;
        self.block[12..16].copy_from_slice(&count.to_be_bytes());
        set_tail(&mut self.block, &self.params);
        Some(self.block)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{journal_csum_seed, CsumVersion, TAIL_SIZE};
    use super::*;

    fn params(csum: CsumVersion, is_64bit: bool) -> JournalParams {
        JournalParams { block_size: 1024, is_64bit, csum, csum_seed: journal_csum_seed(&[9; 16]) }
    }

    #[test]
    fn round_trip_every_layout() {
        for csum in [CsumVersion::None, CsumVersion::V2, CsumVersion::V3] {
            for is_64bit in [false, true] {
                let p = params(csum, is_64bit);
                let cap = RevokeBuilder::capacity(&p);
                let top = if is_64bit { u64::MAX } else { u64::from(u32::MAX) };
                let list: Vec<u64> = (0..cap as u64 - 1).chain([top]).collect();
                let mut b = RevokeBuilder::new(&p, 12);
                for &x in &list {
                    b.push(x).unwrap();
                }
                assert_eq!(b.push(1), Err(PushError::Full));
                assert_eq!(b.len(), cap);
                let blk = b.finish().unwrap();
                let r = RevokeBlock::parse(&blk, &p).unwrap();
                assert_eq!(r.sequence(), 12);
                assert_eq!(r.len(), cap);
                assert!(r.blocks().eq(list.iter().copied()));
                assert!(r.verify_checksum());
                let used = REVOKE_HEADER_SIZE + cap * p.revoke_record_size();
                assert_eq!(r.header().r_count.get() as usize, used);
                if p.has_csum_v2or3() {
                    let mut bad = blk.clone();
                    bad[20] ^= 0x80;
                    assert!(!RevokeBlock::parse(&bad, &p).unwrap().verify_checksum());
                }
            }
        }
        // 4 KiB, 64bit, v3: (4096 - 16 - 4) / 8 = 509 records.
        let p = JournalParams { block_size: 4096, ..params(CsumVersion::V3, true) };
        assert_eq!(RevokeBuilder::capacity(&p), 509);
    }

    #[test]
    fn record_bytes() {
        let p = params(CsumVersion::None, false);
        let mut b = RevokeBuilder::new(&p, 1);
        b.push(0x0102_0304).unwrap();
        assert_eq!(b.push(1 << 32), Err(PushError::BlockTooLarge(1 << 32)));
        let blk = b.finish().unwrap();
        assert_eq!(&blk[12..24], &[0, 0, 0, 20, 1, 2, 3, 4, 0, 0, 0, 0]);
        let p = params(CsumVersion::None, true);
        let mut b = RevokeBuilder::new(&p, 1);
        b.push(0x0102_0304_0506_0708).unwrap();
        let blk = b.finish().unwrap();
        assert_eq!(&blk[12..24], &[0, 0, 0, 24, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(RevokeBuilder::new(&p, 1).finish().is_none());
    }

    #[test]
    fn r_count_is_bounded() {
        let p = params(CsumVersion::V3, true);
        let mut blk = vec![0u8; 1024];
        blk[..12].copy_from_slice(Header::new(BlockType::Revoke, 1).as_bytes());
        // Up to the tail is fine; into the tail is not.
        blk[12..16].copy_from_slice(&1020u32.to_be_bytes());
        let r = RevokeBlock::parse(&blk, &p).unwrap();
        assert_eq!(r.len(), (1020 - 16) / 8);
        blk[12..16].copy_from_slice(&1021u32.to_be_bytes());
        assert_eq!(RevokeBlock::parse(&blk, &p).unwrap_err(), Jbd2Error::BadRevokeCount(1021));
        blk[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(RevokeBlock::parse(&blk, &p).is_err());
        // Below the header: no records. Partial trailing record: ignored.
        blk[12..16].copy_from_slice(&3u32.to_be_bytes());
        assert!(RevokeBlock::parse(&blk, &p).unwrap().is_empty());
        blk[12..16].copy_from_slice(&(16u32 + 8 + 5).to_be_bytes());
        assert_eq!(RevokeBlock::parse(&blk, &p).unwrap().blocks().count(), 1);
        // Without a tail the whole block may be used.
        let p0 = params(CsumVersion::None, true);
        blk[12..16].copy_from_slice(&1024u32.to_be_bytes());
        assert_eq!(RevokeBlock::parse(&blk, &p0).unwrap().len(), (1024 - 16) / 8);
    }

    #[test]
    fn garbage_never_panics() {
        for csum in [CsumVersion::None, CsumVersion::V3] {
            let p = params(csum, true);
            assert!(matches!(RevokeBlock::parse(&[0xFF; 1024], &p), Err(Jbd2Error::BadMagic(_))));
            let mut blk = vec![0xFFu8; 1024];
            blk[..12].copy_from_slice(Header::new(BlockType::Revoke, 1).as_bytes());
            assert_eq!(RevokeBlock::parse(&blk, &p).unwrap_err(), Jbd2Error::BadRevokeCount(u32::MAX));
            assert!(RevokeBlock::parse(&blk[..100], &p).is_err());
            assert!(RevokeBlock::parse(&blk[..TAIL_SIZE], &p).is_err());
        }
    }
}
