//! The `rext4` command end to end: every subcommand on an image made by `mkfs.ext4 -d`, its
//! output checked against the source tree (and, for `cp`, every attribute it should keep).

use rext4_testkit::{e2fsck_clean, is_root, kernel_can_mount, Image, KernelMount};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

struct Fixture {
    _dir: tempfile::TempDir,
    src: PathBuf,
    image: PathBuf,
    work: PathBuf,
}

fn rext4(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rext4")).args(args).output().expect("run rext4")
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "rext4 failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).expect("utf-8 output")
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let work = dir.path().join("work");
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(src.join("hello.txt"), b"hello, world\n").unwrap();
    std::fs::write(src.join("sub/data.bin"), (0..200_000u32).map(|i| (i * 7) as u8).collect::<Vec<_>>())
        .unwrap();
    std::fs::write(src.join("sub/deeper/empty"), b"").unwrap();
    // A sparse file: data, a hole, data.
    let f = std::fs::File::create(src.join("sparse")).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"head", 0).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"tail", 5 << 20).unwrap();
    drop(f);
    std::os::unix::fs::symlink("hello.txt", src.join("link")).unwrap();
    std::fs::hard_link(src.join("hello.txt"), src.join("sub/hard")).unwrap();
    std::fs::set_permissions(src.join("sub/deeper"), std::fs::Permissions::from_mode(0o750)).unwrap();
    std::fs::set_permissions(src.join("hello.txt"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    xattr::set(src.join("hello.txt"), "user.colour", b"blue").unwrap();
    for i in 0..300 {
        std::fs::write(src.join(format!("sub/f{i:03}")), format!("{i}\n")).unwrap();
    }
    let image = dir.path().join("t.img");
    // Made by rext4's own formatter: the commands below work on what it makes.
    Image::ext4("32M").from_dir(&src).rext4_mkfs(env!("CARGO_BIN_EXE_rext4")).build(&image);
    Fixture { _dir: dir, src, image, work }
}

fn at(fx: &Fixture, path: &str) -> String {
    format!("{}:{path}", fx.image.display())
}

/// `rext4 info` shows an image's error record as `dumpe2fs -h` does (times aside, which it
/// writes in UTC): the state, the count, the first and last error's function, line, inode,
/// block and code.
#[test]
fn info_shows_the_error_record() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("e.img");
    // No checksums: the error codes are written into the superblock by hand.
    Image::ext4("8M").features("^metadata_csum").build(&image);
    for set in [
        "state 3",
        "error_count 2",
        "first_error_time 1700000000",
        "first_error_func ext4_lookup",
        "first_error_ino 12",
        "first_error_block 345",
        "first_error_line 7",
        "last_error_time 1700000100",
        "last_error_func ext4_unlink",
        "last_error_ino 13",
    ] {
        let o =
            Command::new("debugfs").args(["-w", "-R", &format!("ssv {set}")]).arg(&image).output().unwrap();
        assert!(
            o.status.success() && o.stderr.len() < 40,
            "debugfs ssv {set}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let mut all = std::fs::read(&image).unwrap();
    // s_first_error_errcode and s_last_error_errcode: EFSBADCRC, EFSCORRUPTED.
    all[1024 + 0x27A..1024 + 0x27C].copy_from_slice(&[4, 5]);
    std::fs::write(&image, &all).unwrap();
    let errors = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| {
                (l.contains("rror") || l.starts_with("Filesystem state")) && !l.contains("error time")
            })
            .map(str::to_string)
            .collect()
    };
    let ours = errors(&stdout(&rext4(&["info", image.to_str().unwrap()])));
    let dump = Command::new("dumpe2fs").arg("-h").arg(&image).output().unwrap();
    let theirs = errors(&String::from_utf8_lossy(&dump.stdout));
    assert!(ours.iter().any(|l| l.ends_with("EFSBADCRC")), "{ours:?}");
    assert_eq!(ours, theirs);
    let ours_times = stdout(&rext4(&["info", image.to_str().unwrap()]));
    assert!(ours_times.contains("First error time:         2023-11-14 22:13:20 UTC"), "{ours_times}");
}

#[test]
fn info_ls_cat_stat_tree() {
    let fx = fixture();
    let info = stdout(&rext4(&["info", fx.image.to_str().unwrap()]));
    assert!(info.contains("Filesystem magic number:  0xEF53"), "{info}");
    assert!(info.contains("metadata_csum"), "{info}");
    assert!(info.contains("Block size:"), "{info}");

    let ls = stdout(&rext4(&["ls", &at(&fx, "/")]));
    let names: Vec<&str> = ls.lines().collect();
    assert_eq!(names, ["hello.txt", "link", "lost+found", "sparse", "sub"]);
    let lsl = stdout(&rext4(&["ls", "-l", &at(&fx, "/")]));
    assert!(lsl.lines().any(|l| l.starts_with("-rwsr-xr-x") && l.ends_with(" hello.txt")), "{lsl}");
    assert!(lsl.lines().any(|l| l.starts_with('l') && l.ends_with("link -> hello.txt")), "{lsl}");
    assert_eq!(stdout(&rext4(&["ls", &at(&fx, "/sub")])).lines().count(), 300 + 3);

    let cat = rext4(&["cat", &at(&fx, "/sub/data.bin")]);
    assert_eq!(cat.stdout, std::fs::read(fx.src.join("sub/data.bin")).unwrap());
    let cat = rext4(&["cat", &at(&fx, "/link")]);
    assert_eq!(cat.stdout, b"hello, world\n");

    let stat = stdout(&rext4(&["stat", &at(&fx, "/hello.txt")]));
    assert!(stat.contains("Size: 13"), "{stat}");
    assert!(stat.contains("Links: 2"), "{stat}");
    assert!(stat.contains("(4755/-rwsr-xr-x)"), "{stat}");
    assert!(stat.contains("Xattr: user.colour (4 bytes)"), "{stat}");

    let tree = stdout(&rext4(&["tree", &at(&fx, "/sub")]));
    assert!(tree.contains("|-- deeper"), "{tree}");
    assert!(tree.contains("|   `-- empty"), "{tree}");
    assert!(tree.trim_end().ends_with("1 directories, 303 files"), "{tree}");
}

#[test]
fn errors_exit_nonzero_with_one_line() {
    let fx = fixture();
    for args in [
        vec!["cat".to_string(), at(&fx, "/nope")],
        vec!["ls".to_string(), at(&fx, "/hello.txt/x")],
        vec!["cat".to_string(), at(&fx, "/sub")],
        vec!["cat".to_string(), "no-colon".to_string()],
        vec!["info".to_string(), "/nonexistent.img".to_string()],
        vec!["cp".to_string(), at(&fx, "/sub"), fx.work.to_str().unwrap().to_string()],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = rext4(&args);
        assert!(!o.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("rext4: "), "{args:?}: {err}");
    }
    let o = rext4(&["cat", &at(&fx, "/nope")]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("no such file or directory"));
}

#[test]
fn cp_exports_everything_it_should_keep() {
    let fx = fixture();
    let out = fx.work.join("out");
    std::fs::create_dir(&out).unwrap();
    let o = rext4(&["cp", "-r", "-q", &at(&fx, "/"), out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    compare_trees(&fx.src, &out);
    // Hard links stay hard links.
    let a = std::fs::metadata(out.join("hello.txt")).unwrap();
    let b = std::fs::metadata(out.join("sub/hard")).unwrap();
    assert_eq!(a.ino(), b.ino());
    assert_eq!(a.nlink(), 2);
    // Holes stay holes.
    let sparse = std::fs::metadata(out.join("sparse")).unwrap();
    assert_eq!(sparse.len(), (5 << 20) + 4);
    assert!(sparse.blocks() * 512 < 1 << 20, "sparse file was filled: {} blocks", sparse.blocks());
    // A single file into a directory.
    let one = fx.work.join("one");
    std::fs::create_dir(&one).unwrap();
    let o = rext4(&["cp", &at(&fx, "/sub/data.bin"), one.to_str().unwrap()]);
    assert!(o.status.success());
    assert_eq!(
        std::fs::read(one.join("data.bin")).unwrap(),
        std::fs::read(fx.src.join("sub/data.bin")).unwrap()
    );
}

/// Every entry of `src` exists in `dst` with the same type, mode, size, bytes, link target,
/// mtime (mkfs keeps whole seconds) and user xattrs; owners too when running as root.
fn compare_trees(src: &Path, dst: &Path) {
    let root = is_root();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let (s, d) = (e.path(), dst.join(e.file_name()));
        let (sm, dm) = (std::fs::symlink_metadata(&s).unwrap(), std::fs::symlink_metadata(&d).unwrap());
        assert_eq!(sm.mode(), dm.mode(), "{}", d.display());
        assert_eq!(sm.mtime(), dm.mtime(), "{}", d.display());
        if root {
            assert_eq!((sm.uid(), sm.gid()), (dm.uid(), dm.gid()), "{}", d.display());
        }
        if sm.is_dir() {
            compare_trees(&s, &d);
        } else if sm.file_type().is_symlink() {
            assert_eq!(std::fs::read_link(&s).unwrap(), std::fs::read_link(&d).unwrap());
        } else {
            assert_eq!(std::fs::read(&s).unwrap(), std::fs::read(&d).unwrap(), "{}", d.display());
            let sx: Vec<_> =
                xattr::list(&s).unwrap().filter(|n| n.to_string_lossy().starts_with("user.")).collect();
            for n in sx {
                assert_eq!(xattr::get(&s, &n).unwrap(), xattr::get(&d, &n).unwrap(), "{}", d.display());
            }
        }
    }
}

#[test]
fn chmod_chown_touch_change_the_image_and_leave_it_clean() {
    let fx = fixture();
    let o = rext4(&["chmod", "640", &at(&fx, "/sub/data.bin")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = rext4(&["chown", "1234:567", &at(&fx, "/sub/data.bin")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = rext4(&["touch", "-d", "1600000000.5", &at(&fx, "/sub/data.bin")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stat = stdout(&rext4(&["stat", &at(&fx, "/sub/data.bin")]));
    assert!(stat.contains("(0640/-rw-r-----)  Uid:  1234   Gid:   567"), "{stat}");
    assert!(stat.contains("Modify: 2020-09-13 12:26:40.500000000"), "{stat}");
    for bad in [vec!["chmod", "999"], vec!["chown", "x:y"], vec!["touch", "-d", "soon"]] {
        let mut args = bad.clone();
        let t = at(&fx, "/hello.txt");
        args.push(&t);
        let o = rext4(&args);
        assert!(!o.status.success(), "{args:?}");
    }
    let o = rext4(&["chmod", "600", &at(&fx, "/missing")]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no such file or directory"));
    e2fsck_clean(&fx.image);
}

#[test]
fn mkdir_rm_mv_ln_change_the_tree_and_leave_it_clean() {
    let fx = fixture();
    for args in [
        vec!["mkdir".to_string(), "-p".into(), at(&fx, "/new/deep/er")],
        vec!["mkdir".to_string(), at(&fx, "/new/sibling")],
        vec!["ln".to_string(), "-s".into(), "../hello.txt".into(), at(&fx, "/new/link")],
        vec!["ln".to_string(), at(&fx, "/hello.txt"), at(&fx, "/new/hard")],
        vec!["mv".to_string(), at(&fx, "/sub/data.bin"), at(&fx, "/new/deep")],
        vec!["mv".to_string(), at(&fx, "/new/sibling"), at(&fx, "/new/renamed")],
        vec!["rm".to_string(), at(&fx, "/sub/f000")],
        vec!["rm".to_string(), "-r".into(), at(&fx, "/sub")],
    ] {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = rext4(&a);
        assert!(o.status.success(), "{a:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let tree = stdout(&rext4(&["tree", &at(&fx, "/new")]));
    for want in ["deep", "er", "data.bin", "renamed", "link -> ../hello.txt", "hard"] {
        assert!(tree.contains(want), "{want} missing:\n{tree}");
    }
    let ls = stdout(&rext4(&["ls", &at(&fx, "/")]));
    assert!(!ls.contains("sub"), "{ls}");
    assert_eq!(rext4(&["cat", &at(&fx, "/new/link")]).stdout, b"hello, world\n");
    // hello.txt had two names (one in /sub); /new/hard added one and `rm -r /sub` took one.
    let stat = stdout(&rext4(&["stat", &at(&fx, "/hello.txt")]));
    assert!(stat.contains("Links: 2"), "{stat}");
    // Errors: existing directory, non-empty without -r, missing source.
    assert!(!rext4(&["mkdir", &at(&fx, "/new")]).status.success());
    assert!(!rext4(&["rm", &at(&fx, "/new")]).status.success());
    assert!(!rext4(&["mv", &at(&fx, "/missing"), &at(&fx, "/x")]).status.success());
    e2fsck_clean(&fx.image);
}

#[test]
fn setfattr_getfattr_round_trip_and_leave_the_image_clean() {
    let fx = fixture();
    let f = at(&fx, "/hello.txt");
    assert_eq!(stdout(&rext4(&["getfattr", &f])), "# file: /hello.txt\nuser.colour=\"blue\"\n\n");
    for args in [
        vec!["setfattr", "-n", "user.colour", "-v", "green", &f],
        vec!["setfattr", "-n", "user.bin", "-v", "0x00ff", &f],
        vec!["setfattr", "-n", "trusted.b64", "-v", "0sYQpi", &f],
        vec!["setfattr", "-n", "user.empty", &f],
        vec!["setfattr", "-n", "user.gone", "-v", "x", &f],
        vec!["setfattr", "-x", "user.gone", &f],
    ] {
        let o = rext4(&args);
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let all = stdout(&rext4(&["getfattr", "-e", "hex", &f]));
    for want in ["user.colour=0x677265656e", "user.bin=0x00ff", "trusted.b64=0x610a62", "user.empty=0x"] {
        assert!(all.contains(want), "{want} missing:\n{all}");
    }
    assert!(!all.contains("user.gone"), "{all}");
    assert_eq!(
        stdout(&rext4(&["getfattr", "-n", "user.colour", &f])),
        "# file: /hello.txt\nuser.colour=\"green\"\n\n"
    );
    // Errors: missing attribute, unknown namespace, missing file.
    assert!(!rext4(&["getfattr", "-n", "user.nope", &f]).status.success());
    assert!(!rext4(&["setfattr", "-x", "user.nope", &f]).status.success());
    let o = rext4(&["setfattr", "-n", "bogus.x", "-v", "1", &f]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("not supported"), "{o:?}");
    assert!(!rext4(&["setfattr", "-n", "user.x", &at(&fx, "/missing")]).status.success());
    e2fsck_clean(&fx.image);
}

#[test]
fn cp_imports_a_tree_and_truncate_resizes() {
    let fx = fixture();
    let img = fx.work.join("empty.img");
    Image::ext4("64M").rext4_mkfs(env!("CARGO_BIN_EXE_rext4")).build(&img);
    let target = format!("{}:/", img.display());
    let o = rext4(&["cp", "-r", "-q", fx.src.to_str().unwrap(), &target]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // A single file to a new name, then over it again.
    let named = format!("{}:/copy.bin", img.display());
    for _ in 0..2 {
        let o = rext4(&["cp", fx.src.join("sub/data.bin").to_str().unwrap(), &named]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    e2fsck_clean(&img);
    // Round trip: export what was imported and compare with the source.
    let back = fx.work.join("back");
    std::fs::create_dir(&back).unwrap();
    let o = rext4(&["cp", "-r", "-q", &format!("{}:/src", img.display()), back.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    compare_trees(&fx.src, &back.join("src"));
    let a = std::fs::metadata(back.join("src/hello.txt")).unwrap();
    assert_eq!(a.nlink(), 2, "hard link kept");
    let sm = std::fs::metadata(fx.src.join("sparse")).unwrap();
    let stat = stdout(&rext4(&["stat", &format!("{}:/src/sparse", img.display())]));
    assert!(stat.contains(&format!("Size: {}", sm.len())), "{stat}");
    let blocks: u64 = stat
        .split("Blocks:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX);
    assert!(blocks < 64, "the hole stayed a hole: {stat}");
    let m = std::fs::metadata(fx.src.join("sub/data.bin")).unwrap();
    let stat = stdout(&rext4(&["stat", &format!("{}:/src/sub/data.bin", img.display())]));
    assert!(stat.contains(&format!(".{:09}", m.mtime_nsec())), "nanoseconds kept: {stat}");

    // truncate: absolute, relative, with suffixes, creating a missing file.
    for (arg, want) in [("100", 100u64), ("+1K", 1124), ("-24", 1100), ("3M", 3 << 20), ("0", 0)] {
        let o = rext4(&["truncate", "-s", arg, &named]);
        assert!(o.status.success(), "{arg}: {}", String::from_utf8_lossy(&o.stderr));
        let stat = stdout(&rext4(&["stat", &named]));
        assert!(stat.contains(&format!("Size: {want} ")), "{arg}: {stat}");
    }
    let fresh = format!("{}:/new-file", img.display());
    assert!(rext4(&["truncate", "-s", "5G", &fresh]).status.success());
    assert!(!rext4(&["truncate", "-s", "lots", &fresh]).status.success());
    assert!(!rext4(&["truncate", "-s", "1", &format!("{}:/src", img.display())]).status.success());
    e2fsck_clean(&img);
    if kernel_can_mount() {
        let k = KernelMount::ro(&img).expect("kernel mount");
        compare_trees(&fx.src, &k.path().join("src"));
        assert_eq!(std::fs::metadata(k.path().join("new-file")).unwrap().len(), 5 << 30);
    }
}

/// `rm` refuses `.`, `..` and the root before touching anything, as coreutils' rm does.
#[test]
fn rm_refuses_dot_dotdot_and_the_root() {
    let fx = fixture();
    let before = stdout(&rext4(&["tree", &at(&fx, "/")]));
    for path in ["/sub/..", "/sub/.", "/.", "/..", "/sub/../", "/"] {
        let t = at(&fx, path);
        let o = rext4(&["rm", "-r", &t]);
        assert!(!o.status.success(), "rm -r {t} succeeded");
        let err = String::from_utf8_lossy(&o.stderr);
        if path == "/" {
            assert!(err.contains("dangerous to operate recursively"), "{err}");
        } else {
            assert_eq!(
                err.trim_end(),
                format!("rext4: refusing to remove '.' or '..' directory: skipping '{t}'")
            );
        }
    }
    let o = rext4(&["rm", &at(&fx, "/")]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("is a directory"), "{o:?}");
    assert_eq!(stdout(&rext4(&["tree", &at(&fx, "/")])), before);
    e2fsck_clean(&fx.image);
}

/// `rext4 fstrim IMAGE`: a file written and removed leaves its blocks in the image file until
/// the trim punches them out; the count is the free space; a minimum over a group is refused.
#[test]
fn fstrim_gives_free_blocks_back_to_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("64M").block_size(4096).build_in(dir.path(), "t.img");
    let blob = dir.path().join("blob");
    std::fs::write(&blob, (0..20_000_000u32).map(|i| (i * 13 + i / 4096) as u8).collect::<Vec<_>>()).unwrap();
    let target = format!("{}:/blob", img.display());
    stdout(&rext4(&["cp", "-q", blob.to_str().unwrap(), &target]));
    stdout(&rext4(&["rm", &target]));
    let held = |p: &Path| std::fs::metadata(p).unwrap().blocks() * 512;
    assert!(held(&img) > 20_000_000, "the removed file's blocks are still in the image file");
    let out = stdout(&rext4(&["fstrim", img.to_str().unwrap()]));
    let n: u64 =
        out.split('(').nth(1).and_then(|s| s.split(' ').next()).and_then(|s| s.parse().ok()).unwrap();
    let o = Command::new("dumpe2fs").arg("-h").arg(&img).output().unwrap();
    let info = String::from_utf8_lossy(&o.stdout);
    let free: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("Free blocks:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert_eq!(n, free * 4096, "{out}");
    assert!(held(&img) < 8 << 20, "the image file holds {} bytes after the trim", held(&img));
    e2fsck_clean(&img);
    let o = rext4(&["fstrim", "-m", "1G", img.to_str().unwrap()]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("invalid argument"));
}
