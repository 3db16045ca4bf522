//! A LUKS volume of either version behind one interface: load (with cryptsetup's type check
//! and auto-repair of a damaged LUKS2 copy before a change), unlock, the data segment, and
//! the header-only operations (keyslots, UUID, label, erase, backup, restore, convert,
//! repair).

use crate::device::open_file;
use crate::error::{Result, VolumeError};
use crate::probe::luks_version;
use crate::segment::Segment;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::kdf::PbkdfRequest;
use cryptblk_format::luks1::Luks1Volume;
use cryptblk_format::luks2::{KeyslotParams, Luks2Header, UnlockPurpose};
use std::fs::File;
use std::path::Path;

/// Which LUKS version an action accepts (cryptsetup's `--type luks|luks1|luks2`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LuksType {
    /// Either version (`--type luks`, or no `--type`).
    #[default]
    Any,
    /// LUKS1 only.
    Luks1,
    /// LUKS2 only.
    Luks2,
}

/// An opened LUKS volume.
pub enum Volume {
    /// LUKS1.
    Luks1(Box<Luks1Volume<File>>),
    /// LUKS2 with its header device.
    Luks2(Box<Luks2Header>, File),
}

/// A successful unlock: the keyslot that opened (none for a volume key given directly) and
/// the volume key.
pub struct Unlocked {
    /// The keyslot whose passphrase matched.
    pub slot: Option<usize>,
    /// The volume key.
    pub key: SecretBytes,
}

impl Volume {
    /// Loads the LUKS header in `header` (the device itself or a detached header), refusing a
    /// type other than `want`. With `write`, a damaged LUKS2 copy is rewritten from the good
    /// one first, as cryptsetup's auto-recovery does before any change.
    pub fn load(header: &Path, want: LuksType, write: bool) -> Result<Volume> {
        let file = open_header(header, write)?;
        let not_luks = || {
            VolumeError::usage(format!(
                "Device {} is not a valid LUKS device.",
                header.display()
            ))
        };
        // A damaged LUKS2 primary is still LUKS2 when the secondary copy survives.
        let version = match luks_version(&file) {
            Some(v) => v,
            None if want != LuksType::Luks1 => match Luks2Header::read(&file) {
                Ok(mut h) => {
                    if write {
                        // Header writes refuse a reencryption in progress themselves;
                        // restoring a damaged copy of one is allowed, as in cryptsetup.
                        h.check_requirements_except_reencryption()?;
                        h.repair(&file)?;
                    }
                    return Ok(Volume::Luks2(Box::new(h), file));
                }
                Err(_) => return Err(not_luks()),
            },
            None => return Err(not_luks()),
        };
        match (version, want) {
            (1, LuksType::Any | LuksType::Luks1) => {
                Ok(Volume::Luks1(Box::new(Luks1Volume::open(file)?)))
            }
            (2, LuksType::Any | LuksType::Luks2) => {
                let h = if write {
                    let mut h = Luks2Header::read(&file)?;
                    h.check_requirements_except_reencryption()?;
                    if h.needs_repair() {
                        h.repair(&file)?;
                    }
                    h
                } else {
                    Luks2Header::read(&file)?
                };
                Ok(Volume::Luks2(Box::new(h), file))
            }
            (1 | 2, _) => Err(not_luks()),
            (v, _) => Err(VolumeError::usage(format!("Unsupported LUKS version {v}."))),
        }
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

    /// The LUKS2 header, if this is LUKS2.
    pub fn luks2(&self) -> Option<&Luks2Header> {
        match self {
            Volume::Luks2(h, _) => Some(h),
            Volume::Luks1(_) => None,
        }
    }

    /// Activation flags stored in the header (LUKS2 `config.flags`; none for LUKS1).
    pub fn stored_flags(&self) -> Vec<String> {
        self.luks2()
            .map(Luks2Header::config_flags)
            .unwrap_or_default()
    }

    /// Unlocks with `passphrase`, from `slot` if given. `purpose` matters for LUKS2 only.
    pub fn unlock(
        &self,
        passphrase: &[u8],
        slot: Option<usize>,
        purpose: UnlockPurpose,
    ) -> Result<(usize, SecretBytes)> {
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

    /// Bytes of the volume key, when a keyslot tells (LUKS2 without keyslots does not).
    pub fn volume_key_size(&self) -> Option<usize> {
        match self {
            Volume::Luks1(v) => Some(v.header().key_bytes as usize),
            Volume::Luks2(h, _) => h.volume_key_size(),
        }
    }

    /// Reads `--volume-key-file` to this volume's key size and checks it against the
    /// volume's digest. As cryptsetup, `key_bits` (`--key-size`) is used only when no
    /// keyslot tells the size (a LUKS2 volume without keyslots, where a volume key file is
    /// the way back in), and required then.
    pub fn volume_key_from_file(&self, path: &Path, key_bits: Option<u32>) -> Result<SecretBytes> {
        let bytes = match (self.volume_key_size(), key_bits) {
            (Some(n), _) => n,
            (None, Some(bits)) => bits as usize / 8,
            (None, None) => {
                return Err(VolumeError::usage(
                    "Cannot determine volume key size for LUKS without keyslots, please use \
                     --key-size option.",
                ))
            }
        };
        let vk = crate::format::read_volume_key_file(path, bytes)?;
        self.verify_volume_key(vk.as_bytes())?;
        Ok(vk)
    }

    /// Checks a volume key supplied directly (`--volume-key-file`).
    pub fn verify_volume_key(&self, vk: &[u8]) -> Result<()> {
        match self {
            Volume::Luks1(v) => Ok(v.verify_volume_key(vk)?),
            Volume::Luks2(h, _) => Ok(h.verify_volume_key(vk)?),
        }
    }

    /// Bytes at the start of the header device that the header and its keyslot areas use:
    /// data on the same device must start at or after this.
    pub fn metadata_size(&self) -> u64 {
        match self {
            Volume::Luks1(v) => v.header().required_size(),
            Volume::Luks2(h, _) => h.metadata_and_keyslots_size(),
        }
    }

    /// The data segment.
    pub fn segment(&self) -> Result<Segment> {
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

    /// Adds a keyslot for `new_passphrase` holding `vk`; `luks1_kdf` is used for LUKS1 and
    /// `luks2` (KDF, AF hash, slot) for LUKS2. Returns the new slot.
    pub fn add_key(
        &mut self,
        vk: &SecretBytes,
        new_passphrase: &[u8],
        slot: Option<usize>,
        luks1_kdf: &PbkdfRequest,
        luks2: &KeyslotParams,
    ) -> Result<usize> {
        Ok(match self {
            Volume::Luks1(v) => v.add_key(vk, new_passphrase, slot, luks1_kdf)?,
            Volume::Luks2(h, f) => h.add_keyslot(&*f, vk, new_passphrase, luks2)?,
        })
    }

    /// Adds a LUKS2 keyslot for `passphrase` holding a new random key of `key_bytes` bytes
    /// bound to no segment (`luksAddKey --unbound`): no existing passphrase is needed, as
    /// in cryptsetup, since the volume key is not involved. LUKS1 has no unbound keyslots.
    pub fn add_unbound_key(
        &mut self,
        key_bytes: usize,
        passphrase: &[u8],
        params: &KeyslotParams,
    ) -> Result<usize> {
        match self {
            Volume::Luks1(_) => Err(VolumeError::usage(
                "Unbound keyslots exist only in LUKS2 devices.",
            )),
            Volume::Luks2(h, f) => Ok(h.add_unbound_keyslot(&*f, key_bytes, passphrase, params)?.0),
        }
    }

    /// [`Self::add_unbound_key`] with the given `key` (`--volume-key-file`) as the keyslot's key.
    pub fn add_unbound_key_with(
        &mut self,
        key: SecretBytes,
        passphrase: &[u8],
        params: &KeyslotParams,
    ) -> Result<usize> {
        match self {
            Volume::Luks1(_) => Err(VolumeError::usage(
                "Unbound keyslots exist only in LUKS2 devices.",
            )),
            Volume::Luks2(h, f) => Ok(h
                .add_unbound_keyslot_with_key(&*f, key, passphrase, params)?
                .0),
        }
    }

    /// Replaces the passphrase of the keyslot `old` opens (from `slot` if given).
    pub fn change_key(
        &mut self,
        old: &[u8],
        new: &[u8],
        slot: Option<usize>,
        luks1_kdf: &PbkdfRequest,
        luks2: &KeyslotParams,
    ) -> Result<()> {
        match self {
            // cryptsetup passes `--key-slot` as both the old and the new slot: a named
            // LUKS1 keyslot is rewritten in place, otherwise the new key goes to the first
            // free slot (the old one is disabled).
            Volume::Luks1(v) => {
                v.change_key(old, slot, new, slot, luks1_kdf)?;
            }
            Volume::Luks2(h, f) => {
                let mut params = luks2.clone();
                params.slot = None;
                h.change_key(&*f, old, new, slot, &params)?;
            }
        }
        Ok(())
    }

    /// Wipes keyslot `slot`.
    pub fn kill_slot(&mut self, slot: usize) -> Result<()> {
        match self {
            Volume::Luks1(v) => v.kill_slot(slot)?,
            Volume::Luks2(h, f) => h.remove_keyslot(&*f, slot)?,
        }
        Ok(())
    }

    /// Wipes every keyslot (`erase`).
    pub fn erase(&mut self) -> Result<()> {
        match self {
            Volume::Luks1(v) => v.erase()?,
            Volume::Luks2(h, f) => h.erase(&*f)?,
        }
        Ok(())
    }

    /// Sets the UUID (`None`: a new random one).
    pub fn set_uuid(&mut self, uuid: Option<&str>) -> Result<()> {
        match self {
            Volume::Luks1(v) => v.set_uuid(uuid)?,
            Volume::Luks2(h, f) => {
                h.set_uuid(uuid.unwrap_or_default())?;
                h.write(&*f)?;
            }
        }
        Ok(())
    }

    /// Writes a header backup to the new file `out` (which must not exist).
    ///
    /// The file is made new, never followed through a symlink nor overwritten, with mode
    /// 0400 whatever the umask, as cryptsetup makes it: it holds every keyslot, so a copy
    /// others can read is an offline attack on the passphrases, one that outlives a later
    /// passphrase change. A file that cannot be written whole is removed.
    pub fn backup_header(&self, out: &Path) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .open(out)
            .map_err(|e| {
                VolumeError::usage(if e.kind() == std::io::ErrorKind::AlreadyExists {
                    format!(
                        "Requested header backup file {} already exists.",
                        out.display()
                    )
                } else {
                    format!("Cannot create header backup file {}.", out.display())
                })
            })?;
        let written = (|| -> Result<()> {
            match self {
                Volume::Luks1(v) => file.write_all(&v.header_backup()?)?,
                Volume::Luks2(h, f) => {
                    file.set_len(h.metadata_and_keyslots_size())?;
                    h.backup(f, &file)?;
                }
            }
            file.sync_all()?;
            Ok(())
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(out);
        }
        written.map_err(|e| {
            VolumeError::new(
                e.code,
                format!(
                    "Cannot write header backup file {}: {}",
                    out.display(),
                    e.message
                ),
            )
        })
    }
}

/// `config`: LUKS2 label, subsystem and keyslot priority, written crash-safely.
#[derive(Clone, Debug, Default)]
pub struct ConfigChange {
    /// New label.
    pub label: Option<String>,
    /// New subsystem.
    pub subsystem: Option<String>,
    /// Keyslot and its new priority (0 ignore, 1 normal, 2 prefer).
    pub priority: Option<(usize, u8)>,
}

/// Applies a [`ConfigChange`] to a LUKS2 volume.
pub fn configure(vol: &mut Volume, change: &ConfigChange) -> Result<()> {
    let Volume::Luks2(h, f) = vol else {
        return Err(VolumeError::usage(
            "config is only supported for LUKS2 devices.",
        ));
    };
    if let Some(l) = &change.label {
        h.set_label(l)?;
    }
    if let Some(s) = &change.subsystem {
        h.set_subsystem(s)?;
    }
    if let Some((slot, prio)) = change.priority {
        h.set_priority(slot, prio)?;
    }
    h.write(&*f)?;
    Ok(())
}

/// What a header backup file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackupKind {
    /// A LUKS1 header.
    Luks1,
    /// A LUKS2 header.
    Luks2,
}

/// The LUKS version of a header backup, or an error naming the file.
pub fn backup_kind(backup: &Path) -> Result<BackupKind> {
    let f = open_file(backup, false)?;
    match luks_version(&f) {
        Some(1) => Ok(BackupKind::Luks1),
        Some(2) => Ok(BackupKind::Luks2),
        _ => Err(VolumeError::usage(format!(
            "Backup file {} doesn't contain valid LUKS header.",
            backup.display()
        ))),
    }
}

/// Restores the header in `backup` onto `header` (the device or a detached header). The
/// backup is checked whole before anything is written.
pub fn restore_header(header: &Path, backup: &Path) -> Result<()> {
    let backup_file = open_file(backup, false)?;
    let target = open_header(header, true)?;
    match backup_kind(backup)? {
        BackupKind::Luks1 => {
            if luks_version(&target) == Some(2) {
                return Err(VolumeError::usage(
                    "Header backup is LUKS1 but the device has a LUKS2 header.",
                ));
            }
            let bytes = std::fs::read(backup)?;
            Luks1Volume::restore_header(target, &bytes)?;
        }
        BackupKind::Luks2 => {
            Luks2Header::restore(&target, &backup_file)?;
        }
    }
    Ok(())
}

/// Opens a header for an action; a writer holds the header lock (see [`crate::lock`]) while
/// the file is open, so two header writers never interleave. The data lock of an open volume
/// does not stop it: keyslots change while the volume is served, as with cryptsetup.
fn open_header(header: &Path, write: bool) -> Result<File> {
    if crate::device::is_remote(header) {
        if write {
            return Err(VolumeError::usage(format!(
                "Changing the header of {} in place is not supported yet (the header of a \
                 remote store is read only by open, luksDump and the like).",
                header.display()
            )));
        }
        return remote_header(header);
    }
    let file = open_file(header, write)?;
    if write {
        crate::lock::lock_header(&file, true).map_err(|e| {
            VolumeError::device(format!(
                "cannot lock the header of {}: {e}",
                header.display()
            ))
        })?;
    }
    Ok(file)
}

/// The header area of a remote store (`rbd:...`) copied into an anonymous in-memory file,
/// which the header code reads as it reads an image file: the LUKS1 or LUKS2 header with its
/// keyslot areas, up to where the data may start. Only reads use it (see [`open_header`]).
fn remote_header(header: &Path) -> Result<File> {
    use cryptblk_format::hdrio::HeaderIo;
    let dev = crate::device::open_remote(header, false)?;
    // SAFETY: a plain syscall with a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"cryptblk-remote-header".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: `fd` was just created and nothing else owns it.
    let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let copy = |from: u64, to: u64| -> Result<()> {
        let mut buf = vec![0u8; 1 << 20];
        let mut pos = from;
        while pos < to {
            let n = (to - pos).min(buf.len() as u64) as usize;
            dev.read_at(pos, &mut buf[..n])?;
            HeaderIo::write_at(&file, pos, &buf[..n])?;
            pos += n as u64;
        }
        Ok(())
    };
    // The first MiB holds both LUKS2 header copies at their default size and says how much
    // more (the keyslot areas) there is; the data of a LUKS volume never starts before it ends.
    // The copy has the device's size (sparse: the data area is a hole, never read), so size
    // checks of the header code see the real device.
    let size = dev.size();
    file.set_len(size)?;
    let have = size.min(1 << 20);
    copy(0, have)?;
    let need = match luks_version(&file) {
        Some(2) => Luks2Header::read(&file)
            .map(|h| h.metadata_and_keyslots_size())
            .unwrap_or(have),
        Some(1) => {
            let mut buf = [0u8; cryptblk_format::luks1::LUKS1_HEADER_SIZE];
            HeaderIo::read_at(&file, 0, &mut buf)?;
            cryptblk_format::luks1::Luks1Header::parse(&buf)
                .map(|h| h.required_size())
                .unwrap_or(have)
        }
        _ => have,
    };
    let need = need.min(size);
    if need > have {
        copy(have, need)?;
    }
    Ok(file)
}

/// The LUKS version in the header at `header`, if any (for actions that ask before acting).
pub fn header_version(header: &Path) -> Result<Option<u16>> {
    Ok(luks_version(&open_file(header, false)?))
}

/// `convert`: LUKS1 <-> LUKS2 in place (`to` is 1 or 2). Not crash-safe in cryptsetup either:
/// callers ask for confirmation first.
pub fn convert(header: &Path, to: u16) -> Result<()> {
    let f = open_header(header, true)?;
    match (luks_version(&f), to) {
        (Some(v), w) if v == w => Err(VolumeError::usage(format!(
            "Device {} is already LUKS{v}.",
            header.display()
        ))),
        (Some(1), 2) => {
            Luks2Header::convert_from_luks1(&f)?;
            Ok(())
        }
        (Some(2), 1) => {
            let h = Luks2Header::read_for_write(&f)?;
            h.convert_to_luks1(&f)?;
            Ok(())
        }
        _ => Err(VolumeError::usage(format!(
            "Device {} is not a valid LUKS device.",
            header.display()
        ))),
    }
}

/// `repair` (LUKS2): rebuilds both header copies from the valid one and removes an LVM2 label
/// that makes the device's signature ambiguous.
pub fn repair(header: &Path) -> Result<()> {
    let f = open_header(header, true)?;
    cryptblk_format::luks2::repair_device(&f)?;
    f.sync_all()?;
    Ok(())
}

/// `repair` of a LUKS1 header (see [`cryptblk_format::luks1::repair`]): cryptsetup's known
/// benign fixes, written only when the result is a valid header.
pub fn repair_luks1(header: &Path) -> Result<cryptblk_format::luks1::Luks1Repair> {
    let f = open_header(header, true)?;
    Ok(cryptblk_format::luks1::repair(&f)?)
}

/// True when `repair` has anything to rewrite in the LUKS2 header at `header` (see
/// [`cryptblk_format::luks2::repair_needed`]); false means cryptsetup's "No known problems
/// detected for LUKS header.", and `repair` leaves the header untouched.
pub fn repair_needed(header: &Path) -> Result<bool> {
    let f = open_header(header, false)?;
    Ok(cryptblk_format::luks2::repair_needed_on(&f)?)
}

/// The sector of an LVM2 label beside a LUKS2 header (an ambiguous signature), if any.
pub fn lvm2_signature_sector(header: &Path) -> Result<Option<u64>> {
    let f = open_file(header, false)?;
    Ok(cryptblk_format::luks2::lvm2_signature_sector(&f))
}

/// `luksConvertKey` (LUKS2 only, as cryptsetup): re-derives the keyslot `passphrase` opens
/// (only `slot` when given) with the KDF and parameters in `params`, keeping its number and
/// passphrase; crash-safe like `luksChangeKey`. `device` names the volume in messages.
/// Returns the keyslot number.
pub fn convert_key(
    vol: &mut Volume,
    device: &Path,
    passphrase: &[u8],
    slot: Option<usize>,
    params: &KeyslotParams,
) -> Result<usize> {
    let Volume::Luks2(h, f) = vol else {
        return Err(not_luks2(device));
    };
    if let Some(s) = slot {
        if h.keyslots().iter().all(|k| k.id != s) {
            return Err(VolumeError::usage(format!("Keyslot {s} is not active.")));
        }
    }
    Ok(h.convert_keyslot(&*f, passphrase, slot, params)?)
}

/// cryptsetup's refusal of a LUKS2-only action on another header (exit 1).
pub fn not_luks2(device: &Path) -> VolumeError {
    VolumeError::usage(format!(
        "Device {} is not a valid LUKS2 device.",
        device.display()
    ))
}
