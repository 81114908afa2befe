//! Converting files between block maps and extent trees (`chattr +e` / `-e`) is one
//! transaction: a crash at any flush leaves every file's bytes as they were, whichever map
//! the recovered image holds, and the image clean after each recovery.

use super::*;
use rext4::format::inode::EXTENTS_FL;

/// Sizes of the block-mapped files (1 KiB blocks): empty, direct pointers only, single and
/// double indirect blocks.
const SIZES: [usize; 8] = [0, 700, 5_000, 12 * 1024, 40_000, 300_000, 700_000, 2_000];

fn content(i: usize) -> Vec<u8> {
    (0..SIZES[i]).map(|b| (b as u8).wrapping_mul(13).wrapping_add(i as u8)).collect()
}

struct Converted {
    fsyncs: usize,
}

impl Durable for Converted {
    fn fsyncs(&self) -> usize {
        self.fsyncs
    }
}

/// Every file reads as it was made, on whichever map the image holds.
fn check(img: &Path, _: &Converted, _: usize, how: &str) {
    let fs = Fs::open(img).unwrap_or_else(|e| panic!("{how}: open: {e}"));
    for i in 0..SIZES.len() {
        let got = fs.read_file(format!("/m{i}")).unwrap_or_else(|e| panic!("{how}: m{i}: {e}"));
        assert!(got == content(i), "{how}: m{i} changed");
    }
}

#[test]
fn conversions_survive_a_crash_at_any_point() {
    let dir = tmpdir();
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..SIZES.len() {
        std::fs::write(src.join(format!("m{i}")), content(i)).unwrap();
    }
    // Made without extents (block maps), then given the feature, as an ext3 being moved on.
    let img = dir.path().join("base.img");
    Image::ext4("16M")
        .block_size(1024)
        .features("^extent,^64bit,^flex_bg,^huge_file,^metadata_csum")
        .extended("root_owner=0:0")
        .from_dir(&src)
        .build(&img);
    let st = Command::new("tune2fs").args(["-O", "extents"]).arg(&img).output().unwrap();
    assert!(st.status.success(), "tune2fs: {}", String::from_utf8_lossy(&st.stderr));
    let dev = Arc::new(CrashDevice::new(std::fs::read(&img).unwrap()));
    let fs = open_rw(&dev);
    let mut fsyncs = 0;
    let mut set = |i: usize, on: bool| {
        let ino = fs.resolve(format!("/m{i}"), false).unwrap();
        let flags = fs.getattr(ino).unwrap().flags & rext4::FL_USER_VISIBLE;
        let r = fs.set_flags(ino, if on { flags | EXTENTS_FL } else { flags & !EXTENTS_FL });
        fs.fsync(ino).unwrap();
        fsyncs += 1;
        r.map(|_| ())
    };
    for i in 0..SIZES.len() {
        set(i, true).unwrap_or_else(|e| panic!("m{i} +e: {e}"));
    }
    // Back to a block map where the direct pointers hold the file; refused elsewhere.
    for (i, &size) in SIZES.iter().enumerate() {
        let fits = size <= 12 * 1024;
        assert_eq!(set(i, false).is_ok(), fits, "m{i} -e");
    }
    fs.unmount().unwrap();
    drop(fs);
    check_crashes("migrate", dir.path(), &dev, &Converted { fsyncs }, 7, check, usize::MAX);
}
