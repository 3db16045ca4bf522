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

/// The reencryption part of `repair` of the LUKS2 header on `device`, or at `header` when
/// it is detached (`--header`), in cryptsetup's order:
/// - unprotected metadata (cryptsetup 2.2's `online-reencrypt`, or no reencryption digest)
///   is upgraded once the passphrase opens the keys: the digest is added and the
///   requirement versioned, nothing else (a cut step is recovered by the next `repair`);
/// - a reencryption cut inside a step gets its hotzone rewritten under the new key (one
///   passphrase opens both keys; keyslot `slot` when given), as cryptsetup's repair does
///   before `reencrypt --resume-only` may continue;
/// - a reencryption between steps only has its digest checked with the passphrase.
///
/// Nothing happens (and nothing is asked) without a reencryption.
pub fn repair_reencryption(
    device: &std::path::Path,
    header: Option<&std::path::Path>,
    luks_type: Option<crate::luks::LuksType>,
    slot: Option<usize>,
    input: &mut dyn super::ReencryptInput,
) -> Result<()> {
    let crate::luks::Volume::Luks2(mut h, file) =
        super::request::load(header.unwrap_or(device), luks_type, true)?
    else {
        return Ok(());
    };
    let Some(state) = ReencryptState::of(&h)? else {
        return Ok(());
    };
    if h.reencrypt_metadata_unprotected() {
        input.confirm(
            "Unprotected LUKS2 reencryption metadata detected. Please verify the reencryption \
             operation is desirable (see luksDump output)\nand continue (upgrade metadata) only \
             if you acknowledge the operation as genuine.",
        )?;
        let pass =
            input.secret("Enter passphrase to protect and upgrade reencryption metadata: ")?;
        // cryptsetup opens the keys of all segments here and, when the passphrase opens
        // none, says so with exit 1.
        let keys = super::unlock_keys(&h, &file, &state, pass.as_bytes(), slot).map_err(|e| {
            if e.to_string().contains("No key available") {
                crate::error::VolumeError::usage("No usable keyslot is available.")
            } else {
                e
            }
        })?;
        h.upgrade_reencrypt_metadata(
            keys.old.as_ref().map(|k| k.as_bytes()),
            keys.new.as_ref().map(|k| k.as_bytes()),
        )?;
        h.write_reencryption(&file)?;
        file.sync_all()?;
        return Ok(());
    }
    if state.hotzone().is_none() {
        let pass = input.secret("Enter passphrase to verify reencryption metadata digest: ")?;
        let keys = super::unlock_keys(&h, &file, &state, pass.as_bytes(), slot)?;
        return super::run::verify_digest(&h, &state, &keys);
    }
    // With a detached header the data is on the device itself.
    let data = if header.is_some() {
        Some(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(device)?,
        )
    } else {
        None
    };
    let pass = input.secret(&super::request::device_prompt(device))?;
    let keys = super::unlock_keys(&h, &file, &state, pass.as_bytes(), slot)?;
    let data_io: &dyn cryptblk_format::hdrio::HeaderIo = match &data {
        Some(d) => d,
        None => &file,
    };
    super::run::recover_split(&mut h, &file, data_io, &state, &keys)?;
    Ok(())
}
