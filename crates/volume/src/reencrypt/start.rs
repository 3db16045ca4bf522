//! The header work that starts or resumes a run, the same offline ([`super::operate`]) and
//! online ([`super::handoff`]): the keys of a resume, the new keyslots and metadata of a
//! re-key, the metadata of a detached-header decryption, and the question and new file of a
//! header export. Secrets come from the caller's [`ReencryptInput`].

use super::request::{
    device_prompt, keyslot_prompt, ReencryptInput, ReencryptNotice, ReencryptRequest, TokenUse,
};
use super::{InitParams, ReencryptKeys, ReencryptState};
use crate::error::{Result, VolumeError};
use cryptblk_cipher::SecretBytes;
use cryptblk_format::luks2::{Luks2Header, UnlockPurpose};
use std::fs::{File, OpenOptions};
use std::path::Path;

/// The parameters of a new re-key from `req` (offline and online alike).
fn init_params(
    req: &ReencryptRequest,
    input: &mut dyn ReencryptInput,
    h: &Luks2Header,
    device_block: u32,
) -> Result<InitParams> {
    // `--volume-key-file` is read to the new key's size, as cryptsetup reads it.
    let new_key_bytes = h
        .volume_key_size()
        .map(|cur| super::init::new_key_size(cur, req.cipher.as_deref(), req.key_size()))
        .or(req.key_size())
        .unwrap_or(0);
    Ok(InitParams {
        cipher: req.cipher.clone(),
        key_size: req.key_size(),
        sector_size: req.sector_size,
        resilience: req.resilience,
        resilience_hash: req.resilience_hash()?,
        pbkdf: if req.pbkdf_chosen {
            Some(input.pbkdf(false)?)
        } else {
            None
        },
        device_block,
        one_keyslot: req.key_slot.is_some(),
        new_key: input.volume_key(new_key_bytes)?,
        shift: req
            .reduce_device_size
            .as_deref()
            .map(|t| crate::format::parse_bytes(t, "--reduce-device-size"))
            .transpose()?,
    })
}

/// A new re-key of `h` (header and data on `file`): the passphrases of the keyslots to
/// carry over, the new keyslots and the reencryption metadata (offline and online alike).
pub(crate) fn start_rekey(
    req: &ReencryptRequest,
    input: &mut dyn ReencryptInput,
    h: &mut Luks2Header,
    file: &File,
    device: &Path,
    device_block: u32,
) -> Result<super::InitOutcome> {
    let mut params = init_params(req, input, h, device_block)?;
    if let Some(shift) = params.shift {
        // A shift that leaves no data: cryptsetup 2.6.1 writes the reencryption metadata,
        // then fails ("Failed to load LUKS2 reencryption context.", exit 1); refused here
        // before anything is asked or written.
        let size = crate::device::device_size(device)?;
        let data = size.saturating_sub(h.data_offset());
        if shift >= data {
            return Err(VolumeError::usage(format!(
                "Reduced device size {shift} bytes is not smaller than the data area of {} \
                 ({data} bytes).",
                device.display()
            )));
        }
    }
    let (pass, one) = passphrases(req, input, h, file, device)?;
    params.one_keyslot |= one;
    let init = super::init(h, file, &pass, &params)?;
    for (_, n) in &init.keyslots {
        input.notice(ReencryptNotice::KeyslotCreated(*n));
    }
    Ok(init)
}

/// The passphrases of the keyslots to carry over: a named token's (that keyslot alone, as
/// with `--key-slot`), `--key-slot`'s one, the only active keyslot's, or (on a terminal or
/// standard input) one per active keyslot as cryptsetup asks for them. True when one
/// keyslot alone is carried over.
fn passphrases(
    req: &ReencryptRequest,
    input: &mut dyn ReencryptInput,
    h: &Luks2Header,
    file: &File,
    device: &Path,
) -> Result<(Vec<(usize, SecretBytes)>, bool)> {
    let mut found = None;
    let opened = input.tokens(h, device, TokenUse::Named, &mut |secret, slot| {
        h.unlock(file, secret, Some(slot), UnlockPurpose::Verify)?;
        found = Some((slot, SecretBytes::from_slice(secret)));
        Ok(())
    })?;
    if let (true, Some(one)) = (opened, found) {
        return Ok((vec![one], true));
    }
    let active: Vec<usize> = h
        .keyslots()
        .iter()
        .filter(|k| k.kind == "luks2" && !k.unbound)
        .map(|k| k.id)
        .collect();
    let slots: Vec<usize> =
        match req.key_slot {
            Some(s) => {
                if !active.contains(&s) {
                    return Err(VolumeError::usage(format!("Keyslot {s} is not active.")));
                }
                vec![s]
            }
            None if input.key_file_given() && active.len() > 1 => return Err(VolumeError::usage(
                "Key file can be used only with --key-slot or with exactly one key slot active.",
            )),
            None => active,
        };
    let one = req.key_slot.is_some();
    slots
        .into_iter()
        .map(|s| Ok((s, input.secret(&keyslot_prompt(s))?)))
        .collect::<Result<Vec<_>>>()
        .map(|v| (v, one))
}

/// Both keys of the reencryption `h` holds, from one passphrase, or from the secret of a
/// token (tried first, as for `open`). cryptsetup assigns a re-key's new keyslots the
/// tokens of the old ones, so one token secret opens both keys.
pub(crate) fn resume_keys(
    req: &ReencryptRequest,
    input: &mut dyn ReencryptInput,
    h: &Luks2Header,
    file: &File,
    device: &Path,
) -> Result<ReencryptKeys> {
    let state = ReencryptState::of(h)?.ok_or_else(|| {
        VolumeError::device("LUKS2 reencryption requirement without reencryption metadata")
    })?;
    let mut found = None;
    let opened = input.tokens(h, device, TokenUse::Any, &mut |secret, slot| {
        found = Some(super::unlock_keys(h, file, &state, secret, Some(slot))?);
        Ok(())
    })?;
    if let (true, Some(keys)) = (opened, found) {
        return Ok(keys);
    }
    let pass = input.secret(&device_prompt(device))?;
    super::unlock_keys(h, file, &state, pass.as_bytes(), req.key_slot)
}

/// `--decrypt` of a volume whose header is detached (offline or online): the passphrase,
/// then the reencryption metadata (backward) in the header file of `h`. `dev_size` is the
/// data device's size. Returns both keys, or `None` after `--init-only`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start_decrypt(
    req: &ReencryptRequest,
    input: &mut dyn ReencryptInput,
    h: &mut Luks2Header,
    file: &File,
    dev_size: u64,
    device_block: u32,
    device: &Path,
) -> Result<Option<ReencryptKeys>> {
    let seg = h.default_segment()?;
    let pass = input.secret(&device_prompt(device))?;
    let keys = super::init_decrypt(
        h,
        file,
        dev_size.saturating_sub(seg.offset),
        pass.as_bytes(),
        req.key_slot,
        req.resilience,
        req.resilience_hash()?,
        device_block,
        // cryptsetup calibrates a decryption's reencryption digest.
        None,
    )?;
    if req.init_only {
        return Ok(None);
    }
    Ok(Some(keys))
}

/// `--decrypt --header NEW_FILE` of an attached header: cryptsetup's question (a "no" aborts),
/// then the passphrase of `device`.
pub(crate) fn confirm_export(
    input: &mut dyn ReencryptInput,
    device: &Path,
    export: &Path,
) -> Result<SecretBytes> {
    input.confirm(&format!(
        "Header file {} does not exist. Do you want to initialize LUKS2 decryption of \
         device {} and export LUKS2 header to file {}?",
        export.display(),
        device.display(),
        export.display()
    ))?;
    input.secret(&device_prompt(device))
}

/// The new header file of an export: created (never an existing file), readable by its
/// owner only, as cryptsetup creates it.
pub(crate) fn create_export_file(export: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(export)
        .map_err(|e| {
            VolumeError::device(format!(
                "Cannot create header file {}: {e}",
                export.display()
            ))
        })
}
