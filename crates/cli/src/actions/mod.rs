//! One module per family of actions.

pub mod activate;
pub mod bench;
pub mod bitlk;
pub mod fvault2;
pub mod info;
pub mod integrity;
pub mod lifecycle;
pub mod loopaes;
pub mod luks;
pub mod luks_integrity;
pub mod monitor;
pub mod offline;
pub mod open;
pub mod reencrypt;
pub mod reencrypt_online;
pub mod serving;
pub mod tcrypt;
pub mod token;
pub mod verity;
pub mod volume;
