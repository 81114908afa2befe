//! Master keys and the keys derived from them (the kernel's `fs/crypto/keysetup.c`,
//! `keysetup_v1.c` and `hkdf.c`).
//!
//! - v2 policies name a master key by its identifier, HKDF-SHA512 of the key (no salt) with
//!   the info `"fscrypt\0"`, context byte 1; a file's key is the same HKDF with context 2
//!   and the file's nonce; with `IV_INO_LBLK_64`, one key per mode (context 4, the mode number
//!   and the filesystem's UUID) and the inode number in the IV.
//! - v1 policies name it by a descriptor its user chose; a file's key is the master key
//!   encrypted with AES-128-ECB under the file's nonce.

use super::{ContentsCipher, NamesCipher};
use crate::error::{Error, Result};
use crate::sync::RwLock;
use aes::cipher::{BlockEncrypt, KeyInit};
use hkdf::Hkdf;
use rext4_format::fscrypt::{
    Context, KeySpec, FLAG_DIRECT_KEY, FLAG_IV_INO_LBLK_32, FLAG_IV_INO_LBLK_64, KEY_DESCRIPTOR_SIZE,
    KEY_IDENTIFIER_SIZE, MODE_AES_256_CTS, MODE_AES_256_XTS,
};
use sha2::Sha512;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use zeroize::Zeroizing;

const HKDF_CONTEXT_KEY_IDENTIFIER: u8 = 1;
const HKDF_CONTEXT_PER_FILE_ENC_KEY: u8 = 2;
const HKDF_CONTEXT_IV_INO_LBLK_64_KEY: u8 = 4;
const HKDF_CONTEXT_DIRHASH_KEY: u8 = 5;

/// Master keys are 16 to 64 bytes (`FSCRYPT_MIN_KEY_SIZE`, `FSCRYPT_MAX_KEY_SIZE`).
const MIN_KEY: usize = 16;
const MAX_KEY: usize = 64;

/// A master key given to [`crate::Options::encryption_keys`]: what `fscrypt add_key` or
/// `fscryptctl add_key` hands the kernel. Its bytes are never shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct EncryptionKey {
    /// Wiped when dropped, as every copy of a key's bytes here is.
    raw: Zeroizing<Vec<u8>>,
    spec: KeySpec,
}

impl EncryptionKey {
    /// A key for v2 policies (the default of `fscrypt` and `fscryptctl`), 16 to 64 bytes;
    /// found by its identifier.
    pub fn new(raw: Vec<u8>) -> Result<EncryptionKey> {
        let raw = Zeroizing::new(raw);
        check_size(&raw)?;
        let id = identifier(&raw);
        Ok(EncryptionKey { raw, spec: KeySpec::Identifier(id) })
    }

    /// A key for v1 policies, which name it by an 8-byte descriptor of the user's choosing.
    pub fn v1(descriptor: [u8; KEY_DESCRIPTOR_SIZE], raw: Vec<u8>) -> Result<EncryptionKey> {
        let raw = Zeroizing::new(raw);
        check_size(&raw)?;
        Ok(EncryptionKey { raw, spec: KeySpec::Descriptor(descriptor) })
    }

    /// A key from a file of its raw bytes (what `fscryptctl add_key` reads), for v2 policies;
    /// or, with `v1_descriptor` (16 hex digits), for v1 policies naming that descriptor.
    pub fn from_file(path: &std::path::Path, v1_descriptor: Option<&str>) -> Result<EncryptionKey> {
        let raw = std::fs::read(path)?;
        match v1_descriptor {
            None => EncryptionKey::new(raw),
            Some(hex) => {
                let bad = || Error::InvalidInput("a v1 key descriptor is 16 hex digits");
                if hex.len() != 2 * KEY_DESCRIPTOR_SIZE || !hex.is_ascii() {
                    return Err(bad());
                }
                let mut d = [0u8; KEY_DESCRIPTOR_SIZE];
                for (i, b) in d.iter_mut().enumerate() {
                    *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
                }
                EncryptionKey::v1(d, raw)
            }
        }
    }

    /// The key's bytes, to hand to a mounted filesystem (`rext4 key add`).
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }

    /// How policies name this key: its identifier (v2) or descriptor (v1).
    pub fn spec(&self) -> KeySpec {
        self.spec
    }

    /// The identifier (v2) or descriptor (v1) policies name this key by, in hex, as
    /// `fscryptctl get_policy` prints it.
    pub fn id_hex(&self) -> String {
        let b: &[u8] = match &self.spec {
            KeySpec::Identifier(id) => id,
            KeySpec::Descriptor(d) => d,
        };
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}

impl std::fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EncryptionKey({})", self.id_hex())
    }
}

fn check_size(raw: &[u8]) -> Result<()> {
    if !(MIN_KEY..=MAX_KEY).contains(&raw.len()) {
        return Err(Error::InvalidInput("an encryption key has 16 to 64 bytes"));
    }
    Ok(())
}

/// HKDF-SHA512 output for `context` and `info` (`fscrypt_hkdf_expand`).
fn hkdf_expand(raw: &[u8], context: u8, info: &[&[u8]], out: &mut [u8]) {
    let hk = Hkdf::<Sha512>::new(None, raw);
    let mut parts: Vec<&[u8]> = vec![b"fscrypt\0", std::slice::from_ref(&context)];
    parts.extend_from_slice(info);
    // Cannot fail: outputs here are at most 64 bytes, far under HKDF's 255 * 64.
    hk.expand_multi_info(&parts, out).expect("HKDF output within its limit");
}

/// A v2 master key's identifier.
fn identifier(raw: &[u8]) -> [u8; KEY_IDENTIFIER_SIZE] {
    let mut id = [0u8; KEY_IDENTIFIER_SIZE];
    hkdf_expand(raw, HKDF_CONTEXT_KEY_IDENTIFIER, &[], &mut id);
    id
}

/// A master key on the keyring and who added it.
struct MasterKey {
    /// Wiped when the last holder drops it (its removal, or a derivation that read it).
    raw: Arc<Zeroizing<Vec<u8>>>,
    /// The users who added it (the kernel's `mk_users`): v2 keys added through
    /// [`crate::Fs::add_encryption_key`]. v1 keys belong to no user.
    users: BTreeSet<u32>,
    /// Given at open ([`crate::Options::encryption_keys`]): users' claims come and go, the
    /// key stays until a removal for all users.
    pinned: bool,
}

/// The master keys of an open filesystem: those given at open, and those added and removed
/// since (the kernel's per-filesystem keyring, `fs/crypto/keyring.c`).
#[derive(Default)]
pub(crate) struct Keyring {
    /// [own lock] Read to derive a file's keys, written to add or remove a key.
    keys: RwLock<HashMap<KeySpec, MasterKey>>,
    /// [atomic] Bumped whenever a key comes or goes, after the map changed: an inode's keys
    /// derived at an older generation are derived again (crypto/mod.rs, invariant 3).
    generation: AtomicU64,
}

/// What a policy needs that this engine does not do; such files are shown as without
/// their key (as the kernel shows files whose policy it does not support to `lookup`).
pub(crate) fn policy_supported(ctx: &Context) -> bool {
    ctx.flags_known()
        && ctx.contents_mode == MODE_AES_256_XTS
        && ctx.filenames_mode == MODE_AES_256_CTS
        && ctx.flags & (FLAG_DIRECT_KEY | FLAG_IV_INO_LBLK_32) == 0
        && (ctx.flags & FLAG_IV_INO_LBLK_64 == 0 || matches!(ctx.key, KeySpec::Identifier(_)))
        && (ctx.log2_data_unit_size == 0 || (9..=16).contains(&ctx.log2_data_unit_size))
        && (ctx.log2_data_unit_size == 0 || matches!(ctx.key, KeySpec::Identifier(_)))
}

impl Keyring {
    pub(crate) fn new(keys: &[EncryptionKey]) -> Keyring {
        let keys = keys
            .iter()
            .map(|k| {
                let mk = MasterKey { raw: Arc::new(k.raw.clone()), users: BTreeSet::new(), pinned: true };
                (k.spec, mk)
            })
            .collect();
        Keyring { keys: RwLock::new(keys), generation: AtomicU64::new(0) }
    }

    /// Whether the master key `spec` names is here.
    pub(crate) fn has(&self, spec: &KeySpec) -> bool {
        self.keys.read().contains_key(spec)
    }

    /// The generation keys derived now belong to (read before deriving them, so that a key
    /// added or removed meanwhile makes them stale).
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn changed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Adds `key` for `user` (`None`: nobody's, as v1 keys are). Whether it is new here.
    pub(crate) fn add(&self, key: &EncryptionKey, user: Option<u32>) -> bool {
        let mut keys = self.keys.write();
        let added = match keys.get_mut(&key.spec) {
            Some(mk) => {
                mk.users.extend(user);
                false
            }
            None => {
                let users = user.into_iter().collect();
                keys.insert(key.spec, MasterKey { raw: Arc::new(key.raw.clone()), users, pinned: false });
                true
            }
        };
        drop(keys);
        if added {
            self.changed();
        }
        added
    }

    /// Takes `user`'s claim on the key `spec` names, or with `None` every claim and the key
    /// (`FS_IOC_REMOVE_ENCRYPTION_KEY` and its `_ALL_USERS` form). `ENOKEY` if it is not here
    /// or `user` never added it; `Ok(true)` if it stays (other users hold it, or it was
    /// given at open).
    pub(crate) fn remove(&self, spec: &KeySpec, user: Option<u32>) -> Result<bool> {
        let mut keys = self.keys.write();
        let mk = keys.get_mut(spec).ok_or(Error::NoKey)?;
        if let Some(uid) = user {
            if !mk.users.remove(&uid) {
                return Err(Error::NoKey);
            }
            if !mk.users.is_empty() || mk.pinned {
                return Ok(true);
            }
        }
        keys.remove(spec);
        drop(keys);
        self.changed();
        Ok(false)
    }

    /// Whether the key `spec` names is here, and the users who added it.
    pub(crate) fn status(&self, spec: &KeySpec) -> Option<Vec<u32>> {
        self.keys.read().get(spec).map(|mk| mk.users.iter().copied().collect())
    }

    /// The key of one file of policy `ctx`, if its master key was given: its size is the
    /// mode's (64 bytes for AES-256-XTS contents, 32 for AES-256-CTS names).
    fn file_key(&self, ctx: &Context, uuid: &[u8; 16], mode: u8, size: usize) -> Option<Zeroizing<Vec<u8>>> {
        let raw = self.keys.read().get(&ctx.key)?.raw.clone();
        let mut key = Zeroizing::new(vec![0u8; size]);
        match ctx.key {
            KeySpec::Identifier(_) if ctx.flags & FLAG_IV_INO_LBLK_64 != 0 => {
                hkdf_expand(&raw, HKDF_CONTEXT_IV_INO_LBLK_64_KEY, &[&[mode], uuid], &mut key);
            }
            KeySpec::Identifier(_) => {
                hkdf_expand(&raw, HKDF_CONTEXT_PER_FILE_ENC_KEY, &[&ctx.nonce], &mut key)
            }
            KeySpec::Descriptor(_) => {
                // The master key must hold the whole derived key (`find_and_lock_process_key`).
                if raw.len() < size {
                    return None;
                }
                let ecb = aes::Aes128::new(&ctx.nonce.into());
                for (out, chunk) in key.chunks_exact_mut(16).zip(raw.chunks_exact(16)) {
                    let mut b = aes::Block::clone_from_slice(chunk);
                    ecb.encrypt_block(&mut b);
                    out.copy_from_slice(&b);
                }
            }
        }
        Some(key)
    }

    /// The SipHash key of a casefolded directory of v2 policy `ctx` (HKDF with context 5 and
    /// the directory's nonce, `fscrypt_derive_dirhash_key`), if its master key is here; v1
    /// policies have none (the kernel refuses them on casefolded directories).
    pub(crate) fn dirhash_key(&self, ctx: &Context) -> Option<Zeroizing<[u8; 16]>> {
        if !ctx.is_v2() {
            return None;
        }
        let raw = self.keys.read().get(&ctx.key)?.raw.clone();
        let mut key = Zeroizing::new([0u8; 16]);
        hkdf_expand(&raw, HKDF_CONTEXT_DIRHASH_KEY, &[&ctx.nonce], &mut key[..]);
        Some(key)
    }

    /// A directory's or symlink's names cipher.
    pub(crate) fn names_cipher(&self, ctx: &Context, uuid: &[u8; 16]) -> Option<NamesCipher> {
        let key = self.file_key(ctx, uuid, ctx.filenames_mode, 32)?;
        Some(NamesCipher::new(&key))
    }

    /// A regular file's contents cipher.
    pub(crate) fn contents_cipher(&self, ctx: &Context, uuid: &[u8; 16]) -> Option<ContentsCipher> {
        let key = self.file_key(ctx, uuid, ctx.contents_mode, 64)?;
        Some(ContentsCipher::new(&key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The identifier of a known key, as `fscryptctl add_key` prints it for 64 bytes 0..63
    /// (checked against the kernel by the integration tests too).
    #[test]
    fn identifiers_are_hkdf_of_the_key() {
        let k = EncryptionKey::new((0..64u8).collect()).unwrap();
        assert_eq!(k.id_hex().len(), 32);
        assert_ne!(identifier(&[1; 64]), identifier(&[2; 64]));
        assert!(EncryptionKey::new(vec![0; 15]).is_err());
        assert!(EncryptionKey::new(vec![0; 65]).is_err());
        assert!(!format!("{k:?}").contains("0001"));
    }
}
