//! BitLocker volumes: loading, unlocking and the activation plan, as cryptsetup's BITLK
//! support maps them through dm-crypt.
//!
//! The mapped device is the volume as Windows shows it: its first sectors come from the
//! encrypted copy BitLocker moved to the "volume header" area, the FVE metadata areas and
//! that copy read as zeros (`zero` lines), and everything else is decrypted in place with IVs
//! from the sector's own position (`crypt` lines with matching `iv_offset`).

use crate::device::{open_file, table_path};
use crate::error::{Result, VolumeError};
use crate::plan::ActivationPlan;
use cryptblk_cipher::SecretBytes;
use cryptblk_dm::{CryptConfig, CryptFlags, CryptKey, TableSpec, ZeroConfig};
use cryptblk_format::bitlk::{BitlkHeader, BitlkKey, BitlkKind, Protection, METADATA_AREA_SIZE};
use cryptblk_format::FormatError;
use std::path::Path;

pub use cryptblk_format::bitlk::BitlkHeader as Header;

/// Reads the BitLocker header of `device`, with cryptsetup's messages for what is not one.
pub fn load(device: &Path) -> Result<BitlkHeader> {
    let f = open_file(device, false)?;
    BitlkHeader::read(&f).map_err(|e| match e {
        FormatError::NotLuks => VolumeError::usage(format!(
            "Device {} is not a valid BITLK device.",
            device.display()
        )),
        FormatError::Io { .. } | FormatError::Corrupt(_) => VolumeError::usage(format!(
            "Device {} is not a valid BITLK device ({e}).",
            device.display()
        )),
        e => e.into(),
    })
}

/// Refuses what cryptsetup does not activate: volumes being encrypted on write (or only
/// partly encrypted), and volumes no protector of which cryptblk can use (TPM, smart card).
pub fn check_activatable(h: &BitlkHeader) -> Result<()> {
    if h.kind == BitlkKind::EncryptOnWrite {
        return Err(VolumeError::usage(
            "BITLK devices with type 'encrypt-on-write' cannot be activated.",
        ));
    }
    let usable = h.vmks.iter().any(|v| {
        matches!(
            v.protection,
            Protection::Passphrase
                | Protection::RecoveryPassphrase
                | Protection::StartupKey
                | Protection::ClearKey
        )
    });
    if !usable {
        return Err(VolumeError::usage(
            "BITLK volume has only TPM or smart card protectors, which cannot be used here.",
        ));
    }
    Ok(())
}

/// The volume key from `key` (see [`BitlkHeader::unlock`]).
pub fn unlock(h: &BitlkHeader, key: &BitlkKey<'_>) -> Result<SecretBytes> {
    Ok(h.unlock(key)?)
}

/// A `--volume-key-file` key, checked for the size the cipher takes (cryptsetup cannot
/// verify a BitLocker volume key against the header either).
pub fn check_volume_key(h: &BitlkHeader, vk: &SecretBytes) -> Result<()> {
    if vk.len() != h.encryption.key_bytes() {
        return Err(VolumeError::usage(format!(
            "Cannot read {} bytes from keyfile (BITLK volume key size).",
            h.encryption.key_bytes()
        )));
    }
    Ok(())
}

/// The dm table of the unlocked volume on `device` (keys included: only ever sent over a
/// pipe); `flags` are extra dm-crypt options.
pub fn table(
    h: &BitlkHeader,
    vk: &SecretBytes,
    device: &Path,
    flags: &[String],
) -> Result<TableSpec> {
    let dev = table_path(device)?.display().to_string();
    let ss = u64::from(h.sector_size);
    let mut crypt_flags = CryptFlags::parse(flags).map_err(VolumeError::usage)?;
    crypt_flags.sector_size = h.sector_size;
    // IVs count whole encryption sectors: eboiv and the diffuser then see byte offsets.
    crypt_flags.iv_large_sectors = h.sector_size > 512;
    let crypt = |iv_from: u64, dev_from: u64| {
        let mut c = CryptConfig::new(
            &h.encryption.spec(),
            CryptKey::for_cipher(&h.encryption.spec(), vk),
            iv_from / 512,
            &dev,
            dev_from / 512,
        );
        c.flags = crypt_flags;
        c
    };
    let mut hidden: Vec<(u64, u64)> = h
        .metadata_offsets
        .iter()
        .map(|&o| (o, METADATA_AREA_SIZE))
        .collect();
    hidden.push((h.volume_header_offset, h.volume_header_size));
    hidden.sort_unstable();
    let misaligned = std::iter::once(h.volume_size)
        .chain(hidden.iter().flat_map(|&(o, l)| [o, l]))
        .any(|v| !v.is_multiple_of(ss));
    if misaligned {
        return Err(VolumeError::usage(format!(
            "BITLK metadata areas are not aligned to the {ss}-byte sector size."
        )));
    }
    let mut t = TableSpec::default();
    // The original first sectors, from their encrypted copy (IVs of where the copy lies).
    t.push(
        h.volume_header_size / 512,
        crypt(h.volume_header_offset, h.volume_header_offset),
    );
    let mut pos = h.volume_header_size;
    for (o, l) in hidden {
        let end = o + l;
        if end <= pos {
            continue;
        }
        if o > pos {
            t.push((o - pos) / 512, crypt(pos, pos));
        }
        t.push((end - o.max(pos)) / 512, ZeroConfig);
        pos = end;
    }
    if h.volume_size > pos {
        t.push((h.volume_size - pos) / 512, crypt(pos, pos));
    }
    Ok(t)
}

/// The plan that activates unlocked BitLocker volume `h` (key `vk`) on `device` as `name`.
pub fn plan(
    h: &BitlkHeader,
    vk: &SecretBytes,
    device: &Path,
    name: &str,
    flags: &[String],
) -> Result<ActivationPlan> {
    check_activatable(h)?;
    let t = table(h, vk, device, flags)?;
    Ok(ActivationPlan {
        name: name.to_string(),
        table: t.to_text(true),
        lower: Vec::new(),
        keyed_lower: Vec::new(),
        info: crate::facts::VolumeFacts {
            kind: "BITLK".into(),
            uuid: Some(h.guid.to_string()),
            cipher: Some(h.encryption.spec().to_string()),
            keysize: Some(format!("{} bits", vk.len() * 8)),
            device: Some(device.display().to_string()),
            sector_size: Some(u64::from(h.sector_size)),
            offset: Some("0 sectors".into()),
            ..Default::default()
        },
    })
}

/// Writes the unlocked volume (what `open` serves) to `dst`: the plan's table run by an
/// in-process dm, so the offline image and the served device are the same bytes.
pub fn write_plaintext(
    h: &BitlkHeader,
    vk: &SecretBytes,
    device: &Path,
    dst: &mut dyn std::io::Write,
    progress: &mut dyn crate::progress::Progress,
) -> Result<()> {
    check_activatable(h)?;
    let t = table(h, vk, device, &[])?;
    crate::offline::write_table_plaintext(&t.to_text(true), dst, progress)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cryptblk_format::bitlk::{EncryptedKey, Encryption, Vmk};

    fn header(kind: BitlkKind, protections: &[Protection]) -> BitlkHeader {
        let key = EncryptedKey {
            nonce: [0; 12],
            data: vec![0; 60],
        };
        BitlkHeader {
            kind,
            version: 2,
            guid: String::new(),
            sector_size: 512,
            volume_size: 64 << 20,
            created: 0,
            description: String::new(),
            encryption: Encryption::Xts(128),
            vmks: protections
                .iter()
                .map(|&protection| Vmk {
                    guid: String::new(),
                    name: None,
                    protection,
                    salt: [0; 16],
                    key: Some(key.clone()),
                    clear_key: None,
                })
                .collect(),
            fvek: key.clone(),
            metadata_offsets: [16 << 20, 32 << 20, 48 << 20],
            volume_header_offset: (16 << 20) + METADATA_AREA_SIZE,
            volume_header_size: 8192,
        }
    }

    #[test]
    fn refusals_are_cryptsetups_class() {
        let tpm = header(BitlkKind::Normal, &[Protection::Tpm, Protection::SmartCard]);
        let e = check_activatable(&tpm).unwrap_err();
        assert_eq!(e.code as i32, 1);
        let eow = header(BitlkKind::EncryptOnWrite, &[Protection::Passphrase]);
        assert!(check_activatable(&eow)
            .unwrap_err()
            .message
            .contains("encrypt-on-write"));
        let ok = header(
            BitlkKind::Normal,
            &[Protection::Tpm, Protection::RecoveryPassphrase],
        );
        assert!(check_activatable(&ok).is_ok());
    }

    #[test]
    fn table_hides_metadata_and_moves_the_header_back() {
        let h = header(BitlkKind::Normal, &[Protection::Passphrase]);
        let vk = SecretBytes::from_vec(vec![1; 32]);
        let t = table(&h, &vk, Path::new("/dev/null"), &[]).unwrap();
        let kinds: Vec<String> = t
            .to_text(false)
            .lines()
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .collect();
        let m = |mib: u64| mib * 2048;
        let vh = (16 << 20) / 512 + 128;
        assert_eq!(
            kinds,
            vec![
                "0 16 crypt".to_string(),
                format!("16 {} crypt", m(16) - 16),
                format!("{} 128 zero", m(16)),
                format!("{} 16 zero", m(16) + 128),
                format!("{} {} crypt", vh + 16, m(32) - vh - 16),
                format!("{} 128 zero", m(32)),
                format!("{} {} crypt", m(32) + 128, m(16) - 128),
                format!("{} 128 zero", m(48)),
                format!("{} {} crypt", m(48) + 128, m(16) - 128),
            ]
        );
        let first = t.lines[0].target.as_crypt().unwrap();
        assert_eq!((first.iv_offset, first.offset), (vh, vh));
        assert_eq!(t.len_sectors(), m(64));
    }
}
