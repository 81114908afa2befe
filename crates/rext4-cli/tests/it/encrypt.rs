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

/// Runs the command as user 65534 (`setpriv`), as a user of the mount does.
fn rext4_as_nobody(args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", env!("CARGO_BIN_EXE_rext4")])
        .args(args)
        .output()
        .expect("run setpriv")
}

fn failed_with(o: &Output, what: &str) -> bool {
    !o.status.success() && String::from_utf8_lossy(&o.stderr).contains(what)
}

fn names(dir: &std::path::Path) -> Vec<String> {
    let mut n: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    n.sort();
    n
}

/// Keys and policies through a mount, as a user of `fscrypt` works on kernel ext4: `rext4
/// key add` shows a tree the kernel encrypted, `rext4 encrypt` encrypts a directory of the
/// mount, `rext4 key status` and `policy` report as `fscryptctl` does; keys held per user
/// (another user's claim keeps a key root removed, each user encrypts only what they own);
/// after a key goes, the mount shows the kernel's no-key names again. What was written
/// through the mount the kernel reads with the keys; e2fsck is clean.
#[test]
fn keys_and_policies_through_a_mount() {
    require_fscrypt!();
    rext4_testkit::require_fuse!();
    if rext4_testkit::find_tool("setpriv").is_none() {
        eprintln!("SKIP: setpriv (util-linux) is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Reachable by user 65534 (the temporary directory is root's alone).
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let img = Image::ext4("64M").features("encrypt").build_in(dir.path(), "m.img");
    let keys: Vec<Vec<u8>> = (0..3u8).map(|k| (0..64u8).map(|i| i.wrapping_mul(7) ^ k).collect()).collect();
    let files: Vec<String> = (0..3)
        .map(|k| {
            let f = dir.path().join(format!("key{k}"));
            std::fs::write(&f, &keys[k]).unwrap();
            std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
            f.to_str().unwrap().to_string()
        })
        .collect();
    let (kernel_nokey, id0) = {
        let m = KernelMount::rw(&img).expect("mount");
        let id = fscrypt_add_key(m.path(), &keys[0], None);
        std::fs::create_dir(m.path().join("kenc")).unwrap();
        fscrypt_set_policy(&m.path().join("kenc"), &id, 3);
        for i in 0..20 {
            std::fs::write(m.path().join(format!("kenc/file-{i}")), format!("kernel file {i}")).unwrap();
        }
        std::fs::create_dir(m.path().join("nobody")).unwrap();
        std::os::unix::fs::chown(m.path().join("nobody"), Some(65534), Some(65534)).unwrap();
        m.unmount().unwrap();
        let m = KernelMount::ro(&img).expect("mount");
        let n = names(&m.path().join("kenc"));
        m.unmount().unwrap();
        (n, id.iter().map(|b| format!("{b:02x}")).collect::<String>())
    };
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let mps = mp.to_str().unwrap();
    ok(rext4(&["mount", img.to_str().unwrap(), mps, "-o", "allow_other"]));
    let kenc = mp.join("kenc");

    // Without the key: the kernel's no-key names and ENOKEY.
    assert_eq!(names(&kenc), kernel_nokey);
    assert_eq!(std::fs::read(kenc.join(&kernel_nokey[0])).unwrap_err().raw_os_error(), Some(libc::ENOKEY));
    // The key added through the mount: the tree shows as the kernel shows it with the key.
    assert_eq!(ok(rext4(&["--key", &files[0], "key", "add", mps])).trim(), id0);
    // The key on standard input, as fscryptctl takes it: the same identifier; 65 bytes refused.
    let piped = |bytes: &[u8]| {
        use std::io::Write;
        let mut c = Command::new(env!("CARGO_BIN_EXE_rext4"))
            .args(["key", "add", mps])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(bytes).unwrap();
        c.wait_with_output().unwrap()
    };
    assert_eq!(ok(piped(&keys[0])).trim(), id0);
    assert!(failed_with(&piped(&[1; 65]), "16 to 64 bytes"));
    assert_eq!(std::fs::read_to_string(kenc.join("file-7")).unwrap(), "kernel file 7");
    assert_eq!(names(&kenc).len(), 20);
    assert!(names(&kenc).contains(&"file-19".to_string()));
    assert_eq!(ok(rext4(&["key", "status", mps, &id0])).trim(), "Present (user_count=1, added_by_self)");

    // A directory of the mount encrypted with a second key, filled through the mount.
    let vault = mp.join("vault");
    std::fs::create_dir(&vault).unwrap();
    ok(rext4(&["--key", &files[1], "encrypt", "--padding", "16", vault.to_str().unwrap()]));
    std::fs::write(vault.join("secret"), b"through the mount").unwrap();
    std::fs::create_dir(vault.join("sub")).unwrap();
    std::os::unix::fs::symlink("../secret", vault.join("sub/link")).unwrap();
    let id1 = ok(rext4(&["--key", &files[1], "key", "add", mps])).trim().to_string();
    let policy = ok(rext4(&["key", "policy", vault.join("sub").to_str().unwrap()]));
    assert!(policy.contains(&format!("Master key identifier: {id1}")), "{policy}");
    assert!(policy.contains("Policy version: 2") && policy.contains("Flags: PAD_16"), "{policy}");
    assert!(failed_with(&rext4(&["key", "policy", mps]), "not encrypted"));
    assert!(failed_with(&rext4(&["--key", &files[1], "encrypt", kenc.to_str().unwrap()]), "File exists"));

    // Another user: encrypts what it owns with its own key, not root's directories; holds
    // its own claim on the first key.
    let nob = mp.join("nobody");
    ok(rext4_as_nobody(&["--key", &files[2], "encrypt", nob.to_str().unwrap()]));
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c"])
        .arg(format!("echo mine > {}/note", nob.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    // A v1 policy is set without its key, which only root may add.
    let v1dir = mp.join("nobody-v1");
    std::fs::create_dir(&v1dir).unwrap();
    std::os::unix::fs::chown(&v1dir, Some(65534), Some(65534)).unwrap();
    let v1_arg = format!("0123456789abcdef:{}", files[2]);
    assert!(failed_with(&rext4_as_nobody(&["--key-v1", &v1_arg, "key", "add", mps]), "denied"));
    ok(rext4_as_nobody(&["--key-v1", &v1_arg, "encrypt", v1dir.to_str().unwrap()]));
    let policy = ok(rext4_as_nobody(&["key", "policy", v1dir.to_str().unwrap()]));
    assert!(
        policy.contains("Policy version: 1") && policy.contains("descriptor: 0123456789abcdef"),
        "{policy}"
    );
    let theirs = mp.join("roots");
    std::fs::create_dir(&theirs).unwrap();
    assert!(failed_with(
        &rext4_as_nobody(&["--key", &files[2], "encrypt", theirs.to_str().unwrap()]),
        "denied"
    ));
    assert!(failed_with(&rext4_as_nobody(&["key", "remove", mps, &id0]), "key"), "never added by nobody");
    ok(rext4_as_nobody(&["--key", &files[0], "key", "add", "-q", mps]));
    assert_eq!(
        ok(rext4_as_nobody(&["key", "status", mps, &id0])).trim(),
        "Present (user_count=2, added_by_self)"
    );
    let o = rext4(&["key", "remove", mps, &id0]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stderr).contains("other users"), "{o:?}");
    assert_eq!(ok(rext4(&["key", "status", mps, &id0])).trim(), "Present (user_count=1)");
    assert_eq!(std::fs::read_to_string(kenc.join("file-7")).unwrap(), "kernel file 7");
    // The last claim gone: no-key names again, the plaintext names gone from the kernel's cache.
    ok(rext4_as_nobody(&["key", "remove", mps, &id0]));
    assert_eq!(ok(rext4(&["key", "status", mps, &id0])).trim(), "Absent");
    assert_eq!(names(&kenc), kernel_nokey);
    assert_eq!(std::fs::metadata(kenc.join("file-7")).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    assert!(failed_with(&rext4_as_nobody(&["key", "remove", "--all-users", mps, &id1]), "denied"));
    ok(rext4(&["key", "remove", "--all-users", mps, &id1]));
    assert_eq!(names(&vault).len(), 2);
    assert!(!names(&vault).contains(&"secret".to_string()));
    assert!(failed_with(&rext4(&["key", "status", mps, "xyz"]), "hex"));

    super::mount::umount(&mp);
    super::mount::wait_unlocked(&img);
    e2fsck_clean(&img);
    let m = KernelMount::ro(&img).expect("mount");
    for k in &keys {
        fscrypt_add_key(m.path(), k, None);
    }
    assert_eq!(std::fs::read(m.path().join("vault/sub/link")).unwrap(), b"through the mount");
    assert_eq!(std::fs::read(m.path().join("nobody/note")).unwrap(), b"mine\n");
    assert_eq!(names(&m.path().join("kenc")).len(), 20);
}
