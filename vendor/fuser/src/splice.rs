//! Replies whose data is spliced from host files into /dev/fuse (Linux): the bytes go from the
//! source file's page cache into a pipe as page references, and from the pipe into the
//! request's pages, so they are copied once in the kernel and never through the daemon's
//! memory (libfuse's `FUSE_BUF_SPLICE_MOVE` replies do the same).
//!
//! Each thread keeps one pipe. A reply is built in it whole (its header written, then every
//! piece spliced in) before one `splice` hands it to /dev/fuse, which takes a message in one
//! call. Anything that fails before that call leaves the pipe drained and nothing sent, so
//! the caller can still reply another way.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice};
use zerocopy::IntoBytes;

use crate::ll::RequestId;
use crate::ll::fuse_abi as abi;

/// A piece of a reply's data: `len` bytes at `offset` of `fd`.
#[derive(Debug, Clone, Copy)]
pub struct HostPiece<'a> {
    /// The file the bytes are in.
    pub fd: BorrowedFd<'a>,
    /// Where they start in it.
    pub offset: u64,
    /// How many.
    pub len: usize,
}

/// What a pipe buffer holds at most: one page (a piece adds a buffer per page it touches).
fn page() -> usize {
    page_size::get()
}

/// Pipe sizes asked for, in turn: room for a 1 MiB reply and its header (a power of two of
/// pages), then the most `/proc/sys/fs/pipe-max-size` lets a process without
/// CAP_SYS_RESOURCE have by default.
const WANT_PIPE: [i32; 2] = [2 << 20, 1 << 20];

struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Its size in bytes, as the kernel set it.
    size: usize,
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        // Above `/proc/sys/fs/pipe-max-size` only with CAP_SYS_RESOURCE: a daemon without it
        // keeps what it can get, and splices only the replies that fit.
        let size = match WANT_PIPE
            .iter()
            .find_map(|&n| fcntl(&write, FcntlArg::F_SETPIPE_SZ(n)).ok())
        {
            Some(n) => n,
            None => fcntl(&write, FcntlArg::F_GETPIPE_SZ)?,
        };
        Ok(Pipe {
            read,
            write,
            size: usize::try_from(size).unwrap_or(0),
        })
    }

    /// Empties the pipe after a reply that was not sent.
    fn drain(&self) {
        let mut scratch = [0u8; 4096];
        while let Ok(n) = nix::unistd::read(&self.read, &mut scratch) {
            if n == 0 {
                break;
            }
        }
    }
}

thread_local! {
    /// This thread's pipe, made at its first spliced reply (the error, if it could not be).
    static PIPE: RefCell<Option<io::Result<Pipe>>> = const { RefCell::new(None) };
}

/// Whether the pipe buffers `pieces` fill, and a header's, fit in `size` bytes.
fn fits(pieces: &[HostPiece<'_>], size: usize) -> bool {
    let mut bufs = 1usize;
    for p in pieces {
        if p.len == 0 {
            continue;
        }
        let page = page() as u64;
        let first = p.offset / page;
        let last = p.offset.saturating_add(p.len as u64 - 1) / page;
        bufs = bufs.saturating_add(usize::try_from(last - first + 1).unwrap_or(usize::MAX));
    }
    bufs.saturating_mul(page()) <= size
}

/// The outcome of a spliced reply.
pub(crate) enum Spliced {
    /// The reply went out, or the request it answers is gone (`ENOENT`: interrupted), which a
    /// written reply would meet too.
    Sent(io::Result<()>),
    /// Nothing was sent, or /dev/fuse refused the message for another reason: the caller
    /// still owes the reply (should the kernel have ended the request after all, a second
    /// reply only meets `ENOENT`, while a reply never sent would leave the reader waiting).
    NotSent,
}

/// Sends the reply to `unique` carrying `pieces` one after another, spliced into `dev`.
pub(crate) fn reply(dev: BorrowedFd<'_>, unique: RequestId, pieces: &[HostPiece<'_>]) -> Spliced {
    PIPE.with_borrow_mut(|slot| {
        let pipe = match slot.get_or_insert_with(Pipe::new) {
            Ok(p) => p,
            Err(_) => return Spliced::NotSent,
        };
        let data: usize = pieces.iter().map(|p| p.len).sum();
        let total = size_of::<abi::fuse_out_header>() + data;
        let Ok(len) = u32::try_from(total) else {
            return Spliced::NotSent;
        };
        if !fits(pieces, pipe.size) {
            return Spliced::NotSent;
        }
        let header = abi::fuse_out_header {
            len,
            error: 0,
            unique: unique.0,
        };
        if !fill(pipe, header.as_bytes(), pieces) {
            pipe.drain();
            return Spliced::NotSent;
        }
        let r = loop {
            match splice(
                &pipe.read,
                None,
                dev,
                None,
                total,
                SpliceFFlags::SPLICE_F_MOVE,
            ) {
                Ok(n) if n == total => break Spliced::Sent(Ok(())),
                Err(Errno::EINTR) => continue,
                Err(Errno::ENOENT) => break Spliced::Sent(Err(Errno::ENOENT.into())),
                Ok(_) | Err(_) => break Spliced::NotSent,
            }
        };
        // The kernel takes the whole message from the pipe even when it refuses it (an
        // interrupted request): whatever is left would corrupt the next reply.
        pipe.drain();
        r
    })
}

/// Puts the header and every piece in the (empty) pipe; false if any of it did not go in.
fn fill(pipe: &Pipe, header: &[u8], pieces: &[HostPiece<'_>]) -> bool {
    match nix::unistd::write(&pipe.write, header) {
        Ok(n) if n == header.len() => {}
        _ => return false,
    }
    for p in pieces {
        let Ok(mut off) = i64::try_from(p.offset) else {
            return false;
        };
        let mut left = p.len;
        while left > 0 {
            match splice(
                p.fd,
                Some(&mut off),
                pipe.write.as_fd(),
                None,
                left,
                SpliceFFlags::SPLICE_F_NONBLOCK,
            ) {
                // Zero: the file ends before the piece does.
                Ok(0) => return false,
                Ok(n) => left -= n,
                Err(Errno::EINTR) => {}
                Err(_) => return false,
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    const PAGE: usize = 4096;

    #[test]
    fn pieces_fit_by_the_pages_they_touch() {
        assert_eq!(page(), PAGE, "the figures are for 4 KiB pages");
        let f = std::fs::File::open("/dev/null").unwrap();
        let p = |offset, len| HostPiece {
            fd: f.as_fd(),
            offset,
            len,
        };
        // A header and two pages.
        assert!(fits(&[p(0, 8192)], 3 * PAGE));
        assert!(!fits(&[p(1, 8192)], 3 * PAGE));
        assert!(fits(&[p(1, 8192)], 4 * PAGE));
        assert!(fits(&[p(0, 4096), p(8192, 0), p(4096, 4096)], 3 * PAGE));
        assert!(fits(&[], PAGE));
    }

    #[test]
    fn a_reply_is_its_header_and_the_pieces_in_order() {
        let dir = std::env::temp_dir().join(format!("fuser-splice-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("src");
        let bytes: Vec<u8> = (0..3 * PAGE).map(|i| (i % 251) as u8).collect();
        std::fs::File::create(&src)
            .unwrap()
            .write_all(&bytes)
            .unwrap();
        let f = std::fs::File::open(&src).unwrap();
        // A pipe stands in for /dev/fuse: the reply must arrive whole, in one splice.
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        let _ = fcntl(&w, FcntlArg::F_SETPIPE_SZ(1 << 20));
        let pieces = [
            HostPiece {
                fd: f.as_fd(),
                offset: 5000,
                len: 3000,
            },
            HostPiece {
                fd: f.as_fd(),
                offset: 0,
                len: 100,
            },
        ];
        assert!(matches!(
            reply(w.as_fd(), RequestId(77), &pieces),
            Spliced::Sent(Ok(()))
        ));
        drop(w);
        let mut got = Vec::new();
        std::fs::File::from(r).read_to_end(&mut got).unwrap();
        let hdr = size_of::<abi::fuse_out_header>();
        assert_eq!(got.len(), hdr + 3100);
        assert_eq!(
            u32::from_ne_bytes(got[0..4].try_into().unwrap()) as usize,
            hdr + 3100
        );
        assert_eq!(u64::from_ne_bytes(got[8..16].try_into().unwrap()), 77);
        assert_eq!(&got[hdr..hdr + 3000], &bytes[5000..8000]);
        assert_eq!(&got[hdr + 3000..], &bytes[..100]);

        // A piece past the end of its file sends nothing, and leaves the pipe empty for the
        // next reply.
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).unwrap();
        let past = [HostPiece {
            fd: f.as_fd(),
            offset: 2 * PAGE as u64,
            len: 2 * PAGE,
        }];
        assert!(matches!(
            reply(w.as_fd(), RequestId(78), &past),
            Spliced::NotSent
        ));
        assert!(matches!(
            nix::unistd::read(&r, &mut [0u8; 16]),
            Err(Errno::EAGAIN)
        ));
        let one = [HostPiece {
            fd: f.as_fd(),
            offset: 0,
            len: 10,
        }];
        assert!(matches!(
            reply(w.as_fd(), RequestId(79), &one),
            Spliced::Sent(Ok(()))
        ));
        let mut buf = [0u8; 64];
        let n = nix::unistd::read(&r, &mut buf).unwrap();
        assert_eq!(n, hdr + 10);
        assert_eq!(&buf[hdr..n], &bytes[..10]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
