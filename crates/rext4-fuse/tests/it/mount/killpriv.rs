//! Set-ID bits and file capabilities taken away by writes, truncations and chowns: with
//! `FUSE_HANDLE_KILLPRIV_V2` the daemon clears them (the kernel only tells it whether the
//! caller lacks `CAP_FSETID`), and the result must be kernel ext4's.

use super::*;

const CAP: &str = "0sAQAAAgAgAAAAAAAAAAAAAAAAAAA=";

/// Runs the same changes under `root` (as root, and as nobody through `setpriv`) and lists
/// each file's mode, owner, size and capability.
fn set_id_changes(root: &std::path::Path) -> String {
    let sh = |script: &str| {
        let o = std::process::Command::new("sh").arg("-c").arg(script).current_dir(root).output().unwrap();
        assert!(o.status.success(), "{script}: {}", String::from_utf8_lossy(&o.stderr));
    };
    let nobody = |script: &str| {
        let (ok, out) = as_nobody(&format!("cd {} && {script}", root.display()));
        assert!(ok, "{script}: {out}");
    };
    let mk = |name: &str, mode: u32| {
        fs::write(root.join(name), b"data\n").unwrap();
        fs::set_permissions(root.join(name), fs::Permissions::from_mode(mode)).unwrap();
    };
    mk("w_nobody", 0o6777);
    nobody("echo more >> w_nobody");
    mk("w_root", 0o6777);
    sh("echo more >> w_root");
    // Set-group-ID without group execute: kept for a writer in the file's group, dropped for
    // one outside it.
    mk("w_mand", 0o2767);
    nobody("echo more >> w_mand");
    mk("w_mand_grp", 0o2767);
    sh("chgrp 65534 w_mand_grp");
    nobody("echo more >> w_mand_grp");
    mk("t_nobody", 0o6777);
    nobody("truncate -s 1 t_nobody");
    mk("t_root", 0o6777);
    sh("truncate -s 1 t_root");
    mk("o_nobody", 0o6777);
    nobody(": > o_nobody");
    mk("c_root", 0o6755);
    sh("chown 0:0 c_root");
    mk("c_same", 0o6755);
    nix::unistd::chown(&root.join("c_same"), None, None).unwrap();
    mk("c_nobody", 0o6755);
    sh("chown 65534 c_nobody");
    mk("c_grp", 0o2745);
    sh("chgrp 65534 c_grp");
    // Root chowns a file of a group it is not in: capable, so mandatory-locking sgid stays
    // (xfstests generic/193).
    mk("c_root_other", 0o2745);
    sh("chgrp 65534 c_root_other && chown 0 c_root_other");
    sh("mkdir d_chown && chmod 2755 d_chown && chown 65534 d_chown");
    for (name, change) in [
        ("cap_w", "echo more >> cap_w"),
        ("cap_read", "cat cap_read >/dev/null && chmod 755 cap_read"),
        ("cap_t", "truncate -s 2 cap_t"),
        ("cap_c", "chown 65534 cap_c"),
    ] {
        mk(name, 0o777);
        sh(&format!("setfattr -n security.capability -v {CAP} {name} && {change}"));
    }
    let mut names: Vec<String> =
        fs::read_dir(root).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.retain(|n| n != "lost+found");
    names.sort();
    let mut out = String::new();
    for n in names {
        let md = fs::symlink_metadata(root.join(&n)).unwrap();
        let cap = xattr_value(&root.join(&n), "security.capability");
        out += &format!("{n} {:o} {}:{} {} {cap}\n", md.mode() & 0o7777, md.uid(), md.gid(), md.len());
    }
    out
}

fn xattr_value(p: &std::path::Path, name: &str) -> String {
    let o = std::process::Command::new("getfattr")
        .args(["--absolute-names", "-e", "hex", "-n", name])
        .arg(p)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    text.lines().find(|l| l.contains('=')).map_or("-".into(), |l| l.to_string())
}

/// Writes, truncations and chowns by root and by another user, through the mount and on
/// kernel ext4: the same set-ID bits and capabilities remain.
#[test]
fn set_id_bits_and_capabilities_go_as_on_ext4() {
    require_fuse!();
    for tool in ["setpriv", "setfattr", "getfattr"] {
        if find_tool(tool).is_none() {
            eprintln!("SKIP: {tool} is not installed");
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").build_in(dir.path(), "killpriv.img");
    let m = FuseMount::new(&img, "rw,allow_other");
    let fuse = set_id_changes(m.path());
    // What the kernel must not have done for the daemon: nobody's write kept set-user-ID.
    assert!(fuse.contains("w_nobody 777 0:0 10 -\n"), "{fuse}");
    assert!(fuse.contains("w_root 6777 0:0 10 -\n"), "{fuse}");
    assert!(fuse.contains("cap_read 755 0:0 5 security.capability=0x01"), "{fuse}");
    unmount_and_compare(m, &img);
    require_kernel!();
    let kimg = Image::ext4("64M").build_in(dir.path(), "kkillpriv.img");
    let k = KernelMount::rw(&kimg).expect("kernel mount");
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(k.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let kernel = set_id_changes(k.path());
    k.unmount().unwrap();
    assert_eq!(fuse, kernel, "the FUSE mount against kernel ext4");
}
