//! `rext4 key` and `rext4 encrypt PATH`: encryption keys and policies on a mounted rext4
//! filesystem, through the ioctls its daemon answers (rext4-fuse's `fscrypt` module). The
//! kernel's own numbers of `FS_IOC_ADD_ENCRYPTION_KEY`, `_SET_ENCRYPTION_POLICY` and
//! `_GET_ENCRYPTION_POLICY_EX` cannot carry their arguments through FUSE, so `fscryptctl`
//! cannot do these three there; its `remove_key` and `key_status` send numbers the daemon
//! answers.

use crate::CliResult;
use rext4::format::fscrypt::{Context, KeySpec};
use rext4::EncryptionKey;
use rext4_fuse::fscrypt as abi;
use std::os::fd::AsRawFd;
use std::path::Path;

/// One restricted ioctl: `buf` is exactly the structure `cmd`'s number sizes, read and
/// written by the daemon through the kernel.
#[allow(unsafe_code)]
fn ioctl(path: &Path, cmd: u32, buf: &mut [u8]) -> std::io::Result<()> {
    // The size the number encodes is what the kernel copies in and out of `buf`.
    assert_eq!(buf.len(), ((cmd >> 16) & 0x3fff) as usize, "the structure of ioctl {cmd:#x}");
    let f = std::fs::File::open(path)?;
    // SAFETY: `buf` is valid for reads and writes of the whole size the command's number
    // gives (checked above), for the duration of the call; the descriptor is open.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::c_ulong::from(cmd), buf.as_mut_ptr()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn explain(what: &str, path: &Path, e: std::io::Error) -> String {
    let hint = match e.raw_os_error() {
        Some(libc::ENOTTY) => " (not a rext4 mount?)",
        Some(libc::ENOKEY) => " (the key is not added)",
        Some(libc::EOPNOTSUPP) => " (an image without the encrypt feature?)",
        _ => "",
    };
    format!("{what} '{}': {e}{hint}", path.display())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A key identifier (32 hex digits) or v1 descriptor (16).
fn parse_spec(id: &str) -> CliResult<KeySpec> {
    let bytes = (0..id.len() / 2)
        .map(|i| id.get(2 * i..2 * i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect::<Option<Vec<u8>>>()
        .filter(|_| id.len().is_multiple_of(2));
    match bytes {
        Some(b) if b.len() == 16 => Ok(KeySpec::Identifier(b.try_into().expect("16 bytes"))),
        Some(b) if b.len() == 8 => Ok(KeySpec::Descriptor(b.try_into().expect("8 bytes"))),
        _ => Err(format!("'{id}': a key identifier is 32 hex digits, a v1 descriptor 16")),
    }
}

/// `rext4 --key FILE key add PATH`: adds the keys given to the mounted filesystem holding
/// PATH; prints each one's identifier (v2) or descriptor (v1), as `fscryptctl add_key` does.
/// Without `--key`, a v2 key's raw bytes are read from standard input, as `fscryptctl
/// add_key` reads them.
pub(crate) fn add(path: &Path, keys: &[EncryptionKey], quiet: bool) -> CliResult {
    let from_stdin;
    let keys = if keys.is_empty() {
        from_stdin = [stdin_key()?];
        &from_stdin[..]
    } else {
        keys
    };
    for k in keys {
        add_one(path, k)?;
        if !quiet {
            println!("{}", k.id_hex());
        }
    }
    Ok(())
}

/// A v2 key's raw bytes from standard input (not a terminal).
fn stdin_key() -> CliResult<EncryptionKey> {
    use std::io::{IsTerminal, Read};
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Err(
            "key add: give the key with --key FILE (or --key-v1 DESCRIPTOR:FILE), or on standard input"
                .into(),
        );
    }
    let mut raw = Vec::new();
    // One byte past the largest key, to tell a longer input from a key.
    stdin.lock().take(abi::MAX_KEY as u64 + 1).read_to_end(&mut raw).map_err(|e| format!("key add: {e}"))?;
    EncryptionKey::new(raw).map_err(|e| format!("key add: the key on standard input: {e}"))
}

fn add_one(path: &Path, key: &EncryptionKey) -> CliResult {
    let descriptor = match key.spec() {
        KeySpec::Descriptor(d) => Some(d),
        KeySpec::Identifier(_) => None,
    };
    let mut arg = abi::add_key_arg(key.raw(), descriptor);
    let r = ioctl(path, abi::ADD_KEY, &mut arg);
    arg[80..].fill(0);
    r.map_err(|e| explain("cannot add the key to", path, e))
}

/// `rext4 key remove [--all-users] PATH ID`.
pub(crate) fn remove(path: &Path, id: &str, all_users: bool) -> CliResult {
    let spec = parse_spec(id)?;
    let mut arg = [0u8; 64];
    arg[..40].copy_from_slice(&abi::key_spec_bytes(spec));
    let cmd = if all_users { abi::REMOVE_KEY_ALL_USERS } else { abi::REMOVE_KEY };
    ioctl(path, cmd, &mut arg).map_err(|e| explain("cannot remove the key from", path, e))?;
    let flags = u32::from_ne_bytes(arg[40..44].try_into().expect("4 bytes"));
    if flags & abi::REMOVAL_OTHER_USERS != 0 {
        eprintln!("rext4: your claim to key {id} is gone, but other users have added it too");
    }
    Ok(())
}

/// `rext4 key status PATH ID`: as `fscryptctl key_status` prints it.
pub(crate) fn status(path: &Path, id: &str) -> CliResult {
    let spec = parse_spec(id)?;
    let mut arg = [0u8; 128];
    arg[..40].copy_from_slice(&abi::key_spec_bytes(spec));
    ioctl(path, abi::GET_KEY_STATUS, &mut arg).map_err(|e| explain("cannot query", path, e))?;
    let w = |at: usize| u32::from_ne_bytes(arg[at..at + 4].try_into().expect("4 bytes"));
    match w(64) {
        abi::STATUS_PRESENT => {
            let mine = if w(68) & abi::STATUS_FLAG_ADDED_BY_SELF != 0 { ", added_by_self" } else { "" };
            match spec {
                KeySpec::Identifier(_) => println!("Present (user_count={}{mine})", w(72)),
                KeySpec::Descriptor(_) => println!("Present"),
            }
        }
        abi::STATUS_ABSENT => println!("Absent"),
        other => println!("Unknown status ({other})"),
    }
    Ok(())
}

fn mode_name(m: u8) -> String {
    use rext4::format::fscrypt::*;
    match m {
        MODE_AES_256_XTS => "AES-256-XTS".into(),
        MODE_AES_256_CTS => "AES-256-CTS".into(),
        MODE_AES_128_CBC => "AES-128-CBC-ESSIV".into(),
        MODE_AES_128_CTS => "AES-128-CTS-CBC".into(),
        MODE_SM4_XTS => "SM4-XTS".into(),
        MODE_SM4_CTS => "SM4-CTS".into(),
        MODE_ADIANTUM => "Adiantum".into(),
        MODE_AES_256_HCTR2 => "AES-256-HCTR2".into(),
        m => format!("Unknown ({m})"),
    }
}

/// `rext4 key policy PATH`: the encryption policy of a file or directory on a mount, as
/// `fscryptctl get_policy` prints it.
pub(crate) fn policy(path: &Path) -> CliResult {
    let mut arg = [0u8; 8 + rext4::format::fscrypt::POLICY_V2_SIZE];
    arg[..8].copy_from_slice(&(rext4::format::fscrypt::POLICY_V2_SIZE as u64).to_ne_bytes());
    ioctl(path, abi::GET_POLICY_EX, &mut arg).map_err(|e| match e.raw_os_error() {
        Some(libc::ENODATA) => format!("'{}': not encrypted", path.display()),
        _ => explain("cannot read the policy of", path, e),
    })?;
    let p = Context::from_policy(&arg[8..]).map_err(|_| "the daemon sent a policy of no known version")?;
    println!("Encryption policy for {}:", path.display());
    match p.key {
        KeySpec::Identifier(id) => {
            println!("\tPolicy version: 2\n\tMaster key identifier: {}", hex(&id));
        }
        KeySpec::Descriptor(d) => println!("\tPolicy version: 1\n\tMaster key descriptor: {}", hex(&d)),
    }
    println!("\tContents encryption mode: {}", mode_name(p.contents_mode));
    println!("\tFilenames encryption mode: {}", mode_name(p.filenames_mode));
    let mut flags = vec![format!("PAD_{}", 4 << (p.flags & 3))];
    for (bit, name) in [(0x04, "DIRECT_KEY"), (0x08, "IV_INO_LBLK_64"), (0x10, "IV_INO_LBLK_32")] {
        if p.flags & bit != 0 {
            flags.push(name.into());
        }
    }
    println!("\tFlags: {}", flags.join(" "));
    if p.log2_data_unit_size != 0 {
        println!("\tData unit size: {}", 1u32 << p.log2_data_unit_size);
    }
    Ok(())
}

/// `rext4 --key FILE encrypt [--padding N] PATH` on a mount: adds the key (the kernel wants
/// a v2 key added by whoever sets a policy naming it; a v1 key where the caller may add it),
/// then sets the policy on the empty directory PATH.
pub(crate) fn encrypt(path: &Path, key: &EncryptionKey, padding: u8) -> CliResult {
    let flags = match padding {
        4 => 0,
        8 => 1,
        16 => 2,
        32 => 3,
        _ => return Err("--padding is 4, 8, 16 or 32".into()),
    };
    match (add_one(path, key), key.spec()) {
        (Ok(()), _) => {}
        // A v1 policy needs no key to be set, and only root adds v1 keys.
        (Err(_), KeySpec::Descriptor(_)) => {}
        (Err(e), KeySpec::Identifier(_)) => return Err(e),
    }
    let mut arg = [0u8; rext4::format::fscrypt::POLICY_V2_SIZE];
    match key.spec() {
        KeySpec::Identifier(id) => {
            arg[..4].copy_from_slice(&[2, 1, 4, flags]);
            arg[8..24].copy_from_slice(&id);
        }
        KeySpec::Descriptor(d) => {
            arg[..4].copy_from_slice(&[0, 1, 4, flags]);
            arg[4..12].copy_from_slice(&d);
        }
    }
    ioctl(path, abi::SET_POLICY, &mut arg).map_err(|e| explain("cannot encrypt", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ids_parse_by_length() {
        assert_eq!(
            parse_spec("00112233445566778899aabbccddeeff").unwrap(),
            KeySpec::Identifier([
                0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee,
                0xff
            ])
        );
        assert_eq!(parse_spec("7265787434763121").unwrap(), KeySpec::Descriptor(*b"rext4v1!"));
        for bad in ["", "123", "zz112233445566778899aabbccddeeff", "001122334455667788", "é1"] {
            assert!(parse_spec(bad).is_err(), "{bad}");
        }
    }
}
