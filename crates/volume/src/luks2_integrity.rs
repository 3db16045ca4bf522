//! LUKS2 with `--integrity` (authenticated encryption), as cryptsetup does it:
//!
//! - `luksFormat` writes the header (segment `integrity` object, keyslot holding the
//!   encryption + integrity key), zeroes the first 8 sectors at the data offset, loads an
//!   8-sector `integrity` table there so the target formats its superblock and journal with
//!   the kernel's defaults, then (unless `--integrity-no-wipe`) writes zeros over the whole
//!   exposed device through `crypt` over `integrity` opened without the journal, so every
//!   sector carries a valid tag.
//! - `open` reads the superblock for the exposed size and stacks the same two layers:
//!   `<name>_dif` (integrity, no internal hash: the tags come from dm-crypt) and `<name>`
//!   (crypt with `integrity:<tag bytes>:aead`).

use crate::device::{open_file, table_path};
use crate::error::{Result, VolumeError};
use crate::progress::{zero_fill, Progress};
use cryptblk_cipher::SecretBytes;
use cryptblk_dm::targets::crypt::{CryptIntegrity, IntegrityKind};
use cryptblk_dm::targets::integrity::{IntegrityMode, IntegrityTableConfig};
use cryptblk_dm::{CryptConfig, CryptFlags, CryptKey, Registry, TableSpec};
use cryptblk_format::integrity::IntegritySuperblock;
use cryptblk_format::luks2::integrity::{IntegrityLayout, FORMAT_MAPPING_SECTORS};
use cryptblk_format::luks2::Luks2Header;
use std::path::Path;
use zeroize::Zeroizing;

/// Superblock flag `fix_padding`.
const FLAG_FIXED_PADDING: u32 = 0x8;

/// Sectors cryptsetup zeroes at the data offset before formatting.
const CLEARED_SECTORS: u64 = 8;

/// The two layers that activate an integrity-protected LUKS2 segment.
pub struct IntegrityStack {
    /// Name of the lower (integrity) mapping: `<name>_dif`, as cryptsetup names it.
    pub lower_name: String,
    /// Its table (holds no key: LUKS2 keeps all keys in dm-crypt).
    pub lower_table: String,
    /// The crypt table over `/dev/mapper/<lower_name>` (holds the volume key).
    pub table: Zeroizing<String>,
    /// The layout the header describes.
    pub layout: IntegrityLayout,
}

/// How `luksFormat` prepares the data device of an integrity-protected volume.
#[derive(Clone, Copy, Debug, Default)]
pub struct DataFormat {
    /// `--integrity-legacy-padding`.
    pub legacy_padding: bool,
    /// `--integrity-no-wipe`: leave the tags invalid until written.
    pub no_wipe: bool,
}

/// The table that formats the integrity superblock on `device` (cryptsetup's
/// `INTEGRITY_format`: an 8-sector `integrity` mapping loaded over a zeroed superblock,
/// journal mode, the kernel's default journal/interleave/buffer sizes, `fix_padding` unless
/// `legacy_padding`).
pub fn format_table(layout: &IntegrityLayout, device: &str, legacy_padding: bool) -> TableSpec {
    let mut line = IntegrityTableConfig::new(device, IntegrityMode::Journal);
    line.start = layout.superblock_offset / 512;
    line.tag_size = Some(layout.tag_size);
    if layout.sector_size != 512 {
        line.block_size = Some(layout.sector_size);
    }
    line.fix_padding = !legacy_padding;
    TableSpec::single(FORMAT_MAPPING_SECTORS, line)
}

/// The lower (`integrity`) table for activation over `device`, sized from the formatted
/// superblock `sb`; `direct` = `--integrity-no-journal` (mode `D`). It holds no key: the tags
/// come from dm-crypt above.
pub fn integrity_table(
    layout: &IntegrityLayout,
    device: &str,
    sb: &IntegritySuperblock,
    direct: bool,
) -> Result<TableSpec> {
    layout.check_superblock(sb)?;
    let mode = if direct {
        IntegrityMode::Direct
    } else {
        IntegrityMode::Journal
    };
    let mut line = IntegrityTableConfig::new(device, mode);
    line.start = layout.superblock_offset / 512;
    line.tag_size = Some(layout.tag_size);
    if layout.sector_size != 512 {
        line.block_size = Some(layout.sector_size);
    }
    line.fix_padding = sb.flags & FLAG_FIXED_PADDING != 0;
    Ok(TableSpec::single(sb.provided_data_sectors, line))
}

/// The upper (`crypt`) table over the integrity mapping `integrity_device`, which exposes
/// `provided_sectors`; `flags` are extra dm-crypt options (`allow_discards`,
/// `no_read_workqueue`, ...). Holds the volume key.
pub fn crypt_table(
    layout: &IntegrityLayout,
    vk: &SecretBytes,
    integrity_device: &str,
    provided_sectors: u64,
    flags: &[String],
) -> Result<TableSpec> {
    if vk.len() != layout.encryption_key_size + layout.integrity_key_size {
        return Err(VolumeError::usage(format!(
            "volume key has {} bytes, the segment needs {}",
            vk.len(),
            layout.encryption_key_size + layout.integrity_key_size
        )));
    }
    let per = u64::from(layout.sector_size / 512);
    let len = provided_sectors - provided_sectors % per;
    if len == 0 {
        return Err(VolumeError::device(
            "the integrity device provides no data sectors",
        ));
    }
    let mut line = CryptConfig::new(
        &layout.dm_cipher,
        CryptKey::Hex(vk.clone()),
        layout.iv_tweak,
        integrity_device,
        0,
    );
    line.flags = CryptFlags::parse(flags).map_err(VolumeError::usage)?;
    line.flags.integrity = Some(CryptIntegrity {
        tuple_size: layout.tag_size,
        kind: IntegrityKind::Aead,
    });
    // A MAC key of other than the digest size needs the kernel's explicit option
    // (cryptsetup's --integrity-key-size; dm-crypt otherwise takes the digest size).
    line.flags.integrity_key_size = layout.integrity.key_size.map(|k| k as u32);
    line.flags.sector_size = layout.sector_size;
    Ok(TableSpec::single(len, line))
}

fn layout_of(h: &Luks2Header, vk_size: usize) -> Result<IntegrityLayout> {
    h.integrity_layout_for_key(vk_size)?
        .ok_or_else(|| VolumeError::usage("LUKS2 segment has no integrity protection"))
}

/// After `luksFormat` wrote the header: formats the dm-integrity superblock at the data
/// offset of `data_dev` and, unless `no_wipe`, wipes the device (reporting to `progress`).
pub fn format_data(
    h: &Luks2Header,
    vk: &SecretBytes,
    data_dev: &Path,
    how: DataFormat,
    progress: &mut dyn Progress,
) -> Result<()> {
    let layout = layout_of(h, vk.len())?;
    let path = table_path(data_dev)?;
    let path_s = path.display().to_string();
    {
        let f = open_file(data_dev, true)?;
        let zeros = vec![0u8; (CLEARED_SECTORS * 512) as usize];
        std::os::unix::fs::FileExt::write_all_at(&f, &zeros, layout.superblock_offset)?;
        f.sync_all()?;
    }
    let registry = Registry::new();
    let tmp = format!("temporary-cryptsetup-{}", std::process::id());
    let line = format_table(&layout, &path_s, how.legacy_padding).to_text(true);
    registry.create(&tmp, &line).map_err(|e| {
        VolumeError::device(format!("Cannot format integrity for device {path_s}: {e}"))
    })?;
    registry
        .remove(&tmp)
        .map_err(|e| VolumeError::device(e.to_string()))?;
    if how.no_wipe {
        return Ok(());
    }
    let stack = stack(h, vk, data_dev, &tmp, true, &[])?;
    registry
        .create(&stack.lower_name, &stack.lower_table)
        .map_err(|e| VolumeError::device(e.to_string()))?;
    let top = registry
        .create(&tmp, &stack.table)
        .map_err(|e| VolumeError::device(e.to_string()))?;
    let wiped = zero_fill(
        top.as_ref(),
        "Wiping device to initialize integrity checksum",
        progress,
    );
    drop(top);
    let _ = registry.remove(&tmp);
    let _ = registry.remove(&stack.lower_name);
    wiped.map(drop)
}

/// The two tables that activate the volume as `name` over `data_dev`; `direct` =
/// `--integrity-no-journal`; `flags` are extra dm-crypt options.
pub fn stack(
    h: &Luks2Header,
    vk: &SecretBytes,
    data_dev: &Path,
    name: &str,
    direct: bool,
    flags: &[String],
) -> Result<IntegrityStack> {
    let layout = layout_of(h, vk.len())?;
    let path = table_path(data_dev)?;
    let f = open_file(data_dev, false)?;
    let sb = IntegritySuperblock::read(&f, layout.superblock_offset / 512).map_err(|e| {
        VolumeError::device(format!(
            "Device {} has no valid integrity superblock at byte {} ({e}).",
            data_dev.display(),
            layout.superblock_offset
        ))
    })?;
    let lower_name = format!("{name}_dif");
    let lower_table = integrity_table(&layout, &path.display().to_string(), &sb, direct)?
        .to_text(false)
        .trim_end()
        .to_string();
    let table = crypt_table(
        &layout,
        vk,
        &format!("/dev/mapper/{lower_name}"),
        sb.provided_data_sectors,
        flags,
    )?
    .to_text(true);
    Ok(IntegrityStack {
        lower_name,
        lower_table,
        table,
        layout,
    })
}
