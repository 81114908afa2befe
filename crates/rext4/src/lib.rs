//! rext4 engine
