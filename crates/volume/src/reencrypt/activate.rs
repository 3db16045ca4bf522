//! Activating a LUKS2 volume mid-reencryption, as cryptsetup's activation does: both keys
//! from one passphrase (or a token), the hotzone of a cut step recovered from its
//! resilience data first (its data rewritten under the new key, the header of the finished
//! step written), then the plan of a table of both segments.

use super::operate::open_rw;
use super::request::{load, ReencryptInput, ReencryptRequest};
use super::start::resume_keys;
use super::ReencryptState;
use crate::activation::Activation;
use crate::error::{Result, VolumeError};
use crate::lock::DataLock;
use crate::luks::{LuksType, Volume};
use crate::plan::{ActivationPlan, LuksLocation};
use std::path::Path;

/// Where and how a volume mid-reencryption is opened.
pub struct MidReencryption<'a> {
    /// The data device.
    pub device: &'a Path,
    /// `--header`: the detached header, when the header is not on `device`.
    pub header: Option<&'a Path>,
    /// `--type`, as [`ReencryptRequest::luks_type`].
    pub luks_type: Option<LuksType>,
    /// `--key-slot`.
    pub key_slot: Option<usize>,
    /// `--readonly`: a hotzone to recover is then refused (it would need a write).
    pub readonly: bool,
    /// The mapping's name.
    pub name: &'a str,
    /// The activation flags of its crypt lines.
    pub flags: &'a Activation,
}

/// The activation plan of the LUKS2 volume `vol` (loaded from `at.header` or `at.device`)
/// mid-reencryption: a table of both segments, each with its key; the hotzone of a cut
/// step is recovered first (under the data lock). When that was the last step the volume
/// is opened as any other (a finished decryption leaves no LUKS2 volume to open: the error
/// says so).
pub fn mid_reencryption_plan(
    vol: Volume,
    at: &MidReencryption<'_>,
    input: &mut dyn ReencryptInput,
) -> Result<ActivationPlan> {
    let Volume::Luks2(h, file) = vol else {
        return Err(VolumeError::usage("reencryption needs a LUKS2 header"));
    };
    let header_path = at.header.unwrap_or(at.device);
    let mut state = ReencryptState::of(&h)?.ok_or_else(|| {
        VolumeError::device("LUKS2 reencryption requirement without reencryption metadata")
    })?;
    let req = ReencryptRequest {
        key_slot: at.key_slot,
        ..ReencryptRequest::default()
    };
    let keys = resume_keys(&req, input, &h, &file, at.device)?;
    drop(file);
    if state.hotzone().is_some() {
        if at.readonly {
            return Err(VolumeError::usage(
                "Device requires reencryption recovery. Run repair first.",
            ));
        }
        // Nobody else may write the data while the hotzone is rewritten.
        let lock = DataLock::take(at.device, true)?;
        let Volume::Luks2(mut h, file) = Volume::load(header_path, LuksType::Luks2, true)? else {
            return Err(VolumeError::usage("reencryption needs a LUKS2 header"));
        };
        let data = match at.header {
            Some(_) => Some(open_rw(at.device)?),
            None => None,
        };
        super::run::recover_split(&mut h, &file, data.as_ref().unwrap_or(&file), &state, &keys)?;
        match ReencryptState::of(&h)? {
            Some(s) => state = s,
            None => {
                // That was the last hotzone: the reencryption is done; open the volume as
                // any other.
                drop((lock, file, data));
                let vol = load(header_path, at.luks_type, false)?;
                let vk = keys
                    .new
                    .clone()
                    .ok_or_else(|| VolumeError::device("no new volume key"))?;
                let header = std::fs::canonicalize(header_path)?;
                let loc = LuksLocation {
                    device: at.device,
                    header: &header,
                };
                return crate::plan::luks(&vol, &vk, loc, at.name, at.flags);
            }
        }
    }
    let crypt_flags = cryptblk_dm::CryptFlags::parse(&at.flags.crypt.table_flags())
        .map_err(VolumeError::usage)?;
    let loc = LuksLocation {
        device: at.device,
        header: header_path,
    };
    super::online::mid_reencryption_plan(&h, &state, &keys, loc, at.name, &crypt_flags)
}
