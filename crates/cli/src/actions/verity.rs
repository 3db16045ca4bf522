//! `verity format|verify|dump|open`: dm-verity volumes with veritysetup's layout and output;
//! `integrity dump`, the integritysetup view of a dm-integrity superblock.

use super::volume::{self, open_file};
use crate::args::{Opts, VerityAction, VerityTreeArgs};
use crate::exit::{ActionResult, ExitCode, Failure};
use crate::serve::ServeSpec;
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::verity::{self, VerityParams, VeritySuperblock};
use serde_json::json;
use std::path::Path;

/// Runs one `verity` action.
pub fn verity(opts: &Opts, action: &VerityAction) -> ActionResult {
    match action {
        VerityAction::Format {
            data,
            hash_device,
            tree,
        } => format(opts, data, hash_device, tree),
        VerityAction::Verify {
            data,
            hash_device,
            root_hash,
            hash_offset,
        } => {
            let (params, root) = load(hash_device, *hash_offset, root_hash)?;
            let d = open_file(data, false)?;
            let h = open_file(hash_device, false)?;
            verity::verify_strict(&d, &h, &params, &root).map_err(|e| {
                Failure::new(
                    ExitCode::WrongParameters,
                    format!("Verification failed: {e}"),
                )
            })?;
            if opts.verbose {
                eprintln!("Verification of data area succeeded.");
            }
            Ok(())
        }
        VerityAction::Dump {
            hash_device,
            hash_offset,
        } => {
            let h = open_file(hash_device, false)?;
            let sb = VeritySuperblock::read(&h, *hash_offset)?;
            print!(
                "{}",
                verity::dump(&sb, &hash_device.display().to_string(), *hash_offset)?
            );
            Ok(())
        }
        VerityAction::Close { name } => super::serving::close(name),
        VerityAction::Status { name } => super::integrity::verity_status(name, opts.json),
        VerityAction::Open {
            data,
            name,
            hash_device,
            root_hash,
            hash_offset,
            export,
        } => {
            crate::control::check_name(name)?;
            let (params, root) = load(hash_device, *hash_offset, root_hash)?;
            // Refuse a wrong root hash up front instead of serving a device whose every read
            // fails; data blocks are only checked when read, as the kernel does.
            if !stored_root_matches(&params, data, hash_device, &root)? {
                return Err(Failure::usage("Root hash does not match the hash tree."));
            }
            let dpath = volume::table_path(data)?;
            let hpath = volume::table_path(hash_device)?;
            let sectors = params.data_blocks * params.data_block_size as u64 / 512;
            let args =
                params.table_params(&dpath.to_string_lossy(), &hpath.to_string_lossy(), &root)?;
            let spec = ServeSpec {
                name: name.clone(),
                table: format!("0 {sectors} verity {args}"),
                export: super::serving::export_spec(export)?,
                readonly: true,
                info: json!({ "type": "VERITY", "device": data.display().to_string() }),
            };
            super::serving::start(spec, export, opts.json)
        }
    }
}

/// True when `root` is the digest of the tree's top block as stored (or, for a one-block
/// volume, of the data block itself).
fn stored_root_matches(
    params: &VerityParams,
    data: &Path,
    hash_device: &Path,
    root: &[u8],
) -> Result<bool, Failure> {
    let g = params.geometry()?;
    let block = match g.level_start.last() {
        Some(&top) => {
            let mut b = vec![0u8; params.hash_block_size as usize];
            open_file(hash_device, false)?.read_at(top * params.hash_block_size as u64, &mut b)?;
            b
        }
        None => {
            let mut b = vec![0u8; params.data_block_size as usize];
            open_file(data, false)?.read_at(0, &mut b)?;
            b
        }
    };
    Ok(params.block_digest(&block) == root)
}

/// Parameters from the superblock at `hash_offset`, and the root hash parsed from hex.
fn load(
    hash_device: &Path,
    hash_offset: u64,
    root_hex: &str,
) -> Result<(VerityParams, Vec<u8>), Failure> {
    let h = open_file(hash_device, false)?;
    let sb = VeritySuperblock::read(&h, hash_offset)?;
    let params = sb.params(hash_offset)?;
    let root = hex::decode(root_hex)
        .map_err(|_| Failure::usage(format!("Invalid root hash '{root_hex}' (expected hex).")))?;
    if root.len() != params.algorithm.output_len() {
        return Err(Failure::usage(format!(
            "Invalid root hash length {} for {} (expected {} bytes).",
            root.len(),
            params.algorithm.name(),
            params.algorithm.output_len()
        )));
    }
    Ok((params, root))
}

/// `verity format`: prints what veritysetup prints, the root hash last.
fn format(opts: &Opts, data: &Path, hash_device: &Path, t: &VerityTreeArgs) -> ActionResult {
    let d = open_file(data, false)?;
    let same = std::fs::canonicalize(data).ok() == std::fs::canonicalize(hash_device).ok();
    if !hash_device.exists() {
        std::fs::File::create(hash_device)?;
    }
    let h = open_file(hash_device, true)?;
    let data_size = d.size()?;
    let data_blocks = match t.data_blocks {
        Some(n) => n,
        None if same && t.hash_offset > 0 => t.hash_offset / t.data_block_size as u64,
        None => data_size / t.data_block_size as u64,
    };
    let mut p = VerityParams::defaults(data_blocks);
    p.hash_type = t.hash_type;
    p.data_block_size = t.data_block_size;
    p.hash_block_size = t.hash_block_size;
    p.hash_offset = t.hash_offset;
    p.superblock = !t.no_superblock;
    if let Some(h) = &opts.hash {
        p.algorithm = HashAlgorithm::from_name(h)
            .map_err(|_| Failure::usage(format!("Hash algorithm {h} not supported.")))?;
    }
    if let Some(s) = &t.salt {
        p.salt = verity::parse_salt(s)?;
    }
    if let Some(u) = &opts.uuid {
        let parsed =
            uuid::Uuid::parse_str(u).map_err(|_| Failure::usage(format!("Invalid UUID '{u}'.")))?;
        p.uuid = Some(*parsed.as_bytes());
    }
    let done = if same {
        verity::format(&h, &h, &p)
    } else {
        verity::format(&d, &h, &p)
    }?;
    print!(
        "{}",
        verity::dump(
            &done.superblock,
            &hash_device.display().to_string(),
            t.hash_offset
        )?
    );
    println!("Root hash:      \t{}", hex::encode(&done.root_hash));
    Ok(())
}

/// `integrity dump <device>`: the superblock at sector 0, printed as integritysetup does.
pub fn integrity_dump(device: &Path) -> ActionResult {
    let f = open_file(device, false)?;
    let sb = cryptblk_format::integrity::IntegritySuperblock::read(&f, 0)?;
    let name = device
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    print!("{}", sb.dump(&name));
    Ok(())
}
