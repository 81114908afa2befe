//! The volume label (`s_volume_name`) read and changed on an open filesystem: the kernel's
//! `FS_IOC_GETFSLABEL` / `FS_IOC_SETFSLABEL` (`ext4_ioctl_getlabel`, `ext4_ioctl_setlabel`),
//! what `e2label` does to an unmounted image.
//!
//! # Locking
//! A change takes a handle, then the superblock buffer's data lock (as every superblock
//! change does, fs/errors.rs); a read takes the data lock alone.

use crate::error::{Error, Result};
use crate::fs::Fs;
use rext4_format::superblock::{Superblock, SUPERBLOCK_SIZE};
use zerocopy::IntoBytes;

/// The label's room in the superblock (`EXT4_LABEL_MAX`).
pub(crate) const LABEL_MAX: usize = 16;

impl Fs {
    /// The volume label, as the superblock now holds it (up to 16 bytes, no NUL).
    pub fn label(&self) -> Vec<u8> {
        let (_, off) = self.inner.sbi.sb_location();
        let d = self.inner.sb_buf.data();
        Superblock::parse(&d[off..]).map(|sb| sb.volume_name().to_vec()).unwrap_or_default()
    }

    /// Sets the volume label, through the journal, in the primary superblock and in every
    /// backup, in one transaction (`ext4_update_superblocks_fn`): `e2fsck -b` or a mount from
    /// a backup then sees the same label. `EINVAL` for more than 16 bytes (ext4's limit),
    /// `EROFS` read-only. A backup whose checksum is wrong is left alone and the call fails
    /// with `EFSBADCRC` after the rest are written, as the kernel's does.
    pub fn set_label(&self, label: &[u8]) -> Result<()> {
        if label.len() > LABEL_MAX || label.contains(&0) {
            return Err(Error::InvalidInput("a label is at most 16 bytes, without NUL"));
        }
        let inner = &self.inner;
        let journal = inner.journal()?;
        let sbi = &inner.sbi;
        let backups: Vec<u64> = (1..sbi.group_count)
            .filter(|&g| sbi.group_has_super(g))
            .map(|g| sbi.group_first_block(g))
            .collect();
        let set = |sb: &mut Superblock| {
            sb.s_volume_name = [0; LABEL_MAX];
            sb.s_volume_name[..label.len()].copy_from_slice(label);
        };
        inner.noting(crate::fs::stats::Op::Setattr, || {
            let credits = u32::try_from(1 + backups.len()).unwrap_or(u32::MAX);
            let h = journal.start(credits)?;
            let (_, off) = sbi.sb_location();
            let mut d = h.write(&inner.sb_buf)?;
            let mut sb = Superblock::parse(&d[off..]).ok_or(Error::InvalidInput("superblock"))?;
            set(&mut sb);
            d[off..off + SUPERBLOCK_SIZE].copy_from_slice(sb.as_bytes());
            drop(d);
            // A backup sits at the start of its group's first block, whatever the block size.
            let mut bad_backup = false;
            for &blk in &backups {
                let buf = inner.bcache.get(blk)?;
                let Some(mut sb) = Superblock::parse(&buf.data()[..]) else { continue };
                if sbi.metadata_csum && !sb.verify_checksum() {
                    bad_backup = true;
                    continue;
                }
                set(&mut sb);
                if sbi.metadata_csum {
                    sb.update_checksum();
                }
                h.write(&buf)?[..SUPERBLOCK_SIZE].copy_from_slice(sb.as_bytes());
            }
            h.stop();
            if bad_backup {
                return Err(crate::error::Corrupt(crate::error::CorruptKind::SuperblockChecksum).into());
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::test_image::{fsck_clean, mkfs_image, open_mem};
    use rext4_format::superblock::Superblock;

    /// The image as the closed filesystem left it: checked by e2fsck, and written to a file
    /// for the e2fsprogs tools (in a directory that lives as long as the returned guard).
    fn closed_image(dev: &crate::dev::MemDevice) -> (tempfile::TempDir, std::path::PathBuf, Vec<u8>) {
        let bytes = dev.snapshot();
        fsck_clean(&bytes);
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("a.img");
        std::fs::write(&img, &bytes).unwrap();
        (dir, img, bytes)
    }

    #[test]
    fn labels_are_set_through_the_journal() {
        let (fs, dev) = open_mem(mkfs_image(None, &["-L", "old"], "16M"));
        assert_eq!(fs.label(), b"old");
        fs.set_label(b"sixteen-bytes-ok").unwrap();
        assert_eq!(fs.label(), b"sixteen-bytes-ok");
        assert!(fs.set_label(b"seventeen-bytes!!").is_err());
        assert!(fs.set_label(b"a\0b").is_err());
        fs.set_label(b"data").unwrap();
        assert_eq!(fs.label(), b"data");
        drop(fs);
        let (_dir, img, _) = closed_image(&dev);
        let out = std::process::Command::new("e2label").arg(&img).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "data");
    }

    /// Every backup superblock carries the new label with a good checksum, as after the
    /// kernel's `FS_IOC_SETFSLABEL`; dumpe2fs reading a backup is the outside witness.
    #[test]
    fn labels_reach_the_backup_superblocks() {
        // 4 KiB blocks, 2,048 per group: 8 groups, backups in groups 1, 3, 5 and 7.
        let (fs, dev) = open_mem(mkfs_image(None, &["-b", "4096", "-g", "2048", "-L", "old"], "64M"));
        fs.set_label(b"new-label").unwrap();
        drop(fs);
        let (_dir, img, bytes) = closed_image(&dev);
        for g in [1usize, 3, 5, 7] {
            let at = g * 2048 * 4096;
            let sb = Superblock::parse(&bytes[at..]).unwrap();
            assert_eq!(sb.volume_name(), b"new-label", "group {g}");
            assert!(sb.verify_checksum(), "group {g}");
            assert_eq!(usize::from(sb.s_block_group_nr.get()), g);
            let out = std::process::Command::new("dumpe2fs")
                .args(["-h", "-o", &format!("superblock={}", g * 2048), "-o", "blocksize=4096"])
                .arg(&img)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.lines().any(|l| l.starts_with("Filesystem volume name:") && l.ends_with("new-label")),
                "{text}"
            );
        }
        // Groups without a backup were not touched.
        let at = 2 * 2048 * 4096;
        assert!(Superblock::parse(&bytes[at..]).is_none_or(|sb| sb.volume_name() != b"new-label"));
    }
}
