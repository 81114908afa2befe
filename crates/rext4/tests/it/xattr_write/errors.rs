//! Errnos, compared with the kernel's, and what immutable and append-only inodes refuse.

use super::*;

/// One operation of the errno table, done the same way on rext4 and on a kernel mount.
struct Case {
    path: &'static str,
    name: Vec<u8>,
    /// `None`: removexattr.
    value: Option<Vec<u8>>,
    flags: u32,
}

fn case(path: &'static str, name: &[u8], value: Option<&[u8]>, flags: u32) -> Case {
    Case { path, name: name.to_vec(), value: value.map(<[u8]>::to_vec), flags }
}

fn kernel_errno(mnt: &Path, c: &Case) -> i32 {
    let p = CString::new(mnt.join(c.path.trim_start_matches('/')).as_os_str().as_bytes()).unwrap();
    let n = CString::new(c.name.clone()).unwrap();
    // SAFETY: both strings are NUL-terminated and live across the call; the value pointer
    // and length describe a live slice.
    let r = unsafe {
        match &c.value {
            Some(v) => libc::lsetxattr(p.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), c.flags as i32),
            None => libc::lremovexattr(p.as_ptr(), n.as_ptr()),
        }
    };
    if r == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap()
    }
}

#[test]
fn errnos_match_the_kernel() {
    let acl = vfs_acl(&[
        (ACL_USER_OBJ, 6, U),
        (ACL_USER, 4, 7),
        (ACL_GROUP_OBJ, 4, U),
        (ACL_MASK, 4, U),
        (ACL_OTHER, 0, U),
    ]);
    let long = |n: usize| [b"user.".to_vec(), vec![b'n'; n - 5]].concat();
    let cases = vec![
        case("/f", b"user.x", Some(b"1"), XATTR_CREATE),
        case("/f", b"user.x", Some(b"2"), XATTR_CREATE),
        case("/f", b"user.x", Some(b"3"), XATTR_REPLACE),
        case("/f", b"user.y", Some(b"3"), XATTR_REPLACE),
        case("/f", b"user.x", Some(b"4"), XATTR_CREATE | XATTR_REPLACE),
        case("/f", b"user.x", Some(b"4"), 4),
        case("/f", b"user.y", None, 0),
        case("/f", b"user.x", None, 0),
        case("/f", b"user.x", None, 0),
        case("/f", b"", Some(b"1"), 0),
        case("/f", &long(255), Some(b"1"), 0),
        case("/f", &long(256), Some(b"1"), 0),
        case("/f", b"user.big", Some(&[1; 65537]), 0),
        case("/f", b"user.big", Some(&[1; 65536]), 0),
        case("/f", b"user.big", Some(&[1; 4000]), 0),
        case("/f", b"user.", Some(b"1"), 0),
        case("/f", b"bogus.x", Some(b"1"), 0),
        case("/f", b"system.data", Some(b"1"), 0),
        case("/f", b"system.posix_acl_accessx", Some(b"1"), 0),
        case("/f", b"bogus.x", None, 0),
        case("/f", b"user.", None, 0),
        case("/f", b"trusted.t", Some(b"t"), 0),
        case("/f", b"security.s", Some(b""), 0),
        case("/l", b"user.x", Some(b"1"), 0),
        case("/l", b"user.x", None, 0),
        case("/l", b"trusted.x", Some(b"1"), 0),
        case("/l", b"system.posix_acl_access", Some(&acl), 0),
        case("/l", b"system.posix_acl_access", None, 0),
        case("/p", b"user.x", Some(b"1"), 0),
        case("/p", b"security.x", Some(b"1"), 0),
        case("/f", b"system.posix_acl_default", Some(&acl), 0),
        case("/f", b"system.posix_acl_default", None, 0),
        case("/d", b"system.posix_acl_default", Some(&acl), XATTR_REPLACE),
        case("/d", b"system.posix_acl_default", Some(&acl), XATTR_CREATE),
        case("/d", b"system.posix_acl_access", None, 0),
        case("/f", b"system.posix_acl_access", Some(&acl[..6]), 0),
        case("/f", b"system.posix_acl_access", Some(&1u32.to_le_bytes()), 0),
        case("/f", b"system.posix_acl_access", Some(&acl), 0),
    ];
    let dir = tempfile::tempdir().unwrap();
    let rimg = mkfs(dir.path(), "rext4", &[]);
    let fs = rw(&rimg);
    let root = fs.root();
    fs.create(root, b"f", 0o644, 0, 0).unwrap();
    fs.mkdir(root, b"d", 0o755, 0, 0).unwrap();
    fs.symlink(root, b"l", b"f", 0, 0).unwrap();
    fs.mknod(root, b"p", 0o010644, (0, 0), 0, 0).unwrap();
    let got: Vec<i32> = cases
        .iter()
        .map(|c| {
            let i = ino(&fs, c.path);
            errno(match &c.value {
                Some(v) => fs.setxattr(i, &c.name, v, c.flags),
                None => fs.removexattr(i, &c.name),
            })
        })
        .collect();
    let paths = ["/f", "/d", "/l", "/p"];
    let views: Vec<(&str, Xattrs)> = paths.iter().map(|p| (*p, rext4_xattrs(&fs, p))).collect();
    finish(fs, &rimg, &views);
    // A read-only filesystem refuses.
    let ro = Fs::open(&rimg).unwrap();
    assert_eq!(errno(ro.setxattr(ino(&ro, "/f"), b"user.z", b"1", 0)), libc::EROFS);
    drop(ro);

    require_kernel!();
    let kimg = mkfs(dir.path(), "kernel", &[]);
    let km = KernelMount::rw(&kimg).unwrap();
    let m = km.path().to_path_buf();
    std::fs::write(m.join("f"), b"").unwrap();
    std::fs::create_dir(m.join("d")).unwrap();
    std::os::unix::fs::symlink("f", m.join("l")).unwrap();
    nix::unistd::mkfifo(&m.join("p"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let want: Vec<i32> = cases.iter().map(|c| kernel_errno(&m, c)).collect();
    for (i, c) in cases.iter().enumerate() {
        assert_eq!(
            got[i],
            want[i],
            "case {i}: {} {} flags {}: rext4 errno {} kernel errno {}",
            c.path,
            String::from_utf8_lossy(&c.name[..c.name.len().min(40)]),
            c.flags,
            got[i],
            want[i]
        );
    }
    for (p, v) in &views {
        assert_eq!(&getfattr(&m, p), v, "{p}: kernel's own result vs rext4's");
    }
    km.unmount().unwrap();
}

#[test]
fn immutable_and_append_only_inodes_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "imm", &[]);
    let fs = rw(&img);
    fs.create(fs.root(), b"i", 0o644, 0, 0).unwrap();
    fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    for (p, fl) in [("/i", "0x80010"), ("/a", "0x80020")] {
        let o = Command::new(tool("debugfs"))
            .args(["-w", "-R", &format!("set_inode_field {p} flags {fl}")])
            .arg(&img)
            .output()
            .unwrap();
        assert!(o.status.success());
    }
    let fs = rw(&img);
    for p in ["/i", "/a"] {
        assert_eq!(errno(fs.setxattr(ino(&fs, p), b"user.x", b"1", 0)), libc::EPERM, "{p}");
        assert_eq!(errno(fs.removexattr(ino(&fs, p), b"user.x")), libc::EPERM, "{p}");
    }
    finish(fs, &img, &[("/i", Xattrs::new()), ("/a", Xattrs::new())]);
}
