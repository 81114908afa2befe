//! The command on addresses other than a plain file: NBD exports (`nbd+unix://`, `nbd://`)
//! served by nbdkit, and partitions (`disk.img@1`, `nbd://.../@root`). A copy into an
//! export killed midway recovers through the server. Skipped (with a note) where nbdkit is
//! missing, a failure under `REXT4_REQUIRE_MOUNT=1`.

use rext4_testkit::{e2fsck_clean, require_tool, tool, Image, Listen, NbdServe};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn rext4(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rext4")).args(args).output().expect("run rext4")
}

fn ok(args: &[&str]) -> String {
    let o = rext4(args);
    assert!(o.status.success(), "rext4 {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// A GPT disk of 40 MiB whose partition 1 ("root") holds an ext4 filesystem; returns the
/// partition's offset and length.
fn gpt_disk(img: &Path) -> (u64, u64) {
    std::fs::File::create(img).unwrap().set_len(40 << 20).unwrap();
    let mut c = Command::new(tool("sfdisk"))
        .arg("--quiet")
        .arg(img)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::io::Write::write_all(c.stdin.as_mut().unwrap(), b"label: gpt\nsize=32MiB, type=linux, name=root\n")
        .unwrap();
    drop(c.stdin.take());
    assert!(c.wait().unwrap().success());
    let (start, len) = (1u64 << 20, 32u64 << 20);
    let dir = tempfile::tempdir().unwrap();
    let part = dir.path().join("p.img");
    Image::ext4("32M").build(&part);
    let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &std::fs::read(&part).unwrap(), start).unwrap();
    (start, len)
}

fn e2fsck_part(img: &Path, start: u64, len: u64) {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy.img");
    let f = std::fs::File::open(img).unwrap();
    let mut buf = vec![0u8; len as usize];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, start).unwrap();
    std::fs::write(&copy, buf).unwrap();
    e2fsck_clean(&copy);
}

#[test]
fn commands_take_nbd_and_partition_addresses() {
    require_tool!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    let (start, len) = gpt_disk(&img);
    let host = dir.path().join("hello.txt");
    std::fs::write(&host, b"over the network\n").unwrap();

    // A partition of a file.
    let part = format!("{}@root", img.display());
    assert!(ok(&["info", &part]).contains("Filesystem magic number:  0xEF53"));
    ok(&["mkdir", &format!("{part}:/local")]);
    ok(&["cp", host.to_str().unwrap(), &format!("{part}:/local/hello.txt")]);

    // The same partition of the disk served by nbdkit, over a Unix socket and TCP.
    for listen in [Listen::Unix, Listen::Tcp] {
        let mut srv = NbdServe::nbdkit(listen, &["file", img.to_str().unwrap()]);
        let addr = format!("{}@1", srv.uri("", ""));
        assert!(ok(&["info", &addr]).contains("0xEF53"));
        assert_eq!(ok(&["cat", &format!("{addr}:/local/hello.txt")]), "over the network\n");
        ok(&["mkdir", "-p", &format!("{addr}:/remote")]);
        ok(&["cp", host.to_str().unwrap(), &format!("{addr}:/remote/hello.txt")]);
        assert!(ok(&["ls", &format!("{addr}:/remote")]).contains("hello.txt"));
        assert!(ok(&["ls", &addr]).contains("local"), "an address without :/path lists the root");
        let out = dir.path().join("out");
        std::fs::create_dir_all(&out).unwrap();
        ok(&["cp", "-r", &format!("{addr}:/remote"), out.to_str().unwrap()]);
        assert_eq!(std::fs::read(out.join("remote/hello.txt")).unwrap(), b"over the network\n");
        std::fs::remove_dir_all(&out).unwrap();
        srv.terminate();
    }
    e2fsck_part(&img, start, len);
    // Errors name the address.
    let o = rext4(&["ls", &format!("{}@7:/", img.display())]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("no partition"));
}

#[test]
fn an_import_killed_midway_recovers_through_the_server() {
    require_tool!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    Image::ext4("512M").build(&img);
    let src = dir.path().join("src");
    for d in 0..8 {
        std::fs::create_dir_all(src.join(format!("d{d}"))).unwrap();
        for f in 0..40 {
            std::fs::write(src.join(format!("d{d}/f{f}")), vec![(d * 40 + f) as u8; 300_000]).unwrap();
        }
    }
    // A slow server (20 ms a write, as over a long link) so the import is still going when
    // it is killed.
    let mut slow =
        NbdServe::nbdkit(Listen::Unix, &["--filter=delay", "file", img.to_str().unwrap(), "wdelay=20ms"]);
    let uri = slow.uri("", "");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rext4"))
        .args(["cp", "-r", "-q", src.to_str().unwrap(), &format!("{uri}:/import")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill it seven seconds (past the first commit) after it opened the image for writing (the superblock says the
    // journal is in use).
    let t = Instant::now();
    let journal_busy = || {
        let o = Command::new(tool("dumpe2fs")).arg("-h").arg(&img).output().unwrap();
        String::from_utf8_lossy(&o.stdout).contains("needs_recovery")
    };
    while t.elapsed() < Duration::from_secs(5) && !journal_busy() {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Some of the import on its way through the server.
    std::thread::sleep(Duration::from_secs(7));
    let finished = child.try_wait().unwrap().is_some();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!finished, "the import finished before it could be killed; make it bigger");
    slow.stop();
    // Reading recovers in memory; writing recovers through the server.
    let srv = NbdServe::nbdkit(Listen::Unix, &["file", img.to_str().unwrap()]);
    let uri = srv.uri("", "");
    ok(&["ls", &format!("{uri}:/")]);
    ok(&["mkdir", &format!("{uri}:/after")]);
    drop(srv);
    e2fsck_clean(&img);
    // Whatever made it before the kill holds its own bytes, never another file's: each
    // file's bytes are its own value (zeros where a file's data had not been written yet).
    let at = |p: &str| format!("{}:{p}", img.display());
    let dirs = rext4(&["ls", &at("/import")]);
    let dirs = String::from_utf8_lossy(&dirs.stdout).into_owned();
    let mut seen = 0;
    for d in dirs.split_whitespace().filter(|n| n.starts_with('d')) {
        let base = d[1..].parse::<u32>().unwrap() * 40;
        for name in ok(&["ls", &at(&format!("/import/{d}"))]).split_whitespace() {
            // As the source was written: the value wraps at 256.
            let want = (base + name[1..].parse::<u32>().unwrap()) as u8;
            let data = rext4(&["cat", &at(&format!("/import/{d}/{name}"))]).stdout;
            assert!(data.iter().all(|&b| b == want || b == 0), "{d}/{name} holds another file's bytes");
            seen += 1;
        }
    }
    eprintln!("{seen} files of 320 made it before the kill");
}
