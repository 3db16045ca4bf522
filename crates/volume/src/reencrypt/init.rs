//! Starting a LUKS2 re-key as cryptsetup 2.6's `reencrypt` does (facts from running it):
//!
//! - every keyslot whose passphrase was given gets a new keyslot for the new volume key
//!   (lowest free number, in keyslot order), with the old keyslot's area cipher and AF hash
//!   and, unless a PBKDF was asked for, its KDF unchanged (no benchmark); each is one
//!   keyslot-area write and one header write, the first also creating the new key's digest
//!   (assigned to no segment yet), and tokens of an old keyslot are given the new one;
//! - then one header write records the reencryption (see
//!   [`Luks2Header::begin_reencrypt`]).
//!
//! Keyslots whose passphrase was not given (`--key-slot`) are dropped when the
//! reencryption finishes, as cryptsetup drops them.
//!
//! A crash between these writes leaves a valid volume under the old key with extra unbound
//! keyslots; no data has been touched yet.

use crate::error::{ErrorClass, Result, VolumeError};
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::kdf::PbkdfRequest;
use cryptblk_format::luks2::{Luks2Header, NewResilience, ReencryptInit};
use cryptblk_format::FormatError;

/// cryptsetup's keyslot limit for LUKS2.
const MAX_KEYSLOTS: usize = 32;

/// The resilience a new reencryption is asked for (`--resilience`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ResilienceChoice {
    /// `none`.
    None,
    /// `checksum` (cryptsetup's default).
    #[default]
    Checksum,
    /// `journal`.
    Journal,
}

impl ResilienceChoice {
    /// The `--resilience` word (also how the control protocol names it).
    pub fn name(self) -> &'static str {
        match self {
            ResilienceChoice::None => "none",
            ResilienceChoice::Checksum => "checksum",
            ResilienceChoice::Journal => "journal",
        }
    }

    /// The choice a `--resilience` word names.
    pub fn from_name(name: &str) -> Option<ResilienceChoice> {
        [Self::None, Self::Checksum, Self::Journal]
            .into_iter()
            .find(|c| c.name() == name)
    }
}

/// Parameters of a new re-key.
#[derive(Clone, Debug)]
pub struct InitParams {
    /// New cipher (`--cipher`); `None` keeps the current one.
    pub cipher: Option<String>,
    /// New volume key size in bytes (`--key-size` / 8).
    pub key_size: Option<usize>,
    /// New encryption sector size (`--sector-size`).
    pub sector_size: Option<u32>,
    /// Hotzone protection.
    pub resilience: ResilienceChoice,
    /// Checksum hash (`--resilience-hash`, default sha256).
    pub resilience_hash: HashAlgorithm,
    /// KDF of the new keyslots when the user chose one; `None` copies each old keyslot's.
    pub pbkdf: Option<PbkdfRequest>,
    /// Data device block size (the checksum block is at least this).
    pub device_block: u32,
    /// True when `--key-slot` limited the passphrases to one keyslot.
    pub one_keyslot: bool,
    /// The new volume key (`--volume-key-file`: its first bytes, as many as the new key
    /// size); `None`: a random one.
    pub new_key: Option<SecretBytes>,
    /// `--reduce-device-size` in bytes: the new data starts this much later, the run goes
    /// backward with `datashift` resilience and the old data's last bytes are dropped.
    pub shift: Option<u64>,
}

/// What [`init`] made.
#[derive(Debug)]
pub struct InitOutcome {
    /// The old volume key.
    pub old_key: SecretBytes,
    /// The new volume key.
    pub new_key: SecretBytes,
    /// `(old keyslot, new keyslot)` pairs.
    pub keyslots: Vec<(usize, usize)>,
    /// The `reencrypt` keyslot.
    pub reencrypt_keyslot: usize,
}

/// The key size cryptsetup picks for a re-key: `--key-size` when given, else with a new
/// cipher its default (512 bits for XTS, 256 otherwise), else the current size.
pub fn new_key_size(current: usize, cipher: Option<&str>, key_size: Option<usize>) -> usize {
    match (key_size, cipher) {
        (Some(k), _) => k,
        (None, Some(c)) if c.contains("xts") => 64,
        (None, Some(_)) => 32,
        (None, None) => current,
    }
}

/// Starts a re-key of `h` (header and data on `io`): `passphrases` are `(keyslot,
/// passphrase)` for the keyslots to carry over, in any order.
pub fn init(
    h: &mut Luks2Header,
    io: &dyn HeaderIo,
    passphrases: &[(usize, SecretBytes)],
    p: &InitParams,
) -> Result<InitOutcome> {
    h.check_requirements()?;
    let seg = h.default_segment()?;
    if seg.integrity.is_some() {
        return Err(VolumeError::usage(
            "Reencryption of device with integrity profile is not supported.",
        ));
    }
    if passphrases.is_empty() {
        return Err(VolumeError::new(
            ErrorClass::NoPermission,
            "No key available with this passphrase.",
        ));
    }
    let keyslots = h.keyslots();
    let active = keyslots
        .iter()
        .filter(|k| k.kind == "luks2" && !k.unbound)
        .count();
    let unbound = keyslots.iter().filter(|k| k.unbound).count();
    if !p.one_keyslot && 2 * active + unbound + 1 > MAX_KEYSLOTS {
        return Err(VolumeError::usage(
            "Not enough free keyslots for reencryption.",
        ));
    }
    let sector_size = p.sector_size.unwrap_or(seg.sector_size);
    if !(512..=4096).contains(&sector_size) || !sector_size.is_power_of_two() {
        return Err(VolumeError::usage(format!(
            "Unsupported encryption sector size {sector_size}."
        )));
    }
    if !h.data_offset().is_multiple_of(u64::from(sector_size)) {
        return Err(VolumeError::usage(
            "Data offset is not aligned to the requested sector size.",
        ));
    }
    let cipher = p.cipher.clone().unwrap_or_else(|| seg.encryption.clone());
    let cur_size = h
        .volume_key_size()
        .ok_or_else(|| VolumeError::device("cannot tell the volume key size"))?;
    let key_size = new_key_size(cur_size, p.cipher.as_deref(), p.key_size);
    // A cipher cryptblk cannot run is refused before anything is written.
    let probe = SecretBytes::random(key_size);
    cryptblk_cipher::open_cipher(
        &cipher,
        probe.as_bytes(),
        &cryptblk_cipher::SectorOptions {
            sector_size: sector_size as usize,
            iv_offset: 0,
            iv_large_sectors: false,
            implementation: None,
        },
    )
    .map_err(|e| VolumeError::usage(format!("Cipher {cipher} (key {key_size} bytes): {e}")))?;
    if let Some(shift) = p.shift {
        // cryptsetup checks this after writing the first new keyslot (and takes it back);
        // checked here, a refusal leaves the header as it was.
        let ss = seg.sector_size.max(sector_size);
        if !shift.is_multiple_of(u64::from(ss)) {
            return Err(VolumeError::usage(format!(
                "Data shift value is not aligned to encryption sector size ({ss} bytes).\n\
                 Failed to initialize LUKS2 reencryption in metadata."
            )));
        }
    }
    // A shifted re-key always uses `datashift` resilience: no checksum blocks.
    if let (ResilienceChoice::Checksum, None) = (p.resilience, p.shift) {
        let block = p.device_block.max(seg.sector_size).max(sector_size);
        let size = io
            .size()
            .map_err(|e| VolumeError::device(format!("reading the device size: {e}")))?;
        super::run::check_checksum_blocks(
            &cryptblk_format::luks2::Resilience::Checksum {
                hash: String::new(),
                sector_size: block,
            },
            size.saturating_sub(h.data_offset()),
        )?;
    }
    // Every passphrase must open its keyslot before anything is written (cryptsetup asks
    // for them all first).
    let mut order: Vec<&(usize, SecretBytes)> = passphrases.iter().collect();
    order.sort_by_key(|(s, _)| *s);
    let mut old_key: Option<SecretBytes> = None;
    for (slot, pass) in &order {
        match h.open_keyslot(io, *slot, pass.as_bytes()) {
            Ok(k) => old_key = Some(k),
            Err(FormatError::WrongPassphrase) => {
                return Err(VolumeError::new(
                    ErrorClass::NoPermission,
                    "No key available with this passphrase.",
                ))
            }
            Err(e) => return Err(e.into()),
        }
    }
    let old_key = old_key.ok_or_else(|| VolumeError::device("no keyslot opened"))?;
    h.verify_volume_key(old_key.as_bytes())?;
    let new_key = match &p.new_key {
        None => SecretBytes::random(key_size),
        Some(k) if k.len() < key_size => {
            return Err(VolumeError::usage(format!(
                "Cannot read {key_size} bytes from volume key file."
            )))
        }
        Some(k) => {
            let k = SecretBytes::from_slice(&k.as_bytes()[..key_size]);
            // cryptsetup keeps the key when the file holds the current one; with nothing
            // else changed there is nothing to do.
            if key_size == cur_size && h.verify_volume_key(k.as_bytes()).is_ok() {
                let unchanged = cipher == seg.encryption && sector_size == seg.sector_size;
                return Err(VolumeError::usage(if unchanged {
                    "No data segment parameters changed. Reencryption aborted."
                } else {
                    "Reencryption keeping the volume key (--keep-key) is not supported by \
                     cryptblk."
                }));
            }
            k
        }
    };
    // cryptsetup skips calibration (1000 iterations) when the KDF is copied or forced.
    let digest_iterations = match &p.pbkdf {
        None => Some(1000),
        Some(r) if r.force_iterations.is_some() => Some(1000),
        Some(_) => None,
    };
    let mut pairs = Vec::new();
    let mut new_digest: Option<String> = None;
    for (slot, pass) in &order {
        let params = h.rekey_keyslot_params(*slot, p.pbkdf)?;
        let new_slot = match &new_digest {
            None => {
                let (s, d) = h.add_keyslot_new_key(
                    io,
                    &new_key,
                    pass.as_bytes(),
                    &params,
                    digest_iterations,
                )?;
                new_digest = Some(d);
                s
            }
            Some(d) => h.add_keyslot_to_digest(io, &new_key, pass.as_bytes(), &params, d)?,
        };
        h.copy_token_keyslot(*slot, new_slot);
        pairs.push((*slot, new_slot));
    }
    let new_digest = new_digest.ok_or_else(|| VolumeError::device("no new keyslot"))?;
    let block = p.device_block.max(seg.sector_size).max(sector_size);
    let resilience = match p.resilience {
        ResilienceChoice::None => NewResilience::None,
        ResilienceChoice::Journal => NewResilience::Journal,
        ResilienceChoice::Checksum => NewResilience::Checksum {
            hash: p.resilience_hash,
            block,
        },
    };
    let reencrypt_keyslot = h.begin_reencrypt(
        &ReencryptInit {
            cipher,
            sector_size,
            resilience,
            new_digest,
            digest_iterations,
            shift: p.shift,
        },
        old_key.as_bytes(),
        new_key.as_bytes(),
    )?;
    h.write_reencryption(io)?;
    Ok(InitOutcome {
        old_key,
        new_key,
        keyslots: pairs,
        reencrypt_keyslot,
    })
}

/// The block size cryptsetup uses for a data device: a regular file's filesystem block
/// (at most a page), a block device's logical sector size.
pub fn device_block_size(file: &std::fs::File) -> u32 {
    use std::os::unix::io::AsRawFd;
    let fd = file.as_raw_fd();
    let page = 4096u32;
    let meta = match file.metadata() {
        Ok(m) => m,
        Err(_) => return page,
    };
    if meta.is_file() {
        // SAFETY: fstatvfs fills the struct it is given; fd is a live descriptor.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstatvfs(fd, &mut st) } == 0 && st.f_bsize > 0 {
            return (st.f_bsize as u64).min(u64::from(page)) as u32;
        }
        return page;
    }
    let mut ss: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int.
    if unsafe { libc::ioctl(fd, libc::BLKSSZGET, &mut ss) } == 0 && ss > 0 {
        return ss as u32;
    }
    page
}

#[cfg(test)]
mod tests {
    use super::ResilienceChoice;

    #[test]
    fn resilience_words_round_trip_and_unknown_ones_are_refused() {
        for (word, c) in [
            ("none", ResilienceChoice::None),
            ("checksum", ResilienceChoice::Checksum),
            ("journal", ResilienceChoice::Journal),
        ] {
            assert_eq!(c.name(), word);
            assert_eq!(ResilienceChoice::from_name(word), Some(c));
        }
        assert_eq!(ResilienceChoice::from_name("datashift"), None);
        assert_eq!(ResilienceChoice::from_name("Checksum"), None);
    }
}
