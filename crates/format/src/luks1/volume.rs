//! LUKS1 volume operations: format, unlock, keyslot management, header backup/restore.
//!
//! Every metadata update is ordered so that an interruption at any single write leaves a
//! volume that still opens with the keys it had before, or with the new ones:
//! - adding a key writes (and syncs) the key material into a disabled slot before the header
//!   write that enables it;
//! - removing a key first writes the header with the slot disabled, then wipes the material;
//! - changing a key adds the new key to a free slot before removing the old one.
//!
//! The header is 592 bytes (two sectors); a write torn between them only ever leaves slots
//! in a state the loader accepts, because the enable/disable marker and the rest of a slot
//! are only changed together with material that is already complete.

use super::header::*;
use crate::af::{self, LUKS_STRIPES};
use crate::error::{FormatError, Result};
use crate::hdrio::HeaderIo;
use crate::kdf::{self, Pbkdf, PbkdfKind, PbkdfRequest};
use crate::sector;
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;

/// cryptsetup's default data alignment: 1 MiB.
pub const DEFAULT_ALIGNMENT_SECTORS: u64 = 2048;
/// Iteration target for the volume key digest, in milliseconds (`LUKS_MKD_ITERATIONS_MS`).
const MK_DIGEST_ITER_MS: u32 = 125;

/// Parameters of `luksFormat --type luks1`.
#[derive(Clone, Debug)]
pub struct Luks1FormatParams {
    /// Cipher name, e.g. `aes`.
    pub cipher_name: String,
    /// Cipher mode, e.g. `xts-plain64`.
    pub cipher_mode: String,
    /// Volume key length in bytes.
    pub key_bytes: usize,
    /// Hash for PBKDF2, digest and AF.
    pub hash: HashAlgorithm,
    /// UUID to use (random when `None`).
    pub uuid: Option<String>,
    /// Keyslot KDF (must be PBKDF2 for LUKS1); its hash is replaced by [`Self::hash`].
    pub kdf: PbkdfRequest,
    /// Data alignment in sectors when no explicit offset is given.
    pub align_sectors: u64,
    /// Explicit data offset in sectors (`--offset`); 0 with a detached header.
    pub data_offset_sectors: Option<u64>,
    /// Use this volume key instead of a random one (`--volume-key-file`).
    pub volume_key: Option<SecretBytes>,
    /// Keyslot for the first passphrase (`--key-slot`), default 0.
    pub keyslot: usize,
}

impl Luks1FormatParams {
    /// Parameters for `cipher_spec` (`aes-xts-plain64`), key size and hash, with cryptsetup's
    /// defaults for everything else.
    pub fn new(cipher_spec: &str, key_bytes: usize, hash: HashAlgorithm) -> Result<Self> {
        let (name, mode) = cipher_spec.split_once('-').ok_or_else(|| {
            FormatError::InvalidParameter(format!(
                "cipher specification '{cipher_spec}' has no mode (expected cipher-mode-iv)"
            ))
        })?;
        Ok(Luks1FormatParams {
            cipher_name: name.to_string(),
            cipher_mode: mode.to_string(),
            key_bytes,
            hash,
            uuid: None,
            kdf: PbkdfRequest::pbkdf2(hash),
            align_sectors: DEFAULT_ALIGNMENT_SECTORS,
            data_offset_sectors: None,
            volume_key: None,
            keyslot: 0,
        })
    }
}

/// The result of a successful unlock.
#[derive(Debug)]
pub struct Unlocked {
    /// The keyslot that accepted the passphrase.
    pub keyslot: usize,
    /// The volume key.
    pub volume_key: SecretBytes,
}

/// An opened LUKS1 volume: its header device and the validated header.
pub struct Luks1Volume<D: HeaderIo> {
    dev: D,
    header: Luks1Header,
}

impl<D: HeaderIo> std::fmt::Debug for Luks1Volume<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The device is left out: it may be a whole in-memory image.
        f.debug_struct("Luks1Volume")
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

fn io_err(context: &str) -> impl FnOnce(std::io::Error) -> FormatError + '_ {
    move |e| FormatError::io(context, e)
}

impl<D: HeaderIo> Luks1Volume<D> {
    /// Reads, validates and size-checks the header on `dev`.
    pub fn open(dev: D) -> Result<Self> {
        let size = dev.size().map_err(io_err("getting device size"))?;
        if size < LUKS1_HEADER_SIZE as u64 {
            return Err(FormatError::NotLuks);
        }
        let mut buf = [0u8; LUKS1_HEADER_SIZE];
        dev.read_at(0, &mut buf)
            .map_err(io_err("reading LUKS1 header"))?;
        let header = Luks1Header::parse(&buf)?;
        header.check_device_size(size)?;
        Ok(Luks1Volume { dev, header })
    }

    /// Creates a new LUKS1 volume on `dev` with `passphrase` in the first keyslot; returns the
    /// volume and its volume key. Everything from offset 0 up to the data offset is
    /// overwritten (zeros, then random keyslot areas), nothing beyond it.
    pub fn format(
        dev: D,
        params: &Luks1FormatParams,
        passphrase: &[u8],
    ) -> Result<(Self, SecretBytes)> {
        if params.kdf.kind != PbkdfKind::Pbkdf2 {
            return Err(FormatError::InvalidParameter(
                "LUKS1 keyslots support only the pbkdf2 KDF".into(),
            ));
        }
        if params.keyslot >= LUKS1_NUM_KEYSLOTS {
            return Err(FormatError::InvalidKeyslot {
                slot: params.keyslot,
                reason: format!("LUKS1 has keyslots 0..{}", LUKS1_NUM_KEYSLOTS - 1),
            });
        }
        if params.hash.output_len() < LUKS1_DIGEST_SIZE {
            return Err(FormatError::InvalidParameter(format!(
                "Requested LUKS hash {} is not supported.",
                params.hash.name()
            )));
        }
        let volume_key = match &params.volume_key {
            Some(vk) if vk.len() != params.key_bytes => {
                return Err(FormatError::InvalidParameter(format!(
                    "volume key is {} bytes, key size is {}",
                    vk.len(),
                    params.key_bytes
                )))
            }
            Some(vk) => vk.clone(),
            None => SecretBytes::random(params.key_bytes),
        };
        // Fails early on unknown ciphers or key sizes.
        let spec = format!("{}-{}", params.cipher_name, params.cipher_mode);
        sector::open(&spec, volume_key.as_bytes())?;

        let slot_sectors = af::split_sectors(params.key_bytes, LUKS_STRIPES);
        let mut next = LUKS1_KEYSLOTS_ALIGN_SECTORS as u64;
        let keyslots: [Luks1Keyslot; LUKS1_NUM_KEYSLOTS] = std::array::from_fn(|_| {
            let offset = next;
            next = (next + slot_sectors).div_ceil(8) * 8;
            Luks1Keyslot {
                active: KEYSLOT_DISABLED,
                iterations: 0,
                salt: [0; LUKS1_SALT_SIZE],
                key_material_offset: offset as u32,
                stripes: LUKS_STRIPES,
            }
        });
        let header_end = next;
        let payload = match params.data_offset_sectors {
            Some(off) => off,
            None if params.align_sectors == 0 => 0,
            None => header_end.div_ceil(params.align_sectors) * params.align_sectors,
        };
        if payload != 0 && payload < header_end {
            return Err(FormatError::InvalidParameter(
                "Data offset for LUKS header must be either 0 or higher than header size.".into(),
            ));
        }
        let payload = u32::try_from(payload)
            .map_err(|_| FormatError::InvalidParameter("data offset too large for LUKS1".into()))?;
        let uuid = match &params.uuid {
            Some(u) => parse_uuid(u)?,
            None => uuid::Uuid::new_v4().hyphenated().to_string(),
        };

        let mut digest_request = PbkdfRequest::pbkdf2(params.hash);
        digest_request.iter_time_ms = MK_DIGEST_ITER_MS;
        let mk_iterations = match params.kdf.force_iterations {
            // cryptsetup: with a forced (benchmark-free) cost the digest uses the minimum.
            Some(_) => kdf::PBKDF2_MIN_ITERATIONS,
            None => match kdf::calibrate(&digest_request, LUKS1_DIGEST_SIZE)? {
                Pbkdf::Pbkdf2 { iterations, .. } => iterations,
                _ => unreachable!("PBKDF2 request yields PBKDF2"),
            },
        };
        let mut mk_digest_salt = [0u8; LUKS1_SALT_SIZE];
        random(&mut mk_digest_salt)?;
        let mut mk_digest = [0u8; LUKS1_DIGEST_SIZE];
        params.hash.pbkdf2(
            volume_key.as_bytes(),
            &mk_digest_salt,
            mk_iterations,
            &mut mk_digest,
        );

        let header = Luks1Header {
            cipher_name: params.cipher_name.clone(),
            cipher_mode: params.cipher_mode.clone(),
            hash_spec: params.hash.name().to_string(),
            payload_offset: payload,
            key_bytes: params.key_bytes as u32,
            mk_digest,
            mk_digest_salt,
            mk_digest_iterations: mk_iterations,
            uuid,
            keyslots,
        };
        header.to_bytes()?; // field lengths
        header.validate()?;

        // Wipe the metadata area: zeros up to the data offset, random keyslot areas.
        let wipe_end = if payload == 0 {
            // Detached header: cryptsetup sizes the file to the 4 KiB-aligned keyslot end.
            header_end * 512
        } else {
            payload as u64 * 512
        };
        let zeros = vec![0u8; 1 << 20];
        let mut at = 0u64;
        while at < wipe_end {
            let n = (wipe_end - at).min(zeros.len() as u64) as usize;
            dev.write_at(at, &zeros[..n])
                .map_err(io_err("wiping LUKS1 header area"))?;
            at += n as u64;
        }
        for slot in 0..LUKS1_NUM_KEYSLOTS {
            let (off, len) = header.keyslot_area(slot);
            let mut noise = vec![0u8; len as usize];
            random(&mut noise)?;
            dev.write_at(off, &noise)
                .map_err(io_err("wiping LUKS1 keyslot area"))?;
        }
        dev.sync().map_err(io_err("syncing device"))?;
        let mut volume = Luks1Volume { dev, header };
        volume.write_header()?;
        volume.add_key(&volume_key, passphrase, Some(params.keyslot), &params.kdf)?;
        Ok((volume, volume_key))
    }

    /// The validated header.
    pub fn header(&self) -> &Luks1Header {
        &self.header
    }

    /// The header device.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// Gives the header device back.
    pub fn into_device(self) -> D {
        self.dev
    }

    /// Opens a keyslot: `Ok(None)` when the passphrase is wrong for it.
    fn try_slot(&self, slot: usize, passphrase: &[u8]) -> Result<Option<SecretBytes>> {
        let h = &self.header;
        let ks = &h.keyslots[slot];
        let hash = h.hash()?;
        let key_bytes = h.key_bytes as usize;
        let derived = Pbkdf::Pbkdf2 {
            hash,
            iterations: ks.iterations.max(1),
        }
        .derive(passphrase, &ks.salt, key_bytes)?;
        let (off, len) = h.keyslot_area(slot);
        let mut material = SecretBytes::zeroed(len as usize);
        self.dev
            .read_at(off, material.as_mut_bytes())
            .map_err(io_err("reading keyslot material"))?;
        let cipher = sector::open(&h.cipher_spec(), derived.as_bytes())?;
        cipher.decrypt(0, material.as_mut_bytes())?;
        let candidate = af::merge(material.as_bytes(), key_bytes, ks.stripes, hash)?;
        if !h.verify_volume_key(candidate.as_bytes())? {
            return Ok(None);
        }
        // cryptsetup: a cipher_null volume opens only with an empty passphrase.
        if h.cipher_name == "cipher_null" && !passphrase.is_empty() {
            return Ok(None);
        }
        Ok(Some(candidate))
    }

    /// Finds the volume key with `passphrase`, trying `slot` only or every enabled slot.
    ///
    /// Errors: [`FormatError::WrongPassphrase`] when at least one slot was tried (exit code 2);
    /// [`FormatError::NoKeyslot`] when no enabled slot exists (or `slot` is disabled; exit 1).
    pub fn unlock(&self, passphrase: &[u8], slot: Option<usize>) -> Result<Unlocked> {
        let candidates: Vec<usize> = match slot {
            Some(s) => {
                self.check_slot_index(s)?;
                vec![s]
            }
            None => (0..LUKS1_NUM_KEYSLOTS).collect(),
        };
        let mut tried = 0;
        for s in candidates {
            if !self.header.keyslots[s].is_enabled() {
                continue;
            }
            tried += 1;
            if let Some(volume_key) = self.try_slot(s, passphrase)? {
                return Ok(Unlocked {
                    keyslot: s,
                    volume_key,
                });
            }
        }
        if tried > 0 {
            Err(FormatError::WrongPassphrase)
        } else {
            Err(FormatError::NoKeyslot(match slot {
                Some(s) => format!(" (keyslot {s} is not active)"),
                None => String::new(),
            }))
        }
    }

    /// Checks a volume key against the header digest.
    pub fn verify_volume_key(&self, volume_key: &[u8]) -> Result<()> {
        if self.header.verify_volume_key(volume_key)? {
            Ok(())
        } else {
            Err(FormatError::VolumeKeyMismatch)
        }
    }

    fn check_slot_index(&self, slot: usize) -> Result<()> {
        if slot >= LUKS1_NUM_KEYSLOTS {
            return Err(FormatError::InvalidKeyslot {
                slot,
                reason: format!(
                    "please select keyslot between 0 and {}",
                    LUKS1_NUM_KEYSLOTS - 1
                ),
            });
        }
        Ok(())
    }

    /// The first disabled keyslot.
    pub fn first_free_slot(&self) -> Option<usize> {
        self.header
            .keyslots
            .iter()
            .position(|k| k.state() == KeyslotState::Disabled)
    }

    fn write_header(&mut self) -> Result<()> {
        let bytes = self.header.to_bytes()?;
        self.dev
            .write_at(0, &bytes)
            .map_err(io_err("writing LUKS1 header"))?;
        self.dev.sync().map_err(io_err("syncing LUKS1 header"))
    }

    /// Stores `volume_key` under `passphrase` in `slot` (or the first free slot) and returns
    /// the slot used. The key must match the header digest.
    pub fn add_key(
        &mut self,
        volume_key: &SecretBytes,
        passphrase: &[u8],
        slot: Option<usize>,
        kdf_request: &PbkdfRequest,
    ) -> Result<usize> {
        self.verify_volume_key(volume_key.as_bytes())?;
        if kdf_request.kind != PbkdfKind::Pbkdf2 {
            return Err(FormatError::InvalidParameter(
                "LUKS1 keyslots support only the pbkdf2 KDF".into(),
            ));
        }
        let slot = match slot {
            Some(s) => {
                self.check_slot_index(s)?;
                match self.header.keyslots[s].state() {
                    KeyslotState::Disabled => s,
                    KeyslotState::Enabled => return Err(FormatError::KeyslotActive(s)),
                    KeyslotState::Invalid(v) => {
                        return Err(FormatError::InvalidKeyslot {
                            slot: s,
                            reason: format!("unknown state marker {v:#x}"),
                        })
                    }
                }
            }
            None => self.first_free_slot().ok_or(FormatError::KeyslotsFull)?,
        };
        let hash = self.header.hash()?;
        let key_bytes = self.header.key_bytes as usize;
        let mut request = *kdf_request;
        request.hash = hash;
        let iterations = match kdf::calibrate(&request, key_bytes)? {
            Pbkdf::Pbkdf2 { iterations, .. } => iterations.max(kdf::PBKDF2_MIN_ITERATIONS),
            _ => unreachable!("PBKDF2 request yields PBKDF2"),
        };
        let mut salt = [0u8; LUKS1_SALT_SIZE];
        random(&mut salt)?;
        let derived = Pbkdf::Pbkdf2 { hash, iterations }.derive(passphrase, &salt, key_bytes)?;
        let stripes = self.header.keyslots[slot].stripes;
        let split = af::split(volume_key.as_bytes(), stripes, hash)?;
        let (off, len) = self.header.keyslot_area(slot);
        let mut material = SecretBytes::zeroed(len as usize);
        material.as_mut_bytes()[..split.len()].copy_from_slice(split.as_bytes());
        let cipher = sector::open(&self.header.cipher_spec(), derived.as_bytes())?;
        cipher.encrypt(0, material.as_mut_bytes())?;
        // Material first: until the header says so, the slot is not used.
        self.dev
            .write_at(off, material.as_bytes())
            .map_err(io_err("writing keyslot material"))?;
        self.dev
            .sync()
            .map_err(io_err("syncing keyslot material"))?;
        let previous = self.header.keyslots[slot].clone();
        {
            let ks = &mut self.header.keyslots[slot];
            ks.active = KEYSLOT_ENABLED;
            ks.iterations = iterations;
            ks.salt = salt;
        }
        if let Err(e) = self.write_header() {
            self.header.keyslots[slot] = previous;
            return Err(e);
        }
        Ok(slot)
    }

    /// Unlocks with `existing` and adds `new_passphrase` (luksAddKey).
    pub fn add_key_by_passphrase(
        &mut self,
        existing: &[u8],
        existing_slot: Option<usize>,
        new_passphrase: &[u8],
        slot: Option<usize>,
        kdf_request: &PbkdfRequest,
    ) -> Result<usize> {
        let unlocked = self.unlock(existing, existing_slot)?;
        self.add_key(&unlocked.volume_key, new_passphrase, slot, kdf_request)
    }

    /// Disables `slot` and wipes its key material (luksKillSlot). The slot must be enabled.
    pub fn kill_slot(&mut self, slot: usize) -> Result<()> {
        self.check_slot_index(slot)?;
        if !self.header.keyslots[slot].is_enabled() {
            return Err(FormatError::InvalidKeyslot {
                slot,
                reason: "keyslot is not active".into(),
            });
        }
        self.destroy_slots(&[slot])
    }

    /// Header first (slots disabled, salt and iterations cleared), then the material wipe.
    fn destroy_slots(&mut self, slots: &[usize]) -> Result<()> {
        let before = self.header.clone();
        for &s in slots {
            let ks = &mut self.header.keyslots[s];
            ks.active = KEYSLOT_DISABLED;
            ks.iterations = 0;
            ks.salt = [0; LUKS1_SALT_SIZE];
        }
        if let Err(e) = self.write_header() {
            self.header = before;
            return Err(e);
        }
        for &s in slots {
            let (off, len) = self.header.keyslot_area(s);
            let mut noise = vec![0u8; len as usize];
            random(&mut noise)?;
            self.dev
                .write_at(off, &noise)
                .map_err(io_err("wiping keyslot material"))?;
        }
        self.dev.sync().map_err(io_err("syncing wiped keyslots"))
    }

    /// Removes the keyslot that `passphrase` opens (luksRemoveKey); returns its number.
    pub fn remove_key(&mut self, passphrase: &[u8]) -> Result<usize> {
        let unlocked = self.unlock(passphrase, None)?;
        self.kill_slot(unlocked.keyslot)?;
        Ok(unlocked.keyslot)
    }

    /// Replaces `old` by `new` (luksChangeKey). The new key goes to `new_slot`, else the first
    /// free slot (crash-safe: added before the old one is removed), else over the old slot
    /// (as cryptsetup does when all slots are full). Returns `(old_slot, new_slot)`.
    pub fn change_key(
        &mut self,
        old: &[u8],
        old_slot: Option<usize>,
        new: &[u8],
        new_slot: Option<usize>,
        kdf_request: &PbkdfRequest,
    ) -> Result<(usize, usize)> {
        let unlocked = self.unlock(old, old_slot)?;
        let from = unlocked.keyslot;
        let to = match new_slot {
            Some(s) if s == from => from,
            Some(s) => {
                self.check_slot_index(s)?;
                if self.header.keyslots[s].state() != KeyslotState::Disabled {
                    return Err(FormatError::KeyslotActive(s));
                }
                s
            }
            None => self.first_free_slot().unwrap_or(from),
        };
        if to == from {
            self.destroy_slots(&[from])?;
            self.add_key(&unlocked.volume_key, new, Some(to), kdf_request)?;
        } else {
            self.add_key(&unlocked.volume_key, new, Some(to), kdf_request)?;
            self.destroy_slots(&[from])?;
        }
        Ok((from, to))
    }

    /// Disables and wipes every keyslot (luksErase); the volume becomes unopenable.
    pub fn erase(&mut self) -> Result<()> {
        let slots: Vec<usize> = (0..LUKS1_NUM_KEYSLOTS)
            .filter(|&s| self.header.keyslots[s].state() != KeyslotState::Disabled)
            .collect();
        self.destroy_slots(&slots)
    }

    /// Sets the UUID (`None`: a new random one) (luksUUID --uuid).
    pub fn set_uuid(&mut self, uuid: Option<&str>) -> Result<()> {
        let new = match uuid {
            Some(u) => parse_uuid(u)?,
            None => uuid::Uuid::new_v4().hyphenated().to_string(),
        };
        let old = std::mem::replace(&mut self.header.uuid, new);
        if let Err(e) = self.write_header() {
            self.header.uuid = old;
            return Err(e);
        }
        Ok(())
    }

    /// `cryptsetup luksDump` text; with a volume key, the `--dump-volume-key` variant.
    pub fn dump(&self, device_name: &str, volume_key: Option<&SecretBytes>) -> String {
        match volume_key {
            None => self.header.dump(device_name),
            Some(vk) => {
                use std::fmt::Write;
                let h = &self.header;
                let mut s = String::new();
                let _ = writeln!(s, "LUKS header information for {device_name}");
                let _ = writeln!(s, "Cipher name:   \t{}", h.cipher_name);
                let _ = writeln!(s, "Cipher mode:   \t{}", h.cipher_mode);
                let _ = writeln!(s, "Payload offset:\t{}", h.payload_offset);
                let _ = writeln!(s, "UUID:          \t{}", h.uuid);
                let _ = writeln!(s, "MK bits:       \t{}", h.key_bytes * 8);
                for (i, chunk) in vk.as_bytes().chunks(16).enumerate() {
                    let lead = if i == 0 { "MK dump:\t" } else { "\t\t" };
                    let _ = writeln!(s, "{lead}{}", hex_spaced(chunk));
                }
                s
            }
        }
    }

    /// The header backup image (luksHeaderBackup): header and keyslot areas, padded to
    /// 4 KiB, with the unused bytes after the header zeroed.
    pub fn header_backup(&self) -> Result<Vec<u8>> {
        let size = self.header.required_size() as usize;
        let mut buf = vec![0u8; size.div_ceil(4096) * 4096];
        self.dev
            .read_at(0, &mut buf[..size])
            .map_err(io_err("reading LUKS1 header area"))?;
        if self.header.keyslots[0].key_material_offset == LUKS1_KEYSLOTS_ALIGN_SECTORS {
            buf[LUKS1_HEADER_SIZE..4096].fill(0);
        }
        Ok(buf)
    }

    /// Writes a header backup image onto `dev` (luksHeaderRestore) and opens the result.
    ///
    /// Refuses backups whose header fails validation ("Header corrupted") or that are shorter
    /// than their keyslot areas ("Header too small"), and, when `dev` already holds a LUKS1
    /// header, backups with a different data offset or key size. Only the header and keyslot
    /// areas are written, which validation guarantees end before the data offset.
    pub fn restore_header(dev: D, backup: &[u8]) -> Result<Self> {
        let header = Luks1Header::parse(backup)?;
        let size = header.required_size();
        if (backup.len() as u64) < size {
            return Err(FormatError::TooSmall(format!(
                "header backup has {} bytes, its keyslots need {size} (LUKS1 requires at least \
                 {size} bytes)",
                backup.len()
            )));
        }
        if let Ok(existing) = Luks1Volume::open(&dev) {
            let e = &existing.header;
            if e.payload_offset != header.payload_offset || e.key_bytes != header.key_bytes {
                return Err(FormatError::InvalidParameter(
                    "Data offset or key size differs on device and backup, restore failed.".into(),
                ));
            }
        }
        dev.write_at(0, &backup[..size as usize])
            .map_err(io_err("writing restored LUKS1 header"))?;
        dev.sync()
            .map_err(io_err("syncing restored LUKS1 header"))?;
        Luks1Volume::open(dev)
    }
}

fn parse_uuid(u: &str) -> Result<String> {
    uuid::Uuid::parse_str(u)
        .map(|u| u.hyphenated().to_string())
        .map_err(|_| FormatError::InvalidParameter("Wrong LUKS UUID format provided.".into()))
}

fn random(buf: &mut [u8]) -> Result<()> {
    getrandom::getrandom(buf).map_err(|e| FormatError::Kdf(format!("random source: {e}")))
}
