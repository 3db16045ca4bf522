//! `reencrypt DEVICE`: offline LUKS2 re-key with cryptsetup's options and messages; the
//! work is [`cryptblk_volume::reencrypt`]'s.

use crate::args::{Opts, ReencryptArgs, ResilienceArg};
use crate::exit::{ActionResult, Failure};
use crate::progress::Bar;
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::keyfile::KeySource;
use cryptblk_volume::reencrypt::{self, InitParams, ReencryptState, ResilienceChoice, RunOptions};
use cryptblk_volume::Volume;
use std::path::Path;

use super::volume;

/// The passphrases of the keyslots to carry over: `--key-slot`'s one, the only active
/// keyslot's, or (on a terminal or standard input) one per active keyslot as cryptsetup
/// asks for them.
pub(super) fn passphrases(
    opts: &Opts,
    h: &cryptblk_format::luks2::Luks2Header,
) -> Result<Vec<(usize, SecretBytes)>, Failure> {
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
        .collect()
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

/// `reencrypt DEVICE`: starts (or, when one is in progress, resumes) an offline re-key of a
/// LUKS2 volume that no cryptblk process serves.
pub fn reencrypt(opts: &Opts, device: &Path, a: &ReencryptArgs) -> ActionResult {
    if opts.header.is_some() {
        return Err(Failure::usage(
            "reencryption with a detached header (--header) is not supported yet",
        ));
    }
    if a.init_only && a.resume_only {
        return Err(Failure::usage(
            "Options --init-only and --resume-only cannot be combined.",
        ));
    }
    // A served volume holds its data lock: refuse it as cryptsetup refuses a busy device
    // (online reencryption through the daemon is not built yet).
    let _lock = cryptblk_volume::lock::DataLock::take(device, true)?;
    let vol = volume::load(opts, device, true)?;
    let (mut h, file) = match vol {
        Volume::Luks2(h, f) => (h, f),
        Volume::Luks1(_) => {
            return Err(Failure::usage(
                "LUKS1 reencryption is not supported by cryptblk yet.",
            ))
        }
    };
    let max_hotzone = a
        .hotzone_size
        .as_deref()
        .map(|t| cryptblk_volume::format::parse_bytes(t, "--hotzone-size"))
        .transpose()?;
    if max_hotzone.is_some_and(|n| n == 0 || n % 512 != 0) {
        return Err(Failure::usage(
            "Invalid max reencryption hotzone size specification.",
        ));
    }
    let run_opts = RunOptions {
        max_hotzone,
        device_block: reencrypt::init::device_block_size(&file),
    };
    let mut bar = Bar::new(true);
    if h.reencryption_in_progress() {
        if a.init_only {
            return Err(Failure::usage(
                "LUKS2 reencryption already initialized. Aborting operation.",
            ));
        }
        let state = ReencryptState::of(&h)?.ok_or_else(|| {
            Failure::device("LUKS2 reencryption requirement without reencryption metadata")
        })?;
        let pass = volume::read_secret(
            &volume::key_source(opts, None),
            volume::limits(opts),
            &format!("Enter passphrase for {}: ", device.display()),
        )?;
        let keys = reencrypt::unlock_keys(
            &h,
            &file,
            &state,
            pass.as_bytes(),
            opts.key_slot.map(|s| s as usize),
        )?;
        let out = reencrypt::run(&mut h, &file, &keys, &run_opts, &mut bar)?;
        if opts.json {
            summary(device, "finished", &out, None);
        }
        return Ok(());
    }
    if a.resume_only {
        return Err(Failure::usage("Device reencryption not in progress."));
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
    let resilience_hash = match &a.resilience_hash {
        Some(name) => HashAlgorithm::from_name(name)
            .map_err(|_| Failure::usage(format!("Hash algorithm {name} is not available.")))?,
        None => HashAlgorithm::Sha256,
    };
    let pbkdf_chosen = opts.pbkdf.is_some()
        || opts.hash.is_some()
        || opts.pbkdf_force_iterations.is_some()
        || opts.iter_time.is_some();
    let params = InitParams {
        cipher: opts.cipher.clone(),
        key_size: opts.key_size.map(|b| b as usize / 8),
        sector_size: opts.sector_size,
        resilience: match a.resilience {
            None | Some(ResilienceArg::Checksum) => ResilienceChoice::Checksum,
            Some(ResilienceArg::Journal) => ResilienceChoice::Journal,
            Some(ResilienceArg::None) => ResilienceChoice::None,
        },
        resilience_hash,
        pbkdf: if pbkdf_chosen {
            Some(volume::pbkdf_request(opts, false)?)
        } else {
            None
        },
        device_block: run_opts.device_block,
        one_keyslot: opts.key_slot.is_some(),
    };
    let pass = passphrases(opts, &h)?;
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
    let out = reencrypt::run(&mut h, &file, &keys, &run_opts, &mut bar)?;
    if opts.json {
        summary(device, "finished", &out, Some(&init));
    }
    Ok(())
}
