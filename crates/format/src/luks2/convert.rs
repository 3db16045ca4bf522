//! In-place conversion between LUKS1 and LUKS2 (`convert --type luks2|luks1`), producing
//! the same metadata cryptsetup produces: 16 KiB header copies, keyslot material moved
//! between 4 KiB (LUKS1) and 32 KiB (LUKS2), PBKDF2 keyslots and the master-key digest
//! carried over unchanged.
//!
//! Like cryptsetup's, conversion is not crash-safe: keyslot material is moved over the old
//! keyslot area before the new header replaces the old one. Take a header backup first.

use super::binary::BIN_HDR_LEN;
use super::json::u64_value;
use super::{random_salt, CopyState, Luks2Header};
use crate::error::{FormatError, Result};
use crate::hdrio::HeaderIo;
use crate::luks1::{Luks1Header, Luks1Keyslot, LUKS1_HEADER_SIZE, LUKS1_NUM_KEYSLOTS};
use base64::Engine;
use serde_json::{json, Map, Value};

/// Size of each LUKS2 header copy a conversion creates.
const CONVERTED_MDA: u64 = 0x4000;
/// LUKS1 keyslot material starts at 4 KiB.
const LUKS1_KEYSLOTS_OFFSET: u64 = 4096;

impl Luks2Header {
    /// Converts the LUKS1 volume on `io` to LUKS2 in place; keyslots, volume key and data
    /// stay usable with the same passphrases. Fails (leaving the device untouched) when the
    /// data offset leaves no room for the larger LUKS2 metadata.
    pub fn convert_from_luks1(io: &dyn HeaderIo) -> Result<Luks2Header> {
        let mut raw = [0u8; LUKS1_HEADER_SIZE];
        io.read_at(0, &mut raw)
            .map_err(|e| FormatError::io("reading LUKS1 header", e))?;
        let v1 = Luks1Header::parse(&raw)?;
        let first = v1
            .keyslots
            .iter()
            .map(|k| k.key_material_offset as u64 * 512)
            .min()
            .unwrap_or(0);
        if first != LUKS1_KEYSLOTS_OFFSET {
            return Err(FormatError::Unsupported(
                "LUKS1 keyslots do not start at 4 KiB (unaligned legacy header)".into(),
            ));
        }
        let spec = if v1.cipher_mode.is_empty() {
            v1.cipher_name.clone()
        } else {
            v1.cipher_spec()
        };
        super::areacipher::check(&spec, v1.key_bytes as usize, 512).map_err(|e| {
            FormatError::Unsupported(format!("cipher {spec} cannot be used for LUKS2: {e}"))
        })?;
        let luks1_size = v1.required_size().div_ceil(4096) * 4096;
        let shift = 2 * CONVERTED_MDA - LUKS1_KEYSLOTS_OFFSET;
        let mut max_size = v1.data_offset_bytes();
        if max_size == 0 {
            max_size = io
                .size()
                .map_err(|e| FormatError::io("reading device size", e))?;
        }
        let required = luks1_size + shift;
        if max_size < required {
            return Err(FormatError::TooSmall(format!(
                "Unable to move keyslot area: LUKS2 needs {required} bytes before the data, \
                 only {max_size} available"
            )));
        }
        let keyslots_size = (max_size - 2 * CONVERTED_MDA) / 4096 * 4096;
        let b64 = base64::engine::general_purpose::STANDARD;

        let mut keyslots = Map::new();
        let mut digest_slots = Vec::new();
        for (i, ks) in v1.keyslots.iter().enumerate() {
            if !ks.is_enabled() {
                continue;
            }
            let (off, len) = v1.keyslot_area(i);
            keyslots.insert(
                i.to_string(),
                json!({
                    "type": "luks2",
                    "key_size": v1.key_bytes,
                    "kdf": {
                        "type": "pbkdf2",
                        "hash": v1.hash_spec,
                        "iterations": ks.iterations,
                        "salt": b64.encode(ks.salt),
                    },
                    "af": {"type": "luks1", "hash": v1.hash_spec, "stripes": 4000},
                    "area": {
                        "type": "raw",
                        "encryption": spec,
                        "key_size": v1.key_bytes,
                        "offset": u64_value(off + shift),
                        "size": u64_value(len.div_ceil(4096) * 4096),
                    }
                }),
            );
            digest_slots.push(Value::String(i.to_string()));
        }
        let json = json!({
            "keyslots": keyslots,
            "tokens": {},
            "segments": {"0": {
                "type": "crypt",
                "offset": u64_value(v1.data_offset_bytes()),
                "iv_tweak": "0",
                "size": "dynamic",
                "encryption": spec,
                "sector_size": 512,
            }},
            "digests": {"0": {
                "type": "pbkdf2",
                "keyslots": digest_slots,
                "segments": ["0"],
                "hash": v1.hash_spec,
                "salt": b64.encode(v1.mk_digest_salt),
                "digest": b64.encode(v1.mk_digest),
                "iterations": v1.mk_digest_iterations,
            }},
            "config": {
                "json_size": u64_value(CONVERTED_MDA - BIN_HDR_LEN as u64),
                "keyslots_size": u64_value(keyslots_size),
            }
        });
        let mut hdr = Luks2Header {
            hdr_size: CONVERTED_MDA,
            seqid: 1,
            label: String::new(),
            subsystem: String::new(),
            checksum_alg: "sha256".into(),
            uuid: v1.uuid.clone(),
            salts: [random_salt(), random_salt()],
            json,
            primary: CopyState::Valid,
            secondary: CopyState::Valid,
            repaired_json: false,
        };
        super::validate::validate(&hdr.json, CONVERTED_MDA - BIN_HDR_LEN as u64).map_err(|e| {
            FormatError::Unsupported(format!(
                "Cannot convert to LUKS2 format - invalid metadata: {e}"
            ))
        })?;
        if luks1_size - LUKS1_KEYSLOTS_OFFSET > keyslots_size {
            return Err(FormatError::TooSmall(
                "Unable to move keyslot area. LUKS2 keyslots area too small.".into(),
            ));
        }
        let mut area = vec![0u8; (luks1_size - LUKS1_KEYSLOTS_OFFSET) as usize];
        io.read_at(LUKS1_KEYSLOTS_OFFSET, &mut area)
            .map_err(|e| FormatError::io("reading LUKS1 keyslot area", e))?;
        io.write_at(2 * CONVERTED_MDA, &area)
            .map_err(|e| FormatError::io("moving keyslot area", e))?;
        zeroize::Zeroize::zeroize(&mut area);
        io.sync()
            .map_err(|e| FormatError::io("syncing moved keyslot area", e))?;
        hdr.write(io)?;
        Ok(hdr)
    }
}

fn not_compatible(why: impl std::fmt::Display) -> FormatError {
    FormatError::Unsupported(format!("Cannot convert to LUKS1 format - {why}"))
}

fn b64_exact(v: &Value, len: usize, what: &str) -> Result<Vec<u8>> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap_or(""))
        .map_err(|_| not_compatible(format!("{what} is not valid base64")))?;
    if bytes.len() < len {
        return Err(not_compatible(format!("{what} is too short")));
    }
    Ok(bytes)
}

impl Luks2Header {
    /// Converts this LUKS2 volume on `io` back to LUKS1 in place (`convert --type luks1`).
    /// Refused, with the device untouched, unless the volume fits LUKS1 exactly as
    /// cryptsetup requires: one 512-byte-sector segment, one PBKDF2 digest, no tokens, at
    /// most keyslots 0..7, all bound PBKDF2 keyslots with 4000 stripes, the digest's hash
    /// and the data cipher. Returns the LUKS1 header written.
    pub fn convert_to_luks1(&self, io: &dyn HeaderIo) -> Result<Luks1Header> {
        self.check_requirements()?;
        let seg = self.default_segment()?;
        if seg.sector_size != 512 {
            return Err(not_compatible(
                "default segment encryption sector size is not 512 bytes",
            ));
        }
        if self.hdr_size != CONVERTED_MDA {
            return Err(not_compatible("metadata size is not 16 KiB"));
        }
        let digests = self.json["digests"].as_object().map_or(0, Map::len);
        let digest = &self.json["digests"]["0"];
        if digests != 1 || digest["type"] != "pbkdf2" {
            return Err(not_compatible("key slot digests are not LUKS1 compatible"));
        }
        let hash = digest["hash"].as_str().unwrap_or("").to_string();
        cryptblk_cipher::hash::HashAlgorithm::from_name(&hash)?;
        let segments = self.json["segments"].as_object().map_or(0, |m| {
            m.values()
                .filter(|s| !super::validate::segment_is_backup(s))
                .count()
        });
        if segments != 1 {
            return Err(not_compatible("device uses more segments"));
        }
        let tokens = self.token_ids().len();
        if tokens > 0 {
            return Err(not_compatible(format!(
                "LUKS2 header contains {tokens} token(s)"
            )));
        }
        let key_size = self
            .volume_key_size()
            .ok_or_else(|| not_compatible("there are no active keyslots"))?;
        let (cipher_name, cipher_mode) = match seg.encryption.split_once('-') {
            Some((c, m)) if !c.starts_with("capi:") => (c.to_string(), m.to_string()),
            _ => {
                return Err(not_compatible(format!(
                    "cipher {} has no LUKS1 form",
                    seg.encryption
                )))
            }
        };
        let area_len =
            (crate::af::split_len(key_size, 4000).div_ceil(512) * 512).div_ceil(4096) as u64 * 4096;
        for k in self.keyslots() {
            let ks = &self.json["keyslots"][k.id.to_string()];
            if k.unbound {
                return Err(not_compatible(format!("keyslot {} is unbound", k.id)));
            }
            if k.id >= LUKS1_NUM_KEYSLOTS {
                return Err(not_compatible(format!(
                    "slot {} (over maximum slots) is still active",
                    k.id
                )));
            }
            let ok = ks["type"] == "luks2"
                && ks["kdf"]["type"] == "pbkdf2"
                && ks["kdf"]["hash"] == hash.as_str()
                && ks["af"]["stripes"] == 4000
                && ks["af"]["hash"] == hash.as_str()
                && ks["area"]["encryption"] == seg.encryption.as_str()
                && ks["area"]["key_size"] == key_size
                && self.keyslot_area(k.id).map(|a| a.1) == Some(area_len);
            if !ok {
                return Err(not_compatible(format!(
                    "keyslot {} is not LUKS1 compatible",
                    k.id
                )));
            }
        }
        // Inactive LUKS1 slots still get areas: allocate placeholders in turn so they do
        // not all land on the same gap.
        let shift = (2 * CONVERTED_MDA - LUKS1_KEYSLOTS_OFFSET) / 512;
        let mut scratch = self.clone();
        let mut slots = Vec::with_capacity(LUKS1_NUM_KEYSLOTS);
        for i in 0..LUKS1_NUM_KEYSLOTS {
            let ks = self.json["keyslots"].get(i.to_string());
            let offset = match ks {
                Some(_) => self.keyslot_area(i).map(|a| a.0).unwrap_or(0),
                None => {
                    let off = scratch.find_area_gap(area_len, None)?;
                    scratch.json["keyslots"][i.to_string()] = json!({
                        "type": "placeholder",
                        "area": {"offset": u64_value(off), "size": u64_value(area_len)}
                    });
                    off
                }
            };
            let sector = u32::try_from(offset / 512 - shift)
                .map_err(|_| not_compatible(format!("keyslot {i} area offset too large")))?;
            let mut slot = Luks1Keyslot {
                active: crate::luks1::KEYSLOT_DISABLED,
                iterations: 0,
                salt: [0; 32],
                key_material_offset: sector,
                stripes: 4000,
            };
            if let Some(ks) = ks {
                slot.active = crate::luks1::KEYSLOT_ENABLED;
                slot.iterations = super::json::get_u32(&ks["kdf"], "iterations").unwrap_or(0);
                let salt = b64_exact(&ks["kdf"]["salt"], 32, "keyslot salt")?;
                slot.salt.copy_from_slice(&salt[..32]);
            }
            slots.push(slot);
        }
        let mk_digest = b64_exact(&digest["digest"], 20, "digest")?;
        let mk_salt = b64_exact(&digest["salt"], 32, "digest salt")?;
        let v1 = Luks1Header {
            cipher_name,
            cipher_mode,
            hash_spec: hash,
            payload_offset: u32::try_from(seg.offset / 512)
                .map_err(|_| not_compatible("data offset too large"))?,
            key_bytes: key_size as u32,
            mk_digest: mk_digest[..20].try_into().unwrap_or([0; 20]),
            mk_digest_salt: mk_salt[..32].try_into().unwrap_or([0; 32]),
            mk_digest_iterations: super::json::get_u32(digest, "iterations").unwrap_or(0),
            uuid: self.uuid.clone(),
            keyslots: slots
                .try_into()
                .map_err(|_| not_compatible("keyslot table"))?,
        };
        v1.validate()?;
        let bytes = v1.to_bytes()?;
        let mut area = vec![0u8; self.keyslots_size() as usize];
        io.read_at(2 * CONVERTED_MDA, &mut area)
            .map_err(|e| FormatError::io("reading LUKS2 keyslots area", e))?;
        io.write_at(LUKS1_KEYSLOTS_OFFSET, &area)
            .map_err(|e| FormatError::io("moving keyslot area", e))?;
        zeroize::Zeroize::zeroize(&mut area);
        io.sync()
            .map_err(|e| FormatError::io("syncing moved keyslot area", e))?;
        let mut first = vec![0u8; LUKS1_KEYSLOTS_OFFSET as usize];
        first[..bytes.len()].copy_from_slice(&bytes);
        io.write_at(0, &first)
            .map_err(|e| FormatError::io("writing LUKS1 header", e))?;
        io.sync()
            .map_err(|e| FormatError::io("syncing LUKS1 header", e))?;
        Ok(v1)
    }
}
