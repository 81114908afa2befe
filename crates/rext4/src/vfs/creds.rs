//! Who is asking: the caller's filesystem ids, groups and capabilities, as the kernel's
//! `struct cred` carries them (its fsuid and fsgid are the ids here).

use std::sync::Arc;

bitflags::bitflags! {
    /// The capabilities that bear on filesystem operations (`capabilities(7)`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct Caps: u32 {
        /// Change owners and groups freely.
        const CHOWN = 1 << 0;
        /// Bypass read, write and search permission checks.
        const DAC_OVERRIDE = 1 << 1;
        /// Bypass read permission on files and read and search on directories.
        const DAC_READ_SEARCH = 1 << 2;
        /// Act as the owner of any file (chmod, utimes, sticky directories, O_NOATIME).
        const FOWNER = 1 << 3;
        /// Keep set-user-ID and set-group-ID bits where others would lose them.
        const FSETID = 1 << 4;
        /// Set and clear the immutable and append-only flags.
        const LINUX_IMMUTABLE = 1 << 5;
        /// Use `trusted.*` extended attributes and other administration.
        const SYS_ADMIN = 1 << 6;
        /// Make device nodes.
        const MKNOD = 1 << 7;
        /// Fill the root-reserved blocks (`s_r_blocks_count`).
        const SYS_RESOURCE = 1 << 8;
    }
}

/// A caller's credentials. Cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Creds {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Arc<[u32]>,
    pub caps: Caps,
}

impl Creds {
    /// Root with every capability (what [`crate::Fs`] calls without credentials act as).
    pub fn root() -> Creds {
        Creds { uid: 0, gid: 0, groups: Arc::new([]), caps: Caps::all() }
    }

    /// A process running as `uid`/`gid` with supplementary `groups`; uid 0 has every
    /// capability, as a root process does, and other users none.
    pub fn user(uid: u32, gid: u32, groups: &[u32]) -> Creds {
        let caps = if uid == 0 { Caps::all() } else { Caps::empty() };
        Creds { uid, gid, groups: groups.into(), caps }
    }

    /// The same ids with capabilities `caps`.
    pub fn with_caps(mut self, caps: Caps) -> Creds {
        self.caps = caps;
        self
    }

    /// Whether `gid` is the caller's group or one of its supplementary groups
    /// (`in_group_p`).
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    pub fn has(&self, cap: Caps) -> bool {
        self.caps.contains(cap)
    }

    /// Runs `f`, a call of this caller on `fs` that may allocate or move quota usage, with
    /// the root-reserved blocks open to it if this caller may fill them, and quota limits
    /// passed with `CAP_SYS_RESOURCE`.
    pub(crate) fn allocating<T>(&self, fs: &crate::Fs, f: impl FnOnce() -> T) -> T {
        let run = || {
            if self.may_use_reserved(fs.superblock()) {
                crate::with_reserved_blocks(f)
            } else {
                f()
            }
        };
        if self.has(Caps::SYS_RESOURCE) {
            crate::with_quota_limits_ignored(run)
        } else {
            run()
        }
    }

    /// Whether this caller may fill the root-reserved blocks of the filesystem whose
    /// superblock is `sb` (`ext4_has_free_clusters`): `CAP_SYS_RESOURCE`, the reserving user,
    /// or a member of the reserving group when that is not root's.
    pub fn may_use_reserved(&self, sb: &rext4_format::superblock::Superblock) -> bool {
        crate::alloc::reserved::may_use(sb, self.uid, |g| self.in_group(g), self.has(Caps::SYS_RESOURCE))
    }
}
