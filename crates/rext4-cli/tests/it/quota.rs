//! `rext4 repquota` and `rext4 setquota` on an image `rext4 mkfs -O quota,project` made:
//! limits set by the command are the ones debugfs reads from the quota file and e2fsck keeps,
//! the report shows usage and limits as the file holds them, and bad requests fail.

use crate::mkfs::{ok, rext4};
use rext4_testkit::{e2fsck_clean, quota_usage, tool};
use std::process::Command;

#[test]
fn setquota_limits_show_in_repquota_and_debugfs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("q.img");
    let p = img.to_str().expect("utf-8 path");
    ok(&rext4(&["mkfs", "-q", "-O", "quota,project", p, "64M"]));
    let f = format!("{p}:/f");
    ok(&rext4(&["truncate", "-s", "0", &f]));
    ok(&rext4(&["chown", "1000:2000", &f]));
    ok(&rext4(&["setquota", "-u", "1000", "10M", "20480", "5", "10", p]));
    ok(&rext4(&["setquota", "-g", "3000", "0", "1G", "0", "0", p]));
    ok(&rext4(&["setquota", "-P", "7", "64", "128", "1", "2", p]));
    e2fsck_clean(&img);
    // debugfs's columns: space, block soft, block hard, inodes, inode soft, inode hard.
    let row = |ty: &str, id: u32| {
        let o = Command::new(tool("debugfs"))
            .args(["-R", &format!("get_quota {ty} {id}"), p])
            .output()
            .expect("debugfs");
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let line =
            out.lines().find(|l| l.split_whitespace().next() == Some(&id.to_string())).map(str::to_owned);
        line.unwrap_or_else(|| panic!("no {ty} {id} in {out}"))
            .split_whitespace()
            .skip(1)
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(row("user", 1000), ["0", "10240", "20480", "1", "5", "10"]);
    assert_eq!(row("group", 3000), ["0", "0", "1048576", "0", "0", "0"]);
    assert_eq!(row("project", 7), ["0", "64", "128", "0", "1", "2"]);
    assert_eq!(quota_usage(&img, "group", 2000), Some((0, 1)));

    let o = rext4(&["repquota", "-u", "-g", "-P", p]);
    ok(&o);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let fields = |id: &str| -> Vec<String> {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(id))
            .unwrap_or_else(|| panic!("{id} in:\n{text}"));
        line.split_whitespace().map(str::to_owned).collect()
    };
    assert_eq!(fields("#1000"), ["#1000", "--", "0", "10240", "20480", "1", "5", "10"]);
    assert_eq!(fields("#7"), ["#7", "--", "0", "64", "128", "0", "1", "2"]);
    for head in ["*** Report for user quotas", "*** Report for group quotas", "*** Report for project quotas"]
    {
        assert!(text.contains(head), "{head} in:\n{text}");
    }
    assert!(text.contains("Block grace time: 7days; Inode grace time: 7days"), "{text}");

    // `rext4 info` names the quota inodes as `dumpe2fs -h` does.
    let quota_lines = |out: &[u8]| -> Vec<String> {
        String::from_utf8_lossy(out)
            .lines()
            .filter(|l| l.contains("quota inode:"))
            .map(str::to_owned)
            .collect()
    };
    let dumpe2fs = Command::new(tool("dumpe2fs")).args(["-h", p]).output().expect("dumpe2fs");
    let info = rext4(&["info", p]);
    ok(&info);
    assert_eq!(quota_lines(&info.stdout), quota_lines(&dumpe2fs.stdout));
    assert_eq!(quota_lines(&info.stdout).len(), 3);

    // Bad requests fail and change nothing.
    let before = std::fs::read(&img).expect("image");
    for bad in [
        &["setquota", "-u", "root", "1", "1", "1", "1", p][..],
        &["setquota", "-u", "1", "x", "1", "1", "1", p],
        &["setquota", "-u", "-g", "1", "1", "1", "1", "1", p],
        &["setquota", "-u", "1", "1", "1", p],
        &["setquota", "-t", "-u", "1", p],
        &["setquota", "-t", "-u", "1x", "2", p],
        &["setquota", "-t", "-u", "99999999999", "1", p],
        &["setquota", "-t", "-u", "1", "2", "3", "4", p],
    ] {
        assert!(!rext4(bad).status.success(), "{bad:?} succeeded");
    }
    assert!(std::fs::read(&img).expect("image") == before, "a refused setquota wrote to the image");
    // Grace periods (`setquota -t`): the group file's only.
    ok(&rext4(&["setquota", "-t", "-g", "3600", "2m", p]));
    let o = rext4(&["repquota", "-u", "-g", p]);
    ok(&o);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let graces: Vec<&str> = text.lines().filter(|l| l.starts_with("Block grace time")).collect();
    assert_eq!(
        graces,
        [
            "Block grace time: 7days; Inode grace time: 7days",
            "Block grace time: 01:00; Inode grace time: 00:02"
        ],
        "{text}"
    );
    e2fsck_clean(&img);
    let plain = dir.path().join("plain.img");
    let q = plain.to_str().expect("utf-8 path");
    ok(&rext4(&["mkfs", "-q", q, "16M"]));
    assert!(!rext4(&["setquota", "-u", "1", "1", "1", "1", "1", q]).status.success());
    assert!(!rext4(&["repquota", q]).status.success());
    e2fsck_clean(&plain);
}
