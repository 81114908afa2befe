//! The engine over corrupted images: a valid image made with mkfs.ext4 at fuzz start, patched
//! by the input (see `rext4_fuzz::patched_image` for the layout), opened through a MemDevice
//! and walked completely. Run with a timeout (`-timeout=10`) so hangs are reported too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((img, _)) = rext4_fuzz::patched_image(data) {
        rext4_fuzz::open_and_walk(img);
    }
});
