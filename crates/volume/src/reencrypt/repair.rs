//! Reencryption recovery (what `cryptsetup repair` does to a reencryption cut inside a
//! step): the hotzone's data is rewritten under the new key from its recovered plaintext,
//! synced, and only then the header is changed to the layout of a finished step (or, after
//! the last hotzone, to the finished reencryption; see [`super::run`]). A crash before the
//! header write leaves the old header naming the hotzone, whose resilience data still
//! decides every block (checksum: a rewritten block no longer matches its old hash;
//! journal: the old data is still in the area), so recovery can simply run again.

use super::keys::ReencryptKeys;
use super::state::ReencryptState;
use crate::error::Result;
use cryptblk_format::luks2::Luks2Header;
use std::fs::File;

/// Recovers the hotzone of `state` (header and data on `file`) and writes the header of the
/// finished step, which is byte for byte the JSON cryptsetup's repair writes. Returns false
/// when the header names no hotzone (nothing to recover).
pub fn recover_hotzone(
    h: &mut Luks2Header,
    file: &File,
    state: &ReencryptState,
    keys: &ReencryptKeys,
) -> Result<bool> {
    Ok(super::run::recover(h, file, state, keys)? > 0)
}
