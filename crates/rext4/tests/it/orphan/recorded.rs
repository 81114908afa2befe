//! Orphans recorded by the kernel or by debugfs, freed at the next writable open.

use super::*;
use rext4_testkit::{e2fsck_clean, features, require_kernel, KernelMount};

/// The kernel leaves orphans behind: files (and a directory) opened, unlinked and still open
/// when the image is copied from under the mount, i.e. a crash with open files. A read-only
/// open leaves them; a writable open frees them, as the kernel's own recovery does.
#[test]
fn kernel_made_orphans() {
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    for &(name, args) in &VARIANTS[..4] {
        let img = image(dir.path(), name, args, 1, 6);
        let snap = dir.path().join(format!("{name}-crash.img"));
        let mut inos = Vec::new();
        {
            let km = KernelMount::rw(&img).unwrap();
            let m = km.path();
            let mut open = Vec::new();
            for f in 0..5 {
                let p = m.join(format!("d0/f{f}"));
                let file = std::fs::File::open(&p).unwrap();
                inos.push(InodeNo(std::os::unix::fs::MetadataExt::ino(&file.metadata().unwrap()) as u32));
                std::fs::remove_file(&p).unwrap();
                open.push(file);
            }
            let d = std::fs::File::open(m.join("emptydir")).unwrap();
            inos.push(InodeNo(std::os::unix::fs::MetadataExt::ino(&d.metadata().unwrap()) as u32));
            std::fs::remove_dir(m.join("emptydir")).unwrap();
            open.push(d);
            // Commit the journal, then take the image as a crash would leave it.
            assert_eq!(unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&open[0])) }, 0);
            copy(&img, &snap);
            drop(open);
            km.unmount().unwrap();
        }
        inos.sort_by_key(|i| i.0);
        e2fsck_clean(&img);
        let kernel_final = free_counts(&img);

        // Read-only: the records are there (after the in-memory replay) and the image is left
        // alone.
        let bytes = std::fs::read(&snap).unwrap();
        let (head, file) = recorded(&snap);
        let mut seen: Vec<u32> = file.into_iter().collect();
        if head != 0 {
            let ro = Fs::open(&snap).unwrap();
            let mut i = head;
            while i != 0 && seen.len() < 100 {
                seen.push(i);
                let raw = ro.getattr(InodeNo(i));
                assert!(raw.is_err(), "{name}: orphan {i} looks live");
                i = dtime_of(&snap, i);
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, inos.iter().map(|i| i.0).collect::<Vec<_>>(), "{name}: orphans the kernel recorded");
        assert_eq!(std::fs::read(&snap).unwrap(), bytes, "{name}: read-only open wrote");

        // rext4's recovery.
        let ours = copy(&snap, &dir.path().join(format!("{name}-ours.img")));
        let fs = rw(&ours);
        assert_eq!(fs.orphans_recovered(), (inos.len() as u32, 0), "{name}");
        assert!(fs.orphans().is_empty());
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&ours);
        assert!(!features(&ours).contains("orphan_present"), "{name}");
        assert_eq!(free_counts(&ours), kernel_final, "{name}: rext4's recovery vs the kernel's unmount");
        for &ino in &inos {
            assert!(!in_use(&ours, ino), "{name}: {ino:?}");
        }
        // The kernel's recovery of the same crash agrees.
        let theirs = copy(&snap, &dir.path().join(format!("{name}-theirs.img")));
        KernelMount::rw(&theirs).unwrap().unmount().unwrap();
        e2fsck_clean(&theirs);
        assert_eq!(free_counts(&theirs), kernel_final, "{name}: kernel recovery");
    }
}

/// `i_dtime` of an inode (the next orphan on the list), read with debugfs.
fn dtime_of(img: &Path, ino: u32) -> u32 {
    let o = Command::new(tool("debugfs")).arg("-R").arg(format!("stat <{ino}>")).arg(img).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("dtime: 0x"))
        .map(|v| u32::from_str_radix(&v[..8], 16).unwrap())
        .unwrap_or(0)
}

fn debugfs_w(img: &Path, cmds: &[String]) {
    rext4_testkit::debugfs_write(img, &cmds.join("\n"));
}

/// Orphans written by hand the way the kernel records them: truncates that did not finish
/// (to zero, and to 1500 bytes: the blocks past the size go, the name stays) and a deleted
/// inode, on the list and in the orphan file, plus entries recovery must drop (a free inode, a
/// duplicate).
#[test]
fn recorded_truncates_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    for &(name, args) in &VARIANTS[..2] {
        let img = image(dir.path(), name, args, 1, 4);
        let (ino0, ino1, ino2, data2, blocks, before, csum_seed, oino) = {
            let fs = Fs::open(&img).unwrap();
            let i0 = fs.resolve("/d0/f0", false).unwrap();
            let i1 = fs.resolve("/d0/f1", false).unwrap();
            let i2 = fs.resolve("/d0/f2", false).unwrap();
            let oino = fs.superblock().s_orphan_file_inum.get();
            let seed = if oino != 0 {
                let g = fs.getattr(InodeNo(oino)).unwrap().generation;
                rext4::format::checksum::inode_csum_seed(fs.superblock().csum_seed(), oino, g)
            } else {
                0
            };
            let freed = fs_blocks(&fs, i0) + fs_blocks(&fs, i1) + fs_blocks(&fs, i2) - 2;
            (i0, i1, i2, read_all(&fs, i2), freed, free_counts(&img), seed, oino)
        };
        assert!(data2.len() > 2048, "{name}");
        let mut cmds = vec![
            "sif /d0/f0 size 0".to_string(),
            "sif /d0/f2 size 1500".to_string(),
            "unlink /d0/f1".to_string(),
            format!("sif <{}> links_count 0", ino1.0),
        ];
        if oino == 0 {
            cmds.push(format!("ssv last_orphan {}", ino0.0));
            cmds.push(format!("sif <{}> dtime {}", ino0.0, ino1.0));
            cmds.push(format!("sif <{}> dtime {}", ino1.0, ino2.0));
        }
        debugfs_w(&img, &cmds);
        if oino != 0 {
            let o = Command::new(tool("debugfs"))
                .arg("-R")
                .arg(format!("bmap <{oino}> 0"))
                .arg(&img)
                .output()
                .unwrap();
            let pblk: u64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
            let mut block = vec![0u8; 1024];
            for (k, v) in [ino0.0, ino1.0, 3999, ino1.0, ino2.0].into_iter().enumerate() {
                block[k * 4..k * 4 + 4].copy_from_slice(&v.to_le_bytes());
            }
            rext4::format::orphan::set_tail(&mut block, csum_seed, pblk);
            let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
            std::os::unix::fs::FileExt::write_at(&f, &block, pblk * 1024).unwrap();
        }
        let fs = rw(&img);
        assert_eq!(fs.orphans_recovered(), (1, 2), "{name}");
        let a = fs.getattr(ino0).unwrap();
        assert_eq!((a.size, a.blocks, a.nlink), (0, 0, 1), "{name}: truncated orphan");
        let a = fs.getattr(ino2).unwrap();
        assert_eq!((a.size, fs_blocks(&fs, ino2), a.nlink), (1500, 2, 1), "{name}: partly truncated orphan");
        assert_eq!(read_all(&fs, ino2), data2[..1500], "{name}");
        assert_eq!(fs.lookup(fs.resolve("/d0", false).unwrap(), b"f1").unwrap_err().errno(), libc::ENOENT);
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img);
        assert_eq!(free_counts(&img), (before.0 + blocks, before.1 + 1), "{name}");
        assert!(!in_use(&img, ino1));
        assert_eq!(recorded(&img), (0, BTreeSet::new()), "{name}");
        // Past the new end of the last block, the kernel reads zeros too.
        if let Ok(km) = KernelMount::ro(&img) {
            assert_eq!(std::fs::read(km.path().join("d0/f2")).unwrap(), data2[..1500], "{name}");
        }
    }
}
