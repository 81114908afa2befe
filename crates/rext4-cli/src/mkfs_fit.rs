//! `rext4 mkfs --size-to-fit[=SLACK]`: the smallest image that holds the source tree. What
//! the tree needs is counted first — data blocks per file at the image's block size, extent
//! or indirect blocks, directory blocks (hashed directories fill their leaves about half),
//! xattr blocks, symbolic link blocks, inodes — then the smallest size whose fresh format
//! leaves that many blocks and inodes free is found by formatting (the journal, group
//! metadata and reserved GDT blocks are what the format takes for that size). A fill that
//! still runs out of space grows the estimate and starts over (bounded, in `mkfs_cmd`).

use crate::CliResult;
use std::collections::{BTreeMap, HashSet};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Room asked for beyond the tree: a share of what it needs, or bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Slack {
    Percent(u64),
    Bytes(u64),
}

/// `10%`, `64M`, or empty for none.
pub(crate) fn parse_slack(s: &str) -> CliResult<Slack> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(Slack::Percent(0));
    }
    if let Some(p) = s.strip_suffix('%') {
        return p.trim().parse().map(Slack::Percent).map_err(|_| format!("invalid slack: {s}"));
    }
    Ok(Slack::Bytes(crate::mkfs_cmd::parse_size(s, Some(1))?))
}

/// What the image's format decides about how the tree is stored.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub(crate) block_size: u64,
    pub(crate) inode_size: u64,
    pub(crate) extents: bool,
    pub(crate) metadata_csum: bool,
    /// Blocks per cluster (1 without bigalloc): every file's blocks are taken in whole
    /// clusters.
    pub(crate) cluster_blocks: u64,
}

/// Blocks and inodes the tree takes beyond what a fresh format holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Need {
    pub(crate) blocks: u64,
    pub(crate) inodes: u64,
}

impl Need {
    pub(crate) fn with_slack(self, slack: Slack, block_size: u64) -> Need {
        match slack {
            Slack::Percent(p) => Need {
                blocks: self.blocks + (self.blocks * p).div_ceil(100),
                inodes: self.inodes + (self.inodes * p).div_ceil(100),
            },
            Slack::Bytes(b) => Need { blocks: self.blocks + b.div_ceil(block_size), inodes: self.inodes },
        }
    }

    /// More room after a fill that ran out of it.
    pub(crate) fn grown(self) -> Need {
        Need { blocks: self.blocks + self.blocks / 8 + 64, inodes: self.inodes + self.inodes / 8 + 16 }
    }
}

/// Counts a tree's entries as they are met.
struct Tally {
    shape: Shape,
    blocks: u64,
    inodes: u64,
    /// Bytes of directory entries by directory path (`/` is the root).
    dirs: BTreeMap<Vec<u8>, u64>,
}

fn round4(n: u64) -> u64 {
    n.div_ceil(4) * 4
}

impl Tally {
    fn new(shape: Shape) -> Tally {
        let mut dirs = BTreeMap::new();
        dirs.insert(b"/".to_vec(), 0);
        Tally { shape, blocks: 0, inodes: 0, dirs }
    }

    /// A name in directory `parent`.
    fn entry(&mut self, parent: &[u8], name_len: usize) {
        *self.dirs.entry(parent.to_vec()).or_insert(0) += 8 + round4(name_len as u64);
    }

    /// A new inode (not a further hard link).
    /// `n` blocks of one file, in the whole clusters they take.
    fn clusters(&self, n: u64) -> u64 {
        n.div_ceil(self.shape.cluster_blocks) * self.shape.cluster_blocks
    }

    fn inode(&mut self) {
        self.inodes += 1;
    }

    fn dir(&mut self, path: &[u8]) {
        self.dirs.entry(path.to_vec()).or_insert(0);
    }

    /// A regular file of `size` bytes, `data` of them stored (less for a sparse file).
    fn file(&mut self, size: u64, data: u64) {
        let bs = self.shape.block_size;
        let n = data.min(size).div_ceil(bs);
        let sparse = data < size;
        // A sparse file's data may start a cluster of its own per run.
        self.blocks += self.clusters(n) + if sparse { 4 * (self.shape.cluster_blocks - 1) } else { 0 };
        if self.shape.extents {
            // Runs of at most 32768 blocks, split again where group metadata interrupts
            // them: more than the inode's four need a leaf block per 340.
            let runs = 2 * n.div_ceil(32768) + u64::from(sparse) * 4;
            if runs > 4 {
                let leaves = runs.div_ceil((bs - 12) / 12) + u64::from(runs > 4 * ((bs - 12) / 12));
                self.blocks += leaves * self.shape.cluster_blocks;
            }
        } else {
            let per = bs / 4;
            let mut rest = n.saturating_sub(12);
            let mut meta = 0;
            if rest > 0 {
                meta += 1;
                rest -= rest.min(per);
            }
            if rest > 0 {
                let k = rest.min(per * per);
                meta += 1 + k.div_ceil(per);
                rest -= k;
            }
            if rest > 0 {
                meta += 1 + rest.div_ceil(per * per) + rest.div_ceil(per);
            }
            // A sparse file's data far out takes a chain of map blocks of its own.
            self.blocks += meta + if sparse { 4 } else { 0 };
        }
    }

    fn symlink(&mut self, target_len: usize) {
        // Up to 59 bytes live in the inode.
        if target_len >= 60 {
            self.blocks += self.clusters(1);
        }
    }

    /// Extended attributes as (full name length, value length).
    fn xattrs(&mut self, list: &[(usize, usize)]) {
        if list.is_empty() {
            return;
        }
        // Names are stored without their namespace prefix (`user.` and the like).
        let bytes: u64 = list.iter().map(|&(n, v)| 16 + round4(n as u64) + round4(v as u64)).sum();
        let in_inode = self.shape.inode_size.saturating_sub(128 + 32 + 8);
        if bytes > in_inode {
            self.blocks += self.clusters(1);
        }
    }

    fn finish(self) -> Need {
        let bs = self.shape.block_size;
        let usable = bs - if self.shape.metadata_csum { 12 } else { 0 };
        let mut blocks = self.blocks;
        let mut dir_inodes = 0u64;
        for (path, bytes) in &self.dirs {
            let n = (24 + bytes).div_ceil(usable);
            // Hashed: a root block, leaves about half full after splits, index blocks.
            let mut n = if n > 1 { n + n / 2 + 1 + n / (bs / 8) } else { n };
            if self.shape.extents && n > 4 {
                n += 1 + n / 300;
            }
            if path.as_slice() == b"/" {
                // The format made the root's first block (and cluster).
                n = self.clusters(n).saturating_sub(self.shape.cluster_blocks);
            } else {
                n = self.clusters(n);
                dir_inodes += 1;
            }
            blocks += n;
        }
        Need { blocks, inodes: self.inodes + dir_inodes }
    }
}

/// What the directory tree at `src` needs.
pub(crate) fn estimate_dir(src: &Path, shape: Shape) -> CliResult<Need> {
    let mut t = Tally::new(shape);
    let mut seen = HashSet::new();
    let mut stack = vec![(src.to_path_buf(), b"/".to_vec())];
    t.xattrs(&xattr_sizes(src));
    while let Some((host, path)) = stack.pop() {
        t.dir(&path);
        for e in std::fs::read_dir(&host).map_err(|e| format!("{}: {e}", host.display()))? {
            let e = e.map_err(|e| format!("{}: {e}", host.display()))?;
            let hp = e.path();
            let name = e.file_name();
            let m = std::fs::symlink_metadata(&hp).map_err(|err| format!("{}: {err}", hp.display()))?;
            let mut child = path.clone();
            if path != b"/" {
                child.push(b'/');
            }
            child.extend_from_slice(name.as_bytes());
            if path == b"/" && name.as_bytes() == b"lost+found" && m.is_dir() {
                // The format made it (its blocks are taken already).
                stack.push((hp, child));
                continue;
            }
            t.entry(&path, name.len());
            if !m.is_dir() && m.nlink() > 1 && !seen.insert((m.dev(), m.ino())) {
                continue;
            }
            if m.is_dir() {
                stack.push((hp.clone(), child));
            } else {
                t.inode();
            }
            if m.is_file() {
                t.file(m.len(), m.blocks() * 512);
            } else if m.file_type().is_symlink() {
                t.symlink(std::fs::read_link(&hp).map(|l| l.as_os_str().len()).unwrap_or(0));
            }
            if !m.file_type().is_symlink() {
                t.xattrs(&xattr_sizes(&hp));
            }
        }
    }
    Ok(t.finish())
}

fn xattr_sizes(p: &Path) -> Vec<(usize, usize)> {
    let Ok(names) = xattr::list(p) else { return Vec::new() };
    names
        .filter_map(|n| {
            let v = xattr::get(p, &n).ok().flatten()?;
            Some((n.len(), v.len()))
        })
        .collect()
}

/// What the archive at `src` needs.
pub(crate) fn estimate_archive(src: &Path, shape: Shape) -> CliResult<Need> {
    let mut t = Tally::new(shape);
    let mut ar = crate::mkfs_tar::open(src)?;
    let at = |err: std::io::Error| format!("{}: {err}", src.display());
    let mut buf = vec![0u8; 1 << 20];
    for e in ar.entries().map_err(at)? {
        let mut e = e.map_err(at)?;
        let raw = e.path_bytes().into_owned();
        let parts: Vec<&[u8]> = raw.split(|&b| b == b'/').filter(|c| !c.is_empty() && *c != b".").collect();
        let Some((name, parents)) = parts.split_last() else { continue };
        let mut parent = Vec::new();
        for p in parents {
            parent.push(b'/');
            parent.extend_from_slice(p);
            t.dir(&parent);
        }
        if parent.is_empty() {
            parent.push(b'/');
        }
        let path = if parent == b"/" { [b"/", *name].concat() } else { [&parent[..], b"/", name].concat() };
        let kind = e.header().entry_type();
        if path == b"/lost+found" && kind.is_dir() {
            continue;
        }
        if !t.dirs.contains_key(&path) {
            t.entry(&parent, name.len());
        }
        let mut xattrs = Vec::new();
        if let Ok(Some(ext)) = e.pax_extensions() {
            for x in ext.flatten() {
                if let Some(n) = x.key_bytes().strip_prefix(b"SCHILY.xattr.") {
                    xattrs.push((n.len(), x.value_bytes().len()));
                }
            }
        }
        if kind.is_dir() {
            t.dir(&path);
        } else if kind.is_hard_link() {
            continue;
        } else {
            t.inode();
            if kind.is_file() || kind == tar::EntryType::GNUSparse {
                // The fill leaves 4 KiB pieces of zeros as holes: count the others.
                let size = e.size();
                let mut data = 0u64;
                loop {
                    let n = crate::mkfs_tar::read_full(&mut e, &mut buf).map_err(at)?;
                    if n == 0 {
                        break;
                    }
                    data += buf[..n]
                        .chunks(4096)
                        .filter(|c| c.iter().any(|&b| b != 0))
                        .map(|c| c.len() as u64)
                        .sum::<u64>();
                }
                t.file(size, data);
            } else if kind.is_symlink() {
                t.symlink(e.link_name_bytes().map_or(0, |l| l.len()));
            }
        }
        t.xattrs(&xattrs);
    }
    Ok(t.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slack_is_a_share_or_a_size() {
        assert_eq!(parse_slack("").unwrap(), Slack::Percent(0));
        assert_eq!(parse_slack("10%").unwrap(), Slack::Percent(10));
        assert_eq!(parse_slack("64M").unwrap(), Slack::Bytes(64 << 20));
        assert!(parse_slack("x%").is_err());
        let n = Need { blocks: 1000, inodes: 100 };
        assert_eq!(n.with_slack(Slack::Percent(10), 4096), Need { blocks: 1100, inodes: 110 });
        assert_eq!(n.with_slack(Slack::Bytes(8192), 4096), Need { blocks: 1002, inodes: 100 });
    }

    #[test]
    fn hashed_directories_and_big_files_cost_map_blocks() {
        let shape = Shape {
            block_size: 4096,
            inode_size: 256,
            extents: true,
            metadata_csum: true,
            cluster_blocks: 1,
        };
        let mut t = Tally::new(shape);
        t.file(1 << 30, 1 << 30);
        let one_gib = t.finish().blocks;
        assert!(one_gib > (1 << 18), "{one_gib}");
        let mut t = Tally::new(shape);
        for _ in 0..10_000 {
            t.entry(b"/d", 20);
        }
        t.dir(b"/d");
        let need = t.finish();
        // 10,000 entries of 28 bytes: 69 full blocks; half-full leaves take more.
        assert!(need.blocks > 69 && need.blocks < 140, "{need:?}");
        assert_eq!(need.inodes, 1);
    }
}
