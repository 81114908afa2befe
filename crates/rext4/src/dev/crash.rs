//! A device that records every write and flush, so that tests can rebuild the image a crash
//! would leave at any point: everything written before the last completed flush, plus any
//! subset of the writes after it (disks reorder and drop unflushed writes).
//!
//! It can also fail every write after a given count, to test what an I/O error does.

use crate::dev::{BlockDevice, MemDevice};
use crate::sync::Mutex;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// Granularity at which unflushed writes survive or vanish in a crash image.
const PIECE: usize = 1024;

/// One recorded device operation.
#[derive(Clone, Debug)]
pub enum Op {
    Write { offset: u64, data: Vec<u8> },
    Flush,
}

pub struct CrashDevice {
    initial: Vec<u8>,
    current: MemDevice,
    /// Every operation in completion order. [own lock]
    log: Mutex<Vec<Op>>,
    /// Writes left before writes start failing (`u64::MAX`: never). [atomic]
    fail_after: AtomicU64,
    /// Bytes where every write fails (a bad stretch of the media), empty if none. [own lock]
    fail_in: Mutex<std::ops::Range<u64>>,
}

impl CrashDevice {
    pub fn new(image: Vec<u8>) -> Self {
        CrashDevice {
            current: MemDevice::new(image.clone()),
            initial: image,
            log: Mutex::new(Vec::new()),
            fail_after: AtomicU64::new(u64::MAX),
            fail_in: Mutex::new(0..0),
        }
    }

    /// Makes every write after the next `n` fail with EIO.
    pub fn fail_writes_after(&self, n: u64) {
        self.fail_after.store(n, Ordering::SeqCst);
    }

    /// Makes every write that touches a byte in `bytes` fail with EIO; others go on.
    pub fn fail_writes_in(&self, bytes: std::ops::Range<u64>) {
        *self.fail_in.lock() = bytes;
    }

    /// Number of operations so far (a position in the log).
    pub fn position(&self) -> usize {
        self.log.lock().len()
    }

    /// A copy of the operation log.
    pub fn ops(&self) -> Vec<Op> {
        self.log.lock().clone()
    }

    /// The current contents (as if every write had reached the media).
    pub fn snapshot(&self) -> Vec<u8> {
        self.current.snapshot()
    }

    /// The image at the start, before any recorded operation.
    pub fn initial(&self) -> &[u8] {
        &self.initial
    }
}

/// Applies `ops[from..to]` to `image`, keeping the writes for which `keep` says yes.
pub fn apply(image: &mut [u8], ops: &[Op], from: usize, to: usize, mut keep: impl FnMut(usize) -> bool) {
    for (i, op) in ops.iter().enumerate().take(to).skip(from) {
        if let Op::Write { offset, data } = op {
            if keep(i) {
                let o = crate::num::usize_from(*offset);
                image[o..o + data.len()].copy_from_slice(data);
            }
        }
    }
}

impl BlockDevice for CrashDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.current.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let left = self.fail_after.load(Ordering::SeqCst);
        let bad = self.fail_in.lock().clone();
        if left == 0 || (offset < bad.end && bad.start < offset + buf.len() as u64) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        if left != u64::MAX {
            self.fail_after.store(left - 1, Ordering::SeqCst);
        }
        let mut log = self.log.lock();
        self.current.write_at(buf, offset)?;
        // A large write may reach the media in part: record it in 1 KiB pieces, each of which
        // a crash may keep or lose.
        for (i, piece) in buf.chunks(PIECE).enumerate() {
            log.push(Op::Write { offset: offset + (i * PIECE) as u64, data: piece.to_vec() });
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.log.lock().push(Op::Flush);
        Ok(())
    }
    fn size(&self) -> u64 {
        self.current.size()
    }
}
