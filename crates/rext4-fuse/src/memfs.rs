//! An in-memory filesystem served with the daemon's own FUSE settings: the same session
//! configuration (threads, cloned fds, mount options), init flags, entry and attribute
//! timeouts and open flags as `rext4 mount`, behind it names and attributes in sharded maps
//! and nothing else (files hold no data). `rext4-bench` measures it beside `rext4 mount` as
//! the ceiling of a FUSE daemon on this machine: what the kernel's FUSE round trips cost when
//! the filesystem costs almost nothing.
//!
//! Names, not semantics: no permission checks of its own (the kernel's `default_permissions`
//! does them), no lookup counts (nodes go when their last name does), no rename or links.

use crate::adapter::{reply_empty, TTL};
use crate::options::MountOptions;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyOpen, Request, Session,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

const SHARDS: usize = 64;

struct Node {
    attr: FileAttr,
    /// A directory's names.
    children: Option<HashMap<Box<[u8]>, u64>>,
}

/// Nodes by number, sharded by number. No operation holds two shards at once.
pub(crate) struct MemFs {
    shards: Vec<Mutex<HashMap<u64, Node>>>,
    next: AtomicU64,
    /// Ask for io_uring queues at init, as the mount's `io_uring` option does.
    io_uring: Option<bool>,
    /// Directories open without a request, as the mount's (init.rs).
    no_opendir: bool,
}

type R<T> = Result<T, Errno>;
/// A directory entry read out: next position, name, attributes.
type Listed = (u64, Box<[u8]>, FileAttr);
/// A name and its node.
type Named = (Box<[u8]>, u64);

impl Default for MemFs {
    fn default() -> Self {
        Self::new()
    }
}

impl MemFs {
    /// An empty filesystem: a root directory, mode 0755, owned by root.
    pub(crate) fn new() -> Self {
        let fs = MemFs {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            next: AtomicU64::new(2),
            io_uring: None,
            no_opendir: false,
        };
        fs.put(attr(1, FileType::Directory, 0o755, 0, 0), true);
        fs
    }

    fn shard(&self, ino: u64) -> std::sync::MutexGuard<'_, HashMap<u64, Node>> {
        // A poisoned shard only means a request panicked; its map is still whole.
        self.shards[crate::handles::shard_index(ino, SHARDS)].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn put(&self, a: FileAttr, dir: bool) {
        self.shard(a.ino.0).insert(a.ino.0, Node { attr: a, children: dir.then(HashMap::new) });
    }

    fn getattr_of(&self, ino: u64) -> R<FileAttr> {
        self.shard(ino).get(&ino).map(|n| n.attr).ok_or(Errno::ENOENT)
    }

    fn lookup_in(&self, parent: u64, name: &[u8]) -> R<Option<u64>> {
        let s = self.shard(parent);
        let dir = s.get(&parent).ok_or(Errno::ENOENT)?;
        let children = dir.children.as_ref().ok_or(Errno::ENOTDIR)?;
        Ok(children.get(name).copied())
    }

    /// Directory `ino`'s entries after position `offset`: (next position, name, attributes),
    /// "." and ".." first, then its names in the map's order at the call.
    fn listing(&self, ino: u64, offset: u64) -> R<Vec<Listed>> {
        let (me, names): (FileAttr, Vec<Named>) = {
            let s = self.shard(ino);
            let n = s.get(&ino).ok_or(Errno::ENOENT)?;
            let c = n.children.as_ref().ok_or(Errno::ENOTDIR)?;
            (n.attr, c.iter().map(|(n, &i)| (n.clone(), i)).collect())
        };
        let dots = [(Box::<[u8]>::from(&b"."[..]), me), (Box::<[u8]>::from(&b".."[..]), me)];
        // A name removed meanwhile is left out.
        let named = names.into_iter().filter_map(|(n, i)| self.getattr_of(i).ok().map(|a| (n, a)));
        Ok(dots
            .into_iter()
            .chain(named)
            .enumerate()
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
            .map(|(pos, (n, a))| (pos as u64 + 1, n, a))
            .collect())
    }

    /// A new node named `name` in `parent`: made first, then linked (EEXIST undoes it).
    fn make(&self, req: &Request, parent: u64, name: &[u8], kind: FileType, mode: u32) -> R<FileAttr> {
        if name.len() > 255 {
            return Err(Errno::ENAMETOOLONG);
        }
        let ino = self.next.fetch_add(1, Ordering::Relaxed);
        let a = attr(ino, kind, (mode & 0o7777) as u16, req.uid(), req.gid());
        self.put(a, kind == FileType::Directory);
        let linked = {
            let mut s = self.shard(parent);
            match s.get_mut(&parent).map(|d| (d.children.as_mut(), &mut d.attr)) {
                None => Err(Errno::ENOENT),
                Some((None, _)) => Err(Errno::ENOTDIR),
                Some((Some(c), _)) if c.contains_key(name) => Err(Errno::EEXIST),
                Some((Some(c), pa)) => {
                    c.insert(name.into(), ino);
                    pa.mtime = a.mtime;
                    pa.ctime = a.ctime;
                    if kind == FileType::Directory {
                        pa.nlink += 1;
                    }
                    Ok(())
                }
            }
        };
        if let Err(e) = linked {
            self.shard(ino).remove(&ino);
            return Err(e);
        }
        Ok(a)
    }

    /// Removes `name` from `parent` (a directory only if `dir`, and only if empty).
    fn remove(&self, parent: u64, name: &[u8], dir: bool) -> R<()> {
        let ino = self.lookup_in(parent, name)?.ok_or(Errno::ENOENT)?;
        {
            let mut s = self.shard(ino);
            let n = s.get(&ino).ok_or(Errno::ENOENT)?;
            match (&n.children, dir) {
                (Some(c), true) if !c.is_empty() => return Err(Errno::ENOTEMPTY),
                (Some(_), false) => return Err(Errno::EISDIR),
                (None, true) => return Err(Errno::ENOTDIR),
                _ => {}
            }
            s.remove(&ino);
        }
        let mut s = self.shard(parent);
        if let Some(d) = s.get_mut(&parent) {
            if let Some(c) = d.children.as_mut() {
                c.remove(name);
            }
            d.attr.mtime = SystemTime::now();
            d.attr.ctime = d.attr.mtime;
            if dir {
                d.attr.nlink -= 1;
            }
        }
        Ok(())
    }
}

fn attr(ino: u64, kind: FileType, perm: u16, uid: u32, gid: u32) -> FileAttr {
    let now = SystemTime::now();
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid,
        gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn negative() -> FileAttr {
    FileAttr { nlink: 0, ..attr(0, FileType::RegularFile, 0, 0, 0) }
}

fn entry(r: R<FileAttr>, reply: ReplyEntry) {
    match r {
        Ok(a) => reply.entry(&TTL, &a, Generation(0)),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for MemFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        crate::init::negotiate(config, false, self.io_uring);
        self.no_opendir = crate::init::zero_message_opendir(config, crate::LockMode::Kernel);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.lookup_in(parent.0, name.as_bytes()) {
            Ok(Some(ino)) => entry(self.getattr_of(ino), reply),
            Ok(None) => reply.entry(&TTL, &negative(), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.getattr_of(ino.0) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        entry(self.make(req, parent.0, name.as_bytes(), FileType::Directory, mode), reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(self.remove(parent.0, name.as_bytes(), false), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(self.remove(parent.0, name.as_bytes(), true), reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.getattr_of(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_opendir {
            reply.error(Errno::ENOSYS);
            return;
        }
        match self.getattr_of(ino.0) {
            Ok(a) if a.kind == FileType::Directory => {
                reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR)
            }
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        match self.listing(ino.0, offset) {
            Ok(v) => {
                for (pos, name, a) in v {
                    if reply.add(a.ino, pos, a.kind, OsStr::from_bytes(&name)) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        match self.listing(ino.0, offset) {
            Ok(v) => {
                for (pos, name, a) in v {
                    if reply.add(a.ino, pos, OsStr::from_bytes(&name), &TTL, &a, Generation(0)) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        match self.make(req, parent.0, name.as_bytes(), FileType::RegularFile, mode) {
            Ok(a) => reply.created(
                &TTL,
                &a,
                Generation(0),
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
            ),
            Err(e) => reply.error(e),
        }
    }
}

/// Mounts an empty `MemFs` on `mountpoint` with the session settings `opts` give
/// `rext4 mount`, and serves it until it is unmounted.
pub fn serve_memfs(mountpoint: &Path, opts: &MountOptions) -> io::Result<()> {
    opts.validate().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let fs = MemFs { io_uring: opts.io_uring, ..MemFs::new() };
    let session = Session::new(fs, mountpoint, &crate::fuser_config(opts))?;
    // The same readahead window as the mount it is the ceiling of.
    let _ = crate::bdi::apply(&mountpoint.canonicalize().unwrap_or_else(|_| mountpoint.to_path_buf()));
    match session.run() {
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENODEV | libc::ECONNABORTED)) => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_and_go() {
        let fs = MemFs::new();
        assert_eq!(fs.lookup_in(1, b"x"), Ok(None));
        let a = fs.next.load(Ordering::Relaxed);
        fs.put(attr(a, FileType::RegularFile, 0o644, 0, 0), false);
        fs.shard(1).get_mut(&1).unwrap().children.as_mut().unwrap().insert(b"x"[..].into(), a);
        assert_eq!(fs.lookup_in(1, b"x"), Ok(Some(a)));
        assert_eq!(fs.remove(1, b"x", true), Err(Errno::ENOTDIR));
        assert_eq!(fs.remove(1, b"x", false), Ok(()));
        assert_eq!(fs.lookup_in(1, b"x"), Ok(None));
        assert_eq!(fs.getattr_of(a), Err(Errno::ENOENT));
    }
}
