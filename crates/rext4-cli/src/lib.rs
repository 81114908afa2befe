//! What the `rext4` command shares with `rext4-bench`: the engine statistics as `rext4 stats`
//! shows them, and a small deterministic generator.
#![forbid(unsafe_code)]

pub mod rng;
pub mod stats;

/// A one-line error for the user.
pub type CliResult<T = ()> = Result<T, String>;
