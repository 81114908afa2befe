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
    /// Journal options: `size=MiB`.
    #[arg(short = 'J')]
    journal: Option<String>,
    /// Volume label.
    #[arg(short = 'L')]
    label: Option<String>,
    /// Filesystem UUID (or `random`, `time`, `clear`).
    #[arg(short = 'U')]
    uuid: Option<String>,
    /// Extended options: hash_seed=UUID, root_owner[=UID:GID], orphan_file_size=SIZE,
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
    /// Accepted for mke2fs compatibility: rext4 mkfs never asks.
    #[arg(short = 'F', action = clap::ArgAction::Count)]
    force: u8,
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
    if let Some(r) = &a.inode_ratio {
        o.inode_ratio = Some(u32::try_from(parse_size(r, Some(1))?).map_err(|_| "inode ratio too large")?);
    }
    if let Some(l) = &a.label {
        if l.len() > 16 {
            return Err(format!("volume label too long: {l}"));
        }
    }
    if let Some(j) = &a.journal {
        for opt in j.split(',') {
            match opt.split_once('=') {
                Some(("size", v)) => {
                    o.journal_size_mib = Some(v.parse().map_err(|_| format!("invalid journal size: {v}"))?)
                }
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
            ("orphan_file_size", Some(v)) => {
                let bytes = parse_size(v, Some(1))?;
                o.orphan_file_blocks = Some(u32::try_from(bytes).map_err(|_| "orphan file too large")?);
            }
            ("lazy_itable_init" | "lazy_journal_init" | "discard" | "nodiscard" | "assume_storage_prezeroed", _) => {}
            _ => return Err(format!("unsupported extended option: {e}")),
        }
    }
    Ok(o)
}

/// Opens (creating or sizing) the image; returns it and whether it reads as zeroes.
pub(crate) fn prepare_image(path: &Path, size: Option<u64>) -> CliResult<(rext4::dev::FileDevice, bool)> {
    use std::os::unix::fs::FileTypeExt;
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
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        f.set_len(len).map_err(|e| format!("{}: {e}", path.display()))?;
        zeroed = true;
    }
    let dev = rext4::dev::FileDevice::open(path, true).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((dev, zeroed))
}

pub(crate) fn run(a: &MkfsArgs) -> CliResult {
    let mut o = options(a)?;
    let size = a.size.as_deref().map(|s| parse_size(s, a.block_size)).transpose()?;
    o.size = size;
    if let Ok(t) = std::env::var("E2FSPROGS_FAKE_TIME") {
        o.time = t.trim().parse().ok();
    }
    let (dev, zeroed) = prepare_image(&a.image, size)?;
    o.device_zeroed = zeroed;
    let r = rext4::Fs::format(&dev, &o).map_err(|e| format!("{}: {e}", a.image.display()))?;
    if !a.quiet {
        println!(
            "{}: {} blocks of {} bytes, {} inodes, {} groups{}",
            a.image.display(),
            r.blocks_count,
            r.block_size,
            r.inodes_count,
            r.group_count,
            if r.journal_blocks > 0 { format!(", journal of {} blocks", r.journal_blocks) } else { String::new() }
        );
    }
    let _ = a.force;
    Ok(())
}
