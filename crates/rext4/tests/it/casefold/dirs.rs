//! Casefolded directories written and read by rext4: names found by their folded form, kept
//! as created, refused where another case of them exists; indexed directories hashed by the
//! folded form (e2fsck checks every hash); strict encoding; `chattr +F` and its inheritance;
//! directories e2fsprogs indexed. The host's kernel has no `CONFIG_UNICODE` (it cannot mount
//! `casefold` images), so e2fsprogs is the oracle here; kernel.rs compares with a kernel
//! booted in a VM.

use rext4::format::inode::{CASEFOLD_FL, INDEX_FL, INLINE_DATA_FL};
use rext4::{Error, Fs, InodeNo, Options};
use rext4_testkit::{e2fsck_clean, e2fsck_reindex, tool, Image};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn image(dir: &Path, name: &str, extended: &str) -> PathBuf {
    let mut i = Image::ext4("32M").features("casefold");
    if !extended.is_empty() {
        i = i.extended(extended);
    }
    i.build_in(dir, name)
}

fn rw(img: &Path) -> Fs {
    Fs::open_with(img, Options { writable: true, ..Options::default() }).unwrap()
}

/// A new casefolded directory `name` under the root.
fn folded_dir(fs: &Fs, name: &[u8]) -> InodeNo {
    let d = fs.mkdir(fs.root(), name, 0o755, 0, 0).unwrap().ino;
    let flags = fs.getattr(d).unwrap().flags;
    fs.set_flags(d, flags | CASEFOLD_FL).unwrap();
    assert!(fs.folds_names(d));
    d
}

fn names(fs: &Fs, dir: InodeNo) -> BTreeSet<Vec<u8>> {
    let mut v = BTreeSet::new();
    fs.readdir(dir, 0, |e| {
        if e.name != b"." && e.name != b".." {
            v.insert(e.name);
        }
        true
    })
    .unwrap();
    v
}

fn debugfs(img: &Path, cmd: &str) -> String {
    let o = std::process::Command::new(tool("debugfs")).args(["-R", cmd]).arg(img).output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn names_are_found_by_their_folded_form_and_kept_as_created() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "cf", "");
    let fs = rw(&img);
    let d = folded_dir(&fs, b"Folded");
    let file = fs.create(d, "Straße.TXT".as_bytes(), 0o644, 0, 0).unwrap().ino;
    let readme = fs.create(d, b"README", 0o644, 0, 0).unwrap().ino;
    for other in ["STRASSE.txt", "strasse.txt", "Straße.txt", "STRAẞE.TXT"] {
        assert_eq!(fs.lookup(d, other.as_bytes()).unwrap().ino, file, "{other}");
    }
    assert_eq!(fs.lookup(d, b"readme").unwrap().ino, readme);
    // Another case of an existing name is that name.
    assert!(matches!(fs.create(d, b"ReadMe", 0o644, 0, 0), Err(Error::Exists)));
    assert!(matches!(fs.mkdir(d, b"readme", 0o755, 0, 0), Err(Error::Exists)));
    assert!(matches!(fs.link(readme, d, b"rEADME"), Err(Error::Exists)));
    assert!(matches!(fs.symlink(d, b"STRASSE.TXT", b"x", 0, 0), Err(Error::Exists)));
    // A rename onto another case of its own name is one inode's two names: nothing changes.
    fs.rename(d, b"readme", d, b"README", 0).unwrap();
    assert_eq!(names(&fs, d), BTreeSet::from([b"README".to_vec(), "Straße.TXT".as_bytes().to_vec()]));
    // A rename over another case of another name points that entry at the moved inode; the
    // entry keeps its name (the kernel's `ext4_setent`).
    let other = fs.create(d, b"other", 0o644, 0, 0).unwrap().ino;
    fs.rename(d, b"OTHER", d, b"readMe", 0).unwrap();
    assert_eq!(fs.lookup(d, b"README").unwrap().ino, other);
    assert!(matches!(fs.lookup(d, b"other"), Err(Error::NotFound)));
    // Removal through any case.
    fs.unlink(d, b"STRASSE.TXT").unwrap();
    assert!(matches!(fs.lookup(d, "Straße.TXT".as_bytes()), Err(Error::NotFound)));
    fs.mkdir(d, b"Sub", 0o755, 0, 0).unwrap();
    fs.rmdir(d, b"SUB").unwrap();
    assert!(matches!(fs.lookup(d, b"Sub"), Err(Error::NotFound)));
    // A directory without the flag beside it still tells cases apart.
    let plain = fs.mkdir(fs.root(), b"plain", 0o755, 0, 0).unwrap().ino;
    assert!(!fs.folds_names(plain));
    fs.create(plain, b"a", 0o644, 0, 0).unwrap();
    fs.create(plain, b"A", 0o644, 0, 0).unwrap();
    assert!(matches!(fs.lookup(plain, b"\xc3\x81"), Err(Error::NotFound)));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    // e2fsprogs sees the names as they were made.
    let ls = debugfs(&img, "ls -l /Folded");
    assert!(ls.contains(" README\n") && !ls.contains("other") && !ls.contains("readMe"), "{ls}");
}

/// Names of many scripts and cases: enough to index the directory several levels of leaves
/// deep, whose hashes e2fsck recomputes from the folded names.
pub(super) fn many_names(n: usize) -> Vec<String> {
    let stems = ["Straße", "ÅNGSTRÖM", "Ωmega", "İstanbul", "ﬃx", "Ǆemal", "한국어", "Ꭰ", "file"];
    (0..n)
        .map(|i| format!("{}-{i:05}-{}", stems[i % stems.len()], ["", "Ä", "e\u{301}", "\u{200D}z"][i % 4]))
        .collect()
}

/// `img` opened for writing with a new casefolded directory `dir` holding `names`.
fn filled(img: &Path, dir: &[u8], names: &[String]) -> (Fs, InodeNo) {
    let fs = rw(img);
    let d = folded_dir(&fs, dir);
    for n in names {
        fs.create(d, n.as_bytes(), 0o644, 0, 0).unwrap();
    }
    (fs, d)
}

#[test]
fn an_indexed_casefolded_directory_hashes_folded_names() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "dx", "");
    let names_in = many_names(3000);
    {
        let (fs, d) = filled(&img, b"big", &names_in);
        assert_ne!(fs.getattr(d).unwrap().flags & INDEX_FL, 0, "the directory is indexed");
        for n in &names_in {
            let up = n.to_uppercase();
            assert!(fs.lookup(d, up.as_bytes()).is_ok(), "{up}");
        }
        // Remove a third through another case.
        for n in names_in.iter().step_by(3) {
            fs.unlink(d, n.to_lowercase().as_bytes()).unwrap();
        }
        fs.unmount().unwrap();
    }
    e2fsck_clean(&img);
    // Reopened: every name left, found by another case, and readdir lists each once.
    let fs = Fs::open(&img).unwrap();
    assert!(matches!(fs.lookup(fs.root(), b"BIG"), Err(Error::NotFound)), "the root is not casefolded");
    let d = fs.lookup(fs.root(), b"big").unwrap().ino;
    let want: BTreeSet<Vec<u8>> =
        names_in.iter().enumerate().filter(|(i, _)| i % 3 != 0).map(|(_, n)| n.as_bytes().to_vec()).collect();
    assert_eq!(names(&fs, d), want);
    for n in &want {
        let upper = String::from_utf8_lossy(n).to_uppercase();
        assert!(fs.lookup(d, upper.as_bytes()).is_ok(), "{upper}");
    }
}

#[test]
fn directories_e2fsprogs_indexed_are_searched_by_folded_hash() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "e2", "");
    let names_in = many_names(1500);
    filled(&img, b"d", &names_in).0.unmount().unwrap();
    // e2fsck rebuilds every index with its own hashes.
    e2fsck_reindex(&img);
    e2fsck_clean(&img);
    let fs = rw(&img);
    let d = fs.lookup(fs.root(), b"d").unwrap().ino;
    for n in &names_in {
        assert!(fs.lookup(d, n.to_uppercase().as_bytes()).is_ok(), "{n}");
    }
    // Inserting into and removing from e2fsck's index keeps it whole.
    for n in names_in.iter().step_by(2) {
        fs.unlink(d, n.to_uppercase().as_bytes()).unwrap();
    }
    for i in 0..500 {
        fs.create(d, format!("NEW-ǅ-{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}

/// Runs `f` on a new casefolded directory of a fresh image made with `-E extended`, then
/// unmounts it and judges the image.
fn on_folded_dir(extended: &str, f: impl FnOnce(&Fs, InodeNo)) {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "img", extended);
    let fs = rw(&img);
    f(&fs, folded_dir(&fs, b"d"));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}

#[test]
fn strict_encoding_refuses_names_that_are_not_utf8() {
    on_folded_dir("encoding_flags=strict", |fs, d| {
        let plain = fs.mkdir(fs.root(), b"plain", 0o755, 0, 0).unwrap().ino;
        let bad = b"bad\xff";
        assert!(matches!(fs.create(d, bad, 0o644, 0, 0), Err(Error::InvalidInput(_))));
        assert!(matches!(fs.mkdir(d, b"\xed\xa0\x80", 0o755, 0, 0), Err(Error::InvalidInput(_))));
        // Elsewhere the name is fine; moving or linking it into the folded directory is not.
        let f = fs.create(plain, bad, 0o644, 0, 0).unwrap().ino;
        assert!(matches!(fs.link(f, d, bad), Err(Error::InvalidInput(_))));
        assert!(matches!(fs.rename(plain, bad, d, bad, 0), Err(Error::InvalidInput(_))));
        fs.rename(plain, bad, d, b"good", 0).unwrap();
        assert_eq!(names(fs, d), BTreeSet::from([b"good".to_vec()]));
    });
}

#[test]
fn without_strict_encoding_other_names_match_by_their_bytes() {
    on_folded_dir("", |fs, d| {
        let f = fs.create(d, b"Bad\xff", 0o644, 0, 0).unwrap().ino;
        assert_eq!(fs.lookup(d, b"Bad\xff").unwrap().ino, f);
        assert!(matches!(fs.lookup(d, b"bad\xff"), Err(Error::NotFound)));
        fs.create(d, b"bad\xff", 0o644, 0, 0).unwrap();
        assert_eq!(names(fs, d).len(), 2);
    });
}

#[test]
fn the_flag_changes_only_on_empty_directories_and_passes_to_subdirectories() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "flags", "");
    let fs = rw(&img);
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(d, b"f", 0o644, 0, 0).unwrap().ino;
    let flags = fs.getattr(d).unwrap().flags;
    assert!(matches!(fs.set_flags(d, flags | CASEFOLD_FL), Err(Error::NotEmpty)));
    let fflags = fs.getattr(f).unwrap().flags;
    assert!(matches!(fs.set_flags(f, fflags | CASEFOLD_FL), Err(Error::NotSupported(_))));
    fs.unlink(d, b"f").unwrap();
    fs.set_flags(d, flags | CASEFOLD_FL).unwrap();
    let sub = fs.mkdir(d, b"Sub", 0o755, 0, 0).unwrap().ino;
    let file = fs.create(d, b"File", 0o644, 0, 0).unwrap().ino;
    let link = fs.symlink(d, b"Link", b"File", 0, 0).unwrap().ino;
    assert_ne!(fs.getattr(sub).unwrap().flags & CASEFOLD_FL, 0, "a subdirectory inherits it");
    assert_eq!(fs.getattr(file).unwrap().flags & CASEFOLD_FL, 0);
    assert_eq!(fs.getattr(link).unwrap().flags & CASEFOLD_FL, 0);
    assert!(fs.lookup(sub, b"x").is_err());
    fs.create(sub, b"Deep", 0o644, 0, 0).unwrap();
    assert!(fs.lookup(sub, b"DEEP").is_ok());
    // Clearing it needs the directory empty too.
    assert!(matches!(fs.set_flags(d, flags), Err(Error::NotEmpty)));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);

    // Without the feature the flag cannot be set.
    let plain = Image::ext4("8M").build_in(dir.path(), "plain");
    let fs = rw(&plain);
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    let flags = fs.getattr(d).unwrap().flags;
    assert!(matches!(fs.set_flags(d, flags | CASEFOLD_FL), Err(Error::NotSupported(_))));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&plain);
}

#[test]
fn an_unknown_encoding_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "enc", "");
    let o = std::process::Command::new(tool("debugfs"))
        .args(["-w", "-R", "ssv encoding 7"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(o.status.success());
    match Fs::open(&img) {
        Err(e) => assert!(matches!(e, Error::Incompatible(ref m) if m.contains("encoding")), "{e}"),
        Ok(_) => panic!("an image with an unknown encoding opened"),
    }
}

/// Without strict encoding, names that are not UTF-8 are hashed by their bytes in an indexed
/// casefolded directory (the kernel's `ext4fs_dirhash`): e2fsck finds them where they are, and
/// after e2fsck rebuilds the index rext4 still finds them.
#[test]
fn names_without_a_folded_form_in_an_index() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "inv", "");
    let bad: [&[u8]; 3] = [b"bad-\xff-x", b"\xff", b"\xed\xa0\x80surrogate"];
    {
        let fs = rw(&img);
        let d = folded_dir(&fs, b"d");
        for i in 0..400 {
            fs.create(d, format!("name-{i:04}").as_bytes(), 0o644, 0, 0).unwrap();
        }
        for b in bad {
            fs.create(d, b, 0o644, 0, 0).unwrap();
        }
        assert_ne!(fs.getattr(d).unwrap().flags & INDEX_FL, 0, "the directory is indexed");
        fs.unmount().unwrap();
    }
    e2fsck_clean(&img);
    e2fsck_reindex(&img);
    e2fsck_clean(&img);
    let fs = Fs::open(&img).unwrap();
    let d = fs.lookup(fs.root(), b"d").unwrap().ino;
    for b in bad {
        assert!(fs.lookup(d, b).is_ok(), "{b:x?}");
    }
    assert!(fs.lookup(d, b"NAME-0399").is_ok());
}

/// A casefolded directory that starts inline (`inline_data`), moves to a block and then to an
/// index as it grows: names are found by another case at every stage.
#[test]
fn inline_casefolded_directories_grow_into_an_index() {
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("32M").features("casefold,inline_data").build_in(dir.path(), "inline");
    let fs = rw(&img);
    let d = folded_dir(&fs, b"d");
    let all = many_names(600);
    for (i, n) in all.iter().enumerate() {
        fs.create(d, n.as_bytes(), 0o644, 0, 0).unwrap();
        if i == 2 {
            assert_ne!(fs.getattr(d).unwrap().flags & INLINE_DATA_FL, 0, "the directory is inline");
            assert!(fs.lookup(d, all[1].to_uppercase().as_bytes()).is_ok(), "inline");
            fs.unlink(d, all[0].to_lowercase().as_bytes()).unwrap();
            fs.create(d, all[0].as_bytes(), 0o644, 0, 0).unwrap();
        }
    }
    assert_ne!(fs.getattr(d).unwrap().flags & INDEX_FL, 0, "the directory is indexed by now");
    for n in &all {
        assert!(fs.lookup(d, n.to_uppercase().as_bytes()).is_ok(), "{n}");
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}
