//! A filesystem with the `quota` feature through the mount: files made, grown, handed to other
//! owners and removed by several users leave the quota files with the usage e2fsck counts.

use super::*;
use std::os::unix::fs::chown;

/// A 64 MiB image with user, group and project quotas in `dir`.
fn quota_image(dir: &std::path::Path) -> std::path::PathBuf {
    let img = dir.join("q.img");
    Image::ext4("64M")
        .args(["-b", "4096", "-O", "quota,project", "-E", "quotatype=usrquota:grpquota:prjquota"])
        .build(&img);
    img
}

#[test]
fn quota_usage_through_the_mount() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = quota_image(dir.path());
    let m = FuseMount::new(&img, "rw,allow_other,default_permissions");
    let shared = m.join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    for u in 0..12u32 {
        let d = m.join(&format!("u{u}"));
        fs::create_dir(&d).unwrap();
        for k in 0..5usize {
            let p = d.join(format!("f{k}"));
            fs::write(&p, vec![u as u8; 1 + k * 20_000 + u as usize * 3_000]).unwrap();
            chown(&p, Some(2000 + u), Some(3000 + u % 3)).unwrap();
        }
        chown(&d, Some(2000 + u), None).unwrap();
        // Some owners' files grow, shrink and go.
        match u % 3 {
            0 => OpenOptions::new()
                .append(true)
                .open(d.join("f4"))
                .unwrap()
                .write_all(&[1u8; 300_000])
                .unwrap(),
            1 => File::options().write(true).open(d.join("f3")).unwrap().set_len(10).unwrap(),
            _ => fs::remove_file(d.join("f2")).unwrap(),
        }
    }
    // A user of its own makes files through the mount.
    let (ok, out) = as_nobody(&format!(
        "for i in 1 2 3; do head -c 50000 /dev/zero > {0}/n$i; done; rm {0}/n2; ln -s n1 {0}/link",
        shared.display()
    ));
    assert!(ok, "{out}");
    // Everything of one owner is handed to another.
    for k in [0, 1, 3, 4] {
        chown(m.join(&format!("u5/f{k}")), Some(2006), None).unwrap();
    }
    m.unmount();
    e2fsck_clean(&img);
    assert_eq!(quota_usage(&img, "user", 65534).map(|u| u.1), Some(3), "nobody: two files and a link");
    assert_eq!(quota_usage(&img, "user", 2005).map(|u| u.1), Some(1), "u5 keeps its directory");
    assert_eq!(quota_usage(&img, "user", 2006).map(|u| u.1), Some(10), "u6's own and u5's files");
}

/// `chattr -p`, `chattr +P`, `lsattr -p`, and links and renames across projects, through the
/// mount on an image with the `project` feature; the transcript must be kernel ext4's on a copy
/// of the image, or, where this kernel mounts such images read-only only (built without
/// quota support), what ext4's rules give (`ext4_link`, `ext4_rename`: `EXDEV`; new files
/// take a `PROJINHERIT` directory's project).
#[test]
fn projects_as_kernel_ext4() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let kimg = dir.path().join("kernel.img");
    let fimg = dir.path().join("fuse.img");
    Image::ext4("32M").args(["-b", "4096", "-O", "project"]).build(&kimg);
    fs::copy(&kimg, &fimg).unwrap();
    let steps = |root: &std::path::Path| -> Vec<String> {
        let sh = |cmd: &str| {
            let o = std::process::Command::new("sh").args(["-c", cmd, "sh"]).arg(root).output().unwrap();
            (o.status.success(), String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        let code = |r: std::io::Result<()>| r.err().map_or(0, |e| errno(&e));
        let mut out = Vec::new();
        for d in ["p", "q", "d"] {
            fs::create_dir(root.join(d)).unwrap();
        }
        fs::write(root.join("x"), b"x").unwrap();
        out.push(format!("chattr p {:?}", sh("chattr +P -p 17 \"$1/p\"").0));
        out.push(format!("chattr x {:?}", sh("chattr -p 23 \"$1/x\"").0));
        fs::write(root.join("p/new"), b"n").unwrap();
        fs::create_dir(root.join("p/sub")).unwrap();
        fs::write(root.join("p/sub/deep"), b"d").unwrap();
        out.push(format!("link {}", code(fs::hard_link(root.join("x"), root.join("p/x")))));
        out.push(format!("rename {}", code(fs::rename(root.join("x"), root.join("p/x")))));
        out.push(format!("rename out {}", code(fs::rename(root.join("p/new"), root.join("q/new")))));
        out.push(format!("chattr x {:?}", sh("chattr -p 17 \"$1/x\"").0));
        out.push(format!("link same {}", code(fs::hard_link(root.join("x"), root.join("p/x")))));
        let (_, l) = sh("cd \"$1\" && lsattr -p -d p p/sub p/sub/deep q/new x d | awk '{print $1, $3}'");
        out.extend(l.lines().map(String::from));
        let (_, l) = sh("chattr -p 0 \"$1/q/new\" && lsattr -p \"$1/q/new\" | awk '{print $1}'");
        out.push(format!("q/new back to {l}"));
        out
    };
    let kernel = kernel_can_mount().then(|| KernelMount::with_options(&kimg, "loop").ok()).flatten();
    let want: Vec<String> = match kernel {
        Some(km) => {
            let k = steps(km.path());
            km.unmount().unwrap();
            e2fsck_clean(&kimg);
            k
        }
        None => [
            "chattr p true",
            "chattr x true",
            "link 18",
            "rename 18",
            "rename out 0",
            "chattr x true",
            "link same 0",
            "17 p",
            "17 p/sub",
            "17 p/sub/deep",
            "17 q/new",
            "17 x",
            "0 d",
            "q/new back to 0",
        ]
        .map(String::from)
        .to_vec(),
    };
    let m = FuseMount::new(&fimg, "rw,allow_other,default_permissions");
    let ours = steps(m.path());
    m.unmount();
    e2fsck_clean(&fimg);
    assert_eq!(ours, want, "through the mount vs kernel ext4 (or its rules)");
}

/// Sets hard limits (KiB, inodes) for `id` on the unmounted image `img`.
fn hard_limits(img: &std::path::Path, ty: rext4::QuotaType, id: u32, kib: u64, inodes: u64) {
    let fs =
        rext4::Fs::open_with(img, rext4::Options { writable: true, ..rext4::Options::default() }).unwrap();
    let lim =
        rext4::QuotaLimits { space_soft_kib: 0, space_hard_kib: kib, inodes_soft: 0, inodes_hard: inodes };
    fs.set_quota_limits(ty, id, lim).unwrap();
    fs.unmount().unwrap();
}

/// Quota limits through a mount with `usrquota,grpquota`: another user's writes stop with
/// `EDQUOT` at its space limit and its creates at its inode limit, as `write(2)` and
/// `open(2)` report them on ext4; root passes limits (`CAP_SYS_RESOURCE`), for writes,
/// creates and a chown to the limited user; the usage after is what e2fsck counts.
#[test]
fn limits_through_the_mount() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("q.img");
    Image::ext4("64M").args(["-b", "4096", "-O", "quota", "-E", "quotatype=usrquota:grpquota"]).build(&img);
    hard_limits(&img, rext4::QuotaType::User, 65534, 1024, 3);
    let m = FuseMount::new(&img, "rw,allow_other,default_permissions,usrquota,grpquota");
    let shared = m.join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    let (ok, out) = as_nobody(&format!("head -c 3000000 /dev/zero > {}/a", shared.display()));
    assert!(!ok && out.contains("Disk quota exceeded"), "{out}");
    assert_eq!(fs::metadata(shared.join("a")).unwrap().len(), 1 << 20, "writes stop at the hard limit");
    let (ok, out) = as_nobody(&format!("touch {0}/b {0}/c", shared.display()));
    assert!(ok, "{out}");
    let (ok, out) = as_nobody(&format!("touch {0}/d", shared.display()));
    assert!(!ok && out.contains("Disk quota exceeded"), "a fourth inode: {out}");
    // Root passes the limits, on the user's files too.
    OpenOptions::new().append(true).open(shared.join("a")).unwrap().write_all(&[1u8; 100_000]).unwrap();
    fs::write(m.join("big"), vec![2u8; 500_000]).unwrap();
    chown(m.join("big"), Some(65534), None).unwrap();
    let (ok, out) = as_nobody(&format!("head -c 4096 /dev/zero >> {}/b", shared.display()));
    assert!(!ok && out.contains("Disk quota exceeded"), "over the limit after root's changes: {out}");
    // Space given back is room again.
    let (ok, out) = as_nobody(&format!("rm {0}/a && head -c 4096 /dev/zero >> {0}/b", shared.display()));
    assert!(ok, "{out}");
    m.unmount();
    e2fsck_clean(&img);
    let (space, inodes) = quota_usage(&img, "user", 65534).expect("nobody's entry");
    assert_eq!(inodes, 3, "b, c and big");
    assert!((500_000..600_000).contains(&space), "big and 4 KiB of b: {space}");
}

/// `df` (statfs) in a project directory through a mount with `prjquota` shows the project's
/// limit and what is left of it, as ext4 does (`ext4_statfs_project`); at the mount's root,
/// the filesystem's.
#[test]
fn statfs_in_a_project_directory_through_the_mount() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = quota_image(dir.path());
    hard_limits(&img, rext4::QuotaType::Project, 88, 4096, 10);
    let m = FuseMount::new(&img, "rw,prjquota");
    let p = m.join("p");
    fs::create_dir(&p).unwrap();
    let o = std::process::Command::new("chattr").args(["+P", "-p", "88"]).arg(&p).output().unwrap();
    assert!(o.status.success(), "chattr: {}", String::from_utf8_lossy(&o.stderr));
    fs::write(p.join("a"), vec![1u8; 256 << 10]).unwrap();
    let df = |path: &std::path::Path| {
        let o = std::process::Command::new("stat")
            .args(["-f", "-c", "%S %b %f %a %c %d"])
            .arg(path)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    // 4 MiB of 4 KiB blocks; the directory's block and the file's 64 in use; 10 inodes, 2 used.
    assert_eq!(df(&p), "4096 1024 959 959 10 8");
    let whole = df(&m.join(""));
    assert!(!whole.starts_with("4096 1024 "), "the root shows the filesystem: {whole}");
    m.unmount();
    e2fsck_clean(&img);
}
