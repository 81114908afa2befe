//! Other users through the mount: permissions, `access(2)`, ACLs and `grpid`.

use super::*;

/// With allow_other, other users get the kernel's permission checks (default_permissions):
/// they work in what they own or may write, and are refused elsewhere.
#[test]
fn permissions_for_other_users() {
    require_fuse!();
    if find_tool("setpriv").is_none() {
        eprintln!("SKIP: setpriv (util-linux) is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").build_in(dir.path(), "perm.img");
    let m = FuseMount::new(&img, "rw,allow_other");
    let root = m.path().to_str().unwrap().to_string();
    fs::create_dir(m.join("pub")).unwrap();
    fs::set_permissions(m.join("pub"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::create_dir(m.join("priv")).unwrap();
    fs::set_permissions(m.join("priv"), fs::Permissions::from_mode(0o700)).unwrap();
    File::create(m.join("pub/roots")).unwrap();
    fs::set_permissions(m.join("pub/roots"), fs::Permissions::from_mode(0o644)).unwrap();

    let (ok, out) = as_nobody(&format!("touch {root}/pub/mine && mkdir {root}/pub/mydir && ls {root}/pub"));
    assert!(ok, "nobody works in a world-writable dir: {out}");
    let md = fs::metadata(m.join("pub/mine")).unwrap();
    assert_eq!((md.uid(), md.gid()), (65534, 65534));
    for (what, script) in [
        ("create in a 0700 root dir", format!("touch {root}/priv/x")),
        ("list a 0700 root dir", format!("ls {root}/priv")),
        ("mkdir in the 0755 root", format!("mkdir {root}/x")),
        ("unlink root's file in a sticky dir", format!("rm -f {root}/pub/roots")),
        ("chmod root's file", format!("chmod 777 {root}/pub/roots")),
        ("write root's 0644 file", format!("echo x >> {root}/pub/roots")),
    ] {
        let (ok, out) = as_nobody(&script);
        assert!(!ok, "{what} must be refused: {out}");
        assert!(
            out.contains("Permission denied") || out.contains("Operation not permitted"),
            "{what}: {out}"
        );
    }
    assert!(m.join("pub/roots").exists());
    unmount_and_compare(m, &img);
}

/// Without `default_permissions` the daemon answers `access(2)` itself: a supplementary group
/// of the caller counts, as in the kernel's own check.
#[test]
fn access_counts_supplementary_groups() {
    require_fuse!();
    if find_tool("setpriv").is_none() {
        eprintln!("SKIP: setpriv (util-linux) is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").build_in(dir.path(), "groups.img");
    let m = FuseMount::new(&img, "rw,allow_other,nodefault_permissions");
    let f = m.join("shared");
    fs::write(&f, b"x").unwrap();
    std::os::unix::fs::chown(&f, Some(0), Some(4242)).unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
    let path = f.to_str().unwrap();
    let access = |groups: &str| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", groups, "test", "-r", path])
            .status()
            .unwrap()
            .success()
    };
    assert!(access("--groups=4242"), "a supplementary group with read permission");
    assert!(!access("--clear-groups"), "no group with read permission");
    unmount_and_compare(m, &img);
}

/// What the ACL script below shows of a tree: for each path, the mode and `getfacl`'s view.
const ACL_SCRIPT: &str = r#"set -e
cd "$1"
umask 022
mkdir d
setfacl -d -m u::r,g::r,o::- d
umask 0
touch d/f
mkdir d/sub
mknod d/fifo p
umask 077
touch d/g
umask 022
mkdir d2
setfacl -d -m u::rwx,u:1000:rwx,g::rx,m::rwx,o::x d2
touch d2/f
mkdir d2/sub
chmod 640 d2/f
umask 077
touch plain
setfacl -m u:65534:r plain
chmod 604 plain
touch denied
chmod 644 denied
setfacl -m u:65534:- denied
# The owner sets an access ACL from inside the file's group (set-group-ID stays) and from
# outside it (it goes: xfstests generic/375).
touch sg_in sg_out
chown 65534:65534 sg_in sg_out
chmod 2775 sg_in sg_out
setpriv --reuid=65534 --regid=65534 --clear-groups setfacl -m u::rwx,g::rwx,o::rwx sg_in
setpriv --reuid=65534 --regid=4242 --clear-groups setfacl -m u::rwx,g::rwx,o::rwx sg_out
for f in d/f d/sub d/fifo d/g d2/f d2/sub plain denied sg_in sg_out; do
    stat -c '%A %n' "$f"
    getfacl -cp "$f"
done
"#;

/// POSIX ACLs as ext4 has them (xfstests generic/099): a new inode under a default ACL takes
/// it ANDed with the create mode, the umask not applied, and a new directory takes it as its
/// own default; without one the umask applies; chmod moves the ACL's mask; and the kernel
/// enforces an ACL entry that denies a user the mode would let in. The same script on a
/// kernel ext4 mount shows the same.
#[test]
fn acls_are_inherited_and_enforced_as_on_ext4() {
    require_fuse!();
    let run = |dir: &std::path::Path| {
        let o = std::process::Command::new("sh").args(["-c", ACL_SCRIPT, "sh"]).arg(dir).output().unwrap();
        assert!(o.status.success(), "ACL script: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").build_in(dir.path(), "acl.img");
    let m = FuseMount::new(&img, "rw,allow_other");
    let fuse = run(m.path());
    assert!(fuse.contains("-r--r----- d/f\nuser::r--\ngroup::r--\nother::---\n"), "{fuse}");
    let (ok, why) = as_nobody(&format!("cat {}", m.join("denied").display()));
    assert!(!ok && why.contains("Permission denied"), "an ACL entry denies nobody: {why}");
    let (ok, why) = as_nobody(&format!("cat {}", m.join("plain").display()));
    assert!(ok, "an ACL entry lets nobody read: {why}");
    assert!(fuse.contains("-rwxrwsrwx sg_in\n") && fuse.contains("-rwxrwxrwx sg_out\n"), "{fuse}");
    unmount_and_compare(m, &img);
    require_kernel!();
    let kimg = Image::ext4("64M").build_in(dir.path(), "kacl.img");
    let k = KernelMount::rw(&kimg).expect("kernel mount");
    let kernel = run(k.path());
    k.unmount().unwrap();
    assert_eq!(fuse, kernel, "the FUSE mount against kernel ext4");
}

/// `grpid`: new files and directories take their directory's group, and a directory that
/// is not set-group-ID passes no set-group-ID bit on; the kernel's ext4 mounted with `grpid`
/// gives the same.
#[test]
fn grpid_gives_the_directory_group() {
    require_fuse!();
    let show = |root: &std::path::Path| {
        fs::create_dir(root.join("g")).unwrap();
        nix::unistd::chown(&root.join("g"), None, Some(4242.into())).unwrap();
        File::create(root.join("g/f")).unwrap();
        fs::create_dir(root.join("g/sub")).unwrap();
        ["g/f", "g/sub"].map(|p| {
            let m = fs::metadata(root.join(p)).unwrap();
            (m.gid(), m.mode() & 0o2000)
        })
    };
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").build_in(dir.path(), "grpid.img");
    let m = FuseMount::new(&img, "rw,grpid");
    let fuse = show(m.path());
    assert_eq!(fuse, [(4242, 0), (4242, 0)]);
    unmount_and_compare(m, &img);
    require_kernel!();
    let kimg = Image::ext4("64M").build_in(dir.path(), "kgrpid.img");
    let k = KernelMount::with_options(&kimg, "loop,grpid").expect("kernel mount -o grpid");
    let kernel = show(k.path());
    k.unmount().unwrap();
    assert_eq!(fuse, kernel, "the FUSE mount against kernel ext4 with grpid");
}
