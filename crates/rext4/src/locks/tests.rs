use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

const INO: u32 = 12;
/// Model bytes: requests start and end below `FINITE`; a range to the end of the file covers
/// the model's bytes up to `BYTES`, which no finite range reaches.
const FINITE: u64 = 24;
const BYTES: u64 = 28;

fn lk(kind: LockType, start: u64, end: u64, owner: LockOwner) -> FileLock {
    FileLock::new(kind, start, end, owner)
}

/// A byte-by-byte model: for every owner, the type it holds on each byte.
#[derive(Default, Clone, Debug, PartialEq)]
struct Model {
    bytes: BTreeMap<LockOwner, [Option<LockType>; BYTES as usize]>,
    flock: BTreeMap<u64, bool>,
}

fn span(start: u64, end: u64) -> std::ops::RangeInclusive<usize> {
    start as usize..=(end.min(BYTES - 1) as usize)
}

impl Model {
    fn conflict(&self, req: &FileLock) -> bool {
        self.bytes.iter().any(|(o, b)| {
            *o != req.owner
                && span(req.start, req.end)
                    .any(|i| b[i].is_some_and(|t| t == LockType::Write || req.kind == LockType::Write))
        })
    }

    fn setlk(&mut self, req: &FileLock) -> bool {
        if req.kind != LockType::Unlock && self.conflict(req) {
            return false;
        }
        let b = self.bytes.entry(req.owner).or_insert([None; BYTES as usize]);
        for i in span(req.start, req.end) {
            b[i] = if req.kind == LockType::Unlock { None } else { Some(req.kind) };
        }
        if b.iter().all(Option::is_none) {
            self.bytes.remove(&req.owner);
        }
        true
    }

    fn flock(&mut self, file: u64, op: FlockOp) -> bool {
        match op {
            FlockOp::Unlock => {
                self.flock.remove(&file);
                true
            }
            _ => {
                let ex = op == FlockOp::Exclusive;
                if self.flock.get(&file) == Some(&ex) {
                    return true;
                }
                self.flock.remove(&file);
                if self.flock.iter().any(|(_, &h)| ex || h) {
                    return false;
                }
                self.flock.insert(file, ex);
                true
            }
        }
    }
}

impl PartialOrd for LockOwner {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for LockOwner {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        let key = |x: &LockOwner| match *x {
            LockOwner::Posix(n) => (0, n),
            LockOwner::Ofd(n) => (1, n),
        };
        key(self).cmp(&key(o))
    }
}

/// What the engine holds, as the model's bytes; also checks the list's own invariants: an
/// owner's locks neither overlap nor, when of one type, touch.
fn observe(l: &FileLocks) -> Model {
    let (posix, flock) = l.list(INO);
    let mut m = Model::default();
    for (i, a) in posix.iter().enumerate() {
        assert!(a.start <= a.end);
        for b in &posix[i + 1..] {
            if a.owner == b.owner {
                assert!(!a.range().overlaps(&b.range()), "overlap {a:?} {b:?}");
                if a.kind == b.kind {
                    assert!(!a.range().touches(&b.range()), "unmerged {a:?} {b:?}");
                }
            }
        }
        let bytes = m.bytes.entry(a.owner).or_insert([None; BYTES as usize]);
        for i in span(a.start, a.end) {
            bytes[i] = Some(a.kind);
        }
    }
    for (f, op) in flock {
        m.flock.insert(f, op == FlockOp::Exclusive);
    }
    m
}

#[derive(Clone, Debug)]
enum Step {
    Set(FileLock),
    Get(FileLock),
    Close(LockOwner),
    Flock(u64, FlockOp),
    FlockClose(u64),
}

fn owner() -> impl Strategy<Value = LockOwner> {
    prop_oneof![(0..3u64).prop_map(LockOwner::Posix), (0..2u64).prop_map(LockOwner::Ofd)]
}

fn request() -> impl Strategy<Value = FileLock> {
    let kind = prop_oneof![Just(LockType::Read), Just(LockType::Write), Just(LockType::Unlock)];
    (kind, 0..FINITE, 0..FINITE, any::<bool>(), owner()).prop_map(|(k, a, b, eof, o)| {
        let (s, e) = (a.min(b), if eof { u64::MAX } else { a.max(b) });
        lk(k, s, e, o)
    })
}

fn step() -> impl Strategy<Value = Step> {
    let fop = prop_oneof![Just(FlockOp::Shared), Just(FlockOp::Exclusive), Just(FlockOp::Unlock)];
    prop_oneof![
        6 => request().prop_map(Step::Set),
        2 => request().prop_map(Step::Get),
        1 => owner().prop_map(Step::Close),
        2 => (0..3u64, fop).prop_map(|(f, o)| Step::Flock(f, o)),
        1 => (0..3u64).prop_map(Step::FlockClose),
    ]
}

proptest! {
    #[test]
    fn lock_table_matches_a_byte_model(steps in proptest::collection::vec(step(), 1..60)) {
        let l = FileLocks::default();
        let mut m = Model::default();
        for s in &steps {
            match s {
                Step::Set(r) => {
                    let got = l.setlk(INO, r, Wait::No);
                    let want = m.setlk(r);
                    prop_assert_eq!(got.is_ok(), want, "{:?} -> {:?}", r, got);
                    if let Err(e) = got {
                        prop_assert!(matches!(e, Error::WouldBlock));
                    }
                }
                Step::Get(r) if r.kind == LockType::Unlock => {
                    // F_OFD_GETLK with F_UNLCK: the first of the owner's own locks in range.
                    let got = l.getlk(INO, r);
                    let want = m.bytes.get(&r.owner).is_some_and(|b| span(r.start, r.end).any(|i| b[i].is_some()));
                    prop_assert_eq!(got.is_some(), want);
                    if let Some(c) = got {
                        prop_assert!(c.owner == r.owner && c.range().overlaps(&r.range()));
                    }
                }
                Step::Get(r) => {
                    let got = l.getlk(INO, r);
                    prop_assert_eq!(got.is_some(), m.conflict(r));
                    if let Some(c) = got {
                        // What is reported really conflicts with the request.
                        prop_assert!(c.owner != r.owner && c.range().overlaps(&r.range()));
                        prop_assert!(c.kind == LockType::Write || r.kind == LockType::Write);
                    }
                }
                Step::Close(o) => {
                    l.release_owner(INO, *o);
                    m.bytes.remove(o);
                }
                Step::Flock(f, op) => {
                    let got = l.flock(INO, *f, *op, Wait::No);
                    prop_assert_eq!(got.is_ok(), m.flock(*f, *op));
                }
                Step::FlockClose(f) => {
                    l.release_flock(INO, *f);
                    m.flock.remove(f);
                }
            }
            prop_assert_eq!(observe(&l), m.clone());
        }
        for o in [LockOwner::Posix(0), LockOwner::Posix(1), LockOwner::Posix(2), LockOwner::Ofd(0), LockOwner::Ofd(1)] {
            l.release_owner(INO, o);
        }
        for f in 0..3 {
            l.release_flock(INO, f);
        }
        prop_assert_eq!(l.live_contexts(INO), 0);
    }
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..2000 {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("timed out waiting for {what}");
}

fn waiters(l: &FileLocks) -> usize {
    l.with_state(INO, false, |st| st.waiters.len()).unwrap_or(0)
}

#[test]
fn a_blocked_writer_is_granted_exactly_when_its_range_frees() {
    let l = Arc::new(FileLocks::default());
    let (a, b) = (LockOwner::Posix(1), LockOwner::Posix(2));
    l.setlk(INO, &lk(LockType::Read, 0, 9, a), Wait::No).unwrap();
    l.setlk(INO, &lk(LockType::Read, 20, 29, a), Wait::No).unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let t = {
        let (l, done) = (l.clone(), done.clone());
        std::thread::spawn(move || {
            l.setlk(INO, &lk(LockType::Write, 5, 25, b), Wait::Forever).unwrap();
            done.store(1, Ordering::SeqCst);
        })
    };
    wait_until("the writer to block", || waiters(&l) == 1);
    // Freeing half of what it needs grants nothing.
    l.setlk(INO, &lk(LockType::Unlock, 0, 9, a), Wait::No).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(done.load(Ordering::SeqCst), 0);
    assert_eq!(waiters(&l), 1);
    // Freeing bytes it does not need grants nothing either.
    l.setlk(INO, &lk(LockType::Unlock, 26, 29, a), Wait::No).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(done.load(Ordering::SeqCst), 0);
    l.setlk(INO, &lk(LockType::Unlock, 20, 25, a), Wait::No).unwrap();
    t.join().unwrap();
    assert_eq!(done.load(Ordering::SeqCst), 1);
    let (held, _) = l.list(INO);
    assert_eq!(held, vec![lk(LockType::Write, 5, 25, b)]);
    l.release_owner(INO, b);
    assert_eq!(l.live_contexts(INO), 0);
}

#[test]
fn a_wait_that_closes_a_cycle_is_edeadlk_and_ofd_waits_are_not_checked() {
    let l = Arc::new(FileLocks::default());
    let (a, b) = (LockOwner::Posix(1), LockOwner::Posix(2));
    l.setlk(INO, &lk(LockType::Write, 0, 0, a), Wait::No).unwrap();
    l.setlk(INO, &lk(LockType::Write, 1, 1, b), Wait::No).unwrap();
    let t = {
        let l = l.clone();
        std::thread::spawn(move || l.setlk(INO, &lk(LockType::Write, 1, 1, a), Wait::Forever))
    };
    wait_until("a to wait for b", || waiters(&l) == 1);
    let r = l.setlk(INO, &lk(LockType::Write, 0, 0, b), Wait::Forever);
    assert!(matches!(r, Err(Error::Deadlock)), "{r:?}");
    // b gives up its byte: a is granted.
    l.setlk(INO, &lk(LockType::Unlock, 1, 1, b), Wait::No).unwrap();
    t.join().unwrap().unwrap();
    // An OFD owner waiting in a cycle is not refused (the kernel checks POSIX owners only);
    // it waits until cancelled.
    let (c, d) = (LockOwner::Ofd(7), LockOwner::Ofd(8));
    l.setlk(INO, &lk(LockType::Write, 10, 10, c), Wait::No).unwrap();
    l.setlk(INO, &lk(LockType::Write, 11, 11, d), Wait::No).unwrap();
    let cancel = Cancel::new();
    let t = {
        let (l, cancel) = (l.clone(), cancel.clone());
        std::thread::spawn(move || l.setlk(INO, &lk(LockType::Write, 11, 11, c), Wait::Until(&cancel)))
    };
    wait_until("c to wait for d", || waiters(&l) == 1);
    let cancel2 = Cancel::new();
    cancel2.cancel();
    let r = l.setlk(INO, &lk(LockType::Write, 10, 10, d), Wait::Until(&cancel2));
    assert!(matches!(r, Err(Error::Interrupted)), "{r:?}");
    cancel.cancel();
    assert!(matches!(t.join().unwrap(), Err(Error::Interrupted)));
    assert_eq!(waiters(&l), 0);
    for o in [a, c, d] {
        l.release_owner(INO, o);
    }
    assert_eq!(l.live_contexts(INO), 0);
    assert!(l.blocked.is_empty());
}

#[test]
fn a_deadlock_found_when_the_blocker_changes_fails_the_waiter() {
    // a waits for b on byte 5; b passes byte 5 to c... (c takes it when b releases);
    // c then waits for a: the kernel's woken waiter a would find the cycle on its retry.
    let l = Arc::new(FileLocks::default());
    let (a, b, c) = (LockOwner::Posix(1), LockOwner::Posix(2), LockOwner::Posix(3));
    l.setlk(INO, &lk(LockType::Write, 0, 0, a), Wait::No).unwrap();
    l.setlk(INO, &lk(LockType::Read, 5, 5, b), Wait::No).unwrap();
    l.setlk(INO, &lk(LockType::Read, 5, 5, c), Wait::No).unwrap();
    let ta = {
        let l = l.clone();
        std::thread::spawn(move || l.setlk(INO, &lk(LockType::Write, 5, 5, a), Wait::Forever))
    };
    wait_until("a to wait", || waiters(&l) == 1);
    let tc = {
        let l = l.clone();
        std::thread::spawn(move || l.setlk(INO, &lk(LockType::Write, 0, 0, c), Wait::Forever))
    };
    wait_until("c to wait", || waiters(&l) == 2);
    // a was recorded as waiting for b (the first conflict). b leaves: a now waits for c,
    // which waits for a.
    l.release_owner(INO, b);
    let ra = ta.join().unwrap();
    assert!(matches!(ra, Err(Error::Deadlock)), "{ra:?}");
    l.release_owner(INO, a);
    tc.join().unwrap().unwrap();
    l.release_owner(INO, c);
    assert_eq!(l.live_contexts(INO), 0);
    assert!(l.blocked.is_empty());
}

#[test]
fn flock_waiters_are_granted_and_a_failed_conversion_loses_the_lock() {
    let l = Arc::new(FileLocks::default());
    l.flock(INO, 1, FlockOp::Shared, Wait::No).unwrap();
    l.flock(INO, 2, FlockOp::Shared, Wait::No).unwrap();
    let r = l.flock(INO, 1, FlockOp::Exclusive, Wait::No);
    assert!(matches!(r, Err(Error::WouldBlock)));
    assert_eq!(l.list(INO).1, vec![(2, FlockOp::Shared)]);
    let t = {
        let l = l.clone();
        std::thread::spawn(move || l.flock(INO, 3, FlockOp::Exclusive, Wait::Forever))
    };
    wait_until("3 to wait", || waiters(&l) == 1);
    // Byte-range locks never meet flock ones.
    l.setlk(INO, &lk(LockType::Write, 0, u64::MAX, LockOwner::Posix(9)), Wait::No).unwrap();
    l.release_flock(INO, 2);
    t.join().unwrap().unwrap();
    assert_eq!(l.list(INO).1, vec![(3, FlockOp::Exclusive)]);
    l.release_flock(INO, 3);
    l.release_owner(INO, LockOwner::Posix(9));
    assert_eq!(l.live_contexts(INO), 0);
}

#[test]
fn freeing_the_inode_fails_its_waiters_and_forgets_its_locks() {
    let l = Arc::new(FileLocks::default());
    l.setlk(INO, &lk(LockType::Write, 0, u64::MAX, LockOwner::Posix(1)), Wait::No).unwrap();
    let t = {
        let l = l.clone();
        std::thread::spawn(move || {
            l.setlk(INO, &lk(LockType::Read, 0, 0, LockOwner::Posix(2)), Wait::Forever)
        })
    };
    wait_until("the reader to wait", || waiters(&l) == 1);
    l.drop_inode(INO);
    assert!(matches!(t.join().unwrap(), Err(Error::Stale)));
    assert_eq!(l.live_contexts(INO), 0);
    assert!(l.blocked.is_empty());
}

#[test]
fn many_owners_hammering_one_range_lose_no_wakeup() {
    // Whole-file write locks taken and dropped by 8 POSIX owners and 4 flock files, 2,000
    // times each, all waiting: every thread finishes and nothing is left.
    let l = Arc::new(FileLocks::default());
    let in_range = Arc::new(AtomicUsize::new(0));
    let mut ts = Vec::new();
    for o in 0..8u64 {
        let (l, in_range) = (l.clone(), in_range.clone());
        ts.push(std::thread::spawn(move || {
            let me = LockOwner::Posix(o);
            for i in 0..2000u64 {
                let (s, e) = if i % 3 == 0 { (0, u64::MAX) } else { (i % 7, i % 7 + 3) };
                l.setlk(INO, &lk(LockType::Write, s, e, me), Wait::Forever).unwrap();
                if s == 0 && e == u64::MAX {
                    assert_eq!(in_range.fetch_add(1, Ordering::SeqCst), 0, "two writers at once");
                    in_range.fetch_sub(1, Ordering::SeqCst);
                }
                l.setlk(INO, &lk(LockType::Unlock, 0, u64::MAX, me), Wait::No).unwrap();
            }
        }));
    }
    for f in 0..4u64 {
        let l = l.clone();
        ts.push(std::thread::spawn(move || {
            for i in 0..2000 {
                let op = if i % 2 == 0 { FlockOp::Exclusive } else { FlockOp::Shared };
                l.flock(INO, f, op, Wait::Forever).unwrap();
                l.flock(INO, f, FlockOp::Unlock, Wait::No).unwrap();
            }
        }));
    }
    for t in ts {
        t.join().unwrap();
    }
    assert_eq!(l.live_contexts(INO), 0);
    assert!(l.blocked.is_empty());
}

/// Starts a waiting `setlk` on a thread of its own.
fn wait_for(
    l: &Arc<FileLocks>,
    req: FileLock,
    cancel: Option<&Cancel>,
) -> std::thread::JoinHandle<Result<()>> {
    let (l, cancel) = (l.clone(), cancel.cloned());
    std::thread::spawn(move || match &cancel {
        Some(c) => l.setlk(INO, &req, Wait::Until(c)),
        None => l.setlk(INO, &req, Wait::Forever),
    })
}

#[test]
fn an_ofd_owner_waiting_on_a_posix_lock_is_followed_and_not_the_other_way() {
    // The kernel puts a wait on its hash by what it waits under: an OFD owner waiting on a
    // POSIX lock is followed, so the POSIX owner closing the cycle gets EDEADLK.
    let l = Arc::new(FileLocks::default());
    let (a, d) = (LockOwner::Posix(1), LockOwner::Ofd(2));
    l.setlk(INO, &lk(LockType::Write, 0, 0, a), Wait::No).unwrap();
    l.setlk(INO, &lk(LockType::Write, 1, 1, d), Wait::No).unwrap();
    let td = wait_for(&l, lk(LockType::Write, 0, 0, d), None);
    wait_until("d to wait", || waiters(&l) == 1);
    let r = l.setlk(INO, &lk(LockType::Write, 1, 1, a), Wait::Forever);
    assert!(matches!(r, Err(Error::Deadlock)), "{r:?}");
    l.release_owner(INO, a);
    td.join().unwrap().unwrap();
    l.release_owner(INO, d);
    // The other way round, a POSIX owner waiting on an OFD lock is not followed (and an OFD
    // request is never checked): both wait.
    l.setlk(INO, &lk(LockType::Write, 0, 0, a), Wait::No).unwrap();
    l.setlk(INO, &lk(LockType::Write, 1, 1, d), Wait::No).unwrap();
    let ta = wait_for(&l, lk(LockType::Write, 1, 1, a), None);
    wait_until("a to wait", || waiters(&l) == 1);
    let cancel = Cancel::new();
    let td = wait_for(&l, lk(LockType::Write, 0, 0, d), Some(&cancel));
    wait_until("d to wait", || waiters(&l) == 2);
    cancel.cancel();
    assert!(matches!(td.join().unwrap(), Err(Error::Interrupted)));
    l.release_owner(INO, d);
    ta.join().unwrap().unwrap();
    l.release_owner(INO, a);
    assert_eq!(l.live_contexts(INO), 0);
    assert!(l.blocked.is_empty());
}

#[test]
fn a_posix_wait_queued_beneath_an_ofd_wait_is_not_followed() {
    // b's request conflicts with d's, which already waits on a's lock: b waits beneath d,
    // an OFD request, so (as in the kernel) b's wait is not on the hash and a waiting for b
    // is let through although it closes a cycle.
    let l = Arc::new(FileLocks::default());
    let (a, d, b) = (LockOwner::Posix(1), LockOwner::Ofd(2), LockOwner::Posix(3));
    l.setlk(INO, &lk(LockType::Write, 0, 0, a), Wait::No).unwrap();
    l.setlk(INO, &lk(LockType::Write, 5, 5, b), Wait::No).unwrap();
    let td = wait_for(&l, lk(LockType::Write, 0, 0, d), None);
    wait_until("d to wait", || waiters(&l) == 1);
    let tb = wait_for(&l, lk(LockType::Write, 0, 0, b), None);
    wait_until("b to wait", || waiters(&l) == 2);
    let cancel = Cancel::new();
    let ta = wait_for(&l, lk(LockType::Write, 5, 5, a), Some(&cancel));
    wait_until("a to wait", || waiters(&l) == 3);
    cancel.cancel();
    assert!(matches!(ta.join().unwrap(), Err(Error::Interrupted)));
    // a leaves: d (right under a's lock) is granted; b moves under d's new lock, and gets
    // byte 0 when d leaves.
    l.release_owner(INO, a);
    td.join().unwrap().unwrap();
    assert_eq!(waiters(&l), 1);
    l.release_owner(INO, d);
    tb.join().unwrap().unwrap();
    assert_eq!(l.list(INO).0, vec![lk(LockType::Write, 0, 0, b), lk(LockType::Write, 5, 5, b)]);
    l.release_owner(INO, b);
    assert_eq!(l.live_contexts(INO), 0);
    assert!(l.blocked.is_empty());
}

#[test]
fn the_deadlock_walk_follows_eleven_waits() {
    // Owner i holds byte i and waits for byte i + 1, the last for byte 0; owner 0 closing
    // the cycle is refused when the cycle is at most 11 waits long, as in the kernel.
    for (hops, found) in [(11u64, true), (12, false)] {
        let l = Arc::new(FileLocks::default());
        let n = hops + 1;
        for i in 0..n {
            l.setlk(INO, &lk(LockType::Write, i, i, LockOwner::Posix(i)), Wait::No).unwrap();
        }
        let mut ts = Vec::new();
        for i in (1..n).rev() {
            let next = (i + 1) % n;
            ts.push((i, wait_for(&l, lk(LockType::Write, next, next, LockOwner::Posix(i)), None)));
            wait_until("the chain to form", || waiters(&l) == (n - i) as usize);
        }
        let cancel = Cancel::new();
        let t0 = wait_for(&l, lk(LockType::Write, 1, 1, LockOwner::Posix(0)), Some(&cancel));
        if found {
            assert!(matches!(t0.join().unwrap(), Err(Error::Deadlock)), "{hops} waits");
        } else {
            wait_until("0 to wait", || waiters(&l) == n as usize);
            cancel.cancel();
            assert!(matches!(t0.join().unwrap(), Err(Error::Interrupted)), "{hops} waits");
        }
        // Unwind: each owner leaving grants the one waiting for it.
        l.release_owner(INO, LockOwner::Posix(0));
        for (i, t) in ts {
            t.join().unwrap().unwrap();
            l.release_owner(INO, LockOwner::Posix(i));
        }
        assert_eq!(l.live_contexts(INO), 0);
        assert!(l.blocked.is_empty());
    }
}

#[test]
fn a_flock_conversion_is_done_before_the_waiters_it_frees_look_again() {
    // 1 holds LOCK_SH and 2 waits for LOCK_EX. 1's LOCK_EX|LOCK_NB drops its shared lock
    // and takes the exclusive one in the same step, as flock_lock_inode does; 2 looks again
    // only then, and waits on.
    let l = Arc::new(FileLocks::default());
    l.flock(INO, 1, FlockOp::Shared, Wait::No).unwrap();
    let t = {
        let l = l.clone();
        std::thread::spawn(move || l.flock(INO, 2, FlockOp::Exclusive, Wait::Forever))
    };
    wait_until("2 to wait", || waiters(&l) == 1);
    l.flock(INO, 1, FlockOp::Exclusive, Wait::No).unwrap();
    assert_eq!(l.list(INO).1, vec![(1, FlockOp::Exclusive)]);
    assert_eq!(waiters(&l), 1);
    l.flock(INO, 1, FlockOp::Unlock, Wait::No).unwrap();
    t.join().unwrap().unwrap();
    assert_eq!(l.list(INO).1, vec![(2, FlockOp::Exclusive)]);
    l.release_flock(INO, 2);
    assert_eq!(l.live_contexts(INO), 0);
}

#[test]
fn getlk_of_an_unlock_asks_an_ofd_owner_about_its_own_locks() {
    // F_OFD_GETLK with F_UNLCK reports the first of the description's own locks in the
    // range; F_GETLK with F_UNLCK is EINVAL.
    let l = FileLocks::default();
    let (d, p) = (LockOwner::Ofd(1), LockOwner::Posix(2));
    l.setlk(INO, &lk(LockType::Write, 10, 19, p), Wait::No).unwrap();
    l.setlk(INO, &lk(LockType::Read, 0, 4, d), Wait::No).unwrap();
    l.setlk(INO, &lk(LockType::Write, 6, 7, d), Wait::No).unwrap();
    assert_eq!(l.getlk(INO, &lk(LockType::Unlock, 3, 20, d)), Some(lk(LockType::Read, 0, 4, d)));
    assert_eq!(l.getlk(INO, &lk(LockType::Unlock, 5, 20, d)), Some(lk(LockType::Write, 6, 7, d)));
    assert_eq!(l.getlk(INO, &lk(LockType::Unlock, 8, 9, d)), None);
    let (fs, _dev) = crate::test_image::open_mem(crate::test_image::mkfs_image(None, &[], "8M"));
    let r = fs.getlk(fs.root(), &lk(LockType::Unlock, 0, u64::MAX, p));
    assert!(matches!(r, Err(Error::InvalidInput(_))), "{r:?}");
    assert_eq!(fs.getlk(fs.root(), &lk(LockType::Unlock, 0, u64::MAX, d)).unwrap(), None);
}
