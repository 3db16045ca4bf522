//! cryptsetup's `token` action (add, remove, import, export, unassign) and the unlock-by-token
//! step every action that takes a key goes through first.

use super::volume;
use crate::args::{Opts, TokenOp};
use crate::exit::{ActionResult, Failure};
use cryptblk_cipher::SecretBytes;
use cryptblk_format::keyfile::{KeyFileLimits, KeySource};
use cryptblk_format::luks2::UnlockPurpose;
use cryptblk_volume::token::{self as lib, TokenChoice};
use cryptblk_volume::{ErrorClass, Volume};
use std::io::{Read, Write};
use std::path::Path;

/// `token <op> <device>`.
pub fn token(opts: &Opts, op: TokenOp, device: &Path) -> ActionResult {
    let t = &opts.token;
    let id = t.token_id.map(|i| i as usize);
    let slot = opts.key_slot.map(|s| s as usize);
    if opts.unbound && op != TokenOp::Add {
        return Err(Failure::usage(
            "Option --unbound is valid only with token add action.",
        ));
    }
    if opts.unbound && slot.is_some() {
        return Err(Failure::usage(
            "Options --key-slot and --unbound cannot be combined.",
        ));
    }
    let need_id = || {
        id.ok_or_else(|| {
            Failure::usage("Action requires specific token. Use --token-id parameter.")
        })
    };
    let header = volume::header_path(opts, device);
    match op {
        TokenOp::Add => {
            let desc = t.key_description.as_deref().ok_or_else(|| {
                Failure::usage("--key-description parameter is mandatory for token add action.")
            })?;
            let mut vol = load(opts, device, true)?;
            let n = lib::add_keyring(
                &mut vol,
                header,
                desc,
                id,
                slot,
                opts.unbound,
                t.token_replace,
            )?;
            if opts.verbose {
                eprintln!("Token {n} created.");
            }
            Ok(())
        }
        TokenOp::Remove => {
            let id = need_id()?;
            let mut vol = load(opts, device, true)?;
            lib::remove(&mut vol, header, id)?;
            if opts.verbose {
                eprintln!("Token {id} removed.");
            }
            Ok(())
        }
        TokenOp::Import => {
            let mut vol = load(opts, device, true)?;
            let text = read_json(t.json_file.as_deref())?;
            let n = lib::import(&mut vol, header, &text, id, slot, t.token_replace)?;
            if opts.verbose {
                eprintln!("Token {n} created.");
            }
            Ok(())
        }
        TokenOp::Export => {
            let id = need_id()?;
            let vol = load(opts, device, false)?;
            let text = lib::export(&vol, header, id)?;
            write_json(t.json_file.as_deref(), &text)
        }
        TokenOp::Unassign => {
            let id = need_id()?;
            let slot = slot.ok_or_else(|| {
                Failure::usage("Action requires specific keyslot. Use --key-slot parameter.")
            })?;
            let mut vol = load(opts, device, true)?;
            lib::unassign(&mut vol, header, id, slot)
        }
    }
}

/// The volume's header; the action is LUKS2-only, so a device without a LUKS header is
/// named "not a valid LUKS2 device", as cryptsetup names it.
fn load(opts: &Opts, device: &Path, write: bool) -> Result<Volume, Failure> {
    volume::load(opts, device, write).map_err(|e| {
        if e.message.ends_with("is not a valid LUKS device.") {
            cryptblk_volume::luks::not_luks2(volume::header_path(opts, device))
        } else {
            e
        }
    })
}

/// Token JSON from `--json-file` (`-` or none: standard input), at most the largest JSON
/// area LUKS2 has.
fn read_json(file: Option<&Path>) -> Result<Vec<u8>, Failure> {
    const LIMIT: u64 = 4 << 20;
    let mut text = Vec::new();
    let res = match file {
        Some(p) if p != Path::new("-") => {
            std::fs::File::open(p).and_then(|f| f.take(LIMIT).read_to_end(&mut text))
        }
        _ => std::io::stdin().lock().take(LIMIT).read_to_end(&mut text),
    };
    res.map_err(|_| Failure::usage("Failed to import token from file."))?;
    Ok(text)
}

fn write_json(file: Option<&Path>, text: &str) -> ActionResult {
    match file {
        Some(p) if p != Path::new("-") => std::fs::write(p, text)
            .map_err(|e| Failure::usage(format!("Failed to write token to {}: {e}", p.display()))),
        _ => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .and_then(|_| out.flush())
                .map_err(|e| Failure::usage(format!("Failed to write token: {e}")))
        }
    }
}

/// The token options as a library choice.
pub fn choice(opts: &Opts) -> TokenChoice {
    TokenChoice {
        id: opts.token.token_id.map(|i| i as usize),
        type_name: opts.token.token_type.clone(),
        only: opts.token.token_only,
        tpm2_device: opts.token.tpm2_device.clone(),
    }
}

/// cryptsetup's order for an action that needs a key: when no key file or volume key file
/// is given (or token options are), tokens are tried first. Returns the keyslot and volume
/// key a token opened, or None to go on to the passphrase: then the reasons tokens failed
/// have been printed. With `--token-only` a miss is the error.
pub fn try_tokens(
    opts: &Opts,
    vol: &Volume,
    device: &Path,
    purpose: UnlockPurpose,
) -> Result<Option<(usize, SecretBytes)>, Failure> {
    let Volume::Luks2(h, f) = vol else {
        if choice(opts).explicit() {
            return Err(cryptblk_volume::luks::not_luks2(device));
        }
        return Ok(None);
    };
    let mut open = |secret: &[u8], slot: usize| -> cryptblk_volume::Result<(usize, SecretBytes)> {
        let u = h.unlock(f, secret, Some(slot), purpose)?;
        Ok((u.slot, u.key))
    };
    try_tokens_with(opts, h, device, &mut open)
}

/// [`try_tokens`] on header `h` with what a token's secret opens left to `open` (called
/// with the secret and a keyslot the token names): e.g. both keys of a reencryption.
pub fn try_tokens_with<T>(
    opts: &Opts,
    h: &cryptblk_format::luks2::Luks2Header,
    device: &Path,
    open: &mut dyn FnMut(&[u8], usize) -> cryptblk_volume::Result<T>,
) -> Result<Option<T>, Failure> {
    let choice = choice(opts);
    let given_key = opts.key_file.is_some() || opts.volume_key_file.is_some();
    if given_key && !choice.explicit() {
        return Ok(None);
    }
    if h.token_ids().is_empty() && !choice.explicit() {
        return Ok(None);
    }
    let mut ask = |what: &str| -> cryptblk_volume::Result<SecretBytes> {
        volume::read_secret(
            &KeySource::Passphrase,
            KeyFileLimits::default(),
            &format!("Enter {what} for {}: ", device.display()),
        )
    };
    match lib::unlock_with(h, &choice, &mut ask, open)? {
        Ok((_, t)) => Ok(Some(t)),
        Err(miss) => {
            if choice.only {
                let msg = if miss.reasons.is_empty() {
                    "No usable token is available.".to_string()
                } else {
                    miss.reasons.join(" ")
                };
                return Err(Failure::new(
                    miss.class.unwrap_or(ErrorClass::WrongParameters),
                    msg,
                ));
            }
            for r in &miss.reasons {
                eprintln!("{r}");
            }
            if !miss.reasons.is_empty() {
                eprintln!(
                    "No token opened {}; using a passphrase instead.",
                    device.display()
                );
            }
            Ok(None)
        }
    }
}

/// `--link-vk-to-keyring`, parsed before any key is asked for (a bad value costs no KDF
/// run); of several, the first is used, as cryptsetup uses one outside reencryption.
pub fn vk_link(opts: &Opts) -> Result<Option<lib::keyring::VkLink>, Failure> {
    match opts.link_vk_to_keyring.first() {
        Some(spec) => Ok(Some(lib::keyring::VkLink::parse(spec)?)),
        None => Ok(None),
    }
}

/// `--volume-key-keyring`: the volume key from the kernel keyring, checked against the
/// volume's digest; None when the option is not given.
pub fn volume_key_from_keyring(opts: &Opts, vol: &Volume) -> Result<Option<SecretBytes>, Failure> {
    let Some(desc) = opts.volume_key_keyring.first() else {
        return Ok(None);
    };
    let vk = lib::keyring::read_volume_key(desc)?;
    vol.verify_volume_key(vk.as_bytes())?;
    Ok(Some(vk))
}

/// `enroll --tang URL <device>`: checks the server's advertisement (signatures, and the
/// thumbprint given or confirmed), unlocks with an existing passphrase (or key file or
/// volume key file), then adds the keyslot and clevis token.
pub fn enroll_tang(
    opts: &Opts,
    url: &str,
    thumbprint: Option<&str>,
    device: &Path,
) -> ActionResult {
    let mut vol = load(opts, device, true)?;
    let adv = lib::clevis::tang::advertisement(url)?;
    match thumbprint {
        Some(t) if adv.signing.iter().any(|s| s == t) => {}
        Some(t) => {
            return Err(Failure::usage(format!(
                "The tang server {url} does not advertise signing key {t} (it advertises {}).",
                adv.signing.join(", ")
            )))
        }
        None => volume::confirm(
            opts,
            &format!(
                "The tang server {url} advertises signing key(s) {}.\nTrust them for this volume?",
                adv.signing.join(", ")
            ),
        )?,
    }
    let vk = existing_volume_key(opts, &vol)?;
    let params = machine_keyslot_params(opts, volume::hash_opt(opts)?)?;
    let id = opts.token.token_id.map(|i| i as usize);
    let (slot, token) = lib::enroll_tang(
        &mut vol,
        volume::header_path(opts, device),
        &vk,
        &params,
        url,
        &adv,
        id,
    )?;
    if opts.verbose {
        eprintln!("Key slot {slot} created.");
        eprintln!("Token {token} created.");
    }
    Ok(())
}

/// The volume key for an enrollment: from `--volume-key-file`, else an existing passphrase
/// (key file, terminal or standard input).
fn existing_volume_key(opts: &Opts, vol: &Volume) -> Result<SecretBytes, Failure> {
    if let Some(p) = &opts.volume_key_file {
        return vol.volume_key_from_file(p, opts.key_size);
    }
    let pass = volume::read_secret(
        &volume::key_source(opts, None),
        volume::limits(opts),
        "Enter existing LUKS password: ",
    )?;
    Ok(vol.unlock(pass.as_bytes(), None, UnlockPurpose::Verify)?.1)
}

/// Keyslot parameters for a machine-made passphrase: unless the user chose a KDF, PBKDF2 with
/// 1000 iterations of `hash`. A random 256-bit passphrase gains nothing from a slow KDF:
/// clevis and systemd-cryptenroll use the same for theirs.
fn machine_keyslot_params(
    opts: &Opts,
    hash: cryptblk_cipher::hash::HashAlgorithm,
) -> Result<cryptblk_format::luks2::KeyslotParams, Failure> {
    let mut params = volume::keyslot_params(opts)?;
    if opts.pbkdf.is_none() && opts.pbkdf_force_iterations.is_none() && opts.iter_time.is_none() {
        params.pbkdf =
            cryptblk_format::kdf::PbkdfRequest::pbkdf2(hash).with_forced_iterations(1000);
    }
    Ok(params)
}

/// `enroll --tpm2-device D [--tpm2-pcrs P] [--tpm2-with-pin] <device>`: unlocks with an
/// existing passphrase (or key file or volume key file), asks for the new PIN if wanted,
/// then seals a new secret on the TPM and adds its keyslot and systemd-tpm2 token, as
/// `systemd-cryptenroll` 252 writes them (keyslot PBKDF2-SHA512, 1000 iterations).
#[cfg(feature = "tpm2")]
pub fn enroll_tpm2(opts: &Opts, pcrs: Option<&str>, with_pin: bool, device: &Path) -> ActionResult {
    use lib::systemd_tpm2 as tpm2;
    let Some(dev) = opts.token.tpm2_device.as_deref() else {
        return Err(Failure::usage(
            "enroll needs --tang URL or --tpm2-device DEVICE.",
        ));
    };
    let tcti = tpm2::tcti(Some(dev))?;
    let pcrs = tpm2::parse_pcrs(pcrs.unwrap_or("7"))?;
    let mut vol = load(opts, device, true)?;
    let vk = existing_volume_key(opts, &vol)?;
    let pin = if with_pin {
        let pin = volume::read_new_secret(None, "Please enter TPM2 PIN: ")?;
        Some(pin)
    } else {
        None
    };
    // systemd-cryptenroll's keyslots for TPM2 use SHA-512 for the KDF and the AF splitter.
    let hash = match &opts.hash {
        Some(_) => volume::hash_opt(opts)?,
        None => cryptblk_cipher::hash::HashAlgorithm::Sha512,
    };
    let mut params = machine_keyslot_params(opts, hash)?;
    params.af_hash = hash;
    let id = opts.token.token_id.map(|i| i as usize);
    let (slot, token) = tpm2::enroll(
        &mut vol,
        volume::header_path(opts, device),
        &vk,
        &params,
        &tcti,
        tpm2::Bank::Sha256,
        &pcrs,
        pin.as_ref().map(SecretBytes::as_bytes),
        id,
    )?;
    if opts.verbose {
        eprintln!("Key slot {slot} created.");
        eprintln!("Token {token} created.");
    }
    Ok(())
}

/// Keyslot parameters of systemd-cryptenroll's machine-made passphrases (its "minimal
/// PBKDF"): PBKDF2-SHA512, 1000 iterations, SHA-512 for the AF splitter, unless the user
/// chose otherwise.
fn systemd_keyslot_params(opts: &Opts) -> Result<cryptblk_format::luks2::KeyslotParams, Failure> {
    let hash = match &opts.hash {
        Some(_) => volume::hash_opt(opts)?,
        None => cryptblk_cipher::hash::HashAlgorithm::Sha512,
    };
    let mut params = machine_keyslot_params(opts, hash)?;
    params.af_hash = hash;
    Ok(params)
}

/// `enroll --pkcs11-token-uri URI <device>`: unlocks with an existing passphrase (or key
/// file or volume key file), wraps a new random key to the token's RSA public key and adds
/// its keyslot and systemd-pkcs11 token, as `systemd-cryptenroll --pkcs11-token-uri` does.
pub fn enroll_pkcs11(opts: &Opts, uri: &str, device: &Path) -> ActionResult {
    let mut vol = load(opts, device, true)?;
    let vk = existing_volume_key(opts, &vol)?;
    let params = systemd_keyslot_params(opts)?;
    let id = opts.token.token_id.map(|i| i as usize);
    let (slot, token) = lib::systemd_pkcs11::enroll(
        &mut vol,
        volume::header_path(opts, device),
        &vk,
        &params,
        uri,
        id,
    )?;
    eprintln!("New PKCS#11 token enrolled as key slot {slot}.");
    if opts.verbose {
        eprintln!("Token {token} created.");
    }
    Ok(())
}

/// `enroll --recovery-key <device>`: unlocks with an existing passphrase (or key file or
/// volume key file), then adds a keyslot for a new recovery key and its systemd-recovery
/// token, as `systemd-cryptenroll --recovery-key` does. The key goes to standard output (a
/// line of its own), the words around it to standard error, as systemd prints them.
pub fn enroll_recovery(opts: &Opts, device: &Path) -> ActionResult {
    let mut vol = load(opts, device, true)?;
    let vk = existing_volume_key(opts, &vol)?;
    let params = systemd_keyslot_params(opts)?;
    let id = opts.token.token_id.map(|i| i as usize);
    let (key, slot, token) = lib::systemd_recovery::enroll(
        &mut vol,
        volume::header_path(opts, device),
        &vk,
        &params,
        id,
    )?;
    eprint!("A secret recovery key has been generated for this volume:\n\n    ");
    let mut out = std::io::stdout().lock();
    out.write_all(key.as_bytes())
        .and_then(|_| out.write_all(b"\n"))
        .and_then(|_| out.flush())
        .map_err(|e| Failure::usage(format!("Failed to write the recovery key: {e}")))?;
    drop(out);
    eprintln!(
        "\nPlease save this secret recovery key at a secure location. It may be used to\n\
         regain access to the volume if the other configured access credentials have\n\
         been lost or forgotten. The recovery key may be entered in place of a password\n\
         whenever authentication is requested."
    );
    eprintln!("New recovery key enrolled as key slot {slot}.");
    if opts.verbose {
        eprintln!("Token {token} created.");
    }
    Ok(())
}

/// Without TPM2 support built in, `enroll --tpm2-device` is refused.
#[cfg(not(feature = "tpm2"))]
pub fn enroll_tpm2(
    _opts: &Opts,
    _pcrs: Option<&str>,
    _with_pin: bool,
    _device: &Path,
) -> ActionResult {
    Err(Failure::usage("cryptblk was built without tpm2 support."))
}
