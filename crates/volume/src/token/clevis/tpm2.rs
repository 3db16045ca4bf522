//! The clevis `tpm2` pin (`clevis luks bind ... tpm2 '{"pcr_ids":"7"}'`): the JWE's content
//! key is a JWK sealed in the TPM. The protected header's `clevis.tpm2` holds the sealed
//! object (`jwk_pub`: TPM2B_PUBLIC, `jwk_priv`: TPM2B_PRIVATE, base64url), the primary's
//! `key` (`ecc`/`rsa`) and name `hash`, and, when sealed to PCRs, `pcr_bank` and `pcr_ids`
//! (PolicyPCR; without them the object opens with its empty auth value). clevis creates the
//! primary with tpm2-tools' defaults, which for `-G ecc|rsa -g sha256` are systemd's
//! template, so the same unseal serves both ([`crate::token::systemd_tpm2`]).
//!
//! Which TPM: `--tpm2-device`, else `TPM2TOOLS_TCTI` (as clevis's tpm2-tools read it), else
//! /dev/tpmrm0.

use super::{b64, bad, Jwe};
use crate::error::Result;
use crate::token::systemd_tpm2::{self as tpm2, Bank, PrimaryAlg, SealedObject};
use cryptblk_cipher::SecretBytes;

/// The content key of a clevis `tpm2` JWE, unsealed on the TPM `device` (None: see above).
pub fn recover_cek(jwe: &Jwe, device: Option<&str>) -> Result<SecretBytes> {
    let t = &jwe.header["clevis"]["tpm2"];
    let field = |k: &str| -> Result<&str> {
        t[k].as_str()
            .ok_or_else(|| bad(format!("tpm2 pin lacks '{k}'")))
    };
    match t["hash"].as_str().unwrap_or("sha256") {
        "sha256" => {}
        other => {
            return Err(bad(format!(
                "tpm2 pin: primary name hash '{other}' is not supported (sha256 is)"
            )))
        }
    }
    let primary = match t["key"].as_str().unwrap_or("ecc") {
        "ecc" => PrimaryAlg::Ecc,
        "rsa" => PrimaryAlg::Rsa,
        other => {
            return Err(bad(format!(
                "tpm2 pin: key type '{other}' is not supported"
            )))
        }
    };
    let public = b64(field("jwk_pub")?, "jwk_pub")?;
    let private = b64(field("jwk_priv")?, "jwk_priv")?;
    let pcrs = match t["pcr_ids"].as_str() {
        Some(ids) if !ids.is_empty() => {
            let bank = t["pcr_bank"].as_str().unwrap_or("sha1");
            let bank = Bank::parse(bank)
                .ok_or_else(|| bad(format!("tpm2 pin: PCR bank '{bank}' is not supported")))?;
            Some((bank, tpm2::parse_pcrs(ids)?))
        }
        _ => None,
    };
    let device = match device {
        Some(d) => Some(d.to_string()),
        None => std::env::var("TPM2TOOLS_TCTI")
            .ok()
            .filter(|s| !s.is_empty()),
    };
    let tcti = tpm2::tcti(Some(device.as_deref().unwrap_or(tpm2::DEFAULT_DEVICE)))?;
    let jwk = tpm2::unseal_object(
        &tcti,
        &SealedObject {
            primary,
            private: sized(&private, "jwk_priv")?,
            public: sized(&public, "jwk_pub")?,
            pcrs: pcrs.as_ref().map(|(b, p)| (*b, p.as_slice())),
            pin: None,
            policy_hash: None,
        },
    )?;
    jwk_k(jwk.as_bytes())
}

/// The contents of a marshalled TPM2B (a big-endian u16 size, then that many bytes).
fn sized<'a>(b: &'a [u8], what: &str) -> Result<&'a [u8]> {
    match b {
        [hi, lo, rest @ ..] if rest.len() == u16::from_be_bytes([*hi, *lo]) as usize => Ok(rest),
        _ => Err(bad(format!("tpm2 pin: {what} is not a TPM2B"))),
    }
}

/// The `k` member of the unsealed JWK (`{"alg":"A256GCM","k":"...","kty":"oct",...}`),
/// decoded. Scanned by hand rather than parsed into a `serde_json::Value`, whose strings
/// would leave copies of the key in unlocked memory that is never wiped.
fn jwk_k(jwk: &[u8]) -> Result<SecretBytes> {
    let not_jwk = || bad("tpm2 pin: the unsealed data is not a symmetric JWK");
    let key = b"\"k\"";
    let at = jwk
        .windows(key.len())
        .position(|w| w == key)
        .ok_or_else(not_jwk)?;
    let rest = &jwk[at + key.len()..];
    let open = rest.iter().position(|&c| c == b'"').ok_or_else(not_jwk)?;
    if rest[..open]
        .iter()
        .any(|&c| c != b':' && !c.is_ascii_whitespace())
    {
        return Err(not_jwk());
    }
    let rest = &rest[open + 1..];
    let close = rest.iter().position(|&c| c == b'"').ok_or_else(not_jwk)?;
    let text = &rest[..close];
    // Room for base64's conservative length estimate; the decoded length is `n`.
    let mut out = SecretBytes::zeroed(text.len() * 3 / 4 + 3);
    let n = base64::Engine::decode_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        text,
        out.as_mut_bytes(),
    )
    .map_err(|_| not_jwk())?;
    match n {
        16 | 32 => Ok(SecretBytes::from_slice(&out.as_bytes()[..n])),
        _ => Err(not_jwk()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwk_key() {
        let k = jwk_k(br#"{"alg":"A256GCM","k":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8","key_ops":["encrypt","decrypt"],"kty":"oct"}"#).unwrap();
        assert_eq!(k.as_bytes(), (0u8..32).collect::<Vec<_>>().as_slice());
        assert!(jwk_k(br#"{"kty":"oct"}"#).is_err());
        assert!(jwk_k(br#"{"k":"AAEC"}"#).is_err());
    }

    #[test]
    fn tpm2b() {
        assert_eq!(sized(&[0, 2, 7, 8], "x").unwrap(), &[7, 8]);
        assert!(sized(&[0, 3, 7, 8], "x").is_err());
        assert!(sized(&[0], "x").is_err());
    }
}
