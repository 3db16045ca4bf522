//! `luksSuspend` / `luksResume` of a served LUKS volume, as cryptsetup does them with the
//! kernel: suspend holds new I/O (never fails it) once the requests in flight are done, then
//! `key wipe` drops the volume key and every cipher built from it in the daemon; resume
//! unlocks a keyslot of the volume's header, hands the key back with `key set` and releases
//! the held I/O. Both go through the daemon's control socket ([`crate::control`]); the key
//! travels only over that socket, inside a [`Request::Message`] that is wiped on drop.

use crate::control::{self, Request, Status};
use crate::error::{ErrorClass, Result, VolumeError};
use crate::luks::Volume;
use cryptblk_format::luks2::UnlockPurpose;
use std::path::PathBuf;

/// The status of `name`, which must be a served LUKS volume (cryptsetup refuses the others
/// with this message and exit 4).
pub fn luks_status(name: &str) -> Result<Status> {
    let st = control::status(name)?;
    match st.info.kind.as_str() {
        "LUKS1" | "LUKS2" => Ok(st),
        _ => Err(VolumeError::device(format!(
            "{name} is not active LUKS device name."
        ))),
    }
}

/// The header a served LUKS volume was opened from: its detached header, else its device.
pub fn header_of(st: &Status) -> Result<PathBuf> {
    st.info
        .header_or_device()
        .map(PathBuf::from)
        .ok_or_else(|| {
            VolumeError::usage(format!(
                "{} is not active LUKS device name or header is missing.",
                st.name
            ))
        })
}

/// Start sectors of the crypt lines of the live table: where key messages go.
fn crypt_lines(st: &Status) -> Vec<u64> {
    st.pipeline.iter().map(|p| p.start).collect()
}

fn message(name: &str, sector: u64, words: &[&str]) -> Result<()> {
    let req = Request::Message {
        sector,
        message: words.iter().map(|w| w.to_string()).collect(),
    };
    control::request(name, &req)?;
    Ok(())
}

/// `luksSuspend NAME`: holds I/O to the served volume and wipes its key from the daemon.
/// Refuses a volume that is already suspended (exit 1, as cryptsetup).
pub fn suspend(name: &str) -> Result<()> {
    let st = luks_status(name)?;
    if st.suspended {
        return Err(VolumeError::usage(format!(
            "Volume {name} is already suspended."
        )));
    }
    // Mid-reencryption the table holds two keys, and luksResume (which unlocks through a
    // header with the reencryption requirement) would refuse: the volume would stay held.
    let running = st
        .reencryption
        .as_ref()
        .is_some_and(|r| r.state != crate::reencrypt::RunState::Finished);
    let pending = Volume::load(&header_of(&st)?, crate::luks::LuksType::Any, false)
        .ok()
        .and_then(|v| v.luks2().map(|h| h.reencryption_in_progress()))
        .unwrap_or(false);
    if running || pending {
        return Err(VolumeError::usage(format!(
            "Volume {name} is in the middle of a reencryption; luksSuspend is not supported \
             until it finishes."
        )));
    }
    control::request(name, &Request::Suspend)?;
    for sector in crypt_lines(&st) {
        if let Err(e) = message(name, sector, &["key", "wipe"]) {
            // A key that cannot be wiped must not leave a volume that looks locked.
            let _ = control::request(name, &Request::Resume);
            return Err(VolumeError::new(
                e.code,
                format!("Error during suspending device {name}: {}", e.message),
            ));
        }
    }
    Ok(())
}

/// The volume `luksResume NAME` unlocks: the served volume's status, checked to be a
/// suspended LUKS volume ("Volume NAME is not suspended." otherwise, exit 1).
pub fn suspended_status(name: &str) -> Result<Status> {
    let st = luks_status(name)?;
    if !st.suspended {
        return Err(VolumeError::usage(format!(
            "Volume {name} is not suspended."
        )));
    }
    Ok(st)
}

/// `luksResume NAME`: unlocks `vol` (the header of the suspended volume `st`, from
/// [`suspended_status`]) with `passphrase` (only `slot` when given), sets the key in every
/// crypt line and releases the held I/O. A passphrase that opens no keyslot leaves the
/// volume suspended (exit 2). Returns the keyslot that opened.
pub fn resume(st: &Status, vol: &Volume, passphrase: &[u8], slot: Option<usize>) -> Result<usize> {
    let name = st.name.as_str();
    let uuid = st.info.uuid.as_deref().unwrap_or_default();
    if !uuid.is_empty() && !vol.uuid().eq_ignore_ascii_case(uuid) {
        return Err(VolumeError::device(format!(
            "The header does not belong to {name} (UUID {} instead of {uuid}).",
            vol.uuid()
        )));
    }
    if let Some(s) = slot {
        let active = match vol {
            Volume::Luks1(v) => v.header().keyslots.get(s).is_some_and(|k| k.is_enabled()),
            Volume::Luks2(h, _) => h.keyslots().iter().any(|k| k.id == s),
        };
        if !active {
            return Err(VolumeError::usage("No usable keyslot is available."));
        }
    }
    let (opened, key) = vol.unlock(passphrase, slot, UnlockPurpose::Activate)?;
    resume_with_key(st, key.as_bytes())?;
    Ok(opened)
}

/// Sets `key` (the volume key, checked by the caller) in every crypt line of the suspended
/// volume `st` and resumes it.
pub fn resume_with_key(st: &Status, key: &[u8]) -> Result<()> {
    let name = st.name.as_str();
    let hex = cryptblk_cipher::SecretBytes::from_slice(key).to_hex();
    for sector in crypt_lines(st) {
        message(name, sector, &["key", "set", hex.as_str()]).map_err(|e| {
            VolumeError::new(
                e.code,
                format!("Error during resuming device {name}: {}", e.message),
            )
        })?;
    }
    control::request(name, &Request::Resume).map_err(|e| {
        VolumeError::new(
            ErrorClass::WrongDevice,
            format!("Error during resuming device {name}: {}", e.message),
        )
    })?;
    Ok(())
}
