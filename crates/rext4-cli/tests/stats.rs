//! `rext4 stats` on a mount served by `rext4 mount`, and `rext4 memfs`, the FUSE ceiling
//! rext4-bench measures.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn rext4() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rext4"))
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn wait_with_output(child: Child) -> (std::process::ExitStatus, String, String) {
    let out = child.wait_with_output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn stats_needs_a_rext4_mount() {
    let out = rext4().args(["stats", "/"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no rext4 daemon serves this mount"), "{err}");
    let out = rext4().args(["stats", "/nonexistent-dir"]).output().unwrap();
    assert!(!out.status.success());
}

/// `rext4 stats` on a mount served by `rext4 mount`: the daemon's operation table, lock waits
/// and commits; `--reset` zeroes the operations; the socket goes with the daemon.
#[test]
fn stats_of_a_rext4_mount() {
    if !is_root() || std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").is_err() {
        eprintln!("skipped: FUSE mounts need root and /dev/fuse");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (img, mp) = (dir.path().join("img"), dir.path().join("mnt"));
    std::fs::create_dir(&mp).unwrap();
    let o = Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img).arg("64M").output().unwrap();
    assert!(o.status.success());
    let o = rext4().arg("mount").arg(&img).arg(&mp).args(["-o", "rw"]).output().unwrap();
    assert!(o.status.success(), "mount: {}", String::from_utf8_lossy(&o.stderr));
    /// Detaches the mount if an assertion fails before the test unmounts it.
    struct Detach(PathBuf);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).stderr(Stdio::null()).status();
        }
    }
    let _detach = Detach(mp.clone());
    for i in 0..300 {
        std::fs::write(mp.join(format!("f{i}")), b"x").unwrap();
    }
    let json = |extra: &[&str]| -> serde_json::Value {
        let o = rext4().arg("stats").arg(&mp).arg("--json").args(extra).output().unwrap();
        assert!(o.status.success(), "stats: {}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let count = |v: &serde_json::Value, name: &str| {
        v["ops"].as_array().unwrap().iter().find(|o| o["name"] == name).unwrap()["count"].as_u64().unwrap()
    };
    let v = json(&["--reset"]);
    assert!(count(&v, "ext4_create") > 0, "{v}");
    assert!(v["locks"].as_array().unwrap().iter().any(|l| l["acquired"].as_u64() > Some(0)));
    assert!(v["commits"].is_object(), "a writable mount reports commits: {v}");
    let after = json(&[]);
    assert_eq!(count(&after, "ext4_create"), 0, "--reset zeroes operations");
    let text = rext4().arg("stats").arg(&mp).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("FUNC") && text.contains("LOCK") && text.contains("journal commits"), "{text}");

    assert!(Command::new("umount").arg(&mp).status().unwrap().success());
    // The daemon commits, removes its socket and lets go of the image.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let f = std::fs::File::open(&img).unwrap();
        if nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok() {
            break;
        }
        assert!(Instant::now() < until, "the daemon did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = rext4().arg("stats").arg(&mp).output().unwrap();
    assert!(!o.status.success(), "no daemon after umount");
    let o = Command::new("e2fsck").arg("-fn").arg(&img).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
}

/// `rext4 memfs`, the FUSE ceiling the bench measures: names come and go through a real
/// mount with the kernel's errnos for the cases it serves, and unmounting ends it cleanly.
#[test]
fn memfs_serves_names_through_a_mount() {
    if !is_root() || !Path::new("/dev/fuse").exists() {
        eprintln!("not root or no /dev/fuse: skipping");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mnt = mnt.canonicalize().unwrap();
    let child = rext4().arg("memfs").arg(&mnt).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    // Takes the mount and the daemon down if an assertion fails first.
    struct Down(PathBuf, Option<Child>);
    impl Drop for Down {
        fn drop(&mut self) {
            if let Some(mut c) = self.1.take() {
                let _ = Command::new("umount").arg("-l").arg(&self.0).status();
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    let mut down = Down(mnt.clone(), Some(child));
    let mounted = |p: &Path| {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(p.to_str().unwrap()))
    };
    let start = Instant::now();
    while !mounted(&mnt) {
        let c = down.1.as_mut().unwrap();
        assert!(c.try_wait().unwrap().is_none(), "memfs exited before mounting");
        assert!(start.elapsed() < Duration::from_secs(20), "memfs did not mount");
        std::thread::sleep(Duration::from_millis(20));
    }
    let errno = |r: std::io::Result<()>| r.err().and_then(|e| e.raw_os_error());
    let d = mnt.join("d");
    std::fs::create_dir(&d).unwrap();
    for i in 0..50 {
        std::fs::File::create(d.join(format!("f{i}"))).unwrap();
    }
    let excl = std::fs::OpenOptions::new().write(true).create_new(true).open(d.join("f7"));
    assert_eq!(errno(excl.map(|_| ())), Some(libc::EEXIST));
    assert!(std::fs::metadata(d.join("f7")).unwrap().is_file());
    assert_eq!(std::fs::metadata(&d).unwrap().nlink(), 2);
    let mut names: Vec<String> =
        std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    let mut want: Vec<String> = (0..50).map(|i| format!("f{i}")).collect();
    want.sort();
    assert_eq!(names, want);
    assert_eq!(errno(std::fs::remove_dir(&d)), Some(libc::ENOTEMPTY));
    assert_eq!(errno(std::fs::remove_file(&d)), Some(libc::EISDIR));
    for i in 0..50 {
        std::fs::remove_file(d.join(format!("f{i}"))).unwrap();
    }
    assert_eq!(errno(std::fs::metadata(d.join("f7")).map(|_| ())), Some(libc::ENOENT));
    std::fs::remove_dir(&d).unwrap();
    assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0);
    let st = Command::new("umount").arg(&mnt).status().unwrap();
    assert!(st.success(), "umount failed");
    let (status, _, err) = wait_with_output(down.1.take().unwrap());
    assert!(status.success(), "memfs exited with {status}: {err}");
}
