//! Patching a copy of a fixture: raw bytes, and the superblock, descriptors, inodes and
//! blocks with their checksums recomputed (so structural checks are reached on metadata_csum
//! images too).

use super::{open_bytes, Fixture};
use rext4::format::checksum::{crc32c, inode_csum_seed};
use rext4::format::dirent;
use rext4::format::dx;
use rext4::format::extent::{self as fext, Node};
use rext4::format::group_desc::GroupDesc;
use rext4::format::inode as fi;
use rext4::format::superblock::Superblock;
use rext4::format::xattr as fx;
use rext4::Fs;

/// Geometry read from the pristine superblock (tests patch the copy, not this).
#[derive(Clone, Copy)]
pub(super) struct Geo {
    pub(super) bs: usize,
    /// The superblock's block (1 on 1 KiB blocks, also under bigalloc where the first data
    /// block is 0); the descriptors follow it.
    pub(super) sb_block: u64,
    pub(super) blocks_count: u64,
    pub(super) inodes_count: u32,
    pub(super) ipg: u32,
    pub(super) inode_size: usize,
    pub(super) desc_size: usize,
    pub(super) csum_seed: u32,
    pub(super) metadata_csum: bool,
    pub(super) gdt_csum: bool,
    pub(super) uuid: [u8; 16],
}

pub(super) const SB: usize = 1024;

/// A copy of a fixture being patched.
pub(super) struct Img {
    pub(super) f: &'static Fixture,
    pub(super) b: Vec<u8>,
    pub(super) g: Geo,
}

impl Img {
    pub(super) fn new(f: &'static Fixture) -> Img {
        let sb = Superblock::parse(&f.bytes[SB..SB + 1024]).unwrap();
        let g = Geo {
            bs: sb.block_size().unwrap() as usize,
            sb_block: (SB / sb.block_size().unwrap() as usize) as u64,
            blocks_count: sb.blocks_count(),
            inodes_count: sb.s_inodes_count.get(),
            ipg: sb.s_inodes_per_group.get(),
            inode_size: usize::from(sb.inode_size()),
            desc_size: usize::from(sb.desc_size()),
            csum_seed: sb.csum_seed(),
            metadata_csum: sb.has_metadata_csum(),
            gdt_csum: sb.ro_compat().contains(rext4::format::features::RoCompat::GDT_CSUM),
            uuid: sb.s_uuid,
        };
        Img { f, b: f.bytes.clone(), g }
    }

    pub(super) fn ino(&self, path: &str) -> u32 {
        *self.f.ino.get(path).unwrap_or_else(|| panic!("no fixture path {path}"))
    }

    pub(super) fn open(&self) -> rext4::Result<Fs> {
        open_bytes(self.b.clone())
    }

    pub(super) fn fs(&self) -> Fs {
        self.open().unwrap_or_else(|e| panic!("{:?}: patched image should still open: {e}", self.f.variant))
    }

    // --- raw access ---

    pub(super) fn u16_at(&self, off: usize) -> u16 {
        u16::from_le_bytes([self.b[off], self.b[off + 1]])
    }
    pub(super) fn u32_at(&self, off: usize) -> u32 {
        u32::from_le_bytes(self.b[off..off + 4].try_into().unwrap())
    }
    pub(super) fn put16(&mut self, off: usize, v: u16) {
        self.b[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }
    pub(super) fn put32(&mut self, off: usize, v: u32) {
        self.b[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }
    pub(super) fn block_off(&self, blk: u64) -> usize {
        blk as usize * self.g.bs
    }
    pub(super) fn block(&self, blk: u64) -> &[u8] {
        let o = self.block_off(blk);
        &self.b[o..o + self.g.bs]
    }
    pub(super) fn block_mut(&mut self, blk: u64) -> &mut [u8] {
        let o = self.block_off(blk);
        let bs = self.g.bs;
        &mut self.b[o..o + bs]
    }

    // --- superblock ---

    pub(super) fn fix_sb(&mut self) {
        if self.g.metadata_csum {
            let c = crc32c(!0, &self.b[SB..SB + 0x3FC]);
            self.put32(SB + 0x3FC, c);
        }
    }
    /// Sets a superblock field and re-checksums.
    pub(super) fn sb32(&mut self, field: usize, v: u32) {
        self.put32(SB + field, v);
        self.fix_sb();
    }
    pub(super) fn sb16(&mut self, field: usize, v: u16) {
        self.put16(SB + field, v);
        self.fix_sb();
    }

    // --- group descriptors ---

    pub(super) fn gd_off(&self, g: u32) -> usize {
        self.block_off(self.g.sb_block + 1) + g as usize * self.g.desc_size
    }
    pub(super) fn gd(&self, g: u32) -> GroupDesc {
        let o = self.gd_off(g);
        GroupDesc::parse(&self.b[o..o + self.g.desc_size], self.g.desc_size).unwrap()
    }
    pub(super) fn fix_gd(&mut self, g: u32) {
        let d = self.gd(g);
        let ds = self.g.desc_size;
        let c = if self.g.metadata_csum {
            d.csum_crc32c(self.g.csum_seed, g, ds)
        } else if self.g.gdt_csum {
            d.csum_crc16(&self.g.uuid, g, ds)
        } else {
            return;
        };
        let o = self.gd_off(g) + 0x1E;
        self.put16(o, c);
    }

    // --- inodes ---

    /// Where inode `ino` lives (by the pristine descriptors, whatever the patches did).
    pub(super) fn inode_off(&self, ino: u32) -> usize {
        let group = (ino - 1) / self.g.ipg;
        let index = ((ino - 1) % self.g.ipg) as usize;
        let o = self.gd_off(group);
        let ds = self.g.desc_size;
        let table = GroupDesc::parse(&self.f.bytes[o..o + ds], ds).unwrap().inode_table(ds);
        self.block_off(table) + index * self.g.inode_size
    }
    pub(super) fn inode_raw(&self, ino: u32) -> &[u8] {
        let o = self.inode_off(ino);
        &self.b[o..o + self.g.inode_size]
    }
    pub(super) fn inode(&self, ino: u32) -> fi::Inode {
        fi::Inode::parse(self.inode_raw(ino)).unwrap()
    }
    pub(super) fn inode_seed(&self, ino: u32) -> u32 {
        inode_csum_seed(self.g.csum_seed, ino, self.inode(ino).generation())
    }
    pub(super) fn fix_inode(&mut self, ino: u32) {
        if self.g.metadata_csum {
            let o = self.inode_off(ino);
            let n = self.g.inode_size;
            fix_inode_record(&mut self.b[o..o + n], ino, self.g.csum_seed);
        }
    }
    /// Patches inode field bytes at `field` and re-checksums the inode.
    pub(super) fn inode_put(&mut self, ino: u32, field: usize, bytes: &[u8]) {
        let o = self.inode_off(ino) + field;
        self.b[o..o + bytes.len()].copy_from_slice(bytes);
        self.fix_inode(ino);
    }
    pub(super) fn inode32(&mut self, ino: u32, field: usize, v: u32) {
        self.inode_put(ino, field, &v.to_le_bytes());
    }
    pub(super) fn inode16(&mut self, ino: u32, field: usize, v: u16) {
        self.inode_put(ino, field, &v.to_le_bytes());
    }
    pub(super) fn set_size(&mut self, ino: u32, size: u64) {
        self.inode32(ino, 0x04, size as u32);
        self.inode32(ino, 0x6C, (size >> 32) as u32);
    }

    // --- block maps ---

    /// `(logical, physical)` of every mapped block of an extent- or block-mapped inode, and the
    /// extent tree / indirect blocks met on the way.
    pub(super) fn mapping(&self, ino: u32) -> (Vec<(u64, u64)>, Vec<u64>) {
        let d = self.inode(ino);
        let mut data = Vec::new();
        let mut meta = Vec::new();
        if d.flags() & fi::EXTENTS_FL != 0 {
            self.walk_extents(d.i_block_bytes(), &mut data, &mut meta);
        } else {
            let ptrs = (self.g.bs / 4) as u64;
            for i in 0..12u64 {
                let p = u64::from(d.i_block[i as usize].get());
                if p != 0 {
                    data.push((i, p));
                }
            }
            let mut first = 12u64;
            for (slot, levels) in [(fi::IND_BLOCK, 1u32), (fi::DIND_BLOCK, 2), (fi::TIND_BLOCK, 3)] {
                let p = u64::from(d.i_block[slot].get());
                if p != 0 {
                    self.walk_indirect(p, levels, first, &mut data, &mut meta);
                }
                first += ptrs.pow(levels);
            }
        }
        (data, meta)
    }

    pub(super) fn walk_indirect(
        &self,
        blk: u64,
        levels: u32,
        first: u64,
        data: &mut Vec<(u64, u64)>,
        meta: &mut Vec<u64>,
    ) {
        meta.push(blk);
        let ptrs = (self.g.bs / 4) as u64;
        let span = ptrs.pow(levels - 1);
        for i in 0..ptrs {
            let p = u64::from(self.u32_at(self.block_off(blk) + 4 * i as usize));
            if p == 0 {
                continue;
            }
            if levels == 1 {
                data.push((first + i, p));
            } else {
                self.walk_indirect(p, levels - 1, first + i * span, data, meta);
            }
        }
    }

    pub(super) fn walk_extents(&self, node: &[u8], data: &mut Vec<(u64, u64)>, meta: &mut Vec<u64>) {
        let n = Node::parse(node).unwrap();
        for i in 0..n.len() {
            if n.depth() > 0 {
                let child = n.index(i).leaf();
                meta.push(child);
                let o = self.block_off(child);
                self.walk_extents(&self.b[o..o + self.g.bs], data, meta);
            } else {
                let e = n.extent(i);
                for k in 0..u64::from(e.len()) {
                    data.push((u64::from(e.ee_block.get()) + k, e.start() + k));
                }
            }
        }
    }

    /// Physical block of logical block `lblk` of `ino`.
    pub(super) fn pblk(&self, ino: u32, lblk: u64) -> u64 {
        let (data, _) = self.mapping(ino);
        data.iter()
            .find(|(l, _)| *l == lblk)
            .map(|(_, p)| *p)
            .unwrap_or_else(|| panic!("ino {ino} lblk {lblk} unmapped"))
    }

    pub(super) fn fix_extent_block(&mut self, ino: u32, blk: u64) {
        if self.g.metadata_csum {
            let seed = self.inode_seed(ino);
            fext::set_block_checksum(self.block_mut(blk), seed);
        }
    }
    pub(super) fn fix_dir_leaf(&mut self, ino: u32, blk: u64) {
        if self.g.metadata_csum {
            let seed = self.inode_seed(ino);
            dirent::set_leaf_tail(self.block_mut(blk), seed);
        }
    }
    pub(super) fn fix_dx(&mut self, ino: u32, blk: u64) {
        if self.g.metadata_csum {
            let seed = self.inode_seed(ino);
            dx::set_checksum(self.block_mut(blk), seed);
        }
    }
    pub(super) fn fix_xattr_block(&mut self, blk: u64) {
        if self.g.metadata_csum {
            let seed = self.g.csum_seed;
            fx::set_block_checksum(self.block_mut(blk), seed, blk);
        }
    }

    /// Byte offsets (in the image) of the entries of a directory leaf block, with their names.
    pub(super) fn dir_entries(&self, blk: u64) -> Vec<(usize, Vec<u8>)> {
        self.dir_entries_full(blk).into_iter().map(|(o, n, _)| (o, n)).collect()
    }

    /// Offsets, names and inode numbers of the entries of a directory leaf block.
    pub(super) fn dir_entries_full(&self, blk: u64) -> Vec<(usize, Vec<u8>, u32)> {
        let base = self.block_off(blk);
        let data = self.block(blk);
        let area = if self.g.metadata_csum { &data[..data.len() - dirent::TAIL_SIZE] } else { data };
        dirent::DirBlockIter::new(area, self.g.bs as u32)
            .map_while(|e| e.ok())
            .map(|e| (base + e.offset, e.name.to_vec(), e.inode))
            .collect()
    }

    /// Offset of the entry named `name` in directory leaf block `blk`.
    pub(super) fn entry_off(&self, blk: u64, name: &[u8]) -> usize {
        self.dir_entries(blk).into_iter().find(|(_, n)| n == name).map(|(o, _)| o).unwrap()
    }

    /// The offset (in the image) of the in-inode xattr entry `(index, name)` and the offset its
    /// values count from.
    pub(super) fn ibody_xattr(&self, ino: u32, index: u8, name: &[u8]) -> (usize, usize) {
        let base = self.inode_off(ino);
        let raw = self.inode_raw(ino);
        let start = 128 + usize::from(u16::from_le_bytes([raw[0x80], raw[0x81]]));
        assert_eq!(u32::from_le_bytes(raw[start..start + 4].try_into().unwrap()), fx::XATTR_MAGIC);
        let area = &raw[start + 4..];
        let mut off = 0;
        for e in fx::XattrIter::new(area) {
            let e = e.unwrap();
            if e.index == index && e.name == name {
                return (base + start + 4 + off, base + start + 4);
            }
            off += fx::entry_size(e.name.len());
        }
        panic!("no in-inode xattr {index}.{}", String::from_utf8_lossy(name));
    }
}

/// Re-checksums an inode record in place (its seed depends on its own generation field).
pub(super) fn fix_inode_record(rec: &mut [u8], ino: u32, fs_seed: u32) {
    let generation = u32::from_le_bytes(rec[0x64..0x68].try_into().unwrap());
    fi::set_inode_checksum(rec, inode_csum_seed(fs_seed, ino, generation));
}
