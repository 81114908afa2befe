//! One NBD connection in the transmission phase: requests are written under the send lock
//! and may be many in flight; a reader thread takes each simple reply, finds its request by
//! cookie and hands it the result. A broken stream, a reply that makes no sense, or a request
//! that times out closes the connection and fails every request still waiting on it.
//!
//! # Locking
//! `send` (the socket's writing half) and `pending` (the cookie table) are separate leaves: a
//! request takes `pending` to register, then `send` to write; the reader takes `pending` only.

use crate::dev::nbd::handshake::{self, ExportInfo};
use crate::dev::nbd::{NbdConfig, NbdServer};
use crate::sync::Mutex;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const CMD_FLAG_FUA: u16 = 1;

/// A transmission-phase command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmd {
    Read,
    Write,
    WriteFua,
    Flush,
    Trim,
}

impl Cmd {
    fn wire(self) -> (u16, u16) {
        match self {
            Cmd::Read => (0, 0),
            Cmd::Write => (0, 1),
            Cmd::WriteFua => (CMD_FLAG_FUA, 1),
            Cmd::Flush => (0, 3),
            Cmd::Trim => (0, 4),
        }
    }
}

/// The socket, either kind.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn connect(server: &NbdServer, timeout: Duration) -> io::Result<Stream> {
        let s = match server {
            NbdServer::Tcp { host, port } => {
                let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host}: no address"));
                let addrs = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), *port))?;
                let mut found = None;
                for a in addrs {
                    match TcpStream::connect_timeout(&a, timeout) {
                        Ok(t) => {
                            found = Some(t);
                            break;
                        }
                        Err(e) => last = e,
                    }
                }
                let t = found.ok_or(last)?;
                t.set_nodelay(true)?;
                Stream::Tcp(t)
            }
            NbdServer::Unix(path) => Stream::Unix(UnixStream::connect(path)?),
        };
        // The handshake must not hang on a silent server either.
        s.set_read_timeout(Some(timeout))?;
        Ok(s)
    }
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(t) => Stream::Tcp(t.try_clone()?),
            Stream::Unix(u) => Stream::Unix(u.try_clone()?),
        })
    }
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }
    /// A server that stops reading must not hold a sender (and the send lock) for ever.
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }
    fn shutdown(&self) {
        // Already closed is fine: the point is to wake the reader.
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(b),
            Stream::Unix(s) => s.read(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(b),
            Stream::Unix(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

type Reply = io::Result<Vec<u8>>;

/// A request waiting for its reply.
struct Pending {
    /// Bytes of data that follow a successful reply (reads only).
    read_len: usize,
    done: mpsc::SyncSender<Reply>,
}

/// State shared with the reader thread.
struct Shared {
    /// Requests sent and not answered, by cookie. [own lock, a leaf]
    pending: Mutex<HashMap<u64, Pending>>,
    /// Cleared once the connection failed or closed. [atomic]
    alive: AtomicBool,
}

impl Shared {
    /// Marks the connection dead and fails everything waiting on it.
    fn fail_all(&self, why: &io::Error) {
        self.alive.store(false, Ordering::Release);
        let waiting: Vec<Pending> = self.pending.lock().drain().map(|(_, p)| p).collect();
        for p in waiting {
            // A waiter that gave up (timed out) has dropped its receiver.
            let _ = p.done.send(Err(io::Error::new(why.kind(), format!("NBD connection lost: {why}"))));
        }
    }
}

pub(crate) struct Conn {
    /// The socket's writing half. [own lock: one request written at a time]
    send: Mutex<Stream>,
    shared: Arc<Shared>,
    /// Next cookie. [atomic]
    cookie: AtomicU64,
    /// [own lock; taken at drop]
    reader: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Conn {
    /// Connects and negotiates; the reader thread starts once the export is chosen.
    pub(crate) fn open(cfg: &NbdConfig) -> io::Result<(Conn, ExportInfo)> {
        let mut s = Stream::connect(&cfg.server, cfg.timeout)?;
        let info = handshake::negotiate(&mut s, &cfg.export)?;
        // Replies may be long in coming while the connection is idle; waiting requests time
        // out on their own.
        s.set_read_timeout(None)?;
        s.set_write_timeout(Some(cfg.timeout))?;
        let shared = Arc::new(Shared { pending: Mutex::new(HashMap::new()), alive: AtomicBool::new(true) });
        let rx = s.try_clone()?;
        let sh = shared.clone();
        let reader = std::thread::Builder::new()
            .name("rext4-nbd-reader".into())
            .spawn(move || read_replies(rx, &sh))?;
        let conn =
            Conn { send: Mutex::new(s), shared, cookie: AtomicU64::new(1), reader: Mutex::new(Some(reader)) };
        Ok((conn, info))
    }

    pub(crate) fn alive(&self) -> bool {
        self.shared.alive.load(Ordering::Acquire)
    }

    /// Sends one request and waits for its reply: the data read, or nothing.
    pub(crate) fn request(
        &self,
        cmd: Cmd,
        offset: u64,
        len: u32,
        data: Option<&[u8]>,
        timeout: Duration,
    ) -> io::Result<Vec<u8>> {
        if !self.alive() {
            return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "NBD connection is closed"));
        }
        let cookie = self.cookie.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::sync_channel(1);
        let read_len = if cmd == Cmd::Read { len as usize } else { 0 };
        self.shared.pending.lock().insert(cookie, Pending { read_len, done: tx });
        let (flags, kind) = cmd.wire();
        let mut msg = Vec::with_capacity(28 + data.map_or(0, <[u8]>::len));
        msg.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        msg.extend_from_slice(&flags.to_be_bytes());
        msg.extend_from_slice(&kind.to_be_bytes());
        msg.extend_from_slice(&cookie.to_be_bytes());
        msg.extend_from_slice(&offset.to_be_bytes());
        msg.extend_from_slice(&len.to_be_bytes());
        if let Some(d) = data {
            msg.extend_from_slice(d);
        }
        let sent = {
            let mut s = self.send.lock();
            s.write_all(&msg)
        };
        if let Err(e) = sent {
            // Part of the request may be on the wire: the stream is out of step for good.
            self.close(&e);
            return Err(e);
        }
        match rx.recv_timeout(timeout) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let e = io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("NBD server did not answer within {timeout:?}"),
                );
                // The reply may still come, for a request the caller has given up on: this
                // connection can no longer be trusted to be in step.
                self.close(&e);
                Err(e)
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(io::Error::new(io::ErrorKind::ConnectionAborted, "NBD connection lost"))
            }
        }
    }

    fn close(&self, why: &io::Error) {
        self.shared.fail_all(why);
        self.send.lock().shutdown();
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.alive() {
            // NBD_CMD_DISC: the server closes its end once earlier requests are answered.
            let mut msg = [0u8; 28];
            msg[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
            msg[6..8].copy_from_slice(&2u16.to_be_bytes());
            let _ = self.send.lock().write_all(&msg);
        }
        self.close(&io::Error::new(io::ErrorKind::ConnectionAborted, "closed"));
        if let Some(h) = self.reader.lock().take() {
            let _ = h.join();
        }
    }
}

/// The reader thread: takes replies until the stream ends or goes wrong.
fn read_replies(mut s: Stream, shared: &Shared) {
    let why = loop {
        let mut h = [0u8; 16];
        if let Err(e) = s.read_exact(&mut h) {
            break e;
        }
        let magic = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        let error = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        let mut c = [0u8; 8];
        c.copy_from_slice(&h[8..16]);
        let cookie = u64::from_be_bytes(c);
        if magic != SIMPLE_REPLY_MAGIC {
            break io::Error::new(io::ErrorKind::InvalidData, "bad NBD reply magic");
        }
        let Some(p) = shared.pending.lock().remove(&cookie) else {
            break io::Error::new(io::ErrorKind::InvalidData, "NBD reply to no request");
        };
        let reply = if error != 0 {
            Err(server_error(error))
        } else {
            let mut data = vec![0u8; p.read_len];
            if let Err(e) = s.read_exact(&mut data) {
                let _ = p.done.send(Err(io::Error::new(e.kind(), format!("short NBD read: {e}"))));
                break e;
            }
            Ok(data)
        };
        let _ = p.done.send(reply);
    };
    shared.fail_all(&why);
}

/// A server's error reply (the protocol's errno values are Linux's) as an I/O error.
fn server_error(code: u32) -> io::Error {
    let errno = match i32::try_from(code) {
        Ok(e @ (libc::EPERM | libc::EIO | libc::ENOMEM | libc::EINVAL | libc::ENOSPC | libc::EOVERFLOW)) => e,
        Ok(libc::ENOTSUP) => libc::ENOTSUP,
        Ok(libc::ESHUTDOWN) => libc::ESHUTDOWN,
        // Unknown values are to be taken as EINVAL; reported as EIO, as any failed I/O.
        _ => libc::EIO,
    };
    io::Error::from_raw_os_error(errno)
}
