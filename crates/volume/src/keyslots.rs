//! Removing a keyslot (`luksKillSlot`, `luksRemoveKey`) with cryptsetup 2.6's safeguards,
//! learned by running it: the passphrase that authorises a kill, the question before the
//! last keyslot goes, and when an empty standard input lets a kill go ahead. The caller
//! supplies the user's answers through [`RemovalInput`]; what is asked and what is refused
//! is decided here, so a careless command cannot leave a volume without a keyslot.

use crate::error::{ErrorClass, Result, VolumeError};
use crate::luks::Volume;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::luks2::UnlockPurpose;

/// cryptsetup's question before the last keyslot of a volume is removed.
pub const LAST_KEYSLOT_QUESTION: &str =
    "This is the last keyslot. Device will become unusable after purging this key.";

/// cryptsetup's answer when that question is not answered YES (exit 2).
pub const NOT_WIPED: &str = "Operation aborted, the keyslot was NOT wiped.";

/// What removing a keyslot asks of the user.
pub trait RemovalInput {
    /// The passphrase (or key file contents) asked with `prompt`; `Ok(None)` when the
    /// input held nothing at all (the caller has said so, as cryptsetup prints "Nothing to
    /// read on input.").
    fn secret(&mut self, prompt: &str) -> Result<Option<SecretBytes>>;
    /// Asks `question` as cryptsetup's yes-dialog does (on a terminal, unless batch mode;
    /// otherwise the answer is yes): true when confirmed.
    fn confirm(&mut self, question: &str) -> Result<bool>;
}

/// Where the passphrase of a `luksKillSlot` comes from, as far as its checks care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyFileGiven {
    /// No key file: the terminal or standard input.
    No,
    /// `--key-file -`: standard input, read as a key file.
    Stdin,
    /// A key file.
    File,
}

/// A `luksKillSlot` request: the keyslot and the circumstances its checks depend on.
#[derive(Clone, Copy, Debug)]
pub struct KillSlot {
    /// The keyslot to wipe.
    pub slot: usize,
    /// `--batch-mode` (`-q`).
    pub batch: bool,
    /// The key file, if any.
    pub key_file: KeyFileGiven,
    /// Standard input is a terminal.
    pub stdin_is_tty: bool,
}

/// A keyslot's state as cryptsetup's `crypt_keyslot_status` tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// Not in use.
    Inactive,
    /// In use, and not the only keyslot that opens the data.
    Active,
    /// The only keyslot that opens the data: removing it makes the volume unusable.
    ActiveLast,
    /// A LUKS2 keyslot not bound to the data segment (an unbound key).
    Unbound,
}

/// The keyslot numbers a volume can have (LUKS1: 8, LUKS2: 32).
fn slot_count(vol: &Volume) -> usize {
    match vol {
        Volume::Luks1(_) => 8,
        Volume::Luks2(..) => 32,
    }
}

/// The keyslots that open the data (LUKS1: the enabled ones; LUKS2: the bound ones).
pub fn data_keyslots(vol: &Volume) -> Vec<usize> {
    match vol {
        Volume::Luks1(v) => v
            .header()
            .keyslots
            .iter()
            .enumerate()
            .filter(|(_, k)| k.is_enabled())
            .map(|(i, _)| i)
            .collect(),
        Volume::Luks2(h, _) => h
            .keyslots()
            .iter()
            .filter(|k| !k.unbound)
            .map(|k| k.id)
            .collect(),
    }
}

/// The state of keyslot `slot`; a number past the format's keyslots is refused (exit 1,
/// silently, as cryptsetup).
pub fn slot_state(vol: &Volume, slot: usize) -> Result<SlotState> {
    if slot >= slot_count(vol) {
        return Err(VolumeError::usage(""));
    }
    let bound = data_keyslots(vol);
    if bound.contains(&slot) {
        return Ok(if bound.len() == 1 {
            SlotState::ActiveLast
        } else {
            SlotState::Active
        });
    }
    let in_use = match vol {
        Volume::Luks1(_) => false,
        Volume::Luks2(h, _) => h.keyslots().iter().any(|k| k.id == slot),
    };
    Ok(if in_use {
        SlotState::Unbound
    } else {
        SlotState::Inactive
    })
}

fn wrong_passphrase() -> VolumeError {
    VolumeError::new(
        ErrorClass::NoPermission,
        "No key available with this passphrase.",
    )
}

fn not_wiped() -> VolumeError {
    VolumeError::new(ErrorClass::NoPermission, NOT_WIPED)
}

/// `luksKillSlot`: wipes `req.slot` once the user has shown the right to, as cryptsetup:
///
/// * an inactive keyslot is refused ("Keyslot N is not active.", exit 1);
/// * in batch mode on a terminal without a key file nothing is asked;
/// * otherwise a passphrase is read ("Enter any remaining passphrase: "): for the last
///   keyslot it must open that keyslot, else it must open another keyslot of the data
///   (not the one being wiped); a wrong one refuses (exit 2, nothing written);
/// * before the last keyslot goes, without batch mode or key file, the user must confirm
///   [`LAST_KEYSLOT_QUESTION`] (on a terminal);
/// * input that holds nothing at all (no key file, or `--key-file -`) lets the kill go on
///   without a passphrase, as cryptsetup's; an empty key file refuses (exit 1).
pub fn kill_slot(vol: &mut Volume, req: &KillSlot, input: &mut dyn RemovalInput) -> Result<()> {
    let slot = req.slot;
    let state = slot_state(vol, slot)?;
    if state == SlotState::Inactive {
        return Err(VolumeError::usage(format!("Keyslot {slot} is not active.")));
    }
    let verify = !req.batch || req.key_file != KeyFileGiven::No || !req.stdin_is_tty;
    if verify {
        let last = state == SlotState::ActiveLast;
        if last
            && !req.batch
            && req.key_file == KeyFileGiven::No
            && !input.confirm(LAST_KEYSLOT_QUESTION)?
        {
            return Err(not_wiped());
        }
        match input.secret("Enter any remaining passphrase: ")? {
            Some(pass) => check_kill_passphrase(vol, slot, last, pass.as_bytes())?,
            // cryptsetup goes on when standard input held nothing, but not for an empty
            // key file (the caller has printed why).
            None if req.key_file == KeyFileGiven::File => {
                return Err(VolumeError::usage(""));
            }
            None => {}
        }
    }
    vol.kill_slot(slot)
}

/// The passphrase that authorises wiping `slot`: the keyslot's own when it is the last,
/// else one of another keyslot of the data.
fn check_kill_passphrase(vol: &Volume, slot: usize, last: bool, pass: &[u8]) -> Result<()> {
    let candidates: Vec<usize> = if last {
        vec![slot]
    } else {
        data_keyslots(vol)
            .into_iter()
            .filter(|&s| s != slot)
            .collect()
    };
    for s in candidates {
        match vol.unlock(pass, Some(s), UnlockPurpose::Verify) {
            Ok(_) => return Ok(()),
            Err(e) if e.code == ErrorClass::NoPermission => {}
            Err(e) => return Err(e),
        }
    }
    Err(wrong_passphrase())
}

/// `luksRemoveKey`: reads the passphrase ("Enter passphrase to be deleted: "), finds the
/// keyslot it opens (only `slot` when given) and wipes it; before the last keyslot goes the
/// user must confirm [`LAST_KEYSLOT_QUESTION`] (on a terminal, unless batch mode, key file
/// or not). Returns the wiped keyslot.
pub fn remove_key(
    vol: &mut Volume,
    slot: Option<usize>,
    input: &mut dyn RemovalInput,
) -> Result<usize> {
    let pass = input
        .secret("Enter passphrase to be deleted: ")?
        .ok_or_else(|| VolumeError::usage(""))?;
    let (found, _) = vol.unlock(pass.as_bytes(), slot, UnlockPurpose::Unbound)?;
    if slot_state(vol, found)? == SlotState::ActiveLast && !input.confirm(LAST_KEYSLOT_QUESTION)? {
        return Err(not_wiped());
    }
    vol.kill_slot(found)?;
    Ok(found)
}
