//! Casefolded directories (`casefold` images, `chattr +F`).

mod dirs;
mod encrypted;
mod folding;
mod kernel;
