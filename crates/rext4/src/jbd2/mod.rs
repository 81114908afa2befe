//! The journal, in jbd2's on-disk format: transactions and handles, commit, checkpoint.

pub(crate) mod checkpoint;
pub(crate) mod commit;
pub(crate) mod journal;
pub(crate) mod transaction;

pub use journal::CommitStats;
