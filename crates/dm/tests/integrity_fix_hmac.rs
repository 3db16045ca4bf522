//! `fix_hmac` at format time, as the kernel's `initialize_superblock` decides it: the
//! FIXED_HMAC flag and a random salt only when something is hashed with them (an internal
//! hash or a journal MAC); external tags (crypt's AEAD over integrity) leave both clear.

mod common;

use common::MemDisk;
use cryptblk_dm::targets::integrity::superblock::FLAG_FIXED_HMAC;
use cryptblk_dm::targets::integrity::{IntegrityConfig, IntegrityMode, IntegrityTarget};

fn format(cfg: IntegrityConfig) -> (bool, [u8; 16]) {
    let sb = IntegrityTarget::format(MemDisk::new(8 << 20), "mem", None, cfg, false).unwrap();
    (sb.flags & FLAG_FIXED_HMAC != 0, sb.salt)
}

#[test]
fn fix_hmac_flag_only_with_something_to_salt() {
    let with_hash = IntegrityConfig {
        fix_hmac: true,
        ..IntegrityConfig::new(IntegrityMode::Journal, "crc32c")
    };
    let (flag, salt) = format(with_hash);
    assert!(flag, "internal hash + fix_hmac: flag set");
    assert_ne!(salt, [0; 16], "internal hash + fix_hmac: random salt");

    let external_tags = IntegrityConfig {
        fix_hmac: true,
        internal_hash: None,
        tag_size: Some(32),
        ..IntegrityConfig::new(IntegrityMode::Journal, "crc32c")
    };
    let (flag, salt) = format(external_tags);
    assert!(!flag, "external tags + fix_hmac: flag clear");
    assert_eq!(salt, [0; 16]);

    let without = IntegrityConfig::new(IntegrityMode::Journal, "crc32c");
    assert_eq!(format(without), (false, [0; 16]));
}
