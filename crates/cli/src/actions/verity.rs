//! `verity format|verify|dump|open`: dm-verity volumes with veritysetup's layout and output.

use super::volume::open_file;
use crate::args::{
    Opts, VerityAction, VerityFecArgs, VerityGeometryArgs, VerityParamArgs, VerityTreeArgs,
};
use crate::exit::{ActionResult, Failure};
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_format::verity::{self, VerityParams, VeritySuperblock};
use cryptblk_volume::serve::ServeSpec;
use cryptblk_volume::verity as lib;
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
            root_hash_file,
            params,
        } => {
            let root_hash = root_hash_hex(root_hash, root_hash_file, "verify")?;
            let fec = fec_options(&params.fec);
            let (params, root) =
                load_params(opts, data, hash_device, *hash_offset, &root_hash, params)?;
            match &fec {
                None => lib::verify(data, hash_device, &params, &root)?,
                Some(f) => {
                    let fixed = lib::verify_with_fec(data, hash_device, &params, &root, f)?;
                    if fixed > 0 {
                        eprintln!("Found {fixed} repairable errors with FEC device.");
                    }
                }
            }
            if opts.verbose {
                eprintln!("Verification of data area succeeded.");
            }
            Ok(())
        }
        VerityAction::Dump {
            hash_device,
            hash_offset,
            fec,
        } => {
            let h = open_file(hash_device, false)?;
            let sb = VeritySuperblock::read(&h, *hash_offset)?;
            let layout = match fec_options(fec) {
                Some(f) => Some(lib::fec_layout(&sb.params(*hash_offset)?, hash_device, &f)?),
                None => None,
            };
            print!(
                "{}",
                verity::dump_with_fec(
                    &sb,
                    &hash_device.display().to_string(),
                    *hash_offset,
                    layout.as_ref(),
                    fec.fec_device
                        .as_ref()
                        .is_some_and(|d| lib::same_file(d, hash_device)),
                )?
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
            root_hash_file,
            params,
            export,
        } => {
            cryptblk_volume::control::check_name(name)?;
            let root_hash = root_hash_hex(root_hash, root_hash_file, "open")?;
            let fec = fec_options(&params.fec);
            let (params, root) =
                load_params(opts, data, hash_device, *hash_offset, &root_hash, params)?;
            let plan = lib::plan(data, hash_device, name, &params, &root, fec.as_ref())?;
            let spec = ServeSpec {
                name: plan.name.clone(),
                table: plan.table.to_string(),
                export: super::serving::export_spec(export, &plan.name)?,
                readonly: true,
                info: plan.info.clone(),
            };
            super::serving::start(spec, export, opts.json)
        }
    }
}

/// The tree's parameters and root hash: from the superblock at `hash_offset`, or with
/// `--no-superblock` from the options (the tree then starts at `hash_offset`).
fn load_params(
    opts: &Opts,
    data: &Path,
    hash_device: &Path,
    hash_offset: u64,
    root_hex: &str,
    a: &VerityParamArgs,
) -> Result<(VerityParams, Vec<u8>), Failure> {
    if !a.no_superblock {
        return lib::load(hash_device, hash_offset, root_hex);
    }
    let mut p = tree_params(&a.geometry, data, hash_device, hash_offset)?;
    p.superblock = false;
    if let Some(h) = &opts.hash {
        p.algorithm = HashAlgorithm::from_name(h)
            .map_err(|_| Failure::usage(format!("Hash algorithm {h} not supported.")))?;
    }
    p.salt = verity::parse_salt(a.salt.as_deref().unwrap_or("-"))?;
    let root = lib::root_for(&p, root_hex)?;
    Ok((p, root))
}

/// The root hash: from --root-hash-file when given (veritysetup then ignores the
/// positional one), else the positional argument.
fn root_hash_hex(
    positional: &Option<String>,
    file: &Option<std::path::PathBuf>,
    action: &str,
) -> Result<String, Failure> {
    let Some(file) = file else {
        return positional.clone().ok_or_else(|| {
            let args = if action == "open" {
                "<data_device> <name> <hash_device> <root_hash>"
            } else {
                "<data_device> <hash_device> <root_hash>"
            };
            Failure::usage(format!("{action}: requires {args} as arguments"))
        });
    };
    let invalid = || Failure::usage(format!("Invalid root hash file {}.", file.display()));
    if !std::fs::metadata(file).map_err(|_| invalid())?.is_file() {
        return Err(invalid());
    }
    let text = std::fs::read_to_string(file)
        .map_err(|_| Failure::usage(format!("Cannot read root hash file {}.", file.display())))?;
    Ok(text.trim_end().to_string())
}

/// The parameters of a tree with geometry `g` at `hash_offset` of `hash_device` (the data
/// blocks default to the whole data device, as veritysetup's).
fn tree_params(
    g: &VerityGeometryArgs,
    data: &Path,
    hash_device: &Path,
    hash_offset: u64,
) -> Result<VerityParams, Failure> {
    let data_blocks = match g.data_blocks {
        Some(n) => n,
        None => lib::default_data_blocks(data, hash_device, hash_offset, g.data_block_size)?,
    };
    let mut p = VerityParams::defaults(data_blocks);
    p.hash_type = g.hash_type;
    p.data_block_size = g.data_block_size;
    p.hash_block_size = g.hash_block_size;
    p.hash_offset = hash_offset;
    Ok(p)
}

/// `verity format`: prints what veritysetup prints, the root hash last.
fn format(opts: &Opts, data: &Path, hash_device: &Path, t: &VerityTreeArgs) -> ActionResult {
    // The hash tree is written: not under a daemon that serves it.
    let _in_use = cryptblk_volume::lock::for_format(&[hash_device])?;
    let mut p = tree_params(&t.geometry, data, hash_device, t.hash_offset)?;
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
    let fec = fec_options(&t.fec);
    let (done, layout) = lib::format(data, hash_device, &p, fec.as_ref())?;
    let dump = verity::dump_with_fec(
        &done.superblock,
        &hash_device.display().to_string(),
        t.hash_offset,
        layout.as_ref(),
        fec.as_ref()
            .is_some_and(|f| lib::same_file(&f.device, hash_device)),
    )?;
    // veritysetup prints the root hash right after the salt, before the device sizes.
    let root_line = format!("Root hash:      \t{}\n", hex::encode(&done.root_hash));
    let mut out = String::new();
    for line in dump.split_inclusive('\n') {
        if t.no_superblock && line.starts_with("UUID:") {
            // No superblock, so no UUID; and the hash device holds the tree alone.
            out.push_str("UUID:            \t\n");
            continue;
        }
        if let (true, Some(size)) = (
            t.no_superblock,
            line.strip_prefix("Hash device size: \t")
                .and_then(|r| r.strip_suffix(" [bytes]\n"))
                .and_then(|n| n.parse::<u64>().ok()),
        ) {
            let tree = size.saturating_sub(u64::from(p.hash_block_size));
            out.push_str(&format!("Hash device size: \t{tree} [bytes]\n"));
            continue;
        }
        out.push_str(line);
        if line.starts_with("Salt:") {
            out.push_str(&root_line);
        }
    }
    print!("{out}");
    if let Some(file) = &t.root_hash_file {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(file)
            .and_then(|mut f| f.write_all(hex::encode(&done.root_hash).as_bytes()))
            .map_err(|_| {
                Failure::usage(format!(
                    "Cannot create root hash file {} for writing.",
                    file.display()
                ))
            })?;
    }
    Ok(())
}

/// The FEC parity the options name, if any.
fn fec_options(a: &VerityFecArgs) -> Option<lib::FecOptions> {
    a.fec_device.as_ref().map(|d| lib::FecOptions {
        device: d.clone(),
        roots: a.fec_roots,
        offset: a.fec_offset,
    })
}
