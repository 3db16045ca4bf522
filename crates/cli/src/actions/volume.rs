//! A LUKS volume of either version behind one interface, and what every action needs to
//! reach it: the header device, passphrases, KDF choices and the data segment.

use crate::args::{Opts, PbkdfKind, VolumeType};
use crate::exit::{ExitCode, Failure};
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::kdf::{PbkdfKind as Kind, PbkdfRequest};
use cryptblk_format::keyfile::{self, KeyFileLimits, KeySource};
use cryptblk_format::luks1::Luks1Volume;
use cryptblk_format::luks2::{KeyslotParams, Luks2Header, UnlockPurpose};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// The data segment of an unlocked volume, as a crypt table needs it.
#[derive(Debug, Clone)]
pub struct Segment {
    /// Cipher specification.
    pub cipher: String,
    /// Byte offset of the data on the data device.
    pub offset: u64,
    /// Length in bytes; `None` to the end of the data device.
    pub size: Option<u64>,
    /// IV offset in 512-byte sectors.
    pub iv_offset: u64,
    /// Encryption sector size.
    pub sector_size: u32,
    /// Integrity (LUKS2 `--integrity`), which this build cannot activate.
    pub integrity: Option<String>,
}

/// An opened LUKS volume.
pub enum Volume {
    /// LUKS1.
    Luks1(Box<Luks1Volume<File>>),
    /// LUKS2 with its header device.
    Luks2(Box<Luks2Header>, File),
}

/// The file that holds the header: `--header` or the device itself.
pub fn header_path<'a>(opts: &'a Opts, device: &'a Path) -> &'a Path {
    opts.header.as_deref().unwrap_or(device)
}

/// Opens `path` for reading (and writing when `write`), naming the device on failure.
pub fn open_file(path: &Path, write: bool) -> Result<File, Failure> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .open(path)
        .map_err(|e| {
            let code = match e.kind() {
                std::io::ErrorKind::PermissionDenied => ExitCode::NoPermission,
                _ => ExitCode::WrongDevice,
            };
            Failure::new(
                code,
                format!(
                    "Device {} does not exist or access denied ({e}).",
                    path.display()
                ),
            )
        })
}

/// LUKS version in the primary header's magic, if any.
pub fn probe_version(file: &File) -> Option<u16> {
    let mut b = [0u8; 8];
    std::os::unix::fs::FileExt::read_exact_at(file, &mut b, 0).ok()?;
    if &b[..6] == b"LUKS\xba\xbe" {
        Some(u16::from_be_bytes([b[6], b[7]]))
    } else {
        None
    }
}

impl Volume {
    /// Loads the header of `device` (or `--header`), refusing a type other than `--type`.
    pub fn load(opts: &Opts, device: &Path, write: bool) -> Result<Volume, Failure> {
        let path = header_path(opts, device);
        let file = open_file(path, write)?;
        let version = probe_version(&file);
        let not_luks = || {
            Failure::usage(format!(
                "Device {} is not a valid LUKS device.",
                path.display()
            ))
        };
        // A damaged LUKS2 primary is still LUKS2 when the secondary copy survives.
        let version = match version {
            Some(v) => v,
            None if opts.volume_type != Some(VolumeType::Luks1) => match Luks2Header::read(&file) {
                Ok(mut h) => {
                    if write {
                        h.check_requirements()?;
                        h.repair(&file)?;
                    }
                    return Self::checked_luks2(opts, h, file);
                }
                Err(_) => return Err(not_luks()),
            },
            None => return Err(not_luks()),
        };
        match (version, opts.volume_type) {
            (1, None | Some(VolumeType::Luks) | Some(VolumeType::Luks1)) => {
                Ok(Volume::Luks1(Box::new(Luks1Volume::open(file)?)))
            }
            (2, None | Some(VolumeType::Luks) | Some(VolumeType::Luks2)) => {
                let h = if write {
                    let mut h = Luks2Header::read_for_write(&file)?;
                    // A damaged copy is rewritten from the good one before any change, as
                    // cryptsetup's auto-recovery does.
                    if h.needs_repair() {
                        h.repair(&file)?;
                    }
                    h
                } else {
                    Luks2Header::read(&file)?
                };
                Self::checked_luks2(opts, h, file)
            }
            (1 | 2, _) => Err(not_luks()),
            (v, _) => Err(Failure::usage(format!("Unsupported LUKS version {v}."))),
        }
    }

    fn checked_luks2(opts: &Opts, h: Luks2Header, file: File) -> Result<Volume, Failure> {
        if opts.volume_type == Some(VolumeType::Luks1) {
            return Err(Failure::usage("Device is not a valid LUKS1 device."));
        }
        Ok(Volume::Luks2(Box::new(h), file))
    }

    /// "LUKS1" or "LUKS2".
    pub fn type_name(&self) -> &'static str {
        match self {
            Volume::Luks1(_) => "LUKS1",
            Volume::Luks2(..) => "LUKS2",
        }
    }

    /// The volume UUID.
    pub fn uuid(&self) -> String {
        match self {
            Volume::Luks1(v) => v.header().uuid.clone(),
            Volume::Luks2(h, _) => h.uuid().to_string(),
        }
    }

    /// Unlocks with `passphrase`, from `slot` if given. `purpose` matters for LUKS2 only.
    pub fn unlock(
        &self,
        passphrase: &[u8],
        slot: Option<usize>,
        purpose: UnlockPurpose,
    ) -> Result<(usize, SecretBytes), Failure> {
        match self {
            Volume::Luks1(v) => {
                let u = v.unlock(passphrase, slot)?;
                Ok((u.keyslot, u.volume_key))
            }
            Volume::Luks2(h, f) => {
                let u = h.unlock(f, passphrase, slot, purpose)?;
                Ok((u.slot, u.key))
            }
        }
    }

    /// Checks a volume key supplied with `--volume-key-file`.
    pub fn verify_volume_key(&self, vk: &[u8]) -> Result<(), Failure> {
        match self {
            Volume::Luks1(v) => Ok(v.verify_volume_key(vk)?),
            Volume::Luks2(h, _) => Ok(h.verify_volume_key(vk)?),
        }
    }

    /// The data segment.
    pub fn segment(&self) -> Result<Segment, Failure> {
        match self {
            Volume::Luks1(v) => {
                let h = v.header();
                Ok(Segment {
                    cipher: h.cipher_spec(),
                    offset: h.data_offset_bytes(),
                    size: None,
                    iv_offset: 0,
                    sector_size: 512,
                    integrity: None,
                })
            }
            Volume::Luks2(h, _) => {
                let s = h.default_segment()?;
                Ok(Segment {
                    cipher: s.encryption,
                    offset: s.offset,
                    size: s.size,
                    iv_offset: s.iv_tweak,
                    sector_size: s.sector_size,
                    integrity: s.integrity,
                })
            }
        }
    }
}

/// Where the (existing) passphrase comes from: `--key-file`, else `positional`, else the
/// terminal or standard input.
pub fn key_source(opts: &Opts, positional: Option<&Path>) -> KeySource {
    match opts.key_file.as_deref().or(positional) {
        Some(p) => KeySource::File(p.to_path_buf()),
        None => KeySource::Passphrase,
    }
}

/// `--keyfile-offset` / `--keyfile-size`.
pub fn limits(opts: &Opts) -> KeyFileLimits {
    KeyFileLimits {
        offset: opts.keyfile_offset.unwrap_or(0),
        size: opts.keyfile_size.map(|n| n as usize),
    }
}

/// Reads a passphrase or key as cryptsetup would.
pub fn read_secret(
    source: &KeySource,
    limits: KeyFileLimits,
    prompt: &str,
) -> Result<SecretBytes, Failure> {
    Ok(keyfile::read_key(source, limits, prompt)?)
}

/// A new passphrase from `new_key_file`, else the terminal (asked twice) or standard input.
pub fn read_new_secret(new_key_file: Option<&Path>, prompt: &str) -> Result<SecretBytes, Failure> {
    match new_key_file {
        Some(p) => read_secret(
            &KeySource::File(p.to_path_buf()),
            KeyFileLimits::default(),
            prompt,
        ),
        None => {
            let first = read_secret(&KeySource::Passphrase, KeyFileLimits::default(), prompt)?;
            if keyfile::stdin_is_tty() {
                let again = read_secret(
                    &KeySource::Passphrase,
                    KeyFileLimits::default(),
                    "Verify passphrase: ",
                )?;
                if first != again {
                    return Err(Failure::usage("Passphrases do not match."));
                }
            }
            if first.is_empty() {
                return Err(Failure::usage("Empty passphrase is not allowed."));
            }
            Ok(first)
        }
    }
}

/// Reads `--volume-key-file` (raw key bytes).
pub fn read_volume_key_file(path: &Path) -> Result<SecretBytes, Failure> {
    read_secret(
        &KeySource::File(path.to_path_buf()),
        KeyFileLimits::default(),
        "",
    )
}

/// The KDF request from `--pbkdf`, `--hash`, `--iter-time`, `--pbkdf-*`.
pub fn pbkdf_request(opts: &Opts, luks1: bool) -> Result<PbkdfRequest, Failure> {
    let hash = hash_opt(opts)?;
    let mut r = match opts.pbkdf {
        None if luks1 => PbkdfRequest::pbkdf2(hash),
        Some(PbkdfKind::Pbkdf2) => PbkdfRequest::pbkdf2(hash),
        Some(_) if luks1 => {
            return Err(Failure::usage(
                "LUKS1 keyslots support only --pbkdf pbkdf2.",
            ))
        }
        None | Some(PbkdfKind::Argon2id) => PbkdfRequest::argon2id(),
        Some(PbkdfKind::Argon2i) => PbkdfRequest {
            kind: Kind::Argon2i,
            ..PbkdfRequest::argon2id()
        },
    };
    r.hash = hash;
    if let Some(t) = opts.iter_time {
        r = r.with_iter_time(t);
    }
    if let Some(n) = opts.pbkdf_force_iterations {
        r = r.with_forced_iterations(n);
    }
    if let Some(m) = opts.pbkdf_memory {
        r.max_memory_kib = m;
    }
    if let Some(p) = opts.pbkdf_parallel {
        r.parallel = p;
    }
    Ok(r)
}

/// `--hash`, default sha256.
pub fn hash_opt(opts: &Opts) -> Result<HashAlgorithm, Failure> {
    match &opts.hash {
        Some(h) => HashAlgorithm::from_name(h)
            .map_err(|_| Failure::usage(format!("Hash algorithm {h} not supported."))),
        None => Ok(HashAlgorithm::Sha256),
    }
}

/// Keyslot parameters for a new LUKS2 keyslot.
pub fn keyslot_params(opts: &Opts) -> Result<KeyslotParams, Failure> {
    let mut p = KeyslotParams::new(pbkdf_request(opts, false)?);
    p.af_hash = hash_opt(opts)?;
    p.slot = opts.key_slot.map(|s| s as usize);
    Ok(p)
}

/// An absolute path usable in a dm table (no whitespace).
pub fn table_path(p: &Path) -> Result<PathBuf, Failure> {
    let abs = std::fs::canonicalize(p)
        .map_err(|e| Failure::device(format!("Device {} does not exist ({e}).", p.display())))?;
    if abs.to_string_lossy().chars().any(char::is_whitespace) {
        return Err(Failure::usage(format!(
            "device path {} contains white space, which a dm table cannot hold",
            abs.display()
        )));
    }
    Ok(abs)
}

/// Size in bytes of a file or block device.
pub fn device_size(p: &Path) -> Result<u64, Failure> {
    let f = open_file(p, false)?;
    let mut f = &f;
    Ok(std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0))?)
}

/// Asks for confirmation as cryptsetup does, unless `--batch-mode`.
pub fn confirm(opts: &Opts, question: &str) -> Result<(), Failure> {
    if opts.batch_mode {
        return Ok(());
    }
    eprintln!(
        "\nWARNING!\n========\n{question}\n\nAre you sure? (Type 'yes' in capital letters): "
    );
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    if line.trim_end() == "YES" {
        Ok(())
    } else {
        Err(Failure::usage("Operation aborted."))
    }
}
