//! The table line of a crypt mapping as a value: [`CryptKey`] and [`CryptConfig`]
//! (`<cipher> <key> <iv_offset> <dev> <offset> [<#opt_params> <opt_params>...]`), and the
//! split of [`CryptFlags`] into activation flags (chosen at each activation or refresh)
//! and format options (fixed by how the volume was written).

use cryptblk_cipher::SecretBytes;
use zeroize::Zeroizing;

use super::{CryptFlags, CryptParams};
use crate::targets::arg_u64;
use crate::targets::config::{counted_tail, push_counted, TargetConfig};

/// The `<key>` field of a crypt line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CryptKey {
    /// A key given inline in hex (printed as zeros unless keys are shown).
    Hex(SecretBytes),
    /// `-`: no key (the null cipher).
    None,
    /// `:<size>:<type>:<description>`: a key in the kernel keyring, printed as given (it
    /// is a reference, not key material). The crypt target itself refuses it.
    Keyring {
        /// Key size in bytes.
        size: u32,
        /// Key type (`logon`, `user`, ...).
        key_type: String,
        /// Key description.
        description: String,
    },
}

impl CryptKey {
    /// The key cryptsetup puts in a table for `cipher`: none for `cipher_null` (whose key
    /// is ignored) or an empty key, else the key in hex.
    pub fn for_cipher(cipher: &str, key: &SecretBytes) -> CryptKey {
        if cipher.contains("cipher_null") || key.is_empty() {
            CryptKey::None
        } else {
            CryptKey::Hex(key.clone())
        }
    }

    /// Parses the table field. Never echoes the text, which may be a real key with a typo.
    pub fn parse(text: &str) -> Result<CryptKey, String> {
        if text == "-" {
            return Ok(CryptKey::None);
        }
        if let Some(rest) = text.strip_prefix(':') {
            let bad = || {
                "invalid keyring key reference (expected :<size>:<type>:<description>)".to_string()
            };
            let mut parts = rest.splitn(3, ':');
            let size = parts.next().and_then(|s| s.parse::<u32>().ok());
            let key_type = parts.next().filter(|t| !t.is_empty());
            let description = parts.next().filter(|d| !d.is_empty());
            return match (size, key_type, description) {
                (Some(size), Some(t), Some(d)) => Ok(CryptKey::Keyring {
                    size,
                    key_type: t.to_string(),
                    description: d.to_string(),
                }),
                _ => Err(bad()),
            };
        }
        if text.is_empty()
            || !text.len().is_multiple_of(2)
            || !text.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(format!(
                "invalid key: expected an even number of hex digits or '-' ({} characters given)",
                text.len()
            ));
        }
        let mut key = SecretBytes::zeroed(text.len() / 2);
        hex::decode_to_slice(text, key.as_mut_bytes())
            .map_err(|_| "invalid key: not hex".to_string())?;
        Ok(CryptKey::Hex(key))
    }

    /// The table field; a hex key is masked with zeros of its length unless `show_keys`.
    pub fn to_text(&self, show_keys: bool) -> Zeroizing<String> {
        Zeroizing::new(match self {
            CryptKey::Hex(k) if k.is_empty() => "-".to_string(),
            // One copy of the final size, wiped with the table text it goes into.
            CryptKey::Hex(k) if show_keys => k.to_hex().as_str().to_owned(),
            // dmsetup without --showkeys prints zeros of the key's length.
            CryptKey::Hex(k) => "0".repeat(k.len() * 2),
            CryptKey::None => "-".to_string(),
            CryptKey::Keyring {
                size,
                key_type,
                description,
            } => format!(":{size}:{key_type}:{description}"),
        })
    }

    /// True for a key carried in the table itself (hex), which makes the text secret.
    pub fn is_inline(&self) -> bool {
        matches!(self, CryptKey::Hex(k) if !k.is_empty())
    }
}

/// `crypt <cipher> <key> <iv_offset> <dev> <offset> [<#opt_params> <opt_params>...]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CryptConfig {
    /// Cipher specification (`aes-xts-plain64`, `capi:xts(aes)-plain64`).
    pub cipher: String,
    /// The key.
    pub key: CryptKey,
    /// IV offset in 512-byte sectors.
    pub iv_offset: u64,
    /// The device as named in the table.
    pub device: String,
    /// Start of the encrypted data on the device, in 512-byte sectors.
    pub offset: u64,
    /// Optional parameters.
    pub flags: CryptFlags,
}

impl CryptConfig {
    /// A crypt line with default flags.
    pub fn new(cipher: &str, key: CryptKey, iv_offset: u64, device: &str, offset: u64) -> Self {
        CryptConfig {
            cipher: cipher.to_string(),
            key,
            iv_offset,
            device: device.to_string(),
            offset,
            flags: CryptFlags::default(),
        }
    }

    /// The parameters a [`super::CryptTarget`] is built from; keyring keys are refused (the
    /// target has no access to the kernel keyring).
    pub fn to_params(&self, implementation: Option<String>) -> Result<CryptParams, String> {
        let key = match &self.key {
            CryptKey::Hex(k) => k.clone(),
            CryptKey::None => SecretBytes::zeroed(0),
            CryptKey::Keyring { .. } => {
                return Err(
                    "kernel keyring keys (:<size>:<type>:<description>) are not supported; give the key as hex"
                        .into(),
                )
            }
        };
        Ok(CryptParams {
            cipher_spec: self.cipher.clone(),
            key,
            iv_offset: self.iv_offset,
            dev_spec: self.device.clone(),
            offset_sectors: self.offset,
            flags: self.flags,
            implementation,
        })
    }
}

impl From<&CryptParams> for CryptConfig {
    fn from(p: &CryptParams) -> Self {
        CryptConfig {
            cipher: p.cipher_spec.clone(),
            key: if p.key.is_empty() {
                CryptKey::None
            } else {
                CryptKey::Hex(p.key.clone())
            },
            iv_offset: p.iv_offset,
            device: p.dev_spec.clone(),
            offset: p.offset_sectors,
            flags: p.flags,
        }
    }
}

impl TargetConfig for CryptConfig {
    const TYPE: &'static str = "crypt";
    fn parse(args: &[String]) -> Result<Self, String> {
        const USAGE: &str =
            "crypt <cipher> <key> <iv_offset> <dev> <offset> [<#opt_params> <opt_params>...]";
        if args.len() < 5 {
            return Err(format!(
                "not enough arguments ({}); usage: {USAGE}",
                args.len()
            ));
        }
        let key = CryptKey::parse(&args[1])?;
        let iv_offset = arg_u64(args, 2, "iv_offset")?;
        let offset = arg_u64(args, 4, "offset")?;
        let opts = counted_tail(args, 5, "opt_params", "optional parameters")?;
        Ok(CryptConfig {
            cipher: args[0].clone(),
            key,
            iv_offset,
            device: args[3].clone(),
            offset,
            flags: CryptFlags::parse(opts)?,
        })
    }
    fn args(&self, show_keys: bool) -> Zeroizing<Vec<String>> {
        let mut out = Zeroizing::new(vec![
            self.cipher.clone(),
            std::mem::take(&mut *self.key.to_text(show_keys)),
            self.iv_offset.to_string(),
            self.device.clone(),
            self.offset.to_string(),
        ]);
        push_counted(&mut out, self.flags.format());
        out
    }
    fn devices(&self) -> Vec<&str> {
        vec![self.device.as_str()]
    }
    fn has_inline_keys(&self) -> bool {
        self.key.is_inline()
    }
}

impl CryptFlags {
    /// Only the activation flags (`allow_discards` and the four pipeline flags), which
    /// cryptsetup takes from the command line at each open and refresh; the format options
    /// (`sector_size:`, `iv_large_sectors`, `integrity:`, `integrity_key_size:`) at their
    /// defaults.
    pub fn activation_only(&self) -> CryptFlags {
        CryptFlags {
            allow_discards: self.allow_discards,
            same_cpu_crypt: self.same_cpu_crypt,
            submit_from_crypt_cpus: self.submit_from_crypt_cpus,
            no_read_workqueue: self.no_read_workqueue,
            no_write_workqueue: self.no_write_workqueue,
            high_priority: self.high_priority,
            ..CryptFlags::default()
        }
    }

    /// The activation flags named as cryptsetup names them in a LUKS2 header's persistent
    /// flags and on its command line (`allow-discards`, `same-cpu-crypt`,
    /// `submit-from-crypt-cpus`, `no-read-workqueue`, `no-write-workqueue`); other names
    /// (`no-journal`, ...) concern other layers and are skipped.
    pub fn from_persistent_flags(names: &[String]) -> CryptFlags {
        let has = |n: &str| names.iter().any(|f| f == n);
        CryptFlags {
            allow_discards: has("allow-discards"),
            same_cpu_crypt: has("same-cpu-crypt"),
            submit_from_crypt_cpus: has("submit-from-crypt-cpus"),
            no_read_workqueue: has("no-read-workqueue"),
            no_write_workqueue: has("no-write-workqueue"),
            high_priority: has("high_priority"),
            ..CryptFlags::default()
        }
    }

    /// These flags with their activation flags replaced by those of `activation`, the
    /// format options kept (a refresh never changes how sectors are encrypted).
    pub fn with_activation_of(&self, activation: &CryptFlags) -> CryptFlags {
        CryptFlags {
            sector_size: self.sector_size,
            iv_large_sectors: self.iv_large_sectors,
            integrity: self.integrity,
            integrity_key_size: self.integrity_key_size,
            ..activation.activation_only()
        }
    }
}
