//! Both volume keys of a reencryption, from one passphrase: cryptsetup gives the new key's
//! keyslot the passphrase of the keyslot that started the reencryption, so one passphrase
//! opens the old key and the new one.

use super::state::{ReencryptState, Side};
use crate::error::{Result, VolumeError};
use cryptblk_cipher::SecretBytes;
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::luks2::{Luks2Header, UnlockPurpose};
use cryptblk_format::FormatError;

/// The old and the new volume key, each when some data still needs it (after the last
/// hotzone cryptsetup drops the old key's keyslot before it clears the requirement).
pub struct ReencryptKeys {
    /// Key of the `backup-previous` digest.
    pub old: Option<SecretBytes>,
    /// Key of the `backup-final` digest.
    pub new: Option<SecretBytes>,
}

/// Opens the keyslots `passphrase` unlocks (`slot` first when given) until every key the
/// data needs is found. Fails with cryptsetup's wrong-passphrase error when no keyslot
/// opens, and names the missing key when only one does.
pub fn unlock_keys(
    h: &Luks2Header,
    io: &dyn HeaderIo,
    state: &ReencryptState,
    passphrase: &[u8],
    slot: Option<usize>,
) -> Result<ReencryptKeys> {
    // Keys the data needs must open; the others are tried too (the reencryption digest
    // that guards the metadata is computed over both), but may stay locked.
    // Plaintext (an encryption's old side, a decryption's new side) needs no key.
    let need_old = !state.old_is_plain() && state.segments.iter().any(|s| s.side != Side::New);
    let need_new = !state.new_is_plain() && state.segments.iter().any(|s| s.side != Side::Old);
    let mut old = None;
    let mut new = None;
    let mut candidates: Vec<usize> = h
        .keyslots()
        .iter()
        .filter(|k| k.kind == "luks2" && k.priority > 0)
        .map(|k| k.id)
        .collect();
    if let Some(s) = slot {
        candidates.retain(|&c| c != s);
        candidates.insert(0, s);
    }
    let mut opened_any = false;
    let have_all = |old: &Option<SecretBytes>, new: &Option<SecretBytes>| {
        (old.is_some() || state.old_is_plain()) && (new.is_some() || state.new_is_plain())
    };
    for (i, s) in candidates.into_iter().enumerate() {
        if have_all(&old, &new) {
            break;
        }
        let Some(digest) = h.digest_of_slot(s) else {
            continue;
        };
        let wanted = (!state.old_is_plain() && digest == state.old_digest && old.is_none())
            || (!state.new_is_plain() && digest == state.new_digest && new.is_none());
        if !wanted {
            continue;
        }
        match h.unlock(io, passphrase, Some(s), UnlockPurpose::Unbound) {
            Ok(u) => {
                opened_any = true;
                if digest == state.old_digest {
                    old = Some(u.key);
                } else {
                    new = Some(u.key);
                }
            }
            // The keyslot asked for by number must open.
            Err(e) if i == 0 && slot.is_some() => return Err(e.into()),
            Err(FormatError::WrongPassphrase) => {}
            Err(e) => return Err(e.into()),
        }
    }
    match (old.is_some() || !need_old, new.is_some() || !need_new) {
        (true, true) => Ok(ReencryptKeys { old, new }),
        _ if !opened_any => Err(FormatError::WrongPassphrase.into()),
        (false, _) => Err(VolumeError::new(
            crate::error::ErrorClass::NoPermission,
            "The passphrase does not open the old volume key of this reencryption.",
        )),
        (_, false) => Err(VolumeError::new(
            crate::error::ErrorClass::NoPermission,
            "The passphrase does not open the new volume key of this reencryption.",
        )),
    }
}
