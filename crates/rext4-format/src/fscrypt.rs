//! fscrypt's on-disk pieces as ext4 stores them: an encrypted inode's context (the xattr of
//! index 9 named `c`), the header of an encrypted symlink's target, and the limits of
//! encrypted names. The cryptography itself is the engine's (`rext4::crypto`).

/// Name of the context attribute in [`crate::xattr::INDEX_ENCRYPTION`].
pub const CONTEXT_XATTR_NAME: &[u8] = b"c";

/// Contents and names modes (`FSCRYPT_MODE_*`).
pub const MODE_AES_256_XTS: u8 = 1;
pub const MODE_AES_256_CTS: u8 = 4;
pub const MODE_AES_128_CBC: u8 = 5;
pub const MODE_AES_128_CTS: u8 = 6;
pub const MODE_SM4_XTS: u8 = 7;
pub const MODE_SM4_CTS: u8 = 8;
pub const MODE_ADIANTUM: u8 = 9;
pub const MODE_AES_256_HCTR2: u8 = 10;

/// Policy flags (`FSCRYPT_POLICY_FLAG*`): the low two bits choose the names' padding.
pub const FLAGS_PAD_MASK: u8 = 0x03;
pub const FLAG_DIRECT_KEY: u8 = 0x04;
pub const FLAG_IV_INO_LBLK_64: u8 = 0x08;
pub const FLAG_IV_INO_LBLK_32: u8 = 0x10;
const FLAGS_KNOWN: u8 = FLAGS_PAD_MASK | FLAG_DIRECT_KEY | FLAG_IV_INO_LBLK_64 | FLAG_IV_INO_LBLK_32;

/// Bytes of a context's nonce, and of the identifiers of v1 and v2 master keys.
pub const NONCE_SIZE: usize = 16;
pub const KEY_DESCRIPTOR_SIZE: usize = 8;
pub const KEY_IDENTIFIER_SIZE: usize = 16;

/// Encrypted names are padded to at least this many bytes (`FSCRYPT_FNAME_MIN_MSG_LEN`);
/// an entry with a shorter name is corrupt.
pub const NAME_MIN_LEN: usize = 16;

/// Which master key a policy names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeySpec {
    /// v1: an 8-byte descriptor chosen by whoever added the key.
    Descriptor([u8; KEY_DESCRIPTOR_SIZE]),
    /// v2: the 16-byte identifier derived from the key itself.
    Identifier([u8; KEY_IDENTIFIER_SIZE]),
}

/// An encrypted inode's context (`struct fscrypt_context_v1` / `_v2`): the policy it shares
/// with its directory, and the nonce its own keys are derived from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Context {
    pub contents_mode: u8,
    pub filenames_mode: u8,
    pub flags: u8,
    /// log2 of the contents' data unit in bytes; 0 for the filesystem's block (v2 only).
    pub log2_data_unit_size: u8,
    pub key: KeySpec,
    pub nonce: [u8; NONCE_SIZE],
}

/// Why a context cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextError {
    /// Not a context of any version this format knows (the kernel's `EINVAL` from
    /// `fscrypt_policy_from_context`: the inode is treated as having an unsupported policy).
    Malformed,
}

impl Context {
    /// Whether this is a v2 context (its key named by identifier).
    pub fn is_v2(&self) -> bool {
        matches!(self.key, KeySpec::Identifier(_))
    }

    /// Parses a context attribute's value. Sizes must be exact, as the kernel requires.
    pub fn parse(v: &[u8]) -> Result<Context, ContextError> {
        let (key, nonce_at, unit) = match (v.first(), v.len()) {
            (Some(1), 28) => {
                let mut d = [0u8; KEY_DESCRIPTOR_SIZE];
                d.copy_from_slice(&v[4..12]);
                (KeySpec::Descriptor(d), 12, 0)
            }
            (Some(2), 40) => {
                let mut id = [0u8; KEY_IDENTIFIER_SIZE];
                id.copy_from_slice(&v[8..24]);
                (KeySpec::Identifier(id), 24, v[4])
            }
            _ => return Err(ContextError::Malformed),
        };
        let mut nonce = [0u8; NONCE_SIZE];
        nonce.copy_from_slice(&v[nonce_at..nonce_at + NONCE_SIZE]);
        Ok(Context {
            contents_mode: v[1],
            filenames_mode: v[2],
            flags: v[3],
            log2_data_unit_size: unit,
            key,
            nonce,
        })
    }

    /// The attribute value of this context.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(40);
        match self.key {
            KeySpec::Descriptor(d) => {
                v.extend_from_slice(&[1, self.contents_mode, self.filenames_mode, self.flags]);
                v.extend_from_slice(&d);
            }
            KeySpec::Identifier(id) => {
                v.extend_from_slice(&[2, self.contents_mode, self.filenames_mode, self.flags]);
                v.extend_from_slice(&[self.log2_data_unit_size, 0, 0, 0]);
                v.extend_from_slice(&id);
            }
        }
        v.extend_from_slice(&self.nonce);
        v
    }

    /// Whether every flag is one the kernel defines.
    pub fn flags_known(&self) -> bool {
        self.flags & !FLAGS_KNOWN == 0
    }

    /// Whether `other` has the same policy (the kernel's `fscrypt_policies_equal`: all but
    /// the nonce), as a file must to be linked or renamed into a directory of this one.
    pub fn same_policy(&self, other: &Context) -> bool {
        (self.contents_mode, self.filenames_mode, self.flags, self.log2_data_unit_size, self.key)
            == (other.contents_mode, other.filenames_mode, other.flags, other.log2_data_unit_size, other.key)
    }

    /// The length `len` bytes take encrypted as a name (`__fscrypt_fname_encrypted_size`): at
    /// least 16 bytes, rounded up to the policy's padding, at most `max` (255 for a directory
    /// entry, the block less 3 bytes for a symlink target). `None` above `max`.
    pub fn encrypted_len(&self, len: usize, max: usize) -> Option<usize> {
        if len > max {
            return None;
        }
        let pad = 4usize << (self.flags & FLAGS_PAD_MASK);
        Some(len.max(NAME_MIN_LEN).next_multiple_of(pad).min(max))
    }
}

/// Bytes of the policy structures of `FS_IOC_SET_ENCRYPTION_POLICY` and
/// `FS_IOC_GET_ENCRYPTION_POLICY_EX` (`struct fscrypt_policy_v1` / `_v2`); their first byte is
/// the version, 0 for v1 and 2 for v2.
pub const POLICY_V1_SIZE: usize = 12;
pub const POLICY_V2_SIZE: usize = 24;
const POLICY_V1: u8 = 0;
const POLICY_V2: u8 = 2;

impl Context {
    /// The policy in `p` (its version's structure, maybe followed by other bytes) as a
    /// context with a zero nonce (`fscrypt_policy` from user space). `Malformed` for an
    /// unknown version or a short structure; [`Context::policy_valid`] checks the rest.
    pub fn from_policy(p: &[u8]) -> Result<Context, ContextError> {
        let (key, unit) = match (p.first(), p.len()) {
            (Some(&POLICY_V1), n) if n >= POLICY_V1_SIZE => {
                let mut d = [0u8; KEY_DESCRIPTOR_SIZE];
                d.copy_from_slice(&p[4..12]);
                (KeySpec::Descriptor(d), 0)
            }
            (Some(&POLICY_V2), n) if n >= POLICY_V2_SIZE => {
                // The three reserved bytes after the unit size must be zero.
                if p[5..8] != [0, 0, 0] {
                    return Err(ContextError::Malformed);
                }
                let mut id = [0u8; KEY_IDENTIFIER_SIZE];
                id.copy_from_slice(&p[8..24]);
                (KeySpec::Identifier(id), p[4])
            }
            _ => return Err(ContextError::Malformed),
        };
        Ok(Context {
            contents_mode: p[1],
            filenames_mode: p[2],
            flags: p[3],
            log2_data_unit_size: unit,
            key,
            nonce: [0; NONCE_SIZE],
        })
    }

    /// This context's policy as user space sees it (`fscrypt_policy_from_context`).
    pub fn to_policy(&self) -> Vec<u8> {
        match self.key {
            KeySpec::Descriptor(d) => {
                [&[POLICY_V1, self.contents_mode, self.filenames_mode, self.flags][..], &d].concat()
            }
            KeySpec::Identifier(id) => {
                let head = [POLICY_V2, self.contents_mode, self.filenames_mode, self.flags];
                [&head[..], &[self.log2_data_unit_size, 0, 0, 0], &id].concat()
            }
        }
    }

    /// Whether this policy is one the kernel accepts on a filesystem of `block_bits`
    /// (`fscrypt_supported_policy` for ext4, whose inode numbers and logical blocks fit 32
    /// bits): a valid pair of modes for its version, known flags, at most one of the IV and
    /// key flags (direct keys only where both modes are Adiantum's), and a data unit of 512
    /// bytes to the block (v2 only, not with `IV_INO_LBLK_32`).
    pub fn policy_valid(&self, block_bits: u32) -> bool {
        let v2 = matches!(self.key, KeySpec::Identifier(_));
        let modes = (self.contents_mode, self.filenames_mode);
        let modes_ok = matches!(
            modes,
            (MODE_AES_256_XTS, MODE_AES_256_CTS)
                | (MODE_AES_128_CBC, MODE_AES_128_CTS)
                | (MODE_ADIANTUM, MODE_ADIANTUM)
        ) || (v2
            && matches!(modes, (MODE_AES_256_XTS, MODE_AES_256_HCTR2) | (MODE_SM4_XTS, MODE_SM4_CTS)));
        let allowed = if v2 { FLAGS_KNOWN } else { FLAGS_PAD_MASK | FLAG_DIRECT_KEY };
        let one_of =
            (self.flags & (FLAG_DIRECT_KEY | FLAG_IV_INO_LBLK_64 | FLAG_IV_INO_LBLK_32)).count_ones();
        let direct_ok = self.flags & FLAG_DIRECT_KEY == 0 || modes == (MODE_ADIANTUM, MODE_ADIANTUM);
        let unit = u32::from(self.log2_data_unit_size);
        let unit_ok =
            unit == 0 || ((9..=block_bits).contains(&unit) && self.flags & FLAG_IV_INO_LBLK_32 == 0);
        modes_ok && self.flags & !allowed == 0 && one_of <= 1 && direct_ok && unit_ok
    }
}

/// An encrypted symlink's stored target (`struct fscrypt_symlink_data`): a little-endian
/// length, then that many bytes of ciphertext. `None` if the header names more than is there
/// or fewer than an encrypted name's minimum.
pub fn symlink_ciphertext(stored: &[u8]) -> Option<&[u8]> {
    let len = usize::from(u16::from_le_bytes([*stored.first()?, *stored.get(1)?]));
    if len < NAME_MIN_LEN {
        return None;
    }
    stored.get(2..2 + len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_round_trip_and_sizes_are_exact() {
        let mut v2 = vec![2, 1, 4, 2, 0, 0, 0, 0];
        v2.extend(1..=16u8);
        v2.extend(101..=116u8);
        let c = Context::parse(&v2).unwrap();
        assert_eq!((c.contents_mode, c.filenames_mode, c.flags), (1, 4, 2));
        assert_eq!(c.key, KeySpec::Identifier(v2[8..24].try_into().unwrap()));
        assert_eq!(v2[8], 1);
        assert_eq!(c.nonce[0], 101);
        assert_eq!(c.to_bytes(), v2);
        assert_eq!(Context::parse(&v2[..39]), Err(ContextError::Malformed));
        let mut v1 = vec![1, 1, 4, 0];
        v1.extend([9u8; 8]);
        v1.extend([7u8; 16]);
        let c1 = Context::parse(&v1).unwrap();
        assert_eq!(c1.key, KeySpec::Descriptor([9; 8]));
        assert_eq!(c1.to_bytes(), v1);
        v1[0] = 3;
        assert_eq!(Context::parse(&v1), Err(ContextError::Malformed));
        assert_eq!(Context::parse(&[]), Err(ContextError::Malformed));
    }

    #[test]
    fn policies_convert_and_are_checked_as_the_kernel_checks_them() {
        let v2 = [&[2u8, 1, 4, 3, 0, 0, 0, 0][..], &[7; 16]].concat();
        let c = Context::from_policy(&v2).unwrap();
        assert_eq!(
            (c.contents_mode, c.filenames_mode, c.flags, c.key),
            (1, 4, 3, KeySpec::Identifier([7; 16]))
        );
        assert_eq!(c.to_policy(), v2);
        assert!(c.policy_valid(12));
        let v1 = [&[0u8, 1, 4, 0][..], &[9; 8]].concat();
        let c1 = Context::from_policy(&v1).unwrap();
        assert_eq!(c1.key, KeySpec::Descriptor([9; 8]));
        assert_eq!(c1.to_policy(), v1);
        assert!(c1.policy_valid(12));
        // Unknown versions, short structures and reserved bytes.
        assert!(Context::from_policy(&[1u8; 24]).is_err());
        assert!(Context::from_policy(&v2[..23]).is_err());
        let mut r = v2.clone();
        r[6] = 1;
        assert!(Context::from_policy(&r).is_err());
        let check = |c: &Context, f: &dyn Fn(&mut Context)| {
            let mut c = c.clone();
            f(&mut c);
            c.policy_valid(12)
        };
        assert!(!check(&c, &|c| c.filenames_mode = MODE_AES_128_CTS));
        assert!(check(&c, &|c| c.filenames_mode = MODE_AES_256_HCTR2));
        assert!(!check(&c1, &|c| c.filenames_mode = MODE_AES_256_HCTR2));
        assert!(!check(&c, &|c| c.flags = 0x20));
        assert!(!check(&c1, &|c| c.flags = FLAG_IV_INO_LBLK_64));
        assert!(!check(&c, &|c| c.flags = FLAG_IV_INO_LBLK_64 | FLAG_IV_INO_LBLK_32));
        assert!(!check(&c, &|c| c.flags = FLAG_DIRECT_KEY));
        assert!(check(&c, &|c| {
            c.flags = FLAG_DIRECT_KEY;
            (c.contents_mode, c.filenames_mode) = (MODE_ADIANTUM, MODE_ADIANTUM);
        }));
        assert!(check(&c, &|c| c.log2_data_unit_size = 9));
        assert!(!check(&c, &|c| c.log2_data_unit_size = 13));
        assert!(!check(&c, &|c| c.log2_data_unit_size = 8));
        assert!(!check(&c, &|c| {
            c.log2_data_unit_size = 10;
            c.flags = FLAG_IV_INO_LBLK_32;
        }));
    }

    #[test]
    fn encrypted_name_lengths_pad_as_the_kernel() {
        let mut c = Context::parse(&[&[2u8, 1, 4, 0, 0, 0, 0, 0][..], &[0; 32]].concat()).unwrap();
        assert_eq!(c.encrypted_len(1, 255), Some(16));
        assert_eq!(c.encrypted_len(17, 255), Some(20));
        c.flags = 3;
        assert_eq!(c.encrypted_len(17, 255), Some(32));
        assert_eq!(c.encrypted_len(250, 255), Some(255));
        assert_eq!(c.encrypted_len(256, 255), None);
        assert_eq!(c.encrypted_len(4090, 4093), Some(4093));
        assert_eq!(c.encrypted_len(4094, 4093), None);
    }

    #[test]
    fn symlink_headers_are_checked() {
        assert_eq!(symlink_ciphertext(&[16, 0]), None);
        let mut s = vec![16, 0];
        s.extend([5u8; 16]);
        assert_eq!(symlink_ciphertext(&s), Some(&[5u8; 16][..]));
        s[0] = 17;
        assert_eq!(symlink_ciphertext(&s), None);
        assert_eq!(symlink_ciphertext(&[3, 0, 1]), None);
    }
}
