//! A device that shows some blocks from memory over another device: how a journal is replayed
//! for a read-only open without touching the image. A copy-on-write overlay also takes writes,
//! into memory, for a replay that needs a writable filesystem (fast commits).

use crate::dev::BlockDevice;
use crate::num::usize_from;
use crate::sync::RwLock;
use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;

/// `base` with whole blocks replaced by in-memory copies. Writes fail unless the overlay is
/// copy-on-write ([`OverlayDevice::copy_on_write`]); `base` is never written.
pub struct OverlayDevice {
    base: Arc<dyn BlockDevice>,
    /// Block number -> contents (exactly `block_size` bytes each). [own lock; read-mostly]
    blocks: RwLock<BTreeMap<u64, Box<[u8]>>>,
    block_size: u64,
    /// Whether writes go into `blocks`. [immutable]
    cow: bool,
}

impl OverlayDevice {
    /// Overlays `blocks` (block number -> contents) on `base`, in units of `block_size` bytes.
    /// Blocks whose contents are not `block_size` bytes long, or that lie past the end of
    /// `base`, are refused.
    pub fn new(
        base: Arc<dyn BlockDevice>,
        blocks: BTreeMap<u64, Box<[u8]>>,
        block_size: u32,
    ) -> io::Result<Self> {
        let bs = u64::from(block_size);
        let size = base.size();
        let fits = |n: u64, b: &[u8]| {
            b.len() as u64 == bs
                && n.checked_mul(bs).and_then(|o| o.checked_add(bs)).is_some_and(|e| e <= size)
        };
        if bs == 0 || !blocks.iter().all(|(&n, b)| fits(n, b)) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "overlay block out of range"));
        }
        Ok(OverlayDevice { base, blocks: RwLock::new(blocks), block_size: bs, cow: false })
    }

    /// An overlay of nothing yet that keeps every write in memory.
    pub fn copy_on_write(base: Arc<dyn BlockDevice>, block_size: u32) -> io::Result<Self> {
        let mut dev = Self::new(base, BTreeMap::new(), block_size)?;
        dev.cow = true;
        Ok(dev)
    }

    /// Where `len` bytes from `offset` end, if they lie in the device.
    fn end_of(&self, offset: u64, len: usize) -> io::Result<u64> {
        Ok(offset
            .checked_add(len as u64)
            .filter(|&e| e <= self.size())
            .ok_or(io::ErrorKind::UnexpectedEof)?)
    }

    /// Number of blocks served from memory.
    pub fn len(&self) -> usize {
        self.blocks.read().len()
    }

    /// Whether no block is overlaid.
    pub fn is_empty(&self) -> bool {
        self.blocks.read().is_empty()
    }
}

impl BlockDevice for OverlayDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let end = self.end_of(offset, buf.len())?;
        let bs = self.block_size;
        let (first, last) = (offset / bs, (end - 1) / bs);
        let blocks = self.blocks.read();
        let overlaid = blocks.range(first..=last);
        // Read the base only if some block of the range is not in memory.
        if overlaid.clone().count() as u64 != last - first + 1 {
            self.base.read_at(buf, offset)?;
        }
        for (&n, data) in overlaid {
            // The part of block n inside [offset, end), as offsets into the block and buf.
            let start = n * bs;
            let lo = start.max(offset);
            let hi = (start + bs).min(end);
            let src = &data[usize_from(lo - start)..usize_from(hi - start)];
            buf[usize_from(lo - offset)..usize_from(hi - offset)].copy_from_slice(src);
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if !self.cow {
            return Err(io::Error::new(io::ErrorKind::ReadOnlyFilesystem, "overlay device is read-only"));
        }
        if buf.is_empty() {
            return Ok(());
        }
        let end = self.end_of(offset, buf.len())?;
        let bs = self.block_size;
        // One lock over the whole write: two writes into one block must not lose either.
        let mut blocks = self.blocks.write();
        for n in offset / bs..=(end - 1) / bs {
            let start = n * bs;
            let (lo, hi) = (start.max(offset), (start + bs).min(end));
            let block = match blocks.entry(n) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    let mut b = vec![0u8; usize_from(bs)].into_boxed_slice();
                    if hi - lo != bs {
                        self.base.read_at(&mut b, start)?;
                    }
                    e.insert(b)
                }
            };
            block[usize_from(lo - start)..usize_from(hi - start)]
                .copy_from_slice(&buf[usize_from(lo - offset)..usize_from(hi - offset)]);
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.base.size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemDevice;

    fn overlay() -> (Vec<u8>, OverlayDevice) {
        let base: Vec<u8> = (0..64u8).collect();
        let mut blocks = BTreeMap::new();
        blocks.insert(1u64, vec![0xA1; 16].into_boxed_slice());
        blocks.insert(2u64, vec![0xA2; 16].into_boxed_slice());
        let mut view = base.clone();
        view[16..32].fill(0xA1);
        view[32..48].fill(0xA2);
        let dev = OverlayDevice::new(Arc::new(MemDevice::new(base)), blocks, 16).unwrap();
        (view, dev)
    }

    #[test]
    fn every_range_reads_the_overlaid_view() {
        let (view, dev) = overlay();
        for off in 0..64usize {
            for len in 0..=64 - off {
                let mut b = vec![0u8; len];
                dev.read_at(&mut b, off as u64).unwrap();
                assert_eq!(b, view[off..off + len], "{off}+{len}");
            }
        }
        let mut b = [0u8; 2];
        assert!(dev.read_at(&mut b, 63).is_err());
        assert!(dev.read_at(&mut b, u64::MAX).is_err());
        assert!(dev.write_at(&b, 0).is_err());
        assert_eq!((dev.size(), dev.len()), (64, 2));
    }

    #[test]
    fn copy_on_write_keeps_writes_in_memory() {
        let base_bytes: Vec<u8> = (0..64u8).collect();
        let base: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(base_bytes.clone()));
        let dev = OverlayDevice::copy_on_write(base.clone(), 16).unwrap();
        let mut view = base_bytes.clone();
        dev.write_at(&[0xEE; 20], 10).unwrap();
        view[10..30].fill(0xEE);
        let mut b = vec![0u8; 64];
        dev.read_at(&mut b, 0).unwrap();
        assert_eq!(b, view);
        base.read_at(&mut b, 0).unwrap();
        assert_eq!(b, base_bytes, "the base is never written");
        assert_eq!(dev.len(), 2);
        assert!(dev.write_at(&[0], 64).is_err());
    }

    #[test]
    fn bad_blocks_are_refused() {
        let base: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(vec![0; 64]));
        let one = |n: u64, len: usize| {
            let mut m = BTreeMap::new();
            m.insert(n, vec![0u8; len].into_boxed_slice());
            OverlayDevice::new(base.clone(), m, 16).is_ok()
        };
        assert!(one(3, 16));
        assert!(!one(4, 16));
        assert!(!one(0, 15));
        assert!(!one(u64::MAX, 16));
    }
}
