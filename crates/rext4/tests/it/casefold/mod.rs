//! Casefolded directories (`casefold` images, `chattr +F`).

mod dirs;
mod folding;
mod kernel;
