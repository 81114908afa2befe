//! Close semantics, flock conversions and access modes, step by step.

use crate::random::{Step, Who, World};
use crate::*;

/// Runs `steps` on both sides, each with the answer the kernel must give and the locks held
/// after it (`None`: not checked), and compares rext4 with the kernel at every step.
pub fn scripted(w: &mut World<'_>, steps: &[(Step, &str, Option<&str>)]) {
    w.begin();
    for (i, (s, want, held)) in steps.iter().enumerate() {
        let (k, r) = w.step(s);
        let (kh, rh) = w.held();
        assert_eq!(k.to_string(), *want, "step {i} {s:?}: the kernel answered {k}");
        assert_eq!(k, r, "step {i} {s:?}: kernel {k}, rext4 {r}");
        if let Some(h) = held {
            assert_eq!(kh, *h, "step {i} {s:?}: the kernel holds [{kh}]");
        }
        assert_eq!(kh, rh, "step {i} {s:?}: locks differ");
        w.probe().unwrap_or_else(|e| panic!("after step {i} {s:?}: {e}"));
    }
    w.finish().unwrap();
}

pub fn plock(n: usize, via: usize, ty: Ty, start: i64, len: i64) -> Step {
    Step::Lock { who: Who::P(n), via, cmd: Cmd::Set, req: rq(ty, start, len) }
}

pub fn ofd(d: usize, via: usize, ty: Ty, start: i64, len: i64) -> Step {
    Step::Lock { who: Who::D(d), via, cmd: Cmd::Set, req: rq(ty, start, len) }
}

pub fn fl(d: usize, via: usize, op: FlockOp) -> Step {
    Step::Flock { d, via, op }
}

#[test]
pub fn close_semantics_match_the_kernel() {
    let _serial = one_at_a_time();
    let Some(env) = Env::new() else { return };
    let mut w = World::new(&env, 2);
    use FlockOp::*;
    use Ty::*;
    scripted(
        &mut w,
        &[
            // A POSIX owner's locks, taken through either of its descriptions, all go when it
            // closes any descriptor of the file; another owner's stay.
            (plock(0, 0, W, 0, 5), "ok", None),
            (plock(0, 1, R, 10, 0), "ok", Some("P0 W 0-4, P0 R 10-EOF")),
            (plock(1, 0, R, 5, 2), "ok", None),
            (Step::Close { who: Who::P(0), via: 1 }, "ok", Some("P1 R 5-6")),
            (plock(0, 0, W, 0, 5), "ok", None),
            (Step::Close { who: Who::P(1), via: 0 }, "ok", Some("P0 W 0-4")),
            // An OFD lock and a flock lock stay while a dup of the description is open...
            (ofd(0, 0, W, 20, 2), "ok", None),
            (fl(0, 0, Exclusive), "ok", None),
            (Step::Dup(0), "ok", None),
            (Step::Close { who: Who::D(0), via: 0 }, "ok", Some("D0 flock W, D0 W 20-21, P0 W 0-4")),
            // ... and a POSIX owner's close does not touch them.
            (Step::Close { who: Who::P(0), via: 0 }, "ok", Some("D0 flock W, D0 W 20-21")),
            // Another description conflicts with them; the dup is the same owner.
            (ofd(1, 0, R, 21, 1), "EAGAIN", None),
            (fl(1, 0, Shared), "EAGAIN", None),
            (ofd(0, 0, R, 21, 1), "ok", Some("D0 flock W, D0 W 20-20, D0 R 21-21")),
            // The last close drops them.
            (Step::Close { who: Who::D(0), via: 0 }, "ok", Some("")),
            (ofd(1, 0, R, 21, 1), "ok", None),
            (fl(1, 0, Shared), "ok", Some("D1 flock R, D1 R 21-21")),
            // flock: a conversion that fails has dropped the old lock first.
            (fl(2, 0, Shared), "ok", None),
            (fl(1, 0, Exclusive), "EAGAIN", Some("D1 R 21-21, D2 flock R")),
            (fl(2, 0, Exclusive), "ok", Some("D1 R 21-21, D2 flock W")),
            (fl(2, 0, Shared), "ok", None),
            (fl(2, 0, Unlock), "ok", Some("D1 R 21-21")),
            // POSIX and OFD owners conflict with each other.
            (plock(1, 1, W, 21, 0), "EAGAIN", None),
            (plock(1, 1, R, 0, 0), "ok", None),
            (ofd(2, 0, W, 0, 1), "EAGAIN", Some("D1 R 21-21, P1 R 0-EOF")),
        ],
    );
}

#[test]
pub fn access_modes_match_the_kernel() {
    let _serial = one_at_a_time();
    let Some(env) = Env::new() else { return };
    let (path, _, ino) = env.new_file("modes");
    let open = |read: bool, write: bool| -> OwnedFd {
        std::fs::OpenOptions::new().read(read).write(write).open(&path).unwrap().into()
    };
    let (kro, kwo) = (open(true, false), open(false, true));
    let (rro, rwo) = (env.open(ino, OpenFlags::READ), env.open(ino, OpenFlags::WRITE));
    for (kfd, rf, ty, want) in [
        (&kro, &rro, Ty::W, "EBADF"),
        (&kwo, &rwo, Ty::R, "EBADF"),
        (&kro, &rro, Ty::R, "ok"),
        (&kwo, &rwo, Ty::W, "ok"),
        (&kro, &rro, Ty::U, "ok"),
        (&kwo, &rwo, Ty::U, "ok"),
    ] {
        for ofd in [true, false] {
            let r = rq(ty, 0, 1);
            let posix = (!ofd).then_some(1);
            let k = kernel_ans(fcntl_lock(kfd.as_raw_fd(), ofd, Cmd::Set, r), Cmd::Set, &[]);
            let e = rext4_lock_call(rf, posix, Cmd::Set, r, Wait::No);
            assert_eq!(k.to_string(), want, "{r:?} ofd={ofd}");
            assert_eq!(k, e, "{r:?} ofd={ofd}");
            let u = rq(Ty::U, 0, 0);
            assert_eq!(fcntl_lock(kfd.as_raw_fd(), ofd, Cmd::Set, u), Ok(None));
            assert_eq!(rext4_lock_call(rf, posix, Cmd::Set, u, Wait::No), Ans::Ok);
        }
    }
}
