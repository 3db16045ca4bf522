//! LUKS2 tokens: the `token` action's header operations (add a `luks2-keyring` token,
//! import, export, remove, unassign), validated as cryptsetup validates them and written
//! through the crash-safe header write, and unlock by token through one handler per token
//! type (one module each).
//!
//! A token is a JSON object in the header's `tokens` section naming keyslots; its handler
//! turns it into the passphrase of one of those keyslots (from the kernel keyring, a tang
//! server, a recovery key typed by the user...). Handlers never see the volume key, and the
//! secrets they return are [`SecretBytes`] (locked, wiped on drop), never logged.

pub mod clevis;
pub mod keyring;
pub mod systemd_pkcs11;
pub mod systemd_recovery;
#[cfg(feature = "tpm2")]
pub mod systemd_tpm2;
#[cfg(feature = "tpm2")]
mod tss2_load;

use crate::error::{ErrorClass, Result, VolumeError};
use crate::luks::{not_luks2, Volume};
use cryptblk_cipher::SecretBytes;
use cryptblk_format::luks2::{Luks2Header, UnlockPurpose};
use serde_json::Value;
use std::path::Path;

/// Highest token id plus one (LUKS2 allows tokens 0..31).
pub const TOKENS_MAX: usize = 32;

/// Token types cryptblk knows by name but cannot open (their secret lives in hardware or a
/// service cryptblk does not speak to yet); listed and refused with a clear message.
pub const RECOGNISED_WITHOUT_HANDLER: &[&str] = &["systemd-fido2", "systemd-tpm2"];

/// What a handler needs from the user before it can open its token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// Nothing: the handler fetches the secret itself (keyring, network).
    None,
    /// A text the user types (PIN, recovery key); the prompt names what is asked for.
    Required(&'static str),
}

/// A token type's handler: cryptsetup's token plugin, in process.
pub trait TokenHandler {
    /// The token `type` this handler opens.
    fn type_name(&self) -> &'static str;
    /// Type-specific checks on a token about to be imported (cryptsetup validates its
    /// built-in types this way); the generic rules are checked by the caller.
    fn validate(&self, _token: &Value) -> Result<()> {
        Ok(())
    }
    /// Whether [`TokenHandler::open`] needs user input for `token` (a TPM2 token needs a PIN
    /// only when enrolled with one).
    fn input(&self, _token: &Value) -> Input {
        Input::None
    }
    /// The passphrase this token holds for its keyslots. `input` is the user's text when
    /// [`TokenHandler::input`] asks for one. An error (server down, key not in the keyring)
    /// is reported by the caller, which moves on to the next token or the passphrase.
    fn open(&self, token: &Value, input: Option<&[u8]>) -> Result<SecretBytes>;
}

/// The handler for a token type, if cryptblk has one.
pub fn handler(type_name: &str) -> Option<Box<dyn TokenHandler>> {
    handler_for(type_name, &TokenChoice::default())
}

/// The handler for a token type, set up as `choice` asks (the TPM to use).
fn handler_for(type_name: &str, choice: &TokenChoice) -> Option<Box<dyn TokenHandler>> {
    match type_name {
        keyring::TYPE => Some(Box::new(keyring::Keyring)),
        systemd_recovery::TYPE => Some(Box::new(systemd_recovery::Recovery)),
        systemd_pkcs11::TYPE => Some(Box::new(systemd_pkcs11::SystemdPkcs11)),
        clevis::TYPE => Some(Box::new(clevis::Clevis {
            tpm2_device: choice.tpm2_device.clone(),
        })),
        #[cfg(feature = "tpm2")]
        systemd_tpm2::TYPE => Some(Box::new(systemd_tpm2::SystemdTpm2 {
            device: choice.tpm2_device.clone(),
        })),
        _ => None,
    }
}

fn luks2_mut<'a>(
    vol: &'a mut Volume,
    device: &Path,
) -> Result<(&'a mut Luks2Header, &'a std::fs::File)> {
    match vol {
        Volume::Luks2(h, f) => Ok((h, f)),
        Volume::Luks1(_) => Err(not_luks2(device)),
    }
}

fn luks2<'a>(vol: &'a Volume, device: &Path) -> Result<&'a Luks2Header> {
    vol.luks2().ok_or_else(|| not_luks2(device))
}

fn check_token_id(id: usize) -> Result<()> {
    if id >= TOKENS_MAX {
        return Err(VolumeError::usage(format!("Token {id} is invalid.")));
    }
    Ok(())
}

fn check_slot_active(h: &Luks2Header, slot: usize) -> Result<()> {
    if h.keyslots().iter().any(|k| k.id == slot) {
        Ok(())
    } else {
        Err(VolumeError::usage(format!("Keyslot {slot} is not active.")))
    }
}

/// Where a new token goes: `id` when free (or `replace`), else the first free id.
fn place(h: &Luks2Header, id: Option<usize>, replace: bool) -> Result<Option<usize>> {
    match id {
        Some(i) => {
            check_token_id(i)?;
            if h.token(i).is_some() && !replace {
                return Err(VolumeError::usage(format!("Token {i} in use.")));
            }
            Ok(Some(i))
        }
        None => Ok(None),
    }
}

fn push_slot(token: &mut Value, slot: usize) {
    if let Some(a) = token.get_mut("keyslots").and_then(Value::as_array_mut) {
        let name = slot.to_string();
        if !a.iter().any(|v| v.as_str() == Some(name.as_str())) {
            a.push(Value::String(name));
        }
    }
}

/// `token add --key-description`: a `luks2-keyring` token for `slot` (None: every active
/// keyslot; `unbound`: none). Returns the token id.
pub fn add_keyring(
    vol: &mut Volume,
    device: &Path,
    description: &str,
    id: Option<usize>,
    slot: Option<usize>,
    unbound: bool,
    replace: bool,
) -> Result<usize> {
    let (h, f) = luks2_mut(vol, device)?;
    let id = place(h, id, replace)?;
    let slots: Vec<Value> = match (slot, unbound) {
        (_, true) => Vec::new(),
        (Some(s), false) => {
            check_slot_active(h, s)?;
            vec![Value::String(s.to_string())]
        }
        (None, false) => h
            .keyslots()
            .iter()
            .filter(|k| k.kind == "luks2")
            .map(|k| Value::String(k.id.to_string()))
            .collect(),
    };
    let token = serde_json::json!({
        "type": keyring::TYPE,
        "keyslots": slots,
        "key_description": description,
    });
    let id = h.import_token(id, token)?;
    h.write(f)?;
    Ok(id)
}

/// Parses and validates a token as `token import` does: an object with a string `type` and
/// a `keyslots` array of strings naming existing keyslots, plus the built-in type's own
/// rules. Every failure is cryptsetup's one line (exit 1).
pub fn parse_token(h: &Luks2Header, text: &[u8]) -> Result<Value> {
    let failed = || VolumeError::usage("Failed to import token from file.");
    let token: Value = serde_json::from_slice(text).map_err(|_| failed())?;
    if !token.is_object() || !token["type"].is_string() {
        return Err(failed());
    }
    let Some(slots) = token["keyslots"].as_array() else {
        return Err(failed());
    };
    for s in slots {
        let Some(name) = s.as_str() else {
            return Err(failed());
        };
        if h.json()["keyslots"].get(name).is_none() {
            return Err(failed());
        }
    }
    if let Some(handler) = handler(token["type"].as_str().unwrap_or_default()) {
        handler.validate(&token).map_err(|_| failed())?;
    }
    Ok(token)
}

/// `token import`: stores `text` (a token's JSON) at `id` (None: the first free id),
/// assigned also to `slot` when given. Nothing is written unless every check passes.
pub fn import(
    vol: &mut Volume,
    device: &Path,
    text: &[u8],
    id: Option<usize>,
    slot: Option<usize>,
    replace: bool,
) -> Result<usize> {
    let (h, f) = luks2_mut(vol, device)?;
    let id = place(h, id, replace)?;
    let mut token = parse_token(h, text)?;
    if let Some(s) = slot {
        check_slot_active(h, s)?;
        push_slot(&mut token, s);
    }
    let id = h
        .import_token(id, token)
        .map_err(|_| VolumeError::usage("Failed to import token from file."))?;
    h.write(f)?;
    Ok(id)
}

/// `token export`: the token's JSON as cryptsetup writes it (compact, no newline).
pub fn export(vol: &Volume, device: &Path, id: usize) -> Result<String> {
    let h = luks2(vol, device)?;
    check_token_id(id)?;
    let t = h
        .token(id)
        .ok_or_else(|| VolumeError::usage(format!("Failed to get token {id} for export.")))?;
    Ok(cryptblk_format::luks2::json::to_compact(t))
}

/// `token remove`.
pub fn remove(vol: &mut Volume, device: &Path, id: usize) -> Result<()> {
    let (h, f) = luks2_mut(vol, device)?;
    check_token_id(id)?;
    if h.token(id).is_none() {
        return Err(VolumeError::usage(format!("Token {id} is not in use.")));
    }
    h.remove_token(id)?;
    h.write(f)?;
    Ok(())
}

/// `token unassign`: removes `slot` from the token's keyslots.
pub fn unassign(vol: &mut Volume, device: &Path, id: usize, slot: usize) -> Result<()> {
    let (h, f) = luks2_mut(vol, device)?;
    check_token_id(id)?;
    let not_assigned =
        || VolumeError::usage(format!("Token {id} is not assigned to keyslot {slot}."));
    let mut token = h.token(id).cloned().ok_or_else(not_assigned)?;
    let name = slot.to_string();
    let slots = token["keyslots"].as_array_mut().ok_or_else(not_assigned)?;
    let before = slots.len();
    slots.retain(|v| v.as_str() != Some(name.as_str()));
    if slots.len() == before {
        return Err(not_assigned());
    }
    h.import_token(Some(id), token)?;
    h.write(f)?;
    Ok(())
}

/// Which tokens an unlock may use (`--token-id`, `--token-type`, `--token-only`).
#[derive(Clone, Debug, Default)]
pub struct TokenChoice {
    /// Only this token.
    pub id: Option<usize>,
    /// Only tokens of this type.
    pub type_name: Option<String>,
    /// Do not fall back to a passphrase.
    pub only: bool,
    /// The TPM for `systemd-tpm2` tokens (`--tpm2-device`; None: `SYSTEMD_TPM2_DEVICE`, then
    /// `/dev/tpmrm0`).
    pub tpm2_device: Option<String>,
}

impl TokenChoice {
    /// True when the user named tokens explicitly (then tokens that need input are used,
    /// and failures are errors rather than a quiet fall-back).
    pub fn explicit(&self) -> bool {
        self.id.is_some() || self.type_name.is_some() || self.only
    }
}

/// A token unlock: which token and keyslot opened, and the volume key.
pub struct TokenUnlock {
    /// The token id.
    pub token: usize,
    /// The keyslot the token's secret opened.
    pub slot: usize,
    /// The volume key.
    pub key: SecretBytes,
}

/// Why no token opened the volume: one line per token tried (empty when none was), for the
/// caller to print before falling back.
#[derive(Debug, Default)]
pub struct TokenMiss {
    /// What happened to each token tried.
    pub reasons: Vec<String>,
    /// The most telling error class (cryptsetup's exit code when tokens only were allowed).
    pub class: Option<ErrorClass>,
}

/// Tries the tokens `choice` allows, in id order, on keyslots they name. `ask` is called for
/// a handler that needs user input (only when the choice is explicit); it returns the text
/// typed. Returns the unlock, or the reasons no token opened.
pub fn unlock(
    vol: &Volume,
    choice: &TokenChoice,
    purpose: UnlockPurpose,
    ask: &mut dyn FnMut(&str) -> Result<SecretBytes>,
) -> Result<std::result::Result<TokenUnlock, TokenMiss>> {
    let Volume::Luks2(h, f) = vol else {
        let mut miss = TokenMiss::default();
        miss.reasons.push("LUKS1 volumes have no tokens.".into());
        return Ok(Err(miss));
    };
    let mut open = |secret: &[u8], slot: usize| -> Result<(usize, SecretBytes)> {
        let u = h.unlock(f, secret, Some(slot), purpose)?;
        Ok((u.slot, u.key))
    };
    Ok(
        unlock_with(h, choice, ask, &mut open)?.map(|(token, (slot, key))| TokenUnlock {
            token,
            slot,
            key,
        }),
    )
}

/// [`unlock`] of header `h` with what a token's secret opens left to `open` (called with the secret and
/// each keyslot the token names, until one succeeds): e.g. both volume keys of a
/// reencryption. Returns the token id and what `open` returned.
pub fn unlock_with<T>(
    h: &Luks2Header,
    choice: &TokenChoice,
    ask: &mut dyn FnMut(&str) -> Result<SecretBytes>,
    open: &mut dyn FnMut(&[u8], usize) -> Result<T>,
) -> Result<std::result::Result<(usize, T), TokenMiss>> {
    let mut miss = TokenMiss::default();
    let ids: Vec<usize> = match choice.id {
        Some(i) => {
            check_token_id(i)?;
            if h.token(i).is_none() {
                miss.reasons.push(format!("Token {i} is not in use."));
                miss.class = Some(ErrorClass::WrongParameters);
                return Ok(Err(miss));
            }
            vec![i]
        }
        None => h.token_ids(),
    };
    for id in ids {
        let Some(token) = h.token(id) else { continue };
        let ty = token["type"].as_str().unwrap_or_default();
        if choice.type_name.as_deref().is_some_and(|t| t != ty) {
            continue;
        }
        let Some(handler) = handler_for(ty, choice) else {
            let why = if cfg!(not(feature = "tpm2")) && ty == "systemd-tpm2" {
                format!("Token {id} ({ty}): cryptblk was built without tpm2 support.")
            } else if RECOGNISED_WITHOUT_HANDLER.contains(&ty) {
                format!("Token {id} ({ty}): cryptblk has no handler for this token type yet.")
            } else {
                format!("Token {id} ({ty}): no handler for this token type.")
            };
            miss.reasons.push(why);
            miss.class.get_or_insert(ErrorClass::WrongParameters);
            continue;
        };
        let input = match handler.input(token) {
            Input::None => None,
            Input::Required(what) if choice.explicit() => match ask(what) {
                Ok(s) => Some(s),
                Err(e) => {
                    miss.reasons.push(format!("Token {id} ({ty}): {e}"));
                    miss.class = Some(e.code);
                    continue;
                }
            },
            // A token that needs typing is not tried unasked: the passphrase prompt that
            // follows takes the same text (a recovery key is a passphrase).
            Input::Required(_) => continue,
        };
        let secret = match handler.open(token, input.as_ref().map(SecretBytes::as_bytes)) {
            Ok(s) => s,
            Err(e) => {
                miss.reasons.push(format!("Token {id} ({ty}): {e}"));
                miss.class = Some(e.code);
                continue;
            }
        };
        let slots: Vec<usize> = token["keyslots"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str()?.parse().ok()).collect())
            .unwrap_or_default();
        let mut last = None;
        for s in slots {
            match open(secret.as_bytes(), s) {
                Ok(t) => return Ok(Ok((id, t))),
                Err(e) => last = Some(e),
            }
        }
        let why = match last {
            Some(e) => {
                miss.class = Some(e.code);
                format!("Token {id} ({ty}): its secret opens none of its keyslots ({e})")
            }
            None => format!("Token {id} ({ty}) is assigned to no keyslot."),
        };
        miss.reasons.push(why);
    }
    Ok(Err(miss))
}

/// `enroll --tang`: binds `vol` to a tang server as `clevis luks bind` does. A new keyslot
/// (parameters `params`) gets a random passphrase of 256 bits (base64url text, 43
/// characters), and a `clevis` token at `id` (None: the first free) holds that passphrase
/// encrypted to the server's advertised key `adv`. Returns (keyslot, token id). The keyslot
/// is written before the token, as clevis writes them: a crash between leaves an extra
/// keyslot nothing opens, never a token naming a missing keyslot.
pub fn enroll_tang(
    vol: &mut Volume,
    device: &Path,
    vk: &SecretBytes,
    params: &cryptblk_format::luks2::KeyslotParams,
    url: &str,
    adv: &clevis::tang::Advertisement,
    id: Option<usize>,
) -> Result<(usize, usize)> {
    use base64::Engine;
    {
        let (h, _) = luks2_mut(vol, device)?;
        place(h, id, false)?;
    }
    let raw = SecretBytes::random(32);
    let mut pass = SecretBytes::zeroed(43);
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode_slice(raw.as_bytes(), pass.as_mut_bytes())
        .map_err(|_| VolumeError::usage("cannot encode the new passphrase"))?;
    let jwe = clevis::tang::encrypt(url, adv, pass.as_bytes())?;
    let (h, f) = luks2_mut(vol, device)?;
    let slot = h.add_keyslot(f, vk, pass.as_bytes(), params)?;
    let token = serde_json::json!({
        "type": clevis::TYPE,
        "keyslots": [slot.to_string()],
        "jwe": jwe,
    });
    let id = h.import_token(id, token)?;
    h.write(f)?;
    Ok((slot, id))
}
