//! Creating and removing names through the journal, alone and from many threads.

use super::*;

#[test]
fn create_mkdir_unlink_rmdir_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [
        ("default", &[][..]),
        ("upstream", &["-O", "metadata_csum_seed,orphan_file"][..]),
        ("nocsum", &["-O", "^metadata_csum"][..]),
        ("nojournal1k", &["-O", "^has_journal", "-b", "1024"][..]),
        ("ext3", &["-t", "ext3"][..]),
    ] {
        let img = mkfs(dir.path(), name, args);
        let fs = rw(&img);
        let root = fs.root();
        let before = fs.statfs().unwrap();
        let a = fs.mkdir(root, b"d", 0o755, 1000, 1000).unwrap();
        assert_eq!(a.kind, FileType::Directory);
        assert_eq!(a.nlink, 2);
        assert_eq!(fs.getattr(root).unwrap().nlink, 4, "{name}: root links after mkdir");
        for i in 0..300 {
            let f = fs
                .create(a.ino, format!("file-{i:04}-with-a-longer-name").as_bytes(), 0o644, 1000, 100)
                .unwrap();
            assert_eq!(f.kind, FileType::RegularFile);
            assert_eq!(f.perm(), 0o644);
        }
        assert_eq!(fs.create(a.ino, b"file-0000-with-a-longer-name", 0o644, 0, 0).unwrap_err().errno(), 17);
        assert_eq!(fs.create(a.ino, &[b'x'; 256], 0o644, 0, 0).unwrap_err().errno(), 36); // ENAMETOOLONG
        assert_eq!(fs.rmdir(root, b"d").unwrap_err().errno(), 39); // ENOTEMPTY
        assert_eq!(fs.unlink(root, b"d").unwrap_err().errno(), 21); // EISDIR
        let sub = fs.mkdir(a.ino, b"sub", 0o700, 0, 0).unwrap();
        assert_eq!(fs.rmdir(a.ino, b"file-0001-with-a-longer-name").unwrap_err().errno(), 20); // ENOTDIR
        assert_eq!(fs.getattr(a.ino).unwrap().nlink, 3);
        for i in (0..300).step_by(2) {
            fs.unlink(a.ino, format!("file-{i:04}-with-a-longer-name").as_bytes()).unwrap();
        }
        assert_eq!(fs.unlink(a.ino, b"file-0000-with-a-longer-name").unwrap_err().errno(), 2); // ENOENT
        fs.rmdir(a.ino, b"sub").unwrap();
        // A freed inode named by number: a stale handle, as the kernel answers one.
        assert_eq!(fs.getattr(sub.ino).unwrap_err().errno(), libc::ESTALE, "{name}: removed dir still live");
        let names: Vec<_> = fs.read_dir("/d").unwrap().map(|e| e.unwrap().name).collect();
        assert_eq!(names.len(), 150);
        fs.unmount().unwrap();
        drop(fs);
        fsck_clean(&img);

        if let Ok(km) = KernelMount::ro(&img) {
            let mnt = km.path().to_path_buf();
            let mut seen: Vec<String> = std::fs::read_dir(mnt.join("d"))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            seen.sort();
            let m = std::fs::metadata(mnt.join("d/file-0001-with-a-longer-name")).unwrap();
            let dm = std::fs::metadata(mnt.join("d")).unwrap();
            km.unmount().unwrap();
            let want: Vec<String> =
                (1..300).step_by(2).map(|i| format!("file-{i:04}-with-a-longer-name")).collect();
            assert_eq!(seen, want, "{name}: kernel view");
            assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (1000, 100, 0o644));
            assert_eq!(dm.nlink(), 2);
        }

        // Remove the rest: counts return to where they were.
        let fs = rw(&img);
        let d = fs.resolve("/d", false).unwrap();
        for i in (1..300).step_by(2) {
            fs.unlink(d, format!("file-{i:04}-with-a-longer-name").as_bytes()).unwrap();
        }
        fs.rmdir(fs.root(), b"d").unwrap();
        let after = fs.statfs().unwrap();
        assert_eq!((after.files_free, after.blocks_free), (before.files_free, before.blocks_free), "{name}");
        fs.unmount().unwrap();
        drop(fs);
        fsck_clean(&img);
    }
}

#[test]
fn parallel_creates_in_own_and_shared_directories() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "par", &[]);
    let fs = rw(&img);
    let root = fs.root();
    let shared = fs.mkdir(root, b"shared", 0o777, 0, 0).unwrap().ino;
    std::thread::scope(|s| {
        for t in 0..8 {
            let fs = fs.clone();
            s.spawn(move || {
                let own = fs.mkdir(root, format!("w{t}").as_bytes(), 0o755, 0, 0).unwrap().ino;
                for i in 0..200 {
                    fs.create(own, format!("f{i}").as_bytes(), 0o600, t, t).unwrap();
                    fs.create(shared, format!("t{t}-{i}").as_bytes(), 0o600, t, t).unwrap();
                }
                for i in (0..200).step_by(3) {
                    fs.unlink(own, format!("f{i}").as_bytes()).unwrap();
                    fs.unlink(shared, format!("t{t}-{i}").as_bytes()).unwrap();
                }
            });
        }
    });
    assert_eq!(fs.read_dir("/shared").unwrap().count(), 8 * 133);
    for t in 0..8 {
        assert_eq!(fs.read_dir(format!("/w{t}")).unwrap().count(), 133);
    }
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&img);
}

/// Directories growing in turn get fragmented: their extent trees outgrow the four extents of
/// the inode and gain a level; everything still checks out and frees cleanly.
#[test]
fn interleaved_growth_deepens_extent_trees() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [("x1k", &["-b", "1024"][..]), ("x4k", &[][..])] {
        let img = mkfs(dir.path(), name, args);
        let fs = rw(&img);
        let root = fs.root();
        let dirs: Vec<_> = (0..64)
            .map(|d| fs.mkdir(root, format!("dir-{d:02}").as_bytes(), 0o755, 0, 0).unwrap().ino)
            .collect();
        for i in 0..150 {
            for (d, &ino) in dirs.iter().enumerate() {
                fs.create(ino, format!("entry-{i:04}-of-directory-{d:02}-padding").as_bytes(), 0o644, 0, 0)
                    .unwrap();
            }
        }
        let big = fs.getattr(dirs[0]).unwrap();
        assert!(big.size >= 5 * u64::from(fs.block_size()), "{name}: directory did not grow: {}", big.size);
        fs.unmount().unwrap();
        drop(fs);
        fsck_clean(&img);
        let fs = Fs::open(&img).unwrap();
        for d in [0usize, 31, 63] {
            assert_eq!(fs.read_dir(format!("/dir-{d:02}")).unwrap().count(), 150, "{name}");
            fs.metadata(format!("/dir-{d:02}/entry-0149-of-directory-{d:02}-padding")).unwrap();
        }
        drop(fs);
        let fs = rw(&img);
        for (d, &ino) in dirs.iter().enumerate() {
            for i in 0..150 {
                fs.unlink(ino, format!("entry-{i:04}-of-directory-{d:02}-padding").as_bytes()).unwrap();
            }
            fs.rmdir(fs.root(), format!("dir-{d:02}").as_bytes()).unwrap();
        }
        fs.unmount().unwrap();
        drop(fs);
        fsck_clean(&img);
    }
}

/// Directories and attribute blocks leave what data leaves (the kernel's
/// `ext4_has_free_clusters` for an allocation without `METADATA_NOFAIL`): the root reserve,
/// for a caller it is not for, and the metadata slack extent trees need on a full disk. Once
/// a user's writes meet `ENOSPC`, so do the user's directories and attribute blocks; root
/// goes on into the reserve, and stops short of the slack.
#[test]
fn directories_and_attribute_blocks_leave_the_reserves() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [("ext4", &["-m", "5"][..]), ("ext3", &["-t", "ext3", "-m", "5"][..])] {
        let img = mkfs(dir.path(), name, args);
        let fs = rw(&img);
        let root = fs.root();
        let st = fs.statfs().unwrap();
        // The slack: 2% of the (64 MiB of) blocks, at most 4096, with extents; none with
        // block maps.
        let slack = if name == "ext4" { ((64 << 20) / u64::from(st.block_size) / 50).min(4096) } else { 0 };
        let f = fs.create(root, b"fill", 0o644, 1000, 1000).unwrap().ino;
        let bs = st.block_size as usize;
        let mut off = 0u64;
        for chunk in [1usize << 20, bs] {
            let buf = vec![1u8; chunk];
            while let Ok(n @ 1..) = fs.write(f, off, &buf).and_then(|n| fs.fsync(f).map(|_| n)) {
                off += n as u64;
            }
        }
        assert_eq!(fs.statfs().unwrap().blocks_avail, 0, "{name}: the user's writes took all they may");
        let d = fs.mkdir(root, b"small", 0o755, 1000, 1000);
        assert_eq!(d.unwrap_err().errno(), libc::ENOSPC, "{name}: the user's mkdir");
        // An attribute too large for the inode needs a block.
        let x = fs.setxattr(f, b"user.big", &[3u8; 3000], 0);
        assert_eq!(x.unwrap_err().errno(), libc::ENOSPC, "{name}: the user's xattr block");
        let mut made = 0u64;
        rext4::with_reserved_blocks(|| {
            while fs.mkdir(root, format!("r{made}").as_bytes(), 0o755, 0, 0).is_ok() {
                made += 1;
            }
        });
        let left = fs.statfs().unwrap();
        // 5% of 64 MiB is 3,276 1 KiB blocks; root's directories take one each, their parent a
        // few more.
        assert!(made > 3000, "{name}: root made {made} directories in its reserve");
        assert!(left.blocks_free >= slack, "{name}: {} free, slack {slack}", left.blocks_free);
        assert!(left.blocks_free <= slack + 2, "{name}: {} free, slack {slack}", left.blocks_free);
        fs.unmount().unwrap();
        drop(fs);
        fsck_clean(&img);
    }
}

/// On a filesystem with free inodes and no free blocks, a directory (its first block) and a
/// slow symlink (its target's block) cannot be made: `ENOSPC`, and the inode each took is
/// given back, so the image stays clean and the inode count where it was (extents and block
/// maps).
#[test]
fn nodes_needing_a_block_on_a_full_disk_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [("ext4", &["-m", "0"][..]), ("ext3", &["-t", "ext3", "-m", "0"][..])] {
        let img = mkfs(dir.path(), name, args);
        let fs = rw(&img);
        let root = fs.root();
        let f = fs.create(root, b"fill", 0o644, 0, 0).unwrap().ino;
        let chunk = vec![1u8; 1 << 20];
        let mut off = 0u64;
        // Every block, the reserve for metadata included (a caller the root reserve is for).
        rext4::with_reserved_blocks(|| loop {
            match fs.write(f, off, &chunk).and_then(|n| fs.fsync(f).map(|_| n)) {
                Ok(n) if n > 0 => off += n as u64,
                _ => break,
            }
        });
        // Block-sized writes end what large ones left, and directories take the blocks kept
        // for metadata.
        let bs = fs.statfs().unwrap().block_size as usize;
        rext4::with_reserved_blocks(|| {
            while fs.write(f, off, &vec![1u8; bs]).is_ok() && fs.fsync(f).is_ok() {
                off += bs as u64;
            }
        });
        let mut k = 0;
        let err = loop {
            match fs.mkdir(root, format!("m{k}").as_bytes(), 0o755, 0, 0) {
                Ok(_) => k += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(err.errno(), libc::ENOSPC, "{name}: mkdir after {k}");
        let inodes = fs.statfs().unwrap().files_free;
        let long = [b'x'; 200];
        for _ in 0..3 {
            assert_eq!(fs.mkdir(root, b"d", 0o755, 0, 0).unwrap_err().errno(), libc::ENOSPC, "{name}: mkdir");
            assert_eq!(
                fs.symlink(root, b"s", &long, 0, 0).unwrap_err().errno(),
                libc::ENOSPC,
                "{name}: symlink"
            );
        }
        assert!(fs.lookup(root, b"d").is_err() && fs.lookup(root, b"s").is_err());
        assert_eq!(fs.statfs().unwrap().files_free, inodes, "{name}: inodes given back");
        fs.unmount().unwrap();
        drop(fs);
        fsck_clean(&img);
    }
}
