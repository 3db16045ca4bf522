//! `open <device> [<name>]`: the one place that dispatches on the volume type. Each type's
//! module unlocks and plans its volume and serves it through [`super::activate`]; none of
//! them imports this one or another type's.

use super::luks::persistent;
use super::{bitlk, fvault2, loopaes, luks, reencrypt_online, tcrypt, volume};
use crate::args::{OpenArgs, Opts, PerfArgs, VolumeType};
use crate::exit::ActionResult;
use std::path::{Path, PathBuf};

/// `open <device> [<name>]`.
pub fn open(opts: &Opts, a: &OpenArgs) -> ActionResult {
    if let Some(lower) = stacked_device(&a.device) {
        let a = OpenArgs {
            device: lower,
            ..a.clone()
        };
        return open_device(opts, &a);
    }
    open_device(opts, a)
}

/// cryptsetup stacks one mapping on another by naming `/dev/mapper/NAME` as the device.
/// cryptblk's mappings have no node there, so when that path does not exist and NAME is an
/// active cryptblk volume, it stands for what the volume is served as: its ublk device, NBD
/// URI or FUSE file. The lower volume then counts the upper one as a user, and `close`
/// refuses it while the upper one is open, as the kernel refuses to remove a held dm device.
fn stacked_device(device: &Path) -> Option<PathBuf> {
    use cryptblk_volume::control::{self, ExportDescription};
    if device.exists() {
        return None;
    }
    let name = device.to_str()?.strip_prefix("/dev/mapper/")?;
    control::check_name(name).ok()?;
    match control::status(name).ok()?.export {
        ExportDescription::Ublk(u) => Some(u.dev),
        ExportDescription::Nbd(n) => Some(PathBuf::from(n.uri)),
        ExportDescription::Fuse(f) => Some(f.file),
        _ => None,
    }
}

fn open_device(opts: &Opts, a: &OpenArgs) -> ActionResult {
    match opts.volume_type {
        Some(VolumeType::Tcrypt) => return tcrypt::open(opts, a),
        Some(VolumeType::Bitlk) => return bitlk::open(opts, a),
        Some(VolumeType::Fvault2) => return fvault2::open(opts, a),
        Some(VolumeType::Loopaes) => return loopaes::open(opts, a),
        Some(VolumeType::Plain) => {
            // cryptsetup ignores --persistent for plain devices (nothing to store it in),
            // but still refuses it with --test-passphrase.
            persistent::check_options(opts, &PerfArgs::default())?;
            return luks::open_plain(opts, a);
        }
        _ => {}
    }
    persistent::check_options(opts, &a.perf)?;
    let vol = volume::load(opts, &a.device, false)?;
    if !opts.test_passphrase && vol.luks2().is_some_and(|h| h.reencryption_in_progress()) {
        // As cryptsetup's activation: recover the hotzone, map both segments.
        return reencrypt_online::open_mid_reencryption(opts, a, vol);
    }
    luks::open_luks(opts, a, vol)
}
