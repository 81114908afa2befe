//! Casefolded directories through the mount: `chattr +F`, names reached by any case, and the
//! kernel's name cache (keyed by bytes) never answering for another case of a name: a name
//! removed or created through one case is seen so through every other.

use super::*;

fn chattr(flag: &str, p: &std::path::Path) -> std::process::Output {
    std::process::Command::new("chattr").arg(flag).arg(p).output().unwrap()
}

#[test]
fn casefolded_directories_through_the_mount() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").features("casefold").build_in(dir.path(), "cf.img");
    let m = FuseMount::new(&img, "rw");
    let d = m.join("Docs");
    fs::create_dir(&d).unwrap();
    let out = chattr("+F", &d);
    assert!(out.status.success(), "chattr +F: {}", String::from_utf8_lossy(&out.stderr));
    let lsattr = std::process::Command::new("lsattr").arg("-d").arg(&d).output().unwrap();
    assert!(String::from_utf8_lossy(&lsattr.stdout).contains('F'), "lsattr shows +F");

    case_semantics(&d);
    let out = chattr("-F", &d);
    assert!(!out.status.success(), "chattr -F on a non-empty directory");
    // Elsewhere cases differ.
    fs::write(m.join("a"), b"a").unwrap();
    fs::write(m.join("A"), b"A").unwrap();
    assert_eq!(fs::read(m.join("a")).unwrap(), b"a");
    m.unmount();
    e2fsck_clean(&img);
}

/// What any case of a name does in casefolded directory `d` (empty), through the mount.
fn case_semantics(d: &std::path::Path) {
    // A name missed once (a negative entry) is found after another case of it is created.
    assert!(fs::metadata(d.join("notes.txt")).is_err());
    fs::write(d.join("NOTES.TXT"), b"one").unwrap();
    assert_eq!(fs::read(d.join("notes.txt")).unwrap(), b"one");
    assert_eq!(fs::read(d.join("Notes.Txt")).unwrap(), b"one");
    // Creating another case opens the same file; O_EXCL refuses it.
    fs::write(d.join("notes.TXT"), b"two").unwrap();
    assert_eq!(fs::read(d.join("NOTES.TXT")).unwrap(), b"two");
    let excl = OpenOptions::new().write(true).create_new(true).open(d.join("Notes.txt"));
    expect_errno(excl, libc::EEXIST, "O_EXCL on another case");
    let listed: Vec<_> = fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(listed, vec![std::ffi::OsString::from("NOTES.TXT")], "stored as first created");

    // Removed through one case: gone through every other the kernel had looked up.
    fs::remove_file(d.join("nOtEs.TxT")).unwrap();
    for n in ["notes.txt", "Notes.Txt", "NOTES.TXT", "notes.TXT"] {
        assert!(fs::metadata(d.join(n)).is_err(), "{n} after the removal");
    }
    // Renamed by case: one inode's two names, so nothing changes (as on kernel ext4).
    fs::write(d.join("Straße"), b"x").unwrap();
    fs::rename(d.join("Straße"), d.join("STRASSE")).unwrap();
    assert_eq!(fs::read_dir(d).unwrap().count(), 1);
    assert!(fs::metadata(d.join("strasse")).is_ok());
    // Subdirectories inherit the flag; the flag needs an empty directory.
    fs::create_dir(d.join("Sub")).unwrap();
    fs::write(d.join("SUB").join("Deep"), b"deep").unwrap();
    assert_eq!(fs::read(d.join("sub").join("DEEP")).unwrap(), b"deep");
}

/// An encrypted casefolded directory (its entries carry their hashes; made in process, the
/// host's kernel having no casefolding) through the mount with its key: the same semantics.
#[test]
fn encrypted_casefolded_directories_through_the_mount() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").features("casefold,encrypt").build_in(dir.path(), "ecf.img");
    let key: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(7)).collect();
    let key_file = dir.path().join("key");
    fs::write(&key_file, &key).unwrap();
    {
        let k = rext4::EncryptionKey::new(key.clone()).unwrap();
        let o =
            rext4::Options { writable: true, encryption_keys: vec![k.clone()], ..rext4::Options::default() };
        let fs = rext4::Fs::open_with(&img, o).unwrap();
        let d = fs.mkdir(fs.root(), b"Sec", 0o755, 0, 0).unwrap().ino;
        fs.set_encryption_policy(d, &k, 32).unwrap();
        fs.set_flags(d, fs.getattr(d).unwrap().flags | rext4::format::inode::CASEFOLD_FL).unwrap();
        fs.unmount().unwrap();
    }
    let m = FuseMount::new(&img, &format!("rw,key={}", key_file.display()));
    let d = m.join("Sec");
    case_semantics(&d);
    // Enough names to index it, each reached through another case.
    for i in 0..300 {
        fs::write(d.join(format!("Many-ǅ-{i}")), i.to_string()).unwrap();
    }
    for i in 0..300 {
        assert_eq!(fs::read_to_string(d.join(format!("MANY-Ǆ-{i}"))).unwrap(), i.to_string());
    }
    m.unmount();
    e2fsck_clean(&img);
}
