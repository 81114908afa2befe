//! Content digests: whole files, or sample windows of the huge ones.

/// A content digest: length plus two independent 64-bit hashes (of the whole file, or of
/// sample windows for files over [`CONTENT_LIMIT`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Digest {
    pub len: u64,
    pub h: [u64; 2],
}

/// Files larger than this are compared by sample windows, not in full.
pub const CONTENT_LIMIT: u64 = 64 << 20;

fn mix(mut h: u64, w: u64) -> u64 {
    h ^= w;
    h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ (h >> 29)
}

struct Hasher([u64; 2]);

impl Hasher {
    fn new() -> Hasher {
        Hasher([0x1234_5678_9abc_def0, 0x0fed_cba9_8765_4321])
    }
    fn feed(&mut self, data: &[u8]) {
        let mut it = data.chunks_exact(8);
        for c in it.by_ref() {
            let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            self.0[0] = mix(self.0[0], w);
            self.0[1] = mix(self.0[1].rotate_left(17), w ^ 0xa5a5_a5a5_a5a5_a5a5);
        }
        let mut last = [0u8; 8];
        let r = it.remainder();
        last[..r.len()].copy_from_slice(r);
        self.0[0] = mix(self.0[0], u64::from_le_bytes(last) ^ ((r.len() as u64) << 59));
        self.0[1] = mix(self.0[1], u64::from_le_bytes(last).rotate_left(7) ^ r.len() as u64);
    }
}

/// Digest of a whole buffer.
pub fn digest(data: &[u8]) -> Digest {
    let mut h = Hasher::new();
    h.feed(data);
    Digest { len: data.len() as u64, h: h.0 }
}

/// The sample windows read from a file over [`CONTENT_LIMIT`]: the first and last MiB, and
/// 128 KiB around every power of two.
pub fn sample_windows(size: u64) -> Vec<(u64, u64)> {
    let mut w = vec![(0, 1 << 20)];
    let mut k = 21;
    while (1u64 << k) < size {
        w.push(((1u64 << k) - (64 << 10), 128 << 10));
        k += 1;
    }
    w.push((size.saturating_sub(1 << 20), 1 << 20));
    w.into_iter().map(|(o, l)| (o, l.min(size - o.min(size)))).collect()
}

pub(crate) fn digest_windows(
    size: u64,
    mut read_at: impl FnMut(u64, &mut [u8]) -> Result<(), String>,
) -> Result<Digest, String> {
    let mut h = Hasher::new();
    for (off, len) in sample_windows(size) {
        let mut buf = vec![0u8; len as usize];
        read_at(off, &mut buf)?;
        h.feed(&off.to_le_bytes());
        h.feed(&buf);
    }
    Ok(Digest { len: size, h: h.0 })
}
