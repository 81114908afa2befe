//! Directories both encrypted and casefolded (entries that carry their SipHash): made and
//! filled by a kernel with both (booted in a VM, rext4_testkit::vm_run), read by rext4 with
//! and without the key; changed by rext4 and read back by the kernel, which finds names by
//! the hashes rext4 stored (its lookups compare them first); made from nothing by rext4.

use super::dirs::many_names;
use super::{list, same, section};
use rext4::format::inode::{CASEFOLD_FL, ENCRYPT_FL, INDEX_FL};
use rext4::{EncryptionKey, Error, Fs, InodeNo, Options};
use rext4_testkit::{e2fsck_clean, require_vm, vm_run, Image};
use std::collections::BTreeSet;

const KEY: [u8; 64] = {
    let mut k = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        k[i] = (i as u8).wrapping_mul(37).wrapping_add(11);
        i += 1;
    }
    k
};

/// A name whose ciphertext is past 149 bytes: listed without the key as a digest.
fn long_name() -> String {
    format!("Long-{}", "ä".repeat(90))
}

fn opts(writable: bool, key: bool) -> Options {
    let encryption_keys = if key { vec![EncryptionKey::new(KEY.to_vec()).unwrap()] } else { Vec::new() };
    Options { writable, encryption_keys, ..Options::default() }
}

fn shown(fs: &Fs, dir: InodeNo) -> BTreeSet<String> {
    fs.children(dir)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .filter(|n| n != "." && n != "..")
        .collect()
}

/// Kernel-side probes: every line of `/probe` must name an entry of `dir`, none of `/gone`.
fn probes(dir: &str) -> String {
    format!(
        "while read -r n; do [ -e \"{dir}/$n\" ] || echo \"MISSING $n\"; done < /probe\n\
         while read -r n; do [ ! -e \"{dir}/$n\" ] || echo \"PRESENT $n\"; done < /gone\n"
    )
}

fn lines(v: impl IntoIterator<Item = String>) -> Vec<u8> {
    v.into_iter().flat_map(|n| format!("{n}\n").into_bytes()).collect()
}

#[test]
fn the_kernels_encrypted_casefolded_directories_read_and_changed() {
    require_vm!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").block_size(4096).features("casefold,encrypt").build_in(dir.path(), "ecf");
    let names = many_names(1000);
    let long = long_name();
    // D: casefolded, then encrypted, filled until indexed; E: encrypted, then casefolded,
    // one block. Each file holds its own name.
    let script = format!(
        "mount -t ext4 /dev/vda /mnt\nid=$(vmtool add_key /key /mnt)\n\
         mkdir /mnt/D; vmtool set_flags /mnt/D 40000000; vmtool set_policy $id /mnt/D\n\
         mkdir /mnt/E; vmtool set_policy $id /mnt/E; vmtool set_flags /mnt/E 40000800\n\
         while read -r n; do echo \"$n\" > \"/mnt/D/$n\"; done < /names\n\
         mkdir /mnt/D/Sub; echo deep > /mnt/D/Sub/Ωmega; ln -s Straße /mnt/D/Link; touch '/mnt/D/{long}'\n\
         echo small > /mnt/E/Small; vmtool get_flags /mnt/D/Sub\n\
         {}umount /mnt\n",
        list("/mnt/D", "KEYED")
    );
    let out = vm_run(&script, &[&img], &[("key", &KEY), ("names", &lines(names.clone()))]).ok();
    let mut want: BTreeSet<String> = names.iter().cloned().collect();
    want.extend(["Sub".to_string(), "Link".to_string(), long.clone()]);
    same("the kernel's listing with the key", &section(&out, "KEYED-BEGIN\n", "KEYED-END"), &want);
    e2fsck_clean(&img);

    // Without the key, the kernel's no-key names.
    let out = vm_run(
        &format!("mount -t ext4 /dev/vda /mnt\n{}umount /mnt\n", list("/mnt/D", "NOKEY")),
        &[&img],
        &[],
    )
    .ok();
    let kernel_nokey = section(&out, "NOKEY-BEGIN\n", "NOKEY-END");

    // rext4 without the key: the same no-key names (each carrying its entry's stored hash),
    // every one found by lookup, removal possible, names refused.
    {
        let fs = Fs::open_with(&img, opts(true, false)).unwrap();
        let d = fs.lookup(fs.root(), b"D").unwrap().ino;
        let attr = fs.getattr(d).unwrap();
        assert_eq!(attr.flags & (CASEFOLD_FL | ENCRYPT_FL | INDEX_FL), CASEFOLD_FL | ENCRYPT_FL | INDEX_FL);
        let nokey = shown(&fs, d);
        same("no-key names", &nokey, &kernel_nokey);
        for n in &nokey {
            fs.lookup(d, n.as_bytes()).unwrap_or_else(|e| panic!("lookup of no-key name {n}: {e}"));
        }
        assert!(matches!(fs.create(d, b"new", 0o644, 0, 0), Err(Error::NoKey)));
        fs.unmount().unwrap();
    }

    // With the key: names as made, found by other cases; contents; then changes.
    let gone: Vec<String> = names.iter().step_by(3).cloned().collect();
    let added: Vec<String> = (0..1500).map(|i| format!("Neu-ẞ-Ǆ-{i:04}")).collect();
    {
        let fs = Fs::open_with(&img, opts(true, true)).unwrap();
        let d = fs.lookup(fs.root(), b"D").unwrap().ino;
        same("rext4's listing with the key", &shown(&fs, d), &want);
        for n in names.iter().step_by(7) {
            for other in [n.to_uppercase(), n.to_lowercase()] {
                let a = fs.lookup(d, other.as_bytes()).unwrap_or_else(|e| panic!("{other}: {e}"));
                let mut b = vec![0u8; 300];
                let len = fs.read(a.ino, 0, &mut b).unwrap();
                assert_eq!(&b[..len], format!("{n}\n").as_bytes());
            }
        }
        let sub = fs.lookup(d, b"SUB").unwrap().ino;
        assert_ne!(fs.getattr(sub).unwrap().flags & CASEFOLD_FL, 0);
        assert!(fs.lookup(sub, "ωMEGA".as_bytes()).is_ok());
        assert!(fs.lookup(d, long.to_uppercase().as_bytes()).is_ok());
        let link = fs.lookup(d, b"link").unwrap().ino;
        assert_eq!(fs.readlink(link).unwrap(), "Straße".as_bytes());
        // Another case of a name is that name.
        assert!(matches!(fs.create(d, names[1].to_uppercase().as_bytes(), 0o644, 0, 0), Err(Error::Exists)));
        for n in &gone {
            fs.unlink(d, n.to_lowercase().as_bytes()).unwrap_or_else(|e| panic!("unlink {n}: {e}"));
        }
        for n in &added {
            fs.create(d, n.as_bytes(), 0o644, 0, 0).unwrap();
        }
        // A rename over another case of an existing name keeps that entry's name.
        fs.rename(d, added[0].as_bytes(), d, names[2].to_uppercase().as_bytes(), 0).unwrap();
        fs.mkdir(sub, b"Deeper", 0o755, 0, 0).unwrap();
        let e = fs.lookup(fs.root(), b"E").unwrap().ino;
        for i in 0..40 {
            fs.create(e, format!("Straße-{i}").as_bytes(), 0o644, 0, 0).unwrap();
        }
        assert!(matches!(fs.mkdir(e, b"STRASSE-7", 0o755, 0, 0), Err(Error::Exists)));
        fs.unlink(e, b"SMALL").unwrap();
        fs.unmount().unwrap();
    }
    e2fsck_clean(&img);

    // The kernel finds what rext4 wrote by other cases (its lookups compare the stored
    // hashes first), and not what rext4 removed.
    let mut probe: Vec<String> = added[1..].iter().map(|n| n.to_lowercase()).collect();
    probe.extend(names.iter().enumerate().filter(|(i, _)| i % 3 != 0).map(|(_, n)| n.to_uppercase()));
    probe.push(names[2].clone());
    let script = format!(
        "mount -t ext4 /dev/vda /mnt\nvmtool add_key /key /mnt >/dev/null\n{}\
         [ -d /mnt/D/sub/DEEPER ] || echo MISSING deeper\n\
         for i in $(seq 0 39); do [ -e /mnt/E/STRASSE-$i ] || echo MISSING E$i; done\n\
         [ ! -e /mnt/E/small ] || echo PRESENT small\n\
         [ \"$(ls /mnt/E | wc -l)\" = 40 ] || echo COUNT\n\
         touch /mnt/E/KERNEL; umount /mnt\n",
        probes("/mnt/D")
    );
    let gone_probe: Vec<String> = gone.iter().map(|n| n.to_uppercase()).chain([added[0].clone()]).collect();
    let out =
        vm_run(&script, &[&img], &[("key", &KEY), ("probe", &lines(probe)), ("gone", &lines(gone_probe))])
            .ok();
    assert!(!out.contains("MISSING") && !out.contains("PRESENT") && !out.contains("COUNT"), "{out}");
    e2fsck_clean(&img);
    let fs = Fs::open_with(&img, opts(false, true)).unwrap();
    let e = fs.lookup(fs.root(), b"E").unwrap().ino;
    assert!(fs.lookup(e, b"kernel").is_ok());
}

/// A directory rext4 makes encrypted and casefolded (both orders), fills until the kernel
/// would index it, and the kernel reads.
#[test]
fn encrypted_casefolded_directories_made_by_rext4() {
    require_vm!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").block_size(4096).features("casefold,encrypt").build_in(dir.path(), "recf");
    let names = many_names(400);
    let key = EncryptionKey::new(KEY.to_vec()).unwrap();
    {
        let fs = Fs::open_with(&img, opts(true, true)).unwrap();
        let f = fs.mkdir(fs.root(), b"F", 0o755, 0, 0).unwrap().ino;
        fs.set_flags(f, fs.getattr(f).unwrap().flags | CASEFOLD_FL).unwrap();
        fs.set_encryption_policy(f, &key, 32).unwrap();
        let g = fs.mkdir(fs.root(), b"G", 0o755, 0, 0).unwrap().ino;
        fs.set_encryption_policy(g, &key, 16).unwrap();
        fs.set_flags(g, fs.getattr(g).unwrap().flags | CASEFOLD_FL).unwrap();
        for n in &names {
            let ino = fs.create(f, n.as_bytes(), 0o644, 0, 0).unwrap().ino;
            fs.write(ino, 0, n.as_bytes()).unwrap();
        }
        // A subdirectory takes both, and its own key for its entries' hashes.
        let sub = fs.mkdir(f, b"Sub", 0o755, 0, 0).unwrap().ino;
        for i in 0..50 {
            fs.create(sub, format!("Inner-ǅ-{i}").as_bytes(), 0o644, 0, 0).unwrap();
        }
        fs.create(g, "Ǆemal".as_bytes(), 0o644, 0, 0).unwrap();
        fs.symlink(g, b"To", "Ǆemal".as_bytes(), 0, 0).unwrap();
        assert!(fs.lookup(g, "ǆEMAL".as_bytes()).is_ok());
        // v1 policies cannot casefold: refused both ways.
        let h = fs.mkdir(fs.root(), b"H", 0o755, 0, 0).unwrap().ino;
        let v1 = EncryptionKey::v1(*b"\x01\x02\x03\x04\x05\x06\x07\x08", vec![9; 64]).unwrap();
        fs.set_flags(h, fs.getattr(h).unwrap().flags | CASEFOLD_FL).unwrap();
        assert!(matches!(fs.set_encryption_policy(h, &v1, 32), Err(Error::InvalidInput(_))));
        fs.unmount().unwrap();
    }
    e2fsck_clean(&img);
    let probe: Vec<String> =
        names.iter().map(|n| n.to_uppercase()).chain((0..50).map(|i| format!("sub/INNER-Ǆ-{i}"))).collect();
    let script = format!(
        "mount -t ext4 /dev/vda /mnt\nvmtool add_key /key /mnt >/dev/null\n{}\
         cat \"/mnt/F/{}\"; echo\n[ \"$(readlink /mnt/G/to)\" = Ǆemal ] || echo MISSING link\n\
         [ -f /mnt/G/ǅEMAL ] || echo MISSING g\n\
         for i in $(seq 0 600); do touch /mnt/F/kernel-$i; done\numount /mnt\n",
        probes("/mnt/F"),
        names[5].to_lowercase()
    );
    let out =
        vm_run(&script, &[&img], &[("key", &KEY), ("probe", &lines(probe)), ("gone", b"nothing-here\n")])
            .ok();
    assert!(!out.contains("MISSING") && !out.contains("PRESENT"), "{out}");
    assert!(out.contains(&names[5]), "{out}");
    e2fsck_clean(&img);
    // rext4 finds the kernel's entries, removes and adds more.
    let fs = Fs::open_with(&img, opts(true, true)).unwrap();
    assert!(matches!(fs.lookup(fs.root(), b"f"), Err(Error::NotFound)), "the root is not casefolded");
    let f = fs.lookup(fs.root(), b"F").unwrap().ino;
    for i in 0..=600 {
        assert!(fs.lookup(f, format!("KERNEL-{i}").as_bytes()).is_ok(), "{i}");
    }
    for n in names.iter().step_by(2) {
        fs.unlink(f, n.to_lowercase().as_bytes()).unwrap();
    }
    for i in 0..500 {
        fs.create(f, format!("again-{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    let probe: Vec<String> = (0..500).map(|i| format!("AGAIN-{i}")).collect();
    let gone: Vec<String> = names.iter().step_by(2).cloned().collect();
    let out = vm_run(
        &format!(
            "mount -t ext4 /dev/vda /mnt\nvmtool add_key /key /mnt >/dev/null\n{}umount /mnt\n",
            probes("/mnt/F")
        ),
        &[&img],
        &[("key", &KEY), ("probe", &lines(probe)), ("gone", &lines(gone))],
    )
    .ok();
    assert!(!out.contains("MISSING") && !out.contains("PRESENT"), "{out}");
}

/// The interior index blocks `debugfs htree_dump` shows for `dir` of `img`.
fn interior_nodes(img: &std::path::Path, dir: &str) -> BTreeSet<u64> {
    let o = std::process::Command::new(rext4_testkit::tool("debugfs"))
        .args(["-R", &format!("htree_dump {dir}")])
        .arg(img)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    // The root's entries are listed first, up to the first blank line.
    let root = text.split("\n\n").next().unwrap_or("");
    root.lines()
        .filter_map(|l| l.trim().strip_prefix("Entry #")?.split("block ").nth(1)?.trim().parse().ok())
        .collect()
}

/// e2fsck's verdict on an image whose only fault in its eyes is a two-level index of an
/// encrypted casefolded directory: the first interior node "directory corrupted" (it expects
/// the limit of other directories' nodes), then it stops. Returns the block it named.
fn e2fsck_sees_only_a_node(img: &std::path::Path, dir: &str) -> u64 {
    let o = std::process::Command::new(rext4_testkit::tool("e2fsck")).arg("-fn").arg(img).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let bad: Vec<&str> = out.lines().filter(|l| l.starts_with("Directory inode")).collect();
    assert_eq!(bad.len(), 1, "{out}");
    let blk: u64 = bad[0].split("block #").nth(1).and_then(|r| r.split(',').next()).unwrap().parse().unwrap();
    assert!(bad[0].ends_with("offset 0: directory corrupted"), "{out}");
    // Its logical block is the first interior node the root points at.
    let nodes = interior_nodes(img, dir);
    assert!(nodes.contains(&blk), "block {blk} is not an interior node ({nodes:?}):\n{out}");
    blk
}

/// Indexes two levels deep (1 KiB blocks, thousands of names). The kernel's interior nodes of
/// such a directory hold one entry fewer than other directories' (its `dx_node_limit` counts
/// a hash after the node's empty entry); e2fsck 1.47 expects the usual limit, calls the
/// kernel's own nodes corrupt and stops there. rext4 writes nodes as the kernel does (the
/// kernel refuses an index with e2fsck's limit) and reads both; the kernel is the oracle here,
/// and e2fsck says of rext4's image exactly what it says of the kernel's.
#[test]
fn two_level_indexes_as_the_kernel_writes_them() {
    require_vm!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").block_size(1024).features("casefold,encrypt").build_in(dir.path(), "deep");
    let names: Vec<String> = (0..3000).map(|i| format!("Entry-Ǆ-{i:05}")).collect();
    let script = "mount -t ext4 /dev/vda /mnt\nid=$(vmtool add_key /key /mnt)\n\
                  mkdir /mnt/D; vmtool set_flags /mnt/D 40000000; vmtool set_policy $id /mnt/D\n\
                  while read -r n; do touch \"/mnt/D/$n\"; done < /names\numount /mnt\n";
    vm_run(script, &[&img], &[("key", &KEY), ("names", &lines(names.clone()))]).ok();
    let kernel_node = e2fsck_sees_only_a_node(&img, "/D");

    let added: Vec<String> = (0..2000).map(|i| format!("Added-ǅ-{i:05}")).collect();
    {
        let fs = Fs::open_with(&img, opts(true, true)).unwrap();
        let d = fs.lookup(fs.root(), b"D").unwrap().ino;
        for n in &names {
            assert!(fs.lookup(d, n.to_uppercase().as_bytes()).is_ok(), "{n}");
        }
        for n in names.iter().step_by(4) {
            fs.unlink(d, n.to_lowercase().as_bytes()).unwrap();
        }
        for n in &added {
            fs.create(d, n.as_bytes(), 0o644, 0, 0).unwrap();
        }
        fs.unmount().unwrap();
    }
    assert_eq!(e2fsck_sees_only_a_node(&img, "/D"), kernel_node);

    let probe: Vec<String> = added
        .iter()
        .map(|n| n.to_lowercase())
        .chain(names.iter().enumerate().filter(|(i, _)| i % 4 != 0).map(|(_, n)| n.to_uppercase()))
        .collect();
    let gone: Vec<String> = names.iter().step_by(4).cloned().collect();
    let left = probe.len();
    let script = format!(
        "mount -t ext4 /dev/vda /mnt\nvmtool add_key /key /mnt >/dev/null\n{}\
         echo \"COUNT $(ls /mnt/D | wc -l)\"\ntouch /mnt/D/kernel-after\numount /mnt\n",
        probes("/mnt/D")
    );
    let out =
        vm_run(&script, &[&img], &[("key", &KEY), ("probe", &lines(probe)), ("gone", &lines(gone))]).ok();
    assert!(!out.contains("MISSING") && !out.contains("PRESENT"), "{out}");
    assert!(out.contains(&format!("COUNT {left}\n")), "{left}: {out}");
    assert_eq!(e2fsck_sees_only_a_node(&img, "/D"), kernel_node);
}

/// e2fsck's rebuild of a one-block encrypted casefolded directory (`-D`) gives `.` the length
/// of an entry with a hash (20 bytes, where the kernel writes 12); when the directory then
/// outgrows its block, rext4 still makes the index root with `..` at 12, and the kernel finds
/// every name in it.
#[test]
fn a_directory_e2fsck_rebuilt_grows_into_an_index() {
    require_vm!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("32M").block_size(4096).features("casefold,encrypt").build_in(dir.path(), "reb");
    let key = EncryptionKey::new(KEY.to_vec()).unwrap();
    let names: Vec<String> = (0..200).map(|i| format!("Rebuilt-ǅ-{i:03}")).collect();
    {
        let fs = Fs::open_with(&img, opts(true, true)).unwrap();
        let d = fs.mkdir(fs.root(), b"D", 0o755, 0, 0).unwrap().ino;
        fs.set_flags(d, fs.getattr(d).unwrap().flags | CASEFOLD_FL).unwrap();
        fs.set_encryption_policy(d, &key, 32).unwrap();
        for n in &names[..20] {
            fs.create(d, n.as_bytes(), 0o644, 0, 0).unwrap();
        }
        fs.unmount().unwrap();
    }
    rext4_testkit::e2fsck_reindex(&img);
    e2fsck_clean(&img);
    {
        let fs = Fs::open_with(&img, opts(true, true)).unwrap();
        let d = fs.lookup(fs.root(), b"D").unwrap().ino;
        for n in &names[20..] {
            fs.create(d, n.as_bytes(), 0o644, 0, 0).unwrap_or_else(|e| panic!("{n}: {e}"));
        }
        assert_ne!(fs.getattr(d).unwrap().flags & INDEX_FL, 0, "indexed");
        fs.unmount().unwrap();
    }
    e2fsck_clean(&img);
    let probe: Vec<String> = names.iter().map(|n| n.to_uppercase()).collect();
    let script = format!(
        "mount -t ext4 /dev/vda /mnt\nvmtool add_key /key /mnt >/dev/null\n{}touch /mnt/D/kernel\numount /mnt\n",
        probes("/mnt/D")
    );
    let out =
        vm_run(&script, &[&img], &[("key", &KEY), ("probe", &lines(probe)), ("gone", b"absent\n")]).ok();
    assert!(!out.contains("MISSING") && !out.contains("PRESENT"), "{out}");
    e2fsck_clean(&img);
}
