//! What a new user meets first: a bare image name, `cp` of a special file, messages that name
//! the path, `getfattr -d`, and attributes an export keeps or warns about.

use rext4_testkit::{e2fsck_clean, is_root, Image};
use std::path::Path;
use std::process::{Command, Output};

fn rext4(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rext4")).args(args).output().expect("run rext4")
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A 16 MiB image, filled from `src` if given.
fn mkfs(img: &Path, src: Option<&Path>) {
    let image = Image::ext4("16M");
    match src {
        Some(s) => image.from_dir(s).build(img),
        None => image.build(img),
    }
}

#[test]
fn a_bare_image_is_its_root_for_reading_commands() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    mkfs(&img, None);
    let i = img.to_str().unwrap();
    assert_eq!(ok(rext4(&["ls", i])), "lost+found\n");
    assert!(ok(rext4(&["stat", i])).contains("directory"));
    assert!(ok(rext4(&["tree", i])).contains("lost+found"));
    // Writers still want the path spelled out.
    assert!(!rext4(&["mkdir", i]).status.success());
}

/// Without -r, cp copies a special file's bytes into a regular file, as coreutils' cp does;
/// with -r it copies the special file itself.
#[test]
fn cp_without_r_copies_bytes_of_special_files() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    mkfs(&img, None);
    let at = |p: &str| format!("{}:{p}", img.display());
    ok(rext4(&["cp", "/dev/null", &at("/z")]));
    let st = ok(rext4(&["stat", &at("/z")]));
    assert!(st.contains("regular empty file"), "{st}");
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::write(fifo, b"through a pipe\n").unwrap())
    };
    ok(rext4(&["cp", fifo.to_str().unwrap(), &at("/piped")]));
    writer.join().unwrap();
    assert_eq!(rext4(&["cat", &at("/piped")]).stdout, b"through a pipe\n");
    ok(rext4(&["cp", "-r", fifo.to_str().unwrap(), &at("/still-a-fifo")]));
    assert!(ok(rext4(&["stat", &at("/still-a-fifo")])).contains("fifo"));
    e2fsck_clean(&img);
}

/// Messages name the path, as coreutils' do; `getfattr -d` is accepted.
#[test]
fn messages_name_the_path_and_getfattr_takes_d() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    mkfs(&img, None);
    let at = |p: &str| format!("{}:{p}", img.display());
    ok(rext4(&["mkdir", &at("/srv")]));
    let o = rext4(&["mkdir", &at("/srv")]);
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        format!("rext4: cannot create directory '{}': file exists\n", at("/srv"))
    );
    let o = rext4(&["setfattr", "-n", "user.tag", "-v", "x", &at("/missing")]);
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        format!("rext4: {}: no such file or directory\n", at("/missing"))
    );
    ok(rext4(&["setfattr", "-n", "user.tag", "-v", "blue", &at("/srv")]));
    assert_eq!(ok(rext4(&["getfattr", "-d", &at("/srv")])), "# file: /srv\nuser.tag=\"blue\"\n\n");
    assert!(ok(rext4(&["getfattr", "-d", "-m", "-", &at("/srv")])).contains("user.tag"));
    e2fsck_clean(&img);
}

/// security.capability survives an export as root (chown clears it, so it is set after);
/// without root, the attributes the host refuses are warned about, not dropped silently.
#[test]
fn export_keeps_file_capabilities_or_says_why_not() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    mkfs(&img, None);
    let f = dir.path().join("ping");
    std::fs::write(&f, b"binary").unwrap();
    let cap = "0sAQAAAgAgAAAAAAAAAAAAAAAAAAA=";
    let at = |p: &str| format!("{}:{p}", img.display());
    ok(rext4(&["cp", f.to_str().unwrap(), &at("/ping")]));
    ok(rext4(&["setfattr", "-n", "security.capability", "-v", cap, &at("/ping")]));
    ok(rext4(&["chown", "1234:1234", &at("/ping")]));
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let o = rext4(&["cp", &at("/ping"), out.to_str().unwrap()]);
    if is_root() {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let g = Command::new("getfattr")
            .args(["-e", "base64", "-n", "security.capability"])
            .arg(out.join("ping"))
            .output()
            .expect("getfattr (attr)");
        assert!(String::from_utf8_lossy(&g.stdout).contains(&format!("security.capability={cap}")), "{g:?}");
    } else {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("warning") && err.contains("chown"), "{err}");
    }
    e2fsck_clean(&img);
}
