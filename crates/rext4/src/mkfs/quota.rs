//! The quota files (`create_quota_inodes`: e2fsprogs' `quota_compute_usage` and
//! `quota_write_inode`): for the `quota` feature, one hidden file per quota type, holding the
//! usage of every id that owns an inode so far (the root directory and lost+found). User and
//! group quotas live in reserved inodes 3 and 4, project quotas in the first free inode. Each
//! file is built by the engine's own insertion (`quota::tree`), one id after another in
//! ascending order, and its blocks are taken in the order e2fsprogs first writes them, so the
//! layout is mke2fs's.

use super::Builder;
use crate::error::Result;
use crate::num::usize_from;
use crate::quota::tree::{self, InMemory, QuotaBlocks};
use rext4_format::inode::{EA_INODE_FL, IMMUTABLE_FL, S_IFREG};
use rext4_format::inode_record::InodeRecord;
use rext4_format::quota::{
    self as fq, DiskDquot, DiskHeader, DiskInfo, ENTRY, MAX_DQ_TIME, QT_BLOCK, QT_TREEOFF,
};
use std::collections::BTreeMap;
use zerocopy::{FromZeros, IntoBytes};

/// Usage per id: (bytes, inodes).
type Usage = BTreeMap<u32, (u64, u64)>;

/// The quota file of type `ty` holding `usage`, and its quota blocks in the order e2fsprogs
/// first writes them: the header, the blocks the first id's insertion adds, the root (written
/// last as that insertion unwinds), then what each later id adds.
fn build(ty: usize, usage: &Usage) -> Result<(Vec<Vec<u8>>, Vec<u32>)> {
    let mut b = InMemory::default();
    let mut info = DiskInfo::new_zeroed();
    info.dqi_bgrace.set(MAX_DQ_TIME);
    info.dqi_igrace.set(MAX_DQ_TIME);
    // The header and the (empty) root.
    info.dqi_blocks.set(QT_TREEOFF + 1);
    b.block(QT_TREEOFF);
    let mut order = vec![0];
    for (&id, &(space, inodes)) in usage {
        let (qblk, off) = tree::insert(&mut b, &mut info, id)?;
        // The new entry, with its usage (an id-0 entry of nothing in use stays marked).
        let mut d = DiskDquot::default();
        d.dqb_id.set(id);
        d.dqb_curspace.set(space);
        d.dqb_curinodes.set(inodes);
        let disk = d.to_disk();
        b.edit(qblk, &mut |blk| blk[off..off + ENTRY].copy_from_slice(&disk))?;
        order.append(&mut b.grown);
        if !order.contains(&QT_TREEOFF) {
            order.push(QT_TREEOFF);
        }
    }
    if !order.contains(&QT_TREEOFF) {
        order.push(QT_TREEOFF);
    }
    let mut header = DiskHeader::new_zeroed();
    header.dqh_magic.set(fq::MAGICS[ty]);
    header.dqh_version.set(fq::V2_VERSION_R1);
    let head = b.block(0);
    head[..size_of::<DiskHeader>()].copy_from_slice(header.as_bytes());
    head[fq::INFO_OFF..fq::INFO_OFF + size_of::<DiskInfo>()].copy_from_slice(info.as_bytes());
    Ok((b.blocks, order))
}

impl Builder {
    /// Usage per user, group and project of the inodes made so far, as e2fsck counts it: the
    /// root and every inode from the first non-reserved one, but EA inodes.
    fn quota_usage(&self) -> [Usage; 3] {
        let mut usage: [Usage; 3] = Default::default();
        // The first non-reserved inode (`s_first_ino`, which mkfs sets to lost+found's).
        let first = super::root::LPF_INO;
        for (&ino, raw) in &self.inodes {
            if ino != super::root::ROOT_INO && ino < first {
                continue;
            }
            let Some(r) = InodeRecord::new(&raw[..]) else { continue };
            if r.links_count() == 0 || r.flags() & EA_INODE_FL != 0 {
                continue;
            }
            for (u, id) in usage.iter_mut().zip([r.uid(), r.gid(), r.projid()]) {
                let e = u.entry(id).or_default();
                e.0 += r.blocks() * 512;
                e.1 += 1;
            }
        }
        usage
    }

    /// Makes the quota files of `types` (user, group, project) for the inodes made so far.
    pub(crate) fn make_quota_files(&mut self, types: [bool; 3]) -> Result<()> {
        let usage = self.quota_usage();
        for (ty, u) in usage.iter().enumerate() {
            if !types[ty] {
                continue;
            }
            let ino = match ty {
                0 => 3,
                1 => 4,
                _ => {
                    let ino = self.l.new_inode()?;
                    self.l.inode_alloc_stats(ino, false);
                    ino
                }
            };
            self.write_quota_file(ino, ty, u)?;
            let inum = match ty {
                0 => &mut self.sb.s_usr_quota_inum,
                1 => &mut self.sb.s_grp_quota_inum,
                _ => &mut self.sb.s_prj_quota_inum,
            };
            inum.set(ino);
        }
        Ok(())
    }

    /// Writes the quota file of type `ty` holding `usage` into inode `ino`: blocks taken from
    /// the first free one on, in the order e2fsprogs first writes each (see `build`).
    fn write_quota_file(&mut self, ino: u32, ty: usize, usage: &Usage) -> Result<()> {
        let (qblocks, order) = build(ty, usage)?;
        let bs = usize_from(u64::from(self.l.geo.block_size));
        let per = (bs / QT_BLOCK).max(1);
        let nblk = qblocks.len().div_ceil(per);
        let mut pblk = vec![0u64; nblk];
        let mut last = 0;
        let mut events = Vec::with_capacity(nblk);
        let bits = self.l.geo.cluster_bits;
        for q in order {
            let l = usize_from(u64::from(q)) / per;
            if pblk[l] == 0 {
                // A block whose logical cluster has a block mapped lies in that block's
                // cluster, at its own offset; else a new cluster is taken.
                let mapped = pblk.iter().enumerate().find(|&(l2, &p)| p != 0 && (l2 >> bits) == (l >> bits));
                pblk[l] = match mapped {
                    Some((l2, &p)) => p - l2 as u64 + l as u64,
                    None => self.l.alloc_block(last)? + (l as u64 & ((1 << bits) - 1)),
                };
                last = pblk[l];
                events.push((l as u64, last));
            }
        }
        for (l, &p) in pblk.iter().enumerate() {
            let mut data = vec![0u8; bs];
            for (k, q) in qblocks.iter().skip(l * per).take(per).enumerate() {
                data[k * QT_BLOCK..(k + 1) * QT_BLOCK].copy_from_slice(q);
            }
            self.blocks.push((p, data));
        }
        self.new_record(ino, S_IFREG | 0o600, 1);
        self.record(ino).set_flags(IMMUTABLE_FL);
        self.map_small_file_as(ino, &pblk, &super::files::extents_as_mapped(&events))?;
        // The size ends at the last quota block, within the last filesystem block.
        self.record(ino).set_size((qblocks.len() * QT_BLOCK) as u64);
        Ok(())
    }
}
