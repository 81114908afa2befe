//! Blocking requests and deadlock detection.

use crate::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Posix,
    Ofd,
}

#[derive(Clone, Copy, Debug)]
pub enum Op {
    Lock(Cmd, Req),
    /// `flock`, waiting or not.
    Flock(FlockOp, bool),
}

#[derive(Clone, Copy, Debug)]
pub enum Act {
    /// Owner `o`'s request, answered at once (one that waits anyway is interrupted after a
    /// while and recorded as `blocked`).
    Do(usize, Op),
    /// Owner `o`'s request, left waiting.
    Start(usize, Op),
    /// Until `n` requests wait on the file: the count seen.
    Waiting(usize),
    /// The answer of owner `o`'s waiting request.
    Finish(usize),
    /// Interrupts owner `o`'s waiting request (a signal, a [`Cancel`]); its answer.
    Interrupt(usize),
    /// The locks held.
    Held,
}

/// One side of a blocking scenario.
pub trait Side {
    fn begin(&mut self, kinds: &[Kind], name: &str);
    fn start(&mut self, o: usize, op: Op);
    /// The answer of `o`'s pending request, if it comes within `t`.
    fn answer(&mut self, o: usize, t: Duration) -> Option<Ans>;
    fn interrupt(&mut self, o: usize);
    fn waiters(&self) -> usize;
    fn held(&self) -> String;
    fn end(&mut self);
}

pub fn play(side: &mut dyn Side, kinds: &[Kind], name: &str, acts: &[Act]) -> Vec<String> {
    side.begin(kinds, name);
    let mut out = Vec::new();
    for a in acts {
        out.push(match *a {
            Act::Do(o, op) => {
                side.start(o, op);
                match side.answer(o, Duration::from_millis(1500)) {
                    Some(x) => x.to_string(),
                    None => {
                        side.interrupt(o);
                        side.answer(o, Duration::from_secs(10)).expect("an interrupted wait answers");
                        Ans::Blocked.to_string()
                    }
                }
            }
            Act::Start(o, op) => {
                side.start(o, op);
                "started".into()
            }
            Act::Waiting(n) => {
                // The same count three times running: a woken waiter that is about to wait
                // again is not mistaken for one that stays.
                let t0 = Instant::now();
                let mut seen = Vec::new();
                loop {
                    seen.push(side.waiters());
                    let last = &seen[seen.len().saturating_sub(3)..];
                    let steady = last.len() == 3 && last.iter().all(|&c| c == last[0]);
                    if (steady && last[0] == n) || t0.elapsed() > Duration::from_secs(5) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                format!("waiting {}", seen[seen.len() - 1])
            }
            Act::Finish(o) => {
                side.answer(o, Duration::from_secs(5)).map_or("no answer".into(), |x| x.to_string())
            }
            Act::Interrupt(o) => {
                side.interrupt(o);
                side.answer(o, Duration::from_secs(5)).map_or("no answer".into(), |x| x.to_string())
            }
            Act::Held => side.held(),
        });
    }
    side.end();
    out
}

/// The kernel: owner `o` is lock server `o` with one description of the file.
pub struct KernelSide<'a> {
    pub env: &'a Env,
    pub servers: &'a mut [Server],
    pub kinds: Vec<Kind>,
    pub pending: Vec<Option<Cmd>>,
    pub devino: String,
}

impl Side for KernelSide<'_> {
    fn begin(&mut self, kinds: &[Kind], name: &str) {
        let (path, devino, _) = self.env.new_file(&format!("k-{name}"));
        for s in &mut self.servers[..kinds.len()] {
            s.open(0, &path);
        }
        self.kinds = kinds.to_vec();
        self.pending = vec![None; kinds.len()];
        self.devino = devino;
    }
    fn start(&mut self, o: usize, op: Op) {
        let (line, cmd) = match op {
            Op::Lock(cmd, r) => (lk_cmd(0, self.kinds[o] == Kind::Ofd, cmd, r), cmd),
            Op::Flock(f, wait) => (flock_cmd(0, f, wait), Cmd::Set),
        };
        self.servers[o].send(&line);
        self.pending[o] = Some(cmd);
    }
    fn answer(&mut self, o: usize, t: Duration) -> Option<Ans> {
        let line = self.servers[o].recv(t)?;
        let pids: Vec<i32> = self.servers.iter().map(|s| s.pid).collect();
        Some(server_ans(&line, self.pending[o].take().expect("a pending request"), &pids))
    }
    fn interrupt(&mut self, o: usize) {
        self.servers[o].interrupt();
    }
    fn waiters(&self) -> usize {
        self.servers[..self.kinds.len()].iter().filter(|s| sleeps_in_lock_call(s.pid, s.tid)).count()
    }
    fn held(&self) -> String {
        let mut l = Listing::default();
        for (o, s) in self.servers[..self.kinds.len()].iter().enumerate() {
            for p in fd_locks(s.pid, s.fds[0], &self.devino) {
                l.add_proc(&format!("#{o}"), &p);
            }
        }
        l.done()
    }
    fn end(&mut self) {
        for s in &mut self.servers[..self.kinds.len()] {
            s.close(0);
        }
    }
}

/// rext4: owner `o` is an open file (POSIX owner `o` for POSIX requests); a request runs on a
/// thread of its own with a [`Cancel`] standing for signals.
pub struct Rext4Side<'a> {
    pub env: &'a Env,
    pub ino: Option<InodeNo>,
    pub kinds: Vec<Kind>,
    pub files: Vec<OpenFile>,
    pub pending: Vec<Option<(Cancel, mpsc::Receiver<Ans>)>>,
}

impl Side for Rext4Side<'_> {
    fn begin(&mut self, kinds: &[Kind], name: &str) {
        let ino =
            self.env.fs.create(self.env.fs.root(), format!("r-{name}").as_bytes(), 0o644, 0, 0).unwrap().ino;
        self.files = kinds.iter().map(|_| self.env.open(ino, OpenFlags::READ | OpenFlags::WRITE)).collect();
        self.pending = kinds.iter().map(|_| None).collect();
        self.kinds = kinds.to_vec();
        self.ino = Some(ino);
    }
    fn start(&mut self, o: usize, op: Op) {
        let f = self.files[o].clone();
        let posix = (self.kinds[o] == Kind::Posix).then_some(o as u64);
        let cancel = Cancel::new();
        let (tx, rx) = mpsc::channel();
        let c = cancel.clone();
        std::thread::spawn(move || {
            let a = match op {
                Op::Lock(cmd, r) => {
                    let wait = if cmd == Cmd::SetW { Wait::Until(&c) } else { Wait::No };
                    rext4_lock_call(&f, posix, cmd, r, wait)
                }
                Op::Flock(fop, w) => {
                    let wait = if w { Wait::Until(&c) } else { Wait::No };
                    f.flock(fop, wait).map_or_else(|e| Ans::Err(e.errno()), |()| Ans::Ok)
                }
            };
            let _ = tx.send(a);
        });
        self.pending[o] = Some((cancel, rx));
    }
    fn answer(&mut self, o: usize, t: Duration) -> Option<Ans> {
        let a = self.pending[o].as_ref().expect("a pending request").1.recv_timeout(t).ok()?;
        self.pending[o] = None;
        Some(a)
    }
    fn interrupt(&mut self, o: usize) {
        self.pending[o].as_ref().expect("a pending request").0.cancel();
    }
    fn waiters(&self) -> usize {
        self.env.fs.lock_waiters(self.ino.unwrap())
    }
    fn held(&self) -> String {
        let mut l = Listing::default();
        let (posix, flock) = self.env.fs.file_locks(self.ino.unwrap());
        let by_id = |id: u64| {
            self.files.iter().position(|f| f.id() == id).map_or(format!("file#{id}"), |o| format!("#{o}"))
        };
        for p in &posix {
            let who = match p.owner {
                LockOwner::Posix(o) => format!("#{o}"),
                LockOwner::Ofd(id) => by_id(id),
            };
            l.add_rext4(&who, p);
        }
        for (id, op) in flock {
            l.add_flock(&by_id(id), flock_ty(op));
        }
        l.done()
    }
    fn end(&mut self) {
        for (o, f) in self.files.drain(..).enumerate() {
            if self.kinds[o] == Kind::Posix {
                f.close_posix(o as u64);
            }
        }
        self.pending.clear();
    }
}

pub fn set(ty: Ty, start: i64, len: i64) -> Op {
    Op::Lock(Cmd::Set, rq(ty, start, len))
}
pub fn setw(ty: Ty, start: i64, len: i64) -> Op {
    Op::Lock(Cmd::SetW, rq(ty, start, len))
}
pub fn get(ty: Ty, start: i64, len: i64) -> Op {
    Op::Lock(Cmd::Get, rq(ty, start, len))
}

/// A name, the owners' kinds, and each act with the answer the kernel gives.
pub type Scenario = (&'static str, Vec<Kind>, Vec<(Act, &'static str)>);

pub const WAITING: [&str; 14] = [
    "waiting 0",
    "waiting 1",
    "waiting 2",
    "waiting 3",
    "waiting 4",
    "waiting 5",
    "waiting 6",
    "waiting 7",
    "waiting 8",
    "waiting 9",
    "waiting 10",
    "waiting 11",
    "waiting 12",
    "waiting 13",
];

#[test]
pub fn blocking_and_deadlocks_match_the_kernel() {
    let _serial = one_at_a_time();
    let Some(env) = Env::new() else { return };
    let mut servers: Vec<Server> = (0..13).map(|_| Server::spawn()).collect();
    use Act::*;
    use Kind::*;
    use Ty::*;
    let mut scenarios: Vec<Scenario> = vec![
        (
            // A holds byte 0 and waits for byte 1, held by B: B waiting for byte 0 is EDEADLK.
            "two-owners",
            vec![Posix, Posix],
            vec![
                (Do(0, set(W, 0, 1)), "ok"),
                (Do(1, set(W, 1, 1)), "ok"),
                (Start(0, setw(W, 1, 1)), "started"),
                (Waiting(1), "waiting 1"),
                (Do(1, setw(W, 0, 1)), "EDEADLK"),
                (Do(1, get(W, 0, 0)), "W 0 1 P0"),
                (Do(1, set(U, 1, 1)), "ok"),
                (Finish(0), "ok"),
                (Held, "#0 W 0-1"),
            ],
        ),
        (
            // A waits for B, B for C: C waiting for A closes the cycle.
            "three-owners",
            vec![Posix, Posix, Posix],
            vec![
                (Do(0, set(W, 0, 1)), "ok"),
                (Do(1, set(W, 1, 1)), "ok"),
                (Do(2, set(W, 2, 1)), "ok"),
                (Start(0, setw(W, 1, 1)), "started"),
                (Waiting(1), "waiting 1"),
                (Start(1, setw(W, 2, 1)), "started"),
                (Waiting(2), "waiting 2"),
                (Do(2, setw(W, 0, 1)), "EDEADLK"),
                (Do(2, set(U, 2, 1)), "ok"),
                (Finish(1), "ok"),
                (Held, "#0 W 0-0, #1 W 1-2"),
                (Do(1, set(U, 0, 0)), "ok"),
                (Finish(0), "ok"),
                (Held, "#0 W 0-1"),
            ],
        ),
        (
            // A waits for byte 5, read-held by B and C; only the first conflict (B) is
            // followed, so C waiting for A is let through. When B leaves, A's retry finds C,
            // which waits for A: A gets EDEADLK.
            "blocker-changes",
            vec![Posix, Posix, Posix],
            vec![
                (Do(0, set(W, 0, 1)), "ok"),
                (Do(1, set(R, 5, 1)), "ok"),
                (Do(2, set(R, 5, 1)), "ok"),
                (Start(0, setw(W, 5, 1)), "started"),
                (Waiting(1), "waiting 1"),
                (Start(2, setw(W, 0, 1)), "started"),
                (Waiting(2), "waiting 2"),
                (Do(1, set(U, 0, 0)), "ok"),
                (Finish(0), "EDEADLK"),
                (Waiting(1), "waiting 1"),
                (Do(0, set(U, 0, 0)), "ok"),
                (Finish(2), "ok"),
                (Held, "#2 W 0-0, #2 R 5-5"),
            ],
        ),
        (
            // OFD owners in a cycle both wait: there is no detection for them.
            "ofd-cycle",
            vec![Ofd, Ofd],
            vec![
                (Do(0, set(W, 10, 1)), "ok"),
                (Do(1, set(W, 11, 1)), "ok"),
                (Start(0, setw(W, 11, 1)), "started"),
                (Waiting(1), "waiting 1"),
                (Start(1, setw(W, 10, 1)), "started"),
                (Waiting(2), "waiting 2"),
                (Interrupt(1), "EINTR"),
                (Waiting(1), "waiting 1"),
                (Held, "#0 W 10-10, #1 W 11-11"),
                (Do(1, set(U, 0, 0)), "ok"),
                (Finish(0), "ok"),
                (Held, "#0 W 10-11"),
            ],
        ),
        (
            // An OFD owner waiting on a POSIX lock is on the kernel's waiter hash (the hash
            // takes waiters by their blocker's kind), so a POSIX owner closing the cycle
            // through it gets EDEADLK.
            "mixed-cycle",
            vec![Posix, Ofd],
            vec![
                (Do(0, set(W, 0, 1)), "ok"),
                (Do(1, set(W, 1, 1)), "ok"),
                (Start(1, setw(W, 0, 1)), "started"),
                (Waiting(1), "waiting 1"),
                (Do(0, setw(W, 1, 1)), "EDEADLK"),
                (Do(0, set(U, 0, 0)), "ok"),
                (Finish(1), "ok"),
                (Held, "#1 W 0-1"),
            ],
        ),
        (
            // The same cycle closed the other way is not found: a POSIX owner waiting on an
            // OFD lock is not on the hash, and an OFD request is never checked.
            "mixed-cycle-other-way",
            vec![Posix, Ofd],
            vec![
                (Do(0, set(W, 0, 1)), "ok"),
                (Do(1, set(W, 1, 1)), "ok"),
                (Start(0, setw(W, 1, 1)), "started"),
                (Waiting(1), "waiting 1"),
                (Start(1, setw(W, 0, 1)), "started"),
                (Waiting(2), "waiting 2"),
                (Interrupt(1), "EINTR"),
                (Do(1, set(U, 0, 0)), "ok"),
                (Finish(0), "ok"),
                (Held, "#0 W 0-1"),
            ],
        ),
        (
            // B's request conflicts with D's, already waiting on A's lock, so the kernel
            // queues B beneath D: B's wait hangs off an OFD request and is not on the hash.
            // A then waiting for B is a cycle the kernel does not see.
            "posix-beneath-ofd-waiter",
            vec![Posix, Ofd, Posix],
            vec![
                (Do(0, set(W, 0, 1)), "ok"),
                (Do(2, set(W, 5, 1)), "ok"),
                (Start(1, setw(W, 0, 1)), "started"),
                (Waiting(1), "waiting 1"),
                (Start(2, setw(W, 0, 1)), "started"),
                (Waiting(2), "waiting 2"),
                (Start(0, setw(W, 5, 1)), "started"),
                (Waiting(3), "waiting 3"),
                (Interrupt(0), "EINTR"),
                (Do(0, set(U, 0, 0)), "ok"),
                (Finish(1), "ok"),
                (Do(1, set(U, 0, 0)), "ok"),
                (Finish(2), "ok"),
                (Held, "#2 W 0-0, #2 W 5-5"),
            ],
        ),
        (
            // A waiting writer is granted when the readers leave, not before; a reader
            // arriving meanwhile is not held back by the waiter.
            "writer-waits-for-readers",
            vec![Posix, Ofd, Posix],
            vec![
                (Do(0, set(R, 0, 10)), "ok"),
                (Do(1, set(R, 5, 10)), "ok"),
                (Start(2, setw(W, 3, 5)), "started"),
                (Waiting(1), "waiting 1"),
                (Do(0, set(R, 20, 1)), "ok"),
                (Do(0, set(U, 0, 10)), "ok"),
                (Waiting(1), "waiting 1"),
                (Do(1, set(R, 3, 2)), "ok"),
                (Do(1, set(U, 0, 0)), "ok"),
                (Finish(2), "ok"),
                (Held, "#0 R 20-20, #2 W 3-7"),
            ],
        ),
        (
            // A downgrade replaces the lock: the reader waiting under it is granted.
            "downgrade-grants-a-reader",
            vec![Posix, Posix],
            vec![
                (Do(0, set(W, 0, 10)), "ok"),
                (Start(1, setw(R, 5, 1)), "started"),
                (Waiting(1), "waiting 1"),
                (Do(0, set(R, 0, 10)), "ok"),
                (Finish(1), "ok"),
                (Held, "#0 R 0-9, #1 R 5-5"),
            ],
        ),
        (
            // Unlocking the middle of a lock splits it: both waiters look again and wait
            // under the half that still holds their byte.
            "split-requeues-its-waiters",
            vec![Posix, Posix, Ofd],
            vec![
                (Do(0, set(W, 0, 10)), "ok"),
                (Start(1, setw(W, 2, 1)), "started"),
                (Waiting(1), "waiting 1"),
                (Start(2, setw(W, 8, 1)), "started"),
                (Waiting(2), "waiting 2"),
                (Do(0, set(U, 5, 1)), "ok"),
                (Waiting(2), "waiting 2"),
                (Held, "#0 W 0-4, #0 W 6-9"),
                (Do(0, set(U, 0, 5)), "ok"),
                (Finish(1), "ok"),
                (Do(0, set(U, 0, 0)), "ok"),
                (Finish(2), "ok"),
                (Held, "#1 W 2-2, #2 W 8-8"),
            ],
        ),
        (
            // flock: a waiter is granted on the unlock; an EX conversion while another waits
            // drops the old lock and takes the new one at once, as one step.
            "flock-wait",
            vec![Ofd, Ofd, Ofd],
            vec![
                (Do(0, Op::Flock(FlockOp::Shared, false)), "ok"),
                (Start(1, Op::Flock(FlockOp::Exclusive, true)), "started"),
                (Waiting(1), "waiting 1"),
                (Do(0, Op::Flock(FlockOp::Exclusive, false)), "ok"),
                (Waiting(1), "waiting 1"),
                (Held, "#0 flock W"),
                (Do(2, Op::Flock(FlockOp::Shared, false)), "EAGAIN"),
                (Do(0, Op::Flock(FlockOp::Unlock, false)), "ok"),
                (Finish(1), "ok"),
                (Held, "#1 flock W"),
            ],
        ),
        (
            // A waiting conversion loses its shared lock while it waits.
            "flock-convert-waits",
            vec![Ofd, Ofd],
            vec![
                (Do(0, Op::Flock(FlockOp::Shared, false)), "ok"),
                (Do(1, Op::Flock(FlockOp::Shared, false)), "ok"),
                (Start(0, Op::Flock(FlockOp::Exclusive, true)), "started"),
                (Waiting(1), "waiting 1"),
                (Held, "#1 flock R"),
                (Interrupt(0), "EINTR"),
                (Held, "#1 flock R"),
                (Start(0, Op::Flock(FlockOp::Exclusive, true)), "started"),
                (Waiting(1), "waiting 1"),
                (Do(1, Op::Flock(FlockOp::Unlock, false)), "ok"),
                (Finish(0), "ok"),
                (Held, "#0 flock W"),
            ],
        ),
    ];
    // A cycle of `hops` waits: owner i holds byte i and waits for byte i + 1, the last one
    // for byte 0; owner 0 closes it. The kernel follows 11 waits and no more.
    for hops in [11usize, 12] {
        let n = hops + 1;
        let mut acts: Vec<(Act, &str)> = Vec::new();
        for i in 0..n {
            acts.push((Do(i, set(W, i as i64, 1)), "ok"));
        }
        for (k, i) in (1..n).rev().enumerate() {
            acts.push((Start(i, setw(W, ((i + 1) % n) as i64, 1)), "started"));
            acts.push((Waiting(k + 1), WAITING[k + 1]));
        }
        if hops <= 11 {
            acts.push((Do(0, setw(W, 1, 1)), "EDEADLK"));
        } else {
            acts.push((Start(0, setw(W, 1, 1)), "started"));
            acts.push((Waiting(n), WAITING[n]));
            acts.push((Interrupt(0), "EINTR"));
        }
        // Unwind: each owner in turn leaves, granting the one waiting for it.
        acts.push((Do(0, set(U, 0, 0)), "ok"));
        for i in (1..n).rev() {
            acts.push((Finish(i), "ok"));
            acts.push((Do(i, set(U, 0, 0)), "ok"));
        }
        acts.push((Held, ""));
        scenarios.push((if hops == 11 { "chain-11" } else { "chain-12" }, vec![Posix; n], acts));
    }
    let mut failures = Vec::new();
    for (name, kinds, acts) in &scenarios {
        let just: Vec<Act> = acts.iter().map(|(a, _)| *a).collect();
        let want: Vec<&str> = acts.iter().map(|(_, w)| *w).collect();
        let mut k = KernelSide {
            env: &env,
            servers: &mut servers,
            kinds: vec![],
            pending: vec![],
            devino: String::new(),
        };
        let kt = play(&mut k, kinds, name, &just);
        if kt != want {
            failures.push(format!("{name}: the kernel answered {kt:?}, the scenario says {want:?}"));
            continue;
        }
        let mut r = Rext4Side { env: &env, ino: None, kinds: vec![], files: vec![], pending: vec![] };
        let rt = play(&mut r, kinds, name, &just);
        if let Some(i) = (0..just.len()).find(|&i| kt[i] != rt[i]) {
            failures.push(format!(
                "{name} act {i} {:?}: kernel {}, rext4 {}\n  kernel {kt:?}\n  rext4  {rt:?}",
                just[i], kt[i], rt[i]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} scenarios differ:\n{}",
        failures.len(),
        scenarios.len(),
        failures.join("\n")
    );
}
