//! One configuration's device stack (a named mapping over its own RAM disk) and the ways it
//! is served: directly, over NBD, and through FUSE + a loop device.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use cryptblk_cipher::SecretBytes;
use cryptblk_dm::{BlockDevice, Mapping, Registry};
use cryptblk_export::{FuseConfig, FuseExport, NbdConfig, NbdServer};

use crate::config::Configuration;
use crate::pattern::GenerationMap;
use crate::BenchError;

/// A configuration, loaded and ready for I/O.
pub struct ConfigStack {
    /// The configuration.
    pub config: Configuration,
    /// The live mapping (what every transport serves).
    pub mapping: Arc<Mapping>,
    /// The RAM disk's spec, e.g. `ram:1G#plain`.
    pub backing: String,
    /// Device size in bytes.
    pub size: u64,
    /// Pattern generations of the in-process region.
    pub generations: GenerationMap,
    key: Option<SecretBytes>,
    registry: Arc<Registry>,
    nbd: Option<NbdServer>,
    fuse_loop: Option<FuseLoop>,
}

impl ConfigStack {
    /// Creates mapping `cryptblk-bench-<name>` over a fresh `ram:` disk of `size` bytes with a
    /// new random key. `region` is the in-process area's length.
    pub fn create(
        registry: &Arc<Registry>,
        config: &Configuration,
        size: u64,
        region: u64,
    ) -> Result<Self, BenchError> {
        let backing = format!("ram:{}#bench-{}-{}", size, config.name, std::process::id());
        let key = config.generate_key();
        let table = config.table(&backing, size, key.as_ref())?;
        let name = format!("cryptblk-bench-{}", config.name);
        // A stale mapping of the same name (an earlier run in this process) goes first.
        let _ = registry.remove(&name);
        let mapping = registry
            .create(&name, &table)
            .map_err(|e| BenchError::Dm(format!("{}: {e}", config.name)))?;
        Ok(ConfigStack {
            config: config.clone(),
            mapping,
            backing,
            size,
            generations: GenerationMap::new(region),
            key,
            registry: registry.clone(),
            nbd: None,
            fuse_loop: None,
        })
    }

    /// The device to drive.
    pub fn device(&self) -> Arc<dyn BlockDevice> {
        self.mapping.clone()
    }

    /// The live table with the key masked (`dmsetup table`).
    pub fn table(&self) -> String {
        self.mapping.table(false).trim_end().to_string()
    }

    /// "read pipeline/write pipeline" of a crypt target (`inline`, `queued`, ...), as the dm
    /// crate reports what it actually runs: proof that a flag took effect.
    pub fn pipelines(&self) -> Option<String> {
        let stats = self.mapping.stats();
        let crypt = stats.iter().find(|s| s.target_type == "crypt")?;
        Some(format!(
            "{}/{}",
            crypt.fact("read_pipeline")?,
            crypt.fact("write_pipeline")?
        ))
    }

    /// Replaces the live table by this configuration's table with `flags` (same key, same
    /// RAM disk) under load: reload, suspend (drains in-flight I/O), resume. Returns how long
    /// the device was suspended.
    pub fn flip_flags(&self, flags: &[&str]) -> Result<Duration, BenchError> {
        let other = self.config.with_flags(&self.config.name, flags);
        let table = other.table(&self.backing, self.size, self.key.as_ref())?;
        // The live table holds the RAM disk open, and the registry hands out open devices by
        // spec, so the new table lands on the very same disk (as `dmsetup reload` would).
        let loaded = self
            .registry
            .load_table(&table)
            .map_err(|e| BenchError::Dm(format!("reloading {}: {e}", self.config.name)))?;
        self.mapping.reload(loaded);
        let t0 = std::time::Instant::now();
        self.mapping
            .suspend()
            .and_then(|()| self.mapping.resume())
            .map_err(|e| BenchError::Dm(format!("swapping {}: {e}", self.config.name)))?;
        Ok(t0.elapsed())
    }

    /// The NBD URI serving this stack, starting the server on first use (Unix socket in
    /// `dir`).
    pub fn nbd_uri(&mut self, dir: &Path) -> Result<String, BenchError> {
        if self.nbd.is_none() {
            self.nbd = Some(serve_nbd(self.device(), dir, &self.config.name)?);
        }
        Ok(self.nbd.as_ref().map(|s| s.uri()).unwrap_or_default())
    }

    /// The loop device over this stack's FUSE export, setting both up on first use.
    pub fn loop_device(&mut self, dir: &Path) -> Result<&FuseLoop, BenchError> {
        if self.fuse_loop.is_none() {
            self.fuse_loop = Some(FuseLoop::setup(
                self.device(),
                &dir.join(&self.config.name),
            )?);
        }
        Ok(self.fuse_loop.as_ref().expect("just set"))
    }

    /// Stops the servers (also done on drop).
    pub fn shutdown(&mut self) {
        self.fuse_loop = None;
        if let Some(s) = self.nbd.take() {
            let _ = s.stop();
        }
    }
}

impl Drop for ConfigStack {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Serves `device` with cryptblk's [`NbdServer`] on the Unix socket `<dir>/<name>.sock`
/// (every fio-over-NBD run of the benchmarks goes through this).
pub fn serve_nbd(
    device: Arc<dyn BlockDevice>,
    dir: &Path,
    name: &str,
) -> Result<NbdServer, BenchError> {
    let sock = dir.join(format!("{name}.sock"));
    NbdServer::start(device, NbdConfig::unix(&sock))
        .map_err(|e| BenchError::Export(format!("NBD server for {name}: {e}")))
}

/// A FUSE export of a device with a loop device attached to its file.
pub struct FuseLoop {
    /// The loop device, e.g. `/dev/loop3`.
    pub loop_dev: PathBuf,
    /// Whether the loop device does direct I/O on the FUSE file (`/sys/block/loopN/loop/dio`).
    pub direct_io: bool,
    export: Option<FuseExport>,
}

impl FuseLoop {
    /// Mounts the device at `mountpoint` (created) and attaches a loop device with direct
    /// I/O requested.
    pub fn setup(device: Arc<dyn BlockDevice>, mountpoint: &Path) -> Result<Self, BenchError> {
        std::fs::create_dir_all(mountpoint)
            .map_err(|e| BenchError::Io(format!("creating {}: {e}", mountpoint.display())))?;
        let export = FuseExport::mount(device, FuseConfig::new(mountpoint)).map_err(|e| {
            BenchError::Export(format!("FUSE mount on {}: {e}", mountpoint.display()))
        })?;
        let out = Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on"])
            .arg(export.file_path())
            .output()
            .map_err(|e| BenchError::Tool(format!("cannot run losetup: {e}")))?;
        if !out.status.success() {
            return Err(BenchError::Tool(format!(
                "losetup on {} failed: {}",
                export.file_path().display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let loop_dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string());
        let dio = loop_dev
            .file_name()
            .and_then(|n| {
                std::fs::read_to_string(format!("/sys/block/{}/loop/dio", n.to_string_lossy())).ok()
            })
            .map(|s| s.trim() == "1")
            .unwrap_or(false);
        Ok(FuseLoop {
            loop_dev,
            direct_io: dio,
            export: Some(export),
        })
    }
}

impl Drop for FuseLoop {
    fn drop(&mut self) {
        let _ = Command::new("losetup")
            .arg("-d")
            .arg(&self.loop_dev)
            .status();
        // The loop driver lets go of the file asynchronously; unmounting before that fails
        // with EBUSY.
        for _ in 0..250 {
            if is_loop_free(&self.loop_dev) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(mut export) = self.export.take() {
            let _ = export.unmount();
        }
    }
}

fn is_loop_free(dev: &Path) -> bool {
    dev.file_name()
        .map(|n| !Path::new(&format!("/sys/block/{}/loop", n.to_string_lossy())).exists())
        .unwrap_or(true)
}
