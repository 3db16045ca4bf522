//! Carrying out a [`ReencryptRequest`] as cryptsetup's `reencrypt` action does: online through
//! the daemon serving the volume ([`super::handoff`]), else offline: which run it becomes
//! ([`Mode`]: re-key, `--encrypt`, `--decrypt` with a detached header or exporting the
//! header, resume, LUKS1), the `--init-only`/`--resume-only` checks, the data and header
//! files, then the init and the run. Secrets come from the caller's [`ReencryptInput`],
//! progress goes to its [`Progress`]; errors carry cryptsetup's messages and exit classes.

use super::request::{
    device_prompt, keyslot_prompt, load, Mode, ReencryptInput, ReencryptNotice, ReencryptOutcome,
    ReencryptRequest,
};
use super::{luks1, EncryptParams, ReencryptKeys, RunOptions, RunOutcome};
use crate::error::{Result, VolumeError};
use crate::lock::DataLock;
use crate::luks::{LuksType, Volume};
use crate::progress::Progress;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::luks1::{Luks1Volume, LUKS1_MAGIC};
use cryptblk_format::luks2::Luks2Header;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::start::{confirm_export, create_export_file, resume_keys, start_decrypt, start_rekey};

pub use super::handoff::{served_volume, wait_online};

/// Runs `req`: online when a cryptblk daemon serves the volume (unless
/// `--force-offline-reencrypt`), else offline. An online run is
/// [`ReencryptOutcome::HandedToDaemon`] once the daemon has it.
pub fn reencrypt(
    req: &ReencryptRequest,
    input: &mut dyn ReencryptInput,
    progress: &mut dyn Progress,
) -> Result<ReencryptOutcome> {
    if !req.force_offline {
        if let Some(st) = served_volume(req.device.as_deref(), req.active_name.as_deref())? {
            return super::handoff::online(req, st, input);
        }
    }
    let device = match (&req.device, &req.active_name) {
        (Some(d), _) => d,
        (None, Some(_)) => {
            return Err(VolumeError::usage(
                "Options --active-name and --force-offline-reencrypt cannot be combined.",
            ))
        }
        (None, None) => return Err(VolumeError::usage("reencrypt needs a device")),
    };
    offline(req, device, input, progress)
}

/// The checks every offline run makes before it touches a file.
fn check_options(req: &ReencryptRequest) -> Result<()> {
    if req.init_only && req.resume_only {
        return Err(VolumeError::usage(
            "Options --init-only and --resume-only cannot be combined.",
        ));
    }
    if req.encrypt && req.decrypt {
        return Err(VolumeError::usage(
            "Options --encrypt and --decrypt cannot be combined.",
        ));
    }
    if req.reduce_device_size.is_some() && req.decrypt {
        return Err(VolumeError::usage(
            "Option --reduce-device-size is allowed only for encryption and reencryption.",
        ));
    }
    Ok(())
}

/// An offline run decided, with what it has opened so far.
enum Start {
    Luks1,
    Encrypt,
    DecryptExport(std::path::PathBuf),
    /// Resume, decrypt (detached) or re-key of the LUKS2 header `h` on `file`, the data on
    /// `data` (a detached header's data device) or on `file`.
    Loaded {
        mode: Mode,
        h: Box<Luks2Header>,
        file: File,
        data: Option<File>,
    },
}

impl Start {
    fn mode(&self) -> Mode {
        match self {
            Start::Luks1 => Mode::Luks1,
            Start::Encrypt => Mode::Encrypt,
            Start::DecryptExport(_) => Mode::DecryptExport,
            Start::Loaded { mode, .. } => *mode,
        }
    }
}

/// Decides the offline run `req` becomes for `device` (holding no lock: the caller holds
/// the data lock), refusing what cryptsetup refuses before any passphrase is asked.
fn decide(req: &ReencryptRequest, device: &Path, run_opts: &mut RunOptions) -> Result<Start> {
    if req.encrypt && !req.disable_blkid {
        // cryptsetup's check before encrypting: a header (or, with --header, a data device)
        // that is no loadable LUKS but still has a LUKS signature blkid recognises holds
        // broken LUKS metadata; encrypting over it would destroy what repair could recover.
        // (`load` with no type loads nothing: either version must be asked for here.) A
        // loadable LUKS device is "already LUKS device" below, as cryptsetup answers it
        // (keyslot_safety::encrypt_refuses_a_luks_device).
        let loads = |p: &Path| load(p, Some(LuksType::Any), false).is_ok();
        let header = req.header_path(device);
        if (req.header.is_none() || header.exists()) && !loads(header) {
            refuse_broken_luks(header)?;
        }
        if req.header.is_some() && !loads(device) {
            refuse_broken_luks(device)?;
        }
    }
    if req.encrypt && is_luks(device) {
        // Encrypting a LUKS device again would bury its header and keyslots under a second
        // layer: cryptsetup refuses it, unless this is its own encryption to resume.
        let resuming = matches!(
            load(req.header_path(device), req.luks_type, false),
            Ok(Volume::Luks2(ref h, _)) if h.reencryption_in_progress()
        );
        if !resuming {
            let version = if is_luks1(device) { 1 } else { 2 };
            let conflicting = match req.luks_type {
                Some(LuksType::Luks1) => version != 1,
                Some(LuksType::Luks2) => version != 2,
                _ => false,
            };
            // Without --header cryptsetup first checks --type against the device.
            if conflicting && req.header.is_none() {
                return Err(VolumeError::usage(format!(
                    "Conflicting versions. Device {} is LUKS{version}.",
                    device.display()
                )));
            }
            return Err(VolumeError::usage(format!(
                "Device {} is already LUKS device. Aborting operation.",
                device.display()
            )));
        }
    }
    if is_luks1(req.header_path(device)) {
        return Ok(Start::Luks1);
    }
    run_opts.max_hotzone = req.max_hotzone()?;
    run_opts.device_block = File::open(device)
        .map(|f| super::init::device_block_size(&f))
        .unwrap_or(4096);
    // --encrypt of a device (or header file) already mid-encryption resumes it, as a plain
    // `reencrypt` does.
    let header_in_progress = {
        let hp = req.header_path(device);
        is_luks(hp)
            && matches!(load(hp, req.luks_type, false), Ok(Volume::Luks2(ref h, _)) if h.reencryption_in_progress())
    };
    if req.encrypt && !header_in_progress {
        return Ok(Start::Encrypt);
    }
    if req.decrypt {
        match &req.header {
            None => {
                return Err(VolumeError::usage(
                    "LUKS2 decryption requires --header option.",
                ));
            }
            Some(hp) if !hp.exists() => return Ok(Start::DecryptExport(hp.clone())),
            Some(_) => {}
        }
    }
    let (h, file) = match load(req.header_path(device), req.luks_type, true)? {
        Volume::Luks2(h, f) => (h, f),
        Volume::Luks1(_) => {
            return Err(VolumeError::usage(
                "LUKS1 reencryption is not supported by cryptblk yet.",
            ))
        }
    };
    // With a detached header the data is the device itself.
    let data = if req.header.is_some() {
        Some(open_rw(device)?)
    } else {
        None
    };
    let mode = if h.reencryption_in_progress() {
        if req.init_only {
            return Err(VolumeError::usage(
                "LUKS2 reencryption already initialized. Aborting operation.",
            ));
        }
        Mode::Resume
    } else if req.resume_only {
        return Err(VolumeError::usage("Device reencryption not in progress."));
    } else if req.decrypt {
        Mode::Decrypt
    } else {
        let seg = h.default_segment()?;
        if let Some(ss) = req.sector_size {
            if ss > seg.sector_size && !req.force_offline {
                return Err(VolumeError::usage(
                    "Encryption sector size increase on offline device is not supported.\n\
                     Activate the device first or use --force-offline-reencrypt option (dangerous!).",
                ));
            }
        }
        Mode::Rekey
    };
    Ok(Start::Loaded {
        mode,
        h,
        file,
        data,
    })
}

/// Which offline run `req` would become for its device, with every check made before a
/// passphrase is asked (the option combinations, the data lock, the header's state):
/// nothing is written.
pub fn offline_mode(req: &ReencryptRequest) -> Result<Mode> {
    check_options(req)?;
    let device = req
        .device
        .as_deref()
        .ok_or_else(|| VolumeError::usage("reencrypt needs a device"))?;
    let _lock = DataLock::take(device, true)?;
    decide(req, device, &mut RunOptions::default()).map(|s| s.mode())
}

/// `reencrypt DEVICE` offline: starts (or, when one is in progress, resumes) a re-key,
/// encryption (`--encrypt`) or decryption (`--decrypt`, with a detached header or exporting
/// it) of a volume no cryptblk process serves, or a LUKS1 re-key.
pub fn offline(
    req: &ReencryptRequest,
    device: &Path,
    input: &mut dyn ReencryptInput,
    progress: &mut dyn Progress,
) -> Result<ReencryptOutcome> {
    check_options(req)?;
    // A served volume holds its data lock: refuse it as cryptsetup refuses a busy device.
    let _lock = DataLock::take(device, true)?;
    let mut run_opts = RunOptions::default();
    let (mode, mut h, file, data_file) = match decide(req, device, &mut run_opts)? {
        Start::Luks1 => return luks1_rekey(req, device, input, progress),
        Start::Encrypt => return encrypt(req, device, input, run_opts, progress),
        Start::DecryptExport(export) => {
            return decrypt_export(req, device, &export, input, run_opts, progress)
        }
        Start::Loaded {
            mode,
            h,
            file,
            data,
        } => (mode, h, file, data),
    };
    let data: &dyn HeaderIo = match &data_file {
        Some(d) => d,
        None => &file,
    };
    let finished = |run: RunOutcome, init| ReencryptOutcome::Finished {
        device: device.to_path_buf(),
        run,
        init,
    };
    match mode {
        Mode::Resume => {
            let keys = resume_keys(req, input, &h, &file, device)?;
            let out = super::run_split(&mut h, &file, data, &keys, &run_opts, progress)?;
            Ok(finished(out, None))
        }
        Mode::Decrypt => {
            let dev_size = data
                .size()
                .map_err(|e| VolumeError::device(format!("reading the device size: {e}")))?;
            let Some(keys) = start_decrypt(
                req,
                input,
                &mut h,
                &file,
                dev_size,
                run_opts.device_block,
                device,
            )?
            else {
                return Ok(ReencryptOutcome::Initialized {
                    device: device.to_path_buf(),
                    init: None,
                });
            };
            let out = super::run_split(&mut h, &file, data, &keys, &run_opts, progress)?;
            Ok(finished(out, None))
        }
        _ => {
            let init = start_rekey(req, input, &mut h, &file, device, run_opts.device_block)?;
            if req.init_only {
                return Ok(ReencryptOutcome::Initialized {
                    device: device.to_path_buf(),
                    init: Some(init),
                });
            }
            let keys = ReencryptKeys {
                old: Some(init.old_key.clone()),
                new: Some(init.new_key.clone()),
            };
            let out = super::run_split(&mut h, &file, data, &keys, &run_opts, progress)?;
            Ok(finished(out, Some(init)))
        }
    }
}

/// The device opened for reading and writing, or cryptsetup's error line.
pub fn open_rw(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| VolumeError::device(format!("Cannot open device {}: {e}", path.display())))
}

/// True when `path` starts with a LUKS magic.
/// Fails when blkid finds a LUKS signature on `path` (cryptsetup's
/// `check_broken_luks_signature`; nothing without libblkid).
fn refuse_broken_luks(path: &Path) -> Result<()> {
    if !crate::blkid::detect(path, crate::blkid::Filter::OnlyLuks)?.is_empty() {
        return Err(VolumeError::usage(format!(
            "Device {} contains broken LUKS metadata. Aborting operation.",
            path.display()
        )));
    }
    Ok(())
}

fn is_luks(path: &Path) -> bool {
    let mut magic = [0u8; 6];
    File::open(path)
        .and_then(|f| f.read_exact_at(&mut magic, 0))
        .is_ok()
        && (magic == *b"LUKS\xba\xbe" || magic == *b"SKUL\xba\xbe")
}

/// True when `path` holds a LUKS1 header, or one cryptsetup's LUKS1 reencryption marked.
pub fn is_luks1(path: &Path) -> bool {
    let mut head = [0u8; 8];
    File::open(path)
        .and_then(|f| f.read_exact_at(&mut head, 0))
        .is_ok()
        && (head[..6] == LUKS1_MAGIC || head[..6] == luks1::UNUSABLE_MAGIC)
        && head[6..8] == [0, 1]
}

/// `reencrypt --encrypt`: a new LUKS2 header for the plain `device` (on the device with
/// `--reduce-device-size`, else in the `--header` file), then the run.
fn encrypt(
    req: &ReencryptRequest,
    device: &Path,
    input: &mut dyn ReencryptInput,
    run_opts: RunOptions,
    progress: &mut dyn Progress,
) -> Result<ReencryptOutcome> {
    if req.resume_only {
        return Err(VolumeError::usage("Device reencryption not in progress."));
    }
    let reduce = req
        .reduce_device_size
        .as_deref()
        .map(|t| crate::format::parse_bytes(t, "--reduce-device-size"))
        .transpose()?;
    let data = open_rw(device)?;
    let header_file = match &req.header {
        Some(hp) => {
            if reduce.is_some() {
                return Err(VolumeError::usage(
                    "encryption with both --reduce-device-size and a detached header is not \
                     supported by cryptblk.",
                ));
            }
            if is_luks(hp) {
                return Err(VolumeError::usage(format!(
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
                        VolumeError::device(format!("Cannot create header {}: {e}", hp.display()))
                    })?,
            )
        }
        None => None,
    };
    let pbkdf = input.pbkdf(false)?;
    let forced = pbkdf.force_iterations.is_some();
    let cipher = req
        .cipher
        .clone()
        .unwrap_or_else(|| "aes-xts-plain64".to_string());
    let key_size = req
        .key_size()
        .unwrap_or_else(|| super::init::new_key_size(64, Some(&cipher), None));
    let params = EncryptParams {
        cipher,
        key_size,
        sector_size: req.sector_size.unwrap_or(512),
        resilience: req.resilience,
        resilience_hash: req.resilience_hash()?,
        keyslot: cryptblk_format::luks2::KeyslotParams::new(pbkdf),
        reduce,
        device_block: run_opts.device_block,
        digest_iterations: forced.then_some(1000),
    };
    let pass = input.secret(&device_prompt(device))?;
    let hdr_io: Option<&dyn HeaderIo> = header_file.as_ref().map(|f| f as &dyn HeaderIo);
    let (mut h, key) = super::init_encrypt(&data, hdr_io, pass.as_bytes(), &params)?;
    input.notice(ReencryptNotice::KeyslotCreated(0));
    if req.init_only {
        return Ok(ReencryptOutcome::Initialized {
            device: device.to_path_buf(),
            init: None,
        });
    }
    let keys = ReencryptKeys {
        old: None,
        new: Some(key),
    };
    let header: &dyn HeaderIo = hdr_io.unwrap_or(&data);
    let run = super::run_split(&mut h, header, &data, &keys, &run_opts, progress)?;
    Ok(ReencryptOutcome::Finished {
        device: device.to_path_buf(),
        run,
        init: None,
    })
}

/// `reencrypt --decrypt --header NEW_FILE DEVICE` of a volume whose header is on DEVICE:
/// the header is exported to NEW_FILE and the data moved back to the device start while
/// it is decrypted (see [`super::init_decrypt_export`]).
fn decrypt_export(
    req: &ReencryptRequest,
    device: &Path,
    export: &Path,
    input: &mut dyn ReencryptInput,
    run_opts: RunOptions,
    progress: &mut dyn Progress,
) -> Result<ReencryptOutcome> {
    let (mut h, data) = match load(device, req.luks_type, true)? {
        Volume::Luks2(h, f) => (h, f),
        Volume::Luks1(_) => {
            return Err(VolumeError::usage(
                "LUKS1 decryption is not supported by cryptblk yet.",
            ))
        }
    };
    if h.reencryption_in_progress() {
        return Err(VolumeError::usage(
            "LUKS2 reencryption already initialized. Aborting operation.",
        ));
    }
    let pass = confirm_export(input, device, export)?;
    let file = create_export_file(export)?;
    let keys = match super::init_decrypt_export(
        &mut h,
        &data,
        &file,
        pass.as_bytes(),
        req.key_slot,
        req.resilience,
        req.resilience_hash()?,
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
    if req.init_only {
        return Ok(ReencryptOutcome::Initialized {
            device: device.to_path_buf(),
            init: None,
        });
    }
    let run = super::run_split(&mut h, &file, &data, &keys, &run_opts, progress)?;
    Ok(ReencryptOutcome::Finished {
        device: device.to_path_buf(),
        run,
        init: None,
    })
}

/// The passphrases of the keyslots of a LUKS1 re-key, as cryptsetup's LUKS1 code asks for
/// them: a key file opens one keyslot (which must be `--key-slot` or the only active one);
/// else `--key-slot`'s passphrase, or one per active keyslot.
fn luks1_passphrases<D: HeaderIo>(
    req: &ReencryptRequest,
    input: &mut dyn ReencryptInput,
    vol: &Luks1Volume<D>,
) -> Result<Vec<(usize, SecretBytes)>> {
    let h = vol.header();
    let active: Vec<usize> = (0..8).filter(|&s| h.keyslots[s].is_enabled()).collect();
    let slot = req.key_slot;
    if let Some(s) = slot {
        if s >= 8 {
            return Err(VolumeError::usage("Key slot is invalid."));
        }
        if !active.contains(&s) {
            return Err(VolumeError::usage(format!("Keyslot {s} is not active.")));
        }
    }
    if input.key_file_given() {
        let pass = input.secret("")?;
        let u = vol.unlock(pass.as_bytes(), slot)?;
        if slot.is_none() && active.len() > 1 {
            return Err(VolumeError::usage(
                "Key file can be used only with --key-slot or with exactly one key slot active.",
            ));
        }
        return Ok(vec![(u.keyslot, pass)]);
    }
    let slots = match slot {
        Some(s) => vec![s],
        None => active,
    };
    slots
        .into_iter()
        .map(|s| Ok((s, input.secret(&keyslot_prompt(s))?)))
        .collect()
}

/// `reencrypt` of the LUKS1 `device` (the caller holds its data lock): the offline re-key
/// cryptsetup 2.6 runs with its legacy LUKS1 code, a new run or the resume of one whose
/// files are in the working directory.
fn luks1_rekey(
    req: &ReencryptRequest,
    device: &Path,
    input: &mut dyn ReencryptInput,
    progress: &mut dyn Progress,
) -> Result<ReencryptOutcome> {
    if req.header.is_some() {
        return Err(VolumeError::usage(
            "LUKS1 reencryption with a detached header is not supported by cryptblk yet.",
        ));
    }
    if req.encrypt || req.decrypt || req.reduce_device_size.is_some() {
        return Err(VolumeError::usage(
            "LUKS1 encryption, decryption and data shift are not supported by cryptblk yet.",
        ));
    }
    if req.init_only {
        return Err(VolumeError::usage(
            "Option --init-only is not supported for LUKS1 reencryption.",
        ));
    }
    if req.sector_size.is_some_and(|s| s != 512) {
        return Err(VolumeError::usage("Unsupported encryption sector size."));
    }
    let block = match req.block_size_mib {
        None => luks1::DEFAULT_BLOCK,
        Some(b @ 1..=64) => u64::from(b) << 20,
        Some(_) => {
            return Err(VolumeError::usage(
                "Only values between 1 MiB and 64 MiB allowed for reencryption block size.",
            ))
        }
    };
    // cryptsetup keeps the run's log and header files in the working directory.
    let dir = std::env::current_dir()
        .map_err(|e| VolumeError::device(format!("Cannot read the working directory: {e}")))?;
    let dev = open_rw(device)?;
    let mut job = match luks1::find(&dev, &dir)? {
        luks1::Found::Finished => {
            return Ok(ReencryptOutcome::Finished {
                device: device.to_path_buf(),
                run: RunOutcome::default(),
                init: None,
            })
        }
        luks1::Found::InProgress(uuid) => {
            input.notice(ReencryptNotice::Luks1Resuming(uuid.clone()));
            let prompt = match req.key_slot {
                Some(s) => keyslot_prompt(s),
                None => "Enter any existing passphrase: ".to_string(),
            };
            let pass = input.secret(&prompt)?;
            luks1::Luks1Rekey::resume(&dev, &dir, &uuid, pass.as_bytes(), req.key_slot)?
        }
        luks1::Found::Nothing => {
            if req.resume_only {
                return Err(VolumeError::usage("Device reencryption not in progress."));
            }
            let vol = Luks1Volume::open(&dev).map_err(|_| {
                VolumeError::usage(format!(
                    "Device {} is not a valid LUKS device.",
                    device.display()
                ))
            })?;
            let kdf = input.pbkdf(true)?;
            let current = vol.header().key_bytes as usize;
            let new_key_bytes = if req.keep_key {
                current
            } else {
                req.key_size().unwrap_or(current)
            };
            let params = luks1::Luks1Params {
                cipher: req.cipher.clone(),
                key_bytes: req.key_size(),
                hash: kdf.hash,
                kdf,
                volume_key: input.volume_key(new_key_bytes)?,
                keep_key: req.keep_key,
            };
            let pass = luks1_passphrases(req, input, &vol)?;
            drop(vol);
            let job = luks1::Luks1Rekey::start(&dev, &dir, &pass, &params)?;
            input.notice(ReencryptNotice::Luks1HeaderBackup);
            input.notice(ReencryptNotice::Luks1NewHeader);
            for s in &job.keyslots {
                input.notice(ReencryptNotice::KeyslotCreated(*s));
            }
            input.notice(ReencryptNotice::Luks1MarkedUnusable);
            job
        }
    };
    let run = job.run(&dev, block, progress)?;
    Ok(ReencryptOutcome::Finished {
        device: device.to_path_buf(),
        run,
        init: None,
    })
}
