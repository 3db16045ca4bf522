//! The facts a daemon reports once it serves ([`ReadyFacts`]): on its `READY` line to the
//! parent that started it, printed by `open --json`, and described in the foreground.
//!
//! Invariant: these are facts about where clients find the volume, never secrets; their
//! JSON (fields in this order) is what `open --json` prints.

use cryptblk_export::ExportDescription;
use serde::{Deserialize, Serialize};

/// What a daemon reports once its export accepts I/O and its control sockets answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadyFacts {
    /// The top (exported) mapping's name.
    pub name: String,
    /// The serving process.
    pub pid: u32,
    /// Where clients find the export.
    pub export: ExportDescription,
    /// The lower mappings of the stack, in creation order.
    pub lower: Vec<String>,
}

impl ReadyFacts {
    /// One line for a person: the mapping and where its export is (`NAME at URI`,
    /// `NAME as FILE`...), as the foreground daemon announces it.
    pub fn describe(&self) -> String {
        let name = &self.name;
        match &self.export {
            ExportDescription::Nbd(n) => format!("{name} at {}", n.uri),
            ExportDescription::Fuse(f) => format!("{name} as {}", f.file.display()),
            ExportDescription::VhostUser(v) => {
                format!("{name} on vhost-user socket {}", v.socket.display())
            }
            ExportDescription::Ublk(u) => format!("{name} as {}", u.dev.display()),
            _ => name.clone(),
        }
    }
}
