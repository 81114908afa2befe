//! The journal, in jbd2's on-disk format: transactions and handles, commit, checkpoint,
//! recovery.

pub(crate) mod checkpoint;
pub(crate) mod commit;
pub(crate) mod external;
pub(crate) mod journal;
pub(crate) mod log_map;
pub(crate) mod recovery;
pub(crate) mod replay;
pub(crate) mod transaction;

pub use journal::{CommitStats, CommitSummary};
