//! `reencrypt DEVICE` of a LUKS1 volume: the offline re-key cryptsetup 2.6 runs with its
//! legacy LUKS1 code, with its prompts, options and temporary files in the working
//! directory; the work is [`cryptblk_volume::reencrypt::luks1`]'s.

use crate::args::{Opts, ReencryptArgs};
use crate::exit::{ActionResult, Failure};
use crate::progress::Bar;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::keyfile::KeySource;
use cryptblk_format::luks1::{Luks1Volume, LUKS1_MAGIC};
use cryptblk_volume::reencrypt::luks1::{self, Found, Luks1Params, Luks1Rekey, UNUSABLE_MAGIC};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::reencrypt::open_rw;
use super::volume;

/// True when `device` holds a LUKS1 header, or one cryptsetup's LUKS1 reencryption marked.
pub(super) fn is_luks1(device: &Path) -> bool {
    let mut head = [0u8; 8];
    File::open(device)
        .and_then(|f| f.read_exact_at(&mut head, 0))
        .is_ok()
        && (head[..6] == LUKS1_MAGIC || head[..6] == UNUSABLE_MAGIC)
        && head[6..8] == [0, 1]
}

/// The passphrases of the keyslots to carry over, as cryptsetup's LUKS1 code asks for them:
/// a key file opens one keyslot (which must be `--key-slot` or the only active one); else
/// `--key-slot`'s passphrase, or one per active keyslot.
fn passphrases<D: HeaderIo>(
    opts: &Opts,
    vol: &Luks1Volume<D>,
) -> Result<Vec<(usize, SecretBytes)>, Failure> {
    let h = vol.header();
    let active: Vec<usize> = (0..8).filter(|&s| h.keyslots[s].is_enabled()).collect();
    let slot = opts.key_slot.map(|s| s as usize);
    if let Some(s) = slot {
        if s >= 8 {
            return Err(Failure::usage("Key slot is invalid."));
        }
        if !active.contains(&s) {
            return Err(Failure::usage(format!("Keyslot {s} is not active.")));
        }
    }
    let source = volume::key_source(opts, None);
    let limits = volume::limits(opts);
    if matches!(source, KeySource::File(_)) {
        let pass = volume::read_secret(&source, limits, "")?;
        let u = vol.unlock(pass.as_bytes(), slot)?;
        if slot.is_none() && active.len() > 1 {
            return Err(Failure::usage(
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
        .map(|s| {
            let p = volume::read_secret(
                &source,
                limits,
                &format!("Enter passphrase for key slot {s}: "),
            )?;
            Ok((s, p))
        })
        .collect()
}

/// `reencrypt` of the LUKS1 `device` (the caller holds its data lock): a new run, or the
/// resume of one whose files are in the working directory.
pub(super) fn reencrypt(opts: &Opts, device: &Path, a: &ReencryptArgs) -> ActionResult {
    if opts.header.is_some() {
        return Err(Failure::usage(
            "LUKS1 reencryption with a detached header is not supported by cryptblk yet.",
        ));
    }
    if a.encrypt || a.decrypt || a.reduce_device_size.is_some() {
        return Err(Failure::usage(
            "LUKS1 encryption, decryption and data shift are not supported by cryptblk yet.",
        ));
    }
    if a.init_only {
        return Err(Failure::usage(
            "Option --init-only is not supported for LUKS1 reencryption.",
        ));
    }
    if opts.sector_size.is_some_and(|s| s != 512) {
        return Err(Failure::usage("Unsupported encryption sector size."));
    }
    let block = match a.block_size {
        None => luks1::DEFAULT_BLOCK,
        Some(b @ 1..=64) => u64::from(b) << 20,
        Some(_) => {
            return Err(Failure::usage(
                "Only values between 1 MiB and 64 MiB allowed for reencryption block size.",
            ))
        }
    };
    let dir = std::env::current_dir()
        .map_err(|e| Failure::device(format!("Cannot read the working directory: {e}")))?;
    let dev = open_rw(device)?;
    let found = luks1::find(&dev, &dir)?;
    let mut job = match found {
        Found::Finished => {
            if opts.json {
                super::reencrypt::summary(
                    device,
                    "finished",
                    &cryptblk_volume::reencrypt::RunOutcome::default(),
                    None,
                );
            }
            return Ok(());
        }
        Found::InProgress(uuid) => {
            if !opts.json {
                println!("Log file LUKS-{uuid}.log exists, resuming reencryption.");
            }
            let prompt = match opts.key_slot {
                Some(s) => format!("Enter passphrase for key slot {s}: "),
                None => "Enter any existing passphrase: ".to_string(),
            };
            let pass = volume::read_secret(
                &volume::key_source(opts, None),
                volume::limits(opts),
                &prompt,
            )?;
            Luks1Rekey::resume(
                &dev,
                &dir,
                &uuid,
                pass.as_bytes(),
                opts.key_slot.map(|s| s as usize),
            )?
        }
        Found::Nothing => {
            if a.resume_only {
                return Err(Failure::usage("Device reencryption not in progress."));
            }
            let vol = Luks1Volume::open(&dev).map_err(|_| {
                Failure::usage(format!(
                    "Device {} is not a valid LUKS device.",
                    device.display()
                ))
            })?;
            let mut kdf = volume::pbkdf_request(opts, true)?;
            kdf.hash = volume::hash_opt(opts)?;
            let params = Luks1Params {
                cipher: opts.cipher.clone(),
                key_bytes: opts.key_size.map(|b| b as usize / 8),
                hash: kdf.hash,
                kdf,
                volume_key: opts
                    .volume_key_file
                    .as_deref()
                    .map(volume::read_volume_key_file)
                    .transpose()?,
                keep_key: a.keep_key,
            };
            let pass = passphrases(opts, &vol)?;
            drop(vol);
            let job = Luks1Rekey::start(&dev, &dir, &pass, &params)?;
            if opts.verbose {
                eprintln!(
                    "LUKS1 header backup of device {} created.",
                    device.display()
                );
                eprintln!("New LUKS header for device {} created.", device.display());
                for s in &job.keyslots {
                    eprintln!("Key slot {s} created.");
                }
                eprintln!("Marking LUKS1 device {} unusable.", device.display());
            }
            job
        }
    };
    let out = job.run(&dev, block, &mut Bar::new(true))?;
    if opts.json {
        super::reencrypt::summary(device, "finished", &out, None);
    }
    Ok(())
}
