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

use crate::actions::volume::{self, Volume};
use crate::args::{Opts, PerfArgs};
use crate::exit::Failure;
use cryptblk_format::luks2::PERSISTENT_FLAGS;
use std::path::Path;

/// The activation flags of one open or refresh, in the header's vocabulary.
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

    /// The header names of these flags, as cryptsetup stores them.
    pub fn names(&self) -> Vec<&'static str> {
        let p = &self.perf;
        let set = [
            p.allow_discards,
            p.same_cpu_crypt,
            p.submit_from_crypt_cpus,
            self.no_journal,
            p.no_read_workqueue,
            p.no_write_workqueue,
        ];
        PERSISTENT_FLAGS
            .iter()
            .zip(set)
            .filter(|(_, on)| *on)
            .map(|(name, _)| *name)
            .collect()
    }

    /// These flags plus the stored `names`; unknown names are skipped (named with -v, as
    /// cryptsetup does), so a newer cryptsetup's flag never blocks an open.
    pub fn with_stored(mut self, names: &[String], verbose: bool) -> Self {
        for n in names {
            let p = &mut self.perf;
            match n.as_str() {
                "allow-discards" => p.allow_discards = true,
                "same-cpu-crypt" => p.same_cpu_crypt = true,
                "submit-from-crypt-cpus" => p.submit_from_crypt_cpus = true,
                "no-read-workqueue" => p.no_read_workqueue = true,
                "no-write-workqueue" => p.no_write_workqueue = true,
                "no-journal" => self.no_journal = true,
                other if verbose => eprintln!("Ignored unknown flag {other}."),
                _ => {}
            }
        }
        self
    }
}

/// Refuses option combinations cryptsetup refuses, and `--perf-queued`, which no header
/// flag can express (storing the empty set would bring back cryptblk's inline default, not
/// the queued model asked for). Runs before any passphrase is asked.
pub fn check_options(opts: &Opts, perf: &PerfArgs) -> Result<(), Failure> {
    if !opts.persistent {
        return Ok(());
    }
    if opts.test_passphrase {
        return Err(Failure::usage(
            "Option --persistent is not allowed with --test-passphrase.",
        ));
    }
    if perf.queued {
        return Err(Failure::usage(
            "Option --perf-queued cannot be stored with --persistent (LUKS2 has no flag for \
             the queued model).",
        ));
    }
    Ok(())
}

/// The flags an activation of a volume whose header stores `stored` uses.
pub fn effective(opts: &Opts, perf: &PerfArgs, stored: &[String]) -> Activation {
    let given = Activation::given(opts, perf);
    if opts.persistent {
        given
    } else {
        given.with_stored(stored, opts.verbose)
    }
}

/// After a successful activation with `--persistent`: replaces the flags stored in the
/// header of `device` (or `--header`) by `given`, through the same crash-safe update as the
/// keyslot actions (both copies, seqid + 1). `uuid` is the volume that was activated: a
/// header that changed identity meanwhile is left alone. Never fails the action (the device
/// is active): problems are reported as cryptsetup reports them, on standard error.
pub fn store(opts: &Opts, device: &Path, uuid: &str, given: &Activation) {
    if !opts.persistent {
        return;
    }
    if let Err(e) = try_store(opts, device, uuid, given) {
        if !e.message.is_empty() {
            eprintln!("{}", e.message);
        }
        eprintln!("Device activated but cannot make flags persistent.");
    }
}

fn try_store(opts: &Opts, device: &Path, uuid: &str, given: &Activation) -> Result<(), Failure> {
    match Volume::load(opts, device, true)? {
        Volume::Luks1(_) => Err(Failure::usage(
            "This operation is supported only for LUKS2 device.",
        )),
        Volume::Luks2(mut h, f) => {
            if h.uuid() != uuid {
                return Err(Failure::device(format!(
                    "Header of {} no longer belongs to volume {uuid}.",
                    volume::header_path(opts, device).display()
                )));
            }
            h.set_persistent_flags(&given.names())?;
            h.write(&f)?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_cryptsetups_order_and_stored_flags_merge() {
        let a = Activation {
            perf: PerfArgs {
                no_read_workqueue: true,
                allow_discards: true,
                ..Default::default()
            },
            no_journal: true,
        };
        assert_eq!(
            a.names(),
            ["allow-discards", "no-journal", "no-read-workqueue"]
        );
        let merged =
            Activation::default().with_stored(&["same-cpu-crypt".into(), "future".into()], false);
        assert_eq!(merged.names(), ["same-cpu-crypt"]);
    }

    #[test]
    fn persistent_uses_only_the_given_flags() {
        let stored = ["allow-discards".to_string(), "no-journal".to_string()];
        let mut opts = Opts::default();
        let perf = PerfArgs {
            same_cpu_crypt: true,
            ..Default::default()
        };
        assert_eq!(
            effective(&opts, &perf, &stored).names(),
            ["allow-discards", "same-cpu-crypt", "no-journal"]
        );
        opts.persistent = true;
        assert_eq!(effective(&opts, &perf, &stored).names(), ["same-cpu-crypt"]);
        assert!(check_options(&opts, &perf).is_ok());
        opts.test_passphrase = true;
        assert!(check_options(&opts, &perf).is_err());
    }
}
