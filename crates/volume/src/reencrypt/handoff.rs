//! Online reencryption seen from the client: finding the daemon that serves a volume
//! ([`served_volume`]), the header work done here under the header lock (new keyslots and
//! the reencryption metadata, or both keys unlocked to resume), the hand-off of both keys
//! to the daemon (`Request::Reencrypt`), and following its run ([`wait_online`]). The
//! daemon's side is [`super::online`].

use super::request::{OnlineFinish, ReencryptInput, ReencryptOutcome, ReencryptRequest};
use super::start::{confirm_export, create_export_file, resume_keys, start_decrypt, start_rekey};
use super::{ReencryptKeys, RunState};
use crate::control::{self, Request, Status};
use crate::error::{ErrorClass, Result, VolumeError};
use crate::luks::{LuksType, Volume};
use crate::progress::Progress;
use cryptblk_cipher::SecretBytes;
use std::path::{Path, PathBuf};

/// True when `a` and `b` name the same file (whatever the path).
pub(crate) fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// The served volume `reencrypt` is about: `--active-name`, a positional argument that is
/// the name of a served volume rather than a file, or the daemon serving `device`'s header.
pub fn served_volume(device: Option<&Path>, active: Option<&str>) -> Result<Option<Status>> {
    if let Some(name) = active {
        return Ok(Some(control::status(name)?));
    }
    let Some(device) = device else {
        return Ok(None);
    };
    if !device.exists() {
        if let Some(name) = device.to_str() {
            if control::check_name(name).is_ok() {
                if let Ok(st) = control::status(name) {
                    return Ok(Some(st));
                }
            }
        }
        return Ok(None);
    }
    // A daemon serving `device` holds its data lock: when a shared lock can be taken, no
    // daemon needs asking (one that does not answer, e.g. with a suspended volume, would
    // otherwise hold up an offline run on an unrelated file for its whole timeout).
    if crate::lock::DataLock::take(device, false).is_ok() {
        return Ok(None);
    }
    for name in control::list().unwrap_or_default() {
        let Ok(st) = control::status(&name) else {
            continue;
        };
        let serves = st.info.files().any(|p| same_file(Path::new(p), device));
        if serves && !st.info.kind.is_empty() {
            return Ok(Some(st));
        }
    }
    Ok(None)
}

/// Refuses a served volume that cannot be reencrypted online now: active read-only (exit 1)
/// or suspended (exit 5).
fn writable_and_running(st: &Status) -> Result<()> {
    let name = &st.name;
    if st.readonly {
        return Err(VolumeError::usage(format!(
            "Device {name} is active read-only; it cannot be reencrypted online."
        )));
    }
    if st.suspended {
        return Err(VolumeError::new(
            ErrorClass::Busy,
            format!("Volume {name} is suspended; resume it first."),
        ));
    }
    Ok(())
}

/// Online reencryption of the served volume `st`: the header work (new keyslots and the
/// reencryption metadata, or unlocking both keys to resume) happens here, under the header
/// lock; then the daemon is handed both keys and runs the steps while it serves.
pub(crate) fn online(
    req: &ReencryptRequest,
    st: Status,
    input: &mut dyn ReencryptInput,
) -> Result<ReencryptOutcome> {
    if req.init_only && req.resume_only {
        return Err(VolumeError::usage(
            "Options --init-only and --resume-only cannot be combined.",
        ));
    }
    let name = st.name.clone();
    match st.info.kind.as_str() {
        "LUKS2" => {}
        "LUKS1" => {
            return Err(VolumeError::usage(
                "LUKS1 reencryption is not supported by cryptblk yet.",
            ))
        }
        _ => {
            return Err(VolumeError::new(
                ErrorClass::WrongDevice,
                format!("{name} is not active LUKS2 device name."),
            ))
        }
    }
    let served_header = crate::suspend::header_of(&st)?;
    let data = st
        .info
        .device
        .as_deref()
        .map(PathBuf::from)
        .ok_or_else(|| VolumeError::usage(format!("{name} has no data device")))?;
    // `--header H` names the detached header the daemon serves the volume with.
    let header = match &req.header {
        Some(h) if req.decrypt && !h.exists() => {
            return online_decrypt_export(req, &st, input, h, &served_header, &data)
        }
        Some(h) if !same_file(h, &served_header) => {
            return Err(VolumeError::usage(format!(
                "{} is not the header of active device {name} ({}).",
                h.display(),
                served_header.display()
            )))
        }
        _ => served_header,
    };
    let detached = !same_file(&data, &header);
    if req.decrypt && !detached {
        return Err(VolumeError::usage(
            "LUKS2 decryption requires --header option.",
        ));
    }
    writable_and_running(&st)?;
    let max_hotzone = req.max_hotzone()?;
    let Volume::Luks2(mut h, file) = Volume::load(&header, LuksType::Luks2, true)? else {
        return Err(VolumeError::usage("reencryption needs a LUKS2 header"));
    };
    // Serialises with other header writers; released before the daemon takes it.
    crate::lock::lock_header(&file, true)
        .map_err(|e| VolumeError::device(format!("cannot lock the header: {e}")))?;
    let device_block = std::fs::File::open(&data)
        .map(|f| super::init::device_block_size(&f))
        .unwrap_or(4096);
    let initialized = |init| {
        Ok(ReencryptOutcome::Initialized {
            device: header.clone(),
            init,
        })
    };
    let keys = if h.reencryption_in_progress() {
        if req.init_only {
            return Err(VolumeError::usage(
                "LUKS2 reencryption already initialized. Aborting operation.",
            ));
        }
        resume_keys(req, input, &h, &file, &header)?
    } else if req.resume_only {
        return Err(VolumeError::usage("Device reencryption not in progress."));
    } else if req.encrypt {
        return Err(VolumeError::usage(format!(
            "Device {} is already a LUKS device.",
            header.display()
        )));
    } else if req.decrypt {
        // Backward over the data device, the detached header keeping the old key.
        let dev_size = crate::device::device_size(&data)?;
        match start_decrypt(req, input, &mut h, &file, dev_size, device_block, &header)? {
            Some(keys) => keys,
            None => return initialized(None),
        }
    } else {
        if req.reduce_device_size.is_some() {
            // The daemon would have to shrink the device it serves as the data moves.
            return Err(VolumeError::usage(
                "Online reencryption with --reduce-device-size is not supported by cryptblk; \
                 close the device or use --force-offline-reencrypt.",
            ));
        }
        let init = start_rekey(req, input, &mut h, &file, &header, device_block)?;
        if req.init_only {
            return initialized(Some(init));
        }
        ReencryptKeys {
            old: Some(init.old_key.clone()),
            new: Some(init.new_key.clone()),
        }
    };
    drop(file);
    // unlock_keys made sure each key the data still needs is there; an old key no data
    // needs any more travels as "".
    let hex = |k: &Option<SecretBytes>| {
        k.as_ref()
            .map_or(String::new(), |k| k.to_hex().as_str().to_owned())
    };
    control::request(
        &name,
        &Request::Reencrypt {
            old_key: hex(&keys.old),
            new_key: hex(&keys.new),
            max_hotzone,
            device_block,
        },
    )?;
    drop(keys);
    Ok(ReencryptOutcome::HandedToDaemon { name, header })
}

/// `reencrypt --decrypt --header NEW_FILE` of the served volume `st` whose header is on
/// its data device `data`: the passphrase opens the volume key here; the daemon exports
/// the header to `export`, moves the first data-offset bytes of ciphertext to the device
/// start with I/O held and decrypts in the background, serving from `export` from then on
/// (see [`super::online::start_decrypt_export`]).
fn online_decrypt_export(
    req: &ReencryptRequest,
    st: &Status,
    input: &mut dyn ReencryptInput,
    export: &Path,
    served_header: &Path,
    data: &Path,
) -> Result<ReencryptOutcome> {
    let name = &st.name;
    if !same_file(served_header, data) {
        return Err(VolumeError::usage(format!(
            "{name} is served with the detached header {}; --header names it, not a new file.",
            served_header.display()
        )));
    }
    if req.init_only || req.resume_only {
        return Err(VolumeError::usage(
            "--init-only and --resume-only with --header NEW_FILE of an active volume are \
             not supported by cryptblk; decryption starts and runs online in one command.",
        ));
    }
    writable_and_running(st)?;
    let max_hotzone = req.max_hotzone()?;
    let Volume::Luks2(h, file) = Volume::load(data, LuksType::Luks2, false)? else {
        return Err(VolumeError::usage(
            "LUKS1 decryption is not supported by cryptblk yet.",
        ));
    };
    if h.reencryption_in_progress() {
        return Err(VolumeError::usage(
            "LUKS2 reencryption already initialized. Aborting operation.",
        ));
    }
    super::encdec::check_decrypt_export(&h)?;
    let pass = confirm_export(input, data, export)?;
    let key = super::encdec::unlock_old(&h, &file, pass.as_bytes(), req.key_slot)?;
    drop((pass, file));
    let device_block = std::fs::File::open(data)
        .map(|f| super::init::device_block_size(&f))
        .unwrap_or(4096);
    drop(create_export_file(export)?);
    let abs = std::fs::canonicalize(export)?;
    let sent = control::request(
        name,
        &Request::DecryptExport {
            key: key.to_hex().as_str().to_owned(),
            export: abs.display().to_string(),
            resilience: req.resilience.name().into(),
            resilience_hash: req
                .resilience_hash
                .clone()
                .unwrap_or_else(|| "sha256".into()),
            max_hotzone,
            device_block,
        },
    );
    drop(key);
    if let Err(e) = sent {
        // The daemon restored the header when it could; an empty file it never used
        // goes too.
        if std::fs::metadata(&abs).is_ok_and(|m| m.len() == 0) {
            let _ = std::fs::remove_file(&abs);
        }
        return Err(e);
    }
    Ok(ReencryptOutcome::HandedToDaemon {
        name: name.clone(),
        header: abs,
    })
}

/// Follows the daemon's run of the served volume `name` to its end, reporting its progress.
/// A daemon that closes (or dies), stops or pauses leaves a resumable state on disk: that is
/// an error saying so (exit 1); a failed run is the daemon's error (exit 4).
pub fn wait_online(name: &str, progress: &mut dyn Progress) -> Result<OnlineFinish> {
    let mut first = None;
    let interrupted = || {
        VolumeError::usage(format!(
            "Reencryption of {name} was interrupted; its state on disk is resumable \
             ('cryptblk reencrypt --resume-only', online or offline)."
        ))
    };
    let result = loop {
        let p = match control::status(name) {
            Ok(Status {
                reencryption: Some(p),
                ..
            }) => p,
            // The daemon closed (or died): the header holds a finished step.
            _ => break Err(interrupted()),
        };
        let start = *first.get_or_insert_with(|| {
            progress.start(Some(p.total), "reencrypting");
            p.done
        });
        progress.update(p.done);
        match p.state {
            RunState::Running => {}
            RunState::Finished => {
                break Ok(OnlineFinish {
                    progress: p,
                    first: start,
                })
            }
            RunState::Failed => {
                break Err(VolumeError::device(
                    p.error.unwrap_or_else(|| "the reencryption failed".into()),
                ))
            }
            RunState::Stopped | RunState::Paused => break Err(interrupted()),
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    progress.finish();
    result
}
