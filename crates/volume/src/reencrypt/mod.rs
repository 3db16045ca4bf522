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
//! - [`run`]: running or resuming a forward re-key step by step;
//! - [`online`]: the same steps in a daemon while the volume is served, and the table
//!   that serves a volume mid-reencryption.
//!
//! What is not here yet: backward direction, data shifts (`--encrypt` with
//! `--reduce-device-size`, `--decrypt`), detached headers.

pub mod init;
pub mod keys;
pub mod online;
pub mod read;
pub mod recovery;
pub mod repair;
pub mod run;
pub mod state;

pub use init::{init, InitOutcome, InitParams, ResilienceChoice};
pub use keys::{unlock_keys, ReencryptKeys};
pub use online::{OnlineJob, OnlineRequest, ReencryptProgress, RunState};
pub use read::read_plaintext;
pub use repair::recover_hotzone;
pub use run::{run, RunOptions, RunOutcome};
pub use state::{ReencryptState, Side, StateSegment};
