//! Partitioned disks: `sfdisk` writes GPT and MBR tables, `mkfs.ext4` fills the partitions;
//! rext4 opens each partition by selector (`disk.img@2`, `@data`, `@type=0x83`), changes it,
//! and then each partition, copied out, is clean under `e2fsck -fn` and read by the kernel
//! (a loop mount at the partition's offset) as rext4 left it. Bytes outside the partition
//! written must not change.

use rext4::{Fs, Options};
use rext4_testkit::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A disk image partitioned by `sfdisk` from `script`, each partition listed as
/// `(start, len)` in bytes.
pub fn partitioned_disk(dir: &Path, name: &str, mib: u64, script: &str) -> (PathBuf, Vec<(u64, u64)>) {
    let disk = dir.join(name);
    std::fs::File::create(&disk).unwrap().set_len(mib << 20).unwrap();
    let mut c = Command::new(tool("sfdisk"))
        .args(["--quiet", "--no-reread", "--no-tell-kernel"])
        .arg(&disk)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("sfdisk");
    std::io::Write::write_all(c.stdin.as_mut().unwrap(), script.as_bytes()).unwrap();
    drop(c.stdin.take());
    assert!(c.wait().unwrap().success(), "sfdisk failed on {script}");
    let dump = Command::new(tool("sfdisk")).arg("-d").arg(&disk).output().unwrap();
    let text = String::from_utf8_lossy(&dump.stdout);
    // "disk.img1 : start=        2048, size=       65536, type=..."
    let field = |l: &str, k: &str| -> u64 {
        let v = l.split(k).nth(1).unwrap().trim_start();
        v[..v.find(',').unwrap_or(v.len())].trim().parse::<u64>().unwrap() * 512
    };
    let parts = text
        .lines()
        .filter(|l| l.contains("start="))
        .map(|l| (field(l, "start="), field(l, "size=")))
        .collect();
    (disk, parts)
}

/// Writes an ext4 filesystem of exactly `len` bytes at `start` of `disk`.
pub fn fill_ext4(disk: &Path, start: u64, len: u64, label: &str) {
    let dir = tempfile::tempdir().unwrap();
    let fs_img = dir.path().join("p.img");
    Image::ext4(&format!("{}K", len / 1024)).args(["-L", label]).build(&fs_img);
    let bytes = std::fs::read(&fs_img).unwrap();
    assert_eq!(bytes.len() as u64, len);
    let f = std::fs::OpenOptions::new().write(true).open(disk).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &bytes, start).unwrap();
}

/// Copies `len` bytes at `start` of `disk` into a file of their own.
pub fn extract(disk: &Path, start: u64, len: u64, to: &Path) {
    let f = std::fs::File::open(disk).unwrap();
    let mut buf = vec![0u8; len as usize];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, start).unwrap();
    std::fs::write(to, buf).unwrap();
}

/// Writes a small tree named after `tag` through `fs`, then unmounts.
pub fn change(fs: &Fs, tag: &str) {
    fs.create_dir_all(format!("/{tag}/sub")).unwrap();
    for i in 0..50 {
        fs.write_file(format!("/{tag}/sub/f{i}"), format!("{tag} {i}\n").repeat(i * 40)).unwrap();
    }
    fs.write_file(format!("/{tag}/big"), vec![tag.as_bytes()[0]; 3 << 20]).unwrap();
    fs.unmount().unwrap();
}

/// Checks one partition of `disk`: e2fsck on a copy, the files `change` wrote, and the
/// kernel's view (a loop mount at the partition's offset) against rext4's.
pub fn check_partition(disk: &Path, start: u64, len: u64, tag: &str) {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("part.img");
    extract(disk, start, len, &copy);
    e2fsck_clean(&copy);
    let fs = Fs::open(&copy).unwrap();
    assert_eq!(
        fs.read_file(format!("/{tag}/sub/f7")).unwrap(),
        format!("{tag} 7\n").repeat(280).into_bytes()
    );
    assert_eq!(fs.read_file(format!("/{tag}/big")).unwrap().len(), 3 << 20);
    if why_no_kernel_mount().is_none() {
        let m = KernelMount::with_options(disk, &format!("loop,ro,offset={start},sizelimit={len}")).unwrap();
        assert_no_diff(
            &format!("{tag}: kernel vs rext4"),
            &diff_full("kernel", &walk_kernel(m.path()), "rext4", &walk_rext4(&fs, None)),
        );
    } else {
        skip_note(module_path!(), line!(), "no kernel comparison", "cannot loop-mount images here");
    }
}

fn rw(addr: &str) -> Fs {
    Fs::open_with(addr, Options { writable: true, ..Options::default() })
        .unwrap_or_else(|e| panic!("{addr}: {e}"))
}

fn digest_outside(disk: &Path, keep: (u64, u64)) -> Vec<u8> {
    let mut all = std::fs::read(disk).unwrap();
    all.drain(keep.0 as usize..(keep.0 + keep.1) as usize);
    all
}

#[test]
fn gpt_partitions_by_number_label_and_type() {
    let dir = tempfile::tempdir().unwrap();
    let script = "label: gpt\nsize=24MiB, type=linux, name=root\nsize=32MiB, type=linux, name=data\nsize=4MiB, type=uefi, name=esp\n";
    let (disk, parts) = partitioned_disk(dir.path(), "gpt.img", 64, script);
    assert_eq!(parts.len(), 3);
    fill_ext4(&disk, parts[0].0, parts[0].1, "root");
    fill_ext4(&disk, parts[1].0, parts[1].1, "data");
    let d = disk.display();

    // By number, then by label; bytes outside each partition stay as they were.
    let before = digest_outside(&disk, parts[0]);
    change(&rw(&format!("{d}@1")), "one");
    assert_eq!(digest_outside(&disk, parts[0]), before, "bytes outside partition 1 changed");
    let before = digest_outside(&disk, parts[1]);
    change(&rw(&format!("{d}@data")), "two");
    assert_eq!(digest_outside(&disk, parts[1]), before, "bytes outside partition 2 changed");

    // The partition labelled root; by type only the ESP is unique.
    assert!(Fs::open(format!("{d}@root")).unwrap().read_file("/one/big").is_ok());
    assert!(Fs::open(format!("{d}@label=data")).unwrap().read_file("/two/big").is_ok());
    let e = Fs::open(format!("{d}@type=linux")).err().expect("two linux partitions");
    assert!(e.to_string().contains("several partitions"), "{e}");
    let e = Fs::open(format!("{d}@9")).err().expect("no partition 9");
    assert!(e.to_string().contains("\"data\""), "the error lists the partitions: {e}");
    assert!(Fs::open(format!("{d}@esp")).is_err(), "the ESP holds no ext4");

    check_partition(&disk, parts[0].0, parts[0].1, "one");
    check_partition(&disk, parts[1].0, parts[1].1, "two");
}

#[test]
fn mbr_primary_and_logical_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let script = "label: dos\nsize=16MiB, type=83\ntype=5\nsize=8MiB, type=82\nsize=24MiB, type=83\n";
    let (disk, parts) = partitioned_disk(dir.path(), "mbr.img", 64, script);
    // sfdisk lists 1, 2 (extended), 5, 6.
    assert_eq!(parts.len(), 4, "{parts:?}");
    let (p1, p6) = (parts[0], parts[3]);
    fill_ext4(&disk, p1.0, p1.1, "first");
    fill_ext4(&disk, p6.0, p6.1, "logical");
    let d = disk.display();
    change(&rw(&format!("{d}@1")), "pri");
    change(&rw(&format!("{d}@6")), "log");
    // Type 0x82 (swap) is the fifth partition alone.
    let e = Fs::open(format!("{d}@type=0x82")).err().expect("swap is not ext4");
    assert!(!e.to_string().contains("no partition"), "{e}");
    check_partition(&disk, p1.0, p1.1, "pri");
    check_partition(&disk, p6.0, p6.1, "log");
}

#[test]
fn loop_partscan_sees_what_rext4_wrote() {
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    let script = "label: gpt\nsize=24MiB, type=linux, name=a\nsize=24MiB, type=linux, name=b\n";
    let (disk, parts) = partitioned_disk(dir.path(), "scan.img", 52, script);
    fill_ext4(&disk, parts[1].0, parts[1].1, "b");
    change(&rw(&format!("{}@b", disk.display())), "bee");
    // The kernel's own partition scan finds partition 2 where rext4 wrote.
    let out = Command::new(tool("losetup"))
        .args(["--find", "--show", "--partscan", "--read-only"])
        .arg(&disk)
        .output()
        .unwrap();
    assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
    let loopdev = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let part = PathBuf::from(format!("{loopdev}p2"));
    let mut found = false;
    for _ in 0..100 {
        if part.exists() {
            found = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let fsck = found.then(|| Command::new(tool("e2fsck")).arg("-fn").arg(&part).output().unwrap());
    let _ = Command::new(tool("losetup")).arg("-d").arg(&loopdev).status();
    let Some(fsck) = fsck else {
        // Loop devices made without partition minors (loop's max_part=0) show none.
        skip_note(module_path!(), line!(), "no partscan check", "the kernel makes no loop partitions here");
        return check_partition(&disk, parts[1].0, parts[1].1, "bee");
    };
    assert!(fsck.status.success(), "e2fsck {}: {}", part.display(), String::from_utf8_lossy(&fsck.stdout));
    check_partition(&disk, parts[1].0, parts[1].1, "bee");
}
