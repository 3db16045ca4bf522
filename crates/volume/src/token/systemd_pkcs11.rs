//! `systemd-pkcs11`: the token `systemd-cryptenroll --pkcs11-token-uri=URI` writes (systemd
//! 252 and later, RSA keys). Enrolment makes a random key of half the RSA modulus' bytes
//! (128 bytes for RSA-2048), encrypts it to the token's RSA public key with PKCS#1 v1.5
//! padding and stores it base64 in `pkcs11-key`, the URI in `pkcs11-uri`; the keyslot's
//! passphrase is the standard base64 (padded) of the random key. Unlocking logs in to the
//! token with the user PIN and decrypts `pkcs11-key` with the private key the URI names
//! (`CKM_RSA_PKCS`), as systemd does.
//!
//! The PKCS#11 module is loaded at run time through the maintained `cryptoki` crate: by
//! default p11-kit's proxy (every module registered with p11-kit, as systemd loads them:
//! SoftHSM2, OpenSC...), or the module a `module-path` URI attribute names. The PIN comes
//! from `$PIN` (as systemd's tools read it non-interactively), else it is asked for.
//!
//! Not done: tokens with EC keys (systemd 254+ wraps with ECDH); enrolment reads the token's
//! RSA public-key object (systemd reads the certificate: tokens that hold a certificate and
//! a private key but no public-key object are refused with a clear message).

use super::{Input, TokenHandler};
use crate::error::{ErrorClass, Result, VolumeError};
use base64::Engine;
use cryptblk_cipher::SecretBytes;
use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{Attribute, AttributeType, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::slot::Slot;
use cryptoki::types::AuthPin;
use serde_json::Value;

/// The token type.
pub const TYPE: &str = "systemd-pkcs11";

/// The module loaded when the URI names none: p11-kit's proxy, which loads every module
/// registered with p11-kit (systemd uses p11-kit the same way). `p11-kit-proxy.so` is a
/// link to `libp11-kit.so.0`, which is always installed where p11-kit is.
const PROXY_MODULES: &[&str] = &["p11-kit-proxy.so", "libp11-kit.so.0"];

/// The `systemd-pkcs11` handler.
pub struct SystemdPkcs11;

impl TokenHandler for SystemdPkcs11 {
    fn type_name(&self) -> &'static str {
        TYPE
    }

    fn validate(&self, token: &Value) -> Result<()> {
        Fields::parse(token).map(|_| ())
    }

    /// The token PIN: from `$PIN` when set, else typed.
    fn input(&self, _token: &Value) -> Input {
        if std::env::var_os("PIN").is_some() {
            Input::None
        } else {
            Input::Required("token PIN")
        }
    }

    fn open(&self, token: &Value, input: Option<&[u8]>) -> Result<SecretBytes> {
        let f = Fields::parse(token)?;
        let pin = match input {
            Some(p) => SecretBytes::from_slice(trim_line(p)),
            None => match std::env::var("PIN") {
                Ok(p) => SecretBytes::from_slice(p.as_bytes()),
                Err(_) => return Err(VolumeError::usage("a token PIN is needed")),
            },
        };
        let key = decrypt(&f.uri, &f.key, pin.as_bytes())?;
        passphrase(key.as_bytes())
    }
}

/// A line as typed: without its line end.
fn trim_line(p: &[u8]) -> &[u8] {
    let p = p.strip_suffix(b"\n").unwrap_or(p);
    p.strip_suffix(b"\r").unwrap_or(p)
}

/// The token's fields.
struct Fields {
    uri: Pkcs11Uri,
    key: Vec<u8>,
}

impl Fields {
    fn parse(token: &Value) -> Result<Fields> {
        let bad = |what: &str| VolumeError::usage(format!("systemd-pkcs11 token: {what}"));
        let uri = token["pkcs11-uri"]
            .as_str()
            .ok_or_else(|| bad("no pkcs11-uri"))?;
        let key = token["pkcs11-key"]
            .as_str()
            .ok_or_else(|| bad("no pkcs11-key"))?;
        let key = base64::engine::general_purpose::STANDARD
            .decode(key)
            .map_err(|_| bad("pkcs11-key is not base64"))?;
        if key.is_empty() {
            return Err(bad("pkcs11-key is empty"));
        }
        Ok(Fields {
            uri: Pkcs11Uri::parse(uri)?,
            key,
        })
    }
}

/// The keyslot passphrase for decrypted key `key`: its standard base64, as systemd hashes it.
pub fn passphrase(key: &[u8]) -> Result<SecretBytes> {
    let mut out = SecretBytes::zeroed(key.len().div_ceil(3) * 4);
    base64::engine::general_purpose::STANDARD
        .encode_slice(key, out.as_mut_bytes())
        .map_err(|_| VolumeError::usage("cannot encode the token key"))?;
    Ok(out)
}

/// A PKCS#11 URI (RFC 7512), the parts systemd and cryptblk match on. Hand-parsed: the
/// format is a short `;`/`&`-separated list of percent-encoded values, and no maintained
/// crate parses it without bringing a PKCS#11 stack of its own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pkcs11Uri {
    /// `token`: the token label.
    pub token: Option<String>,
    /// `manufacturer`: the token's manufacturer id.
    pub manufacturer: Option<String>,
    /// `model`: the token's model.
    pub model: Option<String>,
    /// `serial`: the token's serial number.
    pub serial: Option<String>,
    /// `slot-id`: the slot number.
    pub slot_id: Option<u64>,
    /// `object`: the object label (`CKA_LABEL`).
    pub object: Option<Vec<u8>>,
    /// `id`: the object id (`CKA_ID`).
    pub id: Option<Vec<u8>>,
    /// `type`: the object class named (`cert`, `private`, `public`...).
    pub class: Option<String>,
    /// `module-path` (query): the PKCS#11 module to load instead of p11-kit's proxy.
    pub module_path: Option<String>,
}

impl Pkcs11Uri {
    /// Parses `pkcs11:attr=value;...[?query=value&...]`; unknown attributes are ignored as
    /// RFC 7512 allows (the library's and slot's descriptions, `pin-source`...).
    pub fn parse(text: &str) -> Result<Pkcs11Uri> {
        let bad = |why: &str| VolumeError::usage(format!("Invalid PKCS#11 URI '{text}': {why}"));
        let rest = text
            .strip_prefix("pkcs11:")
            .ok_or_else(|| bad("it does not start with pkcs11:"))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut uri = Pkcs11Uri::default();
        let text_value = |v: &str| -> Result<String> {
            String::from_utf8(percent_decode(v).ok_or_else(|| bad("bad percent-encoding"))?)
                .map_err(|_| bad("a value is not UTF-8"))
        };
        for part in path.split(';').filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad("an attribute without '='"))?;
            match k {
                "token" => uri.token = Some(text_value(v)?),
                "manufacturer" => uri.manufacturer = Some(text_value(v)?),
                "model" => uri.model = Some(text_value(v)?),
                "serial" => uri.serial = Some(text_value(v)?),
                "slot-id" => {
                    uri.slot_id = Some(v.parse().map_err(|_| bad("slot-id is not a number"))?)
                }
                "object" => uri.object = Some(percent_decode(v).ok_or_else(|| bad("bad object"))?),
                "id" => uri.id = Some(percent_decode(v).ok_or_else(|| bad("bad id"))?),
                "type" => uri.class = Some(text_value(v)?),
                _ => {}
            }
        }
        for part in query.split('&').filter(|p| !p.is_empty()) {
            if let Some(("module-path", v)) = part.split_once('=') {
                uri.module_path = Some(text_value(v)?);
            }
        }
        Ok(uri)
    }

    /// Whether the token in `info` is the one the URI names.
    fn matches_token(&self, info: &cryptoki::slot::TokenInfo) -> bool {
        let eq = |want: &Option<String>, have: &str| {
            want.as_deref().is_none_or(|w| w == have.trim_end())
        };
        eq(&self.token, info.label())
            && eq(&self.manufacturer, info.manufacturer_id())
            && eq(&self.model, info.model())
            && eq(&self.serial, info.serial_number())
    }

    /// The object template: the URI's `id` and `object`, with `class`.
    fn template(&self, class: ObjectClass) -> Vec<Attribute> {
        let mut t = vec![Attribute::Class(class)];
        if let Some(id) = &self.id {
            t.push(Attribute::Id(id.clone()));
        }
        if let Some(label) = &self.object {
            t.push(Attribute::Label(label.clone()));
        }
        t
    }
}

/// `%XX` escapes decoded; None for a broken escape.
fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// Errors from the PKCS#11 layer, as one line naming what failed.
fn p11_error(what: &str, e: cryptoki::error::Error) -> VolumeError {
    VolumeError::usage(format!("PKCS#11 {what}: {e}"))
}

/// The loaded module and the one token slot the URI names.
struct Opened {
    ctx: Pkcs11,
    slot: Slot,
    label: String,
}

impl Drop for Opened {
    fn drop(&mut self) {
        // Finalize is by value; a clone of the handle shares the loaded library.
        let _ = self.ctx.clone().finalize();
    }
}

/// Loads the module, initializes it and finds the one token matching `uri`.
fn open_token(uri: &Pkcs11Uri) -> Result<Opened> {
    let ctx = match &uri.module_path {
        Some(p) => Pkcs11::new(p).map_err(|e| p11_error(&format!("module {p}"), e))?,
        None => {
            let mut last = None;
            let mut found = None;
            for m in PROXY_MODULES {
                match Pkcs11::new(m) {
                    Ok(c) => {
                        found = Some(c);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            match (found, last) {
                (Some(c), _) => c,
                (None, Some(e)) => return Err(p11_error("module p11-kit-proxy.so (p11-kit)", e)),
                (None, None) => unreachable!("PROXY_MODULES is not empty"),
            }
        }
    };
    ctx.initialize(CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK))
        .map_err(|e| p11_error("initialize", e))?;
    let mut opened = Opened {
        ctx,
        slot: Slot::try_from(0u64).map_err(|e| p11_error("slot", e))?,
        label: String::new(),
    };
    let slots = opened
        .ctx
        .get_slots_with_token()
        .map_err(|e| p11_error("list slots", e))?;
    let mut matching = Vec::new();
    for s in slots {
        if uri.slot_id.is_some_and(|id| id != s.id()) {
            continue;
        }
        let Ok(info) = opened.ctx.get_token_info(s) else {
            continue;
        };
        if uri.matches_token(&info) {
            matching.push((s, info.label().trim_end().to_string()));
        }
    }
    match matching.len() {
        1 => {
            (opened.slot, opened.label) = matching.remove(0);
            Ok(opened)
        }
        0 => Err(VolumeError::usage(
            "No PKCS#11 token matching the URI is present.",
        )),
        n => Err(VolumeError::usage(format!(
            "{n} PKCS#11 tokens match the URI; name one (token=, serial=)."
        ))),
    }
}

/// The one object of `class` the URI names in `session`.
fn find_one(session: &Session, uri: &Pkcs11Uri, class: ObjectClass) -> Result<ObjectHandle> {
    let what = if class == ObjectClass::PRIVATE_KEY {
        "private key"
    } else {
        "public key"
    };
    let found = session
        .find_objects(&uri.template(class))
        .map_err(|e| p11_error("find objects", e))?;
    match found.len() {
        1 => Ok(found[0]),
        0 => Err(VolumeError::usage(format!(
            "No {what} matching the PKCS#11 URI on the token."
        ))),
        n => Err(VolumeError::usage(format!(
            "{n} {what}s match the PKCS#11 URI; name one (id=, object=)."
        ))),
    }
}

/// Logs in with `pin` and decrypts `data` with the URI's RSA private key (PKCS#1 v1.5).
pub fn decrypt(uri: &Pkcs11Uri, data: &[u8], pin: &[u8]) -> Result<SecretBytes> {
    let t = open_token(uri)?;
    let session = t
        .ctx
        .open_ro_session(t.slot)
        .map_err(|e| p11_error("open session", e))?;
    let pin = std::str::from_utf8(pin).map_err(|_| VolumeError::usage("PIN is not UTF-8"))?;
    {
        use cryptoki::error::{Error, RvError};
        match session.login(UserType::User, Some(&AuthPin::new(pin.into()))) {
            Ok(()) | Err(Error::Pkcs11(RvError::UserAlreadyLoggedIn, _)) => {}
            // cryptsetup's systemd-pkcs11 plugin fails a wrong PIN with exit code 1.
            Err(Error::Pkcs11(
                RvError::PinIncorrect | RvError::PinInvalid | RvError::PinLenRange,
                _,
            )) => {
                return Err(VolumeError::usage(format!(
                    "PIN for token '{}' is incorrect.",
                    t.label
                )))
            }
            Err(Error::Pkcs11(RvError::PinLocked, _)) => {
                return Err(VolumeError::usage(format!(
                    "PIN of token '{}' is locked.",
                    t.label
                )))
            }
            Err(e) => return Err(p11_error("login", e)),
        }
    }
    let key = find_one(&session, uri, ObjectClass::PRIVATE_KEY)?;
    let plain = session
        .decrypt(&Mechanism::RsaPkcs, key, data)
        .map_err(|e| {
            VolumeError::new(
                ErrorClass::NoPermission,
                format!("PKCS#11 decrypt: {e} (the token's key did not encrypt this token)"),
            )
        })?;
    let _ = session.logout();
    Ok(SecretBytes::from_vec(plain))
}

/// What enrolment makes: the keyslot passphrase and the token's encrypted key.
pub struct Enrolment {
    /// The new keyslot's passphrase (base64 of the random key).
    pub passphrase: SecretBytes,
    /// The random key encrypted to the token's public key.
    pub encrypted: Vec<u8>,
}

/// A random key of half the RSA modulus' bytes, encrypted on the token with the URI's RSA
/// public key (PKCS#1 v1.5): no PIN is needed.
pub fn wrap_new_key(uri: &Pkcs11Uri) -> Result<Enrolment> {
    let t = open_token(uri)?;
    let session = t
        .ctx
        .open_ro_session(t.slot)
        .map_err(|e| p11_error("open session", e))?;
    let key = find_one(&session, uri, ObjectClass::PUBLIC_KEY).map_err(|e| {
        VolumeError::new(
            e.code,
            format!(
                "{} (cryptblk enrolls with the token's RSA public-key object)",
                e.message
            ),
        )
    })?;
    let attrs = session
        .get_attributes(key, &[AttributeType::Modulus])
        .map_err(|e| p11_error("read public key", e))?;
    let modulus = attrs
        .iter()
        .find_map(|a| match a {
            Attribute::Modulus(m) => Some(m.clone()),
            _ => None,
        })
        .ok_or_else(|| VolumeError::usage("The PKCS#11 public key is not an RSA key."))?;
    let bits = modulus.len() * 8 - modulus.first().map_or(8, |b| b.leading_zeros() as usize);
    // systemd's choice: half the modulus' bytes, well inside PKCS#1 v1.5's limit.
    let size = bits / 8 / 2;
    if size == 0 {
        return Err(VolumeError::usage("The PKCS#11 RSA key is too small."));
    }
    let raw = SecretBytes::random(size);
    let encrypted = session
        .encrypt(&Mechanism::RsaPkcs, key, raw.as_bytes())
        .map_err(|e| p11_error("encrypt", e))?;
    Ok(Enrolment {
        passphrase: passphrase(raw.as_bytes())?,
        encrypted,
    })
}

/// The token JSON systemd-cryptenroll writes for keyslot `slot`.
pub fn token_json(slot: usize, uri: &str, encrypted: &[u8]) -> Value {
    serde_json::json!({
        "type": TYPE,
        "keyslots": [slot.to_string()],
        "pkcs11-uri": uri,
        "pkcs11-key": base64::engine::general_purpose::STANDARD.encode(encrypted),
    })
}

/// `enroll --pkcs11-token-uri`: a new keyslot (parameters `params`) whose passphrase is a
/// random key wrapped to the token, and its `systemd-pkcs11` token at `id` (None: the first
/// free). Returns (keyslot, token id). The keyslot is written before the token.
pub fn enroll(
    vol: &mut crate::luks::Volume,
    device: &std::path::Path,
    vk: &SecretBytes,
    params: &cryptblk_format::luks2::KeyslotParams,
    uri: &str,
    id: Option<usize>,
) -> Result<(usize, usize)> {
    let parsed = Pkcs11Uri::parse(uri)?;
    {
        let (h, _) = super::luks2_mut(vol, device)?;
        super::place(h, id, false)?;
    }
    let e = wrap_new_key(&parsed)?;
    let (h, f) = super::luks2_mut(vol, device)?;
    let slot = h.add_keyslot(f, vk, e.passphrase.as_bytes(), params)?;
    let id = h.import_token(id, token_json(slot, uri, &e.encrypted))?;
    h.write(f)?;
    Ok((slot, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_uris() {
        let u = Pkcs11Uri::parse(
            "pkcs11:model=SoftHSM%20v2;manufacturer=SoftHSM%20project;serial=abc;token=t1;id=%01%ff;object=my%20key;type=private?module-path=/x.so",
        )
        .unwrap();
        assert_eq!(u.model.as_deref(), Some("SoftHSM v2"));
        assert_eq!(u.manufacturer.as_deref(), Some("SoftHSM project"));
        assert_eq!(u.token.as_deref(), Some("t1"));
        assert_eq!(u.id.as_deref(), Some(&[1u8, 0xff][..]));
        assert_eq!(u.object.as_deref(), Some(&b"my key"[..]));
        assert_eq!(u.class.as_deref(), Some("private"));
        assert_eq!(u.module_path.as_deref(), Some("/x.so"));
        assert!(Pkcs11Uri::parse("pkcs12:token=x").is_err());
        assert!(Pkcs11Uri::parse("pkcs11:id=%zz").is_err());
        assert!(Pkcs11Uri::parse("pkcs11:token").is_err());
    }

    #[test]
    fn passphrase_is_padded_base64() {
        assert_eq!(passphrase(&[0xff; 4]).unwrap().as_bytes(), b"/////w==");
        assert_eq!(passphrase(&[0u8; 128]).unwrap().len(), 172);
    }

    #[test]
    fn token_fields_are_checked() {
        let ok = serde_json::json!({"type": TYPE, "keyslots": ["1"],
            "pkcs11-uri": "pkcs11:token=a", "pkcs11-key": "AAEC"});
        assert!(Fields::parse(&ok).is_ok());
        let mut bad = ok.clone();
        bad["pkcs11-key"] = "!!".into();
        assert!(Fields::parse(&bad).is_err());
        let mut bad = ok;
        bad["pkcs11-uri"] = "http://x".into();
        assert!(Fields::parse(&bad).is_err());
    }
}
