//! Byte strings kept inside their owner up to a size, on the heap beyond it: cached names and
//! inode records, so that the common case reads the owner's cache lines and no others.

/// Up to `N` bytes inline (`N` below 65,536), else boxed.
pub(crate) enum InlineBytes<const N: usize> {
    Inline(u16, [u8; N]),
    Heap(Box<[u8]>),
}

impl<const N: usize> InlineBytes<N> {
    pub(crate) fn new(bytes: &[u8]) -> Self {
        match u16::try_from(bytes.len()) {
            Ok(len) if bytes.len() <= N => {
                let mut inline = [0u8; N];
                inline[..bytes.len()].copy_from_slice(bytes);
                InlineBytes::Inline(len, inline)
            }
            _ => InlineBytes::Heap(bytes.into()),
        }
    }

    /// `len` zero bytes.
    pub(crate) fn zeroed(len: usize) -> Self {
        match u16::try_from(len) {
            Ok(short) if len <= N => InlineBytes::Inline(short, [0u8; N]),
            _ => InlineBytes::Heap(vec![0u8; len].into_boxed_slice()),
        }
    }
}

impl<const N: usize> std::ops::Deref for InlineBytes<N> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            InlineBytes::Inline(len, bytes) => &bytes[..usize::from(*len)],
            InlineBytes::Heap(b) => b,
        }
    }
}

impl<const N: usize> std::ops::DerefMut for InlineBytes<N> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            InlineBytes::Inline(len, bytes) => &mut bytes[..usize::from(*len)],
            InlineBytes::Heap(b) => b,
        }
    }
}

#[cfg(test)]
// Fixtures are built from small known values; a narrowing cast there is the clearest form.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
mod tests {
    use super::*;

    #[test]
    fn inline_up_to_n_then_heap() {
        for len in [0, 1, 7, 8, 9, 300] {
            let v: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut b = InlineBytes::<8>::new(&v);
            assert_eq!(&*b, &v[..]);
            let z = InlineBytes::<8>::zeroed(len);
            assert_eq!((z.len(), z.iter().all(|&x| x == 0)), (len, true));
            assert_eq!(matches!(z, InlineBytes::Inline(..)), len <= 8);
            assert_eq!(matches!(b, InlineBytes::Inline(..)), len <= 8);
            if len > 0 {
                b[0] = 0xAA;
                assert_eq!(b[0], 0xAA);
                assert_eq!(b.len(), len);
            }
        }
    }
}
