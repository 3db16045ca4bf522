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
//!
//! Modules, one job each: [`spawn`] starts the process and hands over the spec, [`stack`]
//! builds and tears down the mappings and the export, [`control`] answers control requests
//! and turns signals into `close`, [`tables`] reads and rewrites table text for requests.

mod control;
pub mod devlink;
mod spawn;
mod stack;

pub use spawn::spawn_stack;

use crate::exit::{ExitCode, Failure};
use cryptblk_volume::control as client;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

/// How a mapping is exported.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum ExportSpec {
    /// NBD on a Unix socket at this path.
    NbdUnix(PathBuf, NbdLimits),
    /// NBD on TCP at this address (loopback unless the user names another).
    NbdTcp(String, NbdLimits),
    /// A FUSE mount at this directory holding one file, `disk`.
    Fuse(PathBuf),
    /// The kernel block device /dev/ublkbN; `queues` None means one per CPU.
    Ublk {
        /// Hardware queues (threads).
        queues: Option<u16>,
        /// Requests in flight per queue.
        depth: u16,
    },
    /// A vhost-user-blk device on the Unix socket at this path.
    VhostUser {
        /// The socket a hypervisor connects to.
        socket: PathBuf,
        /// Virtqueues offered (threads).
        queues: u16,
    },
    /// No export: only the control socket (useful for stacking and tests).
    None,
}

/// The NBD server's bounds (`--max-clients`, `--handshake-timeout`, `--idle-timeout`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct NbdLimits {
    /// Clients served at once.
    pub max_clients: usize,
    /// Seconds a client may take to finish negotiating.
    pub handshake_timeout: u64,
    /// Seconds without requests before a connection is closed; 0 never.
    pub idle_timeout: u64,
    /// `--tls`: off, on or require.
    #[serde(default = "tls_off")]
    pub tls: cryptblk_export::nbd::TlsMode,
    /// `--tls-certificates`: the directory of ca-cert.pem, server-cert.pem, server-key.pem.
    #[serde(default)]
    pub tls_certificates: Option<PathBuf>,
    /// `--tls-verify-peer`: clients need a certificate the CA signed.
    #[serde(default)]
    pub tls_verify_peer: bool,
    /// `--allow-insecure-tcp`: plaintext clients on a non-loopback address are accepted.
    #[serde(default)]
    pub allow_insecure_tcp: bool,
}

fn tls_off() -> cryptblk_export::nbd::TlsMode {
    cryptblk_export::nbd::TlsMode::Off
}

impl NbdLimits {
    /// These limits applied to an NBD server configuration (loading the TLS certificates).
    pub fn apply(&self, cfg: &mut cryptblk_export::nbd::NbdConfig) -> Result<(), String> {
        use cryptblk_export::nbd::{NbdTls, TlsMode};
        cfg.tls = match (self.tls, &self.tls_certificates) {
            (TlsMode::Off, _) => None,
            (mode, Some(dir)) => Some(
                NbdTls::from_dir(dir, mode == TlsMode::Require, self.tls_verify_peer)
                    .map_err(|e| e.to_string())?,
            ),
            (_, None) => return Err("--tls on or require needs --tls-certificates".to_string()),
        };
        cfg.allow_insecure_tcp = self.allow_insecure_tcp;
        cfg.max_clients = self.max_clients;
        cfg.handshake_timeout = std::time::Duration::from_secs(self.handshake_timeout);
        cfg.idle_timeout =
            (self.idle_timeout > 0).then(|| std::time::Duration::from_secs(self.idle_timeout));
        Ok(())
    }
}

/// Everything the daemon needs. Contains key material: only ever sent through a pipe.
#[derive(Serialize, Deserialize)]
pub struct ServeSpec {
    /// Mapping name.
    pub name: String,
    /// The dm table, keys included.
    #[serde(with = "table_lines")]
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

/// Entry point of `cryptblk __serve`: reads the spec from stdin, serves until closed.
pub fn daemon_main() -> i32 {
    // Before the key arrives: nothing of this process may end up in a core file or be read
    // by another process of the same user.
    if let Err(e) = protect_key_memory() {
        eprintln!("cryptblk daemon: {e}");
        return ExitCode::WrongParameters as i32;
    }
    crate::logger::install(crate::logger::Process::Daemon);
    let (spec, lower) = match spawn::read_handover() {
        Ok(s) => s,
        Err(code) => return code,
    };
    match serve_stack(spec, lower, spawn::report_ready) {
        Ok(()) => 0,
        Err(f) => {
            spawn::report_error(&f);
            eprintln!("cryptblk daemon: {}", f.message);
            f.code as i32
        }
    }
}

/// Makes this process hold keys safely: no core dumps (`RLIMIT_CORE` 0) and not dumpable
/// (`PR_SET_DUMPABLE` 0: no core files even where the limit is raised again, and no
/// same-user `ptrace` attach or read of `/proc/PID/mem`; the kernel also makes the process's
/// `/proc` files root's).
pub fn protect_key_memory() -> std::io::Result<()> {
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on a value that lives across them.
    if unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(
            e.kind(),
            format!("cannot disable core dumps: {e}"),
        ));
    }
    // SAFETY: PR_SET_DUMPABLE takes one integer argument; the rest are ignored.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(
            e.kind(),
            format!("cannot make the daemon non-dumpable: {e}"),
        ));
    }
    Ok(())
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
    control::block_termination_signals();
    let lower_names = lower_names(&spec, &secret_lower);
    check_stack_names(&spec.name, &lower_names)?;
    let stack = stack::Stack::build(spec, secret_lower, lower_names)?;
    let mut sockets = match control::Sockets::bind(&stack.spec().name, stack.lower()) {
        Ok(s) => s,
        Err(f) => {
            stack.abandon();
            return Err(f);
        }
    };
    control::spawn_signal_watcher(sockets.top_path().to_path_buf());
    on_ready(&json!({
        "name": stack.spec().name,
        "pid": std::process::id(),
        "export": stack.export_info(),
        "lower": stack.lower(),
    }));
    control::serve(&stack, &mut sockets);
    // STOPPING=1 to a service manager (only `open --foreground` has NOTIFY_SOCKET).
    cryptblk_systemd::notify::stopping(&stack.spec().name);
    let closed = stack.close();
    // Last: `close` waits for the socket to vanish, so it must mean "stopped and flushed"
    // (a ublk node gone, the backing written back) before a script reuses the backing.
    sockets.remove();
    closed
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
        if UnixStream::connect(client::socket_path(name)?).is_ok() {
            return Err(Failure::new(
                ExitCode::Busy,
                format!("Device {name} already exists."),
            ));
        }
    }
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
