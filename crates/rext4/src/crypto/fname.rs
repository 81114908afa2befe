//! Encrypted names (the kernel's `fs/crypto/fname.c` and `hooks.c`): names and symlink
//! targets are AES-256-CBC with ciphertext stealing (the kernel's `cts(cbc(aes))`, CS3: the
//! last two blocks swapped), zero-padded to at least 16 bytes and a multiple of the policy's
//! padding, with the IV of index 0.
//!
//! Without the key a name is shown as a no-key name: base64url (no padding) of the entry's
//! dirhash (major, minor; zeros outside hash-order listings) and its ciphertext, or, for
//! ciphertexts over 149 bytes, of the first 149 bytes and the SHA-256 of the rest. Asked for
//! such a name, a lookup decodes it back: a whole ciphertext is the on-disk name; an
//! abbreviated one is found among the entries of its hash.

use super::{InodeCrypt, NamesCipher};
use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use aes::cipher::{BlockDecrypt, BlockEncrypt};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use rext4_format::inode::ENCRYPT_FL;
use sha2::{Digest, Sha256};
use std::borrow::Cow;

/// Ciphertext bytes a no-key name carries whole (`fscrypt_nokey_name.bytes`).
const NOKEY_BYTES: usize = 149;
/// The dirhash words before them.
const NOKEY_HASH: usize = 8;
/// A no-key name with a digest: hash, 149 bytes, SHA-256 (`FSCRYPT_NOKEY_NAME_MAX`).
const NOKEY_MAX: usize = NOKEY_HASH + NOKEY_BYTES + 32;

const BLOCK: usize = 16;

impl NamesCipher {
    /// CBC-CS3 encryption in place with IV `iv` (at least 16 bytes).
    pub(crate) fn encrypt(&self, iv: [u8; 16], data: &mut [u8]) {
        let n = data.len();
        // Names are padded to a block at least; nothing shorter is ever asked for.
        if n < BLOCK {
            return;
        }
        let k = n.div_ceil(BLOCK);
        let mut prev = iv;
        let cbc = |prev: &[u8; 16], blk: &[u8]| {
            let mut b = aes::Block::default();
            for i in 0..BLOCK {
                b[i] = prev[i] ^ blk.get(i).copied().unwrap_or(0);
            }
            self.aes.encrypt_block(&mut b);
            <[u8; 16]>::from(b)
        };
        if k == 1 {
            data.copy_from_slice(&cbc(&prev, data));
            return;
        }
        for i in 0..k - 2 {
            let c = cbc(&prev, &data[i * BLOCK..(i + 1) * BLOCK]);
            data[i * BLOCK..(i + 1) * BLOCK].copy_from_slice(&c);
            prev = c;
        }
        let at = (k - 2) * BLOCK;
        let tail = n - at - BLOCK;
        let x = cbc(&prev, &data[at..at + BLOCK]);
        let y = cbc(&x, &data[at + BLOCK..]);
        data[at..at + BLOCK].copy_from_slice(&y);
        data[at + BLOCK..].copy_from_slice(&x[..tail]);
    }

    /// CBC-CS3 decryption in place (the inverse of [`NamesCipher::encrypt`]).
    pub(crate) fn decrypt(&self, iv: [u8; 16], data: &mut [u8]) {
        let n = data.len();
        // Callers refuse shorter ciphertexts as damage before they get here.
        if n < BLOCK {
            return;
        }
        let k = n.div_ceil(BLOCK);
        let dec = |blk: &[u8]| {
            let mut b = aes::Block::clone_from_slice(blk);
            self.aes.decrypt_block(&mut b);
            <[u8; 16]>::from(b)
        };
        let mut prev = iv;
        for i in 0..k.saturating_sub(2) {
            let c: [u8; 16] = data[i * BLOCK..(i + 1) * BLOCK].try_into().unwrap_or_default();
            let d = dec(&c);
            for j in 0..BLOCK {
                data[i * BLOCK + j] = d[j] ^ prev[j];
            }
            prev = c;
        }
        if k == 1 {
            let d = dec(data);
            for j in 0..BLOCK {
                data[j] = d[j] ^ prev[j];
            }
            return;
        }
        let at = (k - 2) * BLOCK;
        let tail = n - at - BLOCK;
        // Stored: Y (the last plaintext block's encryption), then the first `tail` bytes of X
        // (the one before it's); the rest of X is what decrypting Y leaves past `tail`.
        let y: [u8; 16] = data[at..at + BLOCK].try_into().unwrap_or_default();
        let d = dec(&y);
        let mut x = d;
        x[..tail].copy_from_slice(&data[at + BLOCK..]);
        for j in 0..tail {
            data[at + BLOCK + j] = d[j] ^ x[j];
        }
        let p = dec(&x);
        for j in 0..BLOCK {
            data[at + j] = p[j] ^ prev[j];
        }
    }
}

/// The IV of a name or symlink target (index 0).
fn name_iv(c: &InodeCrypt) -> [u8; 16] {
    u128::from(c.iv_index(0)).to_le_bytes()
}

impl InodeCrypt {
    /// `plain` encrypted as a name (or symlink target) with this inode's key: zero-padded
    /// as its policy says, up to `max` bytes. `ENOKEY` without the key, `ENAMETOOLONG` past
    /// `max`.
    pub(crate) fn encrypt_name(&self, plain: &[u8], max: usize) -> Result<Vec<u8>> {
        let (Some(names), Some(ctx)) = (&self.names, &self.ctx) else { return Err(Error::NoKey) };
        let len = ctx.encrypted_len(plain.len(), max).ok_or(Error::NameTooLong)?;
        let mut v = plain.to_vec();
        v.resize(len, 0);
        names.encrypt(name_iv(self), &mut v);
        Ok(v)
    }

    /// Ciphertext `ct` decrypted with this inode's key, up to its first NUL (the padding);
    /// `None` without the key.
    pub(crate) fn decrypt_name(&self, ct: &[u8]) -> Option<Vec<u8>> {
        let names = self.names.as_ref()?;
        let mut v = ct.to_vec();
        names.decrypt(name_iv(self), &mut v);
        let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
        v.truncate(end);
        Some(v)
    }
}

/// A no-key name for ciphertext `ct` with dirhash `(major, minor)`.
pub(crate) fn nokey_name(major: u32, minor: u32, ct: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(NOKEY_MAX);
    raw.extend_from_slice(&major.to_le_bytes());
    raw.extend_from_slice(&minor.to_le_bytes());
    if ct.len() <= NOKEY_BYTES {
        raw.extend_from_slice(ct);
    } else {
        raw.extend_from_slice(&ct[..NOKEY_BYTES]);
        raw.extend_from_slice(&Sha256::digest(&ct[NOKEY_BYTES..]));
    }
    URL_SAFE_NO_PAD.encode(raw).into_bytes()
}

/// A decoded no-key name.
pub(crate) enum NoKey {
    /// The whole ciphertext: the on-disk name.
    Whole(Vec<u8>),
    /// An abbreviated one: its dirhash, first bytes and the digest of the rest.
    Digest { major: u32, minor: u32, head: Vec<u8>, sha: [u8; 32] },
}

impl NoKey {
    /// Decodes `name`; `None` for anything no listing shows (`ENOENT` for a lookup).
    pub(crate) fn decode(name: &[u8]) -> Option<NoKey> {
        if name.len() > NOKEY_MAX.div_ceil(3) * 4 {
            return None;
        }
        let raw = URL_SAFE_NO_PAD.decode(name).ok()?;
        // The kernel's decoder takes exactly its own encodings: re-encoding must give the name.
        if URL_SAFE_NO_PAD.encode(&raw).as_bytes() != name {
            return None;
        }
        if raw.len() < NOKEY_HASH + 1 || (raw.len() > NOKEY_HASH + NOKEY_BYTES && raw.len() != NOKEY_MAX) {
            return None;
        }
        if raw.len() != NOKEY_MAX {
            return Some(NoKey::Whole(raw[NOKEY_HASH..].to_vec()));
        }
        let word = |i: usize| u32::from_le_bytes([raw[i], raw[i + 1], raw[i + 2], raw[i + 3]]);
        let head = raw[NOKEY_HASH..NOKEY_HASH + NOKEY_BYTES].to_vec();
        let mut sha = [0u8; 32];
        sha.copy_from_slice(&raw[NOKEY_HASH + NOKEY_BYTES..]);
        Some(NoKey::Digest { major: word(0), minor: word(4), head, sha })
    }

    /// Whether an abbreviated name is entry `de` (`fscrypt_match_name`).
    fn matches(head: &[u8], sha: &[u8; 32], de: &[u8]) -> bool {
        de.len() > NOKEY_BYTES
            && de[..NOKEY_BYTES] == *head
            && Sha256::digest(&de[NOKEY_BYTES..])[..] == sha[..]
    }
}

/// What a name operation on an encrypted directory needs (`fscrypt_setup_filename`'s
/// `lookup` argument).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameUse {
    /// Finding an entry, to look it up or remove it: works without the key.
    Find,
    /// Making or renaming to a name: needs the key (`ENOKEY`).
    Make,
}

impl FsInner {
    /// The on-disk form of `name` in `dir` (crypto/mod.rs, invariant 1): the name itself
    /// outside encrypted directories and for `.` and `..`; else the ciphertext, from the
    /// key or from a no-key name.
    pub(crate) fn disk_name<'a>(&self, dir: &Inode, name: &'a [u8], want: NameUse) -> Result<Cow<'a, [u8]>> {
        if dir.flags() & ENCRYPT_FL == 0 || name == b"." || name == b".." {
            return Ok(Cow::Borrowed(name));
        }
        let crypt = self.inode_crypt(dir)?;
        if crypt.has_key() {
            // In a casefolded directory another case of a name is that name: the entry
            // found by its folded form (crypto/dirhash.rs).
            if want == NameUse::Find && self.hash_in_dirent(dir) {
                return self.find_hashed(dir, &crypt, name).map(Cow::Owned);
            }
            return crypt.encrypt_name(name, 255).map(Cow::Owned);
        }
        if want == NameUse::Make {
            return Err(Error::NoKey);
        }
        match NoKey::decode(name) {
            Some(NoKey::Whole(ct)) => Ok(Cow::Owned(ct)),
            Some(NoKey::Digest { major, minor, head, sha }) => {
                self.find_digested(dir, major, minor, &head, &sha).map(Cow::Owned)
            }
            None => Err(Error::NotFound),
        }
    }

    /// The entry an abbreviated no-key name stands for: searched from its hash's position
    /// in a hash-order directory, else through every entry.
    fn find_digested(
        &self,
        dir: &Inode,
        major: u32,
        minor: u32,
        head: &[u8],
        sha: &[u8; 32],
    ) -> Result<Vec<u8>> {
        self.find_at_hash(dir, (major != 0).then_some((major, minor)), |de| NoKey::matches(head, sha, de))
    }

    /// The on-disk name of the first entry of `dir` that `matches`: searched among the
    /// entries of hash `hash` where the listing is in hash order, else through every entry.
    /// `ENOENT` if none.
    pub(crate) fn find_at_hash(
        &self,
        dir: &Inode,
        hash: Option<(u32, u32)>,
        mut matches: impl FnMut(&[u8]) -> bool,
    ) -> Result<Vec<u8>> {
        let at = hash.filter(|_| self.hash_order_readdir(dir));
        let start = at.map_or(0, |(major, minor)| crate::dir::dx_readdir::hash_pos(major, minor));
        let mut found = None;
        self.readdir(dir, start, |e| {
            if matches(&e.name) {
                found = Some(e.name);
                return false;
            }
            // Past the hash's entries (each reports its position, or the next, as `next`).
            at.is_none() || e.next <= start + 1
        })?;
        found.ok_or(Error::NotFound)
    }

    /// How entry `de` of encrypted directory `dir` is shown: decrypted with the key, else as
    /// a no-key name carrying `(major, minor)`. `.` and `..` are not encrypted.
    pub(crate) fn present_name(
        &self,
        crypt: &InodeCrypt,
        major: u32,
        minor: u32,
        de: &[u8],
    ) -> Result<Vec<u8>> {
        if de == b"." || de == b".." {
            return Ok(de.to_vec());
        }
        if de.len() < rext4_format::fscrypt::NAME_MIN_LEN {
            return corrupt(CorruptKind::DirEntry {
                ino: rext4_format::InodeNo(crypt.ino),
                block: None,
                what: "encrypted name shorter than 16 bytes",
            });
        }
        Ok(crypt.decrypt_name(de).unwrap_or_else(|| nokey_name(major, minor, de)))
    }

    /// The target of encrypted symlink `inode` from its stored bytes (`fscrypt_get_symlink`).
    pub(crate) fn present_symlink(&self, inode: &Inode, stored: &[u8]) -> Result<Vec<u8>> {
        let crypt = self.inode_crypt(inode)?;
        let bad = |what| corrupt(CorruptKind::Symlink { ino: inode.ino, what });
        let Some(ct) = rext4_format::fscrypt::symlink_ciphertext(stored) else {
            return bad("encrypted target header");
        };
        let Some(v) = crypt.decrypt_name(ct) else { return Ok(nokey_name(0, 0, ct)) };
        if v.is_empty() {
            return bad("empty decrypted target");
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aes::cipher::KeyInit;

    fn cipher() -> NamesCipher {
        NamesCipher { aes: aes::Aes256::new_from_slice(&[7u8; 32]).unwrap() }
    }

    #[test]
    fn cts_round_trips_every_length_and_differs_from_cbc_only_at_the_end() {
        let c = cipher();
        for n in 16u8..=80 {
            let p: Vec<u8> = (0..n).collect();
            let mut v = p.clone();
            c.encrypt([1; 16], &mut v);
            assert_ne!(v, p);
            c.decrypt([1; 16], &mut v);
            assert_eq!(v, p, "length {n}");
        }
        // Two full blocks: CS3 swaps them relative to plain CBC.
        let mut v = [3u8; 32];
        c.encrypt([0; 16], &mut v);
        let mut b1 = aes::Block::clone_from_slice(&[3u8; 16]);
        c.aes.encrypt_block(&mut b1);
        assert_eq!(&v[16..], &b1[..]);
    }

    #[test]
    fn nokey_names_decode_to_what_they_encode() {
        let short = nokey_name(6, 9, &[0xAB; 32]);
        assert!(matches!(NoKey::decode(&short), Some(NoKey::Whole(v)) if v == [0xAB; 32]));
        let long_ct = [0x5A; 200];
        let long = nokey_name(0x1234, 5, &long_ct);
        assert_eq!(long.len(), 252);
        match NoKey::decode(&long) {
            Some(NoKey::Digest { major, minor, head, sha }) => {
                assert_eq!((major, minor), (0x1234, 5));
                assert!(NoKey::matches(&head, &sha, &long_ct));
                assert!(!NoKey::matches(&head, &sha, &[0x5A; 201]));
            }
            _ => panic!("digest form expected"),
        }
        for bad in [&b"a+b"[..], b"AAAA", b"", b"AAAAAAAAAAAAA=", b"AAAAAAAAAAAAAB"] {
            assert!(NoKey::decode(bad).is_none(), "{bad:?}");
        }
    }
}
