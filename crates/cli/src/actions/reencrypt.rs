//! `reencrypt DEVICE`: offline LUKS2 re-key, encryption and decryption in place with
//! cryptsetup's options and messages; the
//! work is [`cryptblk_volume::reencrypt`]'s.

use crate::args::{Opts, ReencryptArgs, ResilienceArg};
use crate::exit::{ActionResult, Failure};
use crate::progress::Bar;
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::keyfile::KeySource;
use cryptblk_format::luks2::{Luks2Header, UnlockPurpose};
use cryptblk_volume::reencrypt::{
    self, EncryptParams, InitParams, ReencryptKeys, ReencryptState, ResilienceChoice, RunOptions,
};
use cryptblk_volume::Volume;
use std::fs::{File, OpenOptions};
use std::path::Path;

use super::volume;

/// The passphrases of the keyslots to carry over: `--key-slot`'s one, the only active
/// keyslot's, or (on a terminal or standard input) one per active keyslot as cryptsetup
/// asks for them.
pub(super) fn passphrases(
    opts: &Opts,
    h: &cryptblk_format::luks2::Luks2Header,
    file: &File,
    device: &Path,
) -> Result<(Vec<(usize, SecretBytes)>, bool), Failure> {
    // Named tokens first (`--token-id`, `--token-type`, `--token-only`): the secret of the
    // one that opens its keyslot is that keyslot's passphrase, and that keyslot alone is
    // carried over, as with `--key-slot`.
    if super::token::choice(opts).explicit() {
        let mut open = |secret: &[u8], slot: usize| {
            h.unlock(file, secret, Some(slot), UnlockPurpose::Verify)?;
            Ok((slot, SecretBytes::from_slice(secret)))
        };
        if let Some(one) = super::token::try_tokens_with(opts, h, device, &mut open)? {
            return Ok((vec![one], true));
        }
    }
    let active: Vec<usize> = h
        .keyslots()
        .iter()
        .filter(|k| k.kind == "luks2" && !k.unbound)
        .map(|k| k.id)
        .collect();
    let source = volume::key_source(opts, None);
    let slots: Vec<usize> = match opts.key_slot {
        Some(s) => {
            let s = s as usize;
            if !active.contains(&s) {
                return Err(Failure::usage(format!("Keyslot {s} is not active.")));
            }
            vec![s]
        }
        None if matches!(source, KeySource::File(_)) && active.len() > 1 => {
            return Err(Failure::usage(
                "Key file can be used only with --key-slot or with exactly one key slot active.",
            ))
        }
        None => active,
    };
    let one = opts.key_slot.is_some();
    slots
        .into_iter()
        .map(|s| {
            let p = volume::read_secret(
                &source,
                volume::limits(opts),
                &format!("Enter passphrase for key slot {s}: "),
            )?;
            Ok((s, p))
        })
        .collect::<Result<Vec<_>, Failure>>()
        .map(|v| (v, one))
}

/// The JSON line `--json` prints for an offline run (or an online `--init-only`).
pub(super) fn summary(
    device: &Path,
    status: &str,
    out: &reencrypt::RunOutcome,
    init: Option<&reencrypt::InitOutcome>,
) {
    let mut v = serde_json::json!({
        "device": device.display().to_string(),
        "status": status,
        "data_size": out.data_size,
        "bytes": out.bytes,
        "steps": out.steps,
        "hotzone_size": out.hotzone,
    });
    if let Some(i) = init {
        v["keyslots"] = serde_json::json!(i
            .keyslots
            .iter()
            .map(|(o, n)| serde_json::json!({"old": o, "new": n}))
            .collect::<Vec<_>>());
        v["reencrypt_keyslot"] = serde_json::json!(i.reencrypt_keyslot);
    }
    println!("{v}");
}

fn resilience_choice(a: &ReencryptArgs) -> ResilienceChoice {
    match a.resilience {
        None | Some(ResilienceArg::Checksum) => ResilienceChoice::Checksum,
        Some(ResilienceArg::Journal) => ResilienceChoice::Journal,
        Some(ResilienceArg::None) => ResilienceChoice::None,
    }
}

fn resilience_hash(a: &ReencryptArgs) -> Result<HashAlgorithm, Failure> {
    match &a.resilience_hash {
        Some(name) => HashAlgorithm::from_name(name)
            .map_err(|_| Failure::usage(format!("Hash algorithm {name} is not available."))),
        None => Ok(HashAlgorithm::Sha256),
    }
}

/// The `--hotzone-size` limit as cryptsetup 2.6.1's command line reads it: 0 is refused,
/// any other size is taken in whole 512-byte sectors (rounded down), and less than one
/// sector means no limit. Whether the limit fits the zone alignment is checked when the run
/// starts ([`reencrypt::run::hotzone_length`]), after `--init-only` has done its work, as
/// cryptsetup checks it when it loads the reencryption context.
pub(super) fn max_hotzone(a: &ReencryptArgs) -> Result<Option<u64>, Failure> {
    let max_hotzone = a
        .hotzone_size
        .as_deref()
        .map(|t| cryptblk_volume::format::parse_bytes(t, "--hotzone-size"))
        .transpose()?;
    if max_hotzone == Some(0) {
        return Err(Failure::usage(
            "Invalid max reencryption hotzone size specification.",
        ));
    }
    Ok(max_hotzone.map(|n| n - n % 512).filter(|&n| n > 0))
}

/// The parameters of a new re-key from the command line (offline and online alike).
pub(super) fn init_params(
    opts: &Opts,
    a: &ReencryptArgs,
    device_block: u32,
) -> Result<InitParams, Failure> {
    let pbkdf_chosen = opts.pbkdf.is_some()
        || opts.hash.is_some()
        || opts.pbkdf_force_iterations.is_some()
        || opts.iter_time.is_some();
    Ok(InitParams {
        cipher: opts.cipher.clone(),
        key_size: opts.key_size.map(|b| b as usize / 8),
        sector_size: opts.sector_size,
        resilience: resilience_choice(a),
        resilience_hash: resilience_hash(a)?,
        pbkdf: if pbkdf_chosen {
            Some(volume::pbkdf_request(opts, false)?)
        } else {
            None
        },
        device_block,
        one_keyslot: opts.key_slot.is_some(),
        new_key: opts
            .volume_key_file
            .as_deref()
            .map(volume::read_volume_key_file)
            .transpose()?,
    })
}

/// Both keys of the reencryption `h` holds, from one passphrase, or from the secret of a
/// token (tried first, as for `open`: `--token-id`, `--token-type`, `--token-only`, or any
/// token when no key file is given). cryptsetup assigns a re-key's new keyslots the tokens
/// of the old ones, so one token secret opens both keys.
pub(super) fn resume_keys(
    opts: &Opts,
    h: &Luks2Header,
    file: &File,
    device: &Path,
) -> Result<ReencryptKeys, Failure> {
    let state = ReencryptState::of(h)?.ok_or_else(|| {
        Failure::device("LUKS2 reencryption requirement without reencryption metadata")
    })?;
    let mut open =
        |secret: &[u8], slot: usize| reencrypt::unlock_keys(h, file, &state, secret, Some(slot));
    if let Some(keys) = super::token::try_tokens_with(opts, h, device, &mut open)? {
        return Ok(keys);
    }
    let pass = volume::read_secret(
        &volume::key_source(opts, None),
        volume::limits(opts),
        &format!("Enter passphrase for {}: ", device.display()),
    )?;
    reencrypt::unlock_keys(
        h,
        file,
        &state,
        pass.as_bytes(),
        opts.key_slot.map(|s| s as usize),
    )
}

/// The device opened for reading and writing, or cryptsetup's error line.
pub(super) fn open_rw(path: &Path) -> Result<File, Failure> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| Failure::device(format!("Cannot open device {}: {e}", path.display())))
}

/// True when `path` starts with a LUKS magic.
fn is_luks(path: &Path) -> bool {
    let mut magic = [0u8; 6];
    File::open(path)
        .and_then(|f| std::os::unix::fs::FileExt::read_exact_at(&f, &mut magic, 0))
        .is_ok()
        && (magic == *b"LUKS\xba\xbe" || magic == *b"SKUL\xba\xbe")
}

/// `reencrypt --encrypt`: a new LUKS2 header for the plain `device` (on the device with
/// `--reduce-device-size`, else in the `--header` file), then the run.
fn encrypt(opts: &Opts, device: &Path, a: &ReencryptArgs, run_opts: RunOptions) -> ActionResult {
    if a.resume_only {
        return Err(Failure::usage("Device reencryption not in progress."));
    }
    let reduce = a
        .reduce_device_size
        .as_deref()
        .map(|t| cryptblk_volume::format::parse_bytes(t, "--reduce-device-size"))
        .transpose()?;
    let data = open_rw(device)?;
    let header_file = match &opts.header {
        Some(hp) => {
            if reduce.is_some() {
                return Err(Failure::usage(
                    "encryption with both --reduce-device-size and a detached header is not \
                     supported by cryptblk.",
                ));
            }
            if is_luks(hp) {
                return Err(Failure::usage(format!(
                    "Device {} is already a LUKS device (resume with --resume-only).",
                    hp.display()
                )));
            }
            Some(
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(hp)
                    .map_err(|e| {
                        Failure::device(format!("Cannot create header {}: {e}", hp.display()))
                    })?,
            )
        }
        None => None,
    };
    let mut pbkdf = volume::pbkdf_request(opts, false)?;
    let forced = opts.pbkdf_force_iterations.is_some();
    if forced {
        pbkdf.force_iterations = opts.pbkdf_force_iterations;
    }
    let cipher = opts
        .cipher
        .clone()
        .unwrap_or_else(|| "aes-xts-plain64".to_string());
    let key_size = opts.key_size.map_or_else(
        || reencrypt::init::new_key_size(64, Some(&cipher), None),
        |b| b as usize / 8,
    );
    let params = EncryptParams {
        cipher,
        key_size,
        sector_size: opts.sector_size.unwrap_or(512),
        resilience: resilience_choice(a),
        resilience_hash: resilience_hash(a)?,
        keyslot: cryptblk_format::luks2::KeyslotParams::new(pbkdf),
        reduce,
        device_block: run_opts.device_block,
        digest_iterations: forced.then_some(1000),
    };
    let pass = volume::read_secret(
        &volume::key_source(opts, None),
        volume::limits(opts),
        &format!("Enter passphrase for {}: ", device.display()),
    )?;
    let hdr_io: Option<&dyn HeaderIo> = header_file.as_ref().map(|f| f as &dyn HeaderIo);
    let (mut h, key) = reencrypt::init_encrypt(&data, hdr_io, pass.as_bytes(), &params)?;
    if opts.verbose {
        eprintln!("Key slot 0 created.");
    }
    if a.init_only {
        if opts.json {
            summary(
                device,
                "initialized",
                &reencrypt::RunOutcome::default(),
                None,
            );
        }
        return Ok(());
    }
    let keys = reencrypt::ReencryptKeys {
        old: None,
        new: Some(key),
    };
    let header: &dyn HeaderIo = hdr_io.unwrap_or(&data);
    let out = reencrypt::run_split(&mut h, header, &data, &keys, &run_opts, &mut Bar::new(true))?;
    if opts.json {
        summary(device, "finished", &out, None);
    }
    Ok(())
}

/// `reencrypt --decrypt --header NEW_FILE DEVICE` of a volume whose header is on DEVICE:
/// the header is exported to NEW_FILE and the data moved back to the device start while
/// it is decrypted (see [`reencrypt::init_decrypt_export`]).
fn decrypt_export(
    opts: &Opts,
    device: &Path,
    export: &Path,
    a: &ReencryptArgs,
    run_opts: RunOptions,
) -> ActionResult {
    let on_device = Opts {
        header: None,
        ..opts.clone()
    };
    let (mut h, data) = match volume::load(&on_device, device, true)? {
        Volume::Luks2(h, f) => (h, f),
        Volume::Luks1(_) => {
            return Err(Failure::usage(
                "LUKS1 decryption is not supported by cryptblk yet.",
            ))
        }
    };
    if h.reencryption_in_progress() {
        return Err(Failure::usage(
            "LUKS2 reencryption already initialized. Aborting operation.",
        ));
    }
    volume::confirm(
        opts,
        &format!(
            "Header file {} does not exist. Do you want to initialize LUKS2 decryption of \
             device {} and export LUKS2 header to file {}?",
            export.display(),
            device.display(),
            export.display()
        ),
    )?;
    let pass = volume::read_secret(
        &volume::key_source(opts, None),
        volume::limits(opts),
        &format!("Enter passphrase for {}: ", device.display()),
    )?;
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(export)
            .map_err(|e| {
                Failure::device(format!(
                    "Cannot create header file {}: {e}",
                    export.display()
                ))
            })?
    };
    let keys = match reencrypt::init_decrypt_export(
        &mut h,
        &data,
        &file,
        pass.as_bytes(),
        opts.key_slot.map(|s| s as usize),
        resilience_choice(a),
        resilience_hash(a)?,
        run_opts.device_block,
        // cryptsetup calibrates a decryption's reencryption digest.
        None,
    ) {
        Ok(k) => k,
        Err(e) => {
            // Nothing was exported (every check comes first): leave no empty file behind.
            if file.metadata().is_ok_and(|m| m.len() == 0) {
                let _ = std::fs::remove_file(export);
            }
            return Err(e);
        }
    };
    if a.init_only {
        if opts.json {
            summary(
                device,
                "initialized",
                &reencrypt::RunOutcome::default(),
                None,
            );
        }
        return Ok(());
    }
    let mut bar = Bar::new(true);
    let out = reencrypt::run_split(&mut h, &file, &data, &keys, &run_opts, &mut bar)?;
    if opts.json {
        summary(device, "finished", &out, None);
    }
    Ok(())
}

/// `--decrypt` of a volume whose header is detached (offline or online): the passphrase,
/// then the reencryption metadata (backward) in the header file of `h`. `dev_size` is the
/// data device's size. Returns both keys, or `None` after `--init-only` (its JSON line
/// printed).
pub(super) fn start_decrypt(
    opts: &Opts,
    a: &ReencryptArgs,
    h: &mut Luks2Header,
    file: &File,
    dev_size: u64,
    device_block: u32,
    device: &Path,
) -> Result<Option<ReencryptKeys>, Failure> {
    let seg = h.default_segment()?;
    let pass = volume::read_secret(
        &volume::key_source(opts, None),
        volume::limits(opts),
        &format!("Enter passphrase for {}: ", device.display()),
    )?;
    let keys = reencrypt::init_decrypt(
        h,
        file,
        dev_size.saturating_sub(seg.offset),
        pass.as_bytes(),
        opts.key_slot.map(|s| s as usize),
        resilience_choice(a),
        resilience_hash(a)?,
        device_block,
        // cryptsetup calibrates a decryption's reencryption digest.
        None,
    )?;
    if a.init_only {
        if opts.json {
            summary(
                device,
                "initialized",
                &reencrypt::RunOutcome::default(),
                None,
            );
        }
        return Ok(None);
    }
    Ok(Some(keys))
}

/// `reencrypt DEVICE`: starts (or, when one is in progress, resumes) an offline re-key,
/// encryption (`--encrypt`) or decryption (`--decrypt`, with a detached header or
/// exporting it) of a volume that no cryptblk process serves.
pub fn reencrypt(opts: &Opts, device: &Path, a: &ReencryptArgs) -> ActionResult {
    if a.init_only && a.resume_only {
        return Err(Failure::usage(
            "Options --init-only and --resume-only cannot be combined.",
        ));
    }
    if a.encrypt && a.decrypt {
        return Err(Failure::usage(
            "Options --encrypt and --decrypt cannot be combined.",
        ));
    }
    if a.reduce_device_size.is_some() && !a.encrypt {
        return Err(Failure::usage(
            "Option --reduce-device-size is allowed only for encryption.",
        ));
    }
    // A served volume holds its data lock: refuse it as cryptsetup refuses a busy device
    // (online reencryption through the daemon is not built yet).
    let _lock = cryptblk_volume::lock::DataLock::take(device, true)?;
    if super::reencrypt_luks1::is_luks1(opts.header.as_deref().unwrap_or(device)) {
        return super::reencrypt_luks1::reencrypt(opts, device, a);
    }
    let max_hotzone = max_hotzone(a)?;
    let device_block = File::open(device)
        .map(|f| reencrypt::init::device_block_size(&f))
        .unwrap_or(4096);
    let run_opts = RunOptions {
        max_hotzone,
        device_block,
        chunk: None,
    };
    // --encrypt of a device (or header file) already mid-encryption resumes it, as a plain
    // `reencrypt` does.
    let header_in_progress = {
        let hp = opts.header.as_deref().unwrap_or(device);
        is_luks(hp)
            && matches!(volume::load(opts, device, false), Ok(Volume::Luks2(ref h, _)) if h.reencryption_in_progress())
    };
    if a.encrypt && !header_in_progress {
        return encrypt(opts, device, a, run_opts);
    }
    if a.decrypt {
        match &opts.header {
            None => {
                return Err(Failure::usage("LUKS2 decryption requires --header option."));
            }
            Some(hp) if !hp.exists() => return decrypt_export(opts, device, hp, a, run_opts),
            Some(_) => {}
        }
    }
    let vol = volume::load(opts, device, true)?;
    let (mut h, file) = match vol {
        Volume::Luks2(h, f) => (h, f),
        Volume::Luks1(_) => {
            return Err(Failure::usage(
                "LUKS1 reencryption is not supported by cryptblk yet.",
            ))
        }
    };
    // With a detached header the data is the device itself.
    let data_file = if opts.header.is_some() {
        Some(open_rw(device)?)
    } else {
        None
    };
    let data: &dyn HeaderIo = match &data_file {
        Some(d) => d,
        None => &file,
    };
    let mut bar = Bar::new(true);
    if h.reencryption_in_progress() {
        if a.init_only {
            return Err(Failure::usage(
                "LUKS2 reencryption already initialized. Aborting operation.",
            ));
        }
        let keys = resume_keys(opts, &h, &file, device)?;
        let out = reencrypt::run_split(&mut h, &file, data, &keys, &run_opts, &mut bar)?;
        if opts.json {
            summary(device, "finished", &out, None);
        }
        return Ok(());
    }
    if a.resume_only {
        return Err(Failure::usage("Device reencryption not in progress."));
    }
    if a.decrypt {
        let dev_size = data
            .size()
            .map_err(|e| Failure::device(format!("reading the device size: {e}")))?;
        let Some(keys) = start_decrypt(
            opts,
            a,
            &mut h,
            &file,
            dev_size,
            run_opts.device_block,
            device,
        )?
        else {
            return Ok(());
        };
        let out = reencrypt::run_split(&mut h, &file, data, &keys, &run_opts, &mut bar)?;
        if opts.json {
            summary(device, "finished", &out, None);
        }
        return Ok(());
    }
    let seg = h.default_segment()?;
    if let Some(ss) = opts.sector_size {
        if ss > seg.sector_size && !a.force_offline_reencrypt {
            return Err(Failure::usage(
                "Encryption sector size increase on offline device is not supported.\n\
                 Activate the device first or use --force-offline-reencrypt option (dangerous!).",
            ));
        }
    }
    let mut params = init_params(opts, a, run_opts.device_block)?;
    let (pass, one) = passphrases(opts, &h, &file, device)?;
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
                device,
                "initialized",
                &reencrypt::RunOutcome::default(),
                Some(&init),
            );
        }
        return Ok(());
    }
    let keys = reencrypt::ReencryptKeys {
        old: Some(init.old_key.clone()),
        new: Some(init.new_key.clone()),
    };
    let out = reencrypt::run_split(&mut h, &file, data, &keys, &run_opts, &mut bar)?;
    if opts.json {
        summary(device, "finished", &out, Some(&init));
    }
    Ok(())
}
