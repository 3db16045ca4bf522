//! LUKS2: two checksummed header copies (binary header + JSON metadata), keyslots in a
//! separate area, data segments described in JSON.
//!
//! [`Luks2Header`] is the whole in-memory header. It keeps the JSON metadata as a generic
//! JSON value so that everything cryptblk does not interpret (tokens of any type, unknown
//! fields, flags) is written back verbatim; typed accessors read the parts it needs.
//!
//! # Crash safety of updates
//! Every metadata update goes through [`Luks2Header::write`]: the sequence id is increased,
//! the primary copy is written as one `hdr_size` write and synced, then the secondary the same
//! way. Each copy is valid only if its checksum (over the full copy) matches, so an update
//! interrupted at any write leaves either the primary torn (the old secondary is loaded: old
//! state) or the secondary torn/old (the new primary, with the higher seqid, wins: new state).
//! Keyslot material is written *before* the header that references it (into an area no
//! keyslot uses) and wiped only *after* the header that drops it, so the surviving header
//! always points at intact material.

mod areacipher;
pub mod binary;
mod convert;
mod dump;
mod format;
pub mod integrity;
pub mod json;
mod keyslot;
pub mod reencrypt;
pub mod reencrypt_encdec;
pub mod reencrypt_write;
pub mod validate;

pub use format::{FormatParams, DEFAULT_DATA_OFFSET, DEFAULT_METADATA_SIZE};
pub use keyslot::{KeyslotParams, UnlockPurpose};
pub use reencrypt::{ReencryptDirection, ReencryptKeyslot, ReencryptMode, Resilience, SegmentInfo};
pub use reencrypt_encdec::{EncDecInit, LayoutPart};
pub use reencrypt_write::{NewResilience, ReencryptInit, REENCRYPT_REQUIREMENT};

use crate::error::{FormatError, Result};
use crate::hdrio::HeaderIo;
use binary::{BinaryHeader, BIN_HDR_LEN, METADATA_SIZES};
use cryptblk_cipher::{CipherError, SecretBytes, SectorCipher, SectorOptions};
use serde_json::Value;

/// Highest keyslot/token/segment number LUKS2 allows plus one.
pub const LUKS2_OBJECTS_MAX: usize = 32;

/// What happened to one header copy while loading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyState {
    /// Checksum and metadata valid, and it is the copy in use.
    Valid,
    /// Valid but older (lower seqid) than the other copy.
    Obsolete,
    /// Unusable: the reason.
    Damaged(String),
}

/// The data segment the volume key decrypts (segment type `crypt`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CryptSegment {
    /// Segment number.
    pub id: u32,
    /// Byte offset of the encrypted data on the data device.
    pub offset: u64,
    /// Length in bytes; `None` means "dynamic" (to the end of the device).
    pub size: Option<u64>,
    /// IV offset in 512-byte sectors (dm-crypt's iv_offset).
    pub iv_tweak: u64,
    /// Cipher specification (`aes-xts-plain64`, possibly a `capi:` kernel name).
    pub encryption: String,
    /// Encryption sector size in bytes.
    pub sector_size: u32,
    /// Integrity type, when the segment has one.
    pub integrity: Option<String>,
    /// Segment flags.
    pub flags: Vec<String>,
}

/// Summary of one keyslot, for listing and for the CLI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyslotInfo {
    /// Keyslot number.
    pub id: usize,
    /// Keyslot type (`luks2`, `reencrypt`, ...).
    pub kind: String,
    /// Stored key size in bytes.
    pub key_size: usize,
    /// Priority: 0 ignore, 1 normal, 2 prefer.
    pub priority: u8,
    /// KDF type name.
    pub kdf: String,
    /// True when no digest binds the key to a data segment.
    pub unbound: bool,
}

/// The activation flags cryptsetup can store in `config.flags` (`--persistent`), in the
/// order it writes them: `--allow-discards`, `--perf-same_cpu_crypt`,
/// `--perf-submit_from_crypt_cpus`, `--integrity-no-journal`, `--perf-no_read_workqueue`,
/// `--perf-no_write_workqueue` and (cryptsetup 2.8, spelt with an underscore)
/// `--perf-high_priority`.
pub const PERSISTENT_FLAGS: [&str; 7] = [
    "allow-discards",
    "same-cpu-crypt",
    "submit-from-crypt-cpus",
    "no-journal",
    "no-read-workqueue",
    "no-write-workqueue",
    "high_priority",
];

/// An in-memory LUKS2 header (both copies share it; they differ only in magic, offset and
/// salt).
#[derive(Clone, Debug)]
pub struct Luks2Header {
    hdr_size: u64,
    seqid: u64,
    label: String,
    subsystem: String,
    checksum_alg: String,
    uuid: String,
    salts: [[u8; 64]; 2],
    json: Value,
    primary: CopyState,
    secondary: CopyState,
    repaired_json: bool,
}

struct LoadedCopy {
    bin: BinaryHeader,
    json: Value,
}

/// Reads one copy at `offset` and checks it completely (binary sanity, checksum, JSON).
fn read_copy(io: &dyn HeaderIo, offset: u64, secondary: bool) -> Result<(LoadedCopy, bool)> {
    let mut bin_buf = vec![0u8; BIN_HDR_LEN];
    io.read_at(offset, &mut bin_buf).map_err(|e| {
        // A device too small to hold a binary header simply is not LUKS2.
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            FormatError::NotLuks
        } else {
            FormatError::io("reading LUKS2 binary header", e)
        }
    })?;
    let bin = BinaryHeader::decode(&bin_buf, offset, secondary)?;
    let mut area = vec![0u8; bin.hdr_size as usize];
    io.read_at(offset, &mut area)
        .map_err(|e| FormatError::io("reading LUKS2 JSON area", e))?;
    binary::verify_checksum(&bin.checksum_alg, &area)?;
    let (mut json, _) = json::parse_area(&area[BIN_HDR_LEN..])?;
    let repaired = validate::validate_or_repair(&mut json, bin.hdr_size - BIN_HDR_LEN as u64)?;
    Ok((LoadedCopy { bin, json }, repaired))
}

/// Only checks the magic of the primary copy (cryptsetup's `isLuks` fast path).
pub fn has_primary_magic(io: &dyn HeaderIo) -> bool {
    let mut b = [0u8; 8];
    io.read_at(0, &mut b).is_ok() && &b[..6] == binary::MAGIC_PRIMARY && b[6..8] == [0, 2]
}

/// The LVM2 physical volume label ("LABELONE" + "LVM2 001") in any of the first four
/// sectors, which blkid reports as `LVM2_member`.
pub fn lvm2_signature_sector(io: &dyn HeaderIo) -> Option<u64> {
    (0..4u64).find(|&s| {
        let mut b = [0u8; 32];
        io.read_at(s * 512, &mut b).is_ok() && &b[..8] == b"LABELONE" && &b[24..32] == b"LVM2 001"
    })
}

impl Luks2Header {
    /// Loads the header: both copies are read and checked, the valid one with the higher
    /// sequence id wins. A damaged primary is survived through the secondary (found by
    /// probing every allowed metadata size), and a damaged secondary through the primary;
    /// [`Luks2Header::needs_repair`] then says so and the next [`Luks2Header::write`] (or
    /// [`Luks2Header::repair`]) rewrites both. Fails when neither copy is valid or the
    /// device is smaller than the metadata and keyslots areas.
    ///
    /// Like cryptsetup, a header that needs recovery on a device that also carries another
    /// signature (an LVM2 PV label) is refused as ambiguous until [`repair_device`].
    pub fn read(io: &dyn HeaderIo) -> Result<Self> {
        let hdr = Self::read_unprobed(io)?;
        if hdr.needs_repair() {
            if let Some(sector) = lvm2_signature_sector(io) {
                return Err(FormatError::Corrupt(format!(
                    "Device contains ambiguous signatures (LVM2_member label in sector {sector}), \
                     cannot auto-recover LUKS2. Please run \"cryptsetup repair\" for recovery."
                )));
            }
        }
        Ok(hdr)
    }

    /// [`Luks2Header::read`] without the foreign-signature probe (used by repair).
    fn read_unprobed(io: &dyn HeaderIo) -> Result<Self> {
        let first = read_copy(io, 0, false);
        let mut hdr1_size = None;
        let state1 = match first {
            Ok(c) => {
                hdr1_size = Some(c.0.bin.hdr_size);
                Ok(c)
            }
            Err(e) => {
                // A copy whose binary header and checksum are fine but whose JSON is invalid
                // still tells where the secondary lives.
                let mut b = vec![0u8; BIN_HDR_LEN];
                if io.read_at(0, &mut b).is_ok() {
                    if let Ok(bin) = BinaryHeader::decode(&b, 0, false) {
                        let mut area = vec![0u8; bin.hdr_size as usize];
                        if io.read_at(0, &mut area).is_ok()
                            && binary::verify_checksum(&bin.checksum_alg, &area).is_ok()
                        {
                            hdr1_size = Some(bin.hdr_size);
                        }
                    }
                }
                Err(e)
            }
        };
        let state2 = match hdr1_size {
            Some(off) => read_copy(io, off, true),
            None => {
                let mut last = Err(FormatError::NotLuks);
                for &off in &METADATA_SIZES {
                    // Find the first offset with a sane binary header and valid checksum.
                    let mut b = vec![0u8; BIN_HDR_LEN];
                    if io.read_at(off, &mut b).is_err() {
                        continue;
                    }
                    let Ok(bin) = BinaryHeader::decode(&b, off, true) else {
                        continue;
                    };
                    let mut area = vec![0u8; bin.hdr_size as usize];
                    if io.read_at(off, &mut area).is_err()
                        || binary::verify_checksum(&bin.checksum_alg, &area).is_err()
                    {
                        continue;
                    }
                    last = read_copy(io, off, true);
                    break;
                }
                last
            }
        };
        let (chosen, other_bin, primary_state, secondary_state, repaired) = match (state1, state2) {
            (Ok((c1, r1)), Ok((c2, r2))) => {
                if c1.bin.seqid >= c2.bin.seqid {
                    let s2 = if c1.bin.seqid > c2.bin.seqid {
                        CopyState::Obsolete
                    } else {
                        CopyState::Valid
                    };
                    (c1, Some(c2.bin), CopyState::Valid, s2, r1)
                } else {
                    (c2, Some(c1.bin), CopyState::Obsolete, CopyState::Valid, r2)
                }
            }
            (Ok((c1, r1)), Err(e2)) => (
                c1,
                None,
                CopyState::Valid,
                CopyState::Damaged(e2.to_string()),
                r1,
            ),
            (Err(e1), Ok((c2, r2))) => (
                c2,
                None,
                CopyState::Damaged(e1.to_string()),
                CopyState::Valid,
                r2,
            ),
            (Err(e1), Err(e2)) => {
                return Err(match (e1, e2) {
                    (FormatError::NotLuks, FormatError::NotLuks) => FormatError::NotLuks,
                    // A LUKS1 (or future) header: say which version it is.
                    (e @ FormatError::UnsupportedVersion(_), FormatError::NotLuks) => e,
                    (FormatError::Io { context, source }, _) => FormatError::Io { context, source },
                    (e1, e2) => FormatError::Corrupt(format!(
                        "both LUKS2 header copies are invalid (primary: {e1}; secondary: {e2})"
                    )),
                });
            }
        };
        let mut salts = [[0u8; 64]; 2];
        let idx = usize::from(chosen.bin.secondary);
        salts[idx] = chosen.bin.salt;
        salts[1 - idx] = match other_bin {
            Some(b) => b.salt,
            None => random_salt(),
        };
        let hdr = Luks2Header {
            hdr_size: chosen.bin.hdr_size,
            seqid: chosen.bin.seqid,
            label: chosen.bin.label,
            subsystem: chosen.bin.subsystem,
            checksum_alg: chosen.bin.checksum_alg,
            uuid: chosen.bin.uuid,
            salts,
            json: chosen.json,
            primary: primary_state,
            secondary: secondary_state,
            repaired_json: repaired,
        };
        let needed = hdr.metadata_and_keyslots_size();
        let size = io
            .size()
            .map_err(|e| FormatError::io("reading device size", e))?;
        if size < needed {
            return Err(FormatError::TooSmall(format!(
                "LUKS2 metadata and keyslots need {needed} bytes, device has {size}"
            )));
        }
        Ok(hdr)
    }

    /// Loads the header for a metadata change or activation: as [`Luks2Header::read`], then
    /// refuses volumes whose mandatory requirements cryptblk does not know.
    pub fn read_for_write(io: &dyn HeaderIo) -> Result<Self> {
        let h = Self::read(io)?;
        h.check_requirements()?;
        Ok(h)
    }

    /// Fails with a clear error when the header lists a mandatory requirement cryptblk does
    /// not implement (cryptsetup: "Unmet LUKS2 requirements detected", -ETXTBSY). Known
    /// reencryption/OPAL requirements are also refused: a header change or a plain
    /// activation cannot honour them (a reencryption in progress is refused with cryptsetup's
    /// own message; [`Luks2Header::check_requirements_except_reencryption`] lets it pass).
    pub fn check_requirements(&self) -> Result<()> {
        self.check_requirements_except_reencryption()?;
        if self.reencryption_in_progress() {
            return Err(FormatError::Incompatible(
                "Operation incompatible with device marked for LUKS2 reencryption. Aborting."
                    .into(),
            ));
        }
        Ok(())
    }

    /// As [`Luks2Header::check_requirements`], but an online reencryption requirement
    /// passes: for the operations cryptsetup allows on a volume mid-reencryption (header
    /// backup and restore, `luksErase`, reencryption itself and its recovery).
    pub fn check_requirements_except_reencryption(&self) -> Result<()> {
        let reqs = self.requirements();
        let unknown: Vec<&str> = reqs
            .iter()
            .map(String::as_str)
            .filter(|r| !validate::KNOWN_REQUIREMENTS.contains(r))
            .collect();
        if !unknown.is_empty() {
            return Err(FormatError::Unsupported(format!(
                "Unmet LUKS2 requirements detected (unknown mandatory requirement(s): {})",
                unknown.join(" ")
            )));
        }
        if reqs.iter().any(|r| r == "offline-reencrypt") {
            return Err(FormatError::Incompatible(
                "Operation incompatible with device marked for legacy reencryption. Aborting."
                    .into(),
            ));
        }
        let other: Vec<&str> = reqs
            .iter()
            .map(String::as_str)
            .filter(|r| !validate::is_online_reencrypt_requirement(r))
            .collect();
        if !other.is_empty() {
            return Err(FormatError::Unsupported(format!(
                "operation incompatible with LUKS2 requirement(s): {}",
                other.join(" ")
            )));
        }
        Ok(())
    }

    /// True when the header carries an online reencryption requirement
    /// (`online-reencrypt`, `online-reencrypt-v2`, `-v3`, ...): a reencryption was
    /// initialised and not finished (see [`Luks2Header::reencrypt_keyslot`]).
    pub fn reencryption_in_progress(&self) -> bool {
        self.requirements()
            .iter()
            .any(|r| validate::is_online_reencrypt_requirement(r))
    }

    /// N of the `online-reencrypt-vN` requirement (`None` without one, or for the
    /// unversioned `online-reencrypt` of cryptsetup 2.2).
    pub fn reencrypt_requirement_version(&self) -> Option<u8> {
        self.requirements()
            .iter()
            .find_map(|r| r.strip_prefix("online-reencrypt-v")?.parse().ok())
    }

    /// The mandatory requirement names (`config.requirements.mandatory`).
    pub fn requirements(&self) -> Vec<String> {
        validate::mandatory_requirements(&self.json)
    }

    /// True when a header copy was damaged or stale at load time.
    pub fn needs_repair(&self) -> bool {
        self.primary != CopyState::Valid || self.secondary != CopyState::Valid
    }

    /// State of the (primary, secondary) copies at load time.
    pub fn copy_states(&self) -> (&CopyState, &CopyState) {
        (&self.primary, &self.secondary)
    }

    /// True when loading applied cryptsetup's automatic JSON repair (leftover KDF params).
    pub fn json_was_repaired(&self) -> bool {
        self.repaired_json
    }

    /// Rewrites both copies from the valid one (`cryptsetup repair`), keeping the seqid
    /// increasing. Also used to fix a stale copy after an interrupted update.
    pub fn repair(&mut self, io: &dyn HeaderIo) -> Result<()> {
        self.write_unchecked(io)
    }

    /// Writes both header copies with seqid + 1 (see the module docs for the order).
    /// Refuses volumes with unmet requirements.
    pub fn write(&mut self, io: &dyn HeaderIo) -> Result<()> {
        self.check_requirements()?;
        self.write_unchecked(io)
    }

    pub(crate) fn write_unchecked(&mut self, io: &dyn HeaderIo) -> Result<()> {
        self.write_copies(io, true)
    }

    /// Writes the primary copy, syncs, then writes the secondary copy and, when
    /// `sync_secondary`, syncs again. Without that last sync the caller must sync `io`
    /// before the next header write: until then the synced primary is the newest valid copy
    /// and a crash leaves it (a stale or torn secondary loses to it on load).
    fn write_copies(&mut self, io: &dyn HeaderIo, sync_secondary: bool) -> Result<()> {
        let json_area = (self.hdr_size as usize) - BIN_HDR_LEN;
        validate::validate(&self.json, json_area as u64)?;
        let text = json::to_compact(&self.json);
        if text.len() > json_area - 1 {
            return Err(FormatError::InvalidParameter(format!(
                "JSON metadata ({} bytes) does not fit the {json_area}-byte area",
                text.len()
            )));
        }
        // cryptsetup's guard against two writers: the primary on disk must still be the
        // copy this header was loaded from.
        if self.primary == CopyState::Valid {
            let mut b = vec![0u8; BIN_HDR_LEN];
            if io.read_at(0, &mut b).is_ok() {
                if let Ok(bin) = BinaryHeader::decode(&b, 0, false) {
                    if bin.uuid == self.uuid && bin.seqid != self.seqid {
                        return Err(FormatError::InvalidParameter(
                            "Detected attempt for concurrent LUKS2 metadata update (on-disk \
                             sequence id changed); re-read the header"
                                .into(),
                        ));
                    }
                }
            }
        }
        let seqid = self.seqid + 1;
        let copies = [false, true].map(|secondary| self.encode_copy(secondary, seqid, &text));
        let primary = copies[0].as_ref().map_err(clone_err)?;
        let secondary = copies[1].as_ref().map_err(clone_err)?;
        let result = io
            .write_at(0, primary)
            .map_err(|e| FormatError::io("writing primary LUKS2 header", e))
            .and_then(|_| {
                io.sync()
                    .map_err(|e| FormatError::io("syncing primary LUKS2 header", e))
            })
            .and_then(|_| {
                io.write_at(self.hdr_size, secondary)
                    .map_err(|e| FormatError::io("writing secondary LUKS2 header", e))
            })
            .and_then(|_| {
                if !sync_secondary {
                    return Ok(());
                }
                io.sync()
                    .map_err(|e| FormatError::io("syncing secondary LUKS2 header", e))
            });
        if let Err(e) = result {
            // The copies on disk are now in an unknown mix of old and new: a retry must not
            // trip the concurrent-update guard, and callers should re-read.
            self.primary = CopyState::Damaged(format!("interrupted write: {e}"));
            return Err(e);
        }
        self.seqid = seqid;
        self.primary = CopyState::Valid;
        self.secondary = CopyState::Valid;
        Ok(())
    }

    fn encode_copy(&self, secondary: bool, seqid: u64, text: &str) -> Result<Vec<u8>> {
        let bin = BinaryHeader {
            secondary,
            version: 2,
            hdr_size: self.hdr_size,
            seqid,
            label: self.label.clone(),
            checksum_alg: self.checksum_alg.clone(),
            salt: self.salts[usize::from(secondary)],
            uuid: self.uuid.clone(),
            subsystem: self.subsystem.clone(),
            hdr_offset: if secondary { self.hdr_size } else { 0 },
        };
        let mut area = bin.encode();
        area.resize(self.hdr_size as usize, 0);
        area[BIN_HDR_LEN..BIN_HDR_LEN + text.len()].copy_from_slice(text.as_bytes());
        binary::seal(&self.checksum_alg, &mut area)?;
        Ok(area)
    }

    /// The JSON metadata (read-only).
    pub fn json(&self) -> &Value {
        &self.json
    }

    /// Size of one header copy (binary header + JSON area) in bytes.
    pub fn metadata_size(&self) -> u64 {
        self.hdr_size
    }

    /// Size of the keyslots area in bytes.
    pub fn keyslots_size(&self) -> u64 {
        validate::config_sizes(&self.json).map_or(0, |(_, k)| k)
    }

    /// Both header copies plus the keyslots area: the bytes a header backup holds.
    pub fn metadata_and_keyslots_size(&self) -> u64 {
        2 * self.hdr_size + self.keyslots_size()
    }

    /// Sequence id ("Epoch" in luksDump).
    pub fn seqid(&self) -> u64 {
        self.seqid
    }

    /// Volume UUID.
    pub fn uuid(&self) -> &str {
        &self.uuid
    }

    /// Label ("" when none).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Subsystem ("" when none).
    pub fn subsystem(&self) -> &str {
        &self.subsystem
    }

    /// Sets the label (max 47 bytes); takes effect on the next write.
    pub fn set_label(&mut self, label: &str) -> Result<()> {
        check_label(label, "label")?;
        self.label = label.to_string();
        Ok(())
    }

    /// Sets the subsystem (max 47 bytes); takes effect on the next write.
    pub fn set_subsystem(&mut self, subsystem: &str) -> Result<()> {
        check_label(subsystem, "subsystem")?;
        self.subsystem = subsystem.to_string();
        Ok(())
    }

    /// Sets the UUID (must be a valid UUID text); takes effect on the next write.
    pub fn set_uuid(&mut self, uuid: &str) -> Result<()> {
        let parsed = uuid::Uuid::parse_str(uuid)
            .map_err(|_| FormatError::InvalidParameter(format!("invalid UUID '{uuid}'")))?;
        self.uuid = parsed.hyphenated().to_string();
        Ok(())
    }

    /// The config flags (`allow-discards`, `same-cpu-crypt`, ...).
    pub fn config_flags(&self) -> Vec<String> {
        self.json["config"]
            .get("flags")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Replaces the persistent config flags; takes effect on the next write.
    pub fn set_config_flags(&mut self, flags: &[String]) {
        let cfg = self.json["config"].as_object_mut();
        if let Some(cfg) = cfg {
            if flags.is_empty() {
                cfg.remove("flags");
            } else {
                cfg.insert(
                    "flags".into(),
                    Value::Array(flags.iter().cloned().map(Value::String).collect()),
                );
            }
        }
    }

    /// Replaces the stored activation flags as cryptsetup's `open/refresh --persistent`
    /// does: the whole set is replaced (an empty set clears it, leaving `"flags": []` as
    /// cryptsetup does), names in cryptsetup's order ([`PERSISTENT_FLAGS`]). Takes effect on
    /// the next [`Luks2Header::write`]. Refuses names cryptsetup cannot store.
    pub fn set_persistent_flags(&mut self, names: &[&str]) -> Result<()> {
        if let Some(bad) = names.iter().find(|n| !PERSISTENT_FLAGS.contains(n)) {
            return Err(FormatError::InvalidParameter(format!(
                "'{bad}' is no LUKS2 persistent activation flag"
            )));
        }
        let cfg = self.json["config"].as_object_mut().ok_or_else(|| {
            FormatError::InvalidParameter("LUKS2 metadata has no config object".into())
        })?;
        let ordered = PERSISTENT_FLAGS
            .iter()
            .filter(|f| names.contains(f))
            .map(|f| Value::String(f.to_string()))
            .collect();
        cfg.insert("flags".into(), Value::Array(ordered));
        Ok(())
    }

    /// All segments of type `crypt`, in segment-number order (backup segments excluded).
    pub fn crypt_segments(&self) -> Vec<CryptSegment> {
        let Some(segs) = self.json["segments"].as_object() else {
            return Vec::new();
        };
        json::numeric_keys(segs)
            .into_iter()
            .filter_map(|(id, key)| {
                let s = &segs[key.as_str()];
                if s["type"] != "crypt" || validate::segment_is_backup(s) {
                    return None;
                }
                Some(CryptSegment {
                    id: u32::try_from(id).ok()?,
                    offset: json::get_u64_str(s, "offset")?,
                    size: json::get_u64_str(s, "size"),
                    iv_tweak: json::get_u64_str(s, "iv_tweak")?,
                    encryption: s["encryption"].as_str()?.to_string(),
                    sector_size: json::get_u32(s, "sector_size")?,
                    integrity: s
                        .get("integrity")
                        .and_then(|i| i.get("type"))
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    flags: s
                        .get("flags")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(|v| v.as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default(),
                })
            })
            .collect()
    }

    /// The segment a plain `open` maps: the lowest-numbered crypt segment.
    pub fn default_segment(&self) -> Result<CryptSegment> {
        self.crypt_segments()
            .into_iter()
            .next()
            .ok_or_else(|| FormatError::Unsupported("LUKS2 header has no crypt segment".into()))
    }

    /// The dm-crypt parameters of the default segment as a ready sector cipher under the
    /// volume key `vk` (what activation maps): sector size from the segment, IV offset =
    /// `iv_tweak` (512-byte units, no `iv_large_sectors`, as cryptsetup's LUKS2 tables).
    /// Refuses unmet requirements, and kernel-only cipher names with cryptsetup's
    /// "No known cipher specification pattern" error.
    pub fn open_segment_cipher(&self, vk: &SecretBytes) -> Result<Box<dyn SectorCipher>> {
        self.check_requirements()?;
        let seg = self.default_segment()?;
        if let Some(i) = &seg.integrity {
            return Err(FormatError::Unsupported(format!(
                "segment {} uses integrity '{i}': it is no single sector cipher (activate it \
                 through Luks2Header::integrity_layout)",
                seg.id
            )));
        }
        let opts = SectorOptions {
            sector_size: seg.sector_size as usize,
            iv_offset: seg.iv_tweak,
            iv_large_sectors: false,
            implementation: None,
        };
        cryptblk_cipher::open_cipher(&seg.encryption, vk.as_bytes(), &opts).map_err(|e| match e {
            CipherError::UnknownSpec(spec) => FormatError::Unsupported(format!(
                "No known cipher specification pattern detected for '{spec}'"
            )),
            other => FormatError::Cipher(other),
        })
    }

    /// Byte offset of the data (lowest non-backup segment offset).
    pub fn data_offset(&self) -> u64 {
        validate::min_segment_offset(&self.json)
    }

    /// Keyslot summaries in number order.
    pub fn keyslots(&self) -> Vec<KeyslotInfo> {
        let Some(ks) = self.json["keyslots"].as_object() else {
            return Vec::new();
        };
        json::numeric_keys(ks)
            .into_iter()
            .map(|(id, key)| {
                let k = &ks[key.as_str()];
                KeyslotInfo {
                    id: id as usize,
                    kind: k["type"].as_str().unwrap_or("").to_string(),
                    key_size: json::get_u32(k, "key_size").unwrap_or(0) as usize,
                    priority: keyslot::priority_of(k),
                    kdf: k["kdf"]["type"].as_str().unwrap_or("").to_string(),
                    unbound: !self.keyslot_is_bound(id as usize),
                }
            })
            .collect()
    }

    /// True when the keyslot's digest is the digest of some data (non-backup) segment, where
    /// a segment's digest is the lowest-numbered digest listing it. Mid-reencryption the
    /// hotzone lists both keys' digests and counts for the old one only, so the new key's
    /// keyslot is unbound (as cryptsetup's luksDump says) until a segment of new data exists.
    pub fn keyslot_is_bound(&self, slot: usize) -> bool {
        let name = slot.to_string();
        let Some(digests) = self.json["digests"].as_object() else {
            return false;
        };
        let Some(segments) = self.json["segments"].as_object() else {
            return false;
        };
        let ordered = json::numeric_keys(digests);
        segments
            .iter()
            .filter(|(_, s)| !validate::segment_is_backup(s))
            .filter_map(|(seg, _)| {
                ordered
                    .iter()
                    .map(|(_, id)| &digests[id.as_str()])
                    .find(|d| json::array_has(d.get("segments"), seg))
            })
            .any(|d| json::array_has(d.get("keyslots"), &name))
    }

    /// Token ids in number order.
    pub fn token_ids(&self) -> Vec<usize> {
        self.json["tokens"]
            .as_object()
            .map(|t| {
                json::numeric_keys(t)
                    .into_iter()
                    .map(|(n, _)| n as usize)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The token JSON exactly as stored.
    pub fn token(&self, id: usize) -> Option<&Value> {
        self.json["tokens"].get(id.to_string())
    }

    /// Removes a token (takes effect on the next write). The other tokens keep their order
    /// in the JSON, as json-c keeps it.
    pub fn remove_token(&mut self, id: usize) -> Result<()> {
        self.json["tokens"]
            .as_object_mut()
            .and_then(|t| t.shift_remove(&id.to_string()))
            .map(|_| ())
            .ok_or_else(|| FormatError::InvalidParameter(format!("token {id} is not in use")))
    }

    /// Adds or replaces a token with the given JSON object (`token import`); `id` None picks
    /// the first free number. Returns the id used.
    pub fn import_token(&mut self, id: Option<usize>, token: Value) -> Result<usize> {
        if !token.is_object() {
            return Err(FormatError::InvalidParameter(
                "token must be a JSON object".into(),
            ));
        }
        let used = self.token_ids();
        let id = match id {
            Some(i) if i < LUKS2_OBJECTS_MAX => i,
            Some(i) => {
                return Err(FormatError::InvalidParameter(format!(
                    "token id {i} out of range"
                )))
            }
            None => (0..LUKS2_OBJECTS_MAX)
                .find(|i| !used.contains(i))
                .ok_or_else(|| FormatError::InvalidParameter("all token ids in use".into()))?,
        };
        let mut candidate = self.json.clone();
        if let Some(t) = candidate["tokens"].as_object_mut() {
            t.insert(id.to_string(), token);
        }
        validate::validate(&candidate, self.hdr_size - BIN_HDR_LEN as u64)?;
        self.json = candidate;
        Ok(id)
    }

    /// `luksDump` text, formatted as cryptsetup 2.6 prints it.
    pub fn dump(&self) -> String {
        dump::dump(self)
    }

    /// `luksDump --dump-volume-key` text for `device` (as cryptsetup prints it; the key is
    /// printed in hex, so only call this when the user asked for it).
    pub fn dump_volume_key(&self, device: &str, vk: &SecretBytes) -> String {
        dump::volume_key(self, device, vk.as_bytes())
    }

    /// `luksDump --unbound -S <slot>` text for an unbound key opened from keyslot `slot`.
    pub fn dump_unbound_key(&self, device: &str, slot: usize, key: &SecretBytes) -> String {
        dump::unbound_key(self, device, slot, key.as_bytes())
    }

    /// `luksDump --dump-json-metadata` text (json-c pretty format; like cryptsetup, no
    /// trailing newline).
    pub fn dump_json(&self) -> String {
        json::to_pretty(&self.json)
    }

    /// Copies both header copies and the keyslots area to `out` (`luksHeaderBackup`).
    pub fn backup(&self, io: &dyn HeaderIo, out: &dyn HeaderIo) -> Result<()> {
        let len = self.metadata_and_keyslots_size();
        copy_range(io, out, 0, len)?;
        out.sync()
            .map_err(|e| FormatError::io("syncing header backup", e))
    }

    /// Restores a header backup onto `io` (`luksHeaderRestore`): the backup must hold a valid
    /// LUKS2 header; when `io` already holds LUKS2 metadata its layout (sizes and data
    /// offset) must match so that restoring cannot overwrite data.
    pub fn restore(io: &dyn HeaderIo, backup: &dyn HeaderIo) -> Result<Luks2Header> {
        // cryptsetup restores headers of (and onto) volumes mid-reencryption.
        let new = Self::read(backup)?;
        new.check_requirements_except_reencryption()?;
        if let Ok(cur) = Self::read(io) {
            cur.check_requirements_except_reencryption()?;
            if cur.metadata_and_keyslots_size() != new.metadata_and_keyslots_size()
                || cur.data_offset() != new.data_offset()
            {
                return Err(FormatError::InvalidParameter(
                    "header backup layout (metadata/keyslots size or data offset) differs from the device".into(),
                ));
            }
        }
        let len = new.metadata_and_keyslots_size();
        copy_range(backup, io, 0, len)?;
        io.sync()
            .map_err(|e| FormatError::io("syncing restored header", e))?;
        Self::read(io)
    }

    /// Destroys every keyslot (`luksErase`): wipes each keyslot area, then removes the
    /// keyslots from the metadata. Tokens, digests and segments stay; so does the
    /// `reencrypt` keyslot of a reencryption in progress, with its area (it holds the
    /// hotzone's resilience data), as cryptsetup keeps it.
    pub fn erase(&mut self, io: &dyn HeaderIo) -> Result<()> {
        self.check_requirements_except_reencryption()?;
        let ids: Vec<usize> = self
            .keyslots()
            .iter()
            .filter(|k| k.kind != "reencrypt")
            .map(|k| k.id)
            .collect();
        let areas: Vec<(u64, u64)> = ids.iter().filter_map(|&i| self.keyslot_area(i)).collect();
        for id in &ids {
            self.drop_keyslot_json(*id);
        }
        self.write_unchecked(io)?;
        for (off, len) in areas {
            keyslot::wipe_area(io, off, len)?;
        }
        Ok(())
    }
}

fn clone_err(e: &FormatError) -> FormatError {
    FormatError::Corrupt(e.to_string())
}

fn check_label(s: &str, what: &str) -> Result<()> {
    if s.len() > 47 || s.as_bytes().contains(&0) {
        return Err(FormatError::InvalidParameter(format!(
            "{what} must be at most 47 bytes without NUL"
        )));
    }
    Ok(())
}

fn random_salt() -> [u8; 64] {
    let mut s = [0u8; 64];
    // A failing OS random source leaves a zero salt; the salt only diversifies checksums.
    let _ = getrandom::getrandom(&mut s);
    s
}

fn copy_range(from: &dyn HeaderIo, to: &dyn HeaderIo, start: u64, len: u64) -> Result<()> {
    const CHUNK: u64 = 1 << 20;
    let mut buf = vec![0u8; CHUNK as usize];
    let mut off = start;
    while off < start + len {
        let n = CHUNK.min(start + len - off) as usize;
        from.read_at(off, &mut buf[..n])
            .map_err(|e| FormatError::io("reading LUKS2 metadata", e))?;
        to.write_at(off, &buf[..n])
            .map_err(|e| FormatError::io("writing LUKS2 metadata", e))?;
        off += n as u64;
    }
    Ok(())
}

/// cryptsetup's `isLuks` for LUKS2: a loadable header (see [`Luks2Header::read`], which
/// also refuses ambiguous signatures).
pub fn is_luks2(io: &dyn HeaderIo) -> Result<()> {
    Luks2Header::read(io).map(|_| ())
}

/// `repair`: loads the valid copy without the foreign-signature probe and rewrites both
/// copies. Rewriting the primary's 4 KiB binary header zeroes sectors 1..7, which removes an
/// LVM2 label sitting there; a label anywhere else is reported, not touched.
///
/// A header with nothing to repair (both copies valid, no JSON fix-up, no LVM2 label) is
/// not written at all, as cryptsetup's "No known problems detected": a repair that then
/// fails for another reason (an unknown requirement, a reencryption it cannot recover)
/// must leave the image byte for byte as it was.
pub fn repair_device(io: &dyn HeaderIo) -> Result<Luks2Header> {
    let mut hdr = Luks2Header::read_unprobed(io)?;
    if !repair_needed(io, &hdr) {
        return Ok(hdr);
    }
    hdr.repair(io)?;
    if let Some(sector) = lvm2_signature_sector(io) {
        return Err(FormatError::Corrupt(format!(
            "LVM2 label in sector {sector} still present after repair"
        )));
    }
    Ok(hdr)
}

/// True when `repair` of the header on `io` (loaded as `hdr`) has anything to rewrite: a
/// damaged or stale copy, JSON that loading had to fix up, or an LVM2 label beside it.
pub fn repair_needed(io: &dyn HeaderIo, hdr: &Luks2Header) -> bool {
    hdr.needs_repair() || hdr.json_was_repaired() || lvm2_signature_sector(io).is_some()
}

/// As [`repair_needed`] for the header on `io`, loaded without the foreign-signature probe
/// (as `repair` loads it).
pub fn repair_needed_on(io: &dyn HeaderIo) -> Result<bool> {
    let hdr = Luks2Header::read_unprobed(io)?;
    Ok(repair_needed(io, &hdr))
}

/// The volume key together with the keyslot that released it.
#[derive(Debug)]
pub struct Unlocked {
    /// Keyslot number.
    pub slot: usize,
    /// The key (volume key, or the unbound key of an unbound keyslot).
    pub key: SecretBytes,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hdrio::MemIo;
    use crate::kdf::PbkdfRequest;
    use cryptblk_cipher::hash::HashAlgorithm;

    #[test]
    fn persistent_flags_replace_the_stored_set_in_cryptsetups_order() {
        let dev = MemIo::zeroed(3 << 20);
        let p = FormatParams {
            keyslots_size: Some(1 << 20),
            keyslot: KeyslotParams::new(
                PbkdfRequest::pbkdf2(HashAlgorithm::Sha256).with_forced_iterations(1000),
            ),
            ..FormatParams::default()
        };
        let (mut h, _, _) = Luks2Header::format(&dev, &p, b"pw").unwrap();
        let seqid = h.seqid();
        h.set_persistent_flags(&["no-read-workqueue", "allow-discards"])
            .unwrap();
        h.write(&dev).unwrap();
        let back = Luks2Header::read(&dev).unwrap();
        assert_eq!(back.seqid(), seqid + 1);
        assert_eq!(back.config_flags(), ["allow-discards", "no-read-workqueue"]);
        assert_eq!(back.copy_states(), (&CopyState::Valid, &CopyState::Valid));
        // Replaced, not merged; an empty set stays an (empty) array.
        let mut h = back;
        h.set_persistent_flags(&["no-journal"]).unwrap();
        assert_eq!(h.config_flags(), ["no-journal"]);
        h.set_persistent_flags(&[]).unwrap();
        assert_eq!(h.json()["config"]["flags"], serde_json::json!([]));
        // cryptsetup 2.8 stores --perf-high_priority last, with its underscore.
        h.set_persistent_flags(&["high_priority", "allow-discards"])
            .unwrap();
        assert_eq!(h.config_flags(), ["allow-discards", "high_priority"]);
        assert!(h.set_persistent_flags(&["high-priority"]).is_err());
    }
}
