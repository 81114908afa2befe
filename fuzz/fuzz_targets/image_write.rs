//! The engine's write path over corrupted images: the `image_walk` input (see
//! `rext4_fuzz::patched_image`) opened writable, changed by every kind of operation on the
//! names the base image holds and on new ones, then unmounted. Errors are fine; a panic or a
//! hang (run with `-timeout=10`) is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((img, _)) = rext4_fuzz::patched_image(data) {
        // Half the inputs with quota limits enforced (where the image keeps quotas).
        rext4_fuzz::open_and_change(img, data.len() % 2 == 1);
    }
});
