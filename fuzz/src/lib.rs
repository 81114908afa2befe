//! Shared pieces of the fuzz targets: small base images made with `mkfs.ext4` at fuzz start,
//! patches applied to them, and a bounded walk of everything an image holds.

use rext4::dev::{BlockDevice, MemDevice};
use rext4::{FileType, Fs, InodeNo, Options};
use rext4_format::checksum::{crc32c, inode_csum_seed};
use rext4_format::group_desc::GroupDesc;
use rext4_format::superblock::Superblock;
use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

/// The master key of the `encrypt` base image's encrypted directory, given to every open (a
/// patched context that names another key is read as without it).
fn fuzz_key() -> rext4::EncryptionKey {
    // Cannot fail: 64 bytes is a valid key size.
    rext4::EncryptionKey::new((0..64u8).collect()).expect("a 64-byte key")
}

/// How the targets open an image: the defaults, with the encrypted directory's key.
fn base_options() -> Options {
    Options { encryption_keys: vec![fuzz_key()], ..Options::default() }
}

/// Opens `bytes` as a filesystem and walks it; errors are fine, panics are the fuzzer's to see.
pub fn open_and_walk(bytes: Vec<u8>) {
    if let Ok(fs) = Fs::from_device(Arc::new(MemDevice::new(bytes)), base_options()) {
        walk(&fs);
    }
}

/// Opens `bytes` writable, changes it with every kind of operation (see [`change`]), reads
/// it back and unmounts. `limits`: quota limits enforced where the image keeps quotas (the
/// changes then meet the limits [`change`] sets). Errors are fine; panics and hangs are the
/// fuzzer's to see.
pub fn open_and_change(bytes: Vec<u8>, limits: bool) {
    let opts = Options { writable: true, ..base_options() };
    let enforced = rext4::QuotaEnforcement { user: true, group: true, project: true };
    let dev = Arc::new(MemDevice::new(without_mmp_wait(bytes)));
    let fs = match limits {
        true => match Fs::from_device(dev.clone(), Options { quota_limits: enforced, ..opts.clone() }) {
            // Without the quota feature limits are refused: open as usual.
            Err(rext4::Error::NotSupported(_)) => Fs::from_device(dev, opts),
            r => r,
        },
        false => Fs::from_device(dev, opts),
    };
    if let Ok(fs) = fs {
        change(&fs);
        walk(&fs);
        let _ = fs.sync();
        let _ = fs.unmount();
    }
}

/// `bytes` with a multi-mount protection block that says "in use" (any number but clean and
/// e2fsck's) made clean: the writable open would wait 22 s on it, as the kernel's does, which
/// the fuzzer would take for a hang. Everything else about the block (place, magic,
/// checksum, e2fsck's number) is left to the open to judge.
fn without_mmp_wait(mut bytes: Vec<u8>) -> Vec<u8> {
    use rext4_format::mmp::{MmpBlock, SEQ_CLEAN, SEQ_FSCK};
    use zerocopy::IntoBytes;
    let Some(sb) = bytes.get(1024..2048).and_then(Superblock::parse) else { return bytes };
    let Some(bs) = sb.block_size() else { return bytes };
    let at = usize::try_from(sb.s_mmp_block.get()).ok().and_then(|b| b.checked_mul(bs as usize));
    let Some(m) = at.and_then(|at| bytes.get(at..)).and_then(MmpBlock::parse) else { return bytes };
    if matches!(m.mmp_seq.get(), SEQ_CLEAN | SEQ_FSCK) {
        return bytes;
    }
    let (seed, csum) = (sb.csum_seed(), sb.has_metadata_csum());
    let valid = m.verify_checksum(seed, csum);
    let mut m = m;
    m.mmp_seq.set(SEQ_CLEAN);
    if valid {
        m.update_checksum(seed, csum);
    }
    let at = at.unwrap_or_default();
    bytes[at..at + m.as_bytes().len()].copy_from_slice(m.as_bytes());
    bytes
}

/// Every kind of change, on the names the base images hold (see `build`) and on new ones,
/// ignoring errors: a corrupt image may refuse any of them, or turn read-only half way.
pub fn change(fs: &Fs) {
    use rext4::{SetAttr, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE};
    let root = fs.root();
    let ino = |dir: InodeNo, name: &[u8]| fs.lookup(dir, name).map(|a| a.ino).ok();
    let size = |i: InodeNo, len: u64| fs.setattr(i, &SetAttr { size: Some(len), ..SetAttr::default() });
    let data = vec![0x5Au8; 6000];
    // Quota limits, for an id with an entry and one without (a new branch of the tree).
    for id in [0, 4242] {
        let l = rext4::QuotaLimits { space_soft_kib: 1, space_hard_kib: 64, inodes_soft: 1, inodes_hard: 2 };
        let _ = fs.set_quota_limits(rext4::QuotaType::User, id, l);
    }

    // Existing files: overwrite, extend, shrink, punch, zero, xattrs.
    if let Some(frag) = ino(root, b"frag") {
        let _ = fs.write(frag, 3000, &data[..1500]);
        let _ = fs.fallocate(frag, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1024, 4096);
        let _ = fs.fallocate(frag, FALLOC_FL_ZERO_RANGE, 8000, 3000);
        let _ = size(frag, 5000);
        let _ = size(frag, 0);
    }
    if let Some(small) = ino(root, b"small") {
        let _ = fs.setxattr(small, b"user.new", &data[..2000], 0);
        let _ = fs.removexattr(small, b"user.big");
        let _ = fs.setxattr(small, b"user.tiny", b"replaced", rext4::XATTR_REPLACE);
        let _ = fs.write(small, 11, b" and more");
    }
    if let Some(medium) = ino(root, b"medium") {
        let _ = fs.write(medium, 100, &data);
        let _ = fs.setxattr(medium, b"trusted.t", &data[..300], rext4::XATTR_CREATE);
        // Over a 1 KiB block: an EA inode where the image has them (replacing one there).
        let _ = fs.setxattr(medium, b"user.large", &data[..4000], 0);
        let _ = fs.setattr(medium, &SetAttr { uid: Some(4242), ..SetAttr::default() });
    }
    // New files, sparse and dense.
    if let Ok(a) = fs.create(root, b"new1", 0o644, 0, 0) {
        let _ = fs.write(a.ino, 0, &data);
        let _ = fs.write(a.ino, 1 << 20, &data[..100]);
        let _ = fs.fallocate(a.ino, 0, 16384, 8192);
        let _ = size(a.ino, 100);
    }
    // A large directory: remove, add (splits), rename within and out of it, link into it.
    if let Some(big) = ino(root, b"big") {
        for i in 0..40 {
            let _ = fs.unlink(big, format!("entry_{i:04}_padding").as_bytes());
        }
        for i in 0..60 {
            let _ = fs.create(big, format!("a_new_entry_{i}_with_a_longer_name").as_bytes(), 0o600, 0, 0);
        }
        for i in 40..50 {
            let _ = fs.rename(
                big,
                format!("entry_{i:04}_padding").as_bytes(),
                big,
                format!("r{i}").as_bytes(),
                0,
            );
        }
        if let Some(dir1) = ino(root, b"dir1") {
            let _ = fs.rename(big, b"entry_0060_padding", dir1, b"moved", 0);
            let _ = fs.rename(big, b"entry_0061_padding", dir1, b"a", 0);
        }
        if let Some(small) = ino(root, b"small") {
            let _ = fs.link(small, big, b"hard");
        }
        // Other cases of names (the same names where `big` is casefolded).
        for i in 70..80 {
            let _ = fs.unlink(big, format!("ENTRY_{i:04}_Padding").as_bytes());
        }
        let _ = fs.create(big, "Entry_0090_PADDING\u{200B}".as_bytes(), 0o600, 0, 0);
        let _ = fs.create(big, b"bad\xff", 0o600, 0, 0);
    }
    // Directories: make, move across parents, empty and remove.
    if let Some(dir1) = ino(root, b"dir1") {
        if let Ok(d2) = fs.mkdir(root, b"d2", 0o755, 0, 0) {
            let _ = fs.mkdir(d2.ino, b"d3", 0o755, 0, 0);
            let _ = fs.rename(root, b"d2", dir1, b"d2", 0);
        }
        if let Some(sub) = ino(dir1, b"sub") {
            let _ = fs.rmdir(dir1, b"sub");
            let _ = fs.unlink(sub, b"file");
            let _ = fs.rmdir(dir1, b"sub");
        }
        let _ = fs.removexattr(dir1, b"user.d");
        let _ = fs.rename(dir1, b"d2", root, b"big", 0);
    }
    // Links, special files, exchange.
    let _ = fs.symlink(root, b"sl-fast", b"dir1/a", 0, 0);
    let _ = fs.symlink(root, b"sl-slow", &[b'x'; 200], 0, 0);
    let _ = fs.mknod(root, b"fifo", 0o010644, (0, 0), 0, 0);
    let _ = fs.rename(root, b"fastlink", root, b"slowlink", rext4::RENAME_EXCHANGE);
    let _ = fs.rename(root, b"sl-fast", root, b"sl-moved", rext4::RENAME_WHITEOUT);
    // A nameless file: one released unnamed, one given a name.
    for named in [false, true] {
        if let Ok(t) = fs.tmpfile(root, 0o600, 0, 0) {
            let _ = fs.write(t.ino, 0, &data[..3000]);
            if named {
                let _ = fs.link(t.ino, root, b"from-tmpfile");
            }
            let _ = fs.release(t.ino);
        }
    }
    // An open file unlinked, written and released (the orphan paths).
    if let Ok(a) = fs.create(root, b"orphan", 0o644, 0, 0) {
        if fs.hold(a.ino).is_ok() {
            let _ = fs.write(a.ino, 0, &data);
            let _ = fs.unlink(root, b"orphan");
            let _ = size(a.ino, 10);
            let _ = fs.release(a.ino);
        }
    }
    let _ = fs.unlink(root, b"medium");
    // Flags: an immutable file refuses changes until the flag goes; an append-only directory
    // takes names but gives none up.
    if let Some(small) = ino(root, b"small") {
        let flags = fs.getattr(small).map_or(0, |a| a.flags & rext4::FL_USER_VISIBLE);
        let _ = fs.set_flags(small, flags | rext4::format::inode::IMMUTABLE_FL);
        let _ = fs.write(small, 0, b"refused");
        let _ = fs.set_flags(small, flags);
    }
    if let Some(dir1) = ino(root, b"dir1") {
        let flags = fs.getattr(dir1).map_or(0, |a| a.flags & rext4::FL_USER_VISIBLE);
        let _ = fs.set_flags(dir1, flags | rext4::format::inode::APPEND_FL);
        let _ = fs.create(dir1, b"appended", 0o644, 0, 0);
        let _ = fs.unlink(dir1, b"appended");
        let _ = fs.set_flags(dir1, flags);
    }
}

/// Visits everything reachable, with bounds on inodes, entries and bytes read so that a
/// corrupt image cannot make the walk itself unbounded: readdir (from the start and resumed),
/// lookup of every name, getattr, reads, readlink, xattrs, statfs, and the path API.
pub fn walk(fs: &Fs) {
    const MAX_INODES: usize = 400;
    const MAX_ENTRIES: usize = 600;
    const MAX_READ: u64 = 64 << 10;
    let _ = fs.statfs();
    let _ = fs.read_only_reasons();
    // The quota files, parsed again on a read-only open (a writable one loaded them).
    for ty in [rext4::QuotaType::User, rext4::QuotaType::Group, rext4::QuotaType::Project] {
        let _ = fs.quota_report(ty);
    }
    let mut seen = HashSet::new();
    let mut stack = vec![(fs.root(), 0u32)];
    let mut buf = vec![0u8; 16 << 10];
    while let Some((ino, depth)) = stack.pop() {
        if !seen.insert(ino) || seen.len() > MAX_INODES {
            continue;
        }
        if let Ok(names) = fs.listxattr(ino) {
            for n in names.iter().take(16) {
                let _ = fs.getxattr(ino, n);
            }
        }
        let _ = fs.getxattr(ino, b"system.posix_acl_access");
        let Ok(attr) = fs.getattr(ino) else { continue };
        match attr.kind {
            FileType::Directory => {
                let mut entries = Vec::new();
                let _ = fs.readdir(ino, 0, |e| {
                    entries.push(e);
                    entries.len() < MAX_ENTRIES
                });
                if let Some(mid) = entries.get(entries.len() / 2) {
                    let _ = fs.readdir(ino, mid.next, |_| false);
                }
                for e in &entries {
                    if e.name == b"." || e.name == b".." {
                        continue;
                    }
                    let _ = fs.lookup(ino, &e.name);
                    if depth < 8 {
                        stack.push((e.ino, depth + 1));
                    }
                }
                let _ = fs.lookup(ino, b"no-such-name");
            }
            FileType::RegularFile => {
                let mut off = 0u64;
                while off < attr.size.min(MAX_READ) {
                    match fs.read(ino, off, &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => off += n as u64,
                    }
                }
                if attr.size > 0 {
                    let _ = fs.read(ino, attr.size - 1, &mut buf[..1]);
                }
                let _ = fs.read(ino, u64::MAX - 3, &mut buf[..8]);
            }
            FileType::Symlink => {
                let _ = fs.readlink(ino);
            }
            _ => {}
        }
    }
    let _ = fs.getattr(InodeNo(u32::MAX));
    if let Ok(rd) = fs.read_dir("/") {
        for e in rd.take(32).flatten() {
            let mut p = b"/".to_vec();
            p.extend_from_slice(&e.name);
            let p = std::path::PathBuf::from(
                <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(p),
            );
            let _ = fs.metadata(&p);
            let _ = fs.read_link(&p);
            if let Ok(rd) = fs.read_dir(&p) {
                let _ = rd.take(MAX_ENTRIES).count();
            }
        }
    }
}

/// A valid image to corrupt, and its metadata blocks (what a walk reads through the block
/// cache: superblock, descriptors, inode tables, directory, extent, index and xattr blocks).
pub struct BaseImage {
    pub name: &'static str,
    pub bytes: Vec<u8>,
    pub block_size: usize,
    pub meta_blocks: Vec<u64>,
}

/// (name, mkfs arguments, size): small images so that copying one per run is cheap.
const VARIANTS: &[(&str, &[&str], &str)] = &[
    ("ext4-nocsum-1k", &["-b", "1024", "-O", "^metadata_csum,uninit_bg,^has_journal"], "2M"),
    ("ext2-1k", &["-t", "ext2", "-b", "1024"], "2M"),
    ("inline-1k", &["-b", "1024", "-O", "^metadata_csum,inline_data,^has_journal"], "2M"),
    ("ext4-csum-4k", &["-b", "4096", "-O", "^has_journal"], "4M"),
    // A 1024-block journal whose superblock and first log blocks are among the patch targets
    // (set `needs_recovery` and a log start, and recovery runs at open).
    ("ext4-journal-1k", &["-b", "1024", "-J", "size=1"], "4M"),
    // User and group quota files (inodes 3 and 4), whose blocks are among the patch targets.
    ("quota-1k", &["-b", "1024", "-O", "^metadata_csum,quota,^has_journal"], "2M"),
    // Values in EA inodes, charged to their owners' quotas.
    ("ea-quota-1k", &["-b", "1024", "-O", "^metadata_csum,ea_inode,quota,^has_journal"], "2M"),
    // Multi-mount protection (turned on after the files are in: e2fsprogs' writable opens of
    // an mmp image wait 11 s each), with a journal: its MMP block is among the patch targets.
    ("mmp-1k", &["-b", "1024", "-O", "^metadata_csum", "-J", "size=1"], "4M"),
    // Casefolding: `big` is casefolded (its index rebuilt by e2fsck with folded hashes).
    ("casefold-1k", &["-b", "1024", "-O", "^metadata_csum,casefold,^has_journal"], "2M"),
    // Clusters of four blocks (the filesystem starting at block 0), with a journal.
    ("bigalloc-1k", &["-b", "1024", "-O", "^metadata_csum,bigalloc", "-C", "4096", "-J", "size=1"], "4M"),
    // An encrypted directory (`/enc`, made by rext4 under `fuzz_key`): contexts, encrypted
    // names (an indexed directory of them), contents and symlink targets among the targets.
    ("encrypt-1k", &["-b", "1024", "-O", "^metadata_csum,encrypt,^has_journal"], "2M"),
    // Also an encrypted casefolded directory (`/encf`): entries that carry their hashes, an
    // index of SipHash version.
    (
        "encrypt-casefold-1k",
        &["-b", "1024", "-N", "512", "-O", "^metadata_csum,encrypt,casefold,^has_journal"],
        "2M",
    ),
];

/// The base images, made once per process (needs `mkfs.ext4`, `debugfs` and `e2fsck`).
pub fn base_images() -> &'static [BaseImage] {
    static IMAGES: OnceLock<Vec<BaseImage>> = OnceLock::new();
    IMAGES.get_or_init(|| VARIANTS.iter().map(|&(name, args, size)| build(name, args, size)).collect())
}

fn tool(name: &str) -> String {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| format!("{d}/{name}"))
        .find(|p| Path::new(p).exists())
        .unwrap_or_else(|| panic!("{name} not found: the image_walk target needs e2fsprogs"))
}

fn build(name: &'static str, args: &[&str], size: &str) -> BaseImage {
    use std::io::{Seek, SeekFrom, Write};
    let dir = std::env::temp_dir().join(format!("rext4-fuzz-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("dir1/sub")).unwrap();
    std::fs::write(src.join("dir1/sub/file"), b"hello\n").unwrap();
    std::fs::write(src.join("dir1/a"), b"a\n").unwrap();
    std::fs::create_dir(src.join("big")).unwrap();
    for i in 0..150 {
        std::fs::write(src.join(format!("big/entry_{i:04}_padding")), format!("{i}\n")).unwrap();
    }
    let mut f = std::fs::File::create(src.join("frag")).unwrap();
    for i in 0..12u8 {
        f.seek(SeekFrom::Start(u64::from(i) * 2048)).unwrap();
        f.write_all(&[b'A' + i; 1024]).unwrap();
    }
    drop(f);
    std::fs::write(src.join("small"), b"small file\n").unwrap();
    std::fs::write(src.join("medium"), [b'm'; 100]).unwrap();
    std::os::unix::fs::symlink("dir1/sub/file", src.join("fastlink")).unwrap();
    std::os::unix::fs::symlink(format!("{}target", "d/".repeat(50)), src.join("slowlink")).unwrap();
    let img = dir.join("img");
    let ok = |c: &mut Command| c.status().map(|s| s.code().unwrap_or(8)).unwrap_or(8);
    // A fixed UUID and hash seed keep the image layout (and so the meaning of an input) the
    // same from run to run.
    let uuid = "2f0b6c51-8d6e-4f7a-9a51-6c0de5e1a7b3";
    let rc = ok(Command::new(tool("mkfs.ext4"))
        .stdout(std::process::Stdio::null())
        .args(["-q", "-F", "-U", uuid, "-E", &format!("hash_seed={uuid}")])
        .args(args)
        .arg("-d")
        .arg(&src)
        .arg(&img)
        .arg(size));
    assert_eq!(rc, 0, "mkfs.ext4 {args:?} failed");
    let val = dir.join("val");
    std::fs::write(&val, vec![b'x'; 700]).unwrap();
    // Larger than a block: in an EA inode where the image has them.
    let large = dir.join("large");
    std::fs::write(&large, vec![b'y'; 3000]).unwrap();
    let cmds = dir.join("cmds");
    let mut script = format!(
        "ea_set -f {} /small user.big\nea_set /small user.tiny abc\nea_set /dir1 user.d v\n",
        val.display()
    );
    if args.iter().any(|a| a.contains("ea_inode")) {
        script += &format!("ea_set -f {} /medium user.large\n", large.display());
    }
    if args.iter().any(|a| a.contains("casefold")) {
        script += "set_inode_field /big flags 0x40001000\n";
    }
    std::fs::write(&cmds, script).unwrap();
    let quiet =
        |c: &mut Command| ok(c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()));
    quiet(Command::new(tool("debugfs")).arg("-w").arg("-f").arg(&cmds).arg(&img));
    // Index the directories (mkfs -d writes linear ones), except where that would un-inline.
    let opt = if name.starts_with("inline") { "-fy" } else { "-fyD" };
    assert!(quiet(Command::new(tool("e2fsck")).arg(opt).arg(&img)) <= 1, "e2fsck {opt} failed");
    if name.starts_with("mmp") {
        assert_eq!(quiet(Command::new(tool("tune2fs")).args(["-O", "mmp"]).arg(&img)), 0, "tune2fs -O mmp");
    }
    if name.starts_with("encrypt") {
        encrypt_dir(&img);
    }
    assert_eq!(quiet(Command::new(tool("e2fsck")).arg("-fn").arg(&img)), 0, "{name} is not clean");
    let bytes = std::fs::read(&img).unwrap();
    let sb = Superblock::parse(&bytes[1024..2048]).unwrap();
    let block_size = sb.block_size().unwrap() as usize;
    let mut meta_blocks = record_metadata(&bytes, block_size);
    if sb.s_mmp_block.get() != 0 {
        meta_blocks.push(sb.s_mmp_block.get());
    }
    // The journal's first log blocks and the quota files' blocks (header, tree, entries).
    let mut files: Vec<(u32, u64)> = Vec::new();
    if sb.s_journal_inum.get() != 0 {
        files.extend((0..8).map(|n| (sb.s_journal_inum.get(), n)));
    }
    for q in [sb.s_usr_quota_inum.get(), sb.s_grp_quota_inum.get()] {
        if q != 0 {
            files.extend((0..8).map(|n| (q, n)));
        }
    }
    for (ino, n) in files {
        let out = Command::new(tool("debugfs"))
            .arg("-R")
            .arg(format!("bmap <{ino}> {n}"))
            .arg(&img)
            .output()
            .unwrap();
        if let Ok(b) = String::from_utf8_lossy(&out.stdout).trim().parse::<u64>() {
            if b != 0 && !meta_blocks.contains(&b) {
                meta_blocks.push(b);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    BaseImage { name, bytes, block_size, meta_blocks }
}

/// Makes `/enc` in `img` encrypted under [`fuzz_key`] and fills it: files of a few sizes, a
/// hole, a symlink, a subdirectory of 60 names (indexed with 1 KiB blocks).
fn encrypt_dir(img: &Path) {
    let fs = Fs::open_with(img, Options { writable: true, ..base_options() }).expect("open to encrypt");
    let root = fs.root();
    let enc = fs.mkdir(root, b"enc", 0o755, 0, 0).expect("mkdir /enc").ino;
    fs.set_encryption_policy(enc, &fuzz_key(), 4).expect("set the policy");
    let f = fs.create(enc, b"file", 0o644, 0, 0).expect("create").ino;
    fs.write(f, 0, &[b'e'; 3000]).expect("write");
    fs.write(f, 9000, b"after a hole").expect("write");
    let g = fs.create(enc, "a-longer-name-".repeat(10).as_bytes(), 0o644, 0, 0).expect("create").ino;
    fs.write(g, 0, b"short\n").expect("write");
    fs.symlink(enc, b"link", b"file", 0, 0).expect("symlink");
    let sub = fs.mkdir(enc, b"sub", 0o755, 0, 0).expect("mkdir").ino;
    for i in 0..60 {
        fs.create(sub, format!("entry-{i:03}").as_bytes(), 0o644, 0, 0).expect("create");
    }
    if fs.superblock().incompat().contains(rext4::format::features::Incompat::CASEFOLD) {
        let encf = fs.mkdir(root, b"encf", 0o755, 0, 0).expect("mkdir /encf").ino;
        let flags = fs.getattr(encf).expect("getattr").flags;
        fs.set_flags(encf, flags | rext4::format::inode::CASEFOLD_FL).expect("chattr +F");
        fs.set_encryption_policy(encf, &fuzz_key(), 32).expect("set the policy");
        // Names padded to 32 bytes: 30 of them fill more than a 1 KiB block (indexed).
        for i in 0..30 {
            fs.create(encf, format!("Entry-ǅ-{i:03}").as_bytes(), 0o644, 0, 0).expect("create");
        }
        assert_ne!(fs.getattr(encf).expect("getattr").flags & rext4::format::inode::INDEX_FL, 0);
        fs.symlink(encf, b"Link", "Entry-ǅ-000".as_bytes(), 0, 0).expect("symlink");
    }
    fs.unmount().expect("unmount");
}

/// A device that records the whole-block reads a walk makes (the buffer cache's).
struct Recorder {
    inner: MemDevice,
    bs: u64,
    blocks: Mutex<HashSet<u64>>,
}

impl BlockDevice for Recorder {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        if buf.len() as u64 == self.bs && offset.is_multiple_of(self.bs) {
            self.blocks.lock().unwrap().insert(offset / self.bs);
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

fn record_metadata(bytes: &[u8], bs: usize) -> Vec<u64> {
    let dev = Arc::new(Recorder {
        inner: MemDevice::new(bytes.to_vec()),
        bs: bs as u64,
        blocks: Mutex::new(HashSet::new()),
    });
    let fs = Fs::from_device(dev.clone(), base_options()).expect("base image opens");
    walk(&fs);
    drop(fs);
    let mut v: Vec<u64> = dev.blocks.lock().unwrap().iter().copied().collect();
    v.push(if bs == 1024 { 1 } else { 0 });
    v.sort_unstable();
    v.dedup();
    v
}

/// The fuzz input of `image_walk`, decoded: which base image, whether to re-checksum, and
/// `(offset, xor)` patches.
///
/// Layout: byte 0 selects the image (low bits) and re-checksumming (bit 7); then 5-byte
/// records `[block index: u16 LE][offset in block: u16 LE][xor]`. The block index counts into
/// the image's metadata blocks (so most flips land in metadata), except that index `0xFFFF`
/// makes the next 3 bytes a raw 24-bit image offset (with the 5th byte still the xor).
pub fn patched_image(data: &[u8]) -> Option<(Vec<u8>, &'static BaseImage)> {
    let (&sel, rest) = data.split_first()?;
    let images = base_images();
    let base = &images[usize::from(sel & 0x7F) % images.len()];
    let mut img = base.bytes.clone();
    let mut touched = Vec::new();
    for r in rest.chunks_exact(5).take(64) {
        let idx = u16::from_le_bytes([r[0], r[1]]);
        let off = if idx == 0xFFFF {
            (usize::from(r[2]) | usize::from(r[3]) << 8 | usize::from(r[4] & 0x7F) << 16) % img.len()
        } else {
            let blk = base.meta_blocks[usize::from(idx) % base.meta_blocks.len()] as usize;
            blk * base.block_size + usize::from(u16::from_le_bytes([r[2], r[3]])) % base.block_size
        };
        let x = if r[4] == 0 { 0xFF } else { r[4] };
        img[off] ^= x;
        touched.push(off / base.block_size);
    }
    if sel & 0x80 != 0 {
        refresh_checksums(&mut img, base.block_size, &touched);
    }
    Some((img, base))
}

/// Re-computes the superblock, descriptor and inode checksums (of inodes in touched blocks),
/// so that damage to those structures on a metadata_csum image reaches the structural checks.
/// Uses the (possibly damaged) superblock's own geometry and gives up where it is nonsense.
pub fn refresh_checksums(img: &mut [u8], bs: usize, touched: &[usize]) {
    let Some(sb) = Superblock::parse(&img[1024..2048]) else { return };
    if !sb.has_metadata_csum() {
        return;
    }
    let seed = sb.csum_seed();
    let ds = usize::from(sb.desc_size());
    let ipg = sb.s_inodes_per_group.get();
    let isz = usize::from(sb.inode_size());
    let first = sb.s_first_data_block.get() as usize;
    if !(32..=1024).contains(&ds)
        || !(128..=bs).contains(&isz)
        || ipg == 0
        || sb.block_size() != Some(bs as u32)
    {
        return;
    }
    let groups = (sb.s_inodes_count.get() / ipg).min(64);
    let gdt = (first + 1) * bs;
    for g in 0..groups {
        let o = gdt + g as usize * ds;
        let Some(raw) = img.get(o..o + ds) else { break };
        let Some(d) = GroupDesc::parse(raw, ds) else { break };
        let c = d.csum_crc32c(seed, g, ds);
        img[o + 0x1E..o + 0x20].copy_from_slice(&c.to_le_bytes());
        let table = d.inode_table(ds) as usize;
        let per_block = bs / isz;
        for &t in touched {
            if t < table || t >= table + (ipg as usize).div_ceil(per_block) {
                continue;
            }
            for k in 0..per_block {
                let index = (t - table) * per_block + k;
                let ino = g * ipg + index as u32 + 1;
                let o = t * bs + k * isz;
                let Some(rec) = img.get_mut(o..o + isz) else { continue };
                let generation = u32::from_le_bytes(rec[0x64..0x68].try_into().unwrap());
                rext4_format::inode::set_inode_checksum(rec, inode_csum_seed(seed, ino, generation));
            }
        }
    }
    let c = crc32c(!0, &img[1024..1024 + 0x3FC]);
    img[1024 + 0x3FC..1024 + 0x400].copy_from_slice(&c.to_le_bytes());
}

/// The input read as numbers, zeros once it runs out.
struct Take<'a>(&'a [u8]);

impl Take<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }
    /// `None` half the time (by the next byte), else `f`'s value.
    fn maybe<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> Option<T> {
        if self.u8() & 1 == 0 {
            None
        } else {
            Some(f(self))
        }
    }
}

/// Features `mkfs_options` turns on or off.
const MKFS_FEATURES: &[&str] = &[
    "has_journal",
    "extent",
    "huge_file",
    "flex_bg",
    "metadata_csum",
    "metadata_csum_seed",
    "64bit",
    "dir_nlink",
    "extra_isize",
    "orphan_file",
    "sparse_super",
    "large_file",
    "filetype",
    "resize_inode",
    "dir_index",
    "ext_attr",
    "bigalloc",
    "inline_data",
    "quota",
    "project",
    "meta_bg",
    "mmp",
    "encrypt",
    "casefold",
    "large_dir",
    "fast_commit",
    "sparse_super2",
    "uninit_bg",
    "ea_inode",
    "stable_inodes",
    "verity",
    "journal_dev",
];

/// One `Fs::format` over options read from `data` (see the `mkfs_options` target).
pub fn mkfs_options(data: &[u8]) {
    let mut t = Take(data);
    const MIB: u64 = 1 << 20;
    let size = match t.u8() % 4 {
        0 => t.u64() % (8 * MIB) + 1,
        1 => t.u64() % (64 * MIB) + 1,
        2 => t.u64() % (64 << 30) + 1,
        _ => (64 << 30) >> (t.u8() % 40),
    };
    let mut features = Vec::new();
    for name in MKFS_FEATURES {
        match t.u8() % 8 {
            0 => features.push(name.to_string()),
            1 => features.push(format!("^{name}")),
            _ => {}
        }
    }
    let pow2 = |t: &mut Take, lo: u32, hi: u32| 1u32 << (lo + u32::from(t.u8()) % (hi - lo + 1));
    let mut o = rext4::FormatOptions {
        fs_type: [rext4::FsType::Ext4, rext4::FsType::Ext4, rext4::FsType::Ext2, rext4::FsType::Ext3]
            [usize::from(t.u8() % 4)],
        usage_types: t.maybe(|t| {
            ["small", "floppy", "news", "largefile", "huge", "nonsense"][usize::from(t.u8() % 6)].into()
        }),
        size: Some(size),
        block_size: t.maybe(|t| if t.u8() % 4 == 0 { t.u32() } else { pow2(t, 10, 16) }),
        cluster_size: t.maybe(|t| if t.u8() % 4 == 0 { t.u32() } else { pow2(t, 10, 30) }),
        inode_size: t.maybe(|t| if t.u8() % 4 == 0 { t.u16() } else { 1 << (7 + t.u8() % 4) }),
        inode_ratio: t.maybe(|t| t.u32()),
        inodes: t.maybe(|t| t.u32() >> (t.u8() % 32)),
        blocks_per_group: t.maybe(|t| if t.u8() % 2 == 0 { t.u32() } else { (t.u32() % 65536) & !7 }),
        features: features.join(","),
        journal_size_mib: t.maybe(|t| t.u32() >> (t.u8() % 32)),
        journal_blocks: t.maybe(|t| t.u32() >> (t.u8() % 32)),
        fast_commit_kib: t.maybe(|t| t.u32() >> (t.u8() % 32)),
        label: t.maybe(|t| String::from_utf8_lossy(&t.u64().to_le_bytes()).into_owned()),
        uuid: Some([1; 16]),
        hash_seed: Some([2; 16]),
        root_owner: (t.u32(), t.u32()),
        reserved_ratio: t.maybe(|t| f64::from(t.u8()) / 4.0),
        flex_bg_size: t.maybe(|t| if t.u8() % 2 == 0 { t.u32() } else { pow2(t, 0, 31) }),
        orphan_file_size: t.maybe(|t| match t.u8() % 2 {
            0 => rext4::SizeIn::Blocks(t.u64() >> (t.u8() % 64)),
            _ => rext4::SizeIn::Bytes(t.u64() >> (t.u8() % 64)),
        }),
        quota_types: t.maybe(|t| {
            let b = t.u8();
            [b & 1 != 0, b & 2 != 0, b & 4 != 0]
        }),
        strict_encoding: t.u8() & 1 != 0,
        mmp_update_interval: t.maybe(|t| t.u16()),
        node_name: Some(String::new()),
        time: Some(1_700_000_000),
        ..Default::default()
    };
    o.num_backup_sb = t.maybe(|t| t.u8() % 4);
    o.stride = t.maybe(|t| t.u16());
    o.stripe_width = t.maybe(|t| t.u32());
    o.resize = t.maybe(|t| match t.u8() % 2 {
        0 => rext4::SizeIn::Blocks(t.u64() >> (t.u8() % 64)),
        _ => rext4::SizeIn::Bytes(t.u64() >> (t.u8() % 64)),
    });
    o.errors = t.maybe(|t| u16::from(t.u8() % 5));
    o.last_mounted = t.maybe(|t| String::from_utf8_lossy(&t.u64().to_le_bytes()).into_owned());
    o.dry_run = true;
    let worked_out = Fs::format(&rext4::dev::SizeOnlyDevice(size), &o).is_ok();
    // Small enough to make for real: made in memory, then opened, changed and walked. Not
    // with multi-mount protection, whose writable open waits seconds, as the kernel's does.
    if worked_out && size <= 8 * MIB && !o.features.split(',').any(|f| f == "mmp") {
        o.dry_run = false;
        o.device_zeroed = true;
        let Ok(len) = usize::try_from(size) else { return };
        let mem = MemDevice::new(vec![0u8; len]);
        if Fs::format(&mem, &o).is_ok() {
            open_and_change(mem.snapshot(), false);
        }
    }
}

/// A filesystem and its external journal device as a crash leaves them: made by `Fs::format`
/// and `Fs::format_journal_device` (1 KiB blocks), changed through the journal (transactions
/// committed, not all checkpointed), copied while open. Made once per process.
pub struct JournalBase {
    pub image: Vec<u8>,
    pub journal: Vec<u8>,
}

/// Where each process writes the journal device a run opens (the open takes a path).
fn journal_file() -> &'static std::path::PathBuf {
    static PATH: OnceLock<std::path::PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = if Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() };
        dir.join(format!("rext4-fuzz-journal-{}", std::process::id()))
    })
}

/// The crash image and journal device every `journal_device` run corrupts.
pub fn journal_base() -> &'static JournalBase {
    static BASE: OnceLock<JournalBase> = OnceLock::new();
    BASE.get_or_init(|| {
        let uuid = *b"rext4-fuzz-jdev!";
        let fmt = rext4::FormatOptions {
            block_size: Some(1024),
            uuid: Some(uuid),
            hash_seed: Some(uuid),
            time: Some(1_700_000_000),
            ..rext4::FormatOptions::default()
        };
        let jdev = MemDevice::new(vec![0; 2 << 20]);
        Fs::format_journal_device(&jdev, &fmt).expect("journal device");
        let fs_uuid = *b"rext4-fuzz-fsimg";
        let fs_fmt = rext4::FormatOptions {
            uuid: Some(fs_uuid),
            hash_seed: Some(fs_uuid),
            journal_device: Some(rext4::JournalDeviceRef { uuid, dev_number: 0 }),
            ..fmt
        };
        let img = MemDevice::new(vec![0; 4 << 20]);
        Fs::format(&img, &fs_fmt).expect("filesystem with an external journal");
        Fs::add_journal_user(&jdev, fs_uuid).expect("journal user");
        std::fs::write(journal_file(), jdev.snapshot()).expect("journal device file");
        let img = Arc::new(MemDevice::new(img.snapshot()));
        let opts = Options { writable: true, journal_path: Some(journal_file().clone()), ..base_options() };
        let fs = Fs::from_device(img.clone(), opts).expect("open with the journal device");
        change(&fs);
        let _ = fs.sync();
        let root = fs.root();
        for i in 0..20u32 {
            if let Ok(a) = fs.create(root, format!("late{i}").as_bytes(), 0o644, 0, 0) {
                let _ = fs.write(a.ino, 0, &[i as u8; 3000]);
            }
            let _ = fs.sync();
        }
        // The crash: both devices as they are now, the filesystem still open.
        let base =
            JournalBase { image: img.snapshot(), journal: std::fs::read(journal_file()).expect("journal") };
        drop(fs);
        base
    })
}

/// The input of `journal_device`, decoded: byte 0 says whether to open writable (bit 0);
/// then 5-byte records `[block: u16 LE][offset in block: u16 LE][xor]`, the block counted in
/// the journal device (its first 64 blocks: superblocks and the log's start) unless its top
/// bit is set, when it counts in the filesystem's first 16 blocks (superblock, descriptors).
pub fn patched_journal(data: &[u8]) -> Option<(Vec<u8>, Vec<u8>, bool)> {
    let (&sel, rest) = data.split_first()?;
    let base = journal_base();
    let (mut img, mut journal) = (base.image.clone(), base.journal.clone());
    for r in rest.chunks_exact(5).take(64) {
        let blk = u16::from_le_bytes([r[0], r[1]]);
        let off = usize::from(u16::from_le_bytes([r[2], r[3]])) % 1024;
        let x = if r[4] == 0 { 0xFF } else { r[4] };
        if blk & 0x8000 != 0 {
            let at = (usize::from(blk & 15) * 1024 + off) % img.len();
            img[at] ^= x;
        } else {
            let at = (usize::from(blk % 64) * 1024 + off) % journal.len();
            journal[at] ^= x;
        }
    }
    Some((img, journal, sel & 1 != 0))
}

/// Opens `img` with `journal` as its journal device, walks it, and when `writable` changes
/// and unmounts it. Errors are fine; panics and hangs are the fuzzer's to see.
pub fn open_with_journal(img: Vec<u8>, journal: &[u8], writable: bool) {
    if std::fs::write(journal_file(), journal).is_err() {
        return;
    }
    let opts = Options { writable, journal_path: Some(journal_file().clone()), ..base_options() };
    if let Ok(fs) = Fs::from_device(Arc::new(MemDevice::new(img)), opts) {
        walk(&fs);
        if writable {
            change(&fs);
            let _ = fs.sync();
            let _ = fs.unmount();
        }
    }
}
