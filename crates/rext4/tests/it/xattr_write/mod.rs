//! Extended attribute writes: placement in the inode and in blocks, shared blocks and their
//! reference counts, ACLs, the kernel's errnos. Every image is `e2fsck -fn` clean afterwards
//! and the kernel (`getfattr -d -m -`, `getfacl`) sees what rext4 wrote; where the kernel can
//! do the same thing, its result (errno, on-disk bytes) is the expected one.
//!
//! `placement.rs`: where values go (inode, block, inline data) and the bytes the kernel
//! writes; `acl.rs`: POSIX ACLs; `errors.rs`: errnos and flags; `sharing.rs`: shared blocks
//! and their reference counts; `ea_inode.rs`: values in EA inodes; `damage.rs`: damaged
//! attribute storage; `model.rs`: random operation sequences against a model.

mod acl;
mod damage;
mod ea_inode;
mod errors;
mod model;
mod placement;
mod sharing;

use rext4::{Fs, InodeNo, Options, XATTR_CREATE, XATTR_REPLACE};
use rext4_testkit::{e2fsck_clean, kernel_can_mount, require_kernel, tool, Image, KernelMount};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

const U: u32 = u32::MAX;
const ACL_USER_OBJ: u16 = 0x01;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_GROUP: u16 = 0x08;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;

/// A 32 MiB image; 4 KiB blocks unless `args` say otherwise (mkfs picks 1 KiB for so small a
/// filesystem).
fn mkfs(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    let mut all = args.to_vec();
    if !args.contains(&"-b") {
        all.extend(["-b", "4096"]);
    }
    Image::ext4("32M").args(&all).build(&img);
    img
}

fn rw(img: &Path) -> Fs {
    Fs::open_with(img, Options { writable: true, ..Options::default() }).unwrap()
}

#[track_caller]
fn ino(fs: &Fs, path: &str) -> InodeNo {
    fs.resolve(path, false).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn errno<T>(r: rext4::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.errno(),
    }
}

/// Every attribute of `path` as rext4 lists and reads it.
fn rext4_xattrs(fs: &Fs, path: &str) -> Xattrs {
    let i = ino(fs, path);
    let names = fs.listxattr(i).unwrap_or_else(|e| panic!("{path}: listxattr: {e}"));
    names
        .into_iter()
        .map(|n| {
            let v = fs.getxattr(i, &n).unwrap_or_else(|e| panic!("{path}: getxattr: {e}"));
            (n, v)
        })
        .collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

/// What `getfattr -h -d -m - -e hex` shows for `path` below the mount point `mnt`.
fn getfattr(mnt: &Path, path: &str) -> Xattrs {
    let full = mnt.join(path.trim_start_matches('/'));
    let o = Command::new(tool("getfattr"))
        .args(["-h", "-d", "-m", "-", "-e", "hex", "--absolute-names"])
        .arg(&full)
        .output()
        .expect("getfattr (package attr) is required");
    assert!(o.status.success(), "getfattr {}: {}", full.display(), String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (n, v) = l.split_once("=0x").unwrap_or_else(|| panic!("getfattr line {l:?}"));
            (n.as_bytes().to_vec(), unhex(v))
        })
        .collect()
}

/// Closes `fs`, then checks the image: `e2fsck -fn` clean, and every path's attributes as a
/// fresh rext4 open and the kernel see them equal to `expected`.
fn finish(fs: Fs, img: &Path, expected: &[(&str, Xattrs)]) {
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(img);
    let again = Fs::open(img).unwrap();
    for (p, want) in expected {
        assert_eq!(&rext4_xattrs(&again, p), want, "{p}: rext4 after reopening");
    }
    match KernelMount::ro(img) {
        Ok(km) => {
            for (p, want) in expected {
                assert_eq!(&getfattr(km.path(), p), want, "{p}: as the kernel sees it");
            }
            km.unmount().unwrap();
        }
        Err(e) => eprintln!("skipping the kernel comparison: {e}"),
    }
}

/// A POSIX ACL in the VFS xattr format.
fn vfs_acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

fn debugfs(img: &Path, req: &str) -> String {
    let o = Command::new(tool("debugfs")).arg("-R").arg(req).arg(img).output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The xattr block of `path` (`i_file_acl`), 0 if none.
fn file_acl(img: &Path, path: &str) -> u64 {
    let out = debugfs(img, &format!("stat {path}"));
    let v = out.split("File ACL: ").nth(1).unwrap_or_else(|| panic!("debugfs stat {path}: {out}"));
    v.split_whitespace().next().unwrap().parse().unwrap()
}

fn block_size(img: &Path) -> usize {
    let fs = Fs::open(img).unwrap();
    fs.block_size() as usize
}

fn read_block(img: &Path, blk: u64) -> Vec<u8> {
    let bs = block_size(img);
    let all = std::fs::read(img).unwrap();
    all[blk as usize * bs..(blk as usize + 1) * bs].to_vec()
}

fn refcount(img: &Path, blk: u64) -> u32 {
    let b = read_block(img, blk);
    u32::from_le_bytes([b[4], b[5], b[6], b[7]])
}

/// The on-disk inode record of `path` (`debugfs imap`).
fn inode_record(img: &Path, path: &str) -> Vec<u8> {
    let out = debugfs(img, &format!("imap {path}"));
    let at = out.split("located at block ").nth(1).unwrap_or_else(|| panic!("imap {path}: {out}"));
    let (blk, off) = at.trim().split_once(", offset 0x").unwrap();
    let blk: usize = blk.parse().unwrap();
    let off = usize::from_str_radix(off.trim(), 16).unwrap();
    let isize: usize = debugfs(img, "stats")
        .lines()
        .find_map(|l| l.strip_prefix("Inode size:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let all = std::fs::read(img).unwrap();
    let at = blk * block_size(img) + off;
    all[at..at + isize].to_vec()
}

#[track_caller]
fn set(fs: &Fs, path: &str, name: &str, value: &[u8]) {
    fs.setxattr(ino(fs, path), name.as_bytes(), value, 0).unwrap_or_else(|e| panic!("{path} {name}: {e}"));
}

fn map(pairs: &[(&str, &[u8])]) -> Xattrs {
    pairs.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.to_vec())).collect()
}

fn close(fs: Fs) {
    fs.unmount().unwrap();
}

/// `len` bytes that differ from those of another `seed`.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Inodes in use, from the superblock (`debugfs stats`).
fn inodes_in_use(img: &Path) -> u64 {
    let out = debugfs(img, "stats");
    let free: u64 = out.lines().find_map(|l| l.strip_prefix("Free inodes:")).unwrap().trim().parse().unwrap();
    let count: u64 =
        out.lines().find_map(|l| l.strip_prefix("Inode count:")).unwrap().trim().parse().unwrap();
    count - free
}
