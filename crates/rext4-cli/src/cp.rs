//! `rext4 cp`: copy files and trees out of an image, keeping modes, owners (as root), times to
//! the nanosecond, symbolic links, hard links, device nodes, fifos, xattrs and holes.

use crate::fmt::name;
use crate::imagepath::ImagePath;
use crate::CliResult;
use indicatif::{ProgressBar, ProgressStyle};
use rext4::{Attr, FileType, Fs, InodeNo};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

/// One thing to create on the host.
struct Item {
    attr: Attr,
    host: PathBuf,
}

/// `rext4 cp [-r] IMAGE:/path HOSTPATH`.
pub fn copy_out(source: &str, dest: &Path, recursive: bool, quiet: bool) -> CliResult {
    let p = ImagePath::parse(source)?;
    let fs = p.open()?;
    // Like cp: a symlink operand is followed unless copying recursively.
    let top =
        if recursive { fs.symlink_metadata(&p.path) } else { fs.metadata(&p.path) }.map_err(|e| p.err(e))?;
    if top.kind == FileType::Directory && !recursive {
        return Err(format!("-r not specified; omitting directory '{}'", p.path));
    }
    let base = p.path.trim_end_matches('/').rsplit('/').next().unwrap_or("").to_string();
    let target = if dest.is_dir() && !base.is_empty() { dest.join(&base) } else { dest.to_path_buf() };

    let mut plan = vec![Item { attr: top, host: target }];
    let mut i = 0;
    while i < plan.len() {
        if plan[i].attr.kind == FileType::Directory {
            let (dir, host) = (plan[i].attr.ino, plan[i].host.clone());
            let entries = p.children(&fs, dir)?;
            for e in entries {
                let attr = fs.getattr(e.ino).map_err(|err| p.err(format!("{}: {err}", name(&e.name))))?;
                plan.push(Item { attr, host: host.join(OsStr::from_bytes(&e.name)) });
            }
        }
        i += 1;
    }

    let total: u64 =
        plan.iter().filter(|it| it.attr.kind == FileType::RegularFile).map(|it| it.attr.size).sum();
    let bar = if quiet { ProgressBar::hidden() } else { ProgressBar::new(total) };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let root = nix::unistd::geteuid().is_root();
    let mut links: HashMap<InodeNo, PathBuf> = HashMap::new();
    let mut warnings = Vec::new();
    for it in &plan {
        create(&fs, it, &mut links, &bar, &mut warnings)
            .map_err(|e| format!("{}: {e}", it.host.display()))?;
        finish_attrs(&fs, it, root, &mut warnings);
        if it.attr.kind != FileType::Directory {
            set_times(it)?;
        }
    }
    // Directory modes and times last: creating children needed write access and changed
    // their times.
    for it in plan.iter().rev().filter(|it| it.attr.kind == FileType::Directory) {
        chmod(it, &mut warnings);
        set_times(it)?;
    }
    bar.finish_and_clear();
    for w in warnings {
        eprintln!("rext4: warning: {w}");
    }
    Ok(())
}

fn create(
    fs: &Fs,
    it: &Item,
    links: &mut HashMap<InodeNo, PathBuf>,
    bar: &ProgressBar,
    warnings: &mut Vec<String>,
) -> Result<(), String> {
    let a = &it.attr;
    let host = &it.host;
    if a.kind != FileType::Directory && a.nlink > 1 {
        if let Some(first) = links.get(&a.ino) {
            return std::fs::hard_link(first, host).map_err(|e| e.to_string());
        }
        links.insert(a.ino, host.clone());
    }
    match a.kind {
        FileType::Directory => match std::fs::create_dir(host) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && host.is_dir() => Ok(()),
            r => r.map_err(|e| e.to_string()),
        },
        FileType::RegularFile => copy_file(fs, a, host, bar),
        FileType::Symlink => {
            let t = fs.readlink(a.ino).map_err(|e| e.to_string())?;
            symlink(OsStr::from_bytes(&t), host).map_err(|e| e.to_string())
        }
        FileType::Fifo => nix::unistd::mkfifo(host, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .map_err(|e| e.to_string()),
        FileType::CharDevice | FileType::BlockDevice => {
            let kind = if a.kind == FileType::CharDevice {
                nix::sys::stat::SFlag::S_IFCHR
            } else {
                nix::sys::stat::SFlag::S_IFBLK
            };
            let dev = nix::sys::stat::makedev(u64::from(a.rdev.0), u64::from(a.rdev.1));
            nix::sys::stat::mknod(host, kind, nix::sys::stat::Mode::from_bits_truncate(0o600), dev)
                .map_err(|e| e.to_string())
        }
        FileType::Socket => {
            warnings.push(format!("{}: sockets cannot be copied; skipped", host.display()));
            Ok(())
        }
    }
}

fn copy_file(fs: &Fs, a: &Attr, host: &Path, bar: &ProgressBar) -> Result<(), String> {
    let mut f =
        OpenOptions::new().write(true).create(true).truncate(true).open(host).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < a.size {
        let n = fs.read(a.ino, off, &mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        write_sparse(&mut f, &buf[..n]).map_err(|e| e.to_string())?;
        off += n as u64;
        bar.inc(n as u64);
    }
    f.set_len(a.size).map_err(|e| e.to_string())
}

/// Writes `data` at the current position, seeking over all-zero 4 KiB pieces so holes stay
/// holes.
fn write_sparse(f: &mut std::fs::File, data: &[u8]) -> std::io::Result<()> {
    for piece in data.chunks(4096) {
        if piece.iter().all(|&b| b == 0) {
            f.seek(SeekFrom::Current(piece.len() as i64))?;
        } else {
            f.write_all(piece)?;
        }
    }
    Ok(())
}

fn finish_attrs(fs: &Fs, it: &Item, root: bool, warnings: &mut Vec<String>) {
    let a = &it.attr;
    if a.kind == FileType::Socket {
        return;
    }
    let host = &it.host;
    if let Ok(names) = fs.listxattr(a.ino) {
        for n in names {
            // Symlinks cannot carry user.* attributes on Linux.
            if a.kind == FileType::Symlink && n.starts_with(b"user.") {
                continue;
            }
            let Ok(v) = fs.getxattr(a.ino, &n) else {
                continue;
            };
            if let Err(e) = xattr::set(host, OsStr::from_bytes(&n), &v) {
                warnings.push(format!("{}: xattr {}: {e}", host.display(), name(&n)));
            }
        }
    }
    if root {
        if let Err(e) = std::os::unix::fs::lchown(host, Some(a.uid), Some(a.gid)) {
            warnings.push(format!("{}: chown: {e}", host.display()));
        }
    }
    // After chown, which clears set-id bits; directories wait until their children exist.
    if a.kind != FileType::Symlink && a.kind != FileType::Directory {
        chmod(it, warnings);
    }
}

fn chmod(it: &Item, warnings: &mut Vec<String>) {
    let mode = std::fs::Permissions::from_mode(u32::from(it.attr.perm()));
    if let Err(e) = std::fs::set_permissions(&it.host, mode) {
        warnings.push(format!("{}: chmod: {e}", it.host.display()));
    }
}

fn set_times(it: &Item) -> CliResult {
    let a = &it.attr;
    if a.kind == FileType::Socket {
        return Ok(());
    }
    let ft = |t: rext4::Timestamp| filetime::FileTime::from_unix_time(t.sec, t.nsec);
    filetime::set_symlink_file_times(&it.host, ft(a.atime), ft(a.mtime))
        .map_err(|e| format!("{}: {e}", it.host.display()))
}
