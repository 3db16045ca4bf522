//! Upgrading a served volume's daemon (`cryptblk upgrade`): the running daemon hands the
//! volume over to a successor process running another binary, without the block device
//! going away and without failing a request.
//!
//! NBD and vhost-user: the daemon stops its export with
//! [`Export::hand_over`](cryptblk_export::Export) (NBD stops accepting and closes its
//! connections, whose clients reconnect; vhost-user closes so its frontend reconnects),
//! flushes, gives up its data locks and starts the successor through the embedder's
//! [`Successor`] with a [`Handover`]: the spec with the live tables (keys included), and the
//! listening sockets (the export's and every control socket) to inherit. Once the successor
//! reports that it serves ([`Succession::Serving`]), the old daemon answers `Done` and exits
//! without touching the volume again. If the successor fails (or never reports), the old
//! daemon takes its locks again, restarts its export on the listener it kept and serves on,
//! and the request is refused with the successor's reason.
//!
//! ublk: the kernel lets a new server start user recovery of `/dev/ublkbN` only once the old
//! one has closed `/dev/ublkcN`, i.e. exited (before Linux 6.15's `QUIESCE_DEV`), so the old
//! daemon cannot wait for its successor to serve. It flushes, holds new I/O (the top mapping
//! is suspended: requests wait in the kernel's queue and this process's queue threads),
//! marks the device handed over ([`Export::prepare_hand_over`](cryptblk_export::Export)),
//! gives up its locks and starts the successor, handing it the `upgrade` request's
//! connection too ([`HandedFd::Requester`]). The successor builds the stack (takes the
//! locks, loads the tables) and says it is taking over ([`Succession::TakingOver`]); only
//! then the old daemon exits without answering, the kernel quiesces the device (requests in
//! flight are reissued), the successor recovers the same device and answers the request.
//! Should the successor fail before it takes over, the old daemon withdraws the mark,
//! resumes and serves on, as for the other exports. Should it fail after (or die), nothing
//! serves the device: it stays, its I/O waits, and the same `open` takes it over (the
//! answer, or its absence, says so). That is the trade-off against NBD and vhost-user,
//! where the old daemon can always serve on.
//!
//! Invariants: the key only crosses to the successor through what the embedder's
//! [`Successor`] uses (the `cryptblk` binary: a pipe only the two processes share), never
//! a file, argument or environment variable. FUSE cannot be handed over (the mount dies
//! with its process) and is refused before anything stops; so are a suspended stack (its
//! key is wiped) and one being reencrypted.

use super::facts::ReadyFacts;
use super::spec::{LowerTable, ServeSpec};
use crate::{ErrorClass as ExitCode, VolumeError as Failure};
use cryptblk_export::handover::sockopt;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

/// What a listening socket handed to a successor is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HandedFd {
    /// The export's listener (NBD).
    Export,
    /// The control socket of the named mapping.
    Control(String),
    /// The connection of the `upgrade` request, which the successor answers when its
    /// predecessor must exit before it can take the export over (ublk).
    Requester,
}

/// What a successor reported, as [`Successor`] returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Succession {
    /// It serves: its facts.
    Serving(ReadyFacts),
    /// It holds the stack (locks taken, tables loaded) and takes the export over once this
    /// process has exited; it answers the `upgrade` request itself.
    TakingOver,
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
/// facts), says it takes over once this process has exited, or failed (why, one line).
/// Provided by the program that embeds the daemon (process handling is its business); the
/// `cryptblk` binary runs `BINARY __serve`.
pub type Successor<'a> = &'a dyn Fn(Handover) -> Result<Succession, Failure>;

/// Called by a successor once it holds the stack and is about to take a ublk device over
/// (its predecessor exits on hearing it): the `cryptblk` binary prints `TAKING`.
pub type TakeOverHook = Box<dyn FnOnce() + Send>;

/// The listening sockets a successor inherited from its predecessor (none for a daemon
/// started by `open`).
#[derive(Default)]
pub struct Inherited {
    pub(super) export: Option<OwnedFd>,
    pub(super) control: HashMap<String, UnixListener>,
    /// The `upgrade` request's connection, when this process answers it.
    pub(super) requester: Option<UnixStream>,
    /// Tells the predecessor this process takes over (see [`TakeOverHook`]).
    pub(super) on_take_over: Option<TakeOverHook>,
}

impl Inherited {
    /// Nothing inherited.
    pub fn none() -> Inherited {
        Inherited::default()
    }

    /// The sockets `fds` (what each is for, the descriptor), checked to be listening
    /// stream sockets (a control socket a Unix one), or, for the requester, a connected
    /// Unix one.
    pub fn new(fds: Vec<(HandedFd, OwnedFd)>) -> Result<Inherited, Failure> {
        let mut inherited = Inherited::default();
        for (what, fd) in fds {
            let domain = sockopt(&fd, libc::SO_DOMAIN);
            let listening = sockopt(&fd, libc::SO_ACCEPTCONN) == Some(1);
            if what == HandedFd::Requester {
                if listening || domain != Some(libc::AF_UNIX) {
                    return Err(Failure::usage(format!(
                        "inherited descriptor {} for the upgrade request is not a connected Unix socket",
                        fd.as_raw_fd()
                    )));
                }
                inherited.requester = Some(UnixStream::from(fd));
                continue;
            }
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
                HandedFd::Requester => unreachable!("taken above"),
            }
        }
        Ok(inherited)
    }

    /// Sets what tells the predecessor that this process takes its ublk device over (used
    /// only when the `upgrade` request's connection was inherited).
    pub fn on_take_over(&mut self, hook: TakeOverHook) {
        self.on_take_over = Some(hook);
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
    use cryptblk_export::{ExportDescription, FuseDescription, UblkDescription};

    /// A ublk volume is upgraded (its successor takes the device over once the old daemon
    /// has exited), no longer refused; FUSE still is, with the reason.
    #[test]
    fn ublk_is_upgraded_and_fuse_refused() {
        let ublk = ExportDescription::Ublk(UblkDescription {
            dev: "/dev/ublkb3".into(),
            queues: 2,
            depth: 128,
        });
        assert!(refusal("data", &ublk, false, false).is_none());
        let suspended = refusal("data", &ublk, true, false).expect("suspended is refused");
        assert!(
            format!("{suspended:?}").contains("suspended"),
            "{suspended:?}"
        );
        let fuse = ExportDescription::Fuse(FuseDescription {
            file: "/mnt/x/data".into(),
        });
        let failure = refusal("data", &fuse, false, false).expect("FUSE is refused");
        assert!(format!("{failure:?}").contains("FUSE"), "{failure:?}");
    }
}
