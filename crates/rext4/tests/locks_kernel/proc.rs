//! The kernel's lock lists, from `/proc/locks` and fdinfo.

use crate::*;

/// A lock line of `/proc/locks` or of an fdinfo file.
#[derive(Debug)]
pub struct ProcLock {
    /// `POSIX`, `OFDLCK` or `FLOCK`.
    pub class: String,
    pub ty: Ty,
    pub start: i64,
    /// `None`: to the end of the file.
    pub end: Option<i64>,
}

pub fn proc_locks(text: &str, devino: &str) -> Vec<ProcLock> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.strip_prefix("lock:").unwrap_or(line);
        let mut t: Vec<&str> = line.split_whitespace().collect();
        if t.len() < 2 || !t[0].ends_with(':') {
            continue;
        }
        t.remove(0);
        // A blocked request, listed under the lock it waits for.
        if t[0] == "->" {
            t.remove(0);
        }
        // CLASS ADVISORY TYPE PID DEV:INO START END
        if t.len() != 7 || t[4] != devino {
            continue;
        }
        out.push(ProcLock {
            class: t[0].to_string(),
            ty: match t[2] {
                "READ" => Ty::R,
                "WRITE" => Ty::W,
                _ => Ty::U,
            },
            start: t[5].parse().unwrap(),
            end: if t[6] == "EOF" { None } else { Some(t[6].parse().unwrap()) },
        });
    }
    out
}

/// The kernel's locks set through descriptor `fd` of process `pid`.
pub fn fd_locks(pid: i32, fd: RawFd, devino: &str) -> Vec<ProcLock> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap_or_default();
    proc_locks(&text, devino)
}

/// Whether thread `tid` of `pid` sleeps in a lock call that waits (`F_SETLKW`,
/// `F_OFD_SETLKW`, `flock` without `LOCK_NB`): it does only once its request is queued. Read
/// per thread: `/proc/locks` is one list of the whole system, read in pages that resume by
/// position, so locks others take and drop meanwhile can hide or repeat its entries.
pub fn sleeps_in_lock_call(pid: i32, tid: i32) -> bool {
    let base = format!("/proc/{pid}/task/{tid}");
    let stat = std::fs::read_to_string(format!("{base}/stat")).unwrap_or_default();
    // "TID (COMM) STATE ...": the command may hold spaces, not ") ".
    let sleeping = stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('S'));
    let sc = std::fs::read_to_string(format!("{base}/syscall")).unwrap_or_default();
    let mut w = sc.split_whitespace();
    let nr: i64 = w.next().and_then(|n| n.parse().ok()).unwrap_or(-1);
    let arg = |s: Option<&str>| s.and_then(|a| i64::from_str_radix(a.trim_start_matches("0x"), 16).ok());
    let _fd = w.next();
    let cmd = arg(w.next()).unwrap_or(-1);
    sleeping
        && ((nr == libc::SYS_fcntl && (cmd == libc::F_SETLKW as i64 || cmd == libc::F_OFD_SETLKW as i64))
            || (nr == libc::SYS_flock && cmd & libc::LOCK_NB as i64 == 0))
}

/// Locks by owner label, as `"LABEL TYPE START-END"` (`"LABEL flock TYPE"`), sorted.
#[derive(Default)]
pub struct Listing(Vec<String>);

impl Listing {
    pub fn add(&mut self, who: &str, ty: Ty, start: i64, end: Option<i64>) {
        let end = end.map_or("EOF".to_string(), |e| e.to_string());
        self.0.push(format!("{who} {ty:?} {start}-{end}"));
    }
    pub fn add_proc(&mut self, who: &str, l: &ProcLock) {
        if l.class == "FLOCK" {
            self.add_flock(who, l.ty);
        } else {
            self.add(who, l.ty, l.start, l.end);
        }
    }
    pub fn add_flock(&mut self, who: &str, ty: Ty) {
        self.0.push(format!("{who} flock {ty:?}"));
    }
    pub fn add_rext4(&mut self, who: &str, l: &FileLock) {
        let end = if l.end == u64::MAX { None } else { Some(l.end as i64) };
        self.add(who, Ty::of(l.kind), l.start as i64, end);
    }
    pub fn done(mut self) -> String {
        self.0.sort_by_key(|s| {
            // Numeric order of starts within an owner reads better than text order.
            let mut w = s.split(' ');
            let who = w.next().unwrap_or("").to_string();
            let _ = w.next();
            let start: i64 = w.next().and_then(|r| r.split('-').next()?.parse().ok()).unwrap_or(-1);
            (who, start, s.clone())
        });
        self.0.join(", ")
    }
}

pub fn flock_ty(op: FlockOp) -> Ty {
    if op == FlockOp::Exclusive {
        Ty::W
    } else {
        Ty::R
    }
}
