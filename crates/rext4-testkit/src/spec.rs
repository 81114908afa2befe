//! What a generated source tree holds, and its well-known paths.

/// What to generate. All counts are exact; content is a function of `seed`.
#[derive(Clone, Debug)]
pub struct TreeSpec {
    pub seed: u64,
    /// Regular files spread over `dirs` nested directories under `tree/`.
    pub files: usize,
    pub dirs: usize,
    /// Entries in `bigdir/` (an htree directory once indexed).
    pub big_dir_entries: usize,
    /// Size of `big.bin` (random bytes).
    pub big_file: usize,
    /// Levels under `deep/`.
    pub deep: usize,
    /// `sparse/huge`: > 4 GiB apparent size, data around 4 GiB (triple-indirect territory
    /// for block maps) and near the end.
    pub huge_sparse: bool,
    /// Files that end in a hole (`sparse/tail_hole`, `sparse/all_hole`, and tails on the
    /// others). `mkfs.ext4` 1.47.0 `-d -O inline_data` mangles them: it rounds the size down
    /// to the end of the last data block, and makes an all-hole file an inline file.
    pub tail_holes: bool,
    /// Size of the one large `user.*` value (must fit an xattr block).
    pub big_xattr: usize,
    /// Number of small `user.*` attributes on `xattr/many`.
    pub many_xattrs: usize,
    /// Things only a kernel-written tree gets: fallocate'd (unwritten) ranges, punched holes,
    /// a hard-linked symlink (`mkfs.ext4 -d` does not keep symlink hard links).
    pub kernel_extras: bool,
}

impl TreeSpec {
    /// The default oracle tree: ~3,000 files, a 12,000-entry directory, a 20 MiB file.
    pub fn full() -> TreeSpec {
        TreeSpec {
            seed: 0x7265_7874_3421,
            files: 3000,
            dirs: 150,
            big_dir_entries: 12_000,
            big_file: 20 << 20,
            deep: 40,
            huge_sparse: true,
            tail_holes: true,
            big_xattr: 3000,
            many_xattrs: 20,
            kernel_extras: false,
        }
    }
    /// A smaller tree for the many feature variants (`mkfs.ext4 -d` inserts directory entries
    /// in quadratic time, so the big directory is what costs).
    pub fn medium() -> TreeSpec {
        TreeSpec { files: 1200, dirs: 80, big_dir_entries: 3000, big_file: 6 << 20, ..TreeSpec::full() }
    }
    /// The same with xattrs small enough for 1 KiB blocks, and a directory big enough for a
    /// two-level htree there.
    pub fn small_blocks(mut self) -> TreeSpec {
        self.big_dir_entries = 5000;
        self.big_xattr = 700;
        self.many_xattrs = 10;
        self
    }
}

/// Well-known paths in every generated tree (relative to its root).
pub mod paths {
    pub const FILE: &str = "file";
    pub const EMPTY: &str = "empty";
    pub const BIG: &str = "big.bin";
    pub const BIGDIR: &str = "bigdir";
    pub const SPARSE_HEAD: &str = "sparse/head_hole";
    pub const SPARSE_MULTI: &str = "sparse/multi";
    pub const SPARSE_TAIL: &str = "sparse/tail_hole";
    pub const SPARSE_ALL: &str = "sparse/all_hole";
    pub const SPARSE_FAR: &str = "sparse/far";
    pub const SPARSE_HUGE: &str = "sparse/huge";
    pub const LOOP_A: &str = "links/loop_a";
    pub const SELF_LOOP: &str = "links/self";
    /// `links/chain00` -> `chain01` -> ... -> `chain40` -> `../file`: 41 links from 00.
    pub const CHAIN_41: &str = "links/chain00";
    /// 40 links to `file`.
    pub const CHAIN_40: &str = "links/chain01";
    pub const DIR_LINK: &str = "links/to_deep";
    pub const XATTR_SMALL: &str = "xattr/small";
    pub const XATTR_BIG: &str = "xattr/big";
    pub const FALLOC_FULL: &str = "falloc/prealloc";
    pub const FALLOC_MIXED: &str = "falloc/mixed";
}
