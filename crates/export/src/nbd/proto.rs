//! The NBD wire constants, shared with the NBD client backing: one protocol module for
//! client and server. It lives in `cryptblk-dm` because the client backing is there and
//! this crate sits above it.

pub use cryptblk_dm::backing::nbd::proto::*;
