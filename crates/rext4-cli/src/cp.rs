//! `rext4 cp`: copy files and trees out of an image, keeping modes, owners (as root), times to
//! the nanosecond, symbolic links, hard links, device nodes, fifos, xattrs and holes.

use crate::export_safe::{HostDir, Parent};
use crate::fmt::{bad_name, name};
use crate::imagepath::ImagePath;
use crate::CliResult;
use indicatif::{ProgressBar, ProgressStyle};
use rext4::{Attr, FileType, Fs, InodeNo};
use std::collections::{HashMap, HashSet};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// One thing to create on the host: `name` in the directory made for plan item `parent`
/// (the export's base directory for the top item).
struct Item {
    attr: Attr,
    parent: Option<usize>,
    name: Vec<u8>,
}

/// The names from the base directory down to item `i`, itself included.
fn comps(plan: &[Item], mut i: usize) -> Vec<&[u8]> {
    let mut out = vec![plan[i].name.as_slice()];
    while let Some(p) = plan[i].parent {
        out.push(plan[p].name.as_slice());
        i = p;
    }
    out.reverse();
    out
}

/// The host directory that holds item `i`.
fn parent_comps(plan: &[Item], i: usize) -> Vec<&[u8]> {
    plan[i].parent.map(|p| comps(plan, p)).unwrap_or_default()
}

/// `rext4 cp [-r] IMAGE:/path HOSTPATH`.
pub(crate) fn copy_out(source: &str, dest: &Path, recursive: bool, quiet: bool) -> CliResult {
    let p = ImagePath::parse(source)?;
    let fs = p.open()?;
    // Like cp: a symlink operand is followed unless copying recursively.
    let top =
        if recursive { fs.symlink_metadata(&p.path) } else { fs.metadata(&p.path) }.map_err(|e| p.err(e))?;
    if top.kind == FileType::Directory && !recursive {
        return Err(format!("-r not specified; omitting directory '{}'", p.path));
    }
    // The operand's own last name; `/`, `.` and `..` mean "its contents", as `cp -r dir/. out`.
    let base = p.path.trim_end_matches('/').rsplit('/').next().unwrap_or("").to_string();
    let base = if base == "." || base == ".." { String::new() } else { base };
    let (host, top_name) = match (dest.is_dir(), dest.file_name()) {
        (true, _) if !base.is_empty() => (HostDir::open(dest)?, base.into_bytes()),
        (true, _) | (false, None) => (HostDir::open(dest)?, b".".to_vec()),
        (false, Some(n)) => {
            let parent = dest.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
            (HostDir::open(parent)?, n.as_bytes().to_vec())
        }
    };

    let mut warnings = Vec::new();
    let mut failed = false;
    let mut plan = vec![Item { attr: top, parent: None, name: top_name }];
    let mut seen_dirs: HashSet<InodeNo> = HashSet::from([plan[0].attr.ino]);
    let mut i = 0;
    while i < plan.len() {
        if plan[i].attr.kind == FileType::Directory {
            let dir = plan[i].attr.ino;
            for e in p.children(&fs, dir)? {
                if let Some(why) = bad_name(&e.name) {
                    warnings.push(format!("directory inode {dir}: {why}: '{}'; skipped", name(&e.name)));
                    failed = true;
                    continue;
                }
                let attr = fs.getattr(e.ino).map_err(|err| p.err(format!("{}: {err}", name(&e.name))))?;
                if attr.kind == FileType::Directory && !seen_dirs.insert(attr.ino) {
                    let at = host.display(&[comps(&plan, i), vec![&e.name[..]]].concat());
                    warnings.push(format!("directory cycle at {at} (inode {}); not copied", attr.ino));
                    failed = true;
                    continue;
                }
                plan.push(Item { attr, parent: Some(i), name: e.name });
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
    let mut links: HashMap<InodeNo, usize> = HashMap::new();
    // The plan lists each directory's entries together: one open parent at a time.
    let mut cur: Option<(Option<usize>, Parent)> = None;
    // A refusal (an existing symlink, a non-directory in the way) skips that entry and what
    // is below it; the rest of the export goes on.
    let mut made = vec![false; plan.len()];
    for (idx, it) in plan.iter().enumerate() {
        let shown = || host.display(&comps(&plan, idx));
        if it.parent.is_some_and(|par| !made[par]) {
            continue;
        }
        if cur.as_ref().is_none_or(|(k, _)| *k != it.parent) {
            match host.dir(&parent_comps(&plan, idx)) {
                Ok(dir) => cur = Some((it.parent, dir)),
                Err(e) => {
                    warnings.push(format!("{}: {e}", shown()));
                    failed = true;
                    cur = None;
                    continue;
                }
            }
        }
        let Some((_, dir)) = cur.as_ref() else { continue };
        if let Err(e) = create(&fs, &host, &plan, idx, dir, &mut links, &bar, &mut warnings) {
            warnings.push(format!("{}: {e}", shown()));
            failed = true;
            continue;
        }
        made[idx] = true;
        finish_attrs(&fs, it, dir, root, &shown(), &mut warnings);
        if it.attr.kind != FileType::Directory {
            set_times(it, dir, &shown(), &mut warnings);
        }
    }
    // Directory modes and times last: creating children needed write access and changed
    // their times.
    for (idx, it) in
        plan.iter().enumerate().rev().filter(|(i, it)| made[*i] && it.attr.kind == FileType::Directory)
    {
        let shown = host.display(&comps(&plan, idx));
        let Ok(dir) = host.dir(&parent_comps(&plan, idx)) else { continue };
        chmod(it, &dir, &shown, &mut warnings);
        set_times(it, &dir, &shown, &mut warnings);
    }
    bar.finish_and_clear();
    for w in warnings {
        eprintln!("rext4: warning: {w}");
    }
    if failed {
        return Err(format!("{}: some entries were not copied (see above)", p.path));
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn create(
    fs: &Fs,
    host: &HostDir,
    plan: &[Item],
    idx: usize,
    dir: &Parent,
    links: &mut HashMap<InodeNo, usize>,
    bar: &ProgressBar,
    warnings: &mut Vec<String>,
) -> Result<(), String> {
    let it = &plan[idx];
    let a = &it.attr;
    if a.kind != FileType::Directory && a.nlink > 1 {
        if let Some(&first) = links.get(&a.ino) {
            let from = host.dir(&parent_comps(plan, first)).map_err(|e| e.to_string())?;
            return dir.link(&it.name, &from, &plan[first].name);
        }
        links.insert(a.ino, idx);
    }
    match a.kind {
        FileType::Directory => dir.mkdir(&it.name),
        FileType::RegularFile => copy_file(fs, a, dir.create_file(&it.name)?, bar),
        FileType::Symlink => {
            let t = fs.readlink_noatime(a.ino).map_err(|e| e.to_string())?;
            dir.symlink(&it.name, &t)
        }
        FileType::Fifo => dir.mkfifo(&it.name),
        FileType::CharDevice | FileType::BlockDevice => {
            let kind = if a.kind == FileType::CharDevice {
                nix::sys::stat::SFlag::S_IFCHR
            } else {
                nix::sys::stat::SFlag::S_IFBLK
            };
            dir.mknod(&it.name, kind, nix::sys::stat::makedev(u64::from(a.rdev.0), u64::from(a.rdev.1)))
        }
        FileType::Socket => {
            warnings.push(format!("{}: sockets cannot be copied; skipped", host.display(&comps(plan, idx))));
            Ok(())
        }
    }
}

fn copy_file(fs: &Fs, a: &Attr, mut f: std::fs::File, bar: &ProgressBar) -> Result<(), String> {
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

/// Owner, extended attributes and (but for directories, done last) mode. Each failure is a
/// warning, never silent.
fn finish_attrs(fs: &Fs, it: &Item, dir: &Parent, root: bool, shown: &str, warnings: &mut Vec<String>) {
    let a = &it.attr;
    if a.kind == FileType::Socket {
        return;
    }
    // chown first: it clears security.capability and the set-id bits, which come after.
    if root {
        if let Err(e) = dir.chown(&it.name, a.uid, a.gid) {
            warnings.push(format!("{shown}: chown: {e}"));
        }
    }
    match fs.listxattr(a.ino) {
        Err(e) => warnings.push(format!("{shown}: extended attributes not copied: {e}")),
        Ok(names) => {
            for n in names {
                // Linux keeps no user.* attributes on symlinks.
                if a.kind == FileType::Symlink && n.starts_with(b"user.") {
                    warnings.push(format!("{shown}: xattr {}: not supported on a symlink", name(&n)));
                    continue;
                }
                match fs.getxattr(a.ino, &n) {
                    Ok(v) => {
                        if let Err(e) = dir.set_xattr(&it.name, &n, &v) {
                            warnings.push(format!("{shown}: xattr {}: {e}", name(&n)));
                        }
                    }
                    Err(e) => warnings.push(format!("{shown}: xattr {}: {e}", name(&n))),
                }
            }
        }
    }
    if a.kind != FileType::Symlink && a.kind != FileType::Directory {
        chmod(it, dir, shown, warnings);
    }
}

fn chmod(it: &Item, dir: &Parent, shown: &str, warnings: &mut Vec<String>) {
    if it.attr.kind == FileType::Symlink {
        return;
    }
    if let Err(e) = dir.chmod(&it.name, it.attr.perm()) {
        warnings.push(format!("{shown}: chmod: {e}"));
    }
}

fn set_times(it: &Item, dir: &Parent, shown: &str, warnings: &mut Vec<String>) {
    let a = &it.attr;
    if a.kind == FileType::Socket {
        return;
    }
    if let Err(e) = dir.set_times(&it.name, a.atime, a.mtime) {
        warnings.push(format!("{shown}: times: {e}"));
    }
}
