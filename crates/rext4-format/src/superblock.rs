//! The ext4 superblock (`struct ext4_super_block`), 1024 bytes at byte offset 1024.

use crate::checksum::{crc32c, csum_seed_from_uuid};
use crate::features::{Compat, Incompat, RoCompat};
use crate::split::{hi32, lo32};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Byte offset of the primary superblock on the device.
pub const SUPERBLOCK_OFFSET: u64 = 1024;
/// Size of the superblock structure.
pub const SUPERBLOCK_SIZE: usize = 1024;
/// `s_magic`.
pub const EXT4_MAGIC: u16 = 0xEF53;
/// `s_state` bit: cleanly unmounted.
pub const STATE_VALID: u16 = 0x0001;
/// `s_state` bit: errors detected.
pub const STATE_ERROR: u16 = 0x0002;
/// `s_state` bit: orphans being recovered.
pub const STATE_ORPHAN: u16 = 0x0004;
/// `s_flags`: directory hashes treat name bytes as signed chars.
pub const FLAGS_SIGNED_HASH: u32 = 0x0001;
/// `s_flags`: directory hashes treat name bytes as unsigned chars.
pub const FLAGS_UNSIGNED_HASH: u32 = 0x0002;
/// `s_checksum_type` for crc32c.
pub const CHECKSUM_TYPE_CRC32C: u8 = 1;
/// `s_rev_level` of the original ext2 format (fixed 128-byte inodes, first inode 11).
pub const GOOD_OLD_REV: u32 = 0;
/// Inode size of revision 0 filesystems.
pub const GOOD_OLD_INODE_SIZE: u16 = 128;
/// First non-reserved inode of revision 0 filesystems.
pub const GOOD_OLD_FIRST_INO: u32 = 11;

/// `s_errors`: what to do on an error.
pub const ERRORS_CONTINUE: u16 = 1;
/// `s_errors`: remount read-only.
pub const ERRORS_RO: u16 = 2;
/// `s_errors`: panic (userspace: stop the filesystem).
pub const ERRORS_PANIC: u16 = 3;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone)]
#[repr(C)]
pub struct Superblock {
    /*000*/ pub s_inodes_count: U32,
    /*004*/ pub s_blocks_count_lo: U32,
    /*008*/ pub s_r_blocks_count_lo: U32,
    /*00C*/ pub s_free_blocks_count_lo: U32,
    /*010*/ pub s_free_inodes_count: U32,
    /*014*/ pub s_first_data_block: U32,
    /*018*/ pub s_log_block_size: U32,
    /*01C*/ pub s_log_cluster_size: U32,
    /*020*/ pub s_blocks_per_group: U32,
    /*024*/ pub s_clusters_per_group: U32,
    /*028*/ pub s_inodes_per_group: U32,
    /*02C*/ pub s_mtime: U32,
    /*030*/ pub s_wtime: U32,
    /*034*/ pub s_mnt_count: U16,
    /*036*/ pub s_max_mnt_count: U16,
    /*038*/ pub s_magic: U16,
    /*03A*/ pub s_state: U16,
    /*03C*/ pub s_errors: U16,
    /*03E*/ pub s_minor_rev_level: U16,
    /*040*/ pub s_lastcheck: U32,
    /*044*/ pub s_checkinterval: U32,
    /*048*/ pub s_creator_os: U32,
    /*04C*/ pub s_rev_level: U32,
    /*050*/ pub s_def_resuid: U16,
    /*052*/ pub s_def_resgid: U16,
    /*054*/ pub s_first_ino: U32,
    /*058*/ pub s_inode_size: U16,
    /*05A*/ pub s_block_group_nr: U16,
    /*05C*/ pub s_feature_compat: U32,
    /*060*/ pub s_feature_incompat: U32,
    /*064*/ pub s_feature_ro_compat: U32,
    /*068*/ pub s_uuid: [u8; 16],
    /*078*/ pub s_volume_name: [u8; 16],
    /*088*/ pub s_last_mounted: [u8; 64],
    /*0C8*/ pub s_algorithm_usage_bitmap: U32,
    /*0CC*/ pub s_prealloc_blocks: u8,
    /*0CD*/ pub s_prealloc_dir_blocks: u8,
    /*0CE*/ pub s_reserved_gdt_blocks: U16,
    /*0D0*/ pub s_journal_uuid: [u8; 16],
    /*0E0*/ pub s_journal_inum: U32,
    /*0E4*/ pub s_journal_dev: U32,
    /*0E8*/ pub s_last_orphan: U32,
    /*0EC*/ pub s_hash_seed: [U32; 4],
    /*0FC*/ pub s_def_hash_version: u8,
    /*0FD*/ pub s_jnl_backup_type: u8,
    /*0FE*/ pub s_desc_size: U16,
    /*100*/ pub s_default_mount_opts: U32,
    /*104*/ pub s_first_meta_bg: U32,
    /*108*/ pub s_mkfs_time: U32,
    /*10C*/ pub s_jnl_blocks: [U32; 17],
    /*150*/ pub s_blocks_count_hi: U32,
    /*154*/ pub s_r_blocks_count_hi: U32,
    /*158*/ pub s_free_blocks_count_hi: U32,
    /*15C*/ pub s_min_extra_isize: U16,
    /*15E*/ pub s_want_extra_isize: U16,
    /*160*/ pub s_flags: U32,
    /*164*/ pub s_raid_stride: U16,
    /*166*/ pub s_mmp_update_interval: U16,
    /*168*/ pub s_mmp_block: U64,
    /*170*/ pub s_raid_stripe_width: U32,
    /*174*/ pub s_log_groups_per_flex: u8,
    /*175*/ pub s_checksum_type: u8,
    /*176*/ pub s_encryption_level: u8,
    /*177*/ pub s_reserved_pad: u8,
    /*178*/ pub s_kbytes_written: U64,
    /*180*/ pub s_snapshot_inum: U32,
    /*184*/ pub s_snapshot_id: U32,
    /*188*/ pub s_snapshot_r_blocks_count: U64,
    /*190*/ pub s_snapshot_list: U32,
    /*194*/ pub s_error_count: U32,
    /*198*/ pub s_first_error_time: U32,
    /*19C*/ pub s_first_error_ino: U32,
    /*1A0*/ pub s_first_error_block: U64,
    /*1A8*/ pub s_first_error_func: [u8; 32],
    /*1C8*/ pub s_first_error_line: U32,
    /*1CC*/ pub s_last_error_time: U32,
    /*1D0*/ pub s_last_error_ino: U32,
    /*1D4*/ pub s_last_error_line: U32,
    /*1D8*/ pub s_last_error_block: U64,
    /*1E0*/ pub s_last_error_func: [u8; 32],
    /*200*/ pub s_mount_opts: [u8; 64],
    /*240*/ pub s_usr_quota_inum: U32,
    /*244*/ pub s_grp_quota_inum: U32,
    /*248*/ pub s_overhead_clusters: U32,
    /*24C*/ pub s_backup_bgs: [U32; 2],
    /*254*/ pub s_encrypt_algos: [u8; 4],
    /*258*/ pub s_encrypt_pw_salt: [u8; 16],
    /*268*/ pub s_lpf_ino: U32,
    /*26C*/ pub s_prj_quota_inum: U32,
    /*270*/ pub s_checksum_seed: U32,
    /*274*/ pub s_wtime_hi: u8,
    /*275*/ pub s_mtime_hi: u8,
    /*276*/ pub s_mkfs_time_hi: u8,
    /*277*/ pub s_lastcheck_hi: u8,
    /*278*/ pub s_first_error_time_hi: u8,
    /*279*/ pub s_last_error_time_hi: u8,
    /*27A*/ pub s_first_error_errcode: u8,
    /*27B*/ pub s_last_error_errcode: u8,
    /*27C*/ pub s_encoding: U16,
    /*27E*/ pub s_encoding_flags: U16,
    /*280*/ pub s_orphan_file_inum: U32,
    /*284*/ pub s_reserved: [U32; 94],
    /*3FC*/ pub s_checksum: U32,
}
const _: () = assert!(core::mem::size_of::<Superblock>() == SUPERBLOCK_SIZE);

/// Offset of `s_checksum`: the checksum covers every byte before it.
pub const SB_CHECKSUM_OFFSET: usize = 0x3FC;

fn hi_lo(hi: u32, lo: u32) -> u64 {
    (u64::from(hi) << 32) | u64::from(lo)
}

fn time_hi(lo: u32, hi: u8) -> i64 {
    (i64::from(hi) << 32) | i64::from(lo)
}

/// A time in seconds as the superblock's time fields hold it (`ext4_update_tstamp`): the low
/// 32 bits, and bits 32-39 in the `_hi` byte.
pub fn split_time(t: i64) -> (u32, u8) {
    let t = t.cast_unsigned();
    (lo32(t), crate::split::hi8_of_40(t))
}

impl Superblock {
    /// Parses the first 1024 bytes of `bytes`; `None` if there are fewer.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        Self::read_from_prefix(bytes).ok().map(|(sb, _)| sb)
    }

    pub fn compat(&self) -> Compat {
        Compat::from_bits_retain(self.s_feature_compat.get())
    }
    pub fn incompat(&self) -> Incompat {
        Incompat::from_bits_retain(self.s_feature_incompat.get())
    }
    pub fn ro_compat(&self) -> RoCompat {
        RoCompat::from_bits_retain(self.s_feature_ro_compat.get())
    }
    pub fn is_64bit(&self) -> bool {
        self.incompat().contains(Incompat::BIT64)
    }

    pub fn blocks_count(&self) -> u64 {
        let hi = if self.is_64bit() { self.s_blocks_count_hi.get() } else { 0 };
        hi_lo(hi, self.s_blocks_count_lo.get())
    }
    pub fn set_blocks_count(&mut self, v: u64) {
        self.s_blocks_count_lo.set(lo32(v));
        if self.is_64bit() {
            self.s_blocks_count_hi.set(hi32(v));
        }
    }
    pub fn r_blocks_count(&self) -> u64 {
        let hi = if self.is_64bit() { self.s_r_blocks_count_hi.get() } else { 0 };
        hi_lo(hi, self.s_r_blocks_count_lo.get())
    }
    pub fn free_blocks_count(&self) -> u64 {
        let hi = if self.is_64bit() { self.s_free_blocks_count_hi.get() } else { 0 };
        hi_lo(hi, self.s_free_blocks_count_lo.get())
    }
    pub fn set_free_blocks_count(&mut self, v: u64) {
        self.s_free_blocks_count_lo.set(lo32(v));
        if self.is_64bit() {
            self.s_free_blocks_count_hi.set(hi32(v));
        }
    }

    /// Block size in bytes, or `None` if `s_log_block_size` is out of ext4's range (1 KiB..64 KiB).
    pub fn block_size(&self) -> Option<u32> {
        let log = self.s_log_block_size.get();
        (log <= 6).then(|| 1024u32 << log)
    }
    /// Cluster size in bytes (bigalloc), or `None` if out of range.
    pub fn cluster_size(&self) -> Option<u64> {
        let log = self.s_log_cluster_size.get();
        (log <= 29).then(|| 1024u64 << log)
    }

    pub fn inode_size(&self) -> u16 {
        if self.s_rev_level.get() == GOOD_OLD_REV {
            GOOD_OLD_INODE_SIZE
        } else {
            self.s_inode_size.get()
        }
    }
    pub fn first_ino(&self) -> u32 {
        if self.s_rev_level.get() == GOOD_OLD_REV {
            GOOD_OLD_FIRST_INO
        } else {
            self.s_first_ino.get()
        }
    }
    /// Size of one group descriptor: 32 bytes unless 64bit with a larger `s_desc_size`.
    pub fn desc_size(&self) -> u16 {
        if self.is_64bit() {
            self.s_desc_size.get()
        } else {
            32
        }
    }

    pub fn mtime(&self) -> i64 {
        time_hi(self.s_mtime.get(), self.s_mtime_hi)
    }
    pub fn wtime(&self) -> i64 {
        time_hi(self.s_wtime.get(), self.s_wtime_hi)
    }
    pub fn mkfs_time(&self) -> i64 {
        time_hi(self.s_mkfs_time.get(), self.s_mkfs_time_hi)
    }
    pub fn first_error_time(&self) -> i64 {
        time_hi(self.s_first_error_time.get(), self.s_first_error_time_hi)
    }
    pub fn last_error_time(&self) -> i64 {
        time_hi(self.s_last_error_time.get(), self.s_last_error_time_hi)
    }
    pub fn lastcheck(&self) -> i64 {
        time_hi(self.s_lastcheck.get(), self.s_lastcheck_hi)
    }

    /// Seed for all metadata checksums: `s_checksum_seed` with `metadata_csum_seed`, else
    /// crc32c of the UUID.
    pub fn csum_seed(&self) -> u32 {
        if self.incompat().contains(Incompat::CSUM_SEED) {
            self.s_checksum_seed.get()
        } else {
            csum_seed_from_uuid(&self.s_uuid)
        }
    }

    /// Whether metadata_csum is on (the superblock then carries a crc32c of itself).
    pub fn has_metadata_csum(&self) -> bool {
        self.ro_compat().contains(RoCompat::METADATA_CSUM)
    }

    pub fn compute_checksum(&self) -> u32 {
        crc32c(!0, &self.as_bytes()[..SB_CHECKSUM_OFFSET])
    }
    /// True if the checksum matches or the filesystem does not use metadata_csum.
    pub fn verify_checksum(&self) -> bool {
        !self.has_metadata_csum() || self.compute_checksum() == self.s_checksum.get()
    }
    pub fn update_checksum(&mut self) {
        if self.has_metadata_csum() {
            let c = self.compute_checksum();
            self.s_checksum.set(c);
        }
    }

    /// The directory-hash seed; all zeroes means "use the default".
    pub fn hash_seed(&self) -> [u32; 4] {
        [
            self.s_hash_seed[0].get(),
            self.s_hash_seed[1].get(),
            self.s_hash_seed[2].get(),
            self.s_hash_seed[3].get(),
        ]
    }

    /// The volume label, without trailing NULs.
    pub fn volume_name(&self) -> &[u8] {
        let n = self.s_volume_name.iter().position(|&b| b == 0).unwrap_or(16);
        &self.s_volume_name[..n]
    }
    pub fn last_mounted(&self) -> &[u8] {
        let n = self.s_last_mounted.iter().position(|&b| b == 0).unwrap_or(64);
        &self.s_last_mounted[..n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromZeros;

    #[test]
    fn offsets_match_the_kernel_layout() {
        use core::mem::offset_of;
        assert_eq!(offset_of!(Superblock, s_magic), 0x38);
        assert_eq!(offset_of!(Superblock, s_uuid), 0x68);
        assert_eq!(offset_of!(Superblock, s_journal_inum), 0xE0);
        assert_eq!(offset_of!(Superblock, s_desc_size), 0xFE);
        assert_eq!(offset_of!(Superblock, s_blocks_count_hi), 0x150);
        assert_eq!(offset_of!(Superblock, s_log_groups_per_flex), 0x174);
        assert_eq!(offset_of!(Superblock, s_checksum_seed), 0x270);
        assert_eq!(offset_of!(Superblock, s_orphan_file_inum), 0x280);
        assert_eq!(offset_of!(Superblock, s_checksum), SB_CHECKSUM_OFFSET);
    }

    #[test]
    fn hi_halves_only_count_with_64bit() {
        let mut sb = Superblock::new_zeroed();
        sb.s_blocks_count_lo.set(10);
        sb.s_blocks_count_hi.set(1);
        assert_eq!(sb.blocks_count(), 10);
        sb.s_feature_incompat.set(Incompat::BIT64.bits());
        assert_eq!(sb.blocks_count(), (1 << 32) | 10);
    }

    #[test]
    fn block_size_range_is_checked() {
        let mut sb = Superblock::new_zeroed();
        assert_eq!(sb.block_size(), Some(1024));
        sb.s_log_block_size.set(6);
        assert_eq!(sb.block_size(), Some(65536));
        sb.s_log_block_size.set(7);
        assert_eq!(sb.block_size(), None);
        sb.s_log_block_size.set(u32::MAX);
        assert_eq!(sb.block_size(), None);
    }
}
