//! What a daemon serves: the [`ServeSpec`] (the top table, keys included, its export and
//! the facts `status` shows) and the keyed lower tables of a stack ([`LowerTable`]).
//!
//! Invariants: a table with keys crosses a process boundary only through a pipe, serialised
//! line by line (see `table_lines`), and is wiped when its holder drops; `info` never holds
//! a secret. The names of a stack are checked ([`check_stack`]) before anything is built.

use crate::control as client;
use crate::facts::VolumeFacts;
use crate::plan::ActivationPlan;
use crate::{ErrorClass as ExitCode, VolumeError as Failure};
use cryptblk_export::ExportConfig;
use serde::{Deserialize, Serialize};
use std::os::unix::net::UnixStream;

/// Everything the daemon needs. Contains key material: only ever sent through a pipe.
#[derive(Serialize, Deserialize)]
pub struct ServeSpec {
    /// Mapping name.
    pub name: String,
    /// The dm table, keys included.
    #[serde(with = "table_lines")]
    pub table: String,
    /// The export.
    pub export: ExportConfig,
    /// Serve read-only.
    pub readonly: bool,
    /// Facts for `status` (volume type, device, UUID, cipher...) and the keyless lower
    /// tables: never secrets.
    pub info: VolumeFacts,
}

impl Drop for ServeSpec {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.table);
    }
}

/// A lower mapping of a stack that one daemon serves (`dm create --lower`): created before
/// the top table, which names it as `NAME` or `/dev/mapper/NAME`. Its table may hold keys
/// (an integrity line's `internal_hash:hmac(..):<key>`, a crypt line under another), so it
/// travels like [`ServeSpec::table`], only through the daemon's pipe, and `status` never
/// shows it (unlike the keyless `info.lower` tables of a LUKS2 `--integrity` open).
#[derive(Serialize, Deserialize)]
pub struct LowerTable {
    /// Mapping name.
    pub name: String,
    /// The dm table, keys included.
    #[serde(with = "table_lines")]
    pub table: String,
}

/// A table with keys crosses the pipe as a JSON array of its lines rather than one string:
/// the newlines between lines would be JSON escapes, and serde_json unescapes a string in a
/// scratch buffer that it frees without wiping, which would leave a copy of the key on the
/// daemon's heap for the daemon's lifetime (and so after a `luksSuspend` key wipe). Lines
/// hold no escapes (unless a path has a quote or backslash), so each is copied once, exactly
/// sized, and wiped here after joining.
mod table_lines {
    use serde::{Deserialize, Deserializer, Serializer};
    use zeroize::Zeroize;

    pub fn serialize<S: Serializer>(table: &str, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(table.lines())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        let mut lines = Vec::<String>::deserialize(d)?;
        let len = lines.iter().map(|l| l.len() + 1).sum();
        let mut table = String::with_capacity(len);
        for l in &mut lines {
            table.push_str(l);
            table.push('\n');
            l.zeroize();
        }
        Ok(table)
    }
}

impl Drop for LowerTable {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.table);
    }
}

impl ServeSpec {
    /// What a daemon serves for an activation `plan`, exported as `export` (read-only when
    /// `readonly`), with the plan's keyed lower mappings (a TCRYPT chain's layers) to create
    /// first in the same daemon.
    pub fn from_plan(
        mut plan: ActivationPlan,
        export: ExportConfig,
        readonly: bool,
    ) -> (ServeSpec, Vec<LowerTable>) {
        let lower = std::mem::take(&mut plan.keyed_lower)
            .into_iter()
            .map(|l| LowerTable {
                name: l.name,
                table: l.table.to_string(),
            })
            .collect();
        let spec = ServeSpec {
            name: plan.name.clone(),
            table: plan.table.to_string(),
            export,
            readonly,
            info: plan.info.clone(),
        };
        (spec, lower)
    }
}

/// Refuses a stack whose names are invalid or clash (see `check_stack_names`) before a
/// daemon is started or a stack built.
pub fn check_stack(spec: &ServeSpec, secret_lower: &[LowerTable]) -> Result<(), Failure> {
    check_stack_names(&spec.name, &lower_names(spec, secret_lower), &|_| false)
}

/// [`check_stack`] for a successor (`upgrade`): the mappings whose control sockets it
/// inherits (`taken_over`) answer already, from its predecessor.
pub(super) fn check_stack_taken_over(
    spec: &ServeSpec,
    secret_lower: &[LowerTable],
    taken_over: &dyn Fn(&str) -> bool,
) -> Result<(), Failure> {
    check_stack_names(&spec.name, &lower_names(spec, secret_lower), taken_over)
}

/// Names of every lower mapping of `spec`'s stack, in creation order.
pub(super) fn lower_names(spec: &ServeSpec, secret_lower: &[LowerTable]) -> Vec<String> {
    spec.info
        .lower
        .iter()
        .map(|l| l.name.clone())
        .chain(secret_lower.iter().map(|l| l.name.clone()))
        .collect()
}

/// Refuses a stack whose names clash among themselves (usage) or with a mapping another
/// daemon serves (busy, as cryptsetup's "Device ... already exists.").
fn check_stack_names(
    top: &str,
    lower: &[String],
    taken_over: &dyn Fn(&str) -> bool,
) -> Result<(), Failure> {
    for (i, name) in lower.iter().enumerate() {
        client::check_name(name)?;
        if name == top {
            return Err(Failure::usage(format!(
                "lower mapping '{name}' has the name of the mapping it is under"
            )));
        }
        if lower[..i].contains(name) {
            return Err(Failure::usage(format!(
                "lower mapping '{name}' is given twice"
            )));
        }
    }
    for name in std::iter::once(top).chain(lower.iter().map(String::as_str)) {
        if !taken_over(name) && UnixStream::connect(client::socket_path(name)?).is_ok() {
            return Err(Failure::new(
                ExitCode::Busy,
                format!("Device {name} already exists."),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cryptblk_export::nbd::{NbdConfig, NbdTls};

    /// The export config crosses the pipe as settings: TLS certificates by directory, the
    /// table line by line, and it comes back as it went.
    #[test]
    fn a_spec_crosses_the_pipe_as_settings() {
        let mut nbd = NbdConfig::unix("/run/x.sock");
        nbd.tls = Some(NbdTls::new("/etc/pki/nbd", true, false));
        nbd.description = "cryptblk x".to_string();
        let spec = ServeSpec {
            name: "x".to_string(),
            table: "0 8 linear /dev/null 0\n".to_string(),
            export: ExportConfig::Nbd(nbd),
            readonly: true,
            info: VolumeFacts::of_kind("dm"),
        };
        let text = serde_json::to_string(&spec).unwrap();
        assert!(
            text.contains(r#""table":["0 8 linear /dev/null 0"]"#),
            "{text}"
        );
        assert!(text.contains(r#""certificates":"/etc/pki/nbd""#), "{text}");
        let back: ServeSpec = serde_json::from_str(&text).unwrap();
        let ExportConfig::Nbd(n) = &back.export else {
            panic!("{:?}", back.export)
        };
        let tls = n.tls.as_ref().expect("TLS kept");
        assert_eq!(tls.certificates, std::path::Path::new("/etc/pki/nbd"));
        assert!(tls.require && !tls.verify_peer);
        assert_eq!(n.description, "cryptblk x");
        assert_eq!(back.table, spec.table);
        assert!(back.readonly);
    }
}
