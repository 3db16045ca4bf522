//! `clevis`: the token `clevis luks bind` writes. Its `jwe` member is a JWE (flattened JSON
//! serialization) whose plaintext is the keyslot's passphrase; the protected header's
//! `clevis.pin` says how the content key is recovered. cryptblk speaks the `tang` pin
//! ([`tang`]): an ECDH-ES JWE whose key agreement is finished by a tang server, and the
//! `sss` pin ([`sss`]): a threshold of nested JWEs (of any pin cryptblk speaks).
//!
//! The JWE is unwrapped here rather than with a JOSE crate: clevis's tang JWEs need the
//! ECDH shared point from the tang exchange instead of a private key, which the maintained
//! JOSE crates do not accept as input; the pieces themselves (Concat KDF, AES-GCM, the
//! curves) are RustCrypto's.

pub mod sss;
pub mod tang;
#[cfg(feature = "tpm2")]
pub mod tpm2;

use super::TokenHandler;
use crate::error::{ErrorClass, Result, VolumeError};
use aes_gcm::aead::AeadInPlace;
use aes_gcm::{Aes128Gcm, Aes256Gcm, KeyInit};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use cryptblk_cipher::SecretBytes;
use serde_json::Value;

/// The token type.
pub const TYPE: &str = "clevis";

/// The `clevis` handler (`tpm2_device`: the TPM for the `tpm2` pin, `--tpm2-device`).
pub struct Clevis {
    /// `--tpm2-device` (None: `TPM2TOOLS_TCTI`, else /dev/tpmrm0).
    pub tpm2_device: Option<String>,
}

impl TokenHandler for Clevis {
    fn type_name(&self) -> &'static str {
        TYPE
    }

    fn open(&self, token: &Value, _input: Option<&[u8]>) -> Result<SecretBytes> {
        let jwe = Jwe::from_token(token)?;
        decrypt(&jwe, self.tpm2_device.as_deref())
    }
}

fn bad(msg: impl Into<String>) -> VolumeError {
    VolumeError::usage(format!("clevis token: {}", msg.into()))
}

/// base64url without padding (JOSE's encoding), refusing anything else.
pub fn b64(s: &str, what: &str) -> Result<Vec<u8>> {
    URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .map_err(|_| bad(format!("{what} is not base64url")))
}

/// A JWE in its parts, as stored in a clevis token or given in compact form.
pub struct Jwe {
    /// The protected header as sent (base64url text: it is the AEAD's associated data).
    pub protected_b64: String,
    /// The decoded protected header.
    pub header: Value,
    /// The encrypted content key (empty for direct key agreement).
    pub encrypted_key: Vec<u8>,
    /// The AES-GCM nonce.
    pub iv: Vec<u8>,
    /// The ciphertext.
    pub ciphertext: Vec<u8>,
    /// The AES-GCM tag.
    pub tag: Vec<u8>,
}

impl Jwe {
    /// The `jwe` member of a clevis token (flattened JSON serialization).
    pub fn from_token(token: &Value) -> Result<Jwe> {
        let j = &token["jwe"];
        let part = |k: &str| -> Result<&str> {
            j[k].as_str()
                .ok_or_else(|| bad(format!("jwe lacks its '{k}' member")))
        };
        Jwe::from_parts(
            part("protected")?,
            j["encrypted_key"].as_str().unwrap_or(""),
            part("iv")?,
            part("ciphertext")?,
            part("tag")?,
        )
    }

    /// A JWE in compact serialization (`protected.key.iv.ciphertext.tag`).
    pub fn from_compact(text: &str) -> Result<Jwe> {
        let p: Vec<&str> = text.trim().split('.').collect();
        if p.len() != 5 {
            return Err(bad("a compact JWE has five parts"));
        }
        Jwe::from_parts(p[0], p[1], p[2], p[3], p[4])
    }

    fn from_parts(protected: &str, key: &str, iv: &str, ct: &str, tag: &str) -> Result<Jwe> {
        let header: Value = serde_json::from_slice(&b64(protected, "protected header")?)
            .map_err(|_| bad("the protected header is not JSON"))?;
        if !header.is_object() {
            return Err(bad("the protected header is not a JSON object"));
        }
        Ok(Jwe {
            protected_b64: protected.to_string(),
            header,
            encrypted_key: b64(key, "encrypted_key")?,
            iv: b64(iv, "iv")?,
            ciphertext: b64(ct, "ciphertext")?,
            tag: b64(tag, "tag")?,
        })
    }

    /// The clevis pin that made it (`tang`, `sss`, `tpm2`...).
    pub fn pin(&self) -> &str {
        self.header["clevis"]["pin"].as_str().unwrap_or("")
    }
}

/// Recovers the plaintext of a clevis JWE by its pin (`tpm2_device`: the TPM for `tpm2`).
pub fn decrypt(jwe: &Jwe, tpm2_device: Option<&str>) -> Result<SecretBytes> {
    match jwe.pin() {
        "tang" => {
            let cek = tang::recover_cek(jwe)?;
            open_content(jwe, &cek)
        }
        "sss" => {
            let cek = sss::recover_cek(jwe, tpm2_device)?;
            open_content(jwe, &cek)
        }
        #[cfg(feature = "tpm2")]
        "tpm2" => {
            let cek = tpm2::recover_cek(jwe, tpm2_device)?;
            open_content(jwe, &cek)
        }
        #[cfg(not(feature = "tpm2"))]
        "tpm2" => Err(VolumeError::usage(
            "clevis pin 'tpm2': cryptblk was built without tpm2 support",
        )),
        "" => Err(bad("the JWE names no clevis pin")),
        other => Err(VolumeError::usage(format!(
            "clevis pin '{other}': cryptblk has no handler for this pin (it opens tang, sss and tpm2)"
        ))),
    }
}

/// The content key of an `ECDH-ES` (direct key agreement) JWE from the shared secret `z`
/// (RFC 7518 4.6.2: Concat KDF with SHA-256 over the `enc` name, `apu`, `apv` and the key
/// length in bits).
pub fn ecdh_es_cek(header: &Value, z: &[u8]) -> Result<SecretBytes> {
    let enc = header["enc"].as_str().unwrap_or("");
    let bits: u32 = match enc {
        "A128GCM" => 128,
        "A256GCM" => 256,
        other => {
            return Err(bad(format!(
                "content encryption '{other}' is not supported"
            )))
        }
    };
    let field = |k: &str| -> Result<Vec<u8>> {
        match header[k].as_str() {
            Some(s) => b64(s, k),
            None => Ok(Vec::new()),
        }
    };
    let mut info = Vec::new();
    for part in [enc.as_bytes().to_vec(), field("apu")?, field("apv")?] {
        info.extend_from_slice(&(part.len() as u32).to_be_bytes());
        info.extend_from_slice(&part);
    }
    info.extend_from_slice(&bits.to_be_bytes());
    let mut cek = SecretBytes::zeroed(bits as usize / 8);
    concat_kdf::derive_key_into::<sha2::Sha256>(z, &info, cek.as_mut_bytes())
        .map_err(|_| bad("Concat KDF failed"))?;
    Ok(cek)
}

/// Decrypts the JWE's content with its content key (AES-GCM; the associated data is the
/// protected header's base64url text).
pub fn open_content(jwe: &Jwe, cek: &SecretBytes) -> Result<SecretBytes> {
    if jwe.iv.len() != 12 || jwe.tag.len() != 16 {
        return Err(bad("AES-GCM needs a 12-byte iv and a 16-byte tag"));
    }
    let mut out = SecretBytes::from_slice(&jwe.ciphertext);
    let nonce = aes_gcm::Nonce::from_slice(&jwe.iv);
    let tag = aes_gcm::Tag::from_slice(&jwe.tag);
    let aad = jwe.protected_b64.as_bytes();
    let res = match cek.len() {
        16 => Aes128Gcm::new_from_slice(cek.as_bytes())
            .map_err(|_| bad("bad key"))?
            .decrypt_in_place_detached(nonce, aad, out.as_mut_bytes(), tag),
        32 => Aes256Gcm::new_from_slice(cek.as_bytes())
            .map_err(|_| bad("bad key"))?
            .decrypt_in_place_detached(nonce, aad, out.as_mut_bytes(), tag),
        _ => return Err(bad("unsupported content key size")),
    };
    res.map_err(|_| {
        VolumeError::new(
            ErrorClass::NoPermission,
            "clevis token: the JWE does not decrypt (wrong key from the server?)",
        )
    })?;
    Ok(out)
}
