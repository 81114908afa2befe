//! The writeback cache (`-o writeback_cache`), where the kernel keeps a file's times and
//! places its writes itself, against kernel ext4: append-only files, `utimes`, and times
//! that must survive the kernel flushing its own (xfstests generic/003, 079, 423 with the
//! cache on).

use super::*;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// What one side shows: each open's result, each `utimes`'s, and per file whether its birth
/// time is at most its modification time and whether its change time survived reads and a
/// remount.
#[derive(Debug, PartialEq)]
struct Seen {
    opens: Vec<(String, Option<i32>)>,
    utimes: Vec<(String, Option<i32>)>,
    born_before_written: Vec<bool>,
    ctime_kept: Vec<bool>,
    /// Whether a file written right after its creation and closed a moment later (its
    /// pages sent then) keeps the modification and change times the write showed.
    written_late_kept: Vec<bool>,
}

fn result<T>(r: std::io::Result<T>) -> Option<i32> {
    r.err().map(|e| errno(&e))
}

/// (mtime, ctime) of `md`.
fn mc_times(md: &fs::Metadata) -> (SystemTime, SystemTime) {
    (
        md.modified().unwrap(),
        SystemTime::UNIX_EPOCH + Duration::new(md.ctime() as u64, md.ctime_nsec() as u32),
    )
}

/// Makes the files and tries the calls under `root`; returns the change times to compare
/// after the remount, and the times the late-closed file showed.
fn before_remount(root: &Path, seen: &mut Seen) -> (Vec<SystemTime>, (SystemTime, SystemTime)) {
    // Written in the clock tick of its creation (so the kernel's cache keeps the times the
    // creation gave), its pages sent to the daemon only at the close, ticks later.
    let late = {
        let mut f = File::create(root.join("late")).unwrap();
        f.write_all(b"late\n").unwrap();
        let times = mc_times(&f.metadata().unwrap());
        std::thread::sleep(Duration::from_millis(30));
        times
    };
    let mut ctimes = Vec::new();
    for i in 0..4 {
        let f = root.join(format!("f{i}"));
        fs::write(&f, format!("data {i}\n")).unwrap();
        let md = fs::metadata(&f).unwrap();
        seen.born_before_written.push(md.created().unwrap() <= md.modified().unwrap());
        ctimes.push(SystemTime::UNIX_EPOCH + Duration::new(md.ctime() as u64, md.ctime_nsec() as u32));
    }
    // Reads a moment later move the access time (relatime after a write), not the change time.
    std::thread::sleep(Duration::from_millis(30));
    for i in 0..4 {
        fs::read(root.join(format!("f{i}"))).unwrap();
    }

    let log = root.join("log");
    fs::write(&log, b"start\n").unwrap();
    let out = std::process::Command::new("chattr").arg("+a").arg(&log).output().unwrap();
    assert!(out.status.success(), "chattr +a: {}", String::from_utf8_lossy(&out.stderr));
    for (name, write, read, append) in [
        ("O_WRONLY", true, false, false),
        ("O_RDWR", true, true, false),
        ("O_WRONLY|O_APPEND", true, false, true),
        ("O_RDWR|O_APPEND", true, true, true),
        ("O_RDONLY", false, true, false),
        ("O_RDONLY|O_TRUNC", false, true, false),
    ] {
        let mut o = OpenOptions::new();
        o.read(read).write(write).append(append);
        if name.ends_with("O_TRUNC") {
            o.custom_flags(libc::O_TRUNC);
        }
        let r = o.open(&log).and_then(|mut h| if append { h.write_all(b"more\n") } else { Ok(()) });
        seen.opens.push((name.into(), result(r)));
    }
    let past = SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    let now = File::options().append(true).open(&log).and_then(|h| h.set_modified(past));
    seen.utimes.push(("explicit time, append-only".into(), result(now)));
    let touch = nix::sys::stat::utimes(
        &log,
        &nix::sys::time::TimeVal::new(0, 0),
        &nix::sys::time::TimeVal::new(0, 0),
    );
    seen.utimes.push(("explicit zero, append-only".into(), touch.err().map(|e| e as i32)));
    // utimes(f, NULL): "now", which an append-only file allows.
    let p = std::ffi::CString::new(log.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `p` is a valid NUL-terminated path; a null `times` means "now".
    let r = unsafe { libc::utimes(p.as_ptr(), std::ptr::null()) };
    seen.utimes.push((
        "now, append-only".into(),
        (r != 0).then(|| std::io::Error::last_os_error().raw_os_error().unwrap_or(0)),
    ));
    let out = std::process::Command::new("chattr").arg("-a").arg(&log).output().unwrap();
    assert!(out.status.success());
    (ctimes, late)
}

fn after_remount(root: &Path, (ctimes, late): &(Vec<SystemTime>, (SystemTime, SystemTime)), seen: &mut Seen) {
    seen.written_late_kept.push(mc_times(&fs::metadata(root.join("late")).unwrap()) == *late);
    for (i, want) in ctimes.iter().enumerate() {
        let md = fs::metadata(root.join(format!("f{i}"))).unwrap();
        let got = SystemTime::UNIX_EPOCH + Duration::new(md.ctime() as u64, md.ctime_nsec() as u32);
        seen.ctime_kept.push(got == *want);
    }
    assert_eq!(fs::read(root.join("log")).unwrap(), b"start\nmore\nmore\n");
}

fn empty() -> Seen {
    Seen {
        opens: Vec::new(),
        utimes: Vec::new(),
        born_before_written: Vec::new(),
        ctime_kept: Vec::new(),
        written_late_kept: Vec::new(),
    }
}

#[test]
fn times_and_append_only_as_kernel_ext4() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").build_in(dir.path(), "wb.img");
    let mut mine = empty();
    let m = FuseMount::new(&img, "rw,writeback_cache");
    let ctimes = before_remount(m.path(), &mut mine);
    m.unmount();
    let m = FuseMount::new(&img, "rw,writeback_cache");
    after_remount(m.path(), &ctimes, &mut mine);
    m.unmount();
    e2fsck_clean(&img);

    // What ext4 gives, written out so the test stands where the kernel cannot mount.
    let eperm = Some(libc::EPERM);
    assert_eq!(
        mine.opens,
        [
            ("O_WRONLY".to_string(), eperm),
            ("O_RDWR".into(), eperm),
            ("O_WRONLY|O_APPEND".into(), None),
            ("O_RDWR|O_APPEND".into(), None),
            ("O_RDONLY".into(), None),
            ("O_RDONLY|O_TRUNC".into(), eperm),
        ]
    );
    assert_eq!(
        mine.utimes,
        [
            ("explicit time, append-only".to_string(), eperm),
            ("explicit zero, append-only".into(), eperm),
            ("now, append-only".into(), None),
        ]
    );
    assert_eq!(mine.born_before_written, [true; 4]);
    assert_eq!(mine.ctime_kept, [true; 4]);
    assert_eq!(mine.written_late_kept, [true]);

    if kernel_can_mount() {
        let kimg = Image::ext4("64M").build_in(dir.path(), "kwb.img");
        let mut theirs = empty();
        let k = KernelMount::rw(&kimg).expect("kernel mount");
        let ctimes = before_remount(k.path(), &mut theirs);
        drop(k);
        let k = KernelMount::rw(&kimg).expect("kernel mount");
        after_remount(k.path(), &ctimes, &mut theirs);
        drop(k);
        e2fsck_clean(&kimg);
        assert_eq!(mine, theirs);
    }
}
