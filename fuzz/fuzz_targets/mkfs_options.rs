//! `Fs::format` over any options: the input picks the type, sizes (image, block, cluster,
//! inode, inode ratio and count, blocks per group, journal and fast-commit area, orphan file,
//! growth room), features on and off and the extended options. Each is worked out with
//! `dry_run` over a device of that size (nothing is written, so sizes up to 64 GiB are cheap);
//! one that fits in 8 MiB is also made in memory, opened writable, changed and walked. A
//! refusal is fine; a panic or hang is the fuzzer's to report.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rext4_fuzz::mkfs_options(data);
});
