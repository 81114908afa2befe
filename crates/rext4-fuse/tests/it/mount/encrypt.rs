//! Encrypted directories through the mount: with `-o key=FILE` the mount shows and writes
//! what kernel ext4 shows and writes with the same key (names, bytes, symlink targets, every
//! attribute); without it, the kernel's no-key names and `ENOKEY` for contents and new names.

use super::*;

fn key() -> Vec<u8> {
    (0..64u8).map(|i| i.wrapping_mul(37).wrapping_add(11)).collect()
}

/// An image whose `/enc` the kernel encrypted (v2 policy, names padded to 32) and filled.
fn encrypted_image(dir: &std::path::Path) -> std::path::PathBuf {
    let img = Image::ext4("128M").features("encrypt").build_in(dir, "e.img");
    let m = KernelMount::rw(&img).expect("mount");
    let id = fscrypt_add_key(m.path(), &key(), None);
    let enc = m.path().join("enc");
    fs::create_dir(&enc).unwrap();
    fscrypt_set_policy(&enc, &id, 3);
    fs::write(enc.join("kernel-file"), b"written by the kernel").unwrap();
    fs::create_dir(enc.join("kernel-dir")).unwrap();
    symlink("kernel-file", enc.join("kernel-link")).unwrap();
    for i in 0..200 {
        fs::write(enc.join(format!("many-{i:03}")), i.to_string()).unwrap();
    }
    m.unmount().unwrap();
    img
}

#[test]
fn encrypted_directory_through_the_mount_with_and_without_the_key() {
    require_fuse!();
    require_fscrypt!();
    let dir = tempfile::tempdir().unwrap();
    let img = encrypted_image(dir.path());
    let key_file = dir.path().join("key");
    fs::write(&key_file, key()).unwrap();

    let m = FuseMount::new(&img, &format!("rw,key={}", key_file.display()));
    let enc = m.join("enc");
    assert_eq!(fs::read(enc.join("kernel-file")).unwrap(), b"written by the kernel");
    assert_eq!(fs::read_link(enc.join("kernel-link")).unwrap(), std::path::Path::new("kernel-file"));
    assert_eq!(fs::read_dir(&enc).unwrap().count(), 203);
    // Writes of every shape into new encrypted files.
    let mut f = File::create(enc.join("kernel-dir/new")).unwrap();
    f.write_all(&vec![7u8; 10_000]).unwrap();
    f.write_all_at(b"middle", 4090).unwrap();
    f.set_len(9000).unwrap();
    f.write_all_at(b"past a hole", 20_000).unwrap();
    drop(f);
    let mut f = OpenOptions::new().append(true).open(enc.join("kernel-file")).unwrap();
    f.write_all(b", appended through the mount").unwrap();
    drop(f);
    fs::create_dir(enc.join("made/")).unwrap();
    symlink("/a/longer/target/".repeat(8), enc.join("made/link")).unwrap();
    fs::rename(enc.join("many-000"), enc.join("made/renamed")).unwrap();
    fs::remove_file(enc.join("many-001")).unwrap();
    expect_errno(fs::hard_link(m.join("lost+found"), enc.join("x")), libc::EPERM, "link of a directory");
    fs::write(m.join("plain"), b"plain").unwrap();
    expect_errno(fs::rename(m.join("plain"), enc.join("plain")), libc::EXDEV, "rename into another policy");
    let mut want = vec![7u8; 9000];
    want[4090..4096].copy_from_slice(b"middle");
    want.resize(20_000, 0);
    want.extend_from_slice(b"past a hole");
    assert_eq!(fs::read(enc.join("kernel-dir/new")).unwrap(), want);
    let mut seen = walk_kernel(m.path());
    m.unmount();
    e2fsck_clean(&img);
    let k = KernelMount::ro(&img).expect("kernel mount");
    fscrypt_add_key(k.path(), &key(), None);
    let mut kw = walk_kernel(k.path());
    drop(k);
    normalize_fuse(&mut seen);
    normalize_fuse(&mut kw);
    assert_no_diff(
        "FUSE mount with the key vs kernel with the key",
        &diff_full("fuse", &seen, "kernel", &kw),
    );

    // Without the key: the kernel's no-key names, ENOKEY for contents and new names.
    let k = KernelMount::ro(&img).expect("kernel mount");
    let mut kernel_names: Vec<_> =
        fs::read_dir(k.path().join("enc")).unwrap().map(|e| e.unwrap().file_name()).collect();
    drop(k);
    let m = FuseMount::new(&img, "rw");
    let enc = m.join("enc");
    let mut names: Vec<_> = fs::read_dir(&enc).unwrap().map(|e| e.unwrap().file_name()).collect();
    kernel_names.sort();
    names.sort();
    assert_eq!(names, kernel_names);
    let file = names.iter().map(|n| enc.join(n)).find(|p| p.symlink_metadata().unwrap().len() == 49).unwrap();
    expect_errno(fs::read(&file), libc::ENOKEY, "read without the key");
    expect_errno(fs::write(enc.join("new"), b"x"), libc::ENOKEY, "create without the key");
    expect_errno(fs::create_dir(enc.join("new")), libc::ENOKEY, "mkdir without the key");
    fs::remove_file(&file).unwrap();
    m.unmount();
    e2fsck_clean(&img);
}

/// One ioctl on `path` with `buf` as its argument: the errno, or 0.
fn ioctl_on(path: &std::path::Path, cmd: u32, buf: &mut [u8]) -> i32 {
    use std::os::fd::AsRawFd;
    let f = File::open(path).unwrap();
    // SAFETY: `buf` is as large as the size `cmd` encodes (every caller passes that), valid
    // for the call; the descriptor is open.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::c_ulong::from(cmd), buf.as_mut_ptr()) };
    if r < 0 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    } else {
        0
    }
}

/// fscrypt's ioctls through the mount, as the daemon answers them: the kernel's own numbers
/// where FUSE carries their arguments (key status, removal, nonce), `ENOTTY` where it cannot
/// (the kernel's add-key and policy numbers), rext4's numbers for those; the kernel's errors
/// for a policy on a file, a non-empty directory, an existing policy, a bad version, a
/// policy buffer too small, and on a read-only mount. The kernel reads what was written.
#[test]
fn fscrypt_ioctls_through_the_mount() {
    use rext4_fuse::fscrypt as abi;
    require_fuse!();
    require_fscrypt!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").features("encrypt").build_in(dir.path(), "i.img");
    let m = FuseMount::new(&img, "rw");
    let (d, f) = (m.join("d"), m.join("f"));
    fs::create_dir(&d).unwrap();
    fs::write(&f, b"plain").unwrap();

    // The kernel's add-key number carries no key through FUSE.
    let mut kernel_arg = vec![0u8; 80];
    kernel_arg[0] = 2;
    assert_eq!(ioctl_on(m.path(), 0xC050_6617, &mut kernel_arg), libc::ENOTTY);
    let mut arg = abi::add_key_arg(&key(), None);
    assert_eq!(ioctl_on(m.path(), abi::ADD_KEY, &mut arg), 0);
    let id: [u8; 16] = arg[8..24].try_into().unwrap();
    assert!(arg[80..].iter().all(|&b| b == 0), "the key does not come back");
    let mut bad = abi::add_key_arg(&key()[..15], None);
    assert_eq!(ioctl_on(m.path(), abi::ADD_KEY, &mut bad), libc::EINVAL, "15-byte key");
    let mut bad = abi::add_key_arg(&key(), None);
    bad[44] = 1;
    assert_eq!(ioctl_on(m.path(), abi::ADD_KEY, &mut bad), libc::EOPNOTSUPP, "a keyring key");

    let mut status = [0u8; 128];
    status[..40].copy_from_slice(&abi::key_spec_bytes(rext4::format::fscrypt::KeySpec::Identifier(id)));
    assert_eq!(ioctl_on(m.path(), abi::GET_KEY_STATUS, &mut status), 0);
    assert_eq!(u32::from_ne_bytes(status[64..68].try_into().unwrap()), abi::STATUS_PRESENT);

    let policy = |flags: u8| {
        let mut p = [0u8; 24];
        p[..4].copy_from_slice(&[2, 1, 4, flags]);
        p[8..].copy_from_slice(&id);
        p
    };
    // The kernel's set-policy number is a read through FUSE: refused.
    assert_eq!(ioctl_on(&d, 0x800C_6613, &mut policy(3)[..12].to_vec()), libc::ENOTTY);
    assert_eq!(ioctl_on(&f, abi::SET_POLICY, &mut policy(3)), libc::ENOTDIR);
    assert_eq!(ioctl_on(m.path(), abi::SET_POLICY, &mut policy(3)), libc::ENOTEMPTY);
    let mut v9 = policy(3);
    v9[0] = 9;
    assert_eq!(ioctl_on(&d, abi::SET_POLICY, &mut v9), libc::EINVAL);
    assert_eq!(ioctl_on(&d, abi::SET_POLICY, &mut policy(3)), 0);
    assert_eq!(ioctl_on(&d, abi::SET_POLICY, &mut policy(0)), libc::EEXIST);
    let mut get = [0u8; 32];
    get[..8].copy_from_slice(&12u64.to_ne_bytes());
    assert_eq!(ioctl_on(&d, abi::GET_POLICY_EX, &mut get), libc::EOVERFLOW);
    get[..8].copy_from_slice(&24u64.to_ne_bytes());
    assert_eq!(ioctl_on(&d, abi::GET_POLICY_EX, &mut get), 0);
    assert_eq!((u64::from_ne_bytes(get[..8].try_into().unwrap()), &get[8..]), (24, &policy(3)[..]));
    assert_eq!(ioctl_on(&f, abi::GET_POLICY_EX, &mut get), libc::ENODATA);
    fs::write(d.join("a"), b"one").unwrap();
    fs::write(d.join("b"), b"two").unwrap();
    let (mut na, mut nb) = ([0u8; 16], [0u8; 16]);
    assert_eq!(ioctl_on(&d.join("a"), abi::GET_NONCE, &mut na), 0);
    assert_eq!(ioctl_on(&d.join("b"), abi::GET_NONCE, &mut nb), 0);
    assert_ne!(na, nb);
    assert_eq!(ioctl_on(&f, abi::GET_NONCE, &mut na), libc::ENODATA);
    let mut remove = [0u8; 64];
    remove[..40].copy_from_slice(&status[..40]);
    assert_eq!(ioctl_on(m.path(), abi::REMOVE_KEY, &mut remove), 0);
    assert_eq!(ioctl_on(m.path(), abi::REMOVE_KEY, &mut remove), libc::ENOKEY);
    expect_errno(fs::read(d.join("a")), libc::ENOENT, "a plaintext name without the key");
    m.unmount();
    e2fsck_clean(&img);

    let ro = FuseMount::new(&img, "ro");
    assert_eq!(
        ioctl_on(ro.path(), abi::ADD_KEY, &mut abi::add_key_arg(&key(), None)),
        0,
        "keys on ro mounts"
    );
    assert_eq!(fs::read(ro.join("d/a")).unwrap(), b"one");
    assert_eq!(ioctl_on(&ro.join("lost+found"), abi::SET_POLICY, &mut policy(3)), libc::EROFS);
    ro.unmount();
    let k = KernelMount::ro(&img).expect("kernel mount");
    fscrypt_add_key(k.path(), &key(), None);
    assert_eq!(fs::read(k.path().join("d/b")).unwrap(), b"two");
}
