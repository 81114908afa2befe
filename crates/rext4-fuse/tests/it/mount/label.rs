//! The volume label through the mount (`FS_IOC_GETFSLABEL`/`SETFSLABEL`, `xfs_io -c label`)
//! against kernel ext4: the same answers, and the image's label as `e2label` reads it.

use super::*;
use std::path::Path;

fn xfs_io(root: &Path, cmd: &str, nobody: bool) -> String {
    let script = format!("xfs_io -c '{cmd}' {} 2>&1", root.display());
    let (ok, out) = if nobody {
        as_nobody(&script)
    } else {
        let o = std::process::Command::new("sh").args(["-c", &script]).output().unwrap();
        (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned())
    };
    format!("{cmd}{}: {ok} {}", if nobody { " (nobody)" } else { "" }, out.trim())
}

fn label_steps(root: &Path) -> String {
    [
        xfs_io(root, "label", false),
        xfs_io(root, "label -s renamed", false),
        xfs_io(root, "label", false),
        xfs_io(root, "label -s sixteen-bytes-ok", false),
        xfs_io(root, "label -s seventeen-bytes!!", false),
        xfs_io(root, "label -s other", true),
        xfs_io(root, "label -s final", false),
    ]
    .join("\n")
}

fn e2label(img: &Path) -> String {
    let o = std::process::Command::new("e2label").arg(img).output().unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[test]
fn labels_as_kernel_ext4() {
    require_fuse!();
    require_kernel!();
    if find_tool("xfs_io").is_none() {
        eprintln!("SKIP: xfs_io is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fimg = Image::ext4("32M").args(["-L", "first"]).build_in(dir.path(), "fuse.img");
    let kimg = Image::ext4("32M").args(["-L", "first"]).build_in(dir.path(), "kernel.img");

    let m = FuseMount::new(&fimg, "rw,allow_other");
    let fuse = label_steps(m.path());
    unmount_and_compare(m, &fimg);
    let k = KernelMount::rw(&kimg).expect("kernel mount");
    let kernel = label_steps(k.path());
    k.unmount().unwrap();
    e2fsck_clean(&kimg);

    assert!(fuse.starts_with("label: true label = \"first\""), "{fuse}");
    assert_eq!(fuse, kernel, "the mount against kernel ext4");
    assert_eq!(e2label(&fimg), "final");
    assert_eq!(e2label(&fimg), e2label(&kimg));
}
