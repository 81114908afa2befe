//! jbd2 on-disk format (filled in below).
