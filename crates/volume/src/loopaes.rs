//! loop-AES volumes (`--type loopaes`, cryptsetup's `loopaesOpen`): the key derived from the
//! key file by [`cryptblk_format::loopaes`], the data segment (`--offset`, `--skip`) and the
//! activation plan: one crypt table, `<cipher>-cbc-plain64` for a single key or
//! `<cipher>:64-cbc-lmk` for 64 or 65 keys, as cryptsetup maps it.

use crate::error::{Result, VolumeError};
use crate::plan::ActivationPlan;
use crate::segment::Segment;
use cryptblk_cipher::{CipherSpec, SecretBytes};
use cryptblk_format::loopaes;
use std::path::Path;

/// What `loopaesOpen` takes besides the key file.
#[derive(Clone, Debug)]
pub struct LoopaesParams {
    /// The block cipher (`--cipher`, default `aes`).
    pub cipher: String,
    /// Size of each key in bytes (`--key-size` / 8, default 32).
    pub key_size: usize,
    /// `--hash` (default: chosen by key size).
    pub hash: Option<String>,
    /// Start of the data on the device, in 512-byte sectors (`--offset`).
    pub offset_sectors: u64,
    /// IV offset in 512-byte sectors (`--skip`; cryptsetup defaults it to `--offset`).
    pub skip_sectors: u64,
}

impl Default for LoopaesParams {
    fn default() -> Self {
        Self {
            cipher: loopaes::DEFAULT_CIPHER.into(),
            key_size: (loopaes::DEFAULT_KEY_BITS / 8) as usize,
            hash: None,
            offset_sectors: 0,
            skip_sectors: 0,
        }
    }
}

/// A loop-AES volume whose key file has been read.
pub struct LoopaesVolume {
    /// The dm-crypt cipher specification.
    pub cipher: String,
    /// The dm-crypt key (all keys, concatenated).
    pub key: SecretBytes,
    /// How many keys the key file held (1, 64 or 65).
    pub keys_count: usize,
    /// The parameters it was opened with.
    pub params: LoopaesParams,
}

/// Derives the volume's key from key file contents `keyfile` (already decrypted, if it was
/// GPG-encrypted). A malformed key file is cryptsetup's "Incompatible loop-AES keyfile
/// detected." (exit 1).
pub fn unlock(keyfile: &[u8], params: &LoopaesParams) -> Result<LoopaesVolume> {
    // cryptsetup refuses keys over 1024 bytes before reading the key file.
    if params.key_size == 0 || params.key_size > 1024 {
        return Err(VolumeError::usage("Invalid key size."));
    }
    let k = loopaes::derive_key(keyfile, params.key_size, params.hash.as_deref())?;
    let cipher = k.cipher_spec(&params.cipher);
    let spec = CipherSpec::parse(&cipher).map_err(|_| {
        VolumeError::usage(format!(
            "Cipher {} (as {cipher}) is not available for loop-AES.",
            params.cipher
        ))
    })?;
    spec.check_key_size(k.key.len()).map_err(|_| {
        VolumeError::usage(format!(
            "Invalid key size {} bits for loop-AES cipher {}.",
            params.key_size * 8,
            params.cipher
        ))
    })?;
    Ok(LoopaesVolume {
        cipher,
        key: k.key,
        keys_count: k.keys_count,
        params: params.clone(),
    })
}

/// The data segment: from `--offset` to the end of the device, IVs counted from `--skip`.
pub fn segment(vol: &LoopaesVolume) -> Segment {
    Segment {
        cipher: vol.cipher.clone(),
        offset: vol.params.offset_sectors * 512,
        size: None,
        iv_offset: vol.params.skip_sectors,
        sector_size: 512,
        integrity: None,
    }
}

/// The activation plan of `vol` on `device`: one crypt table.
pub fn plan(
    vol: &LoopaesVolume,
    device: &Path,
    name: &str,
    crypt_flags: &[String],
) -> Result<ActivationPlan> {
    let seg = segment(vol);
    let table = seg.crypt_table(&vol.key, device, crypt_flags)?;
    Ok(ActivationPlan {
        name: name.to_string(),
        table,
        lower: Vec::new(),
        keyed_lower: Vec::new(),
        info: crate::facts::VolumeFacts {
            kind: "LOOPAES".into(),
            cipher: Some(seg.cipher.clone()),
            keysize: Some(format!("{} bits", vol.params.key_size * 8)),
            keys: Some(vol.keys_count as u64),
            device: Some(device.display().to_string()),
            sector_size: Some(512),
            offset: Some(format!("{} sectors", vol.params.offset_sectors)),
            skipped: Some(format!("{} sectors", vol.params.skip_sectors)),
            ..Default::default()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyfile(n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|i| format!("loop-aes-test-key-{i:04}\n").into_bytes())
            .collect()
    }

    #[test]
    fn plans_single_and_multi_key_tables() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        for (n, spec, bytes) in [
            (1, "aes-cbc-plain64", 32),
            (64, "aes:64-cbc-lmk", 64 * 32),
            (65, "aes:64-cbc-lmk", 65 * 32),
        ] {
            let p = LoopaesParams {
                offset_sectors: 8,
                skip_sectors: 8,
                ..LoopaesParams::default()
            };
            let v = unlock(&keyfile(n), &p).unwrap();
            let plan = plan(&v, &img, "la", &[]).unwrap();
            let words: Vec<&str> = plan.table.split_whitespace().collect();
            assert_eq!(words[..3], ["0", "2040", "crypt"], "{words:?}");
            assert_eq!(words[3], spec);
            assert_eq!(words[4].len(), bytes * 2);
            assert_eq!((words[5], words[7]), ("8", "8"));
        }
    }

    #[test]
    fn refuses_what_cryptsetup_refuses() {
        let p = LoopaesParams::default();
        let e = unlock(b"one-key-without-newline", &p).err().unwrap();
        assert_eq!(e.message, loopaes::INCOMPATIBLE);
        let p = LoopaesParams {
            key_size: 2048,
            ..LoopaesParams::default()
        };
        assert_eq!(
            unlock(&keyfile(1), &p).err().unwrap().message,
            "Invalid key size."
        );
        let p = LoopaesParams {
            cipher: "nosuch".into(),
            ..LoopaesParams::default()
        };
        assert!(unlock(&keyfile(1), &p).is_err());
    }
}
