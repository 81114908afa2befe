//! Descriptor blocks: a [`Header`], then one tag per journal block that follows the descriptor,
//! naming the filesystem block it is a copy of, then (checksum v2/v3) a 4-byte tail.
//!
//! Tags are [`BlockTag3`] (16 bytes) with checksum v3 and a prefix of [`BlockTag`] otherwise (see
//! [`super::tag_bytes`]). A tag without [`TagFlags::SAME_UUID`] is followed by a 16-byte UUID (the
//! kernel writes the journal UUID after the first tag of each descriptor). The tag list ends
//! with [`TagFlags::LAST_TAG`] or where the next tag would not fit before the tail; both end the
//! list for the kernel, so a missing `LAST_TAG` is not an error.

use super::{
    check_block, data_block_checksum, escape_block, set_tail, verify_tail, BlockType, CsumVersion, Header,
    Jbd2Error, JournalParams, PushError, TagFlags, HEADER_SIZE, JBD2_MAGIC_NUMBER, UUID_SIZE,
};
use crate::split::{hi32, lo16, lo32};
use zerocopy::big_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `journal_block_tag3_t`: the tag of checksum v3 journals.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockTag3 {
    /*00*/ pub t_blocknr: U32,
    /*04*/ pub t_flags: U32,
    /*08*/ pub t_blocknr_high: U32,
    /*0C*/ pub t_checksum: U32,
}
const _: () = assert!(core::mem::size_of::<BlockTag3>() == 16);

/// `journal_block_tag_t`: the tag of other journals, of which only the first
/// [`super::tag_bytes`] bytes are on disk (8 without 64bit: no `t_blocknr_high`). With checksum
/// v2, 2 unused bytes follow it.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockTag {
    /*00*/ pub t_blocknr: U32,
    /*04*/ pub t_checksum: U16,
    /*06*/ pub t_flags: U16,
    /*08*/ pub t_blocknr_high: U32,
}
const _: () = assert!(core::mem::size_of::<BlockTag>() == 12);

/// `jbd2_journal_block_tail`: the last 4 bytes of descriptor and revoke blocks with v2/v3.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockTail {
    /*00*/ pub t_checksum: U32,
}
const _: () = assert!(core::mem::size_of::<BlockTail>() == super::TAIL_SIZE);

/// Offset within a tag of the 16-bit flags word the kernel reads, in both layouts (for
/// [`BlockTag3`], the low half of the big-endian `t_flags`).
const FLAGS16_OFFSET: usize = 6;

fn join(lo: u32, hi: u32, is_64bit: bool) -> u64 {
    u64::from(lo) | if is_64bit { u64::from(hi) << 32 } else { 0 }
}

impl BlockTag3 {
    /// The target block; `t_blocknr_high` counts only in 64bit journals.
    pub fn block(&self, is_64bit: bool) -> u64 {
        join(self.t_blocknr.get(), self.t_blocknr_high.get(), is_64bit)
    }
    pub fn set_block(&mut self, b: u64, is_64bit: bool) {
        self.t_blocknr.set(lo32(b));
        self.t_blocknr_high.set(if is_64bit { hi32(b) } else { 0 });
    }
    /// The flags: the low 16 bits of `t_flags`, all the kernel looks at.
    pub fn flags(&self) -> TagFlags {
        TagFlags::from_bits_retain(lo16(self.t_flags.get()))
    }
}

impl BlockTag {
    pub fn block(&self, is_64bit: bool) -> u64 {
        join(self.t_blocknr.get(), self.t_blocknr_high.get(), is_64bit)
    }
    pub fn set_block(&mut self, b: u64, is_64bit: bool) {
        self.t_blocknr.set(lo32(b));
        self.t_blocknr_high.set(if is_64bit { hi32(b) } else { 0 });
    }
    pub fn flags(&self) -> TagFlags {
        TagFlags::from_bits_retain(self.t_flags.get())
    }
}

/// One decoded tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag {
    /// The filesystem block the journal block is a copy of.
    pub block: u64,
    pub flags: TagFlags,
    /// The data block checksum: 32 bits with v3, 16 with v2, 0 otherwise.
    pub checksum: u32,
    /// The UUID that followed the tag, when it has no `SAME_UUID` flag and the 16 bytes fit in
    /// the tag area. (A tag whose UUID would overrun the area still counts, as for the kernel;
    /// it is then the last tag.)
    pub uuid: Option<[u8; 16]>,
}

impl Tag {
    pub fn is_escaped(&self) -> bool {
        self.flags.contains(TagFlags::ESCAPE)
    }
    pub fn is_last(&self) -> bool {
        self.flags.contains(TagFlags::LAST_TAG)
    }
    /// Whether `data`, the journal block this tag describes (as it sits in the journal, still
    /// escaped), matches the tag's checksum for transaction `sequence`. Always true without
    /// checksum v2/v3 (`jbd2_block_tag_csum_verify`).
    pub fn verify_data(&self, params: &JournalParams, sequence: u32, data: &[u8]) -> bool {
        let c = data_block_checksum(params.csum_seed, sequence, data);
        match params.csum {
            CsumVersion::V3 => c == self.checksum,
            CsumVersion::V2 => c & 0xFFFF == self.checksum,
            CsumVersion::None | CsumVersion::V1 => true,
        }
    }
}

/// Decodes the tag in `raw` (exactly `params.tag_size()` bytes).
fn decode_tag(raw: &[u8], params: &JournalParams) -> (u64, TagFlags, u32) {
    if params.csum == CsumVersion::V3 {
        let mut buf = [0u8; 16];
        let n = raw.len().min(16);
        buf[..n].copy_from_slice(&raw[..n]);
        // Cannot fail: exactly 16 bytes, and every bit pattern is a valid tag.
        let t = BlockTag3::read_from_bytes(&buf).unwrap();
        (t.block(params.is_64bit), t.flags(), t.t_checksum.get())
    } else {
        // Shorter tags are prefixes of the 12-byte struct; the missing `t_blocknr_high` only
        // exists (and is only read) in 64bit journals.
        let mut buf = [0u8; 12];
        let n = raw.len().min(12);
        buf[..n].copy_from_slice(&raw[..n]);
        // Cannot fail: exactly 12 bytes, and every bit pattern is a valid tag.
        let t = BlockTag::read_from_bytes(&buf).unwrap();
        let csum = if params.csum == CsumVersion::V2 { u32::from(t.t_checksum.get()) } else { 0 };
        (t.block(params.is_64bit), t.flags(), csum)
    }
}

/// A descriptor block, validated, and an iterator over its tags.
///
/// Iteration follows the kernel's `count_tags` exactly (so the number of tags is the number of
/// journal blocks that follow the descriptor): a tag is read whenever it fits before the tail,
/// the UUID after a tag without `SAME_UUID` is skipped, and `LAST_TAG` stops. It never reads
/// outside the block, whatever the tag bytes say.
#[derive(Clone, Debug)]
pub struct DescriptorTags<'a> {
    header: Header,
    block: &'a [u8],
    params: JournalParams,
    pos: usize,
    /// End of the tag area (start of the tail).
    end: usize,
    done: bool,
}

impl<'a> DescriptorTags<'a> {
    /// Checks the block's length (`params.block_size`), magic and type. The tail checksum is
    /// not checked here: see [`Self::verify_checksum`].
    pub fn parse(block: &'a [u8], params: &JournalParams) -> Result<Self, Jbd2Error> {
        let header = check_block(block, params, BlockType::Descriptor)?;
        Ok(DescriptorTags {
            header,
            block,
            params: *params,
            pos: HEADER_SIZE,
            end: block.len() - params.tail_size(),
            done: false,
        })
    }
    pub fn header(&self) -> Header {
        self.header
    }
    pub fn sequence(&self) -> u32 {
        self.header.sequence()
    }
    /// Whether the tail checksum matches (true without checksum v2/v3).
    pub fn verify_checksum(&self) -> bool {
        verify_tail(self.block, &self.params)
    }
}

impl Iterator for DescriptorTags<'_> {
    type Item = Tag;

    fn next(&mut self) -> Option<Tag> {
        if self.done {
            return None;
        }
        let size = self.params.tag_size();
        let Some(raw) = self.block[..self.end].get(self.pos..self.pos + size) else {
            self.done = true;
            return None;
        };
        let (block, flags, checksum) = decode_tag(raw, &self.params);
        self.pos += size;
        let mut uuid = None;
        if !flags.contains(TagFlags::SAME_UUID) {
            if self.pos + UUID_SIZE <= self.end {
                let mut u = [0u8; 16];
                u.copy_from_slice(&self.block[self.pos..self.pos + UUID_SIZE]);
                uuid = Some(u);
            }
            self.pos += UUID_SIZE;
        }
        if flags.contains(TagFlags::LAST_TAG) {
            self.done = true;
        }
        Some(Tag { block, flags, checksum, uuid })
    }
}

/// Builds a descriptor block the way the kernel's commit does: the UUID after the first tag,
/// `SAME_UUID` on the others, `LAST_TAG` on the last, the tail checksum.
#[derive(Clone, Debug)]
pub struct DescriptorBuilder {
    block: Vec<u8>,
    params: JournalParams,
    sequence: u32,
    uuid: [u8; 16],
    pos: usize,
    last_tag: Option<usize>,
    count: usize,
}

impl DescriptorBuilder {
    /// An empty descriptor for transaction `sequence`; `uuid` is the journal's UUID.
    pub fn new(params: &JournalParams, sequence: u32, uuid: [u8; 16]) -> Self {
        let mut block = vec![0u8; params.block_size];
        if let Some(h) = block.get_mut(..HEADER_SIZE) {
            h.copy_from_slice(Header::new(BlockType::Descriptor, sequence).as_bytes());
        }
        DescriptorBuilder {
            block,
            params: *params,
            sequence,
            uuid,
            pos: HEADER_SIZE,
            last_tag: None,
            count: 0,
        }
    }

    /// The most tags one descriptor block can hold.
    pub fn capacity(params: &JournalParams) -> usize {
        let area = params.block_size.saturating_sub(HEADER_SIZE + params.tail_size());
        let size = params.tag_size();
        match area.checked_sub(size + UUID_SIZE) {
            Some(rest) => 1 + rest / size,
            None => 0,
        }
    }

    pub fn len(&self) -> usize {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    /// Whether another tag fits.
    pub fn has_room(&self) -> bool {
        let need = self.params.tag_size() + if self.count == 0 { UUID_SIZE } else { 0 };
        self.pos + need <= self.params.block_size.saturating_sub(self.params.tail_size())
    }

    /// Adds the tag for journal block `data`, the copy of filesystem block `target` that will
    /// follow this descriptor: escapes `data` in place if it starts with the jbd2 magic (setting
    /// [`TagFlags::ESCAPE`]), then stores its checksum. On error nothing changes.
    pub fn push_block(&mut self, target: u64, data: &mut [u8]) -> Result<(), PushError> {
        self.check_block(target, data.len())?;
        let flags = if escape_block(data) { TagFlags::ESCAPE } else { TagFlags::empty() };
        self.push_data(target, flags, data)
    }

    /// [`DescriptorBuilder::push_block`] for a block that stays shared and is not changed:
    /// returns the escaped copy to write in its place when it starts with the jbd2 magic,
    /// else `None` (write `data` itself). On error nothing changes.
    pub fn push_shared(&mut self, target: u64, data: &[u8]) -> Result<Option<Vec<u8>>, PushError> {
        self.check_block(target, data.len())?;
        if !data.starts_with(&JBD2_MAGIC_NUMBER.to_be_bytes()) {
            return self.push_data(target, TagFlags::empty(), data).map(|()| None);
        }
        let mut copy = data.to_vec();
        escape_block(&mut copy);
        self.push_data(target, TagFlags::ESCAPE, &copy)?;
        Ok(Some(copy))
    }

    /// Checks a block of `len` bytes for `target` before its tag is added.
    fn check_block(&self, target: u64, len: usize) -> Result<(), PushError> {
        if len != self.params.block_size {
            return Err(PushError::WrongLength { expected: self.params.block_size, found: len });
        }
        self.check(target)
    }

    /// Adds the tag of the (escaped) log block `data` with its checksum.
    fn push_data(&mut self, target: u64, flags: TagFlags, data: &[u8]) -> Result<(), PushError> {
        let csum = data_block_checksum(self.params.csum_seed, self.sequence, data);
        self.push_tag(target, flags, csum)
    }

    fn check(&self, target: u64) -> Result<(), PushError> {
        if target > self.params.max_block() {
            return Err(PushError::BlockTooLarge(target));
        }
        if !self.has_room() {
            return Err(PushError::Full);
        }
        Ok(())
    }

    /// Adds a tag with the given flags and data checksum (truncated to 16 bits for v2, ignored
    /// without v2/v3). `SAME_UUID` and `LAST_TAG` are managed by the builder.
    pub fn push_tag(&mut self, target: u64, flags: TagFlags, checksum: u32) -> Result<(), PushError> {
        self.check(target)?;
        let mut flags = flags - TagFlags::SAME_UUID - TagFlags::LAST_TAG;
        if self.count > 0 {
            flags |= TagFlags::SAME_UUID;
        }
        let size = self.params.tag_size();
        let is_64bit = self.params.is_64bit;
        // In bounds: check() made sure the tag (and the first tag's UUID) fits before the tail.
        let dst = &mut self.block[self.pos..self.pos + size];
        match self.params.csum {
            CsumVersion::V3 => {
                let mut t = BlockTag3 {
                    t_blocknr: 0.into(),
                    t_flags: u32::from(flags.bits()).into(),
                    t_blocknr_high: 0.into(),
                    t_checksum: checksum.into(),
                };
                t.set_block(target, is_64bit);
                dst.copy_from_slice(t.as_bytes());
            }
            csum => {
                let mut t = BlockTag {
                    t_blocknr: 0.into(),
                    t_checksum: if csum == CsumVersion::V2 { lo16(checksum).into() } else { 0.into() },
                    t_flags: flags.bits().into(),
                    t_blocknr_high: 0.into(),
                };
                t.set_block(target, is_64bit);
                let img = t.as_bytes();
                let n = size.min(img.len());
                dst[..n].copy_from_slice(&img[..n]);
                dst[n..].fill(0);
            }
        }
        self.last_tag = Some(self.pos);
        self.pos += size;
        if self.count == 0 {
            self.block[self.pos..self.pos + UUID_SIZE].copy_from_slice(&self.uuid);
            self.pos += UUID_SIZE;
        }
        self.count += 1;
        Ok(())
    }

    /// The finished block: `LAST_TAG` set on the last tag, tail checksum written. `None` if no
    /// tag was added (an empty descriptor would be read as holding one tag).
    pub fn finish(mut self) -> Option<Vec<u8>> {
        // In bounds: the flags word lies inside the last tag, which was written.
        let off = self.last_tag? + FLAGS16_OFFSET;
        let f = u16::from_be_bytes([self.block[off], self.block[off + 1]]) | TagFlags::LAST_TAG.bits();
        self.block[off..off + 2].copy_from_slice(&f.to_be_bytes());
        set_tail(&mut self.block, &self.params);
        Some(self.block)
    }
}

#[cfg(test)]
// Fixtures are built from small known values; a narrowing cast there is the clearest form.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
mod tests {
    use super::super::{journal_csum_seed, unescape_block, TAIL_SIZE};
    use super::*;

    const UUID: [u8; 16] = [0xAB; 16];

    fn params(csum: CsumVersion, is_64bit: bool) -> JournalParams {
        JournalParams { block_size: 1024, is_64bit, csum, csum_seed: journal_csum_seed(&UUID) }
    }

    fn all_params() -> Vec<JournalParams> {
        let mut v = Vec::new();
        for csum in [CsumVersion::None, CsumVersion::V1, CsumVersion::V2, CsumVersion::V3] {
            for b in [false, true] {
                v.push(params(csum, b));
            }
        }
        v
    }

    fn data(i: u64, p: &JournalParams) -> Vec<u8> {
        let mut d = vec![(i as u8).wrapping_mul(37); p.block_size];
        if i.is_multiple_of(3) {
            d[..4].copy_from_slice(&JBD2_MAGIC_NUMBER.to_be_bytes());
        }
        d
    }

    #[test]
    fn builder_round_trips_every_layout() {
        for p in all_params() {
            let targets: Vec<u64> =
                if p.is_64bit { vec![5, 0x1_2345_6789, u64::MAX, 0] } else { vec![5, 0xFFFF_FFFF, 0] };
            let mut b = DescriptorBuilder::new(&p, 77, UUID);
            let mut copies = Vec::new();
            for &t in &targets {
                let mut d = data(t, &p);
                b.push_block(t, &mut d).unwrap();
                copies.push(d);
            }
            let block = b.finish().unwrap();
            let tags = DescriptorTags::parse(&block, &p).unwrap();
            assert_eq!(tags.sequence(), 77);
            assert!(tags.verify_checksum(), "{p:?}");
            let tags: Vec<Tag> = tags.collect();
            assert_eq!(tags.len(), targets.len());
            for (i, (tag, &t)) in tags.iter().zip(&targets).enumerate() {
                assert_eq!(tag.block, t, "{p:?}");
                assert_eq!(tag.uuid, (i == 0).then_some(UUID));
                assert_eq!(tag.flags.contains(TagFlags::SAME_UUID), i > 0);
                assert_eq!(tag.is_last(), i == targets.len() - 1);
                assert_eq!(tag.is_escaped(), t % 3 == 0);
                assert!(tag.verify_data(&p, 77, &copies[i]));
                let mut restored = copies[i].clone();
                if tag.is_escaped() {
                    unescape_block(&mut restored);
                }
                assert_eq!(restored, data(t, &p));
                if p.has_csum_v2or3() {
                    assert!(!tag.verify_data(&p, 78, &copies[i]));
                } else {
                    assert_eq!(tag.checksum, 0);
                }
            }
            if p.has_csum_v2or3() {
                let mut bad = block.clone();
                bad[HEADER_SIZE] ^= 1;
                assert!(!DescriptorTags::parse(&bad, &p).unwrap().verify_checksum());
            } else {
                assert!(block[p.block_size - TAIL_SIZE..].iter().all(|&x| x == 0));
            }
        }
    }

    #[test]
    fn shared_blocks_get_the_same_tags_as_copied_ones() {
        for p in all_params() {
            let (mut copied, mut shared) =
                (DescriptorBuilder::new(&p, 9, UUID), DescriptorBuilder::new(&p, 9, UUID));
            for t in 0..6u64 {
                let original = data(t, &p);
                let mut d = original.clone();
                copied.push_block(t, &mut d).unwrap();
                let escaped = shared.push_shared(t, &original).unwrap();
                // The escaped copy is what push_block left in place; unescaped blocks are written as they are.
                assert_eq!(escaped.as_deref().unwrap_or(&original), &d[..], "{p:?}");
                assert_eq!(escaped.is_some(), t % 3 == 0);
            }
            assert_eq!(copied.finish(), shared.finish(), "{p:?}");
            let mut short = DescriptorBuilder::new(&p, 9, UUID);
            assert!(matches!(short.push_shared(1, &[0; 3]), Err(PushError::WrongLength { .. })));
            assert!(short.is_empty());
        }
    }

    #[test]
    fn v3_layout_bytes() {
        let p = params(CsumVersion::V3, true);
        let mut b = DescriptorBuilder::new(&p, 1, UUID);
        b.push_tag(0x0102_0304_0506_0708, TagFlags::ESCAPE, 0xCAFE_F00D).unwrap();
        b.push_tag(9, TagFlags::empty(), 1).unwrap();
        let blk = b.finish().unwrap();
        assert_eq!(&blk[12..28], &[5, 6, 7, 8, 0, 0, 0, 1, 1, 2, 3, 4, 0xCA, 0xFE, 0xF0, 0x0D]);
        assert_eq!(&blk[28..44], &UUID);
        // Second tag: SAME_UUID | LAST_TAG in the low half of the 32-bit flags.
        assert_eq!(&blk[44..60], &[0, 0, 0, 9, 0, 0, 0, 0x0A, 0, 0, 0, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn v2_32bit_layout_bytes() {
        let p = params(CsumVersion::V2, false);
        assert_eq!(p.tag_size(), 10);
        let mut b = DescriptorBuilder::new(&p, 1, UUID);
        b.push_tag(0x0A0B_0C0D, TagFlags::empty(), 0x1234_5678).unwrap();
        b.push_tag(2, TagFlags::empty(), 0xFFFF_0001).unwrap();
        let blk = b.finish().unwrap();
        // blocknr, 16-bit checksum, flags, 2 unused bytes.
        assert_eq!(&blk[12..22], &[0x0A, 0x0B, 0x0C, 0x0D, 0x56, 0x78, 0, 0, 0, 0]);
        assert_eq!(&blk[22..38], &UUID);
        assert_eq!(&blk[38..48], &[0, 0, 0, 2, 0, 1, 0, 0x0A, 0, 0]);
        let tags: Vec<Tag> = DescriptorTags::parse(&blk, &p).unwrap().collect();
        assert_eq!(tags[0].checksum, 0x5678);
        assert_eq!(tags[1].checksum, 0x0001);
    }

    #[test]
    fn builder_fills_exactly_to_capacity() {
        for p in all_params() {
            let cap = DescriptorBuilder::capacity(&p);
            let mut b = DescriptorBuilder::new(&p, 3, UUID);
            for i in 0..cap {
                b.push_tag(i as u64, TagFlags::empty(), 0).unwrap();
            }
            assert!(!b.has_room());
            assert_eq!(b.push_tag(1, TagFlags::empty(), 0), Err(PushError::Full));
            let blk = b.finish().unwrap();
            let tags: Vec<Tag> = DescriptorTags::parse(&blk, &p).unwrap().collect();
            assert_eq!(tags.len(), cap, "{p:?}");
            assert!(tags.iter().map(|t| t.block).eq(0..cap as u64));
        }
        // 4 KiB v3: (4096 - 12 - 4 - 16) / 16 = 254 tags, as the kernel fits.
        let p = JournalParams { block_size: 4096, ..params(CsumVersion::V3, true) };
        assert_eq!(DescriptorBuilder::capacity(&p), 254);
    }

    #[test]
    fn builder_rejects_bad_input() {
        let p = params(CsumVersion::V3, false);
        let mut b = DescriptorBuilder::new(&p, 3, UUID);
        assert_eq!(b.push_tag(1 << 32, TagFlags::empty(), 0), Err(PushError::BlockTooLarge(1 << 32)));
        let mut short = vec![0u8; 10];
        assert_eq!(b.push_block(1, &mut short), Err(PushError::WrongLength { expected: 1024, found: 10 }));
        assert!(b.is_empty());
        assert!(b.finish().is_none());
        // Builders for absurd block sizes do not panic.
        let tiny = JournalParams { block_size: 4, ..p };
        let mut b = DescriptorBuilder::new(&tiny, 1, UUID);
        assert_eq!(b.push_tag(1, TagFlags::empty(), 0), Err(PushError::Full));
        assert_eq!(DescriptorBuilder::capacity(&tiny), 0);
        let tinier = JournalParams { block_size: 2, ..p };
        let mut b = DescriptorBuilder::new(&tinier, 1, UUID);
        assert!(!b.has_room());
        assert_eq!(b.push_tag(1, TagFlags::empty(), 0), Err(PushError::Full));
    }

    #[test]
    fn missing_last_tag_ends_at_the_tail() {
        // Without LAST_TAG the list runs to the last tag that fits; all but the first tag carry
        // SAME_UUID so the count is (area - 16) / size.
        for p in all_params() {
            let mut blk = vec![0u8; p.block_size];
            blk[..12].copy_from_slice(Header::new(BlockType::Descriptor, 1).as_bytes());
            let size = p.tag_size();
            let end = p.block_size - p.tail_size();
            let mut pos = 12 + size + 16;
            while pos + size <= end {
                blk[pos + FLAGS16_OFFSET + 1] = TagFlags::SAME_UUID.bits() as u8;
                pos += size;
            }
            let n = DescriptorTags::parse(&blk, &p).unwrap().count();
            assert_eq!(n, DescriptorBuilder::capacity(&p), "{p:?}");
        }
    }

    #[test]
    fn garbage_blocks_stay_in_bounds() {
        for p in all_params() {
            for fill in [0x00u8, 0xFF, 0x02, 0x08, 0xA5] {
                let mut blk = vec![fill; p.block_size];
                blk[..12].copy_from_slice(Header::new(BlockType::Descriptor, 9).as_bytes());
                let tags = DescriptorTags::parse(&blk, &p).unwrap();
                let _ = tags.verify_checksum();
                let v: Vec<Tag> = tags.collect();
                // At most one tag per tag-size slot of the area.
                assert!(v.len() <= (p.block_size - 12) / p.tag_size());
                // 0xFF and 0x08 flags carry LAST_TAG: one tag only.
                if fill == 0xFF || fill == 0x08 {
                    assert_eq!(v.len(), 1);
                }
            }
            // Not a descriptor / wrong length / truncated.
            assert!(matches!(
                DescriptorTags::parse(&vec![0xFF; p.block_size], &p),
                Err(Jbd2Error::BadMagic(_))
            ));
            let mut blk = vec![0u8; p.block_size];
            blk[..12].copy_from_slice(Header::new(BlockType::Commit, 9).as_bytes());
            assert!(matches!(DescriptorTags::parse(&blk, &p), Err(Jbd2Error::WrongBlockType { .. })));
            blk[..12].copy_from_slice(Header::new(BlockType::Descriptor, 9).as_bytes());
            assert!(matches!(
                DescriptorTags::parse(&blk[..p.block_size - 1], &p),
                Err(Jbd2Error::BadLength { .. })
            ));
            assert!(DescriptorTags::parse(&blk[..5], &p).is_err());
        }
    }

    #[test]
    fn uuid_overrunning_the_area_still_counts_the_tag() {
        // One v3 tag that ends 8 bytes before the tail: its UUID would overrun.
        let p = params(CsumVersion::V3, true);
        let mut blk = vec![0u8; p.block_size];
        blk[..12].copy_from_slice(Header::new(BlockType::Descriptor, 1).as_bytes());
        let end = p.block_size - TAIL_SIZE;
        let mut pos = 12 + 16 + 16;
        while pos + 32 <= end {
            blk[pos + FLAGS16_OFFSET + 1] = TagFlags::SAME_UUID.bits() as u8;
            pos += 16;
        }
        // The last tag has no SAME_UUID and no room for its UUID.
        assert!(pos + 16 <= end && pos + 32 > end);
        let v: Vec<Tag> = DescriptorTags::parse(&blk, &p).unwrap().collect();
        let last = v.last().unwrap();
        assert_eq!(last.uuid, None);
        assert!(!last.flags.contains(TagFlags::SAME_UUID));
    }
}
