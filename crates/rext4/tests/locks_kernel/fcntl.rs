//! Requests and answers in fcntl's terms, on both sides.

use crate::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ty {
    R,
    W,
    U,
}

impl Ty {
    pub fn raw(self) -> libc::c_short {
        (match self {
            Ty::R => libc::F_RDLCK,
            Ty::W => libc::F_WRLCK,
            Ty::U => libc::F_UNLCK,
        }) as libc::c_short
    }
    pub fn from_raw(t: libc::c_short) -> Ty {
        match t as libc::c_int {
            libc::F_RDLCK => Ty::R,
            libc::F_WRLCK => Ty::W,
            _ => Ty::U,
        }
    }
    pub fn kind(self) -> LockType {
        match self {
            Ty::R => LockType::Read,
            Ty::W => LockType::Write,
            Ty::U => LockType::Unlock,
        }
    }
    pub fn of(k: LockType) -> Ty {
        match k {
            LockType::Read => Ty::R,
            LockType::Write => Ty::W,
            LockType::Unlock => Ty::U,
        }
    }
    pub fn parse(s: &str) -> Ty {
        match s {
            "R" => Ty::R,
            "W" => Ty::W,
            _ => Ty::U,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmd {
    /// `F_SETLK`
    Set,
    /// `F_SETLKW`
    SetW,
    /// `F_GETLK`
    Get,
}

/// A byte range as `struct flock` gives it: `len` 0 is "to the end of the file".
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Req {
    pub ty: Ty,
    pub start: i64,
    pub len: i64,
}

impl fmt::Debug for Req {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} {} {}", self.ty, self.start, self.len)
    }
}

pub fn rq(ty: Ty, start: i64, len: i64) -> Req {
    Req { ty, start, len }
}

pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// One `fcntl` lock call: `Ok(None)` for a set, or a get finding nothing; `Ok(Some((type,
/// start, len, pid)))` for what a get reports.
pub fn fcntl_lock(fd: RawFd, ofd: bool, cmd: Cmd, r: Req) -> Result<Option<(Ty, i64, i64, i32)>, i32> {
    let c = match (ofd, cmd) {
        (false, Cmd::Set) => libc::F_SETLK,
        (false, Cmd::SetW) => libc::F_SETLKW,
        (false, Cmd::Get) => libc::F_GETLK,
        (true, Cmd::Set) => libc::F_OFD_SETLK,
        (true, Cmd::SetW) => libc::F_OFD_SETLKW,
        (true, Cmd::Get) => libc::F_OFD_GETLK,
    };
    // SAFETY: a plain C struct; all zeroes is valid (and l_pid must be 0 for the OFD forms).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = r.ty.raw();
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = r.start;
    fl.l_len = r.len;
    // SAFETY: `fl` is a valid `struct flock` for the call's lifetime.
    if unsafe { libc::fcntl(fd, c, &mut fl) } < 0 {
        return Err(errno());
    }
    if cmd != Cmd::Get || Ty::from_raw(fl.l_type) == Ty::U {
        return Ok(None);
    }
    Ok(Some((Ty::from_raw(fl.l_type), fl.l_start, fl.l_len, fl.l_pid)))
}

pub fn flock_fd(fd: RawFd, op: FlockOp, wait: bool) -> Result<(), i32> {
    let mut o = match op {
        FlockOp::Shared => libc::LOCK_SH,
        FlockOp::Exclusive => libc::LOCK_EX,
        FlockOp::Unlock => libc::LOCK_UN,
    };
    if !wait {
        o |= libc::LOCK_NB;
    }
    // SAFETY: flock on a descriptor this process holds.
    if unsafe { libc::flock(fd, o) } < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// Whose lock `F_GETLK` reported: a POSIX owner by its index, or some OFD (the kernel gives
/// OFD locks no pid).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    Posix(usize),
    Ofd,
}

/// An answer, the same on both sides when they agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ans {
    Ok,
    Err(i32),
    /// `F_GETLK`: nothing conflicts.
    Free,
    /// `F_GETLK`: the lock reported.
    Held(Ty, i64, i64, Seen),
    /// A request expected to answer at once still waited (it was then interrupted).
    Blocked,
}

impl fmt::Display for Ans {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Ans::Ok => f.write_str("ok"),
            Ans::Free => f.write_str("free"),
            Ans::Blocked => f.write_str("blocked"),
            Ans::Held(t, s, l, Seen::Posix(n)) => write!(f, "{t:?} {s} {l} P{n}"),
            Ans::Held(t, s, l, Seen::Ofd) => write!(f, "{t:?} {s} {l} OFD"),
            Ans::Err(e) => {
                let name = match e {
                    libc::EAGAIN => "EAGAIN",
                    libc::EDEADLK => "EDEADLK",
                    libc::EINTR => "EINTR",
                    libc::EINVAL => "EINVAL",
                    libc::EOVERFLOW => "EOVERFLOW",
                    libc::EBADF => "EBADF",
                    _ => return write!(f, "errno {e}"),
                };
                f.write_str(name)
            }
        }
    }
}

/// A kernel answer; `pids` maps POSIX owners' pids to their indexes.
pub fn kernel_ans(r: Result<Option<(Ty, i64, i64, i32)>, i32>, cmd: Cmd, pids: &[i32]) -> Ans {
    match r {
        Err(e) => Ans::Err(e),
        Ok(None) if cmd == Cmd::Get => Ans::Free,
        Ok(None) => Ans::Ok,
        Ok(Some((t, s, l, pid))) => {
            let who = match pids.iter().position(|&p| p == pid) {
                Some(i) => Seen::Posix(i),
                None if pid == -1 => Seen::Ofd,
                None => panic!("F_GETLK reported pid {pid}, not one of {pids:?}"),
            };
            Ans::Held(t, s, l, who)
        }
    }
}

/// The request as rext4 takes it: `from_len` is where `struct flock`'s range is checked.
pub fn rext4_lock(r: Req) -> Result<FileLock, Ans> {
    let start = u64::try_from(r.start).map_err(|_| Ans::Err(libc::EINVAL))?;
    let len = u64::try_from(r.len).map_err(|_| Ans::Err(libc::EINVAL))?;
    FileLock::from_len(r.ty.kind(), start, len, LockOwner::Ofd(0)).map_err(|e| Ans::Err(e.errno()))
}

pub fn rext4_ans(r: rext4::Result<Option<FileLock>>, cmd: Cmd) -> Ans {
    match r {
        Err(e) => Ans::Err(e.errno()),
        Ok(None) if cmd == Cmd::Get => Ans::Free,
        Ok(None) => Ans::Ok,
        Ok(Some(l)) => {
            let len = if l.end == u64::MAX { 0 } else { l.end.wrapping_sub(l.start).wrapping_add(1) as i64 };
            let who = match l.owner {
                LockOwner::Posix(n) => Seen::Posix(n as usize),
                LockOwner::Ofd(_) => Seen::Ofd,
            };
            Ans::Held(Ty::of(l.kind), l.start as i64, len, who)
        }
    }
}

/// rext4's `F_SETLK`/`F_GETLK` (POSIX owner `posix`, or the OFD forms) on `f`.
pub fn rext4_lock_call(f: &OpenFile, posix: Option<u64>, cmd: Cmd, r: Req, wait: Wait<'_>) -> Ans {
    if cmd == Cmd::Get && r.ty == Ty::U {
        // fcntl checks F_GETLK's type before its range; a caller building the FileLock first
        // would report the range. Ask rext4 about the type alone first, as the kernel does.
        let whole = FileLock::new(LockType::Unlock, 0, u64::MAX, LockOwner::Ofd(0));
        if let Err(e) = f.getlk(whole, posix) {
            return Ans::Err(e.errno());
        }
    }
    let l = match rext4_lock(r) {
        Ok(l) => l,
        Err(a) => return a,
    };
    match cmd {
        Cmd::Get => rext4_ans(f.getlk(l, posix), cmd),
        _ => rext4_ans(f.setlk(l, posix, wait).map(|()| None), cmd),
    }
}
