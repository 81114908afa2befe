//! `rext4 mount` as a user runs it: daemonizing, the image lock, unmounting with umount and
//! with signals, mount-time journal recovery; the image clean under `e2fsck -fn` after each.
//! Skipped (with a message) where FUSE mounts are not possible.

use rext4_testkit::{e2fsck_clean, require_fuse, Image};
use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn rext4(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rext4")).args(args).output().expect("run rext4")
}

/// A 64 MiB image, filled from `src` if given.
fn mkfs(img: &Path, src: Option<&Path>) {
    let image = Image::ext4("64M");
    match src {
        Some(s) => image.from_dir(s).build(img),
        None => image.build(img),
    }
}

fn is_mounted(mp: &Path) -> bool {
    let mp = mp.canonicalize().unwrap();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(mp.to_str().unwrap()))
}

/// Waits until no process holds the image's lock (the daemon has committed and exited).
pub(crate) fn wait_unlocked(img: &Path) {
    let t = Instant::now();
    loop {
        let f = File::open(img).unwrap();
        if nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok() {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the daemon did not let go of {}", img.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) fn umount(mp: &Path) {
    let o = Command::new("umount").arg(mp).output().unwrap();
    assert!(o.status.success(), "umount: {}", String::from_utf8_lossy(&o.stderr));
}

struct Setup {
    _dir: tempfile::TempDir,
    img: PathBuf,
    mp: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d/f"), b"from mkfs\n").unwrap();
    let img = dir.path().join("img");
    mkfs(&img, Some(&src));
    let mp = dir.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    Setup { _dir: dir, img, mp }
}

/// Without -f the command returns once mounted; a second mount of the same image is that
/// mount bound on the new mount point (as the kernel mounts a device twice: one superblock),
/// read-only if asked; another daemon for it is refused; umount of both leaves the image
/// clean.
#[test]
fn daemon_mounts_locks_and_unmounts_clean() {
    require_fuse!();
    let s = setup();
    let (img, mp) = (s.img.to_str().unwrap(), s.mp.to_str().unwrap());
    let o = rext4(&["mount", img, mp, "-o", "rw,commit=1"]);
    assert!(o.status.success(), "mount: {}", String::from_utf8_lossy(&o.stderr));
    assert!(is_mounted(&s.mp), "mounted when the command returns");
    assert_eq!(fs::read(s.mp.join("d/f")).unwrap(), b"from mkfs\n");
    fs::write(s.mp.join("new"), b"through the daemon").unwrap();
    fs::create_dir(s.mp.join("nd")).unwrap();

    // The same image again: the same files, changes seen through both (xfstests generic/732).
    let other = s.mp.with_file_name("mnt2");
    fs::create_dir(&other).unwrap();
    let o = rext4(&["mount", img, other.to_str().unwrap()]);
    assert!(o.status.success(), "second mount: {}", String::from_utf8_lossy(&o.stderr));
    assert!(is_mounted(&other));
    assert_eq!(fs::read(other.join("new")).unwrap(), b"through the daemon");
    fs::rename(other.join("new"), other.join("nd/moved")).unwrap();
    assert_eq!(fs::read(s.mp.join("nd/moved")).unwrap(), b"through the daemon");
    // Read-only on its own: the other mount stays writable.
    let ro = s.mp.with_file_name("mnt3");
    fs::create_dir(&ro).unwrap();
    let o = rext4(&["mount", img, ro.to_str().unwrap(), "-o", "ro"]);
    assert!(o.status.success(), "read-only mount: {}", String::from_utf8_lossy(&o.stderr));
    let e = fs::write(ro.join("x"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    umount(&ro);
    // A daemon of its own (a source name the first mount does not show) is refused.
    let o = rext4(&["mount", img, ro.to_str().unwrap(), "-o", "fsname=another"]);
    assert!(!o.status.success(), "a second daemon for the image must fail");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("in use"), "clear error for a second daemon: {err}");
    assert!(!is_mounted(&ro));

    // The first mount point goes; the second still serves; the daemon ends with it.
    umount(&s.mp);
    fs::write(other.join("after"), b"still served").unwrap();
    umount(&other);
    wait_unlocked(&s.img);
    e2fsck_clean(&s.img);
    let o = Command::new("debugfs").args(["-R", "cat /after"]).arg(&s.img).output().unwrap();
    assert_eq!(o.stdout, b"still served");
}

/// Errors reach the user from the daemon: bad options, a missing mount point, a bad image.
#[test]
fn mount_errors_are_reported() {
    require_fuse!();
    let s = setup();
    let (img, mp) = (s.img.to_str().unwrap(), s.mp.to_str().unwrap());
    for (args, want) in [
        (vec!["mount", img, mp, "-o", "bogus"], "Unknown parameter 'bogus'"),
        (vec!["mount", img, mp, "-o", "rw,norecovery"], "norecovery needs ro"),
        (vec!["mount", img, "/nonexistent/mnt"], "No such file"),
        (vec!["mount", "/dev/null", mp], "/dev/null"),
    ] {
        let o = rext4(&args);
        assert!(!o.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!is_mounted(&s.mp));
    }
    e2fsck_clean(&s.img);
}

fn spawn_foreground(img: &Path, mp: &Path, opts: &str) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_rext4"))
        .arg("mount")
        .arg(img)
        .arg(mp)
        .args(["-o", opts, "-f"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !is_mounted(mp) {
        assert!(t.elapsed() < Duration::from_secs(20), "foreground mount did not appear");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// In the foreground, SIGTERM and SIGINT unmount, commit and exit 0, leaving the image clean.
#[test]
fn signals_unmount_cleanly() {
    require_fuse!();
    let s = setup();
    for sig in [nix::sys::signal::Signal::SIGTERM, nix::sys::signal::Signal::SIGINT] {
        let mut child = spawn_foreground(&s.img, &s.mp, "rw,commit=60");
        let name = format!("{sig}");
        fs::write(s.mp.join(&name), name.as_bytes()).unwrap();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
        let st = child.wait().unwrap();
        assert!(st.success(), "{sig}: exit {st:?}");
        assert!(!is_mounted(&s.mp));
        e2fsck_clean(&s.img);
        let o = Command::new("debugfs").args(["-R", &format!("cat /{name}")]).arg(&s.img).output().unwrap();
        assert_eq!(o.stdout, name.as_bytes(), "{sig}: data committed before exit");
    }
}

/// Not a test by itself: run by `mount_recovers_the_journal` in a child process, it changes
/// the image through the journal and exits without closing it, as a crash would.
#[test]
#[ignore]
fn crash_helper() {
    let Some(img) = std::env::var_os("REXT4_CRASH_IMAGE") else { return };
    let fs = rext4::Fs::open_rw(&img).unwrap();
    let a = fs.create(fs.root(), b"journaled", 0o644, 0, 0).unwrap();
    fs.write(a.ino, 0, b"replayed").unwrap();
    fs.mkdir(fs.root(), b"journaled-dir", 0o755, 0, 0).unwrap();
    fs.sync().unwrap();
    std::process::exit(0);
}

/// An image left needing recovery is replayed at mount time.
#[test]
fn mount_recovers_the_journal() {
    require_fuse!();
    let s = setup();
    // The harness names tests by their path below the crate root.
    let helper = concat!(module_path!(), "::crash_helper").split_once("::").unwrap().1;
    let st = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", helper, "--ignored", "--quiet"])
        .env("REXT4_CRASH_IMAGE", &s.img)
        .status()
        .unwrap();
    assert!(st.success());
    let f = File::open(&s.img).unwrap();
    let mut w = [0u8; 4];
    f.read_exact_at(&mut w, 1024 + 0x60).unwrap();
    assert_ne!(u32::from_le_bytes(w) & 0x4, 0, "the helper left the image needing recovery");
    drop(f);
    let o = rext4(&["mount", s.img.to_str().unwrap(), s.mp.to_str().unwrap()]);
    assert!(o.status.success(), "mount: {}", String::from_utf8_lossy(&o.stderr));
    // The daemon's word on it reaches the user.
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(said.contains("journal recovered at mount"), "mount said: {said}");
    assert_eq!(fs::read(s.mp.join("journaled")).unwrap(), b"replayed");
    assert!(s.mp.join("journaled-dir").is_dir());
    umount(&s.mp);
    wait_unlocked(&s.img);
    e2fsck_clean(&s.img);
    let f = File::open(&s.img).unwrap();
    f.read_exact_at(&mut w, 1024 + 0x60).unwrap();
    assert_eq!(u32::from_le_bytes(w) & 0x4, 0, "needs_recovery cleared");
}

/// An `mmp` image left by a process that died writing it: its last number stands in the MMP
/// block, the daemon's open waits it out (twice 11 s at a 1 s update interval), recovers the
/// journal, keeps the number moving while mounted and leaves it clean at the unmount.
#[test]
fn an_mmp_image_left_by_a_crash_is_waited_out_and_recovered() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    Image::ext4("64M").features("mmp").extended("mmp_update_interval=1").build(&img);
    let mp = dir.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    let helper = concat!(module_path!(), "::crash_helper").split_once("::").unwrap().1;
    let st = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", helper, "--ignored", "--quiet"])
        .env("REXT4_CRASH_IMAGE", &img)
        .status()
        .unwrap();
    assert!(st.success());
    let seq = || {
        let fs = rext4::Fs::open(&img).unwrap();
        let at = fs.superblock().s_mmp_block.get() * u64::from(fs.block_size());
        let mut w = [0u8; 4];
        File::open(&img).unwrap().read_exact_at(&mut w, at + 4).unwrap();
        u32::from_le_bytes(w)
    };
    let left = seq();
    assert_ne!(left, rext4::format::mmp::SEQ_CLEAN, "the dead process's number stands");
    let t = Instant::now();
    let o = rext4(&["mount", img.to_str().unwrap(), mp.to_str().unwrap()]);
    assert!(o.status.success(), "mount: {}", String::from_utf8_lossy(&o.stderr));
    assert!(t.elapsed() >= Duration::from_secs(22), "waited {:?}", t.elapsed());
    assert_eq!(fs::read(mp.join("journaled")).unwrap(), b"replayed");
    let mounted = seq();
    assert!(mounted != left && mounted <= rext4::format::mmp::SEQ_MAX, "{left:#x} then {mounted:#x}");
    std::thread::sleep(Duration::from_millis(2500));
    assert_ne!(seq(), mounted, "the daemon keeps the number moving");
    umount(&mp);
    wait_unlocked(&img);
    assert_eq!(seq(), rext4::format::mmp::SEQ_CLEAN);
    e2fsck_clean(&img);
}

/// Mounting an image marked as having errors warns, as the kernel does, and leaves the mark.
#[test]
fn mounting_an_image_with_errors_warns() {
    require_fuse!();
    let s = setup();
    let o = Command::new("debugfs").args(["-w", "-R", "ssv state 3"]).arg(&s.img).output().unwrap();
    assert!(o.status.success());
    let o = rext4(&["mount", s.img.to_str().unwrap(), s.mp.to_str().unwrap()]);
    assert!(o.status.success(), "mount: {}", String::from_utf8_lossy(&o.stderr));
    let said = String::from_utf8_lossy(&o.stderr).into_owned();
    umount(&s.mp);
    wait_unlocked(&s.img);
    assert!(said.contains("mounting a filesystem with errors"), "mount said: {said}");
    let o = Command::new("dumpe2fs").arg("-h").arg(&s.img).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("clean with errors"));
    e2fsck_clean(&s.img);
}

/// `umount` right after a workload is never "target is busy": a daemon started from inside
/// another mount (its caller's working directory there, a descriptor of the caller's open on
/// a file there) keeps neither, so that mount goes as soon as its own users have gone.
/// Repeated, with creates, writes, renames and unlinks from a shell that works inside.
#[test]
fn umount_after_a_workload_is_not_busy() {
    require_fuse!();
    let s = setup();
    let img2 = s.img.with_file_name("img2");
    mkfs(&img2, None);
    let mp2 = s.mp.with_file_name("mnt2");
    fs::create_dir(&mp2).unwrap();
    let script = r#"cd "$1" || exit 1
exec 5>held
mkdir -p w
for i in $(seq 1 40); do echo "$i" > w/f$i; mv w/f$i w/g$i; done
cat w/g1 > /dev/null
rm -f w/g*
"$REXT4" mount "$2" "$3" || exit 1
"#;
    for round in 0..10 {
        let o = rext4(&["mount", s.img.to_str().unwrap(), s.mp.to_str().unwrap()]);
        assert!(o.status.success(), "mount: {}", String::from_utf8_lossy(&o.stderr));
        let st = Command::new("sh")
            .args(["-c", script, "sh"])
            .arg(&s.mp)
            .arg(&img2)
            .arg(&mp2)
            .env("REXT4", env!("CARGO_BIN_EXE_rext4"))
            .status()
            .unwrap();
        assert!(st.success(), "round {round}: workload");
        let o = Command::new("umount").arg(&s.mp).output().unwrap();
        let busy = !o.status.success();
        if busy {
            let _ = Command::new("umount").arg("-l").arg(&s.mp).status();
        }
        umount(&mp2);
        wait_unlocked(&s.img);
        wait_unlocked(&img2);
        assert!(
            !busy,
            "round {round}: umount right after the workload: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    e2fsck_clean(&s.img);
    e2fsck_clean(&img2);
}

/// The fields of the mountinfo line of `mp`: (per-mount options, filesystem type).
fn mountinfo(mp: &Path) -> (String, String) {
    let mp = mp.canonicalize().unwrap();
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info.lines().find(|l| l.split(' ').nth(4) == Some(mp.to_str().unwrap())).expect("mounted");
    let f: Vec<&str> = line.split(' ').collect();
    let dash = f.iter().position(|&x| x == "-").unwrap();
    (f[5].to_string(), f[dash + 1].to_string())
}

/// The options kernel ext4 and mount(8) accept are accepted; the access-time ones reach the
/// mount's VFS flags; the mount's type is `fuse.rext4`, so `mount -o remount,ro` turns it
/// read-only (and `remount,rw` back) as for any mount.
#[test]
fn ext4_options_are_accepted_and_remount_works() {
    require_fuse!();
    let s = setup();
    let (img, mp) = (s.img.to_str().unwrap(), s.mp.to_str().unwrap());
    let opts = "rw,defaults,strictatime,nodiratime,lazytime,async,nosuid,nodev,noexec,user_xattr,acl,\
                barrier,nobarrier,data=ordered,errors=remount-ro,commit=5,discard,nodiscard,auto_da_alloc,\
                init_itable=10,noauto,nofail,_netdev,user,users,x-systemd.automount";
    let o = rext4(&["mount", img, mp, "-o", opts]);
    assert!(o.status.success(), "mount: {}", String::from_utf8_lossy(&o.stderr));
    let (flags, fstype) = mountinfo(&s.mp);
    assert_eq!(fstype, "fuse.rext4");
    for f in ["rw", "nosuid", "nodev", "noexec", "nodiratime"] {
        assert!(flags.split(',').any(|x| x == f), "{f} in {flags}");
    }
    assert!(!flags.contains("relatime") && !flags.contains("noatime"), "strictatime: {flags}");
    fs::write(s.mp.join("before"), b"x").unwrap();
    // `-i`: the kernel's remount itself, whether or not a `mount.fuse.rext4` helper is
    // installed (without one, mount(8) would hand a `fuse.*` remount to fuse3's `mount.fuse`,
    // which runs `rext4` from PATH); the helper's own path is tested with the helpers.
    let st = Command::new("mount").args(["-i", "-o", "remount,ro"]).arg(&s.mp).status().unwrap();
    assert!(st.success(), "mount -i -o remount,ro");
    let e = fs::write(s.mp.join("after"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let st = Command::new("mount").args(["-i", "-o", "remount,rw"]).arg(&s.mp).status().unwrap();
    assert!(st.success(), "mount -i -o remount,rw");
    fs::write(s.mp.join("after"), b"x").unwrap();
    umount(&s.mp);
    wait_unlocked(&s.img);
    e2fsck_clean(&s.img);
    for (bad, want) in [("frob", "Unknown parameter 'frob'"), ("data=journal", "data=journal")] {
        let o = rext4(&["mount", img, mp, "-o", bad]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(want), "{bad}: {err}");
    }
}

/// With `dirsync` (or `sync`) a directory change is committed before it returns, as on ext4:
/// the daemon killed at once, the journal's replay still has it, though the commit interval
/// is a minute.
#[test]
fn dirsync_commits_before_returning() {
    require_fuse!();
    let s = setup();
    for opt in ["dirsync", "sync"] {
        let mut child = spawn_foreground(&s.img, &s.mp, &format!("rw,commit=60,{opt}"));
        fs::create_dir(s.mp.join(opt)).unwrap();
        if opt == "sync" {
            // The kernel fsyncs each write on a `sync` mount.
            fs::write(s.mp.join("sync-data"), b"durable").unwrap();
        }
        child.kill().unwrap();
        let _ = child.wait();
        let _ = Command::new("umount").arg("-l").arg(&s.mp).status();
        wait_unlocked(&s.img);
        // e2fsck replays the journal the daemon left.
        let o = Command::new("e2fsck").arg("-fy").arg(&s.img).output().unwrap();
        assert!(
            o.status.code().is_some_and(|c| c <= 1),
            "e2fsck -fy: {}",
            String::from_utf8_lossy(&o.stdout)
        );
        let o = Command::new("debugfs").args(["-R", &format!("stat /{opt}")]).arg(&s.img).output().unwrap();
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("Type: directory"),
            "{opt}: the mkdir was committed"
        );
        if opt == "sync" {
            let o = Command::new("debugfs").args(["-R", "cat /sync-data"]).arg(&s.img).output().unwrap();
            assert_eq!(o.stdout, b"durable", "sync: the write was committed");
        }
        e2fsck_clean(&s.img);
    }
}

/// `/sbin/mount.fuse.rext4` or `/sbin/umount.fuse.rext4`, a link to the binary, for as long
/// as it lives.
struct HelperLink(PathBuf);

impl Drop for HelperLink {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// Whether no process holds `img`'s lock now.
fn unlocked_now(img: &Path) -> bool {
    let f = File::open(img).unwrap();
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok()
}

/// mount(8) with `-t fuse.rext4`, and an fstab line of that type, mount through the
/// `mount.fuse.rext4` helper (the binary under that name), with the options mount(8) and
/// fstab add; a remount goes through the helper too. umount(8) goes through
/// `umount.fuse.rext4`, which returns once the daemon has written the image home, as
/// `umount` of a kernel mount does: the image is free and clean the moment it returns.
#[test]
fn mount_helpers_serve_mount_umount_and_fstab() {
    require_fuse!();
    let mut guards = Vec::new();
    for name in ["mount.fuse.rext4", "umount.fuse.rext4"] {
        let link = Path::new("/sbin").join(name);
        if link.symlink_metadata().is_ok() {
            eprintln!("SKIP: {} exists already; not replacing it", link.display());
            return;
        }
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_rext4"), &link).unwrap();
        guards.push(HelperLink(link));
    }
    let s = setup();
    let st = Command::new("mount")
        .args(["-t", "fuse.rext4", "-o", "rw,noatime,nofail,_netdev,x-test=1"])
        .arg(&s.img)
        .arg(&s.mp)
        .status()
        .unwrap();
    assert!(st.success(), "mount -t fuse.rext4");
    let (flags, fstype) = mountinfo(&s.mp);
    assert_eq!(fstype, "fuse.rext4");
    assert!(flags.split(',').any(|f| f == "noatime"), "{flags}");
    assert_eq!(fs::read(s.mp.join("d/f")).unwrap(), b"from mkfs\n");
    let st = Command::new("mount").args(["-o", "remount,ro"]).arg(&s.mp).status().unwrap();
    assert!(st.success(), "remount,ro through the helper");
    assert_eq!(fs::write(s.mp.join("x"), b"x").unwrap_err().raw_os_error(), Some(libc::EROFS));
    umount(&s.mp);
    assert!(unlocked_now(&s.img), "umount returned before the daemon let go of the image");

    let tab = s.img.with_file_name("fstab");
    fs::write(&tab, format!("{} {} fuse.rext4 defaults,nofail 0 0\n", s.img.display(), s.mp.display()))
        .unwrap();
    let st = Command::new("mount").arg("-T").arg(&tab).arg(&s.mp).status().unwrap();
    assert!(st.success(), "mount from an fstab line");
    let st = Command::new("mount").args(["-o", "remount,commit=60"]).arg(&s.mp).status().unwrap();
    assert!(st.success(), "remount with an option a FUSE mount ignores");
    for i in 0..100 {
        fs::write(s.mp.join(format!("via-fstab-{i}")), vec![7u8; 128 << 10]).unwrap();
    }
    // By the image's name, as test suites unmount.
    umount(&s.img);
    assert!(unlocked_now(&s.img), "umount returned before the daemon let go of the image");
    e2fsck_clean(&s.img);
}

/// After `kill -9` of a daemon its mount point answers ENOTCONN: a new mount there names the
/// stale mount and how to clear it; once cleared, the image mounts again (its journal
/// replayed) and is left clean.
#[test]
fn stale_mount_point_is_named() {
    require_fuse!();
    let s = setup();
    let mut child = spawn_foreground(&s.img, &s.mp, "rw");
    child.kill().unwrap();
    let _ = child.wait();
    let (img, mp) = (s.img.to_str().unwrap(), s.mp.to_str().unwrap());
    let o = rext4(&["mount", img, mp]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "mount on a stale mount point succeeded");
    assert!(err.contains("stale FUSE mount") && err.contains(&format!("umount -l {mp}")), "{err}");
    let st = Command::new("umount").arg("-l").arg(&s.mp).status().unwrap();
    assert!(st.success());
    let o = rext4(&["mount", img, mp]);
    assert!(o.status.success(), "mount after clearing: {}", String::from_utf8_lossy(&o.stderr));
    umount(&s.mp);
    wait_unlocked(&s.img);
    e2fsck_clean(&s.img);
}

/// A user who may not use FUSE is told what stands in the way (/dev/fuse, or a missing
/// fusermount3), not "Permission denied" on the mount point.
#[test]
fn unprivileged_mount_names_the_cause() {
    require_fuse!();
    use std::os::unix::fs::PermissionsExt;
    let s = setup();
    let bin = s.img.with_file_name("rext4");
    fs::copy(env!("CARGO_BIN_EXE_rext4"), &bin).unwrap();
    for p in [s.img.parent().unwrap(), &s.img, &s.mp, &bin] {
        nix::unistd::chown(p, Some(65534.into()), Some(65534.into())).unwrap();
    }
    fs::set_permissions(s.img.parent().unwrap(), fs::Permissions::from_mode(0o755)).unwrap();
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .arg("mount")
        .arg(&s.img)
        .arg(&s.mp)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    if o.status.success() {
        // This machine lets users mount FUSE: nothing to explain.
        let _ = Command::new("umount").arg(&s.mp).status();
        wait_unlocked(&s.img);
        eprintln!("SKIP: user 65534 may mount FUSE here");
        return;
    }
    let dev_open = fs::metadata("/dev/fuse").unwrap().permissions().mode() & 0o006 == 0o006;
    let want = if dev_open { "fusermount3" } else { "/dev/fuse" };
    assert!(err.contains(want), "as nobody: {err}");
    assert!(!is_mounted(&s.mp));
    e2fsck_clean(&s.img);
}

/// A mount right after `umount` (a test suite's remount cycle) waits for the old daemon to
/// write the image home instead of failing with "in use"; the data is all there.
#[test]
fn mount_right_after_umount_waits_for_the_old_daemon() {
    require_fuse!();
    let s = setup();
    let (img, mp) = (s.img.to_str().unwrap(), s.mp.to_str().unwrap());
    let o = rext4(&["mount", img, mp, "-o", "commit=60"]);
    assert!(o.status.success(), "mount: {}", String::from_utf8_lossy(&o.stderr));
    for round in 0..5u8 {
        for i in 0..200 {
            fs::write(s.mp.join(format!("r{round}-{i}")), vec![round; 64 << 10]).unwrap();
        }
        umount(&s.mp);
        let o = rext4(&["mount", img, mp, "-o", "commit=60"]);
        assert!(
            o.status.success(),
            "round {round}: mount right after umount: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(fs::read(s.mp.join(format!("r{round}-199"))).unwrap(), vec![round; 64 << 10]);
        for i in 0..200 {
            fs::remove_file(s.mp.join(format!("r{round}-{i}"))).unwrap();
        }
    }
    umount(&s.mp);
    wait_unlocked(&s.img);
    e2fsck_clean(&s.img);
}

/// Where no `mount.fuse.rext4` helper is installed, mount(8) hands `-t fuse.rext4` mounts and
/// remounts to fuse3's `mount.fuse`, which runs `rext4 SOURCE DIR -o OPTIONS` from the system
/// PATH: the binary takes that form too, so `mount -t fuse.rext4` works with `rext4` installed
/// in `/usr/local/bin` alone.
#[test]
fn mount_fuse_runs_the_binary_by_its_own_name() {
    require_fuse!();
    let link = Path::new("/usr/local/bin/rext4");
    if link.symlink_metadata().is_ok() {
        eprintln!("SKIP: {} exists already; not replacing it", link.display());
        return;
    }
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_rext4"), link).unwrap();
    let _guard = HelperLink(link.to_path_buf());
    let s = setup();
    let st = Command::new("mount").args(["-t", "fuse.rext4"]).arg(&s.img).arg(&s.mp).status().unwrap();
    assert!(st.success(), "mount -t fuse.rext4");
    assert_eq!(mountinfo(&s.mp).1, "fuse.rext4");
    assert_eq!(fs::read(s.mp.join("d/f")).unwrap(), b"from mkfs\n");
    let st = Command::new("mount").args(["-o", "remount,ro"]).arg(&s.mp).status().unwrap();
    assert!(st.success(), "remount,ro");
    assert_eq!(fs::write(s.mp.join("x"), b"x").unwrap_err().raw_os_error(), Some(libc::EROFS));
    let st = Command::new("mount").args(["-o", "remount,rw"]).arg(&s.mp).status().unwrap();
    assert!(st.success(), "remount,rw");
    fs::write(s.mp.join("x"), b"x").unwrap();
    umount(&s.mp);
    wait_unlocked(&s.img);
    e2fsck_clean(&s.img);
}
