//! Journal recovery (the kernel's `fs/jbd2/recovery.c`): find the end of the log, collect the
//! revoke records, and work out what to replay.
//!
//! The three passes follow the kernel's `do_one_pass` step by step, including which
//! inconsistencies quietly end the log (a block without the magic or with another sequence:
//! the transaction it belongs to never committed) and which make the kernel refuse the journal
//! (see [`recover`]). Where the kernel writes each replayed block to the device, the replay pass
//! collects the blocks in a [`Replay`] (the last copy of a block wins); the caller applies it in
//! memory or in place (`jbd2/replay.rs`).
//!
//! Beyond the kernel: a walk that goes round the whole log without finding its end is refused
//! (a hostile log of blocks that all carry the expected sequence would otherwise loop forever),
//! and replay targets must lie inside the filesystem.

use crate::error::{corrupt, CorruptKind, Error, Result};
use rext4_format::fast_commit::{self, ScanError, Tag as FcTag};
use rext4_format::jbd2::commit::{commit_checksum, COMMIT_CHECKSUM_OFFSET};
use rext4_format::jbd2::{
    tid_geq, tid_gt, unescape_block, verify_tail, BlockType, CommitBlock, DescriptorTags, Header, Jbd2Error,
    JournalIncompat, JournalParams, JournalSuperblock, RevokeBlock, CHKSUM_CRC32, CRC32_CHKSUM_SIZE,
};
use rext4_format::PhysBlock;
use std::collections::{BTreeMap, HashMap};

/// Reads block `n` of the journal (numbered as in the journal inode) into `buf`, which is one
/// journal block long. Callers only ask for `n` below the journal's length.
pub(super) trait JournalBlocks {
    fn read(&self, n: u32, buf: &mut [u8]) -> Result<()>;
}

/// What a recovery did (the kernel's `recovery_info` and its "recovered transactions ..., replayed
/// ... and revoked .../... blocks" message).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveryReport {
    /// Sequence number of the first transaction in the log (`s_sequence` before recovery).
    pub start_sequence: u32,
    /// Sequence number the journal continues with: one past the first transaction that was not
    /// replayed, as jbd2 sets it so that nothing left in the log is ever taken as valid again.
    pub end_sequence: u32,
    /// Committed transactions replayed.
    pub transactions: u32,
    /// Logged block copies written (a block logged in several transactions counts each time).
    pub blocks_replayed: u64,
    /// Logged block copies skipped because a later (or the same) transaction revoked them.
    pub blocks_revoked: u64,
    /// Revoke records read.
    pub revoke_records: u64,
    /// Distinct filesystem blocks the replay changes.
    pub distinct_blocks: u64,
    /// Fast-commit tags found valid for the transaction after the last full commit, which the
    /// open applies after the blocks (0 without fast commits).
    pub fast_commit_tags: u64,
}

/// The outcome of recovery: the newest copy of every replayed filesystem block, by block
/// number, and the counts.
pub(super) struct Replay {
    pub blocks: BTreeMap<PhysBlock, Box<[u8]>>,
    pub report: RecoveryReport,
    /// The fast commits to apply after the blocks (ext4's, `fs/fast_commit.rs`), in order.
    pub fast_commits: Vec<FcTag>,
}

/// Checks the journal superblock as `journal_get_superblock` and `jbd2_journal_load` do, for a
/// journal of `len` blocks on a filesystem of `fs_block_size`, and returns the block parsers'
/// parameters. Every refusal is a typed corruption error.
pub(super) fn check_superblock(
    jsb: &JournalSuperblock,
    fs_block_size: u32,
    len: u64,
) -> Result<JournalParams> {
    let params = jsb.params().map_err(superblock_error)?;
    if jsb.block_size() != fs_block_size {
        return corrupt(CorruptKind::Journal("journal block size differs from the filesystem's"));
    }
    if u64::from(jsb.maxlen()) > len {
        return corrupt(CorruptKind::Journal("journal superblock longer than the journal inode"));
    }
    Ok(params)
}

fn superblock_error(e: Jbd2Error) -> Error {
    let kind = match e {
        Jbd2Error::BadChecksum { .. } => CorruptKind::JournalChecksum("superblock checksum mismatch"),
        Jbd2Error::BadMagic(_) | Jbd2Error::NotASuperblock(_) => {
            CorruptKind::Journal("no valid journal superblock found")
        }
        Jbd2Error::BadBlockSize(_) => CorruptKind::Journal("bad journal block size"),
        Jbd2Error::BadFirst { .. } => CorruptKind::Journal("invalid first block of the log"),
        Jbd2Error::TooShort { .. } => CorruptKind::Journal("journal too short"),
        Jbd2Error::UnknownIncompat(_) | Jbd2Error::UnknownRoCompat(_) => {
            CorruptKind::Journal("unrecognised journal features")
        }
        Jbd2Error::ConflictingChecksums => CorruptKind::Journal("several journal checksum versions at once"),
        Jbd2Error::BadChecksumType(_) => CorruptKind::Journal("unknown journal checksum type"),
        _ => CorruptKind::Journal("bad journal superblock"),
    };
    Error::Corrupt(crate::error::Corrupt(kind))
}

/// Runs recovery over the log `jsb` describes (`jbd2_journal_recover`). `params` comes from
/// [`check_superblock`]; replayed blocks must lie below `fs_blocks`.
///
/// As the kernel's mount, recovery is refused (a typed error) when:
/// - a commit block of a synchronous journal fails its checksum while commit times still
///   increase (`j_failed_commit`: the kernel replays the transactions before it and then
///   refuses to mount with `EFSCORRUPTED`; e2fsck reports it and carries on);
/// - a descriptor or revoke block failed its checksum and the commit block after it looks
///   current (`EFSBADCRC`);
/// - a logged block that is not revoked fails its tag checksum (the kernel skips that block,
///   replays the others and fails the mount with `EFSBADCRC`);
/// - a revoke block's count overruns the block, or the log runs outside the journal.
///
/// Nothing is returned in those cases, so nothing is written: a later replayer (the kernel,
/// e2fsck) finds the journal exactly as it was.
pub(super) fn recover(
    jsb: &JournalSuperblock,
    params: JournalParams,
    log: &dyn JournalBlocks,
    fs_blocks: u64,
    inode_size: usize,
) -> Result<Replay> {
    let maxlen = u64::from(jsb.maxlen());
    // `load_superblock`: the fast-commit area, if any, sits at the end; check_superblock made
    // sure at least 1024 log blocks remain before it.
    let last = u64::from(jsb.log_end());
    if u64::from(jsb.first()) >= last {
        // The kernel checks `s_first` only against the whole journal; a log starting inside
        // the fast-commit area would make its `wrap()` underflow.
        return corrupt(CorruptKind::Journal("invalid first block of the log"));
    }
    let mut r = Recovery {
        log,
        params,
        first: u64::from(jsb.first()),
        last,
        total: maxlen,
        sequence: jsb.sequence(),
        start: u64::from(jsb.start()),
        v1: jsb.compat().contains(rext4_format::jbd2::JournalCompat::CHECKSUM),
        async_commit: jsb.incompat().contains(JournalIncompat::ASYNC_COMMIT),
        fs_blocks,
        end: None,
        failed_commit: None,
        revoked: HashMap::new(),
        blocks: BTreeMap::new(),
        report: RecoveryReport { start_sequence: jsb.sequence(), ..RecoveryReport::default() },
        bh: vec![0u8; params.block_size],
        obh: vec![0u8; params.block_size],
    };
    if r.start == 0 {
        // Cleanly emptied: nothing to replay, the sequence carries on.
        r.report.end_sequence = r.sequence;
        return Ok(Replay { blocks: BTreeMap::new(), report: r.report, fast_commits: Vec::new() });
    }
    r.pass(Pass::Scan)?;
    if r.failed_commit.is_some() {
        // `jbd2_journal_load` answers a failed commit with EFSCORRUPTED, not EFSBADCRC.
        return corrupt(CorruptKind::Journal("a committed transaction has a corrupt commit block"));
    }
    let fast_commits = if jsb.has_fast_commit() { r.scan_fast_commits(inode_size)? } else { Vec::new() };
    r.pass(Pass::Revoke)?;
    r.pass(Pass::Replay)?;
    // Cannot be None: the scan pass always sets it.
    let end = r.end.unwrap_or(r.sequence);
    r.report.transactions = end.wrapping_sub(r.sequence);
    r.report.end_sequence = end.wrapping_add(1);
    r.report.distinct_blocks = r.blocks.len() as u64;
    r.report.fast_commit_tags = fast_commits.len() as u64;
    Ok(Replay { blocks: r.blocks, report: r.report, fast_commits })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pass {
    /// Find the end of the log (`PASS_SCAN`).
    Scan,
    /// Collect revoke records (`PASS_REVOKE`).
    Revoke,
    /// Collect the blocks to write (`PASS_REPLAY`).
    Replay,
}

struct Recovery<'a> {
    log: &'a dyn JournalBlocks,
    params: JournalParams,
    /// `j_first`, `j_last` (end of the regular log) and `j_total_len`.
    first: u64,
    last: u64,
    total: u64,
    /// `s_sequence` and `s_start`.
    sequence: u32,
    start: u64,
    /// Checksum v1 (`COMPAT_CHECKSUM`): a crc32 of the transaction in its commit block.
    v1: bool,
    async_commit: bool,
    fs_blocks: u64,
    /// The first transaction not to replay (`info->end_transaction`), once the scan knows it.
    end: Option<u32>,
    failed_commit: Option<u32>,
    /// Revoked block -> newest transaction revoking it (the kernel's revoke table).
    revoked: HashMap<u64, u32>,
    blocks: BTreeMap<PhysBlock, Box<[u8]>>,
    report: RecoveryReport,
    /// Scratch: the log block being looked at and a logged copy.
    bh: Vec<u8>,
    obh: Vec<u8>,
}

/// The v1 (`crc32_be`) checksum of a transaction, as the kernel's `lib/crc32.c`: MSB-first
/// crc32 with the IEEE polynomial, no inversions (the caller seeds with `!0`).
fn crc32_be(mut crc: u32, data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0u32;
        while i < 256 {
            let mut c = i << 24;
            let mut k = 0;
            while k < 8 {
                c = if c & 0x8000_0000 != 0 { (c << 1) ^ 0x04C1_1DB7 } else { c << 1 };
                k += 1;
            }
            t[i as usize] = c;
            i += 1;
        }
        t
    };
    for &b in data {
        crc = (crc << 8) ^ TABLE[((crc >> 24) ^ u32::from(b)) as usize];
    }
    crc
}

impl Recovery<'_> {
    /// `wrap()`: a position at or past the end of the log continues at its start.
    fn wrap(&self, n: u64) -> u64 {
        if n >= self.last {
            n - (self.last - self.first)
        } else {
            n
        }
    }

    /// `jread` into `buf`: positions outside the journal mean a corrupt superblock or log.
    fn read(&self, n: u64, buf: &mut [u8]) -> Result<()> {
        let Some(n) = u32::try_from(n).ok().filter(|&n| u64::from(n) < self.total) else {
            return corrupt(CorruptKind::Journal("log runs outside the journal"));
        };
        self.log.read(n, buf)
    }

    /// `count_tags`: how many logged blocks follow a descriptor block.
    fn count_tags(&self, block: &[u8]) -> u64 {
        DescriptorTags::parse(block, &self.params).map_or(0, |t| t.count() as u64)
    }

    fn is_revoked(&self, block: u64, tid: u32) -> bool {
        // `jbd2_journal_test_revoke`: revoked by this transaction or a later one.
        self.revoked.get(&block).is_some_and(|&r| !tid_gt(tid, r))
    }

    /// `do_one_pass`.
    fn pass(&mut self, pass: Pass) -> Result<()> {
        let mut next_id = self.sequence;
        let mut next = self.start;
        let mut crc32_sum = !0u32;
        let mut need_check_commit_time = false;
        let mut last_commit_time = 0u64;
        // Log positions walked; a real log is shorter than the ring.
        let mut walked = 0u64;
        let limit = self.last - self.first + 1;
        // An error found while replaying, reported once the rest is done (as in the kernel).
        let mut deferred: Option<Error> = None;
        let mut bh = std::mem::take(&mut self.bh);
        let result = loop {
            if pass != Pass::Scan && self.end.is_some_and(|end| tid_geq(next_id, end)) {
                break Ok(());
            }
            if walked > limit {
                break corrupt(CorruptKind::Journal("the log goes round the whole journal"));
            }
            if let Err(e) = self.read(next, &mut bh) {
                break Err(e);
            }
            next = self.wrap(next + 1);
            walked += 1;
            // Cannot fail: journal blocks are at least 1024 bytes.
            let Some(h) = Header::parse(&bh) else { break Ok(()) };
            if !h.has_magic() || h.sequence() != next_id {
                break Ok(());
            }
            match h.block_type() {
                Some(BlockType::Descriptor) => {
                    if !verify_tail(&bh, &self.params) {
                        // The scan may meet stale blocks of an older log: judged at the commit.
                        if pass != Pass::Scan {
                            break corrupt(CorruptKind::JournalChecksum(
                                "descriptor block checksum mismatch",
                            ));
                        }
                        need_check_commit_time = true;
                    }
                    if pass == Pass::Replay {
                        match self.replay_descriptor(&bh, &mut next, next_id) {
                            Ok(Some(e)) => deferred = deferred.or(Some(e)),
                            Ok(None) => {}
                            Err(e) => break Err(e),
                        }
                        walked += self.count_tags(&bh);
                        continue;
                    }
                    let n = self.count_tags(&bh);
                    walked += n;
                    if pass == Pass::Scan && self.v1 && self.end.is_none() {
                        // `calc_chksums`: the descriptor and its data blocks.
                        crc32_sum = crc32_be(crc32_sum, &bh);
                        let mut obh = std::mem::take(&mut self.obh);
                        let mut ok = true;
                        for _ in 0..n {
                            let io = next;
                            next = self.wrap(next + 1);
                            if self.read(io, &mut obh).is_err() {
                                ok = false;
                                break;
                            }
                            crc32_sum = crc32_be(crc32_sum, &obh);
                        }
                        self.obh = obh;
                        if !ok {
                            // The kernel stops the scan here (an I/O error on a log block).
                            break Ok(());
                        }
                        continue;
                    }
                    next = self.wrap(next + n);
                }
                Some(BlockType::Commit) => {
                    if pass != Pass::Scan {
                        next_id = next_id.wrapping_add(1);
                        continue;
                    }
                    // Cannot fail: the magic and type were checked and the length is right.
                    let Ok(commit) = CommitBlock::parse(&bh, &self.params) else { break Ok(()) };
                    let commit_time = commit.commit_time().0;
                    if need_check_commit_time {
                        // A bad descriptor or revoke block before: stale blocks of an older log
                        // if time went backwards, else corruption of this one.
                        if commit_time >= last_commit_time {
                            break corrupt(CorruptKind::JournalChecksum(
                                "a descriptor or revoke block of a committed transaction is corrupt",
                            ));
                        }
                        break Ok(());
                    }
                    let ok = if self.v1 {
                        if let Some(end) = self.end {
                            self.failed_commit = Some(end);
                            break Ok(());
                        }
                        let h = commit.header();
                        let found = h.stored_checksum();
                        let matches = crc32_sum == found
                            && h.h_chksum_type == CHKSUM_CRC32
                            && h.h_chksum_size == CRC32_CHKSUM_SIZE;
                        let unused = h.h_chksum_type == 0 && h.h_chksum_size == 0 && found == 0;
                        if matches || unused {
                            crc32_sum = !0;
                        }
                        matches || unused
                    } else {
                        commit.verify_checksum() || self.commit_partial_ok(&bh)
                    };
                    if !ok {
                        if commit_time < last_commit_time {
                            // Stale: the log ends before it.
                            break Ok(());
                        }
                        self.end = Some(next_id);
                        if !self.async_commit {
                            self.failed_commit = Some(next_id);
                            break Ok(());
                        }
                    }
                    last_commit_time = commit_time;
                    next_id = next_id.wrapping_add(1);
                }
                Some(BlockType::Revoke) => {
                    if pass == Pass::Replay {
                        continue;
                    }
                    if pass == Pass::Scan && !verify_tail(&bh, &self.params) {
                        need_check_commit_time = true;
                    }
                    if let Err(e) = self.scan_revoke_records(&bh, pass, next_id) {
                        break Err(e);
                    }
                }
                _ => break Ok(()),
            }
        };
        self.bh = bh;
        result?;
        if pass == Pass::Scan {
            if self.end.is_none() {
                self.end = Some(next_id);
            }
        } else if self.end != Some(next_id) {
            // The passes read the same blocks, so this takes a device that changes under us.
            deferred = deferred.or(Some(Error::Corrupt(crate::error::Corrupt(CorruptKind::Journal(
                "recovery passes ended at different transactions",
            )))));
        }
        match deferred {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// `jbd2_commit_block_csum_verify_partial`: a commit block whose header alone was written
    /// (the rest of the block stale) is taken as committed. Like the kernel, the header copied
    /// is `sizeof(struct commit_header)`, 64 bytes with its trailing padding.
    fn commit_partial_ok(&self, block: &[u8]) -> bool {
        const COMMIT_STRUCT_SIZE: usize = 64;
        let mut tmp = vec![0u8; block.len()];
        let n = COMMIT_STRUCT_SIZE.min(block.len());
        tmp[..n].copy_from_slice(&block[..n]);
        let stored = u32::from_be_bytes([
            block[COMMIT_CHECKSUM_OFFSET],
            block[COMMIT_CHECKSUM_OFFSET + 1],
            block[COMMIT_CHECKSUM_OFFSET + 2],
            block[COMMIT_CHECKSUM_OFFSET + 3],
        ]);
        commit_checksum(&tmp, self.params.csum_seed) == stored
    }

    /// `scan_revoke_records`: in the scan pass only checks the count; in the revoke pass
    /// records every block with the newest transaction revoking it.
    fn scan_revoke_records(&mut self, block: &[u8], pass: Pass, tid: u32) -> Result<()> {
        let Ok(r) = RevokeBlock::parse(block, &self.params) else {
            return corrupt(CorruptKind::Journal("revoke block count out of range"));
        };
        if pass != Pass::Revoke {
            return Ok(());
        }
        for b in r.blocks() {
            self.report.revoke_records += 1;
            self.revoked.entry(b).and_modify(|t| *t = if tid_gt(tid, *t) { tid } else { *t }).or_insert(tid);
        }
        Ok(())
    }

    /// `jbd2_do_replay`: every logged block of one descriptor that is neither revoked nor
    /// corrupt becomes the newest copy of its target. Returns a checksum failure to report at
    /// the end (the other blocks are still replayed, as in the kernel).
    fn replay_descriptor(&mut self, desc: &[u8], next: &mut u64, tid: u32) -> Result<Option<Error>> {
        let mut failed = None;
        let Ok(tags) = DescriptorTags::parse(desc, &self.params) else { return Ok(None) };
        let mut obh = std::mem::take(&mut self.obh);
        for tag in tags {
            let io = *next;
            *next = self.wrap(*next + 1);
            if let Err(e) = self.read(io, &mut obh) {
                self.obh = obh;
                return Err(e);
            }
            if self.is_revoked(tag.block, tid) {
                self.report.blocks_revoked += 1;
                continue;
            }
            if !tag.verify_data(&self.params, tid, &obh) {
                failed = failed.or(Some(Error::Corrupt(crate::error::Corrupt(
                    CorruptKind::JournalChecksum("a logged block fails its checksum"),
                ))));
                continue;
            }
            if tag.block >= self.fs_blocks {
                self.obh = obh;
                return corrupt(CorruptKind::Journal("a logged block lies outside the filesystem"));
            }
            let mut copy = obh.clone().into_boxed_slice();
            if tag.is_escaped() {
                unescape_block(&mut copy);
            }
            self.blocks.insert(PhysBlock(tag.block), copy);
            self.report.blocks_replayed += 1;
        }
        self.obh = obh;
        Ok(failed)
    }

    /// `fc_do_one_pass` hands the fast-commit area to ext4, whose scan picks the fast
    /// commits of the transaction after the last full commit (`fast_commit::scan`). An area
    /// the kernel would refuse is refused here, before anything is written.
    fn scan_fast_commits(&self, inode_size: usize) -> Result<Vec<FcTag>> {
        // `j_fc_first` is one past `j_last`; the area runs to the end of the journal.
        let (first, total) = (self.last + 1, self.total);
        let Some(expected) = self.end else { return Ok(Vec::new()) };
        let mut failed = None;
        let tags = fast_commit::scan(
            |i| {
                let n = first.checked_add(i as u64).filter(|&n| n < total)?;
                let mut buf = vec![0u8; self.params.block_size];
                match self.read(n, &mut buf) {
                    Ok(()) => Some(buf),
                    Err(e) => {
                        failed = Some(e);
                        None
                    }
                }
            },
            expected,
            inode_size,
        );
        if let Some(e) = failed {
            return Err(e);
        }
        tags.map_err(|e| match e {
            ScanError::UnknownFeatures(_) => Error::NotSupported(format!("replaying the journal: {e}")),
            ScanError::Malformed => {
                Error::Corrupt(crate::error::Corrupt(CorruptKind::Journal("malformed fast commit")))
            }
            ScanError::BadChecksum => Error::Corrupt(crate::error::Corrupt(CorruptKind::JournalChecksum(
                "fast commit checksum mismatch",
            ))),
        })
    }
}

#[cfg(test)]
// Fixtures are built from small known values; a narrowing cast there is the clearest form.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
mod tests {
    use super::*;
    use rext4_format::jbd2::{
        CommitHeader, DescriptorBuilder, RevokeBuilder, CHKSUM_CRC32C, JBD2_MAGIC_NUMBER,
    };

    const BS: usize = 1024;
    const UUID: [u8; 16] = [0x5A; 16];

    struct MemLog(Vec<Vec<u8>>);

    impl JournalBlocks for MemLog {
        fn read(&self, n: u32, buf: &mut [u8]) -> Result<()> {
            buf.copy_from_slice(&self.0[n as usize]);
            Ok(())
        }
    }

    /// Writes transactions into an in-memory journal the way jbd2 lays them out.
    struct Writer {
        log: MemLog,
        jsb: JournalSuperblock,
        p: JournalParams,
        pos: u32,
        seq: u32,
    }

    impl Writer {
        fn new(maxlen: u32, incompat: JournalIncompat, start: u32, seq: u32) -> Writer {
            let mut jsb = JournalSuperblock::new(BS as u32, maxlen, UUID);
            jsb.set_incompat(incompat);
            jsb.s_checksum_type = CHKSUM_CRC32C;
            jsb.set_start(start);
            jsb.set_sequence(seq);
            jsb.update_checksum();
            let p = check_superblock(&jsb, BS as u32, u64::from(maxlen)).unwrap();
            Writer { log: MemLog(vec![vec![0u8; BS]; maxlen as usize]), jsb, p, pos: start, seq }
        }
        fn put(&mut self, block: Vec<u8>) -> u32 {
            let at = self.pos;
            self.log.0[at as usize] = block;
            self.pos = if at + 1 >= self.jsb.maxlen() { self.jsb.first() } else { at + 1 };
            at
        }
        /// One transaction; returns the log positions of its commit block and first data block.
        fn tx(&mut self, blocks: &[(u64, u8)], revokes: &[u64], time: u64) -> (u32, u32) {
            let mut d = DescriptorBuilder::new(&self.p, self.seq, UUID);
            let mut copies = Vec::new();
            for &(b, fill) in blocks {
                let mut data = vec![fill; BS];
                if fill == 0xC0 {
                    data[..4].copy_from_slice(&JBD2_MAGIC_NUMBER.to_be_bytes());
                }
                d.push_block(b, &mut data).unwrap();
                copies.push(data);
            }
            if let Some(desc) = d.finish() {
                self.put(desc);
            }
            let first_data = self.pos;
            for c in copies {
                self.put(c);
            }
            let mut r = RevokeBuilder::new(&self.p, self.seq);
            for &b in revokes {
                r.push(b).unwrap();
            }
            if let Some(rb) = r.finish() {
                self.put(rb);
            }
            let commit = self.put(CommitHeader::new(self.seq, time, 0).to_block(&self.p));
            self.seq = self.seq.wrapping_add(1);
            (commit, first_data)
        }
        fn run(&self) -> Result<Replay> {
            recover(&self.jsb, self.p, &self.log, 1 << 20, 256)
        }
    }

    const V3: JournalIncompat =
        JournalIncompat::REVOKE.union(JournalIncompat::BIT64).union(JournalIncompat::CSUM_V3);

    fn fill(r: &Replay, b: u64) -> Option<u8> {
        r.blocks.get(&PhysBlock(b)).map(|d| d[BS / 2])
    }

    #[test]
    fn crc32_be_matches_the_kernel() {
        // crc32_be(~0, "123456789") without the final inversion: the CRC-32/MPEG-2 check value.
        assert_eq!(crc32_be(!0, b"123456789"), 0x0376_E6E7);
        assert_eq!(crc32_be(!0, b""), !0);
    }

    #[test]
    fn revokes_escapes_and_the_newest_copy() {
        let mut w = Writer::new(1024, V3, 1, 7);
        w.tx(&[(10, 1), (11, 1), (12, 0xC0)], &[], 100);
        // 11 revoked by a later transaction; 13 logged and revoked in the same one.
        w.tx(&[(10, 2), (13, 2)], &[11, 13], 101);
        // 13 logged again after its revoke: replayed.
        w.tx(&[(13, 3)], &[], 102);
        let r = w.run().unwrap();
        assert_eq!((fill(&r, 10), fill(&r, 11), fill(&r, 13)), (Some(2), None, Some(3)));
        let twelve = &r.blocks[&PhysBlock(12)];
        assert_eq!(&twelve[..4], &JBD2_MAGIC_NUMBER.to_be_bytes());
        let rep = &r.report;
        assert_eq!((rep.start_sequence, rep.end_sequence, rep.transactions), (7, 11, 3));
        assert_eq!((rep.blocks_replayed, rep.blocks_revoked, rep.revoke_records), (4, 2, 2));
        assert_eq!(rep.distinct_blocks, 3);
    }

    #[test]
    fn sequence_numbers_wrap_and_the_log_wraps() {
        // Starting four blocks before the end: the first transaction wraps to s_first.
        let mut w = Writer::new(1024, V3, 1020, u32::MAX - 1);
        w.tx(&[(10, 1), (11, 1), (12, 1)], &[20], 1);
        w.tx(&[(20, 2)], &[10], 2);
        w.tx(&[(21, 3)], &[], 3);
        let r = w.run().unwrap();
        assert_eq!(r.report.transactions, 3);
        assert_eq!(r.report.end_sequence, 2);
        assert_eq!(
            (fill(&r, 10), fill(&r, 11), fill(&r, 20), fill(&r, 21)),
            (None, Some(1), Some(2), Some(3))
        );
    }

    #[test]
    fn an_uncommitted_tail_is_not_replayed() {
        let mut w = Writer::new(1024, V3, 1, 1);
        w.tx(&[(10, 1)], &[], 1);
        let (commit, _) = w.tx(&[(10, 2), (11, 2)], &[], 2);
        w.log.0[commit as usize] = vec![0; BS];
        let r = w.run().unwrap();
        assert_eq!((r.report.transactions, fill(&r, 10), fill(&r, 11)), (1, Some(1), None));
    }

    #[test]
    fn bad_commits_refuse_a_synchronous_journal_and_end_an_async_one() {
        for incompat in [V3, V3 | JournalIncompat::ASYNC_COMMIT] {
            let mut w = Writer::new(1024, incompat, 1, 1);
            w.tx(&[(10, 1)], &[], 1);
            let (commit, _) = w.tx(&[(10, 2)], &[], 2);
            w.tx(&[(11, 3)], &[], 3);
            w.log.0[commit as usize][0x20] ^= 1;
            let r = w.run();
            if incompat.contains(JournalIncompat::ASYNC_COMMIT) {
                let r = r.unwrap();
                assert_eq!((r.report.transactions, fill(&r, 10), fill(&r, 11)), (1, Some(1), None));
            } else {
                assert_eq!(r.err().map(|e| e.errno()), Some(libc::EUCLEAN));
            }
        }
    }

    #[test]
    fn a_bad_descriptor_is_stale_if_time_went_back_else_corrupt() {
        for (time, ok) in [(0u64, true), (50, false)] {
            let mut w = Writer::new(1024, V3, 1, 1);
            w.tx(&[(10, 1)], &[], 10);
            let desc = w.pos;
            w.tx(&[(11, 2)], &[], time);
            w.log.0[desc as usize][100] ^= 1;
            match w.run() {
                Ok(r) => {
                    assert!(ok);
                    assert_eq!((r.report.transactions, fill(&r, 11)), (1, None));
                }
                Err(e) => {
                    assert!(!ok);
                    assert_eq!(e.errno(), libc::EBADMSG);
                }
            }
        }
    }

    #[test]
    fn a_bad_data_block_refuses_unless_revoked() {
        let mut w = Writer::new(1024, V3, 1, 1);
        let (_, data) = w.tx(&[(10, 1), (11, 1)], &[], 1);
        w.log.0[data as usize][9] ^= 1;
        assert_eq!(w.run().err().map(|e| e.errno()), Some(libc::EBADMSG));
        // The same damage on a copy that a later transaction revokes is never looked at.
        w.tx(&[], &[10], 2);
        assert_eq!(w.run().unwrap().report.blocks_revoked, 1);
    }

    #[test]
    fn fast_commits_of_the_next_transaction_are_found() {
        use rext4_format::fast_commit::{write_area, Tag};
        let incompat = V3 | JournalIncompat::FAST_COMMIT;
        let tags =
            |tid| vec![Tag::Head { tid }, Tag::DelRange { ino: 12, lblk: 0, len: 3 }, Tag::Tail { tid }];
        // (tid of the fast commits, damaged, what recovery finds)
        for (tid, damaged, found) in [(3u32, false, Some(3)), (2, false, Some(0)), (3, true, None)] {
            let mut w = Writer::new(1024 + 256, incompat, 1, 1);
            w.tx(&[(10, 1)], &[], 1);
            w.tx(&[(11, 1)], &[], 2);
            let area = write_area(&tags(tid), BS);
            w.log.0[1024 + 1].copy_from_slice(&area[..BS]);
            if damaged {
                w.log.0[1024 + 1][6] ^= 1;
            }
            match w.run() {
                Ok(r) => {
                    assert_eq!(Some(r.fast_commits.len()), found);
                    assert_eq!(r.report.transactions, 2);
                    assert_eq!(r.report.fast_commit_tags, r.fast_commits.len() as u64);
                }
                Err(e) => assert!(found.is_none(), "{e}"),
            }
        }
    }

    #[test]
    fn targets_outside_the_filesystem_are_refused() {
        let mut w = Writer::new(1024, V3, 1, 1);
        w.tx(&[(1 << 20, 1)], &[], 1);
        assert_eq!(w.run().err().map(|e| e.errno()), Some(libc::EUCLEAN));
    }
}
