//! Encrypted files and directories (`mkfs.ext4 -O encrypt`; the kernel's `fs/crypto`,
//! fscrypt, as ext4 uses it).
//!
//! An encrypted inode has `ENCRYPT_FL` and a context in its attribute `c` of index 9
//! (rext4_format::fscrypt): the policy it shares with its directory and a nonce of its own.
//! Its keys come from a master key given at open ([`crate::Options::encryption_keys`]) or
//! added since ([`crate::Fs::add_encryption_key`], crypto/keyring.rs):
//!
//! | with the key | without it (or with a policy this engine does not do) |
//! |---|---|
//! | names decrypted (AES-256-CTS) in listings, found by encrypting the name asked for (in a casefolded directory, by decrypting entries from the name's hash, crypto/dirhash.rs) | names shown as no-key names (base64url of the ciphertext, or of its start and a SHA-256 of the rest), found by them |
//! | contents decrypted (AES-256-XTS per data unit) | reads `ENOKEY` |
//! | symlink targets decrypted | targets shown as no-key names |
//!
//! Either way a file can be removed (unlink, rmdir) and stat'ed, as the kernel allows. What
//! needs the key (a new name, a rename, a link, contents) is `ENOKEY` without it; with it,
//! new files, directories and symlinks take the directory's policy, names are renamed and
//! linked within one policy (`EXDEV` across), and contents are written whole blocks at a
//! time (crypto/contents.rs). A policy is set on an empty directory by crypto/policy.rs.
//!
//! Invariants:
//! 1. Every name below the directory code is the on-disk name (ciphertext in an encrypted
//!    directory): user names are translated once, at each operation's entry
//!    ([`FsInner::disk_name`]), and the name cache keys encrypted directories by it.
//! 2. An inode's context never changes once set (a policy is set only on an empty,
//!    unencrypted directory), and [`FsInner::inode_crypt`] is called only for inodes with
//!    `ENCRYPT_FL`, so what is derived from the context is computed once per cached inode
//!    and keyring generation ([`Inode::crypt`]) and an inode without the flag never has it.
//! 3. No cache keeps what a key decides: names are cached in their on-disk form (1), and an
//!    inode's keys are derived again after any key came or went (the keyring's generation,
//!    read before the keys are looked up, is kept with them). A caller that caches names or
//!    contents as shown (the FUSE kernel's) is told of key changes by whoever changed them.
//! 4. Every change to a file's contents enters through `regular_file` (data/write.rs), which
//!    computes the file's [`InodeCrypt`] (refusing the change without the key), and checks
//!    again once it holds the file's `op_lock` ([`FsInner::contents_key_held`]): the writes
//!    below it, which may hold the record's lock, tell an encrypted file by it being set
//!    (invariant 2) and use its keys. A key removed while a writer holds the `op_lock` stays
//!    with the file until the writer lets go ([`FsInner::inode_crypt`] derives no keyless
//!    state for it meanwhile), so no write fails half done, after its blocks were mapped.
//!    Encrypted files take no delayed allocation and no inline data, and the page cache
//!    keeps none of their blocks.

pub(crate) mod contents;
pub(crate) mod dirhash;
pub(crate) mod fname;
pub(crate) mod keyring;
pub(crate) mod keysetup;
pub(crate) mod policy;
pub(crate) mod xts;

pub use keyring::KeyStatus;
pub use keysetup::EncryptionKey;

use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use aes::cipher::KeyInit;
use rext4_format::fscrypt::Context;
use rext4_format::inode::{CASEFOLD_FL, ENCRYPT_FL, S_IFDIR, S_IFLNK, S_IFREG};
use std::sync::Arc;

/// What a new inode in an encrypted directory takes: its name's on-disk form (none for an
/// `O_TMPFILE` file) and its own context (none for special files).
pub(crate) type NewEncrypted<'a> = (Option<std::borrow::Cow<'a, [u8]>>, Option<Context>);

/// AES-256 for names (CBC with ciphertext stealing, crypto/fname.rs).
pub(crate) struct NamesCipher {
    aes: aes::Aes256,
}

impl NamesCipher {
    fn new(key: &[u8]) -> NamesCipher {
        // Cannot fail: the key is derived at exactly 32 bytes (keysetup.rs).
        NamesCipher { aes: aes::Aes256::new_from_slice(key).expect("32-byte key") }
    }
}

/// AES-256-XTS for contents (crypto/contents.rs, crypto/xts.rs).
pub(crate) struct ContentsCipher {
    xts: xts::Xts,
}

impl ContentsCipher {
    fn new(key: &[u8]) -> ContentsCipher {
        ContentsCipher { xts: xts::Xts::new(key) }
    }
}

/// What an encrypted inode's context gives this open filesystem.
pub(crate) struct InodeCrypt {
    /// The context; `None` where it is malformed (shown as without its key, as the kernel
    /// does for `lookup` of a policy it cannot use).
    pub ctx: Option<Context>,
    /// With the key: the names cipher of a directory or symlink.
    pub names: Option<NamesCipher>,
    /// With the key: the contents cipher of a regular file.
    pub contents: Option<ContentsCipher>,
    /// With the key: a casefolded directory's SipHash key for the hashes its entries carry
    /// (crypto/dirhash.rs).
    pub dirhash: Option<zeroize::Zeroizing<[u8; 16]>>,
    /// The inode's number, which `IV_INO_LBLK_64` policies put in every IV.
    pub ino: u32,
    /// The keyring's generation when the keys were derived (invariant 3).
    pub generation: u64,
}

impl InodeCrypt {
    /// Whether this inode's key is here.
    pub(crate) fn has_key(&self) -> bool {
        self.names.is_some() || self.contents.is_some()
    }

    /// The IV of data unit or name `index` (`fscrypt_generate_iv`): the index, with the inode
    /// number above it under `IV_INO_LBLK_64`.
    pub(crate) fn iv_index(&self, index: u64) -> u64 {
        match &self.ctx {
            Some(c) if c.flags & rext4_format::fscrypt::FLAG_IV_INO_LBLK_64 != 0 => {
                (u64::from(self.ino) << 32) | (index & 0xffff_ffff)
            }
            _ => index,
        }
    }
}

impl FsInner {
    /// The encryption state of `inode`, which has `ENCRYPT_FL`: computed at the first call and
    /// kept with the cached inode.
    pub(crate) fn inode_crypt(&self, inode: &Inode) -> Result<Arc<InodeCrypt>> {
        // Read before the keys are looked up: a key added or removed meanwhile leaves this
        // state stale, to be derived again at the next call.
        let generation = self.keyring.generation();
        if let Some(c) = inode.crypt.load_full() {
            if c.generation == generation {
                return Ok(c);
            }
        }
        let value = self
            .xattrs(inode)?
            .into_iter()
            .find(|x| x.index == rext4_format::xattr::INDEX_ENCRYPTION && x.name == b"c")
            .map(|x| x.value);
        let Some(value) = value else {
            let ino = inode.ino;
            return corrupt(CorruptKind::Inode {
                ino,
                what: "encrypted inode without an encryption context",
            });
        };
        let ctx = Context::parse(&value).ok();
        let uuid = self.sbi.sb.s_uuid;
        // A data unit larger than the block is no policy the kernel sets.
        let bits = self.sbi.block_size.trailing_zeros();
        let kind = inode.with_disk(|d| d.file_type());
        // A v1 policy on a casefolded directory is none the kernel uses: as without the key.
        let v1_folded = kind == S_IFDIR && inode.flags() & CASEFOLD_FL != 0;
        let usable = ctx.as_ref().filter(|c| {
            keysetup::policy_supported(c)
                && u32::from(c.log2_data_unit_size) <= bits
                && (c.is_v2() || !v1_folded)
        });
        let (names, contents) = match usable {
            Some(c) if kind == S_IFDIR || kind == S_IFLNK => (self.keyring.names_cipher(c, &uuid), None),
            Some(c) if kind == S_IFREG => (None, self.keyring.contents_cipher(c, &uuid)),
            _ => (None, None),
        };
        let dirhash = match usable {
            Some(c) if kind == S_IFDIR && inode.flags() & CASEFOLD_FL != 0 && names.is_some() => {
                self.keyring.dirhash_key(c)
            }
            _ => None,
        };
        let c = Arc::new(InodeCrypt { ctx, names, contents, dirhash, ino: inode.ino.0, generation });
        // A file whose key went keeps it while a writer holds its `op_lock` (invariant 4):
        // the write goes on with the key it was let in with, as the kernel keeps a removed
        // key for files in use. The lock is held while the state is stored, so no writer
        // takes it in between.
        let old = inode.crypt.load_full();
        if c.contents.is_none() && old.as_ref().is_some_and(|o| o.contents.is_some()) {
            let Some(_writers) = inode.op_lock.try_lock() else {
                // Checked by the `if` just above.
                return Ok(old.expect("a state with a key"));
            };
            inode.crypt.store(Some(c.clone()));
            return Ok(c);
        }
        // A racing call computed the same, or for another generation, which the next call
        // notices; either is kept.
        inode.crypt.store(Some(c.clone()));
        Ok(c)
    }
}

impl FsInner {
    /// `ENOKEY` unless regular file `inode`, if encrypted, has its contents key: checked by
    /// writers once they hold its `op_lock`, under which the key stays (invariant 4). Only an
    /// encrypted file has a state here, set by `regular_file` before (invariant 2), so the
    /// others' writes pay one atomic load and take no record lock.
    pub(crate) fn contents_key_held(&self, inode: &Inode) -> Result<()> {
        if inode.crypt.load().is_some() && self.inode_crypt(inode)?.contents.is_none() {
            return Err(Error::NoKey);
        }
        Ok(())
    }

    /// `ENOKEY` if `dir` is encrypted and its key is not here (`fscrypt_require_key`).
    pub(crate) fn require_key(&self, dir: &Inode) -> Result<()> {
        if dir.flags() & ENCRYPT_FL != 0 && !self.inode_crypt(dir)?.has_key() {
            return Err(Error::NoKey);
        }
        Ok(())
    }

    /// What a new inode named `name` (or, for `O_TMPFILE`, none) of type `kind` in encrypted
    /// directory `dir` takes (`fscrypt_prepare_new_inode`): `EEXIST` if the name is there,
    /// `ENOKEY` without the key; else the name's on-disk form and, for a regular file,
    /// directory or symlink, its own context (the directory's policy, a fresh nonce).
    /// Special files are not encrypted, only their names; a link (`kind` 0) takes only the
    /// name.
    pub(crate) fn prepare_new_encrypted<'a>(
        &self,
        dir: &Inode,
        name: Option<&'a [u8]>,
        kind: u16,
    ) -> Result<NewEncrypted<'a>> {
        if let Some(name) = name {
            match self.lookup(dir, name) {
                Ok(_) => return Err(Error::Exists),
                Err(Error::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        self.require_key(dir)?;
        let disk = name.map(|n| self.disk_name(dir, n, fname::NameUse::Make)).transpose()?;
        let ctx = match kind {
            S_IFREG | S_IFDIR | S_IFLNK => {
                let crypt = self.inode_crypt(dir)?;
                let Some(mut ctx) = crypt.ctx.clone() else { return Err(Error::NoKey) };
                getrandom(&mut ctx.nonce)?;
                Some(ctx)
            }
            _ => None,
        };
        Ok((disk, ctx))
    }

    /// Makes new inode `child` (its record `raw`, not yet written) encrypted with `ctx`: the
    /// flag, and the context in the record's attribute area (`ext4_set_context`), written
    /// with the rest of the record.
    pub(crate) fn set_new_context(&self, child: &Inode, raw: &mut [u8], ctx: &Context) -> Result<()> {
        let flags = crate::inode::write::raw_flags(raw);
        crate::inode::write::raw_set_flags(raw, flags | ENCRYPT_FL);
        self.ibody_put(child.ino, raw, rext4_format::xattr::INDEX_ENCRYPTION, b"c", &ctx.to_bytes()).map_err(
            |e| match e {
                Error::NoSpace | Error::Range => Error::NotSupported(
                    "an encryption context needs room in the inode (256-byte inodes)".into(),
                ),
                e => e,
            },
        )
    }

    /// The stored form of symlink `ino`'s target under context `ctx` (`fscrypt_prepare_symlink`
    /// and `fscrypt_encrypt_symlink`): the ciphertext's length, then the ciphertext, padded
    /// as a name but up to the block less 3 bytes. `ENAMETOOLONG` past that.
    pub(crate) fn encrypt_symlink(
        &self,
        ino: rext4_format::InodeNo,
        ctx: &Context,
        target: &[u8],
    ) -> Result<Vec<u8>> {
        // The symlink's own key, from its new nonce; it has no record to be read from yet.
        let names = self.keyring.names_cipher(ctx, &self.sbi.sb.s_uuid);
        let generation = self.keyring.generation();
        let crypt = InodeCrypt {
            ctx: Some(ctx.clone()),
            names,
            contents: None,
            dirhash: None,
            ino: ino.0,
            generation,
        };
        let ct = crypt.encrypt_name(target, self.sbi.block_size as usize - 3)?;
        // Cannot fail: at most a block less 3 bytes.
        let mut v = u16::try_from(ct.len()).expect("within a block").to_le_bytes().to_vec();
        v.extend_from_slice(&ct);
        Ok(v)
    }

    /// Whether `child` may have a name in `parent` (`fscrypt_has_permitted_context`): outside
    /// encrypted directories anything may; inside, regular files, directories and symlinks
    /// only with the directory's own policy.
    pub(crate) fn permitted_context(&self, parent: &Inode, child: &Inode) -> Result<bool> {
        if parent.flags() & ENCRYPT_FL == 0 {
            return Ok(true);
        }
        if !matches!(child.with_disk(|d| d.file_type()), S_IFREG | S_IFDIR | S_IFLNK) {
            return Ok(true);
        }
        if child.flags() & ENCRYPT_FL == 0 {
            return Ok(false);
        }
        let (p, c) = (self.inode_crypt(parent)?, self.inode_crypt(child)?);
        Ok(match (&p.ctx, &c.ctx) {
            (Some(p), Some(c)) => p.same_policy(c),
            _ => false,
        })
    }
}

/// Fills `buf` from the kernel's random source (`getrandom(2)`), as fscrypt's nonces are.
pub(super) fn getrandom(buf: &mut [u8]) -> Result<()> {
    getrandom::fill(buf).map_err(|e| Error::Io(std::io::Error::other(e.to_string())))
}
