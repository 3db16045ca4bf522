//! In-place conversion LUKS1 -> LUKS2 (`convert --type luks2`), producing the same metadata
//! cryptsetup produces: 16 KiB header copies, the LUKS1 keyslot material moved from 4 KiB to
//! 32 KiB, PBKDF2 keyslots and the LUKS1 master-key digest carried over unchanged.
//!
//! Like cryptsetup's, the conversion is not crash-safe: the keyslot material is moved over
//! the LUKS1 keyslot area before the LUKS2 header replaces the LUKS1 one. Take a header
//! backup first.

use super::binary::BIN_HDR_LEN;
use super::json::u64_value;
use super::{random_salt, CopyState, Luks2Header};
use crate::error::{FormatError, Result};
use crate::hdrio::HeaderIo;
use crate::luks1::{Luks1Header, LUKS1_HEADER_SIZE};
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
