//! Casefolded directories against a kernel that has them: the host's is built without
//! `CONFIG_UNICODE`, so Debian's packaged kernel, booted in a VM (rext4_testkit::vm_run), reads
//! what rext4 wrote and writes what rext4 then reads.

use super::dirs::many_names;
use super::{list, same, section};
use rext4::format::inode::{CASEFOLD_FL, INDEX_FL};
use rext4::{Error, Fs, Options};
use rext4_testkit::{e2fsck_clean, require_vm, vm_run, Image};
use std::collections::BTreeSet;

#[test]
fn the_kernel_reads_and_writes_what_rext4_does() {
    require_vm!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").features("casefold").build_in(dir.path(), "cf");
    let all = many_names(1200);
    {
        let fs = Fs::open_with(&img, Options { writable: true, ..Options::default() }).unwrap();
        let big = fs.mkdir(fs.root(), b"Big", 0o755, 0, 0).unwrap().ino;
        fs.set_flags(big, fs.getattr(big).unwrap().flags | CASEFOLD_FL).unwrap();
        for n in &all {
            fs.create(big, n.as_bytes(), 0o644, 0, 0).unwrap();
        }
        assert_ne!(fs.getattr(big).unwrap().flags & INDEX_FL, 0, "indexed");
        let small = fs.mkdir(big, "Ünïcode".as_bytes(), 0o755, 0, 0).unwrap().ino;
        let f = fs.create(small, "Straße.TXT".as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write(f, 0, b"folded").unwrap();
        fs.unmount().unwrap();
    }
    e2fsck_clean(&img);

    // The kernel finds every name by another case, lists them as created, sees the flag
    // inherited, and makes and removes names of its own (through other cases too).
    let mut probes = String::new();
    for n in all.iter().step_by(7) {
        probes.push_str(&format!("[ -f '/mnt/Big/{}' ] || echo 'MISSING {n}'\n", n.to_uppercase()));
    }
    let listing_cmd = list("/mnt/Big", "LIST");
    let script = format!(
        "mount -t ext4 /dev/vda /mnt\n\
         {listing_cmd}\
         cat '/mnt/Big/ÜNÏCODE/strasse.txt'; echo\n\
         vmtool get_flags '/mnt/Big/ünïcode'\n\
         {probes}\
         touch '/mnt/Big/ünïcode/Kernel-Ǆ'; mkdir /mnt/Big/KDIR\n\
         rm '/mnt/Big/{}' '/mnt/Big/{}'\n\
         ! touch '/mnt/Big/ünïcode/KERNEL-ǆ' 2>/dev/null || [ $(ls /mnt/Big/ünïcode | wc -l) = 2 ]\n\
         umount /mnt\n",
        all[0].to_lowercase(),
        all[1].to_uppercase(),
    );
    let out = vm_run(&script, &[&img], &[]).ok();
    assert!(!out.contains("MISSING"), "{out}");
    let listed = section(&out, "LIST-BEGIN\n", "LIST-END");
    let mut want: BTreeSet<String> = all.iter().cloned().collect();
    want.insert("Ünïcode".into());
    same("the kernel's listing", &listed, &want);
    assert!(out.contains("folded\n"), "{out}");
    let flags = out.lines().find_map(|l| u32::from_str_radix(l.trim(), 16).ok()).expect("flags line");
    assert_ne!(flags & CASEFOLD_FL, 0, "a subdirectory inherits +F: {out}");
    e2fsck_clean(&img);

    // rext4 reads the kernel's changes, by other cases as well.
    let fs = Fs::open_with(&img, Options { writable: true, ..Options::default() }).unwrap();
    let big = fs.lookup(fs.root(), b"Big").unwrap().ino;
    assert!(matches!(fs.lookup(fs.root(), b"BIG"), Err(Error::NotFound)));
    assert!(matches!(fs.lookup(big, all[0].as_bytes()), Err(Error::NotFound)));
    assert!(matches!(fs.lookup(big, all[1].as_bytes()), Err(Error::NotFound)));
    let kdir = fs.lookup(big, b"kdir").unwrap().ino;
    assert_ne!(fs.getattr(kdir).unwrap().flags & CASEFOLD_FL, 0);
    let small = fs.lookup(big, "ÜNÏCODE".as_bytes()).unwrap().ino;
    assert!(fs.lookup(small, "kernel-ǆ".as_bytes()).is_ok());
    for n in all.iter().skip(2) {
        assert!(fs.lookup(big, n.to_lowercase().as_bytes()).is_ok(), "{n}");
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}

/// Directories the kernel made, casefolded and filled until indexed: rext4 finds every name by
/// another case, and its changes there read back in the kernel.
#[test]
fn rext4_reads_and_changes_the_kernels_casefolded_directories() {
    require_vm!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").features("casefold").build_in(dir.path(), "kcf");
    let all = many_names(900);
    let names_file: String = all.iter().map(|n| format!("{n}\n")).collect();
    let script = "mount -t ext4 /dev/vda /mnt\nmkdir /mnt/K\nvmtool set_flags /mnt/K 40000000\n\
                  while read -r n; do touch \"/mnt/K/$n\"; done < /names\n\
                  mkdir /mnt/K/Sub; echo data > /mnt/K/Sub/Ωmega\numount /mnt\n";
    vm_run(script, &[&img], &[("names", names_file.as_bytes())]).ok();
    e2fsck_clean(&img);

    let fs = Fs::open_with(&img, Options { writable: true, ..Options::default() }).unwrap();
    let k = fs.lookup(fs.root(), b"K").unwrap().ino;
    assert!(fs.folds_names(k));
    assert_ne!(fs.getattr(k).unwrap().flags & INDEX_FL, 0, "the kernel indexed it");
    for n in &all {
        assert!(fs.lookup(k, n.to_uppercase().as_bytes()).is_ok(), "{n}");
    }
    let sub = fs.lookup(k, b"SUB").unwrap().ino;
    assert!(fs.lookup(sub, "ωMEGA".as_bytes()).is_ok());
    for n in all.iter().step_by(3) {
        fs.unlink(k, n.to_lowercase().as_bytes()).unwrap();
    }
    fs.create(k, "Neu-ẞ".as_bytes(), 0o644, 0, 0).unwrap();
    assert!(matches!(fs.create(k, "NEU-ß".as_bytes(), 0o644, 0, 0), Err(Error::Exists)));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);

    let out = vm_run(
        "mount -t ext4 /dev/vda /mnt\nls -1 /mnt/K | wc -l\n[ -f /mnt/K/neu-ss ] && echo FOUND\numount /mnt\n",
        &[&img],
        &[],
    )
    .ok();
    let left = all.len() - all.len().div_ceil(3) + 2;
    assert!(out.contains(&format!("{left}\n")) && out.contains("FOUND"), "{left}: {out}");
}
