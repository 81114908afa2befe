//! Set-ID bits and file capabilities that writes, truncations and chowns take away
//! (`FUSE_HANDLE_KILLPRIV_V2`).
//!
//! Without it the kernel asks before every `write(2)` whether the file has a
//! `security.capability` attribute (a `GETXATTR` round trip, `file_remove_privs`), and clears
//! the set-ID bits itself with a `GETATTR` and a `SETATTR`. With it the kernel marks inodes it
//! has found clean (`S_NOSEC`) and leaves the clearing to the daemon, which must then do what
//! the kernel's VFS does on ext4:
//! - a write drops `security.capability`, and the set-ID bits when the kernel says so
//!   (`FUSE_WRITE_KILL_SUIDGID`: the writer lacks `CAP_FSETID`);
//! - a truncation (`FATTR_SIZE`) drops `security.capability`, and the set-ID bits with
//!   `FATTR_KILL_SUIDGID`;
//! - a chown of anything but a directory (`FATTR_UID`/`FATTR_GID`, or a `SETATTR` that
//!   changes nothing, which is how `chown(f, -1, -1)` arrives) drops `security.capability`
//!   and set-user-ID, whoever asks (`chown_common`'s `ATTR_KILL_SUID`).
//!
//! Set-group-ID goes where group execution makes it one, and, without group execute (where
//! it marks mandatory locking), only for a caller outside the file's group
//! (`setattr_should_drop_sgid`: the request's group, or a supplementary group read from
//! /proc, as `access(2)` does here). A chown says nothing of the caller's `CAP_FSETID`: there
//! the caller is taken to have it exactly when it is root.

use crate::adapter::{supplementary_groups, Adapter, R};
use fuser::{InitFlags, KernelConfig, Request};
use rext4::Attr;
use rext4::{FileType, InodeNo, SetAttr};
use std::sync::atomic::Ordering;

const CAPABILITY: &[u8] = b"security.capability";

impl Adapter {
    /// Asks for `FUSE_HANDLE_KILLPRIV_V2` where the kernel offers it.
    pub(crate) fn negotiate_killpriv(&self, config: &mut KernelConfig) {
        let on = config.capabilities().contains(InitFlags::FUSE_HANDLE_KILLPRIV_V2)
            && config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2).is_ok();
        self.shared.killpriv.store(on, Ordering::Relaxed);
    }

    /// Whether the daemon clears set-ID bits and capabilities itself.
    pub(crate) fn killpriv(&self) -> bool {
        self.shared.killpriv.load(Ordering::Relaxed)
    }

    /// What a write leaves: `suidgid` is the request's `FUSE_WRITE_KILL_SUIDGID`.
    pub(crate) fn kill_priv_on_write(&self, req: &Request, ino: InodeNo, suidgid: bool) -> R<()> {
        if !self.killpriv() {
            return Ok(());
        }
        if suidgid {
            let a = self.fs().getattr(ino).map_err(|e| self.err(e))?;
            if let Some(mode) = without_set_id(a.perm(), outside_group(req, &a)) {
                let ch = SetAttr { mode: Some(mode), ..SetAttr::default() };
                self.fs().setattr(ino, &ch).map_err(|e| self.err(e))?;
            }
        }
        self.drop_capability(ino)
    }

    /// Adds to a setattr what it takes away (see the module's comment); `kill_suidgid` is
    /// the request's `FATTR_KILL_SUIDGID`.
    pub(crate) fn kill_priv_on_setattr(
        &self,
        req: &Request,
        ino: InodeNo,
        ch: &mut SetAttr,
        kill_suidgid: bool,
    ) -> R<()> {
        if !self.killpriv() {
            return Ok(());
        }
        let chown = ch.uid.is_some() || ch.gid.is_some() || *ch == SetAttr::default();
        if !chown && ch.size.is_none() {
            return Ok(());
        }
        let a = self.fs().getattr(ino).map_err(|e| self.err(e))?;
        if a.kind == FileType::Directory {
            return Ok(());
        }
        if ch.mode.is_none() && (chown || kill_suidgid) {
            // A chown drops set-user-ID whoever asks; a truncation only as the kernel says.
            let perm = if chown && !kill_suidgid { a.perm() & !0o4000 } else { a.perm() };
            // The kernel sends `FATTR_KILL_SUIDGID` with every chown, so the flag tells of
            // `CAP_FSETID` only for a truncation (sent when the caller lacks it).
            let capable = if chown { req.uid() == 0 } else { !kill_suidgid };
            let outside = !capable && outside_group(req, &a);
            let mode = without_set_id(perm, outside).unwrap_or(perm);
            if mode != a.perm() {
                ch.mode = Some(mode);
            }
        }
        self.drop_capability(ino)
    }

    /// Removes `security.capability` if the inode has it.
    fn drop_capability(&self, ino: InodeNo) -> R<()> {
        match self.fs().getxattr(ino, CAPABILITY) {
            Ok(_) => match self.fs().removexattr(ino, CAPABILITY) {
                Ok(()) | Err(rext4::Error::NoData) => Ok(()),
                Err(e) => Err(self.err(e)),
            },
            Err(rext4::Error::NoData | rext4::Error::NotSupported(_)) => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }
}

/// `perm` without set-user-ID, and without set-group-ID where group execution makes it one
/// or the caller is `outside` the file's group; `None` when that changes nothing.
fn without_set_id(perm: u16, outside: bool) -> Option<u16> {
    let mut m = perm & !0o4000;
    if m & 0o010 != 0 || outside {
        m &= !0o2000;
    }
    (m != perm).then_some(m)
}

/// Whether the caller of `req` is outside the group of the file `a`, asked only where it
/// matters (set-group-ID without group execute), since it may read /proc.
fn outside_group(req: &Request, a: &Attr) -> bool {
    a.perm() & 0o2010 == 0o2000 && req.gid() != a.gid && !supplementary_groups(req.pid()).contains(&a.gid)
}

#[cfg(test)]
mod tests {
    use super::without_set_id;

    #[test]
    fn set_group_id_goes_only_with_group_execute() {
        assert_eq!(without_set_id(0o6755, false), Some(0o0755));
        assert_eq!(without_set_id(0o6745, false), Some(0o2745), "mandatory-locking sgid stays");
        assert_eq!(without_set_id(0o6745, true), Some(0o0745), "unless the caller is outside the group");
        assert_eq!(without_set_id(0o4700, false), Some(0o0700));
        assert_eq!(without_set_id(0o2710, false), Some(0o0710));
        assert_eq!(without_set_id(0o0755, true), None);
        assert_eq!(without_set_id(0o2745, false), None);
    }
}
