//! Damaged attribute storage: a failed release changes nothing.

use super::*;

/// A file with data whose xattr block has a damaged entry table loses its last name (by
/// unlink, by a rename over it, by the release that follows an unlink while it was held): the
/// deletion finds the damage before it frees anything, so the block is still counted as the
/// file's and the data blocks are still marked in use. As the kernel's, the operation succeeds;
/// the inode is left without links for e2fsck to free, and the damage is recorded.
#[test]
fn damaged_xattr_block_keeps_its_count_when_its_release_fails() {
    let dir = tempfile::tempdir().unwrap();
    for how in ["unlink", "rename", "release"] {
        // Without block checksums, so that the damage is found in the entries, not by the
        // checksum.
        let img = mkfs(dir.path(), how, &["-O", "ea_inode,^metadata_csum"]);
        let fs = rw(&img);
        let root = fs.root();
        let f = fs.create(root, b"f", 0o644, 1000, 1000).unwrap().ino;
        fs.write(f, 0, &pattern(2, 40_000)).unwrap();
        set(&fs, "/f", "user.a", &pattern(1, 1000));
        fs.create(root, b"g", 0o644, 0, 0).unwrap();
        fs.unmount().unwrap();
        let blk = file_acl(&img, "/f");
        assert_ne!(blk, 0, "the value went to a block");
        let data: Vec<u64> =
            debugfs(&img, "blocks /f").split_whitespace().map(|b| b.parse().unwrap()).collect();
        assert_eq!(data.len(), 10);
        // The first entry's e_value_size (the entry follows the 32-byte header; the field is
        // at 8) past the largest value an entry can have.
        let mut all = std::fs::read(&img).unwrap();
        let at = blk as usize * block_size(&img) + 32 + 8;
        all[at..at + 4].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
        std::fs::write(&img, &all).unwrap();
        let fs = rw(&img);
        match how {
            "unlink" => fs.unlink(root, b"f").unwrap(),
            "rename" => fs.rename(root, b"g", root, b"f", 0).unwrap(),
            _ => {
                fs.hold(f).unwrap();
                fs.unlink(root, b"f").unwrap();
                assert!(!fs.has_errors(), "nothing is freed before the release");
                fs.release(f).unwrap();
            }
        }
        assert!(fs.has_errors(), "{how}");
        assert_eq!(errno(fs.getattr(f)), libc::ESTALE, "{how}");
        fs.unmount().unwrap();
        assert_eq!(refcount(&img, blk), 1, "{how}: the damaged block is still counted as its file's");
        for b in data.iter().chain([&blk]) {
            let t = debugfs(&img, &format!("testb {b}"));
            assert!(t.contains("marked in use"), "{how}: block {b} was freed: {t}");
        }
        let fsck = Command::new(tool("e2fsck")).arg("-fn").arg(&img).output().unwrap();
        let text = String::from_utf8_lossy(&fsck.stdout).into_owned();
        assert!(text.contains(&format!("Deleted inode {} has zero dtime", f.0)), "{how}: {text}");
    }
}

/// A file whose in-inode area names two EA inodes, the second damaged (no longer flagged as an
/// EA inode), loses its last name: the deletion checks both before it drops either reference,
/// so the first keeps its value and stays allocated; the file is left for e2fsck.
#[test]
fn a_damaged_ea_inode_stops_a_deletion_before_it_changes_anything() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "eadamage", &["-O", "ea_inode"]);
    let fs = rw(&img);
    let root = fs.root();
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    set(&fs, "/f", "user.a", &pattern(1, 10_000));
    set(&fs, "/f", "user.b", &pattern(2, 12_000));
    fs.unmount().unwrap();
    drop(fs);
    // The two EA inodes, told apart by their sizes.
    let ea_of = |size: &str| -> u32 {
        (f.0 + 1..f.0 + 8)
            .find(|i| debugfs(&img, &format!("stat <{i}>")).contains(&format!("Size: {size}")))
            .unwrap_or_else(|| panic!("no EA inode of {size} bytes"))
    };
    let (a, b) = (ea_of("10000"), ea_of("12000"));
    let o = Command::new(tool("debugfs"))
        .args(["-w", "-R", &format!("set_inode_field <{b}> flags 0x80000")])
        .arg(&img)
        .output()
        .unwrap();
    assert!(o.status.success(), "debugfs: {}", String::from_utf8_lossy(&o.stderr));
    let fs = rw(&img);
    fs.unlink(root, b"f").unwrap();
    assert!(fs.has_errors());
    fs.unmount().unwrap();
    drop(fs);
    let in_use = |i: u32| debugfs(&img, &format!("testi <{i}>")).contains("marked in use");
    assert!(in_use(a), "the first EA inode was freed before the damage stopped the deletion");
    assert!(in_use(b) && in_use(f.0));
    let fsck = Command::new(tool("e2fsck")).arg("-fn").arg(&img).output().unwrap();
    let text = String::from_utf8_lossy(&fsck.stdout).into_owned();
    assert!(text.contains(&format!("Deleted inode {} has zero dtime", f.0)), "{text}");
}
