//! Image addresses: what a user may write where an image path goes.
//!
//! ```text
//! disk.img                          an image file or block device
//! disk.img@2                        its partition 2 (GPT or MBR); @root, @label=NAME, @type=linux
//! nbd://host[:port][/export]        an export of an NBD server over TCP (port 10809 by default)
//! nbd+unix:///export?socket=PATH    the same over a Unix socket
//! nbd://host/export@2               a partition of an NBD export
//! ```
//!
//! NBD addresses are the URIs of the NBD project's URI specification (`nbds` and TLS are not
//! supported); rext4 also reads `connections=N` (how many connections when the server allows
//! several) and `timeout=SECONDS` from the query.
//!
//! A path that names an existing file is always that file, even if it contains `@`.

use crate::dev::nbd::{NbdConfig, NbdDevice, NbdServer};
use crate::dev::partition::{PartitionDevice, Selector};
use crate::dev::{BlockDevice, FileDevice};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// What holds the disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    File(PathBuf),
    Nbd(NbdConfig),
}

/// A parsed image address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub target: Target,
    /// The partition chosen by an `@` suffix, if any.
    pub partition: Option<Selector>,
}

/// The default NBD port.
pub const NBD_PORT: u16 = 10809;

/// Whether `s` is written as an NBD URI.
pub fn is_nbd_uri(s: &str) -> bool {
    ["nbd://", "nbd+unix://", "nbds://", "nbds+unix://"].iter().any(|p| s.starts_with(p))
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl Address {
    /// Parses `path`. A path naming an existing file is that file; otherwise a trailing `@SEL`
    /// (with no `/` in it) chooses a partition.
    pub fn parse(path: &Path) -> io::Result<Address> {
        let file = |p: &Path| Address { target: Target::File(p.to_path_buf()), partition: None };
        let Some(s) = path.to_str() else { return Ok(file(path)) };
        if !is_nbd_uri(s) && path.symlink_metadata().is_ok() {
            return Ok(file(path));
        }
        let (base, partition) = match s.rsplit_once('@') {
            Some((b, sel)) if !sel.contains('/') && !b.is_empty() => (b, Some(Selector::parse(sel)?)),
            _ => (s, None),
        };
        if is_nbd_uri(base) {
            return Ok(Address { target: Target::Nbd(parse_nbd_uri(base)?), partition });
        }
        if partition.is_some() && Path::new(base).symlink_metadata().is_ok() {
            return Ok(Address { target: Target::File(PathBuf::from(base)), partition });
        }
        Ok(file(path))
    }

    /// Opens the device: the file or export, then the partition.
    pub fn open(&self, writable: bool) -> io::Result<Arc<dyn BlockDevice>> {
        let disk: Arc<dyn BlockDevice> = match &self.target {
            Target::File(p) => Arc::new(FileDevice::open(p, writable)?),
            Target::Nbd(cfg) => Arc::new(NbdDevice::connect(cfg.clone(), writable)?),
        };
        match &self.partition {
            None => Ok(disk),
            Some(sel) => Ok(Arc::new(PartitionDevice::open(disk, sel)?)),
        }
    }
}

/// Opens what `path` addresses (see the module documentation), for writing too if `writable`.
pub fn open(path: &Path, writable: bool) -> io::Result<Arc<dyn BlockDevice>> {
    Address::parse(path)?.open(writable)
}

/// Parses `nbd://host[:port][/export][?query]` and `nbd+unix:///export?socket=PATH`.
pub fn parse_nbd_uri(uri: &str) -> io::Result<NbdConfig> {
    let bad = |why: &str| invalid(format!("{uri}: {why}"));
    let (scheme, rest) = uri.split_once("://").ok_or_else(|| bad("not a URI"))?;
    if scheme.starts_with("nbds") {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{uri}: NBD over TLS is not supported"),
        ));
    }
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let export = percent_decode(path).ok_or_else(|| bad("bad %-escape in the export name"))?;
    let mut socket = None;
    let mut cfg_conns = None;
    let mut timeout = None;
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        let v = percent_decode(v).ok_or_else(|| bad("bad %-escape in the query"))?;
        match k {
            "socket" => socket = Some(PathBuf::from(v)),
            "connections" => {
                cfg_conns = Some(
                    v.parse::<usize>()
                        .ok()
                        .filter(|n| (1..=64).contains(n))
                        .ok_or_else(|| bad("connections must be 1 to 64"))?,
                )
            }
            "timeout" => {
                let secs = v
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s > 0.0)
                    .ok_or_else(|| bad("bad timeout"))?;
                timeout = Some(Duration::from_secs_f64(secs.min(86_400.0)));
            }
            // Other keys (tls-*, ...) belong to other clients.
            _ => {}
        }
    }
    let server = match scheme {
        "nbd" => {
            let (host, port) = split_host_port(authority).ok_or_else(|| bad("bad host or port"))?;
            NbdServer::Tcp { host, port }
        }
        "nbd+unix" => {
            if !authority.is_empty() {
                return Err(bad("nbd+unix takes no host"));
            }
            NbdServer::Unix(socket.ok_or_else(|| bad("nbd+unix needs ?socket=PATH"))?)
        }
        _ => return Err(bad("unknown scheme")),
    };
    let mut cfg = NbdConfig::new(server, export);
    cfg.connections = cfg_conns;
    if let Some(t) = timeout {
        cfg.timeout = t;
    }
    Ok(cfg)
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`.
fn split_host_port(a: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(r) = a.strip_prefix('[') {
        let (h, p) = r.split_once(']')?;
        (h, p.strip_prefix(':'))
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (a, None),
        }
    };
    let port = match port {
        None | Some("") => NBD_PORT,
        Some(p) => p.parse().ok()?,
    };
    let host = if host.is_empty() { "localhost" } else { host };
    Some((host.to_string(), port))
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nbd(s: &str) -> Address {
        Address::parse(Path::new(s)).unwrap()
    }

    #[test]
    fn nbd_uris() {
        let a = nbd("nbd://example.test:10810/disk%201");
        let Target::Nbd(c) = a.target else { panic!() };
        assert_eq!(c.server, NbdServer::Tcp { host: "example.test".into(), port: 10810 });
        assert_eq!(c.export, "disk 1");
        let a = nbd("nbd://[::1]/x@2");
        assert_eq!(a.partition, Some(Selector::Number(2)));
        let Target::Nbd(c) = a.target else { panic!() };
        assert_eq!(c.server, NbdServer::Tcp { host: "::1".into(), port: NBD_PORT });
        let a = nbd("nbd+unix:///exp?socket=/run/nbd.sock&connections=3&timeout=1.5@root");
        let Target::Nbd(c) = a.target else { panic!() };
        assert_eq!(c.server, NbdServer::Unix("/run/nbd.sock".into()));
        assert_eq!(
            (c.export.as_str(), c.connections, c.timeout),
            ("exp", Some(3), Duration::from_millis(1500))
        );
        assert_eq!(a.partition, Some(Selector::Label { name: "root".into(), or_type: true }));
        let Target::Nbd(c) = nbd("nbd://h").target else { panic!() };
        assert_eq!(c.export, "");
        for bad in [
            "nbd+unix:///x",
            "nbd://h:99999/",
            "nbds://h/",
            "nbd://h/%zz",
            "nbd+unix://h/x?socket=/s",
            "nbd://h/x?connections=0",
        ] {
            assert!(Address::parse(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn files_and_partitions() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        std::fs::write(&img, b"").unwrap();
        let with = |s: &str| Address::parse(&dir.path().join(s)).unwrap();
        assert_eq!(with("disk.img").target, Target::File(img.clone()));
        let a = with("disk.img@2");
        assert_eq!((a.target, a.partition), (Target::File(img.clone()), Some(Selector::Number(2))));
        // A file whose name has an @ is that file.
        std::fs::write(dir.path().join("a@1"), b"").unwrap();
        assert_eq!(with("a@1").partition, None);
        // Nothing there: the path as given (opening it says it is missing).
        assert_eq!(with("missing@1").partition, None);
    }
}
