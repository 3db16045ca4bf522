//! Online LUKS2 reencryption (`reencrypt` of a volume a cryptblk daemon serves) and `open`
//! of a volume mid-reencryption; offline runs are [`super::reencrypt`]'s. The work is
//! [`cryptblk_volume::reencrypt`]'s (the online steps run in the daemon: see
//! [`cryptblk_volume::reencrypt::online`]).

use super::reencrypt::{
    init_params, max_hotzone, passphrases, reencrypt, resume_keys, start_decrypt, summary,
};
use super::volume;
use crate::args::{OpenArgs, Opts, ReencryptArgs};
use crate::exit::{ActionResult, ExitCode, Failure};
use crate::progress::Bar;
use cryptblk_cipher::SecretBytes;
use cryptblk_volume::control::{self, Request, Status};
use cryptblk_volume::reencrypt::{self, online, ReencryptKeys, ReencryptState, RunState};
use cryptblk_volume::{LuksType, Progress, Volume};
use std::path::{Path, PathBuf};

/// True when `a` and `b` name the same file (whatever the path).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// The served volume `reencrypt` is about: `--active-name`, a positional argument that is
/// the name of a served volume rather than a file, or the daemon serving `device`'s header.
fn served_volume(device: Option<&Path>, active: Option<&str>) -> Result<Option<Status>, Failure> {
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
    if cryptblk_volume::lock::DataLock::take(device, false).is_ok() {
        return Ok(None);
    }
    for name in control::list().unwrap_or_default() {
        let Ok(st) = control::status(&name) else {
            continue;
        };
        let serves = ["header", "device"]
            .iter()
            .filter_map(|k| st.info[*k].as_str())
            .any(|p| same_file(Path::new(p), device));
        if serves && st.info["type"].is_string() {
            return Ok(Some(st));
        }
    }
    Ok(None)
}

/// `reencrypt [DEVICE]`: a re-key of a LUKS2 volume, online through its daemon when a
/// cryptblk daemon serves it (unless `--force-offline-reencrypt`), else [`reencrypt`].
pub fn reencrypt_action(opts: &Opts, device: Option<&Path>, a: &ReencryptArgs) -> ActionResult {
    if !a.force_offline_reencrypt {
        if let Some(st) = served_volume(device, a.active_name.as_deref())? {
            return online_reencrypt(opts, st, a);
        }
    }
    let device = match (device, &a.active_name) {
        (Some(d), _) => d,
        (None, Some(_)) => {
            return Err(Failure::usage(
                "Options --active-name and --force-offline-reencrypt cannot be combined.",
            ))
        }
        (None, None) => return Err(Failure::usage("reencrypt needs a device")),
    };
    reencrypt(opts, device, a)
}

/// The JSON line `--json` prints for an online run that ended.
fn online_summary(name: &str, device: &str, p: &reencrypt::ReencryptProgress, first: u64) {
    let v = serde_json::json!({
        "device": device,
        "name": name,
        "online": true,
        "status": "finished",
        "data_size": p.total,
        "bytes": p.total.saturating_sub(first),
        "steps": p.steps,
        "hotzone_size": p.hotzone,
    });
    println!("{v}");
}

/// Online re-key of the served volume `st`: the header work (new keyslots and the
/// reencryption metadata, or unlocking both keys to resume) happens here, under the header
/// lock; then the daemon is handed both keys and runs the steps while it serves, and this
/// waits for the end, drawing the progress its `status` reports.
fn online_reencrypt(opts: &Opts, st: Status, a: &ReencryptArgs) -> ActionResult {
    if a.init_only && a.resume_only {
        return Err(Failure::usage(
            "Options --init-only and --resume-only cannot be combined.",
        ));
    }
    let name = st.name.clone();
    match st.info["type"].as_str() {
        Some("LUKS2") => {}
        Some("LUKS1") => {
            return Err(Failure::usage(
                "LUKS1 reencryption is not supported by cryptblk yet.",
            ))
        }
        _ => {
            return Err(Failure::new(
                ExitCode::WrongDevice,
                format!("{name} is not active LUKS2 device name."),
            ))
        }
    }
    let served_header = cryptblk_volume::suspend::header_of(&st)?;
    let data = st.info["device"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| Failure::usage(format!("{name} has no data device")))?;
    // `--header H` names the detached header the daemon serves the volume with.
    let header = match &opts.header {
        Some(h) if a.decrypt && !h.exists() => {
            return online_decrypt_export(opts, &st, a, h, &served_header, &data)
        }
        Some(h) if !same_file(h, &served_header) => {
            return Err(Failure::usage(format!(
                "{} is not the header of active device {name} ({}).",
                h.display(),
                served_header.display()
            )))
        }
        _ => served_header,
    };
    let detached = !same_file(&data, &header);
    if a.decrypt && !detached {
        return Err(Failure::usage("LUKS2 decryption requires --header option."));
    }
    if st.readonly {
        return Err(Failure::usage(format!(
            "Device {name} is active read-only; it cannot be reencrypted online."
        )));
    }
    if st.suspended {
        return Err(Failure::new(
            ExitCode::Busy,
            format!("Volume {name} is suspended; resume it first."),
        ));
    }
    let max_hotzone = max_hotzone(a)?;
    let Volume::Luks2(mut h, file) = Volume::load(&header, LuksType::Luks2, true)? else {
        return Err(Failure::usage("reencryption needs a LUKS2 header"));
    };
    // Serialises with other header writers; released before the daemon takes it.
    cryptblk_volume::lock::lock_header(&file, true)
        .map_err(|e| Failure::device(format!("cannot lock the header: {e}")))?;
    let device_block = std::fs::File::open(&data)
        .map(|f| reencrypt::init::device_block_size(&f))
        .unwrap_or(4096);
    let keys = if h.reencryption_in_progress() {
        if a.init_only {
            return Err(Failure::usage(
                "LUKS2 reencryption already initialized. Aborting operation.",
            ));
        }
        resume_keys(opts, &h, &file, &header)?
    } else if a.resume_only {
        return Err(Failure::usage("Device reencryption not in progress."));
    } else if a.encrypt {
        return Err(Failure::usage(format!(
            "Device {} is already a LUKS device.",
            header.display()
        )));
    } else if a.decrypt {
        // Backward over the data device, the detached header keeping the old key.
        let dev_size = cryptblk_volume::device::device_size(&data)?;
        match start_decrypt(opts, a, &mut h, &file, dev_size, device_block, &header)? {
            Some(keys) => keys,
            None => return Ok(()),
        }
    } else {
        let mut params = init_params(opts, a, device_block)?;
        let (pass, one) = passphrases(opts, &h, &file, &header)?;
        params.one_keyslot |= one;
        let init = reencrypt::init(&mut h, &file, &pass, &params)?;
        if opts.verbose {
            for (_, n) in &init.keyslots {
                eprintln!("Key slot {n} created.");
            }
        }
        if a.init_only {
            if opts.json {
                summary(
                    &header,
                    "initialized",
                    &reencrypt::RunOutcome::default(),
                    Some(&init),
                );
            }
            return Ok(());
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
    wait_online(opts, &name, &header)
}

/// `reencrypt --decrypt --header NEW_FILE` of the served volume `st` whose header is on
/// its data device `data`: the passphrase opens the volume key here; the daemon exports
/// the header to `export`, moves the first data-offset bytes of ciphertext to the device
/// start with I/O held and decrypts in the background, serving from `export` from then
/// on (see [`online::start_decrypt_export`]). This waits for the end.
fn online_decrypt_export(
    opts: &Opts,
    st: &Status,
    a: &ReencryptArgs,
    export: &Path,
    served_header: &Path,
    data: &Path,
) -> ActionResult {
    let name = &st.name;
    if !same_file(served_header, data) {
        return Err(Failure::usage(format!(
            "{name} is served with the detached header {}; --header names it, not a new file.",
            served_header.display()
        )));
    }
    if a.init_only || a.resume_only {
        return Err(Failure::usage(
            "--init-only and --resume-only with --header NEW_FILE of an active volume are \
             not supported by cryptblk; decryption starts and runs online in one command.",
        ));
    }
    if st.readonly {
        return Err(Failure::usage(format!(
            "Device {name} is active read-only; it cannot be reencrypted online."
        )));
    }
    if st.suspended {
        return Err(Failure::new(
            ExitCode::Busy,
            format!("Volume {name} is suspended; resume it first."),
        ));
    }
    let max_hotzone = max_hotzone(a)?;
    let Volume::Luks2(h, file) = Volume::load(data, LuksType::Luks2, false)? else {
        return Err(Failure::usage(
            "LUKS1 decryption is not supported by cryptblk yet.",
        ));
    };
    if h.reencryption_in_progress() {
        return Err(Failure::usage(
            "LUKS2 reencryption already initialized. Aborting operation.",
        ));
    }
    reencrypt::encdec::check_decrypt_export(&h)?;
    super::volume::confirm(
        opts,
        &format!(
            "Header file {} does not exist. Do you want to initialize LUKS2 decryption of \
             device {} and export LUKS2 header to file {}?",
            export.display(),
            data.display(),
            export.display()
        ),
    )?;
    let pass = super::volume::read_secret(
        &super::volume::key_source(opts, None),
        super::volume::limits(opts),
        &format!("Enter passphrase for {}: ", data.display()),
    )?;
    let key = reencrypt::encdec::unlock_old(
        &h,
        &file,
        pass.as_bytes(),
        opts.key_slot.map(|s| s as usize),
    )?;
    drop((pass, file));
    let device_block = std::fs::File::open(data)
        .map(|f| reencrypt::init::device_block_size(&f))
        .unwrap_or(4096);
    {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(export)
            .map_err(|e| {
                Failure::device(format!(
                    "Cannot create header file {}: {e}",
                    export.display()
                ))
            })?;
    }
    let abs = std::fs::canonicalize(export)?;
    let resilience = match a.resilience {
        None | Some(crate::args::ResilienceArg::Checksum) => "checksum",
        Some(crate::args::ResilienceArg::Journal) => "journal",
        Some(crate::args::ResilienceArg::None) => "none",
    };
    let sent = control::request(
        name,
        &Request::DecryptExport {
            key: key.to_hex().as_str().to_owned(),
            export: abs.display().to_string(),
            resilience: resilience.into(),
            resilience_hash: a.resilience_hash.clone().unwrap_or_else(|| "sha256".into()),
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
    wait_online(opts, name, &abs)
}

/// Follows the daemon's run of `name` to its end, drawing its progress.
fn wait_online(opts: &Opts, name: &str, header: &Path) -> ActionResult {
    let mut bar = Bar::new(true);
    let mut first = None;
    let interrupted = || {
        Failure::usage(format!(
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
            bar.start(Some(p.total), "reencrypting");
            p.done
        });
        bar.update(p.done);
        match p.state {
            RunState::Running => {}
            RunState::Finished => {
                if opts.json {
                    online_summary(name, &header.display().to_string(), &p, start);
                }
                break Ok(());
            }
            RunState::Failed => {
                break Err(Failure::device(
                    p.error.unwrap_or_else(|| "the reencryption failed".into()),
                ))
            }
            RunState::Stopped | RunState::Paused => break Err(interrupted()),
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    bar.finish();
    result
}

/// `open` of a LUKS2 volume mid-reencryption (cryptsetup's activation): both keys from one
/// passphrase, the hotzone of a cut step recovered from its resilience data first (its data
/// rewritten under the new key, the header of the finished step written), then a table of
/// both segments served: the new side's data and the old side's, each with its key. The
/// header is on the device or detached (`--header`).
pub fn open_mid_reencryption(opts: &Opts, a: &OpenArgs, vol: Volume) -> ActionResult {
    let name = super::luks::mapping_name(a)?;
    let flags = super::luks::persistent::effective(opts, &a.perf, &vol.stored_flags());
    let Volume::Luks2(h, file) = vol else {
        return Err(Failure::usage("reencryption needs a LUKS2 header"));
    };
    let header_path = opts.header.clone().unwrap_or_else(|| a.device.clone());
    let mut state = ReencryptState::of(&h)?.ok_or_else(|| {
        Failure::device("LUKS2 reencryption requirement without reencryption metadata")
    })?;
    let keys = resume_keys(opts, &h, &file, &a.device)?;
    drop(file);
    if state.hotzone().is_some() {
        if opts.readonly {
            return Err(Failure::usage(
                "Device requires reencryption recovery. Run repair first.",
            ));
        }
        // Nobody else may write the data while the hotzone is rewritten.
        let _lock = cryptblk_volume::lock::DataLock::take(&a.device, true)?;
        let Volume::Luks2(mut h, file) = Volume::load(&header_path, LuksType::Luks2, true)? else {
            return Err(Failure::usage("reencryption needs a LUKS2 header"));
        };
        let data = match &opts.header {
            Some(_) => Some(
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&a.device)
                    .map_err(|e| {
                        Failure::device(format!("Cannot open device {}: {e}", a.device.display()))
                    })?,
            ),
            None => None,
        };
        reencrypt::run::recover_split(
            &mut h,
            &file,
            data.as_ref().unwrap_or(&file),
            &state,
            &keys,
        )?;
        match ReencryptState::of(&h)? {
            Some(s) => state = s,
            None => {
                // That was the last hotzone: the reencryption is done; open the volume as
                // any other (a finished decryption has no LUKS2 volume left to open).
                drop((_lock, file, data));
                let vol = volume::load(opts, &a.device, false)?;
                let vk = keys
                    .new
                    .clone()
                    .ok_or_else(|| Failure::device("no new volume key"))?;
                let header = std::fs::canonicalize(&header_path)?;
                let at = cryptblk_volume::plan::LuksLocation {
                    device: &a.device,
                    header: &header,
                };
                let plan = cryptblk_volume::plan::luks(&vol, &vk, at, name, &flags.library())?;
                return super::luks::serve_plan(plan, opts, a);
            }
        }
    }
    let crypt_flags = cryptblk_dm::CryptFlags::parse(&flags.library().crypt.table_flags())
        .map_err(Failure::usage)?;
    let at = cryptblk_volume::plan::LuksLocation {
        device: &a.device,
        header: &header_path,
    };
    let plan = online::mid_reencryption_plan(&h, &state, &keys, at, name, &crypt_flags)?;
    super::luks::serve_plan(plan, opts, a)
}
