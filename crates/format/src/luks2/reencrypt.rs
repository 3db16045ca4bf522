//! The LUKS2 metadata of a reencryption in progress, as cryptsetup 2.x writes it: the
//! `reencrypt` keyslot (mode, direction, resilience area), the segment list with its
//! `in-reencryption` hotzone and `backup-*` segments, and the `online-reencrypt-v*`
//! requirement.
//!
//! This module only reads that state; the JSON stays in [`Luks2Header`] untouched, so a header
//! cryptblk loads and writes back keeps every field cryptsetup put there.

use super::json::{get_u32, get_u64_str, numeric_keys};
use super::Luks2Header;
use crate::error::{FormatError, Result};
use serde_json::Value;

/// What the reencryption does (`mode` of the `reencrypt` keyslot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReencryptMode {
    /// Old key to new key (`reencrypt`).
    Reencrypt,
    /// Plaintext to ciphertext (`encrypt`).
    Encrypt,
    /// Ciphertext to plaintext (`decrypt`).
    Decrypt,
}

/// Which way the hotzone walks over the data (`direction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReencryptDirection {
    /// From the data start to its end: new data lies below the hotzone.
    Forward,
    /// From the end to the start: new data lies above the hotzone.
    Backward,
}

/// How the hotzone survives a crash (`area.type` of the `reencrypt` keyslot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resilience {
    /// No protection: a crash inside the hotzone loses it.
    None,
    /// A hash per `sector_size` block of the hotzone's old ciphertext in the keyslot area;
    /// recovery re-reads each block and decides old or new by its hash.
    Checksum {
        /// Hash name (`sha256`).
        hash: String,
        /// Bytes per hashed block.
        sector_size: u32,
    },
    /// A copy of the hotzone's old data in the keyslot area.
    Journal,
    /// Data moved by `shift_size` bytes (encryption with `--reduce-device-size`); the moved
    /// segment is the resilience.
    Datashift {
        /// Bytes the data moves.
        shift_size: u64,
    },
    /// Datashift whose first hotzone is protected by checksums (decryption that moves the
    /// data to the device start).
    DatashiftChecksum {
        /// Hash name.
        hash: String,
        /// Bytes per hashed block.
        sector_size: u32,
        /// Bytes the data moves.
        shift_size: u64,
    },
    /// Datashift whose first hotzone is journaled.
    DatashiftJournal {
        /// Bytes the data moves.
        shift_size: u64,
    },
}

/// The `reencrypt` keyslot of a header mid-reencryption.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReencryptKeyslot {
    /// Keyslot number.
    pub id: usize,
    /// What is being done.
    pub mode: ReencryptMode,
    /// Which way.
    pub direction: ReencryptDirection,
    /// The resilience type with its parameters.
    pub resilience: Resilience,
    /// Byte offset of the keyslot area (resilience data) on the header device.
    pub area_offset: u64,
    /// Byte length of that area.
    pub area_size: u64,
}

/// Flags a segment can carry during a reencryption.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Segment number.
    pub id: u32,
    /// `crypt` or `linear`.
    pub kind: String,
    /// Byte offset on the data device.
    pub offset: u64,
    /// Length; `None` for `dynamic`.
    pub size: Option<u64>,
    /// IV offset in 512-byte sectors (crypt only, 0 otherwise).
    pub iv_tweak: u64,
    /// Cipher (crypt only).
    pub encryption: Option<String>,
    /// Encryption sector size (crypt only; 512 otherwise).
    pub sector_size: u32,
    /// The segment's flags (`in-reencryption`, `backup-previous`, ...).
    pub flags: Vec<String>,
}

impl SegmentInfo {
    /// True when the segment carries `flag`.
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// True for `backup-*` segments (descriptions, never mapped).
    pub fn is_backup(&self) -> bool {
        self.flags.iter().any(|f| f.starts_with("backup-"))
    }
}

fn bad(msg: impl Into<String>) -> FormatError {
    FormatError::Corrupt(msg.into())
}

fn parse_keyslot(id: usize, ks: &Value) -> Result<ReencryptKeyslot> {
    let what = format!("reencrypt keyslot {id}");
    let mode = match ks["mode"].as_str() {
        Some("reencrypt") => ReencryptMode::Reencrypt,
        Some("encrypt") => ReencryptMode::Encrypt,
        Some("decrypt") => ReencryptMode::Decrypt,
        other => return Err(bad(format!("{what}: unknown mode {other:?}"))),
    };
    let direction = match ks["direction"].as_str() {
        Some("forward") => ReencryptDirection::Forward,
        Some("backward") => ReencryptDirection::Backward,
        other => return Err(bad(format!("{what}: unknown direction {other:?}"))),
    };
    let area = &ks["area"];
    let hash = || {
        area["hash"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| bad(format!("{what}: checksum area without hash")))
    };
    let sector = || {
        get_u32(area, "sector_size")
            .filter(|s| *s >= 512 && s.is_power_of_two())
            .ok_or_else(|| bad(format!("{what}: checksum area without a valid sector_size")))
    };
    let shift = || {
        get_u64_str(area, "shift_size")
            .filter(|s| *s > 0 && s.is_multiple_of(512))
            .ok_or_else(|| bad(format!("{what}: datashift area without a valid shift_size")))
    };
    let resilience = match area["type"].as_str() {
        Some("none") => Resilience::None,
        Some("checksum") => Resilience::Checksum {
            hash: hash()?,
            sector_size: sector()?,
        },
        Some("journal") => Resilience::Journal,
        Some("datashift") => Resilience::Datashift {
            shift_size: shift()?,
        },
        Some("datashift-checksum") => Resilience::DatashiftChecksum {
            hash: hash()?,
            sector_size: sector()?,
            shift_size: shift()?,
        },
        Some("datashift-journal") => Resilience::DatashiftJournal {
            shift_size: shift()?,
        },
        other => return Err(bad(format!("{what}: unknown resilience type {other:?}"))),
    };
    Ok(ReencryptKeyslot {
        id,
        mode,
        direction,
        resilience,
        area_offset: get_u64_str(area, "offset")
            .ok_or_else(|| bad(format!("{what}: invalid area offset")))?,
        area_size: get_u64_str(area, "size")
            .ok_or_else(|| bad(format!("{what}: invalid area size")))?,
    })
}

impl Luks2Header {
    /// The `reencrypt` keyslot, when the header has one (only headers with an online
    /// reencryption requirement do). Fails on a `reencrypt` keyslot whose fields cryptblk
    /// cannot read.
    pub fn reencrypt_keyslot(&self) -> Result<Option<ReencryptKeyslot>> {
        let Some(ks) = self.json["keyslots"].as_object() else {
            return Ok(None);
        };
        for (id, key) in numeric_keys(ks) {
            let k = &ks[key.as_str()];
            if k["type"] == "reencrypt" {
                return parse_keyslot(id as usize, k).map(Some);
            }
        }
        Ok(None)
    }

    /// Every segment (data and backup, crypt and linear) in number order.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let Some(segs) = self.json["segments"].as_object() else {
            return Vec::new();
        };
        numeric_keys(segs)
            .into_iter()
            .filter_map(|(id, key)| {
                let s = &segs[key.as_str()];
                Some(SegmentInfo {
                    id: u32::try_from(id).ok()?,
                    kind: s["type"].as_str()?.to_string(),
                    offset: get_u64_str(s, "offset")?,
                    size: get_u64_str(s, "size"),
                    iv_tweak: get_u64_str(s, "iv_tweak").unwrap_or(0),
                    encryption: s["encryption"].as_str().map(str::to_string),
                    sector_size: get_u32(s, "sector_size").unwrap_or(512),
                    flags: s["flags"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|f| f.as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default(),
                })
            })
            .collect()
    }

    /// Writes both header copies (see [`Luks2Header::write`]) for a reencryption step or its
    /// recovery: an online reencryption requirement does not block this write.
    pub fn write_reencryption(&mut self, io: &dyn crate::hdrio::HeaderIo) -> Result<()> {
        self.check_requirements_except_reencryption()?;
        self.write_unchecked(io)
    }

    /// [`Luks2Header::write_reencryption`] without the sync after the secondary copy: a
    /// reencryption step syncs the same file next anyway (the hotzone's data, or the next
    /// hotzone's resilience data), and that sync must come before the next header write.
    /// Until it does, the synced primary copy is the newest valid one, which a crash keeps
    /// and a load prefers over a stale or torn secondary (cryptsetup's rule too), so one
    /// sync per header write is saved without weakening any step.
    pub fn write_reencryption_then_sync(&mut self, io: &dyn crate::hdrio::HeaderIo) -> Result<()> {
        self.check_requirements_except_reencryption()?;
        self.write_copies(io, false)
    }

    /// The id of the digest that lists keyslot `slot`.
    pub fn digest_of_slot(&self, slot: usize) -> Option<String> {
        let name = slot.to_string();
        self.json["digests"]
            .as_object()?
            .iter()
            .find(|(_, d)| super::json::array_has(d.get("keyslots"), &name))
            .map(|(k, _)| k.clone())
    }

    /// The ids of the digests assigned to segment `segment`.
    pub fn digests_of_segment(&self, segment: u32) -> Vec<String> {
        let name = segment.to_string();
        self.json["digests"]
            .as_object()
            .map(|d| {
                d.iter()
                    .filter(|(_, v)| super::json::array_has(v.get("segments"), &name))
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keyslot_fields_parse_for_every_resilience_type() {
        let ks = |area: Value| {
            json!({"type":"reencrypt","key_size":1,"mode":"reencrypt",
            "direction":"forward","priority":0,"area":area})
        };
        let base = |t: &str| json!({"type":t,"offset":"548864","size":"532480"});
        let mut a = base("checksum");
        a["hash"] = json!("sha256");
        a["sector_size"] = json!(4096);
        let k = parse_keyslot(2, &ks(a)).unwrap();
        assert_eq!(
            k.resilience,
            Resilience::Checksum {
                hash: "sha256".into(),
                sector_size: 4096
            }
        );
        assert_eq!((k.area_offset, k.area_size), (548864, 532480));
        assert_eq!(
            parse_keyslot(2, &ks(base("journal"))).unwrap().resilience,
            Resilience::Journal
        );
        let mut d = base("datashift");
        d["shift_size"] = json!("2097152");
        assert_eq!(
            parse_keyslot(1, &ks(d)).unwrap().resilience,
            Resilience::Datashift {
                shift_size: 2097152
            }
        );
        // A checksum area without its hash, an unknown mode: one clear error each.
        assert!(parse_keyslot(2, &ks(base("checksum"))).is_err());
        let mut bad_mode = ks(base("none"));
        bad_mode["mode"] = json!("rekey");
        assert!(parse_keyslot(2, &bad_mode).is_err());
    }
}
