//! The work several requests share: new inodes' owners, attribute changes, opens and the
//! append-only rules the kernel cannot apply on a FUSE inode, `copy_file_range`, xattr
//! replies and `access(2)`, each through the engine's VFS layer where it has one.

use crate::adapter::{gen, ino_of, supplementary_groups, Adapter, COPY_CHUNK, COPY_MAX, R};
use crate::attr::file_attr;
use crate::options::LockMode;
use fuser::{
    AccessFlags, Errno, FileHandle, FopenFlags, INodeNo, OpenFlags, ReplyCreate, ReplyXattr, Request,
};
use rext4::format::inode::APPEND_FL;
use rext4::{Attr, Caps, Creds, FileType, InodeNo, SetAttr};

impl Adapter {
    /// The caller as the engine's VFS layer sees it, for what the kernel has not checked
    /// itself: with `default_permissions` every permission check is the kernel's (and so is
    /// the set-group-ID stripping of new files), so the caller passes them all.
    pub(crate) fn creds(&self, req: &Request) -> Creds {
        Creds::user(req.uid(), req.gid(), &[]).with_caps(Caps::all())
    }

    /// Owner and mode of a new inode in `parent` (`inode_init_owner`, in the engine).
    pub(crate) fn new_owner(
        &self,
        req: &Request,
        parent: InodeNo,
        mode: u16,
        is_dir: bool,
    ) -> R<(u16, u32, u32)> {
        let p = self.fs().getattr(parent).map_err(|e| self.err(e))?;
        if p.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        let kind = if is_dir { rext4::format::inode::S_IFDIR } else { rext4::format::inode::S_IFREG };
        let (m, uid, gid) = rext4::init_owner(&self.creds(req), &p, kind | mode, self.shared.opts.grpid);
        Ok((m & 0o7777, uid, gid))
    }

    /// A new regular file's inherited ACLs, mode and owner in `parent`, from the request's
    /// `mode` and `umask` (`create`, `tmpfile`).
    pub(crate) fn new_file(
        &self,
        req: &Request,
        parent: InodeNo,
        mode: u32,
        umask: u32,
    ) -> R<(rext4::InheritedAcl, u16, u32, u32)> {
        let acl = self.new_inode_acl(parent, (mode & 0o7777) as u16, umask, false)?;
        let (m, uid, gid) = self.new_owner(req, parent, acl.initial_mode(), false)?;
        Ok((acl, m, uid, gid))
    }

    /// Replies to a `create` or `tmpfile` in `parent` that made `r` (its lookup counted),
    /// opening it with `flags`.
    pub(crate) fn created(&self, parent: INodeNo, r: R<Attr>, flags: i32, reply: ReplyCreate) {
        match r {
            Ok(a) => {
                let fh = self.shared.handles.open(u64::from(a.ino.0), flags);
                // One validity for the entry and the attributes (the entry's decides).
                let ttl = self.entry_ttl(parent);
                reply.created(&ttl, &file_attr(&a), gen(&a), FileHandle(fh), self.open_flags());
            }
            Err(e) => reply.error(e),
        }
    }

    pub(crate) fn attr(&self, ino: INodeNo) -> R<Attr> {
        self.fs().getattr(ino_of(ino)?).map_err(|e| self.err(e))
    }

    pub(crate) fn do_setattr(&self, ino: InodeNo, ch: &SetAttr) -> R<Attr> {
        // A setattr that names no attribute still moves the change time: that is how
        // `chown(f, -1, -1)` arrives (the VFS's `ATTR_CTIME`, which FUSE does not pass on
        // without the writeback cache), and ext4 stamps it. Nothing changes on a read-only
        // filesystem, where the kernel refuses such calls before they get here.
        if *ch == SetAttr::default() && !self.fs().is_writable() {
            return self.fs().getattr(ino).map_err(|e| self.err(e));
        }
        self.writable()?;
        // Under the writeback cache, a flush of the kernel's own times (`fuse_flush_times`
        // after a write) arrives with equal modification and change times and is taken as
        // the write's "now" (attr.rs `writeback_times`), which an append-only file allows.
        self.fs().setattr(ino, ch).map_err(|e| self.err(e))
    }

    pub(crate) fn do_open(&self, req: &Request, ino: INodeNo, flags: OpenFlags) -> R<(u64, FopenFlags)> {
        let e = ino_of(ino)?;
        let acc = flags.0 & libc::O_ACCMODE;
        if acc != libc::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            self.writable()?;
            // `may_open` in the engine: the kernel knows nothing of ext4's flags on a FUSE
            // inode. The open's flags arrive whole, `O_APPEND` too, also with the writeback
            // cache (where the kernel places the writes, and the pages it flushes are checked
            // by `append_only_tail`).
            let f = rext4::OpenFlags::from_libc(flags.0);
            let a = self.attr(ino)?;
            self.fs().may_open(&self.creds(req), &a, f).map_err(|err| self.err(err))?;
        }
        // No FUSE_ATOMIC_O_TRUNC: the kernel truncates with a SETATTR once the VFS has made
        // its checks (`handle_truncate`: a running executable is ETXTBSY and keeps its bytes).
        let mut open_flags = self.open_flags();
        // The kernel answers reads from its page cache without asking, and a FUSE inode's
        // access time is the daemon's: where a read now would set it (ext4's relatime after
        // a change, every read under strictatime), the open drops the cached pages, so the
        // next read reaches the engine and sets it. Otherwise the cache stays.
        if acc != libc::O_WRONLY
            && flags.0 & libc::O_NOATIME == 0
            && self.fs().read_would_set_atime(e).map_err(|err| self.err(err))?
        {
            open_flags.remove(FopenFlags::FOPEN_KEEP_CACHE);
        }
        let fh = self.shared.handles.open(u64::from(e.0), flags.0);
        Ok((fh, open_flags))
    }

    /// How files are opened: kept in the kernel's cache, and closed without a `FLUSH`
    /// unless the engine keeps the locks (a close must then drop the closer's, locks.rs).
    pub(crate) fn open_flags(&self) -> FopenFlags {
        match self.shared.opts.locks {
            LockMode::Kernel => FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
            LockMode::Engine => FopenFlags::FOPEN_KEEP_CACHE,
        }
    }

    /// What of a write to an append-only file is new: the engine takes such writes only past
    /// the end, but with the writeback cache the kernel writes whole pages back, so the
    /// bytes before the end come again (without it, nothing to do: no attribute read on the
    /// write path). They are dropped where they are what the file holds
    /// (nothing is overwritten); a write that would change them is `EPERM`.
    pub(crate) fn append_only_tail<'a>(
        &self,
        ino: INodeNo,
        offset: u64,
        data: &'a [u8],
    ) -> R<(u64, &'a [u8])> {
        if !self.shared.opts.writeback_cache {
            // The kernel places every write itself: nothing comes twice.
            return Ok((offset, data));
        }
        let a = self.attr(ino)?;
        if a.flags & APPEND_FL == 0 || offset >= a.size {
            return Ok((offset, data));
        }
        let overlap = usize::try_from(a.size - offset).map_or(data.len(), |n| n.min(data.len()));
        let mut have = vec![0u8; overlap];
        let got = self.fs().read(ino_of(ino)?, offset, &mut have).map_err(|e| self.err(e))?;
        if got != overlap || have != data[..overlap] {
            return Err(Errno::EPERM);
        }
        Ok((a.size, &data[overlap..]))
    }

    pub(crate) fn do_xattr_reply(data: Vec<u8>, size: u32, reply: ReplyXattr) {
        if size == 0 {
            match u32::try_from(data.len()) {
                Ok(n) => reply.size(n),
                Err(_) => reply.error(Errno::E2BIG),
            }
        } else if data.len() > size as usize {
            reply.error(Errno::ERANGE);
        } else {
            reply.data(&data);
        }
    }

    /// `copy_file_range` by reads and writes; the reads set the source's access time as a
    /// read does (the kernel's splice reads call `file_accessed`), unless `noatime` (the
    /// source was opened with `O_NOATIME`).
    pub(crate) fn do_copy(
        &self,
        src: InodeNo,
        mut off_in: u64,
        dst: InodeNo,
        mut off_out: u64,
        len: u64,
        noatime: bool,
    ) -> R<u64> {
        self.writable()?;
        let mut left = len.min(COPY_MAX);
        let mut buf = vec![0u8; usize::try_from(left).map_or(COPY_CHUNK, |l| l.min(COPY_CHUNK))];
        let mut done = 0u64;
        while left > 0 {
            let want = usize::try_from(left).map_or(buf.len(), |l| l.min(buf.len()));
            let n = if noatime {
                self.fs().read_noatime(src, off_in, &mut buf[..want])
            } else {
                self.fs().read(src, off_in, &mut buf[..want])
            }
            .map_err(|e| self.err(e))?;
            if n == 0 {
                break;
            }
            let mut put = 0;
            while put < n {
                let w = self.fs().write(dst, off_out + put as u64, &buf[put..n]).map_err(|e| self.err(e))?;
                if w == 0 {
                    return Err(Errno::EIO);
                }
                put += w;
            }
            done += n as u64;
            left -= n as u64;
            off_in += n as u64;
            off_out += n as u64;
        }
        Ok(done)
    }

    /// `access(2)` when the kernel does not check (no `default_permissions`): the engine's
    /// `generic_permission` for the caller with its supplementary groups (which a FUSE
    /// request does not carry: read from /proc) and root's capabilities if it is root.
    pub(crate) fn check_access(&self, req: &Request, a: &Attr, mask: AccessFlags) -> R<()> {
        let want = rext4::Access::from_bits_truncate((mask.bits() & 7).unsigned_abs());
        if want.contains(rext4::Access::WRITE) {
            self.writable()?;
        }
        if want.is_empty() {
            return Ok(());
        }
        let c = Creds::user(req.uid(), req.gid(), &supplementary_groups(req.pid()));
        self.fs().access(&c, a, want).map_err(|e| self.err(e))
    }
}
