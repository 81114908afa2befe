//! Setting an encryption policy on an empty directory (the kernel's
//! `FS_IOC_SET_ENCRYPTION_POLICY`, `fs/crypto/policy.c`): from then on everything made in it
//! is encrypted under the key it names.

use crate::crypto::EncryptionKey;
use crate::error::{Error, Result};
use crate::fs::{Fs, FsInner};
use rext4_format::fscrypt::{Context, KeySpec, MODE_AES_256_CTS, MODE_AES_256_XTS};
use rext4_format::inode::ENCRYPT_FL;
use rext4_format::InodeNo;

/// Credits: the record, and a block for a directory moved out of the record.
const CREDITS: u32 = 16;

impl FsInner {
    /// Sets `policy` (its nonce ignored) on empty directory `ino`, in the order
    /// `fscrypt_ioctl_set_policy` checks: an encrypted inode keeps its policy (the same again
    /// is no change, another `EEXIST`), then `ENOTDIR`, `ENOTEMPTY`, and the policy itself.
    /// Who may set it is the caller's to check (crypto/keyring.rs).
    pub(crate) fn set_encryption_policy(&self, ino: InodeNo, policy: &Context) -> Result<()> {
        self.require_encrypt()?;
        let journal = self.journal()?.clone();
        let inode = self.iget_by_number(ino)?;
        let _op = self.stats.lock(crate::fs::stats::LockClass::OpLock, &inode.op_lock);
        let mut ctx = policy.clone();
        if inode.flags() & ENCRYPT_FL != 0 {
            let same = self.inode_crypt(&inode)?.ctx.as_ref().is_some_and(|c| c.same_policy(&ctx));
            return if same { Ok(()) } else { Err(Error::Exists) };
        }
        if !inode.is_dir() {
            return Err(Error::NotDir);
        }
        if !self.dir_is_empty(&inode)? {
            return Err(Error::NotEmpty);
        }
        if !ctx.policy_valid(self.sbi.block_size.trailing_zeros()) {
            return Err(Error::InvalidInput("an encryption policy the kernel does not take"));
        }
        // `fscrypt_supported_v1_policy`: a casefolded directory's entries need a v2 key.
        if !ctx.is_v2() && inode.flags() & rext4_format::inode::CASEFOLD_FL != 0 {
            return Err(Error::InvalidInput("v1 encryption policies cannot casefold"));
        }
        if !super::keysetup::policy_supported(&ctx) {
            return Err(Error::NotSupported(
                "encryption modes other than AES-256-XTS and AES-256-CTS".into(),
            ));
        }
        super::getrandom(&mut ctx.nonce)?;
        let h = journal.start(CREDITS)?;
        // Encrypted directories are never inline (`ext4_set_context`).
        if self.has_inline_data(&inode) {
            self.inline_dir_to_block(&h, &inode)?;
        }
        let mut raw = inode.raw_mut();
        self.set_new_context(&inode, &mut raw, &ctx)?;
        crate::inode::write::raw_touch_c(&mut raw, self.now());
        self.mark_inode_dirty(&h, &inode, &mut raw)
    }
}

impl Fs {
    /// Encrypts empty directory `dir` under `key` (`FS_IOC_SET_ENCRYPTION_POLICY`): AES-256-XTS
    /// contents, AES-256-CTS names padded to `padding` bytes (4, 8, 16 or 32; `fscrypt` and
    /// `fscryptctl` use 32). A v2 key must be among [`crate::Options::encryption_keys`]
    /// (`ENOKEY`). `EEXIST` if it is encrypted under another policy, `ENOTEMPTY`,
    /// `ENOTDIR`, `EOPNOTSUPP` on an image without `encrypt`.
    pub fn set_encryption_policy(&self, dir: InodeNo, key: &EncryptionKey, padding: u8) -> Result<()> {
        let pad_flags = match padding {
            4 => 0,
            8 => 1,
            16 => 2,
            32 => 3,
            _ => return Err(Error::InvalidInput("name padding is 4, 8, 16 or 32")),
        };
        let policy = Context {
            contents_mode: MODE_AES_256_XTS,
            filenames_mode: MODE_AES_256_CTS,
            flags: pad_flags,
            log2_data_unit_size: 0,
            key: key.spec(),
            nonce: [0; 16],
        };
        self.inner.require_encrypt()?;
        // A v2 policy only with its key present (`fscrypt_verify_key_added`).
        if matches!(policy.key, KeySpec::Identifier(_)) && !self.inner.keyring.has(&policy.key) {
            return Err(Error::NoKey);
        }
        self.inner.op(crate::fs::stats::Op::SetFlags, || self.inner.set_encryption_policy(dir, &policy))
    }
}
