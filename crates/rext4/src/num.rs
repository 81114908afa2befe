//! Integer conversions that are lossless where the cast lints cannot tell.

// The engine is built for 64-bit targets only: there every u64 offset or size fits a usize.
const _: () = assert!(usize::BITS == u64::BITS, "rext4 supports 64-bit targets only");

/// `x` as a `usize`, lossless as usize is 64 bits wide (asserted above). Values from the image
/// still need checking against whatever they index; they just cannot wrap here.
#[inline]
#[allow(clippy::cast_possible_truncation)]
pub(crate) const fn usize_from(x: u64) -> usize {
    x as usize
}
