//! Activation flags: what an `open` or `refresh` asks of dm-crypt (and dm-integrity), and
//! cryptsetup's `--persistent` rules for the set stored in a LUKS2 header (`config.flags`):
//! - an activation uses the given flags plus the stored ones, except with `--persistent`,
//!   which uses only the given ones;
//! - after a successful `open`/`refresh --persistent`, the stored set is *replaced* by the
//!   given flags (none given: the stored set is cleared);
//! - only `allow-discards`, the four performance flags and `no-journal` can be stored;
//! - a volume that is not LUKS2 is activated anyway, and the failure to store is reported.

use crate::error::{Result, VolumeError};
use crate::luks::{LuksType, Volume};
use cryptblk_format::luks2::PERSISTENT_FLAGS;
use std::path::Path;

/// The dm-crypt activation flags of one open or refresh.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CryptActivation {
    /// `--allow-discards`.
    pub allow_discards: bool,
    /// `--perf-same_cpu_crypt`.
    pub same_cpu_crypt: bool,
    /// `--perf-submit_from_crypt_cpus`.
    pub submit_from_crypt_cpus: bool,
    /// `--perf-no_read_workqueue`.
    pub no_read_workqueue: bool,
    /// `--perf-no_write_workqueue`.
    pub no_write_workqueue: bool,
    /// `--perf-high_priority` (cryptsetup 2.8): the pipeline's worker threads at nice -20.
    pub high_priority: bool,
    /// `--perf-queued`: the kernel's queued model on purpose (no header flag expresses it).
    pub queued: bool,
}

impl CryptActivation {
    /// The crypt table options these flags select. With no pipeline flag at all, cryptblk's
    /// default is the inline pipeline both ways (the Cloudflare lesson); `queued` or any
    /// explicit pipeline flag gives exactly what was asked, as dm-crypt would.
    pub fn table_flags(&self) -> Vec<String> {
        let explicit = self.queued
            || self.same_cpu_crypt
            || self.submit_from_crypt_cpus
            || self.no_read_workqueue
            || self.no_write_workqueue
            || self.high_priority;
        cryptblk_dm::CryptFlags {
            allow_discards: self.allow_discards,
            same_cpu_crypt: self.same_cpu_crypt,
            submit_from_crypt_cpus: self.submit_from_crypt_cpus,
            no_read_workqueue: self.no_read_workqueue || !explicit,
            no_write_workqueue: self.no_write_workqueue || !explicit,
            high_priority: self.high_priority,
            ..Default::default()
        }
        .format()
    }
}

/// The activation flags of one open or refresh, in the header's vocabulary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Activation {
    /// The dm-crypt flags (`queued` only ever from the command line).
    pub crypt: CryptActivation,
    /// dm-integrity without a journal (`--integrity-no-journal`, stored as `no-journal`).
    pub no_journal: bool,
}

impl Activation {
    /// The header names of these flags, in cryptsetup's order.
    pub fn names(&self) -> Vec<&'static str> {
        let p = &self.crypt;
        let set = [
            p.allow_discards,
            p.same_cpu_crypt,
            p.submit_from_crypt_cpus,
            self.no_journal,
            p.no_read_workqueue,
            p.no_write_workqueue,
            p.high_priority,
        ];
        PERSISTENT_FLAGS
            .iter()
            .zip(set)
            .filter(|(_, on)| *on)
            .map(|(name, _)| *name)
            .collect()
    }

    /// These flags plus the stored `names`. Unknown names are skipped and returned, so a newer
    /// cryptsetup's flag never blocks an open (cryptsetup names them with -v).
    pub fn with_stored(mut self, names: &[String]) -> (Self, Vec<String>) {
        let mut unknown = Vec::new();
        for n in names {
            let p = &mut self.crypt;
            match n.as_str() {
                "allow-discards" => p.allow_discards = true,
                "same-cpu-crypt" => p.same_cpu_crypt = true,
                "submit-from-crypt-cpus" => p.submit_from_crypt_cpus = true,
                "no-read-workqueue" => p.no_read_workqueue = true,
                "no-write-workqueue" => p.no_write_workqueue = true,
                "high_priority" => p.high_priority = true,
                "no-journal" => self.no_journal = true,
                other => unknown.push(other.to_string()),
            }
        }
        (self, unknown)
    }

    /// The flags an activation uses: `given` alone with `persistent`, else `given` plus the
    /// `stored` ones. Also returns the stored names this build does not know.
    pub fn effective(
        given: &Activation,
        persistent: bool,
        stored: &[String],
    ) -> (Self, Vec<String>) {
        if persistent {
            (given.clone(), Vec::new())
        } else {
            given.clone().with_stored(stored)
        }
    }
}

/// Refuses `--persistent` where cryptsetup does (with `--test-passphrase`), and with
/// `--perf-queued`, which no header flag can express (storing the empty set would bring back
/// cryptblk's inline default, not the queued model asked for). Runs before any passphrase
/// is asked.
pub fn check_persistent(persistent: bool, test_passphrase: bool, queued: bool) -> Result<()> {
    if !persistent {
        return Ok(());
    }
    if test_passphrase {
        return Err(VolumeError::usage(
            "Option --persistent is not allowed with --test-passphrase.",
        ));
    }
    if queued {
        return Err(VolumeError::usage(
            "Option --perf-queued cannot be stored with --persistent (LUKS2 has no flag for \
             the queued model).",
        ));
    }
    Ok(())
}

/// Replaces the flags stored in the LUKS2 header at `header` by `given`, through the same
/// crash-safe update as the keyslot actions (both copies, seqid + 1). `uuid` is the volume
/// that was activated: a header that changed identity meanwhile is left alone.
pub fn store_flags(header: &Path, uuid: &str, given: &Activation) -> Result<()> {
    match Volume::load(header, LuksType::Any, true)? {
        Volume::Luks1(_) => Err(VolumeError::usage(
            "This operation is supported only for LUKS2 device.",
        )),
        Volume::Luks2(mut h, f) => {
            if h.uuid() != uuid {
                return Err(VolumeError::device(format!(
                    "Header of {} no longer belongs to volume {uuid}.",
                    header.display()
                )));
            }
            h.set_persistent_flags(&given.names())?;
            h.write(&f)?;
            Ok(())
        }
    }
}

/// The flags stored in the header at `header` if it belongs to volume `uuid` (an error naming
/// `name` otherwise); none for LUKS1.
pub fn stored_flags_of(header: &Path, uuid: &str, name: &str) -> Result<Vec<String>> {
    match Volume::load(header, LuksType::Any, false)? {
        Volume::Luks2(h, _) if h.uuid() == uuid => Ok(h.config_flags()),
        Volume::Luks2(..) => Err(VolumeError::device(format!(
            "Header {} does not belong to {name} (UUID {uuid}).",
            header.display()
        ))),
        Volume::Luks1(_) => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_cryptsetups_order_and_stored_flags_merge() {
        let a = Activation {
            crypt: CryptActivation {
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
        let (merged, unknown) =
            Activation::default().with_stored(&["same-cpu-crypt".into(), "future".into()]);
        assert_eq!(merged.names(), ["same-cpu-crypt"]);
        assert_eq!(unknown, ["future"]);
    }

    #[test]
    fn persistent_uses_only_the_given_flags() {
        let stored = ["allow-discards".to_string(), "no-journal".to_string()];
        let given = Activation {
            crypt: CryptActivation {
                same_cpu_crypt: true,
                ..Default::default()
            },
            no_journal: false,
        };
        assert_eq!(
            Activation::effective(&given, false, &stored).0.names(),
            ["allow-discards", "same-cpu-crypt", "no-journal"]
        );
        assert_eq!(
            Activation::effective(&given, true, &stored).0.names(),
            ["same-cpu-crypt"]
        );
        assert!(check_persistent(true, false, false).is_ok());
        assert!(check_persistent(true, true, false).is_err());
        assert!(check_persistent(true, false, true).is_err());
    }

    #[test]
    fn no_pipeline_flag_means_inline_both_ways() {
        assert_eq!(
            CryptActivation::default().table_flags(),
            ["no_read_workqueue", "no_write_workqueue"]
        );
        let queued = CryptActivation {
            queued: true,
            ..Default::default()
        };
        assert!(queued.table_flags().is_empty());
    }
}
