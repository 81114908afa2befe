//! The kernel's fscrypt ioctls on a loop mount, to make encrypted fixtures and to read them
//! back with their keys: `FS_IOC_ADD_ENCRYPTION_KEY` (v2 keys by identifier, v1 keys by
//! descriptor) and `FS_IOC_SET_ENCRYPTION_POLICY` (AES-256-XTS contents, AES-256-CTS names).

use std::os::fd::AsRawFd;
use std::path::Path;

nix::ioctl_readwrite_bad!(fs_ioc_add_encryption_key, 0xc050_6617, u8);
nix::ioctl_write_ptr_bad!(fs_ioc_set_encryption_policy, 0x800c_6613, u8);

/// Adds a master key to the filesystem mounted at `mnt`: for v2 policies (returns the
/// identifier the kernel derived) or, with a descriptor, for v1 ones.
pub fn fscrypt_add_key(mnt: &Path, key: &[u8], descriptor: Option<[u8; 8]>) -> [u8; 16] {
    // struct fscrypt_add_key_arg: key_spec (type, reserved, 32-byte union), raw_size,
    // key_id, 8 reserved words, then the raw key.
    let mut arg = vec![0u8; 80 + key.len()];
    match descriptor {
        Some(d) => {
            arg[0..4].copy_from_slice(&1u32.to_ne_bytes());
            arg[8..16].copy_from_slice(&d);
        }
        None => arg[0..4].copy_from_slice(&2u32.to_ne_bytes()),
    }
    arg[40..44].copy_from_slice(&(key.len() as u32).to_ne_bytes());
    arg[80..].copy_from_slice(key);
    let f = std::fs::File::open(mnt).expect("open the mount point");
    // SAFETY: `arg` holds the whole structure and the key after it, and outlives the call.
    unsafe { fs_ioc_add_encryption_key(f.as_raw_fd(), arg.as_mut_ptr()) }.expect("FS_IOC_ADD_ENCRYPTION_KEY");
    arg[8..24].try_into().expect("16 bytes")
}

/// Sets a policy on the empty directory `dir`: v2 with a 16-byte key identifier, v1 (policy
/// version 0) with an 8-byte descriptor; `flags` as the policy's (the low bits choose the
/// names' padding: 4 << flags).
pub fn fscrypt_set_policy(dir: &Path, key: &[u8], flags: u8) {
    let arg = match key.len() {
        16 => [&[2u8, 1, 4, flags, 0, 0, 0, 0][..], key].concat(),
        8 => [&[0u8, 1, 4, flags][..], key].concat(),
        n => panic!("a key identifier has 16 bytes and a descriptor 8, not {n}"),
    };
    let f = std::fs::File::open(dir).expect("open the directory");
    // SAFETY: `arg` is the policy structure of its version, read by the kernel only.
    unsafe { fs_ioc_set_encryption_policy(f.as_raw_fd(), arg.as_ptr()) }
        .expect("FS_IOC_SET_ENCRYPTION_POLICY");
}

/// Why the running kernel cannot be the encryption tests' oracle (no loop mounts, or ext4
/// without `CONFIG_FS_ENCRYPTION`), or None when it can. Panics under
/// `REXT4_REQUIRE_MOUNT=1` where the kernel mounts images but lacks encryption: the run asked
/// for the kernel comparisons.
pub fn why_no_fscrypt() -> Option<&'static str> {
    if let Some(why) = crate::why_no_kernel_mount() {
        return Some(why);
    }
    if Path::new("/sys/fs/ext4/features/encryption").exists() {
        return None;
    }
    if crate::kernel::mounts_required() {
        panic!("REXT4_REQUIRE_MOUNT=1 but this kernel's ext4 has no encryption (CONFIG_FS_ENCRYPTION)");
    }
    Some("this kernel's ext4 has no encryption (CONFIG_FS_ENCRYPTION)")
}

/// Returns from the calling test when the kernel cannot make and read encrypted directories
/// here (see [`why_no_fscrypt`]), saying why; `require_fscrypt!(value)` returns `value`.
#[macro_export]
macro_rules! require_fscrypt {
    () => {
        $crate::require_fscrypt!(())
    };
    ($ret:expr) => {
        $crate::skip_unless!($crate::why_no_fscrypt(), "no kernel with ext4 encryption", $ret)
    };
}
