//! ext4's fast-commit area (`fs/ext4/fast_commit.h`): the journal's last blocks, holding a log
//! of tag-length-value records that describe changes since the last full commit. A fast commit
//! is a run of tags closed by a `TAIL` whose checksum covers the run; the first one after a
//! full commit starts with a `HEAD` naming the transaction the changes belong to.
//!
//! [`scan`] reads the area as the kernel's recovery scan does (`ext4_fc_replay_scan`) and
//! returns the tags a replay must apply: every tag up to the last valid `TAIL` of the expected
//! transaction, in order.

use crate::checksum::crc32c;

pub const TAG_ADD_RANGE: u16 = 1;
pub const TAG_DEL_RANGE: u16 = 2;
pub const TAG_CREAT: u16 = 3;
pub const TAG_LINK: u16 = 4;
pub const TAG_UNLINK: u16 = 5;
pub const TAG_INODE: u16 = 6;
pub const TAG_PAD: u16 = 7;
pub const TAG_TAIL: u16 = 8;
pub const TAG_HEAD: u16 = 9;

/// `fc_tag` and `fc_len`, ahead of every value.
pub const TAG_HEADER: usize = 4;
/// Fast-commit features a replayer of this format knows (`EXT4_FC_SUPPORTED_FEATURES`).
pub const SUPPORTED_FEATURES: u32 = 0;
/// The first 128 bytes of an inode record: the least an `INODE` tag carries.
const GOOD_OLD_INODE_SIZE: usize = 128;
const NAME_MAX: usize = 255;

/// One replayable record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tag {
    /// Logical blocks `lblk..lblk + len` of `ino` map to physical blocks from `pblk`.
    AddRange {
        ino: u32,
        lblk: u32,
        len: u32,
        pblk: u64,
        unwritten: bool,
    },
    /// Logical blocks `lblk..lblk + len` of `ino` map nothing.
    DelRange {
        ino: u32,
        lblk: u32,
        len: u32,
    },
    /// A new inode `ino` got its first name, `name` in directory `parent`.
    Create {
        parent: u32,
        ino: u32,
        name: Vec<u8>,
    },
    /// `ino` got another name.
    Link {
        parent: u32,
        ino: u32,
        name: Vec<u8>,
    },
    /// A name of `ino` went.
    Unlink {
        parent: u32,
        ino: u32,
        name: Vec<u8>,
    },
    /// The record of `ino` as it was (at least its first 128 bytes, at most the inode size).
    Inode {
        ino: u32,
        raw: Vec<u8>,
    },
    Pad,
    Tail {
        tid: u32,
    },
    Head {
        tid: u32,
    },
}

/// Why an area cannot be replayed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanError {
    /// The `HEAD` asks for features this replayer does not know (the kernel: `EOPNOTSUPP`).
    UnknownFeatures(u32),
    /// The area's first fast commit is malformed, before any valid `TAIL` (`ECANCELED`).
    Malformed,
    /// The first fast commit's `TAIL` does not match its tags (`EFSBADCRC`).
    BadChecksum,
}

impl core::fmt::Display for ScanError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::UnknownFeatures(x) => write!(f, "fast commit with unknown features {x:#x}"),
            Self::Malformed => write!(f, "malformed fast-commit tag"),
            Self::BadChecksum => write!(f, "fast commit checksum mismatch"),
        }
    }
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Whether `len` is a valid value length for `tag` (`ext4_fc_value_len_isvalid`).
fn len_is_valid(tag: u16, len: usize, inode_size: usize) -> bool {
    match tag {
        TAG_ADD_RANGE => len == 16,
        TAG_DEL_RANGE => len == 12,
        TAG_CREAT | TAG_LINK | TAG_UNLINK => (9..=8 + NAME_MAX).contains(&len),
        TAG_INODE => (4 + GOOD_OLD_INODE_SIZE..=4 + inode_size).contains(&len),
        TAG_PAD => true,
        TAG_TAIL => len >= 8,
        TAG_HEAD => len == 8,
        _ => false,
    }
}

/// Decodes a tag whose length [`len_is_valid`] accepted.
fn decode(tag: u16, v: &[u8]) -> Tag {
    let dentry = || (le32(v, 0), le32(v, 4), v[8..].to_vec());
    match tag {
        TAG_ADD_RANGE => {
            // `fc_ino`, then an `ext4_extent`.
            let raw_len = le16(v, 8);
            let (len, unwritten) = if raw_len > 32768 { (raw_len - 32768, true) } else { (raw_len, false) };
            let pblk = u64::from(le32(v, 12)) | u64::from(le16(v, 10)) << 32;
            Tag::AddRange { ino: le32(v, 0), lblk: le32(v, 4), len: u32::from(len), pblk, unwritten }
        }
        TAG_DEL_RANGE => Tag::DelRange { ino: le32(v, 0), lblk: le32(v, 4), len: le32(v, 8) },
        TAG_CREAT => {
            let (parent, ino, name) = dentry();
            Tag::Create { parent, ino, name }
        }
        TAG_LINK => {
            let (parent, ino, name) = dentry();
            Tag::Link { parent, ino, name }
        }
        TAG_UNLINK => {
            let (parent, ino, name) = dentry();
            Tag::Unlink { parent, ino, name }
        }
        TAG_INODE => Tag::Inode { ino: le32(v, 0), raw: v[4..].to_vec() },
        TAG_TAIL => Tag::Tail { tid: le32(v, 0) },
        TAG_HEAD => Tag::Head { tid: le32(v, 4) },
        _ => Tag::Pad,
    }
}

/// Reads the fast-commit area block by block (`block(i)` is its `i`th block, `None` past its
/// end or where it cannot be read) and returns the tags to replay for transaction
/// `expected_tid`, as the kernel's scan decides them:
/// - an area that does not start with a `HEAD`, or whose `HEAD` names another transaction,
///   holds nothing to replay (it is older than the log);
/// - each `TAIL` of the expected transaction whose checksum matches the tags since the last
///   one makes those tags valid;
/// - the first malformed tag, bad checksum or foreign `TAIL` ends the log there, unless no
///   fast commit was valid yet: then the area is refused ([`ScanError`]).
///
/// `inode_size` bounds the records `INODE` tags may carry.
pub fn scan(
    mut block: impl FnMut(usize) -> Option<Vec<u8>>,
    expected_tid: u32,
    inode_size: usize,
) -> Result<Vec<Tag>, ScanError> {
    let mut valid: Vec<Tag> = Vec::new();
    let mut pending: Vec<Tag> = Vec::new();
    let mut crc = 0u32;
    // Ends the scan where the kernel's would stop or fail.
    let stop = |valid: Vec<Tag>, err: ScanError| if valid.is_empty() { Err(err) } else { Ok(valid) };
    for i in 0.. {
        let Some(b) = block(i) else { break };
        if i == 0 && (b.len() < TAG_HEADER || le16(&b, 0) != TAG_HEAD) {
            return Ok(Vec::new());
        }
        let mut cur = 0usize;
        while cur + TAG_HEADER <= b.len() {
            let (tag, len) = (le16(&b, cur), usize::from(le16(&b, cur + 2)));
            let val = cur + TAG_HEADER;
            if len > b.len() - val || !len_is_valid(tag, len, inode_size) {
                return stop(valid, ScanError::Malformed);
            }
            let v = &b[val..val + len];
            match tag {
                TAG_TAIL => {
                    // The checksum covers the tag up to its own `fc_crc` field.
                    crc = crc32c(crc, &b[cur..val + 4]);
                    if le32(v, 0) == expected_tid && le32(v, 4) == crc {
                        pending.push(decode(tag, v));
                        valid.append(&mut pending);
                    } else {
                        return stop(valid, ScanError::BadChecksum);
                    }
                    crc = 0;
                }
                TAG_HEAD => {
                    let features = le32(v, 0);
                    if features & !SUPPORTED_FEATURES != 0 {
                        return Err(ScanError::UnknownFeatures(features));
                    }
                    if le32(v, 4) != expected_tid {
                        return Ok(valid);
                    }
                    crc = crc32c(crc, &b[cur..val + len]);
                    pending.push(decode(tag, v));
                }
                _ => {
                    crc = crc32c(crc, &b[cur..val + len]);
                    pending.push(decode(tag, v));
                }
            }
            cur = val + len;
        }
    }
    Ok(valid)
}

/// Encodes one tag (for tests and tools that write fast-commit areas): the value bytes after
/// `fc_tag` and `fc_len`.
pub fn encode(tag: &Tag) -> (u16, Vec<u8>) {
    let dentry = |parent: u32, ino: u32, name: &[u8]| {
        let mut v = Vec::with_capacity(8 + name.len());
        v.extend_from_slice(&parent.to_le_bytes());
        v.extend_from_slice(&ino.to_le_bytes());
        v.extend_from_slice(name);
        v
    };
    match tag {
        Tag::AddRange { ino, lblk, len, pblk, unwritten } => {
            let mut v = Vec::with_capacity(16);
            v.extend_from_slice(&ino.to_le_bytes());
            v.extend_from_slice(&lblk.to_le_bytes());
            // Lengths of one extent fit 16 bits; callers pass such lengths.
            #[allow(clippy::cast_possible_truncation)]
            let l = *len as u16 + if *unwritten { 32768 } else { 0 };
            v.extend_from_slice(&l.to_le_bytes());
            v.extend_from_slice(&crate::split::hi16_of_48(*pblk).to_le_bytes());
            v.extend_from_slice(&crate::split::lo32(*pblk).to_le_bytes());
            (TAG_ADD_RANGE, v)
        }
        Tag::DelRange { ino, lblk, len } => {
            let v = [ino.to_le_bytes(), lblk.to_le_bytes(), len.to_le_bytes()].concat();
            (TAG_DEL_RANGE, v)
        }
        Tag::Create { parent, ino, name } => (TAG_CREAT, dentry(*parent, *ino, name)),
        Tag::Link { parent, ino, name } => (TAG_LINK, dentry(*parent, *ino, name)),
        Tag::Unlink { parent, ino, name } => (TAG_UNLINK, dentry(*parent, *ino, name)),
        Tag::Inode { ino, raw } => (TAG_INODE, [&ino.to_le_bytes()[..], raw].concat()),
        Tag::Pad => (TAG_PAD, Vec::new()),
        Tag::Tail { tid } => (TAG_TAIL, [tid.to_le_bytes(), [0; 4]].concat()),
        Tag::Head { tid } => (TAG_HEAD, [0u32.to_le_bytes(), tid.to_le_bytes()].concat()),
    }
}

/// Lays `tags` out as the kernel writes a fast-commit area of `block_size`-byte blocks: tags
/// never cross a block, a `PAD` fills a block's rest, and each `TAIL` carries the checksum of
/// the tags since the previous one and fills its block.
pub fn write_area(tags: &[Tag], block_size: usize) -> Vec<u8> {
    let mut out: Vec<u8> = Vec::new();
    let mut crc = 0u32;
    let room = |out: &Vec<u8>| block_size - out.len() % block_size;
    for t in tags {
        let (tag, mut v) = encode(t);
        if matches!(t, Tag::Tail { .. }) {
            if room(&out) < TAG_HEADER + 8 {
                pad_block(&mut out, block_size, &mut crc);
            }
            // Fill the block, as the kernel's TAIL does.
            v.resize(room(&out) - TAG_HEADER, 0);
        } else if room(&out) < TAG_HEADER + v.len() + TAG_HEADER + 8 {
            pad_block(&mut out, block_size, &mut crc);
        }
        let len = u16::try_from(v.len()).unwrap_or(u16::MAX);
        let start = out.len();
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&v);
        if tag == TAG_TAIL {
            crc = crc32c(crc, &out[start..start + TAG_HEADER + 4]);
            out[start + TAG_HEADER + 4..start + TAG_HEADER + 8].copy_from_slice(&crc.to_le_bytes());
            crc = 0;
        } else {
            crc = crc32c(crc, &out[start..]);
        }
    }
    let n = out.len().div_ceil(block_size) * block_size;
    out.resize(n, 0);
    out
}

fn pad_block(out: &mut Vec<u8>, block_size: usize, crc: &mut u32) {
    let rest = block_size - out.len() % block_size;
    if rest == block_size {
        return;
    }
    let start = out.len();
    if rest >= TAG_HEADER {
        let len = u16::try_from(rest - TAG_HEADER).unwrap_or(u16::MAX);
        out.extend_from_slice(&TAG_PAD.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.resize(start + rest, 0);
        *crc = crc32c(*crc, &out[start..]);
    } else {
        out.resize(start + rest, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(area: &[u8], bs: usize) -> impl FnMut(usize) -> Option<Vec<u8>> + '_ {
        move |i| area.get(i * bs..(i + 1) * bs).map(<[u8]>::to_vec)
    }

    fn sample(tid: u32) -> Vec<Tag> {
        vec![
            Tag::Head { tid },
            Tag::Inode { ino: 13, raw: vec![7; 256] },
            Tag::AddRange { ino: 13, lblk: 0, len: 40, pblk: 0x1_0000_2341, unwritten: false },
            Tag::Create { parent: 2, ino: 13, name: b"b".to_vec() },
            Tag::Tail { tid },
            Tag::DelRange { ino: 13, lblk: 8, len: 4 },
            Tag::AddRange { ino: 13, lblk: 50, len: 2, pblk: 900, unwritten: true },
            Tag::Unlink { parent: 2, ino: 12, name: b"a".to_vec() },
            Tag::Link { parent: 2, ino: 13, name: b"c".to_vec() },
            Tag::Tail { tid },
        ]
    }

    fn replayable(tags: &[Tag]) -> Vec<Tag> {
        tags.to_vec()
    }

    #[test]
    fn written_areas_scan_back_to_their_tags() {
        for bs in [1024, 4096] {
            let tags = sample(7);
            let area = write_area(&tags, bs);
            let got = scan(blocks(&area, bs), 7, 256).unwrap();
            let want: Vec<Tag> = got.iter().filter(|t| **t != Tag::Pad).cloned().collect();
            assert_eq!(want, replayable(&tags));
        }
    }

    #[test]
    fn another_transaction_or_no_head_is_nothing_to_replay() {
        let area = write_area(&sample(7), 1024);
        assert_eq!(scan(blocks(&area, 1024), 8, 256), Ok(Vec::new()));
        let zeros = vec![0u8; 4096];
        assert_eq!(scan(blocks(&zeros, 1024), 7, 256), Ok(Vec::new()));
    }

    #[test]
    fn a_torn_fast_commit_ends_the_log_at_the_last_good_tail() {
        let bs = 1024;
        let tags = sample(7);
        let mut area = write_area(&tags, bs);
        // Damage a tag after the first TAIL: its fast commit's checksum fails.
        let at = area.len() - bs + 40;
        area[at] ^= 0xff;
        let got = scan(blocks(&area, bs), 7, 256).unwrap();
        let first_tail = got.iter().position(|t| matches!(t, Tag::Tail { .. })).unwrap();
        assert_eq!(first_tail + 1, got.len(), "nothing after the first fast commit");
        assert!(got.contains(&Tag::Create { parent: 2, ino: 13, name: b"b".to_vec() }));
        // Damage in the first fast commit: nothing valid at all is a refusal.
        let mut first = write_area(&tags, bs);
        first[20] ^= 0xff;
        assert!(scan(blocks(&first, bs), 7, 256).is_err());
    }

    #[test]
    fn unknown_features_and_bad_lengths_are_refused() {
        let bs = 1024;
        let mut area = write_area(&sample(7), bs);
        area[4] = 1; // HEAD's fc_features
        assert_eq!(scan(blocks(&area, bs), 7, 256), Err(ScanError::UnknownFeatures(1)));
        // An INODE tag larger than the filesystem's inodes.
        let area = write_area(&sample(7), bs);
        assert_eq!(scan(blocks(&area, bs), 7, 128), Err(ScanError::Malformed));
    }

    #[test]
    fn any_bytes_scan_without_panicking() {
        let mut x = 0x1234_5678u32;
        for _ in 0..2000 {
            let mut area = write_area(&sample(3), 1024);
            for _ in 0..4 {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let i = x as usize % area.len();
                area[i] = x.to_le_bytes()[1];
            }
            let _ = scan(blocks(&area, 1024), 3, 256);
        }
    }
}
