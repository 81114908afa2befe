//! The ioctls the daemon answers: `FS_IOC_GETFLAGS`/`SETFLAGS` and `FS_IOC_FSGETXATTR`/
//! `FSSETXATTR` (what `lsattr` and `chattr` use, through the kernel's fileattr calls),
//! `FS_IOC_GETVERSION`, `FITRIM` (`fstrim`) and `FS_IOC_GETFSLABEL`/`SETFSLABEL` (the volume
//! label, as `xfs_io -c label` and `btrfs filesystem label` use them).

use crate::adapter::{ino_of, Adapter, R};
use fuser::{Errno, INodeNo};
use rext4::Attr;

// `FS_IOC_GETFLAGS` / `FS_IOC_SETFLAGS` / `FS_IOC_GETVERSION`, with the argument sizes of 64-
// and 32-bit callers (the kernel's fileattr calls use the latter).
const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
const FS_IOC32_GETFLAGS: u32 = 0x8004_6601;
const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
const FS_IOC32_SETFLAGS: u32 = 0x4004_6602;
const FS_IOC_FSGETXATTR: u32 = 0x801C_581F;
const FS_IOC_FSSETXATTR: u32 = 0x401C_5820;
const FS_IOC_GETVERSION: u32 = 0x8008_7601;

/// Inode flags and the `FS_XFLAG_*` bits `fsxattr` shows them as (`fileattr_fill_flags`).
const XFLAG_MAP: [(u32, u32); 7] = [
    (0x0000_0008, 0x0000_0020), // sync
    (0x0000_0010, 0x0000_0008), // immutable
    (0x0000_0020, 0x0000_0010), // append
    (0x0000_0040, 0x0000_0080), // nodump
    (0x0000_0080, 0x0000_0040), // noatime
    (0x0200_0000, 0x0000_8000), // dax
    (0x2000_0000, 0x0000_0200), // project inherit
];

fn flags_to_xflags(flags: u32) -> u32 {
    XFLAG_MAP.iter().filter(|&&(f, _)| flags & f != 0).fold(0, |x, &(_, b)| x | b)
}

fn xflags_to_flags(xflags: u32) -> u32 {
    XFLAG_MAP.iter().filter(|&&(_, b)| xflags & b != 0).fold(0, |f, &(b, _)| f | b)
}
const FS_IOC32_GETVERSION: u32 = 0x8004_7601;
/// `FITRIM`: `_IOWR('X', 121, struct fstrim_range)`.
const FITRIM: u32 = 0xC018_5879;
/// `FS_IOC_GETFSLABEL` / `FS_IOC_SETFSLABEL`: `_IOR`/`_IOW(0x94, 49/50, char[FSLABEL_MAX])`.
const FS_IOC_GETFSLABEL: u32 = 0x8100_9431;
const FS_IOC_SETFSLABEL: u32 = 0x4100_9432;
const FSLABEL_MAX: usize = 256;

impl Adapter {
    /// The ioctls `lsattr` and `chattr` use (through the kernel's fileattr calls, which have
    /// checked ownership and, for the immutable and append-only flags, CAP_LINUX_IMMUTABLE),
    /// `FS_IOC_GETVERSION`, `FITRIM` and the label's (the last two root's: `uid` is the
    /// caller's); the reply's bytes.
    pub(crate) fn do_ioctl(&self, uid: u32, ino: INodeNo, cmd: u32, input: &[u8]) -> R<Vec<u8>> {
        let e = ino_of(ino)?;
        let word = |at: usize| -> R<u32> {
            let b = input.get(at..at + 4).ok_or(Errno::EINVAL)?;
            Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let visible = |a: &Attr| a.flags & rext4::FL_USER_VISIBLE;
        match cmd {
            FS_IOC_GETFLAGS | FS_IOC32_GETFLAGS => {
                Ok(u64::from(visible(&self.attr(ino)?)).to_le_bytes().to_vec())
            }
            FS_IOC_GETVERSION | FS_IOC32_GETVERSION => {
                // An int, as ext4 `put_user`s it: the kernel copies the whole reply into the
                // caller's buffer, whatever the size in the ioctl number says.
                Ok(self.attr(ino)?.generation.to_le_bytes().to_vec())
            }
            FS_IOC_SETFLAGS | FS_IOC32_SETFLAGS => {
                let flags = word(0)?;
                self.writable()?;
                self.fs().set_flags(e, flags).map_err(|err| self.err(err))?;
                self.attributes_changed(ino);
                Ok(Vec::new())
            }
            FS_IOC_FSGETXATTR => {
                // struct fsxattr: xflags, extsize, nextents, projid, cowextsize, 8 pad bytes.
                let mut out = vec![0u8; 28];
                out[0..4].copy_from_slice(&flags_to_xflags(visible(&self.attr(ino)?)).to_le_bytes());
                let projid = self.fs().project(e).map_err(|err| self.err(err))?;
                out[12..16].copy_from_slice(&projid.to_le_bytes());
                Ok(out)
            }
            FS_IOC_FSSETXATTR => {
                let (xflags, projid) = (word(0)?, word(12)?);
                self.writable()?;
                let old = visible(&self.attr(ino)?);
                let flags = (old & !XFLAG_MAP.iter().fold(0, |m, &(f, _)| m | f)) | xflags_to_flags(xflags);
                // `ext4_ioctl_check_immutable`: a file immutable before and after keeps its
                // project; then the flags, then the project, as `ext4_fileattr_set` orders them.
                let immutable = rext4::format::inode::IMMUTABLE_FL;
                let moves = projid != self.fs().project(e).map_err(|err| self.err(err))?;
                if old & flags & immutable != 0 && moves {
                    return Err(Errno::EPERM);
                }
                self.fs().set_flags(e, flags).map_err(|err| self.err(err))?;
                if moves {
                    self.fs().set_project(e, projid).map_err(|err| self.err(err))?;
                }
                self.attributes_changed(ino);
                Ok(Vec::new())
            }
            FITRIM => {
                // ext4 asks for CAP_SYS_ADMIN; the request carries only the caller's ids.
                if uid != 0 {
                    return Err(Errno::EPERM);
                }
                // struct fstrim_range: start, len, minlen; len comes back as the bytes trimmed.
                let dword = |at: usize| -> R<u64> {
                    let b = input.get(at..at + 8).ok_or(Errno::EINVAL)?;
                    Ok(u64::from_le_bytes(b.try_into().map_err(|_| Errno::EINVAL)?))
                };
                let (start, len, minlen) = (dword(0)?, dword(8)?, dword(16)?);
                let trimmed = self.fs().trim(start, len, minlen).map_err(|err| self.err(err))?;
                let mut out = input[..24].to_vec();
                out[8..16].copy_from_slice(&trimmed.to_le_bytes());
                Ok(out)
            }
            FS_IOC_GETFSLABEL => {
                let mut out = self.fs().label();
                out.resize(FSLABEL_MAX, 0);
                Ok(out)
            }
            FS_IOC_SETFSLABEL => {
                // ext4 asks for CAP_SYS_ADMIN.
                if uid != 0 {
                    return Err(Errno::EPERM);
                }
                let raw = input.get(..FSLABEL_MAX).ok_or(Errno::EINVAL)?;
                let label = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
                self.writable()?;
                self.fs().set_label(label).map_err(|err| self.err(err))?;
                Ok(Vec::new())
            }
            _ => Err(Errno::ENOTTY),
        }
    }
}
