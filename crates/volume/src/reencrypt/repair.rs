//! Reencryption recovery (what `cryptsetup repair` does to a reencryption cut inside a
//! step): the hotzone's data is rewritten under the new key from its recovered plaintext,
//! synced, and only then the header is changed to the layout of a finished step. A crash
//! before the header write leaves the old header naming the hotzone, whose resilience data
//! still decides every block (checksum: a rewritten block no longer matches its old hash;
//! journal: the old data is still in the area), so recovery can simply run again.

use super::keys::ReencryptKeys;
use super::recovery::{hotzone_plaintext, Ciphers};
use super::state::ReencryptState;
use crate::error::{Result, VolumeError};
use cryptblk_format::luks2::{Luks2Header, ReencryptDirection};
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Recovers the hotzone of `state` (header and data on `file`) and writes the header of the
/// finished step, which is byte for byte the JSON cryptsetup's repair writes. Returns false
/// when the header names no hotzone (nothing to recover). Only forward re-keys whose hotzone
/// is not the last are handled (the last one also needs the reencryption finished).
pub fn recover_hotzone(
    h: &mut Luks2Header,
    file: &File,
    state: &ReencryptState,
    keys: &ReencryptKeys,
) -> Result<bool> {
    let Some(hz) = state.hotzone() else {
        return Ok(false);
    };
    if state.keyslot.direction != ReencryptDirection::Forward {
        return Err(VolumeError::usage(
            "recovery of a backward reencryption is not supported yet",
        ));
    }
    let len = hz
        .size
        .ok_or_else(|| VolumeError::device("hotzone segment without a size"))?;
    // After the last hotzone cryptsetup's repair finishes the whole reencryption. Leaving
    // the header of a finished last step instead is not safe: cryptsetup 2.6.1's
    // `reencrypt --resume-only` from that state reencrypts the whole device again.
    let old_after = state
        .segments
        .iter()
        .any(|s| s.side == super::state::Side::Old && s.offset >= hz.offset + len);
    if !old_after {
        return Err(VolumeError::usage(
            "The interrupted reencryption step is the last one: cryptblk cannot finish the \
             reencryption yet; run 'cryptsetup repair' on it (which also finishes it).",
        ));
    }
    let ciphers = Ciphers::new(state, keys)?;
    let mut data = hotzone_plaintext(state, &ciphers, file, file, hz, len)?;
    ciphers.new_side()?.encrypt_at(hz.offset, &mut data)?;
    file.write_all_at(&data, hz.offset)?;
    file.sync_all()?;
    h.finish_forward_hotzone()?;
    h.write_reencryption(file)?;
    Ok(true)
}
