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

    /// Sets the volume label, through the journal. `EINVAL` for more than 16 bytes (ext4's
    /// limit), `EROFS` read-only. The kernel writes the backup superblocks too; e2fsck does
    /// not compare labels, and they are written here only in the primary.
    pub fn set_label(&self, label: &[u8]) -> Result<()> {
        if label.len() > LABEL_MAX || label.contains(&0) {
            return Err(Error::InvalidInput("a label is at most 16 bytes, without NUL"));
        }
        let inner = &self.inner;
        let journal = inner.journal()?;
        inner.noting(crate::fs::stats::Op::Setattr, || {
            let h = journal.start(1)?;
            let (_, off) = inner.sbi.sb_location();
            let mut d = h.write(&inner.sb_buf)?;
            let mut sb = Superblock::parse(&d[off..]).ok_or(Error::InvalidInput("superblock"))?;
            sb.s_volume_name = [0; LABEL_MAX];
            sb.s_volume_name[..label.len()].copy_from_slice(label);
            d[off..off + SUPERBLOCK_SIZE].copy_from_slice(sb.as_bytes());
            drop(d);
            h.stop();
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::test_image::{fsck_clean, mkfs_image, open_mem};

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
        let bytes = dev.snapshot();
        fsck_clean(&bytes);
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("a.img");
        std::fs::write(&img, &bytes).unwrap();
        let out = std::process::Command::new("e2label").arg(&img).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "data");
    }
}
