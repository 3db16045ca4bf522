//! The daemon's control sockets: one for the top mapping and one per lower mapping, each
//! answering one [`Request`] per connection with one [`Response`]; and termination signals,
//! which take the same path as a `close` request.
//!
//! Invariants: a control socket is created mode 0600 from its first instant (only its owner
//! connects) and is never bound over one that answers; one request per connection, its line
//! bounded by `MAX_REQUEST_LINE`; `close` refuses while the export has users unless the
//! process is terminating (a signal arrived).

use super::stack::Stack;
use super::upgrade::{self, HandedFd, Handover, Inherited, Succession, Successor};
use crate::control::{self as client, BackingStatus, Pipeline, Request, Response, Status};
use crate::facts::{RemoteNbdFacts, VolumeFacts};
use crate::reencrypt::{ReencryptKeys, RunOptions};
use crate::{ErrorClass as ExitCode, VolumeError as Failure};
use cryptblk_cipher::{SecretBytes, SecretText};
use cryptblk_dm::{BlockDevice, CryptFlags, TableSpec};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

/// A control socket that answers for one lower mapping of the stack, so `dm table`,
/// `dm status`, `dm remove` and `dm ls` see it under its own name, as in the kernel.
struct LowerSocket {
    name: String,
    path: PathBuf,
    listener: UnixListener,
}

/// The bound control sockets of a stack.
pub(super) struct Sockets {
    top_path: PathBuf,
    top: UnixListener,
    lower: Vec<LowerSocket>,
}

impl Sockets {
    /// Binds the sockets of every lower mapping, then the top one's; on failure, removes
    /// those already bound.
    /// A socket in `inherited` (an upgrade's predecessor's) is taken as it is.
    pub(super) fn bind(
        top: &str,
        lower: &[String],
        inherited: &mut Inherited,
    ) -> Result<Sockets, Failure> {
        let mut bind_control = |name: &str| match inherited.control.remove(name) {
            Some(listener) => Ok((client::socket_path(name)?, listener)),
            None => bind_control(name),
        };
        let mut lower_sockets: Vec<LowerSocket> = Vec::new();
        let mut bound = Ok(());
        for name in lower {
            match bind_control(name) {
                Ok((path, listener)) => lower_sockets.push(LowerSocket {
                    name: name.clone(),
                    path,
                    listener,
                }),
                Err(f) => {
                    bound = Err(f);
                    break;
                }
            }
        }
        match bound.and_then(|()| bind_control(top)) {
            Ok((top_path, top)) => Ok(Sockets {
                top_path,
                top,
                lower: lower_sockets,
            }),
            Err(f) => {
                for s in &lower_sockets {
                    let _ = std::fs::remove_file(&s.path);
                }
                Err(f)
            }
        }
    }

    /// The top mapping's socket.
    pub(super) fn top_path(&self) -> &Path {
        &self.top_path
    }

    /// Copies of every listening control socket, for a successor to inherit.
    fn handed_fds(&self, top: &str) -> std::io::Result<Vec<(HandedFd, OwnedFd)>> {
        let lower = self.lower.iter().map(|s| (s.name.as_str(), &s.listener));
        let mut fds = Vec::new();
        for (name, listener) in std::iter::once((top, &self.top)).chain(lower) {
            let fd = listener.as_fd().try_clone_to_owned()?;
            fds.push((HandedFd::Control(name.to_string()), fd));
        }
        Ok(fds)
    }

    /// Removes every socket file, the top mapping's last (`close` waits for that one).
    pub(super) fn remove(self) {
        for s in &self.lower {
            let _ = std::fs::remove_file(&s.path);
        }
        let _ = std::fs::remove_file(&self.top_path);
    }
}

/// Binds the control socket of `name` (replacing a stale one nobody answers on).
fn bind_control(name: &str) -> Result<(PathBuf, UnixListener), Failure> {
    let path = client::socket_path(name)?;
    if UnixStream::connect(&path).is_ok() {
        return Err(Failure::new(
            ExitCode::Busy,
            format!("Device {name} already exists."),
        ));
    }
    let _ = std::fs::remove_file(&path);
    // Mode 0600 from the first instant (the runtime directory may be group-searchable).
    let listener = cryptblk_export::unix_socket::bind_owner_only(&path)
        .map_err(|e| Failure::device(format!("cannot bind {}: {e}", path.display())))?;
    Ok((path, listener))
}

/// Set by the signal watcher before it asks for `close`: termination closes even while the
/// volume is in use (the process is going away; refusing would only turn a flushed close
/// into a kill).
static TERMINATING: AtomicBool = AtomicBool::new(false);

/// How long `close` waits for users that are leaving before it refuses. libdevmapper retries
/// a busy removal for seconds because udev briefly opens new devices; here a client that
/// just disconnected or closed the file is counted until its export notices (milliseconds:
/// an NBD client's EOF, the kernel's asynchronous FUSE release), so a second is plenty.
const CLOSE_SETTLE: Duration = Duration::from_secs(1);

/// How often a pending `close --deferred` checks whether the last user has gone. Exports
/// count users rather than announce departures, so the control loop looks again this often.
const DEFERRED_CHECK: Duration = Duration::from_millis(100);

/// Where the control loop stands on closing the top mapping.
#[derive(Default)]
struct Closing {
    /// Closed: the loop ends after this request.
    stopping: AtomicBool,
    /// `close --deferred` is pending: closed once the volume is no longer in use.
    deferred: AtomicBool,
    /// A successor process serves the stack now: the loop ends, this process leaves the
    /// volume alone.
    handed_over: AtomicBool,
}

/// Answers requests on `sockets` until the top mapping is closed (at once, or after a
/// deferred close once its last user has gone). A lower mapping removed with `dm remove`
/// (possible once a reload of the top no longer uses it) stops answering under its name.
///
/// Returns true when the stack was handed over to a successor (`upgrade`): the caller then
/// leaves the stack and its sockets as they are.
pub(super) fn serve(stack: &Stack, sockets: &mut Sockets, successor: Option<Successor>) -> bool {
    let closing = Closing::default();
    loop {
        let wait = closing
            .deferred
            .load(Ordering::SeqCst)
            .then_some(DEFERRED_CHECK);
        // `None`: the deferred check's timeout passed (or accept failed) with no client.
        if let Ok(Some((which, stream))) = accept_next(&sockets.top, &sockets.lower, wait) {
            let target = which.map_or(stack.spec().name.as_str(), |i| {
                sockets.lower[i].name.as_str()
            });
            handle_client(stream, stack, &closing, target, sockets, successor);
            sockets.lower.retain(|s| {
                let live = stack.registry().lookup(&s.name).is_some();
                if !live {
                    let _ = std::fs::remove_file(&s.path);
                }
                live
            });
        }
        if closing.deferred.load(Ordering::SeqCst) && !in_use(stack) {
            stack.stop_reencryption();
            closing.stopping.store(true, Ordering::SeqCst);
        }
        if closing.stopping.load(Ordering::SeqCst) {
            break;
        }
    }
    closing.handed_over.load(Ordering::SeqCst)
}

/// True while closing the top mapping would pull it from under someone: its export has
/// users, or its suspend holds requests (they wait for a resume).
fn in_use(stack: &Stack) -> bool {
    stack.users() > 0
        || stack
            .registry()
            .lookup(&stack.spec().name)
            .is_some_and(|m| holds_suspended_io(&m.info()))
}

/// [`in_use`], after waiting up to [`CLOSE_SETTLE`] for users on their way out.
fn in_use_after_settling(stack: &Stack) -> bool {
    let deadline = Instant::now() + CLOSE_SETTLE;
    loop {
        if !in_use(stack) {
            return false;
        }
        if Instant::now() >= deadline {
            return true;
        }
        // Exports count their users; nothing announces the last one leaving.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for a client on the top mapping's control socket (`None`) or on the socket of
/// lower mapping `Some(i)`; `Ok(None)` when `timeout` (forever if none) passed first.
fn accept_next(
    top: &UnixListener,
    lower: &[LowerSocket],
    timeout: Option<Duration>,
) -> std::io::Result<Option<(Option<usize>, UnixStream)>> {
    use std::os::fd::AsRawFd;
    let mut fds: Vec<libc::pollfd> = std::iter::once(top.as_raw_fd())
        .chain(lower.iter().map(|s| s.listener.as_raw_fd()))
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(None);
        }
        if let Some(i) = fds.iter().position(|p| p.revents != 0) {
            let listener = if i == 0 { top } else { &lower[i - 1].listener };
            let (stream, _) = listener.accept()?;
            return Ok(Some((i.checked_sub(1), stream)));
        }
    }
}

/// Longest request line the daemon reads. The largest real request, a `reload` of a table
/// with many lines, is a few kilobytes; anything longer is refused before it is buffered, so
/// a client cannot make the daemon grow without bound.
pub(super) const MAX_REQUEST_LINE: usize = 1 << 20;

/// How long a control client may take to send its request or to read the answer.
const CLIENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why no request line could be read.
enum LineError {
    /// The connection failed or closed before a line ended.
    Io,
    /// The line reached [`MAX_REQUEST_LINE`] bytes without ending.
    TooLong,
    /// The line is not UTF-8.
    NotText,
}

/// Reads one `\n`-terminated line of at most [`MAX_REQUEST_LINE`] bytes (the newline is
/// kept). A reload line holds the table's keys, so the line goes straight into locked text;
/// the read buffer is wiped.
fn read_request_line(mut stream: &UnixStream) -> Result<SecretText, LineError> {
    let mut line = SecretText::new();
    let mut buf = Zeroizing::new([0u8; 4096]);
    // Up to 3 bytes of a character split across two reads.
    let mut carry = Zeroizing::new(Vec::with_capacity(4));
    loop {
        let n = match stream.read(&mut buf[..]) {
            Ok(0) => return Err(LineError::Io),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(LineError::Io),
        };
        let mut chunk = &buf[..n];
        // Only this connection's one line is read: a client sends nothing after it.
        let end = chunk.iter().position(|&b| b == b'\n');
        if let Some(i) = end {
            chunk = &chunk[..=i];
        }
        if line.len() + carry.len() + chunk.len() > MAX_REQUEST_LINE {
            return Err(LineError::TooLong);
        }
        let mut bytes = Zeroizing::new(Vec::with_capacity(carry.len() + chunk.len()));
        bytes.extend_from_slice(&carry);
        bytes.extend_from_slice(chunk);
        carry.clear();
        match std::str::from_utf8(&bytes) {
            Ok(s) => line.push_str(s),
            Err(e) if e.error_len().is_none() && end.is_none() => {
                let valid = e.valid_up_to();
                line.push_str(
                    std::str::from_utf8(&bytes[..valid]).map_err(|_| LineError::NotText)?,
                );
                carry.extend_from_slice(&bytes[valid..]);
            }
            Err(_) => return Err(LineError::NotText),
        }
        if end.is_some() {
            return Ok(line);
        }
    }
}

/// One request per connection, for mapping `target` (the top or a lower one): read a line,
/// answer a line.
fn handle_client(
    stream: UnixStream,
    stack: &Stack,
    closing: &Closing,
    target: &str,
    sockets: &Sockets,
    successor: Option<Successor>,
) {
    // Requests are answered one at a time, so a client that connects and then sends or reads
    // nothing must not hold every other client off: it gets this long for each.
    let _ = stream.set_read_timeout(Some(CLIENT_TIMEOUT));
    let _ = stream.set_write_timeout(Some(CLIENT_TIMEOUT));
    // The runtime directory is the owner's alone, but root (or a descriptor passed on) can
    // still reach the socket: only the owner's processes are answered, and before their
    // request is read.
    match client::peer_uid(&stream) {
        Ok(uid) if uid == client::euid() => {}
        Ok(uid) => {
            let refusal = Response::error(
                ExitCode::NoPermission,
                format!(
                    "this volume's daemon answers only uid {}, not {uid}",
                    client::euid()
                ),
            );
            let mut w = &stream;
            let _ = w.write_all(refusal.encode().as_bytes());
            return;
        }
        Err(_) => return,
    }
    let answer = match read_request_line(&stream) {
        Ok(line) => match Request::decode(&line) {
            Ok(Request::Upgrade { ref binary }) => {
                // Past the hand-over the successor owns the control socket's backlog; this
                // answer is the old daemon's last word.
                let _ = stream.set_read_timeout(None);
                match upgrade_to(binary, stack, closing, target, sockets, successor, &stream) {
                    Some(answer) => answer,
                    // The successor answers on its copy of the connection.
                    None => return,
                }
            }
            Ok(req) => answer(&req, stack, closing, target),
            Err(refusal) => refusal,
        },
        Err(LineError::Io) => return,
        Err(LineError::TooLong) => Response::error(
            ExitCode::WrongParameters,
            format!("malformed request: longer than {MAX_REQUEST_LINE} bytes"),
        ),
        Err(LineError::NotText) => Response::error(
            ExitCode::WrongParameters,
            "malformed request: not UTF-8 text",
        ),
    };
    let mut w = &stream;
    let _ = w.write_all(answer.encode().as_bytes());
    // Whatever the client still sends is dropped with the connection.
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// True while a suspended mapping holds requests (they wait for its resume).
fn holds_suspended_io(info: &cryptblk_dm::MappingInfo) -> bool {
    info.suspended && info.held > 0
}

fn answer(req: &Request, stack: &Stack, closing: &Closing, target: &str) -> Response {
    let response = answer_unlogged(req, stack, closing, target);
    // Operations that change what clients see go to the daemon's log with their outcome;
    // never a table or a message's arguments (`key set` carries the key).
    let what = match req {
        Request::Suspend => Some("suspend".to_string()),
        Request::Resume => Some("resume".to_string()),
        Request::Reload { .. } => Some("reload (table not logged)".to_string()),
        Request::Refresh { flags } => Some(format!("refresh ({})", flags.join(" "))),
        Request::Message { message, .. } => Some(format!(
            "message '{}'",
            message
                .iter()
                .take_while(|w| w.as_str() == "key" || w.as_str() == "wipe" || w.as_str() == "set")
                .cloned()
                .collect::<Vec<_>>()
                .join(" ")
        )),
        Request::Close | Request::CloseDeferred | Request::CancelDeferredClose => {
            Some(format!("{req:?}"))
        }
        _ => None,
    };
    if let Some(what) = what {
        match &response {
            Response::Error { message, .. } => log::warn!("{target}: {what} refused: {message}"),
            _ => log::info!("{target}: {what}"),
        }
    }
    response
}

/// [`answer`] without its log line.
fn answer_unlogged(req: &Request, stack: &Stack, closing: &Closing, target: &str) -> Response {
    let spec = stack.spec();
    let registry = stack.registry();
    let is_top = target == spec.name;
    if matches!(req, Request::Close) && !is_top {
        return stack.remove_lower(target);
    }
    if matches!(req, Request::CloseDeferred | Request::CancelDeferredClose) && !is_top {
        return Response::error(
            ExitCode::WrongParameters,
            format!(
                "{target} is a lower mapping of {}; deferred close applies to the volume",
                spec.name
            ),
        );
    }
    let Some(mapping) = registry.lookup(target) else {
        return Response::error(
            ExitCode::WrongDevice,
            format!("Device {target} is not active."),
        );
    };
    let dm_err =
        |e: cryptblk_dm::DmError| Response::error(ExitCode::WrongParameters, e.to_string());
    // While an online reencryption runs its thread owns the top table (and the hotzone's):
    // a reload, refresh, suspend or key message would race it.
    let changes_table = matches!(
        req,
        Request::Suspend
            | Request::Resume
            | Request::Reload { .. }
            | Request::Refresh { .. }
            | Request::Message { .. }
    );
    if changes_table && stack.reencrypting() {
        return Response::error(
            ExitCode::Busy,
            format!("Device {} is being reencrypted.", spec.name),
        );
    }
    match req {
        Request::Status => {
            let info = mapping.info();
            let table = mapping.table(false).as_str().to_owned();
            // A lower mapping is not exported; it says which mapping serves it.
            let (mut facts, export) = if is_top {
                let mut facts = spec.info.clone();
                // Served from an exported header since an online decryption began.
                if let Some(h) = stack.header() {
                    facts.header = Some(h);
                }
                (facts, stack.export_info())
            } else {
                let facts = VolumeFacts {
                    stacked_under: Some(spec.name.clone()),
                    ..VolumeFacts::of_kind("dm")
                };
                (facts, client::ExportDescription::None)
            };
            // Remote backings (nbd://...) and their failures, as counted since opening.
            facts.remote_nbd = cryptblk_dm::backing::nbd::nbd_backings()
                .into_iter()
                .map(|r| RemoteNbdFacts {
                    uri: r.uri,
                    connected: r.connected,
                    errors: r.errors,
                    reconnects: r.reconnects,
                })
                .collect();
            Response::Status(Box::new(Status {
                name: target.to_string(),
                info: facts,
                size: info.size,
                suspended: info.suspended,
                inflight: info.inflight as u64,
                held: info.held as u64,
                readonly: spec.readonly,
                pipeline: TableSpec::parse(&table)
                    .map(|t| t.crypt_pipelines())
                    .unwrap_or_default()
                    .into_iter()
                    .map(Pipeline::from)
                    .collect(),
                table,
                status: mapping.status(),
                export,
                lower: if is_top {
                    stack.lower().to_vec()
                } else {
                    Vec::new()
                },
                pid: std::process::id(),
                backings: registry
                    .backing_errors()
                    .into_iter()
                    .map(|(device, errors)| BackingStatus { device, errors })
                    .collect(),
                reencryption: if is_top {
                    stack.reencryption_progress()
                } else {
                    None
                },
                users: if is_top { stack.users() as u64 } else { 0 },
                deferred_remove: is_top && closing.deferred.load(Ordering::SeqCst),
                io: (&mapping.io_stats()).into(),
                targets: mapping.stats().iter().map(Into::into).collect(),
            }))
        }
        Request::Table { showkeys } => Response::Table(mapping.table(*showkeys)),
        // Needs the control sockets: the control loop answers it (`upgrade_to`).
        Request::Upgrade { .. } => Response::error(
            ExitCode::WrongParameters,
            "upgrade is answered by the control loop",
        ),
        // The kernel refuses to remove a device someone holds open (cryptsetup: "Device
        // NAME is still in use.", exit 5): here a client of the export, or a request held by
        // the suspend (resume lets it finish). Termination signals close regardless.
        Request::Close if !TERMINATING.load(Ordering::SeqCst) && in_use_after_settling(stack) => {
            Response::error(ExitCode::Busy, format!("Device {target} is still in use."))
        }
        Request::Close => {
            // A running reencryption finishes its step first, so the header on disk is a
            // finished step that either tool resumes.
            stack.stop_reencryption();
            closing.stopping.store(true, Ordering::SeqCst);
            Response::Done
        }
        // As the kernel's deferred removal: an unused device goes at once, a used one when
        // its last user leaves (the serve loop watches for that).
        Request::CloseDeferred => {
            let pending = in_use(stack);
            if pending {
                closing.deferred.store(true, Ordering::SeqCst);
            } else {
                stack.stop_reencryption();
                closing.stopping.store(true, Ordering::SeqCst);
            }
            Response::CloseDeferred { pending }
        }
        Request::CancelDeferredClose => {
            closing.deferred.store(false, Ordering::SeqCst);
            Response::Done
        }
        Request::Reencrypt { .. } | Request::DecryptExport { .. } if !is_top => Response::error(
            ExitCode::WrongParameters,
            format!("{target} is not the volume's top mapping"),
        ),
        Request::Reencrypt {
            old_key,
            new_key,
            max_hotzone,
            device_block,
        } => {
            // "" is a key the data no longer needs (the old one at the very end).
            let keys = match (hex_key(old_key), hex_key(new_key)) {
                (Ok(old), Ok(new)) => ReencryptKeys { old, new },
                (Err(r), _) | (_, Err(r)) => return r,
            };
            match stack.start_reencryption(keys, run_options(*max_hotzone, *device_block)) {
                Ok(()) => Response::Done,
                Err(f) => Response::error(f.code, f.message),
            }
        }
        Request::DecryptExport {
            key,
            export,
            resilience,
            resilience_hash,
            max_hotzone,
            device_block,
        } => decrypt_export(
            stack,
            key,
            export,
            resilience,
            resilience_hash,
            run_options(*max_hotzone, *device_block),
        ),
        Request::Suspend => match mapping.suspend() {
            Ok(()) => Response::Done,
            Err(e) => dm_err(e),
        },
        Request::Resume => {
            let before = mapping.size();
            match mapping.resume() {
                // A staged table of another length is a resize: as the kernel's resume sets
                // the disk's capacity, the export tells its clients.
                Ok(_) if is_top && mapping.size() != before => {
                    match stack.export_resized(mapping.size()) {
                        Ok(()) => Response::Done,
                        Err(msg) => Response::error(ExitCode::WrongDevice, msg),
                    }
                }
                Ok(_) => Response::Done,
                Err(e) => dm_err(e),
            }
        }
        Request::Reload { table } => match stack.lock_files_of(table) {
            Err(f) => Response::error(f.code, f.message),
            Ok(()) => match registry.reload(target, table) {
                Ok(()) => Response::Done,
                Err(e) => dm_err(e),
            },
        },
        Request::Message { sector, message } => {
            let argv: Vec<&str> = message.iter().map(String::as_str).collect();
            match mapping.message(*sector, &argv) {
                Ok(reply) => Response::Message(reply),
                Err(e) => Response::error(ExitCode::WrongParameters, e.to_string()),
            }
        }
        // After `luksSuspend` the live table's key is wiped: a table rebuilt from it would
        // carry a zero key, and the resume below would serve garbage.
        Request::Refresh { .. } if mapping.info().suspended => Response::error(
            ExitCode::Busy,
            format!("Volume {target} is suspended; resume it first."),
        ),
        Request::Refresh { flags } => match refreshed_table(&mapping.table(true), flags) {
            Ok(text) => {
                // dmsetup reload + suspend + resume: in-flight I/O drains, new I/O waits
                // for the swap, nothing fails. Same registry, so the same open devices.
                match registry.reload(target, &text) {
                    Ok(()) => match mapping.suspend().and_then(|()| mapping.resume()) {
                        Ok(_) => Response::Table(mapping.table(false)),
                        Err(e) => dm_err(e),
                    },
                    Err(e) => dm_err(e),
                }
            }
            Err(msg) => Response::error(ExitCode::WrongParameters, msg),
        },
    }
}

/// The live table with every crypt line's activation flags replaced by `flags`, as
/// cryptsetup's refresh sets them from the command line alone (format options are kept).
fn refreshed_table(table: &str, flags: &[String]) -> Result<Zeroizing<String>, String> {
    let mut spec = TableSpec::parse(table).map_err(|e| e.to_string())?;
    spec.set_crypt_activation_flags(&CryptFlags::parse(flags)?);
    Ok(spec.to_text(true))
}

/// SIGTERM, SIGINT and SIGHUP: the signals that close the volume.
fn termination_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-set calls on a local sigset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        set
    }
}

/// Blocks the termination signals in this thread (and all threads started later), so one
/// watcher thread can receive them synchronously.
///
/// Why not the `signal-hook` crate (issue 29 asked): it delivers through a signal handler
/// and a self-pipe, and the kernel runs a handler in whichever thread has the signal
/// unblocked. In a ublk queue thread that interrupts `io_uring_enter` with `EINTR`
/// (io_uring_enter(2); `SA_RESTART` does not restart it), and libublk 0.4 turns that into
/// a fatal queue error (`submit_and_wait(1).map_err(UblkError::IOError)?` in its queue
/// loop), so the disk would fail on the signal that asks for an orderly close. The signals
/// must therefore be blocked in every serving thread whatever delivers them; with them
/// blocked, `sigwait(3)` in one thread is the whole mechanism, and a handler, a pipe and a
/// registry would add nothing but another way to be interrupted.
pub(super) fn block_termination_signals() {
    let set = termination_signals();
    // SAFETY: a valid sigset; no old mask is asked for.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// On SIGTERM/SIGINT/SIGHUP, asks our own control socket to close, so termination takes the
/// same path as `cryptblk close`: flush, stop the export, exit.
pub(super) fn spawn_signal_watcher(ctl: PathBuf) {
    // A small stack: this thread lives as long as the volume and only waits (issue 28's
    // thousand idle volumes).
    let watcher = std::thread::Builder::new()
        .name("signals".to_string())
        .stack_size(128 << 10);
    let spawned = watcher.spawn(move || {
        let set = termination_signals();
        let mut sig = 0;
        // SAFETY: sigwait on a set of signals this process has blocked.
        unsafe {
            libc::sigwait(&set, &mut sig);
        }
        TERMINATING.store(true, Ordering::SeqCst);
        if let Ok(mut s) = UnixStream::connect(&ctl) {
            let _ = s.write_all(Request::Close.encode().as_bytes());
            let mut sink = String::new();
            let _ = BufReader::new(s).read_line(&mut sink);
        }
    });
    if let Err(e) = spawned {
        log::warn!("cannot watch for termination signals: {e}");
    }
}

/// `DecryptExport`: the online decryption exporting the header (see
/// [`Stack::start_decrypt_export`]), its words checked first.
fn decrypt_export(
    stack: &Stack,
    key: &str,
    export: &str,
    resilience: &str,
    hash: &str,
    opts: RunOptions,
) -> Response {
    use crate::reencrypt::{DecryptResilience, ResilienceChoice};
    let bad = |m: &str| Response::error(ExitCode::WrongParameters, m);
    let k = match hex_key(key) {
        Ok(Some(k)) => k,
        Ok(None) => return bad("malformed volume key"),
        Err(r) => return r,
    };
    let Some(choice) = ResilienceChoice::from_name(resilience) else {
        return bad("unknown resilience");
    };
    let Ok(hash) = cryptblk_cipher::hash::HashAlgorithm::from_name(hash) else {
        return bad("unknown resilience hash");
    };
    if !std::path::Path::new(export).is_absolute() {
        return bad("the exported header's path must be absolute");
    }
    let r = DecryptResilience {
        choice,
        hash,
        device_block: opts.device_block,
        // cryptsetup calibrates a decryption's reencryption digest.
        digest_iterations: None,
    };
    match stack.start_decrypt_export(k, export, r, opts) {
        Ok(()) => Response::Done,
        Err(f) => Response::error(f.code, f.message),
    }
}

/// A volume key sent in hex: `None` for "" (a key the data no longer needs), an error
/// response for anything that is not hex.
fn hex_key(hex: &str) -> Result<Option<SecretBytes>, Response> {
    if hex.is_empty() {
        return Ok(None);
    }
    let mut k = SecretBytes::zeroed(hex.len() / 2);
    hex::decode_to_slice(hex, k.as_mut_bytes())
        .map_err(|_| Response::error(ExitCode::WrongParameters, "malformed volume key"))?;
    Ok(Some(k))
}

/// The run options a reencryption request carries (a device block under 512 is 512).
fn run_options(max_hotzone: Option<u64>, device_block: u32) -> RunOptions {
    RunOptions {
        max_hotzone,
        device_block: device_block.max(512),
        chunk: None,
    }
}

/// `upgrade`: hands the stack over to a successor running `binary` (see
/// [`super::upgrade`]); on any failure before the successor takes over, this daemon serves
/// on and the answer says why. `None`: the successor takes over once this process has
/// exited (ublk) and answers `requester` itself.
fn upgrade_to(
    binary: &str,
    stack: &Stack,
    closing: &Closing,
    target: &str,
    sockets: &Sockets,
    successor: Option<Successor>,
    requester: &UnixStream,
) -> Option<Response> {
    let name = &stack.spec().name;
    let refuse = |f: Failure| {
        log::warn!("{target}: upgrade refused: {}", f.message);
        Some(Response::error(f.code, f.message))
    };
    if target != name.as_str() {
        return refuse(Failure::usage(format!(
            "{target} is a lower mapping of {name}; upgrade the volume"
        )));
    }
    let Some(successor) = successor else {
        return refuse(Failure::usage(format!(
            "the daemon of {name} cannot be upgraded in place (under a service manager, restart its unit)"
        )));
    };
    if !Path::new(binary).is_absolute() {
        return refuse(Failure::usage(
            "the successor's program path must be absolute",
        ));
    }
    if let Some(f) = upgrade::refusal(
        name,
        &stack.export_info(),
        stack.any_suspended(),
        stack.reencrypting(),
    ) {
        return refuse(f);
    }
    if closing.deferred.load(Ordering::SeqCst) {
        return refuse(Failure::new(
            ExitCode::Busy,
            format!("{name} is scheduled for deferred removal; cancel it before upgrading"),
        ));
    }
    // Ours, kept to serve on should the successor fail; and the successor's copies.
    let (listener, fds) = match (stack.export_listener(), sockets.handed_fds(name)) {
        (Ok(l), Ok(control)) => {
            let export = match l.as_ref().map(|l| l.try_clone()).transpose() {
                Ok(e) => e,
                Err(e) => {
                    return refuse(Failure::device(format!(
                        "cannot pass the export's socket on: {e}"
                    )))
                }
            };
            let fds: Vec<(HandedFd, OwnedFd)> = export
                .map(|e| (HandedFd::Export, e))
                .into_iter()
                .chain(control)
                .collect();
            (l, fds)
        }
        (Err(e), _) | (_, Err(e)) => {
            return refuse(Failure::device(format!("cannot pass the sockets on: {e}")))
        }
    };
    if stack.successor_needs_exit() {
        return upgrade_by_exit(binary, stack, closing, successor, requester, fds);
    }
    log::info!("{name}: upgrading to {binary}: handing the export over");
    let (spec, lower) = stack.successor_spec();
    let handed = stack.hand_over_export().and_then(|()| stack.flush_all());
    if let Err(f) = handed {
        return Some(serve_on(stack, listener, f));
    }
    stack.release_locks();
    match successor(Handover {
        spec,
        lower,
        binary: binary.into(),
        fds,
    }) {
        Ok(Succession::Serving(facts)) => {
            log::info!("{name}: upgraded: pid {} serves it now", facts.pid);
            closing.handed_over.store(true, Ordering::SeqCst);
            closing.stopping.store(true, Ordering::SeqCst);
            Some(Response::Done)
        }
        // Only a successor handed the request says it waits for this process to exit.
        Ok(Succession::TakingOver) => Some(serve_on(
            stack,
            listener,
            Failure::device("the successor waits for this daemon to exit, unasked"),
        )),
        Err(f) => Some(serve_on(stack, listener, f)),
    }
}

/// [`upgrade_to`] for an export a successor takes over only once this process has exited
/// (ublk): hold the I/O, hand the successor the stack and `requester`, and exit once it
/// holds the stack (`None`); before that, any failure resumes serving here.
fn upgrade_by_exit(
    binary: &str,
    stack: &Stack,
    closing: &Closing,
    successor: Successor,
    requester: &UnixStream,
    mut fds: Vec<(HandedFd, OwnedFd)>,
) -> Option<Response> {
    let name = &stack.spec().name;
    let failed = |f: Failure| {
        let message = format!(
            "upgrade of {name} failed, pid {} serves on: {}",
            std::process::id(),
            f.message
        );
        log::error!("{message}");
        Some(Response::error(f.code, message))
    };
    match requester.as_fd().try_clone_to_owned() {
        Ok(fd) => fds.push((HandedFd::Requester, fd)),
        Err(e) => {
            return failed(Failure::device(format!(
                "cannot pass the request's connection on: {e}"
            )))
        }
    }
    log::info!(
        "{name}: upgrading to {binary}: flushing, holding I/O until the successor takes over"
    );
    if let Err(f) = stack.flush_all() {
        return failed(f);
    }
    if let Err(f) = stack.hold_for_successor() {
        return failed(f);
    }
    let (spec, lower) = stack.successor_spec();
    stack.release_locks();
    let outcome = successor(Handover {
        spec,
        lower,
        binary: binary.into(),
        fds,
    });
    let why = match outcome {
        Ok(Succession::TakingOver) => {
            log::info!(
                "{name}: the successor holds the stack; exiting so it takes the device over"
            );
            closing.handed_over.store(true, Ordering::SeqCst);
            closing.stopping.store(true, Ordering::SeqCst);
            return None;
        }
        // It cannot serve the device before this process exits: something else answered.
        Ok(Succession::Serving(facts)) => Failure::device(format!(
            "the successor (pid {}) reported serving before taking the device over",
            facts.pid
        )),
        Err(f) => f,
    };
    match stack.resume_after_failed_take_over() {
        Ok(()) => failed(why),
        Err(f) => {
            let message = format!(
                "upgrade of {name} failed ({}) and serving could not resume: {}",
                why.message, f.message
            );
            log::error!("{message}");
            Some(Response::error(f.code, message))
        }
    }
}

/// After a failed hand-over: serve again, and refuse the upgrade with the reason.
fn serve_on(stack: &Stack, listener: Option<OwnedFd>, why: Failure) -> Response {
    let name = &stack.spec().name;
    match stack.resume_after_failed_upgrade(listener) {
        Ok(()) => {
            let message = format!(
                "upgrade of {name} failed, pid {} serves on: {}",
                std::process::id(),
                why.message
            );
            log::error!("{message}");
            Response::error(why.code, message)
        }
        Err(f) => {
            let message = format!(
                "upgrade of {name} failed ({}) and its export could not restart: {}",
                why.message, f.message
            );
            log::error!("{message}");
            Response::error(f.code, message)
        }
    }
}
