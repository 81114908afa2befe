//! Journals the kernel wrote: images copied while mounted recover as the kernel and e2fsck
//! recover them.

use super::*;

/// A read-write kernel mount with chosen options, unmounted on drop.
pub(super) struct RwMount {
    dir: tempfile::TempDir,
    mounted: bool,
}

impl RwMount {
    pub(super) fn new(img: &Path, opts: &str) -> Result<RwMount, String> {
        let dir = tempfile::Builder::new().prefix("rext4-rec-mnt").tempdir().map_err(|e| e.to_string())?;
        let (code, text) = output(
            Command::new(tool("mount"))
                .args(["-t", "ext4", "-o", &format!("loop,{opts}")])
                .arg(img)
                .arg(dir.path()),
        );
        if code != 0 {
            return Err(text);
        }
        Ok(RwMount { dir, mounted: true })
    }
    pub(super) fn path(&self) -> &Path {
        self.dir.path()
    }
    pub(super) fn unmount(&mut self) {
        if self.mounted {
            for _ in 0..20 {
                if output(Command::new(tool("umount")).arg(self.dir.path())).0 == 0 {
                    self.mounted = false;
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = Command::new(tool("umount")).arg("-l").arg(self.dir.path()).status();
            self.mounted = false;
        }
    }
}

impl Drop for RwMount {
    fn drop(&mut self) {
        self.unmount();
    }
}

pub(super) fn fsync(p: &Path) {
    fs::File::open(p).unwrap().sync_all().unwrap();
}

pub(super) fn write_synced(p: &Path, data: &[u8]) {
    fs::write(p, data).unwrap();
    fsync(p);
}

/// Changes the kernel makes: phase 1 is `sync`ed (written home and logged), phase 2 only
/// fsync'ed (in the log; its home blocks still stale when the image is copied).
fn kernel_workload(m: &Path, big: bool) {
    use std::os::unix::fs::symlink;
    for d in ["a", "a/b", "c", "gone-dir"] {
        fs::create_dir(m.join(d)).unwrap();
    }
    for i in 0..30 {
        fs::write(m.join(format!("a/f{i}")), format!("phase one {i}\n").repeat(i * 7 + 1)).unwrap();
    }
    fs::write(m.join("c/doomed"), b"unlinked in phase two").unwrap();
    fs::write(m.join("c/moved"), b"renamed in phase two").unwrap();
    symlink("a/f1", m.join("link1")).unwrap();
    xattr::set(m.join("a/f2"), "user.one", b"1").unwrap();
    let _ = Command::new("sync").status();

    for i in 0..40 {
        write_synced(&m.join(format!("a/b/n{i}")), &vec![i as u8; 100 * i + 1]);
    }
    if big {
        write_synced(&m.join("big"), &(0..3_000_000u32).flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    }
    fs::rename(m.join("c/moved"), m.join("a/moved-here")).unwrap();
    fs::remove_file(m.join("c/doomed")).unwrap();
    fs::remove_dir(m.join("gone-dir")).unwrap();
    fs::remove_file(m.join("a/f3")).unwrap();
    fs::hard_link(m.join("a/f4"), m.join("c/hard")).unwrap();
    fs::set_permissions(m.join("a/f5"), fs::Permissions::from_mode(0o600)).unwrap();
    xattr::set(m.join("a/f2"), "user.two", &[2u8; 300]).unwrap();
    xattr::set(m.join("c"), "user.dir", b"on a directory").unwrap();
    symlink("x".repeat(200), m.join("c/longlink")).unwrap();
    fs::create_dir(m.join("c/newdir")).unwrap();
    for i in 0..300 {
        fs::write(m.join(format!("c/newdir/e{i:03}")), b"").unwrap();
    }
    for d in ["", "a", "a/b", "c", "c/newdir"] {
        fsync(&m.join(d));
    }
    fsync(&m.join("a/f5"));
}

/// How a kernel case ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tail {
    /// With full commits.
    Commit,
    /// With an append and fsync that the kernel logs as a fast commit (`fast_commit` images).
    FastCommit,
}

fn kernel_case(name: &str, mkfs: &[&str], mount_opts: &str, tail: Tail) {
    let tmp = scratch();
    let dir = tmp.path().to_path_buf();
    // REXT4_KEEP=1 keeps the images for a look after a failure.
    let _tmp = if std::env::var_os("REXT4_KEEP").is_some() {
        eprintln!("{name}: images kept in {}", dir.display());
        let _ = tmp.keep();
        None
    } else {
        Some(tmp)
    };
    let img = dir.join("img");
    let mut args = vec!["-E", "lazy_itable_init=0,lazy_journal_init=0"];
    args.extend_from_slice(mkfs);
    Image::ext4("96M").args(&args).build(&img);
    let crash = dir.join("crash");
    let model;
    {
        let mut m = match RwMount::new(&img, mount_opts) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("SKIP {name}: cannot mount with {mount_opts}: {e}");
                return;
            }
        };
        kernel_workload(m.path(), true);
        if tail == Tail::FastCommit {
            let p = m.path().join("a/f7");
            let mut f = fs::OpenOptions::new().append(true).open(&p).unwrap();
            std::io::Write::write_all(&mut f, b"appended after the last full commit\n").unwrap();
            f.sync_all().unwrap();
        }
        model = walk_kernel(m.path());
        // The crash: a copy of the image while the kernel still has it mounted.
        let (code, text) = output(Command::new("cp").arg("--sparse=always").arg(&img).arg(&crash));
        assert_eq!(code, 0, "{text}");
        m.unmount();
    }
    assert!(fs_incompat(&crash) & RECOVER != 0, "{name}: the copy does not need recovery");
    let snapshot = fs::read(&crash).unwrap();

    // rext4 reads the crashed image as the kernel showed it.
    let fs_ro = Fs::open(&crash).unwrap_or_else(|e| panic!("{name}: open: {e}"));
    let report = fs_ro.recovery().cloned().unwrap();
    assert!(report.transactions > 0 && report.distinct_blocks > 0, "{name}: {report:?}");
    assert_eq!(report.fast_commit_tags > 0, tail == Tail::FastCommit, "{name}: {report:?}");
    let ro_walk = walk_rext4(&fs_ro, None);
    assert_no_diff(
        &format!("{name}: kernel before the crash vs rext4 replay"),
        &diff_full("kernel", &model, "rext4", &ro_walk),
    );
    drop(fs_ro);
    assert!(fs::read(&crash).unwrap() == snapshot, "{name}: read-only open modified the image");

    // How much the replay mattered: the same image with the journal ignored.
    let stale = copy(&crash, &dir.join("stale"));
    let mut b = read_block(&stale, 0, 4096);
    let inc = fs_incompat(&stale) & !RECOVER;
    b[1024 + 0x60..1024 + 0x64].copy_from_slice(&inc.to_le_bytes());
    let c = rext4::format::checksum::crc32c(!0, &b[1024..1024 + 0x3FC]);
    b[1024 + 0x3FC..1024 + 0x400].copy_from_slice(&c.to_le_bytes());
    write_at(&stale, 0, &b);
    let stale_diffs = match Fs::open(&stale) {
        Ok(f) => diff_full("kernel", &model, "stale", &walk_rext4(&f, None)).len(),
        Err(_) => usize::MAX,
    };
    eprintln!("{name}: {report:?}; without replay {stale_diffs} differences");

    // rext4's recovery onto the image: clean, and what the kernel then mounts is the same.
    let ours = copy(&crash, &dir.join("ours"));
    let r = rext4::recover_image(&ours).unwrap_or_else(|e| panic!("{name}: recover_image: {e}"));
    assert_eq!(r, report, "{name}");
    // The kernel processes orphans at mount, after the replay; neither rext4's recovery nor
    // e2fsck's journal replay does. What e2fsck then finds must be only that, and the same.
    if tail == Tail::FastCommit {
        // ext4's logical log: rext4 replays it its own way (`fs/fast_commit.rs`), so the
        // blocks differ from e2fsck's; the trees are compared in `fast_commits.rs`.
        assert_fsck_clean(&ours, name);
        let fs_ours = Fs::open(&ours).unwrap();
        assert_no_diff(
            name,
            &diff_full("in-memory replay", &ro_walk, "recovered", &walk_rext4(&fs_ours, None)),
        );
        return;
    }
    let theirs = copy(&crash, &dir.join("theirs"));
    let text = e2fsck_replay(&theirs);
    if text.contains("while recovering journal") {
        // e2fsprogs 1.47.0 fails ("Invalid argument while recovering journal") on a journal
        // with the fast-commit feature whose fast-commit area is stale, and then drops the
        // journal unreplayed; the kernel is the oracle there.
        assert!(mkfs.contains(&"fast_commit"), "{name}: e2fsck could not replay:\n{text}");
        eprintln!("{name}: e2fsck cannot replay this journal: {}", text.trim());
        assert_fsck_clean(&ours, name);
        return;
    }
    let (problems, theirs_problems) = (fsck_problems(&ours), fsck_problems(&theirs));
    assert_eq!(problems, theirs_problems, "{name}: e2fsck -fn after rext4's and after e2fsck's replay");
    for p in &problems {
        assert!(
            p.starts_with("Feature orphan_present is set but orphan file is clean"),
            "{name}: e2fsck -fn: {p}"
        );
    }
    let fs_ours = Fs::open(&ours).unwrap();
    let ours_walk = walk_rext4(&fs_ours, None);
    assert_no_diff(name, &diff_full("in-memory replay", &ro_walk, "recovered", &ours_walk));
    {
        let m = KernelMount::ro(&ours).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_no_diff(name, &diff_full("kernel", &walk_kernel(m.path()), "rext4", &ours_walk));
    }

    // e2fsck's replay of the same crash writes the same bytes; after its full check, the
    // tree is the same.
    let bs = fs_ours.block_size() as usize;
    assert_eq!(differing_blocks(&ours, &theirs, bs), Vec::<u64>::new(), "{name}: rext4 vs e2fsck replay");
    assert_eq!(
        journal_state(&ours, bs),
        journal_state(&theirs, bs),
        "{name}: journal superblock after recovery"
    );
    let (code, text) = e2fsck(&theirs, "-fy");
    assert!(code == 0 || code == 1, "{name}: e2fsck -fy exited {code}:\n{text}");
    let fs_theirs = Fs::open(&theirs).unwrap();
    assert_no_diff(name, &diff_full("e2fsck", &walk_rext4(&fs_theirs, None), "rext4", &ours_walk));
}

#[test]
fn kernel_written_journals() {
    require_kernel!();
    use Tail::*;
    kernel_case("default", &[], "noatime", Commit);
    kernel_case("csum-seed-orphan-file", &["-O", "metadata_csum_seed,orphan_file"], "noatime", Commit);
    kernel_case("no-metadata-csum", &["-O", "^metadata_csum"], "noatime", Commit);
    // Small images get 1 KiB blocks by default; 4 KiB puts the superblock inside block 0.
    kernel_case("4k-blocks", &["-b", "4096"], "noatime", Commit);
    // The kernel allows asynchronous commits only without data=ordered.
    kernel_case("async-commit", &["-b", "4096"], "noatime,data=writeback,journal_async_commit", Commit);
    // A fast-commit journal whose fast-commit area is stale replays like any other; one that
    // holds fast commits replays them too.
    kernel_case("fast-commit-stale", &["-O", "fast_commit"], "noatime", Commit);
    kernel_case("fast-commit", &["-O", "fast_commit"], "noatime", FastCommit);
}
