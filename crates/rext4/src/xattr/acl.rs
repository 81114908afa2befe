//! POSIX ACLs on the way in (the kernel's `acl.c` with the checks of `posix_acl.c` that setting
//! one passes): the VFS xattr form parsed and validated, the mode an access ACL implies, and
//! the compact form ext4 stores. The way out is `rext4_format::xattr::acl_disk_to_xattr`.

use crate::error::{Error, Result};
use rext4_format::xattr::{
    ACL_EXT4_VERSION, ACL_GROUP, ACL_GROUP_OBJ, ACL_MASK, ACL_OTHER, ACL_UNDEFINED_ID, ACL_USER,
    ACL_USER_OBJ, ACL_XATTR_VERSION,
};

/// Permission bits an entry may hold (`ACL_READ | ACL_WRITE | ACL_EXECUTE`).
const PERM_BITS: u16 = 0o7;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AclEntry {
    pub tag: u16,
    pub perm: u16,
    pub id: u32,
}

/// `posix_acl_from_xattr`: `None` for an ACL without entries (which removes the ACL).
pub(super) fn from_xattr(v: &[u8]) -> Result<Option<Vec<AclEntry>>> {
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
    let mut out = ACL_EXT4_VERSION.to_le_bytes().to_vec();
    for e in acl {
        out.extend_from_slice(&e.tag.to_le_bytes());
        out.extend_from_slice(&e.perm.to_le_bytes());
        if e.tag == ACL_USER || e.tag == ACL_GROUP {
            out.extend_from_slice(&e.id.to_le_bytes());
        }
    }
    out
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
