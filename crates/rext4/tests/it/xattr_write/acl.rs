//! POSIX ACLs, stored in ext4's compact form as the kernel stores them.

use super::*;

#[test]
fn acls_are_stored_as_the_kernel_stores_them() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "acl", &[]);
    let fs = rw(&img);
    let root = fs.root();
    let f = fs.create(root, b"f", 0o777, 0, 0).unwrap().ino;
    let d = fs.mkdir(root, b"d", 0o777, 0, 0).unwrap().ino;
    let e = fs.create(root, b"equiv", 0o777, 0, 0).unwrap().ino;
    let l = fs.symlink(root, b"l", b"f", 0, 0).unwrap().ino;
    let access = vfs_acl(&[
        (ACL_USER_OBJ, 6, U),
        (ACL_USER, 4, 1000),
        (ACL_USER, 7, 1001),
        (ACL_GROUP_OBJ, 4, U),
        (ACL_GROUP, 2, 100),
        (ACL_MASK, 6, U),
        (ACL_OTHER, 0, U),
    ]);
    let default = vfs_acl(&[
        (ACL_USER_OBJ, 7, U),
        (ACL_USER, 5, 1234),
        (ACL_GROUP_OBJ, 5, U),
        (ACL_MASK, 7, U),
        (ACL_OTHER, 5, U),
    ]);
    fs.setxattr(f, b"system.posix_acl_access", &access, 0).unwrap();
    // The group bits become the mask.
    assert_eq!(fs.getattr(f).unwrap().mode & 0o7777, 0o660);
    assert_eq!(fs.getxattr(f, b"system.posix_acl_access").unwrap(), access);
    fs.setxattr(d, b"system.posix_acl_default", &default, 0).unwrap();
    fs.setxattr(d, b"system.posix_acl_access", &access, 0).unwrap();
    // An ACL that says no more than a mode is the mode (ids of such entries are ignored).
    fs.setxattr(
        e,
        b"system.posix_acl_access",
        &vfs_acl(&[(ACL_USER_OBJ, 6, 5), (ACL_GROUP_OBJ, 4, 7), (ACL_OTHER, 1, 9)]),
        0,
    )
    .unwrap();
    assert_eq!(fs.getattr(e).unwrap().mode & 0o7777, 0o641);
    assert_eq!(errno(fs.getxattr(e, b"system.posix_acl_access")), libc::ENODATA);
    // Flags do not apply to ACLs; removing an absent one succeeds (as in the kernel).
    fs.setxattr(f, b"system.posix_acl_access", &access, XATTR_CREATE).unwrap();
    fs.removexattr(e, b"system.posix_acl_access").unwrap();
    fs.removexattr(f, b"system.posix_acl_default").unwrap();
    // An empty value, or a header alone, removes.
    let g = fs.create(root, b"g", 0o644, 0, 0).unwrap().ino;
    fs.setxattr(g, b"system.posix_acl_access", &access, 0).unwrap();
    fs.setxattr(g, b"system.posix_acl_access", b"", 0).unwrap();
    assert!(fs.listxattr(g).unwrap().is_empty());
    // Errors.
    assert_eq!(errno(fs.setxattr(f, b"system.posix_acl_default", &default, 0)), libc::EACCES);
    assert_eq!(errno(fs.setxattr(l, b"system.posix_acl_access", &access, 0)), libc::EOPNOTSUPP);
    assert_eq!(errno(fs.setxattr(f, b"system.posix_acl_access", &1u32.to_le_bytes(), 0)), libc::EOPNOTSUPP);
    let no_mask =
        vfs_acl(&[(ACL_USER_OBJ, 6, U), (ACL_USER, 4, 1), (ACL_GROUP_OBJ, 4, U), (ACL_OTHER, 0, U)]);
    assert_eq!(errno(fs.setxattr(f, b"system.posix_acl_access", &no_mask, 0)), libc::EINVAL);
    assert_eq!(
        errno(fs.setxattr(f, b"system.posix_acl_access", &access[..access.len() - 1], 0)),
        libc::EINVAL
    );

    let stored = |p: &str| rext4_xattrs(&fs, p);
    let (wf, wd) = (stored("/f"), stored("/d"));
    assert_eq!(wd.len(), 2);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    let Ok(km) = KernelMount::ro(&img) else {
        eprintln!("skipping the kernel comparison");
        return;
    };
    let getfacl = |p: &str| {
        let o = Command::new(tool("getfacl")).args(["-n", "-p"]).arg(km.path().join(p)).output().unwrap();
        assert!(o.status.success());
        let text = String::from_utf8(o.stdout).unwrap();
        text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')).collect::<Vec<_>>().join("\n")
    };
    assert_eq!(
        getfacl("f"),
        "user::rw-\nuser:1000:r--\nuser:1001:rwx\t#effective:rw-\ngroup::r--\ngroup:100:-w-\nmask::rw-\nother::---"
    );
    assert_eq!(
        getfacl("d"),
        "user::rw-\nuser:1000:r--\nuser:1001:rwx\t#effective:rw-\ngroup::r--\ngroup:100:-w-\nmask::rw-\nother::---\n\
         default:user::rwx\ndefault:user:1234:r-x\ndefault:group::r-x\ndefault:mask::rwx\ndefault:other::r-x"
    );
    assert_eq!(getfacl("equiv"), "user::rw-\ngroup::r--\nother::--x");
    assert_eq!(getfattr(km.path(), "f"), wf);
    assert_eq!(getfattr(km.path(), "d"), wd);
    km.unmount().unwrap();
}
