//! `systemd-recovery`: the token `systemd-cryptenroll --recovery-key` writes. It holds no
//! secret: it marks the keyslot whose passphrase is the recovery key systemd showed once,
//! 64 "modhex" characters (`cbdefghijklnrtuv`, one per nibble) in eight dash-separated
//! groups. The handler asks for that key, checks its form (so a mistyped key is reported as
//! such instead of costing a KDF run) and hands it on exactly as systemd hashes it.

use super::{Input, TokenHandler};
use crate::error::{Result, VolumeError};
use cryptblk_cipher::SecretBytes;
use serde_json::Value;

/// The token type.
pub const TYPE: &str = "systemd-recovery";

/// The modhex alphabet systemd (and Yubico) use: nibble value n is `MODHEX[n]`.
pub const MODHEX: &[u8; 16] = b"cbdefghijklnrtuv";

/// The `systemd-recovery` handler.
pub struct Recovery;

impl TokenHandler for Recovery {
    fn type_name(&self) -> &'static str {
        TYPE
    }

    fn input(&self, _token: &Value) -> Input {
        Input::Required("recovery key")
    }

    fn open(&self, _token: &Value, input: Option<&[u8]>) -> Result<SecretBytes> {
        let typed = input.ok_or_else(|| VolumeError::usage("a recovery key is needed"))?;
        normalize(typed)
    }
}

/// The recovery key in systemd's canonical form from what the user typed: surrounding
/// whitespace is dropped, letters are lowered, and the dashes may be left out (systemd
/// accepts both when a key is typed at its prompt). Anything else is refused.
pub fn normalize(typed: &[u8]) -> Result<SecretBytes> {
    let bad = || {
        VolumeError::new(
            crate::ErrorClass::NoPermission,
            "not a recovery key (expected 8 groups of 8 characters of cbdefghijklnrtuv, \
             separated by dashes)",
        )
    };
    let trimmed = typed.trim_ascii();
    let mut out = SecretBytes::zeroed(71);
    let mut n = 0;
    let mut digits = 0;
    for &c in trimmed {
        let c = c.to_ascii_lowercase();
        if c == b'-' {
            // Dashes are accepted only at group boundaries; they are re-inserted below.
            if digits == 0 || digits % 8 != 0 {
                return Err(bad());
            }
            continue;
        }
        if !MODHEX.contains(&c) || digits == 64 {
            return Err(bad());
        }
        if digits > 0 && digits % 8 == 0 {
            out.as_mut_bytes()[n] = b'-';
            n += 1;
        }
        out.as_mut_bytes()[n] = c;
        n += 1;
        digits += 1;
    }
    if digits != 64 {
        return Err(bad());
    }
    Ok(out)
}

/// A new recovery key as systemd makes one: 32 random bytes, each as two modhex characters
/// (high nibble first), a dash after every 8 characters.
pub fn make_key() -> SecretBytes {
    let raw = SecretBytes::random(32);
    let mut out = SecretBytes::zeroed(71);
    let o = out.as_mut_bytes();
    let mut n = 0;
    for (i, &b) in raw.as_bytes().iter().enumerate() {
        if i > 0 && i % 4 == 0 {
            o[n] = b'-';
            n += 1;
        }
        o[n] = MODHEX[usize::from(b >> 4)];
        o[n + 1] = MODHEX[usize::from(b & 15)];
        n += 2;
    }
    out
}

/// `enroll --recovery-key`: a new keyslot (parameters `params`) whose passphrase is a new
/// recovery key, and a `systemd-recovery` token at `id` (None: the first free) naming it, as
/// `systemd-cryptenroll --recovery-key` writes them. Returns (key, keyslot, token id): the
/// key is shown to the user once and stored nowhere else.
pub fn enroll(
    vol: &mut crate::luks::Volume,
    device: &std::path::Path,
    vk: &SecretBytes,
    params: &cryptblk_format::luks2::KeyslotParams,
    id: Option<usize>,
) -> Result<(SecretBytes, usize, usize)> {
    let (h, f) = super::luks2_mut(vol, device)?;
    super::place(h, id, false)?;
    let key = make_key();
    let slot = h.add_keyslot(f, vk, key.as_bytes(), params)?;
    let token = serde_json::json!({"type": TYPE, "keyslots": [slot.to_string()]});
    let id = h.import_token(id, token)?;
    h.write(f)?;
    Ok((key, slot, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "lejhgtfn-nlltbhcu-edjievjn-ednhecrh-nhhrubif-litfrvev-hbilkgeh-ehuejtid";

    #[test]
    fn canonical_forms() {
        assert_eq!(
            normalize(KEY.as_bytes()).unwrap().as_bytes(),
            KEY.as_bytes()
        );
        let bare: String = KEY.chars().filter(|&c| c != '-').collect();
        assert_eq!(
            normalize(bare.as_bytes()).unwrap().as_bytes(),
            KEY.as_bytes()
        );
        let loud = format!("  {}\n", KEY.to_uppercase());
        assert_eq!(
            normalize(loud.as_bytes()).unwrap().as_bytes(),
            KEY.as_bytes()
        );
    }

    #[test]
    fn made_keys_have_the_canonical_form() {
        let a = make_key();
        assert_eq!(normalize(a.as_bytes()).unwrap().as_bytes(), a.as_bytes());
        assert_ne!(make_key().as_bytes(), a.as_bytes());
    }

    #[test]
    fn refuses_other_text() {
        assert!(normalize(b"passphrase").is_err());
        assert!(normalize(&KEY.as_bytes()[..70]).is_err());
        let mut wrong = KEY.as_bytes().to_vec();
        wrong[0] = b'a';
        assert!(normalize(&wrong).is_err());
        assert!(normalize(format!("{KEY}c").as_bytes()).is_err());
        assert!(normalize(b"lejh-gtfn").is_err());
    }
}
