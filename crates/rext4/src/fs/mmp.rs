//! Multi-mount protection (the `mmp` feature; the kernel's `fs/ext4/mmp.c`): an image on
//! storage that several machines see is written by one of them at a time.
//!
//! The MMP block holds a sequence number that the machine writing the filesystem changes every
//! update interval (`s_mmp_update_interval`). A writable open reads it first:
//! - `SEQ_CLEAN`: nobody has the filesystem; take it at once;
//! - `SEQ_FSCK`: e2fsck has it; refuse (`EBUSY`);
//! - anything else: someone had it, and may still. Wait two check intervals and a second
//!   (`wait_time`), read again, and refuse if it changed.
//!
//! Then a new random sequence number is written, and after `wait_time` more (none when the
//! block was clean) read back: a machine that took the filesystem meanwhile has changed it, and
//! the open is refused. From then on a thread (the kernel's `kmmpd`) writes the next number,
//! the time and this machine's name every update interval, and reads the block back before the
//! next one: if another machine has written it, the filesystem has been opened twice, and
//! every later write to the image fails (the device is fenced: [`MmpFence`]), so this side
//! changes nothing more. A clean close writes `SEQ_CLEAN` last, after the superblock says
//! clean. A process that dies leaves its last number, which the next open waits out.
//!
//! Read-only opens take no part, as the kernel's read-only mounts do not.
//!
//! The block is read and written with `O_DIRECT` where the device is a host file or block
//! device that allows it: another machine's writes reach the storage, not this machine's page
//! cache, which a buffered read would return stale. Elsewhere (storage that refuses `O_DIRECT`
//! at the block's offset, devices in memory or over the network) it goes through the device.
//!
//! Stricter than the kernel in one way: the kernel reads the block back only when an update
//! came late (more than a check interval after the last); this thread reads it back every
//! interval, so a machine that ignored the protocol (or cleared it with `tune2fs -E
//! clear_mmp`) is noticed within one.

use crate::dev::BlockDevice;
use crate::error::{Error, Result};
use crate::fs::super_block::SbInfo;
use crate::sync::{Condvar, Mutex};
use rext4_format::features::Incompat;
use rext4_format::mmp::{self as fmt, MmpBlock};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerocopy::IntoBytes;

/// How the block is read and written.
enum Io {
    /// A descriptor of its own on the host file, opened `O_DIRECT`, and the block's offset in
    /// it; the buffer is aligned for it by [`Aligned`].
    Direct(File, u64),
    /// Through the filesystem's device (before its fence).
    Device(Arc<dyn BlockDevice>, u64),
}

/// A block-sized buffer aligned to 4 KiB, as `O_DIRECT` wants, carved out of a larger
/// allocation (no unsafe code).
struct Aligned {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    const ALIGN: usize = 4096;
    fn new(len: usize) -> Self {
        let buf = vec![0u8; len + Self::ALIGN];
        let start = buf.as_ptr().align_offset(Self::ALIGN).min(Self::ALIGN);
        Aligned { buf, start, len }
    }
    fn get(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
    fn get_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

impl Io {
    /// A direct descriptor where the device's block lies in a host file that takes
    /// `O_DIRECT` reads at its offset; the device otherwise.
    fn new(dev: &Arc<dyn BlockDevice>, offset: u64, len: usize) -> Io {
        let direct = dev.host_range(offset, len as u64).and_then(|(fd, at)| {
            let file = reopen_direct(fd).ok()?;
            // Alignment of the offset depends on the storage's sector size: try it.
            let mut probe = Aligned::new(len);
            file.read_exact_at(probe.get_mut(), at).ok()?;
            Some(Io::Direct(file, at))
        });
        direct.unwrap_or_else(|| Io::Device(dev.clone(), offset))
    }

    fn read(&self, buf: &mut Aligned) -> io::Result<()> {
        match self {
            Io::Direct(f, at) => f.read_exact_at(buf.get_mut(), *at),
            Io::Device(d, at) => d.read_at(buf.get_mut(), *at),
        }
    }

    fn write(&self, buf: &Aligned) -> io::Result<()> {
        match self {
            Io::Direct(f, at) => f.write_all_at(buf.get(), *at),
            Io::Device(d, at) => d.write_at(buf.get(), *at),
        }
    }
}

/// A second open file on what `fd` is open on, with `O_DIRECT`.
fn reopen_direct(fd: BorrowedFd<'_>) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()))
}

/// Set once another machine is found writing the filesystem; every write through the
/// filesystem's device fails from then on (see [`FencedDevice`]). [atomic]
#[derive(Default)]
pub(crate) struct MmpFence {
    fenced: AtomicBool,
}

impl MmpFence {
    fn check(&self) -> io::Result<()> {
        if self.fenced.load(Ordering::Acquire) {
            return Err(io::Error::other(
                "writes stopped: the MMP block shows the filesystem open on another machine",
            ));
        }
        Ok(())
    }
}

/// The filesystem's device under multi-mount protection: writes pass while the fence is
/// open. Reads always pass.
pub(crate) struct FencedDevice {
    inner: Arc<dyn BlockDevice>,
    fence: Arc<MmpFence>,
}

impl BlockDevice for FencedDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.fence.check()?;
        self.inner.write_at(buf, offset)
    }
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        self.fence.check()?;
        self.inner.write_vectored_at(bufs, offset)
    }
    fn write_from_file(&self, src: &File, src_offset: u64, offset: u64, len: u64) -> io::Result<()> {
        self.fence.check()?;
        self.inner.write_from_file(src, src_offset, offset, len)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
    fn write_durable(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.fence.check()?;
        self.inner.write_durable(buf, offset)
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.fence.check()?;
        self.inner.discard(offset, len)
    }
    fn release_claim(&self) {
        self.inner.release_claim();
    }
    fn host_range(&self, offset: u64, len: u64) -> Option<(BorrowedFd<'_>, u64)> {
        self.inner.host_range(offset, len)
    }
}

/// What the thread and the filesystem share. [own lock]
struct State {
    /// Set by [`Mmp::stop`]: write `SEQ_CLEAN` and end.
    stop: bool,
    /// Why the thread fenced the device, once it has.
    conflict: Option<String>,
}

/// The protection of one writable open: started by [`Mmp::protect`], stopped by
/// [`Mmp::stop`] (also when dropped).
pub(crate) struct Mmp {
    shared: Arc<(Mutex<State>, Condvar)>,
    /// The updating thread. [own lock; taken by `stop`]
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// What the thread needs to write and check the block.
struct Writer {
    /// The MMP block's number, for errors.
    block: u64,
    io: Io,
    buf: Aligned,
    mmp: MmpBlock,
    seed: u32,
    csum: bool,
    update: Duration,
}

impl Writer {
    /// Reads the block: magic and checksum checked (`EFSCORRUPTED`, `EFSBADCRC` in the
    /// kernel; here the open's typed errors).
    fn read(&mut self) -> Result<MmpBlock> {
        let block = self.block;
        self.io.read(&mut self.buf)?;
        let m = MmpBlock::parse(self.buf.get()).ok_or_else(|| bad(block, "block shorter than 1 KiB"))?;
        if m.mmp_magic.get() != fmt::MMP_MAGIC {
            return Err(bad(block, "bad magic number"));
        }
        if !m.verify_checksum(self.seed, self.csum) {
            return Err(bad(block, "checksum mismatch"));
        }
        Ok(m)
    }

    /// Writes `self.mmp` with its checksum (the rest of the block kept as read).
    fn write(&mut self) -> io::Result<()> {
        self.mmp.update_checksum(self.seed, self.csum);
        self.buf.get_mut()[..fmt::MMP_SIZE].copy_from_slice(self.mmp.as_bytes());
        self.io.write(&self.buf)
    }

    fn stamp(&mut self, seq: u32) {
        self.mmp.mmp_seq.set(seq);
        self.mmp.mmp_time.set(u64::try_from(crate::fs::mount::now_secs()).unwrap_or(0));
    }
}

fn bad(block: u64, what: &str) -> Error {
    Error::Incompatible(format!("MMP block {block}: {what}"))
}

/// The check interval, seconds: `update` seconds times two, within the kernel's bounds.
fn check_interval(update: u64) -> u16 {
    let c = update.saturating_mul(u64::from(fmt::CHECK_MULT));
    u16::try_from(c).unwrap_or(u16::MAX).clamp(fmt::MIN_CHECK_INTERVAL, fmt::MAX_CHECK_INTERVAL)
}

/// How long an open waits to see whether a number moves (`wait_time` in
/// `ext4_multi_mount_protect`): twice the check interval and a second, at most the interval and
/// a minute. The check interval is the update interval, at least 5 s, or the one the block
/// advertises if longer, but no longer than any writer advertises (300 s): a damaged or
/// hostile block would otherwise hold the open for up to 18 hours.
fn wait_time(update_s: u16, advertised: u16) -> Duration {
    let advertised = advertised.min(fmt::MAX_CHECK_INTERVAL);
    let interval = u64::from(update_s.max(fmt::MIN_CHECK_INTERVAL).max(advertised));
    Duration::from_secs((interval * 2 + 1).min(interval + 60))
}

/// A random sequence number up to `SEQ_MAX`.
fn new_seq() -> Result<u32> {
    let r = crate::mkfs::random16()?;
    let n = u32::from_le_bytes([r[0], r[1], r[2], r[3]]);
    Ok(n % (fmt::SEQ_MAX + 1))
}

/// This machine's name, as `uname -n` gives it.
pub(crate) fn node_name() -> Vec<u8> {
    std::fs::read("/proc/sys/kernel/hostname")
        .map(|mut n| {
            n.retain(|&b| b != b'\n');
            n
        })
        .unwrap_or_default()
}

impl Mmp {
    /// Takes the filesystem on `dev` for this machine as the kernel's
    /// `ext4_multi_mount_protect` does (see the module comment), or says who has it
    /// (`Error::InUse`, `EBUSY`). Blocks for up to twice `wait_time` where the block is not
    /// clean. Returns the protection and the device to write the filesystem through. `name`
    /// goes into the block as the device's (informational, as the kernel's); empty keeps the
    /// one there.
    pub(crate) fn protect(
        dev: Arc<dyn BlockDevice>,
        sbi: &SbInfo,
        name: &[u8],
    ) -> Result<(Mmp, Arc<dyn BlockDevice>)> {
        let sb = &sbi.sb;
        debug_assert!(sb.incompat().contains(Incompat::MMP));
        let block = sb.s_mmp_block.get();
        check_place(sbi, &dev, block)?;
        let bs = sbi.block_size as usize;
        let io = Io::new(&dev, block * u64::from(sbi.block_size), bs);
        // Within what e2fsprogs accepts: a zero interval would have the thread spin, and one
        // longer than the largest check interval would let a waiting machine take the image.
        let update_s = sb.s_mmp_update_interval.get().clamp(1, fmt::MAX_UPDATE_INTERVAL);
        let update = u64::from(update_s);
        let mut w = Writer {
            block,
            io,
            buf: Aligned::new(bs),
            mmp: zerocopy::FromZeros::new_zeroed(),
            seed: sbi.csum_seed,
            csum: sbi.metadata_csum,
            update: Duration::from_secs(update),
        };
        let mut m = w.read()?;
        let seq = m.mmp_seq.get();
        if seq == fmt::SEQ_FSCK {
            return Err(in_use(&m, "e2fsck is running on the filesystem"));
        }
        let mut wait = Duration::ZERO;
        if seq != fmt::SEQ_CLEAN {
            wait = wait_time(update_s, m.mmp_check_interval.get());
            std::thread::sleep(wait);
            m = w.read()?;
            if m.mmp_seq.get() != seq {
                return Err(in_use(&m, "the filesystem is in use on another machine"));
            }
        }
        let mine = new_seq()?;
        w.mmp = m;
        MmpBlock::set_name(&mut w.mmp.mmp_nodename, &node_name());
        if !name.is_empty() {
            MmpBlock::set_name(&mut w.mmp.mmp_bdevname, name);
        }
        w.mmp.mmp_check_interval.set(check_interval(update));
        w.stamp(mine);
        w.write()?;
        std::thread::sleep(wait);
        let now = w.read()?;
        if now.mmp_seq.get() != mine {
            return Err(in_use(&now, "the filesystem is in use on another machine"));
        }
        let fence = Arc::new(MmpFence::default());
        let fenced: Arc<dyn BlockDevice> = Arc::new(FencedDevice { inner: dev, fence: fence.clone() });
        let shared = Arc::new((Mutex::new(State { stop: false, conflict: None }), Condvar::new()));
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("rext4-mmp".into())
                .spawn(move || run(w, mine, &shared, &fence))?
        };
        Ok((Mmp { shared, thread: Mutex::new(Some(thread)) }, fenced))
    }

    /// [`Mmp::protect`] where the filesystem has the `mmp` feature: the device to write it
    /// through and the protection; `dev` as it is and none without the feature.
    pub(crate) fn protect_if_needed(
        dev: Arc<dyn BlockDevice>,
        sbi: &SbInfo,
        name: &[u8],
    ) -> Result<(Arc<dyn BlockDevice>, Option<Mmp>)> {
        if !sbi.sb.incompat().contains(Incompat::MMP) {
            return Ok((dev, None));
        }
        let (mmp, fenced) = Mmp::protect(dev, sbi, name)?;
        Ok((fenced, Some(mmp)))
    }

    /// Ends the protection: the thread writes `SEQ_CLEAN` (unless it found another machine
    /// writing) and ends. Call after the image is clean on disk. Idempotent.
    pub(crate) fn stop(&self) {
        let Some(thread) = self.thread.lock().take() else { return };
        {
            let (lock, cv) = &*self.shared;
            lock.lock().stop = true;
            cv.notify_all();
        }
        let _ = thread.join();
    }

    /// Why writes were stopped, if the thread found another machine writing.
    pub(crate) fn conflict(&self) -> Option<String> {
        self.shared.0.lock().conflict.clone()
    }
}

impl Drop for Mmp {
    fn drop(&mut self) {
        self.stop();
    }
}

fn in_use(m: &MmpBlock, why: &str) -> Error {
    Error::InUse(describe(m, why))
}

/// `why`, with who wrote block `m` last and when.
fn describe(m: &MmpBlock, why: &str) -> String {
    let node = String::from_utf8_lossy(MmpBlock::name(&m.mmp_nodename)).into_owned();
    let dev = String::from_utf8_lossy(MmpBlock::name(&m.mmp_bdevname)).into_owned();
    format!(
        "multi-mount protection: {why} (last update at {} by node \"{node}\", device \"{dev}\")",
        m.mmp_time.get()
    )
}

/// The MMP block must lie inside the filesystem (`ext4_multi_mount_protect`) and, as this
/// open is about to write it, outside every other metadata block: superblock and descriptor
/// copies, bitmaps, inode tables and the journal, as the descriptors and the journal inode
/// say before recovery (the way recovery itself reads them). Descriptors or a journal that
/// only load after recovery (a torn checkpoint) leave that part to the check after it
/// (`FsInner::protect_mmp`).
fn check_place(sbi: &SbInfo, dev: &Arc<dyn BlockDevice>, block: u64) -> Result<()> {
    if block < sbi.first_data_block || block >= sbi.blocks_count {
        return Err(bad(block, "outside the filesystem"));
    }
    let (g, off) = sbi.block_group_offset(block);
    if u64::from(off) < sbi.base_meta_blocks(g) {
        return Err(bad(block, "in the superblock or group descriptors"));
    }
    let opts = crate::fs::Options { cache_bytes: 1 << 20, inode_cache: 16, ..crate::fs::Options::default() };
    let Ok(mut fs) = crate::fs::FsInner::new(dev.clone(), sbi.clone(), &opts) else { return Ok(()) };
    fs.protect_journal();
    if !fs.zones.clear_of(None, block, 1) {
        return Err(bad(block, "in other metadata (a bitmap, an inode table or the journal)"));
    }
    Ok(())
}

/// The updating thread (the kernel's `kmmpd`); see the module comment.
fn run(mut w: Writer, first: u32, shared: &(Mutex<State>, Condvar), fence: &MmpFence) {
    // The number last written: what the block must still hold.
    let mut written = first;
    let (lock, cv) = shared;
    let mut last = Instant::now();
    loop {
        // Wait out the interval since the last write, or until stopped.
        {
            let mut st = lock.lock();
            loop {
                let left = w.update.saturating_sub(last.elapsed());
                if st.stop || left.is_zero() {
                    break;
                }
                cv.wait_for(&mut st, left);
            }
            if st.stop {
                break;
            }
        }
        // Still ours? Anything else is another machine's number (or damage where only ours
        // was): stop writing before the next write of ours lands on its.
        let found = w.read();
        let ours = found.as_ref().is_ok_and(|m| {
            m.mmp_seq.get() == written
                && MmpBlock::name(&m.mmp_nodename) == MmpBlock::name(&w.mmp.mmp_nodename)
        });
        if !ours {
            fence.fenced.store(true, Ordering::Release);
            let why = match found {
                Ok(m) => describe(&m, "the filesystem has been opened on another machine"),
                Err(e) => format!("multi-mount protection: cannot read the MMP block: {e}"),
            };
            lock.lock().conflict = Some(why);
            return;
        }
        let next = if written >= fmt::SEQ_MAX { 1 } else { written + 1 };
        let elapsed = last.elapsed().as_secs();
        w.mmp.mmp_check_interval.set(check_interval(elapsed.max(w.update.as_secs())));
        w.stamp(next);
        last = Instant::now();
        // A failed write is tried again at the next interval, as the kernel does (a machine
        // waiting to take the filesystem sees the number stand still meanwhile), and the
        // block is expected to hold the number before it.
        if w.write().is_ok() {
            written = next;
        }
    }
    w.stamp(fmt::SEQ_CLEAN);
    let _ = w.write();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_image::{fsck_clean, mkfs_image, open_mem};

    fn block_of(bytes: &[u8]) -> MmpBlock {
        let sb = rext4_format::superblock::Superblock::parse(&bytes[1024..]).unwrap();
        let bs = 1024usize << sb.s_log_block_size.get();
        let at = usize::try_from(sb.s_mmp_block.get()).unwrap() * bs;
        let m = MmpBlock::parse(&bytes[at..]).unwrap();
        assert!(m.verify_checksum(sb.csum_seed(), sb.has_metadata_csum()));
        m
    }

    /// A device that is no host file (memory, network) has the block written through it.
    #[test]
    fn a_device_without_a_host_file_is_protected_through_itself() {
        let bytes = mkfs_image(None, &["-O", "mmp", "-E", "mmp_update_interval=1"], "32M");
        assert_eq!(block_of(&bytes).mmp_seq.get(), fmt::SEQ_CLEAN);
        let (fs, dev) = open_mem(bytes);
        let first = block_of(&dev.snapshot()).mmp_seq.get();
        assert!(first <= fmt::SEQ_MAX);
        fs.write_file("/f", vec![3u8; 10_000]).unwrap();
        std::thread::sleep(Duration::from_millis(2300));
        let later = block_of(&dev.snapshot()).mmp_seq.get();
        assert!(later != first && later <= fmt::SEQ_MAX, "{first:#x} then {later:#x}");
        fs.unmount().unwrap();
        let done = dev.snapshot();
        assert_eq!(block_of(&done).mmp_seq.get(), fmt::SEQ_CLEAN);
        fsck_clean(&done);
    }

    /// A memory device whose writes to one offset fail while `failing` is set.
    struct Flaky {
        inner: crate::dev::MemDevice,
        at: std::sync::atomic::AtomicU64,
        failing: AtomicBool,
    }

    impl BlockDevice for Flaky {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.inner.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            if self.failing.load(Ordering::Acquire) && offset == self.at.load(Ordering::Acquire) {
                return Err(io::Error::other("injected"));
            }
            self.inner.write_at(buf, offset)
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn size(&self) -> u64 {
            self.inner.size()
        }
    }

    /// Updates that fail for a while are tried again; the block still holds this machine's
    /// last number, so nothing is fenced, and updates go on once writes work again.
    #[test]
    fn failed_updates_are_retried_without_fencing() {
        let bytes = mkfs_image(None, &["-O", "mmp", "-E", "mmp_update_interval=1"], "32M");
        let sb = rext4_format::superblock::Superblock::parse(&bytes[1024..]).unwrap();
        let at = sb.s_mmp_block.get() << (10 + sb.s_log_block_size.get());
        let snapshot = |d: &Flaky| {
            let mut b = vec![0u8; fmt::MMP_SIZE];
            d.inner.read_at(&mut b, at).unwrap();
            MmpBlock::parse(&b).unwrap().mmp_seq.get()
        };
        let dev = Arc::new(Flaky {
            inner: crate::dev::MemDevice::new(bytes),
            at: std::sync::atomic::AtomicU64::new(at),
            failing: AtomicBool::new(false),
        });
        let fs = crate::Fs::from_device(dev.clone(), crate::Options { writable: true, ..Default::default() })
            .unwrap();
        dev.failing.store(true, Ordering::Release);
        let stuck = snapshot(&dev);
        std::thread::sleep(Duration::from_millis(2600));
        assert_eq!(snapshot(&dev), stuck, "no update lands while writes fail");
        dev.failing.store(false, Ordering::Release);
        std::thread::sleep(Duration::from_millis(2600));
        assert_ne!(snapshot(&dev), stuck, "updates go on");
        fs.write_file("/after", vec![1u8; 5000]).unwrap();
        fs.sync().unwrap();
        fs.unmount().unwrap();
        assert_eq!(snapshot(&dev), fmt::SEQ_CLEAN);
        fsck_clean(&dev.inner.snapshot());
    }

    #[test]
    fn waits_follow_the_kernel_within_the_largest_interval() {
        let secs = |u, a| wait_time(u, a).as_secs();
        assert_eq!(secs(1, 5), 11);
        assert_eq!(secs(5, 10), 21, "after a kernel mount at its default interval");
        assert_eq!(secs(5, 0), 11);
        assert_eq!(secs(30, 60), 120, "an interval and a minute");
        assert_eq!(secs(5, u16::MAX), 360, "a hostile interval waits no more than 300 s allow");
        assert_eq!(secs(300, 300), 360);
    }

    #[test]
    fn the_check_interval_is_twice_the_update_within_bounds() {
        assert_eq!(check_interval(1), 5);
        assert_eq!(check_interval(5), 10);
        assert_eq!(check_interval(200), 300);
        assert_eq!(check_interval(u64::MAX), 300);
    }
}
