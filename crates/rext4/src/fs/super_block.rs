//! Reading and checking the superblock at open (the read side of the kernel's `super.c`):
//! geometry derived once, feature policy, and the reasons an image is refused or read-only.

use crate::dev::BlockDevice;
use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::num::usize_from;
use rext4_format::casefold;
use rext4_format::features::{feature_names, Compat, FeatureKind, Incompat, RoCompat};
use rext4_format::superblock::{self as fsb, Superblock, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE};

/// Incompat features this engine reads.
const INCOMPAT_SUPPORTED: Incompat = Incompat::FILETYPE
    .union(Incompat::META_BG)
    .union(Incompat::EXTENTS)
    .union(Incompat::BIT64)
    .union(Incompat::MMP)
    .union(Incompat::FLEX_BG)
    .union(Incompat::EA_INODE)
    .union(Incompat::CSUM_SEED)
    .union(Incompat::LARGEDIR)
    .union(Incompat::INLINE_DATA)
    .union(Incompat::ENCRYPT)
    .union(Incompat::CASEFOLD)
    // Replayed at open (jbd2/replay.rs) before anything else is read.
    .union(Incompat::RECOVER);

/// Ro-compat features this engine understands (it still opens read-only today, but an unknown
/// one will keep it read-only once writing exists).
const RO_COMPAT_KNOWN: RoCompat = RoCompat::SPARSE_SUPER
    .union(RoCompat::LARGE_FILE)
    .union(RoCompat::HUGE_FILE)
    .union(RoCompat::GDT_CSUM)
    .union(RoCompat::DIR_NLINK)
    .union(RoCompat::EXTRA_ISIZE)
    .union(RoCompat::QUOTA)
    .union(RoCompat::METADATA_CSUM)
    .union(RoCompat::PROJECT)
    .union(RoCompat::VERITY)
    .union(RoCompat::ORPHAN_PRESENT)
    // Read and written (map/cluster.rs); `geometry` keeps odd layouts read-only.
    .union(RoCompat::BIGALLOC);

/// Geometry and policy derived from the superblock; constant while the filesystem is open.
#[derive(Clone)]
pub(crate) struct SbInfo {
    /// The superblock as read at open.
    pub sb: Superblock,
    pub block_size: u32,
    pub blocks_count: u64,
    pub first_data_block: u64,
    pub blocks_per_group: u32,
    /// log2 of blocks per cluster: 0 without bigalloc. Block bitmaps, group descriptors'
    /// free counts and `s_overhead_clusters` count clusters; everything else counts blocks.
    pub cluster_bits: u32,
    /// Bits in a block bitmap (`s_clusters_per_group`; `blocks_per_group` without bigalloc).
    pub clusters_per_group: u32,
    pub inodes_per_group: u32,
    pub inodes_count: u32,
    pub inode_size: usize,
    pub desc_size: usize,
    pub group_count: u32,
    pub descs_per_block: u32,
    /// Blocks holding group descriptors (outside meta_bg).
    pub gdt_blocks: u64,
    pub inode_table_blocks: u64,
    pub csum_seed: u32,
    pub metadata_csum: bool,
    pub gdt_csum: bool,
    pub huge_file: bool,
    pub filetype: bool,
    pub dir_index: bool,
    pub large_dir: bool,
    pub inline_data: bool,
    pub ea_inode: bool,
    pub hash_seed: [u32; 4],
    pub hash_unsigned: bool,
    /// The `casefold` feature (with the one encoding there is): directories with
    /// `CASEFOLD_FL` hash and compare names by their folded form (dir/casefold.rs).
    pub casefold: bool,
    /// `s_encoding_flags` asks for strict encoding: casefolded directories refuse names that
    /// are not valid UTF-8.
    pub strict_encoding: bool,
    /// Why the image may only be read (unknown ro_compat features, ...); empty if writable.
    pub ro_reasons: Vec<String>,
}

fn bad(what: &'static str) -> Error {
    Error::Corrupt(crate::error::Corrupt(CorruptKind::Superblock(what)))
}

impl SbInfo {
    /// Block holding the primary superblock, and the superblock's offset in it.
    pub(crate) fn sb_location(&self) -> (u64, usize) {
        let bs = u64::from(self.block_size);
        (SUPERBLOCK_OFFSET / bs, usize_from(SUPERBLOCK_OFFSET % bs))
    }

    /// Reads the primary superblock from `dev` and checks everything that must hold before any
    /// other structure is trusted.
    pub(crate) fn load(dev: &dyn BlockDevice) -> Result<Self> {
        let mut raw = [0u8; SUPERBLOCK_SIZE];
        if dev.size() < SUPERBLOCK_OFFSET + SUPERBLOCK_SIZE as u64 {
            return Err(Error::Incompatible("device too small to hold an ext2/3/4 filesystem".into()));
        }
        dev.read_at(&mut raw, SUPERBLOCK_OFFSET)?;
        // Cannot fail: `raw` is exactly SUPERBLOCK_SIZE bytes.
        let sb = Superblock::parse(&raw).unwrap();
        if sb.s_magic.get() != fsb::EXT4_MAGIC {
            return Err(Error::Incompatible("no ext2/3/4 filesystem (bad magic number)".into()));
        }
        Self::check_features(&sb)?;
        if sb.has_metadata_csum() {
            if sb.s_checksum_type != fsb::CHECKSUM_TYPE_CRC32C {
                return Err(bad("unknown checksum type"));
            }
            if !sb.verify_checksum() {
                return corrupt(CorruptKind::SuperblockChecksum);
            }
        }
        Self::geometry(sb, dev.size())
    }

    fn check_features(sb: &Superblock) -> Result<()> {
        let incompat = sb.incompat();
        if incompat.contains(Incompat::JOURNAL_DEV) {
            return Err(Error::Incompatible("this is an external journal device, not a filesystem".into()));
        }
        let unsupported = incompat.difference(INCOMPAT_SUPPORTED);
        if !unsupported.is_empty() {
            let names = feature_names(FeatureKind::Incompat, unsupported.bits()).join(", ");
            return Err(Error::Incompatible(format!("unsupported incompat feature(s): {names}")));
        }
        if incompat.contains(Incompat::CASEFOLD) && casefold::encoding_name(sb.s_encoding.get()).is_none() {
            // The kernel's `ext4_encoding_init`: a name hashed with unknown tables is lost.
            return Err(Error::Incompatible(format!(
                "casefold with an unknown encoding ({})",
                sb.s_encoding.get()
            )));
        }
        if sb.ro_compat().contains(RoCompat::METADATA_CSUM) && sb.ro_compat().contains(RoCompat::GDT_CSUM) {
            return Err(bad("both metadata_csum and uninit_bg are set"));
        }
        Ok(())
    }

    fn geometry(sb: Superblock, dev_size: u64) -> Result<Self> {
        let block_size = sb.block_size().ok_or(bad("block size out of range"))?;
        let ro = sb.ro_compat();
        let bigalloc = ro.contains(RoCompat::BIGALLOC);
        let blocks_per_group = sb.s_blocks_per_group.get();
        let bits_per_block = block_size * 8;
        // `ext4_handle_clustersize`: with bigalloc a bitmap bit is a cluster of 2^n blocks.
        let (cluster_bits, clusters_per_group) = if bigalloc {
            let log_block = sb.s_log_block_size.get();
            let log_cluster = sb.s_log_cluster_size.get();
            if log_cluster < log_block {
                return Err(bad("cluster size smaller than block size"));
            }
            // The kernel's EXT4_MAX_CLUSTER_LOG_SIZE: clusters of at most 1 GiB.
            if sb.cluster_size().is_none_or(|c| c > 1 << 30) {
                return Err(bad("cluster size out of range"));
            }
            let bits = log_cluster - log_block;
            let cpg = sb.s_clusters_per_group.get();
            if cpg == 0 || cpg > bits_per_block {
                return Err(bad("clusters per group out of range"));
            }
            if u64::from(cpg) << bits != u64::from(blocks_per_group) {
                return Err(bad("blocks per group and clusters per group inconsistent"));
            }
            if !sb.incompat().contains(Incompat::EXTENTS) {
                // The kernel refuses to mount such a filesystem at all.
                return Err(Error::Incompatible("bigalloc without the extent feature".into()));
            }
            (bits, cpg)
        } else {
            if sb.s_log_cluster_size.get() != sb.s_log_block_size.get() {
                return Err(bad("cluster size differs from block size without bigalloc"));
            }
            if blocks_per_group == 0 || blocks_per_group > bits_per_block {
                return Err(bad("blocks per group out of range"));
            }
            (0, blocks_per_group)
        };
        let blocks_count = sb.blocks_count();
        let first_data_block = u64::from(sb.s_first_data_block.get());
        let inodes_per_group = sb.s_inodes_per_group.get();
        let inodes_count = sb.s_inodes_count.get();
        let inode_size = usize::from(sb.inode_size());

        if inodes_per_group == 0 || inodes_per_group > bits_per_block {
            return Err(bad("inodes per group out of range"));
        }
        if inode_size < 128 || !inode_size.is_power_of_two() || inode_size > block_size as usize {
            return Err(bad("inode size out of range"));
        }
        if !(inodes_per_group as usize * inode_size).is_multiple_of(block_size as usize) {
            return Err(bad("inode table does not fill whole blocks"));
        }
        if first_data_block >= blocks_count {
            return Err(bad("first data block beyond block count"));
        }
        // 1 KiB blocks start the filesystem at block 1, but for bigalloc, whose first cluster
        // holds the boot block and the superblock (`ext4_check_geometry`).
        let first_ok = match block_size {
            1024 => first_data_block == 1 || first_data_block == 0 && cluster_bits > 0,
            _ => first_data_block == 0,
        };
        if !first_ok {
            return Err(bad("first data block does not match block size"));
        }
        if blocks_count.saturating_mul(u64::from(block_size)) > dev_size {
            return Err(Error::Incompatible(format!(
                "block count {blocks_count} exceeds the device size ({dev_size} bytes)"
            )));
        }
        let first_ino = sb.first_ino();
        if sb.s_rev_level.get() != fsb::GOOD_OLD_REV && (first_ino < 11 || first_ino > inodes_count) {
            return Err(bad("first inode out of range"));
        }
        let desc_size = usize::from(sb.desc_size());
        if sb.is_64bit() && (!(64..=1024).contains(&desc_size) || !desc_size.is_power_of_two()) {
            return Err(bad("group descriptor size out of range"));
        }
        let group_count = (blocks_count - first_data_block).div_ceil(u64::from(blocks_per_group));
        let group_count = u32::try_from(group_count).map_err(|_| bad("too many block groups"))?;
        if u64::from(group_count) * u64::from(inodes_per_group) != u64::from(inodes_count) {
            return Err(bad("inode count does not match groups x inodes per group"));
        }
        let descs_per_block = block_size / u32::from(sb.desc_size());
        let gdt_blocks = u64::from(group_count.div_ceil(descs_per_block));
        if sb.incompat().contains(Incompat::META_BG) && u64::from(sb.s_first_meta_bg.get()) > gdt_blocks {
            return Err(bad("first meta_bg beyond descriptor blocks"));
        }
        let inode_table_blocks =
            (u64::from(inodes_per_group) * inode_size as u64).div_ceil(u64::from(block_size));

        let mut ro_reasons = Vec::new();
        if bigalloc && blocks_count & ((1u64 << cluster_bits) - 1) != 0 {
            // mke2fs rounds the size down to whole clusters; a last cluster cut short would
            // have blocks past the end to hand out.
            ro_reasons.push("bigalloc: the block count is not a whole number of clusters".into());
        }
        if bigalloc && first_data_block != 0 {
            // Clusters are counted from block 0 (a block's offset in its cluster is
            // `blk & mask`); groups starting at block 1 would cut every cluster in two.
            ro_reasons.push("bigalloc: the first data block is not 0".into());
        }
        let unknown_ro = ro.difference(RO_COMPAT_KNOWN);
        if !unknown_ro.is_empty() {
            ro_reasons.push(format!(
                "unknown or unsupported ro_compat feature(s): {}",
                feature_names(FeatureKind::RoCompat, unknown_ro.bits()).join(", ")
            ));
        }

        Ok(SbInfo {
            block_size,
            blocks_count,
            first_data_block,
            blocks_per_group,
            cluster_bits,
            clusters_per_group,
            inodes_per_group,
            inodes_count,
            inode_size,
            desc_size,
            group_count,
            descs_per_block,
            gdt_blocks,
            inode_table_blocks,
            csum_seed: sb.csum_seed(),
            metadata_csum: sb.has_metadata_csum(),
            gdt_csum: ro.contains(RoCompat::GDT_CSUM),
            huge_file: ro.contains(RoCompat::HUGE_FILE),
            filetype: sb.incompat().contains(Incompat::FILETYPE),
            dir_index: sb.compat().contains(Compat::DIR_INDEX),
            large_dir: sb.incompat().contains(Incompat::LARGEDIR),
            inline_data: sb.incompat().contains(Incompat::INLINE_DATA),
            ea_inode: sb.incompat().contains(Incompat::EA_INODE),
            hash_seed: sb.hash_seed(),
            hash_unsigned: sb.s_flags.get() & fsb::FLAGS_UNSIGNED_HASH != 0,
            casefold: sb.incompat().contains(Incompat::CASEFOLD),
            strict_encoding: sb.incompat().contains(Incompat::CASEFOLD)
                && sb.s_encoding_flags.get() & casefold::ENCODING_FLAG_STRICT != 0,
            ro_reasons,
            sb,
        })
    }

    /// First block of group `g`.
    pub(crate) fn group_first_block(&self, g: u32) -> u64 {
        self.first_data_block + u64::from(g) * u64::from(self.blocks_per_group)
    }

    /// Number of blocks in group `g` (the last group may be short).
    pub(crate) fn blocks_in_group(&self, g: u32) -> u32 {
        let rest = self.blocks_count - self.group_first_block(g);
        u32::try_from(rest).map_or(self.blocks_per_group, |r| r.min(self.blocks_per_group))
    }

    /// How many groups, from the first, lie wholly below block `end` (all of them when the
    /// filesystem ends first): where blocks for a field that holds numbers below `end` may be
    /// allocated (for block maps' 32 bits, the kernel's `s_blockfile_groups`).
    pub(crate) fn groups_below(&self, end: u64) -> u32 {
        if self.blocks_count <= end {
            return self.group_count;
        }
        let whole = end.saturating_sub(self.first_data_block) / u64::from(self.blocks_per_group);
        u32::try_from(whole).map_or(self.group_count, |w| w.min(self.group_count))
    }

    /// Group of block `blk` and the block's offset in it. `blk` must lie in the filesystem
    /// (callers check it against `first_data_block..blocks_count`).
    // Cannot truncate for such a block: the group is below `group_count` and the offset below
    // `blocks_per_group`, both u32s (checked at mount).
    #[allow(clippy::cast_possible_truncation)]
    pub(crate) fn block_group_offset(&self, blk: u64) -> (u32, u32) {
        debug_assert!(blk >= self.first_data_block && blk < self.blocks_count);
        let rel = blk - self.first_data_block;
        let bpg = u64::from(self.blocks_per_group);
        ((rel / bpg) as u32, (rel % bpg) as u32)
    }

    /// Blocks at the start of group `g` taken by superblock and descriptor copies
    /// (`ext4_num_base_meta_blocks`).
    /// Group 0's count includes a boot block before the superblock where it has one.
    pub(crate) fn base_meta_blocks(&self, g: u32) -> u64 {
        let has_super = u64::from(self.group_has_super(g)) + u64::from(g == 0) * self.boot_block();
        let meta_bg = self.sb.incompat().contains(Incompat::META_BG);
        let first_meta_bg = self.sb.s_first_meta_bg.get();
        if !meta_bg || g / self.descs_per_block < first_meta_bg {
            if has_super == 0 {
                return 0;
            }
            let gdb = if meta_bg { u64::from(first_meta_bg) } else { self.gdt_blocks };
            has_super + gdb + u64::from(self.sb.s_reserved_gdt_blocks.get())
        } else {
            let first = (g / self.descs_per_block) * self.descs_per_block;
            let last = first + self.descs_per_block - 1;
            has_super + u64::from(g == first || g == first + 1 || g == last)
        }
    }

    /// Whether group `g` carries a superblock backup (and descriptor copies).
    pub(crate) fn group_has_super(&self, g: u32) -> bool {
        let sb = &self.sb;
        if g == 0 {
            return true;
        }
        if sb.compat().contains(Compat::SPARSE_SUPER2) {
            return g == sb.s_backup_bgs[0].get() || g == sb.s_backup_bgs[1].get();
        }
        if g <= 1 || !sb.ro_compat().contains(RoCompat::SPARSE_SUPER) {
            return true;
        }
        if g & 1 == 0 {
            return false;
        }
        [3u32, 5, 7].iter().any(|&base| {
            let mut n = base;
            while n < g {
                match n.checked_mul(base) {
                    Some(m) => n = m,
                    None => return false,
                }
            }
            n == g
        })
    }

    /// The block holding descriptor block number `i` (0-based) of the primary copy.
    pub(crate) fn descriptor_block(&self, i: u64) -> u64 {
        let meta_bg = self.sb.incompat().contains(Incompat::META_BG);
        let first_meta_bg = u64::from(self.sb.s_first_meta_bg.get());
        if !meta_bg || i < first_meta_bg {
            // After the superblock's block (block 1 of 1 KiB blocks also where bigalloc
            // starts the filesystem at block 0).
            return self.sb_location().0 + 1 + i;
        }
        // With meta_bg, descriptor block i lives in the first group of its meta group.
        let g = i * u64::from(self.descs_per_block);
        let g = u32::try_from(g).unwrap_or(u32::MAX);
        self.group_first_block(g) + u64::from(self.group_has_super(g)) + u64::from(g == 0) * self.boot_block()
    }

    /// 1 where group 0 starts with a block of its own before the superblock (1 KiB blocks
    /// under bigalloc, whose first data block is 0), else 0.
    pub(crate) fn boot_block(&self) -> u64 {
        self.sb_location().0.saturating_sub(self.first_data_block)
    }

    /// Blocks in `n` clusters.
    pub(crate) fn c2b(&self, n: u64) -> u64 {
        n << self.cluster_bits
    }

    /// Bytes in a cluster (a block without bigalloc): what a file's metadata block costs
    /// its `i_blocks`, and the unit collapse and insert range shift by.
    pub(crate) fn cluster_bytes(&self) -> u64 {
        self.c2b(u64::from(self.block_size))
    }

    /// Blocks in a cluster, less one: the offset of a block in its cluster is `blk & mask`.
    pub(crate) fn cluster_mask(&self) -> u64 {
        self.c2b(1) - 1
    }

    /// Bits of group `g`'s block bitmap in use: its clusters (the last group may be short).
    pub(crate) fn clusters_in_group(&self, g: u32) -> u32 {
        self.blocks_in_group(g).div_ceil(1 << self.cluster_bits)
    }

    /// Whether the journal must be replayed before the filesystem is read (`needs_recovery`).
    pub(crate) fn needs_recovery(&self) -> bool {
        self.sb.incompat().contains(Incompat::RECOVER)
    }

    /// Whether the filesystem may be modified, and if not, why.
    pub(crate) fn read_only_reasons(&self) -> &[String] {
        &self.ro_reasons
    }

    /// `Incompatible` with the first reason the filesystem may not be modified, if any.
    pub(crate) fn check_writable(&self) -> Result<()> {
        match self.ro_reasons.first() {
            Some(why) => Err(Error::Incompatible(format!("cannot open read-write: {why}"))),
            None => Ok(()),
        }
    }
}
