//! Translation between the engine's view of inodes and FUSE's: inode numbers, attributes,
//! times, device numbers, file types.

use fuser::{FileAttr, FileType as FuseType, INodeNo, TimeOrNow};
use rext4::{Attr, FileType, InodeNo, SetAttr, TimeSet, Timestamp};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The engine's root directory (ext4 inode 2), FUSE's node 1.
const EXT4_ROOT: u32 = 2;

/// The engine inode behind a FUSE node id; `None` for ids no inode can have.
pub(crate) fn engine_ino(ino: INodeNo) -> Option<InodeNo> {
    match ino.0 {
        1 => Some(InodeNo(EXT4_ROOT)),
        // ext4 inode 1 (bad blocks) never appears in a directory; FUSE's 1 is the root.
        0 | 2 => None,
        n => u32::try_from(n).ok().map(InodeNo),
    }
}

/// The FUSE node id of an engine inode. ext4 inode 2 is FUSE's root (1); ext4 inode 1 is never
/// given out (callers treat it as corruption, see [`visible`]).
pub(crate) fn fuse_ino(ino: InodeNo) -> INodeNo {
    if ino.0 == EXT4_ROOT {
        INodeNo::ROOT
    } else {
        INodeNo(u64::from(ino.0))
    }
}

/// Whether a directory entry's inode number can be shown through FUSE (not 0, not ext4's
/// reserved inode 1 that would alias the FUSE root).
pub(crate) fn visible(ino: InodeNo) -> bool {
    ino.0 >= EXT4_ROOT
}

/// A timestamp as a `SystemTime`.
pub(crate) fn system_time(t: Timestamp) -> SystemTime {
    let nsec = Duration::from_nanos(u64::from(t.nsec.min(999_999_999)));
    match u64::try_from(t.sec) {
        Ok(sec) => UNIX_EPOCH + Duration::from_secs(sec) + nsec,
        Err(_) => UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + nsec,
    }
}

/// A time the kernel sent back as a timestamp. fuser builds times before 1970 from the wire's
/// (seconds, nanoseconds) as `EPOCH - (|seconds| + nanoseconds)`; this undoes exactly that, so
/// the wire value arrives unchanged.
pub(crate) fn timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp { sec: d.as_secs() as i64, nsec: d.subsec_nanos() },
        Err(e) => {
            let d = e.duration();
            Timestamp { sec: -(d.as_secs() as i64), nsec: d.subsec_nanos() }
        }
    }
}

/// A `setattr` time as the engine's.
pub(crate) fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(timestamp(t)),
    }
}

/// A setattr under the writeback cache, where the kernel keeps a file's times and sends
/// them with `FATTR_CTIME` (its `trust_local_cmtime`): the change time it shows is stored,
/// and a modification time equal to it is the call's own "now" (`utimes(f, NULL)`, a write's
/// `file_update_time`: the VFS stamps both from one clock reading), not a time the caller
/// chose, so an append-only file still allows it, as ext4 does.
pub(crate) fn writeback_times(ch: &mut SetAttr, ctime: Option<Timestamp>) {
    ch.ctime = ctime;
    if ctime.is_some() && ch.mtime == ctime.map(TimeSet::At) {
        ch.mtime = Some(TimeSet::Now);
    }
}

pub(crate) fn fuse_type(k: FileType) -> FuseType {
    match k {
        FileType::RegularFile => FuseType::RegularFile,
        FileType::Directory => FuseType::Directory,
        FileType::Symlink => FuseType::Symlink,
        FileType::CharDevice => FuseType::CharDevice,
        FileType::BlockDevice => FuseType::BlockDevice,
        FileType::Fifo => FuseType::NamedPipe,
        FileType::Socket => FuseType::Socket,
    }
}

/// The kernel's `new_encode_dev`: how `fuse_attr.rdev` carries a device number.
pub(crate) fn encode_dev((major, minor): (u32, u32)) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

/// The kernel's `new_decode_dev`: a device number from `mknod`.
pub(crate) fn decode_dev(dev: u32) -> (u32, u32) {
    ((dev & 0xfff00) >> 8, (dev & 0xff) | ((dev >> 12) & 0xfff00))
}

/// Attributes for `getattr`/`setattr` replies: `st_ino` is the ext4 inode number, so the root
/// shows 2 as on a kernel mount (the kernel takes `st_ino` from the attributes, not from the
/// node id, which stays FUSE's 1).
pub(crate) fn stat_attr(a: &Attr) -> FileAttr {
    FileAttr { ino: INodeNo(u64::from(a.ino.0)), ..file_attr(a) }
}

/// An engine attribute as FUSE's.
pub(crate) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: fuse_ino(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: a.crtime.map_or(UNIX_EPOCH, system_time),
        kind: fuse_type(a.kind),
        perm: a.perm(),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: encode_dev(a.rdev),
        blksize: a.blksize,
        flags: 0,
    }
}

/// The `STATX_ATTR_*` flags ext4 reports from an inode's `flags`, and which of them it
/// supports (`ext4_getattr`): `(attributes, attributes_mask)`.
pub(crate) fn statx_attributes(flags: u32) -> (u64, u64) {
    use rext4::format::inode::{APPEND_FL, COMPR_FL, ENCRYPT_FL, IMMUTABLE_FL, NODUMP_FL, VERITY_FL};
    let map = [
        (APPEND_FL, libc::STATX_ATTR_APPEND),
        (COMPR_FL, libc::STATX_ATTR_COMPRESSED),
        (ENCRYPT_FL, libc::STATX_ATTR_ENCRYPTED),
        (IMMUTABLE_FL, libc::STATX_ATTR_IMMUTABLE),
        (NODUMP_FL, libc::STATX_ATTR_NODUMP),
        (VERITY_FL, libc::STATX_ATTR_VERITY),
    ];
    map.iter().fold((0, 0), |(set, mask), &(fl, attr)| {
        let attr = statx_bit(attr);
        (if flags & fl != 0 { set | attr } else { set }, mask | attr)
    })
}

/// A `STATX_ATTR_*` constant (a positive `c_int` in libc) as `stx_attributes` holds it.
fn statx_bit(attr: libc::c_int) -> u64 {
    u64::from(attr.unsigned_abs())
}

/// A negative entry: node id 0, which the kernel caches as "no such name" for the entry
/// timeout (the other fields are ignored).
pub(crate) fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FuseType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn statx_attributes_follow_ext4_flags() {
        use rext4::format::inode::{APPEND_FL, EXTENTS_FL, IMMUTABLE_FL, NODUMP_FL};
        let (set, mask) = super::statx_attributes(APPEND_FL | IMMUTABLE_FL | NODUMP_FL | EXTENTS_FL);
        let want =
            super::statx_bit(libc::STATX_ATTR_APPEND | libc::STATX_ATTR_IMMUTABLE | libc::STATX_ATTR_NODUMP);
        assert_eq!(set, want, "extents are no statx attribute");
        assert_eq!(mask & set, set);
        let all = want
            | super::statx_bit(
                libc::STATX_ATTR_COMPRESSED | libc::STATX_ATTR_ENCRYPTED | libc::STATX_ATTR_VERITY,
            );
        assert_eq!(mask, all);
        assert_eq!(super::statx_attributes(0), (0, all));
    }

    use super::*;

    #[test]
    fn inode_numbers_round_trip() {
        assert_eq!(engine_ino(INodeNo::ROOT), Some(InodeNo(2)));
        assert_eq!(fuse_ino(InodeNo(2)), INodeNo::ROOT);
        assert_eq!(engine_ino(fuse_ino(InodeNo(12))), Some(InodeNo(12)));
        assert_eq!(engine_ino(INodeNo(2)), None);
        assert_eq!(engine_ino(INodeNo(1 << 40)), None);
        assert!(!visible(InodeNo(1)) && visible(InodeNo(11)));
    }

    #[test]
    fn times_round_trip_both_sides_of_the_epoch() {
        for (sec, nsec) in
            [(0, 0), (1, 999_999_999), (1_700_000_000, 123_456_789), (-1, 0), (-2, 500_000_000)]
        {
            let t = Timestamp { sec, nsec };
            let st = system_time(t);
            // What the kernel receives is seconds rounded down plus nanoseconds.
            match st.duration_since(UNIX_EPOCH) {
                Ok(d) => assert_eq!((d.as_secs() as i64, d.subsec_nanos()), (sec, nsec)),
                Err(e) => {
                    let d = e.duration();
                    let back = if d.subsec_nanos() == 0 {
                        (-(d.as_secs() as i64), 0)
                    } else {
                        (-(d.as_secs() as i64) - 1, 1_000_000_000 - d.subsec_nanos())
                    };
                    assert_eq!(back, (sec, nsec));
                }
            }
        }
        // fuser's reading of wire (-2, 500000000).
        let wire = UNIX_EPOCH - Duration::new(2, 500_000_000);
        assert_eq!(timestamp(wire), Timestamp { sec: -2, nsec: 500_000_000 });
    }

    #[test]
    fn device_numbers_round_trip() {
        for dev in [(0, 0), (1, 3), (8, 17), (259, 65536), (4095, 0xfffff)] {
            assert_eq!(decode_dev(encode_dev(dev)), dev);
        }
    }
}
