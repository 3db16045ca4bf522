//! dm-verity volumes as veritysetup handles them: hash trees made and checked on image files,
//! and the read-only activation plan that serves a data device through its tree.

use crate::device::{open_file, table_path};
use crate::error::{ErrorClass, Result, VolumeError};
use crate::plan::ActivationPlan;
use cryptblk_dm::{TableSpec, VerityTableConfig};
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::verity::{self, VerityFormatted, VerityParams, VeritySuperblock};
use cryptblk_format::verity_fec::{FecLayout, PatchedIo};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Parameters from the superblock at `hash_offset` of `hash_device`, and the root hash parsed
/// from hex and checked against the hash algorithm's digest size.
pub fn load(
    hash_device: &Path,
    hash_offset: u64,
    root_hex: &str,
) -> Result<(VerityParams, Vec<u8>)> {
    let h = open_file(hash_device, false)?;
    let sb = VeritySuperblock::read(&h, hash_offset)?;
    let params = sb.params(hash_offset)?;
    let root = root_for(&params, root_hex)?;
    Ok((params, root))
}

/// The root hash `root_hex` as bytes, checked against the length of `params`' hash.
pub fn root_for(params: &VerityParams, root_hex: &str) -> Result<Vec<u8>> {
    let root = hex::decode(root_hex).map_err(|_| {
        VolumeError::usage(format!("Invalid root hash '{root_hex}' (expected hex)."))
    })?;
    if root.len() != params.algorithm.output_len() {
        return Err(VolumeError::usage(format!(
            "Invalid root hash length {} for {} (expected {} bytes).",
            root.len(),
            params.algorithm.name(),
            params.algorithm.output_len()
        )));
    }
    Ok(root)
}

/// Checks every data block against the tree (`verity verify`).
pub fn verify(data: &Path, hash_device: &Path, params: &VerityParams, root: &[u8]) -> Result<()> {
    let d = open_file(data, false)?;
    let h = open_file(hash_device, false)?;
    verity::verify_strict(&d, &h, params, root).map_err(|e| {
        VolumeError::new(
            ErrorClass::WrongParameters,
            format!("Verification failed: {e}"),
        )
    })
}

/// True when `root` is the digest of the tree's top block as stored (or, for a one-block
/// volume, of the data block itself).
pub fn stored_root_matches(
    params: &VerityParams,
    data: &Path,
    hash_device: &Path,
    root: &[u8],
) -> Result<bool> {
    let g = params.geometry()?;
    let block = match g.level_start.last() {
        Some(&top) => {
            let mut b = vec![0u8; params.hash_block_size as usize];
            open_file(hash_device, false)?
                .read_exact_at(&mut b, top * params.hash_block_size as u64)?;
            b
        }
        None => {
            let mut b = vec![0u8; params.data_block_size as usize];
            open_file(data, false)?.read_exact_at(&mut b, 0)?;
            b
        }
    };
    Ok(params.block_digest(&block) == root)
}

/// The data block count a `verity format` of `data` onto `hash_device` uses when the
/// caller gives none: the whole data device, as veritysetup.
pub fn default_data_blocks(
    data: &Path,
    hash_device: &Path,
    hash_offset: u64,
    data_block_size: u32,
) -> Result<u64> {
    // veritysetup takes the whole data device even when the hash area shares it: with a
    // hash offset inside it, format then refuses the overlap (verity-compat-test's
    // "overlap with option --data-blocks not entered").
    let _ = (hash_device, hash_offset);
    let d = open_file(data, false)?;
    Ok(d.size()? / u64::from(data_block_size))
}

/// True when both paths name one file.
pub fn same_file(a: &Path, b: &Path) -> bool {
    std::fs::canonicalize(a).ok() == std::fs::canonicalize(b).ok()
}

/// Where a verity volume's FEC parity lives (`--fec-device`, `--fec-roots`,
/// `--fec-offset`).
#[derive(Clone, Debug)]
pub struct FecOptions {
    /// The FEC device or image.
    pub device: std::path::PathBuf,
    /// Parity bytes per codeword.
    pub roots: u32,
    /// Byte offset of the parity on the device.
    pub offset: u64,
}

fn usage(e: cryptblk_format::FormatError) -> VolumeError {
    match e {
        cryptblk_format::FormatError::InvalidParameter(m) => VolumeError::usage(m),
        other => other.into(),
    }
}

/// The FEC layout of the volume `params` on `hash_device` with parity as `fec` says:
/// the covered hash area runs to the end of the hash device, or to the FEC offset when
/// the parity is on the hash device itself (veritysetup's rule).
pub fn fec_layout(
    params: &VerityParams,
    hash_device: &Path,
    fec: &FecOptions,
) -> Result<FecLayout> {
    let hash_end = if same_file(hash_device, &fec.device) {
        fec.offset
    } else {
        open_file(hash_device, false)?.size()?
    };
    FecLayout::new(params, fec.roots, fec.offset, hash_end).map_err(usage)
}

/// Refuses a layout whose data, hash and FEC areas overlap on a shared device, with
/// veritysetup's messages (exit 1): data before the hash area, each before the parity.
fn check_overlaps(
    data: &Path,
    hash_device: &Path,
    params: &VerityParams,
    fec: Option<&FecOptions>,
) -> Result<()> {
    let g = params.geometry().map_err(usage)?;
    let data_end = params.data_blocks * u64::from(params.data_block_size);
    let hash_start = params.hash_offset;
    let hash_end = g.hash_device_end();
    let overlap = |a0: u64, a1: u64, b0: u64, b1: u64| a0 < b1 && b0 < a1;
    if same_file(data, hash_device) && overlap(0, data_end, hash_start, hash_end) {
        return Err(VolumeError::usage("Data area overlaps with hash area."));
    }
    if let Some(f) = fec {
        let layout = fec_layout(params, hash_device, f)?;
        let fec_end = f.offset + layout.parity_bytes();
        if same_file(data, &f.device) && overlap(0, data_end, f.offset, fec_end) {
            return Err(VolumeError::usage("Data area overlaps with FEC area."));
        }
        if same_file(hash_device, &f.device) && overlap(hash_start, hash_end, f.offset, fec_end) {
            return Err(VolumeError::usage("Hash area overlaps with FEC area."));
        }
    }
    Ok(())
}

/// Writes the hash tree (and superblock) of `data` onto `hash_device`, which is created when
/// missing (both may be one file), then the FEC parity when `fec` is given (its device is
/// created when missing, and may be either of the others). Overlapping areas are refused
/// before anything is written.
pub fn format(
    data: &Path,
    hash_device: &Path,
    params: &VerityParams,
    fec: Option<&FecOptions>,
) -> Result<(VerityFormatted, Option<FecLayout>)> {
    if let Some(f) = fec {
        cryptblk_format::verity_fec::check_roots(f.roots).map_err(usage)?;
        if params.data_block_size != params.hash_block_size {
            return Err(VolumeError::usage("Block sizes must match for FEC."));
        }
    }
    let d = open_file(data, false)?;
    if !hash_device.exists() {
        std::fs::File::create(hash_device)?;
    }
    if let Some(f) = fec {
        if !f.device.exists() {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&f.device)?;
        }
    }
    check_overlaps(data, hash_device, params, fec)?;
    let h = open_file(hash_device, true)?;
    let same = same_file(data, hash_device);
    let done = if same {
        verity::format(&h, &h, params)
    } else {
        verity::format(&d, &h, params)
    }?;
    let Some(f) = fec else {
        return Ok((done, None));
    };
    // The superblock carries the UUID format picked: FEC covers what was written.
    let mut written = params.clone();
    written.uuid = Some(done.superblock.uuid);
    let layout = fec_layout(&written, hash_device, f)?;
    let fd = open_file(&f.device, true)?;
    let data_io: &dyn HeaderIo = if same { &h } else { &d };
    cryptblk_format::verity_fec::encode(data_io, &h, &fd, &layout)?;
    Ok((done, Some(layout)))
}

/// `verity verify` with a FEC device: when the tree check fails, decodes every codeword
/// (nothing is written) and checks the tree again over the corrected blocks. Returns the
/// number of bytes FEC corrected (0 when the volume was intact).
pub fn verify_with_fec(
    data: &Path,
    hash_device: &Path,
    params: &VerityParams,
    root: &[u8],
    fec: &FecOptions,
) -> Result<usize> {
    let d = open_file(data, false)?;
    let h = open_file(hash_device, false)?;
    if verity::verify_strict(&d, &h, params, root).is_ok() {
        return Ok(0);
    }
    let layout = fec_layout(params, hash_device, fec)?;
    let f = open_file(&fec.device, false)?;
    let c = cryptblk_format::verity_fec::correct(&d, &h, &f, &layout).map_err(|_| {
        VolumeError::new(
            ErrorClass::NoPermission,
            "Errors cannot be repaired with FEC device.",
        )
    })?;
    let same = same_file(data, hash_device);
    let dv = PatchedIo::new(&d, &layout, &c, true, same);
    let hv = PatchedIo::new(&h, &layout, &c, same, true);
    verity::verify_strict(&dv, &hv, params, root).map_err(|e| {
        VolumeError::new(
            ErrorClass::NoPermission,
            format!("Verification failed after FEC correction: {e}"),
        )
    })?;
    Ok(c.errors)
}

/// The read-only plan that serves `data` through the tree on `hash_device` as `name`, with
/// FEC correction from `fec` when given. A wrong root hash is refused here instead of
/// serving a device whose every read fails (without FEC: a corrupted top block may be
/// correctable); data blocks are only checked when read, as the kernel does.
pub fn plan(
    data: &Path,
    hash_device: &Path,
    name: &str,
    params: &VerityParams,
    root: &[u8],
    fec: Option<&FecOptions>,
) -> Result<ActivationPlan> {
    if fec.is_none() && !stored_root_matches(params, data, hash_device, root)? {
        return Err(VolumeError::usage(
            "Root hash does not match the hash tree.",
        ));
    }
    let dpath = table_path(data)?;
    let hpath = table_path(hash_device)?;
    let sectors = params.data_blocks * params.data_block_size as u64 / 512;
    let mut line = VerityTableConfig::from_format(
        params,
        &dpath.to_string_lossy(),
        &hpath.to_string_lossy(),
        root,
    )
    .map_err(VolumeError::usage)?;
    if let Some(f) = fec {
        let layout = fec_layout(params, hash_device, f)?;
        let bs = u64::from(params.data_block_size);
        if !f.offset.is_multiple_of(bs) {
            return Err(VolumeError::usage(format!(
                "FEC offset {} is not a multiple of the block size {bs}.",
                f.offset
            )));
        }
        line.fec = Some(cryptblk_dm::VerityFecConfig {
            device: table_path(&f.device)?.to_string_lossy().into_owned(),
            blocks: layout.blocks,
            start: f.offset / bs,
            roots: f.roots,
        });
    }
    Ok(ActivationPlan {
        name: name.to_string(),
        table: TableSpec::single(sectors, line).to_text(true),
        lower: Vec::new(),
        keyed_lower: Vec::new(),
        info: crate::facts::VolumeFacts {
            device: Some(data.display().to_string()),
            ..crate::facts::VolumeFacts::of_kind("VERITY")
        },
    })
}
