//! LUKS1: the original Linux Unified Key Setup format (header, keyslots, operations).

mod header;
mod repair;
mod volume;

pub use header::{
    KeyslotState, Luks1Header, Luks1Keyslot, KEYSLOT_DISABLED, KEYSLOT_ENABLED, LUKS1_DIGEST_SIZE,
    LUKS1_HEADER_SIZE, LUKS1_MAGIC, LUKS1_NUM_KEYSLOTS, LUKS1_SALT_SIZE,
};
pub use repair::{repair, Luks1Repair};
pub use volume::{Luks1FormatParams, Luks1Volume, Unlocked, DEFAULT_ALIGNMENT_SECTORS};
