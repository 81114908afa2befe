//! `-o locks=engine`: fcntl locks taken through the mount live in the engine's table, where
//! the library's users see them; a blocked F_SETLKW is woken when the engine frees the
//! range; closes release what the kernel would release.

use crate::support::FuseMount;
use nix::fcntl::{fcntl, FcntlArg};
use rext4::{FileLock, LockOwner, LockType, Wait};
use rext4_testkit::{e2fsck_clean, require_fuse, Image};
use std::fs::OpenOptions;
use std::time::Duration;

fn fl(kind: i32, start: i64, len: i64) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: len,
        l_pid: 0,
    }
}

#[test]
fn locks_through_the_mount_are_the_engines() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("32M").build_in(dir.path(), "a.img");
    let o = rext4_fuse::MountOptions::parse("rw,locks=engine").unwrap();
    let fs = rext4::Fs::open_with(&img, o.engine_options()).unwrap();
    let m = FuseMount::serve(fs.clone(), &o).unwrap();
    let path = m.join("f");
    std::fs::write(&path, vec![0u8; 4096]).unwrap();
    let ino = fs.resolve("/f", false).unwrap();
    let open = || OpenOptions::new().read(true).write(true).open(&path).unwrap();

    // An OFD lock through the mount is in the engine's table and stops a library user.
    let a = open();
    fcntl(&a, FcntlArg::F_OFD_SETLK(&fl(libc::F_WRLCK, 0, 10))).unwrap();
    let held = fs.file_locks(ino).0;
    assert_eq!(held.len(), 1);
    assert_eq!((held[0].start, held[0].end, held[0].kind), (0, 9, LockType::Write));
    let mine = LockOwner::Ofd(u64::MAX);
    let r = fs.setlk(ino, &FileLock::new(LockType::Read, 5, 5, mine), Wait::No);
    assert!(matches!(r, Err(rext4::Error::WouldBlock)), "{r:?}");
    // A library lock is seen through the mount.
    fs.setlk(ino, &FileLock::new(LockType::Write, 100, 199, mine), Wait::No).unwrap();
    let mut probe = fl(libc::F_RDLCK, 150, 1);
    fcntl(&a, FcntlArg::F_OFD_GETLK(&mut probe)).unwrap();
    assert_eq!((probe.l_type as i32, probe.l_start, probe.l_len), (libc::F_WRLCK, 100, 100));
    let e = fcntl(&a, FcntlArg::F_OFD_SETLK(&fl(libc::F_RDLCK, 150, 1))).unwrap_err();
    assert_eq!(e, nix::errno::Errno::EAGAIN);

    // F_OFD_SETLKW through the mount waits until the engine frees the range.
    let b = open();
    let t =
        std::thread::spawn(move || fcntl(&b, FcntlArg::F_OFD_SETLKW(&fl(libc::F_WRLCK, 120, 10))).map(|_| b));
    std::thread::sleep(Duration::from_millis(200));
    assert!(!t.is_finished(), "the wait went through a held range");
    fs.setlk(ino, &FileLock::new(LockType::Unlock, 0, u64::MAX, mine), Wait::No).unwrap();
    let b = t.join().unwrap().unwrap();
    assert!(fs.file_locks(ino).0.iter().any(|l| l.start == 120 && l.end == 129));

    // The OFD lock of `a` outlives a closed duplicate and goes with the last close.
    let a2 = a.try_clone().unwrap();
    drop(a);
    assert!(fs.file_locks(ino).0.iter().any(|l| l.start == 0 && l.end == 9));
    drop(a2);
    drop(b);
    // The kernel sends the last close's RELEASE after close(2) has returned.
    let gone = (0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(10));
        fs.file_locks(ino).0.is_empty()
    });
    assert!(gone, "left behind: {:?}", fs.file_locks(ino).0);

    // A POSIX lock goes when its process closes any descriptor of the file.
    let p = open();
    fcntl(&p, FcntlArg::F_SETLK(&fl(libc::F_WRLCK, 0, 0))).unwrap();
    assert_eq!(fs.file_locks(ino).0.len(), 1);
    assert_eq!(fs.file_locks(ino).0[0].end, u64::MAX, "l_len 0 is to the end");
    drop(open());
    assert_eq!(fs.file_locks(ino).0, vec![]);
    drop(p);

    // flock(2) through the mount is the engine's flock table.
    let f = nix::fcntl::Flock::lock(open(), nix::fcntl::FlockArg::LockExclusiveNonblock).unwrap();
    assert_eq!(fs.file_locks(ino).1.len(), 1);
    let r = fs.flock(ino, u64::MAX, rext4::FlockOp::Shared, Wait::No);
    assert!(matches!(r, Err(rext4::Error::WouldBlock)), "{r:?}");
    drop(f);
    let gone = (0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(10));
        fs.file_locks(ino).1.is_empty()
    });
    assert!(gone, "the flock lock outlived its file");

    // A process killed while waiting for a lock through the mount goes at once: the kernel's
    // interrupt cancels the daemon's wait, and nothing is left behind.
    fs.flock(ino, u64::MAX, rext4::FlockOp::Exclusive, Wait::No).unwrap();
    for args in [&["-x"][..], &["-s"][..]] {
        let mut child =
            std::process::Command::new("flock").args(args).arg(&path).arg("true").spawn().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert!(child.try_wait().unwrap().is_none(), "flock {args:?} did not wait");
        child.kill().unwrap();
        let ended = (0..300).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            child.try_wait().unwrap().is_some()
        });
        assert!(ended, "a killed waiter stayed blocked in the daemon");
        assert_eq!(fs.file_locks(ino).1, vec![(u64::MAX, rext4::FlockOp::Exclusive)]);
    }
    fs.flock(ino, u64::MAX, rext4::FlockOp::Unlock, Wait::No).unwrap();
    m.unmount();
    drop(fs);
    e2fsck_clean(&img);
}
