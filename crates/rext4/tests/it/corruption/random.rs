//! Random corruption of every fixture's metadata.

use super::*;
use std::collections::{BTreeSet, HashSet};

/// splitmix64: small, seedable, good enough to choose bytes.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[derive(Clone, Copy, Debug)]
enum BlockKind {
    Extent,
    DirLeaf,
    Dx,
    Xattr,
    /// Indirect blocks and slow symlink targets: no checksum.
    Plain,
}

/// The metadata of a fixture, found by parsing it (not through rext4): which block is what and
/// belongs to which inode, so random damage lands on metadata and can be re-checksummed.
struct MetaMap {
    owners: HashMap<u64, (u32, BlockKind)>,
    /// Every metadata block: superblock, descriptors, bitmaps, used inode-table blocks, and the
    /// owned blocks above.
    blocks: Vec<u64>,
    /// Inode-table blocks holding the inodes walked (all in group 0's table).
    itable: BTreeSet<u64>,
    /// Group 0's inode table.
    table: u64,
}

impl MetaMap {
    fn new(img: &Img) -> MetaMap {
        let mut owners = HashMap::new();
        let mut itable = BTreeSet::new();
        let mut stack: Vec<u32> = (1..=11).collect();
        stack.push(2);
        let mut seen = HashSet::new();
        while let Some(ino) = stack.pop() {
            if !seen.insert(ino) || ino == 0 || ino > img.g.inodes_count {
                continue;
            }
            itable.insert((img.inode_off(ino) / img.g.bs) as u64);
            let d = img.inode(ino);
            if d.links_count() == 0 && ino != 2 {
                continue;
            }
            if d.file_acl() != 0 {
                owners.insert(d.file_acl(), (ino, BlockKind::Xattr));
            }
            let inline = d.flags() & fi::INLINE_DATA_FL != 0;
            let fast_link = d.file_type() == fi::S_IFLNK && d.size() < 60;
            if inline || fast_link || d.file_type() == 0 {
                continue;
            }
            let is_dir = d.file_type() == fi::S_IFDIR;
            let is_link = d.file_type() == fi::S_IFLNK;
            // Regular files' data is not metadata (and the journal is big): only their maps.
            let (data, meta) = img.mapping(ino);
            let kind = if d.flags() & fi::EXTENTS_FL != 0 { BlockKind::Extent } else { BlockKind::Plain };
            for m in meta {
                owners.insert(m, (ino, kind));
            }
            if is_link {
                for (_, p) in &data {
                    owners.insert(*p, (ino, BlockKind::Plain));
                }
            }
            if is_dir {
                let dx_dir = d.flags() & fi::INDEX_FL != 0;
                for (l, p) in data {
                    let node = dx_dir && (l == 0 || dx::parse_node(img.block(p)).is_ok());
                    owners.insert(p, (ino, if node { BlockKind::Dx } else { BlockKind::DirLeaf }));
                    if !node {
                        for (_, name, child) in img.dir_entries_full(p) {
                            if child != 0 && name != b"." && name != b".." {
                                stack.push(child);
                            }
                        }
                    }
                }
            }
        }
        let mut blocks: BTreeSet<u64> = owners.keys().copied().collect();
        blocks.extend(itable.iter().copied());
        blocks.insert(img.g.sb_block); // superblock (block 0 on 4 KiB, 1 on 1 KiB)
        blocks.insert(img.g.sb_block + 1); // descriptors
        let gd = img.gd(0);
        blocks.insert(gd.block_bitmap(img.g.desc_size));
        blocks.insert(gd.inode_bitmap(img.g.desc_size));
        let table = gd.inode_table(img.g.desc_size);
        assert!(
            itable.iter().all(|&t| t >= table && t < table + u64::from(img.g.ipg)),
            "inodes outside group 0"
        );
        MetaMap { owners, blocks: blocks.into_iter().collect(), itable, table }
    }

    /// Recomputes every checksum a patch may have broken: the superblock, the descriptors,
    /// inodes in touched inode-table blocks, and touched extent, directory, dx and xattr blocks.
    fn refresh(&self, img: &mut Img, touched: &BTreeSet<u64>) {
        let groups = img.g.inodes_count / img.g.ipg;
        if img.g.metadata_csum || img.g.gdt_csum {
            for g in 0..groups {
                img.fix_gd(g);
            }
        }
        if !img.g.metadata_csum {
            return;
        }
        img.fix_sb();
        let per_block = (img.g.bs / img.g.inode_size) as u32;
        for &t in touched.iter().filter(|t| self.itable.contains(t)) {
            for k in 0..per_block {
                let ino = ((t - self.table) as u32) * per_block + k + 1;
                img.fix_inode(ino);
            }
        }
        for t in touched {
            match self.owners.get(t) {
                Some(&(ino, BlockKind::Extent)) => img.fix_extent_block(ino, *t),
                Some(&(ino, BlockKind::DirLeaf)) => img.fix_dir_leaf(ino, *t),
                Some(&(ino, BlockKind::Dx)) => img.fix_dx(ino, *t),
                Some(&(_, BlockKind::Xattr)) => img.fix_xattr_block(*t),
                _ => {}
            }
        }
    }
}

/// Random byte flips in the metadata of every fixture, then a full walk: no panic, no hang,
/// no crash. Half the cases re-checksum what they touched so the damage reaches structural
/// checks on metadata_csum images. `REXT4_CORRUPTION_ITERS` sets the cases per variant.
#[test]
fn random_metadata_corruption() {
    run_cases(test_path!("random_metadata_corruption"), Duration::from_secs(10), || {
        let iters = env_usize("REXT4_CORRUPTION_ITERS", 120) as u64;
        let mut cases = Vec::new();
        for v in ALL_VARIANTS {
            let Some(f) = fixture(v) else { return cases };
            let img0 = Img::new(f);
            let meta = MetaMap::new(&img0);
            for seed in 0..iters {
                let mut rng = Rng(seed ^ ((v as u64) << 32));
                let mut img = Img::new(f);
                let n = 1 + rng.below(8);
                let mut touched = BTreeSet::new();
                let mut flips = Vec::new();
                for _ in 0..n {
                    let blk = meta.blocks[rng.below(meta.blocks.len())];
                    // Half the flips land in the first 64 bytes, where headers live.
                    let within = if rng.below(2) == 0 { rng.below(64) } else { rng.below(img.g.bs) };
                    let off = img.block_off(blk) + within;
                    let x = (rng.below(255) + 1) as u8;
                    img.b[off] ^= x;
                    touched.insert(blk);
                    flips.push((off, x));
                }
                let refreshed = seed % 2 == 1;
                if refreshed {
                    meta.refresh(&mut img, &touched);
                }
                let patches = diff(&img0.b, &img.b);
                let desc = format!(
                    "seed {seed}{} flips (offset, xor) {flips:?}",
                    if refreshed { " re-checksummed" } else { "" }
                );
                cases.push(Case { desc, variant: v, patches, full: true });
            }
        }
        cases
    });
}

/// The byte ranges where `b` differs from `a`, as patches.
fn diff(a: &[u8], b: &[u8]) -> Vec<(usize, Vec<u8>)> {
    let mut out: Vec<(usize, Vec<u8>)> = Vec::new();
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        if x != y {
            match out.last_mut() {
                Some((o, v)) if *o + v.len() == i => v.push(*y),
                _ => out.push((i, vec![*y])),
            }
        }
    }
    out
}

/// The metadata map covers what the tests mean it to (guards the random test's aim).
#[test]
fn random_test_targets_metadata() {
    for v in ALL_VARIANTS {
        let img = img!(v);
        let m = MetaMap::new(&img);
        let kinds = |k: fn(&BlockKind) -> bool| m.owners.values().filter(|(_, kind)| k(kind)).count();
        assert!(kinds(|k| matches!(k, BlockKind::DirLeaf)) > 5, "{v:?}");
        assert!(kinds(|k| matches!(k, BlockKind::Xattr)) >= 1, "{v:?}");
        if !matches!(v, Variant::Inline) {
            assert!(kinds(|k| matches!(k, BlockKind::Dx)) >= 1, "{v:?}");
        }
        if v != Variant::Ext2 {
            assert!(kinds(|k| matches!(k, BlockKind::Extent)) >= 1, "{v:?}");
        }
        assert!(m.itable.len() >= 2, "{v:?}");
    }
}
