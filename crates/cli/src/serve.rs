//! The daemon that keeps a mapping alive and serves it: one process per open volume.
//!
//! `open` and `dm create` unlock and build the table in the foreground, then start
//! `cryptblk __serve` and hand it a [`ServeSpec`] over a pipe (the table carries the volume
//! key, so it never appears on a command line or in the environment). The daemon builds the
//! mapping, starts the export, binds its control socket, and only then answers `READY`, so the
//! parent returns exactly when the export accepts I/O.

use crate::control;
use crate::exit::{ExitCode, Failure};
use cryptblk_dm::backing::FileOptions;
use cryptblk_dm::crypt::CryptFlags;
use cryptblk_dm::table::parse_table_lines;
use cryptblk_dm::{BlockDevice, Mapping, Registry};
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

/// Starts a daemon for `spec` and waits until it serves (or failed). Returns the daemon's
/// READY facts (pid, export address).
pub fn spawn(spec: &ServeSpec) -> Result<Value, Failure> {
    let ctl = control::socket_path(&spec.name)?;
    if UnixStream::connect(&ctl).is_ok() {
        return Err(Failure::new(
            ExitCode::Busy,
            format!("Device {} already exists.", spec.name),
        ));
    }
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
        let text = Zeroizing::new(serde_json::to_string(spec).expect("spec serialises"));
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
    let spec: ServeSpec = match serde_json::from_str(&text) {
        Ok(s) => s,
        Err(e) => {
            println!("ERROR 1 malformed serve spec: {e}");
            return 1;
        }
    };
    drop(text);
    let mut ready = std::io::stdout();
    match serve(spec, |facts| {
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

/// Serves `spec` in this process until `close` or SIGTERM/SIGINT. `on_ready` is called once
/// the export accepts I/O and the control socket answers.
pub fn serve(spec: ServeSpec, on_ready: impl FnOnce(&Value)) -> Result<(), Failure> {
    block_termination_signals();
    // A read-only volume opens every backing O_RDONLY, and its targets load read-only (an
    // integrity target then never writes: no journal replay to disk, no bitmap).
    let registry = Registry::with_file_options(FileOptions {
        read_only: spec.readonly,
        ..FileOptions::default()
    });
    let lower = lower_tables(&spec.info);
    for (name, table) in &lower {
        registry
            .create(name, table)
            .map_err(|e| Failure::new(ExitCode::WrongDevice, format!("{name}: {e}")))?;
    }
    let mapping = registry
        .create(&spec.name, &spec.table)
        .map_err(|e| Failure::new(ExitCode::WrongDevice, e.to_string()))?;
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

    let ctl_path = control::socket_path(&spec.name)?;
    let _ = std::fs::remove_file(&ctl_path);
    let listener = UnixListener::bind(&ctl_path)
        .map_err(|e| Failure::device(format!("cannot bind {}: {e}", ctl_path.display())))?;
    spawn_signal_watcher(ctl_path.clone());

    let facts =
        json!({ "name": spec.name, "pid": std::process::id(), "export": export.describe() });
    on_ready(&facts);

    let stopping = AtomicBool::new(false);
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        handle_client(stream, &spec, &registry, &mapping, &export, &stopping);
        if stopping.load(Ordering::SeqCst) {
            break;
        }
    }
    let flushed = mapping.flush();
    let stopped = export.stop();
    let _ = registry.remove(&spec.name);
    for (name, _) in lower.iter().rev() {
        let _ = registry.remove(name);
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

/// One request per connection: read a JSON line, answer a JSON line.
fn handle_client(
    stream: UnixStream,
    spec: &ServeSpec,
    registry: &Registry,
    mapping: &Arc<Mapping>,
    export: &Export,
    stopping: &AtomicBool,
) {
    let mut line = String::new();
    let Ok(reader_stream) = stream.try_clone() else {
        return;
    };
    if BufReader::new(reader_stream).read_line(&mut line).is_err() {
        return;
    }
    let answer = match serde_json::from_str::<Value>(&line) {
        Ok(req) => answer(&req, spec, registry, mapping, export, stopping),
        Err(e) => control::err(ExitCode::WrongParameters, format!("malformed request: {e}")),
    };
    let mut w = stream;
    let _ = w.write_all(format!("{answer}\n").as_bytes());
}

fn answer(
    req: &Value,
    spec: &ServeSpec,
    registry: &Registry,
    mapping: &Arc<Mapping>,
    export: &Export,
    stopping: &AtomicBool,
) -> Value {
    let dm_err = |e: cryptblk_dm::DmError| control::err(ExitCode::WrongParameters, e.to_string());
    match req["cmd"].as_str().unwrap_or("") {
        "status" => {
            let info = mapping.info();
            let pipelines = crypt_pipelines(&mapping.table(false));
            control::ok(json!({
                "name": spec.name,
                "info": spec.info,
                "size": info.size,
                "suspended": info.suspended,
                "inflight": info.inflight,
                "readonly": spec.readonly,
                "table": mapping.table(false),
                "status": mapping.status(),
                "pipeline": pipelines,
                "export": export.describe(),
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
            match registry.reload(&spec.name, text) {
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
                    match registry.reload(&spec.name, &text) {
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
    fn refresh_leaves_other_targets_alone() {
        let t = "0 8 linear /dev/x 0\n8 8 zero\n";
        assert_eq!(
            refreshed_table(t, &["no_read_workqueue".into()]).unwrap(),
            t
        );
    }
}
