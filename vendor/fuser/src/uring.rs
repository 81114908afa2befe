//! FUSE over io_uring (Linux 6.14+, `CONFIG_FUSE_IO_URING`, `enable_uring` set on the fuse
//! module).
//!
//! After `FUSE_INIT` has agreed on `FUSE_OVER_IO_URING`, one queue per possible CPU registers
//! ring entries with the kernel (`FUSE_IO_URING_CMD_REGISTER`, an SQE128 `URING_CMD` on the
//! /dev/fuse fd). Each entry is a header buffer (`fuse_uring_req_header`: the in/out header,
//! the opcode's own struct, the entry's payload size) and a payload buffer of the connection's
//! largest request. The kernel fills an entry with a request and completes its command; the
//! reply goes back in the same buffers with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which also
//! hands the entry back for the next request. The kernel queues a request on the queue of the
//! CPU its caller runs on, and switches from /dev/fuse to the rings only once every queue has
//! an entry registered. Forgets, interrupts and notifications stay on /dev/fuse, whose reader
//! threads keep running beside the queues.
//!
//! Requests are parsed and dispatched by the same code as those read from /dev/fuse: the
//! in-header and opcode struct are moved in front of the payload so that the request is one
//! contiguous slice, as a /dev/fuse read gives it.

use std::alloc::Layout;
use std::fmt;
use std::io;
use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::thread::ThreadId;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types::Fd;
use log::info;
use log::warn;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::ReplyEmpty;
use crate::channel::ChannelSender;
use crate::ll::Operation;
use crate::ll::fuse_abi as abi;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// `fuse_uring_req_header`: `in_out[128]`, `op_in[128]`, `fuse_uring_ent_in_out` (32 bytes).
const HEADERS_LEN: usize = 288;
const OP_IN_OFF: usize = 128;
const OP_IN_LEN: usize = 128;
/// `fuse_uring_ent_in_out.payload_sz`.
const PAYLOAD_SZ_OFF: usize = 256 + 16;
/// The payload starts a page into the entry's allocation; the request's in-header and opcode
/// struct are copied just below it, after the headers.
const PAYLOAD_OFF: usize = 4096;
const IN_HEADER_LEN: usize = size_of::<abi::fuse_in_header>();
const OUT_HEADER_LEN: usize = size_of::<abi::fuse_out_header>();

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `user_data` of the wake-up eventfd's read; entries use their index.
const WAKE: u64 = u64::MAX;
/// Threads serving each CPU's queue, each with a ring of its own holding one entry in the
/// kernel: an entry the kernel hands a request to then always belongs to an idle thread (the
/// kernel gives a new request the entry that became available last), so one slow request
/// (a journal wait, a lock) does not hold up the next one from the same CPU.
pub(crate) const THREADS_PER_QUEUE: usize = 2;
/// Entries a thread may register beyond its first: one more each time a request's reply is
/// deferred (a lock wait answered later by another thread), so that a thread waiting for
/// replies still takes requests. Those it registers stay with the kernel.
const SPARES: usize = 8;
const MAX_ENTS: usize = 1 + SPARES;

/// Counts of requests served by each transport.
#[derive(Debug, Default)]
pub struct TransportStats {
    uring_requests: AtomicU64,
    uring_queues: AtomicU64,
}

impl TransportStats {
    /// Requests served through io_uring queues.
    pub fn uring_requests(&self) -> u64 {
        self.uring_requests.load(Ordering::Relaxed)
    }

    /// io_uring rings (one per serving thread) that served at least one request.
    pub fn uring_queues(&self) -> u64 {
        self.uring_queues.load(Ordering::Relaxed)
    }
}

/// The number of queues the kernel expects: one per possible CPU (`num_possible_cpus`).
pub(crate) fn queue_count() -> usize {
    let from_sysfs = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            // "0-3" or "0,2-5": the kernel's count is the mask's weight.
            let mut n = 0usize;
            for part in s.trim().split(',') {
                let (lo, hi) = match part.split_once('-') {
                    Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
                    None => {
                        let a = part.parse::<usize>().ok()?;
                        (a, a)
                    }
                };
                n += hi.checked_sub(lo)? + 1;
            }
            Some(n)
        });
    from_sysfs
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// One entry's memory: headers at the start, payload from `PAYLOAD_OFF`.
struct EntBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is plain memory; who may touch it at a time is the entry's ownership
// protocol (kernel, queue thread, reply holder), described on `Ent`.
unsafe impl Send for EntBuf {}
// SAFETY: as above.
unsafe impl Sync for EntBuf {}

impl EntBuf {
    fn new(payload: usize) -> io::Result<EntBuf> {
        let layout = Layout::from_size_align(PAYLOAD_OFF + payload, 4096)
            .map_err(|_| io::Error::other("io_uring entry too large"))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        Ok(EntBuf { ptr, layout })
    }

    fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for EntBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the ring that wrote into it is gone
        // (the queue thread drops its ring before its `Arc<Queue>`).
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A ring entry. It belongs to the kernel while its command is in flight, to the queue thread
/// from the command's completion until the request is dispatched, then to the request's reply
/// until the reply is written, then to the queue thread again until it commits. Only the
/// current owner reads or writes the buffer.
struct Ent {
    buf: EntBuf,
    /// The reply's payload, when the request had a payload of its own: the request's bytes
    /// overlap the payload buffer while it is served, so the reply waits here until the queue
    /// thread commits.
    staged: Mutex<Option<Vec<u8>>>,
    /// Set when the reply is written; the queue thread registers a spare entry for a request
    /// dispatched without a reply.
    replied: AtomicBool,
}

/// A queue's state shared with the replies of its requests.
pub(crate) struct Queue {
    qid: u16,
    ents: Vec<Ent>,
    payload_len: usize,
    /// Entries whose reply is written, with the request's unique id: to be committed.
    done: Mutex<Vec<(u16, u64)>>,
    /// Wakes the queue thread for replies sent from other threads.
    wake: OwnedFd,
    thread: Mutex<Option<ThreadId>>,
    stop: AtomicBool,
}

impl Queue {
    fn new(qid: u16, payload_len: usize) -> io::Result<Queue> {
        // Large zeroed allocations are mapped lazily: spares cost nothing until used.
        let mut ents = Vec::with_capacity(MAX_ENTS);
        for _ in 0..MAX_ENTS {
            ents.push(Ent {
                buf: EntBuf::new(payload_len)?,
                staged: Mutex::new(None),
                replied: AtomicBool::new(false),
            });
        }
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor owned by nothing else.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Queue {
            qid,
            ents,
            payload_len,
            done: Mutex::new(Vec::new()),
            wake,
            thread: Mutex::new(None),
            stop: AtomicBool::new(false),
        })
    }

    fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to an eventfd we own.
        let _ = unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Asks the queue thread to end (the connection is gone).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake();
    }
}

/// Where a request served from a ring entry sends its reply.
#[derive(Clone)]
pub(crate) struct UringReply {
    queue: Arc<Queue>,
    ent: u16,
    unique: u64,
    /// The request had a payload, which the reply must not overwrite while it is served.
    staged: bool,
    /// For what replies do besides replying (backing files).
    pub(crate) ch: ChannelSender,
}

impl fmt::Debug for UringReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UringReply")
            .field("qid", &self.queue.qid)
            .field("ent", &self.ent)
            .field("unique", &self.unique)
            .finish()
    }
}

impl UringReply {
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let ent = &self.queue.ents[usize::from(self.ent)];
        let base = ent.buf.base();
        let total: usize = data.iter().map(|s| s.len()).sum();
        let mut result = Ok(());
        let mut header = [0u8; OUT_HEADER_LEN];
        let payload_len;
        if total < OUT_HEADER_LEN || total - OUT_HEADER_LEN > self.queue.payload_len {
            // The kernel would refuse it too; the entry must still go back, with an error.
            header = out_header(self.unique, libc::EIO);
            payload_len = 0;
            result = Err(io::Error::other("reply does not fit the io_uring entry"));
        } else {
            payload_len = total - OUT_HEADER_LEN;
            let mut staged = if self.staged {
                Some(Vec::with_capacity(payload_len))
            } else {
                None
            };
            let mut at = 0usize;
            for s in data {
                let mut s: &[u8] = s;
                if at < OUT_HEADER_LEN {
                    let n = s.len().min(OUT_HEADER_LEN - at);
                    header[at..at + n].copy_from_slice(&s[..n]);
                    at += n;
                    s = &s[n..];
                }
                if s.is_empty() {
                    continue;
                }
                match &mut staged {
                    Some(v) => v.extend_from_slice(s),
                    // SAFETY: this reply owns the entry; the request had no payload, so
                    // nothing borrows the payload buffer, and `at - OUT_HEADER_LEN + s.len()`
                    // stays within `payload_len`, checked above against the buffer's size.
                    None => unsafe {
                        std::ptr::copy_nonoverlapping(
                            s.as_ptr(),
                            base.add(PAYLOAD_OFF + at - OUT_HEADER_LEN),
                            s.len(),
                        );
                    },
                }
                at += s.len();
            }
            *ent.staged.lock() = staged;
        }
        let payload_sz = u32::try_from(payload_len).unwrap_or(u32::MAX);
        // SAFETY: this reply owns the entry; the out-header area and the entry's payload size
        // are inside the headers, which no request slice covers.
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_ptr(), base, OUT_HEADER_LEN);
            std::ptr::copy_nonoverlapping(
                payload_sz.to_ne_bytes().as_ptr(),
                base.add(PAYLOAD_SZ_OFF),
                4,
            );
        }
        ent.replied.store(true, Ordering::Release);
        self.queue.done.lock().push((self.ent, self.unique));
        if *self.queue.thread.lock() != Some(std::thread::current().id()) {
            self.queue.wake();
        }
        result
    }
}

fn out_header(unique: u64, errno: i32) -> [u8; OUT_HEADER_LEN] {
    let mut h = [0u8; OUT_HEADER_LEN];
    h[0..4].copy_from_slice(&(OUT_HEADER_LEN as u32).to_ne_bytes());
    h[4..8].copy_from_slice(&(-errno).to_ne_bytes());
    h[8..16].copy_from_slice(&unique.to_ne_bytes());
    h
}

fn cmd(commit_id: u64, qid: u16) -> [u8; 80] {
    // struct fuse_uring_cmd_req { u64 flags; u64 commit_id; u16 qid; u8 padding[6]; }
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    c[16..18].copy_from_slice(&qid.to_ne_bytes());
    c
}

/// Creates the rings' state (`THREADS_PER_QUEUE` for each CPU's queue) for a connection whose
/// largest request payload is `payload_len`.
pub(crate) fn queues(payload_len: usize) -> io::Result<Vec<Arc<Queue>>> {
    let mut v = Vec::new();
    for q in 0..queue_count() {
        let qid = u16::try_from(q).map_err(|_| io::Error::other("too many CPUs"))?;
        for _ in 0..THREADS_PER_QUEUE {
            v.push(Arc::new(Queue::new(qid, payload_len)?));
        }
    }
    Ok(v)
}

/// Serves one queue until the connection ends or the queue is stopped.
pub(crate) fn run_queue<FS: Filesystem>(
    queue: Arc<Queue>,
    se: SessionEventLoop<FS>,
    dev: RawFd,
    stats: Arc<TransportStats>,
) -> io::Result<()> {
    *queue.thread.lock() = Some(std::thread::current().id());
    // The kernel queues a request on its caller's CPU: serve it from the same one.
    let mut cpus = nix::sched::CpuSet::new();
    if cpus.set(usize::from(queue.qid)).is_ok() {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &cpus);
    }
    let entries = u32::try_from(MAX_ENTS * 2 + 2).unwrap_or(64);
    // Completions are reaped only by this thread, which also submits everything.
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(entries)?;
    let iovecs: Vec<[libc::iovec; 2]> = queue
        .ents
        .iter()
        .map(|e| {
            [
                libc::iovec {
                    iov_base: e.buf.base().cast(),
                    iov_len: HEADERS_LEN,
                },
                libc::iovec {
                    // SAFETY: the payload offset is inside the allocation.
                    iov_base: unsafe { e.buf.base().add(PAYLOAD_OFF) }.cast(),
                    iov_len: queue.payload_len,
                },
            ]
        })
        .collect();
    let mut wake_buf = Box::new(0u64);
    let register = |i: usize| {
        let mut sqe = opcode::UringCmd80::new(Fd(dev), CMD_REGISTER)
            .cmd(cmd(0, queue.qid))
            .addr(Some(iovecs[i].as_ptr() as u64))
            .build()
            .user_data(i as u64);
        set_sqe_len(&mut sqe, 2);
        sqe
    };
    let mut sqes = Vec::with_capacity(MAX_ENTS + 1);
    sqes.push(register(0));
    sqes.push(wake_read(&queue, &mut wake_buf));
    push_all(&mut ring, &sqes)?;
    ring.submit()?;
    sqes.clear();

    // Entries not lost to an error: held by the kernel, being served, or awaiting a reply.
    let mut registered_ents = 1;
    let mut live = 1;
    let mut served_any = false;
    let mut scratch: Vec<u64> = Vec::new();
    let mut cqes: Vec<(u64, i32)> = Vec::with_capacity(MAX_ENTS + 1);
    let mut first_error = true;
    while live > 0 && !queue.stop.load(Ordering::Acquire) {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e),
        }
        cqes.extend(ring.completion().map(|c| (c.user_data(), c.result())));
        for &(ud, res) in &cqes {
            if ud == WAKE {
                sqes.push(wake_read(&queue, &mut wake_buf));
                continue;
            }
            let Ok(i) = u16::try_from(ud) else { continue };
            if res < 0 {
                live -= 1;
                let errno = -res;
                if first_error
                    && !matches!(
                        errno,
                        libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV
                    )
                {
                    first_error = false;
                    warn!(
                        "io_uring queue {}: {}",
                        queue.qid,
                        io::Error::from_raw_os_error(errno)
                    );
                }
                continue;
            }
            if !served_any {
                served_any = true;
                stats.uring_queues.fetch_add(1, Ordering::Relaxed);
            }
            stats.uring_requests.fetch_add(1, Ordering::Relaxed);
            let ent = &queue.ents[usize::from(i)];
            ent.replied.store(false, Ordering::Relaxed);
            serve(&queue, i, &se, &mut scratch);
            if !ent.replied.load(Ordering::Acquire) && registered_ents < MAX_ENTS {
                // The reply comes later from elsewhere: keep taking requests meanwhile.
                sqes.push(register(registered_ents));
                registered_ents += 1;
                live += 1;
            }
        }
        cqes.clear();
        let done = std::mem::take(&mut *queue.done.lock());
        for (i, unique) in done {
            let ent = &queue.ents[usize::from(i)];
            if let Some(staged) = ent.staged.lock().take() {
                // SAFETY: the request was dispatched and its reply written: the queue thread
                // owns the entry again, and `send` checked the size against the buffer.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        staged.as_ptr(),
                        ent.buf.base().add(PAYLOAD_OFF),
                        staged.len(),
                    );
                }
            }
            sqes.push(
                opcode::UringCmd80::new(Fd(dev), CMD_COMMIT_AND_FETCH)
                    .cmd(cmd(unique, queue.qid))
                    .build()
                    .user_data(u64::from(i)),
            );
        }
        push_all(&mut ring, &sqes)?;
        sqes.clear();
    }
    if !served_any {
        info!("io_uring queue {} served no request", queue.qid);
    }
    // The ring goes first: the kernel cancels its commands before the buffers can go.
    drop(ring);
    Ok(())
}

/// Serves the request the kernel put in entry `i`.
fn serve<FS: Filesystem>(
    queue: &Arc<Queue>,
    i: u16,
    se: &SessionEventLoop<FS>,
    scratch: &mut Vec<u64>,
) {
    let ent = &queue.ents[usize::from(i)];
    let base = ent.buf.base();
    let mut header = [0u8; IN_HEADER_LEN];
    let mut payload_sz = [0u8; 4];
    // SAFETY: the queue thread owns the entry (its command completed); both reads are inside
    // the headers.
    unsafe {
        std::ptr::copy_nonoverlapping(base, header.as_mut_ptr(), IN_HEADER_LEN);
        std::ptr::copy_nonoverlapping(base.add(PAYLOAD_SZ_OFF), payload_sz.as_mut_ptr(), 4);
    }
    let len = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let unique = u64::from_ne_bytes(header[8..16].try_into().unwrap_or([0; 8]));
    let payload_sz = u32::from_ne_bytes(payload_sz) as usize;
    let reply = UringReply {
        queue: queue.clone(),
        ent: i,
        unique,
        staged: payload_sz > 0,
        ch: se.ch.sender(),
    };
    let op_len = len.checked_sub(IN_HEADER_LEN + payload_sz);
    let Some(op_len) = op_len.filter(|&n| n <= OP_IN_LEN && payload_sz <= queue.payload_len) else {
        warn!("io_uring: malformed request (len {len}, payload {payload_sz})");
        let _ = reply.send(&[IoSlice::new(&out_header(unique, libc::EIO))]);
        return;
    };
    let start = PAYLOAD_OFF - IN_HEADER_LEN - op_len;
    let data: &[u8] = if start % align_of::<abi::fuse_in_header>() == 0 {
        // SAFETY: the queue thread owns the entry. The in-header and opcode struct are copied
        // from the headers to just below the payload (disjoint: `start` is past the headers),
        // which makes the request one slice `[start, PAYLOAD_OFF + payload_sz)`, inside the
        // allocation. While it is borrowed, replies write only the headers' out-header and
        // payload size, and stage their payload when the request has one.
        unsafe {
            std::ptr::copy_nonoverlapping(base, base.add(start), IN_HEADER_LEN);
            std::ptr::copy_nonoverlapping(
                base.add(OP_IN_OFF),
                base.add(start + IN_HEADER_LEN),
                op_len,
            );
            std::slice::from_raw_parts(base.add(start), len)
        }
    } else {
        // An opcode struct of unusual size: assemble the request in aligned scratch memory.
        scratch.clear();
        scratch.resize(len.div_ceil(8), 0);
        // SAFETY: `scratch` holds at least `len` bytes; the sources are inside the entry,
        // which the queue thread owns.
        unsafe {
            let dst = scratch.as_mut_ptr().cast::<u8>();
            std::ptr::copy_nonoverlapping(base, dst, IN_HEADER_LEN);
            std::ptr::copy_nonoverlapping(base.add(OP_IN_OFF), dst.add(IN_HEADER_LEN), op_len);
            std::ptr::copy_nonoverlapping(
                base.add(PAYLOAD_OFF),
                dst.add(IN_HEADER_LEN + op_len),
                payload_sz,
            );
            std::slice::from_raw_parts(dst, len)
        }
    };
    match RequestWithSender::with_uring(reply, data) {
        Some(req) => {
            if let Ok(Operation::Destroy(_)) = req.request.operation() {
                req.reply::<ReplyEmpty>().ok();
            } else {
                req.dispatch(se);
            }
        }
        None => {
            // Parsing failed: the entry still goes back, with an error.
            let reply = UringReply {
                queue: queue.clone(),
                ent: i,
                unique,
                staged: false,
                ch: se.ch.sender(),
            };
            let _ = reply.send(&[IoSlice::new(&out_header(unique, libc::EIO))]);
        }
    }
}

fn wake_read(queue: &Queue, buf: &mut Box<u64>) -> squeue::Entry128 {
    opcode::Read::new(
        Fd(queue.wake.as_raw_fd()),
        std::ptr::from_mut::<u64>(&mut **buf).cast(),
        8,
    )
    .build()
    .user_data(WAKE)
    .into()
}

fn push_all(
    ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
    sqes: &[squeue::Entry128],
) -> io::Result<()> {
    for sqe in sqes {
        loop {
            // SAFETY: every buffer an SQE points at (entry buffers, iovecs, the eventfd word)
            // lives until the ring is dropped.
            match unsafe { ring.submission().push(sqe) } {
                Ok(()) => break,
                Err(_) => {
                    ring.submit()?;
                }
            }
        }
    }
    Ok(())
}

/// Sets an SQE's `len` (the iovec count of a REGISTER), which `UringCmd80` leaves at zero.
fn set_sqe_len(sqe: &mut squeue::Entry128, len: u32) {
    // SAFETY: `Entry128` is `repr(C)`: the kernel's 64-byte `io_uring_sqe` then 64 bytes of
    // command; `len` is the `u32` at byte 24 of the SQE (UAPI layout).
    unsafe {
        std::ptr::from_mut(sqe)
            .cast::<u8>()
            .add(24)
            .cast::<u32>()
            .write_unaligned(len);
    }
}
