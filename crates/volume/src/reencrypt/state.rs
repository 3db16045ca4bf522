//! The reencryption a LUKS2 header describes.

use crate::error::{Result, VolumeError};
use cryptblk_format::luks2::{
    Luks2Header, ReencryptKeyslot, ReencryptMode, Resilience, SegmentInfo,
};

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
}

/// A reencryption in progress (re-key mode, no data shift).
#[derive(Clone, Debug)]
pub struct ReencryptState {
    /// The `reencrypt` keyslot.
    pub keyslot: ReencryptKeyslot,
    /// The whole old segment (`backup-previous`): cipher and IV base of old data.
    pub previous: SegmentInfo,
    /// The whole new segment (`backup-final`).
    pub fin: SegmentInfo,
    /// Digest of the old key.
    pub old_digest: String,
    /// Digest of the new key.
    pub new_digest: String,
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
    /// Refuses what cryptblk cannot read yet (data shifts, encryption, decryption).
    pub fn of(h: &Luks2Header) -> Result<Option<ReencryptState>> {
        if !h.reencryption_in_progress() {
            return Ok(None);
        }
        h.check_requirements_except_reencryption()?;
        let keyslot = h.reencrypt_keyslot()?.ok_or_else(|| {
            VolumeError::device("LUKS2 reencryption requirement without a reencrypt keyslot")
        })?;
        if keyslot.mode != ReencryptMode::Reencrypt {
            return Err(unsupported(format!(
                "LUKS2 {:?} in progress: only re-key reencryption can be read by cryptblk yet",
                keyslot.mode
            )));
        }
        if !matches!(
            keyslot.resilience,
            Resilience::None | Resilience::Checksum { .. } | Resilience::Journal
        ) {
            return Err(unsupported(
                "LUKS2 reencryption with a data shift cannot be read by cryptblk yet",
            ));
        }
        let all = h.segments();
        let flagged = |f: &str| all.iter().find(|s| s.has_flag(f)).cloned();
        let previous = flagged("backup-previous")
            .ok_or_else(|| VolumeError::device("reencryption without a backup-previous segment"))?;
        let fin = flagged("backup-final")
            .ok_or_else(|| VolumeError::device("reencryption without a backup-final segment"))?;
        for s in [&previous, &fin] {
            if s.kind != "crypt" || s.encryption.is_none() {
                return Err(unsupported(
                    "LUKS2 reencryption from or to a plain (linear) segment cannot be read yet",
                ));
            }
        }
        let old_digest = one_digest(h, &previous, "backup-previous")?;
        let new_digest = one_digest(h, &fin, "backup-final")?;
        let mut segments = Vec::new();
        for s in all.iter().filter(|s| !s.is_backup()) {
            let d = h.digests_of_segment(s.id);
            let has = |x: &String| d.contains(x);
            let side = if s.has_flag("in-reencryption") {
                Side::Hotzone
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
            segments.push(StateSegment {
                offset: s.offset,
                size: s.size,
                side,
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
            segments,
        }))
    }

    /// The hotzone segment, if the header names one (a reencryption step was cut).
    pub fn hotzone(&self) -> Option<&StateSegment> {
        self.segments.iter().find(|s| s.side == Side::Hotzone)
    }
}
