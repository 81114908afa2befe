//! Directories both encrypted and casefolded (the kernel's "hash in dirent",
//! `ext4_hash_in_dirent`). Their names are ciphertext, so neither a name's folded form nor its
//! index hash can be computed without the key; each entry therefore carries its hash after
//! its name (`rext4_format::dirent::HASH_LEN`: major, minor): SipHash-2-4 of the folded
//! plaintext (of the plaintext where it has no folded form), keyed per directory (HKDF
//! context 5 with the directory's nonce, keysetup.rs; v2 policies only), major `& !1` as for
//! every ext4 hash. An indexed one has hash version 6 (SipHash) in its root, and its interior
//! nodes hold one entry fewer (`dx_node_limit`).
//!
//! - With the key, a name is found by decrypting entries and comparing folded forms (the
//!   kernel's `generic_ci_match`), starting at its hash in an indexed directory; what is
//!   found is the entry's on-disk name, from which everything below the directory code goes
//!   on as in any encrypted directory (crypto/mod.rs, invariant 1). A new entry stores the
//!   hash of its name.
//! - Without it, listings show no-key names carrying the stored hashes, and a no-key name is
//!   found by its ciphertext (the index, needing a hash only the key gives, is then searched
//!   linearly, as the kernel falls back).
//! - `.` and `..` carry no hash; entries moved by a leaf split take theirs along, and the
//!   split orders them by it (`dx_make_map`).

use super::InodeCrypt;
use crate::error::{Error, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use rext4_format::casefold;
use rext4_format::dirent::HASH_LEN;
use rext4_format::hash::DxHash;
use rext4_format::inode::{CASEFOLD_FL, ENCRYPT_FL};
use std::hash::Hasher as _;

/// The largest major hash an entry may have: `0xffff_fffe` is the index's end marker.
const MAJOR_EOF: u32 = 0xffff_fffe;

/// The hash an entry named `plain` carries in a directory whose dirhash key is `key`.
pub(crate) fn name_siphash(key: &[u8; 16], plain: &[u8]) -> DxHash {
    let folded = casefold::fold(plain);
    let mut h = siphasher::sip::SipHasher24::new_with_key(key);
    h.write(folded.as_deref().unwrap_or(plain));
    let h = h.finish();
    // Both halves are meant: the major is the high word, the minor the low one.
    #[allow(clippy::cast_possible_truncation)]
    let (major, minor) = ((h >> 32) as u32 & !1, h as u32);
    DxHash { major: if major == MAJOR_EOF { MAJOR_EOF - 2 } else { major }, minor }
}

/// Whether decrypted entry name `entry` is the name asked for, `plain` (folded: `folded`), as
/// `generic_ci_match` compares: the same bytes, or the same folded form; a name without one
/// matches only itself.
fn same_name(plain: &[u8], folded: Option<&[u8]>, entry: &[u8]) -> bool {
    entry == plain || folded.is_some_and(|f| casefold::matches_folded(f, entry))
}

impl FsInner {
    /// Whether `dir`'s entries carry their hashes: it is encrypted and casefolded.
    pub(crate) fn hash_in_dirent(&self, dir: &Inode) -> bool {
        dir.flags() & (ENCRYPT_FL | CASEFOLD_FL) == ENCRYPT_FL | CASEFOLD_FL
    }

    /// Bytes past its name each live entry of `dir` uses for its hash.
    pub(crate) fn dirent_extra(&self, dir: &Inode) -> usize {
        if self.hash_in_dirent(dir) {
            HASH_LEN
        } else {
            0
        }
    }

    /// The hash of on-disk name `disk` in `dir`, whose entries carry their hashes: from the
    /// decrypted name. `ENOKEY` without the key.
    pub(crate) fn disk_name_siphash(&self, dir: &Inode, disk: &[u8]) -> Result<DxHash> {
        let crypt = self.inode_crypt(dir)?;
        let key = crypt.dirhash.as_ref().ok_or(Error::NoKey)?;
        let plain = crypt.decrypt_name(disk).ok_or(Error::NoKey)?;
        Ok(name_siphash(key, &plain))
    }

    /// The on-disk name of the entry of `dir` (entries with hashes, its key here as `crypt`)
    /// that `name` names, by any case: searched from its hash's position in a hash-order
    /// listing, else through every entry. `ENOENT` if none.
    pub(crate) fn find_hashed(&self, dir: &Inode, crypt: &InodeCrypt, name: &[u8]) -> Result<Vec<u8>> {
        let key = crypt.dirhash.as_ref().ok_or(Error::NoKey)?;
        let want = name_siphash(key, name);
        let folded = casefold::fold(name);
        self.find_at_hash(dir, Some((want.major, want.minor)), |de| {
            de != b"."
                && de != b".."
                && crypt.decrypt_name(de).is_some_and(|p| same_name(name, folded.as_deref(), &p))
        })
    }

    /// The hash a new entry named `disk` (ciphertext) stores in `dir`, if `dir`'s entries
    /// carry theirs.
    pub(crate) fn new_entry_hash(&self, dir: &Inode, disk: &[u8]) -> Result<Option<DxHash>> {
        if self.hash_in_dirent(dir) {
            self.disk_name_siphash(dir, disk).map(Some)
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SipHash-2-4's reference vector (the paper's appendix A: key 00..0f, message 00..0e).
    #[test]
    fn siphash_is_siphash_2_4() {
        let key: [u8; 16] = std::array::from_fn(|i| u8::try_from(i).unwrap());
        let msg: Vec<u8> = (0..15).collect();
        let mut h = siphasher::sip::SipHasher24::new_with_key(&key);
        h.write(&msg);
        assert_eq!(h.finish(), 0xa129_ca61_49be_45e5);
    }

    #[test]
    fn names_hash_by_their_folded_form() {
        let key = [7u8; 16];
        let a = name_siphash(&key, "Straße".as_bytes());
        assert_eq!(a, name_siphash(&key, b"STRASSE"));
        assert_eq!(a.major & 1, 0);
        assert_ne!(a, name_siphash(&key, b"strasse2"));
        // Not UTF-8: hashed by its bytes, so another case is another hash.
        assert_ne!(name_siphash(&key, b"A\xff"), name_siphash(&key, b"a\xff"));
        assert!(same_name(b"x\xff", None, b"x\xff") && !same_name(b"X\xff", None, b"x\xff"));
    }
}
