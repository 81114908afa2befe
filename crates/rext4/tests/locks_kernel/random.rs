//! Random sequences: POSIX owners, OFD owners and flock holders on one file.

use crate::*;

/// POSIX owners (lock servers), each with two descriptions of the file.
pub const OWNERS: usize = 3;
/// Open file descriptions of this process: OFD and flock owners.
pub const DESCS: usize = 3;
pub const MAX_DUPS: usize = 3;
/// Requests mostly fall in bytes `0..FINITE`.
pub const FINITE: i64 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    /// POSIX owner `n`.
    P(usize),
    /// Description `d`'s OFD locks.
    D(usize),
}

#[derive(Clone, Debug)]
pub enum Step {
    /// `F_SETLK`/`F_GETLK` (or the OFD forms), through descriptor `via` of the owner.
    Lock { who: Who, via: usize, cmd: Cmd, req: Req },
    /// `flock(LOCK_NB)` through descriptor `via` of description `d`.
    Flock { d: usize, via: usize, op: FlockOp },
    /// `dup` of description `d`'s descriptor.
    Dup(usize),
    /// `close` of one descriptor: a POSIX owner's (which drops all its POSIX locks, then it
    /// opens the file again), or a description's (its locks go at its last close; then a new
    /// description takes its place).
    Close { who: Who, via: usize },
}

/// One comparison case: a file and every owner's descriptors on both sides.
pub struct Case {
    pub ino: InodeNo,
    pub devino: String,
    pub kdescs: Vec<Vec<OwnedFd>>,
    pub kprobe: OwnedFd,
    pub rposix: Vec<[OpenFile; SLOTS]>,
    pub rdescs: Vec<Vec<OpenFile>>,
    pub rprobe: OpenFile,
    pub path: PathBuf,
}

/// Tallies of what the kernel answered, to show the sequences exercised something.
#[derive(Default, Debug)]
pub struct Tally {
    pub cases: usize,
    pub steps: usize,
    pub set_ok: usize,
    pub set_eagain: usize,
    pub set_other_err: usize,
    pub get_free: usize,
    pub get_held: usize,
    pub flock_ok: usize,
    pub flock_eagain: usize,
    pub closes: usize,
    pub probes: usize,
}

pub struct World<'a> {
    pub env: &'a Env,
    pub servers: Vec<Server>,
    pub pids: Vec<i32>,
    pub case: Option<Case>,
    pub n: usize,
    pub tally: Tally,
}

impl<'a> World<'a> {
    pub fn new(env: &'a Env, owners: usize) -> World<'a> {
        let servers: Vec<Server> = (0..owners).map(|_| Server::spawn()).collect();
        let pids = servers.iter().map(|s| s.pid).collect();
        World { env, servers, pids, case: None, n: 0, tally: Tally::default() }
    }

    pub fn begin(&mut self) {
        self.n += 1;
        let (path, devino, ino) = self.env.new_file(&format!("f{}", self.n));
        for s in &mut self.servers {
            for slot in 0..SLOTS {
                s.open(slot, &path);
            }
        }
        let rw = OpenFlags::READ | OpenFlags::WRITE;
        let env = self.env;
        self.case = Some(Case {
            ino,
            kdescs: (0..DESCS).map(|_| vec![open_k(&path)]).collect(),
            kprobe: open_k(&path),
            rposix: (0..self.servers.len()).map(|_| std::array::from_fn(|_| env.open(ino, rw))).collect(),
            rdescs: (0..DESCS).map(|_| vec![env.open(ino, rw)]).collect(),
            rprobe: env.open(ino, rw),
            devino,
            path,
        });
    }

    /// Closes everything; then neither side may hold a lock or a waiter on the file.
    pub fn finish(&mut self) -> Result<(), String> {
        for s in &mut self.servers {
            for slot in 0..SLOTS {
                s.close(slot);
            }
        }
        let c = self.case.take().expect("a case");
        for (n, files) in c.rposix.iter().enumerate() {
            files[0].close_posix(n as u64);
        }
        let (ino, devino, path) = (c.ino, c.devino.clone(), c.path.clone());
        let name = format!("f{}", self.n);
        drop(c);
        let text = std::fs::read_to_string("/proc/locks").unwrap();
        let k = proc_locks(&text, &devino);
        let (posix, flock) = self.env.fs.file_locks(ino);
        if !k.is_empty() || !posix.is_empty() || !flock.is_empty() || self.env.fs.lock_waiters(ino) != 0 {
            return Err(format!("locks left after the last close: kernel {k:?}, rext4 {posix:?} {flock:?}"));
        }
        // Long runs would use up the images' inodes.
        std::fs::remove_file(&path).expect("kernel unlink");
        self.env.fs.unlink(self.env.fs.root(), name.as_bytes()).expect("rext4 unlink");
        Ok(())
    }

    pub fn c(&self) -> &Case {
        self.case.as_ref().expect("a case")
    }

    /// Makes `s` on both sides: (kernel's answer, rext4's answer).
    pub fn step(&mut self, s: &Step) -> (Ans, Ans) {
        let pids = self.pids.clone();
        let c = self.case.as_mut().expect("a case");
        match *s {
            Step::Lock { who: Who::P(n), via, cmd, req } => {
                let k = server_ans(&self.servers[n].call(&lk_cmd(via, false, cmd, req)), cmd, &pids);
                let r = rext4_lock_call(&c.rposix[n][via], Some(n as u64), cmd, req, Wait::No);
                (k, r)
            }
            Step::Lock { who: Who::D(d), via, cmd, req } => {
                let kfd = c.kdescs[d][via % c.kdescs[d].len()].as_raw_fd();
                let k = kernel_ans(fcntl_lock(kfd, true, cmd, req), cmd, &pids);
                let rf = &c.rdescs[d][via % c.rdescs[d].len()];
                (k, rext4_lock_call(rf, None, cmd, req, Wait::No))
            }
            Step::Flock { d, via, op } => {
                let kfd = c.kdescs[d][via % c.kdescs[d].len()].as_raw_fd();
                let k = flock_fd(kfd, op, false).map_or_else(Ans::Err, |()| Ans::Ok);
                let rf = &c.rdescs[d][via % c.rdescs[d].len()];
                (k, rf.flock(op, Wait::No).map_or_else(|e| Ans::Err(e.errno()), |()| Ans::Ok))
            }
            Step::Dup(d) => {
                if c.kdescs[d].len() < MAX_DUPS {
                    let k = c.kdescs[d][0].try_clone().expect("dup");
                    c.kdescs[d].push(k);
                    let r = c.rdescs[d][0].clone();
                    c.rdescs[d].push(r);
                }
                (Ans::Ok, Ans::Ok)
            }
            Step::Close { who: Who::P(n), via } => {
                self.servers[n].close(via);
                self.servers[n].open(via, &c.path);
                c.rposix[n][via].close_posix(n as u64);
                c.rposix[n][via] = self.env.open(c.ino, OpenFlags::READ | OpenFlags::WRITE);
                (Ans::Ok, Ans::Ok)
            }
            Step::Close { who: Who::D(d), via } => {
                let i = via % c.kdescs[d].len();
                drop(c.kdescs[d].remove(i));
                drop(c.rdescs[d].remove(i));
                if c.kdescs[d].is_empty() {
                    c.kdescs[d].push(open_k(&c.path));
                    c.rdescs[d].push(self.env.open(c.ino, OpenFlags::READ | OpenFlags::WRITE));
                }
                (Ans::Ok, Ans::Ok)
            }
        }
    }

    /// Every lock held on the file, on each side.
    pub fn held(&self) -> (String, String) {
        let c = self.c();
        let mut k = Listing::default();
        for (n, s) in self.servers.iter().enumerate() {
            for fd in s.fds {
                for l in fd_locks(s.pid, fd, &c.devino) {
                    k.add_proc(&format!("P{n}"), &l);
                }
            }
        }
        let me = std::process::id() as i32;
        for (d, fds) in c.kdescs.iter().enumerate() {
            for l in fd_locks(me, fds[0].as_raw_fd(), &c.devino) {
                k.add_proc(&format!("D{d}"), &l);
            }
        }
        let mut r = Listing::default();
        let desc_of = |id: u64| match c.rdescs.iter().position(|v| v[0].id() == id) {
            Some(d) => format!("D{d}"),
            None => format!("file#{id}"),
        };
        let (posix, flock) = self.env.fs.file_locks(c.ino);
        for l in &posix {
            let who = match l.owner {
                LockOwner::Posix(n) => format!("P{n}"),
                LockOwner::Ofd(id) => desc_of(id),
            };
            r.add_rext4(&who, l);
        }
        for (id, op) in flock {
            r.add_flock(&desc_of(id), flock_ty(op));
        }
        (k.done(), r.done())
    }

    /// `F_OFD_GETLK` from a description that holds nothing, over every byte and a few wide
    /// ranges: which lock each side reports first.
    pub fn probe(&mut self) -> Result<(), TestCaseError> {
        let c = self.c();
        let mut reqs: Vec<Req> = (0..FINITE + 2).map(|i| rq(Ty::W, i, 1)).collect();
        reqs.extend([
            rq(Ty::W, FINITE + 2, 0),
            rq(Ty::R, 0, 0),
            rq(Ty::W, 0, 0),
            rq(Ty::W, i64::MAX - 8, 0),
            rq(Ty::W, i64::MAX, 1),
        ]);
        for r in reqs {
            let k = kernel_ans(fcntl_lock(c.kprobe.as_raw_fd(), true, Cmd::Get, r), Cmd::Get, &self.pids);
            let e = rext4_lock_call(&c.rprobe, None, Cmd::Get, r, Wait::No);
            prop_assert_eq!(k, e, "probe F_OFD_GETLK {:?}: kernel {} rext4 {}", r, k, e);
        }
        self.tally.probes += 1;
        Ok(())
    }

    pub fn run(&mut self, steps: &[Step]) -> Result<(), TestCaseError> {
        for (i, s) in steps.iter().enumerate() {
            let (k, r) = self.step(s);
            self.count(s, k);
            let (kh, rh) = self.held();
            prop_assert_eq!(k, r, "step {} {:?}: kernel {} rext4 {}; kernel holds [{}]", i, s, k, r, kh);
            prop_assert_eq!(&kh, &rh, "after step {} {:?}: locks differ", i, s);
            self.probe().map_err(|e| TestCaseError::fail(format!("after step {i} {s:?}: {e}")))?;
        }
        Ok(())
    }

    pub fn count(&mut self, s: &Step, k: Ans) {
        let t = &mut self.tally;
        t.steps += 1;
        match (s, k) {
            (Step::Lock { cmd: Cmd::Get, .. }, Ans::Free) => t.get_free += 1,
            (Step::Lock { cmd: Cmd::Get, .. }, Ans::Held(..)) => t.get_held += 1,
            (Step::Lock { .. }, Ans::Ok) => t.set_ok += 1,
            (Step::Lock { .. }, Ans::Err(libc::EAGAIN)) => t.set_eagain += 1,
            (Step::Lock { .. }, _) => t.set_other_err += 1,
            (Step::Flock { .. }, Ans::Ok) => t.flock_ok += 1,
            (Step::Flock { .. }, _) => t.flock_eagain += 1,
            (Step::Close { .. }, _) => t.closes += 1,
            _ => {}
        }
    }
}

pub fn req_strategy() -> impl Strategy<Value = Req> {
    let ty = prop_oneof![Just(Ty::R), Just(Ty::W), Just(Ty::U)];
    let range = prop_oneof![
        // Mostly small ranges, a sixth of them to the end of the file.
        12 => (0..FINITE, 0..6i64),
        // Near the largest offset, some past it (EOVERFLOW).
        1 => (0..4i64, 0..6i64).prop_map(|(k, len)| (i64::MAX - k, len)),
        // Exactly up to the largest offset (the kernel's "to the end of the file"), or one past.
        1 => (2..FINITE, 0..2i64).prop_map(|(s, extra)| (s, i64::MAX - s + 1 + extra)),
    ];
    (ty, range).prop_map(|(ty, (start, len))| rq(ty, start, len))
}

pub fn step_strategy() -> impl Strategy<Value = Step> {
    let fop = prop_oneof![Just(FlockOp::Shared), Just(FlockOp::Exclusive), Just(FlockOp::Unlock)];
    let set = prop_oneof![4 => Just(Cmd::Set), 1 => Just(Cmd::Get)];
    prop_oneof![
        8 => (0..OWNERS, 0..SLOTS, set.clone(), req_strategy())
            .prop_map(|(n, via, cmd, req)| Step::Lock { who: Who::P(n), via, cmd, req }),
        6 => (0..DESCS, 0..MAX_DUPS, set, req_strategy())
            .prop_map(|(d, via, cmd, req)| Step::Lock { who: Who::D(d), via, cmd, req }),
        3 => (0..DESCS, 0..MAX_DUPS, fop).prop_map(|(d, via, op)| Step::Flock { d, via, op }),
        1 => (0..DESCS).prop_map(Step::Dup),
        1 => (0..OWNERS, 0..SLOTS).prop_map(|(n, via)| Step::Close { who: Who::P(n), via }),
        1 => (0..DESCS, 0..MAX_DUPS).prop_map(|(d, via)| Step::Close { who: Who::D(d), via }),
    ]
}

#[test]
pub fn random_lock_sequences_match_the_kernel() {
    let _serial = one_at_a_time();
    let Some(env) = Env::new() else { return };
    let t0 = Instant::now();
    let world = RefCell::new(World::new(&env, OWNERS));
    // REXT4_LOCK_CASES=N for a longer hunt.
    let cases = std::env::var("REXT4_LOCK_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256);
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    let r = runner.run(&proptest::collection::vec(step_strategy(), 20..=40), |steps| {
        let mut w = world.borrow_mut();
        w.begin();
        let r = w.run(&steps);
        let f = w.finish();
        w.tally.cases += 1;
        r?;
        f.map_err(TestCaseError::fail)
    });
    if let Err(e) = r {
        panic!("{e}");
    }
    eprintln!("{cases} cases in {:.1?}: {:?}", t0.elapsed(), world.borrow().tally);
}
