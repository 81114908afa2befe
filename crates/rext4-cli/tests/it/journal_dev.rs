//! `--journal PATH` (and the mount's `-o journal_path=`) for images whose journal is on a
//! device of its own: without it a change is refused, with it `mkdir`, `cp` into the image
//! and a mount write through the journal device; e2fsck with the journal device is clean
//! after each. The images are made over loop devices (mke2fs takes only a block device as a
//! journal), so root is needed, as for the kernel comparisons.

use rext4_testkit::{require_fuse, require_kernel, tool};
use std::path::Path;
use std::process::{Command, Output};

fn rext4(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rext4")).args(args).output().expect("run rext4")
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn images(dir: &Path) -> (String, String) {
    let (img, jimg) = (dir.join("fs.img"), dir.join("j.img"));
    std::fs::File::create(&jimg).unwrap().set_len(8 << 20).unwrap();
    let o = Command::new(tool("losetup")).args(["-f", "--show"]).arg(&jimg).output().unwrap();
    assert!(o.status.success());
    let dev = String::from_utf8(o.stdout).unwrap().trim().to_string();
    let mk = |args: &[&str]| {
        let o = Command::new(tool("mke2fs")).args(args).output().unwrap();
        o.status.success().then_some(()).ok_or_else(|| String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let made = mk(&["-q", "-F", "-O", "journal_dev", "-b", "4096", &dev]).and_then(|()| {
        mk(&[
            "-q",
            "-F",
            "-t",
            "ext4",
            "-b",
            "4096",
            "-J",
            &format!("device={dev}"),
            img.to_str().unwrap(),
            "64M",
        ])
    });
    let _ = Command::new(tool("losetup")).arg("-d").arg(&dev).status();
    made.unwrap();
    (img.to_str().unwrap().to_string(), jimg.to_str().unwrap().to_string())
}

fn fsck_clean(img: &str, jimg: &str) {
    let o = Command::new(tool("e2fsck")).args(["-fn", "-j", jimg, img]).output().unwrap();
    assert!(o.status.success(), "e2fsck: {}", String::from_utf8_lossy(&o.stdout));
}

#[test]
fn commands_take_the_journal_device() {
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    let (img, jimg) = images(dir.path());
    let at = |p: &str| format!("{img}:{p}");
    let o = rext4(&["mkdir", &at("/d")]);
    assert!(!o.status.success(), "a change without the journal device");
    assert!(String::from_utf8_lossy(&o.stderr).contains("external device"), "says why");
    ok(rext4(&["--journal", &jimg, "mkdir", &at("/d")]));
    let src = dir.path().join("src.txt");
    std::fs::write(&src, b"through the journal device\n").unwrap();
    ok(rext4(&["cp", src.to_str().unwrap(), &at("/d/f"), "--journal", &jimg]));
    assert_eq!(ok(rext4(&["cat", &at("/d/f")])), "through the journal device\n");
    fsck_clean(&img, &jimg);

    require_fuse!();
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let o = rext4(&["mount", &img, mp.to_str().unwrap()]);
    assert!(!o.status.success(), "a writable mount without the journal device");
    ok(rext4(&["mount", &img, mp.to_str().unwrap(), "-o", &format!("journal_path={jimg}")]));
    std::fs::write(mp.join("d/g"), b"through the mount").unwrap();
    assert_eq!(std::fs::read(mp.join("d/f")).unwrap(), b"through the journal device\n");
    let o = Command::new("umount").arg(&mp).output().unwrap();
    assert!(o.status.success());
    // The daemon lets go of the image once it has closed the journal.
    let t = std::time::Instant::now();
    while rext4(&["--journal", &jimg, "mkdir", &at("/after")]).status.code() != Some(0) {
        assert!(t.elapsed().as_secs() < 30, "the image stays locked");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(ok(rext4(&["cat", &at("/d/g")])), "through the mount");
    fsck_clean(&img, &jimg);
}
