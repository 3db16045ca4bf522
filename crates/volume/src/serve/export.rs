//! Starting the export a daemon is handed. The export's settings are one serialisable type,
//! the export crate's [`ExportConfig`]: what the command line builds, what crosses the
//! daemon's pipe inside a [`ServeSpec`], and what starts the export.
//!
//! Invariant: an `ExportConfig` holds settings only (paths, addresses, bounds; TLS
//! certificates by directory, never loaded keys), so it crosses the pipe as JSON; the daemon
//! loads the certificates when the export starts. The spec's `readonly` decides the export's
//! read-only mode, whatever the config says.
//!
//! Adding an export: a module and one `exports!` line in `cryptblk_export`, its error context
//! in [`start_export`], and the option that builds its config in the CLI's arguments.

use crate::VolumeError as Failure;
use cryptblk_dm::BlockDevice;
use cryptblk_export::{Export, ExportConfig};
use std::sync::Arc;

use super::spec::ServeSpec;

/// Starts the export `spec` asks for on `device`, through the export registry, read-only
/// when `spec.readonly`; it is ready when this returns. Unloadable TLS certificates are
/// wrong parameters (exit 1); an export that fails to start is a device error (exit 4).
pub fn start_export(
    spec: &ServeSpec,
    device: Arc<dyn BlockDevice>,
) -> Result<Box<dyn Export>, Failure> {
    let mut config = spec.export.clone();
    config.set_read_only(spec.readonly);
    let what = match &mut config {
        ExportConfig::Nbd(cfg) => {
            if let Some(tls) = cfg.tls.as_mut() {
                tls.load()
                    .map_err(|e| Failure::usage(format!("cannot start NBD server: {e}")))?;
            }
            "cannot start NBD server".to_string()
        }
        ExportConfig::Fuse(cfg) => {
            format!("cannot mount FUSE export at {}", cfg.mountpoint.display())
        }
        ExportConfig::Ublk(cfg) => {
            // Recorded with the device, so a restarted daemon takes over the one it left.
            cfg.volume.get_or_insert_with(|| spec.name.clone());
            "cannot start ublk export".to_string()
        }
        ExportConfig::VhostUser(cfg) => {
            format!("cannot start vhost-user export on {}", cfg.socket.display())
        }
        ExportConfig::None => String::new(),
    };
    cryptblk_export::start(config, device).map_err(|e| Failure::device(format!("{what}: {e}")))
}
