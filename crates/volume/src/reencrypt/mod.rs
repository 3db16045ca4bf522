//! LUKS2 reencryption as cryptsetup 2.6 does it, in small parts:
//!
//! - [`state`]: the reencryption a header describes, read from its `reencrypt` keyslot and
//!   segments: which data lies under the old key, which under the new one, and the hotzone
//!   between them;
//! - [`keys`]: unlocking both volume keys with one passphrase;
//! - [`recovery`]: the hotzone's state after a crash, decided from its resilience data
//!   (checksums or journal in the keyslot area) the way cryptsetup's recovery decides it;
//! - [`read`]: reading the plaintext of a volume mid-reencryption without changing it;
//! - [`repair`]: recovery written back (`repair`): the hotzone rewritten under the new key
//!   and the header of a finished step;
//! - [`init`]: starting a re-key (new keyslots, the reencryption metadata);
//! - [`encdec`]: starting an encryption (datashift or detached header) or a decryption
//!   (detached header) in place;
//! - [`run`]: running or resuming any of them step by step, forward or backward, with the
//!   header on the data device or detached;
//! - [`online`]: any of them (forward or backward, header attached or detached) run in a
//!   daemon while the volume is served, and the table that serves a volume
//!   mid-reencryption;
//! - [`request`], [`operate`], [`handoff`], [`activate`]: the orchestration of a
//!   `reencrypt` action as cryptsetup runs it: a [`ReencryptRequest`] (the options) carried
//!   out by [`operate::reencrypt`] (which run: re-key, `--encrypt`, `--decrypt`, resume,
//!   LUKS1; the `--init-only`/`--resume-only` checks; online through the serving daemon
//!   or offline), with secrets and prompts from the caller's [`ReencryptInput`]; and
//!   [`activate::mid_reencryption_plan`], the recovery-then-plan of `open` mid-reencryption.
//!
//! A decryption that exports an attached header starts offline with
//! [`init_decrypt_export`] and online with [`online::start_decrypt_export`].

pub mod activate;
pub mod encdec;
pub mod handoff;
pub mod init;
pub mod keys;
pub mod luks1;
pub mod online;
pub mod operate;
pub mod read;
pub mod recovery;
pub mod repair;
pub mod request;
pub mod run;
mod start;
pub mod state;

pub use encdec::{
    init_decrypt, init_decrypt_export, init_encrypt, DecryptResilience, EncryptParams,
};
pub use init::{init, InitOutcome, InitParams, ResilienceChoice};
pub use keys::{unlock_keys, ReencryptKeys};
pub use online::{
    start_decrypt_export, ExportRequest, OnlineJob, OnlineRequest, ReencryptProgress, RunState,
};
pub use operate::{offline_mode, reencrypt, wait_online};
pub use read::read_plaintext;
pub use repair::recover_hotzone;
pub use request::{
    Mode, OnlineFinish, ReencryptInput, ReencryptNotice, ReencryptOutcome, ReencryptRequest,
    TokenUse,
};
pub use run::{run, run_split, RunOptions, RunOutcome};
pub use state::{ReencryptState, Side, StateSegment};
