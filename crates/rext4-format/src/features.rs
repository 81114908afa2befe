//! Feature flags of the superblock, with the names e2fsprogs prints for them.

use bitflags::bitflags;

bitflags! {
    /// `s_feature_compat`: a kernel that does not know these may still mount read-write.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Compat: u32 {
        const DIR_PREALLOC = 0x0001;
        const IMAGIC_INODES = 0x0002;
        const HAS_JOURNAL = 0x0004;
        const EXT_ATTR = 0x0008;
        const RESIZE_INODE = 0x0010;
        const DIR_INDEX = 0x0020;
        const LAZY_BG = 0x0040;
        const EXCLUDE_BITMAP = 0x0100;
        const SPARSE_SUPER2 = 0x0200;
        const FAST_COMMIT = 0x0400;
        const STABLE_INODES = 0x0800;
        const ORPHAN_FILE = 0x1000;
    }

    /// `s_feature_incompat`: a driver that does not know one of these must not mount.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Incompat: u32 {
        const COMPRESSION = 0x0001;
        const FILETYPE = 0x0002;
        const RECOVER = 0x0004;
        const JOURNAL_DEV = 0x0008;
        const META_BG = 0x0010;
        const EXTENTS = 0x0040;
        const BIT64 = 0x0080;
        const MMP = 0x0100;
        const FLEX_BG = 0x0200;
        const EA_INODE = 0x0400;
        const DIRDATA = 0x1000;
        const CSUM_SEED = 0x2000;
        const LARGEDIR = 0x4000;
        const INLINE_DATA = 0x8000;
        const ENCRYPT = 0x10000;
        const CASEFOLD = 0x20000;
    }

    /// `s_feature_ro_compat`: a driver that does not know one of these may mount read-only.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct RoCompat: u32 {
        const SPARSE_SUPER = 0x0001;
        const LARGE_FILE = 0x0002;
        const BTREE_DIR = 0x0004;
        const HUGE_FILE = 0x0008;
        const GDT_CSUM = 0x0010;
        const DIR_NLINK = 0x0020;
        const EXTRA_ISIZE = 0x0040;
        const HAS_SNAPSHOT = 0x0080;
        const QUOTA = 0x0100;
        const BIGALLOC = 0x0200;
        const METADATA_CSUM = 0x0400;
        const REPLICA = 0x0800;
        const READONLY = 0x1000;
        const PROJECT = 0x2000;
        const SHARED_BLOCKS = 0x4000;
        const VERITY = 0x8000;
        const ORPHAN_PRESENT = 0x10000;
    }
}

const COMPAT_NAMES: &[(u32, &str)] = &[
    (0x0001, "dir_prealloc"),
    (0x0002, "imagic_inodes"),
    (0x0004, "has_journal"),
    (0x0008, "ext_attr"),
    (0x0010, "resize_inode"),
    (0x0020, "dir_index"),
    (0x0040, "lazy_bg"),
    (0x0100, "snapshot_bitmap"),
    (0x0200, "sparse_super2"),
    (0x0400, "fast_commit"),
    (0x0800, "stable_inodes"),
    (0x1000, "orphan_file"),
];
const INCOMPAT_NAMES: &[(u32, &str)] = &[
    (0x0001, "compression"),
    (0x0002, "filetype"),
    (0x0004, "needs_recovery"),
    (0x0008, "journal_dev"),
    (0x0010, "meta_bg"),
    (0x0040, "extent"),
    (0x0080, "64bit"),
    (0x0100, "mmp"),
    (0x0200, "flex_bg"),
    (0x0400, "ea_inode"),
    (0x1000, "dirdata"),
    (0x2000, "metadata_csum_seed"),
    (0x4000, "large_dir"),
    (0x8000, "inline_data"),
    (0x10000, "encrypt"),
    (0x20000, "casefold"),
];
const RO_COMPAT_NAMES: &[(u32, &str)] = &[
    (0x0001, "sparse_super"),
    (0x0002, "large_file"),
    (0x0004, "btree_dir"),
    (0x0008, "huge_file"),
    (0x0010, "uninit_bg"),
    (0x0020, "dir_nlink"),
    (0x0040, "extra_isize"),
    (0x0080, "snapshot"),
    (0x0100, "quota"),
    (0x0200, "bigalloc"),
    (0x0400, "metadata_csum"),
    (0x0800, "replica"),
    (0x1000, "read-only"),
    (0x2000, "project"),
    (0x4000, "shared_blocks"),
    (0x8000, "verity"),
    (0x10000, "orphan_present"),
];

/// Which of the three feature words a bit belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FeatureKind {
    Compat,
    Incompat,
    RoCompat,
}

/// The name e2fsprogs gives a single feature bit, e.g. `metadata_csum`, or `FEATURE_I31` for an
/// unknown incompat bit 31.
pub fn feature_name(kind: FeatureKind, bit: u32) -> String {
    let (table, prefix) = match kind {
        FeatureKind::Compat => (COMPAT_NAMES, 'C'),
        FeatureKind::Incompat => (INCOMPAT_NAMES, 'I'),
        FeatureKind::RoCompat => (RO_COMPAT_NAMES, 'R'),
    };
    match table.iter().find(|(b, _)| *b == bit) {
        Some((_, name)) => (*name).to_string(),
        None => format!("FEATURE_{prefix}{}", bit.trailing_zeros()),
    }
}

/// Names of every bit set in `word`, lowest bit first.
pub fn feature_names(kind: FeatureKind, word: u32) -> Vec<String> {
    (0..32).map(|i| 1u32 << i).filter(|b| word & b != 0).map(|b| feature_name(kind, b)).collect()
}

/// The feature bit e2fsprogs calls `name` (`e2p_string2feature`): the names above, the old
/// spellings `extents`, `gdt_csum` and `metadata_csum_seed`'s, and `FEATURE_C12`-style names.
pub fn feature_by_name(name: &str) -> Option<(FeatureKind, u32)> {
    let name = name.to_ascii_lowercase();
    let name = match name.as_str() {
        "extents" => "extent",
        "gdt_csum" => "uninit_bg",
        "snapshot_bitmap" | "exclude_bitmap" => "snapshot_bitmap",
        n => n,
    };
    for (kind, table) in [
        (FeatureKind::Compat, COMPAT_NAMES),
        (FeatureKind::Incompat, INCOMPAT_NAMES),
        (FeatureKind::RoCompat, RO_COMPAT_NAMES),
    ] {
        if let Some((bit, _)) = table.iter().find(|(_, n)| *n == name) {
            return Some((kind, *bit));
        }
    }
    let rest = name.strip_prefix("feature_")?;
    let kind = match rest.as_bytes().first()? {
        b'c' => FeatureKind::Compat,
        b'i' => FeatureKind::Incompat,
        b'r' => FeatureKind::RoCompat,
        _ => return None,
    };
    let n: u32 = rest[1..].parse().ok()?;
    (n < 32).then(|| (kind, 1u32 << n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_known_and_unknown_bits() {
        assert_eq!(feature_name(FeatureKind::RoCompat, 0x400), "metadata_csum");
        assert_eq!(feature_name(FeatureKind::Incompat, 1 << 31), "FEATURE_I31");
        assert_eq!(
            feature_names(FeatureKind::Incompat, 0x2 | 0x40 | 0x80),
            vec!["filetype", "extent", "64bit"]
        );
    }

    #[test]
    fn names_map_back_to_bits() {
        assert_eq!(feature_by_name("metadata_csum"), Some((FeatureKind::RoCompat, 0x400)));
        assert_eq!(feature_by_name("extents"), Some((FeatureKind::Incompat, 0x40)));
        assert_eq!(feature_by_name("FEATURE_I31"), Some((FeatureKind::Incompat, 1 << 31)));
        assert_eq!(feature_by_name("orphan_file"), Some((FeatureKind::Compat, 0x1000)));
        assert_eq!(feature_by_name("no_such"), None);
        assert_eq!(feature_by_name("feature_c32"), None);
    }
}
