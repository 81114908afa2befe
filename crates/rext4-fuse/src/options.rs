//! Mount options: what `-o` accepts, and how each one becomes an engine option, a kernel mount
//! option or an adapter setting.

use std::time::Duration;

/// What to do when corruption is found while mounted (the kernel's `errors=`): the engine's
/// setting, which the adapter applies too (errno.rs).
pub use rext4::ErrorBehavior;

/// Everything `rext4 mount -o ...` can say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountOptions {
    /// Mount read-only (`ro`); `rw` is the default.
    pub read_only: bool,
    /// Let users other than the one who mounted use the mount (`allow_other`).
    pub allow_other: bool,
    /// Let the kernel check permissions from the mode bits (`default_permissions`, on unless
    /// `nodefault_permissions` is given).
    pub default_permissions: bool,
    /// Journal commit interval (`commit=SECONDS`); `None` keeps the engine's default.
    pub commit: Option<Duration>,
    /// `errors=`; `None` follows the superblock's setting, as the kernel does.
    pub errors: Option<ErrorBehavior>,
    /// Let the kernel cache writes (`writeback_cache`).
    pub writeback_cache: bool,
    /// Take requests through FUSE-over-io_uring queues where the kernel offers them (the fuse
    /// module's `enable_uring`), /dev/fuse reads otherwise. `None` (the default): so, quietly;
    /// `Some(true)` (`io_uring`): so, saying when the kernel does not offer it; `Some(false)`
    /// (`noio_uring`): /dev/fuse reads only.
    pub io_uring: Option<bool>,
    /// Large reads answered by splicing the file's blocks from the image into the reply
    /// (`splice`, the default; `nosplice` reads them through the daemon's memory).
    pub splice: bool,
    /// Worker threads reading requests (`threads=N`); `None` is one per core.
    pub threads: Option<usize>,
    /// The source shown in the mount table (`fsname=`); the image path by default.
    pub fsname: Option<String>,
    /// The mount table's type is `fuse.SUBTYPE` (`subtype=`; `rext4` by default, so mount(8)
    /// finds `mount.fuse.rext4`); `subtype=` with nothing shows plain `fuse`, as a libfuse
    /// daemon mounted without one does (what xfstests' `FSTYP=fuse` expects).
    pub subtype: String,
    /// Do not replay the journal (`norecovery`, read-only mounts only).
    pub norecovery: bool,
    /// The journal device of a filesystem whose journal is on one of its own
    /// (`journal_path=PATH`, as the kernel's option; an image file or a block device).
    pub journal_path: Option<std::path::PathBuf>,
    /// Master keys of encrypted directories (`key=FILE`, raw key bytes, for v2 policies;
    /// `key_v1=DESCRIPTOR:FILE` for v1 ones; each may be given more than once).
    pub keys: Vec<rext4::EncryptionKey>,
    /// Bytes of metadata to cache (`cache=MiB`); `None` keeps the engine's default.
    pub cache_bytes: Option<usize>,
    /// POSIX ACLs enforced and inherited (`acl`, the default, or `noacl`).
    pub acl: bool,
    /// Access-time updates (`relatime`, the default, `noatime`, `strictatime`).
    pub atime: Atime,
    /// No access-time updates on directories (`nodiratime`).
    pub nodiratime: bool,
    /// Every change durable before it returns (`sync`, ext4's meaning: the daemon commits
    /// after each namespace or attribute change, and the kernel fsyncs after each write).
    pub sync: bool,
    /// Directory changes durable before they return (`dirsync`).
    pub dirsync: bool,
    /// New inodes take their directory's group (`grpid`, `bsdgroups`; the default is
    /// `nogrpid`: the creator's group unless the directory is set-group-ID).
    pub grpid: bool,
    /// Freed blocks are discarded on the device after their commit (`discard`; default
    /// `nodiscard`; see `rext4::Options::discard`).
    pub discard: bool,
    /// Writes into holes wait in memory and get their blocks at writeback (`delalloc`, the
    /// default; `nodelalloc`; see `rext4::Options::delalloc`).
    pub delalloc: bool,
    /// Who answers `fcntl` and `flock` locks (`locks=kernel`, the default, or `locks=engine`).
    pub locks: LockMode,
    /// Quota types whose limits are enforced (`usrquota` or `quota`, `grpquota`, `prjquota`;
    /// `noquota` none, the default). Needs an image with the quota feature; usage is kept on
    /// such images either way (see `rext4::Options::quota_limits`).
    pub quota: rext4::QuotaEnforcement,
    /// Generic mount flags passed on to the kernel (`noatime`, `nodev`, `noexec`, ...).
    pub kernel_flags: Vec<String>,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            read_only: false,
            allow_other: false,
            default_permissions: true,
            commit: None,
            errors: None,
            writeback_cache: false,
            io_uring: None,
            splice: true,
            threads: None,
            fsname: None,
            subtype: "rext4".into(),
            norecovery: false,
            journal_path: None,
            keys: Vec::new(),
            cache_bytes: None,
            acl: true,
            atime: Atime::Relatime,
            nodiratime: false,
            sync: false,
            dirsync: false,
            grpid: false,
            discard: false,
            delalloc: true,
            locks: LockMode::Kernel,
            quota: rext4::QuotaEnforcement::default(),
            kernel_flags: Vec::new(),
        }
    }
}

/// Where `fcntl` locks on the mount live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// The kernel's own lock table for the mount: the daemon never hears of locks. Fast, and
    /// right for every process using this mount.
    Kernel,
    /// The engine's lock table (POSIX, OFD and flock locks through `GETLK`/`SETLK`/
    /// `SETLKW`), so the locks are the same ones the library's users of the image take (see
    /// docs/fuse.md).
    Engine,
}

/// When reads set access times: the mount's VFS flags, and the engine's
/// [`rext4::AtimeMode`], which applies them (the kernel leaves FUSE inodes' access times to
/// the daemon).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Atime {
    /// `relatime`: the kernel's default.
    Relatime,
    /// `noatime`.
    NoAtime,
    /// `strictatime` (`atime` in the old spelling).
    Strict,
}

/// Generic VFS flags handed to the kernel unchanged.
const KERNEL_FLAGS: &[&str] =
    &["dev", "nodev", "suid", "nosuid", "exec", "noexec", "sync", "async", "dirsync"];

/// Kernel flags that undo each other.
const KERNEL_PAIRS: [(&str, &str); 4] =
    [("dev", "nodev"), ("suid", "nosuid"), ("exec", "noexec"), ("sync", "async")];

/// The kernel flag `k` undoes, if any.
fn opposite(k: &str) -> Option<&'static str> {
    KERNEL_PAIRS.iter().find_map(|&(a, b)| (k == a).then_some(b).or((k == b).then_some(a)))
}

/// Options ext4 (or mount(8), or fstab) accepts that mean nothing to a userspace daemon:
/// accepted and ignored, with or without a value (docs/fuse.md says why, for each).
const IGNORED: &[&str] = &[
    "defaults",
    "auto",
    "noauto",
    "nofail",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "_netdev",
    "comment",
    "loop",
    "lazytime",
    "nolazytime",
    "diratime",
    "user_xattr",
    "nouser_xattr",
    "barrier",
    "nobarrier",
    "auto_da_alloc",
    "noauto_da_alloc",
    "init_itable",
    "noinit_itable",
    "journal_checksum",
    "nojournal_checksum",
    "block_validity",
    "noblock_validity",
    "dioread_lock",
    "dioread_nolock",
    "max_batch_time",
    "min_batch_time",
    "stripe",
    "i_version",
    "mblk_io_submit",
    "nomblk_io_submit",
    "bh",
    "nobh",
    "orlov",
    "oldalloc",
    "debug",
    "nombcache",
    "no_mbcache",
    "journal_ioprio",
    "max_dir_size_kb",
    "inode_readahead_blks",
    "resuid",
    "resgid",
    "symfollow",
    "norelatime",
    "nostrictatime",
];

/// Options ext4 accepts that rext4 cannot honour: refused, with the reason.
fn unsupported(key: &str, val: Option<&str>) -> Option<String> {
    let why = match (key, val) {
        ("data", Some("journal")) => "data=journal: not supported (rext4 journals metadata, data=ordered)",
        ("journal_async_commit", _) => "journal_async_commit: not supported",
        ("usrjquota" | "grpjquota" | "jqfmt", _) => {
            "journaled quota files (usrjquota, grpjquota, jqfmt): not supported (rext4 keeps quotas in the quota feature's hidden files: usrquota, grpquota, prjquota)"
        }
        ("journal_dev", _) => "journal_dev=: name the journal device by its path (journal_path=PATH)",
        ("dax", _) => "dax: not supported on a FUSE mount",
        ("test_dummy_encryption" | "inlinecrypt" | "abort", _) => "not supported by rext4",
        _ => return None,
    };
    Some(why.to_string())
}

/// A master key named by `key=FILE` (v2) or `key_v1=DESCRIPTOR:FILE` (v1), also what the
/// command's `--key` and `--key-v1` take.
pub fn load_key(option: &str, spec: &str) -> Result<rext4::EncryptionKey, String> {
    let (desc, file) = match option {
        "key_v1" => match spec.split_once(':') {
            Some((d, f)) => (Some(d), f),
            None => return Err(format!("{option}={spec}: expected DESCRIPTOR:FILE")),
        },
        _ => (None, spec),
    };
    rext4::EncryptionKey::from_file(std::path::Path::new(file), desc)
        .map_err(|e| format!("{option}={spec}: {e}"))
}

fn need<'a>(key: &str, v: Option<&'a str>) -> Result<&'a str, String> {
    v.ok_or_else(|| format!("option {key} needs a value"))
}

impl MountOptions {
    /// Parses a comma-separated `-o` list (several lists may be given one after another).
    pub fn parse(list: &str) -> Result<MountOptions, String> {
        let mut o = MountOptions::default();
        o.add(list)?;
        Ok(o)
    }

    /// Adds the options of a comma-separated list; later options win.
    pub fn add(&mut self, list: &str) -> Result<(), String> {
        for opt in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, val) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            let flag = |v: Option<&str>| match v {
                None => Ok(()),
                Some(_) => Err(format!("option {key} takes no value")),
            };
            match key {
                "ro" => {
                    flag(val)?;
                    self.read_only = true;
                }
                "rw" => {
                    flag(val)?;
                    self.read_only = false;
                }
                "allow_other" => {
                    flag(val)?;
                    self.allow_other = true;
                }
                "default_permissions" => {
                    flag(val)?;
                    self.default_permissions = true;
                }
                "nodefault_permissions" => {
                    flag(val)?;
                    self.default_permissions = false;
                }
                "writeback_cache" => {
                    flag(val)?;
                    self.writeback_cache = true;
                }
                "io_uring" | "noio_uring" => {
                    flag(val)?;
                    self.io_uring = Some(key == "io_uring");
                }
                "splice" | "nosplice" => {
                    flag(val)?;
                    self.splice = key == "splice";
                }
                "norecovery" | "noload" => {
                    flag(val)?;
                    self.norecovery = true;
                }
                "journal_path" => {
                    self.journal_path = Some(std::path::PathBuf::from(need(key, val)?));
                }
                "key" | "key_v1" => self.keys.push(load_key(key, need(key, val)?)?),
                "commit" => {
                    let v = need(key, val)?;
                    let secs: u64 = v.parse().map_err(|_| format!("commit={v}: not a number of seconds"))?;
                    // The kernel takes 0 as its default of 5 seconds.
                    self.commit = Some(Duration::from_secs(if secs == 0 { 5 } else { secs }));
                }
                "errors" => {
                    self.errors = Some(match need(key, val)? {
                        "continue" => ErrorBehavior::Continue,
                        "remount-ro" => ErrorBehavior::RemountRo,
                        "panic" => {
                            return Err("errors=panic is not supported: the daemon never stops on an \
                                        error (use continue or remount-ro)"
                                .into())
                        }
                        v => return Err(format!("errors={v}: expected continue or remount-ro")),
                    });
                }
                "threads" => {
                    let v = need(key, val)?;
                    let n: usize = v.parse().map_err(|_| format!("threads={v}: not a number"))?;
                    if n == 0 || n > 1024 {
                        return Err(format!("threads={v}: must be between 1 and 1024"));
                    }
                    self.threads = Some(n);
                }
                "fsname" => {
                    let v = need(key, val)?;
                    if v.is_empty() || v.contains([',', '\\', ' ', '\n']) {
                        return Err(format!("fsname={v}: must be non-empty, without commas or spaces"));
                    }
                    self.fsname = Some(v.to_string());
                }
                "cache" => {
                    let v = need(key, val)?;
                    let mib: usize = v.parse().map_err(|_| format!("cache={v}: not a number of MiB"))?;
                    if mib == 0 {
                        return Err("cache=0: the cache needs at least 1 MiB".into());
                    }
                    self.cache_bytes = Some(mib.saturating_mul(1 << 20));
                }
                "acl" | "noacl" => {
                    flag(val)?;
                    self.acl = key == "acl";
                }
                "relatime" => self.atime = Atime::Relatime,
                "noatime" => self.atime = Atime::NoAtime,
                "strictatime" | "atime" => self.atime = Atime::Strict,
                "nodiratime" => self.nodiratime = true,
                "diratime" => self.nodiratime = false,
                // What the engine does anyway; `writeback` is weaker, so ordered is within it.
                "data" if matches!(val, Some("ordered" | "writeback")) => {}
                "data_err" if matches!(val, Some("ignore" | "abort")) => {}
                "locks" => {
                    self.locks = match need(key, val)? {
                        "kernel" => LockMode::Kernel,
                        "engine" => LockMode::Engine,
                        v => return Err(format!("locks={v}: expected kernel or engine")),
                    };
                }
                "discard" | "nodiscard" => {
                    flag(val)?;
                    self.discard = key == "discard";
                }
                "delalloc" | "nodelalloc" => {
                    flag(val)?;
                    self.delalloc = key == "delalloc";
                }
                "quota" | "usrquota" => {
                    flag(val)?;
                    self.quota.user = true;
                }
                "grpquota" => {
                    flag(val)?;
                    self.quota.group = true;
                }
                "prjquota" => {
                    flag(val)?;
                    self.quota.project = true;
                }
                "noquota" => {
                    flag(val)?;
                    self.quota = rext4::QuotaEnforcement::default();
                }
                "grpid" | "bsdgroups" | "nogrpid" | "sysvgroups" => {
                    flag(val)?;
                    self.grpid = matches!(key, "grpid" | "bsdgroups");
                }
                // Written by mount(8) for `mount -t fuse.NAME`; empty: plain `fuse`.
                "subtype" => {
                    let v = val.unwrap_or("");
                    if v.contains([',', '\\', ' ', '\n', '/']) {
                        return Err(format!("subtype={v}: must be a name, without commas, spaces or '/'"));
                    }
                    self.subtype = v.to_string();
                }
                k if k.starts_with("x-") => {}
                k if KERNEL_FLAGS.contains(&k) => {
                    flag(val)?;
                    match k {
                        "sync" => self.sync = true,
                        "async" => self.sync = false,
                        "dirsync" => self.dirsync = true,
                        _ => {}
                    }
                    // The last of a pair wins, as for mount(8) and the kernel (`suid,nosuid`
                    // is nosuid): fuser refuses a list holding both.
                    self.kernel_flags.retain(|f| f != k && Some(f.as_str()) != opposite(k));
                    self.kernel_flags.push(k.to_string());
                }
                k if IGNORED.contains(&k) => {}
                k => {
                    if let Some(why) = unsupported(k, val) {
                        return Err(why);
                    }
                    // The kernel's words for it (`ext4: Unknown parameter 'x'`).
                    return Err(format!("Unknown parameter '{k}'"));
                }
            }
        }
        Ok(())
    }

    /// Checks combinations that no single option can judge.
    pub fn validate(&self) -> Result<(), String> {
        if self.norecovery && !self.read_only {
            return Err("norecovery needs ro: a read-write mount must replay the journal first".into());
        }
        Ok(())
    }

    /// Whether each directory change must be durable before it returns (`sync`, `dirsync`).
    pub fn dir_sync(&self) -> bool {
        self.sync || self.dirsync
    }

    /// Whether to take requests through io_uring (`Some(true)`: and say when the kernel does
    /// not offer it), as `io_uring` asks. Unasked, `locks=engine` keeps to /dev/fuse: a lock
    /// wait answered later holds its ring entry, and a queue whose entries and spares all
    /// hold waits takes no request, not even the unlock that would free them.
    pub fn uring_choice(&self) -> Option<bool> {
        match (self.io_uring, self.locks) {
            (None, LockMode::Engine) => Some(false),
            (x, _) => x,
        }
    }

    /// Worker threads to run.
    pub fn thread_count(&self) -> usize {
        self.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// The engine options these mount options ask for.
    pub fn engine_options(&self) -> rext4::Options {
        let mut o = rext4::Options {
            writable: !self.read_only,
            norecovery: self.norecovery,
            errors: self.errors,
            discard: self.discard,
            delalloc: self.delalloc,
            // The kernel leaves access times of FUSE inodes to the daemon (`S_NOATIME`).
            atime: match self.atime {
                Atime::Relatime => rext4::AtimeMode::Relatime,
                Atime::NoAtime => rext4::AtimeMode::NoAtime,
                Atime::Strict => rext4::AtimeMode::StrictAtime,
            },
            nodiratime: self.nodiratime,
            quota_limits: self.quota,
            journal_path: self.journal_path.clone(),
            encryption_keys: self.keys.clone(),
            ..rext4::Options::default()
        };
        if let Some(c) = self.commit {
            o.commit_interval = c;
        }
        if let Some(b) = self.cache_bytes {
            o.cache_bytes = b;
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_option() {
        let o = MountOptions::parse(
            "ro,allow_other,commit=30,errors=remount-ro,writeback_cache,threads=4,fsname=img,norecovery,noatime",
        )
        .unwrap();
        assert!(o.read_only && o.allow_other && o.default_permissions && o.writeback_cache && o.norecovery);
        assert_eq!(o.commit, Some(Duration::from_secs(30)));
        assert_eq!(o.errors, Some(ErrorBehavior::RemountRo));
        assert_eq!(o.threads, Some(4));
        assert_eq!(o.fsname.as_deref(), Some("img"));
        assert_eq!(o.subtype, "rext4");
        assert_eq!(o.atime, Atime::NoAtime);
        assert_eq!(MountOptions::parse("subtype=").unwrap().subtype, "");
        assert_eq!(MountOptions::parse("subtype=img").unwrap().subtype, "img");
        assert!(MountOptions::parse("subtype=a/b").is_err());
        o.validate().unwrap();
        assert!(!o.engine_options().writable);
    }

    /// What mount(8) and fstab hand over, and ext4's own options, are accepted.
    #[test]
    fn accepts_what_ext4_and_mount_accept() {
        let o = MountOptions::parse(
            "rw,relatime,strictatime,nodiratime,lazytime,sync,dirsync,nosuid,nodev,noexec,suid,dev,exec,\
             defaults,user_xattr,acl,barrier,barrier=1,nobarrier,data=ordered,errors=continue,commit=5,\
             discard,nodiscard,auto_da_alloc,init_itable=10,noauto,nofail,_netdev,user,users,x-systemd.x=1",
        )
        .unwrap();
        assert_eq!(o.atime, Atime::Strict);
        assert!(o.nodiratime && o.sync && o.dirsync && o.acl && o.dir_sync());
        let e = o.engine_options();
        assert!(e.atime == rext4::AtimeMode::StrictAtime && e.nodiratime);
        let e = MountOptions::parse("noatime,nodiratime,diratime").unwrap().engine_options();
        assert!(e.atime == rext4::AtimeMode::NoAtime && !e.nodiratime);
        let e = MountOptions::default().engine_options();
        assert!(e.atime == rext4::AtimeMode::Relatime && !e.nodiratime, "relatime by default");
        // The last of a pair of kernel flags wins (xfstests generic/128 mounts `suid,...,nosuid`).
        let o = MountOptions::parse("dev,suid,exec,nosuid,sync,async,nodev,dev").unwrap();
        assert_eq!(o.kernel_flags, ["exec", "nosuid", "async", "dev"]);
        // The last of `discard,nodiscard` wins, as for the kernel.
        assert!(!o.discard && !o.engine_options().discard);
        let o = MountOptions::parse("discard").unwrap();
        assert!(o.discard && o.engine_options().discard);
        assert!(o.engine_options().delalloc, "delalloc by default");
        let o = MountOptions::parse("delalloc,nodelalloc").unwrap();
        assert!(!o.delalloc && !o.engine_options().delalloc);
        assert!(MountOptions::parse("discard=1").is_err());
        let o = MountOptions::parse("noacl,async,noatime").unwrap();
        assert!(!o.acl && !o.sync && o.atime == Atime::NoAtime);
        let e = MountOptions::parse("data=journal").unwrap_err();
        assert!(e.contains("data=journal"), "{e}");
        let e = MountOptions::parse("frobnicate").unwrap_err();
        assert!(e.contains("Unknown parameter 'frobnicate'"), "{e}");
    }

    #[test]
    fn splice_by_default() {
        assert!(MountOptions::parse("rw").unwrap().splice);
        assert!(!MountOptions::parse("nosplice").unwrap().splice);
        assert!(MountOptions::parse("nosplice,splice").unwrap().splice);
        assert!(MountOptions::parse("splice=1").is_err());
    }

    #[test]
    fn io_uring_by_default_or_by_name() {
        assert_eq!(MountOptions::parse("rw").unwrap().io_uring, None);
        assert_eq!(MountOptions::parse("io_uring").unwrap().io_uring, Some(true));
        assert_eq!(MountOptions::parse("io_uring,noio_uring").unwrap().io_uring, Some(false));
        assert!(MountOptions::parse("io_uring=1").is_err());
        // The engine's lock waits hold ring entries: /dev/fuse unless asked.
        assert_eq!(MountOptions::parse("rw").unwrap().uring_choice(), None);
        assert_eq!(MountOptions::parse("locks=engine").unwrap().uring_choice(), Some(false));
        assert_eq!(MountOptions::parse("locks=engine,io_uring").unwrap().uring_choice(), Some(true));
    }

    #[test]
    fn rejects_bad_options() {
        for bad in
            ["bogus", "threads=0", "threads=x", "commit", "errors=panic", "errors=x", "ro=1", "fsname="]
        {
            assert!(MountOptions::parse(bad).is_err(), "{bad} accepted");
        }
        assert!(MountOptions::parse("norecovery").unwrap().validate().is_err());
        assert!(MountOptions::parse("ro,rw").map(|o| !o.read_only).unwrap());
    }

    #[test]
    fn quota_options_pick_the_enforced_types() {
        let q = |s: &str| MountOptions::parse(s).map(|o| o.quota);
        let t = |user, group, project| rext4::QuotaEnforcement { user, group, project };
        assert_eq!(q("rw").unwrap(), t(false, false, false));
        assert_eq!(q("usrquota,prjquota").unwrap(), t(true, false, true));
        assert_eq!(q("quota,grpquota").unwrap(), t(true, true, false));
        assert_eq!(q("usrquota,grpquota,noquota").unwrap(), t(false, false, false));
        assert_eq!(
            MountOptions::parse("grpquota").unwrap().engine_options().quota_limits,
            t(false, true, false)
        );
        for bad in ["usrjquota=aquota.user", "grpjquota=x", "jqfmt=vfsv1", "usrquota=1"] {
            assert!(q(bad).is_err(), "{bad} accepted");
        }
    }
}
