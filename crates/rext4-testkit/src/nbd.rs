//! NBD servers for tests: nbdkit and qemu-nbd started on a Unix socket in a temporary
//! directory (or on a loopback TCP port), stopped on drop; [`require_tool!`](crate::require_tool)
//! skips a test where a server program is missing.

use crate::tools::find_tool;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why `name` cannot be used here (not installed), or `None`. Under
/// `REXT4_REQUIRE_MOUNT=1` (CI, where `.ci/setup` installs it) a missing tool panics.
pub fn why_no_tool(name: &str) -> Option<String> {
    if find_tool(name).is_some() {
        return None;
    }
    let why = format!("{name} is not installed");
    if crate::kernel::mounts_required() {
        panic!("REXT4_REQUIRE_MOUNT=1 but {why}");
    }
    Some(why)
}

/// Returns from the calling test when the program `name` is missing, printing why; panics
/// instead under `REXT4_REQUIRE_MOUNT=1`. `require_tool!(name, value)` returns `value`.
#[macro_export]
macro_rules! require_tool {
    ($name:expr) => {
        $crate::require_tool!($name, ())
    };
    ($name:expr, $ret:expr) => {
        $crate::skip_unless!($crate::why_no_tool($name), "a server program is missing", $ret)
    };
}

/// A running NBD server; killed (SIGKILL) and reaped on drop.
pub struct NbdServe {
    child: Option<Child>,
    _dir: tempfile::TempDir,
    /// Its Unix socket, if it listens on one.
    pub sock: Option<PathBuf>,
    /// Its loopback TCP port, if it listens on one.
    pub port: Option<u16>,
}

/// Where a server listens.
pub enum Listen {
    Unix,
    Tcp,
}

impl NbdServe {
    /// `nbdkit --foreground ARGS` (plugin, filters and parameters in `args`).
    pub fn nbdkit(listen: Listen, args: &[&str]) -> NbdServe {
        let dir = tempfile::Builder::new().prefix("rext4-nbd").tempdir().expect("tempdir");
        let mut cmd = Command::new(find_tool("nbdkit").expect("nbdkit"));
        cmd.arg("--foreground").arg("--exit-with-parent");
        let (sock, port) = match listen {
            Listen::Unix => {
                let s = dir.path().join("nbd.sock");
                cmd.arg("-U").arg(&s);
                (Some(s), None)
            }
            Listen::Tcp => {
                let p = free_port();
                cmd.args(["-i", "127.0.0.1", "-p", &p.to_string()]);
                (None, Some(p))
            }
        };
        cmd.args(args);
        Self::start(cmd, dir, sock, port)
    }

    /// `qemu-nbd --persistent --shared=8 -f FORMAT IMAGE` on a Unix socket.
    pub fn qemu_nbd(image: &Path, format: &str) -> NbdServe {
        let dir = tempfile::Builder::new().prefix("rext4-nbd").tempdir().expect("tempdir");
        let s = dir.path().join("nbd.sock");
        let mut cmd = Command::new(find_tool("qemu-nbd").expect("qemu-nbd"));
        cmd.args(["--persistent", "--shared=8", "--cache=writeback", "-f", format, "-k"]).arg(&s).arg(image);
        Self::start(cmd, dir, Some(s), None)
    }

    fn start(mut cmd: Command, dir: tempfile::TempDir, sock: Option<PathBuf>, port: Option<u16>) -> NbdServe {
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let mut me = NbdServe { child: Some(child), _dir: dir, sock, port };
        let t = Instant::now();
        while !me.listening() {
            if let Some(Ok(Some(st))) = me.child.as_mut().map(Child::try_wait) {
                panic!("{cmd:?} exited at start: {st}");
            }
            assert!(t.elapsed() < Duration::from_secs(20), "{cmd:?} did not start listening");
            std::thread::sleep(Duration::from_millis(20));
        }
        me
    }

    fn listening(&self) -> bool {
        match (&self.sock, self.port) {
            (Some(s), _) => std::os::unix::net::UnixStream::connect(s).is_ok(),
            (None, Some(p)) => std::net::TcpStream::connect(("127.0.0.1", p)).is_ok(),
            _ => false,
        }
    }

    /// The address of `export` on this server (`nbd+unix:///EXPORT?socket=...` or
    /// `nbd://127.0.0.1:PORT/EXPORT`), with `query` (`connections=2`, ...) appended.
    pub fn uri(&self, export: &str, query: &str) -> String {
        match (&self.sock, self.port) {
            (Some(s), _) => {
                let q = if query.is_empty() { String::new() } else { format!("&{query}") };
                format!("nbd+unix:///{export}?socket={}{q}", s.display())
            }
            (None, Some(p)) => {
                let q = if query.is_empty() { String::new() } else { format!("?{query}") };
                format!("nbd://127.0.0.1:{p}/{export}{q}")
            }
            _ => unreachable!("a server listens somewhere"),
        }
    }

    /// Stops the server now (SIGKILL) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the server cleanly (SIGTERM: qemu-nbd and nbdkit flush and exit) and waits.
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Ok(pid) = i32::try_from(c.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            let _ = c.wait();
        }
    }
}

impl Drop for NbdServe {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A loopback port free at the moment of asking.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind");
    l.local_addr().expect("local addr").port()
}
