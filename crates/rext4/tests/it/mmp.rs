//! Multi-mount protection (`mmp`): images made by `mkfs.ext4 -O mmp` are written, their MMP
//! block kept as the kernel keeps it (a changing number while open, clean after), and a
//! writable open stays away from an image another machine is writing: one whose number
//! changes, one e2fsck has, one where the kernel's ext4 has it. The other machine is played
//! by a thread writing the block as the kernel's `kmmpd` does, or by the kernel itself.

use rext4::{Error, Fs, Options};
use rext4_format::mmp::{self, MmpBlock};
use rext4_testkit::*;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerocopy::IntoBytes;

/// A 64 MiB `mmp` image updated every second (`-E mmp_update_interval=1`); its check
/// interval is then the kernel's minimum, 5 s, and an open that must wait waits 11 s.
fn image(dir: &Path, name: &str) -> PathBuf {
    Image::ext4("64M").features("mmp").extended("mmp_update_interval=1").build_in(dir, name)
}

fn rw() -> Options {
    Options { writable: true, ..Options::default() }
}

/// Where the MMP block is and how its checksum is seeded.
struct Place {
    offset: u64,
    seed: u32,
    csum: bool,
}

fn place(img: &Path) -> Place {
    let fs = Fs::open(img).unwrap();
    let sb = fs.superblock();
    let p = Place {
        offset: sb.s_mmp_block.get() * u64::from(fs.block_size()),
        seed: sb.csum_seed(),
        csum: sb.has_metadata_csum(),
    };
    drop(fs);
    p
}

fn read_mmp(img: &Path, p: &Place) -> MmpBlock {
    let mut b = [0u8; mmp::MMP_SIZE];
    std::fs::File::open(img).unwrap().read_exact_at(&mut b, p.offset).unwrap();
    let m = MmpBlock::parse(&b).unwrap();
    assert_eq!(m.mmp_magic.get(), mmp::MMP_MAGIC);
    assert!(m.verify_checksum(p.seed, p.csum), "MMP block checksum");
    m
}

/// Writes the MMP block as another machine would: `f` changes it, the checksum follows.
fn write_mmp(img: &Path, p: &Place, f: impl FnOnce(&mut MmpBlock)) {
    let mut m = read_mmp(img, p);
    f(&mut m);
    m.update_checksum(p.seed, p.csum);
    let file = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    file.write_all_at(m.as_bytes(), p.offset).unwrap();
}

fn hostname() -> Vec<u8> {
    let mut n = std::fs::read("/proc/sys/kernel/hostname").unwrap();
    n.retain(|&b| b != b'\n');
    n
}

fn in_use(r: Result<Fs, Error>) -> String {
    match r {
        Err(e @ Error::InUse(_)) => {
            assert_eq!(e.errno(), libc::EBUSY);
            e.to_string()
        }
        Err(e) => panic!("expected EBUSY, got {e}"),
        Ok(_) => panic!("the open should have been refused"),
    }
}

#[test]
fn an_open_keeps_the_number_moving_and_leaves_it_clean() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.img");
    let p = place(&img);
    assert_eq!(read_mmp(&img, &p).mmp_seq.get(), mmp::SEQ_CLEAN);
    let t = Instant::now();
    let fs = Fs::open_with(&img, rw()).unwrap();
    assert!(t.elapsed() < Duration::from_secs(3), "a clean block is taken at once: {:?}", t.elapsed());
    let first = read_mmp(&img, &p);
    let seq = first.mmp_seq.get();
    assert!(seq <= mmp::SEQ_MAX, "an open node's number: {seq:#x}");
    assert_eq!(MmpBlock::name(&first.mmp_nodename), hostname().as_slice());
    let path = img.as_os_str().as_encoded_bytes();
    assert_eq!(MmpBlock::name(&first.mmp_bdevname), &path[..path.len().min(32)]);
    assert_eq!(first.mmp_check_interval.get(), mmp::MIN_CHECK_INTERVAL);
    fs.write_file("/f", b"written under protection").unwrap();
    fs.sync().unwrap();
    // The thread writes the next number every second.
    let mut seen = vec![seq];
    let t = Instant::now();
    while seen.len() < 3 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(200));
        let s = read_mmp(&img, &p).mmp_seq.get();
        if s != *seen.last().unwrap() {
            assert_ne!(s, mmp::SEQ_CLEAN);
            seen.push(s);
        }
    }
    assert!(seen.len() >= 3, "the number moves while open: {seen:x?}");
    // A read-only open beside the writer takes no part.
    let ro = Fs::open(&img).unwrap();
    assert_eq!(ro.read_file("/f").unwrap(), b"written under protection");
    drop(ro);
    fs.unmount().unwrap();
    let last = read_mmp(&img, &p);
    assert_eq!(last.mmp_seq.get(), mmp::SEQ_CLEAN, "clean after the unmount");
    drop(fs);
    e2fsck_clean(&img);
    // Taken again at once.
    let t = Instant::now();
    let fs = Fs::open_with(&img, rw()).unwrap();
    assert!(t.elapsed() < Duration::from_secs(3));
    assert_eq!(fs.read_file("/f").unwrap(), b"written under protection");
    fs.unmount().unwrap();
    e2fsck_clean(&img);
}

#[test]
fn an_image_e2fsck_has_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "f.img");
    let p = place(&img);
    write_mmp(&img, &p, |m| m.mmp_seq.set(mmp::SEQ_FSCK));
    let before = std::fs::read(&img).unwrap();
    let t = Instant::now();
    let msg = in_use(Fs::open_with(&img, rw()));
    assert!(t.elapsed() < Duration::from_secs(3), "no wait: {:?}", t.elapsed());
    assert!(msg.contains("e2fsck"), "{msg}");
    assert!(std::fs::read(&img).unwrap() == before, "a refused open writes nothing");
    // Reading needs no protection.
    let fs = Fs::open(&img).unwrap();
    assert!(fs.lookup(fs.root(), b"lost+found").is_ok());
}

#[test]
fn a_number_left_by_a_dead_node_is_waited_out() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "d.img");
    let p = place(&img);
    write_mmp(&img, &p, |m| {
        m.mmp_seq.set(0x1234);
        MmpBlock::set_name(&mut m.mmp_nodename, b"gone");
    });
    let t = Instant::now();
    let fs = Fs::open_with(&img, rw()).unwrap();
    let waited = t.elapsed();
    // Twice the wait: before the new number is written and after (2 x 11 s).
    assert!(waited >= Duration::from_secs(22), "waited {waited:?}");
    assert!(waited < Duration::from_secs(40), "waited {waited:?}");
    let m = read_mmp(&img, &p);
    assert_ne!(m.mmp_seq.get(), 0x1234);
    assert_eq!(MmpBlock::name(&m.mmp_nodename), hostname().as_slice());
    fs.write_file("/after", vec![7; 5000]).unwrap();
    fs.unmount().unwrap();
    assert_eq!(read_mmp(&img, &p).mmp_seq.get(), mmp::SEQ_CLEAN);
    drop(fs);
    e2fsck_clean(&img);
}

/// Another machine with the image open: a thread writing the next number every second.
struct OtherNode {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OtherNode {
    fn start(img: &Path, p: Place) -> OtherNode {
        let stop = Arc::new(AtomicBool::new(false));
        let (img, s) = (img.to_path_buf(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut seq = 77;
            while !s.load(Ordering::Acquire) {
                seq += 1;
                write_mmp(&img, &p, |m| {
                    m.mmp_seq.set(seq);
                    MmpBlock::set_name(&mut m.mmp_nodename, b"other-node");
                });
                std::thread::sleep(Duration::from_millis(1000));
            }
        });
        OtherNode { stop, thread: Some(thread) }
    }
}

impl Drop for OtherNode {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn an_image_another_node_writes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "o.img");
    let p = place(&img);
    let other = OtherNode::start(&img, place(&img));
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let msg = in_use(Fs::open_with(&img, rw()));
    let waited = t.elapsed();
    assert!(waited >= Duration::from_secs(11), "one wait before refusing: {waited:?}");
    assert!(msg.contains("other-node"), "names the node: {msg}");
    // Meanwhile the image is readable.
    Fs::open(&img).unwrap();
    drop(other);
    assert_eq!(MmpBlock::name(&read_mmp(&img, &p).mmp_nodename), b"other-node");
}

#[test]
fn a_node_taking_the_image_over_stops_every_later_write() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "t.img");
    let p = place(&img);
    let fs = Fs::open_with(&img, rw()).unwrap();
    fs.write_file("/before", vec![1; 3000]).unwrap();
    fs.sync().unwrap();
    // Another machine ignores the protocol and writes its own number.
    write_mmp(&img, &p, |m| {
        m.mmp_seq.set(5);
        MmpBlock::set_name(&mut m.mmp_nodename, b"intruder");
    });
    let taken = read_mmp(&img, &p);
    let snapshot = std::fs::read(&img).unwrap();
    // Found within an update interval (1 s); writes then fail and leave the image alone.
    std::thread::sleep(Duration::from_millis(2500));
    let wrote = fs.write_file("/after", vec![2; 3000]).and_then(|()| fs.sync());
    assert!(wrote.is_err(), "a write after the takeover must fail");
    let closed = fs.unmount();
    match closed {
        Err(Error::InUse(why)) => assert!(why.contains("intruder"), "{why}"),
        other => panic!("the unmount reports the other node: {other:?}"),
    }
    drop(fs);
    assert!(std::fs::read(&img).unwrap() == snapshot, "nothing written after the takeover");
    let m = read_mmp(&img, &p);
    assert_eq!(m.as_bytes(), taken.as_bytes(), "the other node's block is left as it wrote it");
    // What rext4 left is whole: once the other node lets go (clean), recovery makes it
    // e2fsck-clean, with what was synced before the takeover.
    write_mmp(&img, &p, |m| m.mmp_seq.set(mmp::SEQ_CLEAN));
    rext4::recover_image(&img).unwrap();
    e2fsck_clean(&img);
    assert_eq!(Fs::open(&img).unwrap().read_file("/before").unwrap(), vec![1; 3000]);
}

#[test]
fn an_mmp_block_in_metadata_is_refused_for_writing() {
    let dir = tempfile::tempdir().unwrap();
    let base = image(dir.path(), "base.img");
    let fs = Fs::open(&base).unwrap();
    let sb = fs.superblock();
    let (first, count) = (u64::from(sb.s_first_data_block.get()), sb.blocks_count());
    drop(fs);
    let journal_block = {
        let out = std::process::Command::new(tool("debugfs"))
            .args(["-R", "bmap <8> 3"])
            .arg(&base)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse::<u64>().unwrap()
    };
    let bitmap = sb_group0_block_bitmap(&base);
    let p = place(&base);
    let valid = read_mmp(&base, &p);
    let bs = p.offset / Fs::open(&base).unwrap().superblock().s_mmp_block.get();
    for (what, blk) in
        [("superblock", first), ("bitmap", bitmap), ("journal", journal_block), ("past the end", count + 10)]
    {
        let img = dir.path().join(format!("{}.img", what.replace(' ', "_")));
        std::fs::copy(&base, &img).unwrap();
        let out = std::process::Command::new(tool("debugfs"))
            .args(["-w", "-R", &format!("ssv mmp_block {blk}")])
            .arg(&img)
            .output()
            .unwrap();
        assert!(out.status.success());
        assert_eq!(Fs::open(&img).unwrap().superblock().s_mmp_block.get(), blk, "{what}");
        if blk > first && blk < count {
            // A well-formed MMP block there (its checksum does not cover its place), so that
            // only the place can refuse the open.
            let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
            f.write_all_at(valid.as_bytes(), blk * bs).unwrap();
        }
        let before = std::fs::read(&img).unwrap();
        let r = Fs::open_with(&img, rw());
        assert!(r.is_err(), "{what}: MMP block {blk} must refuse a writable open");
        assert!(std::fs::read(&img).unwrap() == before, "{what}: the refused open wrote nothing");
        // Reading is unaffected.
        let fs = Fs::open(&img).unwrap();
        assert!(fs.lookup(fs.root(), b"lost+found").is_ok(), "{what}");
    }
}

fn sb_group0_block_bitmap(img: &Path) -> u64 {
    let out = std::process::Command::new(tool("dumpe2fs")).arg(img).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.trim_start().starts_with("Block bitmap at ")).unwrap();
    line.trim_start()["Block bitmap at ".len()..].split([' ', ',']).next().unwrap().parse().unwrap()
}

#[test]
fn the_kernel_stays_away_while_rext4_writes_and_mounts_after() {
    require_kernel!();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("k.img");
    // The kernel's own default interval (5 s): its mount waits 2 x 10 + 1 s before refusing.
    Image::ext4("64M").features("mmp").build(&img);
    let fs = Fs::open_with(&img, rw()).unwrap();
    fs.write_file("/from-rext4", b"kept").unwrap();
    fs.sync().unwrap();
    // One mount(8) call (the kit's mount retries, each try waiting again).
    let mnt = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let out = std::process::Command::new(tool("mount"))
        .args(["-t", "ext4", "-o", "loop"])
        .arg(&img)
        .arg(mnt.path())
        .output()
        .unwrap();
    if out.status.success() {
        let _ = std::process::Command::new(tool("umount")).arg(mnt.path()).status();
        panic!("the kernel must not mount an image rext4 is writing");
    }
    assert!(t.elapsed() >= Duration::from_secs(20), "after the kernel's wait: {:?}", t.elapsed());
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    let t = Instant::now();
    {
        let k = KernelMount::rw(&img).unwrap();
        assert!(t.elapsed() < Duration::from_secs(5), "a clean block is mounted at once");
        assert_eq!(std::fs::read(k.path().join("from-rext4")).unwrap(), b"kept");
        std::fs::write(k.path().join("from-kernel"), b"too").unwrap();
    }
    // And back: the kernel left it clean.
    let p = place(&img);
    assert_eq!(read_mmp(&img, &p).mmp_seq.get(), mmp::SEQ_CLEAN);
    let fs = Fs::open_with(&img, rw()).unwrap();
    assert_eq!(fs.read_file("/from-kernel").unwrap(), b"too");
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}

/// e2fsprogs keeps the same protocol: `e2fsck -fy`, which would write, refuses an image rext4
/// has open (it waits, sees the number move, and stops), and checks it once rext4 let go.
#[test]
fn e2fsck_stays_away_while_rext4_writes() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "e.img");
    let fs = Fs::open_with(&img, rw()).unwrap();
    fs.write_file("/f", vec![9; 20_000]).unwrap();
    fs.sync().unwrap();
    let before = read_mmp(&img, &place(&img));
    let out = std::process::Command::new(tool("e2fsck")).arg("-fy").arg(&img).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "e2fsck must not check an image rext4 is writing:\n{text}");
    assert!(text.contains("MMP"), "{text}");
    // It left the block to us.
    let after = read_mmp(&img, &place(&img));
    assert_eq!(MmpBlock::name(&after.mmp_nodename), MmpBlock::name(&before.mmp_nodename));
    fs.write_file("/g", b"still ours").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
    let out = std::process::Command::new(tool("e2fsck")).arg("-fy").arg(&img).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(read_mmp(&img, &place(&img)).mmp_seq.get(), mmp::SEQ_CLEAN, "e2fsck leaves it clean");
}
