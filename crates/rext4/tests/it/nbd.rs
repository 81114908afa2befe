//! Images on NBD servers: nbdkit (file and memory plugins, error and delay filters) and
//! qemu-nbd (qcow2 holding a GPT disk), on a Unix socket or loopback TCP. rext4 reads and
//! writes through its own NBD client; the image the server holds must then be clean under
//! `e2fsck -fn` and hold what was written. Skipped (with a note) where the servers are not
//! installed, a failure under `REXT4_REQUIRE_MOUNT=1`.

use crate::partition::{change, check_partition, fill_ext4, partitioned_disk};
use rext4::dev::{BlockDevice, NbdDevice};
use rext4::{Error, Fs, Options};
use rext4_testkit::*;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

fn rw(addr: &str) -> Fs {
    Fs::open_with(addr, Options { writable: true, ..Options::default() })
        .unwrap_or_else(|e| panic!("{addr}: {e}"))
}

fn nbd_device(uri: &str, writable: bool) -> NbdDevice {
    let rext4::dev::address::Target::Nbd(cfg) = rext4::dev::Address::parse(Path::new(uri)).unwrap().target
    else {
        panic!("{uri} is not an NBD address")
    };
    NbdDevice::connect(cfg, writable).unwrap()
}

/// Writes from several threads at once, then unmounts.
fn parallel_changes(fs: &Fs) {
    std::thread::scope(|s| {
        for t in 0..4 {
            let fs = fs.clone();
            s.spawn(move || {
                fs.create_dir_all(format!("/t{t}")).unwrap();
                for i in 0..40 {
                    fs.write_file(format!("/t{t}/f{i}"), vec![(t * 40 + i) as u8; 1000 * i + 1]).unwrap();
                }
            });
        }
    });
    fs.sync().unwrap();
    fs.unmount().unwrap();
}

fn check_parallel_changes(fs: &Fs) {
    for t in 0..4 {
        for i in [0, 17, 39] {
            assert_eq!(fs.read_file(format!("/t{t}/f{i}")).unwrap(), vec![(t * 40 + i) as u8; 1000 * i + 1]);
        }
    }
}

#[test]
fn nbdkit_file_over_unix_socket_and_tcp() {
    require_tool!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    Image::ext4("128M").build(&img);
    for listen in [Listen::Unix, Listen::Tcp] {
        let mut srv = NbdServe::nbdkit(listen, &["file", img.to_str().unwrap()]);
        let uri = srv.uri("", "");
        {
            let dev = nbd_device(&uri, true);
            assert!(dev.multi_conn() && dev.connections() > 1, "nbdkit file offers multi-conn");
        }
        let fs = rw(&uri);
        parallel_changes(&fs);
        drop(fs);
        check_parallel_changes(&Fs::open(&uri).unwrap());
        srv.terminate();
        e2fsck_clean(&img);
        check_parallel_changes(&Fs::open(&img).unwrap());
        // A second round starts from what the first left.
        std::fs::write(dir.path().join("ignored"), b"").unwrap();
    }
}

#[test]
fn nbdkit_memory_export_multi_conn_copy_in_and_out() {
    require_tool!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("src.img");
    Image::ext4("64M").build(&img);
    let bytes = std::fs::read(&img).unwrap();
    let srv = NbdServe::nbdkit(Listen::Tcp, &["memory", "64M"]);
    let uri = srv.uri("", "connections=4");
    // Copy the image in from four threads at once, through four connections.
    let dev = Arc::new(nbd_device(&uri, true));
    assert_eq!((dev.size(), dev.connections()), (64 << 20, 4));
    std::thread::scope(|s| {
        for (i, chunk) in bytes.chunks(16 << 20).enumerate() {
            let dev = dev.clone();
            s.spawn(move || dev.write_at(chunk, (i as u64) << 24).unwrap());
        }
    });
    dev.flush().unwrap();
    let fs = Fs::from_device(dev.clone(), Options { writable: true, ..Options::default() }).unwrap();
    parallel_changes(&fs);
    drop(fs);
    // Copy out and judge.
    let mut out = vec![0u8; bytes.len()];
    dev.read_at(&mut out, 0).unwrap();
    let copy = dir.path().join("out.img");
    std::fs::write(&copy, &out).unwrap();
    e2fsck_clean(&copy);
    check_parallel_changes(&Fs::open(&copy).unwrap());
    // Reads past the end are refused before they reach the server.
    assert!(dev.read_at(&mut [0u8; 2], (64 << 20) - 1).is_err());
}

#[test]
fn qemu_nbd_qcow2_with_gpt_partitions() {
    require_tool!("qemu-nbd");
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let script = "label: gpt\nsize=24MiB, type=linux, name=root\nsize=24MiB, type=linux, name=data\n";
    let (raw, parts) = partitioned_disk(dir.path(), "raw.img", 52, script);
    fill_ext4(&raw, parts[0].0, parts[0].1, "root");
    fill_ext4(&raw, parts[1].0, parts[1].1, "data");
    let qcow = dir.path().join("disk.qcow2");
    let st = Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&qcow)
        .status()
        .unwrap();
    assert!(st.success());
    {
        let mut srv = NbdServe::qemu_nbd(&qcow, "qcow2");
        change(&rw(&format!("{}@1", srv.uri("", ""))), "one");
        change(&rw(&format!("{}@data", srv.uri("", ""))), "two");
        srv.terminate();
    }
    let back = dir.path().join("back.img");
    let st = Command::new("qemu-img")
        .args(["convert", "-f", "qcow2", "-O", "raw"])
        .arg(&qcow)
        .arg(&back)
        .status()
        .unwrap();
    assert!(st.success());
    check_partition(&back, parts[0].0, parts[0].1, "one");
    check_partition(&back, parts[1].0, parts[1].1, "two");
}

#[test]
fn read_only_export_refuses_a_writer() {
    require_tool!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    Image::ext4("32M").build(&img);
    let srv = NbdServe::nbdkit(Listen::Unix, &["-r", "file", img.to_str().unwrap()]);
    let uri = srv.uri("", "");
    let e = Fs::open_with(&uri, Options { writable: true, ..Options::default() })
        .err()
        .expect("read-only export");
    assert_eq!(e.errno(), libc::EROFS, "{e}");
    assert!(Fs::open(&uri).unwrap().read_dir("/").is_ok());
    // A server that is not there.
    assert!(Fs::open(format!("nbd+unix:///?socket={}", dir.path().join("none.sock").display())).is_err());
}

#[test]
fn failing_writes_abort_the_journal_and_nothing_is_lost() {
    require_tool!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    Image::ext4("64M").build(&img);
    let trigger = dir.path().join("fail-now");
    let srv = NbdServe::nbdkit(
        Listen::Unix,
        &[
            "--filter=error",
            "file",
            img.to_str().unwrap(),
            "error=EIO",
            "error-pwrite-rate=100%",
            &format!("error-pwrite-file={}", trigger.display()),
        ],
    );
    let uri = srv.uri("", "");
    let fs = rw(&uri);
    fs.create_dir_all("/kept").unwrap();
    for i in 0..20 {
        fs.write_file(format!("/kept/f{i}"), vec![i as u8; 5000]).unwrap();
    }
    fs.sync().unwrap();
    // From now on every write fails on the server.
    std::fs::write(&trigger, b"").unwrap();
    let mut failed = None;
    for i in 0..200 {
        let r = fs.write_file(format!("/kept/lost{i}"), vec![1u8; 20000]).and_then(|()| fs.sync());
        if let Err(e) = r {
            failed = Some(e);
            break;
        }
    }
    let e = failed.expect("a failing server must fail sync");
    assert_eq!(e.errno(), libc::EIO, "{e}");
    let after = fs.write_file("/kept/after", b"x").expect_err("the journal aborted");
    assert!(matches!(after.errno(), libc::EROFS | libc::EIO), "{after}");
    drop(fs);
    std::fs::remove_file(&trigger).unwrap();
    // Recovery through the server: everything synced is there, and the image is clean.
    let fs = rw(&uri);
    for i in 0..20 {
        assert_eq!(fs.read_file(format!("/kept/f{i}")).unwrap(), vec![i as u8; 5000]);
    }
    fs.unmount().unwrap();
    drop(fs);
    drop(srv);
    e2fsck_clean(&img);
}

#[test]
fn a_silent_server_times_out() {
    require_tool!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    Image::ext4("32M").build(&img);
    let srv = NbdServe::nbdkit(Listen::Unix, &["--filter=delay", "file", img.to_str().unwrap(), "rdelay=5"]);
    let t = std::time::Instant::now();
    let e = Fs::open(srv.uri("", "timeout=0.5")).err().expect("reads time out");
    assert!(t.elapsed() < std::time::Duration::from_secs(4), "timed out late: {:?}", t.elapsed());
    assert!(matches!(e, Error::Io(ref io) if io.kind() == std::io::ErrorKind::TimedOut), "{e}");
}

#[test]
fn a_dropped_connection_fails_writes_and_recovers_through_the_server() {
    require_tool!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    Image::ext4("64M").build(&img);
    let mut srv = NbdServe::nbdkit(Listen::Unix, &["file", img.to_str().unwrap()]);
    let uri = srv.uri("", "");
    let fs = rw(&uri);
    fs.create_dir_all("/d").unwrap();
    fs.write_file("/d/synced", vec![7u8; 100_000]).unwrap();
    fs.sync().unwrap();
    fs.write_file("/d/unsynced", vec![8u8; 100_000]).unwrap();
    // The server dies with the filesystem open: the next commit fails, nothing hangs.
    srv.stop();
    let e = fs.sync().expect_err("sync without a server");
    assert_eq!(e.errno(), libc::EIO, "{e}");
    drop(fs);
    // A new server on the same file: recovery replays what was committed.
    let srv = NbdServe::nbdkit(Listen::Unix, &["file", img.to_str().unwrap()]);
    let fs = rw(&srv.uri("", ""));
    assert_eq!(fs.read_file("/d/synced").unwrap(), vec![7u8; 100_000]);
    fs.unmount().unwrap();
    drop(fs);
    drop(srv);
    e2fsck_clean(&img);
}

/// A commit block goes out as one FUA write after a flush of what it commits, where the
/// server offers FUA (nbdkit's log filter records each request and its flags).
#[test]
fn commit_block_is_a_fua_write() {
    require_tool!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    let log = dir.path().join("nbd.log");
    Image::ext4("64M").build(&img);
    let logfile = format!("logfile={}", log.display());
    let mut srv = NbdServe::nbdkit(Listen::Unix, &["--filter=log", "file", img.to_str().unwrap(), &logfile]);
    let fs = rw(&srv.uri("", ""));
    fs.write_file("/f", vec![7u8; 10_000]).unwrap();
    fs.sync().unwrap();
    fs.unmount().unwrap();
    drop(fs);
    srv.terminate();
    let text = std::fs::read_to_string(&log).unwrap();
    let fua = text.lines().filter(|l| l.contains("Write") && l.contains("fua=1")).count();
    assert!(fua >= 1, "no FUA write in the server's log:\n{text}");
    e2fsck_clean(&img);
    assert_eq!(Fs::open(&img).unwrap().read_file("/f").unwrap(), vec![7u8; 10_000]);
}
