//! sd_notify(3) for `cryptblk open --foreground` under a `Type=notify` unit, through the
//! `sd-notify` crate. Every call does nothing when `NOTIFY_SOCKET` is unset, so the serving
//! code calls them unconditionally.
//!
//! Kept here, apart from the daemon, so that the serving code needs one call line at each
//! point: [`ready`] once the export accepts I/O, [`stopping`] when a close begins.

use cryptblk_volume::serve::ReadyFacts;
use sd_notify::NotifyState;
use std::time::Duration;

/// Whether a service manager listens (`NOTIFY_SOCKET` set).
pub fn enabled() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
}

/// The `STATUS=` text once serving: `Serving ` and the daemon's own one-line description
/// ([`ReadyFacts::describe`]), e.g. `Serving data at nbd+unix:///?socket=/run/data.sock`.
pub fn status_line(facts: &ReadyFacts) -> String {
    format!("Serving {}", facts.describe())
}

/// `READY=1` and `STATUS=`, and the watchdog pings when the manager asked for them
/// (`WATCHDOG_USEC`, for this process or any). Errors are reported once on stderr: a unit
/// left "activating" is the manager's to time out, the volume itself serves.
///
/// No `MAINPID=` here: the generated units either `exec` cryptblk (it is the main process
/// already) or keep the unlock shell as the main process, whose exit status is cryptblk's;
/// naming cryptblk instead would make systemd supervise a process that is not its child,
/// whose exit status it cannot collect for `Restart=on-failure`. Only an upgrade's
/// successor names itself ([`main_pid`]).
pub fn ready(facts: &ReadyFacts) {
    if !enabled() {
        return;
    }
    let status = status_line(facts);
    if let Err(e) = sd_notify::notify(false, &[NotifyState::Ready, NotifyState::Status(&status)]) {
        eprintln!("cryptblk: cannot notify the service manager: {e}");
    }
    start_watchdog();
}

/// `MAINPID=` this process: the successor of an upgraded daemon (`cryptblk upgrade` of the
/// unit's `open --foreground`) becomes the unit's main process before its predecessor
/// exits, so the unit does not see its main process end (which would stop it, or restart it
/// under `Restart=`). It is in the unit's control group (a child of the predecessor) and
/// becomes the manager's child when the predecessor exits, so its exit status is collected
/// as the old main process's was. The units set `NotifyAccess=all`, which lets it say so.
pub fn main_pid() {
    if !enabled() {
        return;
    }
    if let Err(e) = sd_notify::notify(false, &[NotifyState::MainPid(std::process::id())]) {
        eprintln!("cryptblk: cannot tell the service manager the new main process: {e}");
    }
}

/// `STOPPING=1` and a `STATUS=` line: the volume is closing.
pub fn stopping(name: &str) {
    if !enabled() {
        return;
    }
    let status = format!("Closing {name}");
    let _ = sd_notify::notify(
        false,
        &[NotifyState::Stopping, NotifyState::Status(&status)],
    );
}

/// Pings `WATCHDOG=1` at half the interval the manager set, from a thread of its own, for
/// as long as the process lives. A hung process (the whole daemon stopped, or this thread
/// starved) misses pings and the manager restarts the unit.
fn start_watchdog() {
    let Some(usec) = watchdog_usec() else {
        return;
    };
    let period = Duration::from_micros(usec / 2);
    let _ = std::thread::Builder::new()
        .name("sd-watchdog".into())
        .spawn(move || loop {
            let _ = sd_notify::notify(false, &[NotifyState::Watchdog]);
            std::thread::sleep(period);
        });
}

/// The watchdog interval asked of this process, as sd_watchdog_enabled(3): `WATCHDOG_USEC`
/// set and non-zero, and `WATCHDOG_PID` either unset or this process. (The crate's
/// `watchdog_enabled` also wants `WATCHDOG_PID` set; the unlock shell of a unit without a
/// key file unsets it because it names the shell, not the cryptblk it starts.)
fn watchdog_usec() -> Option<u64> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if usec == 0 {
        return None;
    }
    match std::env::var("WATCHDOG_PID") {
        Err(_) => Some(usec),
        Ok(_) => {
            let mut u = 0;
            sd_notify::watchdog_enabled(false, &mut u).then_some(u)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cryptblk_export::ublk::UblkDescription;
    use cryptblk_export::ExportDescription;

    #[test]
    fn status_lines_name_the_export() {
        let facts = ReadyFacts {
            name: "d".into(),
            pid: 1,
            export: ExportDescription::Ublk(UblkDescription {
                dev: "/dev/ublkb0".into(),
                queues: 1,
                depth: 64,
            }),
            lower: Vec::new(),
        };
        assert_eq!(status_line(&facts), "Serving d as /dev/ublkb0");
    }
}
