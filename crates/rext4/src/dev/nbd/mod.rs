//! An NBD client device: an export of a network block device server (nbdkit, qemu-nbd, ...)
//! as a [`BlockDevice`], over TCP or a Unix socket, without the kernel's nbd driver.
//!
//! | module | owns |
//! |---|---|
//! | `handshake` | fixed-newstyle negotiation, `NBD_OPT_GO` |
//! | `conn` | one connection: requests sent under its send lock, replies matched by cookie on its reader thread |
//! | this file | `NbdDevice`: the connections, request splitting, flush, reconnection |
//!
//! Requests from the engine's threads run in parallel: each connection keeps many requests in
//! flight, and when the server offers `NBD_FLAG_CAN_MULTI_CONN` the device opens several
//! connections and spreads requests over them. A write returns only once the server has
//! answered it, and `flush` sends `NBD_CMD_FLUSH`, which (with multi-conn) covers every write
//! answered on any connection: the journal's "commit block after its blocks are durable"
//! holds over the network as over a file.
//!
//! Failures are errors, never silent: a server's error reply carries its errno (`EIO`,
//! `EPERM` for a server refusing writes, `ENOSPC`, ...); a dropped connection or a reply that
//! does not come within the timeout fails the request (`ConnectionAborted`, `TimedOut`), and
//! the connection is closed and its other requests failed. A read that failed so is retried
//! once on a fresh connection (reading twice is harmless); a write is not: its error goes to
//! the engine, whose journal then aborts (EIO on fsync, EROFS after).

mod conn;
pub(crate) mod handshake;

use crate::dev::nbd::conn::{Cmd, Conn};
use crate::dev::nbd::handshake::tflags;
use crate::dev::BlockDevice;
use crate::sync::RwLock;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Where an NBD server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdServer {
    /// `host:port` (a name, an IPv4 address or an IPv6 address without brackets).
    Tcp { host: String, port: u16 },
    /// A Unix socket.
    Unix(PathBuf),
}

/// How to reach an export, and how to use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdConfig {
    pub server: NbdServer,
    /// The export's name ("" is the server's default export).
    pub export: String,
    /// Connections to open when the server allows several (`NBD_FLAG_CAN_MULTI_CONN`);
    /// `None` picks one per available core, at least two and at most eight.
    pub connections: Option<usize>,
    /// How long to wait for a reply before the connection is given up.
    pub timeout: Duration,
}

impl NbdConfig {
    /// The default export of `server`, with default connections and timeout.
    pub fn new(server: NbdServer, export: impl Into<String>) -> Self {
        NbdConfig { server, export: export.into(), connections: None, timeout: Duration::from_secs(60) }
    }
}

/// An NBD export.
pub struct NbdDevice {
    cfg: NbdConfig,
    info: handshake::ExportInfo,
    /// Open connections; a failed one is replaced in place. [own lock: readers pick a
    /// connection, a reconnection writes]
    conns: RwLock<Vec<Arc<Conn>>>,
    /// Round-robin position. [atomic]
    next: AtomicUsize,
    /// Largest request sent (the server's limit, at most 32 MiB).
    max_request: usize,
}

/// The protocol's usual limit on one request's length (nbdkit and qemu-nbd take 32 MiB).
const MAX_REQUEST: u32 = 32 << 20;

impl NbdDevice {
    /// Connects to the export. A writable open of an export the server offers read-only is
    /// refused (`EROFS`).
    pub fn connect(cfg: NbdConfig, writable: bool) -> io::Result<Self> {
        let (first, info) = Conn::open(&cfg)?;
        if writable && info.flags & tflags::READ_ONLY != 0 {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        let want = if info.flags & tflags::CAN_MULTI_CONN != 0 {
            cfg.connections
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8))
        } else {
            1
        };
        let mut conns = vec![Arc::new(first)];
        for _ in 1..want.max(1) {
            let (c, i) = Conn::open(&cfg)?;
            if i.size != info.size {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "NBD export changed size between connections",
                ));
            }
            conns.push(Arc::new(c));
        }
        let max = info.max_request.filter(|&m| m > 0).unwrap_or(MAX_REQUEST).min(MAX_REQUEST);
        Ok(NbdDevice {
            cfg,
            info,
            conns: RwLock::new(conns),
            next: AtomicUsize::new(0),
            max_request: max as usize,
        })
    }

    /// Number of open connections.
    pub fn connections(&self) -> usize {
        self.conns.read().len()
    }

    /// Whether the server offered several connections (`NBD_FLAG_CAN_MULTI_CONN`).
    pub fn multi_conn(&self) -> bool {
        self.info.flags & tflags::CAN_MULTI_CONN != 0
    }

    /// Whether the server serves the export read-only.
    pub fn read_only(&self) -> bool {
        self.info.flags & tflags::READ_ONLY != 0
    }

    /// Tells the server the bytes are no longer needed (`NBD_CMD_TRIM`), where it offers
    /// trimming; otherwise does nothing.
    pub fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.info.flags & tflags::SEND_TRIM == 0 {
            return Ok(());
        }
        self.check(offset, len)?;
        let mut at = offset;
        while at < offset + len {
            let n = u32::try_from((offset + len - at).min(self.max_request as u64)).unwrap_or(MAX_REQUEST);
            self.pick().request(Cmd::Trim, at, n, None, self.cfg.timeout)?;
            at += u64::from(n);
        }
        Ok(())
    }

    /// Writes `buf` at `offset` and returns once it is durable (`NBD_CMD_FLAG_FUA` where the
    /// server offers it, else a write and a flush).
    pub fn write_durable(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.info.flags & tflags::SEND_FUA == 0 {
            self.write_at(buf, offset)?;
            return self.flush();
        }
        self.check(offset, buf.len() as u64)?;
        for (i, chunk) in buf.chunks(self.max_request).enumerate() {
            let at = offset + (i * self.max_request) as u64;
            self.pick().request(Cmd::WriteFua, at, len32(chunk.len()), Some(chunk), self.cfg.timeout)?;
        }
        Ok(())
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(e) if e <= self.info.size => Ok(()),
            _ => Err(io::ErrorKind::UnexpectedEof.into()),
        }
    }

    /// The next live connection, round robin.
    fn pick(&self) -> Arc<Conn> {
        let conns = self.conns.read();
        let n = conns.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n).map(|i| &conns[(start + i) % n]).find(|c| c.alive()).unwrap_or(&conns[start % n]).clone()
    }

    /// Replaces `dead` with a fresh connection (unless another thread already did).
    fn reconnect(&self, dead: &Arc<Conn>) -> io::Result<Arc<Conn>> {
        let mut conns = self.conns.write();
        let Some(slot) = conns.iter().position(|c| Arc::ptr_eq(c, dead)) else {
            return Ok(conns[0].clone());
        };
        let (c, info) = Conn::open(&self.cfg)?;
        if info.size != self.info.size || info.flags != self.info.flags {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "NBD export changed on reconnection"));
        }
        conns[slot] = Arc::new(c);
        Ok(conns[slot].clone())
    }

    fn read_chunk(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let conn = self.pick();
        match conn.request(Cmd::Read, offset, len32(buf.len()), None, self.cfg.timeout) {
            Ok(data) => copy_reply(buf, &data),
            // The connection broke under this read: reading again elsewhere is safe.
            Err(e) if !conn.alive() => {
                let fresh = self.reconnect(&conn).map_err(|_| e)?;
                let data = fresh.request(Cmd::Read, offset, len32(buf.len()), None, self.cfg.timeout)?;
                copy_reply(buf, &data)
            }
            Err(e) => Err(e),
        }
    }
}

fn copy_reply(buf: &mut [u8], data: &[u8]) -> io::Result<()> {
    if data.len() != buf.len() {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short NBD read"));
    }
    buf.copy_from_slice(data);
    Ok(())
}

/// A chunk's length, which is at most `max_request` (32 MiB) and so fits.
fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(MAX_REQUEST)
}

impl BlockDevice for NbdDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        let max = self.max_request;
        for (i, chunk) in buf.chunks_mut(max).enumerate() {
            self.read_chunk(chunk, offset + (i * max) as u64)?;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        for (i, chunk) in buf.chunks(self.max_request).enumerate() {
            let at = offset + (i * self.max_request) as u64;
            self.pick().request(Cmd::Write, at, len32(chunk.len()), Some(chunk), self.cfg.timeout)?;
        }
        Ok(())
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        // One request for the pieces together (a journal transaction's blocks), in chunks the
        // server takes.
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if bufs.len() <= 1 || total > self.max_request {
            let mut at = offset;
            for b in bufs {
                self.write_at(b, at)?;
                at += b.len() as u64;
            }
            return Ok(());
        }
        self.write_at(&bufs.concat(), offset)
    }

    fn flush(&self) -> io::Result<()> {
        if self.info.flags & tflags::SEND_FLUSH == 0 {
            return Ok(()); // The server answers writes only once they are durable.
        }
        // With multi-conn one flush covers the writes answered on every connection; without,
        // there is only one connection.
        self.pick().request(Cmd::Flush, 0, 0, None, self.cfg.timeout).map(drop)
    }

    fn size(&self) -> u64 {
        self.info.size
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.trim(offset, len)
    }

    fn write_durable(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        // The inherent method (FUA where offered), which takes precedence in this path.
        NbdDevice::write_durable(self, buf, offset)
    }
}
