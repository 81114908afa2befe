//! `e2fsck`: the judge of every image a test leaves behind.

use crate::tools::{out_text, run, tool};
use std::path::Path;
use std::process::Command;

/// Asserts `e2fsck -fn img` finds nothing to fix.
pub fn e2fsck_clean(img: &Path) {
    let o = run(Command::new(tool("e2fsck")).arg("-fn").arg(img));
    assert_eq!(o.status.code(), Some(0), "e2fsck -fn {} is not clean:\n{}", img.display(), out_text(&o));
}

/// `e2fsck -fyD`: rebuilds every directory, turning big ones into htree (hash-indexed)
/// directories, which `mkfs.ext4 -d` does not build by itself.
pub fn e2fsck_reindex(img: &Path) {
    let o = run(Command::new(tool("e2fsck")).arg("-fyD").arg(img));
    assert!(
        matches!(o.status.code(), Some(0) | Some(1)),
        "e2fsck -fyD {} failed:\n{}",
        img.display(),
        out_text(&o)
    );
}
