//! Shared fixtures of the rext4 integration tests: an image builder over `mkfs.ext4`, the
//! e2fsprogs and kernel-mount oracles, a deterministic source-tree generator, walkers that
//! describe a tree as the kernel and as rext4 see it, and diffs between those descriptions.
//!
//! Oracles: the source tree (bytes, modes, owners, xattrs, link targets, hard-link groups), the
//! Linux kernel's ext4 driver (everything `lstat`/`statx`/`getxattr`/`FS_IOC_GETFLAGS` report,
//! incl. inode numbers and nanosecond times) and `e2fsck -fn` (the fixtures themselves).
//!
//! Tests that need a kernel loop mount or a FUSE mount start with [`require_kernel!`] or
//! [`require_fuse!`]: without one (not root, no loop devices, no `/dev/fuse`) the test returns
//! early saying why, and with `REXT4_REQUIRE_MOUNT=1` it fails instead, so a run that is
//! meant to cover the kernel comparisons cannot pass by skipping them.
//!
//! Generated source trees live in `<target>/tmp/rext4-trees/` (one per spec, regenerated on
//! every run); images and mount points are temporary directories.

// Test support: fixtures from small known values and the host's own numbers; the cast lints
// are for the code that reads images.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod checks;
mod crash;
mod device;
mod diff;
mod digest;
mod fsck;
mod fscrypt;
mod fuse;
mod image;
mod inspect;
mod kernel;
mod nbd;
mod rng;
mod source;
mod spec;
mod tools;
mod tree;
mod vm;
mod walk;

pub use checks::{concurrent_walks, readdir_resume, unlink_all};
pub use crash::{flush_count, for_each_crash_image};
pub use device::HookedDevice;
pub use diff::{assert_no_diff, diff_full, diff_source, statfs_diff, Report, SourceCmp};
pub use digest::{digest, sample_windows, Digest, CONTENT_LIMIT};
pub use fsck::{e2fsck_clean, e2fsck_reindex};
pub use fscrypt::{fscrypt_add_key, fscrypt_set_policy, why_no_fscrypt};
pub use fuse::{fuse_available, why_no_fuse};
pub use image::Image;
pub use inspect::{
    assert_features, extent_count, extent_depth, features, htree_levels, layout, quota_usage, sb_field,
};
pub use kernel::{kernel_can_mount, skip_note, why_no_kernel_mount, KernelMount};
pub use nbd::{why_no_tool, Listen, NbdServe};
pub use rng::Rng;
pub use source::{check_fixture, mutated_source_tree, source_tree, SourceTree};
pub use spec::{paths, TreeSpec};
pub use tools::{debugfs_write, find_tool, is_root, tool};
pub use tree::{generate, mutate, name_of_len, vfs_acl};
pub use vm::{vm_run, why_no_vm, VmRun};
pub use walk::{show, walk_kernel, walk_rext4, Kind, Rec, Walk};
