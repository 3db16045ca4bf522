//! cryptsetup's `--persistent`: activation flags stored in the LUKS2 header
//! (`config.flags`) and used by every later activation.
//!
//! cryptsetup's rules, which these helpers follow:
//! - an activation uses the flags given on the command line plus the stored ones, except
//!   with `--persistent`, which uses only the given ones;
//! - after a successful `open`/`refresh --persistent`, the stored set is *replaced* by the
//!   given flags (no flag given: the stored set is cleared);
//! - only `--allow-discards`, the four `--perf-*` flags and `--integrity-no-journal` can be
//!   stored; `--persistent` with `--test-passphrase` is refused before anything else;
//! - a volume that is not LUKS2 is activated anyway, and the failure to store is reported
//!   on standard error with exit status 0.

use crate::actions::volume;
use crate::args::{Opts, PerfArgs};
use crate::exit::Failure;
use cryptblk_volume::activation as lib;
use std::path::Path;

/// The activation flags of one open or refresh, as the command line holds them.
#[derive(Clone, Debug, Default)]
pub struct Activation {
    /// The dm-crypt flags (`--perf-queued` only ever from the command line).
    pub perf: PerfArgs,
    /// dm-integrity without a journal (`--integrity-no-journal`, stored as `no-journal`).
    pub no_journal: bool,
}

impl Activation {
    /// The flags given on the command line.
    pub fn given(opts: &Opts, perf: &PerfArgs) -> Self {
        Activation {
            perf: perf.clone(),
            no_journal: opts.integrity.integrity_no_journal,
        }
    }

    /// These flags as the library's activation flags.
    pub fn library(&self) -> lib::Activation {
        lib::Activation {
            crypt: self.perf.activation(),
            no_journal: self.no_journal,
        }
    }

    fn from_lib(a: &lib::Activation) -> Self {
        Activation {
            perf: PerfArgs::from_activation(&a.crypt),
            no_journal: a.no_journal,
        }
    }
}

/// Refuses option combinations cryptsetup refuses, and `--perf-queued`, which no header
/// flag can express. Runs before any passphrase is asked.
pub fn check_options(opts: &Opts, perf: &PerfArgs) -> Result<(), Failure> {
    lib::check_persistent(opts.persistent, opts.test_passphrase, perf.queued)
}

/// The flags an activation of a volume whose header stores `stored` uses; stored flags this
/// build does not know are named with -v, as cryptsetup does.
pub fn effective(opts: &Opts, perf: &PerfArgs, stored: &[String]) -> Activation {
    let given = Activation::given(opts, perf).library();
    let (used, unknown) = lib::Activation::effective(&given, opts.persistent, stored);
    if opts.verbose {
        for flag in unknown {
            eprintln!("Ignored unknown flag {flag}.");
        }
    }
    Activation::from_lib(&used)
}

/// After a successful activation with `--persistent`: replaces the flags stored in the
/// header of `device` (or `--header`) by `given`. `uuid` is the volume that was activated.
/// Never fails the action (the device is active): problems are reported as cryptsetup
/// reports them, on standard error.
pub fn store(opts: &Opts, device: &Path, uuid: &str, given: &Activation) {
    if !opts.persistent {
        return;
    }
    if let Err(e) = lib::store_flags(volume::header_path(opts, device), uuid, &given.library()) {
        if !e.message.is_empty() {
            eprintln!("{}", e.message);
        }
        eprintln!("Device activated but cannot make flags persistent.");
    }
}
