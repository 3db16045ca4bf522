//! The device configurations compared: dm tables over one RAM disk, as in the reference's
//! `dmsetup` experiments (plain `linear`, `crypt` with the null cipher, `aes-xts-plain64` with
//! each performance flag on its own and the inline flags together).

use cryptblk_cipher::SecretBytes;
use cryptblk_dm::{CryptConfig, CryptFlags, CryptKey, LinearConfig, TableSpec};
use serde::Serialize;
use zeroize::Zeroizing;

use crate::BenchError;

/// The cipher of the null-cipher configurations (`memcpy` "encryption", key `-`).
pub const NULL_CIPHER: &str = "capi:ecb(cipher_null)";
/// The cipher cryptsetup picks by default (and the reference uses).
pub const XTS_CIPHER: &str = "aes-xts-plain64";
/// Key length of the XTS configurations: 512 bits (two AES-256 keys).
pub const XTS_KEY_BYTES: usize = 64;

/// Encryption sector size of the crypt configurations: what a default LUKS2 volume on an
/// image file or 4K device uses (`luksFormat` chooses 4096 there, as cryptsetup 2.6 does).
pub const DEFAULT_SECTOR_SIZE: u32 = 4096;

/// The flags that bypass both dm-crypt queues (the mainline form of Cloudflare's
/// `force_inline`).
pub const INLINE_FLAGS: [&str; 2] = ["no_read_workqueue", "no_write_workqueue"];

/// What a configuration's table maps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "target", rename_all = "snake_case")]
pub enum ConfigKind {
    /// `linear`: the RAM disk as is (the reference's `/dev/ram0`).
    Linear,
    /// `crypt` with a cipher, a random key of `key_bytes` (0: the key `-`) and optional flags.
    Crypt {
        /// dm-crypt cipher specification.
        cipher: String,
        /// Key length in bytes; 0 writes the key as `-` (null cipher).
        key_bytes: usize,
        /// Optional parameters (`same_cpu_crypt`, `no_read_workqueue`, ...).
        flags: Vec<String>,
        /// Encryption sector size in bytes (`sector_size:` in the table when not 512).
        sector_size: u32,
    },
}

/// One named device configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Configuration {
    /// Short name used in filters, tables and charts.
    pub name: String,
    /// One line saying what it is.
    pub description: String,
    /// The table's target.
    #[serde(flatten)]
    pub kind: ConfigKind,
}

impl Configuration {
    fn crypt(
        name: &str,
        description: &str,
        cipher: &str,
        key_bytes: usize,
        flags: &[&str],
    ) -> Self {
        Configuration {
            name: name.into(),
            description: description.into(),
            kind: ConfigKind::Crypt {
                cipher: cipher.into(),
                key_bytes,
                flags: flags.iter().map(|f| f.to_string()).collect(),
                sector_size: DEFAULT_SECTOR_SIZE,
            },
        }
    }

    /// Every built-in configuration, default set first.
    pub fn builtin() -> Vec<Configuration> {
        let mut all = Self::default_set();
        all.push(Self::crypt(
            "null-inline",
            "crypt, null cipher, both inline flags (the force_inline thread's third device)",
            NULL_CIPHER,
            0,
            &INLINE_FLAGS,
        ));
        all
    }

    /// The configurations run when no `--config` filter is given: the reference's sequence.
    pub fn default_set() -> Vec<Configuration> {
        vec![
            Configuration {
                name: "plain".into(),
                description: "linear over the RAM disk, no encryption".into(),
                kind: ConfigKind::Linear,
            },
            Self::crypt(
                "null",
                "crypt, null cipher (memcpy), default queued pipeline",
                NULL_CIPHER,
                0,
                &[],
            ),
            Self::crypt(
                "xts",
                "crypt aes-xts-plain64, 512-bit key, default queued pipeline",
                XTS_CIPHER,
                XTS_KEY_BYTES,
                &[],
            ),
            Self::crypt(
                "xts-same-cpu",
                "aes-xts-plain64 with same_cpu_crypt",
                XTS_CIPHER,
                XTS_KEY_BYTES,
                &["same_cpu_crypt"],
            ),
            Self::crypt(
                "xts-submit-crypt-cpus",
                "aes-xts-plain64 with submit_from_crypt_cpus",
                XTS_CIPHER,
                XTS_KEY_BYTES,
                &["submit_from_crypt_cpus"],
            ),
            Self::crypt(
                "xts-inline-read",
                "aes-xts-plain64 with no_read_workqueue (reads inline)",
                XTS_CIPHER,
                XTS_KEY_BYTES,
                &["no_read_workqueue"],
            ),
            Self::crypt(
                "xts-inline-write",
                "aes-xts-plain64 with no_write_workqueue (writes inline)",
                XTS_CIPHER,
                XTS_KEY_BYTES,
                &["no_write_workqueue"],
            ),
            Self::crypt(
                "xts-inline",
                "aes-xts-plain64 with no_read_workqueue and no_write_workqueue",
                XTS_CIPHER,
                XTS_KEY_BYTES,
                &INLINE_FLAGS,
            ),
        ]
    }

    /// The cipher specification, for crypt configurations.
    pub fn cipher(&self) -> Option<&str> {
        match &self.kind {
            ConfigKind::Crypt { cipher, .. } => Some(cipher),
            ConfigKind::Linear => None,
        }
    }

    /// A fresh random key for this configuration (`None` for `linear` and the null cipher).
    pub fn generate_key(&self) -> Option<SecretBytes> {
        match &self.kind {
            ConfigKind::Crypt { key_bytes, .. } if *key_bytes > 0 => {
                Some(SecretBytes::random(*key_bytes))
            }
            _ => None,
        }
    }

    /// The same configuration with the crypt flags replaced (the live flip's other side).
    pub fn with_flags(&self, name: &str, new_flags: &[&str]) -> Configuration {
        let mut c = self.clone();
        c.name = name.into();
        if let ConfigKind::Crypt { flags, .. } = &mut c.kind {
            *flags = new_flags.iter().map(|f| f.to_string()).collect();
        }
        c
    }

    /// The dm table (one line covering `size` bytes of `device`) as dm's typed config, with
    /// `key` for a crypt line (`-` when there is none or the cipher takes none). Unknown
    /// crypt flags are an error here, before anything is loaded.
    pub fn table_spec(
        &self,
        device: &str,
        size: u64,
        key: Option<&SecretBytes>,
    ) -> Result<TableSpec, BenchError> {
        let sectors = size / 512;
        Ok(match &self.kind {
            ConfigKind::Linear => TableSpec::single(
                sectors,
                LinearConfig {
                    device: device.to_string(),
                    offset: 0,
                },
            ),
            ConfigKind::Crypt {
                cipher,
                key_bytes,
                flags,
                sector_size,
            } => {
                let key = match key {
                    Some(k) if *key_bytes > 0 && !k.is_empty() => CryptKey::Hex(k.clone()),
                    _ => CryptKey::None,
                };
                let mut line = CryptConfig::new(cipher, key, 0, device, 0);
                line.flags = CryptFlags::parse(flags)
                    .map_err(|e| BenchError::Dm(format!("{}: crypt flags: {e}", self.name)))?;
                line.flags.sector_size = *sector_size;
                TableSpec::single(sectors, line)
            }
        })
    }

    /// The dm table text with the real key: what is loaded. It lives in a [`Zeroizing`]
    /// buffer because it contains the key.
    pub fn table(
        &self,
        device: &str,
        size: u64,
        key: Option<&SecretBytes>,
    ) -> Result<Zeroizing<String>, BenchError> {
        let mut text = self.table_spec(device, size, key)?.to_text(true);
        // One line, printed with its '\n'; dropped in place so no unwiped copy is made.
        let len = text.trim_end().len();
        text.truncate(len);
        Ok(text)
    }

    /// The dm table as `dmsetup table` prints it without `--showkeys`: the key as zeros.
    pub fn masked_table(&self, device: &str, size: u64) -> Result<String, BenchError> {
        // A zero key of the configuration's length prints as the masked key would.
        let key = match &self.kind {
            ConfigKind::Crypt { key_bytes, .. } => Some(SecretBytes::zeroed(*key_bytes)),
            ConfigKind::Linear => None,
        };
        let text = self.table_spec(device, size, key.as_ref())?.to_text(false);
        Ok(text.trim_end().to_string())
    }
}

/// Keeps the configurations whose name matches one of `filters` (exact name, or a prefix
/// ending in `*`); all of `candidates` when `filters` is empty. Unknown names are an error.
pub fn select<T: Clone>(
    what: &str,
    candidates: &[T],
    name_of: impl Fn(&T) -> &str,
    filters: &[String],
) -> Result<Vec<T>, BenchError> {
    if filters.is_empty() {
        return Ok(candidates.to_vec());
    }
    let mut out: Vec<T> = Vec::new();
    for f in filters {
        let matches: Vec<&T> = candidates
            .iter()
            .filter(|c| match f.strip_suffix('*') {
                Some(prefix) => name_of(c).starts_with(prefix),
                None => name_of(c) == f,
            })
            .collect();
        if matches.is_empty() {
            let known: Vec<&str> = candidates.iter().map(&name_of).collect();
            return Err(BenchError::UnknownName {
                what: what.into(),
                name: f.clone(),
                known: known.join(", "),
            });
        }
        for m in matches {
            if !out.iter().any(|o| name_of(o) == name_of(m)) {
                out.push(m.clone());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_in_dmsetup_syntax() {
        let all = Configuration::builtin();
        let plain = &all[0];
        assert_eq!(
            plain.masked_table("ram0", 1 << 30).unwrap(),
            "0 2097152 linear ram0 0"
        );
        let null = all.iter().find(|c| c.name == "null").unwrap();
        assert!(null.generate_key().is_none());
        let t = null.table("ram0", 1 << 20, None).unwrap();
        assert_eq!(
            t.as_str(),
            "0 2048 crypt capi:ecb(cipher_null) - 0 ram0 0 1 sector_size:4096"
        );
        let inline = all.iter().find(|c| c.name == "xts-inline").unwrap();
        let key = inline.generate_key().unwrap();
        assert_eq!(key.len(), 64);
        let text = inline.table("ram0", 1 << 20, Some(&key)).unwrap();
        assert_eq!(
            *text,
            format!(
                "0 2048 crypt aes-xts-plain64 {} 0 ram0 0 3 no_read_workqueue no_write_workqueue \
                 sector_size:4096",
                key.to_hex().as_str()
            )
        );
        let masked = inline.masked_table("ram0", 1 << 20).unwrap();
        assert!(masked.contains(&"0".repeat(128)));
        assert!(!masked.contains(key.to_hex().as_str()));
    }

    #[test]
    fn keys_differ_per_generation() {
        let c = &Configuration::default_set()[2];
        assert_ne!(
            c.generate_key().unwrap().as_bytes(),
            c.generate_key().unwrap().as_bytes()
        );
    }

    #[test]
    fn filters() {
        let all = Configuration::builtin();
        let names = |v: Vec<Configuration>| v.into_iter().map(|c| c.name).collect::<Vec<_>>();
        assert_eq!(
            names(select("configuration", &all, |c| &c.name, &["xts-inline*".into()]).unwrap()),
            ["xts-inline-read", "xts-inline-write", "xts-inline"]
        );
        assert_eq!(
            names(
                select(
                    "configuration",
                    &all,
                    |c| &c.name,
                    &["plain".into(), "plain".into()]
                )
                .unwrap()
            ),
            ["plain"]
        );
        let err = select("configuration", &all, |c| &c.name, &["nope".into()]).unwrap_err();
        assert!(err.to_string().contains("nope"));
        assert_eq!(
            select("configuration", &all, |c| &c.name, &[])
                .unwrap()
                .len(),
            all.len()
        );
    }
}
