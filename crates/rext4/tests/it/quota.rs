//! Quota usage (`quota` feature): every change rext4 makes keeps the hidden quota files'
//! usage equal to what e2fsck counts from the inodes, for users, groups and projects, and the
//! files take new ids (new tree and data blocks) as the kernel's format lays them out.
//! e2fsck compares each id's space and inodes with its own count and reports any difference;
//! `an_unaccounted_write_is_caught` shows it does on these images.

use rext4::format::inode::PROJINHERIT_FL;
use rext4::{Fs, InodeNo, Options, SetAttr};
use rext4_testkit::{e2fsck_clean, quota_usage, tool, Image};
use std::path::{Path, PathBuf};
use std::process::Command;

const QUOTA_ARGS: [&str; 6] =
    ["-b", "4096", "-O", "quota,project", "-E", "quotatype=usrquota:grpquota:prjquota"];

fn image(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let img = dir.join(name);
    Image::ext4("64M").args(QUOTA_ARGS).args(extra).build(&img);
    img
}

fn rw(img: &Path) -> Fs {
    Fs::open_with(img, Options { writable: true, ..Options::default() }).unwrap()
}

/// `debugfs -R cmd img`'s output.
fn debugfs(img: &Path, cmd: &str, write: bool) -> String {
    let mut c = Command::new(tool("debugfs"));
    if write {
        c.arg("-w");
    }
    let o = c.arg("-R").arg(cmd).arg(img).output().unwrap();
    assert!(o.status.success(), "debugfs {cmd}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// e2fsck's verdict, without asserting it.
fn fsck_code(img: &Path) -> (i32, String) {
    let o = Command::new(tool("e2fsck")).arg("-fn").arg(img).output().unwrap();
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Ids spread over every level of the tree: neighbours sharing data blocks, ids differing in
/// each byte, and the largest.
fn ids() -> Vec<u32> {
    let mut v: Vec<u32> = (1000..1020).collect();
    v.extend([1, 255, 256, 65_535, 65_536, 1 << 24, (1 << 24) + 5, 0x7fff_fffe, u32::MAX - 1]);
    v
}

#[test]
fn usage_follows_every_change() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "q.img", &[]);
    let fs = rw(&img);
    let root = fs.root();
    let ids = ids();
    let mut files = Vec::new();
    for (k, &id) in ids.iter().enumerate() {
        let d = fs.mkdir(root, format!("d{k}").as_bytes(), 0o755, id, id ^ 1).unwrap().ino;
        let f = fs.create(d, b"f", 0o644, id, id.wrapping_add(7)).unwrap().ino;
        let len = 1 + k * 9_000;
        fs.write(f, 0, &vec![k as u8 + 1; len]).unwrap();
        // A big file in some, written past a hole.
        if k % 5 == 0 {
            fs.write(f, 3 << 20, &vec![7u8; 200_000]).unwrap();
        }
        fs.symlink(d, b"fast", b"f", id, id).unwrap();
        fs.symlink(d, &[b'l'; 4][..], &[b'x'; 300][..], id, id).unwrap();
        // An xattr block charged to the owner.
        fs.setxattr(f, b"user.big", &[9u8; 3000], 0).unwrap();
        files.push((d, f));
    }
    fs.sync().unwrap();
    // Ownership moves usage between ids, in both directions and to ids with no entry yet.
    for (k, &(d, f)) in files.iter().enumerate() {
        let to = ids[(k + 3) % ids.len()];
        let ch = SetAttr {
            uid: Some(to),
            gid: (k % 2 == 0).then_some(to.wrapping_add(100)),
            ..Default::default()
        };
        fs.setattr(f, &ch).unwrap();
        if k % 4 == 0 {
            fs.setattr(d, &SetAttr { gid: Some(4_000_000 + k as u32), ..Default::default() }).unwrap();
        }
    }
    // Space shrinks and grows: truncate, punch, preallocate, hard links, rename over, removal.
    for (k, &(d, f)) in files.iter().enumerate() {
        match k % 6 {
            0 => fs.setattr(f, &SetAttr { size: Some(100), ..Default::default() }).map(|_| ()).unwrap(),
            1 => fs.fallocate(f, 0x02 | 0x01, 0, 4096).unwrap(),
            2 => fs.fallocate(f, 0, 0, 1 << 20).unwrap(),
            3 => {
                fs.link(f, root, format!("hard{k}").as_bytes()).unwrap();
                fs.unlink(d, b"f").unwrap();
            }
            4 => {
                let g = fs.create(d, b"g", 0o600, 0, 0).unwrap().ino;
                fs.write(g, 0, &[1u8; 10_000]).unwrap();
                fs.rename(d, b"g", d, b"f", 0).unwrap();
            }
            _ => fs.removexattr(f, b"user.big").unwrap(),
        }
    }
    // An open file loses its last name, is written while an orphan, then released; a tmpfile
    // comes and goes; a tmpfile gets a name.
    let (d0, _) = files[1];
    let o = fs.create(d0, b"open", 0o644, 77, 78).unwrap().ino;
    fs.hold(o).unwrap();
    fs.unlink(d0, b"open").unwrap();
    fs.write(o, 0, &[5u8; 50_000]).unwrap();
    fs.sync().unwrap();
    fs.release(o).unwrap();
    let t = fs.tmpfile(d0, 0o600, 88, 89).unwrap().ino;
    fs.write(t, 0, &[6u8; 20_000]).unwrap();
    fs.release(t).unwrap();
    let t = fs.tmpfile(d0, 0o600, 90, 91).unwrap().ino;
    fs.write(t, 0, &[6u8; 20_000]).unwrap();
    fs.link(t, d0, b"named").unwrap();
    fs.release(t).unwrap();
    // A whole tree goes.
    let (d5, _) = files[5];
    for name in [&b"f"[..], b"fast", b"llll"] {
        fs.unlink(d5, name).unwrap();
    }
    fs.rmdir(root, b"d5").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    // Owners named above have entries with what e2fsck counts (spot checks; e2fsck checked
    // every id): the tmpfile that got a name, and one removed tree's owner with nothing left
    // of its own but the file given to it by a chown.
    assert_eq!(quota_usage(&img, "user", 90).map(|u| u.1), Some(1), "user 90");
    assert_eq!(quota_usage(&img, "user", 88).map(|u| u.1), Some(0), "user 88 (tmpfile released)");
    assert_eq!(quota_usage(&img, "user", 77).map(|u| u.1), Some(0), "user 77 (orphan released)");
    let big = quota_usage(&img, "user", u32::MAX - 1).expect("largest id has an entry");
    assert!(big.1 >= 1, "{big:?}");
    // The kernel's format: new ids went into new tree and data blocks of the quota files.
    let size = debugfs(&img, "stat <3>", false);
    assert!(!size.contains("Size: 6144\n"), "user quota file did not grow:\n{size}");
}

/// What e2fsck would say of a write nobody charged: the oracle of this file's tests sees it.
#[test]
fn an_unaccounted_write_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "q.img", &[]);
    let src = dir.path().join("data");
    std::fs::write(&src, vec![1u8; 100_000]).unwrap();
    // libext2fs's write keeps no quota.
    debugfs(&img, &format!("write {} unaccounted", src.display()), true);
    let (code, out) = fsck_code(&img);
    assert_ne!(code, 0, "e2fsck missed the usage nobody recorded:\n{out}");
    // The same write through rext4 is counted.
    let img = image(dir.path(), "r.img", &[]);
    let fs = rw(&img);
    let f = fs.create(fs.root(), b"accounted", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &[1u8; 100_000]).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}

/// A directory marked `PROJINHERIT` with a project gives it to what is made in it (the
/// kernel's `__ext4_new_inode`), and the project's usage counts them.
#[test]
fn new_files_take_their_directorys_project() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "q.img", &[]);
    {
        let fs = rw(&img);
        fs.mkdir(fs.root(), b"proj", 0o755, 0, 0).unwrap();
        fs.mkdir(fs.root(), b"plain", 0o755, 0, 0).unwrap();
        fs.unmount().unwrap();
    }
    // Projects are set from outside (FS_IOC_FSSETXATTR), here with debugfs and the usage
    // rebuilt by e2fsck.
    debugfs(&img, "set_inode_field proj projid 4242", true);
    let flags = u32::from_str_radix(
        debugfs(&img, "stat proj", false)
            .split("Flags: 0x")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap(),
        16,
    )
    .unwrap();
    debugfs(&img, &format!("set_inode_field proj flags {:#x}", flags | PROJINHERIT_FL), true);
    let o = Command::new(tool("e2fsck")).arg("-fy").arg(&img).output().unwrap();
    assert!(o.status.code().unwrap_or(8) < 4, "{}", String::from_utf8_lossy(&o.stdout));
    e2fsck_clean(&img);
    let fs = rw(&img);
    let p = fs.resolve("/proj", false).unwrap();
    let q = fs.resolve("/plain", false).unwrap();
    let sub = fs.mkdir(p, b"sub", 0o755, 5, 5).unwrap().ino;
    let a = fs.create(sub, b"a", 0o644, 5, 5).unwrap().ino;
    fs.write(a, 0, &[1u8; 70_000]).unwrap();
    let b = fs.create(q, b"b", 0o644, 5, 5).unwrap().ino;
    fs.write(b, 0, &[1u8; 7_000]).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    for (path, want) in [("proj/sub", 4242), ("proj/sub/a", 4242), ("plain/b", 0)] {
        let st = debugfs(&img, &format!("stat {path}"), false);
        assert!(st.contains(&format!("Project: {want:>5}")), "{path}:\n{st}");
    }
    let (space, inodes) = quota_usage(&img, "project", 4242).expect("project 4242");
    assert_eq!(inodes, 3, "the directory, its subdirectory and the file");
    assert!(space >= 70_000, "{space}");
}

/// A quota file whose header is not a quota file's fails the writable open (the kernel's
/// mount fails to turn quotas on); reading still works, and nothing was written.
#[test]
fn a_damaged_quota_file_refuses_writing() {
    let dir = tempfile::tempdir().unwrap();
    // (what, byte offset in the user quota file, bytes written there)
    let damages: [(&str, u64, &[u8]); 4] = [
        ("header magic", 0, &[0xee; 8]),
        ("blocks in the info record beyond the file", 8 + 12, &0x10_0000u32.to_le_bytes()),
        ("root naming a block beyond the file", 1024, &0xffff_ff00u32.to_le_bytes()),
        ("root naming itself", 1024, &1u32.to_le_bytes()),
    ];
    for (k, (what, off, bytes)) in damages.into_iter().enumerate() {
        let img = image(dir.path(), &format!("q{k}.img"), &[]);
        let blk: u64 = debugfs(&img, "bmap <3> 0", false).trim().parse().unwrap();
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
            f.write_all_at(bytes, blk * 4096 + off).unwrap();
        }
        let before = std::fs::read(&img).unwrap();
        let r = Fs::open_with(&img, Options { writable: true, ..Options::default() });
        let err = r.err().unwrap_or_else(|| panic!("{what}: writable open of a damaged quota file"));
        assert_eq!(err.errno(), libc::EUCLEAN, "{what}: {err}");
        let fs = Fs::open(&img).unwrap();
        assert!(fs.read_dir("/").is_ok(), "{what}");
        drop(fs);
        assert!(std::fs::read(&img).unwrap() == before, "{what}: the refused open wrote to the image");
    }
}

fn user_usage(fs: &Fs, id: u32) -> (u64, u64) {
    let r = fs.quota_report(rext4::QuotaType::User).unwrap().unwrap();
    r.entries.iter().find(|e| e.id == id).map_or((0, 0), |e| (e.space, e.inodes))
}

/// With `ea_inode`, each attribute whose value lives in an EA inode charges its owner one
/// inode more, and the value's blocks (as e2fsck counts and the kernel's
/// `ext4_xattr_inode_alloc_quota` charges); EA inodes themselves are charged to nobody.
/// Values in the inode and in the xattr block, shared EA inodes, replaced and removed values,
/// owner and project changes, renames over and deletions all keep usage as e2fsck counts it
/// (with the `project` feature, which once made a value on the root directory wait forever
/// for the root's record).
#[test]
fn ea_inode_values_are_charged_to_their_owner() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "q.img", &["-O", "ea_inode"]);
    let fs = rw(&img);
    let root = fs.root();
    let big = |k: u8, len: usize| -> Vec<u8> { (0..len).map(|j| k.wrapping_add((j / 251) as u8)).collect() };
    // Names long enough that the in-inode area holds one entry: the rest go to the block.
    let name = |k: usize| format!("user.{}{k}", "n".repeat(40)).into_bytes();
    let a = fs.create(root, b"a", 0o644, 1000, 1000).unwrap().ino;
    let (s0, i0) = user_usage(&fs, 1000);
    assert_eq!(i0, 1);
    fs.setxattr(a, &name(0), &big(1, 20_000), 0).unwrap();
    fs.setxattr(a, &name(1), &big(2, 9_000), 0).unwrap();
    fs.setxattr(a, &name(2), b"small", 0).unwrap();
    let (s1, i1) = user_usage(&fs, 1000);
    assert_eq!(i1, 3, "the file and two values in EA inodes");
    // 20,000 and 9,000 bytes: 5 + 3 blocks, and one xattr block.
    assert_eq!(s1 - s0, 9 * 4096);
    // Another owner's file with an equal value shares the EA inode but is charged for it too.
    let b = fs.create(root, b"b", 0o644, 1001, 1001).unwrap().ino;
    fs.setxattr(b, b"user.same", &big(1, 20_000), 0).unwrap();
    assert_eq!(user_usage(&fs, 1001).1, 2);
    assert_eq!(user_usage(&fs, 1000).1, 3, "the sharer's owner is untouched");
    // A directory's value, and one more file to delete and one to be renamed over.
    let d = fs.mkdir(root, b"d", 0o755, 1002, 1002).unwrap().ino;
    fs.setxattr(d, &name(0), &big(3, 65_536), 0).unwrap();
    let c = fs.create(root, b"c", 0o644, 1002, 1002).unwrap().ino;
    fs.setxattr(c, &name(0), &big(4, 10_000), 0).unwrap();
    fs.setxattr(c, &name(1), &big(5, 10_000), 0).unwrap();
    let e = fs.create(root, b"e", 0o644, 1002, 1002).unwrap().ino;
    fs.setxattr(e, &name(1), &big(6, 30_000), 0).unwrap();
    assert_eq!(user_usage(&fs, 1002).1, 2 + 3 + 2);
    // The root directory's own value: the new EA inode goes in the root's project, read from
    // the record being changed.
    let root_inodes = user_usage(&fs, 0).1;
    fs.setxattr(root, &name(0), &big(9, 20_000), 0).unwrap();
    assert_eq!(user_usage(&fs, 0).1, root_inodes + 1);
    fs.sync().unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);

    let fs = rw(&img);
    // EA value to EA value, EA value to a small one, small to EA, and a removal.
    fs.setxattr(a, &name(0), &big(7, 30_000), 0).unwrap();
    fs.setxattr(a, &name(1), b"tiny", 0).unwrap();
    fs.setxattr(a, &name(2), &big(8, 12_000), 0).unwrap();
    assert_eq!(user_usage(&fs, 1000).1, 3);
    fs.removexattr(a, &name(0)).unwrap();
    assert_eq!(user_usage(&fs, 1000).1, 2);
    // A change of owner moves the file and its values' inodes; a project change too.
    let (s1001, i1001) = user_usage(&fs, 1001);
    fs.setattr(c, &SetAttr { uid: Some(1001), gid: Some(1001), ..SetAttr::default() }).unwrap();
    assert_eq!(user_usage(&fs, 1001).1, i1001 + 3);
    assert!(user_usage(&fs, 1001).0 > s1001);
    assert_eq!(user_usage(&fs, 1002).1, 2 + 2);
    fs.set_project(c, 17).unwrap();
    // Deletions and a rename over a file with values.
    fs.unlink(root, b"b").unwrap();
    assert_eq!(user_usage(&fs, 1001).1, i1001 + 3 - 2);
    fs.rename(root, b"a", root, b"e", 0).unwrap();
    assert_eq!(user_usage(&fs, 1002).1, 2, "the directory and its value");
    fs.rmdir(root, b"d").unwrap();
    assert_eq!(user_usage(&fs, 1002), (0, 0));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    let (space, inodes) = quota_usage(&img, "user", 1000).unwrap();
    assert_eq!(inodes, 2, "the file and its one value in an EA inode");
    assert!(space > 0);
    assert_eq!(quota_usage(&img, "project", 17).map(|u| u.1), Some(3));
}

/// `chattr -p` (`Fs::set_project`) moves a file's usage to its new project; a directory that
/// passes its project on refuses links and renames of files from other projects (`EXDEV`,
/// both ways for an exchange); quota files keep theirs (`EPERM`).
#[test]
fn projects_move_usage_and_fence_links() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "q.img", &[]);
    let fs = rw(&img);
    let root = fs.root();
    let p = fs.mkdir(root, b"p", 0o755, 0, 0).unwrap().ino;
    let flags = fs.getattr(p).unwrap().flags & rext4::FL_USER_VISIBLE;
    fs.set_flags(p, flags | PROJINHERIT_FL).unwrap();
    fs.set_project(p, 31).unwrap();
    let a = fs.create(p, b"a", 0o644, 0, 0).unwrap().ino;
    fs.write(a, 0, &[1u8; 50_000]).unwrap();
    assert_eq!(fs.project(a).unwrap(), 31, "inherited");
    let x = fs.create(root, b"x", 0o644, 0, 0).unwrap().ino;
    fs.write(x, 0, &[2u8; 20_000]).unwrap();
    let exdev = |r: rext4::Result<()>| r.err().map(|e| e.errno());
    assert_eq!(exdev(fs.link(x, p, b"x").map(|_| ())), Some(libc::EXDEV), "link");
    assert_eq!(exdev(fs.rename(root, b"x", p, b"x", 0)), Some(libc::EXDEV), "rename");
    assert_eq!(exdev(fs.rename(root, b"x", p, b"a", rext4::RENAME_EXCHANGE)), Some(libc::EXDEV), "exchange");
    // Out of the project is allowed: root does not pass one on.
    fs.rename(p, b"a", root, b"a", 0).unwrap();
    fs.rename(root, b"a", p, b"a", 0).unwrap();
    assert_eq!(fs.set_project(InodeNo(3), 31).err().map(|e| e.errno()), Some(libc::EPERM));
    fs.set_project(x, 31).unwrap();
    fs.link(x, p, b"x").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    assert_eq!(quota_usage(&img, "project", 31).map(|u| u.1), Some(3), "p, a and x");
    assert_eq!(quota_usage(&img, "project", 0).map(|u| u.1), Some(2), "the root and lost+found");
    // Without the feature only project 0 exists.
    let plain = dir.path().join("plain.img");
    Image::ext4("16M").build(&plain);
    let fs = rw(&plain);
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    assert_eq!(fs.set_project(f, 5).err().map(|e| e.errno()), Some(libc::EOPNOTSUPP));
    fs.set_project(f, 0).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&plain);
}

/// Limits and usage of `id` as debugfs reads them from the file: (space, block soft, block
/// hard, inodes, inode soft, inode hard).
fn debugfs_entry(img: &Path, ty: &str, id: u32) -> Option<[u64; 6]> {
    let out = debugfs(img, &format!("get_quota {ty} {id}"), false);
    let row = out.lines().find(|l| l.split_whitespace().next() == Some(&id.to_string()))?;
    let f: Vec<u64> = row.split_whitespace().skip(1).map(|v| v.parse().unwrap()).collect();
    f.try_into().ok()
}

/// `Fs::quota_report` lists every id's usage and limits as debugfs reads them from the file,
/// from a writable open and a read-only one; `Fs::set_quota_limits` sets limits that debugfs
/// shows and e2fsck keeps, and starts a grace time exactly where usage is over the new soft
/// limit (the kernel's `do_set_dqblk`). Read-only opens and missing files refuse.
#[test]
fn reports_and_limits_match_debugfs() {
    use rext4::{QuotaLimits, QuotaType};
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "q.img", &[]);
    let fs = rw(&img);
    let root = fs.root();
    let owners = [1000u32, 1001, 70_000];
    for (k, &id) in owners.iter().enumerate() {
        let f = fs.create(root, format!("f{k}").as_bytes(), 0o644, id, id + 5).unwrap().ino;
        fs.write(f, 0, &vec![7u8; 20_000 * (k + 1)]).unwrap();
    }
    // Over the soft limits (space and inodes) of 1000, under those of 1001; 4242 has no entry
    // yet and gets one.
    let over = QuotaLimits { space_soft_kib: 4, space_hard_kib: 1000, inodes_soft: 0, inodes_hard: 9 };
    let under = QuotaLimits { space_soft_kib: 500, space_hard_kib: 0, inodes_soft: 3, inodes_hard: 0 };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let e = fs.set_quota_limits(QuotaType::User, 1000, over).unwrap();
    assert_eq!((e.limits, e.inodes_grace_end), (over, 0));
    assert!((now + 604_800..now + 604_810).contains(&e.space_grace_end), "{e:?}");
    let e = fs.set_quota_limits(QuotaType::User, 1001, under).unwrap();
    assert_eq!((e.space_grace_end, e.inodes_grace_end), (0, 0), "{e:?}");
    let e = fs.set_quota_limits(QuotaType::Group, 4242, under).unwrap();
    assert_eq!((e.space, e.inodes), (0, 0));
    let e = fs
        .set_quota_limits(QuotaType::Project, 0, QuotaLimits { inodes_soft: 1, ..Default::default() })
        .unwrap();
    assert!(e.inodes_grace_end > now, "{e:?}");
    let live: Vec<_> = [QuotaType::User, QuotaType::Group, QuotaType::Project]
        .map(|t| fs.quota_report(t).unwrap().expect("every type has a file"))
        .into();
    fs.unmount().unwrap();
    e2fsck_clean(&img);
    let ro = Fs::open(&img).unwrap();
    for (k, (ty, name)) in
        [(QuotaType::User, "user"), (QuotaType::Group, "group"), (QuotaType::Project, "project")]
            .into_iter()
            .enumerate()
    {
        let r = ro.quota_report(ty).unwrap().unwrap();
        assert_eq!(r, live[k], "{name}: read-only report");
        assert_eq!((r.space_grace, r.inodes_grace), (604_800, 604_800));
        assert!(r.entries.windows(2).all(|w| w[0].id < w[1].id), "{name}: id order");
        for e in &r.entries {
            let l = e.limits;
            let want = [e.space, l.space_soft_kib, l.space_hard_kib, e.inodes, l.inodes_soft, l.inodes_hard];
            assert_eq!(debugfs_entry(&img, name, e.id), Some(want), "{name} {}", e.id);
        }
        let ids: Vec<u32> = r.entries.iter().map(|e| e.id).collect();
        match ty {
            QuotaType::User => assert_eq!(ids, [0, 1000, 1001, 70_000]),
            QuotaType::Group => assert_eq!(ids, [0, 1005, 1006, 4242, 70_005]),
            QuotaType::Project => assert_eq!(ids, [0]),
        }
    }
    let err = ro.set_quota_limits(QuotaType::User, 1, QuotaLimits::default()).unwrap_err();
    assert_eq!(err.errno(), libc::EROFS);
    drop(ro);
    // Without the project feature there is no project file.
    let plain = dir.path().join("plain.img");
    Image::ext4("64M").args(["-O", "quota"]).build(&plain);
    let fs = rw(&plain);
    assert!(fs.quota_report(QuotaType::Project).unwrap().is_none());
    let err = fs.set_quota_limits(QuotaType::Project, 1, QuotaLimits::default()).unwrap_err();
    assert_eq!(err.errno(), libc::EOPNOTSUPP);
    fs.unmount().unwrap();
    e2fsck_clean(&plain);
}
