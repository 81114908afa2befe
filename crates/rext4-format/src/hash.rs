//! Directory and xattr hashes (filled in below).
