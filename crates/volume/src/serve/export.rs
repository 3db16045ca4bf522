//! The one serialisable export setting ([`ExportSpec`]): what the command line asks for
//! and what a daemon is handed, turned into the export crate's runtime
//! [`ExportConfig`] and started by [`start_export`].
//!
//! Invariant: `ExportSpec` holds settings only (paths, addresses, bounds, never loaded
//! certificates or keys), so it crosses the daemon's pipe as JSON; everything that must be
//! loaded (TLS certificates) is loaded by the daemon when the export starts.
//!
//! Adding an export: a module and one `exports!` line in `cryptblk_export`, a variant here
//! with its arm in [`start_export`], and the option that picks it in the CLI's arguments.

use crate::VolumeError as Failure;
use cryptblk_dm::BlockDevice;
use cryptblk_export::fuse::FuseConfig;
use cryptblk_export::nbd::{NbdConfig, NbdListen};
use cryptblk_export::ublk::UblkConfig;
use cryptblk_export::vhost_user::VhostUserConfig;
use cryptblk_export::{Export, ExportConfig};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;

use super::spec::ServeSpec;

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

impl Default for NbdLimits {
    /// The NBD server's own defaults, TLS off.
    fn default() -> Self {
        NbdLimits {
            max_clients: cryptblk_export::nbd::DEFAULT_MAX_CLIENTS,
            handshake_timeout: cryptblk_export::nbd::DEFAULT_HANDSHAKE_TIMEOUT.as_secs(),
            idle_timeout: 0,
            tls: tls_off(),
            tls_certificates: None,
            tls_verify_peer: false,
            allow_insecure_tcp: false,
        }
    }
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

/// Starts the export `spec` asks for on `device`, through the export registry; it is ready
/// when this returns.
pub fn start_export(
    spec: &ServeSpec,
    device: Arc<dyn BlockDevice>,
) -> Result<Box<dyn Export>, Failure> {
    let (config, what) = match &spec.export {
        ExportSpec::NbdUnix(path, limits) => {
            let mut cfg = NbdConfig::unix(path);
            limits
                .apply(&mut cfg)
                .map_err(|e| Failure::usage(format!("cannot start NBD server: {e}")))?;
            cfg.read_only = spec.readonly;
            cfg.description = format!("cryptblk {}", spec.name);
            (
                ExportConfig::Nbd(cfg),
                "cannot start NBD server".to_string(),
            )
        }
        ExportSpec::NbdTcp(addr, limits) => {
            let sock = addr.parse().map_err(|_| {
                Failure::usage(format!("invalid NBD address '{addr}' (want host:port)"))
            })?;
            let mut cfg = NbdConfig::new(NbdListen::Tcp(sock));
            limits
                .apply(&mut cfg)
                .map_err(|e| Failure::usage(format!("cannot start NBD server: {e}")))?;
            cfg.read_only = spec.readonly;
            (
                ExportConfig::Nbd(cfg),
                "cannot start NBD server".to_string(),
            )
        }
        ExportSpec::Fuse(dir) => {
            let mut cfg = FuseConfig::new(dir);
            cfg.read_only = spec.readonly;
            let what = format!("cannot mount FUSE export at {}", dir.display());
            (ExportConfig::Fuse(cfg), what)
        }
        ExportSpec::Ublk { queues, depth } => {
            let cfg = UblkConfig {
                queues: *queues,
                queue_depth: *depth,
                read_only: spec.readonly,
                ..UblkConfig::default()
            };
            (
                ExportConfig::Ublk(cfg),
                "cannot start ublk export".to_string(),
            )
        }
        ExportSpec::VhostUser { socket, queues } => {
            let mut cfg = VhostUserConfig::new(socket);
            cfg.queues = *queues;
            cfg.read_only = spec.readonly;
            let what = format!("cannot start vhost-user export on {}", socket.display());
            (ExportConfig::VhostUser(cfg), what)
        }
        ExportSpec::None => (ExportConfig::None, String::new()),
    };
    cryptblk_export::start(config, device).map_err(|e| Failure::device(format!("{what}: {e}")))
}
