//! The README's examples as a user would run them: every `rext4` line of "The command", in
//! order, on an image made here, each succeeding, the image clean under e2fsck at the end.

use rext4_testkit::{e2fsck_clean, Image};
use std::path::Path;
use std::process::Command;

const README: &str = include_str!("../../../../README.md");

/// The `rext4 ...` command lines of the first `sh` block after `heading`, comments cut.
fn commands(heading: &str) -> Vec<Vec<String>> {
    let section = README.split(heading).nth(1).expect("section in the README");
    let block = section.split("```sh\n").nth(1).and_then(|b| b.split("```").next()).expect("sh block");
    block
        .lines()
        .filter(|l| l.starts_with("rext4 "))
        .map(|l| l.split(" #").next().unwrap_or(l).split_whitespace().map(str::to_string).collect())
        .collect()
}

fn write(p: &Path, data: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

#[test]
fn the_first_steps_say_how_to_get_started() {
    let first = README.split("## Status").next().unwrap();
    assert!(first.contains("cargo install --path crates/rext4-cli"), "how to put rext4 on PATH");
    assert!(first.contains("mkfs.ext4"), "how to make disk.img");
    assert!(first.contains("As root, or with `sudo`"), "runs where there is no sudo");
}

#[test]
fn the_command_examples_run_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("tree");
    for (f, data) in [
        ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
        ("etc/shadow", "root:*:19000:0:99999:7:::\n"),
        ("etc/motd", "welcome\n"),
        ("usr/bin/env", "#!/bin/sh\n"),
        ("home/user/notes", "notes\n"),
    ] {
        write(&src.join(f), data);
    }
    write(&dir.path().join("site/index.html"), "<p>hello</p>\n");
    std::fs::write(dir.path().join("k.bin"), [0x5au8; 64]).unwrap();
    let img = dir.path().join("disk.img");
    Image::ext4("64M").from_dir(&src).build(&img);

    let cmds = commands("## The command");
    assert!(cmds.len() > 15, "{cmds:?}");
    for args in &cmds {
        // stats needs a mount: it has tests of its own.
        if args.get(1).map(String::as_str) == Some("stats") {
            continue;
        }
        let o = Command::new(env!("CARGO_BIN_EXE_rext4"))
            .args(&args[1..])
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr));
    }
    e2fsck_clean(&img);
    e2fsck_clean(&dir.path().join("q.img"));
    e2fsck_clean(&dir.path().join("e.img"));
}
