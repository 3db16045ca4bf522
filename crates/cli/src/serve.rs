//! The daemon that keeps a mapping alive and serves it: one process per open volume.
//!
//! `open` and `dm create` unlock and build the table in the foreground, then start
//! `cryptblk __serve` and hand it a [`ServeSpec`] over a pipe (the table carries the volume
//! key, so it never appears on a command line or in the environment). The daemon builds the
//! mapping, starts the export, binds its control socket, and only then answers `READY`, so the
//! parent returns exactly when the export accepts I/O.
//!
//! One daemon may serve a stack: lower mappings (a LUKS2 `--integrity` volume's `<name>_dif`,
//! or `dm create --lower` tables) live in the same registry under the exported top one, and
//! each answers on its own control socket, so `dm ls|table|status|remove` see every mapping
//! under its own name, as in the kernel.

use crate::control;
use crate::exit::{ExitCode, Failure};
use cryptblk_dm::backing::FileOptions;
use cryptblk_dm::table::parse_table_lines;
use cryptblk_dm::targets::crypt::CryptFlags;
use cryptblk_dm::{BlockDevice, Registry};
use cryptblk_export::fuse::{FuseConfig, FuseExport};
use cryptblk_export::nbd::{NbdConfig, NbdListen, NbdServer};
use cryptblk_export::ublk::{UblkConfig, UblkExport};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use zeroize::Zeroizing;

/// How a mapping is exported.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum ExportSpec {
    /// NBD on a Unix socket at this path.
    NbdUnix(PathBuf),
    /// NBD on TCP at this address (loopback unless the user names another).
    NbdTcp(String),
    /// A FUSE mount at this directory holding one file, `disk`.
    Fuse(PathBuf),
    /// The kernel block device /dev/ublkbN; `queues` None means one per CPU.
    Ublk {
        /// Hardware queues (threads).
        queues: Option<u16>,
        /// Requests in flight per queue.
        depth: u16,
    },
    /// No export: only the control socket (useful for stacking and tests).
    None,
}

/// Everything the daemon needs. Contains key material: only ever sent through a pipe.
#[derive(Serialize, Deserialize)]
pub struct ServeSpec {
    /// Mapping name.
    pub name: String,
    /// The dm table, keys included.
    pub table: String,
    /// The export.
    pub export: ExportSpec,
    /// Serve read-only.
    pub readonly: bool,
    /// Facts for `status` (volume type, device, UUID, cipher...): never secrets.
    pub info: Value,
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
    pub table: String,
}

impl Drop for LowerTable {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.table);
    }
}

/// What `cryptblk __serve` reads from its stdin.
#[derive(Serialize)]
struct DaemonSpecRef<'a> {
    spec: &'a ServeSpec,
    lower: &'a [LowerTable],
}

/// The daemon's side of [`DaemonSpecRef`].
#[derive(Deserialize)]
struct DaemonSpec {
    spec: ServeSpec,
    #[serde(default)]
    lower: Vec<LowerTable>,
}

/// Names of every lower mapping of `spec`'s stack, in creation order.
fn lower_names(spec: &ServeSpec, secret_lower: &[LowerTable]) -> Vec<String> {
    lower_tables(&spec.info)
        .into_iter()
        .map(|(n, _)| n)
        .chain(secret_lower.iter().map(|l| l.name.clone()))
        .collect()
}

/// Refuses a stack whose names clash among themselves (usage) or with a mapping another
/// daemon serves (busy, as cryptsetup's "Device ... already exists.").
fn check_stack_names(top: &str, lower: &[String]) -> Result<(), Failure> {
    for (i, name) in lower.iter().enumerate() {
        control::check_name(name)?;
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
        if UnixStream::connect(control::socket_path(name)?).is_ok() {
            return Err(Failure::new(
                ExitCode::Busy,
                format!("Device {name} already exists."),
            ));
        }
    }
    Ok(())
}

/// Starts a daemon for `spec` and waits until it serves (or failed). Returns the daemon's
/// READY facts (pid, export address, lower mappings). `lower` (`dm create --lower`, else
/// empty) are created first, in order, in the same registry, each answering on its own
/// control socket.
pub fn spawn_stack(spec: &ServeSpec, lower: &[LowerTable]) -> Result<Value, Failure> {
    check_stack_names(&spec.name, &lower_names(spec, lower))?;
    let log = control::runtime_dir()?.join(format!("{}.log", spec.name));
    let log_file = std::fs::File::create(&log)?;
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.arg("__serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file));
    // Detach from the terminal's session so the daemon outlives the shell that opened it.
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid is async-signal-safe and touches no Rust state.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    {
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let text = Zeroizing::new(
            serde_json::to_string(&DaemonSpecRef { spec, lower }).expect("spec serialises"),
        );
        stdin.write_all(text.as_bytes())?;
    }
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout is piped")).read_line(&mut line)?;
    if let Some(rest) = line.strip_prefix("READY ") {
        return Ok(serde_json::from_str(rest).unwrap_or(Value::Null));
    }
    let _ = child.wait();
    let detail = line
        .strip_prefix("ERROR ")
        .map(str::to_string)
        .unwrap_or_else(|| format!("daemon exited before serving; see {}", log.display()));
    let (code, msg) = match detail.split_once(' ') {
        Some((c, m)) if c.parse::<i32>().is_ok() => (c.parse::<i32>().unwrap(), m.to_string()),
        _ => (ExitCode::WrongDevice as i32, detail.clone()),
    };
    Err(Failure::new(code_from_i32(code), msg.trim().to_string()))
}

fn code_from_i32(code: i32) -> ExitCode {
    match code {
        1 => ExitCode::WrongParameters,
        2 => ExitCode::NoPermission,
        3 => ExitCode::OutOfMemory,
        5 => ExitCode::Busy,
        _ => ExitCode::WrongDevice,
    }
}

/// Entry point of `cryptblk __serve`: reads the spec from stdin, serves until closed.
pub fn daemon_main() -> i32 {
    let mut text = Zeroizing::new(String::new());
    if std::io::stdin().read_to_string(&mut text).is_err() {
        return 1;
    }
    let DaemonSpec { spec, lower } = match serde_json::from_str(&text) {
        Ok(s) => s,
        Err(e) => {
            println!("ERROR 1 malformed serve spec: {e}");
            return 1;
        }
    };
    drop(text);
    let mut ready = std::io::stdout();
    match serve_stack(spec, lower, |facts| {
        let _ = writeln!(ready, "READY {facts}");
        let _ = ready.flush();
        // Closing stdout tells the parent we are up even if it stops reading.
        // SAFETY: fd 1 is ours; later prints go nowhere, logs go to stderr.
        unsafe { libc::close(1) };
    }) {
        Ok(()) => 0,
        Err(f) => {
            let _ = writeln!(std::io::stdout(), "ERROR {} {}", f.code as i32, f.message);
            eprintln!("cryptblk daemon: {}", f.message);
            f.code as i32
        }
    }
}

/// A running export, stopped on close.
enum Export {
    Nbd(NbdServer),
    Fuse(FuseExport),
    Ublk(UblkExport),
    None,
}

impl Export {
    fn describe(&self) -> Value {
        match self {
            Export::Nbd(s) => json!({ "kind": "nbd", "uri": s.uri() }),
            Export::Fuse(f) => json!({ "kind": "fuse", "file": f.file_path() }),
            Export::Ublk(u) => json!({
                "kind": "ublk",
                "dev": u.dev_path(),
                "queues": u.queues(),
                "depth": u.queue_depth(),
            }),
            Export::None => json!({ "kind": "none" }),
        }
    }

    fn stop(self) -> Result<(), String> {
        match self {
            Export::Nbd(s) => s.stop().map_err(|e| e.to_string()),
            Export::Fuse(mut f) => f.unmount().map_err(|e| e.to_string()),
            Export::Ublk(u) => u.stop().map_err(|e| e.to_string()),
            Export::None => Ok(()),
        }
    }
}

/// A control socket that answers for one lower mapping of the stack, so `dm table`,
/// `dm status`, `dm remove` and `dm ls` see it under its own name, as in the kernel.
struct LowerSocket {
    name: String,
    path: PathBuf,
    listener: UnixListener,
}

/// Binds the control socket of `name` (replacing a stale one nobody answers on).
fn bind_control(name: &str) -> Result<(PathBuf, UnixListener), Failure> {
    let path = control::socket_path(name)?;
    if UnixStream::connect(&path).is_ok() {
        return Err(Failure::new(
            ExitCode::Busy,
            format!("Device {name} already exists."),
        ));
    }
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)
        .map_err(|e| Failure::device(format!("cannot bind {}: {e}", path.display())))?;
    Ok((path, listener))
}

/// Serves `spec` in this process until `close` or SIGTERM/SIGINT. `on_ready` is called once
/// the export accepts I/O and the control sockets answer. Lower mappings are created first:
/// the keyless ones of `spec.info.lower`, then `secret_lower` (`dm create --lower`). The top
/// mapping is exported; every lower one answers on its own control socket; closing the top
/// ends them all.
pub fn serve_stack(
    spec: ServeSpec,
    secret_lower: Vec<LowerTable>,
    on_ready: impl FnOnce(&Value),
) -> Result<(), Failure> {
    block_termination_signals();
    let lower_names = lower_names(&spec, &secret_lower);
    check_stack_names(&spec.name, &lower_names)?;
    // A read-only volume opens every backing O_RDONLY, and its targets load read-only (an
    // integrity target then never writes: no journal replay to disk, no bitmap).
    let registry = Registry::with_file_options(FileOptions {
        read_only: spec.readonly,
        ..FileOptions::default()
    });
    {
        let keyless = lower_tables(&spec.info);
        let tables = keyless.iter().map(|(n, t)| (n.as_str(), t.as_str())).chain(
            secret_lower
                .iter()
                .map(|l| (l.name.as_str(), l.table.as_str())),
        );
        for (name, table) in tables {
            registry
                .create(name, table)
                .map_err(|e| Failure::new(ExitCode::WrongDevice, format!("{name}: {e}")))?;
        }
    }
    drop(secret_lower);
    let mapping = registry.create(&spec.name, &spec.table).map_err(|e| {
        let msg = e.to_string();
        if lower_names.is_empty() {
            Failure::new(ExitCode::WrongDevice, msg)
        } else {
            Failure::new(ExitCode::WrongDevice, format!("{}: {msg}", spec.name))
        }
    })?;
    let device: Arc<dyn BlockDevice> = mapping.clone();
    let export = match &spec.export {
        ExportSpec::NbdUnix(path) => {
            let mut cfg = NbdConfig::unix(path);
            cfg.read_only = spec.readonly;
            cfg.description = format!("cryptblk {}", spec.name);
            Export::Nbd(start_nbd(device, cfg)?)
        }
        ExportSpec::NbdTcp(addr) => {
            let sock = addr.parse().map_err(|_| {
                Failure::usage(format!("invalid NBD address '{addr}' (want host:port)"))
            })?;
            let mut cfg = NbdConfig::new(NbdListen::Tcp(sock));
            cfg.read_only = spec.readonly;
            Export::Nbd(start_nbd(device, cfg)?)
        }
        ExportSpec::Fuse(dir) => {
            let mut cfg = FuseConfig::new(dir);
            cfg.read_only = spec.readonly;
            Export::Fuse(FuseExport::mount(device, cfg).map_err(|e| {
                Failure::device(format!(
                    "cannot mount FUSE export at {}: {e}",
                    dir.display()
                ))
            })?)
        }
        ExportSpec::Ublk { queues, depth } => {
            let cfg = UblkConfig {
                queues: *queues,
                queue_depth: *depth,
                read_only: spec.readonly,
                ..UblkConfig::default()
            };
            Export::Ublk(
                UblkExport::start(device, cfg)
                    .map_err(|e| Failure::device(format!("cannot start ublk export: {e}")))?,
            )
        }
        ExportSpec::None => Export::None,
    };

    let mut lower_sockets: Vec<LowerSocket> = Vec::new();
    let mut bound = Ok(());
    for name in &lower_names {
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
    let top = bound.and_then(|()| bind_control(&spec.name));
    let (ctl_path, listener) = match top {
        Ok(t) => t,
        Err(f) => {
            for s in &lower_sockets {
                let _ = std::fs::remove_file(&s.path);
            }
            let _ = export.stop();
            return Err(f);
        }
    };
    spawn_signal_watcher(ctl_path.clone());

    let facts = json!({
        "name": spec.name,
        "pid": std::process::id(),
        "export": export.describe(),
        "lower": lower_names,
    });
    on_ready(&facts);

    let stopping = AtomicBool::new(false);
    let ctx = Ctx {
        spec: &spec,
        registry: &registry,
        export: &export,
        stopping: &stopping,
        lower: &lower_names,
    };
    loop {
        let Ok((which, stream)) = accept_next(&listener, &lower_sockets) else {
            continue;
        };
        let target = which.map_or(spec.name.as_str(), |i| lower_sockets[i].name.as_str());
        handle_client(stream, &ctx, target);
        // A lower mapping removed with `dm remove` (possible once a reload of the top no
        // longer uses it) stops answering under its name.
        lower_sockets.retain(|s| {
            let live = registry.lookup(&s.name).is_some();
            if !live {
                let _ = std::fs::remove_file(&s.path);
            }
            live
        });
        if stopping.load(Ordering::SeqCst) {
            break;
        }
    }
    let flushed = mapping.flush();
    let stopped = export.stop();
    drop(mapping);
    let _ = registry.remove(&spec.name);
    for name in lower_names.iter().rev() {
        if let Some(m) = registry.lookup(name) {
            let _ = m.flush();
        }
        let _ = registry.remove(name);
    }
    for s in &lower_sockets {
        let _ = std::fs::remove_file(&s.path);
    }
    // Last: `close` waits for the socket to vanish, so it must mean "stopped and flushed"
    // (a ublk node gone, the backing written back) before a script reuses the backing.
    let _ = std::fs::remove_file(&ctl_path);
    flushed.map_err(|e| Failure::device(format!("flush on close failed: {e}")))?;
    stopped.map_err(Failure::device)?;
    Ok(())
}

/// Keyless lower layers to create, in order, before the top table, which stacks on them
/// by name (LUKS2 `--integrity`: the `<name>_dif` integrity mapping under dm-crypt). They
/// travel in `info.lower` as `[{"name": ..., "table": ...}]` because their tables hold no
/// secret and `status` may show them.
fn lower_tables(info: &Value) -> Vec<(String, String)> {
    info["lower"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| {
            Some((
                l["name"].as_str()?.to_string(),
                l["table"].as_str()?.to_string(),
            ))
        })
        .collect()
}

fn start_nbd(device: Arc<dyn BlockDevice>, cfg: NbdConfig) -> Result<NbdServer, Failure> {
    NbdServer::start(device, cfg)
        .map_err(|e| Failure::device(format!("cannot start NBD server: {e}")))
}

/// Waits for a client on the top mapping's control socket (`None`) or on the socket of
/// lower mapping `Some(i)`.
fn accept_next(
    top: &UnixListener,
    lower: &[LowerSocket],
) -> std::io::Result<(Option<usize>, UnixStream)> {
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
        // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if let Some(i) = fds.iter().position(|p| p.revents != 0) {
            let listener = if i == 0 { top } else { &lower[i - 1].listener };
            let (stream, _) = listener.accept()?;
            return Ok((i.checked_sub(1), stream));
        }
    }
}

/// What requests need from the serving daemon.
struct Ctx<'a> {
    spec: &'a ServeSpec,
    registry: &'a Registry,
    export: &'a Export,
    stopping: &'a AtomicBool,
    /// The stack's lower mappings, in creation order.
    lower: &'a [String],
}

/// One request per connection, for mapping `target` (the top or a lower one): read a JSON
/// line, answer a JSON line.
fn handle_client(stream: UnixStream, ctx: &Ctx, target: &str) {
    let mut line = String::new();
    let Ok(reader_stream) = stream.try_clone() else {
        return;
    };
    if BufReader::new(reader_stream).read_line(&mut line).is_err() {
        return;
    }
    let answer = match serde_json::from_str::<Value>(&line) {
        Ok(req) => answer(&req, ctx, target),
        Err(e) => control::err(ExitCode::WrongParameters, format!("malformed request: {e}")),
    };
    let mut w = stream;
    let _ = w.write_all(format!("{answer}\n").as_bytes());
}

/// True if a table names device `name` (as `name` or `/dev/mapper/name`).
fn table_names_device(table: &str, name: &str) -> bool {
    let dev = format!("/dev/mapper/{name}");
    parse_table_lines(table).is_ok_and(|lines| {
        lines
            .iter()
            .any(|l| l.args.iter().any(|a| a == name || *a == dev))
    })
}

/// `dm remove` of a lower mapping: refused while another mapping of the stack uses it in
/// its live or staged table (the kernel's EBUSY), or while suspended (its flush would wait
/// for a resume that this very loop must answer), else flushed and removed.
fn remove_lower(registry: &Registry, name: &str) -> Value {
    let users: Vec<String> = registry
        .list()
        .into_iter()
        .filter(|other| {
            other != name
                && registry.lookup(other).is_some_and(|m| {
                    table_names_device(&m.table(false), name)
                        || m.staged_table(false)
                            .is_some_and(|t| table_names_device(&t, name))
                })
        })
        .collect();
    if !users.is_empty() {
        return control::err(
            ExitCode::Busy,
            format!("Device {name} is still in use (by {}).", users.join(", ")),
        );
    }
    if let Some(m) = registry.lookup(name) {
        if m.info().suspended {
            return control::err(
                ExitCode::Busy,
                format!("Device {name} is suspended; resume it before removing it."),
            );
        }
        if let Err(e) = m.flush() {
            return control::err(
                ExitCode::WrongDevice,
                format!("flush of {name} failed: {e}"),
            );
        }
    }
    match registry.remove(name) {
        Ok(()) => control::ok(json!({})),
        Err(cryptblk_dm::DmError::Busy(_, why)) => control::err(
            ExitCode::Busy,
            format!("Device {name} is still in use ({why})."),
        ),
        Err(e) => control::err(ExitCode::WrongDevice, e.to_string()),
    }
}

fn answer(req: &Value, ctx: &Ctx, target: &str) -> Value {
    let Ctx {
        spec,
        registry,
        export,
        stopping,
        lower,
    } = *ctx;
    let is_top = target == spec.name;
    let cmd = req["cmd"].as_str().unwrap_or("");
    if cmd == "close" && !is_top {
        return remove_lower(registry, target);
    }
    let Some(mapping) = registry.lookup(target) else {
        return control::err(
            ExitCode::WrongDevice,
            format!("Device {target} is not active."),
        );
    };
    let dm_err = |e: cryptblk_dm::DmError| control::err(ExitCode::WrongParameters, e.to_string());
    match cmd {
        "status" => {
            let info = mapping.info();
            let pipelines = crypt_pipelines(&mapping.table(false));
            // A lower mapping is not exported; it says which mapping serves it.
            let (facts, exported) = if is_top {
                (spec.info.clone(), export.describe())
            } else {
                (
                    json!({ "type": "dm", "stacked_under": spec.name }),
                    json!({ "kind": "none" }),
                )
            };
            let lower: &[String] = if is_top { lower } else { &[] };
            control::ok(json!({
                "name": target,
                "info": facts,
                "size": info.size,
                "suspended": info.suspended,
                "inflight": info.inflight,
                "readonly": spec.readonly,
                "table": mapping.table(false),
                "status": mapping.status(),
                "pipeline": pipelines,
                "export": exported,
                "lower": lower,
                "pid": std::process::id(),
            }))
        }
        "table" => {
            control::ok(json!({ "table": mapping.table(req["showkeys"].as_bool() == Some(true)) }))
        }
        "close" => {
            stopping.store(true, Ordering::SeqCst);
            control::ok(json!({}))
        }
        "suspend" => {
            mapping.suspend();
            control::ok(json!({}))
        }
        "resume" => {
            mapping.resume();
            control::ok(json!({}))
        }
        "reload" => {
            let Some(text) = req["table"].as_str() else {
                return control::err(ExitCode::WrongParameters, "reload needs a table");
            };
            match registry.reload(target, text) {
                Ok(()) => control::ok(json!({})),
                Err(e) => dm_err(e),
            }
        }
        "refresh" => {
            let flags: Vec<String> = req["flags"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            match refreshed_table(&mapping.table(true), &flags) {
                Ok(text) => {
                    let text = Zeroizing::new(text);
                    // dmsetup reload + suspend + resume: in-flight I/O drains, new I/O waits
                    // for the swap, nothing fails. Same registry, so the same open devices.
                    match registry.reload(target, &text) {
                        Ok(()) => {
                            mapping.suspend();
                            mapping.resume();
                            control::ok(json!({ "table": mapping.table(false) }))
                        }
                        Err(e) => dm_err(e),
                    }
                }
                Err(msg) => control::err(ExitCode::WrongParameters, msg),
            }
        }
        other => control::err(
            ExitCode::WrongParameters,
            format!("unknown request '{other}'"),
        ),
    }
}

/// The live table with every crypt line's activation flags (`allow_discards` and the four
/// pipeline flags) replaced by `perf`, as cryptsetup's refresh sets them from the command
/// line alone; the line's format options (`sector_size:`, `iv_large_sectors`, `integrity:`,
/// `integrity_key_size:`) are kept, so a refresh never changes how sectors are encrypted.
fn refreshed_table(table: &str, perf: &[String]) -> Result<String, String> {
    let lines = parse_table_lines(table).map_err(|e| e.to_string())?;
    let given = CryptFlags::parse(perf)?;
    let mut out = String::new();
    for l in lines {
        let mut args = l.args.clone();
        if l.target_type == "crypt" && args.len() >= 5 {
            let opts: &[String] = if args.len() > 6 { &args[6..] } else { &[] };
            let f = CryptFlags {
                allow_discards: given.allow_discards,
                same_cpu_crypt: given.same_cpu_crypt,
                submit_from_crypt_cpus: given.submit_from_crypt_cpus,
                no_read_workqueue: given.no_read_workqueue,
                no_write_workqueue: given.no_write_workqueue,
                ..CryptFlags::parse(opts)?
            };
            args.truncate(5);
            let formatted = f.format();
            if !formatted.is_empty() {
                args.push(formatted.len().to_string());
                args.extend(formatted);
            }
        }
        let mut fields = vec![
            l.start.to_string(),
            l.len.to_string(),
            l.target_type.clone(),
        ];
        fields.extend(args);
        out.push_str(&fields.join(" "));
        out.push('\n');
    }
    Ok(out)
}

/// For `status`: the pipeline of each crypt line per direction, read from its flags.
fn crypt_pipelines(table: &str) -> Vec<Value> {
    let Ok(lines) = parse_table_lines(table) else {
        return Vec::new();
    };
    lines
        .iter()
        .filter(|l| l.target_type == "crypt")
        .map(|l| {
            let opts: &[String] = if l.args.len() > 6 { &l.args[6..] } else { &[] };
            let f = CryptFlags::parse(opts).unwrap_or_default();
            json!({
                "start": l.start,
                "read": if f.no_read_workqueue { "inline" } else { "queued" },
                "write": if f.no_write_workqueue { "inline" } else { "queued" },
                "flags": f.format(),
            })
        })
        .collect()
}

/// Blocks SIGTERM/SIGINT/SIGHUP in this thread (and all threads started later), so one
/// watcher thread can receive them synchronously.
fn block_termination_signals() {
    // SAFETY: plain libc signal-mask calls on a local sigset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// On SIGTERM/SIGINT/SIGHUP, asks our own control socket to close, so termination takes the
/// same path as `cryptblk close`: flush, stop the export, exit.
fn spawn_signal_watcher(ctl: PathBuf) {
    std::thread::spawn(move || {
        // SAFETY: sigwait on a set of signals this process has blocked.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGHUP);
            let mut sig = 0;
            libc::sigwait(&set, &mut sig);
        }
        if let Ok(mut s) = UnixStream::connect(&ctl) {
            let _ = s.write_all(b"{\"cmd\":\"close\"}\n");
            let mut sink = String::new();
            let _ = BufReader::new(s).read_line(&mut sink);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refresh_replaces_only_activation_flags() {
        let t = "0 8 crypt aes-xts-plain64 00 0 /dev/x 0 3 allow_discards sector_size:4096 same_cpu_crypt\n";
        let out = refreshed_table(
            t,
            &["no_read_workqueue".into(), "no_write_workqueue".into()],
        )
        .unwrap();
        assert_eq!(
            out,
            "0 8 crypt aes-xts-plain64 00 0 /dev/x 0 3 no_read_workqueue no_write_workqueue sector_size:4096\n"
        );
        let queued = refreshed_table(&out, &["allow_discards".into()]).unwrap();
        assert_eq!(
            queued,
            "0 8 crypt aes-xts-plain64 00 0 /dev/x 0 2 allow_discards sector_size:4096\n"
        );
    }

    #[test]
    fn refresh_keeps_authenticated_encryption_options() {
        let t = "0 8 crypt capi:authenc(hmac(sha256),xts(aes))-random 00 0 /dev/x 0 3 \
                 integrity:32:aead integrity_key_size:40 sector_size:4096\n";
        let out = refreshed_table(t, &["no_read_workqueue".into()]).unwrap();
        assert_eq!(
            out,
            "0 8 crypt capi:authenc(hmac(sha256),xts(aes))-random 00 0 /dev/x 0 4 \
             no_read_workqueue integrity:32:aead integrity_key_size:40 sector_size:4096\n"
        );
    }

    #[test]
    fn users_of_a_lower_mapping_are_found_by_name_or_mapper_path() {
        let t = "0 8 crypt capi:gcm(aes)-random 00 0 /dev/mapper/x_dif 0 1 integrity:28:aead\n";
        assert!(table_names_device(t, "x_dif"));
        assert!(!table_names_device(t, "x"));
        assert!(table_names_device("0 8 linear x_dif 0\n", "x_dif"));
        assert!(!table_names_device(
            "0 8 linear /dev/mapper/x_dif2 0\n",
            "x_dif"
        ));
    }

    #[test]
    fn refresh_leaves_other_targets_alone() {
        let t = "0 8 linear /dev/x 0\n8 8 zero\n";
        assert_eq!(
            refreshed_table(t, &["no_read_workqueue".into()]).unwrap(),
            t
        );
    }
}
