//! The reencryption a LUKS2 header describes.

use crate::error::{Result, VolumeError};
use cryptblk_format::luks2::{Luks2Header, ReencryptKeyslot, ReencryptMode, SegmentInfo};

/// Under which key a data segment's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The old volume key (`backup-previous`'s parameters).
    Old,
    /// The new volume key (`backup-final`'s parameters).
    New,
    /// The hotzone (`in-reencryption`): old or new block by block, decided by recovery.
    Hotzone,
}

/// One data (non-backup) segment with the side its data is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateSegment {
    /// Byte offset on the data device.
    pub offset: u64,
    /// Byte length; `None` to the end of the device.
    pub size: Option<u64>,
    /// Old, new or hotzone.
    pub side: Side,
    /// Logical start: bytes from the first byte of the volume's data (the data of a
    /// datashift reencryption sits elsewhere physically).
    pub logical: u64,
}

/// A reencryption in progress: re-key, encryption or decryption, with or without a data
/// shift.
#[derive(Clone, Debug)]
pub struct ReencryptState {
    /// The `reencrypt` keyslot.
    pub keyslot: ReencryptKeyslot,
    /// The whole old segment (`backup-previous`): cipher and IV base of old data.
    pub previous: SegmentInfo,
    /// The whole new segment (`backup-final`).
    pub fin: SegmentInfo,
    /// Digest of the old key (empty when the old data is plaintext: encryption).
    pub old_digest: String,
    /// Digest of the new key (empty when the new data is plaintext: decryption).
    pub new_digest: String,
    /// The first `shift` bytes of the old data moved elsewhere (`backup-moved-segment`).
    pub moved: Option<SegmentInfo>,
    /// The data segments in order.
    pub segments: Vec<StateSegment>,
}

fn unsupported(msg: impl Into<String>) -> VolumeError {
    VolumeError::usage(msg)
}

fn one_digest(h: &Luks2Header, seg: &SegmentInfo, what: &str) -> Result<String> {
    let d = h.digests_of_segment(seg.id);
    match d.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(VolumeError::device(format!(
            "LUKS2 reencryption metadata is invalid: the {what} segment has {} digests",
            d.len()
        ))),
    }
}

impl ReencryptState {
    /// The reencryption `h` describes; `None` when no reencryption is in progress.
    /// Refuses metadata whose segments do not fit its mode.
    pub fn of(h: &Luks2Header) -> Result<Option<ReencryptState>> {
        if !h.reencryption_in_progress() {
            return Ok(None);
        }
        h.check_requirements_except_reencryption()?;
        let keyslot = h.reencrypt_keyslot()?.ok_or_else(|| {
            VolumeError::device("LUKS2 reencryption requirement without a reencrypt keyslot")
        })?;
        let all = h.segments();
        let flagged = |f: &str| all.iter().find(|s| s.has_flag(f)).cloned();
        let previous = flagged("backup-previous")
            .ok_or_else(|| VolumeError::device("reencryption without a backup-previous segment"))?;
        let fin = flagged("backup-final")
            .ok_or_else(|| VolumeError::device("reencryption without a backup-final segment"))?;
        for s in [&previous, &fin] {
            if !(s.kind == "linear" || s.kind == "crypt" && s.encryption.is_some()) {
                return Err(unsupported(format!(
                    "LUKS2 reencryption of a '{}' segment cannot be read by cryptblk",
                    s.kind
                )));
            }
        }
        if previous.kind == "linear" && fin.kind == "linear" {
            return Err(VolumeError::device(
                "LUKS2 reencryption metadata is invalid: both backup segments are linear",
            ));
        }
        let expect_mode = match (previous.kind.as_str(), fin.kind.as_str()) {
            ("linear", _) => ReencryptMode::Encrypt,
            (_, "linear") => ReencryptMode::Decrypt,
            _ => ReencryptMode::Reencrypt,
        };
        if keyslot.mode != expect_mode {
            return Err(VolumeError::device(format!(
                "LUKS2 reencryption metadata is invalid: mode {:?} with {} to {} segments",
                keyslot.mode, previous.kind, fin.kind
            )));
        }
        let digest_of = |s: &SegmentInfo, what: &str| -> Result<String> {
            if s.kind == "linear" {
                Ok(String::new())
            } else {
                one_digest(h, s, what)
            }
        };
        let old_digest = digest_of(&previous, "backup-previous")?;
        let new_digest = digest_of(&fin, "backup-final")?;
        let moved = flagged("backup-moved-segment");
        if let Some(m) = &moved {
            if m.size.is_none() || !m.offset.is_multiple_of(512) {
                return Err(VolumeError::device(
                    "LUKS2 reencryption metadata is invalid: moved segment without a size",
                ));
            }
        }
        let mut segments = Vec::new();
        for s in all.iter().filter(|s| !s.is_backup()) {
            let d = h.digests_of_segment(s.id);
            let has = |x: &String| d.contains(x);
            let side = if s.has_flag("in-reencryption") {
                Side::Hotzone
            } else if s.kind == "linear" && d.is_empty() {
                // Plaintext has no key: it is on the side whose backup is linear.
                if previous.kind == "linear" {
                    Side::Old
                } else {
                    Side::New
                }
            } else if has(&new_digest) && !has(&old_digest) {
                Side::New
            } else if has(&old_digest) && !has(&new_digest) {
                Side::Old
            } else {
                return Err(VolumeError::device(format!(
                    "LUKS2 reencryption metadata is invalid: segment {} has no single key",
                    s.id
                )));
            };
            if segments
                .last()
                .is_some_and(|p: &StateSegment| p.size.is_none())
            {
                return Err(VolumeError::device(
                    "LUKS2 reencryption metadata is invalid: a dynamic segment is not last",
                ));
            }
            let logical = segments
                .last()
                .map_or(0, |p: &StateSegment| p.logical + p.size.unwrap_or(0));
            segments.push(StateSegment {
                offset: s.offset,
                size: s.size,
                side,
                logical,
            });
        }
        if segments.iter().filter(|s| s.side == Side::Hotzone).count() > 1 {
            return Err(VolumeError::device(
                "LUKS2 reencryption metadata is invalid: more than one hotzone",
            ));
        }
        Ok(Some(ReencryptState {
            keyslot,
            previous,
            fin,
            old_digest,
            new_digest,
            moved,
            segments,
        }))
    }

    /// Bytes of the volume's data on a device of `dev_size` bytes: the original data's
    /// size (`backup-previous`), cut to what fits after the new segment's offset (a
    /// re-key with `--reduce-device-size` moves the data up by the shift and drops its
    /// last shift bytes, as cryptsetup does; writing them would go past the device's
    /// end), whole encryption sectors.
    pub fn logical_size(&self, dev_size: u64) -> u64 {
        let old = self
            .previous
            .size
            .unwrap_or_else(|| dev_size.saturating_sub(self.previous.offset));
        let new = self
            .fin
            .size
            .unwrap_or_else(|| dev_size.saturating_sub(self.fin.offset));
        let n = old.min(new);
        let ss = u64::from(self.sector_size());
        n - n % ss
    }

    /// The larger encryption sector size of both sides (512 for plaintext).
    pub fn sector_size(&self) -> u32 {
        self.previous.sector_size.max(self.fin.sector_size).max(512)
    }

    /// Where the old data of logical byte `l` lies on the data device (the moved segment
    /// holds the first `shift` bytes of a datashift reencryption).
    pub fn old_phys(&self, l: u64) -> u64 {
        match &self.moved {
            Some(m) if l < m.size.unwrap_or(0) => m.offset + l,
            _ => self.previous.offset + l,
        }
    }

    /// Where the new data of logical byte `l` goes.
    pub fn new_phys(&self, l: u64) -> u64 {
        self.fin.offset + l
    }

    /// True when the old data of `[l, l + len)` lies where its new data goes (the
    /// resilience data must protect it); false when the data moves (datashift).
    pub fn in_place(&self, l: u64, len: u64) -> bool {
        let (o, n) = (self.old_phys(l), self.new_phys(l));
        o < n + len && n < o + len
    }

    /// True when the data on the old side is plaintext (encryption).
    pub fn old_is_plain(&self) -> bool {
        self.previous.kind == "linear"
    }

    /// True when the data on the new side is plaintext (decryption).
    pub fn new_is_plain(&self) -> bool {
        self.fin.kind == "linear"
    }

    /// The hotzone segment, if the header names one (a reencryption step was cut).
    pub fn hotzone(&self) -> Option<&StateSegment> {
        self.segments.iter().find(|s| s.side == Side::Hotzone)
    }
}
