//! loop-AES: `open --type loopaes` (and cryptsetup's old name `loopaesOpen`) and
//! `decrypt --type loopaes`, with cryptsetup's options: `--key-file` (required; `-` for
//! standard input, e.g. from `gpg --decrypt`), `--keyfile-offset`, `--keyfile-size`,
//! `--key-size`, `--hash`, `--cipher`, `--offset`, `--skip`, `--readonly`,
//! `--allow-discards`.

use super::volume;
use crate::args::{OpenArgs, Opts};
use crate::exit::{ActionResult, Failure};
use cryptblk_format::keyfile;
use cryptblk_volume::loopaes::{self as lib, LoopaesParams, LoopaesVolume};
use cryptblk_volume::offline::{self, Output};
use std::fs::File;
use std::path::Path;

/// The loop-AES parameters of the options, checked as cryptsetup checks them.
fn params(opts: &Opts) -> Result<LoopaesParams, Failure> {
    let mut p = LoopaesParams::default();
    if let Some(bits) = opts.key_size.filter(|&b| b != 0) {
        if !bits.is_multiple_of(8) {
            return Err(Failure::usage("Key size must be a multiple of 8 bits"));
        }
        p.key_size = (bits / 8) as usize;
    }
    if let Some(c) = &opts.cipher {
        p.cipher = c.clone();
    }
    p.hash = opts.hash.clone();
    p.offset_sectors = opts.offset.unwrap_or(0);
    // As cryptsetup: without --skip, IVs count from the offset.
    p.skip_sectors = opts.skip.or(opts.offset).unwrap_or(0);
    Ok(p)
}

/// Reads the key file and derives the volume's key; the device must exist first (exit 4
/// as cryptsetup when it does not).
fn unlock(opts: &Opts, device: &Path) -> Result<LoopaesVolume, Failure> {
    let Some(path) = &opts.key_file else {
        return Err(Failure::usage("Option --key-file is required."));
    };
    let p = params(opts)?;
    if File::open(device).is_err() {
        return Err(Failure::device(format!(
            "Device {} does not exist or access denied.",
            device.display()
        )));
    }
    let contents = keyfile::read_key_file(path, volume::limits(opts))?;
    lib::unlock(contents.as_bytes(), &p)
}

/// `open --type loopaes <device> <name>` / `loopaesOpen <device> <name>`: serves the volume.
pub fn open(opts: &Opts, a: &OpenArgs) -> ActionResult {
    if opts.test_passphrase {
        // cryptsetup has nothing to test a loop-AES key file against either.
        return Err(Failure::usage(
            "Option --test-passphrase is allowed only for open of LUKS, TCRYPT, BITLK and FVAULT2 devices.",
        ));
    }
    if opts.key_file.is_none() {
        return Err(Failure::usage("Option --key-file is required."));
    }
    let name = super::activate::mapping_name(a)?;
    let vol = unlock(opts, &a.device)?;
    let plan = lib::plan(&vol, &a.device, name, &a.perf.table_flags())?;
    super::activate::serve_plan(plan, opts, a)
}

/// `decrypt --type loopaes <device> <output>`: the decrypted data from `--offset` on.
pub fn decrypt(opts: &Opts, device: &Path, output: &Path) -> ActionResult {
    let vol = unlock(opts, device)?;
    let seg = lib::segment(&vol);
    let cipher =
        offline::segment_cipher(&seg, vol.key.as_bytes(), opts.cipher_implementation.clone())?;
    let data = File::open(device)?;
    let dev_size = cryptblk_volume::device::device_size(device)?;
    let len = offline::segment_len(&seg, dev_size, device)?;
    let mut dst = Output::create(output)?;
    offline::decrypt_segment(
        cipher.as_ref(),
        &seg,
        &data,
        len,
        dst.writer(),
        &mut crate::progress::Bar::for_file(opts, device),
    )?;
    dst.commit()
}
