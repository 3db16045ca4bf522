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
//!
//! Tables are built as text by the format crate and loaded through the dm table parser,
//! exactly as for plain LUKS volumes.

use super::volume;
use crate::args::Opts;
use crate::exit::Failure;
use cryptblk_cipher::SecretBytes;
use cryptblk_dm::{BlockDevice, Registry};
use cryptblk_format::integrity::IntegritySuperblock;
use cryptblk_format::luks2::integrity::IntegrityLayout;
use cryptblk_format::luks2::Luks2Header;
use std::path::Path;

/// Bytes written per wipe request (cryptsetup's DEFAULT_WIPE_BLOCK).
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

/// Refuses `--integrity` where cryptsetup does, with its messages.
pub fn check_format_options(opts: &Opts, luks1: bool) -> Result<(), Failure> {
    let o = &opts.integrity;
    if o.integrity.is_none() {
        if o.integrity_no_wipe || o.integrity_legacy_padding {
            return Err(Failure::usage(
                "Integrity options can be used only with --integrity.",
            ));
        }
        return Ok(());
    }
    if luks1 {
        return Err(Failure::usage(
            "Integrity option can be used only for LUKS2 format.",
        ));
    }
    if o.integrity_key_file.is_some() || o.tag_size.is_some() || o.journal_size.is_some() {
        return Err(Failure::usage(
            "Options --integrity-key-file, --tag-size and --journal-size are not supported \
             with LUKS2 integrity (the key is part of the volume key, the tag size follows \
             the cipher).",
        ));
    }
    if o.integrity_bitmap_mode || o.integrity_recovery_mode {
        return Err(Failure::usage(
            "Only --integrity-no-journal is supported for LUKS2 integrity devices.",
        ));
    }
    Ok(())
}

/// Encryption key size in bytes for `--integrity` volumes, with cryptsetup's defaults
/// (512 bits for XTS, 256 otherwise).
pub fn encryption_key_bytes(opts: &Opts, cipher: &str) -> Result<usize, Failure> {
    let bits = match opts.key_size {
        Some(b) => b,
        None if cipher.contains("-xts-") => 512,
        None => 256,
    };
    if bits == 0 || bits % 8 != 0 {
        return Err(Failure::usage(format!(
            "Key size {bits} is not a multiple of 8 bits."
        )));
    }
    Ok(bits as usize / 8)
}

/// `--integrity-key-size` for luksFormat, which cryptsetup takes in bits (integritysetup
/// takes bytes for the same option name).
pub fn integrity_key_bytes(opts: &Opts) -> Result<Option<usize>, Failure> {
    match opts.integrity.integrity_key_size {
        None => Ok(None),
        Some(bits) if bits > 0 && bits % 8 == 0 => Ok(Some(bits as usize / 8)),
        Some(bits) => Err(Failure::usage(format!(
            "Cannot use specified integrity key size ({bits} bits is no whole number of bytes)."
        ))),
    }
}

fn layout_of(h: &Luks2Header, vk_size: usize) -> Result<IntegrityLayout, Failure> {
    h.integrity_layout_for_key(vk_size)?
        .ok_or_else(|| Failure::usage("LUKS2 segment has no integrity protection"))
}

/// After `luksFormat` wrote the header: formats the dm-integrity superblock at the data
/// offset of `data_dev` and, unless `--integrity-no-wipe`, wipes the device.
pub fn format_data(
    opts: &Opts,
    h: &Luks2Header,
    vk: &SecretBytes,
    data_dev: &Path,
) -> Result<(), Failure> {
    let layout = layout_of(h, vk.len())?;
    let path = volume::table_path(data_dev)?;
    let path_s = path.display().to_string();
    {
        let f = volume::open_file(data_dev, true)?;
        let zeros = vec![0u8; (CLEARED_SECTORS * 512) as usize];
        std::os::unix::fs::FileExt::write_all_at(&f, &zeros, layout.superblock_offset)?;
        f.sync_all()?;
    }
    let registry = Registry::new();
    let tmp = format!("temporary-cryptsetup-{}", std::process::id());
    let line = layout.format_table_line(&path_s, opts.integrity.integrity_legacy_padding);
    registry.create(&tmp, &line).map_err(|e| {
        Failure::device(format!("Cannot format integrity for device {path_s}: {e}"))
    })?;
    registry
        .remove(&tmp)
        .map_err(|e| Failure::device(e.to_string()))?;
    if opts.integrity.integrity_no_wipe {
        return Ok(());
    }
    let stack = stack(h, vk, data_dev, &tmp, true, &[])?;
    registry
        .create(&stack.lower_name, &stack.lower_table)
        .map_err(|e| Failure::device(e.to_string()))?;
    let top = registry
        .create(&tmp, &stack.table)
        .map_err(|e| Failure::device(e.to_string()))?;
    let wiped = wipe(top.as_ref(), !opts.batch_mode || opts.verbose);
    drop(top);
    let _ = registry.remove(&tmp);
    let _ = registry.remove(&stack.lower_name);
    wiped
}

/// Writes zeros over `dev` (the crypt layer), so every sector gets a valid tag.
fn wipe(dev: &dyn BlockDevice, show: bool) -> Result<(), Failure> {
    crate::progress::zero_fill(dev, "Wiping device to initialize integrity checksum", show)
        .map(drop)
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
) -> Result<IntegrityStack, Failure> {
    let layout = layout_of(h, vk.len())?;
    let path = volume::table_path(data_dev)?;
    let f = volume::open_file(data_dev, false)?;
    let sb = IntegritySuperblock::read(&f, layout.superblock_offset / 512).map_err(|e| {
        Failure::device(format!(
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
