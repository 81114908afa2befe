//! POSIX ACLs on the way in (the kernel's `acl.c` with the checks of `posix_acl.c` that setting
//! one passes): the VFS xattr form parsed and validated, the mode an access ACL implies, and
//! the compact form ext4 stores. The way out is `rext4_format::xattr::acl_disk_to_xattr`.
//! Also what a new inode takes from its directory's default ACL (`posix_acl_create`) and
//! what `chmod` does to an access ACL (`posix_acl_chmod`).

use crate::error::{Error, Result};
use crate::fs::Fs;
use rext4_format::xattr::{
    ACL_EXT4_VERSION, ACL_GROUP, ACL_GROUP_OBJ, ACL_MASK, ACL_OTHER, ACL_UNDEFINED_ID, ACL_USER,
    ACL_USER_OBJ, ACL_XATTR_VERSION,
};
use rext4_format::InodeNo;

/// Permission bits an entry may hold (`ACL_READ | ACL_WRITE | ACL_EXECUTE`).
const PERM_BITS: u16 = 0o7;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AclEntry {
    pub tag: u16,
    pub perm: u16,
    pub id: u32,
}

/// `posix_acl_from_xattr`: `None` for an ACL without entries (which removes the ACL).
pub(crate) fn from_xattr(v: &[u8]) -> Result<Option<Vec<AclEntry>>> {
    if v.is_empty() {
        return Ok(None);
    }
    let bad = Error::InvalidInput("malformed POSIX ACL");
    let Some(version) = v.get(..4) else { return Err(bad) };
    // Cannot fail: the slice has 4 bytes.
    if u32::from_le_bytes(version.try_into().unwrap()) != ACL_XATTR_VERSION {
        return Err(Error::NotSupported("POSIX ACL version".into()));
    }
    if !(v.len() - 4).is_multiple_of(8) {
        return Err(bad);
    }
    let mut out = Vec::with_capacity((v.len() - 4) / 8);
    for e in v[4..].chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u16::from_le_bytes([e[2], e[3]]);
        let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        let id = match tag {
            ACL_USER_OBJ | ACL_GROUP_OBJ | ACL_MASK | ACL_OTHER => ACL_UNDEFINED_ID,
            // (uid_t)-1 maps to no user.
            ACL_USER | ACL_GROUP if id != ACL_UNDEFINED_ID => id,
            _ => return Err(bad),
        };
        out.push(AclEntry { tag, perm, id });
    }
    Ok(if out.is_empty() { None } else { Some(out) })
}

/// `posix_acl_valid`: entries in tag order, one owner, group and other entry, a mask wherever
/// named users or groups appear, permission bits only.
pub(super) fn validate(acl: &[AclEntry]) -> Result<()> {
    let bad = Err(Error::InvalidInput("invalid POSIX ACL"));
    // What may come next: 1 user entries, 2 group entries, 3 other, 0 nothing.
    let mut state = ACL_USER_OBJ;
    let mut needs_mask = false;
    for e in acl {
        if e.perm & !PERM_BITS != 0 {
            return bad;
        }
        state = match (e.tag, state) {
            (ACL_USER_OBJ, ACL_USER_OBJ) => ACL_USER,
            (ACL_USER, ACL_USER) => {
                needs_mask = true;
                ACL_USER
            }
            (ACL_GROUP_OBJ, ACL_USER) => ACL_GROUP,
            (ACL_GROUP, ACL_GROUP) => {
                needs_mask = true;
                ACL_GROUP
            }
            (ACL_MASK, ACL_GROUP) => ACL_OTHER,
            (ACL_OTHER, ACL_OTHER) => 0,
            (ACL_OTHER, ACL_GROUP) if !needs_mask => 0,
            _ => return bad,
        };
    }
    if state == 0 {
        Ok(())
    } else {
        bad
    }
}

/// `posix_acl_equiv_mode`: the mode `acl` implies (owner, group — or the mask — and other
/// bits into `mode`), and whether the ACL says more than the mode can.
pub(super) fn equiv_mode(acl: &[AclEntry], mode: u16) -> (u16, bool) {
    let mut bits = 0u16;
    let mut more = false;
    for e in acl {
        let p = e.perm & PERM_BITS;
        match e.tag {
            ACL_USER_OBJ => bits |= p << 6,
            ACL_GROUP_OBJ => bits |= p << 3,
            ACL_OTHER => bits |= p,
            ACL_MASK => {
                bits = (bits & !0o070) | (p << 3);
                more = true;
            }
            _ => more = true,
        }
    }
    ((mode & !0o777) | bits, more)
}

/// `ext4_acl_to_disk`: version 1, then 4-byte entries for the owner, group, mask and other
/// tags and 8-byte ones (with the id) for named users and groups.
pub(crate) fn to_disk(acl: &[AclEntry]) -> Vec<u8> {
    encode(acl, false)
}

/// `posix_acl_xattr_set`'s input form: version 2, then 8-byte entries.
fn to_xattr(acl: &[AclEntry]) -> Vec<u8> {
    encode(acl, true)
}

/// The entries after a version word: every entry with its id in the VFS form (`xattr`),
/// only named users' and groups' in ext4's compact one.
fn encode(acl: &[AclEntry], xattr: bool) -> Vec<u8> {
    let version = if xattr { ACL_XATTR_VERSION } else { ACL_EXT4_VERSION };
    let mut out = version.to_le_bytes().to_vec();
    for e in acl {
        out.extend_from_slice(&e.tag.to_le_bytes());
        out.extend_from_slice(&e.perm.to_le_bytes());
        if xattr || e.tag == ACL_USER || e.tag == ACL_GROUP {
            out.extend_from_slice(&e.id.to_le_bytes());
        }
    }
    out
}

/// `posix_acl_create_masq`: ANDs the owner, other and mask (or, without one, group) entries
/// of a copy of a default ACL with the permission bits of `mode`, and the bits of `mode` with
/// them. Returns the new mode and whether the ACL says more than that mode.
pub(crate) fn create_masq(acl: &mut [AclEntry], mode: u16) -> Result<(u16, bool)> {
    let mut m = mode;
    let mut more = false;
    let (mut group, mut mask) = (None, None);
    for (i, e) in acl.iter_mut().enumerate() {
        match e.tag {
            ACL_USER_OBJ => {
                e.perm &= (m >> 6) & PERM_BITS;
                m &= (e.perm << 6) | !0o700;
            }
            ACL_USER | ACL_GROUP => more = true,
            ACL_GROUP_OBJ => group = Some(i),
            ACL_OTHER => {
                e.perm &= m & PERM_BITS;
                m &= e.perm | !0o007;
            }
            ACL_MASK => {
                mask = Some(i);
                more = true;
            }
            _ => return Err(Error::InvalidInput("invalid POSIX ACL")),
        }
    }
    let Some(g) = mask.or(group) else { return Err(Error::InvalidInput("invalid POSIX ACL")) };
    let e = &mut acl[g];
    e.perm &= (m >> 3) & PERM_BITS;
    m &= (e.perm << 3) | !0o070;
    Ok(((mode & !0o777) | (m & 0o777), more))
}

/// `posix_acl_chmod_masq`: the owner, other and mask (or, without one, group) entries take
/// the permission bits of the new mode.
pub(crate) fn chmod_masq(acl: &mut [AclEntry], mode: u16) {
    let has_mask = acl.iter().any(|e| e.tag == ACL_MASK);
    for e in acl.iter_mut() {
        match e.tag {
            ACL_USER_OBJ => e.perm = (mode >> 6) & PERM_BITS,
            ACL_GROUP_OBJ if !has_mask => e.perm = (mode >> 3) & PERM_BITS,
            ACL_MASK => e.perm = (mode >> 3) & PERM_BITS,
            ACL_OTHER => e.perm = mode & PERM_BITS,
            _ => {}
        }
    }
}

/// What a new inode takes from its directory (`posix_acl_create`): found by
/// [`Fs::acl_for_new_inode`], stored by [`Fs::set_inherited_acl`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InheritedAcl {
    /// The new inode's permission bits (and any set-ID/sticky bits asked for).
    pub mode: u16,
    /// Its access ACL, where the default ACL says more than the mode.
    access: Option<Vec<AclEntry>>,
    /// Its default ACL (directories: the parent's, unchanged).
    default: Option<Vec<AclEntry>>,
}

impl InheritedAcl {
    /// A mode and no ACLs (a mount without ACLs).
    pub fn none(mode: u16) -> InheritedAcl {
        InheritedAcl { mode, access: None, default: None }
    }

    /// Whether [`Fs::set_inherited_acl`] has anything to store.
    pub fn stores_any(&self) -> bool {
        self.access.is_some() || self.default.is_some()
    }

    /// The mode to create the inode with, before [`Fs::set_inherited_acl`] stores its ACLs
    /// (which then sets [`InheritedAcl::mode`]). Its group bits grant no more than the
    /// owning group's entry, not the mask's: if the ACLs never get written (a crash between
    /// the two transactions), the owning group is not given what the ACL denied it.
    pub fn initial_mode(&self) -> u16 {
        let Some(acl) = &self.access else { return self.mode };
        let group = acl.iter().find(|e| e.tag == ACL_GROUP_OBJ).map_or(0, |e| e.perm & PERM_BITS);
        self.mode & !(0o070 & !(group << 3))
    }
}

impl Fs {
    /// `posix_acl_create`: the mode and ACLs an inode created in `parent` with the
    /// permission bits `mode` gets. With a default ACL on `parent` the umask is not applied:
    /// the ACL, ANDed with `mode`, decides; a new directory also takes that default ACL as
    /// its own. Without one the mode is `mode & !umask` and there are no ACLs.
    pub fn acl_for_new_inode(
        &self,
        parent: InodeNo,
        mode: u16,
        umask: u16,
        is_dir: bool,
    ) -> Result<InheritedAcl> {
        let plain = InheritedAcl::none(mode & !(umask & 0o777));
        let default = match self.getxattr(parent, b"system.posix_acl_default") {
            Ok(v) => from_xattr(&v)?,
            Err(Error::NoData) | Err(Error::NotSupported(_)) => None,
            Err(e) => return Err(e),
        };
        let Some(default) = default else { return Ok(plain) };
        let mut access = default.clone();
        let (mode, more) = create_masq(&mut access, mode)?;
        Ok(InheritedAcl { mode, access: more.then_some(access), default: is_dir.then_some(default) })
    }

    /// Stores on the new inode `ino` the ACLs [`Fs::acl_for_new_inode`] found for it.
    pub fn set_inherited_acl(&self, ino: InodeNo, acl: &InheritedAcl) -> Result<()> {
        if let Some(d) = &acl.default {
            self.setxattr(ino, b"system.posix_acl_default", &to_xattr(d), 0)?;
        }
        if let Some(a) = &acl.access {
            self.setxattr(ino, b"system.posix_acl_access", &to_xattr(a), 0)?;
        }
        Ok(())
    }

    /// `posix_acl_chmod`: after a mode change, the access ACL of `ino` (if it has one) takes
    /// the new permission bits.
    pub(crate) fn acl_chmod(&self, ino: InodeNo, mode: u16) -> Result<()> {
        let mut acl = match self.getxattr(ino, b"system.posix_acl_access") {
            Ok(v) => match from_xattr(&v)? {
                Some(a) => a,
                None => return Ok(()),
            },
            Err(Error::NoData) | Err(Error::NotSupported(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        chmod_masq(&mut acl, mode);
        self.setxattr(ino, b"system.posix_acl_access", &to_xattr(&acl), 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rext4_format::xattr::acl_disk_to_xattr;

    const U: u32 = ACL_UNDEFINED_ID;

    fn xattr(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = ACL_XATTR_VERSION.to_le_bytes().to_vec();
        for &(t, p, i) in entries {
            v.extend_from_slice(&t.to_le_bytes());
            v.extend_from_slice(&p.to_le_bytes());
            v.extend_from_slice(&i.to_le_bytes());
        }
        v
    }

    fn parse(e: &[(u16, u16, u32)]) -> Result<Vec<AclEntry>> {
        let a = from_xattr(&xattr(e))?.expect("entries");
        validate(&a)?;
        Ok(a)
    }

    #[test]
    fn full_acl_round_trips_and_sets_the_mask_as_group_bits() {
        let e = [
            (ACL_USER_OBJ, 6, U),
            (ACL_USER, 4, 1000),
            (ACL_GROUP_OBJ, 4, U),
            (ACL_MASK, 6, U),
            (ACL_OTHER, 0, U),
        ];
        let a = parse(&e).unwrap();
        assert_eq!(acl_disk_to_xattr(&to_disk(&a)).unwrap(), xattr(&e));
        assert_eq!(equiv_mode(&a, 0o104777), (0o104660, true));
    }

    #[test]
    fn minimal_acl_is_just_a_mode() {
        // Ids of the owner/group/other entries are ignored, as the kernel ignores them.
        let a = parse(&[(ACL_USER_OBJ, 6, 5), (ACL_GROUP_OBJ, 4, 7), (ACL_OTHER, 0, 9)]).unwrap();
        assert!(a.iter().all(|e| e.id == U));
        assert_eq!(equiv_mode(&a, 0o100777), (0o100640, false));
    }

    /// generic/099's case: `u::r,g::r,o::-` as a default ACL and a create with 0666 give
    /// mode 0440 and no access ACL; with a named user and a mask the mask takes the group bits.
    #[test]
    fn create_masks_the_default_acl_with_the_mode() {
        let mut a = parse(&[(ACL_USER_OBJ, 4, U), (ACL_GROUP_OBJ, 4, U), (ACL_OTHER, 0, U)]).unwrap();
        assert_eq!(create_masq(&mut a, 0o666).unwrap(), (0o440, false));
        let mut a = parse(&[
            (ACL_USER_OBJ, 7, U),
            (ACL_USER, 7, 1000),
            (ACL_GROUP_OBJ, 5, U),
            (ACL_MASK, 7, U),
            (ACL_OTHER, 5, U),
        ])
        .unwrap();
        assert_eq!(create_masq(&mut a, 0o2640).unwrap(), (0o2640, true));
        let inherited = InheritedAcl { mode: 0o2640, access: Some(a.clone()), default: None };
        assert_eq!(inherited.initial_mode(), 0o2640, "the mask's r-- within the group's r-x");
        let mut b = parse(&[
            (ACL_USER_OBJ, 7, U),
            (ACL_USER, 7, 1000),
            (ACL_GROUP_OBJ, 4, U),
            (ACL_MASK, 7, U),
            (ACL_OTHER, 4, U),
        ])
        .unwrap();
        assert_eq!(create_masq(&mut b, 0o666).unwrap(), (0o664, true));
        let inherited = InheritedAcl { mode: 0o664, access: Some(b), default: None };
        assert_eq!(inherited.initial_mode(), 0o644, "the group's r--, not the mask's rw-");
        assert_eq!(a.iter().map(|e| e.perm).collect::<Vec<_>>(), [6, 7, 5, 4, 0]);
        chmod_masq(&mut a, 0o751);
        assert_eq!(a.iter().map(|e| e.perm).collect::<Vec<_>>(), [7, 7, 5, 5, 1]);
    }

    #[test]
    fn kernel_errnos() {
        let errno =
            |v: &[u8]| from_xattr(v).and_then(|a| validate(&a.unwrap_or_default())).unwrap_err().errno();
        assert_eq!(errno(&1u32.to_le_bytes()), libc::EOPNOTSUPP);
        assert_eq!(errno(&[2, 0]), libc::EINVAL);
        let mut trailing = xattr(&[(ACL_USER_OBJ, 6, U), (ACL_GROUP_OBJ, 4, U), (ACL_OTHER, 0, U)]);
        trailing.push(0);
        assert_eq!(errno(&trailing), libc::EINVAL);
        assert_eq!(from_xattr(&xattr(&[])).unwrap(), None);
        assert_eq!(from_xattr(&[]).unwrap(), None);
        for bad in [
            &[(ACL_USER_OBJ, 6, U), (ACL_USER, 4, 1), (ACL_GROUP_OBJ, 4, U), (ACL_OTHER, 0, U)][..], // no mask
            &[
                (ACL_USER_OBJ, 6, U),
                (ACL_USER, 4, U),
                (ACL_GROUP_OBJ, 4, U),
                (ACL_MASK, 4, U),
                (ACL_OTHER, 0, U),
            ],
            &[(ACL_USER_OBJ, 0o17, U), (ACL_GROUP_OBJ, 4, U), (ACL_OTHER, 0, U)],
            &[(ACL_GROUP_OBJ, 4, U), (ACL_USER_OBJ, 6, U), (ACL_OTHER, 0, U)],
            &[(ACL_USER_OBJ, 6, U), (0x40, 4, U), (ACL_GROUP_OBJ, 4, U), (ACL_OTHER, 0, U)],
            &[(ACL_USER_OBJ, 6, U), (ACL_GROUP_OBJ, 4, U)],
        ] {
            assert_eq!(parse(bad).unwrap_err().errno(), libc::EINVAL, "{bad:?}");
        }
        // Duplicate and unsorted named entries pass, as in the kernel.
        parse(&[
            (ACL_USER_OBJ, 6, U),
            (ACL_USER, 4, 9),
            (ACL_USER, 4, 9),
            (ACL_USER, 4, 2),
            (ACL_GROUP_OBJ, 4, U),
            (ACL_MASK, 4, U),
            (ACL_OTHER, 0, U),
        ])
        .unwrap();
    }
}
