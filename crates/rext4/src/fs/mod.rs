//! The filesystem object (`ext4_sb_info` and `super.c`): [`FsInner`] and the public [`Fs`],
//! the superblock, opening and closing, error recording, statistics.
//!
//! | module | owns |
//! |---|---|
//! | this file | `FsInner`, `Fs`, `Options`, the inode-level read API |
//! | `super_block` | reading the superblock, feature policy, geometry |
//! | `mount` | writable open (journal, orphans), sync, clean close |
//! | `errors` | errors recorded in the superblock, `errors=`, the op wrapper |
//! | `stats` | per-operation times, lock waits |
//!
//! # Locking
//! `FsInner`'s fields say what protects each; most are immutable after open. No lock here is
//! taken on the operation path but the superblock buffer's, joined to a handle.
//!
//! ## This module
//! The filesystem object and its inode-level API (what the FUSE adapter calls).

pub(crate) mod errors;
pub(crate) mod fast_commit;
pub(crate) mod label;
pub(crate) mod mmp;
pub(crate) mod mount;
pub(crate) mod stats;
pub(crate) mod super_block;

use crate::alloc::group::Groups;
use crate::attr::{Attr, DirEntry, StatFs};
use crate::cache::buffer::{Buffer, BufferCache};
use crate::cache::ShardedCache;
use crate::data::read::HostRange;
use crate::dev::BlockDevice;
use crate::error::{corrupt, CorruptKind, Error, Result};
use crate::fs::super_block::SbInfo;
use crate::inode::atime::{AtimeFacts, AtimeMode};
use crate::inode::Inode;
use rext4_format::superblock::Superblock;
use rext4_format::{InodeNo, PhysBlock};
use std::path::Path;
use std::sync::Arc;

/// How to open a filesystem.
#[derive(Clone, Debug)]
pub struct Options {
    /// Bytes of metadata blocks to cache (default: see [`Options::default`]).
    pub cache_bytes: usize,
    /// Bytes of file data to cache (default: see [`Options::default`]; 0 keeps none, and
    /// every read goes to the device).
    pub page_cache_bytes: usize,
    /// Inodes to cache (default: see [`Options::default`]; about 430 bytes each when cached).
    pub inode_cache: usize,
    /// Name lookups to cache (default: see [`Options::default`]; about 110 bytes each).
    pub name_cache: usize,
    /// Open for writing (default: read-only).
    pub writable: bool,
    /// How often the journal commits on its own (the kernel's `commit=`, default 5 s).
    pub commit_interval: std::time::Duration,
    /// Read-only opens only: show the image as it is, without replaying a journal that needs
    /// recovery (the kernel's `norecovery`).
    pub norecovery: bool,
    /// What corruption found while writable does (the kernel's `errors=`); `None` follows the
    /// superblock's setting, as the kernel does (see fs/errors.rs).
    pub errors: Option<ErrorBehavior>,
    /// New inodes take their directory's group, and set-group-ID directories pass nothing
    /// on (ext4's `grpid` / `bsdgroups` mount option; see [`crate::UserFs`]).
    pub grpid: bool,
    /// Writable opens with a journal: data blocks freed by a transaction are discarded on the
    /// device (a hole punched in an image file, `NBD_CMD_TRIM` on an NBD export) once that
    /// transaction has committed, before they can be allocated again (the kernel's `discard`
    /// mount option; default off, as there).
    pub discard: bool,
    /// Writable opens: writes into holes are kept in memory and given blocks when written
    /// back, for whole runs at once (the kernel's `delalloc`, its default; off:
    /// `nodelalloc`). Needs a page cache (`page_cache_bytes` > 0). See docs/pagecache.md.
    pub delalloc: bool,
    /// How long a delayed write may stay in memory before the flusher writes it back (the
    /// kernel's `dirty_expire_centisecs`, default 30 s). `fsync`, `sync` and unmount write
    /// back at once, and so does a writer when too much is dirty.
    pub dirty_expire: std::time::Duration,
    /// Percent of `page_cache_bytes` that may be dirty before a writer writes its own file
    /// back before going on (the kernel's `dirty_ratio`, there of memory; default 50).
    pub dirty_ratio: u8,
    /// Percent of `page_cache_bytes` dirty that wakes the flusher to write back the oldest
    /// files (the kernel's `dirty_background_ratio`; default 25). At or above `dirty_ratio`,
    /// nothing is written back early: writers meet the hard limit first.
    pub dirty_background_ratio: u8,
    /// When reads of files and directories set their access time (the kernel's `relatime`,
    /// its default; `noatime`; `strictatime`). Writable opens only: a read-only filesystem
    /// never changes. A file opened with `O_NOATIME` ([`crate::OpenFlags::NOATIME`]) and an
    /// inode with `NOATIME_FL` (`chattr +A`) keep theirs whatever this says.
    pub atime: AtimeMode,
    /// Reads of directories leave their access time alone (the kernel's `nodiratime`).
    pub nodiratime: bool,
    /// Writable opens: the quota types whose limits are enforced (`EDQUOT`; the kernel's
    /// `usrquota`, `grpquota` and `prjquota`; default none). Needs the `quota` feature. Usage
    /// is kept either way. See quota/limits.rs and [`crate::with_quota_limits_ignored`].
    pub quota_limits: crate::quota::limits::QuotaEnforcement,
    /// The journal device of a filesystem whose journal is on one of its own (made with
    /// `mkfs.ext4 -J device=`; the kernel's `journal_path=`): an image file or a block
    /// device. Needed to open such a filesystem for writing, and for reading when its journal
    /// needs recovery; refused for a filesystem without an external journal. See
    /// jbd2/external.rs.
    pub journal_path: Option<std::path::PathBuf>,
    /// Master keys of encrypted directories (`mkfs.ext4 -O encrypt`; what `fscrypt unlock`
    /// or `fscryptctl add_key` gives the kernel). Files whose key is not here are shown as
    /// the kernel shows them without it (crypto/mod.rs).
    pub encryption_keys: Vec<crate::crypto::EncryptionKey>,
}

/// What to do when an operation finds the image corrupt (the kernel's `errors=`). Either way
/// the error is recorded in the superblock and returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorBehavior {
    /// Go on taking changes (`errors=continue`).
    Continue,
    /// Refuse every later change with `EROFS`; reads go on (`errors=remount-ro`; the
    /// superblock's `panic` too, which a library cannot honour otherwise).
    RemountRo,
}

/// Cache bounds below which the defaults never go: 64 MiB of blocks, 262,144 inodes and names.
const MIN_CACHE_BYTES: usize = 64 << 20;
const MIN_CACHED: usize = 262_144;
/// What one cached inode and one cached name cost, with their share of the maps, rounded up.
const INODE_COST: usize = 512;
const NAME_COST: usize = 128;

/// The memory the default caches may grow to: an eighth of the machine's memory, or of the
/// cgroup's limit when that is lower. The kernel lets its page cache, dentries and inodes take
/// whatever memory is free and shrinks them under pressure; a process sees no such pressure, so
/// it takes a fixed share. Bounds fixed at a few hundred thousand entries made a run over more
/// files than that reload every inode and directory block from the image (docs/bench.md,
/// "After locality in the cache tables, the inode's layout and caches sized by memory").
/// Read once per process: every `Options::default()` would otherwise read a handful of files.
fn cache_budget() -> usize {
    static BUDGET: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let limits: Vec<String> =
            cgroup_limit_files().into_iter().filter_map(|f| std::fs::read_to_string(f).ok()).collect();
        budget_from(&meminfo, limits.iter().map(String::as_str))
    })
}

/// Where this process's cgroup memory limits are: cgroup v2's `memory.max` and v1's
/// `memory.limit_in_bytes`, for its own group (from `/proc/self/cgroup`) and at the mount's
/// root (what a container with its own cgroup namespace sees).
fn cgroup_limit_files() -> Vec<String> {
    let mut files = vec![
        "/sys/fs/cgroup/memory.max".to_string(),
        "/sys/fs/cgroup/memory/memory.limit_in_bytes".to_string(),
    ];
    // Lines are `ID:CONTROLLERS:PATH`; cgroup v2's has no controllers.
    for line in std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default().lines() {
        let Some((_, rest)) = line.split_once(':') else { continue };
        let Some((controllers, path)) = rest.split_once(':') else { continue };
        if path.len() > 1 && controllers.is_empty() {
            files.push(format!("/sys/fs/cgroup{path}/memory.max"));
        } else if path.len() > 1 && controllers.split(',').any(|c| c == "memory") {
            files.push(format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"));
        }
    }
    files
}

/// An eighth of `MemTotal` in `meminfo`, or of the lowest cgroup limit when that is lower
/// (v2 writes `max` for none, v1 a number near 2^63); 0 when the total cannot be read.
fn budget_from<'a>(meminfo: &str, limits: impl Iterator<Item = &'a str>) -> usize {
    let total = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<usize>().ok())
        .map_or(0, |kib| kib.saturating_mul(1024));
    let limit = limits.filter_map(|s| s.trim().parse::<usize>().ok()).min().unwrap_or(usize::MAX);
    total.min(limit) / 8
}

impl Default for Options {
    /// Read-only, commits every 5 s, and caches that may take an eighth of the machine's memory
    /// (or of the cgroup's limit): half for metadata blocks, three eighths for inodes, an eighth
    /// for names; at least 64 MiB of blocks and 262,144 inodes and names. The page cache may
    /// take as much again (the whole eighth, at least 64 MiB). Caches only grow as files are
    /// used: on a 24 GiB machine, 1.5 GiB of blocks, 2.2M inodes, 2.9M names and 3 GiB of
    /// file data.
    fn default() -> Self {
        let budget = cache_budget();
        Options {
            cache_bytes: (budget / 2).max(MIN_CACHE_BYTES),
            page_cache_bytes: budget.max(MIN_CACHE_BYTES),
            inode_cache: (budget / 8 * 3 / INODE_COST).max(MIN_CACHED),
            name_cache: (budget / 8 / NAME_COST).max(MIN_CACHED),
            writable: false,
            commit_interval: std::time::Duration::from_secs(5),
            norecovery: false,
            errors: None,
            grpid: false,
            discard: false,
            delalloc: true,
            dirty_expire: std::time::Duration::from_secs(30),
            dirty_ratio: 50,
            dirty_background_ratio: 25,
            atime: AtimeMode::Relatime,
            nodiratime: false,
            quota_limits: Default::default(),
            journal_path: None,
            encryption_keys: Vec::new(),
        }
    }
}

/// What the page cache holds and how reads used it ([`Fs::page_cache_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageCacheStats {
    /// Pages cached (one filesystem block each), current or left by an invalidation.
    pub pages: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Reads that missed and read a run of blocks from the device.
    pub misses: u64,
    /// Misses that followed the last one and read ahead.
    pub readahead: u64,
    /// Reads large enough to go straight to the device.
    pub direct_reads: u64,
    /// Large reads whose bytes were handed over where they lie in the image file
    /// ([`Fs::read_in_place`]), not read.
    pub spliced_reads: u64,
}

/// Delayed writes and their writeback ([`Fs::writeback_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WritebackStats {
    /// Dirty pages of delayed writes now, all files together.
    pub dirty_pages: u64,
    /// Blocks reserved for the dirty pages over holes (delayed allocation's reservations;
    /// pages over preallocated blocks need none).
    pub delalloc_blocks: u64,
    /// Files with something to write back now.
    pub dirty_files: u64,
    /// Blocks written back since the filesystem was opened.
    pub written_blocks: u64,
    /// Writebacks of one file (by `fsync`, `sync`, the flusher, a throttled writer, or an
    /// operation that edits the map).
    pub writebacks: u64,
    /// Time spent writing back, in nanoseconds.
    pub writeback_ns: u64,
    /// Writes that found too much dirty and wrote their own file back (the hard limit).
    pub throttled: u64,
    /// Rounds of the flusher that found files to look at.
    pub flusher_rounds: u64,
}

/// Shared state behind every [`Fs`] handle.
pub(crate) struct FsInner {
    pub dev: Arc<dyn BlockDevice>,
    /// Geometry and policy. [immutable]
    pub sbi: SbInfo,
    /// Group descriptors and live group counts. [see alloc/group.rs]
    pub groups: Arc<Groups>,
    /// Filesystem-wide free counts. [sharded atomics]
    pub counters: Arc<crate::alloc::counter::Counters>,
    /// Metadata blocks. [sharded, see cache/mod.rs]
    pub bcache: Arc<BufferCache>,
    /// The block holding the superblock, held for the filesystem's life: allocations, frees
    /// and orphan-list changes join it to their transaction without a cache lookup (see
    /// `touch_group_desc`). [immutable; contents under the buffer's lock]
    pub sb_buf: Arc<Buffer>,
    /// Inodes. [sharded, see cache/mod.rs]
    pub icache: ShardedCache<Inode>,
    /// File data. [sharded, see cache/page.rs]
    pub pcache: crate::cache::page::PageCache,
    /// Blocks set aside for files' appends, all groups together, and the count of discards of
    /// them all (alloc/prealloc.rs). [atomics]
    pub pa_blocks: std::sync::atomic::AtomicU64,
    pub pa_epoch: std::sync::atomic::AtomicU64,
    /// Dirty pages of delayed writes and their writeback (data/writeback.rs). [see there]
    pub wb: crate::data::writeback::Writeback,
    /// Name lookups. [sharded, see cache/dcache.rs]
    pub dcache: crate::cache::dcache::Dcache,
    /// Xattr blocks by hash, for sharing. [sharded, see cache/mbcache.rs]
    pub xattr_cache: crate::cache::mbcache::MbCache,
    /// EA inodes by value hash. [sharded, see cache/mbcache.rs]
    pub ea_inode_cache: crate::cache::mbcache::MbCache,
    /// Held by cross-directory renames only (the kernel's `s_vfs_rename_mutex`). [own lock]
    pub rename_lock: crate::sync::Mutex<()>,
    /// The journal (also present, without a log, for unjournaled images); `None` when
    /// read-only. [immutable after open]
    pub journal: Option<Arc<crate::jbd2::journal::Journal>>,
    /// The commit thread. [own lock; taken at close]
    pub committer: crate::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    /// What journal recovery at open replayed, if the image needed it. [immutable]
    pub recovery: Option<crate::RecoveryReport>,
    /// Orphan records (see inode/orphan.rs). [immutable after open; its own locks inside]
    pub orphans: Arc<crate::inode::orphan::Orphans>,
    /// Operation times and lock waits (`Fs::stats`), shared with the journal. [sharded atomics]
    pub stats: Arc<crate::fs::stats::Stats>,
    /// What corruption does (`Options::errors`, or the superblock's). [immutable]
    pub errors: ErrorBehavior,
    /// Set once an error stopped changes (`errors=remount-ro`; see fs/errors.rs). [atomic]
    pub stopped: std::sync::atomic::AtomicBool,
    /// Set once an aborted journal is recorded in the superblock (see fs/errors.rs). [atomic]
    pub abort_recorded: std::sync::atomic::AtomicBool,
    /// Metadata blocks no inode may name (see map/block_validity.rs). [immutable after open]
    pub zones: crate::map::block_validity::SystemZones,
    /// File locks (see locks/mod.rs). [per-inode mutexes inside]
    pub locks: crate::locks::FileLocks,
    /// `Options::grpid`. [immutable]
    pub grpid: bool,
    /// `Options::atime` and `Options::nodiratime` (inode/atime.rs). [immutable]
    pub atime: AtimeMode,
    pub nodiratime: bool,
    /// Inode times from the coarse clock (`Fs::set_coarse_time`). [atomic]
    pub coarse_time: std::sync::atomic::AtomicBool,
    /// Data writes leave mtime and ctime to the caller (`Fs::set_caller_write_times`).
    /// [atomic]
    pub caller_write_times: std::sync::atomic::AtomicBool,
    /// Quota files kept on writes (quota/mod.rs). [set at the writable open; locks inside]
    pub quota: crate::quota::Quotas,
    /// Multi-mount protection of a writable open of an `mmp` image (fs/mmp.rs). [immutable
    /// after open; its own lock inside]
    pub mmp: Option<mmp::Mmp>,
    /// The journal's own device, where the filesystem's journal is external (jbd2/external.rs).
    /// [immutable after open]
    pub ext_journal: Option<Arc<crate::jbd2::external::ExternalJournal>>,
    /// `Options::encryption_keys`, and the keys added and removed since
    /// (crypto/keysetup.rs, crypto/keyring.rs). [own lock and atomic generation]
    pub keyring: crate::crypto::keysetup::Keyring,
}

/// An open ext4 filesystem. Cheap to clone; every clone is the same filesystem, and all
/// methods may be called from many threads at once.
#[derive(Clone)]
pub struct Fs {
    pub(crate) inner: Arc<FsInner>,
}

impl Fs {
    /// Opens the image or block device at `path` read-only with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Fs> {
        Self::open_with(path, Options::default())
    }

    /// Opens the image or block device at `path` for reading and writing.
    pub fn open_rw(path: impl AsRef<Path>) -> Result<Fs> {
        Self::open_with(path, Options { writable: true, ..Options::default() })
    }

    /// Opens the image or block device at `path` as `opts` say. `path` may also be an
    /// address (see [`crate::dev::address`]): a partition (`disk.img@2`) or an NBD export
    /// (`nbd://host/export`, `nbd+unix:///export?socket=PATH`).
    pub fn open_with(path: impl AsRef<Path>, opts: Options) -> Result<Fs> {
        let path = path.as_ref();
        let dev = crate::dev::open(path, opts.writable)?;
        Self::open_device(dev, opts, path.as_os_str().as_encoded_bytes())
    }

    /// Opens a filesystem on any block device.
    /// A journal that needs recovery is replayed first: onto the device when writing, in
    /// memory when reading (the device is not modified).
    pub fn from_device(dev: Arc<dyn BlockDevice>, opts: Options) -> Result<Fs> {
        Self::open_device(dev, opts, b"")
    }

    /// [`Fs::from_device`] for a device named `name` (what multi-mount protection records).
    fn open_device(dev: Arc<dyn BlockDevice>, opts: Options, name: &[u8]) -> Result<Fs> {
        let sbi = SbInfo::load(&*dev)?;
        if opts.norecovery && opts.writable {
            return Err(Error::InvalidInput("norecovery is for read-only opens"));
        }
        if opts.writable {
            // Before recovery writes anything, as the kernel checks the features first.
            sbi.check_writable()?;
        }
        // Multi-mount protection, also before recovery: another machine may be writing.
        let (dev, mmp) = match opts.writable {
            true => mmp::Mmp::protect_if_needed(dev, &sbi, name)?,
            false => (dev, None),
        };
        let journal = crate::jbd2::replay::open_external(opts.journal_path.as_deref(), &sbi, opts.writable)?;
        let recovered = if opts.norecovery {
            crate::jbd2::replay::Recovered { dev, sbi, report: None, fast_commits: Vec::new(), journal }
        } else {
            crate::jbd2::replay::recover_at_open(dev, sbi, opts.writable, journal)?
        };
        Self::start(recovered, &opts, mmp)
    }

    /// The filesystem on a recovered device, made writable (with the fast commits applied)
    /// when `opts` say, under multi-mount protection `mmp` where it has the feature.
    fn start(recovered: crate::jbd2::replay::Recovered, opts: &Options, mmp: Option<mmp::Mmp>) -> Result<Fs> {
        let crate::jbd2::replay::Recovered { dev, sbi, report, fast_commits, journal } = recovered;
        let mut inner = FsInner::new(dev, sbi, opts)?;
        inner.recovery = report;
        inner.ext_journal = journal;
        inner.protect_journal();
        inner.protect_mmp(opts.writable)?;
        inner.mmp = mmp;
        if opts.writable {
            inner.start_writing(opts, &fast_commits)?;
        }
        let inner = Arc::new(inner);
        crate::data::writeback::start_flusher(&inner)?;
        Ok(Fs { inner })
    }

    /// Recovers the image on `cow`, a copy-on-write view, as a writable open would (the logged
    /// blocks, then the fast commits), whatever keeps the image itself read-only, and closes it
    /// clean: how a read-only open applies fast commits (jbd2/replay.rs).
    pub(crate) fn replay_in_memory(
        cow: Arc<dyn BlockDevice>,
        journal: Option<Arc<crate::jbd2::external::ExternalJournal>>,
    ) -> Result<()> {
        let sbi = SbInfo::load(&*cow)?;
        let mut recovered = crate::jbd2::replay::recover_at_open(cow, sbi, true, journal)?;
        recovered.sbi.ro_reasons.clear();
        Self::start(recovered, &Options { writable: true, ..Options::default() }, None)?.unmount()
    }

    /// What journal recovery replayed when this filesystem was opened; `None` if the image
    /// did not need recovery.
    pub fn recovery(&self) -> Option<&crate::RecoveryReport> {
        self.inner.recovery.as_ref()
    }

    /// The superblock as read at open.
    pub fn superblock(&self) -> &Superblock {
        &self.inner.sbi.sb
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.inner.sbi.block_size
    }

    /// Allocation unit in bytes: the cluster of a `bigalloc` filesystem, else the block.
    /// Collapse and insert range take whole ones.
    pub fn cluster_size(&self) -> u64 {
        self.inner.sbi.cluster_bytes()
    }

    /// Why this filesystem could only be opened read-only (unknown ro_compat features, ...).
    pub fn read_only_reasons(&self) -> &[String] {
        self.inner.sbi.read_only_reasons()
    }

    /// The root directory's inode number.
    pub fn root(&self) -> InodeNo {
        rext4_format::types::ROOT_INO
    }

    /// Attributes of inode `ino`.
    pub fn getattr(&self, ino: InodeNo) -> Result<Attr> {
        self.inner.op(crate::fs::stats::Op::Getattr, || {
            self.inner.iget_by_number(ino).and_then(|inode| self.inner.attr_of(&inode))
        })
    }

    /// The attributes of inode `ino` named by a file handle (NFS export, `open_by_handle_at`,
    /// a FUSE `LOOKUP` of "."): `ESTALE` for a number no file can have (reserved inodes but
    /// the root, out of range) or one not in use, as ext4's `ext4_nfs_get_inode`. The caller
    /// compares the generation.
    pub fn getattr_by_handle(&self, ino: InodeNo) -> Result<Attr> {
        self.inner.op(crate::fs::stats::Op::Getattr, || {
            if ino.0 < self.inner.sbi.sb.first_ino() && ino != rext4_format::types::ROOT_INO {
                return Err(Error::Stale);
            }
            self.inner.iget_by_number(ino).and_then(|inode| self.inner.attr_of(&inode))
        })
    }

    /// Whether directory `dir` finds names by their folded form (`chattr +F` on an image with
    /// `casefold`): `Foo` there is the entry `foo`. A cache of names by their bytes (the
    /// kernel's, in front of the mount) must not keep this directory's.
    pub fn folds_names(&self, dir: InodeNo) -> bool {
        self.inner.sbi.casefold
            && self
                .inner
                .iget_by_number(dir)
                .is_ok_and(|d| self.inner.is_casefolded(&d) || self.inner.hash_in_dirent(&d))
    }

    /// Looks `name` up in directory `dir`; returns the entry's inode attributes.
    pub fn lookup(&self, dir: InodeNo, name: &[u8]) -> Result<Attr> {
        self.inner.op(crate::fs::stats::Op::Lookup, || {
            let d = self.inner.iget_dir(dir)?;
            let inode = match self.inner.lookup(&d, name) {
                // The name may have been removed (and its inode freed) since it was found: look
                // again with removals held off; only an entry still naming a free inode is
                // corrupt.
                Err(Error::Corrupt(_)) if self.inner.journal.is_some() => {
                    let _l = self.inner.stats.lock(crate::fs::stats::LockClass::OpLock, &d.op_lock);
                    self.inner.lookup(&d, name)?
                }
                r => r?,
            };
            self.inner.attr_of(&inode)
        })
    }

    /// Reads directory entries from position `pos` (0 to start; then an entry's `next`),
    /// calling `f` for each until it returns `false` or the directory ends. `.` and `..` are
    /// included.
    ///
    /// Like `getdents(2)`, each call sets the directory's access time as
    /// [`Options::atime`] says ([`Fs::readdir_noatime`] does not).
    pub fn readdir(&self, dir: InodeNo, pos: u64, f: impl FnMut(DirEntry) -> bool) -> Result<()> {
        self.readdir_touching(dir, pos, f, true)
    }

    /// [`Fs::readdir`] leaving the access time alone, as a directory opened with
    /// `O_NOATIME` is read.
    pub fn readdir_noatime(&self, dir: InodeNo, pos: u64, f: impl FnMut(DirEntry) -> bool) -> Result<()> {
        self.readdir_touching(dir, pos, f, false)
    }

    fn readdir_touching(
        &self,
        dir: InodeNo,
        pos: u64,
        f: impl FnMut(DirEntry) -> bool,
        touch: bool,
    ) -> Result<()> {
        self.inner.op(crate::fs::stats::Op::Readdir, || {
            let d = self.inner.iget_dir(dir)?;
            let facts = (touch && self.inner.atime_may_change())
                .then(|| d.with_disk(|r| AtimeFacts::of(r, self.inner.sbi.inode_size)));
            self.inner.readdir_shown(&d, pos, f)?;
            // After the listing, as `iterate_dir` calls `file_accessed`.
            if let Some(facts) = facts {
                self.inner.touch_atime(&d, &facts);
            }
            Ok(())
        })
    }

    /// Reads up to `buf.len()` bytes at `offset` of a regular file; returns the count (0 at or
    /// past the end). Like `read(2)`, sets the file's access time as [`Options::atime`] says
    /// ([`Fs::read_noatime`] does not).
    pub fn read(&self, ino: InodeNo, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.inner.op(crate::fs::stats::Op::Read, || {
            self.inner.iget_by_number(ino).and_then(|inode| self.inner.read(&inode, offset, buf, true))
        })
    }

    /// Where the `len` bytes of regular file `ino` from `offset` lie in the image file, handed
    /// to `f` while no write can change them: what a large [`Fs::read`] would read, for a
    /// caller that moves the bytes on without reading them (the mount's daemon splices them
    /// into its reply). The ranges are clipped at the end of the file (none at or past it).
    /// `None`, and `f` not called, where a read would take anything else (reads under 64 KiB,
    /// which the page cache serves; holes, unwritten extents, delayed writes, inline data; a
    /// device that is no host file): the caller then reads. With `touch`, sets the access
    /// time as [`Fs::read`] does.
    pub fn read_in_place<R>(
        &self,
        ino: InodeNo,
        offset: u64,
        len: usize,
        touch: bool,
        f: impl FnOnce(&[HostRange<'_>]) -> R,
    ) -> Result<Option<R>> {
        // Short reads before anything is looked up or counted: every read through the mount
        // asks, and most of them are short.
        if !crate::data::read::may_read_in_place(len) {
            return Ok(None);
        }
        let op = crate::fs::stats::Op::Read;
        let mut timed = self.inner.stats.time(op);
        let r = self.inner.noting(op, || {
            let inode = self.inner.iget_by_number(ino)?;
            self.inner.read_in_place(&inode, offset, len, touch, f)
        });
        if matches!(r, Ok(None)) {
            // The caller reads instead, and that read is the one counted.
            timed.forget();
        }
        r
    }

    /// [`Fs::read`] leaving the access time alone, as a file opened with `O_NOATIME` is read.
    pub fn read_noatime(&self, ino: InodeNo, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.inner.op(crate::fs::stats::Op::Read, || {
            self.inner.iget_by_number(ino).and_then(|inode| self.inner.read(&inode, offset, buf, false))
        })
    }

    /// Whether a [`Fs::read`] of `ino` now would set its access time, by [`Options::atime`]
    /// and the times it holds. A cache that answers reads without the engine (the kernel's,
    /// in front of the mount) asks this to send a read through where ext4 would set the time.
    pub fn read_would_set_atime(&self, ino: InodeNo) -> Result<bool> {
        // Under noatime or read-only, no inode to look up at every open.
        if !self.inner.atime_may_change() {
            return Ok(false);
        }
        // Asked at an open: counted as one.
        self.inner.op(crate::fs::stats::Op::Open, || {
            self.inner.iget_by_number(ino).map(|inode| self.inner.read_would_set_atime(&inode))
        })
    }

    /// The target of a symbolic link. Like `readlink(2)`, sets the link's access time as
    /// [`Options::atime`] says ([`Fs::readlink_noatime`] does not).
    pub fn readlink(&self, ino: InodeNo) -> Result<Vec<u8>> {
        self.inner.op(crate::fs::stats::Op::Readlink, || {
            self.inner.iget_by_number(ino).and_then(|inode| self.inner.readlink_touching(&inode, true))
        })
    }

    /// [`Fs::readlink`] leaving the access time alone (tree walkers that copy or list).
    pub fn readlink_noatime(&self, ino: InodeNo) -> Result<Vec<u8>> {
        self.inner.op(crate::fs::stats::Op::Readlink, || {
            self.inner.iget_by_number(ino).and_then(|inode| self.inner.readlink_touching(&inode, false))
        })
    }

    /// The value of extended attribute `name` (full name, e.g. `user.foo`).
    pub fn getxattr(&self, ino: InodeNo, name: &[u8]) -> Result<Vec<u8>> {
        self.inner.op(crate::fs::stats::Op::Getxattr, || {
            self.inner.iget_by_number(ino).and_then(|inode| self.inner.getxattr(&inode, name))
        })
    }

    /// The names of the inode's extended attributes.
    pub fn listxattr(&self, ino: InodeNo) -> Result<Vec<Vec<u8>>> {
        self.inner.op(crate::fs::stats::Op::Listxattr, || {
            self.inner.iget_by_number(ino).and_then(|inode| self.inner.listxattr(&inode))
        })
    }

    /// Filesystem-wide counts, as `statfs(2)` reports them.
    pub fn statfs(&self) -> Result<StatFs> {
        let _t = self.inner.stats.time(crate::fs::stats::Op::Statfs);
        Ok(self.inner.statfs())
    }

    /// `statfs(2)` of a path within inode `ino`: the filesystem's counts, or a project's where
    /// `ino` is a directory that passes its project on and project limits are enforced
    /// (`ext4_statfs_project`: `df` in a project directory shows its quota).
    pub fn statfs_at(&self, ino: InodeNo) -> Result<StatFs> {
        let _t = self.inner.stats.time(crate::fs::stats::Op::Statfs);
        let mut st = self.inner.statfs();
        // An inode gone meanwhile is in no project: the filesystem's counts.
        if let Ok(inode) = self.inner.iget_by_number(ino) {
            self.inner.quota_statfs_project(&inode, &mut st)?;
        }
        Ok(st)
    }

    /// `FITRIM`: tells the device that the free blocks of `len` bytes from byte `start`, in
    /// runs of at least `minlen` bytes, hold nothing (an image file gets them punched out);
    /// returns the bytes discarded. Errors as ext4's: `EINVAL` for a start past the end, a
    /// length under a block or a minimum over a group; `EROFS` read-only.
    pub fn trim(&self, start: u64, len: u64, minlen: u64) -> Result<u64> {
        let _t = self.inner.stats.time(crate::fs::stats::Op::Trim);
        self.inner.trim_fs(start, len, minlen)
    }

    /// Drops every cached block and inode that is not in use.
    pub fn drop_caches(&self) {
        self.inner.bcache.shrink();
        self.inner.icache.shrink();
        self.inner.pcache.shrink();
    }

    /// Numbers of cached metadata blocks and inodes.
    pub fn cache_counts(&self) -> (usize, usize) {
        (self.inner.bcache.len(), self.inner.icache.len())
    }

    /// Delayed writes: what is dirty now, and what writeback did so far.
    pub fn writeback_stats(&self) -> WritebackStats {
        let wb = &self.inner.wb;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        WritebackStats {
            dirty_pages: get(&wb.pages),
            delalloc_blocks: self.inner.sbi.c2b(get(&wb.dirty_blocks)),
            dirty_files: wb.files_listed(),
            written_blocks: get(&wb.stats.blocks),
            writebacks: get(&wb.stats.files),
            writeback_ns: get(&wb.stats.nanos),
            throttled: get(&wb.stats.throttled),
            flusher_rounds: get(&wb.stats.flusher_rounds),
        }
    }

    /// The page cache's figures: pages held and how reads used it.
    pub fn page_cache_stats(&self) -> PageCacheStats {
        let p = &self.inner.pcache;
        let pages = p.len();
        let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        PageCacheStats {
            pages,
            bytes: pages as u64 * u64::from(self.inner.sbi.block_size),
            misses: get(&p.stats.misses),
            readahead: get(&p.stats.readahead),
            direct_reads: get(&p.stats.direct),
            spliced_reads: get(&p.stats.spliced),
        }
    }
}

impl FsInner {
    /// A read-only filesystem over `dev`, whose superblock `sbi` was loaded from it.
    pub(crate) fn new(dev: Arc<dyn BlockDevice>, sbi: SbInfo, opts: &Options) -> Result<FsInner> {
        let bcache = Arc::new(BufferCache::new(dev.clone(), sbi.block_size as usize, opts.cache_bytes));
        let groups = Arc::new(Groups::load(&sbi, &bcache)?);
        let sb_buf = bcache.get(sbi.sb_location().0)?;
        let errors = opts.errors.unwrap_or(match sbi.sb.s_errors.get() {
            rext4_format::superblock::ERRORS_RO | rext4_format::superblock::ERRORS_PANIC => {
                ErrorBehavior::RemountRo
            }
            _ => ErrorBehavior::Continue,
        });
        let (free_blocks, free_inodes, dirs) = groups.totals();
        let zones =
            crate::map::block_validity::SystemZones::build(&sbi, &groups, |g| sbi.base_meta_blocks(g));
        let counters = Arc::new(crate::alloc::counter::Counters {
            free_blocks: crate::alloc::counter::ShardedCounter::new(free_blocks as i64),
            free_inodes: crate::alloc::counter::ShardedCounter::new(free_inodes as i64),
            dirs: crate::alloc::counter::ShardedCounter::new(dirs as i64),
        });
        let pcache = crate::cache::page::PageCache::new(opts.page_cache_bytes, sbi.block_size as usize);
        let wb = crate::data::writeback::Writeback::new(
            opts.delalloc && opts.writable && opts.page_cache_bytes > 0,
            crate::data::writeback::DirtyLimits {
                page_cache_bytes: opts.page_cache_bytes,
                block_size: sbi.block_size,
                ratio: opts.dirty_ratio,
                background_ratio: opts.dirty_background_ratio,
            },
            opts.dirty_expire,
        );
        Ok(FsInner {
            dev,
            sbi,
            groups,
            counters,
            bcache,
            sb_buf,
            icache: ShardedCache::new(opts.inode_cache, 512),
            pcache,
            pa_blocks: std::sync::atomic::AtomicU64::new(0),
            pa_epoch: std::sync::atomic::AtomicU64::new(0),
            wb,
            dcache: crate::cache::dcache::Dcache::new(opts.name_cache),
            xattr_cache: crate::cache::mbcache::MbCache::new(4096),
            ea_inode_cache: crate::cache::mbcache::MbCache::new(4096),
            rename_lock: crate::sync::Mutex::new(()),
            journal: None,
            committer: crate::sync::Mutex::new(None),
            recovery: None,
            orphans: Arc::new(crate::inode::orphan::Orphans::inactive()),
            stats: Arc::default(),
            errors,
            stopped: std::sync::atomic::AtomicBool::new(false),
            abort_recorded: std::sync::atomic::AtomicBool::new(false),
            coarse_time: std::sync::atomic::AtomicBool::new(false),
            caller_write_times: std::sync::atomic::AtomicBool::new(false),
            quota: crate::quota::Quotas::default(),
            mmp: None,
            ext_journal: None,
            zones,
            locks: crate::locks::FileLocks::default(),
            grpid: opts.grpid,
            atime: opts.atime,
            nodiratime: opts.nodiratime,
            keyring: crate::crypto::keysetup::Keyring::new(&opts.encryption_keys),
        })
    }

    /// Reads metadata block `blk` through the cache, refusing blocks outside the filesystem.
    pub(crate) fn bread(&self, blk: u64, ino: Option<InodeNo>) -> Result<Arc<Buffer>> {
        if blk < self.sbi.first_data_block || blk >= self.sbi.blocks_count {
            return corrupt(CorruptKind::BlockRange { ino, block: PhysBlock(blk) });
        }
        self.bcache.get(blk)
    }

    fn statfs(&self) -> StatFs {
        let sbi = &self.sbi;
        let (free_clusters, free_inodes, _) = self.groups.totals();
        let free_blocks = sbi.c2b(free_clusters);
        let overhead = self.overhead();
        let sb = &sbi.sb;
        // The root-reserved blocks and the kernel's own slack for extent splits and unwritten
        // conversions are not available.
        let reserved = sb.r_blocks_count() + self.meta_slack();
        // Blocks reserved for dirty pages are spoken for (the kernel's statfs subtracts its
        // dirty clusters).
        let free_blocks = free_blocks
            .saturating_sub(sbi.c2b(self.wb.dirty_blocks.load(std::sync::atomic::Ordering::Acquire)));
        let uuid = &sb.s_uuid;
        // Cannot fail: both halves are 8 bytes of a 16-byte array.
        let fsid = u64::from_le_bytes(uuid[..8].try_into().unwrap())
            ^ u64::from_le_bytes(uuid[8..].try_into().unwrap());
        StatFs {
            block_size: sbi.block_size,
            blocks: sbi.blocks_count.saturating_sub(overhead),
            blocks_free: free_blocks,
            blocks_avail: free_blocks.saturating_sub(reserved),
            files: u64::from(sbi.inodes_count),
            files_free: free_inodes,
            name_max: 255,
            fsid,
        }
    }

    /// Blocks taken by metadata, as the kernel's `ext4_calculate_overhead` counts them.
    fn overhead(&self) -> u64 {
        let sbi = &self.sbi;
        let stored = u64::from(sbi.sb.s_overhead_clusters.get());
        if stored != 0 {
            return sbi.c2b(stored);
        }
        if sbi.cluster_bits > 0 {
            // Each cluster that holds any metadata is lost whole (`count_overhead`).
            let journal = self.journal_blocks().unwrap_or(0).div_ceil(sbi.c2b(1));
            return sbi.c2b(self.zones.meta_clusters(sbi.cluster_bits) + journal);
        }
        let mut total = sbi.first_data_block;
        for g in 0..sbi.group_count {
            total += u64::from(sbi.group_has_super(g)) + self.gdt_blocks_in(g) + sbi.inode_table_blocks + 2;
        }
        if let Some(j) = self.journal_blocks() {
            total += j;
        }
        total
    }

    /// Descriptor blocks stored in group `g` (`ext4_bg_num_gdb`).
    fn gdt_blocks_in(&self, g: u32) -> u64 {
        let sbi = &self.sbi;
        let meta_bg = sbi.sb.incompat().contains(rext4_format::features::Incompat::META_BG);
        let first_meta_bg = sbi.sb.s_first_meta_bg.get();
        let metagroup = g / sbi.descs_per_block;
        if !meta_bg || metagroup < first_meta_bg {
            if !sbi.group_has_super(g) {
                0
            } else if meta_bg {
                u64::from(first_meta_bg)
            } else {
                sbi.gdt_blocks
            }
        } else {
            let first = metagroup * sbi.descs_per_block;
            let last = first + sbi.descs_per_block - 1;
            u64::from(g == first || g == first + 1 || g == last)
        }
    }

    /// Length of the internal journal in blocks, if there is one.
    fn journal_blocks(&self) -> Option<u64> {
        let sb = &self.sbi.sb;
        if !sb.compat().contains(rext4_format::features::Compat::HAS_JOURNAL) {
            return None;
        }
        let ino = sb.s_journal_inum.get();
        if ino == 0 {
            return None;
        }
        let inode = self.iget(InodeNo(ino)).ok()?;
        Some(inode.size() / u64::from(self.sbi.block_size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_caches_take_an_eighth_of_memory() {
        let info = "MemTotal:       25165824 kB\nMemFree:        20000000 kB\n";
        let none = std::iter::empty;
        assert_eq!(budget_from(info, none()), 3 << 30);
        assert_eq!(budget_from(info, ["max\n", "9223372036854771712\n"].into_iter()), 3 << 30);
        assert_eq!(budget_from(info, ["max\n", "1073741824\n", "2147483648"].into_iter()), 128 << 20);
        assert_eq!(budget_from("", ["max"].into_iter()), 0);
        assert_eq!(budget_from("MemTotal: lots\n", none()), 0);
        // Never below the floors, whatever the machine.
        let o = Options::default();
        assert!(
            o.cache_bytes >= MIN_CACHE_BYTES && o.inode_cache >= MIN_CACHED && o.name_cache >= MIN_CACHED
        );
    }
}
