//! The facts an activation records about a volume ([`VolumeFacts`]): what `status` reports
//! (type, UUID, cipher, devices), what later operations read back to find the volume's
//! header and data again (suspend, resize, online reencryption), and the keyless lower
//! mappings a daemon creates under the top one.
//!
//! Invariant: never a secret. The facts travel on the pipe that starts a daemon, in its
//! `status --json` answer and in the spec a successor daemon receives; keyed tables travel
//! separately (see [`crate::plan::KeyedLower`]).
//!
//! The JSON shape is `status --json`'s `info` object, so its field names are cryptsetup's
//! status words; a field that does not apply to the volume's type is left out.

use crate::reencrypt::online::ReencryptProgress;
use serde::{Deserialize, Serialize};

/// What `status` reports about an activated volume and what operations read back from it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeFacts {
    /// The volume type as cryptsetup's status names it (`LUKS2`, `PLAIN`, `TCRYPT`,
    /// `INTEGRITY`, ...); `dm` for a mapping created from a bare table.
    #[serde(rename = "type")]
    pub kind: String,
    /// The volume's UUID (LUKS, BITLK, FVAULT2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The data cipher in cryptsetup's notation (`aes-xts-plain64`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cipher: Option<String>,
    /// The volume key's size (`512 bits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keysize: Option<String>,
    /// The integrity algorithm (LUKS2 `--integrity`, dm-integrity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integrity: Option<String>,
    /// The authentication tag size of a LUKS2 `--integrity` volume (`32 bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integrity_tag_size: Option<String>,
    /// The integrity key size, for keyed MACs only (`256 bits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integrity_keysize: Option<String>,
    /// The tag size in bytes of a standalone dm-integrity device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag_size: Option<u64>,
    /// A standalone dm-integrity device's mode (`journal`, `bitmap`, `direct`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The data device (absolute path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// A dm-integrity device's separate metadata device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_device: Option<String>,
    /// Where the header is (absolute path): the device itself, `--header`, or the header an
    /// online decryption exported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// The encryption sector size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sector_size: Option<u64>,
    /// The data offset (`4096 sectors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<String>,
    /// The IV offset (`skipped`, as cryptsetup prints it for plain, TCRYPT and loop-AES).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// The number of keys of a loop-AES volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<u64>,
    /// Keyless mappings created below the top one, in creation order (a LUKS2
    /// `--integrity` volume's `<name>_dif`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lower: Vec<crate::plan::LowerMapping>,
    /// The paused progress of a volume activated mid-reencryption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reencryption: Option<ReencryptProgress>,
    /// The activation flags (kernel words) of a volume activated mid-reencryption: its
    /// table of linear pieces does not show them, and the online run needs them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation_flags: Option<Vec<String>>,
    /// For a lower mapping: the top mapping whose daemon serves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stacked_under: Option<String>,
    /// Where cryptsetup would keep the volume key: `keyring` for a LUKS2 volume opened
    /// without `--disable-keyring` (then, as with cryptsetup, `resize` needs the key again:
    /// a passphrase, token or key file), else absent (`dm-crypt`, the table holds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_location: Option<String>,
    /// The remote NBD backings of the stack and their failures since opening.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote_nbd: Vec<RemoteNbdFacts>,
}

/// One remote NBD backing (`nbd://...`) of a served stack, as `status --json` reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteNbdFacts {
    /// The backing's URI.
    pub uri: String,
    /// Whether a connection is up now.
    pub connected: bool,
    /// Requests that failed since opening.
    pub errors: u64,
    /// Reconnections since opening.
    pub reconnects: u64,
}

impl VolumeFacts {
    /// Facts of the given type and nothing else (`dm`, `VERITY` ...).
    pub fn of_kind(kind: &str) -> Self {
        VolumeFacts {
            kind: kind.to_string(),
            ..Default::default()
        }
    }

    /// The files that hold this volume's header and its data, header first (what an offline
    /// operation compares with its device to find the daemon that serves it).
    pub fn files(&self) -> impl Iterator<Item = &str> {
        self.header
            .iter()
            .chain(self.device.iter())
            .map(String::as_str)
    }

    /// The header's file: the recorded header, else the data device.
    pub fn header_or_device(&self) -> Option<&str> {
        self.header.as_deref().or(self.device.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_shape_is_status_info_and_leaves_out_what_does_not_apply() {
        let f = VolumeFacts {
            kind: "LUKS2".into(),
            uuid: Some("u".into()),
            sector_size: Some(4096),
            ..Default::default()
        };
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "LUKS2", "uuid": "u", "sector_size": 4096})
        );
        let back: VolumeFacts = serde_json::from_value(v).unwrap();
        assert_eq!(back, f);
    }

    #[test]
    fn unknown_fields_of_another_version_are_ignored() {
        let f: VolumeFacts =
            serde_json::from_str(r#"{"type":"PLAIN","future_field":[1,2]}"#).unwrap();
        assert_eq!(f, VolumeFacts::of_kind("PLAIN"));
    }
}
