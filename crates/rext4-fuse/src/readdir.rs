//! Directory listings: `READDIR` (names and types) and `READDIRPLUS` (names with attributes,
//! each entry handed to the kernel counting as a lookup). Each request sets the directory's
//! access time as the mount's options say (the engine's `readdir`), unless it was opened
//! with `O_NOATIME`.

use crate::adapter::{gen, ino_of, Adapter, R};
use crate::attr::{file_attr, fuse_type, stat_attr, visible};
use fuser::{FileHandle, INodeNo, ReplyDirectory, ReplyDirectoryPlus};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

impl Adapter {
    /// The engine's `readdir`, or `readdir_noatime` for a directory opened with `O_NOATIME`:
    /// `READDIR` carries no flags here, but the `OPENDIR` that made `fh` did. (Opened without
    /// a request, `FUSE_NO_OPENDIR_SUPPORT`, it has no handle, and the flag is not seen.)
    fn list(
        &self,
        dir: rext4::InodeNo,
        fh: FileHandle,
        offset: u64,
        f: impl FnMut(rext4::DirEntry) -> bool,
    ) -> rext4::Result<()> {
        let noatime =
            self.shared.handles.get(fh.0, u64::from(dir.0)).is_some_and(|o| o.flags & libc::O_NOATIME != 0);
        if noatime {
            self.fs().readdir_noatime(dir, offset, f)
        } else {
            self.fs().readdir(dir, offset, f)
        }
    }

    pub(crate) fn do_readdir(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: &mut ReplyDirectory,
    ) -> R<()> {
        let dir = ino_of(ino)?;
        let mut failed = None;
        let res = self.list(dir, fh, offset, |e| {
            if !visible(e.ino) {
                return true;
            }
            let kind = match e.kind {
                Some(k) => k,
                None => match self.fs().getattr(e.ino) {
                    Ok(a) => a.kind,
                    // Removed since the entry was read: leave it out.
                    Err(rext4::Error::NotFound) => return true,
                    Err(err) => {
                        failed = Some(self.err(err));
                        return false;
                    }
                },
            };
            // `d_ino` is the ext4 number (the root's `.` and `..` show 2, as `st_ino` does).
            !reply.add(INodeNo(u64::from(e.ino.0)), e.next, fuse_type(kind), OsStr::from_bytes(&e.name))
        });
        match (res, failed) {
            (_, Some(e)) => Err(e),
            (Err(e), None) => Err(self.err(e)),
            (Ok(()), None) => Ok(()),
        }
    }

    pub(crate) fn do_readdirplus(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: &mut ReplyDirectoryPlus,
    ) -> R<()> {
        let dir = ino_of(ino)?;
        let ttl = self.entry_ttl(ino);
        let mut failed = None;
        let mut added = 0usize;
        let res = self.list(dir, fh, offset, |e| {
            if !visible(e.ino) {
                return true;
            }
            let a = match self.fs().getattr(e.ino) {
                Ok(a) => a,
                Err(rext4::Error::NotFound) => return true,
                Err(err) => {
                    failed = Some(self.err(err));
                    return false;
                }
            };
            let dots = e.name == b"." || e.name == b"..";
            // `.` and `..` carry no lookup: the kernel skips them. Every other entry
            // that fits is counted before the reply goes out.
            if !dots {
                if let Err(err) = self.take_lookup(a.ino) {
                    failed = Some(err);
                    return false;
                }
            }
            // The kernel links no dentry for `.` and `..`: they carry `st_ino` values.
            let fa = if dots { stat_attr(&a) } else { file_attr(&a) };
            let d_ino = INodeNo(u64::from(a.ino.0));
            let full = reply.add(d_ino, e.next, OsStr::from_bytes(&e.name), &ttl, &fa, gen(&a));
            if full && !dots {
                self.forget_one(fa.ino, 1);
            }
            if !full {
                added += 1;
            }
            !full
        });
        match (res, failed) {
            // What was added is still good; the error comes back on the next call.
            _ if added > 0 => Ok(()),
            (_, Some(e)) => Err(e),
            (Err(e), None) => Err(self.err(e)),
            (Ok(()), None) => Ok(()),
        }
    }
}
