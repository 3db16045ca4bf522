//! Actions on served mappings: `dm ...`, `close`, `status`, `refresh`, and the shared
//! start-a-daemon path that `open` also uses.

use crate::args::{DmAction, ExportArgs, PerfArgs, TableArgs};
use crate::daemon;
use crate::exit::{ActionResult, Failure};
use cryptblk_export::fuse::FuseConfig;
use cryptblk_export::nbd::{NbdConfig, NbdListen, NbdTls};
use cryptblk_export::ublk::UblkConfig;
use cryptblk_export::vhost_user::VhostUserConfig;
use cryptblk_volume::control::{self, ExportDescription, Request};
use cryptblk_volume::serve::{self, ExportConfig, LowerTable, ServeSpec};
use serde_json::{json, Value};
use std::io::Read;
use std::path::{Path, PathBuf};
use zeroize::{Zeroize, Zeroizing};

/// Starts serving `spec` as the export args ask: a daemon, or in the foreground.
pub fn start(spec: ServeSpec, export: &ExportArgs, json_out: bool) -> ActionResult {
    start_stack(spec, Vec::new(), export, json_out)
}

/// Like [`start`], with lower mappings created first in the same daemon.
pub(super) fn start_stack(
    spec: ServeSpec,
    lower: Vec<LowerTable>,
    export: &ExportArgs,
    json_out: bool,
) -> ActionResult {
    if export.foreground {
        // From here this process is the volume's daemon: its log (the journal under
        // systemd) gets the daemon's records.
        crate::logger::install(crate::logger::Process::Daemon);
        return serve::serve_stack_upgradable(
            spec,
            lower,
            serve::Inherited::none(),
            |facts| {
                eprintln!("cryptblk: serving {}", facts.describe());
                // Under a Type=notify unit (cryptblk-generator's): READY=1 now that the
                // export accepts I/O, STATUS=, watchdog pings.
                cryptblk_systemd::notify::ready(facts);
                crate::daemon::release_startup_memory();
            },
            // STOPPING=1 to a service manager (only `open --foreground` has NOTIFY_SOCKET).
            cryptblk_systemd::notify::stopping,
            // Under a unit the successor (which inherits NOTIFY_SOCKET) names itself the
            // main process (`MAINPID=`) before this one exits, so the unit carries on.
            Some(&daemon::spawn_successor as serve::Successor),
        );
    }
    let facts = daemon::spawn_stack(&spec, &lower)?;
    if json_out {
        println!(
            "{}",
            serde_json::to_string(&facts).expect("facts serialise")
        );
    }
    Ok(())
}

/// The export the user asked for (at most one); with none, the device `open` makes by
/// default for mapping `name` (see [`default_export`]).
pub fn export_spec(export: &ExportArgs, name: &str) -> Result<ExportConfig, Failure> {
    if let Some(socket) = &export.vhost_user {
        if export.nbd.is_some() || export.fuse.is_some() || export.ublk {
            return Err(Failure::usage(
                "choose one export: --nbd, --fuse, --ublk or --vhost-user",
            ));
        }
        let queues = export
            .queues
            .unwrap_or(cryptblk_export::vhost_user::DEFAULT_QUEUES);
        if queues == 0 || queues > cryptblk_export::vhost_user::MAX_QUEUES {
            return Err(Failure::usage(format!(
                "--queues {queues} out of range for --vhost-user (1-{})",
                cryptblk_export::vhost_user::MAX_QUEUES
            )));
        }
        let abs = if socket.is_absolute() {
            socket.clone()
        } else {
            std::env::current_dir()?.join(socket)
        };
        let mut cfg = VhostUserConfig::new(abs);
        cfg.queues = queues;
        return Ok(ExportConfig::VhostUser(cfg));
    }
    if export.queues.is_some() && !export.ublk {
        return Err(Failure::usage("--queues needs --ublk or --vhost-user"));
    }
    if export.ublk {
        if export.nbd.is_some() || export.fuse.is_some() {
            return Err(Failure::usage("choose one export: --nbd, --fuse or --ublk"));
        }
        return Ok(ExportConfig::Ublk(UblkConfig {
            queues: export.queues,
            queue_depth: export
                .queue_depth
                .unwrap_or(cryptblk_export::ublk::DEFAULT_QUEUE_DEPTH),
            ..UblkConfig::default()
        }));
    }
    match (&export.nbd, &export.fuse) {
        (Some(_), Some(_)) => Err(Failure::usage("choose one export: --nbd, --fuse or --ublk")),
        (Some(n), None) => match parse_nbd_address(n)? {
            NbdAddress::Tcp(addr) => {
                let cfg = nbd_config(NbdListen::Tcp(addr), export)?;
                let tls_required = cfg.tls.as_ref().is_some_and(|t| t.require);
                if !addr.ip().is_loopback() && !tls_required && !cfg.allow_insecure_tcp {
                    return Err(Failure::usage(format!(
                        "refusing plaintext NBD on {addr}, which is not a loopback address: \
                         use --tls require with --tls-certificates, or --allow-insecure-tcp \
                         on a trusted network"
                    )));
                }
                Ok(ExportConfig::Nbd(cfg))
            }
            NbdAddress::Unix(p) => {
                let abs = if p.is_absolute() {
                    p
                } else {
                    std::env::current_dir()?.join(p)
                };
                Ok(ExportConfig::Nbd(nbd_unix(abs, name, export)?))
            }
        },
        (None, Some(dir)) => {
            let abs = std::fs::canonicalize(dir)
                .map_err(|e| Failure::usage(format!("FUSE mount point {}: {e}", dir.display())))?;
            Ok(ExportConfig::Fuse(FuseConfig::new(abs)))
        }
        (None, None) => default_export(name, export, ublk_usable()),
    }
}

/// The kernel's ublk control device: the kernel serves ublk block devices when it exists.
const UBLK_CONTROL: &str = "/dev/ublk-control";

/// True when the kernel has ublk and this process may use it: `/dev/ublk-control` opens
/// read-write (it exists once `ublk_drv` is loaded; opening it needs root or a udev rule).
pub fn ublk_usable() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(UBLK_CONTROL)
        .is_ok()
}

/// The export given no export option, as cryptsetup always makes a device: a ublk block
/// device when `ublk` (the kernel has it, [`ublk_usable`]; the daemon then links
/// `/dev/cryptblk/NAME` to it when root), else NBD on the Unix socket
/// `<runtime dir>/NAME.sock` ([`default_nbd_socket`]), whose path is the stable name. The
/// NBD options (`--tls`, `--max-clients`...) apply to that socket.
pub fn default_export(
    name: &str,
    export: &ExportArgs,
    ublk: bool,
) -> Result<ExportConfig, Failure> {
    if ublk {
        return Ok(ExportConfig::Ublk(UblkConfig {
            queues: None,
            queue_depth: export
                .queue_depth
                .unwrap_or(cryptblk_export::ublk::DEFAULT_QUEUE_DEPTH),
            ..UblkConfig::default()
        }));
    }
    Ok(ExportConfig::Nbd(nbd_unix(
        default_nbd_socket(name)?,
        name,
        export,
    )?))
}

/// NBD on the Unix socket `path` for mapping `name`, described to clients as
/// `cryptblk NAME`.
fn nbd_unix(path: PathBuf, name: &str, export: &ExportArgs) -> Result<NbdConfig, Failure> {
    let mut cfg = nbd_config(NbdListen::Unix(path), export)?;
    cfg.description = format!("cryptblk {name}");
    Ok(cfg)
}

/// The NBD socket of mapping `name` served without an export option:
/// `<runtime dir>/NAME.sock`, next to its control socket `NAME.ctl` (the runtime directory
/// is `$CRYPTBLK_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/cryptblk`, else `/run/cryptblk` for
/// root; private to its owner, so only that user's clients connect).
pub fn default_nbd_socket(name: &str) -> Result<PathBuf, Failure> {
    control::check_name(name)?;
    Ok(control::runtime_dir()?.join(format!("{name}.sock")))
}

/// The path that stands for a served mapping where cryptsetup names `/dev/mapper/NAME`:
/// `/dev/cryptblk/NAME` for a ublk device that link names (else `/dev/ublkbN`), the socket
/// of NBD on a Unix socket, the URI of NBD on TCP, the FUSE file, the vhost-user socket;
/// `None` for a mapping without export (a lower mapping of a stack).
pub fn device_path(name: &str, export: &ExportDescription) -> Option<String> {
    match export {
        ExportDescription::Ublk(u) => {
            let link = serve::devlink::link_path(name);
            Some(if std::fs::read_link(&link).is_ok_and(|t| t == u.dev) {
                link.display().to_string()
            } else {
                u.dev.display().to_string()
            })
        }
        ExportDescription::Nbd(n) => Some(match n.uri.split_once("?socket=") {
            Some((_, socket)) => socket.to_string(),
            None => n.uri.clone(),
        }),
        ExportDescription::Fuse(f) => Some(f.file.display().to_string()),
        ExportDescription::VhostUser(v) => Some(v.socket.display().to_string()),
        ExportDescription::None => None,
    }
}

/// cryptsetup's first `status` line with the path that stands for the mapping
/// ([`device_path`]) where cryptsetup prints `/dev/mapper/NAME`, which does not exist here.
pub fn active_line(a: &control::Status) -> String {
    format!(
        "{} is active{}.",
        device_path(&a.name, &a.export).unwrap_or_else(|| a.name.clone()),
        if a.users > 0 { " and is in use" } else { "" }
    )
}

/// `status --json`'s report: the daemon's, plus `device_path` ([`device_path`]; null
/// without export).
pub fn status_json(a: &control::Status) -> Value {
    let mut v = a.to_json();
    v["device_path"] = json!(device_path(&a.name, &a.export));
    v
}

/// Where `--nbd` listens.
#[derive(Debug, PartialEq, Eq)]
pub enum NbdAddress {
    /// A Unix socket at this path.
    Unix(std::path::PathBuf),
    /// TCP at this address (port 0: a free port).
    Tcp(std::net::SocketAddr),
}

/// Parses `--nbd`: `unix:PATH`, or a path with a `/` (`./data.sock`, `/run/data.sock`), for a
/// Unix socket; `HOST:PORT` (an IPv4 address or a host name) or `[IPV6]:PORT`, port 0-65535,
/// for TCP. Anything else (a bare name or port, a missing host, a port out of range) is
/// refused (exit 1) rather than taken as a file name in the current directory.
pub fn parse_nbd_address(text: &str) -> Result<NbdAddress, Failure> {
    use std::net::ToSocketAddrs;
    let refuse = |why: &str| {
        Failure::usage(format!(
            "invalid --nbd address '{text}' ({why}): use unix:PATH or a path containing '/' \
             for a Unix socket, HOST:PORT or [IPV6]:PORT for TCP"
        ))
    };
    if let Some(path) = text.strip_prefix("unix:") {
        if path.is_empty() {
            return Err(refuse("no path"));
        }
        return Ok(NbdAddress::Unix(path.into()));
    }
    if text.contains('/') {
        return Ok(NbdAddress::Unix(text.into()));
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(refuse("neither a path nor HOST:PORT"));
    };
    let port: u16 = port
        .parse()
        .map_err(|_| refuse("the port must be a number from 0 to 65535"))?;
    let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => {
            let ip: std::net::Ipv6Addr = v6.parse().map_err(|_| refuse("not an IPv6 address"))?;
            return Ok(NbdAddress::Tcp((ip, port).into()));
        }
        None if host.is_empty() => return Err(refuse("no host")),
        None if host.contains(':') => return Err(refuse("write an IPv6 address as [ADDR]:PORT")),
        None => host,
    };
    if let Ok(ip) = host.parse::<std::net::Ipv4Addr>() {
        return Ok(NbdAddress::Tcp((ip, port).into()));
    }
    let addr = (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| refuse("unknown host"))?;
    Ok(NbdAddress::Tcp(addr))
}

/// The NBD server listening at `listen` with the bounds and TLS of the command line,
/// defaulting to the server's own.
fn nbd_config(listen: NbdListen, export: &ExportArgs) -> Result<NbdConfig, Failure> {
    use cryptblk_export::nbd::{TlsMode, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_CLIENTS};
    use std::time::Duration;
    let tls = export.tls.unwrap_or(TlsMode::Off);
    if tls == TlsMode::Off && (export.tls_certificates.is_some() || export.tls_verify_peer) {
        return Err(Failure::usage(
            "--tls-certificates and --tls-verify-peer need --tls on or --tls require",
        ));
    }
    let tls_certificates = match &export.tls_certificates {
        Some(dir) => Some(std::fs::canonicalize(dir).map_err(|e| {
            Failure::usage(format!("TLS certificate directory {}: {e}", dir.display()))
        })?),
        None if tls != TlsMode::Off => {
            return Err(Failure::usage(
                "--tls on or require needs --tls-certificates DIR",
            ))
        }
        None => None,
    };
    let mut cfg = NbdConfig::new(listen);
    cfg.max_clients = export
        .max_clients
        .map_or(DEFAULT_MAX_CLIENTS, |n| n as usize);
    cfg.handshake_timeout = Duration::from_secs(
        export
            .handshake_timeout
            .unwrap_or(DEFAULT_HANDSHAKE_TIMEOUT.as_secs()),
    );
    cfg.idle_timeout = export
        .idle_timeout
        .filter(|s| *s > 0)
        .map(Duration::from_secs);
    // The certificates are loaded by the daemon when the export starts.
    cfg.tls = tls_certificates
        .map(|dir| NbdTls::new(dir, tls == TlsMode::Require, export.tls_verify_peer));
    cfg.allow_insecure_tcp = export.allow_insecure_tcp;
    Ok(cfg)
}

/// Reads a table from `--table`, `--table-file` or standard input. Inline tables may not
/// carry crypt keys: a command line is visible to every user through /proc.
pub fn read_table(args: &TableArgs) -> Result<Zeroizing<String>, Failure> {
    let text = match (&args.table, &args.table_file) {
        (Some(_), Some(_)) => {
            return Err(Failure::usage(
                "give the table with --table or --table-file, not both",
            ))
        }
        (Some(t), None) => {
            if cryptblk_dm::text_has_inline_keys(t) {
                return Err(Failure::usage(
                    "refusing a key on the command line (visible in the process list); use --table-file or standard input",
                ));
            }
            Zeroizing::new(t.clone())
        }
        (None, Some(p)) => read_table_file(p)?,
        (None, None) => read_stdin()?,
    };
    Ok(text)
}

/// Reads a table file, `-` being standard input.
fn read_table_file(p: &Path) -> Result<Zeroizing<String>, Failure> {
    if p.as_os_str() == "-" {
        return read_stdin();
    }
    Ok(Zeroizing::new(std::fs::read_to_string(p).map_err(|e| {
        Failure::usage(format!("cannot read table file {}: {e}", p.display()))
    })?))
}

/// The `--lower NAME=TABLE_FILE` options of `dm create`, tables read in order. Only files
/// (or standard input, once for the whole stack): lower tables may hold keys too.
fn read_lower_tables(
    top: &str,
    top_from_stdin: bool,
    given: &[String],
) -> Result<Vec<LowerTable>, Failure> {
    let mut parsed: Vec<(String, PathBuf)> = Vec::new();
    for g in given {
        let Some((name, file)) = g
            .split_once('=')
            .filter(|(n, f)| !n.is_empty() && !f.is_empty())
        else {
            return Err(Failure::usage(format!(
                "--lower wants NAME=TABLE_FILE, not '{g}'"
            )));
        };
        let name = name.strip_prefix("/dev/mapper/").unwrap_or(name);
        control::check_name(name)?;
        if name == top {
            return Err(Failure::usage(format!(
                "lower mapping '{name}' has the name of the mapping it is under"
            )));
        }
        if parsed.iter().any(|(n, _)| n == name) {
            return Err(Failure::usage(format!(
                "lower mapping '{name}' is given twice"
            )));
        }
        parsed.push((name.to_string(), PathBuf::from(file)));
    }
    let stdin_users =
        parsed.iter().filter(|(_, f)| f.as_os_str() == "-").count() + usize::from(top_from_stdin);
    if stdin_users > 1 {
        return Err(Failure::usage(
            "only one table of the stack can come from standard input",
        ));
    }
    parsed
        .into_iter()
        .map(|(name, file)| {
            let table = read_table_file(&file)?;
            Ok(LowerTable {
                name,
                table: table.to_string(),
            })
        })
        .collect()
}

fn read_stdin() -> Result<Zeroizing<String>, Failure> {
    let mut s = Zeroizing::new(String::new());
    std::io::stdin().read_to_string(&mut s)?;
    Ok(s)
}

/// The words of `dm message`. A key never comes from the command line (the process list
/// shows it): crypt's `key set -` reads the hex key from standard input, and any other
/// `key set <key>` is refused, as inline tables with keys are.
fn message_words(given: &[String]) -> Result<Vec<String>, Failure> {
    let mut words = given.to_vec();
    if words.len() == 3 && words[0] == "key" && words[1] == "set" {
        if words[2] != "-" {
            words[2].zeroize();
            return Err(Failure::usage(
                "refusing a key on the command line (visible in the process list); use 'key set -' and give the hex key on standard input",
            ));
        }
        let key = read_stdin()?;
        words[2] = key.trim().to_string();
    }
    Ok(words)
}

/// `dm <action>`.
pub fn dm(action: &DmAction, json_out: bool) -> ActionResult {
    match action {
        DmAction::Create {
            name,
            table,
            lower,
            export,
        } => {
            control::check_name(name)?;
            let export_to = export_spec(export, name)?;
            let top_from_stdin = table.table.is_none()
                && table
                    .table_file
                    .as_ref()
                    .is_none_or(|p| p.as_os_str() == "-");
            // Lower tables first: a missing file fails before anything is read from stdin.
            let lower = read_lower_tables(name, top_from_stdin, lower)?;
            let text = read_table(table)?;
            let spec = ServeSpec {
                name: name.clone(),
                table: text.to_string(),
                export: export_to,
                readonly: false,
                info: cryptblk_volume::facts::VolumeFacts::of_kind("dm"),
            };
            start_stack(spec, lower, export, json_out)
        }
        DmAction::Remove { name } => close(name),
        DmAction::Table { name, showkeys } => {
            // The daemon holds the key; showing it needs the table with keys.
            let table = control::table(name, *showkeys)?;
            // Printed as is: a copy with the newline added would be a key left unwiped.
            print!("{}", table.as_str());
            if !table.is_empty() && !table.ends_with('\n') {
                println!();
            }
            Ok(())
        }
        DmAction::Reload { name, table } => {
            let text = read_table(table)?;
            control::request(
                name,
                &Request::Reload {
                    table: text.to_string(),
                },
            )?;
            Ok(())
        }
        DmAction::Suspend { name } => control::request(name, &Request::Suspend).map(|_| ()),
        DmAction::Resume { name } => control::request(name, &Request::Resume).map(|_| ()),
        DmAction::Status { name } => {
            let a = control::status(name)?;
            if json_out {
                println!("{}", a.to_json());
            } else {
                print!("{}", ensure_newline(&a.status));
            }
            Ok(())
        }
        DmAction::Message {
            name,
            sector,
            message,
        } => {
            let request = Request::Message {
                sector: *sector,
                message: message_words(message)?,
            };
            if let control::Response::Message(Some(reply)) = control::request(name, &request)? {
                println!("{reply}");
            }
            Ok(())
        }
        DmAction::Ls => {
            let names = control::list()?;
            if json_out {
                println!("{}", json!(names));
            } else if names.is_empty() {
                println!("No devices found");
            } else {
                for n in names {
                    println!("{n}");
                }
            }
            Ok(())
        }
    }
}

fn ensure_newline(s: &str) -> String {
    if s.is_empty() || s.ends_with('\n') {
        s.to_string()
    } else {
        format!("{s}\n")
    }
}

/// How `close` goes about it (`--deferred`, `--cancel-deferred`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseMode {
    /// Close now; refused (exit 5) while the volume is in use.
    Now,
    /// Close once the last user has gone (at once if none).
    Deferred,
    /// Cancel a pending deferred close.
    CancelDeferred,
}

impl CloseMode {
    /// The mode the two flags ask for; both at once is refused as cryptsetup refuses it.
    pub fn from_flags(deferred: bool, cancel_deferred: bool) -> Result<CloseMode, Failure> {
        match (deferred, cancel_deferred) {
            (true, true) => Err(Failure::usage(
                "Options --cancel-deferred and --deferred cannot be used at the same time.",
            )),
            (true, false) => Ok(CloseMode::Deferred),
            (false, true) => Ok(CloseMode::CancelDeferred),
            (false, false) => Ok(CloseMode::Now),
        }
    }
}

/// `close <name>`: flush, stop the export, end the daemon; refused while in use.
pub fn close(name: &str) -> ActionResult {
    close_with(name, CloseMode::Now)
}

/// `close [--deferred | --cancel-deferred] <name>`.
pub fn close_with(name: &str, mode: CloseMode) -> ActionResult {
    match mode {
        CloseMode::Now => {
            control::request(name, &Request::Close)?;
        }
        CloseMode::CancelDeferred => {
            control::request(name, &Request::CancelDeferredClose)?;
            return Ok(());
        }
        CloseMode::Deferred => {
            if let control::Response::CloseDeferred { pending: true } =
                control::request(name, &Request::CloseDeferred)?
            {
                // cryptsetup's line when the device stays until its last user closes it.
                println!("Device {name} is still active and scheduled for deferred removal.");
                return Ok(());
            }
        }
    }
    // The daemon removes its socket once the export has stopped; wait for that so a script
    // can reuse the name or the backing file right after `close` returns.
    let path = control::socket_path(name)?;
    for _ in 0..600 {
        if !path.exists() {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Err(Failure::new(
        crate::exit::ExitCode::Busy,
        format!("Device {name} did not close within 30 s"),
    ))
}

/// `upgrade <name> [--binary PATH]`: the daemon serving `name` hands the volume (key,
/// listening sockets, tables) over to a new process running `binary` (default: this
/// program, as installed now), which serves on; see `cryptblk_volume::serve::upgrade`.
pub fn upgrade(name: &str, binary: Option<&Path>) -> ActionResult {
    let binary = match binary {
        Some(b) => std::fs::canonicalize(b)
            .map_err(|e| Failure::usage(format!("--binary {}: {e}", b.display())))?,
        None => std::env::current_exe()?,
    };
    let text = binary
        .to_str()
        .ok_or_else(|| Failure::usage(format!("{} is not a UTF-8 path", binary.display())))?;
    let request = Request::Upgrade {
        binary: text.to_string(),
    };
    match control::request(name, &request) {
        Ok(_) => Ok(()),
        // A daemon started by a cryptblk from before `upgrade` cannot decode the request.
        Err(e) if e.message.contains("unknown variant") => Err(Failure::usage(format!(
            "the daemon of {name} predates upgrade; close and reopen the volume once"
        ))),
        // A ublk daemon exits once its successor holds the volume; the successor answers,
        // unless it died first. Then nothing serves the device, which stays (its I/O waits).
        Err(e) if e.message.starts_with(control::NO_ANSWER) => Err(Failure::device(format!(
            "upgrade of {name}: no answer from its daemon or successor; if it is served over ublk, its device stays and its I/O waits: run the same open to take it over"
        ))),
        Err(e) => Err(e),
    }
}

/// `status <name>`, like `cryptsetup status` (or JSON).
pub fn status(name: &str, json_out: bool) -> ActionResult {
    let a = control::status(name)?;
    if json_out {
        println!("{}", status_json(&a));
        return Ok(());
    }
    let info = &a.info;
    // cryptsetup's first line, " and is in use" while the device is open.
    println!("{}", active_line(&a));
    // cryptsetup 2.6's lines, labels and spacing first (scripts read them), then cryptblk's
    // own (pipeline, export, live status).
    let line = |label: &str, v: &str| println!("  {label}{v}");
    if !info.kind.is_empty() {
        line("type:    ", &info.kind);
    }
    let cipher = &info.cipher;
    if let Some(v) = cipher {
        line("cipher:  ", v);
    }
    if let Some(v) = &info.keysize {
        line("keysize: ", v);
    }
    if cipher.is_some() {
        // cryptsetup's word for where the key is (see VolumeFacts::key_location).
        line(
            "key location: ",
            info.key_location.as_deref().unwrap_or("dm-crypt"),
        );
    }
    if let Some(v) = &info.integrity {
        line("integrity: ", v);
    }
    if let Some(v) = &info.integrity_keysize {
        line("integrity keysize: ", v);
    }
    if let Some(v) = &info.device {
        line("device:  ", v);
    }
    if let Some(v) = info.sector_size {
        line("sector size:  ", &v.to_string());
    }
    if let Some(v) = &info.offset {
        line("offset:  ", v);
    }
    line("size:    ", &format!("{} sectors", a.size / 512));
    // cryptsetup adds " (suspended)" to the mode of a suspended device.
    line(
        "mode:    ",
        &format!(
            "{}{}",
            if a.readonly { "readonly" } else { "read/write" },
            if a.suspended { " (suspended)" } else { "" }
        ),
    );
    // cryptsetup's `flags:` line, byte for byte: each flag but the last followed by a space.
    let flags: String = [
        ("allow_discards", "discards "),
        ("same_cpu_crypt", "same_cpu_crypt "),
        ("submit_from_crypt_cpus", "submit_from_crypt_cpus "),
        ("no_read_workqueue", "no_read_workqueue "),
        ("no_write_workqueue", "no_write_workqueue"),
        ("high_priority", "high_priority"),
    ]
    .into_iter()
    .filter(|(opt, _)| a.pipeline.iter().any(|p| p.flags.iter().any(|f| f == opt)))
    .map(|(_, shown)| shown)
    .collect();
    if !flags.is_empty() {
        line("flags:   ", &flags);
    }
    for p in &a.pipeline {
        println!(
            "  pipeline:    read {}, write {}{}",
            p.read.as_str(),
            p.write.as_str(),
            if p.flags.is_empty() {
                String::new()
            } else {
                format!(" (flags: {})", p.flags.join(" "))
            }
        );
    }
    match &a.export {
        ExportDescription::Nbd(n) => println!("  export:      nbd {}", n.uri),
        ExportDescription::Fuse(f) => println!("  export:      fuse {}", f.file.display()),
        ExportDescription::VhostUser(v) => {
            println!("  export:      vhost-user {}", v.socket.display())
        }
        // The plain report never named ublk devices or their absence.
        ExportDescription::Ublk(_) | ExportDescription::None => {}
    }
    println!("  status:      {}", a.status.trim());
    if a.deferred_remove {
        println!("  deferred:    closes when the last user has gone");
    }
    if let Some(r) = &a.reencryption {
        let state = serde_json::to_value(r.state).unwrap_or_default();
        println!(
            "  reencrypt:   {}, {:.1}% ({} of {} bytes{}){}",
            state.as_str().unwrap_or("?"),
            r.done as f64 * 100.0 / r.total.max(1) as f64,
            r.done,
            r.total,
            if r.bytes_per_sec > 0 {
                format!(", {} bytes/s", r.bytes_per_sec)
            } else {
                String::new()
            },
            r.error.as_ref().map_or(String::new(), |e| format!(": {e}"))
        );
    }
    for b in &a.backings {
        println!("  backing:     {} errors={}", b.device, b.errors);
    }
    Ok(())
}

/// `refresh <name> --perf-...`: swap the crypt flags on the live device.
pub fn refresh(name: &str, perf: &PerfArgs) -> ActionResult {
    let flags = perf.table_flags();
    control::request(name, &Request::Refresh { flags })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_options_are_checked_before_any_file_is_read() {
        let bad = |given: &[&str]| {
            let given: Vec<String> = given.iter().map(|s| s.to_string()).collect();
            read_lower_tables("top", false, &given)
                .err()
                .expect("refused")
                .message
        };
        assert!(bad(&["nameonly"]).contains("NAME=TABLE_FILE"));
        assert!(bad(&["=f"]).contains("NAME=TABLE_FILE"));
        assert!(bad(&["top=/nonexistent"]).contains("name of the mapping"));
        assert!(bad(&["a=/nonexistent", "a=/nonexistent"]).contains("twice"));
        assert!(bad(&["a b=/nonexistent"]).contains("invalid mapping name"));
        assert!(bad(&["a=-", "b=-"]).contains("standard input"));
        assert!(bad(&["a=/nonexistent"]).contains("cannot read table file"));
        let err = read_lower_tables("top", true, &["a=-".to_string()]).err();
        assert!(err.expect("refused").message.contains("standard input"));
    }
}

#[cfg(test)]
mod nbd_address_tests {
    use super::*;

    #[test]
    fn nbd_addresses_follow_the_grammar() {
        let unix = |p: &str| Some(NbdAddress::Unix(p.into()));
        assert_eq!(parse_nbd_address("unix:data.sock").ok(), unix("data.sock"));
        assert_eq!(parse_nbd_address("./d.sock").ok(), unix("./d.sock"));
        assert_eq!(parse_nbd_address("/run/x:1").ok(), unix("/run/x:1"));
        let tcp = |a: &str| Some(NbdAddress::Tcp(a.parse().unwrap()));
        assert_eq!(
            parse_nbd_address("127.0.0.1:10809").ok(),
            tcp("127.0.0.1:10809")
        );
        assert_eq!(parse_nbd_address("[::1]:0").ok(), tcp("[::1]:0"));
        assert!(matches!(
            parse_nbd_address("localhost:10809"),
            Ok(NbdAddress::Tcp(a)) if a.port() == 10809 && a.ip().is_loopback()
        ));
        for bad in [
            ":10809",
            "10809",
            "data.sock",
            "127.0.0.1:65536",
            "127.0.0.1:",
            "::1:10809",
            "[::1:10809",
            "[nope]:1",
            "unix:",
            "no-such-host.invalid:1",
        ] {
            let e = parse_nbd_address(bad).unwrap_err();
            assert_eq!(e.code, crate::exit::ExitCode::WrongParameters, "{bad}");
            assert!(e.message.contains(bad), "{}", e.message);
        }
    }
}

#[cfg(test)]
mod default_export_tests {
    use super::*;

    #[test]
    fn no_export_option_serves_ublk_where_the_kernel_has_it_else_nbd_in_the_runtime_dir() {
        let dir = tempfile::tempdir().unwrap();
        // The environment is left alone (other tests run in this process): the socket is
        // wherever the runtime directory is (tests/default_export.rs sets it).
        let run = control::runtime_dir().unwrap();
        let none = ExportArgs::default();
        match default_export("vol", &none, true).unwrap() {
            ExportConfig::Ublk(u) => {
                assert_eq!(u.queues, None);
                assert_eq!(u.queue_depth, cryptblk_export::ublk::DEFAULT_QUEUE_DEPTH);
            }
            other => panic!("with ublk: {other:?}"),
        }
        match default_export("vol", &none, false).unwrap() {
            ExportConfig::Nbd(n) => assert_eq!(n.listen, NbdListen::Unix(run.join("vol.sock"))),
            other => panic!("without ublk: {other:?}"),
        }
        // The choice is only made when no export is asked for.
        let asked = ExportArgs {
            fuse: Some(dir.path().to_path_buf()),
            ..ExportArgs::default()
        };
        assert!(matches!(
            export_spec(&asked, "vol").unwrap(),
            ExportConfig::Fuse(_)
        ));
        // A bad name is refused before any path is made of it.
        assert!(default_export("../x", &none, false).is_err());
    }
}
