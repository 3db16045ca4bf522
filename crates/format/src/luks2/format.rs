//! Creating a new LUKS2 volume (`luksFormat --type luks2`), with cryptsetup 2.x's layout
//! rules: 16 KiB metadata copies by default, keyslots area filling the space up to a 16 MiB
//! data offset (1 MiB-aligned), or sized from `--luks2-keyslots-size` / `--offset`.

use super::binary::{is_valid_metadata_size, KEYSLOTS_SIZE_MAX};
use super::integrity::{dm_cipher, IntegrityAlgorithm, IntegrityCipher, SegmentIntegrity};
use super::json::u64_value;
use super::keyslot::{new_digest_iterations, KeyslotParams};
use super::{random_salt, CopyState, Luks2Header};
use crate::error::{FormatError, Result};
use crate::hdrio::HeaderIo;
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;
use serde_json::json;

/// Default metadata (one header copy) size: 16 KiB.
pub const DEFAULT_METADATA_SIZE: u64 = 0x4000;
/// Default size reserved for metadata and keyslots before the data: 16 MiB.
pub const DEFAULT_DATA_OFFSET: u64 = 0x100_0000;
/// Default data alignment: 1 MiB.
const DEFAULT_ALIGNMENT: u64 = 0x10_0000;

/// Parameters of a new LUKS2 volume.
#[derive(Clone, Debug)]
pub struct FormatParams {
    /// Data cipher specification (`--cipher`, default aes-xts-plain64).
    pub cipher: String,
    /// Volume key size in bytes (`--key-size` / 8, default 64).
    pub key_size: usize,
    /// Encryption sector size (`--sector-size`, 512..4096, power of two).
    pub sector_size: u32,
    /// UUID (`--uuid`); None generates a random one.
    pub uuid: Option<String>,
    /// `--label`.
    pub label: String,
    /// `--subsystem`.
    pub subsystem: String,
    /// One header copy's size (`--luks2-metadata-size`), 16 KiB..4 MiB.
    pub metadata_size: u64,
    /// `--luks2-keyslots-size`; None derives it from the data offset.
    pub keyslots_size: Option<u64>,
    /// Data offset in bytes (`--offset` * 512); None: 16 MiB, or 0 with a detached header.
    pub data_offset: Option<u64>,
    /// True when the header lives in its own file (`--header`): data starts at 0 unless
    /// `data_offset` says otherwise and the device need not hold any data.
    pub detached_header: bool,
    /// Hash of the volume key digest (`--hash`, default sha256).
    pub digest_hash: HashAlgorithm,
    /// Use this volume key instead of a random one (`--volume-key-file`).
    pub volume_key: Option<SecretBytes>,
    /// First keyslot's parameters.
    pub keyslot: KeyslotParams,
    /// `--integrity` in cryptsetup spelling (`hmac-sha256`, `aead`, `poly1305`) for
    /// authenticated encryption; `key_size` then stays the encryption key size and the
    /// volume key grows by the integrity key.
    pub integrity: Option<String>,
    /// `--integrity-key-size` in bytes (`None` = the algorithm's default).
    pub integrity_key_size: Option<usize>,
    /// Data alignment in bytes for an attached header without `data_offset`
    /// (`--align-payload` * 512); None or 0: 1 MiB.
    pub data_alignment: Option<u64>,
}

impl Default for FormatParams {
    fn default() -> Self {
        FormatParams {
            cipher: "aes-xts-plain64".into(),
            key_size: 64,
            sector_size: 512,
            uuid: None,
            label: String::new(),
            subsystem: String::new(),
            metadata_size: DEFAULT_METADATA_SIZE,
            keyslots_size: None,
            data_offset: None,
            detached_header: false,
            digest_hash: HashAlgorithm::Sha256,
            volume_key: None,
            keyslot: KeyslotParams::default(),
            integrity: None,
            integrity_key_size: None,
            data_alignment: None,
        }
    }
}

/// (keyslots_size, data_offset) for the parameters, as cryptsetup computes them.
fn layout(p: &FormatParams) -> Result<(u64, u64)> {
    let mda = p.metadata_size;
    let mut data_offset = p.data_offset.unwrap_or(0);
    if data_offset != 0 && data_offset < 2 * mda {
        return Err(FormatError::InvalidParameter(
            "requested data offset is too small".into(),
        ));
    }
    if !data_offset.is_multiple_of(512) {
        return Err(FormatError::InvalidParameter(
            "data offset must be a multiple of 512 bytes".into(),
        ));
    }
    let mut ks = match p.keyslots_size {
        Some(k) => k,
        None if data_offset != 0 => data_offset - 2 * mda,
        None => 0,
    };
    ks -= ks % 4096;
    ks = ks.min(KEYSLOTS_SIZE_MAX);
    if ks == 0 {
        ks = DEFAULT_DATA_OFFSET - 2 * mda;
    }
    if data_offset != 0 && ks + 2 * mda > data_offset {
        ks = data_offset - 2 * mda;
        ks -= ks % 4096;
    }
    if data_offset == 0 && !p.detached_header {
        let align = p
            .data_alignment
            .filter(|&a| a > 0)
            .unwrap_or(DEFAULT_ALIGNMENT);
        data_offset = (2 * mda + ks).div_ceil(align) * align;
    }
    Ok((ks, data_offset))
}

fn zero_range(io: &dyn HeaderIo, start: u64, len: u64) -> Result<()> {
    const CHUNK: usize = 1 << 20;
    let zeros = vec![0u8; CHUNK];
    let mut pos = start;
    while pos < start + len {
        let n = (CHUNK as u64).min(start + len - pos) as usize;
        io.write_at(pos, &zeros[..n])
            .map_err(|e| FormatError::io("wiping LUKS2 header area", e))?;
        pos += n as u64;
    }
    Ok(())
}

impl Luks2Header {
    /// Formats `io` as a new LUKS2 volume and adds keyslot 0 (or `keyslot.slot`) for
    /// `passphrase`. Returns the header, the volume key and the keyslot number.
    pub fn format(
        io: &dyn HeaderIo,
        p: &FormatParams,
        passphrase: &[u8],
    ) -> Result<(Luks2Header, SecretBytes, usize)> {
        if !is_valid_metadata_size(p.metadata_size) {
            return Err(FormatError::InvalidParameter(format!(
                "unsupported LUKS2 metadata size {} (allowed: 16 KiB, 32 KiB, ..., 4 MiB)",
                p.metadata_size
            )));
        }
        if let Some(k) = p.keyslots_size {
            if !k.is_multiple_of(4096) || k > KEYSLOTS_SIZE_MAX || k == 0 {
                return Err(FormatError::InvalidParameter(format!(
                    "unsupported LUKS2 keyslots size {k} (4 KiB aligned, at most 128 MiB)"
                )));
            }
        }
        if !(512..=4096).contains(&p.sector_size) || !p.sector_size.is_power_of_two() {
            return Err(FormatError::InvalidParameter(format!(
                "unsupported encryption sector size {}",
                p.sector_size
            )));
        }
        if p.key_size == 0 || p.key_size > 512 {
            return Err(FormatError::InvalidParameter(format!(
                "invalid key size {} bytes",
                p.key_size
            )));
        }
        let integrity = match &p.integrity {
            Some(name) => {
                let alg = IntegrityAlgorithm::from_name(name)?;
                let ikey = alg.key_size(p.integrity_key_size)?;
                dm_cipher(&alg, &IntegrityCipher::parse(&p.cipher)?, p.key_size)?;
                Some(SegmentIntegrity::new(&alg, ikey))
            }
            None if p.integrity_key_size.is_some() => {
                return Err(FormatError::InvalidParameter(
                    "--integrity-key-size needs --integrity".into(),
                ))
            }
            None => None,
        };
        let vk_size = p.key_size
            + match &integrity {
                Some(i) => IntegrityAlgorithm::from_name(&i.kind)?.key_size(i.key_size)?,
                None => 0,
            };
        let vk = match &p.volume_key {
            Some(k) if k.len() != vk_size => {
                return Err(FormatError::InvalidParameter(format!(
                    "volume key has {} bytes, key size is {vk_size}",
                    k.len(),
                )))
            }
            Some(k) => k.clone(),
            None => SecretBytes::random(vk_size),
        };
        if integrity.is_none() {
            super::areacipher::check(&p.cipher, p.key_size, p.sector_size)?;
        }
        let (keyslots_size, data_offset) = layout(p)?;
        if !data_offset.is_multiple_of(p.sector_size as u64) {
            return Err(FormatError::InvalidParameter(format!(
                "data offset {data_offset} is not aligned to the {}-byte sector",
                p.sector_size
            )));
        }
        let meta_end = 2 * p.metadata_size + keyslots_size;
        let size = io
            .size()
            .map_err(|e| FormatError::io("reading device size", e))?;
        if !p.detached_header && size <= data_offset {
            return Err(FormatError::TooSmall(format!(
                "device of {size} bytes has no room for data after the {data_offset}-byte header"
            )));
        }
        let uuid = match &p.uuid {
            Some(u) => uuid::Uuid::parse_str(u)
                .map_err(|_| FormatError::InvalidParameter(format!("invalid UUID '{u}'")))?
                .hyphenated()
                .to_string(),
            None => uuid::Uuid::new_v4().hyphenated().to_string(),
        };
        // cryptsetup does not benchmark the digest when the keyslot KDF cost is forced
        // (--pbkdf-force-iterations): it uses the minimum, 1000 iterations.
        let fixed = p.keyslot.pbkdf.force_iterations.map(|_| 1000);
        let digest = new_digest_iterations(vk.as_bytes(), p.digest_hash, fixed, &[], &[0])?;
        let mut json = json!({
            "keyslots": {},
            "tokens": {},
            "segments": {
                "0": {
                    "type": "crypt",
                    "offset": u64_value(data_offset),
                    "size": "dynamic",
                    "iv_tweak": "0",
                    "encryption": p.cipher,
                    "sector_size": p.sector_size
                }
            },
            "digests": { "0": digest },
            "config": {
                "json_size": u64_value(p.metadata_size - super::binary::BIN_HDR_LEN as u64),
                "keyslots_size": u64_value(keyslots_size)
            }
        });
        if let Some(i) = &integrity {
            json["segments"]["0"]["integrity"] = i.to_json();
        }
        let mut hdr = Luks2Header {
            hdr_size: p.metadata_size,
            seqid: 0,
            label: String::new(),
            subsystem: String::new(),
            checksum_alg: "sha256".into(),
            uuid,
            salts: [random_salt(), random_salt()],
            json,
            primary: CopyState::Valid,
            secondary: CopyState::Valid,
            repaired_json: false,
        };
        hdr.set_label(&p.label)?;
        hdr.set_subsystem(&p.subsystem)?;
        // Old signatures and old keyslot material must not survive: zero both metadata
        // copies, randomise the keyslots area.
        zero_range(io, 0, 2 * p.metadata_size)?;
        super::keyslot::wipe_area(io, 2 * p.metadata_size, meta_end - 2 * p.metadata_size)?;
        hdr.write(io)?;
        let slot = hdr.add_keyslot(io, &vk, passphrase, &p.keyslot)?;
        Ok((hdr, vk, slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_layout_is_16mib() {
        let p = FormatParams::default();
        assert_eq!(
            layout(&p).unwrap(),
            (16 * 1024 * 1024 - 32768, 16 * 1024 * 1024)
        );
        let p = FormatParams {
            metadata_size: 65536,
            ..FormatParams::default()
        };
        assert_eq!(
            layout(&p).unwrap(),
            (16 * 1024 * 1024 - 131072, 16 * 1024 * 1024)
        );
        let p = FormatParams {
            keyslots_size: Some(4096 * 100),
            ..FormatParams::default()
        };
        assert_eq!(layout(&p).unwrap(), (409600, 1024 * 1024));
        let p = FormatParams {
            data_offset: Some(4 * 1024 * 1024),
            ..FormatParams::default()
        };
        assert_eq!(
            layout(&p).unwrap(),
            (4 * 1024 * 1024 - 32768, 4 * 1024 * 1024)
        );
        let p = FormatParams {
            detached_header: true,
            ..FormatParams::default()
        };
        assert_eq!(layout(&p).unwrap(), (16 * 1024 * 1024 - 32768, 0));
    }
}
