//! Quota limits enforced (`Options::quota_limits`, the kernel's `usrquota`/`grpquota`/
//! `prjquota`): `EDQUOT` where ext4 returns it (`check_bdq`/`check_idq`), grace times started
//! and run out, writes near a limit short as on ext4, owners and projects refused where the
//! new id has no room, `CAP_SYS_RESOURCE` callers passing, and every image e2fsck-clean with
//! usage as debugfs counts it. This kernel has no quota format, so the kernel's rules are the
//! oracle (fs/quota/dquot.c), not a mount.

use rext4::{
    with_quota_limits_ignored, Error, Fs, InodeNo, Options, QuotaEnforcement, QuotaLimits, QuotaType, SetAttr,
};
use rext4_testkit::{e2fsck_clean, quota_usage, Image};
use std::path::{Path, PathBuf};
use std::time::Duration;

const QUOTA_ARGS: [&str; 6] =
    ["-b", "4096", "-O", "quota,project", "-E", "quotatype=usrquota:grpquota:prjquota"];

const ALL: QuotaEnforcement = QuotaEnforcement { user: true, group: true, project: true };

/// A 64 MiB image with user, group and project quotas.
fn image(dir: &Path) -> PathBuf {
    let img = dir.join("q.img");
    Image::ext4("64M").args(QUOTA_ARGS).build(&img);
    img
}

fn open(img: &Path, limits: QuotaEnforcement) -> Fs {
    Fs::open_with(img, Options { writable: true, quota_limits: limits, ..Options::default() }).unwrap()
}

fn limits(space_soft_kib: u64, space_hard_kib: u64, inodes_soft: u64, inodes_hard: u64) -> QuotaLimits {
    QuotaLimits { space_soft_kib, space_hard_kib, inodes_soft, inodes_hard }
}

fn edquot<T: std::fmt::Debug>(r: rext4::Result<T>, what: &str) {
    match r {
        Err(e @ Error::QuotaExceeded) => assert_eq!(e.errno(), libc::EDQUOT, "{what}"),
        other => panic!("{what}: expected EDQUOT, got {other:?}"),
    }
}

fn user(fs: &Fs, id: u32) -> rext4::QuotaEntry {
    let r = fs.quota_report(QuotaType::User).unwrap().unwrap();
    *r.entries.iter().find(|e| e.id == id).unwrap_or_else(|| panic!("user {id} has an entry"))
}

fn new_file(fs: &Fs, name: &str, uid: u32) -> InodeNo {
    fs.create(fs.root(), name.as_bytes(), 0o644, uid, uid).unwrap().ino
}

/// Writes `chunk`-byte pieces from offset 0 until the write fails; the bytes written and the
/// error.
fn fill(fs: &Fs, ino: InodeNo, chunk: usize) -> (u64, Error) {
    let buf = vec![7u8; chunk];
    let mut off = 0u64;
    loop {
        match fs.write(ino, off, &buf) {
            Ok(n) => off += n as u64,
            Err(e) => return (off, e),
        }
        assert!(off < 64 << 20, "writes never stopped");
    }
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// Hard limits on inodes and space: the file past the inode limit and the block past the
/// space limit are `EDQUOT`, small (delayed) and large writes alike stop exactly at the limit
/// (a large write is short first), other ids are untouched, and a caller passing limits goes
/// on. Usage as e2fsck and debugfs count it after.
#[test]
fn hard_limits_stop_at_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let fs = open(&img, ALL);
    for id in [1000, 1002] {
        fs.set_quota_limits(QuotaType::User, id, limits(0, 1024, 0, 4)).unwrap();
    }
    let files: Vec<InodeNo> = (0..4).map(|k| new_file(&fs, &format!("f{k}"), 1000)).collect();
    edquot(fs.create(fs.root(), b"f4", 0o644, 1000, 1000), "a fifth inode");
    edquot(fs.mkdir(fs.root(), b"d4", 0o755, 1000, 1000), "a fifth inode (mkdir)");
    edquot(fs.symlink(fs.root(), b"s4", b"target", 1000, 1000), "a fifth inode (symlink)");
    // Another user, and a group limit's absence, are not concerned.
    new_file(&fs, "other", 1001);
    with_quota_limits_ignored(|| fs.create(fs.root(), b"f5", 0o644, 1000, 1000)).unwrap();
    assert_eq!(user(&fs, 1000).inodes, 5);

    // 4 KiB writes go through delayed allocation: their reservations count.
    let (n, e) = fill(&fs, files[0], 4096);
    assert!(matches!(e, Error::QuotaExceeded), "{e:?}");
    assert_eq!(n, 1 << 20, "small writes stop at the hard limit");
    edquot(fs.write(files[1], 0, &[1u8; 100_000]), "a large write with no room left");
    fs.fsync(files[0]).unwrap();
    assert_eq!(user(&fs, 1000).space, 1 << 20);

    // A large write allocates at once and is cut short at the limit, as ext4's is.
    let g = new_file(&fs, "g", 1002);
    assert_eq!(fs.write(g, 0, &vec![3u8; 1536 << 10]).unwrap(), 1 << 20, "short write");
    edquot(fs.write(g, 1 << 20, &[3u8; 4096]), "the write after the short one");
    // Rewriting blocks already allocated needs no more space.
    assert_eq!(fs.write(g, 0, &[4u8; 8192]).unwrap(), 8192);
    edquot(fs.fallocate(g, 0, 1 << 20, 2 << 20), "fallocate past the limit");
    // A caller passing limits goes on.
    assert_eq!(with_quota_limits_ignored(|| fs.write(g, 1 << 20, &[5u8; 8192])).unwrap(), 8192);
    fs.fsync(g).unwrap();
    assert_eq!(user(&fs, 1002).space, (1 << 20) + 8192);

    // Freeing space makes room again.
    fs.setattr(g, &SetAttr { size: Some(512 << 10), ..SetAttr::default() }).unwrap();
    assert_eq!(fs.write(g, 512 << 10, &vec![6u8; 256 << 10]).unwrap(), 256 << 10);

    let report = fs.quota_report(QuotaType::User).unwrap().unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    for e in report.entries.iter().filter(|e| [1000, 1001, 1002].contains(&e.id)) {
        assert_eq!(quota_usage(&img, "user", e.id), Some((e.space, e.inodes)), "user {}", e.id);
    }
}

/// Soft limits: passing one starts its grace time (now plus the file's grace period), growth
/// goes on until the grace time runs out, then stops with `EDQUOT`; usage back under the soft
/// limit ends the grace time and growth resumes. Inodes the same.
#[test]
fn soft_limits_start_grace_and_stop_when_it_runs_out() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let fs = open(&img, ALL);
    // Grace periods of 2 s (`setquota -t`; mke2fs leaves a week).
    fs.set_quota_grace(QuotaType::User, 2, 2).unwrap();
    fs.set_quota_limits(QuotaType::User, 1003, limits(256, 0, 2, 0)).unwrap();
    let f = new_file(&fs, "f", 1003);
    fs.write(f, 0, &vec![1u8; 300 << 10]).unwrap();
    fs.fsync(f).unwrap();
    let e = user(&fs, 1003);
    let t = now();
    assert!(e.space_grace_end >= t && e.space_grace_end <= t + 3, "grace end {} at {t}", e.space_grace_end);
    assert_eq!(e.inodes_grace_end, 0, "one inode is under the inode soft limit");
    // Within the grace time: growth goes on.
    fs.write(f, 300 << 10, &[1u8; 4096]).unwrap();
    new_file(&fs, "g", 1003);
    new_file(&fs, "h", 1003);
    let e = user(&fs, 1003);
    assert!(e.inodes_grace_end >= now(), "three inodes pass the soft limit of two");
    std::thread::sleep(Duration::from_secs(3));
    edquot(fs.write(f, 1 << 20, &[1u8; 4096]), "growth after the space grace time");
    edquot(fs.write(f, 2 << 20, &vec![1u8; 1 << 20]), "large growth after the space grace time");
    edquot(fs.create(fs.root(), b"i", 0o644, 1003, 1003), "an inode after the inode grace time");
    with_quota_limits_ignored(|| fs.write(f, 1 << 20, &[1u8; 4096])).unwrap();
    // Back under the soft limits: the grace times end, growth resumes.
    fs.setattr(f, &SetAttr { size: Some(100 << 10), ..SetAttr::default() }).unwrap();
    fs.unlink(fs.root(), b"h").unwrap();
    let e = user(&fs, 1003);
    assert_eq!((e.space_grace_end, e.inodes_grace_end), (0, 0), "{e:?}");
    fs.write(f, 100 << 10, &[2u8; 4096]).unwrap();
    new_file(&fs, "h2", 1003);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    // The grace periods are in the file, for the kernel and the next open.
    let r = Fs::open(&img).unwrap().quota_report(QuotaType::User).unwrap().unwrap();
    assert_eq!((r.space_grace, r.inodes_grace), (2, 2));
    let r = Fs::open(&img).unwrap().quota_report(QuotaType::Group).unwrap().unwrap();
    assert_eq!((r.space_grace, r.inodes_grace), (604_800, 604_800), "other types keep a week");
}

/// A change of owner, group or project moves the file's inode and space to the new ids:
/// refused with `EDQUOT` where they have no room (delayed writes included: the file is written
/// back first, so their blocks count), allowed for a caller passing limits.
#[test]
fn owners_and_projects_move_only_where_there_is_room() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let fs = open(&img, ALL);
    fs.set_quota_limits(QuotaType::User, 1005, limits(0, 512, 0, 0)).unwrap();
    fs.set_quota_limits(QuotaType::User, 1007, limits(0, 1024, 0, 0)).unwrap();
    fs.set_quota_limits(QuotaType::Group, 2000, limits(0, 0, 0, 1)).unwrap();
    fs.set_quota_limits(QuotaType::Project, 77, limits(0, 512, 0, 0)).unwrap();
    let f = new_file(&fs, "f", 1000);
    fs.write(f, 0, &vec![1u8; 1 << 20]).unwrap();
    let chown = |ino, uid: Option<u32>, gid: Option<u32>| {
        fs.setattr(ino, &SetAttr { uid, gid, ..SetAttr::default() })
    };
    edquot(chown(f, Some(1005), None), "chown to a user without room");
    chown(f, Some(1006), None).unwrap();
    with_quota_limits_ignored(|| chown(f, Some(1005), None)).unwrap();
    assert_eq!(user(&fs, 1005).space, 1 << 20);

    // Delayed writes count: 600 KiB of another file of 1007's and 600 KiB in memory.
    let a = new_file(&fs, "a", 1007);
    fs.write(a, 0, &vec![2u8; 600 << 10]).unwrap();
    let b = new_file(&fs, "b", 1008);
    for k in 0..150u64 {
        fs.write(b, k * 4096, &[3u8; 4096]).unwrap();
    }
    edquot(chown(b, Some(1007), None), "chown of delayed writes to a user without room");
    assert_eq!(fs.getattr(b).unwrap().uid, 1008);

    // Groups: an inode limit.
    let g1 = new_file(&fs, "g1", 1010);
    let g2 = new_file(&fs, "g2", 1011);
    chown(g1, None, Some(2000)).unwrap();
    edquot(chown(g2, None, Some(2000)), "chgrp past an inode limit");

    // Projects (`chattr -p`).
    edquot(fs.set_project(f, 77), "a project without room");
    assert_eq!(fs.project(f).unwrap(), 0);
    fs.set_project(g1, 77).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    assert_eq!(quota_usage(&img, "user", 1005), Some((1 << 20, 1)));
    assert_eq!(quota_usage(&img, "user", 1008).map(|u| u.0), Some(600 << 10));
    assert_eq!(quota_usage(&img, "group", 2000), Some((0, 1)));
}

/// Blocks other than file data: a directory's first block and an attribute block are
/// refused where the owner has no room, and leave nothing behind.
#[test]
fn directory_and_attribute_blocks_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let fs = open(&img, ALL);
    fs.set_quota_limits(QuotaType::User, 1009, limits(0, 8, 0, 0)).unwrap();
    let d = fs.mkdir(fs.root(), b"d", 0o755, 1009, 1009).unwrap().ino;
    let f = fs.create(d, b"f", 0o644, 1009, 1009).unwrap().ino;
    fs.write(f, 0, &[1u8; 4096]).unwrap();
    edquot(fs.mkdir(fs.root(), b"e", 0o755, 1009, 1009), "a directory's block");
    assert!(matches!(fs.lookup(fs.root(), b"e"), Err(Error::NotFound)));
    // A small value fits in the inode; a large one needs a block.
    fs.setxattr(f, b"user.small", b"v", 0).unwrap();
    edquot(fs.setxattr(f, b"user.big", &[9u8; 3000], 0), "an attribute block");
    assert!(matches!(fs.getxattr(f, b"user.big"), Err(Error::NoData)));
    with_quota_limits_ignored(|| fs.setxattr(f, b"user.big", &[9u8; 3000], 0)).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    assert_eq!(quota_usage(&img, "user", 1009), Some((12 << 10, 2)));
}

/// With `ea_inode`, a value kept in an EA inode costs its owner an inode and the value's
/// blocks: past either limit it is refused with `EDQUOT` and nothing changes
/// (`ext4_xattr_inode_alloc_quota`); values that fit in the inode or the block cost no inode.
#[test]
fn values_in_ea_inodes_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("q.img");
    Image::ext4("64M").args(QUOTA_ARGS).args(["-O", "ea_inode"]).build(&img);
    let fs = open(&img, ALL);
    // Two inodes: the file and one value.
    fs.set_quota_limits(QuotaType::User, 1010, limits(0, 0, 0, 2)).unwrap();
    let f = new_file(&fs, "f", 1010);
    fs.setxattr(f, b"user.a", &[1u8; 20_000], 0).unwrap();
    edquot(fs.setxattr(f, b"user.b", &[2u8; 20_000], 0), "a second value's inode");
    assert!(matches!(fs.getxattr(f, b"user.b"), Err(Error::NoData)));
    fs.setxattr(f, b"user.c", &[3u8; 1000], 0).unwrap();
    // Replacing the value takes a new EA inode before the old one goes, as in the kernel.
    edquot(fs.setxattr(f, b"user.a", &[4u8; 20_000], 0), "a replacement's inode");
    assert_eq!(fs.getxattr(f, b"user.a").unwrap(), vec![1u8; 20_000]);
    assert_eq!(user(&fs, 1010).inodes, 2);
    // Space: 64 KiB allowed; a file of 40 KiB and a value of 30,000 bytes (8 blocks) do not fit.
    fs.set_quota_limits(QuotaType::User, 1011, limits(0, 64, 0, 0)).unwrap();
    let g = new_file(&fs, "g", 1011);
    fs.write(g, 0, &[5u8; 40 << 10]).unwrap();
    fs.fsync(g).unwrap();
    edquot(fs.setxattr(g, b"user.v", &[6u8; 30_000], 0), "a value's blocks");
    fs.setxattr(g, b"user.v", &[6u8; 20_000], 0).unwrap();
    with_quota_limits_ignored(|| fs.setxattr(g, b"user.w", &[7u8; 30_000], 0)).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    // The value's 5 blocks, and the xattr block `user.c` went to.
    assert_eq!(quota_usage(&img, "user", 1010), Some(((5 + 1) << 12, 2)));
    // 40 KiB, and 5 and 8 value blocks (both entries in the inode).
    assert_eq!(quota_usage(&img, "user", 1011), Some(((10 + 5 + 8) << 12, 3)));
}

/// Limits are kept, not enforced, unless asked for (the default), and asking for them on an
/// image without the quota feature is refused.
#[test]
fn limits_bind_only_where_asked() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let fs = open(&img, QuotaEnforcement::default());
    fs.set_quota_limits(QuotaType::User, 1000, limits(0, 4, 0, 1)).unwrap();
    let f = new_file(&fs, "f", 1000);
    new_file(&fs, "g", 1000);
    fs.write(f, 0, &vec![1u8; 1 << 20]).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    // Only group limits enforced: the user is over its limits and goes on.
    let fs = open(&img, QuotaEnforcement { group: true, ..QuotaEnforcement::default() });
    fs.write(f, 1 << 20, &[1u8; 4096]).unwrap();
    new_file(&fs, "h", 1000);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);

    let plain = dir.path().join("plain.img");
    Image::ext4("16M").build(&plain);
    match Fs::open_with(&plain, Options { writable: true, quota_limits: ALL, ..Options::default() }) {
        Err(Error::NotSupported(_)) => {}
        other => panic!("quota limits without the feature: {:?}", other.err()),
    }
}

/// Inline data (`inline_data`) moving to a block at a limit: the write or the new name is
/// `EDQUOT`, and the file's bytes and the directory's names stay where they were, in memory
/// and on disk.
#[test]
fn inline_files_and_directories_stay_whole_at_a_limit() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("inline.img");
    Image::ext4("64M")
        .args(["-b", "4096", "-O", "quota,inline_data", "-E", "quotatype=usrquota:grpquota"])
        .build(&img);
    let fs = open(&img, ALL);
    fs.set_quota_limits(QuotaType::User, 1011, limits(0, 1, 0, 0)).unwrap();
    let f = new_file(&fs, "f", 1011);
    fs.write(f, 0, b"forty bytes of inline data, kept inline.").unwrap();
    edquot(fs.write(f, 40, &[1u8; 4000]), "a write that needs a block");
    let mut buf = vec![0u8; 100];
    let n = fs.read(f, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"forty bytes of inline data, kept inline.");
    let d = fs.mkdir(fs.root(), b"d", 0o755, 1011, 1011).unwrap().ino;
    let mut names = Vec::new();
    let err = loop {
        let name = format!("entry-with-a-long-name-{:03}", names.len());
        match fs.create(d, name.as_bytes(), 0o644, 0, 0) {
            Ok(_) => names.push(name),
            Err(e) => break e,
        }
        assert!(names.len() < 100, "the directory never left the inode");
    };
    assert!(matches!(err, Error::QuotaExceeded), "{err:?}");
    assert!(!names.is_empty());
    for n in &names {
        fs.lookup(d, n.as_bytes()).unwrap();
    }
    assert_eq!(fs.getattr(d).unwrap().blocks, 0, "still inline");
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    let fs = Fs::open(&img).unwrap();
    let n = fs.read(f, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"forty bytes of inline data, kept inline.");
    for n in &names {
        fs.lookup(d, n.as_bytes()).unwrap();
    }
}

/// `statfs` inside a project directory (`PROJINHERIT`) where project limits are enforced
/// shows the project's space and inodes (`ext4_statfs_project`: `df` there shows the
/// quota); elsewhere, or without enforcement, the filesystem's.
#[test]
fn statfs_in_a_project_directory_shows_its_limits() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let fs = open(&img, ALL);
    let whole = fs.statfs().unwrap();
    let p = fs.mkdir(fs.root(), b"p", 0o755, 0, 0).unwrap().ino;
    let flags = fs.getattr(p).unwrap().flags & rext4::FL_USER_VISIBLE;
    fs.set_flags(p, flags | rext4::format::inode::PROJINHERIT_FL).unwrap();
    fs.set_project(p, 88).unwrap();
    // No limits yet: the filesystem's counts.
    assert_eq!(fs.statfs_at(p).unwrap().blocks, whole.blocks);
    // The soft limit when both are set, as `min_not_zero` picks.
    fs.set_quota_limits(QuotaType::Project, 88, limits(2048, 4096, 0, 10)).unwrap();
    let a = fs.create(p, b"a", 0o644, 0, 0).unwrap().ino;
    fs.write(a, 0, &vec![1u8; 256 << 10]).unwrap();
    let st = fs.statfs_at(p).unwrap();
    assert_eq!((st.blocks, st.block_size), (512, 4096), "2 MiB of 4 KiB blocks");
    // The directory's block and the file's 64 blocks (delayed: reserved) are in use.
    assert_eq!(st.blocks_free, 512 - 65);
    assert_eq!(st.blocks_avail, 512 - 65);
    assert_eq!((st.files, st.files_free), (10, 8));
    // Outside the project directory, and for a file in it (no PROJINHERIT), the filesystem's.
    assert_eq!(fs.statfs_at(fs.root()).unwrap().blocks, whole.blocks);
    assert_eq!(fs.statfs_at(a).unwrap().blocks, whole.blocks);
    fs.unmount().unwrap();
    drop(fs);
    let fs = open(&img, QuotaEnforcement { user: true, group: true, project: false });
    assert_eq!(fs.statfs_at(p).unwrap().blocks, whole.blocks, "project limits not enforced");
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}

/// Writers of one id racing each other never pass its hard limits together (the kernel checks
/// and charges under one lock, `dq_dqb_lock`): 8 threads writing their own files in large
/// (allocated at once) and small (delayed) pieces, and 8 threads creating files, each until
/// `EDQUOT`, several rounds; 8 threads giving files to one id. Usage stays within the limits (extent-tree blocks excepted, which
/// are not checked: at most one per file), and e2fsck agrees with it after.
#[test]
fn racing_writers_of_one_id_stay_within_its_limits() {
    const UID: u32 = 2000;
    const THREADS: usize = 8;
    const LIMIT: u64 = 4 << 20;
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let fs = open(&img, ALL);
    fs.set_quota_limits(QuotaType::User, UID, limits(0, LIMIT >> 10, 0, 64)).unwrap();
    let files: Vec<InodeNo> = (0..THREADS).map(|k| new_file(&fs, &format!("w{k}"), UID)).collect();
    let bs = 4096u64;
    for round in 0..16 {
        let chunk = if round % 2 == 0 { 192 << 10 } else { 4096 };
        std::thread::scope(|s| {
            for &f in &files {
                let fs = &fs;
                s.spawn(move || {
                    let (_, e) = fill(fs, f, chunk);
                    assert!(matches!(e, Error::QuotaExceeded), "{e:?}");
                });
            }
        });
        for &f in &files {
            fs.fsync(f).unwrap();
        }
        let used = user(&fs, UID).space;
        assert!(used <= LIMIT + THREADS as u64 * bs, "round {round}: {used} bytes in use, limit {LIMIT}");
        for &f in &files {
            fs.setattr(f, &SetAttr { size: Some(0), ..SetAttr::default() }).unwrap();
        }
    }
    // Inodes: 64 allowed, 8 in use; each thread in a directory of its own (root's), so
    // that no directory lock orders the creates.
    let dirs: Vec<InodeNo> = (0..THREADS)
        .map(|t| fs.mkdir(fs.root(), format!("d{t}").as_bytes(), 0o755, 0, 0).unwrap().ino)
        .collect();
    let made = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for &d in &dirs {
            let (fs, made) = (&fs, &made);
            s.spawn(move || {
                for k in 0.. {
                    match fs.create(d, format!("c{k}").as_bytes(), 0o644, UID, UID) {
                        Ok(_) => made.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                        Err(e) => {
                            assert!(matches!(e, Error::QuotaExceeded), "{e:?}");
                            break;
                        }
                    };
                }
            });
        }
    });
    assert_eq!(made.into_inner(), 64 - THREADS, "creates stop exactly at the inode limit");
    assert_eq!(user(&fs, UID).inodes, 64);
    // Changes of owner: eight files of 1 MiB given at once to an id with room for four.
    fs.set_quota_limits(QuotaType::User, UID + 1, limits(0, LIMIT >> 10, 0, 0)).unwrap();
    let owned: Vec<InodeNo> = (0..THREADS)
        .map(|k| {
            let f = new_file(&fs, &format!("o{k}"), 0);
            fs.write(f, 0, &vec![1u8; 1 << 20]).unwrap();
            fs.fsync(f).unwrap();
            f
        })
        .collect();
    let moved = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for &f in &owned {
            let (fs, moved) = (&fs, &moved);
            s.spawn(move || match fs.setattr(f, &SetAttr { uid: Some(UID + 1), ..SetAttr::default() }) {
                Ok(_) => _ = moved.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                Err(e) => assert!(matches!(e, Error::QuotaExceeded), "{e:?}"),
            });
        }
    });
    assert_eq!(moved.into_inner(), 4, "four files of 1 MiB fit in 4 MiB");
    assert_eq!(user(&fs, UID + 1).space, LIMIT);
    let report = fs.quota_report(QuotaType::User).unwrap().unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    for id in [UID, UID + 1] {
        let e = report.entries.iter().find(|e| e.id == id).unwrap();
        assert_eq!(quota_usage(&img, "user", id), Some((e.space, e.inodes)), "user {id}");
    }
}
