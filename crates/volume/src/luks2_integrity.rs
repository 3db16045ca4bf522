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
use cryptblk_dm::Registry;
use cryptblk_format::integrity::IntegritySuperblock;
use cryptblk_format::luks2::integrity::IntegrityLayout;
use cryptblk_format::luks2::Luks2Header;
use std::path::Path;

/// Sectors cryptsetup zeroes at the data offset before formatting.
const CLEARED_SECTORS: u64 = 8;

/// The two layers that activate an integrity-protected LUKS2 segment.
pub struct IntegrityStack {
    /// Name of the lower (integrity) mapping: `<name>_dif`, as cryptsetup names it.
    pub lower_name: String,
    /// Its table (holds no key: LUKS2 keeps all keys in dm-crypt).
    pub lower_table: String,
    /// The crypt table over `/dev/mapper/<lower_name>` (holds the volume key).
    pub table: String,
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
    let line = layout.format_table_line(&path_s, how.legacy_padding);
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
    let lower_table = layout.integrity_table_line(&path.display().to_string(), &sb, direct)?;
    let table = layout.crypt_table_line(
        vk,
        &format!("/dev/mapper/{lower_name}"),
        sb.provided_data_sectors,
        flags,
    )?;
    Ok(IntegrityStack {
        lower_name,
        lower_table,
        table,
        layout,
    })
}
