//! The read-only inspection commands: info, ls, cat, stat, tree.

use crate::fmt::{mode_string, name, target, time};
use crate::imagepath::ImagePath;
use crate::CliResult;
use rext4::format::features::{feature_names, FeatureKind};
use rext4::format::superblock as fsb;
use rext4::{Attr, FileType, Fs, Timestamp};
use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

fn uuid(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

fn when(sec: i64) -> String {
    if sec == 0 {
        "n/a".into()
    } else {
        format!("{} UTC", &time(Timestamp { sec, nsec: 0 })[..19])
    }
}

/// The name `dumpe2fs` gives an `s_*_error_errcode` (the kernel's `EXT4_ERR_*`).
fn error_code(code: u8) -> String {
    const NAMES: [&str; 17] = [
        "UNKNOWN",
        "EIO",
        "ENOMEM",
        "EFSBADCRC",
        "EFSCORRUPTED",
        "ENOSPC",
        "ENOKEY",
        "EROFS",
        "EFBIG",
        "EEXIST",
        "ERANGE",
        "EOVERFLOW",
        "EBUSY",
        "ENOTDIR",
        "ENOTEMPTY",
        "ESHUTDOWN",
        "EFAULT",
    ];
    NAMES.get(usize::from(code).wrapping_sub(1)).map_or_else(|| code.to_string(), |n| n.to_string())
}

/// `rext4 info IMAGE`: the superblock in the spirit of `dumpe2fs -h`.
pub(crate) fn info(image: &Path) -> CliResult {
    let fs = Fs::open_with(image, crate::modify::read_options())
        .map_err(|e| format!("{}: {e}", image.display()))?;
    let sb = fs.superblock();
    let st = fs.statfs().map_err(|e| e.to_string())?;
    let mut features = feature_names(FeatureKind::Compat, sb.s_feature_compat.get());
    features.extend(feature_names(FeatureKind::Incompat, sb.s_feature_incompat.get()));
    features.extend(feature_names(FeatureKind::RoCompat, sb.s_feature_ro_compat.get()));
    let vol = sb.volume_name();
    let state = sb.s_state.get();
    let mut out = Vec::<(String, String)>::new();
    let mut row = |k: &str, v: String| out.push((k.to_string(), v));
    row("Filesystem volume name", if vol.is_empty() { "<none>".into() } else { name(vol) });
    let lm = sb.last_mounted();
    row("Last mounted on", if lm.is_empty() { "<not available>".into() } else { name(lm) });
    row("Filesystem UUID", uuid(&sb.s_uuid));
    row("Filesystem magic number", format!("0x{:04X}", sb.s_magic.get()));
    let rev = sb.s_rev_level.get();
    row("Filesystem revision #", format!("{rev} ({})", if rev == 0 { "original" } else { "dynamic" }));
    row("Filesystem features", features.join(" "));
    let flags = sb.s_flags.get();
    let mut fl = Vec::new();
    if flags & fsb::FLAGS_SIGNED_HASH != 0 {
        fl.push("signed_directory_hash");
    }
    if flags & fsb::FLAGS_UNSIGNED_HASH != 0 {
        fl.push("unsigned_directory_hash");
    }
    row("Filesystem flags", fl.join(" "));
    let mut st_s = vec![if state & fsb::STATE_VALID != 0 { "clean" } else { "not clean" }];
    if state & fsb::STATE_ERROR != 0 {
        st_s.push("with errors");
    }
    row("Filesystem state", st_s.join(" "));
    row(
        "Errors behavior",
        match sb.s_errors.get() {
            fsb::ERRORS_RO => "Remount read-only",
            fsb::ERRORS_PANIC => "Panic",
            _ => "Continue",
        }
        .into(),
    );
    if sb.s_error_count.get() != 0 {
        row("FS Error count", sb.s_error_count.get().to_string());
    }
    let errors = [
        ("First", sb.first_error_time(), &sb.s_first_error_func, sb.s_first_error_line.get()),
        ("Last", sb.last_error_time(), &sb.s_last_error_func, sb.s_last_error_line.get()),
    ];
    let (inos, blocks) = (
        [sb.s_first_error_ino.get(), sb.s_last_error_ino.get()],
        [sb.s_first_error_block.get(), sb.s_last_error_block.get()],
    );
    let codes = [sb.s_first_error_errcode, sb.s_last_error_errcode];
    for (i, (which, t, func, line)) in errors.into_iter().enumerate() {
        if t == 0 {
            continue;
        }
        let field = |what: &str| format!("{which} error {what}");
        row(&field("time"), when(t));
        row(&field("function"), name(func.split(|&b| b == 0).next().unwrap_or_default()));
        row(&field("line #"), line.to_string());
        row(&field("inode #"), inos[i].to_string());
        if blocks[i] != 0 {
            row(&field("block #"), blocks[i].to_string());
        }
        if codes[i] != 0 {
            row(&field("err"), error_code(codes[i]));
        }
    }
    row("Inode count", sb.s_inodes_count.get().to_string());
    row("Block count", sb.blocks_count().to_string());
    row("Reserved block count", sb.r_blocks_count().to_string());
    row("Free blocks", st.blocks_free.to_string());
    row("Free inodes", st.files_free.to_string());
    row("First block", sb.s_first_data_block.get().to_string());
    row("Block size", fs.block_size().to_string());
    let bigalloc = sb.ro_compat().contains(rext4::format::features::RoCompat::BIGALLOC);
    if bigalloc {
        // Cannot be out of range: the open checked it.
        row("Cluster size", sb.cluster_size().unwrap_or(0).to_string());
    }
    row("Group descriptor size", sb.desc_size().to_string());
    row("Reserved GDT blocks", sb.s_reserved_gdt_blocks.get().to_string());
    row("Blocks per group", sb.s_blocks_per_group.get().to_string());
    if bigalloc {
        row("Clusters per group", sb.s_clusters_per_group.get().to_string());
    }
    row("Inodes per group", sb.s_inodes_per_group.get().to_string());
    if sb.s_log_groups_per_flex != 0 && sb.s_log_groups_per_flex < 32 {
        row("Flex block group size", (1u64 << sb.s_log_groups_per_flex).to_string());
    }
    row("Filesystem created", when(sb.mkfs_time()));
    row("Last mount time", when(sb.mtime()));
    row("Last write time", when(sb.wtime()));
    row("Mount count", sb.s_mnt_count.get().to_string());
    row("Last checked", when(sb.lastcheck()));
    row("Reserved blocks uid", sb.s_def_resuid.get().to_string());
    row("Reserved blocks gid", sb.s_def_resgid.get().to_string());
    row("First inode", sb.first_ino().to_string());
    row("Inode size", sb.inode_size().to_string());
    if sb.inode_size() > 128 {
        row("Required extra isize", sb.s_min_extra_isize.get().to_string());
        row("Desired extra isize", sb.s_want_extra_isize.get().to_string());
    }
    if sb.s_journal_inum.get() != 0 {
        row("Journal inode", sb.s_journal_inum.get().to_string());
    }
    for (what, ino) in [
        ("User quota inode", sb.s_usr_quota_inum.get()),
        ("Group quota inode", sb.s_grp_quota_inum.get()),
        ("Project quota inode", sb.s_prj_quota_inum.get()),
    ] {
        if ino != 0 {
            row(what, ino.to_string());
        }
    }
    if sb.s_orphan_file_inum.get() != 0 {
        row("Orphan file inode", sb.s_orphan_file_inum.get().to_string());
    }
    let hash =
        ["legacy", "half_md4", "tea", "legacy_unsigned", "half_md4_unsigned", "tea_unsigned", "siphash"];
    row(
        "Default directory hash",
        hash.get(usize::from(sb.s_def_hash_version)).unwrap_or(&"unknown").to_string(),
    );
    let seed: Vec<u8> = sb.s_hash_seed.iter().flat_map(|w| w.get().to_le_bytes()).collect();
    row("Directory Hash Seed", uuid(&seed.try_into().unwrap_or([0; 16])));
    if sb.incompat().contains(rext4::format::features::Incompat::CASEFOLD) {
        let e = sb.s_encoding.get();
        let name = rext4::format::casefold::encoding_name(e)
            .map_or_else(|| format!("UNKNOWN_ENCODING_{e}"), String::from);
        row("Character encoding", name);
    }
    if sb.incompat().contains(rext4::format::features::Incompat::MMP) {
        row("MMP block number", sb.s_mmp_block.get().to_string());
        row("MMP update interval", sb.s_mmp_update_interval.get().to_string());
    }
    if sb.has_metadata_csum() {
        row("Checksum type", "crc32c".into());
        row("Checksum", format!("0x{:08x}", sb.s_checksum.get()));
        row("Checksum seed", format!("0x{:08x}", sb.csum_seed()));
    }
    row("Usable blocks (statfs)", st.blocks.to_string());
    for r in fs.read_only_reasons() {
        row("Read-only because", r.clone());
    }
    let mut o = std::io::stdout().lock();
    for (k, v) in out {
        writeln!(o, "{:<26}{v}", format!("{k}:")).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn open(target: &str) -> CliResult<(ImagePath, Fs)> {
    let p = ImagePath::parse_read(target)?;
    let fs = p.open()?;
    Ok((p, fs))
}

fn long_line(fs: &Fs, entry_name: &[u8], a: &Attr) -> String {
    let size = match a.kind {
        FileType::CharDevice | FileType::BlockDevice => format!("{}, {}", a.rdev.0, a.rdev.1),
        _ => a.size.to_string(),
    };
    let mut line = format!(
        "{} {:>3} {:>5} {:>5} {:>10} {} {}",
        mode_string(a),
        a.nlink,
        a.uid,
        a.gid,
        size,
        &time(a.mtime)[..19],
        name(entry_name)
    );
    if a.kind == FileType::Symlink {
        if let Ok(t) = fs.readlink(a.ino) {
            line.push_str(" -> ");
            line.push_str(&target(&t));
        }
    }
    line
}

/// `rext4 ls [-l] [-a] IMAGE:/dir`.
pub(crate) fn ls(target: &str, long: bool, all: bool) -> CliResult {
    let (p, fs) = open(target)?;
    let a = fs.symlink_metadata(&p.path).map_err(|e| p.err(e))?;
    let mut o = std::io::stdout().lock();
    if a.kind != FileType::Directory {
        let base = p.path.rsplit('/').next().unwrap_or(&p.path).as_bytes().to_vec();
        let line = if long { long_line(&fs, &base, &a) } else { name(&base) };
        writeln!(o, "{line}").map_err(|e| e.to_string())?;
        return Ok(());
    }
    let mut entries = Vec::new();
    fs.readdir(a.ino, 0, |e| {
        entries.push(e);
        true
    })
    .map_err(|e| p.err(e))?;
    entries.sort_by(|x, y| x.name.cmp(&y.name));
    for e in entries {
        if !all && e.name.starts_with(b".") {
            continue;
        }
        let line = if long {
            let a = fs.getattr(e.ino).map_err(|err| p.err(format!("{}: {err}", name(&e.name))))?;
            long_line(&fs, &e.name, &a)
        } else {
            name(&e.name)
        };
        writeln!(o, "{line}").map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `rext4 cat IMAGE:/file`.
pub(crate) fn cat(target: &str) -> CliResult {
    let (p, fs) = open(target)?;
    let f = fs.open_file(&p.path).map_err(|e| p.err(e))?;
    let mut o = std::io::stdout().lock();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        let n = f.read_at(&mut buf, off).map_err(|e| p.err(e))?;
        if n == 0 {
            return Ok(());
        }
        o.write_all(&buf[..n]).map_err(|e| e.to_string())?;
        off += n as u64;
    }
}

/// `rext4 stat IMAGE:/path`.
pub(crate) fn stat(target: &str) -> CliResult {
    let (p, fs) = open(target)?;
    let a = fs.symlink_metadata(&p.path).map_err(|e| p.err(e))?;
    let kind = match a.kind {
        FileType::RegularFile if a.size == 0 => "regular empty file",
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symbolic link",
        FileType::CharDevice => "character special file",
        FileType::BlockDevice => "block special file",
        FileType::Fifo => "fifo",
        FileType::Socket => "socket",
    };
    let mut o = std::io::stdout().lock();
    let mut lines = vec![format!("  File: {}", p.path)];
    if a.kind == FileType::Symlink {
        let t = fs.readlink(a.ino).map_err(|e| p.err(e))?;
        lines[0].push_str(&format!(" -> {}", crate::fmt::target(&t)));
    }
    lines.push(format!("  Size: {:<15} Blocks: {:<10} IO Block: {:<6} {kind}", a.size, a.blocks, a.blksize));
    let dev = if matches!(a.kind, FileType::CharDevice | FileType::BlockDevice) {
        format!(" Device type: {},{}", a.rdev.0, a.rdev.1)
    } else {
        String::new()
    };
    lines.push(format!("Inode: {:<15} Links: {}{dev}", a.ino, a.nlink));
    lines.push(format!(
        "Access: ({:04o}/{})  Uid: {:>5}   Gid: {:>5}",
        a.perm(),
        mode_string(&a),
        a.uid,
        a.gid
    ));
    lines.push(format!("Access: {}", time(a.atime)));
    lines.push(format!("Modify: {}", time(a.mtime)));
    lines.push(format!("Change: {}", time(a.ctime)));
    lines.push(format!(" Birth: {}", a.crtime.map(time).unwrap_or_else(|| "-".into())));
    lines.push(format!("Flags: 0x{:08x}  Generation: {}", a.flags, a.generation));
    if let Ok(names) = fs.listxattr(a.ino) {
        for n in names {
            let v = fs
                .getxattr(a.ino, &n)
                .map(|v| format!("{} bytes", v.len()))
                .unwrap_or_else(|e| e.to_string());
            lines.push(format!("Xattr: {} ({v})", name(&n)));
        }
    }
    for l in lines {
        writeln!(o, "{l}").map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `rext4 tree IMAGE:/dir`. A directory met a second time (a crafted image's directory
/// hard link, or a cycle back to an ancestor) is shown but not entered, and reported.
pub(crate) fn tree(target: &str) -> CliResult {
    let (p, fs) = open(target)?;
    let root = fs.metadata(&p.path).map_err(|e| p.err(e))?;
    let mut o = std::io::BufWriter::new(std::io::stdout().lock());
    writeln!(o, "{}", p.path).map_err(|e| e.to_string())?;
    let (mut dirs, mut files) = (0u64, 0u64);
    let mut seen = HashSet::from([root.ino]);
    let mut cycles = Vec::new();
    let top = p.path.trim_end_matches('/').to_string();
    // Depth-first with an explicit stack of sibling lists, so deep trees cannot overflow.
    let mut stack = vec![children(&fs, &p, root.ino, "", &top)?.into_iter()];
    while let Some(top) = stack.last_mut() {
        let Some(child) = top.next() else {
            stack.pop();
            continue;
        };
        if child.is_dir {
            dirs += 1;
            if !seen.insert(child.ino) {
                writeln!(o, "{}  [directory cycle, not followed]", child.line).map_err(|e| e.to_string())?;
                cycles.push(format!(
                    "directory cycle at {}:{} (inode {})",
                    p.image.display(),
                    child.path,
                    child.ino
                ));
                continue;
            }
            writeln!(o, "{}", child.line).map_err(|e| e.to_string())?;
            stack.push(children(&fs, &p, child.ino, &child.prefix, &child.path)?.into_iter());
        } else {
            writeln!(o, "{}", child.line).map_err(|e| e.to_string())?;
            files += 1;
        }
    }
    writeln!(o, "\n{dirs} directories, {files} files").map_err(|e| e.to_string())?;
    o.flush().map_err(|e| e.to_string())?;
    match cycles.split_last() {
        None => Ok(()),
        Some((last, rest)) => {
            for c in rest {
                eprintln!("rext4: {c}");
            }
            Err(last.clone())
        }
    }
}

struct Child {
    line: String,
    is_dir: bool,
    ino: rext4::InodeNo,
    /// Prefix for this entry's own children.
    prefix: String,
    /// Where it is in the image, names escaped.
    path: String,
}

/// The sorted entries of `dir` (at `path`) as `tree` lines under `prefix`.
fn children(fs: &Fs, p: &ImagePath, dir: rext4::InodeNo, prefix: &str, path: &str) -> CliResult<Vec<Child>> {
    let mut entries = p.children(fs, dir)?;
    entries.sort_by(|x, y| x.name.cmp(&y.name));
    let n = entries.len();
    let mut out = Vec::with_capacity(n);
    for (i, e) in entries.into_iter().enumerate() {
        let last = i + 1 == n;
        let a = fs.getattr(e.ino).map_err(|err| p.err(format!("{}: {err}", name(&e.name))))?;
        let mut line = format!("{prefix}{}{}", if last { "`-- " } else { "|-- " }, name(&e.name));
        if a.kind == FileType::Symlink {
            if let Ok(t) = fs.readlink(a.ino) {
                line.push_str(&format!(" -> {}", target(&t)));
            }
        }
        let prefix = format!("{prefix}{}", if last { "    " } else { "|   " });
        let path = format!("{path}/{}", name(&e.name));
        out.push(Child { line, is_dir: a.kind == FileType::Directory, ino: a.ino, prefix, path });
    }
    Ok(out)
}
