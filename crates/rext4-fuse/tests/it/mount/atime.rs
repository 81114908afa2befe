//! Access times through the mount against kernel ext4: two copies of one image, made by
//! mkfs.ext4 with times set in the past by debugfs, are read cold (fresh mounts) through a
//! kernel loop mount and through rext4-fuse with the same options; each access time must be
//! set (or kept) in both alike, `stat` through the mount must show the time the image then
//! holds (a `copy_file_range` source's too), and both images must be clean.

use super::*;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

const HOUR: i64 = 3600;

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// The paths the workload reads: `f` (access time older than its change: relatime renews
/// it), `keep` (newer than its changes and an hour old: relatime keeps it), `noa` (like `f`,
/// read through `O_NOATIME`), `cp` (like `f`, the source of a `copy_file_range`), `d` (a
/// directory like `f`, listed), `l` (a symbolic link like `f`, read by `readlink`), `lw` (one
/// followed by `stat`).
const PATHS: [&str; 7] = ["f", "keep", "noa", "cp", "d", "l", "lw"];

fn base_image(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    for f in ["f", "keep", "noa", "cp"] {
        fs::write(src.join(f), vec![b'x'; 10_000]).unwrap();
    }
    fs::write(src.join("d/a"), b"a").unwrap();
    std::os::unix::fs::symlink("f", src.join("l")).unwrap();
    std::os::unix::fs::symlink("keep", src.join("lw")).unwrap();
    let img = dir.join("base.img");
    Image::ext4("32M").block_size(4096).from_dir(&src).build(&img);
    let t = now();
    let mut cmds = String::new();
    for (p, (a, m)) in [
        ("f", (2, 1)),
        ("keep", (1, 2)),
        ("noa", (2, 1)),
        ("cp", (2, 1)),
        ("d", (2, 1)),
        ("l", (2, 1)),
        ("lw", (2, 1)),
    ] {
        let (a, m) = (t - a * HOUR, t - m * HOUR);
        cmds += &format!("sif /{p} atime @{a}\nsif /{p} mtime @{m}\nsif /{p} ctime @{m}\n");
    }
    debugfs_write(&img, &cmds);
    img
}

fn atime_of(p: &Path) -> (i64, i64) {
    let md = fs::symlink_metadata(p).unwrap();
    (md.atime(), md.atime_nsec())
}

/// Reads every path once under `root` and returns their access times as `stat` then shows.
fn workload(root: &Path) -> Vec<(i64, i64)> {
    assert_eq!(fs::read(root.join("f")).unwrap().len(), 10_000);
    assert_eq!(fs::read(root.join("keep")).unwrap().len(), 10_000);
    let mut noa = OpenOptions::new().read(true).custom_flags(libc::O_NOATIME).open(root.join("noa")).unwrap();
    let mut v = Vec::new();
    noa.read_to_end(&mut v).unwrap();
    assert_eq!(v.len(), 10_000);
    // std's copy between regular files is `copy_file_range`: a splice read on ext4, a
    // `COPY_FILE_RANGE` request through the mount.
    assert_eq!(fs::copy(root.join("cp"), root.join("copy")).unwrap(), 10_000);
    assert_eq!(fs::read_dir(root.join("d")).unwrap().count(), 1);
    assert_eq!(fs::read_link(root.join("l")).unwrap(), Path::new("f"));
    assert_eq!(fs::metadata(root.join("lw")).unwrap().len(), 10_000);
    PATHS.iter().map(|p| atime_of(&root.join(p))).collect()
}

/// Runs `f` on a kernel loop mount of `img` with `opts`; then unmounts and checks the image.
fn on_kernel<T>(img: &Path, opts: &str, f: impl FnOnce(&Path) -> T) -> T {
    let km = KernelMount::with_options(img, &format!("loop,{opts}")).unwrap();
    let r = f(km.path());
    km.unmount().unwrap();
    e2fsck_clean(img);
    r
}

/// Which paths a read set the access time of, from the times before and after.
fn changed(before: &[(i64, i64)], after: &[(i64, i64)]) -> Vec<&'static str> {
    PATHS.iter().zip(before.iter().zip(after)).filter(|(_, (b, a))| b != a).map(|(p, _)| *p).collect()
}

#[test]
fn reads_set_access_times_as_kernel_ext4() {
    require_fuse!();
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    let base = base_image(dir.path());
    let original: Vec<_> = {
        let k = KernelMount::ro(&base).unwrap();
        let v = PATHS.iter().map(|p| atime_of(&k.path().join(p))).collect();
        k.unmount().unwrap();
        v
    };
    for (opts, want) in [
        ("relatime", &["f", "cp", "d", "l", "lw"][..]),
        ("strictatime", &["f", "keep", "cp", "d", "l", "lw"][..]),
        ("nodiratime", &["f", "cp", "l", "lw"][..]),
        ("noatime", &[][..]),
    ] {
        let kimg = dir.path().join(format!("kernel-{opts}.img"));
        let fimg = dir.path().join(format!("fuse-{opts}.img"));
        fs::copy(&base, &kimg).unwrap();
        fs::copy(&base, &fimg).unwrap();

        let kernel = on_kernel(&kimg, opts, workload);

        let m = FuseMount::new(&fimg, opts);
        let before_read = now();
        let fuse = workload(m.path());
        m.unmount();
        e2fsck_clean(&fimg);

        let k = KernelMount::ro(&fimg).unwrap();
        let stored: Vec<_> = PATHS.iter().map(|p| atime_of(&k.path().join(p))).collect();
        k.unmount().unwrap();

        assert_eq!(changed(&original, &kernel), want, "{opts}: kernel ext4");
        assert_eq!(changed(&original, &stored), want, "{opts}: the image the mount left");
        for (p, (o, f)) in PATHS.iter().zip(original.iter().zip(&stored)) {
            if o != f {
                assert!(
                    f.0 >= before_read && f.0 <= now(),
                    "{opts}: {p}: atime {f:?} is not the read's time"
                );
            }
        }
        // `stat` through the mount showed what the image then held, the source of
        // `copy_file_range` too (the daemon drops the kernel's cached attributes for it).
        for (i, p) in PATHS.iter().enumerate() {
            assert_eq!(fuse[i], stored[i], "{opts}: {p}: stat through the mount");
        }
    }
}

/// The steps of [`cached_reads_as_kernel_ext4`]: whether each moved the access time.
const CACHED_STEPS: [&str; 4] = ["read after create", "read again", "read after append", "read again"];

/// Creates a file under `root` and reads it as the steps say, a little apart; returns which
/// steps moved its access time. Every read but the first finds the file's pages in the
/// kernel's cache (its own writes left them there).
fn cached_workload(root: &Path) -> Vec<bool> {
    let f = root.join("w");
    let pause = || std::thread::sleep(std::time::Duration::from_millis(30));
    fs::write(&f, b"written\n").unwrap();
    let mut last = atime_of(&f);
    let mut moved = Vec::new();
    for step in CACHED_STEPS {
        pause();
        if step == "read after append" {
            OpenOptions::new().append(true).open(&f).unwrap().write_all(b"more\n").unwrap();
            pause();
        }
        assert!(fs::read(&f).unwrap().starts_with(b"written\n"));
        let now = atime_of(&f);
        moved.push(now != last);
        last = now;
    }
    moved
}

/// Reads the kernel answers from its page cache set access times where ext4 would: the
/// daemon opens a file without `FOPEN_KEEP_CACHE` when a read would set the time (relatime
/// after a change, every read under strictatime), so the read reaches it.
#[test]
fn cached_reads_as_kernel_ext4() {
    require_fuse!();
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    for (opts, want) in [
        ("relatime", [true, false, true, false]),
        ("strictatime", [true, true, true, true]),
        ("noatime", [false, false, false, false]),
    ] {
        let kimg = dir.path().join(format!("kernel-{opts}.img"));
        let fimg = dir.path().join(format!("fuse-{opts}.img"));
        Image::ext4("32M").build(&kimg);
        fs::copy(&kimg, &fimg).unwrap();

        let kernel = on_kernel(&kimg, opts, cached_workload);

        let m = FuseMount::new(&fimg, opts);
        let fuse = cached_workload(m.path());
        let shown = atime_of(&m.path().join("w"));
        m.unmount();
        e2fsck_clean(&fimg);
        let k = KernelMount::ro(&fimg).unwrap();
        assert_eq!(atime_of(&k.path().join("w")), shown, "{opts}: stat through the mount");
        k.unmount().unwrap();

        let steps = |v: &[bool]| CACHED_STEPS.iter().zip(v).map(|(s, m)| (*s, *m)).collect::<Vec<_>>();
        assert_eq!(steps(&kernel), steps(&want), "{opts}: kernel ext4");
        assert_eq!(steps(&fuse), steps(&want), "{opts}: the mount");
    }
}
