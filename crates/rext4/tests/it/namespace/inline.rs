//! Inline directories (`inline_data`) taking every change, also from many threads.

use super::*;

/// Directories the kernel stored inline (`inline_data`) take every name operation: in place
/// (in `i_block`, then in the attribute space, as `system.data`) while the names fit, in a
/// block of their own after. Each stays inline, and as large, as when the kernel makes the
/// same changes; the image stays clean, with the kernel seeing the tree rext4 shows.
#[test]
fn inline_directories_take_every_change() {
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "inline", &["-O", "inline_data", "-I", "256"]);
    {
        let m = KernelMount::rw(&img).unwrap();
        let p = m.path();
        for d in ["empty", "few", "ren", "src", "dst", "rm", "nest", "links", "grown"] {
            std::fs::create_dir(p.join(d)).unwrap();
        }
        // Past i_block: the kernel grows system.data for these.
        for i in 1..=6 {
            std::fs::write(p.join("grown").join(format!("name_{i}")), "g").unwrap();
        }
        for f in ["a", "bb", "ccc"] {
            std::fs::write(p.join("few").join(f), f).unwrap();
            std::fs::write(p.join("ren").join(f), f).unwrap();
        }
        std::fs::create_dir(p.join("src/sub")).unwrap();
        std::fs::write(p.join("src/sub/x"), "x").unwrap();
        std::fs::create_dir(p.join("rm/gone")).unwrap();
        std::fs::write(p.join("links/t"), "t").unwrap();
        m.unmount().unwrap();
    }
    // The kernel makes the same changes on a copy: which directories stay inline, and how
    // large, must match.
    let kimg = dir.path().join("inline-kernel.img");
    std::fs::copy(&img, &kimg).unwrap();
    {
        let m = KernelMount::rw(&kimg).unwrap();
        let p = m.path();
        std::fs::write(p.join("empty/new-file"), "").unwrap();
        std::fs::remove_file(p.join("few/bb")).unwrap();
        std::fs::rename(p.join("ren/a"), p.join("ren/a-renamed-to-a-longer-name")).unwrap();
        std::fs::rename(p.join("src/sub"), p.join("dst/sub")).unwrap();
        std::fs::remove_dir(p.join("rm/gone")).unwrap();
        std::fs::create_dir(p.join("nest/inner")).unwrap();
        std::fs::write(p.join("nest/inner/deep"), "").unwrap();
        std::fs::hard_link(p.join("links/t"), p.join("links/t2")).unwrap();
        std::os::unix::fs::symlink("t", p.join("links/s")).unwrap();
        std::fs::remove_file(p.join("grown/name_6")).unwrap();
        std::fs::remove_file(p.join("grown/name_1")).unwrap();
        std::fs::write(p.join("grown/other6"), "").unwrap();
        std::fs::rename(p.join("grown/name_3"), p.join("grown/nm3")).unwrap();
        m.unmount().unwrap();
    }
    let fs = rw(&img);
    let inline = |path: &str| fs.metadata(path).unwrap().flags & 0x1000_0000 != 0;
    for d in ["/empty", "/few", "/ren", "/src", "/src/sub", "/rm/gone", "/nest", "/links"] {
        assert!(inline(d), "{d} is not inline: the fixture does not test anything");
    }
    let at = |path: &str| fs.resolve(path, false).unwrap();
    fs.create(at("/empty"), b"new-file", 0o644, 0, 0).unwrap();
    fs.unlink(at("/few"), b"bb").unwrap();
    fs.rename(at("/ren"), b"a", at("/ren"), b"a-renamed-to-a-longer-name", 0).unwrap();
    // A directory moved out of one inline directory into another: three conversions, and
    // the moved directory's `..` now names its new parent.
    fs.rename(at("/src"), b"sub", at("/dst"), b"sub", 0).unwrap();
    assert_eq!(fs.resolve("/dst/sub/..", false).unwrap(), at("/dst"));
    fs.rmdir(at("/rm"), b"gone").unwrap();
    let n = fs.mkdir(at("/nest"), b"inner", 0o755, 0, 0).unwrap();
    fs.create(n.ino, b"deep", 0o600, 0, 0).unwrap();
    fs.link(at("/links/t"), at("/links"), b"t2").unwrap();
    fs.symlink(at("/links"), b"s", b"t", 0, 0).unwrap();
    assert!(fs.metadata("/grown").unwrap().size > 60, "the kernel did not grow /grown");
    fs.unlink(at("/grown"), b"name_6").unwrap();
    fs.unlink(at("/grown"), b"name_1").unwrap();
    fs.create(at("/grown"), b"other6", 0o644, 0, 0).unwrap();
    fs.rename(at("/grown"), b"name_3", at("/grown"), b"nm3", 0).unwrap();
    // The long name did not fit in i_block: /ren's attribute space took it.
    assert!(inline("/ren") && fs.metadata("/ren").unwrap().size > 60, "/ren did not grow inline");
    let dirs = [
        "/empty",
        "/few",
        "/ren",
        "/src",
        "/dst",
        "/dst/sub",
        "/rm",
        "/nest",
        "/nest/inner",
        "/links",
        "/grown",
    ];
    let shape = |fs: &Fs, d: &str| {
        let a = fs.metadata(d).unwrap();
        (a.size, a.flags & 0x1000_0000 != 0)
    };
    let kfs = Fs::open(&kimg).unwrap();
    for d in dirs {
        assert_eq!(
            shape(&fs, d),
            shape(&kfs, d),
            "{d}: (size, inline) after the same changes, rext4 against the kernel"
        );
    }
    drop(kfs);
    let names = |path: &str| {
        let mut v: Vec<Vec<u8>> = fs.read_dir(path).unwrap().map(|e| e.unwrap().name).collect();
        v.sort();
        v
    };
    assert_eq!(names("/few"), [&b"a"[..], b"ccc"]);
    assert_eq!(names("/grown"), [&b"name_2"[..], b"name_4", b"name_5", b"nm3", b"other6"]);
    assert!(names("/src").is_empty());
    assert_eq!(names("/dst/sub"), [b"x"]);
    assert_eq!(names("/ren"), [&b"a-renamed-to-a-longer-name"[..], b"bb", b"ccc"]);
    assert_eq!(fs.getattr(at("/src")).unwrap().nlink, 2);
    assert_eq!(fs.getattr(at("/dst")).unwrap().nlink, 3);
    let ours = walk_rext4(&fs, None);
    fs.unmount().unwrap();
    fsck_clean(&img);
    let m = KernelMount::ro(&img).unwrap();
    let kernel = walk_kernel(m.path());
    let diffs = diff_full("kernel", &kernel, "rext4", &ours);
    m.unmount().unwrap();
    assert_no_diff("inline directories", &diffs);
}

/// Inline directories changed from several threads while others read them: a name that is
/// always there is always found, whichever area the changes land in; names move between two
/// inline directories; the directories stay inline and the image stays clean.
#[test]
fn concurrent_changes_to_inline_directories() {
    let dir = tempfile::tempdir().unwrap();
    let img = mkfs(dir.path(), "ic", &["-O", "inline_data", "-I", "256"]);
    let fs = rw(&img);
    let root = fs.root();
    let dirs: Vec<_> =
        (0..3).map(|i| fs.mkdir(root, format!("d{i}").as_bytes(), 0o755, 0, 0).unwrap().ino).collect();
    for &d in &dirs {
        fs.create(d, b"keep", 0o644, 0, 0).unwrap();
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..3usize)
            .map(|t| {
                let (fs, dirs) = (fs.clone(), dirs.clone());
                s.spawn(move || {
                    for round in 0..300 {
                        let n = format!("w{t}");
                        fs.create(dirs[t], n.as_bytes(), 0o644, 0, 0).unwrap();
                        fs.rename(
                            dirs[t],
                            n.as_bytes(),
                            dirs[t],
                            format!("r{t}-{}", round % 7).as_bytes(),
                            0,
                        )
                        .unwrap();
                        let to = dirs[(t + 1) % 3];
                        let moved = format!("m{t}");
                        fs.rename(dirs[t], format!("r{t}-{}", round % 7).as_bytes(), to, moved.as_bytes(), 0)
                            .unwrap();
                        fs.unlink(to, moved.as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for _ in 0..2 {
            let (fs, dirs, done) = (fs.clone(), dirs.clone(), &done);
            s.spawn(move || {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    for &d in &dirs {
                        fs.lookup(d, b"keep").unwrap();
                        let mut seen = false;
                        fs.readdir(d, 0, |e| {
                            seen |= e.name == b"keep";
                            true
                        })
                        .unwrap();
                        assert!(seen, "readdir missed a name that never moved");
                    }
                }
            });
        }
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    for i in 0..3 {
        let p = format!("/d{i}");
        assert!(fs.metadata(&p).unwrap().flags & 0x1000_0000 != 0, "{p} left inline");
        let names: Vec<_> = fs.read_dir(&p).unwrap().map(|e| e.unwrap().name).collect();
        assert_eq!(names, [b"keep"], "{p}");
    }
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&img);
}
