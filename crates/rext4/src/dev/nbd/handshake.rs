//! The NBD handshake (protocol document, "Newstyle negotiation"): fixed newstyle, the export
//! chosen with `NBD_OPT_GO` (its size, transmission flags and block-size limits come back as
//! `NBD_REP_INFO`), or with `NBD_OPT_EXPORT_NAME` from servers that do not know `GO`.
//! Structured replies are not asked for: reads come back as simple replies.

use std::io::{self, Read, Write};

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
const IHAVEOPT: u64 = 0x4948_4156_454F_5054; // "IHAVEOPT"
const OLDSTYLE_MAGIC: u64 = 0x0000_4202_8186_1253;
const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

const FLAG_FIXED_NEWSTYLE: u16 = 1;
const FLAG_NO_ZEROES: u16 = 2;

const OPT_EXPORT_NAME: u32 = 1;
const OPT_GO: u32 = 7;

const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_ERR_UNSUP: u32 = (1 << 31) | 1;

const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags (`NBD_FLAG_*`, sent with the export's size).
pub(crate) mod tflags {
    pub(crate) const READ_ONLY: u16 = 1 << 1;
    pub(crate) const SEND_FLUSH: u16 = 1 << 2;
    pub(crate) const SEND_FUA: u16 = 1 << 3;
    pub(crate) const SEND_TRIM: u16 = 1 << 5;
    pub(crate) const CAN_MULTI_CONN: u16 = 1 << 8;
}

/// What the server said about the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExportInfo {
    pub size: u64,
    pub flags: u16,
    /// Largest request the server takes (`NBD_INFO_BLOCK_SIZE`), if it said.
    pub max_request: Option<u32>,
}

fn proto(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("NBD handshake: {}", msg.into()))
}

fn u16_of<R: Read>(r: &mut R) -> io::Result<u16> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}
fn u32_of<R: Read>(r: &mut R) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}
fn u64_of<R: Read>(r: &mut R) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// Runs the handshake on a fresh connection and selects `export`.
pub(crate) fn negotiate<S: Read + Write>(s: &mut S, export: &str) -> io::Result<ExportInfo> {
    if u64_of(s)? != NBDMAGIC {
        return Err(proto("not an NBD server"));
    }
    match u64_of(s)? {
        IHAVEOPT => {}
        OLDSTYLE_MAGIC => return Err(proto("oldstyle servers are not supported")),
        _ => return Err(proto("bad magic")),
    }
    let hflags = u16_of(s)?;
    if hflags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(proto("server does not speak fixed newstyle"));
    }
    let no_zeroes = hflags & FLAG_NO_ZEROES != 0;
    let cflags = u32::from(FLAG_FIXED_NEWSTYLE | (hflags & FLAG_NO_ZEROES));
    s.write_all(&cflags.to_be_bytes())?;

    let name = export.as_bytes();
    let name_len =
        u32::try_from(name.len()).ok().filter(|&n| n <= 4096).ok_or_else(|| proto("export name too long"))?;
    let mut data = Vec::with_capacity(name.len() + 8);
    data.extend_from_slice(&name_len.to_be_bytes());
    data.extend_from_slice(name);
    data.extend_from_slice(&1u16.to_be_bytes());
    data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    send_option(s, OPT_GO, &data)?;

    let (mut size_flags, mut max_request) = (None, None);
    loop {
        if u64_of(s)? != REPLY_MAGIC {
            return Err(proto("bad option reply magic"));
        }
        let (opt, kind, len) = (u32_of(s)?, u32_of(s)?, u32_of(s)?);
        if opt != OPT_GO {
            return Err(proto("reply to an option not sent"));
        }
        // Replies are small; a hostile length is not allocated.
        if len > 64 * 1024 {
            return Err(proto("option reply too long"));
        }
        let mut body = vec![0u8; len as usize];
        s.read_exact(&mut body)?;
        match kind {
            REP_ACK => break,
            REP_INFO if body.len() >= 2 => {
                let info = u16::from_be_bytes([body[0], body[1]]);
                if info == INFO_EXPORT && body.len() >= 12 {
                    let size = u64::from_be_bytes(body[2..10].try_into().map_err(|_| proto("short info"))?);
                    size_flags = Some((size, u16::from_be_bytes([body[10], body[11]])));
                } else if info == INFO_BLOCK_SIZE && body.len() >= 14 {
                    max_request = Some(u32::from_be_bytes([body[10], body[11], body[12], body[13]]));
                }
            }
            REP_INFO => return Err(proto("short info reply")),
            REP_ERR_UNSUP => return export_name(s, name, no_zeroes),
            e if e & (1 << 31) != 0 => {
                let msg = String::from_utf8_lossy(&body).into_owned();
                return Err(refused(e, export, &msg));
            }
            _ => {} // Unknown non-error replies are ignored, as the protocol says.
        }
    }
    let (size, flags) =
        size_flags.ok_or_else(|| proto("server acknowledged GO without the export's size"))?;
    Ok(ExportInfo { size, flags, max_request })
}

fn send_option<W: Write>(s: &mut W, opt: u32, data: &[u8]) -> io::Result<()> {
    let len = u32::try_from(data.len()).map_err(|_| proto("option too long"))?;
    let mut m = Vec::with_capacity(16 + data.len());
    m.extend_from_slice(&IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&opt.to_be_bytes());
    m.extend_from_slice(&len.to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m)
}

/// The old way to choose an export: the server answers with size and flags, or closes.
fn export_name<S: Read + Write>(s: &mut S, name: &[u8], no_zeroes: bool) -> io::Result<ExportInfo> {
    send_option(s, OPT_EXPORT_NAME, name)?;
    let size = u64_of(s).map_err(|_| proto("server refused the export"))?;
    let flags = u16_of(s)?;
    if !no_zeroes {
        let mut z = [0u8; 124];
        s.read_exact(&mut z)?;
    }
    Ok(ExportInfo { size, flags, max_request: None })
}

/// An option error reply as an I/O error a user can act on.
fn refused(code: u32, export: &str, msg: &str) -> io::Error {
    let (kind, what) = match code & !(1 << 31) {
        2 => (io::ErrorKind::PermissionDenied, "forbidden by the server's policy"),
        3 => (io::ErrorKind::InvalidInput, "invalid request"),
        5 => (io::ErrorKind::Unsupported, "the server requires TLS, which rext4 does not speak"),
        6 => (io::ErrorKind::NotFound, "no such export"),
        7 => (io::ErrorKind::ConnectionAborted, "the server is shutting down"),
        _ => (io::ErrorKind::Other, "refused"),
    };
    let detail = if msg.is_empty() { String::new() } else { format!(": {msg}") };
    io::Error::new(kind, format!("NBD export {export:?}: {what}{detail}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted server: what it says, and what the client wrote to it.
    struct Script {
        input: io::Cursor<Vec<u8>>,
        output: Vec<u8>,
    }
    impl Read for Script {
        fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
            self.input.read(b)
        }
    }
    impl Write for Script {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.output.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn greeting() -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&NBDMAGIC.to_be_bytes());
        v.extend_from_slice(&IHAVEOPT.to_be_bytes());
        v.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        v
    }

    fn reply(v: &mut Vec<u8>, kind: u32, body: &[u8]) {
        v.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
        v.extend_from_slice(&OPT_GO.to_be_bytes());
        v.extend_from_slice(&kind.to_be_bytes());
        v.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
        v.extend_from_slice(body);
    }

    #[test]
    fn go_with_info() {
        let mut v = greeting();
        let mut info = INFO_EXPORT.to_be_bytes().to_vec();
        info.extend_from_slice(&(1u64 << 30).to_be_bytes());
        info.extend_from_slice(&(tflags::SEND_FLUSH | tflags::CAN_MULTI_CONN).to_be_bytes());
        reply(&mut v, REP_INFO, &info);
        let mut bs = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        for n in [1u32, 4096, 1 << 25] {
            bs.extend_from_slice(&n.to_be_bytes());
        }
        reply(&mut v, REP_INFO, &bs);
        reply(&mut v, REP_ACK, &[]);
        let mut s = Script { input: io::Cursor::new(v), output: Vec::new() };
        let e = negotiate(&mut s, "disk").unwrap();
        assert_eq!(
            e,
            ExportInfo {
                size: 1 << 30,
                flags: tflags::SEND_FLUSH | tflags::CAN_MULTI_CONN,
                max_request: Some(1 << 25)
            }
        );
        // Client flags, then IHAVEOPT GO with the name and one info request.
        assert_eq!(&s.output[..4], &3u32.to_be_bytes());
        assert_eq!(&s.output[4..12], &IHAVEOPT.to_be_bytes());
        assert_eq!(&s.output[12..16], &OPT_GO.to_be_bytes());
        assert_eq!(&s.output[20..24], &4u32.to_be_bytes());
        assert_eq!(&s.output[24..28], b"disk");
    }

    #[test]
    fn errors_are_typed() {
        let mut v = greeting();
        reply(&mut v, (1 << 31) | 6, b"nope");
        let mut s = Script { input: io::Cursor::new(v), output: Vec::new() };
        let e = negotiate(&mut s, "x").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        // A hostile length, a truncated stream, a non-NBD peer.
        let mut v = greeting();
        v.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
        v.extend_from_slice(&OPT_GO.to_be_bytes());
        v.extend_from_slice(&REP_INFO.to_be_bytes());
        v.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(negotiate(&mut Script { input: io::Cursor::new(v), output: Vec::new() }, "x").is_err());
        let g = greeting();
        assert!(negotiate(&mut Script { input: io::Cursor::new(g[..10].to_vec()), output: Vec::new() }, "x")
            .is_err());
        assert!(negotiate(
            &mut Script { input: io::Cursor::new(b"HTTP/1.1 200 OK".to_vec()), output: Vec::new() },
            "x"
        )
        .is_err());
        // ACK without the export's size.
        let mut v = greeting();
        reply(&mut v, REP_ACK, &[]);
        assert!(negotiate(&mut Script { input: io::Cursor::new(v), output: Vec::new() }, "x").is_err());
    }
}
