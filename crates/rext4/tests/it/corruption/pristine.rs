//! Pristine images read back, and hold the structures the other tests damage.

use super::*;

#[test]
fn pristine_fixtures_read_back() {
    for v in ALL_VARIANTS {
        let img = img!(v);
        let fs = img.fs();
        assert_eq!(fs.read_file("/dir1/sub/file").unwrap(), b"hello\n", "{v:?}");
        assert_eq!(fs.read_file("/fastlink").unwrap(), b"hello\n", "{v:?}");
        let slow = fs.read_link("/slowlink").unwrap();
        assert_eq!(slow.as_os_str().len(), SLOW_TARGET_REPEAT * 2 + 6, "{v:?}");
        let frag = fs.read_file("/frag").unwrap();
        assert_eq!(frag.len(), 11 * 8192 + 4096, "{v:?}");
        assert_eq!(frag[8192 * 3], b'D', "{v:?}");
        assert_eq!(frag[8192 * 3 + 4096], 0, "{v:?}");
        let small = InodeNo(img.ino("/small"));
        assert_eq!(fs.getxattr(small, b"user.big").unwrap().len(), BIG_XATTR_LEN, "{v:?}");
        assert_eq!(fs.getxattr(small, b"user.tiny").unwrap(), b"abc", "{v:?}");
        assert_eq!(fs.getxattr(InodeNo(img.ino("/dir1")), b"user.d").unwrap(), b"dirval", "{v:?}");
        if v == Variant::Inline {
            assert_eq!(fs.getxattr(InodeNo(img.ino("/medium")), b"user.huge").unwrap(), vec![b'y'; 4096]);
            assert_eq!(fs.read_file("/medium").unwrap(), vec![b'm'; 100]);
        }
    }
}

/// Indexed directories of pristine images read and look up (one- and two-level htrees, with
/// and without metadata_csum).
#[test]
fn pristine_htree_dirs_read_back() {
    let mut failures = Vec::new();
    for v in ALL_VARIANTS {
        let img = img!(v);
        let fs = img.fs();
        let r = catch_unwind(AssertUnwindSafe(|| {
            let n = fs.read_dir("/big").unwrap().collect::<rext4::Result<Vec<_>>>().unwrap().len();
            assert_eq!(n, 500);
            assert_eq!(fs.metadata("/big/entry_0123_padding_name").unwrap().size, 4);
            if v.has_huge_dir() {
                assert_eq!(
                    fs.read_dir("/huge").unwrap().collect::<rext4::Result<Vec<_>>>().unwrap().len(),
                    3000
                );
                for i in [0, 1234, 2999] {
                    fs.metadata(format!("/huge/{}", huge_name(i))).unwrap();
                }
            }
            assert!(walk(&fs) > 500);
        }));
        if let Err(p) = r {
            failures.push(format!("{v:?}: {}", panic_message(p)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The fixtures really contain the structures the tests below corrupt.
#[test]
fn fixtures_have_the_structures_under_test() {
    for v in [Variant::Csum4k, Variant::NoCsum4k, Variant::Ext2, Variant::Csum1k] {
        let img = img!(v);
        let big = img.ino("/big");
        assert!(img.inode(big).flags() & fi::INDEX_FL != 0, "{v:?}: /big should be indexed");
        assert_ne!(img.inode(img.ino("/small")).file_acl(), 0, "{v:?}: /small xattr block");
        if v != Variant::Ext2 {
            let frag = img.inode(img.ino("/frag"));
            assert!(Node::parse(frag.i_block_bytes()).unwrap().depth() >= 1, "{v:?}: /frag extent depth");
        }
    }
    for v in [Variant::Csum1k, Variant::Ext2] {
        let img = img!(v);
        let root = img.pblk(img.ino("/huge"), 0);
        assert_eq!(dx::parse_root(img.block(root)).unwrap().info.indirect_levels, 1, "{v:?}");
    }
    let img = img!(Variant::NoCsum4k);
    assert!(img.g.gdt_csum && !img.g.metadata_csum);
    let img = img!(Variant::Inline);
    assert!(img.inode(img.ino("/dir1")).flags() & fi::INLINE_DATA_FL != 0);
    assert!(img.inode(img.ino("/dir1/sub/file")).flags() & fi::INLINE_DATA_FL != 0);
    let img = img!(Variant::Ext2);
    assert_ne!(img.inode(img.ino("/frag")).i_block[fi::IND_BLOCK].get(), 0);
}
