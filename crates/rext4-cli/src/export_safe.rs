//! Creating an export's files on the host without ever writing outside its directory.
//!
//! Names come from the image and are untrusted: the caller checks each with
//! [`crate::fmt::bad_name`], and everything here works relative to directory descriptors,
//! opening each directory component with `O_NOFOLLOW`, so neither a crafted name nor a
//! symbolic link (made by the export itself or already on the host) can redirect a write.

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fchmodat, fstatat, mkdirat, mknodat, utimensat, FchmodatFlags, Mode, SFlag};
use nix::sys::stat::{FileStat, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchownat, linkat, mkfifoat, symlinkat, Gid, Uid};
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The host directory an export is made in, held open.
pub(crate) struct HostDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// A directory below the export's base, opened component by component.
pub(crate) struct Parent {
    fd: OwnedFd,
}

fn is(st: &FileStat, kind: libc::mode_t) -> bool {
    st.st_mode & libc::S_IFMT == kind
}

impl HostDir {
    /// Opens `path`, which the user named (so a symlink there is followed, as `cp` does).
    pub(crate) fn open(path: &Path) -> Result<Self, String> {
        let fd =
            nix::fcntl::open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
                .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(HostDir { fd, path: path.to_path_buf() })
    }

    /// How `comps` is shown in messages.
    pub(crate) fn display(&self, comps: &[&[u8]]) -> String {
        let mut p = self.path.clone();
        for c in comps {
            p.push(OsStr::from_bytes(c));
        }
        p.display().to_string()
    }

    /// Opens the directory `comps` below the base; no component may be a symbolic link.
    pub(crate) fn dir(&self, comps: &[&[u8]]) -> nix::Result<Parent> {
        let mut fd = self.fd.try_clone().map_err(|_| Errno::EMFILE)?;
        for c in comps {
            let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            fd = openat(&fd, OsStr::from_bytes(c), flags, Mode::empty())?;
        }
        Ok(Parent { fd })
    }
}

impl Parent {
    fn stat(&self, name: &[u8]) -> nix::Result<FileStat> {
        fstatat(&self.fd, OsStr::from_bytes(name), AtFlags::AT_SYMLINK_NOFOLLOW)
    }

    /// Makes directory `name`, or accepts one already there (never a symlink to one).
    pub(crate) fn mkdir(&self, name: &[u8]) -> Result<(), String> {
        match mkdirat(&self.fd, OsStr::from_bytes(name), Mode::from_bits_truncate(0o700)) {
            Err(Errno::EEXIST) if self.stat(name).is_ok_and(|st| is(&st, libc::S_IFDIR)) => Ok(()),
            Err(Errno::EEXIST) => Err("exists and is not a directory".into()),
            r => r.map_err(|e| e.to_string()),
        }
    }

    /// Opens regular file `name` for writing, creating it or emptying one already there as
    /// `cp` does; a symbolic link, fifo or device there is refused, not written through.
    pub(crate) fn create_file(&self, name: &[u8]) -> Result<File, String> {
        // O_NONBLOCK: opening a fifo someone left there must fail, not wait for a reader.
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let fd = openat(&self.fd, OsStr::from_bytes(name), flags, Mode::from_bits_truncate(0o600)).map_err(
            |e| match e {
                Errno::ELOOP => "exists and is a symbolic link; not followed".to_string(),
                e => e.to_string(),
            },
        )?;
        let st = nix::sys::stat::fstat(&fd).map_err(|e| e.to_string())?;
        if !is(&st, libc::S_IFREG) {
            return Err("exists and is not a regular file".into());
        }
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(OFlag::empty())).map_err(|e| e.to_string())?;
        let f = File::from(fd);
        f.set_len(0).map_err(|e| e.to_string())?;
        Ok(f)
    }

    pub(crate) fn symlink(&self, name: &[u8], target: &[u8]) -> Result<(), String> {
        symlinkat(OsStr::from_bytes(target), &self.fd, OsStr::from_bytes(name)).map_err(|e| e.to_string())
    }

    pub(crate) fn mkfifo(&self, name: &[u8]) -> Result<(), String> {
        mkfifoat(&self.fd, OsStr::from_bytes(name), Mode::from_bits_truncate(0o600))
            .map_err(|e| e.to_string())
    }

    pub(crate) fn mknod(&self, name: &[u8], kind: SFlag, dev: libc::dev_t) -> Result<(), String> {
        mknodat(&self.fd, OsStr::from_bytes(name), kind, Mode::from_bits_truncate(0o600), dev)
            .map_err(|e| e.to_string())
    }

    /// A hard link `name` to `from_name` in `from` (never following a symlink).
    pub(crate) fn link(&self, name: &[u8], from: &Parent, from_name: &[u8]) -> Result<(), String> {
        linkat(&from.fd, OsStr::from_bytes(from_name), &self.fd, OsStr::from_bytes(name), AtFlags::empty())
            .map_err(|e| e.to_string())
    }

    pub(crate) fn chown(&self, name: &[u8], uid: u32, gid: u32) -> nix::Result<()> {
        let (u, g) = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
        fchownat(&self.fd, OsStr::from_bytes(name), u, g, AtFlags::AT_SYMLINK_NOFOLLOW)
    }

    /// Sets permission bits; never on a symbolic link (Linux has no modes for those).
    pub(crate) fn chmod(&self, name: &[u8], mode: u16) -> nix::Result<()> {
        if self.stat(name).is_ok_and(|st| is(&st, libc::S_IFLNK)) {
            return Err(Errno::ELOOP);
        }
        let m = Mode::from_bits_truncate(libc::mode_t::from(mode));
        fchmodat(&self.fd, OsStr::from_bytes(name), m, FchmodatFlags::FollowSymlink)
    }

    pub(crate) fn set_times(
        &self,
        name: &[u8],
        atime: rext4::Timestamp,
        mtime: rext4::Timestamp,
    ) -> nix::Result<()> {
        let ts = |t: rext4::Timestamp| TimeSpec::new(t.sec, i64::from(t.nsec));
        utimensat(&self.fd, OsStr::from_bytes(name), &ts(atime), &ts(mtime), UtimensatFlags::NoFollowSymlink)
    }

    /// Sets an extended attribute on `name` itself (a symlink is not followed): through
    /// this directory's descriptor in /proc, since there is no `setxattrat` to call.
    pub(crate) fn set_xattr(&self, name: &[u8], attr: &[u8], value: &[u8]) -> std::io::Result<()> {
        let mut p = PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_fd().as_raw_fd()));
        p.push(OsStr::from_bytes(name));
        xattr::set(p, OsStr::from_bytes(attr), value)
    }
}
