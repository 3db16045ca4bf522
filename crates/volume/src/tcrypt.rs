//! TrueCrypt and VeraCrypt volumes (`--type tcrypt`): unlock through
//! [`cryptblk_format::tcrypt`], the data segment, the cipher chain as one sector cipher (for
//! offline decryption) and the activation plan.
//!
//! cryptsetup maps a chain of ciphers as one dm-crypt device per cipher, stacked: the last
//! cipher of the chain on the device as `<name>_<n-1>`, each other one over the device
//! below it, the first as `<name>`. The plan here does the same: the lower crypt tables
//! hold keys, so they travel in [`ActivationPlan::keyed_lower`] (never in `info`). The
//! legacy CBC cascades and TrueCrypt's Blowfish have no dm-crypt mode; as cryptsetup, they
//! are refused for activation, and `decrypt` reads them.

use crate::error::{ErrorClass, Result, VolumeError};
use crate::plan::{ActivationPlan, KeyedLower};
use crate::segment::Segment;
use cryptblk_cipher::SectorCipher;
use cryptblk_dm::{CryptConfig, CryptFlags, CryptKey, TableSpec};
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::tcrypt::{self, TcryptParams, TcryptVolume};
use cryptblk_format::FormatError;
use std::fs::File;
use std::path::Path;

/// Finds and decrypts the header of the TCRYPT volume at `path` (or of `header`, for
/// `--header`). No header that decrypts is cryptsetup's "No device header detected with
/// this passphrase." (exit 2); an unknown `--hash`/`--cipher` exits 1.
pub fn unlock(path: &Path, params: &TcryptParams) -> Result<TcryptVolume> {
    let file = File::open(path).map_err(|_| {
        VolumeError::device(format!(
            "Device {} does not exist or access denied.",
            path.display()
        ))
    })?;
    tcrypt::unlock(&file as &dyn HeaderIo, params).map_err(|e| match e {
        FormatError::WrongPassphrase => {
            VolumeError::new(ErrorClass::NoPermission, tcrypt::NO_HEADER)
        }
        other => other.into(),
    })
}

/// The data segment of the volume's outermost layer (the one on the device; the others
/// share its IV offset and length). Its cipher is the chain's mode for the legacy cascades,
/// which have no dm-crypt specification.
pub fn segment(vol: &TcryptVolume) -> Segment {
    let cipher = match vol.layers() {
        Some(l) if !l.is_empty() => l[0].spec.clone(),
        _ => format!("{}-{}", vol.chain.name, vol.chain.mode.spec()),
    };
    Segment {
        cipher,
        offset: vol.data_offset_sectors() * 512,
        size: Some(vol.data_size_sectors() * 512),
        iv_offset: vol.iv_offset_sectors(),
        sector_size: 512,
        integrity: None,
    }
}

/// The whole chain as one sector cipher (every mode), for offline decryption.
pub fn data_cipher(
    vol: &TcryptVolume,
    implementation: Option<String>,
) -> Result<Box<dyn SectorCipher>> {
    Ok(vol.data_cipher(implementation)?)
}

/// The activation plan of an unlocked volume on `device`, as cryptsetup stacks it: the
/// chain's last cipher on the device (`<name>_<n-1>`), each earlier one over the mapping
/// below it, the first as `name`. A chain the kernel cannot map is refused with
/// cryptsetup's message (exit 1).
pub fn plan(
    vol: &TcryptVolume,
    device: &Path,
    name: &str,
    crypt_flags: &[String],
) -> Result<ActivationPlan> {
    let Some(layers) = vol.layers() else {
        return Err(VolumeError::usage(format!(
            "Kernel does not support activation for this TCRYPT legacy mode ({}-{}); \
             'cryptblk decrypt --type tcrypt' reads it.",
            vol.chain.name,
            vol.chain.mode.spec()
        )));
    };
    let seg = segment(vol);
    let n = layers.len();
    // layers[0] is read first: it sits on the device, with the data offset.
    let bottom = seg.crypt_table(&layers[0].key, device, crypt_flags)?;
    let len = seg.mapped_len(0, device)? / 512;
    let flags = CryptFlags::parse(crypt_flags).map_err(VolumeError::usage)?;
    let lower_name = |i: usize| format!("{name}_{i}");
    let mut keyed_lower = Vec::new();
    let mut table = bottom;
    for (i, layer) in layers.iter().enumerate().skip(1) {
        // The mapping below this one is layers[i - 1], named for its depth.
        keyed_lower.push(KeyedLower {
            name: lower_name(n - i),
            table,
        });
        let mut cfg = CryptConfig::new(
            &layer.spec,
            CryptKey::for_cipher(&layer.spec, &layer.key),
            seg.iv_offset,
            &format!("/dev/mapper/{}", lower_name(n - i)),
            0,
        );
        cfg.flags = flags;
        cfg.flags.sector_size = 512;
        table = TableSpec::single(len, cfg).to_text(true);
    }
    Ok(ActivationPlan {
        name: name.to_string(),
        table,
        lower: Vec::new(),
        keyed_lower,
        info: crate::facts::VolumeFacts {
            kind: "TCRYPT".into(),
            // As cryptsetup's status: the chain and its mode.
            cipher: Some(format!("{}-{}", vol.chain.name, vol.chain.mode.spec())),
            keysize: Some(format!("{} bits", vol.volume_key.len() * 8)),
            device: Some(device.display().to_string()),
            sector_size: Some(512),
            offset: Some(format!("{} sectors", seg.offset / 512)),
            skipped: Some(format!("{} sectors", seg.iv_offset)),
            ..Default::default()
        },
    })
}
