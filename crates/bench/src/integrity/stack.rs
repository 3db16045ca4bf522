//! One configuration made real: its dm tables loaded in a [`Registry`] over RAM disks of
//! its own (for verity, a data disk and a hash disk with the tree cryptblk built), the
//! region prefilled, and for the `nbd` transport the mapping served over NBD.
//!
//! Invariants when [`IntegrityStack::create`] returns a stack: `[0, region)` holds the
//! engine's generation-0 pattern; with NBD, `[region, 2 * region)` holds fio's verification
//! headers (on verity's data disk, written before the tree hashes it) and the mapping
//! provides at least `2 * region` bytes; [`IntegrityStack::tables`] holds the lines as loaded
//! with every key masked to zeros (they go into the report). Dropping the stack stops its
//! NBD server, then removes its mappings top first.

use std::path::Path;
use std::sync::Arc;

use cryptblk_cipher::SecretBytes;
use cryptblk_dm::{BlockDevice, Mapping, Registry};
use cryptblk_export::NbdServer;
use cryptblk_format::hdrio::HeaderIo;

use super::configs::{IntegrityBenchConfig, IntegrityKind};
use crate::engine;
use crate::fio;
use crate::pattern::GenerationMap;
use crate::stack::serve_nbd;
use crate::BenchError;

/// What the NBD transport needs while a stack is built: fio (to write the verification
/// headers of the NBD region) and a directory for sockets and fio output.
pub struct NbdSetup<'a> {
    /// The fio program.
    pub fio: &'a Path,
    /// Directory for the Unix sockets and fio's JSON.
    pub dir: &'a Path,
}

/// [`HeaderIo`] over a block device, for building a verity tree on a RAM disk.
struct DeviceIo(Arc<dyn BlockDevice>);

impl HeaderIo for DeviceIo {
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.0.size())
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.0
            .write_at(offset, buf, cryptblk_dm::WriteFlags::default())
    }
    fn sync(&self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// A configuration loaded over its own RAM disk(s), its region prefilled.
pub struct IntegrityStack {
    /// The configuration.
    pub config: IntegrityBenchConfig,
    /// The top mapping (what the workloads drive).
    pub mapping: Arc<Mapping>,
    /// Pattern generations of the region.
    pub generations: GenerationMap,
    /// The tables as loaded, keys masked.
    pub tables: Vec<String>,
    names: Vec<String>,
    registry: Arc<Registry>,
    nbd: Option<NbdServer>,
    _held: Vec<Arc<dyn BlockDevice>>,
}

impl Drop for IntegrityStack {
    fn drop(&mut self) {
        if let Some(s) = self.nbd.take() {
            let _ = s.stop();
        }
        for n in self.names.iter().rev() {
            let _ = self.registry.remove(n);
        }
    }
}

/// The sectors an integrity table line over `ram` provides (its status line's second
/// field), found by loading it over a fresh device, which formats it as the kernel would.
fn provided_sectors(registry: &Registry, probe: &str, line_tail: &str) -> Result<u64, String> {
    let m = registry
        .create(probe, &format!("0 8 integrity {line_tail}"))
        .map_err(|e| e.to_string())?;
    let status = m.status();
    let _ = registry.remove(probe);
    status
        .split_whitespace()
        .nth(4)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("unexpected integrity status '{}'", status.trim()))
}

fn mask_keys(table: &str, key: Option<&SecretBytes>) -> String {
    match key {
        Some(k) => table.replace(&k.to_hex(), &"0".repeat(k.len() * 2)),
        None => table.to_string(),
    }
}

impl IntegrityStack {
    /// Builds `config` over RAM disks of `size` bytes and prefills `[0, region)` with the
    /// engine's generation-0 pattern. With `nbd`, also serves the mapping over NBD and
    /// writes `[region, 2 * region)` once with fio's verification headers (for verity: on
    /// the data disk, before the tree is built). `Ok(Err(reason))`: the configuration cannot
    /// be loaded by this build (the crypt+integrity AEAD table before crates/dm supports it).
    pub fn create(
        registry: &Arc<Registry>,
        config: &IntegrityBenchConfig,
        size: u64,
        region: u64,
        nbd: Option<&NbdSetup<'_>>,
    ) -> Result<Result<Self, String>, BenchError> {
        let tag = format!("{}-{}", config.name, std::process::id());
        let ram = format!("ram:{size}#ibench-{tag}");
        let name = format!("cryptblk-ibench-{}", config.name);
        let mut names = Vec::new();
        let mut tables = Vec::new();
        let mut held: Vec<Arc<dyn BlockDevice>> = Vec::new();
        let dm = |e: cryptblk_dm::DmError| BenchError::Dm(format!("{}: {e}", config.name));
        for n in [&name, &format!("{name}-dif")] {
            let _ = registry.remove(n);
        }
        let mapping = match &config.kind {
            IntegrityKind::Plain => {
                let t = format!("0 {} linear {ram} 0", size / 512);
                tables.push(t.clone());
                registry.create(&name, &t).map_err(dm)?
            }
            IntegrityKind::Integrity {
                hash,
                key_bytes,
                mode,
            } => {
                let key = (*key_bytes > 0).then(|| SecretBytes::random(*key_bytes));
                let hash_opt = match &key {
                    Some(k) => format!("internal_hash:{hash}:{}", k.to_hex()),
                    None => format!("internal_hash:{hash}"),
                };
                let tail = format!("{ram} 0 - {mode} 2 fix_padding {hash_opt}");
                held.push(registry.open_device(&ram).map_err(dm)?);
                let sectors = provided_sectors(registry, &format!("{name}-probe"), &tail)
                    .map_err(|e| BenchError::Dm(format!("{}: {e}", config.name)))?;
                let t = format!("0 {sectors} integrity {tail}");
                tables.push(mask_keys(&t, key.as_ref()));
                registry.create(&name, &t).map_err(dm)?
            }
            IntegrityKind::CryptIntegrity {
                cipher,
                key_bytes,
                tag_size,
            } => {
                let lower = format!("{name}-dif");
                let tail = format!("{ram} 0 {tag_size} J 1 fix_padding");
                held.push(registry.open_device(&ram).map_err(dm)?);
                let sectors = match provided_sectors(registry, &format!("{name}-probe"), &tail) {
                    Ok(s) => s,
                    Err(e) => return Ok(Err(format!("integrity table failed to load: {e}"))),
                };
                let t = format!("0 {sectors} integrity {tail}");
                if let Err(e) = registry.create(&lower, &t) {
                    return Ok(Err(format!("integrity table failed to load: {e}")));
                }
                names.push(lower.clone());
                tables.push(t);
                let key = SecretBytes::random(*key_bytes);
                let ct = format!(
                    "0 {sectors} crypt {cipher} {} 0 {lower} 0 1 integrity:{tag_size}:aead",
                    key.to_hex()
                );
                match registry.create(&name, &ct) {
                    Ok(m) => {
                        tables.push(mask_keys(&ct, Some(&key)));
                        m
                    }
                    Err(e) => {
                        let _ = registry.remove(&lower);
                        return Ok(Err(format!("crypt table failed to load: {e}")));
                    }
                }
            }
            IntegrityKind::Verity { once } => {
                let data_len = if nbd.is_some() { 2 * region } else { region };
                let data_spec = format!("ram:{data_len}#ibench-data-{tag}");
                let hash_spec = format!("ram:{}#ibench-hash-{tag}", data_len / 64 + (4 << 20));
                let data = registry.open_device(&data_spec).map_err(dm)?;
                let hash = registry.open_device(&hash_spec).map_err(dm)?;
                engine::prefill(data.as_ref(), 0, region)?;
                if let Some(n) = nbd {
                    // fio's headers go on the data disk before the tree hashes it.
                    let server = serve_nbd(data.clone(), n.dir, &format!("{}-data", config.name))?;
                    let filled =
                        fio::fill_with_headers(n.fio, &server.uri(), region, region, n.dir);
                    let _ = server.stop();
                    filled?;
                }
                let mut p = cryptblk_format::verity::VerityParams::defaults(data_len / 4096);
                p.uuid = Some([7; 16]);
                let done = cryptblk_format::verity::format(
                    &DeviceIo(data.clone()),
                    &DeviceIo(hash.clone()),
                    &p,
                )
                .map_err(|e| BenchError::Dm(format!("verity format: {e}")))?;
                let mut line = cryptblk_dm::VerityTableConfig::from_format(
                    &p,
                    &data_spec,
                    &hash_spec,
                    &done.root_hash,
                )
                .map_err(|e| BenchError::Dm(format!("verity table: {e}")))?;
                line.config.check_at_most_once = *once;
                let t = cryptblk_dm::TableSpec::single(data_len / 512, line)
                    .to_text(true)
                    .trim_end()
                    .to_string();
                held.push(data);
                held.push(hash);
                tables.push(t.clone());
                registry.create(&name, &t).map_err(dm)?
            }
        };
        names.push(name);
        let mut stack = IntegrityStack {
            config: config.clone(),
            mapping,
            generations: GenerationMap::new(region),
            tables,
            names,
            registry: registry.clone(),
            nbd: None,
            _held: held,
        };
        if config.writable() {
            engine::prefill(stack.device().as_ref(), 0, region)?;
        }
        if let Some(n) = nbd {
            if stack.mapping.size() < 2 * region {
                return Err(BenchError::Options(format!(
                    "{}: the mapping provides {} bytes, the NBD region needs {}",
                    config.name,
                    stack.mapping.size(),
                    2 * region
                )));
            }
            let server = serve_nbd(stack.device(), n.dir, &config.name)?;
            if config.writable() {
                fio::fill_with_headers(n.fio, &server.uri(), region, region, n.dir)?;
            }
            stack.nbd = Some(server);
        }
        Ok(Ok(stack))
    }

    /// The device to drive.
    pub fn device(&self) -> Arc<dyn BlockDevice> {
        self.mapping.clone()
    }

    /// The NBD URI serving the mapping, when it was built for the NBD transport.
    pub fn nbd_uri(&self) -> Option<String> {
        self.nbd.as_ref().map(NbdServer::uri)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::engine::EngineRun;
    use crate::integrity::workloads;

    #[test]
    fn every_configuration_loads_and_reads_back_its_pattern() {
        let registry = Arc::new(Registry::new());
        for c in IntegrityBenchConfig::builtin() {
            let s = match IntegrityStack::create(&registry, &c, 8 << 20, 1 << 20, None).unwrap() {
                Ok(s) => s,
                Err(why) => {
                    // Only the AEAD stack may be missing, and only with a loader message.
                    assert_eq!(c.name, "crypt-int-hmac-sha256", "{why}");
                    assert!(why.contains("failed to load"), "{why}");
                    continue;
                }
            };
            assert!(s.nbd_uri().is_none());
            for w in workloads() {
                if w.read_percent < 100 && !c.writable() {
                    continue;
                }
                // A loaded machine may let a short run end before its first request: run
                // longer until requests were made (each one verified by the engine).
                let mut runtime = Duration::from_millis(30);
                loop {
                    let m = engine::run(&EngineRun {
                        device: s.device(),
                        workload: &w,
                        region_offset: 0,
                        region_len: 1 << 20,
                        runtime,
                        generations: &s.generations,
                        live: None,
                        seed: 1,
                    })
                    .unwrap_or_else(|e| panic!("{} {}: {e}", c.name, w.name));
                    if m.read.ops + m.write.ops > 0 {
                        break;
                    }
                    runtime *= 4;
                    assert!(runtime < Duration::from_secs(10), "{} {}", c.name, w.name);
                }
            }
        }
    }
}
