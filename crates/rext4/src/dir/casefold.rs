//! Names in casefolded directories (images with `casefold`, directories with `chattr +F`,
//! the kernel's `IS_CASEFOLDED` paths in `namei.c` and `hash.c`).
//!
//! In such a directory a name is found by its folded form (rext4_format::casefold): `FOO`
//! finds the entry `foo`, creating `Foo` beside it is `EEXIST`, and the index hashes the folded
//! form. Entries keep the bytes they were created with. A name that has no folded form (not
//! UTF-8) is hashed and matched by its bytes, or refused (`EINVAL`) on images with strict
//! encoding. The name cache keys these directories' names by their folded form.

use crate::error::{Error, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use rext4_format::casefold;
use rext4_format::dirent::NameKey;
use rext4_format::hash::{dx_hash, DxHash, HashAlgo};
use rext4_format::inode::{CASEFOLD_FL, ENCRYPT_FL};
use std::sync::Arc;

/// A name as one directory compares it.
pub(crate) struct DirName<'a> {
    name: &'a [u8],
    /// In a casefolded directory, the folded form (`None`: the name has none).
    folded: Option<Option<Vec<u8>>>,
}

impl DirName<'_> {
    /// What entries are compared against.
    pub(crate) fn key(&self) -> NameKey<'_> {
        match &self.folded {
            None => NameKey::Exact(self.name),
            Some(f) => NameKey::Folded { name: self.name, folded: f.as_deref() },
        }
    }

    /// The form the directory hashes the name in, and keys it under in the name cache: the
    /// folded form in a casefolded directory (so every case of a name finds, and a removal
    /// through any case drops, one cached entry), else the bytes. A name without a folded form
    /// keeps its bytes, which no folded form equals (those are UTF-8).
    pub(crate) fn canonical(&self) -> &[u8] {
        match &self.folded {
            Some(Some(f)) => f,
            _ => self.name,
        }
    }
}

impl FsInner {
    /// Whether `dir` compares names by their folded form. An encrypted directory's names are
    /// ciphertext (its folded hashes are stored in the entries, which needs the key).
    pub(crate) fn is_casefolded(&self, dir: &Inode) -> bool {
        self.sbi.casefold && dir.flags() & (CASEFOLD_FL | ENCRYPT_FL) == CASEFOLD_FL
    }

    /// `name` as `dir` compares it.
    pub(crate) fn dir_name<'a>(&self, dir: &Inode, name: &'a [u8]) -> DirName<'a> {
        let folded = self.is_casefolded(dir).then(|| casefold::fold(name));
        DirName { name, folded }
    }

    /// The index hash of on-disk name `name` in `dir` (the kernel's `ext4fs_dirhash`); in a
    /// directory whose entries carry their hashes, SipHash of the decrypted name (`ENOKEY`
    /// without the key; crypto/dirhash.rs).
    pub(crate) fn name_hash(&self, dir: &Inode, name: &[u8], algo: HashAlgo) -> Result<DxHash> {
        if self.hash_in_dirent(dir) {
            return self.disk_name_siphash(dir, name);
        }
        Ok(dx_hash(self.dir_name(dir, name).canonical(), algo, self.sbi.hash_seed))
    }

    /// Whether a new entry `name` may go into `dir`: on strict-encoding images a casefolded
    /// directory takes only valid UTF-8 (`generic_ci_validate_strict_name`).
    pub(crate) fn check_new_name(&self, dir: &Inode, name: &[u8]) -> Result<()> {
        if self.sbi.strict_encoding && self.is_casefolded(dir) && !casefold::is_valid(name) {
            return Err(Error::InvalidInput("name is not valid UTF-8 in a casefolded directory"));
        }
        Ok(())
    }

    /// Caches `name` -> `inode` in `dir`'s names (under [`DirName::canonical`]).
    pub(crate) fn cache_name(&self, dir: &Inode, name: &[u8], inode: &Arc<Inode>) {
        self.dcache.insert(dir.ino, self.dir_name(dir, name).canonical(), inode);
    }

    /// Drops `name` from `dir`'s cached names.
    pub(crate) fn uncache_name(&self, dir: &Inode, name: &[u8]) {
        self.dcache.remove(dir.ino, self.dir_name(dir, name).canonical());
    }
}
