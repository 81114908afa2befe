//! `rext4 mkfs IMAGE [SIZE]`: make an ext2/3/4 filesystem with mke2fs's options and
//! defaults, optionally filled from a directory (`--from`), reproducibly under
//! `SOURCE_DATE_EPOCH`.

use crate::CliResult;
use rext4::{FormatOptions, FsType};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub(crate) struct MkfsArgs {
    /// Filesystem type: ext2, ext3 or ext4 (default).
    #[arg(short = 't', default_value = "ext4")]
    fs_type: String,
    /// Usage types from mke2fs.conf: small, floppy, news, largefile, largefile4, big, huge.
    #[arg(short = 'T')]
    usage: Option<String>,
    /// Block size in bytes.
    #[arg(short = 'b')]
    block_size: Option<u32>,
    /// Cluster size in bytes, with -O bigalloc (16 blocks by default).
    #[arg(short = 'C')]
    cluster_size: Option<String>,
    /// Blocks per group (clusters per group with bigalloc): a multiple of 8.
    #[arg(short = 'g')]
    blocks_per_group: Option<u32>,
    /// A journal (`-O has_journal`).
    #[arg(short = 'j')]
    journal_flag: bool,
    /// Errors behaviour: continue, remount-ro or panic.
    #[arg(short = 'e')]
    errors: Option<String>,
    /// The last-mounted directory recorded in the superblock.
    #[arg(short = 'M')]
    last_mounted: Option<String>,
    /// Inode size in bytes.
    #[arg(short = 'I')]
    inode_size: Option<u16>,
    /// Bytes per inode.
    #[arg(short = 'i')]
    inode_ratio: Option<String>,
    /// Number of inodes.
    #[arg(short = 'N')]
    inodes: Option<u32>,
    /// Features: `name` to add, `^name` to remove (repeatable, comma-separated).
    #[arg(short = 'O', action = clap::ArgAction::Append)]
    features: Vec<String>,
    /// Journal options: `size=MiB`, `fast_commit_size=KiB` (with -O fast_commit), or
    /// `device=PATH` for a journal device made with `rext4 mkfs -O journal_dev` (or
    /// mke2fs's).
    #[arg(short = 'J')]
    journal: Option<String>,
    /// Volume label.
    #[arg(short = 'L')]
    label: Option<String>,
    /// Filesystem UUID (or `random`, `time`, `clear`).
    #[arg(short = 'U')]
    uuid: Option<String>,
    /// Extended options: hash_seed=UUID, root_owner[=UID:GID], orphan_file_size=SIZE,
    /// quotatype=usrquota:grpquota:prjquota (with -O quota), encoding=utf8 (turns casefold
    /// on), encoding_flags=strict (with casefold), mmp_update_interval=SECONDS (with -O mmp),
    /// stride=BLOCKS, stripe_width=BLOCKS (RAID), resize=BLOCKS|SIZE (growth room),
    /// num_backup_sb=0|1|2 (with -O sparse_super2),
    /// lazy_itable_init, lazy_journal_init, discard, nodiscard, assume_storage_prezeroed.
    #[arg(short = 'E', action = clap::ArgAction::Append)]
    extended: Vec<String>,
    /// Percent of blocks reserved for root.
    #[arg(short = 'm')]
    reserved: Option<f64>,
    /// Groups per flex group.
    #[arg(short = 'G')]
    flex_bg_size: Option<u32>,
    /// Quiet.
    #[arg(short = 'q')]
    quiet: bool,
    /// Show what would be made (sizes, groups, where the backup superblocks go) and write
    /// nothing.
    #[arg(short = 'n')]
    dry_run: bool,
    /// Accepted for mke2fs compatibility: rext4 mkfs never asks.
    #[arg(short = 'F', action = clap::ArgAction::Count)]
    force: u8,
    /// Fill the filesystem with this directory tree, or this tar archive (plain, gzip or
    /// zstd); `-d` as mke2fs spells it.
    #[arg(long = "from", short = 'd', value_name = "DIR|ARCHIVE")]
    from: Option<PathBuf>,
    /// Make the smallest image that holds the --from tree, with this much room to spare: a
    /// share of what the tree takes (`10%`) or a size (`64M`). The block size is 4 KiB and
    /// no blocks are reserved for root unless -b and -m say otherwise.
    #[arg(long, value_name = "SLACK", num_args = 0..=1, default_missing_value = "", require_equals = true)]
    size_to_fit: Option<String>,
    /// Same input, same image, byte for byte: UUIDs, hash seed and every time derived from
    /// SOURCE_DATE_EPOCH (or the tree's newest time), times clamped to it. On by default
    /// when SOURCE_DATE_EPOCH is set.
    #[arg(long)]
    reproducible: bool,
    /// Owners, modes, times and xattrs by path: `PATH UID GID MODE` or `PATH uid=.. gid=..
    /// mode=.. mtime=.. xattr.NAME=VALUE`.
    #[arg(long, value_name = "FILE")]
    manifest: Option<PathBuf>,
    /// SELinux labels from a file_contexts file (`REGEX [TYPE] CONTEXT` lines), stored as
    /// `security.selinux`; with FILE.homedirs, FILE.local, FILE.subs and FILE.subs_dist
    /// beside it when they exist, as libselinux reads them.
    #[arg(long, value_name = "FILE_CONTEXTS")]
    selinux: Option<PathBuf>,
    /// Every file owned by root (0:0).
    #[arg(long)]
    all_root: bool,
    /// Added to every owner's user ID.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    uid_offset: i64,
    /// Added to every owner's group ID.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    gid_offset: i64,
    /// The image file or block device.
    image: PathBuf,
    /// Size: a number with a K, M, G or T suffix (bytes with B); a bare number is KiB, or
    /// blocks with -b, as mke2fs reads it.
    size: Option<String>,
}

/// A size as mke2fs's `parse_num_blocks2` reads it, in bytes: suffixes K, M, G, T (powers
/// of 1024), `s` for 512-byte sectors; a bare number is KiB, or blocks of `block_size`.
pub(crate) fn parse_size(s: &str, block_size: Option<u32>) -> CliResult<u64> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, suffix) = s.split_at(digits);
    let n: u64 = num.parse().map_err(|_| format!("invalid size: {s}"))?;
    let suffix = suffix.trim_end_matches(['i', 'I', 'b', 'B']);
    let mult: u64 = match suffix.to_ascii_lowercase().as_str() {
        "" if s.ends_with(['b', 'B']) && !s.ends_with("iB") => 1,
        "" => block_size.map_or(1024, u64::from),
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        "s" => 512,
        _ => return Err(format!("invalid size suffix: {s}")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("size too large: {s}"))
}

/// A count as mke2fs's `parse_num_blocks2` reads it where the block size may not be known
/// yet: a bare number is blocks, a size with a suffix is bytes.
fn parse_blocks_or_size(v: &str) -> CliResult<rext4::SizeIn> {
    Ok(match v.parse::<u64>() {
        Ok(n) => rext4::SizeIn::Blocks(n),
        Err(_) => rext4::SizeIn::Bytes(parse_size(v, Some(1))?),
    })
}

/// A UUID in its text form.
pub(crate) fn parse_uuid(s: &str) -> CliResult<[u8; 16]> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || s.len() != 36 {
        return Err(format!("invalid UUID: {s}"));
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| format!("invalid UUID: {s}"))?;
    }
    Ok(out)
}

/// The mke2fs options as [`FormatOptions`].
fn options(a: &MkfsArgs) -> CliResult<FormatOptions> {
    let mut o = FormatOptions {
        fs_type: match a.fs_type.as_str() {
            "ext2" => FsType::Ext2,
            "ext3" => FsType::Ext3,
            "ext4" => FsType::Ext4,
            t => return Err(format!("unsupported filesystem type: {t}")),
        },
        usage_types: a.usage.clone(),
        block_size: a.block_size,
        inode_size: a.inode_size,
        inodes: a.inodes,
        features: a.features.join(","),
        label: a.label.clone(),
        reserved_ratio: a.reserved,
        flex_bg_size: a.flex_bg_size,
        ..FormatOptions::default()
    };
    o.blocks_per_group = a.blocks_per_group;
    o.last_mounted = a.last_mounted.clone();
    if a.journal_flag {
        o.features.push_str(if o.features.is_empty() { "has_journal" } else { ",has_journal" });
    }
    o.errors = match a.errors.as_deref() {
        None => None,
        Some("continue") => Some(rext4::format::superblock::ERRORS_CONTINUE),
        Some("remount-ro") => Some(rext4::format::superblock::ERRORS_RO),
        Some("panic") => Some(rext4::format::superblock::ERRORS_PANIC),
        Some(e) => return Err(format!("invalid errors behaviour: {e}")),
    };
    if let Some(c) = &a.cluster_size {
        o.cluster_size = Some(u32::try_from(parse_size(c, Some(1))?).map_err(|_| "cluster size too large")?);
    }
    // mke2fs's clock for tests and reproducible images.
    if let Ok(t) = std::env::var("E2FSPROGS_FAKE_TIME") {
        o.time = t.trim().parse().ok();
    }
    if let Some(r) = &a.inode_ratio {
        o.inode_ratio = Some(u32::try_from(parse_size(r, Some(1))?).map_err(|_| "inode ratio too large")?);
    }
    if let Some(l) = &a.label {
        if l.len() > 16 {
            // As mke2fs: the first 16 bytes are kept.
            let kept = String::from_utf8_lossy(&l.as_bytes()[..16]);
            eprintln!("Warning: label too long; will be truncated to '{kept}'");
        }
    }
    if let Some(j) = &a.journal {
        for opt in j.split(',') {
            match opt.split_once('=') {
                Some(("size", v)) => {
                    o.journal_size_mib = Some(v.parse().map_err(|_| format!("invalid journal size: {v}"))?)
                }
                Some(("fast_commit_size", v)) => {
                    o.fast_commit_kib = Some(v.parse().map_err(|_| format!("invalid fast commit size: {v}"))?)
                }
                // Taken by `run`, which opens the device.
                Some(("device", _)) => {}
                _ => return Err(format!("unsupported journal option: {opt}")),
            }
        }
    }
    match a.uuid.as_deref() {
        None | Some("random") | Some("time") => {}
        Some("clear") | Some("null") => o.uuid = Some([0; 16]),
        Some(u) => o.uuid = Some(parse_uuid(u)?),
    }
    for e in a.extended.iter().flat_map(|e| e.split(',')).filter(|e| !e.is_empty()) {
        let (k, v) = e.split_once('=').map_or((e, None), |(k, v)| (k, Some(v)));
        match (k, v) {
            ("hash_seed", Some(v)) => o.hash_seed = Some(parse_uuid(v)?),
            ("root_owner", None) => {
                o.root_owner = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw())
            }
            ("root_owner", Some(v)) => {
                let (u, g) = v.split_once(':').ok_or_else(|| format!("invalid root_owner: {v}"))?;
                o.root_owner = (
                    u.parse().map_err(|_| format!("invalid root_owner: {v}"))?,
                    g.parse().map_err(|_| format!("invalid root_owner: {v}"))?,
                );
            }
            ("quotatype", Some(v)) => {
                // mke2fs's `parse_quota_types`: colon-separated, with or without "quota".
                let mut t = [false; 3];
                for q in v.split(':').filter(|q| !q.is_empty()) {
                    match q {
                        "usr" | "usrquota" => t[0] = true,
                        "grp" | "grpquota" => t[1] = true,
                        "prj" | "prjquota" => t[2] = true,
                        _ => return Err(format!("invalid quota type: {q}")),
                    }
                }
                o.quota_types = Some(t);
            }
            ("encoding", Some(v)) => {
                // mke2fs: naming the encoding turns casefold on.
                if rext4::format::casefold::encoding_from_name(v).is_none() {
                    return Err(format!("invalid encoding: {v}"));
                }
                o.features.push_str(if o.features.is_empty() { "casefold" } else { ",casefold" });
            }
            ("encoding_flags", Some(v)) => {
                // `e2p_str2encoding_flags`: flags joined by '-', each maybe prefixed "no".
                for f in v.split('-') {
                    match f {
                        "strict" => o.strict_encoding = true,
                        "nostrict" => o.strict_encoding = false,
                        _ => return Err(format!("invalid encoding flag: {f}")),
                    }
                }
            }
            ("num_backup_sb", Some(v)) => {
                o.num_backup_sb = Some(v.parse().map_err(|_| format!("invalid num_backup_sb: {v}"))?);
            }
            ("stride", Some(v)) => {
                o.stride = Some(v.parse().map_err(|_| format!("invalid stride: {v}"))?);
            }
            ("stripe_width" | "stripe-width", Some(v)) => {
                o.stripe_width = Some(v.parse().map_err(|_| format!("invalid stripe width: {v}"))?);
            }
            ("resize", Some(v)) => o.resize = Some(parse_blocks_or_size(v)?),
            ("mmp_update_interval", Some(v)) => {
                o.mmp_update_interval =
                    Some(v.parse().map_err(|_| format!("invalid mmp_update_interval: {v}"))?);
            }
            ("orphan_file_size", Some(v)) => o.orphan_file_size = Some(parse_blocks_or_size(v)?),
            (
                "lazy_itable_init"
                | "lazy_journal_init"
                | "discard"
                | "nodiscard"
                | "assume_storage_prezeroed",
                _,
            ) => {}
            _ => return Err(format!("unsupported extended option: {e}")),
        }
    }
    Ok(o)
}

/// The device `path` names when it is a partition (`disk.img@2`) or an NBD export, which mkfs
/// formats in place; `None` for an image file or block device.
fn in_place_device(
    path: &Path,
    writable: bool,
) -> CliResult<Option<std::sync::Arc<dyn rext4::dev::BlockDevice>>> {
    use rext4::dev::address::{Address, Target};
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let addr = Address::parse(path).map_err(err)?;
    if addr.partition.is_none() && !matches!(addr.target, Target::Nbd(_)) {
        return Ok(None);
    }
    addr.open(writable).map(Some).map_err(err)
}

/// Opens (creating or sizing) the image; returns it and whether it reads as zeroes. A
/// partition (`disk.img@2`) or an NBD export is formatted in place, at most its size.
pub(crate) fn prepare_image(
    path: &Path,
    size: Option<u64>,
) -> CliResult<(std::sync::Arc<dyn rext4::dev::BlockDevice>, bool)> {
    use std::os::unix::fs::FileTypeExt;
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    if let Some(dev) = in_place_device(path, true)? {
        if let Some(s) = size.filter(|&s| s > dev.size()) {
            return Err(format!("{}: {s} bytes do not fit in its {} bytes", path.display(), dev.size()));
        }
        return Ok((dev, false));
    }
    let meta = std::fs::metadata(path);
    let is_blockdev = meta.as_ref().is_ok_and(|m| m.file_type().is_block_device());
    let mut zeroed = false;
    if !is_blockdev {
        let len = match (size, &meta) {
            (Some(s), _) => s,
            (None, Ok(m)) if m.len() > 0 => m.len(),
            _ => return Err(format!("{}: give a size for a new image", path.display())),
        };
        // A fresh file of the size: every block reads as zero, as after mke2fs's discard.
        let f =
            std::fs::OpenOptions::new().create(true).truncate(true).write(true).open(path).map_err(err)?;
        f.set_len(len).map_err(err)?;
        zeroed = true;
    }
    let dev = rext4::dev::FileDevice::open(path, true).map_err(err)?;
    Ok((std::sync::Arc::new(dev), zeroed))
}

/// 16 bytes derived from `parts` (crc32c chained four ways): what a reproducible image uses
/// for its UUID and hash seed, so they differ between inputs yet repeat for the same one.
fn derive16(parts: &[&[u8]]) -> [u8; 16] {
    use rext4::format::checksum::crc32c;
    let mut out = [0u8; 16];
    for i in 0..4u32 {
        let mut c = crc32c(0x5EED_0000 ^ i.wrapping_mul(0x9E37_79B9), b"rext4 mkfs");
        for p in parts {
            c = crc32c(c, &(p.len() as u64).to_le_bytes());
            c = crc32c(c, p);
        }
        let i = i as usize;
        out[4 * i..4 * i + 4].copy_from_slice(&c.to_le_bytes());
    }
    out[6] = (out[6] & 0x0F) | 0x40;
    out[8] = (out[8] & 0x3F) | 0x80;
    out
}

/// The time a reproducible build stamps: SOURCE_DATE_EPOCH, else the newest modification in
/// the source tree.
fn build_epoch(a: &MkfsArgs) -> CliResult<Option<i64>> {
    if let Some(t) = rext4::clock::fixed_time() {
        return Ok(Some(t));
    }
    if !a.reproducible {
        return Ok(None);
    }
    let Some(src) = &a.from else { return Ok(Some(0)) };
    if crate::mkfs_tar::is_archive(src) {
        return Ok(Some(crate::mkfs_tar::measure(src)?.2));
    }
    let mut newest = 0i64;
    let mut stack = vec![src.clone()];
    while let Some(d) = stack.pop() {
        let m = std::fs::symlink_metadata(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        newest = newest.max(std::os::unix::fs::MetadataExt::mtime(&m));
        if m.is_dir() {
            for e in std::fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))? {
                stack.push(e.map_err(|e| e.to_string())?.path());
            }
        }
    }
    Ok(Some(newest))
}

pub(crate) fn run(a: &MkfsArgs) -> CliResult {
    let mut o = options(a)?;
    // `-O journal_dev`: an external journal device, not a filesystem.
    let edits: Vec<&str> = o.features.split(',').filter(|f| !f.is_empty()).collect();
    if edits.iter().rev().find(|f| f.trim_start_matches('^') == "journal_dev") == Some(&"journal_dev") {
        o.features = edits
            .into_iter()
            .filter(|f| f.trim_start_matches('^') != "journal_dev")
            .collect::<Vec<_>>()
            .join(",");
        return journal_device(a, o);
    }
    // `-J device=PATH`: the journal is on that device.
    let jdev_path = a
        .journal
        .as_deref()
        .into_iter()
        .flat_map(|j| j.split(','))
        .find_map(|opt| opt.strip_prefix("device="));
    let jdev = match jdev_path {
        Some(p) => {
            let dev =
                rext4::dev::FileDevice::open(Path::new(p), !a.dry_run).map_err(|e| format!("{p}: {e}"))?;
            let (uuid, bs) = rext4::Fs::journal_device(&dev).map_err(|e| format!("{p}: {e}"))?;
            // mke2fs takes the journal's block size where none is given.
            match o.block_size {
                None => o.block_size = Some(bs),
                Some(b) if b != bs => {
                    return Err(format!("{p}: journal block size {bs} is not the filesystem's {b}"))
                }
                Some(_) => {}
            }
            let dev_number = std::fs::metadata(p)
                .ok()
                .filter(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
                .map_or(0, |m| u32::try_from(std::os::unix::fs::MetadataExt::rdev(&m)).unwrap_or(0));
            o.journal_device = Some(rext4::JournalDeviceRef { uuid, dev_number });
            // -J asks for a journal, as `-J size=` does (mke2fs turns the feature on).
            o.features = if o.features.is_empty() {
                "has_journal".into()
            } else {
                format!("{},has_journal", o.features)
            };
            Some((p, dev))
        }
        None => None,
    };
    if a.dry_run {
        return dry_run(a, o, jdev.as_ref().map(|(p, _)| *p));
    }
    let mut size = a.size.as_deref().map(|s| parse_size(s, a.block_size)).transpose()?;
    let epoch = build_epoch(a)?;
    if let Some(t) = epoch {
        rext4::clock::set_fixed_time(Some(t));
        o.time = Some(t);
        // Nothing of the machine in a reproducible image.
        o.node_name = Some(String::new());
    }
    o.device_name = Some(a.image.display().to_string());
    let manifest = match &a.manifest {
        Some(p) => crate::mkfs_from::parse_manifest(
            &std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?,
        )?,
        None => Default::default(),
    };
    let policy = crate::mkfs_from::Policy {
        all_root: a.all_root,
        uid_offset: a.uid_offset,
        gid_offset: a.gid_offset,
        clamp: epoch,
        manifest,
        selinux: match &a.selinux {
            Some(p) => Some(std::sync::Arc::new(crate::file_contexts::FileContexts::load(p)?)),
            None => None,
        },
    };
    let mut fit = None;
    if let Some(slack) = &a.size_to_fit {
        let slack = crate::mkfs_fit::parse_slack(slack)?;
        let Some(src) = &a.from else { return Err("--size-to-fit needs --from".into()) };
        if size.is_some() {
            return Err("give a size or --size-to-fit, not both".into());
        }
        o.block_size = Some(o.block_size.unwrap_or(4096));
        o.reserved_ratio = Some(o.reserved_ratio.unwrap_or(0.0));
        let shape = shape(&o)?;
        let need = if crate::mkfs_tar::is_archive(src) {
            crate::mkfs_fit::estimate_archive(src, shape)?
        } else {
            crate::mkfs_fit::estimate_dir(src, shape)?
        };
        fit = Some(need.with_slack(slack, shape.block_size));
    }
    // A fill that outgrows a fitted size starts over a little larger, a few times at most.
    let mut attempts = 0;
    let r = loop {
        let mut o = o.clone();
        if let Some(need) = fit {
            // Enough inodes for the tree and the reserved ones, or more if -N says so.
            let n = u32::try_from(need.inodes + 16).map_err(|_| "too many files")?;
            o.inodes = Some(n.max(a.inodes.unwrap_or(0)));
            size = Some(fit_size(&a.image, &o, need)?);
        }
        o.size = size;
        if let Some(t) = epoch {
            let key = [
                &t.to_le_bytes()[..],
                a.label.as_deref().unwrap_or("").as_bytes(),
                &size.unwrap_or(0).to_le_bytes(),
                o.features.as_bytes(),
                a.fs_type.as_bytes(),
            ];
            if o.uuid.is_none() {
                o.uuid = Some(derive16(&[&key[..], &[b"uuid"]].concat()));
            }
            if o.hash_seed.is_none() {
                o.hash_seed = Some(derive16(&[&key[..], &[b"hash_seed"]].concat()));
            }
        }
        let (dev, zeroed) = prepare_image(&a.image, size)?;
        o.device_zeroed = zeroed;
        let r = rext4::Fs::format(&*dev, &o).map_err(|e| format!("{}: {e}", a.image.display()))?;
        drop(dev);
        let Some(src) = &a.from else { break r };
        match fill(a, src, &policy) {
            Err(e) if fit.is_some() && attempts < 5 && e.contains(NO_SPACE) => {
                attempts += 1;
                fit = fit.map(crate::mkfs_fit::Need::grown);
            }
            Err(e) => return Err(e),
            Ok(()) => break r,
        }
    };
    if let Some((p, dev)) = &jdev {
        rext4::Fs::add_journal_user(dev, r.uuid).map_err(|e| format!("{p}: {e}"))?;
    }
    if let Some(t) = epoch {
        seal(&a.image, &r, t, a.last_mounted.as_deref())?;
    }
    if !a.quiet {
        print_report(a, &r, jdev.as_ref().map(|(p, _)| *p));
    }
    let _ = a.force;
    Ok(())
}

/// `rext4 mkfs -O journal_dev IMAGE [SIZE]`: an external journal device, as mke2fs makes
/// one (block size, size, UUID, hash seed and time as for a filesystem).
fn journal_device(a: &MkfsArgs, mut o: rext4::FormatOptions) -> CliResult {
    let size = a.size.as_deref().map(|s| parse_size(s, a.block_size)).transpose()?;
    o.size = size;
    let r = if a.dry_run {
        o.dry_run = true;
        let existing = std::fs::metadata(&a.image).ok().map(|m| m.len()).filter(|&n| n > 0);
        let n =
            size.or(existing).ok_or_else(|| format!("{}: give a size for a new image", a.image.display()))?;
        rext4::Fs::format_journal_device(&rext4::dev::SizeOnlyDevice(n), &o)
    } else {
        let (dev, zeroed) = prepare_image(&a.image, size)?;
        o.device_zeroed = zeroed;
        rext4::Fs::format_journal_device(&*dev, &o)
    };
    let r = r.map_err(|e| format!("{}: {e}", a.image.display()))?;
    if !a.quiet {
        println!(
            "{}: journal device of {} blocks of {} bytes",
            a.image.display(),
            r.blocks_count,
            r.block_size
        );
    }
    Ok(())
}

/// `rext4 mkfs -n`: the filesystem worked out and shown, nothing written.
fn dry_run(a: &MkfsArgs, mut o: FormatOptions, jdev: Option<&str>) -> CliResult {
    use std::os::unix::fs::FileTypeExt;
    if a.from.is_some() || a.size_to_fit.is_some() {
        return Err("-n makes nothing to fill: drop --from".into());
    }
    let size = a.size.as_deref().map(|s| parse_size(s, a.block_size)).transpose()?;
    o.size = size;
    o.dry_run = true;
    let meta = std::fs::metadata(&a.image);
    let dev: std::sync::Arc<dyn rext4::dev::BlockDevice> = match (in_place_device(&a.image, false)?, &meta) {
        // A partition or an NBD export: its own size.
        (Some(dev), _) => dev,
        (None, Ok(m)) if m.file_type().is_block_device() => std::sync::Arc::new(
            rext4::dev::FileDevice::open(&a.image, false)
                .map_err(|e| format!("{}: {e}", a.image.display()))?,
        ),
        // An image file is made (or grown) to the size asked for.
        (None, _) => match size.or(meta.as_ref().ok().map(|m| m.len()).filter(|&n| n > 0)) {
            Some(n) => std::sync::Arc::new(rext4::dev::SizeOnlyDevice(n)),
            None => return Err(format!("{}: give a size for a new image", a.image.display())),
        },
    };
    let r = rext4::Fs::format(&*dev, &o).map_err(|e| format!("{}: {e}", a.image.display()))?;
    if !a.quiet {
        print_report(a, &r, jdev);
    }
    Ok(())
}

/// What `rext4 mkfs` says it made: sizes, groups, the journal, and where the backup
/// superblocks are (to repair from, as `mke2fs -n` is asked for them).
fn print_report(a: &MkfsArgs, r: &rext4::FormatReport, jdev: Option<&str>) {
    println!(
        "{}: {} blocks of {} bytes, {} inodes, {} groups{}",
        a.image.display(),
        r.blocks_count,
        r.block_size,
        r.inodes_count,
        r.group_count,
        if let Some(p) = jdev {
            format!(", journal on {p}")
        } else if r.journal_blocks > 0 {
            format!(", journal of {} blocks", r.journal_blocks)
        } else {
            String::new()
        }
    );
    if !r.backup_superblocks.is_empty() {
        let list: Vec<String> = r.backup_superblocks.iter().map(u64::to_string).collect();
        println!("Superblock backups stored on blocks: {}", list.join(", "));
    }
}

/// How the engine says a fill ran out of room.
const NO_SPACE: &str = "no space left on device";

/// Copies the tree or archive at `src` into the formatted image.
fn fill(a: &MkfsArgs, src: &Path, policy: &crate::mkfs_from::Policy) -> CliResult {
    let archive = crate::mkfs_tar::is_archive(src);
    // The tree is measured (a walk of its own) only for a bar someone sees.
    let bar = if a.quiet || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        indicatif::ProgressBar::hidden()
    } else {
        let bytes =
            if archive { crate::mkfs_tar::measure(src)?.0 } else { crate::mkfs_from::measure(src)?.0 };
        indicatif::ProgressBar::new(bytes)
    };
    // A fill never reads back what it wrote: no page cache for file data (and so no delayed
    // allocation: every write allocates as it comes, the same way each run).
    let opts = rext4::Options { page_cache_bytes: 0, ..crate::modify::writable_options() };
    let fs = rext4::Fs::open_with(&a.image, opts).map_err(|e| format!("{}: {e}", a.image.display()))?;
    let filled = if archive {
        crate::mkfs_tar::fill(&fs, src, policy, &bar)
    } else {
        crate::mkfs_from::fill(&fs, src, policy, &bar)
    };
    bar.finish_and_clear();
    let closed = fs.unmount();
    filled?;
    closed.map_err(|e| format!("{}: {e}", a.image.display()))?;
    Ok(())
}

/// How the tree will be stored under the format `o` asks for.
fn shape(o: &FormatOptions) -> CliResult<crate::mkfs_fit::Shape> {
    let f = &o.features;
    let has = |name: &str| f.split(',').any(|x| x.trim() == name);
    let not = |name: &str| f.split(',').any(|x| x.trim() == format!("^{name}"));
    let ext4 = o.fs_type == FsType::Ext4;
    let bs = o.block_size.unwrap_or(4096);
    Ok(crate::mkfs_fit::Shape {
        block_size: u64::from(bs),
        inode_size: u64::from(o.inode_size.unwrap_or(256)),
        extents: (ext4 && !not("extent") && !not("extents")) || has("extent") || has("extents"),
        metadata_csum: (ext4 && !not("metadata_csum")) || has("metadata_csum"),
        cluster_blocks: match has("bigalloc") {
            true => u64::from(o.cluster_size.unwrap_or(bs * 16) / bs).max(1),
            false => 1,
        },
    })
}

/// The smallest size (bytes) whose fresh format leaves `need` free: formats the image at a
/// first guess, then grows by what was missing until it fits.
fn fit_size(image: &Path, o: &FormatOptions, need: crate::mkfs_fit::Need) -> CliResult<u64> {
    let bs = u64::from(o.block_size.unwrap_or(4096));
    let mut o = o.clone();
    let mut blocks = need.blocks + 64;
    let mut failed = 0;
    for _ in 0..64 {
        o.size = Some(blocks * bs);
        let (dev, zeroed) = prepare_image(image, o.size)?;
        o.device_zeroed = zeroed;
        match rext4::Fs::format(&*dev, &o) {
            Ok(r) if r.free_blocks >= need.blocks => return Ok(blocks * bs),
            Ok(r) => blocks += (need.blocks - r.free_blocks).max(16),
            // Too small for its own metadata.
            Err(_) if failed < 8 => {
                failed += 1;
                blocks += blocks / 2 + 64;
            }
            Err(e) => return Err(format!("{}: {e}", image.display())),
        }
    }
    Err(format!("{}: no size fits the tree", image.display()))
}

/// Makes a filled image independent of when and how fast it was filled: the journal log
/// (whose commits fell where the clock put them) emptied and restarted at sequence 1, and
/// the superblock's mount bookkeeping reset.
fn seal(image: &Path, r: &rext4::FormatReport, t: i64, last_mounted: Option<&str>) -> CliResult {
    use rext4::format::jbd2::superblock::JournalSuperblock;
    use rext4::format::superblock::{split_time, Superblock, STATE_VALID};
    let err = |e: std::io::Error| format!("{}: {e}", image.display());
    // The image as every command opens it (a partition of a disk, say).
    let f = rext4::dev::open(image, true).map_err(err)?;
    let bs = u64::from(r.block_size);
    if let Some(&(first, _)) = r.journal_extents.first() {
        let mut jb = vec![0u8; 1024];
        f.read_at(&mut jb, first * bs).map_err(err)?;
        let zeros = vec![0u8; 1 << 20];
        for &(s, l) in &r.journal_extents {
            let (mut at, end) = (s * bs, (s + l) * bs);
            while at < end {
                let n = usize::try_from((end - at).min(zeros.len() as u64)).unwrap_or(zeros.len());
                f.write_at(&zeros[..n], at).map_err(err)?;
                at += n as u64;
            }
        }
        if let Some(mut jsb) = JournalSuperblock::parse(&jb) {
            jsb.set_sequence(1);
            jsb.set_start(0);
            jsb.update_checksum();
            f.write_at(zerocopy::IntoBytes::as_bytes(&jsb), first * bs).map_err(err)?;
        }
    }
    let mut sbb = vec![0u8; 1024];
    f.read_at(&mut sbb, 1024).map_err(err)?;
    let mut sb = Superblock::parse(&sbb).ok_or_else(|| format!("{}: no superblock", image.display()))?;
    let (lo, hi) = split_time(t);
    sb.s_mnt_count.set(0);
    sb.s_mtime.set(lo);
    sb.s_mtime_hi = hi;
    sb.s_wtime.set(lo);
    sb.s_wtime_hi = hi;
    sb.s_lastcheck.set(lo);
    sb.s_lastcheck_hi = hi;
    sb.s_kbytes_written.set(0);
    // As mkfs left it: `-M`'s directory or nothing.
    sb.s_last_mounted = [0; 64];
    if let Some(dir) = last_mounted {
        let n = dir.len().min(64);
        sb.s_last_mounted[..n].copy_from_slice(&dir.as_bytes()[..n]);
    }
    sb.s_state.set(sb.s_state.get() | STATE_VALID);
    sb.update_checksum();
    f.write_at(zerocopy::IntoBytes::as_bytes(&sb), 1024).map_err(err)?;
    f.flush().map_err(err)?;
    Ok(())
}
