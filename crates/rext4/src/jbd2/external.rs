//! Journals on a device of their own (`mke2fs -O journal_dev`, then `mkfs.ext4 -J device=`):
//! the kernel's `ext4_get_journal_blkdev` and `ext4_open_dev_journal`. The device starts with
//! an ext4 superblock that has the `journal_dev` feature and the UUID the filesystem's
//! `s_journal_uuid` names; the journal superblock is the block after it, and jbd2's block
//! numbers are the device's own (`jbd2_journal_bmap` maps them one to one). The device is
//! given by path ([`crate::Options::journal_path`], the kernel's `journal_path=`): the device
//! number the superblock records (`s_journal_dev`) means nothing to an image file, and is not
//! followed where it could mean something: the kernel's mount finds the device by it, but an
//! image is untrusted here, and its number would have rext4 open a block device of the host
//! that the image chose.
//!
//! What the filesystem's device and the journal's each get: commits write the log to the
//! journal's device and flush both before the commit block (ordered data lives on the
//! filesystem's); checkpoints write home to the filesystem's device and flush it before the
//! journal superblock lets the log go; recovery reads the journal's device and writes the
//! filesystem's.

use crate::dev::BlockDevice;
use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::super_block::SbInfo;
use crate::jbd2::log_map::JournalLog;
use crate::jbd2::recovery::{self, JournalBlocks};
use rext4_format::features::Incompat;
use rext4_format::jbd2::{JournalParams, JournalSuperblock};
use rext4_format::superblock::{Superblock, EXT4_MAGIC, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE};
use std::sync::Arc;

/// An external journal device, checked against the filesystem that uses it. [immutable]
pub(crate) struct ExternalJournal {
    dev: Arc<dyn BlockDevice>,
    /// Its blocks (its superblock's count, in the filesystem's block size).
    blocks: u32,
    /// The block of its journal superblock (`j_blk_offset`).
    sb_block: u32,
}

impl ExternalJournal {
    /// Checks that `dev` is the journal device of the filesystem `sbi` describes, as the
    /// kernel's mount does: an ext4 superblock with `journal_dev`, its checksum where it has
    /// `metadata_csum`, the UUID the filesystem names, and the filesystem's block size.
    pub(crate) fn load(dev: Arc<dyn BlockDevice>, sbi: &SbInfo) -> Result<Self> {
        let bad = |what| corrupt(CorruptKind::Journal(what));
        let jsb_dev = device_superblock(&*dev)?;
        if !jsb_dev.verify_checksum() {
            return bad("external journal has corrupt superblock");
        }
        if jsb_dev.s_uuid != sbi.sb.s_journal_uuid {
            return bad("journal UUID does not match");
        }
        if jsb_dev.block_size() != Some(sbi.block_size) {
            return Err(Error::Incompatible(
                "the journal device's block size is not the filesystem's".into(),
            ));
        }
        let blocks = u32::try_from(jsb_dev.blocks_count())
            .map_err(|_| Error::Incompatible("journal device longer than 2^32 blocks".into()))?;
        let sb_block = jsb_block(sbi.block_size);
        if blocks <= sb_block {
            return bad("journal device too short");
        }
        Ok(ExternalJournal { dev, blocks, sb_block })
    }

    /// The log and its superblock (`jbd2_journal_init_dev` and `journal_load`'s checks), for
    /// a filesystem whose blocks are `block_size` bytes.
    pub(crate) fn log(&self, block_size: u32) -> Result<(JournalLog, JournalSuperblock, JournalParams)> {
        let bad = |what| corrupt(CorruptKind::Journal(what));
        let log = JournalLog::external(self.dev.clone(), u64::from(block_size), self.blocks, self.sb_block);
        let mut raw = vec![0u8; block_size as usize];
        log.read(self.sb_block, &mut raw)?;
        // Cannot fail: a block is at least 1024 bytes.
        let Some(jsb) = JournalSuperblock::parse(&raw) else { return bad("journal superblock unreadable") };
        let params = recovery::check_superblock(&jsb, block_size, u64::from(self.blocks))?;
        if jsb.nr_users() != 1 {
            // As the kernel: one journal device, one filesystem.
            return Err(Error::Incompatible("external journal has more than one user (unsupported)".into()));
        }
        // The log must not reach back over the superblocks before it.
        if jsb.first() <= self.sb_block {
            return bad("invalid first block of the log");
        }
        Ok((log, jsb, params))
    }

    /// The device.
    pub(crate) fn dev(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    /// The same journal on another view of its device (a copy-on-write overlay for a
    /// read-only open that replays in memory).
    pub(crate) fn on(&self, dev: Arc<dyn BlockDevice>) -> Self {
        ExternalJournal { dev, blocks: self.blocks, sb_block: self.sb_block }
    }
}

/// The block of a journal device's journal superblock, for `block_size`-byte blocks: the one
/// after the block holding its ext4 superblock (1, or 2 with 1 KiB blocks).
pub(crate) fn jsb_block(block_size: u32) -> u32 {
    1024 / block_size + 1
}

/// The ext4 superblock of a journal device: the ext4 magic and the `journal_dev` feature, or
/// `EUCLEAN` (the kernel's "external journal has bad superblock").
pub(crate) fn device_superblock(dev: &dyn BlockDevice) -> Result<Superblock> {
    let mut raw = [0u8; SUPERBLOCK_SIZE];
    dev.read_at(&mut raw, SUPERBLOCK_OFFSET)?;
    match Superblock::parse(&raw) {
        Some(sb) if sb.s_magic.get() == EXT4_MAGIC && sb.incompat().contains(Incompat::JOURNAL_DEV) => Ok(sb),
        _ => corrupt(CorruptKind::Journal("external journal has bad superblock")),
    }
}
