//! File handles (`name_to_handle_at`, `open_by_handle_at`: what NFS export and xfstests'
//! exportfs group use) through the mount against kernel ext4. Once the kernel has dropped
//! its cached inodes, a handle reaches the daemon as a lookup of "." (and a directory's
//! parent as ".."); handles outlive a remount, and name a removed file no more.

use super::*;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// A `struct file_handle` with room for any handle (`MAX_HANDLE_SZ` is 128).
#[repr(C)]
struct Handle {
    bytes: u32,
    kind: i32,
    data: [u8; 128],
}

fn handle_of(p: &Path) -> Handle {
    let mut h = Handle { bytes: 128, kind: 0, data: [0; 128] };
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let mut mount_id = 0;
    // SAFETY: `h` is a file_handle with `bytes` of room after its header; the path is a C string.
    let r =
        unsafe { libc::name_to_handle_at(libc::AT_FDCWD, c.as_ptr(), (&raw mut h).cast(), &mut mount_id, 0) };
    assert_eq!(r, 0, "name_to_handle_at {}: {}", p.display(), std::io::Error::last_os_error());
    h
}

/// Opens `h` below the mount `root`: the first bytes read, or the error.
fn open_handle(root: &Path, h: &mut Handle, dir: bool) -> Result<Vec<u8>, i32> {
    let mount = File::open(root).unwrap();
    let flags = libc::O_RDONLY | if dir { libc::O_DIRECTORY } else { 0 };
    // SAFETY: as in `handle_of`; the descriptor returned is owned below.
    let fd = unsafe { libc::open_by_handle_at(mount.as_raw_fd(), (h as *mut Handle).cast(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    let f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    if dir {
        return Ok(b"dir".to_vec());
    }
    let mut v = Vec::new();
    (&f).read_to_end(&mut v).unwrap();
    Ok(v)
}

fn drop_kernel_caches() {
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
}

/// Takes handles, drops the kernel's caches, opens them again; returns what each open gave.
/// `remount` unmounts and mounts the image again and gives the new root.
fn handle_steps(root: &Path, remount: &mut dyn FnMut() -> PathBuf) -> String {
    fs::create_dir_all(root.join("d/sub")).unwrap();
    fs::write(root.join("d/f"), b"handle data").unwrap();
    fs::write(root.join("gone"), b"x").unwrap();
    fs::write(root.join("reused"), b"y").unwrap();
    let mut hs: Vec<(&str, Handle, bool)> = vec![
        ("d", handle_of(&root.join("d")), true),
        ("d/sub", handle_of(&root.join("d/sub")), true),
        ("d/f", handle_of(&root.join("d/f")), false),
        ("gone", handle_of(&root.join("gone")), false),
        ("reused", handle_of(&root.join("reused")), false),
    ];
    fs::remove_file(root.join("gone")).unwrap();
    // A new file may take the removed one's inode number; its generation differs.
    fs::remove_file(root.join("reused")).unwrap();
    fs::write(root.join("new"), b"z").unwrap();
    let mut out = String::new();
    let mut report = |when: &str, root: &Path, hs: &mut Vec<(&str, Handle, bool)>| {
        for (name, h, dir) in hs.iter_mut() {
            let r = open_handle(root, h, *dir).map(|v| String::from_utf8_lossy(&v).into_owned());
            out += &format!("{when} {name}: {r:?}\n");
        }
    };
    report("cached", root, &mut hs);
    drop_kernel_caches();
    report("dropped", root, &mut hs);
    let root = remount();
    report("remounted", &root, &mut hs);
    // The directory opened by handle has its parent (".." through the daemon).
    drop_kernel_caches();
    let d = open_handle(&root, &mut hs[1].1, true);
    out += &format!("parent of d/sub: {d:?}\n");
    out
}

#[test]
fn file_handles_as_kernel_ext4() {
    require_fuse!();
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    let fimg = Image::ext4("32M").build_in(dir.path(), "fuse.img");
    let kimg = Image::ext4("32M").build_in(dir.path(), "kernel.img");

    let mut m = Some(FuseMount::new(&fimg, "rw"));
    let root = m.as_ref().unwrap().path().to_path_buf();
    let fuse = handle_steps(&root, &mut || {
        m.take().unwrap().unmount();
        m = Some(FuseMount::new(&fimg, "rw"));
        m.as_ref().unwrap().path().to_path_buf()
    });
    unmount_and_compare(m.take().unwrap(), &fimg);

    let mut k = Some(KernelMount::rw(&kimg).expect("kernel mount"));
    let root = k.as_ref().unwrap().path().to_path_buf();
    let kernel = handle_steps(&root, &mut || {
        k.take().unwrap().unmount().unwrap();
        k = Some(KernelMount::rw(&kimg).expect("kernel mount"));
        k.as_ref().unwrap().path().to_path_buf()
    });
    k.take().unwrap().unmount().unwrap();
    e2fsck_clean(&kimg);

    assert!(fuse.contains("remounted d/f: Ok(\"handle data\")"), "{fuse}");
    assert!(fuse.contains(&format!("dropped gone: Err({})", libc::ESTALE)), "{fuse}");
    assert_eq!(fuse, kernel, "the mount against kernel ext4");
}
