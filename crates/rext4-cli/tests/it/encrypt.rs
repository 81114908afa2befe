//! `--key FILE` (and `--key-v1 DESCRIPTOR:FILE`) on images with encrypted directories the
//! kernel made: with the key the commands read and write plaintext names and bytes (what the
//! kernel then reads with the same key), without it they list the kernel's no-key names and
//! refuse contents with `ENOKEY`'s message; `rext4 encrypt` sets a policy the kernel then
//! reads under. e2fsck is clean after each change.

use rext4_testkit::{e2fsck_clean, fscrypt_add_key, fscrypt_set_policy, require_fscrypt, Image, KernelMount};
use std::process::{Command, Output};

fn rext4(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rext4")).args(args).output().expect("run rext4")
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn commands_take_encryption_keys() {
    require_fscrypt!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").features("encrypt").build_in(dir.path(), "e.img");
    let key: Vec<u8> = (0..64u8).rev().collect();
    let v1: Vec<u8> = (100..164u8).collect();
    let (kf, v1f) = (dir.path().join("k"), dir.path().join("k1"));
    std::fs::write(&kf, &key).unwrap();
    std::fs::write(&v1f, &v1).unwrap();
    let kernel_names = {
        let m = KernelMount::rw(&img).expect("mount");
        let id = fscrypt_add_key(m.path(), &key, None);
        fscrypt_add_key(m.path(), &v1, Some(*b"\x01\x23\x45\x67\x89\xab\xcd\xef"));
        for (d, k) in [("enc", &id[..]), ("encv1", &b"\x01\x23\x45\x67\x89\xab\xcd\xef"[..])] {
            std::fs::create_dir(m.path().join(d)).unwrap();
            fscrypt_set_policy(&m.path().join(d), k, 0);
            std::fs::write(m.path().join(d).join("secret.txt"), b"the plaintext\n").unwrap();
        }
        m.unmount().unwrap();
        let m = KernelMount::ro(&img).expect("mount");
        let mut n: Vec<String> = std::fs::read_dir(m.path().join("enc"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        n.sort();
        n
    };
    let img_s = img.to_str().unwrap();
    let at = |p: &str| format!("{img_s}:{p}");
    let (key_arg, v1_arg) = (kf.to_str().unwrap(), format!("0123456789abcdef:{}", v1f.display()));

    assert_eq!(ok(rext4(&["--key", key_arg, "cat", &at("/enc/secret.txt")])), "the plaintext\n");
    assert_eq!(ok(rext4(&["--key-v1", &v1_arg, "cat", &at("/encv1/secret.txt")])), "the plaintext\n");
    let listed = ok(rext4(&["ls", &at("/enc")]));
    let mut listed: Vec<&str> = listed.lines().collect();
    listed.sort();
    assert_eq!(listed, kernel_names, "no-key names as the kernel lists them");
    let o = rext4(&["cat", &at(&format!("/enc/{}", kernel_names[0]))]);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).to_lowercase().contains("key"),
        "{o:?}"
    );
    let o = rext4(&["--key", "/nonexistent/key", "ls", &at("/")]);
    assert!(!o.status.success());

    ok(rext4(&["--key", key_arg, "mkdir", &at("/enc/made")]));
    let src = dir.path().join("src");
    std::fs::write(&src, vec![42u8; 70_000]).unwrap();
    ok(rext4(&["--key", key_arg, "cp", src.to_str().unwrap(), &at("/enc/made/copied")]));
    // A directory encrypted by the command itself.
    ok(rext4(&["mkdir", &at("/fresh")]));
    assert!(!rext4(&["encrypt", &at("/fresh")]).status.success(), "encrypt needs a key");
    ok(rext4(&["--key", key_arg, "encrypt", "--padding", "16", &at("/fresh")]));
    ok(rext4(&["--key", key_arg, "cp", src.to_str().unwrap(), &at("/fresh/copied")]));
    assert!(!rext4(&["--key", key_arg, "encrypt", &at("/enc/made")]).status.success(), "another policy");
    e2fsck_clean(&img);
    let m = KernelMount::ro(&img).expect("mount");
    fscrypt_add_key(m.path(), &key, None);
    assert_eq!(std::fs::read(m.path().join("enc/made/copied")).unwrap(), vec![42u8; 70_000]);
    assert_eq!(std::fs::read(m.path().join("fresh/copied")).unwrap(), vec![42u8; 70_000]);
}
