//! FileVault2 (CoreStorage) volumes: loading, unlocking and the activation plan, as
//! cryptsetup's FVAULT2 support maps them through dm-crypt: one `aes-xts-plain64` line over
//! the logical volume, IVs counted from its first sector. cryptsetup maps it read-write
//! unless `--readonly` is given, and so does cryptblk.

use crate::device::{device_size, open_file};
use crate::error::{Result, VolumeError};
use crate::plan::ActivationPlan;
use crate::segment::Segment;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::fvault2::{Fvault2Header, CIPHER, CIPHER_MODE, VOLUME_KEY_SIZE};
use cryptblk_format::FormatError;
use std::path::Path;

pub use cryptblk_format::fvault2::Fvault2Header as Header;

/// Reads the FVAULT2 metadata of `device`, with cryptsetup's message for what is not one.
pub fn load(device: &Path) -> Result<Fvault2Header> {
    let f = open_file(device, false)?;
    Fvault2Header::read(&f).map_err(|e| match e {
        FormatError::NotLuks => VolumeError::usage(format!(
            "Device {} is not a valid FVAULT2 device.",
            device.display()
        )),
        e => VolumeError::usage(format!(
            "Device {} is not a valid FVAULT2 device ({e}).",
            device.display()
        )),
    })
}

/// The volume key from `passphrase` (see [`Fvault2Header::unlock`]).
pub fn unlock(h: &Fvault2Header, passphrase: &[u8]) -> Result<SecretBytes> {
    Ok(h.unlock(passphrase)?)
}

/// A `--volume-key-file` key as cryptsetup reads it: the first 32 bytes of the file (it
/// cannot be checked against the metadata, which holds no digest of it).
pub fn volume_key_from_file(contents: SecretBytes, path: &Path) -> Result<SecretBytes> {
    if contents.len() < VOLUME_KEY_SIZE {
        return Err(VolumeError::usage(format!(
            "Cannot read {VOLUME_KEY_SIZE} bytes from keyfile {}.",
            path.display()
        )));
    }
    Ok(SecretBytes::from_slice(
        &contents.as_bytes()[..VOLUME_KEY_SIZE],
    ))
}

/// The data segment: the logical volume, refused as cryptsetup's activation refuses it when
/// it does not fit `device` (in whole 512-byte sectors, as dm sees it).
pub fn segment(h: &Fvault2Header, device: &Path) -> Result<Segment> {
    let dev_sectors = device_size(device)? / 512;
    let offset = h.lv_offset / 512;
    if offset >= dev_sectors {
        return Err(VolumeError::usage(format!(
            "Requested offset is beyond real size of device {}.",
            device.display()
        )));
    }
    // A size below one sector means "the rest of the device" to cryptsetup.
    let size = match h.lv_size / 512 {
        0 => dev_sectors - offset,
        n => n,
    };
    if dev_sectors - offset < size {
        return Err(VolumeError::usage(format!(
            "Device {} is too small.",
            device.display()
        )));
    }
    Ok(Segment {
        cipher: format!("{CIPHER}-{CIPHER_MODE}"),
        offset: offset * 512,
        size: Some(size * 512),
        iv_offset: 0,
        sector_size: 512,
        integrity: None,
    })
}

/// The plan that activates unlocked volume `h` (key `vk`) on `device` as `name`; `flags`
/// are extra dm-crypt options.
pub fn plan(
    h: &Fvault2Header,
    vk: &SecretBytes,
    device: &Path,
    name: &str,
    flags: &[String],
) -> Result<ActivationPlan> {
    let seg = segment(h, device)?;
    let table = seg.crypt_table(vk, device, flags)?;
    Ok(ActivationPlan {
        name: name.to_string(),
        table,
        lower: Vec::new(),
        keyed_lower: Vec::new(),
        info: crate::facts::VolumeFacts {
            kind: "FVAULT2".into(),
            uuid: Some(h.pv_uuid.to_string()),
            cipher: Some(seg.cipher.clone()),
            keysize: Some(format!("{} bits", vk.len() * 8)),
            device: Some(device.display().to_string()),
            sector_size: Some(512),
            offset: Some(format!("{} sectors", seg.offset / 512)),
            ..Default::default()
        },
    })
}

/// Writes the unlocked logical volume (what `open` serves) to `dst`: the plan's table run
/// by an in-process dm, so the offline image and the served device are the same bytes.
pub fn write_plaintext(
    h: &Fvault2Header,
    vk: &SecretBytes,
    device: &Path,
    dst: &mut dyn std::io::Write,
    progress: &mut dyn crate::progress::Progress,
) -> Result<()> {
    let p = plan(h, vk, device, "fvault2-decrypt", &[])?;
    crate::offline::write_table_plaintext(&p.table, dst, progress)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(lv_offset: u64, lv_size: u64) -> Fvault2Header {
        Fvault2Header {
            pv_uuid: String::new(),
            family_uuid: [0; 16],
            block_size: 4096,
            lv_offset,
            lv_size,
            pbkdf2_iterations: 1,
            pbkdf2_salt: [0; 16],
            wrapped_kek: [0; 24],
            wrapped_vk: [0; 24],
        }
    }

    #[test]
    fn segment_fits_the_device_as_cryptsetup_checks_it() {
        let dir = std::env::temp_dir().join(format!("cryptblk-fvault2-seg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dev = dir.join("dev");
        std::fs::File::create(&dev)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let s = segment(&header(4096, 8192), &dev).unwrap();
        assert_eq!((s.offset, s.size, s.iv_offset), (4096, Some(8192), 0));
        assert_eq!(s.cipher, "aes-xts-plain64");
        // Exactly to the end, then one sector past it.
        assert!(segment(&header(4096, (1 << 20) - 4096), &dev).is_ok());
        let e = segment(&header(4096, (1 << 20) - 4096 + 512), &dev).unwrap_err();
        assert_eq!((e.code as i32, e.message.contains("too small")), (1, true));
        let e = segment(&header(1 << 20, 512), &dev).unwrap_err();
        assert!(e.message.contains("beyond real size"), "{e}");
        // Under one sector: the rest of the device.
        let s = segment(&header(4096, 100), &dev).unwrap();
        assert_eq!(s.size, Some((1 << 20) - 4096));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn volume_key_file_takes_the_first_32_bytes() {
        let p = Path::new("vk");
        let long = SecretBytes::from_vec((0..40).collect());
        let vk = volume_key_from_file(long, p).unwrap();
        assert_eq!(vk.as_bytes(), &(0..32).collect::<Vec<u8>>()[..]);
        let e = volume_key_from_file(SecretBytes::from_vec(vec![0; 31]), p).unwrap_err();
        assert_eq!(e.message, "Cannot read 32 bytes from keyfile vk.");
    }
}
