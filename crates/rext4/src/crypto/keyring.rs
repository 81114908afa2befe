//! Master keys added and removed while the filesystem is open, and what a caller may read of
//! a policy (the kernel's `fs/crypto/keyring.c` and `policy.c` behind
//! `FS_IOC_ADD_ENCRYPTION_KEY`, `FS_IOC_REMOVE_ENCRYPTION_KEY[_ALL_USERS]`,
//! `FS_IOC_GET_ENCRYPTION_KEY_STATUS`, `FS_IOC_GET_ENCRYPTION_POLICY_EX` and
//! `FS_IOC_GET_ENCRYPTION_NONCE`).
//!
//! As in the kernel, a v2 key is held by the users who added it: each removal by a user
//! takes that user's claim, and the key goes with the last one (or at once, for all users,
//! with `CAP_SYS_ADMIN`). v1 keys belong to no user: adding and removing them takes
//! `CAP_SYS_ADMIN`. Keys given at open ([`crate::Options::encryption_keys`]) stay, whatever
//! claims users add and take, until a removal for all users. A key that goes is gone for
//! every inode once the writes in flight on it end (crypto/mod.rs, invariant 4), open files
//! included: the kernel keeps it for files still open and reports the removal incomplete;
//! here nothing of a removed key stays, and its bytes are wiped.

use crate::crypto::EncryptionKey;
use crate::error::{Error, Result};
use crate::fs::{Fs, FsInner};
use crate::vfs::creds::{Caps, Creds};
use rext4_format::features::Incompat;
use rext4_format::fscrypt::{Context, KeySpec, NONCE_SIZE};
use rext4_format::inode::ENCRYPT_FL;
use rext4_format::InodeNo;

/// What `FS_IOC_GET_ENCRYPTION_KEY_STATUS` reports of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyStatus {
    /// Whether the key is on the filesystem's keyring.
    pub present: bool,
    /// Whether the caller is among the users who added it (v2 keys).
    pub added_by_self: bool,
    /// How many users added it (v2 keys).
    pub user_count: u32,
}

impl FsInner {
    /// `EOPNOTSUPP` on an image without the `encrypt` feature, as ext4's ioctls answer.
    pub(crate) fn require_encrypt(&self) -> Result<()> {
        if !self.sbi.sb.incompat().contains(Incompat::ENCRYPT) {
            return Err(Error::NotSupported("encryption on an image without the encrypt feature".into()));
        }
        Ok(())
    }
}

impl Fs {
    /// Adds master key `key` for caller `creds` (`FS_IOC_ADD_ENCRYPTION_KEY`): names, contents
    /// and targets under policies naming it read and write from now on. A v2 key records the
    /// caller among its users (adding it again is no change); a v1 key takes
    /// `CAP_SYS_ADMIN` (`EACCES`).
    pub fn add_encryption_key(&self, creds: &Creds, key: &EncryptionKey) -> Result<()> {
        self.inner.require_encrypt()?;
        let user = match key.spec() {
            KeySpec::Identifier(_) => Some(creds.uid),
            KeySpec::Descriptor(_) if creds.has(Caps::SYS_ADMIN) => None,
            KeySpec::Descriptor(_) => return Err(Error::AccessDenied),
        };
        self.inner.keyring.add(key, user);
        Ok(())
    }

    /// Removes the caller's claim on the key `spec` names, or with `all_users` the key itself
    /// (`FS_IOC_REMOVE_ENCRYPTION_KEY` / `_ALL_USERS`; the latter, and any v1 key, take
    /// `CAP_SYS_ADMIN`: `EACCES`). `ENOKEY` if the key is not here or the caller never added
    /// it. `Ok(true)` when it stays: other users still hold it, or it was given at open.
    pub fn remove_encryption_key(&self, creds: &Creds, spec: KeySpec, all_users: bool) -> Result<bool> {
        self.inner.require_encrypt()?;
        let v1 = matches!(spec, KeySpec::Descriptor(_));
        if (all_users || v1) && !creds.has(Caps::SYS_ADMIN) {
            return Err(Error::AccessDenied);
        }
        let user = if all_users || v1 { None } else { Some(creds.uid) };
        self.inner.keyring.remove(&spec, user)
    }

    /// Whether the key `spec` names is here, and who added it
    /// (`FS_IOC_GET_ENCRYPTION_KEY_STATUS`).
    pub fn encryption_key_status(&self, creds: &Creds, spec: KeySpec) -> Result<KeyStatus> {
        self.inner.require_encrypt()?;
        Ok(match self.inner.keyring.status(&spec) {
            None => KeyStatus { present: false, added_by_self: false, user_count: 0 },
            Some(users) => KeyStatus {
                present: true,
                added_by_self: users.contains(&creds.uid),
                user_count: u32::try_from(users.len()).unwrap_or(u32::MAX),
            },
        })
    }

    /// The context of encrypted inode `ino`; `ENODATA` if it is not encrypted, `EINVAL` if
    /// its context is not one the kernel knows.
    fn encryption_context(&self, ino: InodeNo) -> Result<Context> {
        self.inner.require_encrypt()?;
        let inode = self.inner.iget_by_number(ino)?;
        if inode.flags() & ENCRYPT_FL == 0 {
            return Err(Error::NoData);
        }
        self.inner
            .inode_crypt(&inode)?
            .ctx
            .clone()
            .ok_or(Error::InvalidInput("an encryption context of no known version"))
    }

    /// The policy of encrypted inode `ino` (`FS_IOC_GET_ENCRYPTION_POLICY_EX`): its context
    /// with the nonce zeroed ([`Context::to_policy`] gives user space's structure). Readable
    /// without the key. `ENODATA` if `ino` is not encrypted.
    pub fn encryption_policy(&self, ino: InodeNo) -> Result<Context> {
        let mut ctx = self.encryption_context(ino)?;
        ctx.nonce = [0; NONCE_SIZE];
        Ok(ctx)
    }

    /// The nonce of encrypted inode `ino` (`FS_IOC_GET_ENCRYPTION_NONCE`), which with the
    /// master key gives its own keys. `ENODATA` if `ino` is not encrypted.
    pub fn encryption_nonce(&self, ino: InodeNo) -> Result<[u8; NONCE_SIZE]> {
        Ok(self.encryption_context(ino)?.nonce)
    }

    /// Sets policy `policy` ([`Context::from_policy`]; its nonce is ignored) on empty
    /// directory `dir` for caller `creds`, as `FS_IOC_SET_ENCRYPTION_POLICY` does: the owner
    /// or `CAP_FOWNER` only (`EACCES`); a v2 policy only with its key added by the caller
    /// (or `CAP_FOWNER`: `ENOKEY`); then as [`Fs::set_encryption_policy`], with `EINVAL` for
    /// a policy the kernel refuses and `EOPNOTSUPP` for one it takes that this engine cannot
    /// encrypt with (modes other than AES-256-XTS and -CTS, `DIRECT_KEY`, `IV_INO_LBLK_32`).
    pub fn set_encryption_policy_as(&self, creds: &Creds, dir: InodeNo, policy: &Context) -> Result<()> {
        self.inner.require_encrypt()?;
        let owner = self.getattr(dir)?.uid;
        if creds.uid != owner && !creds.has(Caps::FOWNER) {
            return Err(Error::AccessDenied);
        }
        if let KeySpec::Identifier(_) = policy.key {
            let claimed = self.inner.keyring.status(&policy.key).is_some_and(|u| u.contains(&creds.uid));
            if !claimed && !creds.has(Caps::FOWNER) {
                return Err(Error::NoKey);
            }
        }
        self.inner.op(crate::fs::stats::Op::SetFlags, || self.inner.set_encryption_policy(dir, policy))
    }
}
