//! Journal recovery at open, the ext4 side (`ext4_get_journal_inode` and `ext4_load_journal`
//! in the kernel's `super.c`): find the internal journal's blocks, check its superblock, run
//! jbd2 recovery (`jbd2/recovery.rs`), and apply what it found: in memory for a read-only
//! open (an [`OverlayDevice`] the image never sees), in place for a writable open and for
//! [`recover_image`].

use crate::dev::overlay::OverlayDevice;
use crate::dev::BlockDevice;
use crate::error::{corrupt, Corrupt, CorruptKind, Error, Result};
use crate::fs::super_block::SbInfo;
use crate::fs::{FsInner, Options};
use crate::jbd2::external::ExternalJournal;
use crate::jbd2::log_map::JournalLog;
use crate::jbd2::recovery::{self, JournalBlocks, RecoveryReport, Replay};
use crate::map::Mapping;
use rext4_format::fast_commit::Tag as FcTag;
use rext4_format::features::{Compat, Incompat};
use rext4_format::inode::{INLINE_DATA_FL, S_IFREG};
use rext4_format::jbd2::{JournalIncompat, JournalParams, JournalSuperblock};
use rext4_format::superblock::{Superblock, STATE_ERROR, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE};
use rext4_format::InodeNo;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use zerocopy::IntoBytes;

/// The part of the superblock that records errors (`EXT4_S_ERR_START..EXT4_S_ERR_END`, from
/// `s_error_count` to `s_mount_opts`): the kernel keeps the copy it read before the replay.
const ERR_RANGE: core::ops::Range<usize> = 0x194..0x200;

/// Replays the journal of the image at `path` onto the image and marks it recovered, as the
/// kernel does when it mounts an image that was not cleanly unmounted: every replayed block
/// is written home, then the journal is emptied (`s_start = 0`, `s_sequence` moved past
/// everything in the log) and `needs_recovery` is cleared in the superblock, each step made
/// durable before the next, so an interruption leaves an image that recovers again.
///
/// An image that needs no recovery is left alone (the report is all zeros). A journal the
/// kernel would refuse (see `docs/design.md`, "Journal recovery") is refused here too, before
/// anything is written. Orphans are not processed: the kernel does that at mount, e2fsck
/// when checking.
pub fn recover_image(path: impl AsRef<Path>) -> Result<RecoveryReport> {
    recover_image_with(path, None)
}

/// [`recover_image`] for an image whose journal is on the external device `journal` (see
/// [`Options::journal_path`]).
pub fn recover_image_with(path: impl AsRef<Path>, journal: Option<&Path>) -> Result<RecoveryReport> {
    let dev = crate::dev::open(path.as_ref(), true)?;
    let sbi = SbInfo::load(&*dev)?;
    if !sbi.needs_recovery() {
        return Ok(RecoveryReport::default());
    }
    let ext = open_external(journal, &sbi, true)?;
    // It writes the image: multi-mount protection first, as e2fsck takes it for its replay.
    let name = path.as_ref().as_os_str().as_encoded_bytes();
    let (dev, mmp) = crate::fs::mmp::Mmp::protect_if_needed(dev, &sbi, name)?;
    let replayed = replay_in_place(&dev, &sbi, ext.as_deref());
    // Clean again before the writable open below takes it.
    drop(mmp);
    let (report, fast_commits) = replayed?;
    if !fast_commits.is_empty() {
        // Fast commits are applied by a writable filesystem, which finds them again.
        drop(dev);
        drop(ext);
        let opts =
            Options { writable: true, journal_path: journal.map(Path::to_path_buf), ..Options::default() };
        let fs = crate::Fs::open_with(path, opts)?;
        fs.unmount()?;
    }
    Ok(report)
}

/// The external journal device at `path`, for a filesystem (`sbi`) whose journal is on one;
/// `None` for one with an internal journal or none. A journal device for a filesystem that
/// has none of its own is refused, as the kernel refuses `journal_path=` there.
pub(crate) fn open_external(
    path: Option<&Path>,
    sbi: &SbInfo,
    writable: bool,
) -> Result<Option<Arc<ExternalJournal>>> {
    let external = sbi.sb.compat().contains(Compat::HAS_JOURNAL) && sbi.sb.s_journal_inum.get() == 0;
    match (path, external) {
        (None, _) => Ok(None),
        (Some(_), false) => {
            Err(Error::InvalidInput("a journal device for a filesystem without an external journal"))
        }
        (Some(p), true) => {
            let dev = crate::dev::open(p, writable)?;
            Ok(Some(Arc::new(ExternalJournal::load(dev, sbi)?)))
        }
    }
}

/// What an open continues with after recovery.
pub(crate) struct Recovered {
    pub dev: Arc<dyn BlockDevice>,
    pub sbi: SbInfo,
    /// What was replayed, if the image needed it.
    pub report: Option<RecoveryReport>,
    /// Fast commits a writable open must apply (`fs/fast_commit.rs`).
    pub fast_commits: Vec<FcTag>,
    /// The external journal device, where the filesystem has one and the open named it.
    pub journal: Option<Arc<ExternalJournal>>,
}

/// What the open path does when the superblock says the journal needs recovery: replays it in
/// place when writing, over an in-memory overlay when reading.
pub(crate) fn recover_at_open(
    dev: Arc<dyn BlockDevice>,
    sbi: SbInfo,
    writable: bool,
    ext: Option<Arc<ExternalJournal>>,
) -> Result<Recovered> {
    if !sbi.needs_recovery() {
        return Ok(Recovered { dev, sbi, report: None, fast_commits: Vec::new(), journal: ext });
    }
    if writable {
        let (report, fast_commits) = replay_in_place(&dev, &sbi, ext.as_deref())?;
        let sbi = SbInfo::load(&*dev)?;
        return Ok(Recovered { dev, sbi, report: Some(report), fast_commits, journal: ext });
    }
    let (replay, journal) = recover(&dev, &sbi, ext.as_deref())?;
    if !replay.fast_commits.is_empty() {
        // Fast commits need a writable filesystem: run one over a copy-on-write view of the
        // image, closed cleanly, and read that. What keeps the image itself read-only
        // (features rext4 does not write) does not stop it: the writes stay in memory, and
        // the kernel replays fast commits on a read-only mount too.
        let report = replay.report;
        let cow: Arc<dyn BlockDevice> = Arc::new(OverlayDevice::copy_on_write(dev, sbi.block_size)?);
        // An external journal's device is not written either.
        let ext_cow = match &ext {
            Some(e) => {
                Some(Arc::new(e.on(Arc::new(OverlayDevice::copy_on_write(e.dev().clone(), sbi.block_size)?))))
            }
            None => None,
        };
        crate::Fs::replay_in_memory(cow.clone(), ext_cow)?;
        let mut sbi = SbInfo::load(&*cow)?;
        sbi.ro_reasons
            .push("the journal was replayed in memory only; the image itself still needs recovery".into());
        return Ok(Recovered { dev: cow, sbi, report: Some(report), fast_commits: Vec::new(), journal: ext });
    }
    let mut blocks: BTreeMap<u64, Box<[u8]>> = replay.blocks.into_iter().map(|(b, d)| (b.0, d)).collect();
    let bs = u64::from(sbi.block_size);
    let (sb_blk, sb_off) = sbi.sb_location();
    let mut block = match blocks.remove(&sb_blk) {
        Some(b) => b,
        None => {
            let mut b = vec![0u8; sbi.block_size as usize].into_boxed_slice();
            dev.read_at(&mut b, sb_blk * bs)?;
            b
        }
    };
    finish_superblock(&mut block[sb_off..sb_off + SUPERBLOCK_SIZE], &sbi.sb, &journal.jsb, false)?;
    blocks.insert(sb_blk, block);
    let overlay: Arc<dyn BlockDevice> = Arc::new(OverlayDevice::new(dev, blocks, sbi.block_size)?);
    let mut sbi = SbInfo::load(&*overlay)?;
    if sbi.needs_recovery() {
        // Cannot happen: finish_superblock cleared the flag.
        return corrupt(CorruptKind::Journal("superblock still needs recovery after replay"));
    }
    sbi.ro_reasons
        .push("the journal was replayed in memory only; the image itself still needs recovery".into());
    Ok(Recovered { dev: overlay, sbi, report: Some(replay.report), fast_commits: Vec::new(), journal: ext })
}

/// Replays onto `dev`, whose superblock `sbi` needs recovery, and marks it recovered.
///
/// With fast commits to apply (returned), the journal is left empty but started at their
/// transaction, with its fast-commit area, and the superblock still needs recovery: a crash
/// before a writable open has applied and committed them finds them again
/// (`fs/fast_commit.rs`).
fn replay_in_place(
    dev: &Arc<dyn BlockDevice>,
    sbi: &SbInfo,
    ext: Option<&ExternalJournal>,
) -> Result<(RecoveryReport, Vec<FcTag>)> {
    let (replay, journal) = recover(dev, sbi, ext)?;
    let bs = u64::from(sbi.block_size);
    for (blk, data) in &replay.blocks {
        dev.write_at(data, blk.0 * bs)?;
    }
    dev.flush()?;
    let pending = !replay.fast_commits.is_empty();
    // `journal_reset` / `jbd2_mark_journal_empty`, and `jbd2_journal_clear_err`.
    let mut jsb = journal.jsb.clone();
    if jsb.start() != 0 || jsb.errno() != 0 {
        if pending {
            // The transaction the fast commits belong to is the next one to commit.
            jsb.set_start(jsb.first());
            jsb.set_sequence(replay.report.end_sequence.wrapping_sub(1));
        } else {
            jsb.set_start(0);
            jsb.set_sequence(replay.report.end_sequence);
            // An empty journal does not advertise fast commits (`jbd2_mark_journal_empty`).
            jsb.set_incompat(jsb.incompat() - JournalIncompat::FAST_COMMIT);
        }
        jsb.set_errno(0);
        jsb.update_checksum();
        // Always mapped: the superblock was read from it.
        let Some(at) = journal.log.device_block(journal.log.sb_block()) else {
            return corrupt(CorruptKind::Journal("cannot locate the journal superblock"));
        };
        let log_dev = journal.log.dev();
        log_dev.write_at(jsb.as_bytes(), at * bs)?;
        log_dev.flush()?;
    }
    let mut raw = [0u8; SUPERBLOCK_SIZE];
    dev.read_at(&mut raw, SUPERBLOCK_OFFSET)?;
    finish_superblock(&mut raw, &sbi.sb, &journal.jsb, pending)?;
    dev.write_at(&raw, SUPERBLOCK_OFFSET)?;
    dev.flush()?;
    Ok((replay.report, replay.fast_commits))
}

/// Turns the replayed primary superblock into the recovered one, as `ext4_load_journal` and
/// the end of the kernel's mount do: the error record and error state read before the replay
/// are kept, an error the journal recorded (`s_errno`) marks the filesystem as having errors
/// (`ext4_clear_journal_err`), and `needs_recovery` is cleared unless fast commits are
/// `pending`.
fn finish_superblock(
    raw: &mut [u8],
    before: &Superblock,
    jsb: &JournalSuperblock,
    pending: bool,
) -> Result<()> {
    // Cannot fail: callers pass SUPERBLOCK_SIZE bytes.
    let Some(mut sb) = Superblock::parse(raw) else { return corrupt(CorruptKind::Superblock("unreadable")) };
    if !sb.verify_checksum() {
        return corrupt(CorruptKind::SuperblockChecksum);
    }
    let bytes = sb.as_mut_bytes();
    bytes[ERR_RANGE].copy_from_slice(&before.as_bytes()[ERR_RANGE]);
    let mut state = sb.s_state.get() | (before.s_state.get() & STATE_ERROR);
    if jsb.errno() != 0 {
        state |= STATE_ERROR;
    }
    sb.s_state.set(state);
    if !pending {
        sb.s_feature_incompat.set(sb.s_feature_incompat.get() & !Incompat::RECOVER.bits());
    }
    sb.update_checksum();
    raw.copy_from_slice(sb.as_bytes());
    Ok(())
}

/// A journal ready for recovery.
struct Journal {
    log: JournalLog,
    jsb: JournalSuperblock,
}

/// Finds the journal of the filesystem on `dev` (superblock `sbi`) and runs recovery on it.
fn recover(
    dev: &Arc<dyn BlockDevice>,
    sbi: &SbInfo,
    ext: Option<&ExternalJournal>,
) -> Result<(Replay, Journal)> {
    let sb = &sbi.sb;
    if !sb.compat().contains(Compat::HAS_JOURNAL) {
        return corrupt(CorruptKind::Journal("needs recovery but has no journal"));
    }
    let ino = sb.s_journal_inum.get();
    if ino == 0 && ext.is_none() {
        return Err(Error::Incompatible(
            "the journal needs recovery and is on an external device: give its path \
             (Options::journal_path, --journal, -o journal_path=)"
                .into(),
        ));
    }
    if ino != 0 && sb.s_journal_dev.get() != 0 {
        return corrupt(CorruptKind::Journal("both a journal inode and a journal device"));
    }
    // Just enough of a filesystem to read the journal inode: the descriptors and that inode.
    let opts = Options { cache_bytes: 4 << 20, inode_cache: 64, ..Options::default() };
    let mut fs = FsInner::new(dev.clone(), sbi.clone(), &opts)?;
    let (log, jsb, params) = match ext {
        Some(e) => e.log(sbi.block_size)?,
        None => fs.journal_log(InodeNo(ino))?,
    };
    let replay = recovery::recover(&jsb, params, &log, sbi.blocks_count, sbi.inode_size)?;
    if !replay.fast_commits.is_empty() {
        // Fast commits naming what they may not are refused before anything is written.
        fs.protect_journal();
        fs.check_fast_commit_tags(&replay.fast_commits)?;
    }
    Ok((replay, Journal { log, jsb }))
}

impl FsInner {
    /// The internal journal in inode `ino` (`ext4_get_journal_inode`, `jbd2_journal_init_inode`):
    /// a linked regular file whose first `s_maxlen` blocks are all mapped inside the
    /// filesystem, with a journal superblock the kernel would load.
    pub(crate) fn journal_log(&self, ino: InodeNo) -> Result<(JournalLog, JournalSuperblock, JournalParams)> {
        let bad = |what| corrupt(CorruptKind::Journal(what));
        let inode = self.iget(ino)?;
        let disk = inode.disk();
        if disk.links_count() == 0 {
            return bad("journal inode is deleted");
        }
        if disk.file_type() != S_IFREG || disk.flags() & INLINE_DATA_FL != 0 {
            return bad("invalid journal inode");
        }
        let bs = u64::from(self.sbi.block_size);
        let len = inode.size() / bs;
        let mut log = JournalLog::new(self.dev.clone(), bs);
        self.map_journal(&inode, &mut log, len.min(1))?;
        if log.mapped() == 0 {
            return bad("cannot locate the journal superblock");
        }
        let mut raw = vec![0u8; self.sbi.block_size as usize];
        log.read(0, &mut raw)?;
        // Cannot fail: a block is at least 1024 bytes.
        let Some(jsb) = JournalSuperblock::parse(&raw) else { return bad("journal superblock unreadable") };
        let params = recovery::check_superblock(&jsb, self.sbi.block_size, len)?;
        self.map_journal(&inode, &mut log, u64::from(jsb.maxlen()))?;
        Ok((log, jsb, params))
    }

    /// Extends `log` to the first `n` blocks of the journal inode, each inside the filesystem.
    fn map_journal(&self, inode: &crate::inode::Inode, log: &mut JournalLog, n: u64) -> Result<()> {
        let mut l = log.mapped();
        // n is at most s_maxlen, a u32: so are l and len.
        let too_long = || Error::Corrupt(Corrupt(CorruptKind::Journal("journal longer than 2^32 blocks")));
        while l < n {
            let lblk = u32::try_from(l).map_err(|_| too_long())?;
            let (pblk, len) = match self.map_block(inode, lblk)? {
                Mapping::Mapped { pblk, len, unwritten: false } => (pblk, len.min(n - l)),
                _ => return corrupt(CorruptKind::Journal("the journal inode has a hole")),
            };
            self.check_range(inode.ino, pblk, len)?;
            log.push(pblk, u32::try_from(len).map_err(|_| too_long())?);
            l += len;
        }
        Ok(())
    }
}
