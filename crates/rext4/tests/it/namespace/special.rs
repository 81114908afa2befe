//! Device nodes, FIFOs and sockets: made, read back and freed without touching blocks.

use super::*;

#[test]
fn mknod_makes_fifos_sockets_and_devices() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "mknod", &[]);
    let fs = rw(&img);
    let root = fs.root();
    let fifo = fs.mknod(root, b"fifo", 0o010644, (0, 0), 0, 0).unwrap();
    assert_eq!(fifo.kind, FileType::Fifo);
    fs.mknod(root, b"sock", 0o140600, (0, 0), 0, 0).unwrap();
    let c = fs.mknod(root, b"null", 0o020666, (1, 3), 0, 0).unwrap();
    assert_eq!((c.kind, c.rdev), (FileType::CharDevice, (1, 3)));
    let b = fs.mknod(root, b"big", 0o060600, (259, 70000), 0, 0).unwrap();
    assert_eq!((b.kind, b.rdev), (FileType::BlockDevice, (259, 70000)));
    assert_eq!(fs.mknod(root, b"d", 0o040755, (0, 0), 0, 0).unwrap_err().errno(), 22);
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&img);
    if let Ok(km) = KernelMount::ro(&img) {
        let mnt = km.path().to_path_buf();
        use std::os::unix::fs::FileTypeExt;
        let c = std::fs::symlink_metadata(mnt.join("null")).unwrap();
        let b = std::fs::symlink_metadata(mnt.join("big")).unwrap();
        let f = std::fs::symlink_metadata(mnt.join("fifo")).unwrap();
        let s = std::fs::symlink_metadata(mnt.join("sock")).unwrap();
        km.unmount().unwrap();
        assert!(c.file_type().is_char_device() && c.rdev() == (1 << 8 | 3));
        assert!(b.file_type().is_block_device());
        assert_eq!(b.rdev(), ((259u64 & 0xFFF) << 8) | (70000 & 0xFF) | ((70000u64 & !0xFF) << 12));
        assert!(f.file_type().is_fifo() && s.file_type().is_socket());
    }
}

/// Device nodes keep their device number in `i_block`: deleting one must free no block. The
/// number (1, 2) reads as block 258 when taken for a block map (the reserved GDT blocks on a
/// default image), others as blocks outside the filesystem. Nodes made by rext4 and by the
/// kernel, unlinked directly and after being held open, on extent and block-mapped images:
/// the free counts come back to where they were and e2fsck finds nothing.
#[test]
fn deleting_device_nodes_frees_no_block() {
    let dir = tempfile::tempdir().unwrap();
    let devs: [(u32, u32); 6] = [(1, 2), (8, 1), (1, 3), (259, 70000), (4095, 1 << 19), (0, 0)];
    for (name, args) in
        [("dev-ext4", &[][..]), ("dev-ext3", &["-t", "ext3"][..]), ("dev-1k", &["-b", "1024"][..])]
    {
        let img = mkfs(dir.path(), name, args);
        let kernel_made = match KernelMount::rw(&img) {
            Ok(km) => {
                for (i, &(ma, mi)) in devs.iter().enumerate() {
                    let p = std::ffi::CString::new(
                        km.path().join(format!("k{i}")).into_os_string().into_encoded_bytes(),
                    )
                    .unwrap();
                    let rc = unsafe { libc::mknod(p.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(ma, mi)) };
                    assert_eq!(rc, 0, "mknod through the kernel");
                }
                km.unmount().unwrap();
                true
            }
            Err(e) => {
                eprintln!("{name}: no kernel mount ({e}): rext4's own nodes only");
                false
            }
        };
        let fs = rw(&img);
        let root = fs.root();
        let before = fs.statfs().unwrap();
        let mut names = Vec::new();
        for (i, &d) in devs.iter().enumerate() {
            let mode = if i % 2 == 0 { 0o020644 } else { 0o060600 };
            let n = format!("r{i}").into_bytes();
            fs.mknod(root, &n, mode, d, 0, 0).unwrap_or_else(|e| panic!("mknod {d:?}: {e}"));
            names.push(n);
        }
        if kernel_made {
            names.extend((0..devs.len()).map(|i| format!("k{i}").into_bytes()));
        }
        for (i, n) in names.iter().enumerate() {
            if i % 3 == 0 {
                // Held open while its name goes: freed at release, through the orphan record.
                let ino = fs.lookup(root, n).unwrap().ino;
                fs.hold(ino).unwrap();
                fs.unlink(root, n).unwrap();
                fs.release(ino).unwrap();
            } else {
                fs.unlink(root, n)
                    .unwrap_or_else(|e| panic!("{name}: unlink {}: {e}", String::from_utf8_lossy(n)));
            }
        }
        let after = fs.statfs().unwrap();
        assert_eq!(after.blocks_free, before.blocks_free, "{name}: blocks freed by deleting device nodes");
        assert!(!fs.has_errors(), "{name}");
        fs.unmount().unwrap();
        drop(fs);
        fsck_clean(&img);
    }
}
