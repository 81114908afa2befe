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
