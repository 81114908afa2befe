//! Making a filesystem (`mke2fs`): [`Fs::format`] lays out an empty ext2, ext3 or ext4 as
//! e2fsprogs 1.47 does for the same arguments — same geometry, same feature defaults, same
//! placement of every table and special inode — so `dumpe2fs` shows the same filesystem.
//!
//! | module | owns (and the e2fsprogs code it follows) |
//! |---|---|
//! | this file | [`FormatOptions`], [`Fs::format`], the order of the steps (`mke2fs.c` `main`) |
//! | `params` | types, features, block and inode sizes from the options (`PRS`, `mke2fs.conf`) |
//! | `geometry` | groups, inodes per group, reserved GDT blocks (`initialize.c`) |
//! | `layout` | the block bitmap, group counts, table placement (`alloc_sb.c`, `alloc_tables.c`) |
//! | `files` | inode records, extent and block maps of the special files |
//! | `root` | root directory, lost+found, reserved and bad-block inodes |
//! | `resize` | the resize inode (`res_gdt.c`) |
//! | `journal` | the journal inode and jbd2 superblock (`mkjournal.c`) |
//! | `orphan_file` | the orphan file (`orphan.c`) |
//! | `quota` | the quota files and their usage (`mkquota.c`, `create_quota_inodes`) |
//! | `write` | superblocks, descriptors, bitmaps, inode tables, checksums (`closefs.c`) |
//!
//! # Locking
//! None: formatting is single-threaded, over a device nothing else has open.

mod files;
mod geometry;
mod journal;
mod journal_dev;
mod layout;
mod orphan_file;
pub(crate) mod params;
mod quota;
mod resize;
mod root;
mod write;

use crate::dev::BlockDevice;
use crate::error::{Error, Result};
use crate::fs::Fs;
pub use journal_dev::JournalDeviceRef;
use layout::Layout;
use rext4_format::features::{Compat, Incompat, RoCompat};
use rext4_format::superblock::Superblock;
use std::collections::BTreeMap;
use zerocopy::{FromZeros, IntoBytes};

/// Which kind of filesystem `mke2fs -t` makes; it decides the default features.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FsType {
    /// sparse_super, large_file, filetype, resize_inode, dir_index, ext_attr.
    Ext2,
    /// ext2's features and a journal.
    Ext3,
    /// ext3's and e2fsprogs 1.47's ext4 set: extent, huge_file, flex_bg, metadata_csum,
    /// metadata_csum_seed, 64bit, dir_nlink, extra_isize, orphan_file.
    #[default]
    Ext4,
}

/// How to make a filesystem: `mke2fs`'s options, with its defaults where `None`.
#[derive(Clone, Debug, Default)]
pub struct FormatOptions {
    /// `-t`.
    pub fs_type: FsType,
    /// `-T`: usage types from `mke2fs.conf` (`news`, `largefile`, `small`, ...); by default
    /// the size decides (`floppy` below 3 MiB, `small` below 512 MiB, ...).
    pub usage_types: Option<String>,
    /// Bytes of the device to use; the whole device by default.
    pub size: Option<u64>,
    /// `-b`.
    pub block_size: Option<u32>,
    /// `-C`: bytes per cluster with `bigalloc` (16 blocks by default).
    pub cluster_size: Option<u32>,
    /// `-g`: blocks per group (clusters per group with `bigalloc`), a multiple of 8 from 256
    /// to 8 times the block size; a bitmap block's worth by default.
    pub blocks_per_group: Option<u32>,
    /// `-E num_backup_sb=`: with `sparse_super2`, how many backup superblocks (0, 1 or 2, by
    /// default 2: in group 1 and the last group).
    pub num_backup_sb: Option<u8>,
    /// `-E stride=`: blocks per RAID chunk (`s_raid_stride`); without flex_bg each group's
    /// bitmaps are staggered by it, as mke2fs staggers them.
    pub stride: Option<u16>,
    /// `-E stripe_width=`: blocks per RAID stripe (`s_raid_stripe_width`).
    pub stripe_width: Option<u32>,
    /// `-E resize=`: the size online growth should reach without `meta_bg` (reserved GDT
    /// blocks for it, the resize inode on).
    pub resize: Option<SizeIn>,
    /// `-e`: what the kernel does on an error (`s_errors`: continue, the default, remount
    /// read-only, or panic).
    pub errors: Option<u16>,
    /// `-M`: the directory the filesystem was last mounted on (`s_last_mounted`; its first
    /// 64 bytes, as mke2fs keeps them).
    pub last_mounted: Option<String>,
    /// `-I`.
    pub inode_size: Option<u16>,
    /// `-i`: bytes per inode.
    pub inode_ratio: Option<u32>,
    /// `-N`: at least this many inodes.
    pub inodes: Option<u32>,
    /// `-O`: feature edits applied to the type's defaults, e.g. `"inline_data,^metadata_csum"`.
    pub features: String,
    /// `-J size=`: journal size in MiB.
    pub journal_size_mib: Option<u32>,
    /// Journal size in blocks (overrides `journal_size_mib`).
    pub journal_blocks: Option<u32>,
    /// `-J fast_commit_size=`: KiB of fast-commit area after the journal, with the
    /// `fast_commit` feature (a 64th of the journal by default).
    pub fast_commit_kib: Option<u32>,
    /// `-L`.
    pub label: Option<String>,
    /// `-U`.
    pub uuid: Option<[u8; 16]>,
    /// `-E hash_seed=`.
    pub hash_seed: Option<[u8; 16]>,
    /// `-E root_owner=`: the root directory's owner (0:0 by default, as mke2fs).
    pub root_owner: (u32, u32),
    /// `-m`: percent of blocks reserved for root (5 by default).
    pub reserved_ratio: Option<f64>,
    /// `-G`.
    pub flex_bg_size: Option<u32>,
    /// `-E orphan_file_size=`: blocks, or bytes taken as whole blocks.
    pub orphan_file_size: Option<SizeIn>,
    /// `-E quotatype=`: which quota files the `quota` feature makes (user, group, project).
    /// By default user and group, and project with the `project` feature; asking for project
    /// quotas turns that feature on.
    pub quota_types: Option<[bool; 3]>,
    /// `-E encoding_flags=strict` (with `casefold`): casefolded directories refuse names that
    /// are not valid UTF-8.
    pub strict_encoding: bool,
    /// `-E mmp_update_interval=`: seconds between updates of the multi-mount protection
    /// block (`mmp` feature; 5 by default or for 0, at most 300).
    pub mmp_update_interval: Option<u16>,
    /// The device's name, which the `mmp` block records (as mke2fs records the path it was
    /// given); nothing by default.
    pub device_name: Option<String>,
    /// The machine's name, which the `mmp` block records; this machine's (`uname -n`) by
    /// default. Empty for an image that must not depend on where it was made.
    pub node_name: Option<String>,
    /// Every timestamp the filesystem starts with (`E2FSPROGS_FAKE_TIME`); now by default.
    pub time: Option<i64>,
    /// The device reads as zeroes already (a new or truncated image file): inode tables and
    /// the journal need not be written.
    pub device_zeroed: bool,
    /// `-n`: work the filesystem out and report it, writing nothing to the device.
    pub dry_run: bool,
    /// `-J device=`: the journal is on this external journal device (made by
    /// [`Fs::format_journal_device`], checked with [`Fs::journal_device`]); no journal inode
    /// is made. The caller lists the new filesystem on the device afterwards
    /// ([`Fs::add_journal_user`]).
    pub journal_device: Option<JournalDeviceRef>,
}

/// A size given in blocks of the filesystem's block size (which may be mkfs's to choose), or
/// in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeIn {
    Blocks(u64),
    Bytes(u64),
}

impl SizeIn {
    /// In blocks of `block_size` bytes (bytes taken as whole blocks).
    pub fn blocks(self, block_size: u64) -> u64 {
        match self {
            SizeIn::Blocks(n) => n,
            SizeIn::Bytes(b) => b / block_size,
        }
    }
}

/// What [`Fs::format`] made.
#[derive(Clone, Debug)]
pub struct FormatReport {
    pub uuid: [u8; 16],
    pub block_size: u32,
    pub blocks_count: u64,
    pub inodes_count: u32,
    pub group_count: u32,
    /// The journal's blocks, its fast-commit area included.
    pub journal_blocks: u32,
    /// Where the journal lies: runs of (first block, blocks).
    pub journal_extents: Vec<(u64, u64)>,
    /// Blocks free once formatted: what files can have.
    pub free_blocks: u64,
    /// Where the backup superblocks are (what `mke2fs -n` lists, to find one to repair from).
    pub backup_superblocks: Vec<u64>,
}

/// A filesystem being formatted: the layout, the records of the inodes made, and the blocks
/// to write.
pub(crate) struct Builder {
    pub(crate) l: Layout,
    pub(crate) sb: Superblock,
    pub(crate) now: i64,
    pub(crate) inodes: BTreeMap<u32, Vec<u8>>,
    /// Blocks to write as they are.
    pub(crate) blocks: Vec<(u64, Vec<u8>)>,
    /// Directory leaf blocks by block number: (owner, bytes); their tails are checksummed at
    /// write time.
    pub(crate) dir_blocks: BTreeMap<u64, (u32, Vec<u8>)>,
    /// Extent leaf blocks: (owner, block, bytes).
    pub(crate) extent_blocks: Vec<(u32, u64, Vec<u8>)>,
    /// Orphan file blocks: (owner, block).
    pub(crate) orphan_blocks: Vec<(u32, u64)>,
    /// Block ranges to zero unless the device is zeroed already.
    pub(crate) zero_ranges: Vec<(u64, u64)>,
}

/// 16 random bytes from the kernel (UUIDs and hash seeds, as `uuid_generate`).
pub(crate) fn random16() -> Result<[u8; 16]> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b)
}

/// The time, UUID and hash seed a new filesystem (or journal device) starts with: the
/// options', else now and random ones.
pub(crate) fn identity(opts: &FormatOptions) -> Result<(i64, [u8; 16], [u8; 16])> {
    let now = opts.time.unwrap_or_else(crate::fs::mount::now_secs);
    let uuid = match opts.uuid {
        Some(u) => u,
        None => random_uuid()?,
    };
    let hash_seed = match opts.hash_seed {
        Some(h) => h,
        None => random_uuid()?,
    };
    Ok((now, uuid, hash_seed))
}

/// Puts `seed` in the superblock's directory-hash seed (four little-endian words).
pub(crate) fn put_hash_seed(sb: &mut Superblock, seed: [u8; 16]) {
    for (i, w) in seed.chunks_exact(4).enumerate() {
        sb.s_hash_seed[i].set(u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
    }
}

/// A random (version 4) UUID.
fn random_uuid() -> Result<[u8; 16]> {
    let mut u = random16()?;
    u[6] = (u[6] & 0x0F) | 0x40;
    u[8] = (u[8] & 0x3F) | 0x80;
    Ok(u)
}

impl Fs {
    /// Makes an empty filesystem on `dev` as `mke2fs` would with the same options: the same
    /// geometry, features and placement, a journal, lost+found, the resize inode, the quota
    /// files and the orphan file as e2fsprogs 1.47 makes them. Open it with
    /// [`Fs::from_device`] afterwards.
    pub fn format(dev: &dyn BlockDevice, opts: &FormatOptions) -> Result<FormatReport> {
        let mut p = params::resolve(opts, dev.size())?;
        let geo = geometry::compute(&p)?;
        // Room for the reserved inodes and lost+found (mke2fs fails writing them otherwise).
        if geo.inodes_count() < root::LPF_INO {
            return Err(Error::InvalidInput("too few inodes for the files mkfs makes"));
        }
        p.features = geo.features;
        let has_journal = geo.features.has_c(Compat::HAS_JOURNAL);
        if opts.journal_device.is_some() && !has_journal {
            return Err(Error::InvalidInput("a journal device for a filesystem without has_journal"));
        }
        let layout = Layout::new(geo)?;
        if has_journal && opts.journal_device.is_none() {
            // `figure_journal_size`.
            let fast_commit = layout.geo.features.has_c(Compat::FAST_COMMIT);
            let bs = layout.geo.block_size;
            let default = params::default_journal_blocks(layout.geo.blocks_count);
            p.journal_blocks = default.unwrap_or(0);
            // A 64th of the journal for fast commits (`EXT2_JOURNAL_TO_FC_BLKS_RATIO`).
            p.fc_blocks = if fast_commit { p.journal_blocks / 64 } else { 0 };
            let fc_asked = opts.fast_commit_kib.filter(|&k| fast_commit && k > 0);
            let j_asked = match (opts.journal_blocks, opts.journal_size_mib) {
                (Some(b), _) => Some(b),
                // Past u32 it is refused below, as too large.
                (None, Some(mib)) if mib > 0 => {
                    Some(u32::try_from(u64::from(mib) * 1024 / u64::from(bs / 1024)).unwrap_or(u32::MAX))
                }
                _ => None,
            };
            if default.is_some() && (j_asked.is_some() || fc_asked.is_some()) {
                if let Some(j) = j_asked {
                    p.journal_blocks = j;
                }
                if let Some(k) = fc_asked {
                    p.fc_blocks = u32::try_from(u64::from(k) * 1024 / u64::from(bs)).unwrap_or(u32::MAX);
                }
                let total = u64::from(p.journal_blocks) + u64::from(p.fc_blocks);
                if !(1024..=10_240_000).contains(&total) {
                    return Err(Error::InvalidInput("journal size must be 1024 to 10,240,000 blocks"));
                }
                // What `ext2fs_initialize` counted free, in whole clusters.
                let free = layout.free_blocks & !(layout.geo.ratio() - 1);
                if total > free / 2 {
                    return Err(Error::InvalidInput("total journal size too big for the filesystem"));
                }
            }
            if p.journal_blocks != 0 && p.journal_blocks < 1024 {
                return Err(Error::InvalidInput("journal size must be 1024 to 10,240,000 blocks"));
            }
        }
        let (now, uuid, hash_seed) = identity(opts)?;
        let mut b = Builder {
            l: layout,
            sb: Superblock::new_zeroed(),
            now,
            inodes: BTreeMap::new(),
            blocks: Vec::new(),
            dir_blocks: BTreeMap::new(),
            extent_blocks: Vec::new(),
            orphan_blocks: Vec::new(),
            zero_ranges: Vec::new(),
        };
        b.sb.s_uuid = uuid;
        put_hash_seed(&mut b.sb, hash_seed);
        if let Some(label) = &opts.label {
            let n = label.len().min(16);
            b.sb.s_volume_name[..n].copy_from_slice(&label.as_bytes()[..n]);
        }
        for g in 0..b.l.geo.group_count {
            b.l.allocate_group_table(g)?;
        }
        b.l.convert_to_clusters();
        let mut overhead = b.l.count_used();
        b.make_root_and_lpf(opts.root_owner)?;
        if b.l.geo.features.has_c(Compat::RESIZE_INODE) {
            b.make_resize_inode()?;
        }
        let mut journal_blocks = 0;
        if has_journal && opts.journal_device.is_none() {
            if p.journal_blocks == 0 {
                // Too small for a journal: mke2fs drops the feature (and the orphan file).
                b.l.geo.features.clear_c(Compat::HAS_JOURNAL);
                b.l.geo.features.clear_c(Compat::ORPHAN_FILE);
            } else {
                let total = p.journal_blocks + p.fc_blocks;
                overhead += u64::from(total).div_ceil(b.l.geo.ratio());
                b.make_journal(p.journal_blocks, p.fc_blocks)?;
                journal_blocks = total;
            }
        }
        overhead += b.l.geo.first_data_block;
        // After the journal, before the quota files, as mke2fs allocates it (the first free
        // block); written once the superblock gives its checksum seed.
        let mmp = match b.l.geo.features.has_i(Incompat::MMP) {
            true => Some(b.l.alloc_block(0)?),
            false => None,
        };
        if b.l.geo.cluster_bits != 0 {
            b.l.recount_free_clusters();
        }
        if b.l.geo.features.has_r(RoCompat::QUOTA) {
            b.make_quota_files(p.quota_types)?;
        }
        if b.l.geo.features.has_c(Compat::ORPHAN_FILE) {
            let n = match opts.orphan_file_size {
                Some(size) => u32::try_from(size.blocks(u64::from(b.l.geo.block_size)))
                    .map_err(|_| Error::InvalidInput("orphan file too large"))?,
                None => {
                    // Whole clusters.
                    let mask = u32::try_from(b.l.geo.ratio() - 1).unwrap_or(0);
                    (params::default_orphan_file_blocks(b.l.geo.blocks_count) + mask) & !mask
                }
            };
            b.make_orphan_file(n)?;
        }
        b.fill_superblock(&p, overhead);
        if let Some(j) = &opts.journal_device {
            b.sb.s_journal_uuid = j.uuid;
            b.sb.s_journal_dev.set(j.dev_number);
        }
        if let Some(blk) = mmp {
            b.make_mmp(blk, opts)?;
        }
        if !opts.dry_run {
            b.write(dev, opts.device_zeroed)?;
        }
        let geo = &b.l.geo;
        let backup_superblocks =
            (1..geo.group_count).map(|g| geo.super_and_bgd_loc(g).0).filter(|&sb| sb != 0).collect();
        Ok(FormatReport {
            uuid,
            block_size: geo.block_size,
            blocks_count: geo.blocks_count,
            inodes_count: geo.inodes_count(),
            group_count: geo.group_count,
            journal_blocks,
            journal_extents: b.zero_ranges.clone(),
            free_blocks: b.l.free_blocks,
            backup_superblocks,
        })
    }
}

impl Builder {
    /// The multi-mount protection block at `blk` (`ext2fs_mmp_init`, `ext2fs_mmp_reset`):
    /// clean, the machine's and the device's names, and a check interval of the update
    /// interval.
    fn make_mmp(&mut self, blk: u64, opts: &FormatOptions) -> Result<()> {
        use rext4_format::mmp::{self as fmt, MmpBlock};
        // 0 is the default, as `ext2fs_mmp_init` takes it.
        let interval = opts.mmp_update_interval.filter(|&i| i != 0).unwrap_or(fmt::UPDATE_INTERVAL);
        if interval > fmt::MAX_UPDATE_INTERVAL {
            return Err(Error::InvalidInput("mmp_update_interval must be at most 300 seconds"));
        }
        self.sb.s_mmp_block.set(blk);
        self.sb.s_mmp_update_interval.set(interval);
        let mut m = MmpBlock::new_zeroed();
        m.mmp_magic.set(fmt::MMP_MAGIC);
        m.mmp_seq.set(fmt::SEQ_CLEAN);
        // `ext2fs_mmp_write` stamps it.
        m.mmp_time.set(u64::try_from(self.now).unwrap_or(0));
        let node = match &opts.node_name {
            Some(n) => n.as_bytes().to_vec(),
            None => crate::fs::mmp::node_name(),
        };
        MmpBlock::set_name(&mut m.mmp_nodename, &node);
        if let Some(name) = &opts.device_name {
            MmpBlock::set_name(&mut m.mmp_bdevname, name.as_bytes());
        }
        m.mmp_check_interval.set(interval.max(fmt::MIN_CHECK_INTERVAL));
        m.update_checksum(self.sb.csum_seed(), self.sb.has_metadata_csum());
        let mut data = vec![0u8; self.l.geo.block_size as usize];
        data[..fmt::MMP_SIZE].copy_from_slice(m.as_bytes());
        self.blocks.push((blk, data));
        Ok(())
    }

    /// Every superblock field `mke2fs` sets, but the free counts and checksums (`write`).
    fn fill_superblock(&mut self, p: &params::Params, overhead: u64) {
        let geo = self.l.geo.clone();
        let sb = &mut self.sb;
        let f = geo.features;
        sb.s_feature_compat.set(f.compat);
        sb.s_feature_incompat.set(f.incompat);
        sb.s_feature_ro_compat.set(f.ro_compat);
        sb.s_inodes_count.set(geo.inodes_count());
        sb.set_blocks_count(geo.blocks_count);
        sb.s_r_blocks_count_lo.set(rext4_format::split::lo32(geo.r_blocks_count));
        if f.has_i(Incompat::BIT64) {
            sb.s_r_blocks_count_hi.set(rext4_format::split::hi32(geo.r_blocks_count));
        }
        sb.s_first_data_block.set(rext4_format::split::lo32(geo.first_data_block));
        let log = geo.block_size.trailing_zeros() - 10;
        sb.s_log_block_size.set(log);
        sb.s_log_cluster_size.set(log + geo.cluster_bits);
        sb.s_blocks_per_group.set(geo.blocks_per_group);
        sb.s_clusters_per_group.set(geo.clusters_per_group());
        sb.s_inodes_per_group.set(geo.inodes_per_group);
        sb.s_max_mnt_count.set(0xFFFF);
        sb.s_magic.set(rext4_format::superblock::EXT4_MAGIC);
        sb.s_state.set(rext4_format::superblock::STATE_VALID);
        sb.s_errors.set(p.errors);
        sb.s_raid_stride.set(p.stride);
        for (field, g) in sb.s_backup_bgs.iter_mut().zip(geo.backup_bgs) {
            field.set(g);
        }
        sb.s_raid_stripe_width.set(p.stripe_width);
        if let Some(dir) = &p.last_mounted {
            let n = dir.len().min(sb.s_last_mounted.len());
            sb.s_last_mounted[..n].copy_from_slice(&dir.as_bytes()[..n]);
        }
        sb.s_rev_level.set(1);
        sb.s_first_ino.set(11);
        sb.s_inode_size.set(geo.inode_size);
        sb.s_reserved_gdt_blocks.set(u16::try_from(geo.reserved_gdt_blocks).unwrap_or(0));
        sb.s_def_hash_version = 1; // half_md4
        if f.has_i(Incompat::CASEFOLD) {
            // The one encoding there is (mke2fs's `encoding=utf8`).
            sb.s_encoding.set(rext4_format::casefold::ENCODING_UTF8_12_1);
            if p.strict_encoding {
                sb.s_encoding_flags.set(rext4_format::casefold::ENCODING_FLAG_STRICT);
            }
        }
        if f.has_i(Incompat::ENCRYPT) {
            // mke2fs records the default modes: AES-256-XTS contents, AES-256-CTS names.
            sb.s_encrypt_algos[0] = rext4_format::fscrypt::MODE_AES_256_XTS;
            sb.s_encrypt_algos[1] = rext4_format::fscrypt::MODE_AES_256_CTS;
        }
        sb.s_desc_size.set(geo.desc_size_field);
        // acl, user_xattr
        sb.s_default_mount_opts.set(0x000C);
        let (lo, hi) = rext4_format::superblock::split_time(self.now);
        sb.s_mkfs_time.set(lo);
        sb.s_mkfs_time_hi = hi;
        sb.s_lastcheck.set(lo);
        sb.s_lastcheck_hi = hi;
        sb.s_wtime.set(lo);
        sb.s_wtime_hi = hi;
        if geo.inode_size >= 160 {
            sb.s_min_extra_isize.set(32);
            sb.s_want_extra_isize.set(32);
        }
        // Signed, as on x86 (where mke2fs's `char` is signed): fixed, so the image does not
        // depend on the machine that made it.
        sb.s_flags.set(rext4_format::superblock::FLAGS_SIGNED_HASH);
        sb.s_log_groups_per_flex = p.log_groups_per_flex;
        if f.has_r(RoCompat::METADATA_CSUM) {
            sb.s_checksum_type = rext4_format::superblock::CHECKSUM_TYPE_CRC32C;
        }
        if f.has_i(Incompat::CSUM_SEED) {
            sb.s_checksum_seed.set(rext4_format::checksum::csum_seed_from_uuid(&sb.s_uuid));
        }
        sb.s_overhead_clusters.set(u32::try_from(overhead).unwrap_or(0));
    }
}
