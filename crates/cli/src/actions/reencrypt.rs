//! `reencrypt [DEVICE]`: LUKS2 re-key, encryption and decryption in place (offline, or
//! online through the daemon serving the volume) and the LUKS1 re-key, with cryptsetup's
//! options and messages. The decisions and the work are
//! [`cryptblk_volume::reencrypt::operate`]'s; this reads the options into a
//! [`ReencryptRequest`], supplies passphrases, tokens and confirmations
//! ([`ReencryptInput`]), draws the progress and prints `--json` and `--verbose` lines.

use crate::args::{Opts, ReencryptArgs, ResilienceArg, VolumeType};
use crate::exit::{ActionResult, Failure};
use crate::progress::{Bar, Dest};
use cryptblk_cipher::SecretBytes;
use cryptblk_format::kdf::PbkdfRequest;
use cryptblk_format::keyfile::KeySource;
use cryptblk_format::luks2::Luks2Header;
use cryptblk_volume::reencrypt::{
    self, InitOutcome, ReencryptInput, ReencryptNotice, ReencryptOutcome, ReencryptRequest,
    ResilienceChoice, RunOutcome, TokenUse,
};
use cryptblk_volume::LuksType;
use std::path::Path;

use super::volume;

/// The command line's answers to what a reencryption asks: passphrases from the terminal,
/// standard input or `--key-file`, tokens as `open` tries them, `--batch-mode`
/// confirmations, the PBKDF options and `--volume-key-file`; notices printed as cryptsetup
/// prints them.
pub(super) struct CliInput<'a> {
    pub opts: &'a Opts,
    /// The device notices name.
    pub device: &'a Path,
}

impl ReencryptInput for CliInput<'_> {
    fn secret(&mut self, prompt: &str) -> Result<SecretBytes, Failure> {
        volume::read_secret(
            &volume::key_source(self.opts, None),
            volume::limits(self.opts),
            prompt,
        )
    }

    fn key_file_given(&self) -> bool {
        matches!(volume::key_source(self.opts, None), KeySource::File(_))
    }

    fn tokens(
        &mut self,
        h: &Luks2Header,
        device: &Path,
        which: TokenUse,
        open: &mut dyn FnMut(&[u8], usize) -> Result<(), Failure>,
    ) -> Result<bool, Failure> {
        if which == TokenUse::Named && !super::token::choice(self.opts).explicit() {
            return Ok(false);
        }
        Ok(super::token::try_tokens_with(self.opts, h, device, open)?.is_some())
    }

    fn confirm(&mut self, question: &str) -> Result<(), Failure> {
        volume::confirm(self.opts, question)
    }

    fn pbkdf(&mut self, luks1: bool) -> Result<PbkdfRequest, Failure> {
        volume::pbkdf_request(self.opts, luks1)
    }

    fn volume_key(&mut self, key_bytes: usize) -> Result<Option<SecretBytes>, Failure> {
        self.opts
            .volume_key_file
            .as_deref()
            .map(|p| volume::read_volume_key_file(p, key_bytes))
            .transpose()
    }

    fn notice(&mut self, notice: ReencryptNotice) {
        let device = self.device.display();
        match notice {
            ReencryptNotice::KeyslotCreated(n) if self.opts.verbose => {
                eprintln!("Key slot {n} created.")
            }
            ReencryptNotice::Luks1Resuming(uuid) if !self.opts.json => {
                println!("Log file LUKS-{uuid}.log exists, resuming reencryption.")
            }
            ReencryptNotice::Luks1HeaderBackup if self.opts.verbose => {
                eprintln!("LUKS1 header backup of device {device} created.")
            }
            ReencryptNotice::Luks1NewHeader if self.opts.verbose => {
                eprintln!("New LUKS header for device {device} created.")
            }
            ReencryptNotice::Luks1MarkedUnusable if self.opts.verbose => {
                eprintln!("Marking LUKS1 device {device} unusable.")
            }
            _ => {}
        }
    }
}

/// `--type` as the library wants it (see [`ReencryptRequest::luks_type`]).
pub(super) fn luks_type(opts: &Opts) -> Option<LuksType> {
    match opts.volume_type {
        None | Some(VolumeType::Luks) => Some(LuksType::Any),
        Some(VolumeType::Luks1) => Some(LuksType::Luks1),
        Some(VolumeType::Luks2) => Some(LuksType::Luks2),
        Some(_) => None,
    }
}

/// The request the options make.
fn request(opts: &Opts, device: Option<&Path>, a: &ReencryptArgs) -> ReencryptRequest {
    ReencryptRequest {
        device: device.map(Path::to_path_buf),
        active_name: a.active_name.clone(),
        header: opts.header.clone(),
        luks_type: luks_type(opts),
        encrypt: a.encrypt,
        decrypt: a.decrypt,
        init_only: a.init_only,
        resume_only: a.resume_only,
        force_offline: a.force_offline_reencrypt,
        // In bytes, so the library need not know cryptsetup's suffixes (`1024S`, `2MiB`).
        reduce_device_size: a.reduce_device_size.as_deref().map(|v| {
            crate::args_check::parse_size(v).map_or_else(|| v.to_string(), |n| n.to_string())
        }),
        hotzone_size: a.hotzone_size.clone(),
        resilience: match a.resilience {
            None | Some(ResilienceArg::Checksum) => ResilienceChoice::Checksum,
            Some(ResilienceArg::Journal) => ResilienceChoice::Journal,
            Some(ResilienceArg::None) => ResilienceChoice::None,
        },
        resilience_hash: a.resilience_hash.clone(),
        cipher: opts.cipher.clone(),
        key_size_bits: opts.key_size,
        sector_size: opts.sector_size,
        key_slot: opts.key_slot.map(|s| s as usize),
        pbkdf_chosen: opts.pbkdf.is_some()
            || opts.hash.is_some()
            || opts.pbkdf_force_iterations.is_some()
            || opts.iter_time.is_some(),
        block_size_mib: a.block_size,
        keep_key: a.keep_key,
        disable_blkid: opts.compat.disable_blkid,
    }
}

/// The JSON line `--json` prints for an offline run (or an online `--init-only`).
fn summary(device: &Path, status: &str, out: &RunOutcome, init: Option<&InitOutcome>) {
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

/// `reencrypt [DEVICE]`: online through its daemon when a cryptblk daemon serves the
/// volume (unless `--force-offline-reencrypt`), else offline.
pub fn reencrypt_action(opts: &Opts, device: Option<&Path>, a: &ReencryptArgs) -> ActionResult {
    let req = request(opts, device, a);
    // Notices name the device (a LUKS1 run's); an online run names none.
    let notice_device = device.unwrap_or(Path::new(""));
    let mut input = CliInput {
        opts,
        device: notice_device,
    };
    let mut bar = Bar::for_action(opts, Dest::Stdout, &notice_device.display().to_string());
    match reencrypt::reencrypt(&req, &mut input, &mut bar)? {
        ReencryptOutcome::Initialized { device, init } => {
            if opts.json {
                summary(
                    &device,
                    "initialized",
                    &RunOutcome::default(),
                    init.as_ref(),
                );
            }
        }
        ReencryptOutcome::Finished { device, run, init } => {
            if opts.json {
                summary(&device, "finished", &run, init.as_ref());
            }
        }
        ReencryptOutcome::HandedToDaemon { name, header } => {
            let end =
                reencrypt::wait_online(&name, &mut Bar::for_action(opts, Dest::Stdout, &name))?;
            if opts.json {
                let p = &end.progress;
                let v = serde_json::json!({
                    "device": header.display().to_string(),
                    "name": name,
                    "online": true,
                    "status": "finished",
                    "data_size": p.total,
                    "bytes": p.total.saturating_sub(end.first),
                    "steps": p.steps,
                    "hotzone_size": p.hotzone,
                });
                println!("{v}");
            }
        }
    }
    Ok(())
}
