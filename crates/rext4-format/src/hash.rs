//! Directory-index (htree) name hashes and extended-attribute hashes.
//!
//! Both are on-disk contracts: an htree lookup only finds a name if we hash it exactly as the
//! kernel did when it inserted it, and an xattr block is only shareable (and passes e2fsck) if
//! its `e_hash`/`h_hash` fields match the kernel's formulas. So everything here is bit-exact
//! with Linux `fs/ext4/hash.c` and `fs/ext4/xattr.c`, and pure (no I/O, no state). No function
//! panics, whatever the length or contents of its input.

/// `dx_root.info.hash_version` values (and `s_def_hash_version`).
pub const DX_HASH_LEGACY: u8 = 0;
/// Half-MD4, with names read as signed `char`s.
pub const DX_HASH_HALF_MD4: u8 = 1;
/// TEA, with names read as signed `char`s.
pub const DX_HASH_TEA: u8 = 2;
/// Legacy hash, names read as unsigned `char`s. Never stored on disk: derived from
/// [`DX_HASH_LEGACY`] plus the superblock's unsigned-hash flag.
pub const DX_HASH_LEGACY_UNSIGNED: u8 = 3;
/// Half-MD4, unsigned `char`s (derived, like [`DX_HASH_LEGACY_UNSIGNED`]).
pub const DX_HASH_HALF_MD4_UNSIGNED: u8 = 4;
/// TEA, unsigned `char`s (derived, like [`DX_HASH_LEGACY_UNSIGNED`]).
pub const DX_HASH_TEA_UNSIGNED: u8 = 5;
/// SipHash, used only by casefolded + encrypted directories; not implemented here, since its
/// input is the casefolded name and its key comes from the encryption policy.
pub const DX_HASH_SIPHASH: u8 = 6;

/// `EXT4_HTREE_EOF_32BIT`: the largest 31-bit readdir position, which the kernel uses as the
/// "end of directory" cookie for 32-bit htree positions (`major >> 1`). No real name may
/// hash to it, which is why [`dx_hash`] remaps that one value.
pub const HTREE_EOF_32BIT: u32 = 0x7fff_ffff;

/// The MD4 initial state; the kernel uses it as the hash seed when `s_hash_seed` is all zero.
const DEFAULT_SEED: [u32; 4] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];

/// A directory-name hash algorithm, with the signedness of `char` made explicit.
///
/// The original implementation fed names through plain `char`, so the hash of any name with a
/// byte >= 0x80 depended on the CPU (signed on x86, unsigned on ARM/PowerPC). The superblock
/// records which one a filesystem was built with, and the kernel selects the matching variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashAlgo {
    /// `dx_hack_hash`, signed chars. Yields no minor hash.
    Legacy,
    /// Half-MD4, signed chars.
    HalfMd4,
    /// TEA, signed chars.
    Tea,
    /// `dx_hack_hash`, unsigned chars.
    LegacyUnsigned,
    /// Half-MD4, unsigned chars.
    HalfMd4Unsigned,
    /// TEA, unsigned chars.
    TeaUnsigned,
}

impl HashAlgo {
    /// The algorithm for a `DX_HASH_*` number; `None` for SipHash and unknown values (which the
    /// kernel refuses to index).
    pub fn from_version(v: u8) -> Option<Self> {
        match v {
            DX_HASH_LEGACY => Some(Self::Legacy),
            DX_HASH_HALF_MD4 => Some(Self::HalfMd4),
            DX_HASH_TEA => Some(Self::Tea),
            DX_HASH_LEGACY_UNSIGNED => Some(Self::LegacyUnsigned),
            DX_HASH_HALF_MD4_UNSIGNED => Some(Self::HalfMd4Unsigned),
            DX_HASH_TEA_UNSIGNED => Some(Self::TeaUnsigned),
            _ => None,
        }
    }

    /// The `DX_HASH_*` number of this algorithm.
    pub fn version(self) -> u8 {
        match self {
            Self::Legacy => DX_HASH_LEGACY,
            Self::HalfMd4 => DX_HASH_HALF_MD4,
            Self::Tea => DX_HASH_TEA,
            Self::LegacyUnsigned => DX_HASH_LEGACY_UNSIGNED,
            Self::HalfMd4Unsigned => DX_HASH_HALF_MD4_UNSIGNED,
            Self::TeaUnsigned => DX_HASH_TEA_UNSIGNED,
        }
    }

    /// The algorithm a `dx_root`'s `hash_version` means on a filesystem whose superblock has
    /// (`unsigned_flag`) or lacks the [`crate::superblock::FLAGS_UNSIGNED_HASH`] bit: like the
    /// kernel's `dx_probe`, versions 0..=2 are shifted by 3 to their unsigned twins when the
    /// flag is set, and anything else is taken as is.
    ///
    /// When the superblock has neither the signed nor the unsigned flag, the kernel picks by its
    /// own `char` signedness (and records the choice); resolving that is up to the caller.
    pub fn for_dir(root_version: u8, unsigned_flag: bool) -> Option<Self> {
        let v = if unsigned_flag && root_version <= DX_HASH_TEA { root_version + 3 } else { root_version };
        Self::from_version(v)
    }

    /// Whether name bytes are sign-extended before mixing (the historical x86 behaviour).
    fn signed_chars(self) -> bool {
        matches!(self, Self::Legacy | Self::HalfMd4 | Self::Tea)
    }
}

/// An htree hash: `major` is what index nodes store and sort by (its low bit is always clear,
/// as the kernel uses that bit to flag hash collisions across leaf blocks); `minor` breaks ties
/// for 64-bit readdir cookies. Orders by (major, minor), as the kernel compares them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DxHash {
    /// The 32-bit hash stored in `dx_entry.hash`.
    pub major: u32,
    /// The secondary hash (0 for the legacy algorithm).
    pub minor: u32,
}

/// Hash a directory entry name as the kernel's `ext4fs_dirhash` does.
///
/// `seed` is the superblock's `s_hash_seed` read as four little-endian words; an all-zero seed
/// means "use the default", exactly as the kernel does (the legacy hash ignores the seed). The
/// major hash has its low bit cleared, and the one value that would collide with the 32-bit
/// end-of-directory cookie (`HTREE_EOF_32BIT << 1`) is moved down by one step, to
/// `(HTREE_EOF_32BIT - 1) << 1`. (e2fsprogs' `ext2fs_dirhash` does *not* do that remap.)
pub fn dx_hash(name: &[u8], algo: HashAlgo, seed: [u32; 4]) -> DxHash {
    let mut buf = if seed.iter().any(|&w| w != 0) { seed } else { DEFAULT_SEED };
    let signed = algo.signed_chars();

    let (major, minor) = match algo {
        HashAlgo::Legacy | HashAlgo::LegacyUnsigned => (dx_hack_hash(name, signed), 0),
        HashAlgo::HalfMd4 | HashAlgo::HalfMd4Unsigned => {
            // Each 32-byte chunk is packed with the length of the *remaining* name, so the
            // packer sees the whole tail, not just the chunk.
            let mut input = [0u32; 8];
            let mut rest = name;
            while !rest.is_empty() {
                str2hashbuf(rest, signed, &mut input);
                half_md4_transform(&mut buf, &input);
                rest = rest.get(32..).unwrap_or(&[]);
            }
            (buf[1], buf[2])
        }
        HashAlgo::Tea | HashAlgo::TeaUnsigned => {
            let mut input = [0u32; 4];
            let mut rest = name;
            while !rest.is_empty() {
                str2hashbuf(rest, signed, &mut input);
                tea_transform(&mut buf, &input);
                rest = rest.get(16..).unwrap_or(&[]);
            }
            (buf[0], buf[1])
        }
    };

    let mut major = major & !1;
    if major == HTREE_EOF_32BIT << 1 {
        major = (HTREE_EOF_32BIT - 1) << 1;
    }
    DxHash { major, minor }
}

/// A name byte as the C code's `(int)` of a `signed char` or `unsigned char`, reinterpreted as
/// the `u32` it is mixed in as.
fn char_value(b: u8, signed: bool) -> u32 {
    if signed {
        i32::from(b.cast_signed()).cast_unsigned()
    } else {
        u32::from(b)
    }
}

/// The original ext3 htree hash (`dx_hack_hash`): a 31-bit additive mix. Returns it shifted
/// left by one, as the kernel does.
fn dx_hack_hash(name: &[u8], signed: bool) -> u32 {
    let (mut hash0, mut hash1): (u32, u32) = (0x12a3_fe2d, 0x37ab_e8f9);
    for &b in name {
        // In C this product is an `int`; it cannot overflow (|c| <= 255), but wrap anyway.
        let mixed = char_value(b, signed).cast_signed().wrapping_mul(7_152_373).cast_unsigned();
        let mut hash = hash1.wrapping_add(hash0 ^ mixed);
        if hash & 0x8000_0000 != 0 {
            hash = hash.wrapping_sub(0x7fff_ffff);
        }
        hash1 = hash0;
        hash0 = hash;
    }
    hash0 << 1
}

/// Pack the start of `msg` big-endian-ish into `out`, four bytes per word, each word starting
/// from a padding pattern built from the remaining length; unused words get the pad itself.
/// This is the kernel's `str2hashbuf_{signed,unsigned}`.
fn str2hashbuf(msg: &[u8], signed: bool, out: &mut [u32]) {
    // The C code takes `len` as an `int` and casts it to `__u32`; names are at most 255 bytes,
    // and longer inputs just wrap the same way.
    #[allow(clippy::cast_possible_truncation)]
    let len = msg.len() as u32;
    let mut pad = len | (len << 8);
    pad |= pad << 16;

    let take = msg.len().min(out.len().saturating_mul(4));
    let mut words = out.iter_mut();
    let mut val = pad;
    for (i, &b) in msg.iter().take(take).enumerate() {
        val = char_value(b, signed).wrapping_add(val << 8);
        if i % 4 == 3 {
            if let Some(slot) = words.next() {
                *slot = val;
            }
            val = pad;
        }
    }
    // The partial (or, on an exact multiple of 4, pad-only) word, then pure padding.
    if let Some(slot) = words.next() {
        *slot = val;
    }
    for slot in words {
        *slot = pad;
    }
}

/// TEA in a Davies-Meyer construction: 16 rounds keyed by the 4 input words, fed forward into
/// the first two state words.
fn tea_transform(buf: &mut [u32; 4], input: &[u32; 4]) {
    const DELTA: u32 = 0x9e37_79b9;
    let (mut b0, mut b1) = (buf[0], buf[1]);
    let [a, b, c, d] = *input;
    let mut sum: u32 = 0;
    for _ in 0..16 {
        sum = sum.wrapping_add(DELTA);
        b0 =
            b0.wrapping_add(((b1 << 4).wrapping_add(a)) ^ b1.wrapping_add(sum) ^ ((b1 >> 5).wrapping_add(b)));
        b1 =
            b1.wrapping_add(((b0 << 4).wrapping_add(c)) ^ b0.wrapping_add(sum) ^ ((b0 >> 5).wrapping_add(d)));
    }
    buf[0] = buf[0].wrapping_add(b0);
    buf[1] = buf[1].wrapping_add(b1);
}

/// MD4 cut down to three 8-step rounds over 8 input words, fed forward into all four state
/// words.
fn half_md4_transform(buf: &mut [u32; 4], input: &[u32; 8]) {
    // MD4's round constants: 0, floor(2^30 * sqrt 2), floor(2^30 * sqrt 3).
    const K2: u32 = 0x5a82_7999;
    const K3: u32 = 0x6ed9_eba1;

    fn f(x: u32, y: u32, z: u32) -> u32 {
        z ^ (x & (y ^ z)) // select
    }
    fn g(x: u32, y: u32, z: u32) -> u32 {
        (x & y).wrapping_add((x ^ y) & z) // majority
    }
    fn h(x: u32, y: u32, z: u32) -> u32 {
        x ^ y ^ z // parity
    }
    /// One MD4 step: `(acc + mixed + word) <<< shift`.
    fn step(acc: u32, mixed: u32, word: u32, shift: u32) -> u32 {
        acc.wrapping_add(mixed).wrapping_add(word).rotate_left(shift)
    }

    let [mut a, mut b, mut c, mut d] = *buf;
    let w = |i: usize, k: u32| input[i].wrapping_add(k);

    // Round 1: words in order.
    for i in [0, 4] {
        a = step(a, f(b, c, d), w(i, 0), 3);
        d = step(d, f(a, b, c), w(i + 1, 0), 7);
        c = step(c, f(d, a, b), w(i + 2, 0), 11);
        b = step(b, f(c, d, a), w(i + 3, 0), 19);
    }
    // Round 2: odd words, then even ones.
    for i in [1, 0] {
        a = step(a, g(b, c, d), w(i, K2), 3);
        d = step(d, g(a, b, c), w(i + 2, K2), 5);
        c = step(c, g(d, a, b), w(i + 4, K2), 9);
        b = step(b, g(c, d, a), w(i + 6, K2), 13);
    }
    // Round 3: words 3, 7, 2, 6, then 1, 5, 0, 4.
    for i in [3, 1] {
        a = step(a, h(b, c, d), w(i, K3), 3);
        d = step(d, h(a, b, c), w(i + 4, K3), 9);
        c = step(c, h(d, a, b), w(i - 1, K3), 11);
        b = step(b, h(c, d, a), w(i + 3, K3), 15);
    }

    buf[0] = buf[0].wrapping_add(a);
    buf[1] = buf[1].wrapping_add(b);
    buf[2] = buf[2].wrapping_add(c);
    buf[3] = buf[3].wrapping_add(d);
}

/// Mix an xattr name into an entry hash: rotate by 5, xor each byte. The kernel now reads the
/// bytes as unsigned; before Linux 6.2 made `char` unsigned everywhere, x86 builds (and
/// e2fsprogs before 1.47.1) sign-extended them, so `signed` reproduces those hashes, which the
/// kernel still accepts as a fallback.
fn xattr_name_hash(name: &[u8], signed: bool) -> u32 {
    name.iter().fold(0u32, |hash, &b| hash.rotate_left(5) ^ char_value(b, signed))
}

/// Mix one value word into an entry hash (rotate by 16, xor).
fn xattr_value_mix(hash: u32, word: u32) -> u32 {
    hash.rotate_left(16) ^ word
}

/// `e_hash` of an xattr entry whose value is stored in the xattr block (or inode body): the
/// name suffix (`e_name`, without the prefix that `e_name_index` stands for) and then the
/// value as little-endian 32-bit words, zero-padded to a multiple of 4 as it is on disk. An
/// empty value contributes no words.
///
/// The kernel only computes this for entries in an xattr *block*; for values stored in the
/// inode body it writes `e_hash = 0`.
pub fn xattr_entry_hash(name: &[u8], value: &[u8], signed: bool) -> u32 {
    value.chunks(4).fold(xattr_name_hash(name, signed), |hash, chunk| {
        let mut word = [0u8; 4];
        for (dst, &src) in word.iter_mut().zip(chunk) {
            *dst = src;
        }
        xattr_value_mix(hash, u32::from_le_bytes(word))
    })
}

/// `e_hash` of an xattr entry whose value lives in an EA inode (`ea_inode` feature): instead of
/// rehashing a value of up to 64 KiB, the kernel mixes in a single word, the value's crc32c
/// hash (`ext4_xattr_inode_hash`, stored in the EA inode's `i_atime`), after the name. This
/// applies wherever such an entry sits, block or inode body.
pub fn xattr_entry_hash_ea_inode(name: &[u8], value_hash: u32, signed: bool) -> u32 {
    xattr_value_mix(xattr_name_hash(name, signed), value_hash)
}

/// `h_hash` of an xattr block from its entries' `e_hash` values in on-disk order
/// (`ext4_xattr_rehash`). An entry hash of 0 marks an entry that must not be shared, so the
/// whole block hash becomes 0, which the kernel reads as "never share this block".
pub fn xattr_block_hash(entry_hashes: impl IntoIterator<Item = u32>) -> u32 {
    let mut hash = 0u32;
    for e in entry_hashes {
        if e == 0 {
            return 0;
        }
        hash = hash.rotate_left(16) ^ e;
    }
    hash
}

#[cfg(test)]
// Fixtures are built from small known values; a narrowing cast there is the clearest form.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
mod tests {
    use super::*;
    use HashAlgo::*;

    /// How a test name is spelled: a literal, or `len` bytes from a simple generator (keeps
    /// 255-byte names out of the table).
    #[derive(Clone, Copy)]
    enum Name {
        Lit(&'static [u8]),
        Pat(usize, Kind),
    }

    #[derive(Clone, Copy)]
    enum Kind {
        /// `a..z` repeating.
        Lower,
        /// Bytes 0x80..=0xff only, where signed and unsigned chars differ.
        High,
        /// Letters at even positions, bytes >= 0xa0 at odd positions.
        Mixed,
    }
    use Kind::*;
    use Name::*;

    fn name_bytes(n: Name) -> Vec<u8> {
        match n {
            Lit(b) => b.to_vec(),
            Pat(len, kind) => (0..len)
                .map(|i| match kind {
                    Lower => b'a' + (i % 26) as u8,
                    High => 0x80 + ((i * 37) % 128) as u8,
                    Mixed if i % 2 == 0 => b'a' + (i % 26) as u8,
                    Mixed => 0xa0 + (i % 96) as u8,
                })
                .collect(),
        }
    }

    /// A UUID string as `s_hash_seed` words: its 16 bytes read as little-endian `u32`s, which
    /// is how both debugfs (`uuid_parse` into a `__u32[4]` on x86) and the kernel
    /// (`le32_to_cpu(es->s_hash_seed[i])`) see it.
    fn seed(uuid: &str) -> [u32; 4] {
        let hex: Vec<u8> = uuid.bytes().filter(|&c| c != b'-').collect();
        assert_eq!(hex.len(), 32, "bad uuid {uuid}");
        let byte = |i: usize| {
            let s = std::str::from_utf8(&hex[2 * i..2 * i + 2]).expect("ascii hex");
            u8::from_str_radix(s, 16).expect("hex digit")
        };
        let word =
            |w: usize| u32::from_le_bytes([byte(4 * w), byte(4 * w + 1), byte(4 * w + 2), byte(4 * w + 3)]);
        [word(0), word(1), word(2), word(3)]
    }

    const Z: &str = "00000000-0000-0000-0000-000000000000";
    const S1: &str = "00112233-4455-6677-8899-aabbccddeeff";
    const S2: &str = "6f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

    /// Produced by `debugfs` of e2fsprogs 1.47.0 (Debian 1.47.0-2): on a throwaway image from
    /// `mkfs.ext4 -q -F d.img` (8 MiB), `debugfs -f cmds d.img` with one line per vector,
    /// `dx_hash -h <DX_HASH_* number 0..=5> -s <seed uuid> -- "<name bytes>"`; it prints
    /// `Hash of NAME is 0x<major> (minor 0x<minor>)`. (Numbers, not names, select the
    /// unsigned variants; `--` lets names start with `-`.) None of these majors is the EOF
    /// value, so debugfs and the kernel agree on all of them.
    const DEBUGFS_VECTORS: &[(Name, HashAlgo, &str, u32, u32)] = &[
        (Lit(b""), Legacy, Z, 0x2547fc5a, 0x00000000),
        (Lit(b"lost+found"), Legacy, S1, 0x5e2aba24, 0x00000000),
        (Lit(b"caf\xc3\xa9"), Legacy, S2, 0x96ca5a2c, 0x00000000),
        (Pat(16, Mixed), Legacy, Z, 0x13be24c8, 0x00000000),
        (Pat(17, High), Legacy, S1, 0x75a32e78, 0x00000000),
        (Pat(33, High), Legacy, S2, 0xdb865160, 0x00000000),
        (Pat(64, Mixed), Legacy, Z, 0x266aa528, 0x00000000),
        (Pat(255, High), Legacy, S2, 0xef70226a, 0x00000000),
        (Lit(b""), HalfMd4, S1, 0x77665544, 0xbbaa9988),
        (Lit(b"lost+found"), HalfMd4, S2, 0xc757eac2, 0x2f065056),
        (Lit(b"caf\xc3\xa9"), HalfMd4, Z, 0xfb9c5e5c, 0x0573e8b8),
        (Pat(16, Mixed), HalfMd4, S1, 0x821afdf8, 0xace38eb7),
        (Pat(17, High), HalfMd4, S2, 0x844d6c80, 0x7b1ffed6),
        (Pat(33, High), HalfMd4, Z, 0xe4297924, 0xab4ec319),
        (Pat(64, Mixed), HalfMd4, S1, 0xb715d1a6, 0x7a3950bc),
        (Pat(255, Lower), HalfMd4, S2, 0x4e33c766, 0x90c12dd0),
        (Pat(255, High), HalfMd4, Z, 0x3a87a988, 0xe6daa3c4),
        (Lit(b""), Tea, S2, 0x3c2d1e6e, 0x78695a4b),
        (Lit(b"lost+found"), Tea, Z, 0x2dbf9e80, 0xbfebee4f),
        (Lit(b"caf\xc3\xa9"), Tea, S1, 0x643516dc, 0x87a2cff9),
        (Pat(16, Mixed), Tea, S2, 0x86cc4a3c, 0x9bb0e2c3),
        (Pat(17, High), Tea, Z, 0x71a299e6, 0xf7c25fd1),
        (Pat(33, High), Tea, S1, 0x4e292844, 0x6efa6ea3),
        (Pat(64, Mixed), Tea, S2, 0x3fe30e24, 0xc1d022ef),
        (Pat(255, Lower), Tea, Z, 0xbb476820, 0xe990b17f),
        (Pat(255, High), Tea, S1, 0xac2c3cea, 0x4b8e7f0b),
        (Lit(b""), LegacyUnsigned, Z, 0x2547fc5a, 0x00000000),
        (Lit(b"lost+found"), LegacyUnsigned, S1, 0x5e2aba24, 0x00000000),
        (Lit(b"caf\xc3\xa9"), LegacyUnsigned, S2, 0x6dde4230, 0x00000000),
        (Pat(16, Mixed), LegacyUnsigned, Z, 0xf85266be, 0x00000000),
        (Pat(17, High), LegacyUnsigned, S1, 0x00ba0c30, 0x00000000),
        (Pat(33, High), LegacyUnsigned, S2, 0xeb876d4c, 0x00000000),
        (Pat(64, Mixed), LegacyUnsigned, Z, 0xf4a4fae8, 0x00000000),
        (Pat(255, High), LegacyUnsigned, S2, 0x46995112, 0x00000000),
        (Lit(b""), HalfMd4Unsigned, S1, 0x77665544, 0xbbaa9988),
        (Lit(b"lost+found"), HalfMd4Unsigned, S2, 0xc757eac2, 0x2f065056),
        (Lit(b"caf\xc3\xa9"), HalfMd4Unsigned, Z, 0x9d72aed6, 0xf6138c6a),
        (Pat(16, Mixed), HalfMd4Unsigned, S1, 0x4051c434, 0x18ae68db),
        (Pat(17, High), HalfMd4Unsigned, S2, 0xd76763d4, 0x675699d3),
        (Pat(33, High), HalfMd4Unsigned, Z, 0x9fbda8d8, 0x7e41bad3),
        (Pat(64, Mixed), HalfMd4Unsigned, S1, 0x74f26012, 0xd61f042b),
        (Pat(255, Lower), HalfMd4Unsigned, S2, 0x4e33c766, 0x90c12dd0),
        (Pat(255, High), HalfMd4Unsigned, Z, 0x6ae054d0, 0x711c9fa2),
        (Lit(b""), TeaUnsigned, S2, 0x3c2d1e6e, 0x78695a4b),
        (Lit(b"lost+found"), TeaUnsigned, Z, 0x2dbf9e80, 0xbfebee4f),
        (Lit(b"caf\xc3\xa9"), TeaUnsigned, S1, 0x6aaf4150, 0x460fa819),
        (Pat(16, Mixed), TeaUnsigned, S2, 0x8366138e, 0xae0142eb),
        (Pat(17, High), TeaUnsigned, Z, 0x9293d88a, 0xd265ba79),
        (Pat(33, High), TeaUnsigned, S1, 0xf1ee0fbc, 0xf17f52e1),
        (Pat(64, Mixed), TeaUnsigned, S2, 0x471d1b1c, 0x8689e2d4),
        (Pat(255, Lower), TeaUnsigned, Z, 0xbb476820, 0xe990b17f),
        (Pat(255, High), TeaUnsigned, S1, 0x87cba250, 0xbf7d5ae3),
    ];

    #[test]
    fn dx_hash_matches_debugfs() {
        for &(name, algo, uuid, major, minor) in DEBUGFS_VECTORS {
            let bytes = name_bytes(name);
            let got = dx_hash(&bytes, algo, seed(uuid));
            assert_eq!(got, DxHash { major, minor }, "{algo:?} seed {uuid} name {bytes:02x?}");
        }
    }

    /// The one place the kernel and e2fsprogs differ: e2fsprogs 1.47.0 prints 0xfffffffe for
    /// both of these (`dx_hash -h tea -s ffffffff-0000-0000-0000-000000000000 -- ""` and
    /// `dx_hash -h half_md4 -s 00000000-ffff-ffff-0000-000000000000 -- ""`: an empty name
    /// leaves the seed word as the hash), but the kernel never lets a name hash to the
    /// end-of-directory cookie and moves it to 0xfffffffc.
    #[test]
    fn eof_hash_is_remapped_like_the_kernel() {
        let tea = dx_hash(b"", Tea, seed("ffffffff-0000-0000-0000-000000000000"));
        assert_eq!(tea, DxHash { major: 0xffff_fffc, minor: 0 });
        let md4 = dx_hash(b"", HalfMd4, seed("00000000-ffff-ffff-0000-000000000000"));
        assert_eq!(md4, DxHash { major: 0xffff_fffc, minor: 0 });
        // 0xfffffffc itself and its odd neighbour are left alone (apart from the low bit).
        let below = dx_hash(b"", TeaUnsigned, [0xffff_fffd, 0, 0, 0]);
        assert_eq!(below.major, 0xffff_fffc);
    }

    #[test]
    fn zero_seed_means_default_seed() {
        for algo in [Legacy, HalfMd4, Tea, LegacyUnsigned, HalfMd4Unsigned, TeaUnsigned] {
            for name in [&b""[..], b"x", b"a-rather-long-file-name-over-32-bytes.txt"] {
                assert_eq!(dx_hash(name, algo, [0; 4]), dx_hash(name, algo, DEFAULT_SEED));
            }
        }
        // One non-zero word is enough to make the seed count.
        assert_ne!(dx_hash(b"x", Tea, [0, 0, 0, 1]), dx_hash(b"x", Tea, [0; 4]));
    }

    #[test]
    fn signedness_only_matters_for_high_bytes() {
        let pairs = [(Legacy, LegacyUnsigned), (HalfMd4, HalfMd4Unsigned), (Tea, TeaUnsigned)];
        let s = seed(S2);
        for (signed, unsigned) in pairs {
            let ascii = name_bytes(Pat(100, Lower));
            assert_eq!(dx_hash(&ascii, signed, s), dx_hash(&ascii, unsigned, s));
            let high = name_bytes(Pat(100, High));
            assert_ne!(dx_hash(&high, signed, s), dx_hash(&high, unsigned, s));
        }
    }

    #[test]
    fn any_input_is_fine() {
        // Names beyond ext4's 255 bytes (the length pad wraps), NULs, every byte value.
        let all: Vec<u8> = (0..=255u8).cycle().take(1500).collect();
        for algo in [Legacy, HalfMd4, Tea, LegacyUnsigned, HalfMd4Unsigned, TeaUnsigned] {
            for len in 0..all.len() {
                let h = dx_hash(&all[..len], algo, [1, 2, 3, 4]);
                assert_eq!(h.major & 1, 0);
                assert_ne!(h.major, HTREE_EOF_32BIT << 1);
            }
        }
        for len in 0..600 {
            let _ = xattr_entry_hash(&all[..len], &all[..len], false);
            let _ = xattr_entry_hash(&all[..len], &all[..len], true);
        }
    }

    #[test]
    fn versions_and_dir_flag() {
        for v in 0..=255u8 {
            match HashAlgo::from_version(v) {
                Some(a) => assert_eq!(a.version(), v),
                None => assert!(v > DX_HASH_TEA_UNSIGNED),
            }
        }
        assert_eq!(HashAlgo::from_version(DX_HASH_SIPHASH), None);
        assert_eq!(HashAlgo::for_dir(DX_HASH_LEGACY, false), Some(Legacy));
        assert_eq!(HashAlgo::for_dir(DX_HASH_HALF_MD4, false), Some(HalfMd4));
        assert_eq!(HashAlgo::for_dir(DX_HASH_TEA, false), Some(Tea));
        assert_eq!(HashAlgo::for_dir(DX_HASH_LEGACY, true), Some(LegacyUnsigned));
        assert_eq!(HashAlgo::for_dir(DX_HASH_HALF_MD4, true), Some(HalfMd4Unsigned));
        assert_eq!(HashAlgo::for_dir(DX_HASH_TEA, true), Some(TeaUnsigned));
        // Already-unsigned numbers are not shifted again.
        assert_eq!(HashAlgo::for_dir(DX_HASH_TEA_UNSIGNED, true), Some(TeaUnsigned));
        assert_eq!(HashAlgo::for_dir(DX_HASH_SIPHASH, true), None);
        assert_eq!(HashAlgo::for_dir(200, false), None);
    }

    #[test]
    fn dx_hash_orders_major_then_minor() {
        let a = DxHash { major: 2, minor: 9 };
        let b = DxHash { major: 4, minor: 0 };
        assert!(a < b);
        assert!(DxHash { major: 4, minor: 1 } > b);
    }

    /// Deterministic xattr values used when the vectors were made: byte i = i*7 + k*13 (mod 256).
    fn val(len: usize, k: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + k * 13) as u8).collect()
    }

    /// Written by Linux 6.18 (`mount -o loop` of `mkfs.ext4 -q -F -b 4096 -I 256 xa.img`, values
    /// set with Python `os.setxattr`, after a 60-byte `user.fill` that filled the inode body);
    /// `e_hash`/`h_hash` read from the raw xattr block at the inode's "File ACL"
    /// (`debugfs -R "stat /f1"`). Entries are in on-disk order; names are `e_name` (the
    /// `user.`/`trusted.` prefix is `e_name_index`, not hashed). (name, value len, k, e_hash).
    const KERNEL_BLOCK_F1: [(&[u8], usize, usize, u32); 5] = [
        (b"z", 3, 3, 0x004f2e27),
        (b"\xe9t\xe9", 301, 2, 0xb38fff59),
        (b"alpha", 300, 1, 0xe5a0a058),
        (b"empty", 0, 0, 0x06674ef9),
        (b"t\xff", 200, 4, 0x1e2ad0ed), // trusted.t\xff
    ];
    const KERNEL_BLOCK_F1_H_HASH: u32 = 0x4a65eb7a;

    #[test]
    fn xattr_hashes_match_the_kernel() {
        for (name, len, k, e_hash) in KERNEL_BLOCK_F1 {
            assert_eq!(xattr_entry_hash(name, &val(len, k), false), e_hash, "{name:02x?}");
        }
        assert_eq!(xattr_block_hash(KERNEL_BLOCK_F1.iter().map(|e| e.3)), KERNEL_BLOCK_F1_H_HASH);

        // Same image, a block holding a single entry `user.\x80\x81\xfe\xff` (1000 bytes):
        // h_hash is then the entry hash itself.
        let e = xattr_entry_hash(b"\x80\x81\xfe\xff", &val(1000, 5), false);
        assert_eq!(e, 0x9a08292d);
        assert_eq!(xattr_block_hash([e]), 0x9a08292d);

        // `mkfs.ext4 -O ea_inode` image, same kernel: `user.big\xe9` with a 10000-byte value
        // (k = 6) went to EA inode 13 whose i_atime (the value's crc32c hash, per
        // `debugfs -R "stat <13>"`) is 0x3aa6ec1f; `user.small` (100 bytes, k = 7) stayed in
        // the block.
        let big = xattr_entry_hash_ea_inode(b"big\xe9", 0x3aa6ec1f, false);
        assert_eq!(big, 0x92afec2f);
        let small = xattr_entry_hash(b"small", &val(100, 7), false);
        assert_eq!(small, 0xf985655c);
        assert_eq!(xattr_block_hash([big, small]), 0x15aaf7f3);
    }

    /// From libext2fs 1.47.0-2 (Debian), called through Python ctypes:
    /// `ext2fs_ext_attr_hash_entry` (unsigned, as today's kernel) and
    /// `ext2fs_ext_attr_hash_entry_signed` (the pre-6.2 x86 kernel formula), on an entry with
    /// `e_value_inum = 0` and the zero-padded value. (name, value len, k, unsigned, signed).
    /// The ea_inode row passes the 4-byte LE value hash as the value, which is the same
    /// formula the kernel applies to EA-inode entries.
    #[test]
    fn xattr_signed_variant_matches_libext2fs() {
        let rows: [(&[u8], usize, usize, u32, u32); 7] = [
            (b"\xe9t\xe9", 301, 2, 0xb38fff59, 0xb38c03a6),
            (b"t\xff", 200, 4, 0x1e2ad0ed, 0xe1d52fed),
            (b"\x80\x81\xfe\xff", 1000, 5, 0x9a08292d, 0x9a744a32),
            (b"s\xe9\xff", 700, 8, 0xc25321db, 0xdd4c21db),
            (b"caf\xc3\xa9", 0, 0, 0x060100c9, 0x06011fd6),
            (b"\xff\xff\xff\xff\xff\xff\xff\xff", 5, 10, 0xb80ef3d7, 0x8982970e),
            (b"plain", 333, 9, 0xe9f0992e, 0xe9f0992e),
        ];
        for (name, len, k, unsigned, signed) in rows {
            let v = val(len, k);
            assert_eq!(xattr_entry_hash(name, &v, false), unsigned, "{name:02x?}");
            assert_eq!(xattr_entry_hash(name, &v, true), signed, "{name:02x?}");
        }
        assert_eq!(xattr_entry_hash_ea_inode(b"big\xe9", 0x3aa6ec1f, true), 0x6daf13d0);
        // The ea_inode formula is the in-block one over a single LE word.
        assert_eq!(
            xattr_entry_hash_ea_inode(b"big\xe9", 0x3aa6ec1f, false),
            xattr_entry_hash(b"big\xe9", &0x3aa6ec1fu32.to_le_bytes(), false)
        );
    }

    /// `ext2fs_ext_attr_block_rehash` (libext2fs 1.47.0-2, via ctypes on hand-built blocks)
    /// gives 0 for any block with a zero entry hash, and 0 for an empty block.
    #[test]
    fn xattr_block_hash_zero_entry_disables_sharing() {
        assert_eq!(xattr_block_hash([0x1111_1111, 0, 0x2222_2222]), 0);
        assert_eq!(xattr_block_hash([0xdead_beef, 0xcafe_f00d, 0]), 0);
        assert_eq!(xattr_block_hash([0x1234_5678]), 0x1234_5678);
        assert_eq!(xattr_block_hash([]), 0);
    }
}
