//! Upgrading a served volume's daemon (`cryptblk upgrade`): the running daemon hands the
//! volume over to a successor process running another binary, without the block device
//! going away and without failing a request.
//!
//! The daemon stops its export with [`Export::hand_over`](cryptblk_export::Export) (NBD
//! stops accepting and closes its connections, whose clients reconnect; vhost-user closes
//! so its frontend reconnects; ublk keeps its device for user recovery), flushes, gives up
//! its data locks and starts the successor through the embedder's [`Successor`] with a
//! [`Handover`]: the spec with the live tables (keys included), and the listening sockets
//! (the export's and every control socket) to inherit. Once the successor reports that it
//! serves, the old daemon answers `Done` and exits without touching the volume again.
//!
//! Invariants: the key only crosses to the successor through what the embedder's
//! [`Successor`] uses (the `cryptblk` binary: a pipe only the two processes share), never
//! a file, argument or environment variable; if the successor fails (or never reports),
//! the old daemon takes its locks again, restarts its export on the listener it kept and
//! serves on, and the request is refused with the successor's reason. FUSE cannot be
//! handed over (the mount dies with its process) and is refused before anything stops; so
//! are a suspended stack (its key is wiped) and one being reencrypted.

use super::facts::ReadyFacts;
use super::spec::{LowerTable, ServeSpec};
use crate::{ErrorClass as ExitCode, VolumeError as Failure};
use cryptblk_export::handover::sockopt;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

/// What a listening socket handed to a successor is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HandedFd {
    /// The export's listener (NBD).
    Export,
    /// The control socket of the named mapping.
    Control(String),
}

/// Everything a successor needs to take a served stack over. Holds key material (the
/// tables): it goes to the successor only through a channel only the two share.
pub struct Handover {
    /// The stack's top mapping, its live table (keys included), export and facts.
    pub spec: ServeSpec,
    /// The keyed lower tables (keyless ones travel in `spec.info`).
    pub lower: Vec<LowerTable>,
    /// The program the successor runs.
    pub binary: PathBuf,
    /// The listening sockets the successor inherits, in the order it is told about them.
    pub fds: Vec<(HandedFd, OwnedFd)>,
}

/// Starts the successor of a daemon with the handover and waits until it serves (its
/// facts) or failed (why, one line). Provided by the program that embeds the daemon
/// (process handling is its business); the `cryptblk` binary runs `BINARY __serve`.
pub type Successor<'a> = &'a dyn Fn(Handover) -> Result<ReadyFacts, Failure>;

/// The listening sockets a successor inherited from its predecessor (none for a daemon
/// started by `open`).
#[derive(Default)]
pub struct Inherited {
    pub(super) export: Option<OwnedFd>,
    pub(super) control: HashMap<String, UnixListener>,
}

impl Inherited {
    /// Nothing inherited.
    pub fn none() -> Inherited {
        Inherited::default()
    }

    /// The sockets `fds` (what each is for, the descriptor), checked to be listening
    /// stream sockets; a control socket must be a Unix one.
    pub fn new(fds: Vec<(HandedFd, OwnedFd)>) -> Result<Inherited, Failure> {
        let mut inherited = Inherited::default();
        for (what, fd) in fds {
            let domain = sockopt(&fd, libc::SO_DOMAIN);
            let listening = sockopt(&fd, libc::SO_ACCEPTCONN) == Some(1);
            if !listening || (matches!(what, HandedFd::Control(_)) && domain != Some(libc::AF_UNIX))
            {
                return Err(Failure::usage(format!(
                    "inherited descriptor {} for {what:?} is not a listening socket",
                    fd.as_raw_fd()
                )));
            }
            match what {
                HandedFd::Export => inherited.export = Some(fd),
                HandedFd::Control(name) => {
                    inherited.control.insert(name, UnixListener::from(fd));
                }
            }
        }
        Ok(inherited)
    }

    /// True when the control socket of `name` is inherited (it answers already: the
    /// predecessor's listener, in whose backlog requests wait).
    pub(super) fn has_control(&self, name: &str) -> bool {
        self.control.contains_key(name)
    }
}

/// Why an upgrade is refused before anything stops, if it is: the export cannot be handed
/// over (FUSE), or the stack is not in a state a successor can take (suspended: its key
/// is wiped; reencrypting: the run's state lives in this process).
pub(super) fn refusal(
    name: &str,
    export: &cryptblk_export::ExportDescription,
    suspended: bool,
    reencrypting: bool,
) -> Option<Failure> {
    if matches!(export, cryptblk_export::ExportDescription::Fuse(_)) {
        return Some(Failure::usage(format!(
            "{name} is served over FUSE, which cannot outlive its daemon: close and reopen it to change binaries"
        )));
    }
    // A ublk device can only be taken over (START_USER_RECOVERY) once the old server has let
    // go of /dev/ublkcN, i.e. has exited (before Linux 6.15's QUIESCE_DEV), while this hand-over
    // keeps the old daemon serving until its successor is ready: the two would wait on each
    // other. A restart keeps the disk instead (user recovery), so say that.
    if matches!(export, cryptblk_export::ExportDescription::Ublk(_)) {
        return Some(Failure::usage(format!(
            "{name} is served over ublk, whose device a successor can take over only after the daemon has exited: restart it instead (kill the daemon or `systemctl restart`, then the same open; the disk stays and its I/O waits)"
        )));
    }
    if suspended {
        return Some(Failure::new(
            ExitCode::Busy,
            format!("Volume {name} is suspended; resume it before upgrading."),
        ));
    }
    if reencrypting {
        return Some(Failure::new(
            ExitCode::Busy,
            format!("Device {name} is being reencrypted; upgrade once it is done."),
        ));
    }
    None
}

#[cfg(test)]
mod refusal_tests {
    use super::refusal;
    use cryptblk_export::{ExportDescription, UblkDescription};

    /// A ublk volume is refused (its successor could not take the device over while the old
    /// daemon waits for it), with the restart that keeps the disk named.
    #[test]
    fn ublk_is_refused_with_the_restart_named() {
        let ublk = ExportDescription::Ublk(UblkDescription {
            dev: "/dev/ublkb3".into(),
            queues: 2,
            depth: 128,
        });
        let failure = refusal("data", &ublk, false, false).expect("ublk is refused");
        let text = format!("{failure:?}");
        assert!(text.contains("restart it instead"), "{text}");
    }
}
