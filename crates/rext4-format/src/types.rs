//! Newtypes for the numbers that cross the public API and must never mix: device blocks and
//! inodes. (Logical blocks and group numbers stay plain integers: they never leave the
//! mapping and allocation code that computes them.)

use core::fmt;

macro_rules! newtype {
    ($(#[$m:meta])* $name:ident($inner:ty)) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub $inner);
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({})"), self.0)
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

newtype!(
    /// A block number on the device, in filesystem blocks.
    PhysBlock(u64)
);
newtype!(
    /// An inode number (1-based; 0 means "none").
    InodeNo(u32)
);

/// The root directory's inode number.
pub const ROOT_INO: InodeNo = InodeNo(2);
/// The journal's inode number, unless the superblock names another.
pub const JOURNAL_INO: InodeNo = InodeNo(8);
/// The resize inode (reserved GDT blocks).
pub const RESIZE_INO: InodeNo = InodeNo(7);
