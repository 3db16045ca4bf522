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
use cryptblk_dm::targets::crypt::{CryptIntegrity, IntegrityKind as CryptIntegrityKind};
use cryptblk_dm::targets::integrity::{IntegrityAlgorithm, IntegrityMode};
use cryptblk_dm::{
    BlockDevice, CryptConfig, CryptFlags, CryptKey, IntegrityTableConfig, LinearConfig, Mapping,
    Registry, TableSpec, TargetSpec,
};
use cryptblk_export::NbdServer;
use cryptblk_format::hdrio::HeaderIo;
use zeroize::Zeroizing;

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

/// The sectors an integrity table line provides (its status line's second field), found by
/// loading it over a fresh device, which formats it as the kernel would.
fn provided_sectors(
    registry: &Registry,
    probe: &str,
    line: &IntegrityTableConfig,
) -> Result<u64, String> {
    let table = TableSpec::single(8, line.clone()).to_text(true);
    let m = registry.create(probe, &table).map_err(|e| e.to_string())?;
    let status = m.status();
    let _ = registry.remove(probe);
    status
        .split_whitespace()
        .nth(4)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("unexpected integrity status '{}'", status.trim()))
}

/// A one-line table's text, with keys (`show_keys`, what is loaded) or masked to zeros as
/// `dmsetup table` prints them (what the report stores); without the trailing newline.
fn line_text(sectors: u64, target: impl Into<TargetSpec>, show_keys: bool) -> Zeroizing<String> {
    let mut text = TableSpec::single(sectors, target).to_text(show_keys);
    // Truncated in place: trimming into a new String would leave an unwiped key copy.
    let len = text.trim_end().len();
    text.truncate(len);
    text
}

/// `linear` over all of `ram` (`size` bytes).
fn linear_line(ram: &str, size: u64) -> (u64, LinearConfig) {
    let line = LinearConfig {
        device: ram.to_string(),
        offset: 0,
    };
    (size / 512, line)
}

/// `integrity` over `ram` with the tag size of `hash` (keyed with `key`) in `mode`
/// (`J`, `B`, `D` or `R`), with 4 KiB metadata padding as integritysetup formats today.
fn integrity_line(
    ram: &str,
    hash: &str,
    key: Option<&SecretBytes>,
    mode: char,
) -> Result<IntegrityTableConfig, String> {
    let mode = match mode {
        'J' => IntegrityMode::Journal,
        'B' => IntegrityMode::Bitmap,
        'D' => IntegrityMode::Direct,
        'R' => IntegrityMode::Recovery,
        other => return Err(format!("unknown integrity mode '{other}'")),
    };
    Ok(IntegrityTableConfig {
        fix_padding: true,
        internal_hash: Some(match key {
            Some(k) => IntegrityAlgorithm::keyed(hash, k.clone()),
            None => IntegrityAlgorithm::new(hash),
        }),
        ..IntegrityTableConfig::new(ram, mode)
    })
}

/// `integrity` over `ram` holding `tag_size` bytes of tags per `block_size`-byte block for
/// the crypt target above it (no internal hash), in journal mode.
fn external_tags_line(ram: &str, tag_size: u32, block_size: u32) -> IntegrityTableConfig {
    IntegrityTableConfig {
        tag_size: Some(tag_size),
        block_size: (block_size != 512).then_some(block_size),
        fix_padding: true,
        ..IntegrityTableConfig::new(ram, IntegrityMode::Journal)
    }
}

/// `crypt` with an AEAD `cipher` and `key` over `lower`, keeping `tag_size` bytes per
/// `sector_size`-byte sector in the integrity device below.
fn aead_crypt_line(
    cipher: &str,
    key: &SecretBytes,
    lower: &str,
    tag_size: u32,
    sector_size: u32,
) -> CryptConfig {
    let mut line = CryptConfig::new(cipher, CryptKey::Hex(key.clone()), 0, lower, 0);
    line.flags = CryptFlags {
        sector_size,
        integrity: Some(CryptIntegrity {
            tuple_size: tag_size,
            kind: CryptIntegrityKind::Aead,
        }),
        ..CryptFlags::default()
    };
    line
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
                let (sectors, line) = linear_line(&ram, size);
                let t = line_text(sectors, line, true);
                tables.push(t.to_string());
                registry.create(&name, &t).map_err(dm)?
            }
            IntegrityKind::Integrity {
                hash,
                key_bytes,
                mode,
            } => {
                let key = (*key_bytes > 0).then(|| SecretBytes::random(*key_bytes));
                let failed = |e: String| BenchError::Dm(format!("{}: {e}", config.name));
                let line = integrity_line(&ram, hash, key.as_ref(), *mode).map_err(failed)?;
                held.push(registry.open_device(&ram).map_err(dm)?);
                let sectors =
                    provided_sectors(registry, &format!("{name}-probe"), &line).map_err(failed)?;
                tables.push(line_text(sectors, line.clone(), false).to_string());
                registry
                    .create(&name, &line_text(sectors, line, true))
                    .map_err(dm)?
            }
            IntegrityKind::CryptIntegrity {
                cipher,
                key_bytes,
                tag_size,
                sector_size,
            } => {
                let lower = format!("{name}-dif");
                let line = external_tags_line(&ram, *tag_size, *sector_size);
                held.push(registry.open_device(&ram).map_err(dm)?);
                let sectors = match provided_sectors(registry, &format!("{name}-probe"), &line) {
                    Ok(s) => s,
                    Err(e) => return Ok(Err(format!("integrity table failed to load: {e}"))),
                };
                let t = line_text(sectors, line, true);
                if let Err(e) = registry.create(&lower, &t) {
                    return Ok(Err(format!("integrity table failed to load: {e}")));
                }
                names.push(lower.clone());
                tables.push(t.to_string());
                let key = SecretBytes::random(*key_bytes);
                let crypt = aead_crypt_line(cipher, &key, &lower, *tag_size, *sector_size);
                match registry.create(&name, &line_text(sectors, crypt.clone(), true)) {
                    Ok(m) => {
                        tables.push(line_text(sectors, crypt, false).to_string());
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
                let t = line_text(data_len / 512, line, true).to_string();
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

    /// The typed lines print exactly the text the bench loaded before they existed (keys
    /// shown), and the report's copies mask the keys with zeros of their length.
    #[test]
    fn lines_print_as_dmsetup_tables() {
        let (sectors, line) = linear_line("ram:8M#x", 8 << 20);
        assert_eq!(*line_text(sectors, line, true), "0 16384 linear ram:8M#x 0");

        let line = integrity_line("ram:8M#x", "crc32c", None, 'B').unwrap();
        let text = "0 15944 integrity ram:8M#x 0 - B 2 fix_padding internal_hash:crc32c";
        assert_eq!(*line_text(15944, line.clone(), true), text);
        assert_eq!(*line_text(15944, line, false), text);

        let key = SecretBytes::random(32);
        let line = integrity_line("ram:8M#x", "hmac(sha256)", Some(&key), 'J').unwrap();
        let head = "0 14240 integrity ram:8M#x 0 - J 2 fix_padding internal_hash:hmac(sha256):";
        assert_eq!(
            *line_text(14240, line.clone(), true),
            format!("{head}{}", key.to_hex().as_str())
        );
        assert_eq!(
            *line_text(14240, line, false),
            format!("{head}{}", "0".repeat(64))
        );
        assert!(integrity_line("ram:8M#x", "crc32c", None, 'X').is_err());

        let line = external_tags_line("ram:8M#x", 32, 512);
        assert_eq!(
            *line_text(14240, line, true),
            "0 14240 integrity ram:8M#x 0 32 J 1 fix_padding"
        );
        let line = external_tags_line("ram:8M#x", 32, 4096);
        assert_eq!(
            *line_text(14240, line, true),
            "0 14240 integrity ram:8M#x 0 32 J 2 block_size:4096 fix_padding"
        );

        let cipher = "capi:authenc(hmac(sha256),xts(aes))-plain64";
        let key = SecretBytes::random(96);
        let line = aead_crypt_line(cipher, &key, "low-dif", 32, 512);
        let line_with =
            |k: &str| format!("0 14240 crypt {cipher} {k} 0 low-dif 0 1 integrity:32:aead");
        assert_eq!(
            *line_text(14240, line.clone(), true),
            line_with(&key.to_hex())
        );
        assert_eq!(*line_text(14240, line, false), line_with(&"0".repeat(192)));
        let line = aead_crypt_line(cipher, &key, "low-dif", 32, 4096);
        assert_eq!(
            *line_text(14240, line, false),
            format!(
                "0 14240 crypt {cipher} {} 0 low-dif 0 2 integrity:32:aead sector_size:4096",
                "0".repeat(192)
            )
        );
    }

    #[test]
    fn every_configuration_loads_and_reads_back_its_pattern() {
        let registry = Arc::new(Registry::new());
        for c in IntegrityBenchConfig::builtin() {
            let s = match IntegrityStack::create(&registry, &c, 8 << 20, 1 << 20, None).unwrap() {
                Ok(s) => s,
                Err(why) => {
                    // Only the AEAD stack may be missing, and only with a loader message.
                    assert!(c.name.starts_with("crypt-int-hmac-sha256"), "{why}");
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
