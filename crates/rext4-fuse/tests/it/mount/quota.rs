//! A filesystem with the `quota` feature through the mount: files made, grown, handed to other
//! owners and removed by several users leave the quota files with the usage e2fsck counts.

use super::*;
use std::os::unix::fs::chown;

fn usage(img: &std::path::Path, ty: &str, id: u32) -> Option<(u64, u64)> {
    let o = std::process::Command::new("debugfs")
        .args(["-R", &format!("get_quota {ty} {id}")])
        .arg(img)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let row = out.lines().find(|l| l.split_whitespace().next() == Some(&id.to_string()))?;
    let f: Vec<&str> = row.split_whitespace().collect();
    Some((f.get(1)?.parse().ok()?, f.get(4)?.parse().ok()?))
}

#[test]
fn quota_usage_through_the_mount() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("q.img");
    Image::ext4("64M")
        .args(["-b", "4096", "-O", "quota,project", "-E", "quotatype=usrquota:grpquota:prjquota"])
        .build(&img);
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
    assert_eq!(usage(&img, "user", 65534).map(|u| u.1), Some(3), "nobody: two files and a link");
    assert_eq!(usage(&img, "user", 2005).map(|u| u.1), Some(1), "u5 keeps its directory");
    assert_eq!(usage(&img, "user", 2006).map(|u| u.1), Some(10), "u6's own and u5's files");
}
