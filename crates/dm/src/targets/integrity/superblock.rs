//! The dm-integrity superblock as the target uses it. The on-disk format itself (fields,
//! flags, versions, validation) is `cryptblk_format::integrity`, shared with
//! `integritysetup dump`; this module adapts it to the target: an absent magic means "format
//! the device", and the superblock is written as a zero-padded area.

use std::io;

pub use cryptblk_format::integrity::{
    IntegritySuperblock as Superblock, FLAG_DIRTY_BITMAP, FLAG_FIXED_HMAC, FLAG_FIXED_PADDING,
    FLAG_HAVE_JOURNAL_MAC, FLAG_RECALCULATING,
};

/// Bytes reserved for the superblock (`SB_SECTORS` = 8).
pub const SUPERBLOCK_BYTES: usize = cryptblk_format::integrity::INTEGRITY_SUPERBLOCK_AREA;

/// Decodes a superblock area; `Ok(None)` when the magic is absent.
pub fn parse(area: &[u8]) -> io::Result<Option<Superblock>> {
    if !Superblock::has_magic(area) {
        return Ok(None);
    }
    Superblock::parse(area)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

/// Encodes `sb` into a zero-padded superblock area.
pub fn encode(sb: &Superblock) -> Vec<u8> {
    let mut area = vec![0u8; SUPERBLOCK_BYTES];
    area[..64].copy_from_slice(&sb.to_bytes());
    area
}
