//! Casefolded directories (`casefold` images, `chattr +F`).

mod folding;
