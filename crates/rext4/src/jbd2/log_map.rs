//! Where the log lives: the journal's blocks on the device, resolved once from the journal
//! inode's map when the journal is loaded (the kernel's `jbd2_journal_bmap`, done ahead), as
//! runs of (first journal block, first device block, length) in journal order. An external
//! journal's blocks are its device's own, one to one (jbd2/external.rs).

use crate::dev::BlockDevice;
use crate::error::{corrupt, CorruptKind, Result};
use crate::jbd2::recovery::JournalBlocks;
use std::sync::Arc;

/// The log's device blocks. [immutable once loaded]
pub(crate) struct JournalLog {
    dev: Arc<dyn BlockDevice>,
    block_size: u64,
    runs: Vec<(u32, u64, u32)>,
    /// The journal block holding the journal superblock: 0 in a journal inode; on an external
    /// device the block after its ext4 superblock (the kernel's `j_blk_offset`).
    sb_block: u32,
    /// Whether `dev` is a device of its own, not the filesystem's.
    external: bool,
}

impl JournalLog {
    /// An empty map of a log on `dev` with blocks of `block_size` bytes.
    pub(crate) fn new(dev: Arc<dyn BlockDevice>, block_size: u64) -> Self {
        JournalLog { dev, block_size, runs: Vec::new(), sb_block: 0, external: false }
    }

    /// The log of an external journal device `dev` of `blocks` blocks, its superblock in
    /// block `sb_block`: journal block n is the device's block n.
    pub(crate) fn external(dev: Arc<dyn BlockDevice>, block_size: u64, blocks: u32, sb_block: u32) -> Self {
        let mut log = JournalLog { dev, block_size, runs: Vec::new(), sb_block, external: true };
        log.push(0, blocks);
        log
    }

    /// The device the log is on.
    pub(crate) fn dev(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    /// The journal block of the journal superblock.
    pub(crate) fn sb_block(&self) -> u32 {
        self.sb_block
    }

    /// Whether the log is on a device of its own.
    pub(crate) fn is_external(&self) -> bool {
        self.external
    }

    /// How many journal blocks, from the first, are mapped.
    pub(crate) fn mapped(&self) -> u64 {
        self.runs.last().map_or(0, |&(l, _, len)| u64::from(l) + u64::from(len))
    }

    /// Maps the next `len` journal blocks (from [`JournalLog::mapped`]) to device blocks from
    /// `pblk`, joining the last run when they continue it.
    pub(crate) fn push(&mut self, pblk: u64, len: u32) {
        // Cannot truncate: journals are at most 2^32 blocks (s_maxlen).
        #[allow(clippy::cast_possible_truncation)]
        let lblk = self.mapped() as u32;
        match self.runs.last_mut() {
            Some((_, rp, rlen)) if *rp + u64::from(*rlen) == pblk => *rlen += len,
            _ => self.runs.push((lblk, pblk, len)),
        }
    }

    /// Device block of journal block `n`, if it is mapped.
    pub(super) fn device_block(&self, n: u32) -> Option<u64> {
        let i = self.runs.partition_point(|r| r.0 <= n).checked_sub(1)?;
        let (l, p, len) = self.runs[i];
        (n - l < len).then(|| p + u64::from(n - l))
    }

    /// The log's runs on the device, as (first device block, length).
    pub(crate) fn runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.runs.iter().map(|&(_, p, len)| (p, u64::from(len)))
    }
}

impl JournalBlocks for JournalLog {
    fn read(&self, n: u32, buf: &mut [u8]) -> Result<()> {
        let Some(blk) = self.device_block(n) else {
            return corrupt(CorruptKind::Journal("log block beyond the journal inode"));
        };
        self.dev.read_at(buf, blk * self.block_size)?;
        Ok(())
    }
}
