//! What `mke2fs` decides before it lays anything out (its `PRS()`): the filesystem type's
//! features, the size type (`floppy`, `small`, `default`, `big`, `huge`) and the block size,
//! inode size and inode ratio they imply, as e2fsprogs 1.47's stock `mke2fs.conf` has them.

use super::{FormatOptions, FsType};
use crate::error::{Error, Result};
use rext4_format::features::{feature_by_name, Compat, FeatureKind, Incompat, RoCompat};

/// The three feature words.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Features {
    pub(crate) compat: u32,
    pub(crate) incompat: u32,
    pub(crate) ro_compat: u32,
}

impl Features {
    pub(crate) fn has_c(&self, f: Compat) -> bool {
        self.compat & f.bits() != 0
    }
    pub(crate) fn has_i(&self, f: Incompat) -> bool {
        self.incompat & f.bits() != 0
    }
    pub(crate) fn has_r(&self, f: RoCompat) -> bool {
        self.ro_compat & f.bits() != 0
    }
    pub(crate) fn clear_c(&mut self, f: Compat) {
        self.compat &= !f.bits();
    }
    pub(crate) fn clear_i(&mut self, f: Incompat) {
        self.incompat &= !f.bits();
    }
    pub(crate) fn clear_r(&mut self, f: RoCompat) {
        self.ro_compat &= !f.bits();
    }
    pub(crate) fn set_i(&mut self, f: Incompat) {
        self.incompat |= f.bits();
    }
    pub(crate) fn has_group_csum(&self) -> bool {
        self.has_r(RoCompat::METADATA_CSUM) || self.has_r(RoCompat::GDT_CSUM)
    }

    /// Applies a comma- or space-separated list as `mke2fs -O` does: `name` sets, `^name`
    /// clears, `none` clears everything.
    pub(crate) fn edit(&mut self, list: &str) -> Result<()> {
        for word in list.split([',', ' ', '\t']).filter(|w| !w.is_empty()) {
            if word.eq_ignore_ascii_case("none") || word.eq_ignore_ascii_case("clear") {
                *self = Features::default();
                continue;
            }
            let (clear, name) = match word.strip_prefix(['^', '-']) {
                Some(n) => (true, n),
                None => (false, word.strip_prefix('+').unwrap_or(word)),
            };
            let Some((kind, bit)) = feature_by_name(name) else {
                return Err(Error::Incompatible(format!("unknown filesystem feature: {name}")));
            };
            let w = match kind {
                FeatureKind::Compat => &mut self.compat,
                FeatureKind::Incompat => &mut self.incompat,
                FeatureKind::RoCompat => &mut self.ro_compat,
            };
            if clear {
                *w &= !bit;
            } else {
                *w |= bit;
            }
        }
        Ok(())
    }
}

/// `base_features` of `mke2fs.conf`'s `[defaults]`.
const BASE_FEATURES: &str = "sparse_super,large_file,filetype,resize_inode,dir_index,ext_attr";
/// e2fsprogs 1.47's `ext4` type as upstream ships it (some distributions leave out
/// `metadata_csum_seed` and `orphan_file`).
const EXT4_FEATURES: &str =
    "has_journal,extent,huge_file,flex_bg,metadata_csum,metadata_csum_seed,64bit,dir_nlink,extra_isize,orphan_file";

/// What `mke2fs.conf` says for one type: `None` leaves the value to earlier types.
#[derive(Clone, Copy)]
struct TypeProfile {
    name: &'static str,
    block_size: Option<i32>,
    inode_ratio: Option<u32>,
    inode_size: Option<u16>,
}

const PROFILES: &[TypeProfile] = &[
    TypeProfile { name: "floppy", block_size: Some(1024), inode_ratio: Some(8192), inode_size: None },
    TypeProfile { name: "small", block_size: Some(1024), inode_ratio: Some(4096), inode_size: None },
    TypeProfile { name: "default", block_size: None, inode_ratio: None, inode_size: None },
    TypeProfile { name: "big", block_size: None, inode_ratio: Some(32768), inode_size: None },
    TypeProfile { name: "huge", block_size: None, inode_ratio: Some(65536), inode_size: None },
    TypeProfile { name: "news", block_size: None, inode_ratio: Some(4096), inode_size: None },
    TypeProfile { name: "largefile", block_size: Some(-1), inode_ratio: Some(1_048_576), inode_size: None },
    TypeProfile { name: "largefile4", block_size: Some(-1), inode_ratio: Some(4_194_304), inode_size: None },
    TypeProfile { name: "hurd", block_size: Some(4096), inode_ratio: None, inode_size: Some(128) },
];

/// The size type `mke2fs` picks for a filesystem of `bytes`.
pub(crate) fn size_type(bytes: u64) -> &'static str {
    const MIB: u64 = 1 << 20;
    if bytes < 3 * MIB {
        "floppy"
    } else if bytes < 512 * MIB {
        "small"
    } else if bytes < 4 * 1024 * 1024 * MIB {
        "default"
    } else if bytes < 16 * 1024 * 1024 * MIB {
        "big"
    } else {
        "huge"
    }
}

/// Everything `ext2fs_initialize` is handed.
#[derive(Clone, Debug)]
pub(crate) struct Params {
    pub(crate) block_size: u32,
    pub(crate) blocks_count: u64,
    pub(crate) r_blocks_count: u64,
    pub(crate) features: Features,
    pub(crate) inode_size: u16,
    pub(crate) inodes_count: u64,
    pub(crate) log_groups_per_flex: u8,
    /// Journal blocks, 0 for none.
    pub(crate) journal_blocks: u32,
    /// Fast-commit blocks after the journal's.
    pub(crate) fc_blocks: u32,
    /// The quota files to make with the `quota` feature: user, group, project.
    pub(crate) quota_types: [bool; 3],
    /// `s_encoding_flags`' strict bit (with `casefold`).
    pub(crate) strict_encoding: bool,
    /// log2 of blocks per cluster: 0 but with `bigalloc`.
    pub(crate) cluster_bits: u32,
    /// `-g`: blocks per group, clusters per group with bigalloc.
    pub(crate) per_group: Option<u32>,
    /// `s_errors`.
    pub(crate) errors: u16,
    /// `s_last_mounted`.
    pub(crate) last_mounted: Option<String>,
    /// `s_raid_stride`, `s_raid_stripe_width`.
    pub(crate) stride: u16,
    pub(crate) stripe_width: u32,
    /// Reserved GDT blocks asked for with `-E resize=`.
    pub(crate) reserved_gdt: Option<u32>,
    /// With `sparse_super2`, the groups asked to hold backups (`s_backup_bgs` before the
    /// group count settles them: 1 and the last, `u32::MAX`), 0 for none.
    pub(crate) backup_bgs: [u32; 2],
}

/// Resolves `opts` for a device of `dev_bytes` as `mke2fs`'s `PRS()` does.
pub(crate) fn resolve(opts: &FormatOptions, dev_bytes: u64) -> Result<Params> {
    let page = 4096u64;
    let bytes = match opts.size {
        Some(s) => s,
        // A size taken from the device is rounded down to whole pages.
        None => dev_bytes & !(page - 1),
    };
    if bytes > dev_bytes {
        return Err(Error::InvalidInput("filesystem larger than the device"));
    }
    let mut types: Vec<&str> = vec![match opts.fs_type {
        FsType::Ext2 => "ext2",
        FsType::Ext3 => "ext3",
        FsType::Ext4 => "ext4",
    }];
    match &opts.usage_types {
        Some(u) => types.extend(u.split(',').filter(|t| !t.is_empty())),
        None => types.push(size_type(bytes)),
    }
    for t in &types[1..] {
        if !PROFILES.iter().any(|p| p.name == *t) {
            return Err(Error::Incompatible(format!("unknown usage type: {t}")));
        }
    }
    let profile = |f: fn(&TypeProfile) -> Option<i64>, def: i64| {
        types
            .iter()
            .filter_map(|t| PROFILES.iter().find(|p| p.name == *t))
            .filter_map(f)
            .next_back()
            .unwrap_or(def)
    };

    // Features: the base set, each type's, then the caller's edits. orphan_file and
    // metadata_csum_seed from the defaults quietly go when their prerequisites are edited out.
    let mut features = Features::default();
    features.edit(BASE_FEATURES)?;
    match opts.fs_type {
        FsType::Ext2 => {}
        FsType::Ext3 => features.edit("has_journal")?,
        FsType::Ext4 => features.edit(EXT4_FEATURES)?,
    }
    let default_orphan = features.has_c(Compat::ORPHAN_FILE);
    let default_seed = features.has_i(Incompat::CSUM_SEED);
    features.edit(&opts.features)?;
    if opts.journal_blocks.is_some() || opts.journal_size_mib.is_some_and(|m| m > 0) {
        features.compat |= Compat::HAS_JOURNAL.bits();
    }
    if default_orphan && !features.has_c(Compat::HAS_JOURNAL) {
        features.clear_c(Compat::ORPHAN_FILE);
    }
    if default_seed && !features.has_r(RoCompat::METADATA_CSUM) {
        features.clear_i(Incompat::CSUM_SEED);
    }

    let block_size = match opts.block_size {
        Some(b) => b,
        None => {
            let b = profile(|p| p.block_size.map(i64::from), 4096);
            if b < 0 {
                4096
            } else {
                u32::try_from(b).unwrap_or(4096)
            }
        }
    };
    if !(1024..=65536).contains(&block_size) || !block_size.is_power_of_two() {
        return Err(Error::InvalidInput("block size must be a power of two from 1024 to 65536"));
    }
    let bs = u64::from(block_size);
    let blocks_count = bytes / bs;
    if blocks_count > u64::from(u32::MAX) {
        if features.has_i(Incompat::BIT64) {
            features.clear_c(Compat::RESIZE_INODE);
        } else {
            return Err(Error::InvalidInput("too many blocks for a filesystem without 64bit"));
        }
    }
    if blocks_count >= 1u64 << (block_size.trailing_zeros() + 3 + 32) {
        return Err(Error::InvalidInput("device too big for this block size"));
    }
    if features.has_i(Incompat::BIT64) && !features.has_i(Incompat::EXTENTS) {
        return Err(Error::Incompatible("64bit needs the extent feature".into()));
    }
    let per_group = opts.blocks_per_group;
    if let Some(n) = per_group {
        if n % 8 != 0 {
            return Err(Error::InvalidInput("blocks per group must be a multiple of 8"));
        }
        if n < 256 || n > 8 * block_size {
            return Err(Error::InvalidInput("blocks per group count out of range"));
        }
    }
    let reserved_gdt = match opts.resize {
        Some(r) => resize_reserve(
            r.blocks(bs),
            blocks_count,
            block_size,
            per_group,
            features.has_i(Incompat::BIT64),
        )?,
        None => None,
    };
    if reserved_gdt.is_some() {
        features.compat |= Compat::RESIZE_INODE.bits();
    }
    if features.has_r(RoCompat::METADATA_CSUM) && features.has_r(RoCompat::GDT_CSUM) {
        features.clear_r(RoCompat::GDT_CSUM);
    }
    if features.has_i(Incompat::META_BG) && features.has_c(Compat::RESIZE_INODE) {
        return Err(Error::Incompatible("resize_inode and meta_bg cannot both be enabled".into()));
    }
    if features.has_c(Compat::RESIZE_INODE) && !features.has_r(RoCompat::SPARSE_SUPER) {
        return Err(Error::Incompatible("resize_inode needs sparse_super".into()));
    }
    if features.has_c(Compat::ORPHAN_FILE) && !features.has_c(Compat::HAS_JOURNAL) {
        return Err(Error::Incompatible("orphan_file needs a journal".into()));
    }
    if features.has_i(Incompat::CSUM_SEED) && !features.has_r(RoCompat::METADATA_CSUM) {
        return Err(Error::Incompatible("metadata_csum_seed needs metadata_csum".into()));
    }
    // mke2fs's `quotatype_bits`: user and group unless told, project with the feature (which
    // asking for project quotas turns on).
    let mut quota_types = opts.quota_types.unwrap_or([true, true, false]);
    if quota_types[2] {
        features.ro_compat |= RoCompat::PROJECT.bits();
    }
    if features.has_r(RoCompat::PROJECT) {
        quota_types[2] = true;
    }
    let unsupported = Incompat::COMPRESSION.bits() | Incompat::JOURNAL_DEV.bits() | Incompat::DIRDATA.bits();
    if features.incompat & unsupported != 0 {
        return Err(Error::Incompatible("mkfs does not make journal_dev filesystems this way".into()));
    }
    let cluster_bits = cluster_bits(opts, &features, block_size)?;
    let backups = opts.num_backup_sb.unwrap_or(2);
    if backups > 2 {
        return Err(Error::InvalidInput("num_backup_sb must be 0, 1 or 2"));
    }
    let backup_bgs = match features.has_c(Compat::SPARSE_SUPER2) {
        true => [u32::from(backups >= 1), if backups >= 2 { u32::MAX } else { 0 }],
        false => [0, 0],
    };
    let errors = opts.errors.unwrap_or(rext4_format::superblock::ERRORS_CONTINUE);
    if !(1..=3).contains(&errors) {
        return Err(Error::InvalidInput("errors behaviour must be continue, remount-ro or panic"));
    }

    if opts.strict_encoding && !features.has_i(Incompat::CASEFOLD) {
        return Err(Error::InvalidInput("encoding_flags need casefold (an encoding)"));
    }
    let known_c = Compat::all().bits()
        & !(Compat::LAZY_BG.bits()
            | Compat::EXCLUDE_BITMAP.bits()
            | Compat::DIR_PREALLOC.bits()
            | Compat::IMAGIC_INODES.bits());
    if features.compat & !known_c != 0
        || features.incompat & !Incompat::all().bits() != 0
        || features.ro_compat & !RoCompat::all().bits() != 0
    {
        return Err(Error::Incompatible("mkfs does not make that feature".into()));
    }

    let mut inode_ratio = match opts.inode_ratio {
        Some(r) => r,
        None => u32::try_from(profile(|p| p.inode_ratio.map(i64::from), 16384)).unwrap_or(16384),
    };
    if !(1024..=65536 * 1024).contains(&inode_ratio) {
        return Err(Error::InvalidInput("inode ratio must be from 1024 to 64 MiB"));
    }
    if opts.inode_ratio.is_none() {
        inode_ratio = inode_ratio.max(block_size).max(block_size << cluster_bits);
    }
    let inode_size = match opts.inode_size {
        Some(s) => s,
        None => u16::try_from(profile(|p| p.inode_size.map(i64::from), 256)).unwrap_or(256),
    };
    if inode_size < 128 || u32::from(inode_size) > block_size || !inode_size.is_power_of_two() {
        return Err(Error::InvalidInput("inode size must be a power of two from 128 to the block size"));
    }
    if features.has_i(Incompat::INLINE_DATA) && inode_size == 128 {
        return Err(Error::InvalidInput("128-byte inodes are too small for inline data"));
    }
    if features.has_r(RoCompat::PROJECT) && inode_size == 128 {
        return Err(Error::InvalidInput("128-byte inodes are too small for project quota"));
    }
    let log_groups_per_flex = if features.has_i(Incompat::FLEX_BG) {
        let n = opts.flex_bg_size.unwrap_or(16);
        if n == 0 || !n.is_power_of_two() {
            return Err(Error::InvalidInput("flex_bg size must be a power of two"));
        }
        u8::try_from(n.trailing_zeros()).unwrap_or(0)
    } else {
        if opts.flex_bg_size.is_some() {
            return Err(Error::InvalidInput("a flex_bg size needs the flex_bg feature"));
        }
        0
    };
    let inodes_count = match opts.inodes {
        Some(n) => u64::from(n),
        None => {
            let n = blocks_count * bs / u64::from(inode_ratio);
            if n > u64::from(u32::MAX) {
                if features.has_i(Incompat::BIT64) {
                    u64::from(u32::MAX)
                } else {
                    return Err(Error::InvalidInput("too many inodes: raise the inode ratio"));
                }
            } else {
                n
            }
        }
    };
    if inodes_count * u64::from(inode_size) >= blocks_count * bs {
        return Err(Error::InvalidInput("inode tables would fill the filesystem: fewer inodes"));
    }
    let ratio = opts.reserved_ratio.unwrap_or(5.0);
    if !(0.0..=50.0).contains(&ratio) {
        return Err(Error::InvalidInput("reserved blocks percentage must be 0 to 50"));
    }
    // As mke2fs: a double product, truncated.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
    let r_blocks_count = (ratio * blocks_count as f64 / 100.0) as u64;
    Ok(Params {
        block_size,
        blocks_count,
        r_blocks_count,
        features,
        inode_size,
        inodes_count,
        log_groups_per_flex,
        journal_blocks: 0,
        fc_blocks: 0,
        quota_types,
        strict_encoding: opts.strict_encoding,
        cluster_bits,
        per_group,
        errors,
        last_mounted: opts.last_mounted.clone(),
        backup_bgs,
        stride: opts.stride.unwrap_or(0),
        stripe_width: opts.stripe_width.unwrap_or(0),
        reserved_gdt,
    })
}

/// `-E resize=`'s reserved GDT blocks, as mke2fs's option parser counts them: descriptor
/// blocks for the groups of `resize` blocks less those of `blocks`, at most a block of
/// pointers; `None` when that is none.
fn resize_reserve(
    resize: u64,
    blocks: u64,
    block_size: u32,
    per_group: Option<u32>,
    bit64: bool,
) -> Result<Option<u32>> {
    if resize <= blocks {
        return Err(Error::InvalidInput("the resize maximum must be greater than the filesystem size"));
    }
    let bpg = u64::from(per_group.unwrap_or(block_size * 8));
    let per_block = u64::from(block_size / if bit64 { 64 } else { 32 });
    let desc_blocks = blocks.div_ceil(bpg).div_ceil(per_block);
    let rsv = i64::try_from(resize.div_ceil(bpg).div_ceil(per_block)).unwrap_or(i64::MAX)
        - i64::try_from(desc_blocks).unwrap_or(i64::MAX);
    let rsv = rsv.min(i64::from(block_size / 4));
    Ok(u32::try_from(rsv).ok().filter(|&r| r > 0))
}

/// Blocks per cluster as log2, from `-C` (16 blocks by default with `bigalloc`, as
/// mke2fs.conf's `cluster_size` default): clusters of 2 KiB to 512 MiB, no smaller than a
/// block; bigalloc maps only through extents.
fn cluster_bits(opts: &FormatOptions, features: &Features, block_size: u32) -> Result<u32> {
    if !features.has_r(RoCompat::BIGALLOC) {
        return match opts.cluster_size {
            Some(_) => Err(Error::InvalidInput("a cluster size needs the bigalloc feature")),
            None => Ok(0),
        };
    }
    if !features.has_i(Incompat::EXTENTS) {
        return Err(Error::Incompatible("bigalloc needs the extent feature".into()));
    }
    let cluster = opts.cluster_size.unwrap_or_else(|| block_size.saturating_mul(16));
    if !(2048..=1 << 29).contains(&cluster) || !cluster.is_power_of_two() {
        return Err(Error::InvalidInput("cluster size must be a power of two from 2048 to 512 MiB"));
    }
    if cluster < block_size {
        return Err(Error::InvalidInput("the cluster size may not be smaller than the block size"));
    }
    Ok(cluster.trailing_zeros() - block_size.trailing_zeros())
}

/// `ext2fs_default_journal_size`: the journal's blocks for a filesystem of `blocks`, `None`
/// below 2048 blocks.
pub(crate) fn default_journal_blocks(blocks: u64) -> Option<u32> {
    Some(match blocks {
        0..2048 => return None,
        2048..32768 => 1024,
        32768..262_144 => 4096,
        262_144..524_288 => 8192,
        524_288..4_194_304 => 16384,
        4_194_304..8_388_608 => 32768,
        8_388_608..16_777_216 => 65536,
        16_777_216..33_554_432 => 131_072,
        _ => 262_144,
    })
}

/// `ext2fs_default_orphan_file_blocks`.
pub(crate) fn default_orphan_file_blocks(blocks: u64) -> u32 {
    if blocks < 128 * 1024 {
        32
    } else if blocks < 2 * 1024 * 1024 {
        u32::try_from(blocks / 4096).unwrap_or(512)
    } else {
        512
    }
}
