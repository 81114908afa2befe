//! bigalloc images written through the mount: a generated tree (big directory, sparse and
//! fallocated files, punched holes, xattrs, links) made and then changed through rext4's
//! daemon must be the tree the same steps make on the host, and what kernel ext4 shows.

use super::*;
use std::sync::OnceLock;

static SOURCE: OnceLock<SourceTree> = OnceLock::new();

#[test]
fn bigalloc_tree_written_through_the_mount_matches_kernel() {
    require_fuse!();
    let spec = TreeSpec { kernel_extras: true, ..TreeSpec::medium() };
    let src = mutated_source_tree(&SOURCE, "fuse-bigalloc", spec);
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("1G").features("bigalloc").args(["-C", "65536"]).build_in(dir.path(), "b.img");
    assert_features(&img, &["bigalloc"], &[]);
    let m = FuseMount::new(&img, "rw");
    generate(m.path(), &src.spec);
    mutate(m.path(), &src.spec);
    let seen = walk_kernel(m.path());
    assert_no_diff("mount vs source tree", &diff_source(&src.walk, &seen, SourceCmp { mtime_ns: true }));
    unmount_and_compare(m, &img);
}
