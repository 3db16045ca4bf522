//! What a device holds, read from its magic: the first step of every action, as cryptsetup's
//! `crypt_load` tries each format in turn.

use crate::device::open_file;
use crate::error::Result;
use std::fs::File;
use std::path::Path;

/// The kinds of volume the library recognises on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeKind {
    /// A LUKS1 header.
    Luks1,
    /// A LUKS2 header (primary or, when the primary is damaged, the secondary copy).
    Luks2,
    /// A dm-integrity superblock at offset 0 (integritysetup).
    Integrity,
    /// A dm-verity superblock at offset 0 (veritysetup).
    Verity,
    /// Nothing recognised (plain dm-crypt has no header).
    Unknown,
}

/// LUKS version in the primary header's magic, if any (unreadable devices have none).
pub fn luks_version(file: &File) -> Option<u16> {
    cryptblk_format::luks_version(file).ok().flatten()
}

/// Probes the device or image at `path`.
pub fn probe(path: &Path) -> Result<VolumeKind> {
    let file = open_file(path, false)?;
    Ok(probe_file(&file))
}

/// Probes an open device.
pub fn probe_file(file: &File) -> VolumeKind {
    match luks_version(file) {
        Some(1) => return VolumeKind::Luks1,
        Some(2) => return VolumeKind::Luks2,
        _ => {}
    }
    if cryptblk_format::luks2::Luks2Header::read(file).is_ok() {
        return VolumeKind::Luks2;
    }
    if cryptblk_format::integrity::IntegritySuperblock::read(file, 0).is_ok() {
        return VolumeKind::Integrity;
    }
    if cryptblk_format::verity::VeritySuperblock::read(file, 0).is_ok() {
        return VolumeKind::Verity;
    }
    VolumeKind::Unknown
}
