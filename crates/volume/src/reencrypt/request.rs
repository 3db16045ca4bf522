//! What a `reencrypt` run is asked to do and what it needs from its caller: the
//! [`ReencryptRequest`] (cryptsetup's options, as given), the [`ReencryptInput`] that supplies
//! secrets, confirmations and the settings whose parsing is the caller's, and the
//! [`ReencryptOutcome`] the caller reports. [`super::operate`] carries a request out.

use super::{InitOutcome, ReencryptProgress, ResilienceChoice, RunOutcome};
use crate::error::{Result, VolumeError};
use crate::luks::{LuksType, Volume};
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::kdf::PbkdfRequest;
use cryptblk_format::luks2::Luks2Header;
use std::path::{Path, PathBuf};

/// A `reencrypt` run as the command line asks for it. Option values that can be wrong are
/// kept as given and checked when the run needs them, so errors come in cryptsetup's order.
#[derive(Clone, Debug, Default)]
pub struct ReencryptRequest {
    /// The positional device (data device, or with `--active-name` optional).
    pub device: Option<PathBuf>,
    /// `--active-name`: the served volume to reencrypt online.
    pub active_name: Option<String>,
    /// `--header`: the detached header (a new file for `--encrypt`, or for `--decrypt`
    /// of an attached header, which is exported to it).
    pub header: Option<PathBuf>,
    /// `--type`: the LUKS version wanted; `None` when `--type` named a non-LUKS format
    /// (refused as "not a valid LUKS device").
    pub luks_type: Option<LuksType>,
    /// `--encrypt`.
    pub encrypt: bool,
    /// `--decrypt`.
    pub decrypt: bool,
    /// `--init-only`.
    pub init_only: bool,
    /// `--resume-only`.
    pub resume_only: bool,
    /// `--force-offline-reencrypt`.
    pub force_offline: bool,
    /// `--reduce-device-size`, as given.
    pub reduce_device_size: Option<String>,
    /// `--hotzone-size`, as given.
    pub hotzone_size: Option<String>,
    /// `--resilience` (checksum when not given).
    pub resilience: ResilienceChoice,
    /// `--resilience-hash`, as given (sha256 when not given).
    pub resilience_hash: Option<String>,
    /// `--cipher` of the new segment.
    pub cipher: Option<String>,
    /// `--key-size` in bits.
    pub key_size_bits: Option<u32>,
    /// `--sector-size`.
    pub sector_size: Option<u32>,
    /// `--key-slot`.
    pub key_slot: Option<usize>,
    /// True when a re-key's new keyslots get a PBKDF from the options (`--pbkdf`, `--hash`,
    /// `--pbkdf-force-iterations`, `--iter-time`) rather than the old keyslots'.
    pub pbkdf_chosen: bool,
    /// LUKS1 `--block-size` in MiB.
    pub block_size_mib: Option<u32>,
    /// LUKS1 `--keep-key`.
    pub keep_key: bool,
    /// `--disable-blkid`: no probe for broken LUKS metadata before `--encrypt`.
    pub disable_blkid: bool,
}

/// Which tokens [`ReencryptInput::tokens`] may try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenUse {
    /// Only tokens the options name (`--token-id`, `--token-type`, `--token-only`).
    Named,
    /// Any token, as `open` tries them (unless a key file is given).
    Any,
}

/// A line worth telling the user while a run goes on (the CLI prints these with
/// `--verbose`, or as cryptsetup prints them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReencryptNotice {
    /// A new keyslot was written.
    KeyslotCreated(usize),
    /// LUKS1: the run's log file (`LUKS-<uuid>.log`) exists; the run resumes.
    Luks1Resuming(String),
    /// LUKS1: the header backup file was written.
    Luks1HeaderBackup,
    /// LUKS1: the new header file was written.
    Luks1NewHeader,
    /// LUKS1: the device's header was marked unusable for the run.
    Luks1MarkedUnusable,
}

/// What a reencryption needs from its user: secrets, a confirmation, and the settings whose
/// parsing belongs to the caller (the CLI reads them from the terminal, key files and
/// options). Each is asked for only when the run needs it, in cryptsetup's order.
pub trait ReencryptInput {
    /// A passphrase (or key file contents), asked with cryptsetup's `prompt`.
    fn secret(&mut self, prompt: &str) -> Result<SecretBytes>;
    /// True when secrets come from a key file (one key, one keyslot).
    fn key_file_given(&self) -> bool;
    /// Tries the tokens of `h` that `which` allows, calling `open` with a token's secret and
    /// a keyslot it names until `open` succeeds: true then; false when none did (the caller
    /// has told the user why, or with `--token-only` returned the error).
    fn tokens(
        &mut self,
        h: &Luks2Header,
        device: &Path,
        which: TokenUse,
        open: &mut dyn FnMut(&[u8], usize) -> Result<()>,
    ) -> Result<bool>;
    /// Asks the user to confirm `question`; an error aborts the run.
    fn confirm(&mut self, question: &str) -> Result<()>;
    /// The key derivation of new keyslots (`luks1`: of a LUKS1 header).
    fn pbkdf(&mut self, luks1: bool) -> Result<PbkdfRequest>;
    /// The new volume key (`--volume-key-file`, read to `key_bytes` bytes), when given.
    fn volume_key(&mut self, key_bytes: usize) -> Result<Option<SecretBytes>>;
    /// A step worth telling the user about.
    fn notice(&mut self, notice: ReencryptNotice);
}

/// How a `reencrypt` run ended.
#[derive(Debug)]
pub enum ReencryptOutcome {
    /// `--init-only`: the reencryption metadata is written (run it with `--resume-only`).
    /// `device` is the device (offline) or header (online) the run is about; `init` the
    /// new keyslots of a re-key.
    Initialized {
        /// The device the run is about.
        device: PathBuf,
        /// The new keyslots of a re-key.
        init: Option<InitOutcome>,
    },
    /// Run to its end in this process (or found finished, LUKS1).
    Finished {
        /// The device the run is about.
        device: PathBuf,
        /// What the run did.
        run: RunOutcome,
        /// The new keyslots of a re-key started by this run.
        init: Option<InitOutcome>,
    },
    /// Handed to the daemon serving the volume, which runs it while it serves; follow it
    /// with [`super::operate::wait_online`].
    HandedToDaemon {
        /// The served volume's name.
        name: String,
        /// Its header.
        header: PathBuf,
    },
}

/// How an online run followed with [`super::operate::wait_online`] ended.
#[derive(Debug)]
pub struct OnlineFinish {
    /// The daemon's last report.
    pub progress: ReencryptProgress,
    /// Bytes already done when the wait began (a resumed run's earlier part).
    pub first: u64,
}

/// Which offline run a request becomes (see [`super::operate::offline_mode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A LUKS1 volume: cryptsetup's legacy offline re-key.
    Luks1,
    /// `--encrypt` of a plain device (new header on it, or a new detached header).
    Encrypt,
    /// `--decrypt --header NEW_FILE` of an attached header: the header is exported.
    DecryptExport,
    /// A reencryption is in progress in the header: it is resumed.
    Resume,
    /// `--decrypt` of a volume with a detached header.
    Decrypt,
    /// A re-key (new volume key, optionally new cipher, key size, sector size).
    Rekey,
}

impl ReencryptRequest {
    /// The file holding the header: `--header`, else the device.
    pub(crate) fn header_path<'a>(&'a self, device: &'a Path) -> &'a Path {
        self.header.as_deref().unwrap_or(device)
    }

    /// The `--hotzone-size` limit as cryptsetup 2.6.1's command line reads it: 0 is refused,
    /// any other size is taken in whole 512-byte sectors (rounded down), and less than one
    /// sector means no limit. Whether the limit fits the zone alignment is checked when the
    /// run starts ([`super::run::hotzone_length`]), after `--init-only` has done its work, as
    /// cryptsetup checks it when it loads the reencryption context.
    pub fn max_hotzone(&self) -> Result<Option<u64>> {
        let max_hotzone = self
            .hotzone_size
            .as_deref()
            .map(|t| crate::format::parse_bytes(t, "--hotzone-size"))
            .transpose()?;
        if max_hotzone == Some(0) {
            return Err(VolumeError::usage(
                "Invalid max reencryption hotzone size specification.",
            ));
        }
        Ok(max_hotzone.map(|n| n - n % 512).filter(|&n| n > 0))
    }

    /// `--resilience-hash` (sha256 when not given).
    pub fn resilience_hash(&self) -> Result<HashAlgorithm> {
        match &self.resilience_hash {
            Some(name) => HashAlgorithm::from_name(name).map_err(|_| {
                VolumeError::usage(format!("Hash algorithm {name} is not available."))
            }),
            None => Ok(HashAlgorithm::Sha256),
        }
    }

    /// `--key-size` in bytes.
    pub(crate) fn key_size(&self) -> Option<usize> {
        self.key_size_bits.map(|b| b as usize / 8)
    }
}

/// Loads the LUKS header at `path` as `--type` wants it (see
/// [`ReencryptRequest::luks_type`]).
pub(crate) fn load(path: &Path, want: Option<LuksType>, write: bool) -> Result<Volume> {
    match want {
        Some(t) => Volume::load(path, t, write),
        None => {
            // Validate the path first so a missing device reads as such.
            crate::device::open_file(path, write)?;
            Err(VolumeError::usage(format!(
                "Device {} is not a valid LUKS device.",
                path.display()
            )))
        }
    }
}

/// The prompt for one passphrase of `device`.
pub(crate) fn device_prompt(device: &Path) -> String {
    format!("Enter passphrase for {}: ", device.display())
}

/// The prompt for the passphrase of keyslot `slot`.
pub(crate) fn keyslot_prompt(slot: usize) -> String {
    format!("Enter passphrase for key slot {slot}: ")
}
