//! Starting `reencrypt --encrypt` and `--decrypt` as cryptsetup 2.6.1 does (facts from
//! tracing its writes):
//!
//! - **encrypt with a data shift** (`--reduce-device-size 2N`, header on the device): the
//!   new header (keyslot for a random volume key, the reencryption metadata; see
//!   [`Luks2Header::begin_encrypt`]) is built in memory for a data offset of `N`; the
//!   first `N` bytes of plaintext are copied to `device - N` and synced; then the whole
//!   header area is written over the start in one write and synced. A crash before that
//!   write leaves the plain device (with a spare copy at its end); after it, the header
//!   names the copy as the moved segment.
//! - **encrypt with a detached header** (`--header FILE`): the header is written to
//!   `FILE`; the device is not touched until the run.
//! - **decrypt with a detached header**: one header write records the reencryption
//!   (backward, resilience as asked).
//! - **decrypt with the header on the device** (`--header NEW_FILE`): see
//!   [`init_decrypt_export`].

use super::init::ResilienceChoice;
use super::keys::ReencryptKeys;
use crate::error::{ErrorClass, Result, VolumeError};
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::hdrio::{HeaderIo, MemIo};
use cryptblk_format::luks2::{
    EncDecInit, FormatParams, KeyslotParams, Luks2Header, NewResilience, UnlockPurpose,
};
use cryptblk_format::FormatError;

/// cryptsetup's size of a detached header it creates (16 MiB).
const DETACHED_HEADER_SIZE: u64 = 16 << 20;
/// cryptsetup's limit on `--reduce-device-size` (1 GiB).
pub const MAX_REDUCE: u64 = 1 << 30;

/// Parameters of a new encryption.
#[derive(Clone, Debug)]
pub struct EncryptParams {
    /// Cipher (`aes-xts-plain64`).
    pub cipher: String,
    /// Volume key bytes.
    pub key_size: usize,
    /// Encryption sector size.
    pub sector_size: u32,
    /// Hotzone protection (detached header only; a data shift is its own).
    pub resilience: ResilienceChoice,
    /// Checksum hash.
    pub resilience_hash: HashAlgorithm,
    /// Keyslot parameters of keyslot 0.
    pub keyslot: KeyslotParams,
    /// `--reduce-device-size` in bytes; `None` with a detached header.
    pub reduce: Option<u64>,
    /// Data device block size.
    pub device_block: u32,
    /// Iterations of the digests (`None`: calibrated).
    pub digest_iterations: Option<u32>,
}

fn resilience(choice: ResilienceChoice, hash: HashAlgorithm, block: u32) -> NewResilience {
    match choice {
        ResilienceChoice::None => NewResilience::None,
        ResilienceChoice::Journal => NewResilience::Journal,
        ResilienceChoice::Checksum => NewResilience::Checksum { hash, block },
    }
}

fn io_err(what: &'static str) -> impl Fn(std::io::Error) -> VolumeError {
    move |e| VolumeError::device(format!("{what}: {e}"))
}

/// Starts an encryption of the plain device `data` in place: with `p.reduce` the header
/// goes on `data` (datashift), else on `header` (a new detached header file, which must
/// be given). Returns the header and the new volume key.
pub fn init_encrypt(
    data: &dyn HeaderIo,
    header: Option<&dyn HeaderIo>,
    passphrase: &[u8],
    p: &EncryptParams,
) -> Result<(Luks2Header, SecretBytes)> {
    let dev = data.size().map_err(io_err("reading the device size"))?;
    let block = p.device_block.max(p.sector_size);
    let (shift, data_size) = match (p.reduce, header) {
        (Some(r), None) => {
            if r == 0 || r % 4096 != 0 || r > MAX_REDUCE {
                return Err(VolumeError::usage("Invalid device size specification."));
            }
            if r >= dev {
                return Err(VolumeError::usage("Device is too small."));
            }
            let shift = r / 2;
            if shift < 2 * 16384 + 4096 * 2 {
                return Err(VolumeError::usage(
                    "Data shift is not large enough to hold the LUKS2 header.",
                ));
            }
            (Some(shift), dev - r)
        }
        (None, Some(_)) => (None, dev),
        (Some(_), Some(_)) => {
            return Err(VolumeError::usage(
                "encryption with both --reduce-device-size and a detached header is not \
                 supported by cryptblk",
            ))
        }
        (None, None) => {
            return Err(VolumeError::usage(
                "Encryption without detached header (--header) is not possible without data \
                 device size reduction (--reduce-device-size).",
            ))
        }
    };
    if !data_size.is_multiple_of(u64::from(p.sector_size)) {
        return Err(VolumeError::usage(format!(
            "The data area ({data_size} bytes) is not a multiple of the {}-byte encryption \
             sector.",
            p.sector_size
        )));
    }
    if shift.is_none() && p.resilience == ResilienceChoice::Checksum {
        super::run::check_checksum_blocks(
            &cryptblk_format::luks2::Resilience::Checksum {
                hash: String::new(),
                sector_size: block,
            },
            data_size,
        )?;
    }
    let area = shift.unwrap_or(DETACHED_HEADER_SIZE);
    // One spare block: formatting wants room for data after the header area.
    let mem = MemIo::zeroed(area as usize + 4096);
    let fp = FormatParams {
        cipher: p.cipher.clone(),
        key_size: p.key_size,
        sector_size: p.sector_size,
        data_offset: Some(shift.unwrap_or(0)),
        detached_header: shift.is_none(),
        keyslot: p.keyslot.clone(),
        ..FormatParams::default()
    };
    let (mut h, key, _) = Luks2Header::format(&mem, &fp, passphrase)?;
    h.begin_encrypt(
        &EncDecInit {
            resilience: resilience(p.resilience, p.resilience_hash, block),
            shift,
            data_size,
            digest_iterations: p.digest_iterations,
        },
        dev,
        key.as_bytes(),
    )?;
    h.write_reencryption(&mem)?;
    let mut image = mem.into_inner();
    image.truncate(area as usize);
    match (shift, header) {
        (Some(shift), _) => {
            // The first `shift` bytes of plaintext go to the end first: the header will
            // overwrite them.
            let mut first = vec![0u8; shift as usize];
            data.read_at(0, &mut first)
                .map_err(io_err("reading the device start"))?;
            data.write_at(shift + data_size, &first)
                .map_err(io_err("moving the first data segment"))?;
            data.sync().map_err(io_err("syncing the data"))?;
            data.write_at(0, &image)
                .map_err(io_err("writing the LUKS2 header"))?;
            data.sync().map_err(io_err("syncing the header"))?;
        }
        (None, Some(hdr)) => {
            hdr.write_at(0, &image)
                .map_err(io_err("writing the LUKS2 header"))?;
            hdr.sync().map_err(io_err("syncing the header"))?;
        }
        (None, None) => unreachable!("refused above"),
    }
    Ok((h, key))
}

/// Starts a decryption of the LUKS2 volume whose (detached) header is `h` on `header`:
/// the passphrase opens the volume key (keyslot `slot` when given). Returns the keys for
/// [`super::run::run_split`].
#[allow(clippy::too_many_arguments)]
pub fn init_decrypt(
    h: &mut Luks2Header,
    header: &dyn HeaderIo,
    data_size: u64,
    passphrase: &[u8],
    slot: Option<usize>,
    choice: ResilienceChoice,
    hash: HashAlgorithm,
    device_block: u32,
    digest_iterations: Option<u32>,
) -> Result<ReencryptKeys> {
    h.check_requirements()?;
    let seg = h.default_segment()?;
    if seg.integrity.is_some() {
        return Err(VolumeError::usage(
            "Reencryption of device with integrity profile is not supported.",
        ));
    }
    let key = unlock_old(h, header, passphrase, slot)?;
    let block = device_block.max(seg.sector_size);
    if choice == ResilienceChoice::Checksum {
        super::run::check_checksum_blocks(
            &cryptblk_format::luks2::Resilience::Checksum {
                hash: String::new(),
                sector_size: block,
            },
            data_size,
        )?;
    }
    h.begin_decrypt(
        &EncDecInit {
            resilience: resilience(choice, hash, block),
            shift: None,
            data_size,
            digest_iterations,
        },
        key.as_bytes(),
    )?;
    h.write_reencryption(header)?;
    Ok(ReencryptKeys {
        old: Some(key),
        new: None,
    })
}

/// Starts a decryption of the LUKS2 volume whose header `h` is on `data` itself, as
/// cryptsetup 2.6.1's `reencrypt --decrypt --header NEW_FILE` does (facts from tracing
/// its writes): the data moves back by the data offset `N`, so the plaintext will start
/// at byte 0. After every check (the passphrase, the parameters), in this order, each
/// synced: the header area `[0, N)` is copied to `export` (a new, empty file), the two
/// LUKS2 magics on `data` are wiped ([`export_header`]), the first `N` bytes of
/// ciphertext are copied to the device start ([`move_first_segment`]), and the
/// reencryption header is written to `export`. A crash before the last write leaves
/// `export` holding the original header, which still describes the data (untouched from
/// `N` on) as a detached header. Returns the keys for [`super::run::run_split`] with
/// `export` as the header. Online, [`super::online::start_decrypt_export`] does the same
/// steps with the served volume's I/O held over the last two.
#[allow(clippy::too_many_arguments)]
pub fn init_decrypt_export(
    h: &mut Luks2Header,
    data: &dyn HeaderIo,
    export: &dyn HeaderIo,
    passphrase: &[u8],
    slot: Option<usize>,
    choice: ResilienceChoice,
    hash: HashAlgorithm,
    device_block: u32,
    digest_iterations: Option<u32>,
) -> Result<ReencryptKeys> {
    check_decrypt_export(h)?;
    let key = unlock_old(h, data, passphrase, slot)?;
    let dev = data.size().map_err(io_err("reading the device size"))?;
    let mut new_h = plan_decrypt_export(
        h,
        dev,
        &key,
        &DecryptResilience {
            choice,
            hash,
            device_block,
            digest_iterations,
        },
    )?;
    let shift = h.default_segment()?.offset;
    export_header(h, data, export)?;
    move_first_segment(data, shift)?;
    new_h.write_reencryption(export)?;
    *h = new_h;
    Ok(ReencryptKeys {
        old: Some(key),
        new: None,
    })
}

/// How a decryption protects its hotzones (the choice, the checksum hash, the device
/// block) and the iterations of its reencryption digest (`None`: calibrated).
#[derive(Clone, Copy, Debug)]
pub struct DecryptResilience {
    /// `--resilience` (a data shift adds its own).
    pub choice: ResilienceChoice,
    /// `--resilience-hash`.
    pub hash: HashAlgorithm,
    /// The data device's block size.
    pub device_block: u32,
    /// Iterations of the reencryption digest (`None`: calibrated).
    pub digest_iterations: Option<u32>,
}

/// Refuses a volume whose header cannot be exported by [`init_decrypt_export`]: an
/// integrity profile, or a data offset that is not a whole number of 4 KiB blocks up to
/// 1 GiB (the data moves back by it). Checks no key.
pub fn check_decrypt_export(h: &Luks2Header) -> Result<()> {
    h.check_requirements()?;
    let seg = h.default_segment()?;
    if seg.integrity.is_some() {
        return Err(VolumeError::usage(
            "Reencryption of device with integrity profile is not supported.",
        ));
    }
    let shift = seg.offset;
    if shift == 0 || shift > MAX_REDUCE || !shift.is_multiple_of(4096) {
        return Err(VolumeError::usage(format!(
            "Moving the data back by the data offset ({shift} bytes) is not supported."
        )));
    }
    Ok(())
}

/// The header a decryption exporting `h` records (in memory, nothing written) for a data
/// device of `dev` bytes, the volume key `key` checked against `h`'s digest.
pub fn plan_decrypt_export(
    h: &Luks2Header,
    dev: u64,
    key: &SecretBytes,
    r: &DecryptResilience,
) -> Result<Luks2Header> {
    check_decrypt_export(h)?;
    let seg = h.default_segment()?;
    let shift = seg.offset;
    let data_size = dev.saturating_sub(shift);
    let data_size = seg.size.unwrap_or(data_size).min(data_size);
    if data_size == 0 {
        return Err(VolumeError::usage("Device is too small."));
    }
    let block = r.device_block.max(seg.sector_size);
    if r.choice == ResilienceChoice::Checksum {
        super::run::check_checksum_blocks(
            &cryptblk_format::luks2::Resilience::Checksum {
                hash: String::new(),
                sector_size: block,
            },
            data_size,
        )?;
    }
    let mut new_h = h.clone();
    new_h.begin_decrypt(
        &EncDecInit {
            resilience: resilience(r.choice, r.hash, block),
            shift: Some(shift),
            data_size,
            digest_iterations: r.digest_iterations,
        },
        key.as_bytes(),
    )?;
    Ok(new_h)
}

/// Copies `len` bytes from `from` at `src` to `to` at `dst` in 4 MiB pieces, then syncs
/// `to`.
fn copy_range(
    from: &dyn HeaderIo,
    src: u64,
    to: &dyn HeaderIo,
    dst: u64,
    len: u64,
    what: &'static str,
) -> Result<()> {
    let mut buf = vec![0u8; (4u64 << 20).min(len) as usize];
    let mut pos = 0u64;
    while pos < len {
        let n = ((len - pos) as usize).min(buf.len());
        from.read_at(src + pos, &mut buf[..n])
            .map_err(io_err("reading the device"))?;
        to.write_at(dst + pos, &buf[..n]).map_err(io_err(what))?;
        pos += n as u64;
    }
    to.sync().map_err(io_err(what))
}

/// The first step of [`init_decrypt_export`]: the header area of `h` (`[0, data
/// offset)`) copied from `data` to `export` and synced, then the two LUKS2 magics on
/// `data` wiped and synced. The data itself is not touched: `export` is a detached
/// header of the same volume.
pub fn export_header(h: &Luks2Header, data: &dyn HeaderIo, export: &dyn HeaderIo) -> Result<()> {
    let shift = h.default_segment()?.offset;
    copy_range(data, 0, export, 0, shift, "exporting the LUKS2 header")?;
    let zeros = [0u8; 6];
    for at in [0, h.metadata_size()] {
        data.write_at(at, &zeros)
            .map_err(io_err("wiping the LUKS2 signature"))?;
    }
    data.sync().map_err(io_err("wiping the LUKS2 signature"))
}

/// Undoes [`export_header`] (a start that failed before the reencryption header was
/// written): the header area copied back from `export` to `data` and synced.
pub fn restore_exported_header(export: &dyn HeaderIo, data: &dyn HeaderIo, len: u64) -> Result<()> {
    copy_range(export, 0, data, 0, len, "restoring the LUKS2 header")
}

/// The second step of [`init_decrypt_export`]: the first `shift` bytes of ciphertext
/// (`[shift, 2 shift)`, or all of it when the data is shorter) copied to the device start
/// (the moved segment) and synced.
pub fn move_first_segment(data: &dyn HeaderIo, shift: u64) -> Result<()> {
    let dev = data.size().map_err(io_err("reading the device size"))?;
    let len = shift.min(dev.saturating_sub(shift));
    copy_range(data, shift, data, 0, len, "moving the first data segment")
}

/// The volume key the passphrase opens in `h` (keyslot `slot` when given), with
/// cryptsetup's message for a wrong passphrase.
pub fn unlock_old(
    h: &Luks2Header,
    header: &dyn HeaderIo,
    passphrase: &[u8],
    slot: Option<usize>,
) -> Result<SecretBytes> {
    match h.unlock(header, passphrase, slot, UnlockPurpose::Activate) {
        Ok(u) => Ok(u.key),
        Err(FormatError::WrongPassphrase) => Err(VolumeError::new(
            ErrorClass::NoPermission,
            "No key available with this passphrase.",
        )),
        Err(e) => Err(e.into()),
    }
}
