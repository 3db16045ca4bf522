//! One module per family of actions.

pub mod bench;
pub mod bitlk;
pub mod info;
pub mod integrity;
pub mod lifecycle;
pub mod luks;
pub mod luks_integrity;
pub mod offline;
pub mod serving;
pub mod verity;
pub mod volume;
