//! `Fs::stats`: operation counts and times, lock waits and commit times from real work on an
//! image from mkfs.ext4, from many threads; the image stays clean (e2fsck).

use rext4::{Fs, Options, SetAttr};
use rext4_testkit::{e2fsck_clean, Image};

fn op<'a>(r: &'a rext4::StatsReport, name: &str) -> &'a rext4::OpStat {
    r.ops.iter().find(|o| o.name == name).unwrap_or_else(|| panic!("no {name} row"))
}

#[test]
fn counts_what_threads_did_and_resets() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("s.img");
    Image::ext4("64M").build(&img);
    let fs = Fs::open_with(&img, Options { writable: true, ..Options::default() }).unwrap();
    fs.set_stats_every(1);
    let root = fs.root();
    let dirs: Vec<_> =
        (0..4).map(|t| fs.mkdir(root, format!("d{t}").as_bytes(), 0o755, 0, 0).unwrap().ino).collect();
    std::thread::scope(|s| {
        for &d in &dirs {
            let fs = &fs;
            s.spawn(move || {
                for i in 0..50 {
                    let name = format!("f{i}");
                    let ino = fs.create(d, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
                    fs.write(ino, 0, b"hello").unwrap();
                    fs.setattr(ino, &SetAttr { size: Some(1), ..SetAttr::default() }).unwrap();
                    fs.lookup(d, name.as_bytes()).unwrap();
                    if i % 2 == 0 {
                        fs.unlink(d, name.as_bytes()).unwrap();
                    }
                }
            });
        }
    });
    fs.fsync(dirs[0]).unwrap();
    fs.sync().unwrap();
    let r = fs.stats();
    assert_eq!(op(&r, "ext4_create").count, 200);
    assert_eq!(op(&r, "ext4_mkdir").count, 4);
    assert_eq!(op(&r, "ext4_unlink").count, 100);
    assert_eq!(op(&r, "ext4_file_write_iter").count, 200);
    assert_eq!(op(&r, "ext4_truncate").count, 200);
    assert_eq!(op(&r, "__ext4_new_inode").count, 204);
    assert_eq!(op(&r, "ext4_free_inode").count, 100);
    assert!(op(&r, "ext4_lookup").count >= 200);
    assert!(op(&r, "ext4_add_entry").count >= 204);
    assert!(op(&r, "jbd2__journal_start").count >= 204);
    assert!(op(&r, "ext4_mark_inode_dirty").count >= 400);
    assert!(op(&r, "jbd2_journal_get_write_access").count > op(&r, "ext4_create").count);
    assert!(op(&r, "ext4_create").total_ns >= op(&r, "ext4_add_entry").total_ns / 2);
    for o in &r.ops {
        assert_eq!(o.count == 0, o.total_ns == 0, "{o:?}");
    }
    let oplock = r.locks.iter().find(|l| l.name.starts_with("inode op_lock")).unwrap();
    assert!(oplock.acquired >= 304, "{oplock:?}");
    for l in &r.locks {
        assert!(l.contended <= l.acquired && l.max_wait_ns <= l.wait_ns, "{l:?}");
    }
    let c = r.commits.clone().expect("writable: commit figures");
    assert!(c.commits >= 1 && c.max_us as f64 >= c.mean_us && c.top5_us.len() <= 5, "{c:?}");
    assert!(op(&r, "jbd2_journal_commit_transaction").count >= c.commits.min(4096));
    // Every operation above ran in a handle; each changed at least an inode-table block.
    assert!(c.handles >= 604 && c.blocks >= c.commits && c.blocks <= c.handles * 16, "{c:?}");

    fs.reset_stats();
    let z = fs.stats();
    assert!(z.ops.iter().all(|o| o.count == 0), "reset left counts");
    fs.getattr(root).unwrap();
    assert_eq!(op(&fs.stats(), "ext4_getattr").count, 1);
    // Sampled: one call in eight on average, scaled.
    fs.set_stats_every(8);
    fs.reset_stats();
    for _ in 0..8000 {
        fs.getattr(root).unwrap();
    }
    let n = op(&fs.stats(), "ext4_getattr").count;
    assert!(n.is_multiple_of(8) && n.abs_diff(8000) < 1000, "{n}");
    fs.unmount().unwrap();
    e2fsck_clean(&img);
}

#[test]
fn read_only_has_no_commit_figures() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("r.img");
    Image::ext4("16M").build(&img);
    let fs = Fs::open(&img).unwrap();
    fs.set_stats_every(1);
    fs.lookup(fs.root(), b"lost+found").unwrap();
    let r = fs.stats();
    assert!(r.commits.is_none());
    assert_eq!(op(&r, "ext4_lookup").count, 1);
}

/// Every public call is timed under the kernel function it stands for, once: the calls that
/// went untimed (seeks, inode flags) or under another's name (holding an inode) included.
#[test]
fn every_public_call_is_timed_under_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("n.img");
    Image::ext4("16M").build(&img);
    let fs = Fs::open_with(&img, Options { writable: true, ..Options::default() }).unwrap();
    fs.set_stats_every(1);
    let root = fs.root();
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 8192, b"data").unwrap();
    fs.reset_stats();
    fs.seek_data(f, 0).unwrap();
    fs.seek_hole(f, 0).unwrap();
    fs.set_flags(f, 0x80000).unwrap();
    fs.hold(f).unwrap();
    fs.release(f).unwrap();
    fs.sync().unwrap();
    let r = fs.stats();
    for (name, n) in [
        ("ext4_llseek", 2),
        ("ext4_fileattr_set", 1),
        ("ext4_file_open", 1),
        ("ext4_release_file", 1),
        ("ext4_sync_fs", 1),
        ("ext4_setattr", 0),
    ] {
        assert_eq!(op(&r, name).count, n, "{name}");
    }
    fs.unmount().unwrap();
    e2fsck_clean(&img);
}

/// A large read asked first where its bytes lie (`Fs::read_in_place`, as the mount's daemon
/// does) counts once as `ext4_file_read_iter`: as itself when answered in place, and only as
/// the read that follows when it cannot be (a hole).
#[test]
fn a_large_read_counts_once_whichever_way_it_goes() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("r.img");
    Image::ext4("64M").build(&img);
    let fs = Fs::open_with(&img, Options { writable: true, ..Options::default() }).unwrap();
    // Before any operation: the sampling countdown starts at every one.
    fs.set_stats_every(1);
    let root = fs.root();
    let written = fs.create(root, b"w", 0o644, 0, 0).unwrap().ino;
    fs.write(written, 0, &vec![7u8; 256 << 10]).unwrap();
    fs.fsync(written).unwrap();
    let sparse = fs.create(root, b"s", 0o644, 0, 0).unwrap().ino;
    fs.setattr(sparse, &SetAttr { size: Some(256 << 10), ..SetAttr::default() }).unwrap();
    fs.reset_stats();
    let reads = |fs: &Fs| op(&fs.stats(), "ext4_file_read_iter").count;
    let bytes = fs.read_in_place(written, 0, 128 << 10, false, |r| r.iter().map(|r| r.len).sum::<usize>());
    assert_eq!(bytes.unwrap(), Some(128 << 10), "the written file lies in the image file");
    assert_eq!(reads(&fs), 1);
    assert!(fs.read_in_place(sparse, 0, 128 << 10, false, |_| ()).unwrap().is_none(), "a hole");
    assert_eq!(reads(&fs), 1, "the attempt that found a hole is not a read");
    let mut buf = vec![1u8; 128 << 10];
    assert_eq!(fs.read(sparse, 0, &mut buf).unwrap(), 128 << 10);
    assert!(buf.iter().all(|&b| b == 0));
    assert_eq!(reads(&fs), 2);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img);
}
