//! `systemd-tpm2`: the token `systemd-cryptenroll --tpm2-device=... --tpm2-pcrs=...` writes
//! (systemd 252's format), opened and enrolled through a TPM 2.0 with Debian's tpm2-tss
//! (the `tss-esapi` crate over libtss2-esys).
//!
//! The token holds a sealed data object (`tpm2-blob`: the marshalled TPM2B_PRIVATE then
//! TPM2B_PUBLIC) whose authorization policy (`tpm2-policy-hash`) is PolicyPCR over the
//! listed PCRs of one bank, followed by PolicyAuthValue when `tpm2-pin` is true. Its parent
//! is a transient primary key under the owner hierarchy, recreated from systemd's fixed
//! template (ECC P-256 or RSA 2048 per `tpm2-primary-alg`, AES-128-CFB, restricted
//! decryption): the same template on the same TPM always gives the same key. The PIN's auth
//! value is SHA-256 of the PIN. The unsealed 32 bytes, base64-encoded (with padding), are
//! the keyslot's passphrase.
//!
//! Fields later systemd versions add (signed PCR policies `tpm2-pubkey`, a persistent SRK
//! `tpm2_srk`, salted PINs `tpm2_salt`, pcrlock policies) are refused with a clear message:
//! systemd 252, the version this was checked against, writes none of them.
//!
//! Which TPM: `--tpm2-device` (a TCTI such as `swtpm:host=127.0.0.1,port=2321`, or a device
//! path), else `SYSTEMD_TPM2_DEVICE` as systemd reads it, else `/dev/tpmrm0`.

use super::{Input, TokenHandler};
use crate::error::{ErrorClass, Result, VolumeError};
use base64::Engine;
use cryptblk_cipher::SecretBytes;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use std::str::FromStr;
use tss_esapi::attributes::{ObjectAttributesBuilder, SessionAttributesBuilder};
use tss_esapi::constants::{SessionType, Tss2ResponseCodeKind};
use tss_esapi::handles::{KeyHandle, ObjectHandle, SessionHandle};
use tss_esapi::interface_types::algorithm::{HashingAlgorithm, PublicAlgorithm};
use tss_esapi::interface_types::ecc::EccCurve;
use tss_esapi::interface_types::key_bits::RsaKeyBits;
use tss_esapi::interface_types::resource_handles::Hierarchy;
use tss_esapi::interface_types::session_handles::{AuthSession, PolicySession};
use tss_esapi::structures::{
    Auth, Digest, EccPoint, KeyedHashScheme, PcrSelectionList, PcrSelectionListBuilder, PcrSlot,
    Private, Public, PublicBuilder, PublicEccParametersBuilder, PublicKeyRsa,
    PublicKeyedHashParameters, PublicRsaParametersBuilder, RsaExponent, SensitiveData,
    SymmetricDefinition, SymmetricDefinitionObject,
};
use tss_esapi::traits::{Marshall, UnMarshall};
use tss_esapi::{Context, TctiNameConf};

/// The token type.
pub const TYPE: &str = "systemd-tpm2";

/// The environment variable systemd reads for the TPM when none is named.
pub const DEVICE_ENV: &str = "SYSTEMD_TPM2_DEVICE";

/// systemd's default TPM: the kernel's resource-managed device.
pub const DEFAULT_DEVICE: &str = "/dev/tpmrm0";

/// The `systemd-tpm2` handler, bound to a TPM (None: `SYSTEMD_TPM2_DEVICE` or the default).
pub struct SystemdTpm2 {
    /// `--tpm2-device`.
    pub device: Option<String>,
}

impl TokenHandler for SystemdTpm2 {
    fn type_name(&self) -> &'static str {
        TYPE
    }

    fn validate(&self, token: &Value) -> Result<()> {
        Fields::parse(token).map(|_| ())
    }

    fn input(&self, token: &Value) -> Input {
        if token["tpm2-pin"].as_bool() == Some(true) {
            Input::Required("TPM2 PIN")
        } else {
            Input::None
        }
    }

    fn open(&self, token: &Value, input: Option<&[u8]>) -> Result<SecretBytes> {
        Fields::check_supported(token)?;
        let f = Fields::parse(token)?;
        let pin = match (f.pin, input) {
            (true, Some(p)) => Some(p),
            (true, None) => return Err(VolumeError::usage("this token needs its TPM2 PIN")),
            (false, _) => None,
        };
        let tcti = tcti(self.device.as_deref())?;
        unseal(&tcti, &f, pin)
    }
}

/// The primary key algorithm of the token (`tpm2-primary-alg`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrimaryAlg {
    /// NIST P-256.
    Ecc,
    /// RSA 2048.
    Rsa,
}

impl PrimaryAlg {
    fn name(self) -> &'static str {
        match self {
            PrimaryAlg::Ecc => "ecc",
            PrimaryAlg::Rsa => "rsa",
        }
    }
}

/// A PCR bank systemd 252 seals against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bank {
    /// `sha1`.
    Sha1,
    /// `sha256`.
    Sha256,
}

impl Bank {
    /// The bank's name in the token and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Bank::Sha1 => "sha1",
            Bank::Sha256 => "sha256",
        }
    }

    /// Parses a bank name.
    pub fn parse(s: &str) -> Option<Bank> {
        match s.to_ascii_lowercase().as_str() {
            "sha1" => Some(Bank::Sha1),
            "sha256" => Some(Bank::Sha256),
            _ => None,
        }
    }

    fn alg(self) -> HashingAlgorithm {
        match self {
            Bank::Sha1 => HashingAlgorithm::Sha1,
            Bank::Sha256 => HashingAlgorithm::Sha256,
        }
    }
}

/// The token's fields, checked.
#[derive(Debug)]
pub struct Fields {
    /// TPM2B_PRIVATE then TPM2B_PUBLIC of the sealed object, marshalled.
    pub blob: Vec<u8>,
    /// The PCRs the policy covers, ascending.
    pub pcrs: Vec<u32>,
    /// Their bank.
    pub bank: Bank,
    /// The parent's algorithm.
    pub primary: PrimaryAlg,
    /// The policy digest the sealed object requires (None on tokens older than systemd 250).
    pub policy_hash: Option<Vec<u8>>,
    /// Whether a PIN is part of the policy.
    pub pin: bool,
}

fn bad(what: &str) -> VolumeError {
    VolumeError::usage(format!("systemd-tpm2 token: {what}"))
}

impl Fields {
    /// Refuses fields of later systemd versions that change how the secret is sealed
    /// (checked on open, not on import: cryptsetup imports such tokens too).
    pub fn check_supported(token: &Value) -> Result<()> {
        for later in [
            "tpm2-pubkey",
            "tpm2_pubkey",
            "tpm2_srk",
            "tpm2_salt",
            "tpm2_pcrlock",
        ] {
            let present = match &token[later] {
                Value::Null => false,
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if present {
                return Err(bad(&format!(
                    "field {later} (written by a systemd newer than 252) is not supported"
                )));
            }
        }
        if token["tpm2-pubkey-pcrs"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
        {
            return Err(bad(
                "signed PCR policies (tpm2-pubkey-pcrs) are not supported",
            ));
        }
        Ok(())
    }

    /// Reads and checks a token's fields as systemd 252's plugin validates them (types and
    /// encodings; the blob's structure is checked when it is used).
    pub fn parse(token: &Value) -> Result<Fields> {
        let blob = token["tpm2-blob"]
            .as_str()
            .ok_or_else(|| bad("tpm2-blob is missing or not a string"))?;
        let blob = base64::engine::general_purpose::STANDARD
            .decode(blob)
            .map_err(|_| bad("tpm2-blob is not base64"))?;
        let mut pcrs = Vec::new();
        for p in token["tpm2-pcrs"]
            .as_array()
            .ok_or_else(|| bad("tpm2-pcrs is missing or not an array"))?
        {
            match p.as_u64() {
                Some(n) if n < 24 => pcrs.push(n as u32),
                _ => return Err(bad("tpm2-pcrs holds something that is not a PCR (0..23)")),
            }
        }
        pcrs.sort_unstable();
        pcrs.dedup();
        // systemd before 249 wrote no bank and used sha256.
        let bank = match &token["tpm2-pcr-bank"] {
            Value::Null => Bank::Sha256,
            Value::String(s) => {
                Bank::parse(s).ok_or_else(|| bad(&format!("PCR bank {s} is not supported")))?
            }
            _ => return Err(bad("tpm2-pcr-bank is not a string")),
        };
        // systemd before 250 wrote no primary algorithm and used ECC.
        let primary = match token["tpm2-primary-alg"].as_str() {
            None => PrimaryAlg::Ecc,
            Some("ecc") => PrimaryAlg::Ecc,
            Some("rsa") => PrimaryAlg::Rsa,
            Some(o) => return Err(bad(&format!("primary algorithm {o} is not supported"))),
        };
        let policy_hash = match &token["tpm2-policy-hash"] {
            Value::Null => None,
            Value::String(s) => {
                Some(hex::decode(s).map_err(|_| bad("tpm2-policy-hash is not hex"))?)
            }
            _ => return Err(bad("tpm2-policy-hash is not a string")),
        };
        let pin = match &token["tpm2-pin"] {
            Value::Null => false,
            Value::Bool(b) => *b,
            _ => return Err(bad("tpm2-pin is not a boolean")),
        };
        Ok(Fields {
            blob,
            pcrs,
            bank,
            primary,
            policy_hash,
            pin,
        })
    }
}

/// The blob's two halves: TPM2B_PRIVATE's buffer and TPM2B_PUBLIC's TPMT_PUBLIC.
fn split_blob(blob: &[u8]) -> Result<(&[u8], &[u8])> {
    let truncated = || bad("tpm2-blob is truncated");
    let take = |b: &[u8]| -> Result<(usize, usize)> {
        let n = u16::from_be_bytes([
            *b.first().ok_or_else(truncated)?,
            *b.get(1).ok_or_else(truncated)?,
        ]);
        let n = n as usize;
        if b.len() < 2 + n {
            return Err(truncated());
        }
        Ok((2, 2 + n))
    };
    let (a, b) = take(blob)?;
    let private = &blob[a..b];
    let rest = &blob[b..];
    let (c, d) = take(rest)?;
    if d != rest.len() {
        return Err(bad("tpm2-blob has trailing bytes"));
    }
    Ok((private, &rest[c..d]))
}

/// The TCTI for `device` as systemd reads its `--tpm2-device=`: `driver:config` is a TCTI, a
/// path is a character device; none (or `auto`) means `SYSTEMD_TPM2_DEVICE`, else
/// [`DEFAULT_DEVICE`].
pub fn tcti(device: Option<&str>) -> Result<String> {
    let from_env;
    let d = match device {
        Some(d) if d != "auto" => d,
        _ => {
            from_env = std::env::var(DEVICE_ENV).ok().filter(|s| !s.is_empty());
            from_env.as_deref().unwrap_or(DEFAULT_DEVICE)
        }
    };
    let conf = if d.starts_with('/') {
        format!("device:{d}")
    } else {
        d.to_string()
    };
    TctiNameConf::from_str(&conf)
        .map_err(|_| VolumeError::usage(format!("TPM2 device {d}: not a device path or TCTI")))?;
    Ok(conf)
}

fn tpm_err(what: &str, e: tss_esapi::Error) -> VolumeError {
    VolumeError::usage(format!("TPM2 {what} failed: {e}"))
}

fn connect(tcti: &str) -> Result<Context> {
    super::tss2_load::load()?;
    let conf = TctiNameConf::from_str(tcti)
        .map_err(|_| VolumeError::usage(format!("TPM2 device {tcti}: not a TCTI")))?;
    Context::new(conf)
        .map_err(|e| VolumeError::usage(format!("cannot reach the TPM2 at {tcti}: {e}")))
}

/// systemd's transient primary key template (its "legacy" SRK template, unchanged since
/// systemd 248): restricted decryption key, SHA-256 names, AES-128-CFB, empty unique.
fn primary_template(alg: PrimaryAlg) -> std::result::Result<Public, tss_esapi::Error> {
    let attrs = ObjectAttributesBuilder::new()
        .with_restricted(true)
        .with_decrypt(true)
        .with_fixed_tpm(true)
        .with_fixed_parent(true)
        .with_sensitive_data_origin(true)
        .with_user_with_auth(true)
        .build()?;
    let b = PublicBuilder::new()
        .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
        .with_object_attributes(attrs);
    match alg {
        PrimaryAlg::Ecc => b
            .with_public_algorithm(PublicAlgorithm::Ecc)
            .with_ecc_parameters(
                PublicEccParametersBuilder::new_restricted_decryption_key(
                    SymmetricDefinitionObject::AES_128_CFB,
                    EccCurve::NistP256,
                )
                .build()?,
            )
            .with_ecc_unique_identifier(EccPoint::default())
            .build(),
        PrimaryAlg::Rsa => b
            .with_public_algorithm(PublicAlgorithm::Rsa)
            .with_rsa_parameters(
                PublicRsaParametersBuilder::new_restricted_decryption_key(
                    SymmetricDefinitionObject::AES_128_CFB,
                    RsaKeyBits::Rsa2048,
                    RsaExponent::default(),
                )
                .build()?,
            )
            .with_rsa_unique_identifier(PublicKeyRsa::default())
            .build(),
    }
}

/// Handles to flush when a TPM conversation ends, whatever its outcome: without a resource
/// manager (swtpm's socket, `/dev/tpm0`) transient objects and sessions outlive the
/// connection and the TPM has room for three.
struct Flush<'a> {
    ctx: &'a mut Context,
    handles: Vec<ObjectHandle>,
}

impl Drop for Flush<'_> {
    fn drop(&mut self) {
        for h in self.handles.drain(..).rev() {
            let _ = self.ctx.execute_without_session(|c| c.flush_context(h));
        }
    }
}

impl Flush<'_> {
    fn primary(&mut self, alg: PrimaryAlg) -> Result<KeyHandle> {
        let template = primary_template(alg).map_err(|e| tpm_err("primary key template", e))?;
        let key = self
            .ctx
            .execute_with_session(Some(AuthSession::Password), |c| {
                c.create_primary(Hierarchy::Owner, template, None, None, None, None)
            })
            .map_err(|e| tpm_err("creating the primary key", e))?
            .key_handle;
        self.handles.push(key.into());
        Ok(key)
    }

    /// A session salted with the primary key: `encrypt`/`decrypt` protect the secret on its
    /// way to and from the TPM (a bus or socket between them sees only ciphertext).
    fn session(&mut self, salt: KeyHandle, kind: SessionType) -> Result<AuthSession> {
        let s = self
            .ctx
            .execute_without_session(|c| {
                c.start_auth_session(
                    Some(salt),
                    None,
                    None,
                    kind,
                    SymmetricDefinition::AES_128_CFB,
                    HashingAlgorithm::Sha256,
                )
            })
            .map_err(|e| tpm_err("starting a session", e))?
            .ok_or_else(|| VolumeError::usage("TPM2 returned no session"))?;
        self.handles
            .push(ObjectHandle::from(SessionHandle::from(s)));
        let (attrs, mask) = SessionAttributesBuilder::new()
            .with_continue_session(true)
            .with_decrypt(kind == SessionType::Hmac)
            .with_encrypt(kind == SessionType::Hmac)
            .build();
        self.ctx
            .tr_sess_set_attributes(s, attrs, mask)
            .map_err(|e| tpm_err("setting session attributes", e))?;
        Ok(s)
    }

    /// PolicyPCR (current values of `pcrs`) and, with a PIN, PolicyAuthValue, in the order
    /// systemd asserts them; returns the session's digest.
    fn policy(
        &mut self,
        session: AuthSession,
        bank: Bank,
        pcrs: &[u32],
        pin: bool,
    ) -> Result<Digest> {
        let ps = PolicySession::try_from(session).map_err(|e| tpm_err("policy session", e))?;
        let sel = selection(bank, pcrs)?;
        self.ctx
            .execute_without_session(|c| {
                c.policy_pcr(ps, Digest::default(), sel)?;
                if pin {
                    c.policy_auth_value(ps)?;
                }
                c.policy_get_digest(ps)
            })
            .map_err(|e| tpm_err("policy", e))
    }
}

fn selection(bank: Bank, pcrs: &[u32]) -> Result<PcrSelectionList> {
    let slots = pcrs
        .iter()
        .map(|&p| PcrSlot::try_from(1u32 << p))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| tpm_err("PCR selection", e))?;
    PcrSelectionListBuilder::new()
        .with_selection(bank.alg(), &slots)
        .build()
        .map_err(|e| tpm_err("PCR selection", e))
}

fn pcr_list(pcrs: &[u32]) -> String {
    pcrs.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join("+")
}

/// The auth value for `pin`: SHA-256 of the PIN as typed (systemd 252 hashes it unsalted).
fn pin_auth(pin: &[u8]) -> Result<Auth> {
    let mut h = Sha256::digest(pin);
    let auth = Auth::try_from(h.to_vec()).map_err(|e| tpm_err("PIN auth value", e));
    zeroize::Zeroize::zeroize(h.as_mut_slice());
    auth
}

/// The passphrase the sealed secret stands for: its standard base64 (with padding), as
/// systemd hands it to libcryptsetup.
fn passphrase(secret: &[u8]) -> Result<SecretBytes> {
    let mut out = SecretBytes::zeroed(secret.len().div_ceil(3) * 4);
    base64::engine::general_purpose::STANDARD
        .encode_slice(secret, out.as_mut_bytes())
        .map_err(|_| VolumeError::usage("cannot encode the unsealed secret"))?;
    Ok(out)
}

/// Unseals the token's secret on the TPM at `tcti` and returns the keyslot passphrase. A
/// PCR state other than the one sealed against is refused before the unseal is attempted
/// (the policy digest differs), with exit code 2 as cryptsetup gives for a token that cannot
/// unlock.
pub fn unseal(tcti: &str, f: &Fields, pin: Option<&[u8]>) -> Result<SecretBytes> {
    let (private, public) = split_blob(&f.blob)?;
    let secret = unseal_object(
        tcti,
        &SealedObject {
            primary: f.primary,
            private,
            public,
            pcrs: Some((f.bank, &f.pcrs)),
            pin,
            policy_hash: f.policy_hash.as_deref(),
        },
    )?;
    passphrase(secret.as_bytes())
}

/// A sealed data object and what authorizes its unseal.
pub struct SealedObject<'a> {
    /// Its parent: the transient primary of this algorithm from systemd's template (which
    /// is also tpm2-tools' default for `-G ecc|rsa -g sha256`, as clevis creates it).
    pub primary: PrimaryAlg,
    /// The TPM2B_PRIVATE's buffer.
    pub private: &'a [u8],
    /// The marshalled TPMT_PUBLIC.
    pub public: &'a [u8],
    /// PolicyPCR over these PCRs (None: no PCR policy).
    pub pcrs: Option<(Bank, &'a [u32])>,
    /// PolicyAuthValue with SHA-256 of this PIN (None: no PIN). With neither `pcrs` nor
    /// `pin`, the object is authorized by its (empty) auth value.
    pub pin: Option<&'a [u8]>,
    /// The policy digest expected (checked before the unseal, to name a PCR change).
    pub policy_hash: Option<&'a [u8]>,
}

/// Unseals `o` on the TPM at `tcti`: the sealed bytes, in locked memory.
pub fn unseal_object(tcti: &str, o: &SealedObject) -> Result<SecretBytes> {
    let private = Private::try_from(o.private.to_vec()).map_err(|e| tpm_err("sealed object", e))?;
    super::tss2_load::load()?;
    let public = Public::unmarshall(o.public).map_err(|e| tpm_err("sealed object", e))?;
    // Without a recorded policy hash (clevis, systemd before 250) the object's own policy is
    // what the session must reach.
    let want = o
        .policy_hash
        .map(<[u8]>::to_vec)
        .unwrap_or_else(|| public.auth_policy().value().to_vec());
    let mut ctx = connect(tcti)?;
    let mut fl = Flush {
        ctx: &mut ctx,
        handles: Vec::new(),
    };
    let primary = fl.primary(o.primary)?;
    let enc = fl.session(primary, SessionType::Hmac)?;
    let auth_session = if o.pcrs.is_some() || o.pin.is_some() {
        let policy = fl.session(primary, SessionType::Policy)?;
        let (bank, pcrs) = o.pcrs.unwrap_or((Bank::Sha256, &[][..]));
        let digest = fl.policy(policy, bank, pcrs, o.pin.is_some())?;
        if digest.value() != want.as_slice() {
            return Err(VolumeError::new(
                ErrorClass::NoPermission,
                format!(
                    "the TPM's PCR values ({}: {}) differ from those the token was sealed \
                     against: the system state changed since enrollment",
                    bank.name(),
                    pcr_list(pcrs)
                ),
            ));
        }
        policy
    } else {
        AuthSession::Password
    };
    let obj = fl
        .ctx
        .execute_with_sessions((Some(AuthSession::Password), Some(enc), None), |c| {
            c.load(primary, private, public)
        })
        .map_err(|e| tpm_err("loading the sealed object", e))?;
    fl.handles.push(obj.into());
    if let Some(pin) = o.pin {
        let auth = pin_auth(pin)?;
        fl.ctx
            .tr_set_auth(obj.into(), auth)
            .map_err(|e| tpm_err("PIN", e))?;
    }
    let secret: SensitiveData = fl
        .ctx
        .execute_with_sessions((Some(auth_session), Some(enc), None), |c| {
            c.unseal(obj.into())
        })
        .map_err(|e| match e {
            tss_esapi::Error::Tss2Error(rc) => match rc.kind() {
                Some(Tss2ResponseCodeKind::AuthFail | Tss2ResponseCodeKind::BadAuth) => {
                    VolumeError::new(ErrorClass::NoPermission, "wrong TPM2 PIN")
                }
                Some(Tss2ResponseCodeKind::Lockout) => VolumeError::new(
                    ErrorClass::NoPermission,
                    "the TPM2 is in dictionary-attack lockout",
                ),
                Some(Tss2ResponseCodeKind::PolicyFail | Tss2ResponseCodeKind::PolicyCc) => {
                    VolumeError::new(
                        ErrorClass::NoPermission,
                        "the TPM refused the sealed object's policy: its PCR values differ \
                         from those sealed against",
                    )
                }
                _ => tpm_err("unseal", e),
            },
            _ => tpm_err("unseal", e),
        })?;
    Ok(SecretBytes::from_slice(secret.value()))
}

/// A freshly sealed secret: the token fields and the keyslot passphrase.
pub struct Sealed {
    /// `tpm2-blob`, decoded.
    pub blob: Vec<u8>,
    /// `tpm2-policy-hash`, decoded.
    pub policy_hash: Vec<u8>,
    /// The primary key algorithm used.
    pub primary: PrimaryAlg,
    /// The keyslot passphrase (base64 of the sealed secret).
    pub passphrase: SecretBytes,
}

impl Sealed {
    /// The token JSON systemd 252 writes, in its field order, for `slot`.
    pub fn token(&self, slot: usize, bank: Bank, pcrs: &[u32], pin: bool) -> Value {
        serde_json::json!({
            "type": TYPE,
            "keyslots": [slot.to_string()],
            "tpm2-blob": base64::engine::general_purpose::STANDARD.encode(&self.blob),
            "tpm2-pcrs": pcrs,
            "tpm2-pcr-bank": bank.name(),
            "tpm2-primary-alg": self.primary.name(),
            "tpm2-policy-hash": hex::encode(&self.policy_hash),
            "tpm2-pin": pin,
        })
    }
}

/// Seals 32 fresh random bytes on the TPM at `tcti` to the current values of `pcrs` in
/// `bank` (and to `pin`), as `systemd-cryptenroll --tpm2-device` does: an ECC primary key
/// (RSA when the TPM has no ECC), a keyed-hash data object with only `fixedTPM` and
/// `fixedParent` set (so nothing but the policy authorizes it), name algorithm SHA-256.
pub fn seal(tcti: &str, bank: Bank, pcrs: &[u32], pin: Option<&[u8]>) -> Result<Sealed> {
    let mut ctx = connect(tcti)?;
    let mut fl = Flush {
        ctx: &mut ctx,
        handles: Vec::new(),
    };
    let (primary, alg) = match fl.primary(PrimaryAlg::Ecc) {
        Ok(k) => (k, PrimaryAlg::Ecc),
        Err(_) => (fl.primary(PrimaryAlg::Rsa)?, PrimaryAlg::Rsa),
    };
    let trial = fl.session(primary, SessionType::Trial)?;
    let policy = fl.policy(trial, bank, pcrs, pin.is_some())?;
    let enc = fl.session(primary, SessionType::Hmac)?;
    let attrs = ObjectAttributesBuilder::new()
        .with_fixed_tpm(true)
        .with_fixed_parent(true)
        .build()
        .map_err(|e| tpm_err("sealed object attributes", e))?;
    let template = PublicBuilder::new()
        .with_public_algorithm(PublicAlgorithm::KeyedHash)
        .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
        .with_object_attributes(attrs)
        .with_auth_policy(policy.clone())
        .with_keyed_hash_parameters(PublicKeyedHashParameters::new(KeyedHashScheme::Null))
        .with_keyed_hash_unique_identifier(Digest::default())
        .build()
        .map_err(|e| tpm_err("sealed object template", e))?;
    // The host's RNG, as for every other key cryptblk makes; the TPM only stores it.
    let secret = SecretBytes::random(32);
    let data = SensitiveData::try_from(secret.as_bytes().to_vec())
        .map_err(|e| tpm_err("sealed data", e))?;
    let auth = pin.map(pin_auth).transpose()?;
    let created = fl
        .ctx
        .execute_with_sessions((Some(AuthSession::Password), Some(enc), None), |c| {
            c.create(primary, template, auth, Some(data), None, None)
        })
        .map_err(|e| tpm_err("sealing", e))?;
    let mut blob = Vec::new();
    let private = created.out_private.value();
    blob.extend_from_slice(&(private.len() as u16).to_be_bytes());
    blob.extend_from_slice(private);
    let public = created
        .out_public
        .marshall()
        .map_err(|e| tpm_err("marshalling the sealed object", e))?;
    blob.extend_from_slice(&(public.len() as u16).to_be_bytes());
    blob.extend_from_slice(&public);
    Ok(Sealed {
        blob,
        policy_hash: policy.value().to_vec(),
        primary: alg,
        passphrase: passphrase(secret.as_bytes())?,
    })
}

/// `enroll --tpm2-device`: seals a new secret on the TPM at `tcti` ([`seal`]), adds a keyslot
/// (parameters `params`) whose passphrase is that secret in base64, and a `systemd-tpm2`
/// token at `id` (None: the first free) naming it. Returns (keyslot, token id). As
/// `systemd-cryptenroll` does, the keyslot is written before the token: a crash between
/// leaves an extra keyslot nothing opens, never a token naming a missing keyslot.
#[allow(clippy::too_many_arguments)]
pub fn enroll(
    vol: &mut crate::luks::Volume,
    device: &std::path::Path,
    vk: &SecretBytes,
    params: &cryptblk_format::luks2::KeyslotParams,
    tcti: &str,
    bank: Bank,
    pcrs: &[u32],
    pin: Option<&[u8]>,
    id: Option<usize>,
) -> Result<(usize, usize)> {
    {
        let (h, _) = super::luks2_mut(vol, device)?;
        super::place(h, id, false)?;
    }
    let sealed = seal(tcti, bank, pcrs, pin)?;
    let (h, f) = super::luks2_mut(vol, device)?;
    let slot = h.add_keyslot(f, vk, sealed.passphrase.as_bytes(), params)?;
    let id = h.import_token(id, sealed.token(slot, bank, pcrs, pin.is_some()))?;
    h.write(f)?;
    Ok((slot, id))
}

/// Parses `--tpm2-pcrs` as systemd does: PCR numbers separated by `+` or `,` (empty: none).
pub fn parse_pcrs(s: &str) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.split(['+', ',']).filter(|p| !p.is_empty()) {
        match part.trim().parse::<u32>() {
            Ok(n) if n < 24 => out.push(n),
            _ => {
                return Err(VolumeError::usage(format!(
                    "Failed to parse PCR number: {part}"
                )))
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // From a token systemd-cryptenroll 252 wrote against swtpm (--tpm2-pcrs=7).
    const TOKEN: &str = r#"{"type":"systemd-tpm2","keyslots":["1"],"tpm2-blob":"AJ4AIN6Ll3GdN2zGN0CWjwJNnvdzPxB5plVgH3DKaRC4Jax8ABBQrcxHLrFCl/fdqMrG592p1VoDx8CO6rGnRDBFO6xaVTjDUuQWRC3jD5hH6/SuEe39bYzPwxs8SGWT+Ua48+1tzCtDnRt119Djy0gPdCWOD2b9cKz+wlk7NKCfRcAP18VXCISkmUcbrxNasIjdVu4mTkb+jq7c7rVJRwBOAAgACwAAABIAIFGm9Kg+Ffcvd/DORPpx9apRTF7dWtNt5SODnXuo5wzsABAAILQpaM7Hh2/ZezWBVeu8QyitQa2HDSV4UOe4jxkI7Nru","tpm2-pcrs":[7],"tpm2-pcr-bank":"sha256","tpm2-primary-alg":"ecc","tpm2-policy-hash":"51a6f4a83e15f72f77f0ce44fa71f5aa514c5edd5ad36de523839d7ba8e70cec","tpm2-pin":false}"#;

    #[test]
    fn parses_systemd_252_token() {
        let t: Value = serde_json::from_str(TOKEN).unwrap();
        let f = Fields::parse(&t).unwrap();
        assert_eq!(f.pcrs, [7]);
        assert_eq!(f.bank, Bank::Sha256);
        assert_eq!(f.primary, PrimaryAlg::Ecc);
        assert!(!f.pin);
        let (private, public) = split_blob(&f.blob).unwrap();
        assert_eq!(private.len(), 0x9e);
        crate::token::tss2_load::load().unwrap();
        let p = Public::unmarshall(public).unwrap();
        // The sealed object's policy is the token's policy hash.
        assert_eq!(p.auth_policy().value(), f.policy_hash.as_deref().unwrap());
        // What cryptblk would write for it is the same JSON, field for field.
        let sealed = Sealed {
            blob: f.blob.clone(),
            policy_hash: f.policy_hash.clone().unwrap(),
            primary: f.primary,
            passphrase: SecretBytes::zeroed(0),
        };
        assert_eq!(sealed.token(1, f.bank, &f.pcrs, f.pin), t);
        assert_eq!(
            serde_json::to_string(&sealed.token(1, f.bank, &f.pcrs, f.pin)).unwrap(),
            TOKEN
        );
    }

    #[test]
    fn refuses_what_it_cannot_open() {
        let t: Value = serde_json::from_str(TOKEN).unwrap();
        let with = |k: &str, v: Value| {
            let mut t = t.clone();
            t[k] = v;
            Fields::parse(&t).unwrap_err().message
        };
        let mut newer = t.clone();
        newer["tpm2_srk"] = "AAAA".into();
        assert!(Fields::check_supported(&newer)
            .unwrap_err()
            .message
            .contains("newer"));
        assert!(Fields::check_supported(&t).is_ok());
        assert!(with("tpm2-pcr-bank", "md5".into()).contains("bank"));
        assert!(with("tpm2-blob", "not base64!".into()).contains("base64"));
        let mut short = t.clone();
        short["tpm2-blob"] = "AJ4AIP/x".into();
        let f = Fields::parse(&short).unwrap();
        assert!(split_blob(&f.blob)
            .unwrap_err()
            .message
            .contains("truncated"));
        assert!(with("tpm2-pcrs", serde_json::json!([24])).contains("PCR"));
        assert!(with("tpm2-pin", "yes".into()).contains("boolean"));
    }

    #[test]
    fn pcrs_and_devices() {
        assert_eq!(parse_pcrs("7").unwrap(), [7]);
        assert_eq!(parse_pcrs("7+0,4").unwrap(), [0, 4, 7]);
        assert!(parse_pcrs("24").is_err());
        assert!(parse_pcrs("x").is_err());
        assert_eq!(
            tcti(Some("swtpm:host=127.0.0.1,port=2321")).unwrap(),
            "swtpm:host=127.0.0.1,port=2321"
        );
        assert_eq!(tcti(Some("/dev/tpm0")).unwrap(), "device:/dev/tpm0");
        assert!(tcti(Some("nonsense")).is_err());
    }

    #[test]
    fn passphrase_is_padded_base64() {
        let p = passphrase(&[0xff; 32]).unwrap();
        assert_eq!(p.len(), 44);
        assert!(p.as_bytes().ends_with(b"="));
    }
}
