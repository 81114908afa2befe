//! External journal devices (`mke2fs -O journal_dev`: `ext2fs_initialize` with only that
//! feature, then `ext2fs_create_journal_superblock2`) and the link between one and a
//! filesystem (`mke2fs -J device=`: `ext2fs_add_journal_device`). The device holds an ext4
//! superblock that says what it is, a journal superblock in the next block whose log is the
//! rest of the device, and zeroes; the filesystem names it by UUID and lists nothing of it
//! itself, and the journal lists the filesystem's UUID among its users.

use super::{identity, params, put_hash_seed, FormatOptions, FormatReport};
use crate::dev::BlockDevice;
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::jbd2::external::{device_superblock, jsb_block};
use rext4_format::features::Incompat;
use rext4_format::jbd2::superblock::USERS_MAX;
use rext4_format::jbd2::JournalSuperblock;
use rext4_format::superblock::{Superblock, EXT4_MAGIC, SUPERBLOCK_OFFSET};
use zerocopy::{FromZeros, IntoBytes};

/// What a filesystem records of the journal device it uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalDeviceRef {
    /// The device's UUID (`s_journal_uuid`).
    pub uuid: [u8; 16],
    /// Its device number where it is a block device (`s_journal_dev`, what the kernel looks
    /// for when no `journal_path=` is given); 0 for an image file.
    pub dev_number: u32,
}

/// Bytes of zeroes written at a time.
const ZERO_CHUNK: usize = 1 << 20;

impl Fs {
    /// Makes an external journal device on `dev` as `mke2fs -O journal_dev` does with the same
    /// options (block size, size, UUID, hash seed, time; the others do not apply): the whole
    /// device is the journal, empty, with no users yet. Zeroes the device unless
    /// `opts.device_zeroed`.
    pub fn format_journal_device(dev: &dyn BlockDevice, opts: &FormatOptions) -> Result<FormatReport> {
        // The block size as for a filesystem of this size (mke2fs's profiles), nothing else.
        let probe = FormatOptions { features: String::new(), ..opts.clone() };
        let p = params::resolve(&probe, dev.size())?;
        let (bs, blocks) = (p.block_size, p.blocks_count);
        let blocks32 = u32::try_from(blocks).map_err(|_| Error::InvalidInput("journal device too big"))?;
        if blocks32 < jsb_block(bs) + 1024 {
            return Err(Error::InvalidInput("journal device too small (at least 1024 log blocks)"));
        }
        let (now, uuid, hash_seed) = identity(opts)?;
        let inode_size = opts.inode_size.unwrap_or(256);
        let mut sb = Superblock::new_zeroed();
        let log = bs.trailing_zeros() - 10;
        let t = u32::try_from(now).unwrap_or(0);
        sb.s_blocks_count_lo.set(blocks32);
        sb.s_first_data_block.set(u32::from(bs == 1024));
        sb.s_log_block_size.set(log);
        sb.s_log_cluster_size.set(log);
        sb.s_blocks_per_group.set(bs * 8);
        sb.s_clusters_per_group.set(bs * 8);
        sb.s_wtime.set(t);
        sb.s_max_mnt_count.set(u16::MAX);
        sb.s_magic.set(EXT4_MAGIC);
        sb.s_state.set(1);
        sb.s_errors.set(1);
        sb.s_lastcheck.set(t);
        sb.s_rev_level.set(1);
        sb.s_first_ino.set(11);
        sb.s_inode_size.set(inode_size);
        sb.s_feature_incompat.set(Incompat::JOURNAL_DEV.bits());
        sb.s_uuid = uuid;
        put_hash_seed(&mut sb, hash_seed);
        sb.s_def_hash_version = 1;
        sb.s_default_mount_opts.set(0x0c);
        sb.s_mkfs_time.set(t);
        let extra = if inode_size > 128 { 32 } else { 0 };
        sb.s_min_extra_isize.set(extra);
        sb.s_want_extra_isize.set(extra);

        let mut jsb = JournalSuperblock::new(bs, blocks32, uuid);
        let at = jsb_block(bs);
        jsb.s_first.set(at + 1);
        jsb.s_nr_users.set(0);

        if opts.dry_run {
            // Nothing written; the report says what would be.
        } else if !opts.device_zeroed {
            let zeros = vec![0u8; ZERO_CHUNK];
            let end = blocks * u64::from(bs);
            let mut off = 0;
            while off < end {
                let n = usize::try_from(end - off).map_or(ZERO_CHUNK, |n| n.min(ZERO_CHUNK));
                dev.write_at(&zeros[..n], off)?;
                off += n as u64;
            }
        }
        if !opts.dry_run {
            dev.write_at(sb.as_bytes(), SUPERBLOCK_OFFSET)?;
            let mut block = vec![0u8; bs as usize];
            block[..size_of::<JournalSuperblock>()].copy_from_slice(jsb.as_bytes());
            dev.write_at(&block, u64::from(at) * u64::from(bs))?;
            dev.flush()?;
        }
        Ok(FormatReport {
            uuid,
            block_size: bs,
            blocks_count: blocks,
            inodes_count: 0,
            group_count: 1,
            journal_blocks: blocks32,
            journal_extents: Vec::new(),
            free_blocks: 0,
            backup_superblocks: Vec::new(),
        })
    }

    /// The journal device on `dev`, checked as `ext2fs_add_journal_device` checks it (an ext4
    /// superblock with `journal_dev`, a version 2 journal superblock with room for one more
    /// user): its UUID and block size, which a filesystem using it must share.
    pub fn journal_device(dev: &dyn BlockDevice) -> Result<([u8; 16], u32)> {
        let (sb, jsb) = read_journal_device(dev)?;
        if jsb.nr_users() as usize >= USERS_MAX {
            return Err(Error::InvalidInput("the journal device has as many users as it can list"));
        }
        Ok((sb.s_uuid, jsb.block_size()))
    }

    /// Lists the filesystem `fs_uuid` among the users of the journal device on `dev`
    /// (`ext2fs_add_journal_device`; nothing if it is there already).
    pub fn add_journal_user(dev: &dyn BlockDevice, fs_uuid: [u8; 16]) -> Result<()> {
        let (sb, mut jsb) = read_journal_device(dev)?;
        let n = jsb.nr_users() as usize;
        if jsb.users().any(|u| u == fs_uuid) {
            return Ok(());
        }
        if n >= USERS_MAX {
            return Err(Error::InvalidInput("the journal device has as many users as it can list"));
        }
        jsb.s_users[16 * n..16 * n + 16].copy_from_slice(&fs_uuid);
        jsb.s_nr_users.set(jsb.nr_users() + 1);
        jsb.update_checksum();
        // Cannot fail: read_journal_device checked the block size.
        let bs = sb.block_size().unwrap_or(1024);
        dev.write_at(jsb.as_bytes(), u64::from(jsb_block(bs)) * u64::from(bs))?;
        dev.flush()?;
        Ok(())
    }
}

/// The ext4 and journal superblocks of a journal device.
fn read_journal_device(dev: &dyn BlockDevice) -> Result<(Superblock, JournalSuperblock)> {
    let sb = device_superblock(dev)?;
    let not = || Error::InvalidInput("not an external journal device (mke2fs -O journal_dev)");
    let bs = sb.block_size().ok_or_else(not)?;
    let mut block = vec![0u8; bs as usize];
    dev.read_at(&mut block, u64::from(jsb_block(bs)) * u64::from(bs))?;
    let jsb = JournalSuperblock::parse(&block).ok_or_else(not)?;
    if !jsb.is_v2() || jsb.block_size() != bs {
        return Err(not());
    }
    Ok((sb, jsb))
}
