//! The VFS layer without any adapter: owners, set-group-ID directories, permission and ACL
//! checks, sticky directories, attribute rules, and open files that hold their inode.

use super::open::OpenFlags;
use crate::test_image::{fsck_clean, mkfs_image, open_mem};
use crate::Creds;
use crate::{Access, Error, FileLock, FlockOp, LockType, SetAttr, TimeSet, Wait};
use std::sync::Arc;

fn fresh() -> (crate::Fs, Arc<crate::dev::MemDevice>) {
    open_mem(mkfs_image(None, &["-O", "^metadata_csum_seed"], "32M"))
}

fn root() -> Creds {
    Creds::root()
}

#[test]
fn setgid_directories_give_their_group_and_bit_to_what_is_made_in_them() {
    let (fs, dev) = fresh();
    let r = fs.as_user(root());
    let shared = r.mkdir(fs.root(), b"shared", 0o777).unwrap();
    r.setattr(shared.ino, &SetAttr { gid: Some(500), mode: Some(0o2777), ..SetAttr::default() }).unwrap();
    let alice = fs.as_user(Creds::user(1000, 1000, &[]));
    let f = alice.create(shared.ino, b"f", 0o644).unwrap();
    assert_eq!((f.uid, f.gid, f.perm()), (1000, 500, 0o644));
    let d = alice.mkdir(shared.ino, b"d", 0o755).unwrap();
    assert_eq!((d.uid, d.gid, d.perm()), (1000, 500, 0o2755));
    // Alice is not in group 500: a set-group-ID executable she makes there loses the bit.
    let x = alice.create(shared.ino, b"x", 0o2755).unwrap();
    assert_eq!((x.gid, x.perm()), (500, 0o755));
    let s = alice.symlink(d.ino, b"l", b"target").unwrap();
    assert_eq!((s.uid, s.gid), (1000, 500));
    // Outside it, her own group.
    let home = r.mkdir(fs.root(), b"home", 0o777).unwrap();
    let g = alice.create(home.ino, b"g", 0o600).unwrap();
    assert_eq!((g.uid, g.gid), (1000, 1000));
    fs.sync().unwrap();
    fsck_clean(&dev.snapshot());
}

#[test]
fn permission_bits_acls_and_capabilities_decide_access() {
    let (fs, dev) = fresh();
    let r = fs.as_user(root());
    let f = r.create(fs.root(), b"f", 0o640).unwrap();
    r.setattr(f.ino, &SetAttr { uid: Some(1000), gid: Some(100), ..SetAttr::default() }).unwrap();
    let owner = fs.as_user(Creds::user(1000, 1000, &[]));
    let member = fs.as_user(Creds::user(2000, 2000, &[100]));
    let other = fs.as_user(Creds::user(3000, 3000, &[]));
    owner.access(f.ino, Access::READ | Access::WRITE).unwrap();
    member.access(f.ino, Access::READ).unwrap();
    assert!(matches!(member.access(f.ino, Access::WRITE), Err(Error::AccessDenied)));
    assert!(matches!(other.access(f.ino, Access::READ), Err(Error::AccessDenied)));
    // Root reads anything but executes only what someone may.
    r.access(f.ino, Access::READ | Access::WRITE).unwrap();
    assert!(matches!(r.access(f.ino, Access::EXEC), Err(Error::AccessDenied)));
    // A named-user ACL entry lets `other` read (mask r--).
    let acl = |entries: &[(u16, u16, u32)]| {
        let mut v = 2u32.to_le_bytes().to_vec();
        for &(tag, perm, id) in entries {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    };
    let a =
        acl(&[(1, 6, u32::MAX), (2, 6, 3000), (4, 4, u32::MAX), (0x10, 4, u32::MAX), (0x20, 0, u32::MAX)]);
    owner.setxattr(f.ino, b"system.posix_acl_access", &a, 0).unwrap();
    other.access(f.ino, Access::READ).unwrap();
    assert!(matches!(other.access(f.ino, Access::WRITE), Err(Error::AccessDenied)), "the mask limits it");
    // Only the owner sets ACLs.
    assert!(matches!(member.setxattr(f.ino, b"system.posix_acl_access", &a, 0), Err(Error::NotPermitted)));
    // Opening checks the same way.
    assert!(matches!(member.open_inode(f.ino, OpenFlags::WRITE), Err(Error::AccessDenied)));
    let rd = other.open_inode(f.ino, OpenFlags::READ).unwrap();
    assert!(matches!(rd.write_at(b"x", 0), Err(Error::Io(_))), "EBADF: not open for writing");
    // Search permission on the way to a file.
    let private = r.mkdir(fs.root(), b"private", 0o700).unwrap();
    r.create(private.ino, b"secret", 0o666).unwrap();
    assert!(matches!(other.resolve("/private/secret", true), Err(Error::AccessDenied)));
    assert!(matches!(other.lookup(private.ino, b"secret"), Err(Error::AccessDenied)));
    r.resolve("/private/secret", true).unwrap();
    drop(rd);
    // An access ACL set from outside the file's group (and without CAP_FSETID) takes
    // set-group-ID away; from inside it, the bit stays (`posix_acl_update_mode`).
    let plain = acl(&[(1, 7, u32::MAX), (4, 7, u32::MAX), (0x20, 7, u32::MAX)]);
    for (who, gid, groups, kept) in [("member", 1000, &[100][..], true), ("outsider", 1000, &[][..], false)] {
        let g = r.create(fs.root(), who.as_bytes(), 0o644).unwrap();
        r.setattr(g.ino, &SetAttr { uid: Some(1000), gid: Some(100), ..SetAttr::default() }).unwrap();
        r.setattr(g.ino, &SetAttr { mode: Some(0o2755), ..SetAttr::default() }).unwrap();
        fs.as_user(Creds::user(1000, gid, groups))
            .setxattr(g.ino, b"system.posix_acl_access", &plain, 0)
            .unwrap();
        let want = if kept { 0o2777 } else { 0o777 };
        assert_eq!(fs.getattr(g.ino).unwrap().perm(), want, "{who}");
    }
    fs.sync().unwrap();
    fsck_clean(&dev.snapshot());
}

#[test]
fn sticky_directories_and_attribute_changes_follow_ownership() {
    let (fs, dev) = fresh();
    let r = fs.as_user(root());
    let tmp = r.mkdir(fs.root(), b"tmp", 0o1777).unwrap();
    let alice = fs.as_user(Creds::user(1000, 1000, &[50]));
    let bob = fs.as_user(Creds::user(2000, 2000, &[]));
    let a = alice.create(tmp.ino, b"a", 0o666).unwrap();
    assert!(matches!(bob.unlink(tmp.ino, b"a"), Err(Error::NotPermitted)));
    assert!(matches!(bob.rename(tmp.ino, b"a", tmp.ino, b"b", 0), Err(Error::NotPermitted)));
    // chmod and chown belong to the owner; a group she is not in is not hers to give.
    assert!(matches!(
        bob.setattr(a.ino, &SetAttr { mode: Some(0o777), ..SetAttr::default() }),
        Err(Error::NotPermitted)
    ));
    assert!(matches!(
        alice.setattr(a.ino, &SetAttr { uid: Some(2000), ..SetAttr::default() }),
        Err(Error::NotPermitted)
    ));
    assert!(matches!(
        alice.setattr(a.ino, &SetAttr { gid: Some(7), ..SetAttr::default() }),
        Err(Error::NotPermitted)
    ));
    let moved = alice.setattr(a.ino, &SetAttr { gid: Some(50), ..SetAttr::default() }).unwrap();
    assert_eq!(moved.gid, 50);
    // Explicit times are the owner's; "now" is anyone's who may write.
    let t = TimeSet::At(crate::Timestamp { sec: 5, nsec: 0 });
    assert!(matches!(
        bob.setattr(a.ino, &SetAttr { mtime: Some(t), ..SetAttr::default() }),
        Err(Error::NotPermitted)
    ));
    bob.setattr(a.ino, &SetAttr { mtime: Some(TimeSet::Now), ..SetAttr::default() }).unwrap();
    // chmod to set-group-ID of a group the owner is not in drops the bit.
    let m = alice.setattr(a.ino, &SetAttr { gid: Some(1000), ..SetAttr::default() }).unwrap();
    assert_eq!(m.gid, 1000);
    r.setattr(a.ino, &SetAttr { gid: Some(9), ..SetAttr::default() }).unwrap();
    let m = alice.setattr(a.ino, &SetAttr { mode: Some(0o2755), ..SetAttr::default() }).unwrap();
    assert_eq!(m.perm(), 0o755);
    // A chown drops set-user-ID, even root's.
    r.setattr(a.ino, &SetAttr { mode: Some(0o4755), ..SetAttr::default() }).unwrap();
    let m = r.setattr(a.ino, &SetAttr { uid: Some(2000), ..SetAttr::default() }).unwrap();
    assert_eq!((m.uid, m.perm()), (2000, 0o755));
    // A write by someone without CAP_FSETID drops it too.
    r.setattr(a.ino, &SetAttr { mode: Some(0o4777), ..SetAttr::default() }).unwrap();
    let w = alice.open_inode(a.ino, OpenFlags::WRITE).unwrap();
    w.write_at(b"hi", 0).unwrap();
    assert_eq!(fs.getattr(a.ino).unwrap().perm(), 0o777);
    drop(w);
    // The owner of the file removes it from the sticky directory.
    bob.unlink(tmp.ino, b"a").unwrap();
    // Flags: only with CAP_LINUX_IMMUTABLE for immutable and append-only.
    let c = alice.create(tmp.ino, b"c", 0o644).unwrap();
    let imm = rext4_format::inode::IMMUTABLE_FL;
    assert!(matches!(alice.set_flags(c.ino, c.flags | imm), Err(Error::NotPermitted)));
    r.set_flags(c.ino, c.flags | imm).unwrap();
    assert!(matches!(alice.open_inode(c.ino, OpenFlags::WRITE), Err(Error::NotPermitted)));
    assert!(matches!(r.open_inode(c.ino, OpenFlags::WRITE), Err(Error::NotPermitted)));
    assert!(matches!(alice.unlink(tmp.ino, b"c"), Err(Error::NotPermitted)));
    r.set_flags(c.ino, c.flags).unwrap();
    assert!(matches!(alice.open_inode(tmp.ino, OpenFlags::WRITE), Err(Error::IsDir)));
    fs.sync().unwrap();
    fsck_clean(&dev.snapshot());
}

#[test]
fn an_open_file_outlives_its_name_and_its_locks_its_close() {
    let (fs, dev) = fresh();
    let before = fs.statfs().unwrap();
    let u = fs.as_user(Creds::user(1000, 1000, &[]));
    let home = fs.as_user(root()).mkdir(fs.root(), b"home", 0o777).unwrap();
    let (f, made) =
        u.create_open(home.ino, b"f", 0o444, OpenFlags::READ | OpenFlags::WRITE | OpenFlags::CREATE).unwrap();
    assert!(made, "a read-only mode does not stop its creator's writes");
    f.write(&vec![9u8; 100_000]).unwrap();
    f.setlk(FileLock::new(LockType::Write, 0, 9, crate::LockOwner::Ofd(0)), None, Wait::No).unwrap();
    f.flock(FlockOp::Exclusive, Wait::No).unwrap();
    u.unlink(home.ino, b"f").unwrap();
    // Still readable and writable by the description.
    let mut buf = vec![0u8; 10];
    assert_eq!(f.read_at(&mut buf, 99_990).unwrap(), 10);
    assert_eq!(buf, vec![9u8; 10]);
    f.seek(std::io::SeekFrom::Start(0)).unwrap();
    assert_eq!(f.write(b"abc").unwrap(), 3);
    let dup = f.clone();
    let ino = f.ino();
    drop(f);
    assert_eq!(fs.file_locks(ino).1.len(), 1, "a clone keeps the description open");
    drop(dup);
    assert_eq!(fs.file_locks(ino), (vec![], vec![]));
    assert!(matches!(fs.getattr(ino), Err(Error::NotFound | Error::Stale)));
    let after = fs.statfs().unwrap();
    let used = |s: &crate::StatFs| (s.blocks_free, s.files_free);
    assert_eq!((used(&before).0 - 1, used(&before).1 - 1), used(&after), "only /home remains");
    fs.sync().unwrap();
    fsck_clean(&dev.snapshot());
}

#[test]
fn appenders_never_overwrite_each_other_and_truncate_needs_write() {
    let (fs, dev) = fresh();
    let r = fs.as_user(root());
    let a = r.create(fs.root(), b"log", 0o666).unwrap();
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let f = r.open_inode(a.ino, OpenFlags::WRITE | OpenFlags::APPEND).unwrap();
            std::thread::spawn(move || {
                for _ in 0..200 {
                    f.write(&[b'a' + t; 100]).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let data = fs.read_file("/log").unwrap();
    assert_eq!(data.len(), 4 * 200 * 100);
    for rec in data.chunks(100) {
        assert!(rec.iter().all(|&b| b == rec[0]), "interleaved append");
    }
    let ro = r.open_inode(a.ino, OpenFlags::READ).unwrap();
    assert!(matches!(ro.set_len(0), Err(Error::InvalidInput(_))));
    let t = r.open_inode(a.ino, OpenFlags::WRITE | OpenFlags::TRUNCATE).unwrap();
    assert_eq!(t.metadata().unwrap().size, 0);
    let other = fs.as_user(Creds::user(5, 5, &[]));
    r.setattr(a.ino, &SetAttr { mode: Some(0o644), ..SetAttr::default() }).unwrap();
    assert!(matches!(
        other.open_inode(a.ino, OpenFlags::READ | OpenFlags::TRUNCATE),
        Err(Error::AccessDenied)
    ));
    fs.sync().unwrap();
    fsck_clean(&dev.snapshot());
}

#[test]
fn set_len_refuses_append_only_files_and_clears_set_id_bits_as_ftruncate_does() {
    use rext4_format::inode::APPEND_FL;
    let (fs, dev) = fresh();
    let r = fs.as_user(root());
    let alice = fs.as_user(Creds::user(1000, 1000, &[]));
    let home = r.mkdir(fs.root(), b"home", 0o777).unwrap();
    let f = alice.create(home.ino, b"prog", 0o6775).unwrap();
    let w = alice.open_inode(f.ino, OpenFlags::WRITE).unwrap();
    w.write(b"#!/bin/sh\n").unwrap();
    // The write cleared them already; set them again, as chmod would.
    alice.setattr(f.ino, &SetAttr { mode: Some(0o6775), ..SetAttr::default() }).unwrap();
    w.set_len(4).unwrap();
    let a = fs.getattr(f.ino).unwrap();
    assert_eq!((a.size, a.perm()), (4, 0o775));
    // Root (CAP_FSETID) keeps them.
    r.setattr(f.ino, &SetAttr { mode: Some(0o6775), ..SetAttr::default() }).unwrap();
    r.open_inode(f.ino, OpenFlags::WRITE).unwrap().set_len(2).unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().perm(), 0o6775);
    // An append-only file may only grow by appending: ftruncate is EPERM.
    let flags = fs.getattr(f.ino).unwrap().flags;
    r.set_flags(f.ino, flags | APPEND_FL).unwrap();
    let ap = r.open_inode(f.ino, OpenFlags::WRITE | OpenFlags::APPEND).unwrap();
    assert!(matches!(ap.set_len(0), Err(Error::NotPermitted)));
    assert_eq!(fs.getattr(f.ino).unwrap().size, 2);
    r.set_flags(f.ino, flags).unwrap();
    // O_CREAT of a path ending in a directory's own entry is EISDIR.
    assert!(matches!(r.open("/.", OpenFlags::WRITE | OpenFlags::CREATE, 0o600), Err(Error::IsDir)));
    drop((w, ap));
    fs.sync().unwrap();
    fsck_clean(&dev.snapshot());
}

#[test]
fn path_opens_create_follow_and_refuse_as_open_does() {
    let (fs, dev) = fresh();
    let r = fs.as_user(root());
    let f = r.open("/new", OpenFlags::WRITE | OpenFlags::CREATE, 0o600).unwrap();
    f.write(b"x").unwrap();
    assert!(matches!(
        r.open("/new", OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::EXCLUSIVE, 0o600),
        Err(Error::Exists)
    ));
    r.symlink(fs.root(), b"link", b"new").unwrap();
    let via = r.open("/link", OpenFlags::READ, 0).unwrap();
    assert_eq!(via.ino(), f.ino());
    assert!(matches!(r.open("/link", OpenFlags::READ | OpenFlags::NOFOLLOW, 0), Err(Error::Loop)));
    assert!(matches!(r.open("/new", OpenFlags::READ | OpenFlags::DIRECTORY, 0), Err(Error::NotDir)));
    assert!(matches!(
        r.open("/missing/x", OpenFlags::WRITE | OpenFlags::CREATE, 0o600),
        Err(Error::NotFound)
    ));
    drop((f, via));
    fs.sync().unwrap();
    fsck_clean(&dev.snapshot());
}

#[test]
fn lock_offsets_stop_where_the_kernels_do() {
    let (fs, dev) = fresh();
    let a = fs.as_user(root()).create(fs.root(), b"f", 0o644).unwrap();
    let max = i64::MAX.cast_unsigned();
    let owner = crate::LockOwner::Posix(1);
    // A range reaching the largest offset runs to the end of the file.
    fs.setlk(a.ino, &FileLock::new(LockType::Write, 10, max, owner), Wait::No).unwrap();
    assert_eq!(fs.file_locks(a.ino).0[0].end, u64::MAX);
    // A start past it, and F_GETLK of an unlock, are EINVAL.
    let past = FileLock::new(LockType::Read, max + 1, u64::MAX, crate::LockOwner::Posix(2));
    assert!(matches!(fs.setlk(a.ino, &past, Wait::No), Err(Error::InvalidInput(_))));
    let unlock = FileLock::new(LockType::Unlock, 0, 5, crate::LockOwner::Posix(2));
    assert!(matches!(fs.getlk(a.ino, &unlock), Err(Error::InvalidInput(_))));
    fs.release_posix_locks(a.ino, 1);
    fs.sync().unwrap();
    fsck_clean(&dev.snapshot());
}

/// The root-reserved blocks (`-m 10`) are filled by callers with `CAP_SYS_RESOURCE`, the
/// reserving user and members of the reserving group (`tune2fs -u`/`-g`), not by others:
/// through writes, and through a file's growth by truncation and ACLs alike.
#[test]
fn the_reserve_is_for_the_callers_ext4_lets_fill_it() {
    use crate::Caps;
    let bytes = mkfs_image(None, &["-m", "10"], "32M");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("a.img");
    std::fs::write(&img, &bytes).unwrap();
    let out =
        std::process::Command::new("tune2fs").args(["-u", "700", "-g", "600"]).arg(&img).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (fs, dev) = open_mem(std::fs::read(&img).unwrap());
    fs.as_user(root()).setattr(fs.root(), &SetAttr { mode: Some(0o1777), ..SetAttr::default() }).unwrap();
    // Writes 256 KiB at a time until the filesystem says no; returns what went in.
    let fill = |creds: Creds, name: &[u8]| -> u64 {
        let u = fs.as_user(creds);
        let (f, _) = u.create_open(fs.root(), name, 0o644, OpenFlags::WRITE | OpenFlags::CREATE).unwrap();
        let chunk = vec![7u8; 256 << 10];
        let mut total = 0u64;
        while let Ok(n) = f.write(&chunk) {
            if n == 0 || f.sync_all().is_err() {
                break;
            }
            total += n as u64;
        }
        total
    };
    let plain = fill(Creds::user(1000, 1000, &[]), b"plain");
    assert!(plain > 20 << 20, "{plain}");
    // Past the reserve's edge: nobody without the right gets a byte more.
    assert_eq!(fill(Creds::user(1001, 1001, &[5]), b"other"), 0);
    let capable = fill(Creds::user(1000, 1000, &[]).with_caps(Caps::SYS_RESOURCE), b"capable");
    assert!(capable > 1 << 20, "{capable}");
    fs.as_user(root()).unlink(fs.root(), b"capable").unwrap();
    fs.sync().unwrap();
    assert!(fill(Creds::user(700, 700, &[]), b"resuid") > 1 << 20);
    fs.as_user(root()).unlink(fs.root(), b"resuid").unwrap();
    fs.sync().unwrap();
    assert!(fill(Creds::user(1002, 1002, &[600]), b"resgid") > 1 << 20);
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&dev.snapshot());
}
