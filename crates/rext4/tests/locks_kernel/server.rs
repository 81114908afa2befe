//! Lock servers: POSIX owners on the kernel side, as helper processes.

use crate::*;

pub const SERVER_ENV: &str = "REXT4_LOCK_SERVER";
/// Marks the server's answers among whatever else the test harness prints.
pub const MARK: &str = "@lk ";
pub const SLOTS: usize = 2;

/// Not a test: the helper process of the kernel side (see the file's head). An ordinary run
/// returns at once.
#[test]
pub fn lock_server() {
    if std::env::var_os(SERVER_ENV).is_none() {
        return;
    }
    serve();
    std::process::exit(0);
}

extern "C" fn on_signal(_: libc::c_int) {}

pub fn serve() {
    // SIGUSR1 interrupts a blocked F_SETLKW with EINTR (no SA_RESTART), as a Cancel does on
    // rext4's side.
    // SAFETY: installs a handler that does nothing.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }
    let say = |s: String| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{MARK}{s}");
        let _ = out.flush();
    };
    // SAFETY: gettid has no preconditions.
    say(format!("ready {} {}", std::process::id(), unsafe { libc::gettid() }));
    let mut slots: Vec<Option<OwnedFd>> = (0..SLOTS).map(|_| None).collect();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let w: Vec<&str> = line.split_whitespace().collect();
        let fd = |s: &str| slots[s.parse::<usize>().unwrap()].as_ref().expect("slot open").as_raw_fd();
        let ans = match w[..] {
            ["open", s, path] => {
                let f = open_k(Path::new(path));
                let n = f.as_raw_fd();
                slots[s.parse::<usize>().unwrap()] = Some(f);
                format!("fd {n}")
            }
            ["close", s] => {
                slots[s.parse::<usize>().unwrap()] = None;
                "ok".into()
            }
            ["lk", s, ofd, cmd, ty, start, len] => {
                let cmd = match cmd {
                    "set" => Cmd::Set,
                    "setw" => Cmd::SetW,
                    _ => Cmd::Get,
                };
                let r = rq(Ty::parse(ty), start.parse().unwrap(), len.parse().unwrap());
                match fcntl_lock(fd(s), ofd == "ofd", cmd, r) {
                    Err(e) => format!("err {e}"),
                    Ok(None) => "none".into(),
                    Ok(Some((t, s, l, p))) => format!("lk {t:?} {s} {l} {p}"),
                }
            }
            ["flock", s, op, wait] => {
                let op = match op {
                    "sh" => FlockOp::Shared,
                    "ex" => FlockOp::Exclusive,
                    _ => FlockOp::Unlock,
                };
                match flock_fd(fd(s), op, wait == "wait") {
                    Err(e) => format!("err {e}"),
                    Ok(()) => "none".into(),
                }
            }
            _ => panic!("lock server: bad command {line:?}"),
        };
        say(ans);
    }
}

/// A lock server process: one POSIX owner, with `SLOTS` descriptions of the current file.
pub struct Server {
    pub child: std::process::Child,
    pub stdin: std::process::ChildStdin,
    pub lines: mpsc::Receiver<String>,
    pub pid: i32,
    pub tid: i32,
    pub fds: [RawFd; SLOTS],
}

impl Server {
    pub fn spawn() -> Server {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new(exe)
            .args(["server::lock_server", "--exact", "--nocapture", "--test-threads=1"])
            .env(SERVER_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn lock server");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(l) = line else { break };
                // The harness's "test lock_server ... " may begin the first line.
                if let Some((_, m)) = l.split_once(MARK) {
                    if tx.send(m.to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        let ready = lines.recv_timeout(Duration::from_secs(60)).expect("lock server did not start");
        let w: Vec<&str> = ready.split_whitespace().collect();
        assert_eq!(w[0], "ready", "{ready}");
        Server {
            child,
            stdin,
            lines,
            pid: w[1].parse().unwrap(),
            tid: w[2].parse().unwrap(),
            fds: [-1; SLOTS],
        }
    }

    pub fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").expect("write to lock server");
    }

    pub fn recv(&self, t: Duration) -> Option<String> {
        self.lines.recv_timeout(t).ok()
    }

    pub fn call(&mut self, cmd: &str) -> String {
        self.send(cmd);
        self.recv(Duration::from_secs(20)).unwrap_or_else(|| panic!("lock server gave no answer to {cmd:?}"))
    }

    pub fn open(&mut self, slot: usize, path: &Path) {
        let a = self.call(&format!("open {slot} {}", path.display()));
        self.fds[slot] = a.strip_prefix("fd ").expect("fd").parse().unwrap();
    }

    pub fn close(&mut self, slot: usize) {
        assert_eq!(self.call(&format!("close {slot}")), "ok");
        self.fds[slot] = -1;
    }

    /// Interrupts the server's blocked call with a signal to the thread making it.
    pub fn interrupt(&self) {
        // SAFETY: a signal to a thread of our own child, which handles it.
        unsafe { libc::syscall(libc::SYS_tgkill, self.pid, self.tid, libc::SIGUSR1) };
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn lk_cmd(slot: usize, ofd: bool, cmd: Cmd, r: Req) -> String {
    let c = match cmd {
        Cmd::Set => "set",
        Cmd::SetW => "setw",
        Cmd::Get => "get",
    };
    let o = if ofd { "ofd" } else { "posix" };
    format!("lk {slot} {o} {c} {:?} {} {}", r.ty, r.start, r.len)
}

pub fn flock_cmd(slot: usize, op: FlockOp, wait: bool) -> String {
    let o = match op {
        FlockOp::Shared => "sh",
        FlockOp::Exclusive => "ex",
        FlockOp::Unlock => "un",
    };
    format!("flock {slot} {o} {}", if wait { "wait" } else { "nb" })
}

/// A server's answer line as an answer.
pub fn server_ans(line: &str, cmd: Cmd, pids: &[i32]) -> Ans {
    let w: Vec<&str> = line.split_whitespace().collect();
    let raw = match w[..] {
        ["none"] => Ok(None),
        ["err", e] => Err(e.parse().unwrap()),
        ["lk", t, s, l, p] => {
            Ok(Some((Ty::parse(t), s.parse().unwrap(), l.parse().unwrap(), p.parse().unwrap())))
        }
        _ => panic!("lock server answered {line:?}"),
    };
    kernel_ans(raw, cmd, pids)
}
