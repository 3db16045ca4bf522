//! dm-verity volumes as veritysetup handles them: hash trees made and checked on image files,
//! and the read-only activation plan that serves a data device through its tree.

use crate::device::{open_file, table_path};
use crate::error::{ErrorClass, Result, VolumeError};
use crate::plan::ActivationPlan;
use cryptblk_dm::{TableSpec, VerityTableConfig};
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::verity::{self, VerityFormatted, VerityParams, VeritySuperblock};
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

/// The tree geometry a `verity format` of `data` onto `hash_device` uses when the caller
/// gives no data block count: up to `hash_offset` when both are one file, else the whole
/// data device.
pub fn default_data_blocks(
    data: &Path,
    hash_device: &Path,
    hash_offset: u64,
    data_block_size: u32,
) -> Result<u64> {
    let same = same_file(data, hash_device);
    if same && hash_offset > 0 {
        return Ok(hash_offset / u64::from(data_block_size));
    }
    let d = open_file(data, false)?;
    Ok(d.size()? / u64::from(data_block_size))
}

fn same_file(a: &Path, b: &Path) -> bool {
    std::fs::canonicalize(a).ok() == std::fs::canonicalize(b).ok()
}

/// Writes the hash tree (and superblock) of `data` onto `hash_device`, which is created when
/// missing; both may be one file.
pub fn format(data: &Path, hash_device: &Path, params: &VerityParams) -> Result<VerityFormatted> {
    let d = open_file(data, false)?;
    if !hash_device.exists() {
        std::fs::File::create(hash_device)?;
    }
    let h = open_file(hash_device, true)?;
    Ok(if same_file(data, hash_device) {
        verity::format(&h, &h, params)
    } else {
        verity::format(&d, &h, params)
    }?)
}

/// The read-only plan that serves `data` through the tree on `hash_device` as `name`. A wrong
/// root hash is refused here instead of serving a device whose every read fails; data blocks
/// are only checked when read, as the kernel does.
pub fn plan(
    data: &Path,
    hash_device: &Path,
    name: &str,
    params: &VerityParams,
    root: &[u8],
) -> Result<ActivationPlan> {
    if !stored_root_matches(params, data, hash_device, root)? {
        return Err(VolumeError::usage(
            "Root hash does not match the hash tree.",
        ));
    }
    let dpath = table_path(data)?;
    let hpath = table_path(hash_device)?;
    let sectors = params.data_blocks * params.data_block_size as u64 / 512;
    let line = VerityTableConfig::from_format(
        params,
        &dpath.to_string_lossy(),
        &hpath.to_string_lossy(),
        root,
    )
    .map_err(VolumeError::usage)?;
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
