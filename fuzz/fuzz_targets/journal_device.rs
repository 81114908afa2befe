//! Filesystems whose journal is on a device of its own (`-O journal_dev`, `-J device=`): a
//! crash image and its journal device, both corrupted (see `rext4_fuzz::patched_journal`),
//! opened with `Options::journal_path` read-only or writable (recovery reads the device's
//! superblock, the journal superblock and every log block), walked, and when writable
//! changed and unmounted. Errors are fine; a panic or a hang is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((img, journal, writable)) = rext4_fuzz::patched_journal(data) {
        rext4_fuzz::open_with_journal(img, &journal, writable);
    }
});
