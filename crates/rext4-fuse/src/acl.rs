//! POSIX ACLs on the mount. The daemon asks the kernel for `FUSE_POSIX_ACL` (the kernel then
//! enforces ACLs in its permission checks, as for ext4) and `FUSE_DONT_MASK` (create, mkdir
//! and mknod arrive with the mode unmasked and the caller's umask beside it), so a new inode
//! can take its directory's default ACL as ext4's `posix_acl_create` gives it: the umask is
//! then not applied. Without ACLs (`noacl`, `nodefault_permissions`, or a kernel without
//! them) the kernel has applied the umask already and nothing is inherited.

use crate::adapter::{Adapter, R};
use fuser::{InitFlags, KernelConfig};
use rext4::{InheritedAcl, InodeNo};
use std::sync::atomic::Ordering;

impl Adapter {
    /// Asks for ACLs at init where the options and the kernel allow.
    pub(crate) fn negotiate_acl(&self, config: &mut KernelConfig) {
        // ACLs need the kernel's permission checks, which `nodefault_permissions` turns off.
        let acl = InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK;
        let opts = &self.shared.opts;
        if opts.acl && opts.default_permissions && config.capabilities().contains(acl) {
            let on = config.add_capabilities(acl).is_ok();
            self.shared.acls.store(on, Ordering::Relaxed);
            // So that a `system.posix_acl_access` set by a caller outside the file's group
            // says so (`FUSE_SETXATTR_ACL_KILL_SGID`): the set-group-ID bit goes then.
            if on && config.capabilities().contains(InitFlags::FUSE_SETXATTR_EXT) {
                let _ = config.add_capabilities(InitFlags::FUSE_SETXATTR_EXT);
            }
        }
    }

    /// Whether ACLs are enforced and inherited on this mount.
    pub(crate) fn acls_on(&self) -> bool {
        self.shared.acls.load(Ordering::Relaxed)
    }

    /// The mode and ACLs of a new inode in `parent`, from the mode and umask of the request.
    pub(crate) fn new_inode_acl(
        &self,
        parent: InodeNo,
        mode: u16,
        umask: u32,
        is_dir: bool,
    ) -> R<InheritedAcl> {
        let umask = (umask & 0o777) as u16;
        if !self.acls_on() {
            return Ok(InheritedAcl::none(mode & !umask));
        }
        self.fs().acl_for_new_inode(parent, mode, umask, is_dir).map_err(|e| self.err(e))
    }

    /// Stores the inherited ACLs on `made`, the inode just created as `name` in `parent`, and
    /// returns its attributes as they then are (`made` itself when there was nothing to
    /// store: no second lookup on the create path). If storing fails the new name is removed
    /// again, so the request fails whole.
    pub(crate) fn store_inherited_acl(
        &self,
        parent: InodeNo,
        name: &[u8],
        made: rext4::Attr,
        acl: &InheritedAcl,
        is_dir: bool,
    ) -> R<rext4::Attr> {
        if !acl.stores_any() {
            return Ok(made);
        }
        let ino = made.ino;
        let e = match self.fs().set_inherited_acl(ino, acl) {
            Ok(()) => return self.fs().getattr(ino).map_err(|e| self.err(e)),
            Err(e) => e,
        };
        let errno = self.err_in("create (ACL)", e);
        let undo = if is_dir { self.fs().rmdir(parent, name) } else { self.fs().unlink(parent, name) };
        if let Err(u) = undo {
            crate::log(&format!("removing inode {ino} after its ACL failed: {u}"));
        }
        Err(errno)
    }
}
