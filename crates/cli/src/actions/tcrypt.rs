//! cryptsetup's TCRYPT actions: `tcryptDump`, `open --type tcrypt` and
//! `decrypt --type tcrypt` of TrueCrypt and VeraCrypt volumes.

use super::volume;
use crate::args::{OpenArgs, Opts};
use crate::exit::{ActionResult, Failure};
use crate::progress::Bar;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::keyfile::{self, KeyFileLimits, KeySource};
use cryptblk_format::tcrypt::{TcryptParams, TcryptVolume};
use cryptblk_volume::offline::{self, Output};
use cryptblk_volume::tcrypt as lib;
use std::fs::File;
use std::path::Path;

/// The TCRYPT parameters of the options: the passphrase (terminal or standard input; each
/// `--key-file` is a TrueCrypt key file mixed into it, as in cryptsetup), `--hash`,
/// `--cipher` and the `--tcrypt-*`/`--veracrypt-*` options.
fn params(opts: &Opts, device: &Path) -> Result<TcryptParams, Failure> {
    let mut keyfiles = Vec::new();
    for p in &opts.key_files {
        let data = std::fs::read(p).map_err(|_| Failure::usage("Failed to open key file."))?;
        keyfiles.push(SecretBytes::from_vec(data));
    }
    let prompt = format!("Enter passphrase for {}: ", device.display());
    let passphrase = keyfile::read_key(&KeySource::Passphrase, KeyFileLimits::default(), &prompt)?;
    let t = &opts.tcrypt;
    let mut p = TcryptParams::new(passphrase);
    p.keyfiles = keyfiles;
    p.hash = opts.hash.clone();
    p.cipher = opts.cipher.clone();
    p.pim = t.veracrypt_pim.unwrap_or(0);
    p.veracrypt = !t.disable_veracrypt;
    p.hidden = t.tcrypt_hidden;
    p.system = t.tcrypt_system;
    p.backup = t.tcrypt_backup;
    if p.pim != 0 && !p.veracrypt {
        return Err(Failure::usage(
            "Option --veracrypt-pim is supported only for VeraCrypt compatible devices.",
        ));
    }
    Ok(p)
}

/// Unlocks the volume whose header is on `--header` or `device`.
fn unlock(opts: &Opts, device: &Path) -> Result<TcryptVolume, Failure> {
    let header = volume::header_path(opts, device);
    let p = params(opts, device)?;
    lib::unlock(header, &p)
}

/// `tcryptDump`: the header, or with `--dump-volume-key` the volume key.
pub fn dump(opts: &Opts, device: &Path) -> ActionResult {
    if opts.dump_volume_key {
        volume::confirm(
            opts,
            "Header dump with volume key is sensitive information\nwhich allows access to encrypted partition without a passphrase.",
        )?;
    }
    let vol = unlock(opts, device)?;
    print!(
        "{}",
        vol.dump(&device.display().to_string(), opts.dump_volume_key)
    );
    Ok(())
}

/// `open --type tcrypt`: serves the volume, a chain of ciphers as cryptsetup stacks it (one
/// crypt mapping per cipher; the legacy CBC cascades are refused as by cryptsetup, see
/// [`cryptblk_volume::tcrypt`]); with `--test-passphrase` only checks the passphrase.
pub fn open(opts: &Opts, a: &OpenArgs) -> ActionResult {
    let vol = unlock(opts, &a.device)?;
    if opts.test_passphrase {
        return Ok(());
    }
    let name = super::activate::mapping_name(a)?;
    let plan = lib::plan(&vol, &a.device, name, &a.perf.table_flags())?;
    super::activate::serve_plan(plan, opts, a)
}

/// `decrypt --type tcrypt <device> <output>`: the decrypted data area, every chain and mode.
pub fn decrypt(opts: &Opts, device: &Path, output: &Path) -> ActionResult {
    let vol = unlock(opts, device)?;
    let seg = lib::segment(&vol);
    let cipher = lib::data_cipher(&vol, opts.cipher_implementation.clone())?;
    let data = File::open(device)?;
    let len = seg.size.unwrap_or(0);
    let mut dst = Output::create(output)?;
    offline::decrypt_segment(
        cipher.as_ref(),
        &seg,
        &data,
        len,
        dst.writer(),
        &mut Bar::for_file(opts, device),
    )?;
    dst.commit()
}
