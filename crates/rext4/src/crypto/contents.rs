//! Encrypted contents (the kernel's `fs/crypto/crypto.c` and ext4's read path for encrypted
//! files): each data unit (the filesystem block, or the policy's smaller unit) is
//! AES-256-XTS with its index as the tweak. Holes and unwritten extents are not encrypted:
//! they read as zeros.

use super::InodeCrypt;
use crate::data::read::MAX_RUN_BLOCKS;
use crate::data::write::Run;
use crate::error::{Error, Result};
use crate::fs::FsInner;
use crate::inode::Inode;
use crate::num::usize_from;

impl InodeCrypt {
    /// Decrypts logical block `lblk` of this file in place (`block_bits`: log2 of the block
    /// size). The caller has checked that the key is here.
    pub(crate) fn decrypt_block(&self, lblk: u64, block_bits: u32, block: &mut [u8]) {
        self.crypt_block(lblk, block_bits, block, false);
    }

    /// Encrypts logical block `lblk` in place, as [`InodeCrypt::decrypt_block`] undoes.
    pub(crate) fn encrypt_block(&self, lblk: u64, block_bits: u32, block: &mut [u8]) {
        self.crypt_block(lblk, block_bits, block, true);
    }

    fn crypt_block(&self, lblk: u64, block_bits: u32, block: &mut [u8], encrypt: bool) {
        let (Some(c), Some(ctx)) = (&self.contents, &self.ctx) else { return };
        let unit_bits = match ctx.log2_data_unit_size {
            0 => block_bits,
            n => u32::from(n).min(block_bits),
        };
        let per_block = block_bits - unit_bits;
        let unit = 1usize << unit_bits;
        for (i, u) in block.chunks_exact_mut(unit).enumerate() {
            let index = self.iv_index((lblk << per_block) + i as u64);
            if encrypt {
                c.xts.encrypt_unit(u, index);
            } else {
                c.xts.decrypt_unit(u, index);
            }
        }
    }
}

impl FsInner {
    /// `read(2)` of an encrypted regular file at `offset`, of at most `size - offset` bytes:
    /// blocks read from the device and decrypted (the page cache keeps no plaintext of these
    /// files). `ENOKEY` without the key. The caller holds `data_sem` shared.
    pub(crate) fn read_encrypted(
        &self,
        inode: &Inode,
        size: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize> {
        let crypt = self.inode_crypt(inode)?;
        if crypt.contents.is_none() {
            return Err(Error::NoKey);
        }
        if self.has_inline_data(inode) {
            // fscrypt never stores an encrypted file inline (`ext4_set_context` moves it out).
            return Err(Error::NotSupported("encrypted inline data".into()));
        }
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let total = buf.len().min(usize::try_from(size - offset).unwrap_or(usize::MAX));
        let bits = self.sbi.block_size.trailing_zeros();
        let bs = u64::from(self.sbi.block_size);
        let mut block = Vec::new();
        let mut done = 0usize;
        while done < total {
            let pos = offset + done as u64;
            let Ok(lblk) = u32::try_from(pos / bs) else {
                buf[done..total].fill(0);
                break;
            };
            let in_block = usize_from(pos % bs);
            let (len, pblk) = self.map_for_read(inode, lblk)?;
            // Whole blocks, as far as the request and this run reach.
            let want = (in_block + (total - done)).div_ceil(usize_from(bs)) as u64;
            let blocks = len.min(want).min(MAX_RUN_BLOCKS);
            let span = usize_from(blocks * bs);
            let n = (total - done).min(span - in_block);
            match pblk {
                None => buf[done..done + n].fill(0),
                Some(p) => {
                    block.resize(span, 0);
                    self.dev.read_at(&mut block, p * bs)?;
                    for (i, b) in block.chunks_exact_mut(usize_from(bs)).enumerate() {
                        crypt.decrypt_block(u64::from(lblk) + i as u64, bits, b);
                    }
                    buf[done..done + n].copy_from_slice(&block[in_block..in_block + n]);
                }
            }
            done += n;
        }
        Ok(total)
    }
}

impl FsInner {
    /// The encrypted form of [`FsInner::write_runs`]: `data` (the file's bytes from `offset`)
    /// written into the blocks of `runs` whole, each encrypted under its logical number. A
    /// block the write covers in part keeps the rest of its bytes: zeros in a freshly mapped
    /// block, else its old contents, decrypted first (the kernel's read-modify-write through
    /// the page). The caller holds the file's `op_lock`, so no other writer changes a block
    /// between its read and its write.
    pub(crate) fn write_runs_encrypted(
        &self,
        crypt: &InodeCrypt,
        runs: &[Run],
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        if crypt.contents.is_none() {
            return Err(Error::NoKey);
        }
        let bits = self.sbi.block_size.trailing_zeros();
        let bs = u64::from(self.sbi.block_size);
        let end = offset + data.len() as u64;
        for r in runs {
            let (rs, re) = (r.lblk * bs, (r.lblk + r.len) * bs);
            let (a, b) = (rs.max(offset), re.min(end));
            if a >= b {
                continue;
            }
            let (first, last) = (a / bs, b.div_ceil(bs));
            let mut buf = vec![0u8; usize_from((last - first) * bs)];
            let phys = |blk: u64| (r.pblk + (blk - r.lblk)) * bs;
            let ends = if first + 1 == last { vec![first] } else { vec![first, last - 1] };
            for blk in ends {
                let covered = a <= blk * bs && b >= (blk + 1) * bs;
                let at = usize_from((blk - first) * bs);
                if !covered && !r.fresh {
                    let slot = &mut buf[at..at + usize_from(bs)];
                    self.dev.read_at(slot, phys(blk))?;
                    crypt.decrypt_block(blk, bits, slot);
                }
            }
            let from = usize_from(a - first * bs);
            buf[from..from + usize_from(b - a)]
                .copy_from_slice(&data[usize_from(a - offset)..usize_from(b - offset)]);
            for (i, blk) in buf.chunks_exact_mut(usize_from(bs)).enumerate() {
                crypt.encrypt_block(first + i as u64, bits, blk);
            }
            self.dev.write_at(&buf, phys(first))?;
        }
        Ok(())
    }

    /// The encrypted form of zeroing `from..to` where it is stored: each written block it
    /// touches decrypted, zeroed there, encrypted again (`fscrypt_zeroout_range` and
    /// `ext4_block_zero_page_range` for encrypted files).
    pub(crate) fn zero_stored_encrypted(
        &self,
        crypt: &InodeCrypt,
        runs: &[crate::map::extents_write::Ext],
        from: u64,
        to: u64,
    ) -> Result<()> {
        if crypt.contents.is_none() {
            return Err(Error::NoKey);
        }
        let bits = self.sbi.block_size.trailing_zeros();
        let bs = u64::from(self.sbi.block_size);
        let mut block = vec![0u8; usize_from(bs)];
        for e in runs.iter().filter(|e| !e.unwritten) {
            let a = from.max(e.lblk * bs);
            let b = to.min((e.lblk + e.len) * bs);
            let mut blk = a / bs;
            while blk * bs < b {
                let lo = a.max(blk * bs) - blk * bs;
                let hi = b.min((blk + 1) * bs) - blk * bs;
                let phys = (e.pblk + (blk - e.lblk)) * bs;
                if lo == 0 && hi == bs {
                    block.fill(0);
                } else {
                    self.dev.read_at(&mut block, phys)?;
                    crypt.decrypt_block(blk, bits, &mut block);
                    block[usize_from(lo)..usize_from(hi)].fill(0);
                }
                crypt.encrypt_block(blk, bits, &mut block);
                self.dev.write_at(&block, phys)?;
                blk += 1;
            }
        }
        Ok(())
    }
}
