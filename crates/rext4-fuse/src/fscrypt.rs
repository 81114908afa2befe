//! fscrypt's ioctls through the mount: adding and removing master keys, their status, and
//! setting and reading policies (the kernel's `FS_IOC_*_ENCRYPTION_*`, `fs/crypto`).
//!
//! FUSE passes a filesystem's ioctls on "restricted": the kernel copies in and out exactly
//! what the command's number says (`_IOC_DIR`, `_IOC_SIZE`), and no more. Four of fscrypt's
//! commands fit that and are answered under their own numbers (those `fscryptctl
//! remove_key` and `key_status` send), as ext4 answers them. Three do not:
//! `FS_IOC_ADD_ENCRYPTION_KEY` puts the key after the structure its number sizes,
//! `FS_IOC_SET_ENCRYPTION_POLICY` is numbered as a read of a v1 policy, and
//! `FS_IOC_GET_ENCRYPTION_POLICY_EX` sizes only its header. For those the daemon takes the
//! same structures under numbers whose direction and size carry them whole ([`ADD_KEY`],
//! [`SET_POLICY`], [`GET_POLICY_EX`]: type `'f'` and fscrypt's command numbers, fixed sizes);
//! `rext4 key` and `rext4 encrypt` send them (docs/fuse.md, "Encryption keys and policies").
//!
//! The kernel's caches hold what a key decides (names in its dentry cache and cached
//! listings, contents in its page cache, a symlink's size and target): after a key comes or
//! goes names, attributes and listings are dropped before the ioctl returns, pages just after
//! ([`Adapter::keys_changed`]).

use crate::adapter::{ino_of, Adapter, R};
use crate::attr::fuse_ino;
use fuser::{Errno, INodeNo};
use rext4::format::fscrypt::{Context, KeySpec, POLICY_V2_SIZE};
use rext4::format::inode::ENCRYPT_FL;
use rext4::{Creds, EncryptionKey, InodeNo};

/// `_IOC(dir, 'f', nr, size)`: read and write are from the caller's side.
// Cannot truncate: the sizes here are constants under the number's 14 bits.
#[allow(clippy::cast_possible_truncation)]
const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | ((b'f' as u32) << 8) | nr
}
const W: u32 = 1;
const R_: u32 = 2;

/// `struct fscrypt_key_specifier`: type, reserved word, a 32-byte union.
const KEY_SPEC: usize = 40;
/// `struct fscrypt_add_key_arg` before the raw key.
const ADD_KEY_ARG: usize = 80;
/// The largest master key (`FSCRYPT_MAX_KEY_SIZE`).
pub const MAX_KEY: usize = 64;

/// `FS_IOC_REMOVE_ENCRYPTION_KEY`: `_IOWR('f', 24, struct fscrypt_remove_key_arg)`.
pub const REMOVE_KEY: u32 = ioc(W | R_, 24, 64);
/// `FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS`: `_IOWR('f', 25, ...)`.
pub const REMOVE_KEY_ALL_USERS: u32 = ioc(W | R_, 25, 64);
/// `FS_IOC_GET_ENCRYPTION_KEY_STATUS`: `_IOWR('f', 26, struct fscrypt_get_key_status_arg)`.
pub const GET_KEY_STATUS: u32 = ioc(W | R_, 26, 128);
/// `FS_IOC_GET_ENCRYPTION_NONCE`: `_IOR('f', 27, __u8[16])`.
pub const GET_NONCE: u32 = ioc(R_, 27, 16);
/// `FS_IOC_ADD_ENCRYPTION_KEY`'s structure with room for the largest key after it.
pub const ADD_KEY: u32 = ioc(W | R_, 23, ADD_KEY_ARG + MAX_KEY);
/// `FS_IOC_SET_ENCRYPTION_POLICY`'s policy (v1 or v2, by its first byte), sized as a v2 one.
pub const SET_POLICY: u32 = ioc(W, 19, POLICY_V2_SIZE);
/// `FS_IOC_GET_ENCRYPTION_POLICY_EX`'s structure (the policy's size, then the policy) with
/// room for a v2 policy.
pub const GET_POLICY_EX: u32 = ioc(W | R_, 22, 8 + POLICY_V2_SIZE);

/// The kernel's own numbers of the three commands the mount cannot carry; they are refused
/// with a line in the daemon's log that names the commands that do.
const KERNEL_ADD_KEY: u32 = ioc(W | R_, 23, ADD_KEY_ARG);
const KERNEL_SET_POLICY: u32 = ioc(R_, 19, 12);
const KERNEL_GET_POLICY_EX: u32 = ioc(W | R_, 22, 9);
const KERNEL_GET_POLICY: u32 = ioc(W, 21, 12);

/// `FSCRYPT_KEY_SPEC_TYPE_*`.
const SPEC_DESCRIPTOR: u32 = 1;
const SPEC_IDENTIFIER: u32 = 2;
/// `FSCRYPT_KEY_STATUS_*` and `FSCRYPT_KEY_STATUS_FLAG_ADDED_BY_SELF`.
pub const STATUS_ABSENT: u32 = 1;
pub const STATUS_PRESENT: u32 = 2;
pub const STATUS_FLAG_ADDED_BY_SELF: u32 = 1;
/// `FSCRYPT_KEY_REMOVAL_STATUS_FLAG_OTHER_USERS`.
pub const REMOVAL_OTHER_USERS: u32 = 2;
/// `FSCRYPT_ADD_KEY_FLAG_HW_WRAPPED`.
const ADD_KEY_HW_WRAPPED: u32 = 1;

fn word(b: &[u8], at: usize) -> R<u32> {
    let w = b.get(at..at + 4).ok_or(Errno::EINVAL)?;
    Ok(u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
}

fn all_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

/// A key specifier as the kernel's `valid_key_spec` takes it: a known type, its reserved
/// word zero.
pub fn parse_key_spec(b: &[u8]) -> R<KeySpec> {
    let spec = b.get(..KEY_SPEC).ok_or(Errno::EINVAL)?;
    if word(spec, 4)? != 0 {
        return Err(Errno::EINVAL);
    }
    let u = &spec[8..];
    match word(spec, 0)? {
        SPEC_DESCRIPTOR => Ok(KeySpec::Descriptor(u[..8].try_into().map_err(|_| Errno::EINVAL)?)),
        SPEC_IDENTIFIER => Ok(KeySpec::Identifier(u[..16].try_into().map_err(|_| Errno::EINVAL)?)),
        _ => Err(Errno::EINVAL),
    }
}

/// The key specifier structure naming `spec`.
pub fn key_spec_bytes(spec: KeySpec) -> [u8; KEY_SPEC] {
    let mut b = [0u8; KEY_SPEC];
    match spec {
        KeySpec::Descriptor(d) => {
            b[..4].copy_from_slice(&SPEC_DESCRIPTOR.to_ne_bytes());
            b[8..16].copy_from_slice(&d);
        }
        KeySpec::Identifier(id) => {
            b[..4].copy_from_slice(&SPEC_IDENTIFIER.to_ne_bytes());
            b[8..24].copy_from_slice(&id);
        }
    }
    b
}

/// [`ADD_KEY`]'s argument for master key `raw` (a v2 key, or v1 with `descriptor`).
pub fn add_key_arg(raw: &[u8], descriptor: Option<[u8; 8]>) -> Vec<u8> {
    let mut b = vec![0u8; ADD_KEY_ARG + MAX_KEY];
    let spec = match descriptor {
        Some(d) => KeySpec::Descriptor(d),
        None => KeySpec::Identifier([0; 16]),
    };
    b[..KEY_SPEC].copy_from_slice(&key_spec_bytes(spec));
    let n = raw.len().min(MAX_KEY);
    // Cannot fail: at most MAX_KEY.
    b[40..44].copy_from_slice(&u32::try_from(n).expect("at most 64").to_ne_bytes());
    b[ADD_KEY_ARG..ADD_KEY_ARG + n].copy_from_slice(&raw[..n]);
    b
}

impl Adapter {
    /// fscrypt's ioctls on `ino` for the caller `creds`: `None` when `cmd` is none of them.
    pub(crate) fn fscrypt_ioctl(
        &self,
        creds: &Creds,
        ino: INodeNo,
        cmd: u32,
        input: &[u8],
    ) -> Option<R<Vec<u8>>> {
        let r = match cmd {
            ADD_KEY => self.add_key(creds, input),
            REMOVE_KEY | REMOVE_KEY_ALL_USERS => self.remove_key(creds, input, cmd == REMOVE_KEY_ALL_USERS),
            GET_KEY_STATUS => self.key_status(creds, input),
            SET_POLICY => self.set_policy(creds, ino, input),
            GET_POLICY_EX => self.get_policy(ino, input),
            GET_NONCE => ino_of(ino)
                .and_then(|e| self.fs().encryption_nonce(e).map_err(|err| self.err(err)))
                .map(|n| n.to_vec()),
            KERNEL_ADD_KEY | KERNEL_SET_POLICY | KERNEL_GET_POLICY_EX | KERNEL_GET_POLICY => {
                crate::log(
                    "fscrypt: a FUSE mount cannot carry this ioctl's argument; \
                     use `rext4 key add`, `rext4 encrypt` or `rext4 key policy`",
                );
                Err(Errno::ENOTTY)
            }
            _ => return None,
        };
        Some(r)
    }

    fn add_key(&self, creds: &Creds, input: &[u8]) -> R<Vec<u8>> {
        let arg = input.get(..ADD_KEY_ARG + MAX_KEY).ok_or(Errno::EINVAL)?;
        let spec = parse_key_spec(arg)?;
        let (raw_size, key_id, flags) = (word(arg, 40)?, word(arg, 44)?, word(arg, 48)?);
        if !all_zero(&arg[52..ADD_KEY_ARG]) || flags & !ADD_KEY_HW_WRAPPED != 0 {
            return Err(Errno::EINVAL);
        }
        // A key from the caller's keyring (`key_id`) is not the daemon's to read, nor is a
        // hardware-wrapped one usable here.
        if key_id != 0 || flags & ADD_KEY_HW_WRAPPED != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        let raw = arg[ADD_KEY_ARG..].get(..raw_size as usize).ok_or(Errno::EINVAL)?.to_vec();
        let key = match spec {
            KeySpec::Descriptor(d) => EncryptionKey::v1(d, raw),
            // The identifier is the kernel's answer, not the caller's to give.
            KeySpec::Identifier(id) if all_zero(&id) => EncryptionKey::new(raw),
            KeySpec::Identifier(_) => return Err(Errno::EINVAL),
        }
        .map_err(|e| self.err(e))?;
        self.fs().add_encryption_key(creds, &key).map_err(|e| self.err(e))?;
        self.keys_changed();
        let mut out = arg.to_vec();
        out[..KEY_SPEC].copy_from_slice(&key_spec_bytes(key.spec()));
        // The key's bytes do not go back to the caller.
        out[ADD_KEY_ARG..].fill(0);
        Ok(out)
    }

    fn remove_key(&self, creds: &Creds, input: &[u8], all_users: bool) -> R<Vec<u8>> {
        let arg = input.get(..64).ok_or(Errno::EINVAL)?;
        let spec = parse_key_spec(arg)?;
        if !all_zero(&arg[KEY_SPEC..]) {
            return Err(Errno::EINVAL);
        }
        let others = self.fs().remove_encryption_key(creds, spec, all_users).map_err(|e| self.err(e))?;
        if !others {
            self.keys_changed();
        }
        let mut out = arg.to_vec();
        let flags = if others { REMOVAL_OTHER_USERS } else { 0 };
        out[40..44].copy_from_slice(&flags.to_ne_bytes());
        Ok(out)
    }

    fn key_status(&self, creds: &Creds, input: &[u8]) -> R<Vec<u8>> {
        let arg = input.get(..128).ok_or(Errno::EINVAL)?;
        let spec = parse_key_spec(arg)?;
        if !all_zero(&arg[KEY_SPEC..64]) {
            return Err(Errno::EINVAL);
        }
        let st = self.fs().encryption_key_status(creds, spec).map_err(|e| self.err(e))?;
        let mut out = arg.to_vec();
        out[64..].fill(0);
        let status = if st.present { STATUS_PRESENT } else { STATUS_ABSENT };
        let flags = if st.added_by_self { STATUS_FLAG_ADDED_BY_SELF } else { 0 };
        out[64..68].copy_from_slice(&status.to_ne_bytes());
        out[68..72].copy_from_slice(&flags.to_ne_bytes());
        out[72..76].copy_from_slice(&st.user_count.to_ne_bytes());
        Ok(out)
    }

    fn set_policy(&self, creds: &Creds, ino: INodeNo, input: &[u8]) -> R<Vec<u8>> {
        let policy = Context::from_policy(input).map_err(|_| Errno::EINVAL)?;
        self.writable()?;
        let e = ino_of(ino)?;
        self.fs().set_encryption_policy_as(creds, e, &policy).map_err(|err| self.err(err))?;
        // The flag shows in `lsattr` and statx, and the change time moved.
        self.attributes_changed(ino);
        Ok(Vec::new())
    }

    fn get_policy(&self, ino: INodeNo, input: &[u8]) -> R<Vec<u8>> {
        let room = input.get(..8).ok_or(Errno::EINVAL)?;
        let room = u64::from_ne_bytes(room.try_into().map_err(|_| Errno::EINVAL)?);
        let policy = self.fs().encryption_policy(ino_of(ino)?).map_err(|e| self.err(e))?.to_policy();
        if room < policy.len() as u64 {
            return Err(Errno::EOVERFLOW);
        }
        let mut out = (policy.len() as u64).to_ne_bytes().to_vec();
        out.extend_from_slice(&policy);
        out.resize(8 + POLICY_V2_SIZE, 0);
        Ok(out)
    }

    /// After a key came or went: the kernel looks every cached name up again
    /// (`FUSE_NOTIFY_INC_EPOCH`; where the kernel lacks it, names in encrypted directories
    /// are never cached, `Adapter::entry_ttl`), and drops what it holds of every encrypted
    /// inode it knows: attributes (a symlink's size is its target's as shown), listings and
    /// pages (decrypted contents, a symlink's target). Directories' pages here, before the
    /// reply; other inodes' on a thread of their own, since a page the kernel has locked
    /// for a request in flight (a read, a `READLINK`) is freed only when some worker answers
    /// that request, and this one must not wait for it.
    pub(crate) fn keys_changed(&self) {
        let Some(n) = self.shared.notifier.get() else { return };
        if self.shared.epoch_notify.load(std::sync::atomic::Ordering::Relaxed) {
            if let Err(e) = n.inc_epoch() {
                crate::log(&format!("fscrypt: invalidating the kernel's names: {e}"));
            }
        }
        let mut pages = Vec::new();
        for ino in self.shared.lookups.keys() {
            let Ok(e) = u32::try_from(ino).map(InodeNo) else { continue };
            let Ok(a) = self.fs().getattr(e) else { continue };
            if a.flags & ENCRYPT_FL == 0 {
                continue;
            }
            if a.kind == rext4::FileType::Directory {
                self.invalidate(fuse_ino(e), 0);
            } else {
                self.attributes_changed(fuse_ino(e));
                pages.push(fuse_ino(e));
            }
        }
        if !pages.is_empty() {
            let n = n.clone();
            std::thread::spawn(move || {
                for ino in pages {
                    let _ = n.inval_inode(ino, 0, 0);
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapter::{Shared, TTL};
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Duration;

    /// The numbers fscrypt's header gives (`include/uapi/linux/fscrypt.h`), which `ioc`
    /// must reproduce for the commands answered under them and the ones refused.
    #[test]
    fn numbers_are_the_kernels() {
        assert_eq!(REMOVE_KEY, 0xC040_6618);
        assert_eq!(REMOVE_KEY_ALL_USERS, 0xC040_6619);
        assert_eq!(GET_KEY_STATUS, 0xC080_661A);
        assert_eq!(GET_NONCE, 0x8010_661B);
        assert_eq!(KERNEL_ADD_KEY, 0xC050_6617);
        assert_eq!(KERNEL_SET_POLICY, 0x800C_6613);
        assert_eq!(KERNEL_GET_POLICY_EX, 0xC009_6616);
        assert_eq!(KERNEL_GET_POLICY, 0x400C_6615);
        // rext4's own differ from every kernel number in direction or size.
        for ours in [ADD_KEY, SET_POLICY, GET_POLICY_EX] {
            assert!(
                ![KERNEL_ADD_KEY, KERNEL_SET_POLICY, KERNEL_GET_POLICY_EX, KERNEL_GET_POLICY].contains(&ours)
            );
        }
        assert_eq!((ADD_KEY >> 16) & 0x3fff, 144);
    }

    #[test]
    fn key_specifiers_round_trip_and_are_checked() {
        for spec in [KeySpec::Identifier([7; 16]), KeySpec::Descriptor([9; 8])] {
            assert_eq!(parse_key_spec(&key_spec_bytes(spec)), Ok(spec));
        }
        let mut b = key_spec_bytes(KeySpec::Identifier([7; 16]));
        b[4] = 1;
        assert_eq!(parse_key_spec(&b), Err(Errno::EINVAL), "reserved word");
        b[4] = 0;
        b[0] = 3;
        assert_eq!(parse_key_spec(&b), Err(Errno::EINVAL), "unknown type");
        assert_eq!(parse_key_spec(&b[..39]), Err(Errno::EINVAL), "short");
        let arg = add_key_arg(&[5; 32], Some(*b"abcdefgh"));
        assert_eq!(arg.len(), 144);
        assert_eq!(parse_key_spec(&arg), Ok(KeySpec::Descriptor(*b"abcdefgh")));
        assert_eq!(word(&arg, 40), Ok(32));
        assert_eq!(&arg[80..112], &[5; 32]);
    }

    /// Where the kernel cannot be told to drop every cached name, names in encrypted
    /// directories get no cache time; elsewhere, and with the notice, they keep the usual.
    #[test]
    fn names_in_encrypted_directories_are_not_cached_without_the_epoch_notice() {
        let dev = Arc::new(rext4::dev::MemDevice::new(vec![0; 8 << 20]));
        let fmt = rext4::FormatOptions { features: "encrypt".into(), ..Default::default() };
        rext4::Fs::format(dev.as_ref(), &fmt).unwrap();
        let key = EncryptionKey::new(vec![3; 64]).unwrap();
        let opts =
            rext4::Options { writable: true, encryption_keys: vec![key.clone()], ..Default::default() };
        let fs = rext4::Fs::from_device(dev, opts).unwrap();
        let enc = fs.mkdir(fs.root(), b"enc", 0o755, 0, 0).unwrap().ino;
        fs.set_encryption_policy(enc, &key, 32).unwrap();
        let plain = fs.mkdir(fs.root(), b"plain", 0o755, 0, 0).unwrap().ino;
        let behavior = fs.error_behavior();
        let policy = crate::errno::ErrorPolicy::new(behavior);
        let a = Adapter { shared: Arc::new(Shared::new(fs, policy, Default::default())) };
        assert_eq!(a.entry_ttl(fuse_ino(enc)), Duration::ZERO);
        assert_eq!(a.entry_ttl(fuse_ino(plain)), TTL);
        a.shared.epoch_notify.store(true, Ordering::Relaxed);
        assert_eq!(a.entry_ttl(fuse_ino(enc)), TTL);
    }
}
